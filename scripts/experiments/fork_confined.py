#!/usr/bin/python3
"""Experiment (issue 36, jails forked from a trusted template): what does a
template interpreter pay to fork a child that becomes a FULL jail, part by
part, and what is left once the imports are no longer paid per step?

fork_jail.py measured a floor (fork, six namespaces, PID 1, a new /proc, no
confinement). This script adds every layer of DESIGN.md section 3 that a
fork has to redo, in the order of section 6, and times each part in the
child with time.perf_counter_ns (CLOCK_MONOTONIC, the same clock in every
process); the child sends its timestamps back over a pipe as JSON:

  1  fork: os.fork() in the template until the child's first instruction
     (the template's page tables are copied here: its VmPTE is printed);
     the child then closes inherited fds and waits to be released, as a
     jail waits while its supervisor places it in a cgroup (part 10)
  2  unshare(CLONE_NEWUSER) and the child writing its own maps (setgroups
     deny; sandbox uid/gid 1000 -> the child's uid/gid): a nested user
     namespace
  3  unshare of mount, net, ipc, uts, cgroup and pid together; every sample
     is run a second time without CLONE_NEWNET (samples alternate) to give
     the network namespace's share
  4  mounts: MS_PRIVATE|MS_REC on /; a tmpfs root; read-only (recursive,
     mount_setattr AT_RECURSIVE: ro, nosuid, nodev) binds of the HOST's
     /usr and /etc (the template here is not pivoted into a rootfs, so the
     host's are what its interpreter runs from); /bin, /lib, /lib64 are
     symlinks into /usr on this merged-usr host and are recreated as the
     same symlinks (a real bind where one is a directory); with --data the
     data rootfs's /usr bound read-only at its own host path, so the
     template's sys.path still resolves inside; a per-fork staging folder's
     input/ at /workspace/input (ro) and output/ at /workspace/output (rw,
     nosuid, nodev); tmpfs /tmp and /dev/shm (size caps); binds of
     /dev/{null,zero,full,random,urandom}; then (4b) pivot_root(".", "."),
     umount2(MNT_DETACH) of the old root and the root tmpfs made read-only.
     4a is done before part 5 and 4b after it: proc can only be mounted in
     a user namespace while a fully visible /proc is still in the mount
     namespace (fs/namespace.c mount_too_revealing), i.e. before the old
     root is detached; the jail's own mount plan does the same
  5  fork of PID 1 of the new pid namespace (the intermediate child sends
     PID 1's pid and exits; the template is PR_SET_CHILD_SUBREAPER, so
     PID 1 is re-parented to it and no idle intermediate holds memory) and
     PID 1 mounting a fresh /proc (nosuid, nodev, noexec). This second
     fork copies the page tables again: os.fork cannot clone straight into
     new namespaces as the jail's supervisor does
  6  privileges: PR_CAPBSET_DROP 0..63, ambient cleared, setresgid and
     setresuid to 1000, capset to nothing, PR_SET_NO_NEW_PRIVS
  7  landlock: ABI from LANDLOCK_CREATE_RULESET_VERSION (read once in the
     template); handled_access_fs = every FS right of that ABI, plus TCP
     bind/connect (ABI >= 4) and abstract-unix/signal scoping (ABI >= 6)
     as DESIGN.md's landlock layer has; rules: read+execute beneath /,
     every right beneath /workspace/output, /tmp, /dev/shm; restrict_self
  8  seccomp: a BPF program compiled ONCE in the template with ctypes
     against the host's libseccomp.so.2 (default SCMP_ACT_ERRNO(EPERM);
     allow rules for the unconditional allow list of policies/default.json
     plus its argument-checked clone/socket/socketpair/personality/set*id/
     chown rules, ioctl allowed without its TIOCSTI/TIOCLINUX checks;
     data-syscalls.txt or a built-in list when the repo is not beside the
     script), exported to a memfd; each fork installs it with
     prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &sock_fprog)
  9  a trivial step (sum(range(10))) and, with --data, a pandas step (a
     1000-row DataFrame, groupby mean), run in the forked interpreter
  10 the cgroup, done by the template as a supervisor would: a cgroup made
     beneath the caller's OWN cgroup of each v1 controller memory, cpu and
     pids (this host is hybrid; located from /proc/self/cgroup and
     /proc/self/mountinfo), memory (and memsw: no swap) limit, pids.max
     and a cpu quota written, the child's pid written to cgroup.procs
     (10a, while the child waits; split into mkdir, limits and attach),
     rmdir after it is reaped (10b). Skipped,
     with the reason, where the v1 controllers are not writable (an
     ordinary user here). Only cgroups this run made are ever touched.

Each part's row also shows the minor page faults (getrusage ru_minflt)
taken in it, mostly copy-on-write breaks of pages shared with the
template; the steps of 9 are also timed in the template itself (warm, no
fork) for reference. Every fork checks, after part 8, that it is PID 1,
uid/gid 1000, has no capabilities (effective and bounding), no_new_privs,
seccomp mode 2, that landlock refuses opening /proc/self/comm for writing
(EACCES), that seccomp refuses unshare(0) (EPERM), that its netns holds
only lo, that it reads /workspace/input and writes /workspace/output;
the run fails otherwise. Not done here (they are in a real jail): rlimits,
setsid, hostname, masking /proc, the environment allowlist, stdio pipes.

It also measures (a) the private memory (USS = Private_Clean +
Private_Dirty of /proc/PID/smaps_rollup, plus the child's own page tables,
VmPTE, which smaps does not count) of K idle forks alive at once that did
parts 1-8, against the template's RSS and PSS, and how many fit in 2 GiB
(as root, also what each fork's cgroup was charged, kernel objects
included); (b) fork request to ready (parts 1-8); (c) a template's start:
a fresh /usr/bin/python3 running the imports, one pandas step and one Agg
figure saved to BytesIO (the template warm-up this script itself does
before forking), and the amortised cost per step of re-making the template
to re-randomise ASLR (every fork shares the template's layout).

Before each fork the template checks that it has exactly one thread in
/proc/self/task (OPENBLAS/OMP/MKL_NUM_THREADS=1 are set before any import)
and fails otherwise. Run as root or as an ordinary user, from a directory
the user can read (not under `unshare`: the fork makes its own user
namespace, mapping sandbox uid 1000 to the caller's uid; as root that is
uid 0, where a real jail maps to a leased unprivileged host uid):

    /usr/bin/python3 scripts/experiments/fork_confined.py [--data] [N] [--idle K] [--starts S] [--rootfs DIR]
    runuser -u jailtest -- /usr/bin/python3 /tmp/fork_confined.py [--data] [N]

N samples per part (default 50; p99 is nearest-rank, the maximum at N=50),
K idle forks (default 10), S template starts (default 5). --rootfs is the
data rootfs (default python-rootfs/out/data beside the script, else
/work/main/python-rootfs/out/data): its site-packages go on sys.path.
"""
import os
import sys

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ["MPLBACKEND"] = "Agg"

import ctypes  # noqa: E402
import errno  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

if platform.machine() != "x86_64":
    sys.exit("x86_64 only (syscall numbers and libseccomp path)")

# --- arguments -------------------------------------------------------------
ARGS = sys.argv[1:]


def opt(name, default):
    if name in ARGS:
        i = ARGS.index(name)
        value = ARGS[i + 1]
        del ARGS[i : i + 2]
        return value
    return default


IDLE = int(opt("--idle", "10"))
STARTS = int(opt("--starts", "5"))
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
if not os.path.isdir(os.path.join(REPO, "python-rootfs")):
    REPO = "/work/main"
ROOTFS = os.path.abspath(opt("--rootfs", os.path.join(REPO, "python-rootfs", "out", "data")))
DATA = "--data" in ARGS
N = int(next((a for a in ARGS if a.isdigit()), "50"))
PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"
SITE = [f"{ROOTFS}/usr/local/lib/{PYVER}/dist-packages", f"{ROOTFS}/usr/lib/python3/dist-packages"]
BASE = tempfile.mkdtemp(prefix="fork_confined-")
os.environ.setdefault("MPLCONFIGDIR", os.path.join(BASE, "mpl"))

now = time.perf_counter_ns


class Stamps(dict):
    """perf_counter_ns stamps, each with the process's minor faults so far (F)."""

    def __init__(self):
        super().__init__()
        self.F = {}

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.F[key] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

# --- the template's warm-up (also what a fresh template runs in (c)) ------
WARMUP = r"""
import time, json, io
t0 = time.perf_counter_ns()
import numpy, pandas, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
t1 = time.perf_counter_ns()
exec(PANDAS_STEP)
t2 = time.perf_counter_ns()
fig, ax = plt.subplots()
ax.plot(range(10), [x * x for x in range(10)])
buf = io.BytesIO()
fig.savefig(buf, format="png")
plt.close(fig)
t3 = time.perf_counter_ns()
WARM = {"imports": t1 - t0, "pandas step": t2 - t1, "figure": t3 - t2}
"""
TRIVIAL_STEP = "x = sum(range(10))"
PANDAS_STEP = (
    "import numpy as np, pandas as pd\n"
    "df = pd.DataFrame({'k': np.arange(1000) % 10, 'v': np.arange(1000.0)})\n"
    "r = df.groupby('k')['v'].mean()\n"
)

if DATA:
    for p in SITE:
        if not os.path.isdir(p):
            sys.exit(f"--data: {p} is missing or unreadable")
    sys.path[1:1] = [p for p in SITE if p not in sys.path]
    t = now()
    _g = {"PANDAS_STEP": PANDAS_STEP}
    exec(WARMUP, _g)
    TEMPLATE_WARM = {k: v / 1e6 for k, v in _g["WARM"].items()}
    TEMPLATE_WARM["total"] = (now() - t) / 1e6

# --- libc ------------------------------------------------------------------
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.restype = ctypes.c_long

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NS_NO_NET = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | CLONE_NEWPID
NS_ALL = NS_NO_NET | CLONE_NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 1, 2, 4, 8
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_capset, SYS_pivot_root, SYS_mount_setattr = 126, 155, 442
SYS_ll_create, SYS_ll_add_rule, SYS_ll_restrict = 444, 445, 446
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_CAPBSET_DROP = 1, 22, 24
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 38, 47, 4
SECCOMP_MODE_FILTER = 2
SANDBOX_ID = 1000


def ok(ret, what):
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return ret


def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    ok(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {src} on {dst}")


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def setattr_mount(path, attrs, flags=0):
    a = MountAttr(attrs, 0, 0, 0)
    ok(libc.syscall(ctypes.c_long(SYS_mount_setattr), ctypes.c_int(AT_FDCWD), ctypes.c_char_p(path.encode()), ctypes.c_uint(flags), ctypes.byref(a), ctypes.c_size_t(ctypes.sizeof(a))), f"mount_setattr {path}")


def bind_ro(src, dst):
    mount(src, dst, None, MS_BIND | MS_REC)
    setattr_mount(dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, AT_RECURSIVE)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# --- landlock (ABI read once, in the template) ------------------------------
class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


LL_ABI = libc.syscall(ctypes.c_long(SYS_ll_create), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
if LL_ABI < 1:
    sys.exit(f"landlock unavailable ({os.strerror(ctypes.get_errno())})")
LL_FS = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
if LL_ABI >= 2:
    LL_FS |= 1 << 13  # REFER
if LL_ABI >= 3:
    LL_FS |= 1 << 14  # TRUNCATE
if LL_ABI >= 5:
    LL_FS |= 1 << 15  # IOCTL_DEV
LL_NET = 3 if LL_ABI >= 4 else 0  # BIND_TCP | CONNECT_TCP
LL_SCOPED = 3 if LL_ABI >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
LL_SIZE = 24 if LL_ABI >= 6 else 16 if LL_ABI >= 4 else 8
LL_READ_EXEC = 1 | 4 | 8  # EXECUTE | READ_FILE | READ_DIR


def landlock():
    attr = RulesetAttr(LL_FS, LL_NET, LL_SCOPED)
    rs = ok(libc.syscall(ctypes.c_long(SYS_ll_create), ctypes.byref(attr), ctypes.c_size_t(LL_SIZE), ctypes.c_uint32(0)), "landlock_create_ruleset")
    for path, access in (("/", LL_READ_EXEC), ("/workspace/output", LL_FS), ("/tmp", LL_FS), ("/dev/shm", LL_FS)):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(access, fd)
        ok(libc.syscall(ctypes.c_long(SYS_ll_add_rule), ctypes.c_int(rs), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule {path}")
        os.close(fd)
    ok(libc.syscall(ctypes.c_long(SYS_ll_restrict), ctypes.c_int(rs), ctypes.c_uint32(0)), "landlock_restrict_self")
    os.close(rs)


# --- seccomp (compiled once, in the template) -------------------------------
FALLBACK_SYSCALLS = """read write openat close lseek pread64 pwrite64 close_range dup dup2 dup3 fcntl flock fsync fdatasync
ftruncate sendfile readv writev preadv pwritev newfstatat fstat stat lstat statx statfs fstatfs access faccessat
faccessat2 readlink readlinkat getdents64 getcwd chdir fchdir mkdir mkdirat rmdir unlink unlinkat rename renameat
renameat2 link linkat symlink symlinkat chmod fchmod fchmodat utimensat umask mmap munmap mprotect mremap madvise
brk mbind get_mempolicy mincore msync mlock munlock membarrier memfd_create futex futex_waitv set_robust_list
set_tid_address rseq arch_prctl prctl getpid gettid getppid getuid geteuid getgid getegid getgroups getresuid
getresgid getrlimit setrlimit prlimit64 getrusage times sysinfo uname getrandom clock_gettime clock_getres
clock_nanosleep nanosleep gettimeofday sched_yield sched_getaffinity sched_setaffinity getcpu rt_sigaction
rt_sigprocmask rt_sigreturn rt_sigsuspend rt_sigtimedwait sigaltstack kill tgkill tkill exit exit_group wait4
waitid pipe pipe2 poll ppoll select pselect6 epoll_create1 epoll_ctl epoll_wait epoll_pwait eventfd2 execve
vfork fork socketpair recvmsg sendmsg recvfrom sendto shutdown getsockopt setsockopt ioctl""".split()


def seccomp_rules():
    """(name, [(arg, op, a, b)]) allow rules: policies/default.json's, else a fallback."""
    policy = os.path.join(REPO, "policies", "default.json")
    rules = []
    if os.path.exists(policy):
        sym = {"AF_UNIX": 1, "PERSONALITY_QUERY": 0xFFFFFFFF, "PER_LINUX": 0, "LOW_32_BITS": 0xFFFFFFFF, "0": 0}
        ns = NS_ALL | CLONE_NEWUSER
        for r in json.load(open(policy))["seccomp"]["rules"]:
            if r["action"] != "allow":
                continue
            for name in r["syscalls"]:
                conds = []
                for w in r.get("when", []):
                    mask = w.get("mask")
                    mask = ns if isinstance(mask, str) and mask.startswith("CLONE_") else sym.get(mask, mask)
                    value = w.get("value")
                    value = sym.get(value, value) if isinstance(value, str) else value
                    if w["op"] == "eq":
                        conds.append((w["arg"], 4, value, 0))  # SCMP_CMP_EQ
                    elif w["op"] == "masked_eq":
                        conds.append((w["arg"], 7, mask, value))  # SCMP_CMP_MASKED_EQ
                    else:  # ioctl's not_in: allowed unconditionally here
                        conds = None
                        break
                rules.append((name, conds or []))
        return rules, "policies/default.json"
    src = os.path.join(REPO, "python-rootfs", "data-syscalls.txt")
    names = set(FALLBACK_SYSCALLS)
    if os.path.exists(src):
        names |= {ln.split("#")[0].strip() for ln in open(src) if ln.split("#")[0].strip()}
    return [(n, []) for n in sorted(names)], "fallback list"


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def build_seccomp():
    t = now()
    lib = ctypes.CDLL("/usr/lib/x86_64-linux-gnu/libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(0x00050000 | errno.EPERM)  # SCMP_ACT_ERRNO(EPERM)
    if not ctx:
        sys.exit("seccomp_init failed")
    rules, source = seccomp_rules()
    names, unknown = set(), []
    for name, conds in rules:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            unknown.append(name)
            continue
        arr = (ArgCmp * max(1, len(conds)))(*[ArgCmp(*c) for c in conds])
        rc = lib.seccomp_rule_add_array(ctx, 0x7FFF0000, nr, len(conds), arr)  # SCMP_ACT_ALLOW
        if rc < 0:
            sys.exit(f"seccomp_rule_add {name} {conds}: {os.strerror(-rc)}")
        names.add(name)
    fd = os.memfd_create("bpf")
    rc = lib.seccomp_export_bpf(ctx, fd)
    if rc < 0:
        sys.exit(f"seccomp_export_bpf: {os.strerror(-rc)}")
    lib.seccomp_release(ctx)
    os.lseek(fd, 0, 0)
    bpf = b""
    while chunk := os.read(fd, 65536):
        bpf += chunk
    os.close(fd)
    return bpf, len(names), len(rules), unknown, source, (now() - t) / 1e6


BPF, SC_NAMES, SC_RULES, SC_UNKNOWN, SC_SOURCE, SC_BUILD_MS = build_seccomp()
BPF_BUF = ctypes.create_string_buffer(BPF, len(BPF))
FPROG = SockFprog(len(BPF) // 8, ctypes.addressof(BPF_BUF))

# --- cgroups (v1 on this hybrid host; only our own children) ---------------
CG_LIMITS = {
    "memory": [("memory.limit_in_bytes", str(1 << 30)), ("memory.memsw.limit_in_bytes", str(1 << 30))],
    "pids": [("pids.max", "64")],
    "cpu": [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "100000")],
}
CG_MADE = []  # every cgroup dir this run made and has not removed


def cgroup_parents():
    """{controller: our own cgroup's dir} or a reason string."""
    own = {}
    for line in open("/proc/self/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        for c in ctrls.split(","):
            own[c] = path
    mounts = {}
    for line in open("/proc/self/mountinfo"):
        pre, post = line.split(" - ")
        fields, (fstype, _src, sopts) = pre.split(), post.split()[:3]
        if fstype == "cgroup":
            for c in sopts.split(","):
                if c in CG_LIMITS:
                    mounts[c] = (fields[3], fields[4])
    parents = {}
    for c in CG_LIMITS:
        if c not in own or c not in mounts:
            return f"no cgroup v1 {c} hierarchy (cgroup v2-only host: not handled by this script)"
        root, mnt = mounts[c]
        rel = own[c][len(root) :] if own[c].startswith(root) else own[c]
        d = os.path.join(mnt, rel.lstrip("/"))
        if not os.access(d, os.W_OK):
            st = os.stat(d)
            return f"{d} (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}) is not writable by uid {os.geteuid()}"
        parents[c] = d
    return parents


CG_PARENTS = cgroup_parents()


def cgroup_make(name, pid, D):
    t0 = now()
    dirs = {}
    for c, parent in CG_PARENTS.items():
        d = os.path.join(parent, name)
        os.mkdir(d)
        CG_MADE.append(d)
        dirs[c] = d
    t1 = now()
    for c, writes in CG_LIMITS.items():
        for f, v in writes:
            if os.path.exists(os.path.join(dirs[c], f)):
                with open(os.path.join(dirs[c], f), "w") as fh:
                    fh.write(v)
    t2 = now()
    for d in dirs.values():
        with open(os.path.join(d, "cgroup.procs"), "w") as fh:
            fh.write(str(pid))
    t3 = now()
    D["   10a mkdir x3"], D["   10a limits"], D["   10a attach (cgroup.procs x3)"] = t1 - t0, t2 - t1, t3 - t2
    return dirs


def cgroup_remove(dirs):
    for d in dirs.values():
        for attempt in range(100):
            try:
                os.rmdir(d)
                break
            except OSError as e:
                if e.errno != errno.EBUSY or attempt == 99:
                    raise
                time.sleep(0.001)
        CG_MADE.remove(d)


# --- the forked child ------------------------------------------------------
ROOT = os.path.join(BASE, "root")
os.mkdir(ROOT)
LIVE = set()  # pids of our children not reaped yet


def send(fd, msg):
    os.write(fd, (json.dumps(msg) + "\n").encode())


def child(T, res_w, rel_r, hold_r, flags, staging):
    """Runs in the fork; never returns. T holds perf_counter_ns stamps."""
    stage = "fds"
    try:
        keep = sorted({res_w, rel_r} | ({hold_r} if hold_r is not None else set()))
        lo = 3
        for fd in keep:
            os.closerange(lo, fd)
            lo = fd + 1
        os.closerange(lo, 1 << 16)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        T["fds"] = now()
        stage = "release"
        if os.read(rel_r, 1) != b"x":
            os._exit(124)
        os.close(rel_r)
        T["released"] = now()

        stage = "2 userns"
        uid, gid = os.getuid(), os.getgid()
        ok(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
        for f, text in (("setgroups", "deny"), ("uid_map", f"{SANDBOX_ID} {uid} 1\n"), ("gid_map", f"{SANDBOX_ID} {gid} 1\n")):
            fd = os.open(f"/proc/self/{f}", os.O_WRONLY)
            os.write(fd, text.encode())
            os.close(fd)
        T["userns"] = now()

        stage = "3 unshare"
        ok(libc.unshare(flags), "unshare(mnt|ipc|uts|cgroup|pid[|net])")
        T["unshare"] = now()

        stage = "4a mounts"
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        R = ROOT
        mount("tmpfs", R, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for d in ("usr", "etc"):
            os.mkdir(f"{R}/{d}")
            bind_ro(f"/{d}", f"{R}/{d}")
        for d in ("bin", "lib", "lib64"):
            if os.path.islink(f"/{d}"):
                os.symlink(os.readlink(f"/{d}"), f"{R}/{d}")
            elif os.path.isdir(f"/{d}"):
                os.mkdir(f"{R}/{d}")
                bind_ro(f"/{d}", f"{R}/{d}")
        if DATA:
            os.makedirs(f"{R}{ROOTFS}/usr")
            bind_ro(f"{ROOTFS}/usr", f"{R}{ROOTFS}/usr")
        os.makedirs(f"{R}/workspace/input")
        os.mkdir(f"{R}/workspace/output")
        bind_ro(f"{staging}/input", f"{R}/workspace/input")
        mount(f"{staging}/output", f"{R}/workspace/output", None, MS_BIND)
        setattr_mount(f"{R}/workspace/output", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
        os.mkdir(f"{R}/tmp")
        mount("tmpfs", f"{R}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
        os.mkdir(f"{R}/dev")
        os.mkdir(f"{R}/dev/shm")
        mount("tmpfs", f"{R}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
        for dev in ("null", "zero", "full", "random", "urandom"):
            os.close(os.open(f"{R}/dev/{dev}", os.O_CREAT | os.O_WRONLY, 0o666))
            mount(f"/dev/{dev}", f"{R}/dev/{dev}", None, MS_BIND)
            setattr_mount(f"{R}/dev/{dev}", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)
        os.mkdir(f"{R}/proc")
        T["mounts"] = now()

        stage = "5 fork PID 1"
        T["pid1_fork"] = now()
        pid1 = os.fork()
        if pid1:
            send(res_w, {"pid1": pid1})
            os._exit(0)
        mount("proc", f"{R}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        T["pid1"] = now()

        stage = "4b pivot"
        os.chdir(R)
        ok(libc.syscall(ctypes.c_long(SYS_pivot_root), b".", b"."), "pivot_root")
        ok(libc.umount2(b".", MNT_DETACH), "umount2 old root")
        os.chdir("/")
        setattr_mount("/", MOUNT_ATTR_RDONLY)
        T["pivot"] = now()

        stage = "6 privileges"
        for cap in range(64):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() != errno.EINVAL:
                ok(-1, f"PR_CAPBSET_DROP {cap}")
        ok(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "PR_CAP_AMBIENT_CLEAR_ALL")
        os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        hdr, data = CapHeader(0x20080522, 0), (CapData * 2)()
        ok(libc.syscall(ctypes.c_long(SYS_capset), ctypes.byref(hdr), ctypes.byref(data)), "capset")
        ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
        T["privileges"] = now()

        stage = "7 landlock"
        landlock()
        T["landlock"] = now()

        stage = "8 seccomp"
        ok(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(FPROG), 0, 0), "PR_SET_SECCOMP")
        T["seccomp"] = now()

        stage = "checks"
        status = dict(ln.split(":\t", 1) for ln in open("/proc/self/status").read().splitlines() if ":\t" in ln)
        checks = {
            "pid": os.getpid(),
            "uid": os.getresuid(),
            "gid": os.getresgid(),
            "CapEff": status["CapEff"].strip(),
            "CapBnd": status["CapBnd"].strip(),
            "NoNewPrivs": status["NoNewPrivs"].strip(),
            "Seccomp": status["Seccomp"].strip(),
        }
        try:
            os.close(os.open("/proc/self/comm", os.O_WRONLY))
            checks["landlock_write_proc"] = "allowed"
        except OSError as e:
            checks["landlock_write_proc"] = errno.errorcode[e.errno]
        checks["seccomp_unshare"] = "allowed" if libc.unshare(0) == 0 else errno.errorcode[ctypes.get_errno()]
        checks["net"] = sorted(ln.split(":")[0].strip() for ln in open("/proc/self/net/dev").readlines()[2:])
        with open("/workspace/output/hello.txt", "w") as fh:
            fh.write("ok")
        checks["input"] = open("/workspace/input/in.txt").read()

        if hold_r is not None:  # idle: ready, then wait to be let go
            send(res_w, {"ready": True, "T": T, "F": T.F, "checks": checks})
            os.read(hold_r, 1)
            os._exit(0)

        stage = "9 steps"
        T["step0"] = now()
        exec(compile(TRIVIAL_STEP, "<step>", "exec"), {})
        T["trivial"] = now()
        if DATA:
            exec(compile(PANDAS_STEP, "<step>", "exec"), {})
            T["pandas"] = now()
        send(res_w, {"T": T, "F": T.F, "checks": checks})
        os._exit(0)
    except BaseException as e:  # noqa: BLE001
        try:
            send(res_w, {"error": f"{stage}: {e!r}"})
        finally:
            os._exit(125)


# --- the template's side ---------------------------------------------------
def threads():
    n = len(os.listdir("/proc/self/task"))
    if n != 1:
        raise SystemExit(f"FAIL: the template has {n} threads (/proc/self/task), forking it would be unsafe")


def status_kb(pid, key):
    for ln in open(f"/proc/{pid}/status"):
        if ln.startswith(key + ":"):
            return int(ln.split()[1])
    return 0


def rollup(pid):
    out = {}
    for ln in open(f"/proc/{pid}/smaps_rollup"):
        parts = ln.split()
        if len(parts) == 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1])
    return out


class Reader:
    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def message(self, timeout=60):
        while b"\n" not in self.buf:
            r, _, _ = select.select([self.fd], [], [], timeout)
            if not r:
                raise SystemExit("FAIL: no message from the child in 60 s")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def reap(pid):
    _, st = os.waitpid(pid, 0)
    LIVE.discard(pid)
    return os.waitstatus_to_exitcode(st)


def staging_make(i):
    d = os.path.join(BASE, f"f{i}")
    os.mkdir(d)
    os.mkdir(f"{d}/input")
    os.mkdir(f"{d}/output")
    with open(f"{d}/input/in.txt", "w") as fh:
        fh.write("in")
    return d


SEQ = [0]
FAULTS = {}  # label: minor page faults in that part, per sample


def one_fork(flags, idle_hold=None):
    """Fork a full jail; returns (durations in ms, checks, live pid1, cgroup dirs, staging)."""
    SEQ[0] += 1
    i = SEQ[0]
    ts = now()
    staging = staging_make(i)
    D = {"staging (template)": now() - ts}
    threads()
    res_r, res_w = os.pipe()
    rel_r, rel_w = os.pipe()
    T = Stamps()
    T["fork"] = now()
    pid = os.fork()
    if pid == 0:
        T["first"] = now()
        child(T, res_w, rel_r, idle_hold, flags, staging)
    t_ret = now()
    LIVE.add(pid)
    os.close(res_w)
    os.close(rel_r)
    cg = None
    if isinstance(CG_PARENTS, dict):
        tc = now()
        cg = cgroup_make(f"fork-confined-{os.getpid()}-{i}", pid, D)
        D["10a cgroup create+limits+attach"] = now() - tc
    os.write(rel_w, b"x")
    os.close(rel_w)
    rd = Reader(res_r)
    pid1, final = None, None
    # PID 1's message may come before the intermediate's {"pid1"}: wait for both
    while (pid1 is None or final is None) and (m := rd.message()) is not None:
        if "error" in m:
            final = m
            break
        if "pid1" in m:
            pid1 = m["pid1"]
            LIVE.add(pid1)
        else:
            final = m
    code = reap(pid)
    if final is None or "error" in final or code != 0 or pid1 is None:
        if pid1:
            os.kill(pid1, signal.SIGKILL)
            reap(pid1)
        raise SystemExit(f"FAIL: the fork failed (exit {code}): {final}")
    if idle_hold is None:
        os.close(res_r)
    C, F = final["T"], final["F"]
    D["fork() returned in template"] = t_ret - C["fork"]
    net = ",net" if flags & CLONE_NEWNET else ""
    # (label, start stamp, end stamp, faults counted from the start stamp, or
    # from 0 where the end stamp is the first in a new process)
    for label, a, b, fa in (
        ("1 fork (to child's 1st instruction)", "fork", "first", None),
        ("   close inherited fds", "first", "fds", "first"),
        ("   wait for release (cgroup 10a)", "fds", "released", "fds"),
        ("2 userns + uid/gid maps", "released", "userns", "released"),
        ("3 unshare mnt,ipc,uts,cgroup,pid" + net, "userns", "unshare", "userns"),
        ("4a mounts before PID 1", "unshare", "mounts", "unshare"),
        ("5 fork PID 1 + mount /proc", "pid1_fork", "pid1", None),
        ("4b pivot_root + detach + ro root", "pid1", "pivot", "pid1"),
        ("6 privileges", "pivot", "privileges", "pivot"),
        ("7 landlock", "privileges", "landlock", "privileges"),
        ("8 seccomp", "landlock", "seccomp", "landlock"),
        ("9a trivial step", "step0", "trivial", "step0"),
        ("9b pandas step", "trivial", "pandas", "trivial"),
    ):
        if b in C:
            D[label] = C[b] - C[a]
            if idle_hold is None and (flags == NS_ALL or label.startswith("3 ")):
                key = label if flags == NS_ALL else "3' unshare mnt,ipc,uts,cgroup,pid (no net)"
                FAULTS.setdefault(key, []).append(F[b] - (F[fa] if fa else 0))
        if label.startswith("4b"):
            D["4 mounts (4a + 4b)"] = D["4a mounts before PID 1"] + D["4b pivot_root + detach + ro root"]
        if label.startswith("8"):
            D["ready: fork request to end of 8"] = C["seccomp"] - C["fork"]
    if idle_hold is not None:
        return D, final["checks"], pid1, cg, staging, res_r
    tr = now()
    code = reap(pid1)
    D["   PID 1 exit to reaped"] = now() - tr
    if code != 0:
        raise SystemExit(f"FAIL: PID 1 exited {code}")
    if cg:
        tc = now()
        cgroup_remove(cg)
        D["10b cgroup remove"] = now() - tc
    tc = now()
    out = os.listdir(f"{staging}/output")
    shutil.rmtree(staging)
    D["staging cleanup (template)"] = now() - tc
    D["cycle: fork request to cleaned up"] = now() - C["fork"]
    if out != ["hello.txt"]:
        raise SystemExit(f"FAIL: output dir holds {out}")
    return {k: v / 1e6 for k, v in D.items()}, final["checks"]


def p99(xs):
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.99 * len(xs)) - 1)]


def table(title, rows):
    print(f"\n{title}")
    print(f"  {'part':<42} {'median ms':>10} {'p99 ms':>9} {'faults':>7}")
    for k, xs in rows.items():
        f = f"{statistics.median(FAULTS[k]):7.0f}" if k in FAULTS else ""
        print(f"  {k:<42} {statistics.median(xs):10.3f} {p99(xs):9.3f} {f}")


def check_child(checks, first=[True]):  # noqa: B006
    want = {"uid": [1000] * 3, "gid": [1000] * 3, "CapEff": "0" * 16, "CapBnd": "0" * 16, "NoNewPrivs": "1", "Seccomp": "2", "pid": 1, "landlock_write_proc": "EACCES", "seccomp_unshare": "EPERM", "input": "in"}
    bad = {k: (checks.get(k), v) for k, v in want.items() if checks.get(k) != v}
    if bad:
        raise SystemExit(f"FAIL: the fork is not confined as expected: {bad}")
    if first[0]:
        first[0] = False
        print(f"child checks (first fork): {json.dumps(checks)}")


def template_start():
    env = dict(os.environ)
    code = "import time, json\nT0 = time.perf_counter_ns()\n"
    if DATA:
        env["PYTHONPATH"] = ":".join(SITE)
        code += f"PANDAS_STEP = {PANDAS_STEP!r}\n" + WARMUP + "print(json.dumps(WARM))\n"
    else:
        code += "print('{}')\n"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)  # warm caches (font cache)
    walls, inner = [], {}
    for _ in range(STARTS):
        t = now()
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
        walls.append((now() - t) / 1e6)
        for k, v in json.loads(out).items():
            inner.setdefault(k, []).append(v / 1e6)
    bare = []
    for _ in range(STARTS):
        t = now()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append((now() - t) / 1e6)
    return walls, inner, bare


def main():
    print(f"uid {os.getuid()}; kernel {os.uname().release}; loadavg {open('/proc/loadavg').read().split()[:3]}")
    print(f"template: {'data stack (numpy, pandas, matplotlib.pyplot; warmed: one pandas step, one Agg figure)' if DATA else 'bare'}; {N} samples per variant, {IDLE} idle forks")
    if DATA:
        print("template warm-up in-process (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in TEMPLATE_WARM.items()))
    me = rollup("self")
    print(f"template: VmPTE {status_kb('self', 'VmPTE')} kB, RSS {me['Rss'] / 1024:.1f} MiB, PSS {me['Pss'] / 1024:.1f} MiB, threads {len(os.listdir('/proc/self/task'))}")
    print(f"landlock ABI {LL_ABI}: handled fs {LL_FS:#x}, net {LL_NET:#x}, scoped {LL_SCOPED:#x}")
    print(f"seccomp: {SC_NAMES} syscalls allowed ({SC_RULES} rules, from {SC_SOURCE}; unknown here: {SC_UNKNOWN or 'none'}), {len(BPF) // 8} BPF instructions, built once in {SC_BUILD_MS:.1f} ms")
    print(f"cgroup (part 10): {'v1 beneath ' + ', '.join(CG_PARENTS.values()) if isinstance(CG_PARENTS, dict) else 'SKIPPED: ' + CG_PARENTS}")
    ok(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")
    ref = {}
    for _ in range(N):  # the steps in the template itself, warm, no fork: the reference for 9
        for label, code in (("9a trivial step", TRIVIAL_STEP), ("9b pandas step", PANDAS_STEP)):
            if label.startswith("9b") and not DATA:
                continue
            t, f = now(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            exec(compile(code, "<step>", "exec"), {})
            ref.setdefault(label, []).append(((now() - t) / 1e6, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f))
    print("steps in the template itself (warm, no fork): " + "; ".join(f"{k[3:]} median {statistics.median(x for x, _ in v):.3f} ms, {statistics.median(f for _, f in v):.0f} faults" for k, v in ref.items()))

    rows, nonet = {}, []
    for _ in range(N):
        d, checks = one_fork(NS_ALL)
        check_child(checks)
        if checks["net"] != ["lo"]:
            raise SystemExit(f"FAIL: the netns shows {checks['net']}")
        for k, v in d.items():
            rows.setdefault(k, []).append(v)
        d2, _ = one_fork(NS_NO_NET)
        nonet.append(d2["3 unshare mnt,ipc,uts,cgroup,pid"])
        rows.setdefault("   ready, variant without netns", []).append(d2["ready: fork request to end of 8"])
    rows["3' unshare mnt,ipc,uts,cgroup,pid (no net)"] = nonet
    order = [k for k in rows if not k.startswith("   ready, variant")] + ["   ready, variant without netns"]
    table(f"parts ({N} samples; net variant and no-net variant alternate)", {k: rows[k] for k in order})
    net = statistics.median(rows["3 unshare mnt,ipc,uts,cgroup,pid,net"]) - statistics.median(nonet)
    parts = ["1 fork (to child's 1st instruction)", "2 userns + uid/gid maps", "3 unshare mnt,ipc,uts,cgroup,pid,net", "4 mounts (4a + 4b)", "5 fork PID 1 + mount /proc", "6 privileges", "7 landlock", "8 seccomp"]
    print(f"  netns creation's share of part 3 (difference of medians): {net:.3f} ms")
    print(f"  sum of medians of parts 1-8: {sum(statistics.median(rows[k]) for k in parts):.3f} ms")

    # (a) idle forks
    hold_r, hold_w = os.pipe()
    idle = []
    try:
        for _ in range(IDLE):
            d, checks, pid1, cg, staging, res_r = one_fork(NS_ALL, hold_r)
            check_child(checks)
            idle.append((pid1, cg, staging, res_r))
        tpl = rollup("self")
        uss, pte, rss, charged, kmem = [], [], [], [], []
        for pid1, cg, _, _ in idle:
            r = rollup(pid1)
            uss.append((r["Private_Clean"] + r["Private_Dirty"]) / 1024)
            rss.append(r["Rss"] / 1024)
            pte.append(status_kb(pid1, "VmPTE") / 1024)
            if cg:
                charged.append(int(open(f"{cg['memory']}/memory.usage_in_bytes").read()) / 2**20)
                kmem.append(int(open(f"{cg['memory']}/memory.kmem.usage_in_bytes").read()) / 2**20)
    finally:
        os.close(hold_w)
        for pid1, cg, staging, res_r in idle:
            reap(pid1)
            os.close(res_r)
            if cg:
                cgroup_remove(cg)
            shutil.rmtree(staging)
        os.close(hold_r)
    priv = [u + p for u, p in zip(uss, pte)]
    m = statistics.median(priv)
    print(f"\n(a) {IDLE} idle forks alive at once (parts 1-8 done), per fork, median [min-max] MiB:")
    print(f"  USS {statistics.median(uss):.2f} [{min(uss):.2f}-{max(uss):.2f}]  + own page tables {statistics.median(pte):.2f} = {m:.2f} private; RSS {statistics.median(rss):.1f}")
    if charged:
        print(f"  charged to its cgroup (user + kernel objects since attach): {statistics.median(charged):.2f} [{min(charged):.2f}-{max(charged):.2f}], of which kmem {statistics.median(kmem):.2f}")
    print(f"  template meanwhile: RSS {tpl['Rss'] / 1024:.1f} MiB, PSS {tpl['Pss'] / 1024:.1f} MiB (before the idle forks: RSS {me['Rss'] / 1024:.1f}, PSS {me['Pss'] / 1024:.1f}), VmPTE {status_kb('self', 'VmPTE') / 1024:.2f} MiB")
    fit = int(2048 // m)
    fit_t = int((2048 - me["Rss"] / 1024) // m)
    print(f"  idle forks in 2 GiB: {fit} by USS+PTE alone, {fit_t} after the template's own RSS" + (f", {int(2048 // statistics.median(charged))} by cgroup charge" if charged else ""))

    # (c) template start
    walls, inner, bare = template_start()
    st = statistics.median(walls)
    print(f"\n(c) a fresh template's start ({STARTS} samples, after one unmeasured warm run): median {st:.0f} ms, p99 {p99(walls):.0f} ms wall")
    print(f"  of which inside: " + ", ".join(f"{k} {statistics.median(v):.0f} ms" for k, v in inner.items()) + f"; bare interpreter start+exit: {statistics.median(bare):.1f} ms")
    ready = statistics.median(rows["ready: fork request to end of 8"])
    print(f"  re-made to re-randomise ASLR, amortised per step (vs {ready:.2f} ms to fork one jail):")
    for label, steps in (("every 100 steps", 100), ("every 1000 steps", 1000), ("every 10000 steps", 10000), ("every 60 s at 10 steps/s", 600)):
        print(f"    {label:<26} {st / steps:8.3f} ms/step")
    print(f"\nloadavg at the end {open('/proc/loadavg').read().split()[:3]}")


try:
    main()
finally:
    # Every child of ours still here (LIVE, and any PID 1 re-parented to us
    # that we had no pid for), by pid: killed, then reaped.
    try:
        kids = {int(p) for p in open(f"/proc/self/task/{os.getpid()}/children").read().split()}
    except OSError:
        kids = set()
    for pid in LIVE | kids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    for d in list(CG_MADE):
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except OSError as e:
                if e.errno != errno.EBUSY:
                    print(f"WARNING: could not remove cgroup {d}: {e}", file=sys.stderr)
                    break
                time.sleep(0.01)
        else:
            print(f"WARNING: could not remove cgroup {d}: still busy", file=sys.stderr)
    shutil.rmtree(BASE, ignore_errors=True)
