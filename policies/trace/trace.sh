#!/usr/bin/env bash
# Trace a workload inside the jail and list the syscalls it made, to derive
# or re-check the default seccomp allowlist (policies/README.md, "How the
# allowlist was made"). Needs strace (apt-get install strace) and root or
# ptrace rights over the jail; it is a maintainer's tool, not part of CI.
#
#   policies/trace/trace.sh [WORKLOAD.py] > policies/trace/traced.txt
#
# The jail is traced with its seccomp filter in force: strace sees every
# call, refused ones included (they show as ENOSYS or EPERM in the raw log
# kept in $TRACE_DIR/strace.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
workload=${1:-$here/stdlib.py}
jail=${JAIL_BIN:-$repo/target/debug/jail}
rootfs=${JAIL_ROOTFS:-$repo/python-rootfs/out/minimal}
dir=${TRACE_DIR:-$(mktemp -d /tmp/jail-trace.XXXXXX)}
mkdir -p "$dir/code" "$dir/output"
chmod 755 "$dir" "$dir/code"
cp "$workload" "$dir/code/workload.py"
chmod 644 "$dir/code/workload.py"
# As root every run shares the group identity.root_host_gid (policies/README.md).
[ "$(id -u)" = 0 ] && chgrp 1879048192 "$dir/output" && chmod 775 "$dir/output"
strace -f -qq -o "$dir/strace.txt" "$jail" run --json --timeout 600 --rootfs "$rootfs" --output "$dir/output" \
    "$dir/code/workload.py" > "$dir/result.json" || true
echo "# syscalls made by $(basename "$workload") in the jail, with counts (policies/trace/trace.sh)"
python3 "$here/syscalls.py" "$dir/strace.txt"
