#!/usr/bin/env bash
# A test of the test harness (issue 22): tests/harness-test.sh, as root.
#
# Drives `make test` itself, each time filtered to a few real tests so a
# case costs seconds, and checks what it promises:
#   A. without the test user's account, `make test` is green: the ordinary-
#      user half runs as a spare uid, and every skip (here a data rootfs
#      made missing on purpose) is listed with its reason;
#   B. the same missing account under JAIL_MUST_WORK=1 fails, saying why,
#      before any test runs;
#   C. under JAIL_MUST_WORK=1 a skip is a failure, named, and still listed;
#      and a failure stops nothing: the test binaries after the failing
#      one still run, the ordinary-user half still runs, and the exit
#      status says so only at the end;
#   D. under JAIL_MUST_WORK=1 with nothing missing, it is green, and the
#      tests each half leaves to the other are listed, not failed.
# The missing account is a name nobody has (jail-no-such-user): no account
# on the machine is created, changed or removed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
[ "$(id -u)" = 0 ] || { echo "harness-test: run as root (it tests root's two halves)" >&2; exit 2; }
missing=jail-no-such-user
! id "$missing" >/dev/null 2>&1 || { echo "harness-test: an account '$missing' exists; this test needs it missing" >&2; exit 2; }
spare=$(tests/spare-uid.sh)

# One test that only an ordinary user runs, one that only root runs (it
# delegates a cgroup to the ordinary user), one that needs the data rootfs.
user_only=an_unreadable_script_is_refused
root_only=a_delegated_cgroup_gives_an_ordinary_user_cgroup_limits
data=jail_packages_lists_exactly_the_locked_stack

work=$(mktemp -d /tmp/jail-harness-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0 failures_before=0
case_=""
out="" rc=0

# run NAME [VAR=VALUE...] -- FILTER...: `make test` with that environment.
run() {
    case_=$1 failures_before=$failures
    shift
    local env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    echo "== harness-test $case_: ${env[*]} make test TEST_FILTER='--exact $*'"
    out=$work/$case_.out
    rc=0
    env -u JAIL_MUST_WORK -u TEST_USER JAIL_SKIP_REPORT="$work/$case_.tsv" "${env[@]}" \
        make --no-print-directory test TEST_FILTER="--exact $*" >"$out" 2>&1 || rc=$?
}
fail() {
    echo "harness-test $case_: FAIL: $*"
    failures=$((failures + 1))
}
expect_rc() { # ok|fail
    if [ "$1" = ok ] && [ "$rc" -ne 0 ]; then fail "make test exited $rc, expected success"; fi
    if [ "$1" = fail ] && [ "$rc" -eq 0 ]; then fail "make test succeeded, expected a failure"; fi
}
says() { grep -qF -- "$1" "$out" || fail "the output does not say: $1"; }
never_says() { ! grep -qF -- "$1" "$out" || fail "the output says: $1"; }
# The tests' passes, as libtest prints them: "N passed".
passes() { grep -oE 'test result: ok\. [0-9]+ passed' "$out" | awk '{ n += $4 } END { print n + 0 }'; }
# skipped KIND WHO TEST: the report lists that skip.
skipped() {
    awk -F'\t' -v k="$1" -v w="$2" -v t="$3" '$1 == k && index($2, w) == 1 && $3 ~ ("::" t "$") { found = 1 } END { exit !found }' \
        "$work/$case_.tsv" || fail "the skip list has no '$1' skip of $3 as $2"
}
skips() { wc -l <"$work/$case_.tsv"; }
done_case() {
    if [ "$failures" -eq "$failures_before" ]; then echo "   ok"; else echo "   output:"; sed 's/^/   | /' "$out"; fi
}

# A. The newcomer: no account, no JAIL_MUST_WORK.
run A TEST_USER=$missing JAIL_DATA_ROOTFS=/nonexistent -- "$user_only" "$root_only" "$data"
expect_rc ok
says "no user '$missing', so the ordinary-user half ran as uid $spare"
says "== as uid $spare (no account): bad_input"
says "== as uid $spare (no account): limits"
# Root: the delegated cgroup (for real, to the spare uid); the user: the unreadable script.
[ "$(passes)" -eq 6 ] || fail "expected 3 tests passing in each half, saw $(passes)"
skipped host root "$data"
skipped host "uid $spare" "$data"
skipped elsewhere root "$user_only"
skipped elsewhere "uid $spare" "$root_only"
[ "$(skips)" -eq 4 ] || fail "expected exactly 4 skips, the list has $(skips)"
says "== skipped: 4 (2 for want of something on this host, 2 run by another half or host)"
says "no data rootfs at /nonexistent"
done_case

# B. CI on the same machine: the missing account is a failure, up front.
run B JAIL_MUST_WORK=1 TEST_USER=$missing -- "$user_only" "$root_only"
expect_rc fail
says "JAIL_MUST_WORK=1 but there is no user '$missing' for the ordinary-user half"
never_says "test result:"
done_case

# C. CI with something missing: the skip fails the run, and is listed. The
#    failing binary (data_stack) comes before limits in each half: both
#    halves run every binary all the same.
run C JAIL_MUST_WORK=1 TEST_USER=$spare JAIL_DATA_ROOTFS=/nonexistent -- "$data" "$user_only" "$root_only"
expect_rc fail
says "JAIL_MUST_WORK=1 but this host cannot run the test: no data rootfs at /nonexistent"
says "test result: FAILED"
skipped host root "$data"
skipped host "uid $spare" "$data"
says "== as uid $spare (no account): limits"
[ "$(passes)" -eq 4 ] || fail "expected 2 tests passing in each half past the failure, saw $(passes)"
says "== failed: the tests as root; the tests as the ordinary user ($spare)"
says "run-as-user: as uid $spare (no account), these test binaries failed: data_stack"
done_case

# D. CI with everything there (the explicit bare uid is no fallback): green,
#    and each half's test for the other half is listed, not failed.
run D JAIL_MUST_WORK=1 TEST_USER=$spare -- "$user_only" "$root_only"
expect_rc ok
never_says "no user"
[ "$(passes)" -eq 4 ] || fail "expected 2 tests passing in each half, saw $(passes)"
skipped elsewhere root "$user_only"
skipped elsewhere "uid $spare" "$root_only"
[ "$(skips)" -eq 2 ] || fail "expected exactly 2 skips, the list has $(skips)"
done_case

if [ "$failures" -gt 0 ]; then
    echo "harness-test: $failures check(s) failed"
    exit 1
fi
echo "harness-test: all cases as promised"
