#!/usr/bin/env bash
# Run the end-to-end tests again as an ordinary user:
#   tests/run-as-user.sh USER|UID [FILTER...]
#
# The jail's promise is to work without root, so `make test` (run as root)
# runs every jail test a second time as an ordinary user: an account by
# name, or a bare numeric uid with no account at all (tests/spare-uid.sh
# finds one), so a machine without a test user needs no new one. FILTERs
# are libtest arguments (name filters, --exact) for every test binary;
# with them, only the binaries they select anything in run, and a filter
# that selects nothing is an error.
#
# Test binaries are built here, as the caller; the user needs only to read
# them, the jail binary and the rootfs. They are copied to a world-readable
# staging folder, removed afterwards, which is also the user's HOME and
# TMPDIR, so the run leaves nothing of the user elsewhere; a rootfs the
# user cannot reach where it is (a checkout under /root, say) is copied
# there too. Skips are collected as the user and appended to the caller's
# JAIL_SKIP_LOG, or listed at the end when there is none (tests/skips.sh).
set -euo pipefail
who=${1:?usage: tests/run-as-user.sh USER|UID [FILTER...]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# Who the tests run as: an account brings its groups; a bare uid gets its
# own number as gid and no supplementary groups.
if [[ $who =~ ^[0-9]+$ ]] && ! getent passwd "$who" >/dev/null; then
    uid=$who gid=$who groups=--clear-groups label="uid $who (no account)"
elif id "$who" >/dev/null 2>&1; then
    uid=$(id -u "$who") gid=$(id -g "$who") groups=--init-groups label="$who"
else
    echo "run-as-user: no user '$who' (create it: useradd -m $who; or pass a spare uid: tests/spare-uid.sh)" >&2
    exit 2
fi
[ "$uid" != 0 ] || { echo "run-as-user: '$who' is root; pass an ordinary user" >&2; exit 2; }
as_user() { setpriv --reuid="$uid" --regid="$gid" "$groups" -- "$@"; }

cargo build --workspace --quiet
# The integration tests (jail-tests and jail-tests-fronts hold them all),
# built as `cargo test --workspace` builds them: `-p` alone unifies other
# features and builds the jail crate and every test binary a second time.
mapfile -t bins < <(cargo test --workspace --no-run --message-format=json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable") \
       and "test" in m["target"]["kind"]:
        print(m["executable"])')
[ ${#bins[@]} -gt 0 ] || { echo "run-as-user: no test binaries found" >&2; exit 1; }
if [ $# -gt 0 ]; then
    selected=()
    for b in "${bins[@]}"; do
        [ "$("$b" --list "$@" 2>/dev/null | grep -c ': test$')" -gt 0 ] && selected+=("$b")
    done
    [ ${#selected[@]} -gt 0 ] || { echo "run-as-user: the filter '$*' selects no test" >&2; exit 1; }
    bins=("${selected[@]}")
fi

stage=$(mktemp -d /tmp/jail-user-tests.XXXXXX)
trap 'rm -rf "$stage"' EXIT
chmod 755 "$stage"
mkdir -p "$stage/bin" "$stage/repo" "$stage/tmp"
# Each binary is a hard link where the staging folder is on the same disk
# (debug binaries are large), else a copy.
stage_bin() { ln -f "$1" "$stage/bin/" 2>/dev/null || cp "$1" "$stage/bin/"; }
stage_bin "$repo/target/debug/jail"
# A pool's template loads the jail crate's cdylib from beside the binary.
stage_bin "$repo/target/debug/libjail.so"
# The agent's CLI tests run jail-agent, which finds jail beside itself;
# `jail mcp` runs jail-mcp and `jail serve` jail-serve from beside jail
# (tests/fronts/tests/mcp.rs, serve.rs).
for b in jail-agent jail-mcp jail-serve; do
    if [ -x "$repo/target/debug/$b" ]; then stage_bin "$repo/target/debug/$b"; fi
done
for b in "${bins[@]}"; do stage_bin "$b"; done
cp -r "$repo/policies" "$stage/repo/"
[ -d "$repo/examples" ] && cp -r "$repo/examples" "$stage/repo/"
# The committed result schema every result is validated against, and the
# MCP client test's README snippet and client script.
cp -r "$repo/schema" "$stage/repo/"
cp "$repo/README.md" "$stage/repo/"
mkdir -p "$stage/repo/tests" && cp -r "$repo/tests/mcp" "$stage/repo/tests/"
chmod -R a+rX "$stage"
# The user's own corners: its temporary files and its skip log.
touch "$stage/skips.tsv"
chown "$uid:$gid" "$stage/tmp" "$stage/skips.tsv"
chmod 700 "$stage/tmp"

# A rootfs the user can reach in place is used in place; otherwise copied.
reach() { as_user test -r "$1/usr/bin/python3"; }
place() {
    local src=$1 name=$2
    if [ ! -d "$src" ]; then echo ""; return; fi
    if reach "$src"; then echo "$src"; return; fi
    cp -a "$src" "$stage/$name" && chmod -R a+rX "$stage/$name" && echo "$stage/$name"
}
rootfs=$(place "${JAIL_ROOTFS:-$repo/python-rootfs/out/minimal}" rootfs-minimal)
data_rootfs=$(place "${JAIL_DATA_ROOTFS:-$repo/python-rootfs/out/data}" rootfs-data)

# Every binary runs, whatever the ones before it did.
status=0 failed=()
for b in "$stage"/bin/*; do
    case "$(basename "$b")" in jail|jail-agent|jail-mcp|jail-serve|*.so) continue ;; esac
    echo "== as $label: $(basename "$b")"
    (cd "$stage" && as_user env -i PATH=/usr/bin:/bin HOME="$stage" TMPDIR="$stage/tmp" \
        JAIL_BIN="$stage/bin/jail" JAIL_AGENT_BIN="$stage/bin/jail-agent" JAIL_ROOTFS="$rootfs" ${data_rootfs:+JAIL_DATA_ROOTFS="$data_rootfs"} \
        JAIL_REPO="$stage/repo" JAIL_MUST_WORK="${JAIL_MUST_WORK:-0}" JAIL_SKIP_LOG="$stage/skips.tsv" RUST_BACKTRACE=1 \
        "$b" --test-threads=2 "$@") || { status=1; failed+=("$(basename "$b")"); }
done
[ $status = 0 ] || echo "run-as-user: as $label, these test binaries failed: ${failed[*]}" >&2

# A bare uid must leave nothing behind: anything it still owns in the
# shared temporary folders came from this run (nothing did before).
if [ "$groups" = --clear-groups ]; then
    leftovers=$(find /tmp /var/tmp /dev/shm -xdev -uid "$uid" ! -path "$stage/*" -print 2>/dev/null | head -20)
    if [ -n "$leftovers" ]; then
        echo "run-as-user: the run left files of uid $uid outside its staging folder:" >&2
        echo "$leftovers" >&2
    fi
fi

if [ -n "${JAIL_SKIP_LOG:-}" ]; then
    cat "$stage/skips.tsv" >>"$JAIL_SKIP_LOG"
else
    "$repo/tests/skips.sh" "$stage/skips.tsv" || status=1
fi
exit $status
