#!/usr/bin/env bash
# Set up what tests/fronts/tests/mcp.rs needs: a Python venv with the official MCP
# Python SDK (`mcp` from PyPI), which tests/mcp/client.py drives `jail mcp`
# with as a real client. Idempotent: a venv whose stamp matches is kept.
# Readable by every user (the suite runs as jailtest too). `make test-deps`
# runs it.
#
#   tests/mcp/setup.sh            # venv in /var/cache/jail-mcp/venv (root) or ~/.cache/jail-mcp/venv
#   JAIL_MCP_VENV=DIR tests/mcp/setup.sh
#
# Prints the venv's python; the test looks there, or at JAIL_MCP_PYTHON.
set -euo pipefail

if [ "$(id -u)" = 0 ]; then
    default=/var/cache/jail-mcp/venv
else
    default="${XDG_CACHE_HOME:-$HOME/.cache}/jail-mcp/venv"
fi
venv="${JAIL_MCP_VENV:-$default}"
packages="mcp==2.3.0"
stamp="$venv/.jail-mcp-stamp"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$packages" ] \
    && "$venv/bin/python" -c 'import mcp.client.stdio' 2>/dev/null; then
    echo "$venv/bin/python"
    exit 0
fi

py=/usr/bin/python3
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
        echo "mcp setup: $py cannot make a venv: install python3-venv" >&2
        exit 1
    fi
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv"
# shellcheck disable=SC2086 # the package list is meant to split
"$venv/bin/pip" install --quiet --disable-pip-version-check $packages
echo "$packages" > "$stamp"
chmod -R a+rX "$venv" "$(dirname "$venv")"
echo "$venv/bin/python"
