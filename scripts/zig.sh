#!/usr/bin/env bash
# The linker `make release` links with: zig (the `ziglang` wheel) driven by
# cargo-zigbuild, pinned in scripts/zig-requirements.txt, from PyPI, in a
# cached venv (python/venv.sh). Linked this way the release binaries need
# glibc 2.31 or newer (Debian 11, Ubuntu 20.04) and no libgcc_s, whatever
# glibc the build host has, so one build serves `make install` and the
# manylinux_2_31 wheel alike (python/pack.py checks).
#
#   scripts/zig.sh      # prints the venv's bin folder (put it on PATH)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=$("$here/../python/venv.sh" "$here/zig-requirements.txt")
echo "$venv/bin"
