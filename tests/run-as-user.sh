#!/usr/bin/env bash
# Run the end-to-end tests again as an ordinary user: tests/run-as-user.sh USER
#
# The jail's promise is to work without root, so CI (which runs as root) runs
# every jail test a second time as USER. Test binaries are built here, as the
# caller; USER needs only to read them, the jail binary and the rootfs. When
# USER cannot reach them where they are (a checkout under /root, say), they
# are copied to a world-readable staging folder that is removed afterwards.
set -euo pipefail
user=${1:?usage: tests/run-as-user.sh USER}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
id "$user" >/dev/null 2>&1 || { echo "run-as-user: no user '$user' (create it: useradd -m $user)" >&2; exit 2; }

cargo build --workspace --quiet
mapfile -t bins < <(cargo test -p jail-tests --no-run --message-format=json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable") \
       and "test" in m["target"]["kind"]:
        print(m["executable"])')
[ ${#bins[@]} -gt 0 ] || { echo "run-as-user: no test binaries found" >&2; exit 1; }

stage=$(mktemp -d /tmp/jail-user-tests.XXXXXX)
trap 'rm -rf "$stage"' EXIT
chmod 755 "$stage"
mkdir -p "$stage/bin" "$stage/repo"
cp "$repo/target/debug/jail" "$stage/bin/jail"
# The agent's CLI tests run jail-agent, which finds jail beside itself.
[ -x "$repo/target/debug/jail-agent" ] && cp "$repo/target/debug/jail-agent" "$stage/bin/jail-agent"
for b in "${bins[@]}"; do cp "$b" "$stage/bin/"; done
cp -r "$repo/policies" "$stage/repo/"
[ -d "$repo/examples" ] && cp -r "$repo/examples" "$stage/repo/"
chmod -R a+rX "$stage"

# A rootfs the user can reach in place is used in place; otherwise copied.
reach() { runuser -u "$user" -- test -r "$1/usr/bin/python3"; }
place() {
    local src=$1 name=$2
    if [ ! -d "$src" ]; then echo ""; return; fi
    if reach "$src"; then echo "$src"; return; fi
    cp -a "$src" "$stage/$name" && chmod -R a+rX "$stage/$name" && echo "$stage/$name"
}
rootfs=$(place "${JAIL_ROOTFS:-$repo/python-rootfs/out/minimal}" rootfs-minimal)
data_rootfs=$(place "${JAIL_DATA_ROOTFS:-$repo/python-rootfs/out/data}" rootfs-data)

status=0
for b in "$stage"/bin/*; do
    case "$(basename "$b")" in jail|jail-agent) continue ;; esac
    echo "== as $user: $(basename "$b")"
    (cd "$stage" && runuser -u "$user" -- env -i PATH=/usr/bin:/bin HOME="$stage" \
        JAIL_BIN="$stage/bin/jail" JAIL_AGENT_BIN="$stage/bin/jail-agent" JAIL_ROOTFS="$rootfs" ${data_rootfs:+JAIL_DATA_ROOTFS="$data_rootfs"} \
        JAIL_REPO="$stage/repo" JAIL_MUST_WORK="${JAIL_MUST_WORK:-0}" RUST_BACKTRACE=1 \
        "$b" --test-threads=2) || status=1
done
exit $status
