#!/usr/bin/env bash
# The linker `make release` links with: zig (the `ziglang` wheel) driven by
# cargo-zigbuild, pinned, from PyPI, in a cached venv. Linked this way the
# release binaries need glibc 2.31 or newer (Debian 11, Ubuntu 20.04) and
# no libgcc_s, whatever glibc the build host has, so one build serves
# `make install` and the manylinux_2_31 wheel alike (python/pack.py checks).
# Idempotent: a venv whose stamp matches the pins is kept.
#
#   scripts/zig.sh      # prints the venv's bin folder (put it on PATH)
#   JAIL_ZIG_VENV=DIR scripts/zig.sh
set -euo pipefail

pins="ziglang==0.13.0 cargo-zigbuild==0.20.1"
if [ "$(id -u)" = 0 ]; then
    default=/var/cache/jail-python/zig
else
    default="${XDG_CACHE_HOME:-$HOME/.cache}/jail-python/zig"
fi
venv="${JAIL_ZIG_VENV:-$default}"
stamp="$venv/.jail-zig-stamp"
if [ -x "$venv/bin/cargo-zigbuild" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ]; then
    echo "$venv/bin"
    exit 0
fi
py=/usr/bin/python3
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
        echo "scripts/zig.sh: $py cannot make a venv: install python3-venv" >&2
        exit 1
    fi
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/pip" install --quiet --disable-pip-version-check $pins >&2
chmod -R a+rX "$venv"
echo "$pins" >"$stamp"
echo "$venv/bin"
