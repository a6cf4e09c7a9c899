#!/usr/bin/python3
"""Experiment (issue 18, the pool's throughput and refill): what would a
pooled jail cost if it were forked from an interpreter that already holds
the preload, instead of started (a `jail session start` and the imports)?

Measures, in one process, as root or as an ordinary user (run it under
`unshare -Urm` so the namespaces below are made in a user namespace of
the caller's, as a jail's are):

  fork       fork() and the child's _exit(), reaped
  + <ns>     the same, the child first unsharing one namespace
  jail       fork; unshare mount, net, ipc, uts, pid and cgroup together;
             fork PID 1 of the new pid namespace; fresh tmpfs /tmp and
             /dev/shm and a new /proc; run a one-line step; exit

with the interpreter bare, then after `import numpy, pandas,
matplotlib.pyplot` (the data rootfs's site-packages on PYTHONPATH, as
bench.py's bare pandas row does). It applies no landlock, seccomp,
rlimits or cgroup: a floor, not a jail.

    PYTHONPATH=python-rootfs/out/data/usr/local/lib/python3.11/dist-packages:python-rootfs/out/data/usr/lib/python3/dist-packages \\
        unshare -Urm /usr/bin/python3 scripts/experiments/fork_jail.py [--data] [N]
"""
import ctypes
import os
import statistics
import sys
import time

DATA = "--data" in sys.argv
N = int(next((a for a in sys.argv[1:] if a.isdigit()), "30"))
if DATA:
    t = time.perf_counter()
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    print(f"preload imported in {1000 * (time.perf_counter() - t):.0f} ms")

libc = ctypes.CDLL(None, use_errno=True)
NS = {"mnt": 0x00020000, "net": 0x40000000, "ipc": 0x08000000, "uts": 0x04000000, "pid": 0x20000000, "cgroup": 0x02000000}
MS_PRIVATE, MS_REC = 1 << 18, 1 << 14


def forked(child):
    pid = os.fork()
    if pid == 0:
        try:
            code = child()
        except BaseException:
            code = 99
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def unshared(flags, then=lambda: 0):
    def child():
        if libc.unshare(flags) != 0:
            return 10
        return then()

    return child


def in_new_pid_ns():
    return forked(lambda: 0)


def jail_step():
    if libc.mount(None, b"/", None, MS_PRIVATE | MS_REC, None) != 0:
        return 11

    def pid1():
        for d in (b"/tmp", b"/dev/shm"):
            if libc.mount(b"tmpfs", d, b"tmpfs", 0, b"size=64m") != 0:
                return 12
        if libc.mount(b"proc", b"/proc", b"proc", 0, None) != 0:
            return 13
        exec(compile("x = sum(range(10))", "<step>", "exec"), {})
        return 0

    return forked(pid1)


def timed(label, child):
    xs = []
    for _ in range(N):
        t = time.perf_counter()
        code = forked(child)
        xs.append(1000 * (time.perf_counter() - t))
        if code != 0:
            sys.exit(f"{label}: the child failed ({code}); run under `unshare -Urm` or as root")
    xs.sort()
    print(f"{label:<10} median {statistics.median(xs):7.2f} ms   p90 {xs[int(len(xs) * 0.9)]:7.2f} ms")


print(f"interpreter: {'data stack imported' if DATA else 'bare'}; {N} samples each")
timed("fork", lambda: 0)
for name, flag in NS.items():
    timed(f"+ {name}", unshared(flag, in_new_pid_ns if name == "pid" else (lambda: 0)))
timed("jail", unshared(sum(NS.values()), jail_step))
