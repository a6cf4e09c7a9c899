#!/usr/bin/env bash
# List the tests that skipped, with their reasons: tests/skips.sh LOG
#
# LOG is what the tests appended to JAIL_SKIP_LOG (tests/src/lib.rs
# `record`): one line a skip, tab-separated kind, who ran it, test, reason.
# Kind `host`: this host lacked something the test needs. Kind `elsewhere`:
# the other half of `make test` (root or the ordinary user), or a guest of
# the VM matrix, runs that case.
#
# Exits 1 under JAIL_MUST_WORK=1 when a `host` skip is listed: CI applies
# this to the README's `make test`, which runs as a newcomer's would,
# without JAIL_MUST_WORK (the tests themselves fail such skips under it).
set -euo pipefail
log=${1:?usage: tests/skips.sh LOG}
[ -f "$log" ] || { echo "skips: no skip log at $log" >&2; exit 2; }

host=$(awk -F'\t' '$1 == "host"' "$log" | wc -l)
elsewhere=$(awk -F'\t' '$1 == "elsewhere"' "$log" | wc -l)
if [ "$((host + elsewhere))" -eq 0 ]; then
    echo "== skipped: none"
    exit 0
fi
echo "== skipped: $((host + elsewhere)) ($host for want of something on this host, $elsewhere run by another half or host)"
sort -t$'\t' -k1,1r -k2,2 -k3,3 "$log" | awk -F'\t' '
    { kind = ($1 == "host") ? "SKIP (this host lacks it)" : "SKIP (covered elsewhere)"
      printf "  %-26s as %s  %s\n      %s\n", kind, $2, $3, $4 }'
if [ "$host" -gt 0 ]; then
    if [ "${JAIL_MUST_WORK:-}" = 1 ]; then
        echo "skips: JAIL_MUST_WORK=1 but $host test(s) skipped for want of something on this host (listed above)" >&2
        exit 1
    fi
    echo "   (JAIL_MUST_WORK=1, as in CI, makes the first kind failures)"
fi
