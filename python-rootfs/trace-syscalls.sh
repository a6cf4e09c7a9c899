#!/usr/bin/env bash
# Trace the data workloads in the jail and write the syscalls they make:
#     python-rootfs/trace-syscalls.sh        (root; needs strace and the data rootfs)
#
# Each workload (trace/*.py) runs under the default policy in a real jail on
# the data rootfs, with `strace -f` on the whole `jail run`. Only the
# interpreter's part counts: from the worker's execve of Python on, and every
# thread or process started after it; the supervisor's and the jail setup's
# syscalls are not the script's. The data workload runs twice, with the
# default environment and with the thread variables the CPU limit sets, so
# both the threaded and the single-threaded paths of OpenBLAS/OpenMP are seen.
# Writes data-syscalls.txt: the sorted union of both, each syscall marked by
# which side alone made it (the stdlib baseline is trace/stdlib_workload.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
jail=${JAIL_BIN:-$repo/target/debug/jail}
rootfs=${JAIL_DATA_ROOTFS:-$here/out/data}
command -v strace >/dev/null || { echo "trace-syscalls: strace not found: apt-get install strace" >&2; exit 1; }
[ -x "$jail" ] || { echo "trace-syscalls: no jail binary at $jail: cargo build, or set JAIL_BIN" >&2; exit 1; }
[ -f "$rootfs/usr/share/jail/manifest.json" ] || { echo "trace-syscalls: no data rootfs at $rootfs: make rootfs-data" >&2; exit 1; }

work=$(mktemp -d /tmp/jail-trace.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
cp "$here"/trace/*.py "$work/"
chmod 644 "$work"/*.py
/usr/bin/python3 - "$repo/policies/default.json" "$work/threads.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    p["environment"]["set"][k] = "1"
json.dump(p, open(sys.argv[2], "w"), indent=1)
PY

trace() { # NAME SCRIPT [jail run options...]
    local name=$1 script=$2
    shift 2
    local out="$work/out-$name"
    mkdir -p "$out"
    # As root every run shares the group identity.root_host_gid (policies/README.md).
    [ "$(id -u)" = 0 ] && chgrp 1879048192 "$out" && chmod 775 "$out"
    strace -f -qq -o "$work/$name.strace" "$jail" run --json --rootfs "$rootfs" --output "$out" --timeout 300 "$@" \
        "$work/$script" > "$work/$name.json"
    /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["status"]=="ok" else "trace-syscalls: %s failed: %s" % (sys.argv[2], r["stderr"]["text"][-2000:]))' \
        "$work/$name.json" "$name"
}
trace stdlib stdlib_workload.py
trace data data_workload.py
trace data-threads1 data_workload.py --policy "$work/threads.json"

/usr/bin/python3 - "$work" "$here/data-syscalls.txt" <<'PY'
import re, sys
work, dest = sys.argv[1], sys.argv[2]
line_re = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()")

def script_syscalls(path):
    """Syscalls of the interpreter: its pid from its execve on, plus every pid first seen after that."""
    lines = open(path, errors="replace").read().splitlines()
    python_pid, start = None, None
    for i, l in enumerate(lines):
        m = line_re.match(l)
        if m and m.group(3) == "execve" and '"/usr/bin/python3"' in l:
            python_pid, start = m.group(1), i
    if python_pid is None:
        sys.exit(f"trace-syscalls: no execve of python in {path}")
    seen_before = {line_re.match(l).group(1) for l in lines[:start] if line_re.match(l)}
    names = set()
    for l in lines[start:]:
        m = line_re.match(l)
        if not m:
            continue
        pid = m.group(1)
        if pid == python_pid or pid not in seen_before:
            names.add(m.group(2) or m.group(3))
    return names

stdlib = script_syscalls(f"{work}/stdlib.strace")
data = script_syscalls(f"{work}/data.strace") | script_syscalls(f"{work}/data-threads1.strace")
extra, baseline_only = sorted(data - stdlib), sorted(stdlib - data)
with open(dest, "w") as f:
    f.write("""# Syscalls Python makes in the jail running the data workloads, and the
# standard-library baseline (python-rootfs/trace-syscalls.sh; scripts in
# python-rootfs/trace/): one per line, sorted, strace's (= libseccomp's) names.
# Unmarked: both made them. "# data stack": only the data workloads (numpy,
# scipy, pandas, matplotlib, scikit-learn, office files). "# stdlib baseline":
# only the baseline (its sqlite3 and tempfile use), kept so an allowlist
# built from this file also serves stdlib scripts.
# Not seen here because nothing filters yet: with clone3 answered ENOSYS,
# glibc starts threads with clone(CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|
# CLONE_THREAD|CLONE_SYSVSEM|CLONE_SETTLS|CLONE_PARENT_SETTID|CLONE_CHILD_CLEARTID).
""")
    for name in sorted(data | stdlib):
        mark = "  # data stack" if name in extra else "  # stdlib baseline" if name in baseline_only else ""
        f.write(f"{name}{mark}\n")
print(f"trace-syscalls: {len(data)} syscalls in the data workloads, {len(stdlib)} in the stdlib baseline")
print(f"trace-syscalls: data stack only: {' '.join(extra) or 'none'}")
print(f"trace-syscalls: stdlib baseline only: {' '.join(baseline_only) or 'none'}")
PY
