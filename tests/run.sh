#!/usr/bin/env bash
# What `make test` runs: tests/run.sh [FILTER...]
#
# 1. Every test of the workspace, as the caller.
# 2. As root, the jail's end-to-end tests again as an ordinary user
#    (tests/run-as-user.sh), because the jail's promise is to work without
#    root: TEST_USER (default jailtest) when it has an account, or a
#    numeric TEST_USER; without an account, a spare uid that has none
#    (tests/spare-uid.sh), so the machine is left as it was. Under
#    JAIL_MUST_WORK=1 (CI) a missing account is a failure instead.
# 3. Every test that skipped, with its reason (tests/skips.sh), also left
#    in JAIL_SKIP_REPORT (default target/test-skips.tsv).
# 4. Which half failed, and in which test binaries.
#
# A failure stops nothing: every test binary of both halves runs
# (`--no-fail-fast`), the skips are listed, and only then does the script
# exit non-zero, so a newcomer sees every failure at once.
#
# FILTERs are libtest arguments (name filters, --exact) for every test
# binary of both halves (tests/harness-test.sh drives the harness so).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
user=${TEST_USER:-jailtest}
report=${JAIL_SKIP_REPORT:-${CARGO_TARGET_DIR:-$repo/target}/test-skips.tsv}

log=$(mktemp /tmp/jail-skips.XXXXXX)
trap 'rm -f "$log"' EXIT
export JAIL_SKIP_LOG=$log

# The ordinary user: the second half runs as it, and the root tests that
# hand something to an ordinary user (a delegated cgroup) use it too.
ordinary="" note=""
if [ "$(id -u)" = 0 ]; then
    if [[ $user =~ ^[0-9]+$ ]] || id "$user" >/dev/null 2>&1; then
        ordinary=$user
    elif [ "${JAIL_MUST_WORK:-}" = 1 ]; then
        echo "test: JAIL_MUST_WORK=1 but there is no user '$user' for the ordinary-user half: create it (useradd -m $user), or set TEST_USER to an account or a uid" >&2
        exit 1
    else
        ordinary=$(tests/spare-uid.sh)
        note="note: no user '$user', so the ordinary-user half ran as uid $ordinary, which has no account (nothing was created; useradd -m $user to run it as a real account)"
        echo "$note"
    fi
fi

failed=()
finish() { # list the skips, keep them, say what failed, exit
    [ -z "$note" ] || echo "$note"
    mkdir -p "$(dirname "$report")" && cp "$log" "$report"
    # Under JAIL_MUST_WORK the tests already failed their host skips.
    JAIL_MUST_WORK= tests/skips.sh "$log"
    if [ ${#failed[@]} -eq 0 ]; then
        exit 0
    fi
    local IFS=';'
    echo "== failed:${failed[*]/#/ } (each half ran to its end; the failures are above)"
    exit 1
}

JAIL_TEST_USER=$ordinary cargo test --workspace --no-fail-fast -- "$@" || failed+=("the tests as $(id -un)")
if [ -n "$ordinary" ]; then
    tests/run-as-user.sh "$ordinary" "$@" || failed+=("the tests as the ordinary user ($ordinary)")
fi
finish
