#!/usr/bin/env bash
# Set up what the agent's OTLP test needs (tests/fronts/tests/agent.rs,
# `spans_reach_a_real_otlp_receiver...`): a Python venv with the
# opentelemetry-proto and protobuf packages from PyPI, which the test's small
# OTLP/HTTP receiver decodes with. Idempotent: a venv whose stamp matches is
# kept. Readable by every user (the suite runs as jailtest too).
#
#   agent/otel-test-setup.sh            # venv in /var/cache/jail-agent/otel-venv (root) or ~/.cache
#   JAIL_OTEL_VENV=DIR agent/otel-test-setup.sh
#
# Prints the venv's python; the test looks there, or at JAIL_OTEL_PYTHON.
set -euo pipefail

if [ "$(id -u)" = 0 ]; then
    default=/var/cache/jail-agent/otel-venv
else
    default="${XDG_CACHE_HOME:-$HOME/.cache}/jail-agent/otel-venv"
fi
venv="${JAIL_OTEL_VENV:-$default}"
packages="opentelemetry-proto==1.45.2 protobuf>=5,<8"
stamp="$venv/.jail-agent-stamp"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$packages" ] \
    && "$venv/bin/python" -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2' 2>/dev/null; then
    echo "$venv/bin/python"
    exit 0
fi

py=/usr/bin/python3
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
        echo "otel-test-setup: $py cannot make a venv: install python3-venv" >&2
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
