#!/usr/bin/env bash
# A pinned venv from PyPI, cached: python/venv.sh [REQUIREMENTS]
#
# The default, python/requirements-test.txt, is what `make test-python`
# uses (pytest, auditwheel and the frameworks the package's integrations
# plug into); scripts/zig.sh makes the release build's linker venv with it
# too. Idempotent: a venv whose stamp matches its requirements file is
# kept. Readable by every user (the suite runs as jailtest too).
#
#   python/venv.sh          # /var/cache/jail-python/venv (root) or ~/.cache/jail-python/venv
#   python/venv.sh FILE     # .../jail-python/NAME, NAME the file's name less -requirements.txt
#   JAIL_PYTHON_VENV=DIR python/venv.sh [FILE]
#
# Prints the venv's folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
requirements=$(readlink -f "${1:-$here/requirements-test.txt}")
name=venv
[ -z "${1:-}" ] || name=$(basename "$requirements" -requirements.txt)

if [ "$(id -u)" = 0 ]; then
    default=/var/cache/jail-python/$name
else
    default="${XDG_CACHE_HOME:-$HOME/.cache}/jail-python/$name"
fi
venv="${JAIL_PYTHON_VENV:-$default}"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
stamp="$venv/.jail-python-stamp"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "$venv"
    exit 0
fi

py=/usr/bin/python3
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
        echo "python/venv.sh: $py cannot make a venv: install python3-venv" >&2
        exit 1
    fi
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
chmod -R a+rX "$venv"
echo "$want" >"$stamp"
echo "$venv"
