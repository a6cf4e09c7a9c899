#!/usr/bin/python3
"""Experiment (issue 18.2): attach a host folder read-only to a made jail.

A target stands in for a pooled jail: its own user + mount namespace, a
tmpfs root-ish dir with an empty `input` mount point, landlock applied
(read-only beneath `input`, made BEFORE the attach), waiting. A helper
joins the target's user namespace, unshares a mount namespace it owns,
resolves the host dir by an O_PATH|O_NOFOLLOW walk, clones it with
open_tree(OPEN_TREE_CLONE|AT_RECURSIVE), makes it rdonly/nosuid/nodev/
noexec with mount_setattr(AT_RECURSIVE), joins the target's mount
namespace and move_mounts the clone onto the mount point. The target
then reads a file, fails to write (EROFS), and is denied by landlock
outside `input`. Run as root and as an ordinary user.
"""
import ctypes, os, sys, time, errno

libc = ctypes.CDLL(None, use_errno=True)
SYS_setns, SYS_unshare, SYS_open_tree, SYS_move_mount, SYS_mount_setattr = 308, 272, 428, 429, 442
SYS_ll_create, SYS_ll_add, SYS_ll_restrict = 444, 445, 446
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 1, 2, 4, 8
O_PATH, O_NOFOLLOW, O_DIRECTORY = 0o10000000, 0o400000, 0o200000


def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"syscall {nr}: {os.strerror(e)}")
    return r


def walk_nofollow(path):
    """Resolve an absolute path one component at a time, never following a link."""
    fd = os.open("/", O_PATH | O_DIRECTORY)
    for part in [p for p in path.split("/") if p]:
        nfd = os.open(part, O_PATH | O_NOFOLLOW | O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def helper(pid, host_dir, target):
    userns = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    mntns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    sc(SYS_setns, userns, CLONE_NEWUSER)
    sc(SYS_unshare, CLONE_NEWNS)
    src = walk_nofollow(host_dir)
    tree = sc(SYS_open_tree, src, b"", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH)
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, 0, 0, 0)
    sc(SYS_mount_setattr, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    sc(SYS_setns, mntns, CLONE_NEWNS)
    sc(SYS_move_mount, tree, b"", -100, target.encode(), MOVE_MOUNT_F_EMPTY_PATH)


class LLAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class LLPath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_read_only_beneath(path):
    # ABI v1 fs rights: execute..make_sym (bits 0-12)
    handled = (1 << 13) - 1
    read = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read_file, read_dir
    ruleset = sc(SYS_ll_create, ctypes.byref(LLAttr(handled)), ctypes.sizeof(LLAttr), 0)
    fd = os.open(path, O_PATH)
    sc(SYS_ll_add, ruleset, 1, ctypes.byref(LLPath(read, fd)), 0)
    for p in ("/usr", "/lib", "/lib64", "/etc", "/proc"):
        if os.path.exists(p):
            pfd = os.open(p, O_PATH)
            sc(SYS_ll_add, ruleset, 1, ctypes.byref(LLPath(read, pfd)), 0)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    sc(SYS_ll_restrict, ruleset, 0)


def target(base, r, w):
    # new user ns (map own uid to 0) + mount ns
    uid, gid = os.getuid(), os.getgid()
    sc(SYS_unshare, CLONE_NEWUSER | CLONE_NEWNS)
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
    open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
    libc.mount(b"none", b"/", None, 0x40000 | 0x4000, None)  # MS_PRIVATE|MS_REC
    if libc.mount(b"tmpfs", base.encode(), b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs")
    os.mkdir(f"{base}/input")
    # ATTACH_RULE=parent puts the read rule on the mount point's parent
    rule = base if os.environ.get("ATTACH_RULE") == "parent" else f"{base}/input"
    landlock_read_only_beneath(rule)
    os.write(w, b"r")           # ready: the helper may attach
    os.read(r, 1)               # attached
    out = []
    try:
        out.append("read:" + open(f"{base}/input/data.txt").read().strip())
    except OSError as e:
        out.append(f"read failed {e}")
    try:
        open(f"{base}/input/new", "w")
        out.append("WRITE SUCCEEDED")
    except OSError as e:
        out.append(f"write denied {errno.errorcode[e.errno]}")
    try:
        open(f"{base}/input/link").read()
        out.append("link read (link is inside the folder; points to /etc/hostname)")
    except OSError as e:
        out.append(f"link read denied {errno.errorcode[e.errno]}")
    try:
        os.listdir("/tmp")
        out.append("LANDLOCK MISSED: listed /tmp")
    except OSError as e:
        out.append(f"landlock outside the rule {errno.errorcode[e.errno]}")
    mi = [l for l in open("/proc/self/mountinfo") if "/input " in l]
    out.append("mountinfo:" + (mi[-1].split(" - ")[0].split()[5] if mi else "none"))
    print("target:", "; ".join(out), flush=True)


def main():
    host = sys.argv[1]   # the host dir to attach
    base = sys.argv[2]   # an empty dir the target mounts its tmpfs on
    r1, w1 = os.pipe()   # target -> parent: ready
    r2, w2 = os.pipe()   # parent -> target: attached
    pid = os.fork()
    if pid == 0:
        try:
            target(base, r2, w1)
        finally:
            os._exit(0)
    os.read(r1, 1)
    t0 = time.perf_counter()
    h = os.fork()
    if h == 0:
        try:
            helper(pid, host, f"{base}/input")
            os._exit(0)
        except OSError as e:
            print("helper failed:", e, flush=True)
            os._exit(1)
    _, st = os.waitpid(h, 0)
    print(f"helper exit {os.waitstatus_to_exitcode(st)} in {(time.perf_counter()-t0)*1000:.2f} ms")
    os.write(w2, b"g")
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()

# Findings on Debian 12, kernel 6.18.44, x86_64 (2026-12-04), run as root
# and as jailtest (uid 1001):
#   ATTACH_RULE=mountpoint: attach OK (1-4 ms), write EROFS, mountinfo
#     ro,nosuid,nodev,noexec, BUT reading a file of the attached folder is
#     EACCES: landlock's path walk skips a hidden mount point (it jumps from
#     the attached mount's root to the mount point and on to its parent
#     without checking the mount point's own rules), so a rule made ahead on
#     the empty mount point does NOT cover what is attached there later.
#   ATTACH_RULE=parent: the same, and the read succeeds: a rule made ahead
#     on the mount point's parent (/workspace) does cover the attached tree.
# So a pooled jail grants read beneath /workspace (holding only input, code,
# output; input and code read-only by their mount flags, output its own
# capped tmpfs with its own read-write rule), not on /workspace/input.
