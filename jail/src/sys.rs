//! Thin, safe wrappers over the raw syscalls nix does not cover.
//!
//! This is the only module with `unsafe`. Each wrapper is a small safe
//! function that returns `io::Result` (and an `OwnedFd` where the kernel hands
//! back a descriptor); each `unsafe` block states the invariants it relies on.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::unistd::Pid;

// Stable kernel ABI values (include/uapi/linux/mount.h, openat2.h,
// close_range.h), spelled out here so we do not depend on which libc release
// happens to export them.
const OPEN_TREE_CLONE: libc::c_uint = 0x1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
/// `RESOLVE_NO_MAGICLINKS`: no `/proc/self/fd`-style jumps.
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// `RESOLVE_NO_SYMLINKS`: fail with ELOOP on any symlink component.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
/// `RESOLVE_BENEATH`: never leave the starting directory.
pub const RESOLVE_BENEATH: u64 = 0x08;
/// `RESOLVE_IN_ROOT`: resolve as if the starting directory were `/`
/// (absolute symlinks and `..` stay inside it).
pub(crate) const RESOLVE_IN_ROOT: u64 = 0x10;

/// `MOUNT_ATTR_*` bits for [`mount_setattr`].
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn path_cstring(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// How many threads this process has, from `/proc/self/status`.
pub(crate) fn thread_count() -> io::Result<usize> {
    proc_status_field("Threads")?
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "no Threads: line"))
}

/// The value of one `Name:` line of `/proc/self/status`, trimmed.
fn proc_status_field(name: &str) -> io::Result<String> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {name}: line")))
}

fn require_single_thread(what: &str) -> io::Result<()> {
    let n = thread_count()?;
    if n != 1 {
        return Err(io::Error::other(format!("{what} needs a single-threaded process, this one has {n} threads")));
    }
    Ok(())
}

/// Which side of a fork we are on.
pub enum Forked {
    Parent(Pid),
    Child,
}

/// `clone(flags | SIGCHLD)` with no new stack: fork(2) semantics plus
/// namespace flags. Refuses to run in a multi-threaded process, where the
/// child could inherit a lock held by a thread that no longer exists.
pub(crate) fn clone_process(flags: libc::c_int) -> io::Result<Forked> {
    require_single_thread("clone")?;
    // SAFETY: the process is single-threaded (checked above), so the child
    // starts with a consistent copy of every lock and allocator state. A null
    // stack makes the child run on a copy-on-write copy of our stack, exactly
    // like fork(2); the remaining arguments (ptid, ctid, tls) are unused
    // because no CLONE_*TID or CLONE_SETTLS flag is passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match check(ret)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(Pid::from_raw(pid as libc::pid_t))),
    }
}

/// `struct clone_args` up to `cgroup` (CLONE_ARGS_SIZE_VER2, Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3({flags | CLONE_INTO_CGROUP, exit_signal: SIGCHLD, cgroup})` with
/// no new stack: like [`clone_process`], but the child is born in the v2
/// cgroup `cgroup` (a directory descriptor). `Ok(None)`: this kernel has
/// no clone3 or no CLONE_INTO_CGROUP (before 5.7); use clone and a join.
pub(crate) fn clone_into_cgroup(flags: libc::c_int, cgroup: BorrowedFd<'_>) -> io::Result<Option<Forked>> {
    require_single_thread("clone3")?;
    let args = CloneArgs {
        flags: flags as u32 as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: as for clone_process: the process is single-threaded (checked
    // above) and a zero stack gives fork(2) semantics. `args` is a live,
    // fully initialised struct whose size we pass; no pointer in it is set.
    let ret = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    match check(ret) {
        Ok(0) => Ok(Some(Forked::Child)),
        Ok(pid) => Ok(Some(Forked::Parent(Pid::from_raw(pid as libc::pid_t)))),
        // ENOSYS: no clone3 (before 5.3); E2BIG: a clone3 that does not
        // know the cgroup field (5.3 to 5.6).
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::E2BIG)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// fork(2), refusing in a multi-threaded process.
pub fn fork_process() -> io::Result<Forked> {
    clone_process(0)
}

/// `pidfd_open(pid, 0)`: a descriptor that becomes readable when `pid` exits.
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; on success the kernel
    // returns a new descriptor that nothing else owns.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) })?;
    // SAFETY: `fd` is a fresh descriptor returned by the kernel just above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`: the signal reaches the process
/// the descriptor was opened for, never one that reused its pid.
pub(crate) fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: nix::sys::signal::Signal) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we borrow, a valid signal
    // number, no siginfo (NULL) and no flags.
    check(unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig as libc::c_int, std::ptr::null::<libc::siginfo_t>(), 0)
    })?;
    Ok(())
}

/// Whether the process `pidfd` names still lives: signal 0 through it,
/// which checks and sends nothing.
pub(crate) fn pidfd_alive(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: plain syscall on a descriptor we borrow, signal 0, no
    // siginfo (NULL) and no flags.
    check(unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0) })
        .is_ok()
}

/// `ioctl(ns, NS_GET_PARENT)`: the parent of the user (or pid) namespace
/// `ns` names.
pub(crate) fn namespace_parent(ns: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // linux/nsfs.h: NS_GET_PARENT is _IO(0xb7, 0x2).
    const NS_GET_PARENT: libc::c_ulong = 0xb702;
    // SAFETY: an ioctl that takes no argument, on a descriptor we borrow.
    let fd = check(unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_PARENT as _) } as libc::c_long)?;
    // SAFETY: `fd` is a fresh descriptor returned by the kernel just above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `faccessat2(fd, "", mode, AT_EACCESS | AT_EMPTY_PATH)`: the kernel's
/// check of whether this process, by its effective ids and groups, may use
/// the opened entry `fd` as `mode` (`R_OK`, `W_OK`, `X_OK`). The syscall
/// itself (Linux 5.8): glibc's `faccessat` before 2.33 checks these flags
/// in user space and refuses AT_EMPTY_PATH with EINVAL (Debian 11).
pub(crate) fn access_fd(fd: BorrowedFd<'_>, mode: libc::c_int) -> io::Result<()> {
    let empty = c"";
    // SAFETY: `fd` is a live descriptor borrowed for the call and `empty` a
    // static NUL-terminated string; nothing is written back.
    check(unsafe {
        libc::syscall(libc::SYS_faccessat2, fd.as_raw_fd(), empty.as_ptr(), mode, libc::AT_EACCESS | libc::AT_EMPTY_PATH)
    })?;
    Ok(())
}

/// `openat2(dirfd, path, {flags, 0, resolve})`.
pub fn openat2(dirfd: Option<BorrowedFd<'_>>, path: &Path, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    openat2_mode(dirfd, path, flags, 0, resolve)
}

/// `openat2(dirfd, path, {flags, mode, resolve})`: `mode` for `O_CREAT`.
pub fn openat2_mode(
    dirfd: Option<BorrowedFd<'_>>,
    path: &Path,
    flags: libc::c_int,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let c_path = path_cstring(path)?;
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: mode as u64, resolve };
    let dir = dirfd.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: `c_path` is a valid NUL-terminated string and `how` a properly
    // sized open_how that both outlive the call; the kernel copies them.
    let fd = check(unsafe {
        libc::syscall(libc::SYS_openat2, dir, c_path.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    })?;
    // SAFETY: `fd` is a fresh descriptor returned by the kernel just above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `open_tree(fd, "", OPEN_TREE_CLONE | AT_RECURSIVE | AT_EMPTY_PATH)`: a
/// detached copy of the mount tree at `fd`, ready for [`mount_setattr`] and
/// [`move_mount`].
pub(crate) fn open_tree_clone(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let empty = c"";
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | libc::AT_EMPTY_PATH as u32;
    // SAFETY: `fd` is a live descriptor borrowed for the call and `empty` a
    // static NUL-terminated string.
    let tree = check(unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), empty.as_ptr(), flags) })?;
    // SAFETY: `tree` is a fresh descriptor returned by the kernel just above.
    Ok(unsafe { OwnedFd::from_raw_fd(tree as RawFd) })
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, {attr_set})`: set
/// mount flags on every mount of a (detached) tree.
pub fn mount_setattr(fd: BorrowedFd<'_>, attr_set: u64) -> io::Result<()> {
    mount_setattr_at(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE, attr_set)
}

/// `mount_setattr(AT_FDCWD, path, 0, {attr_set})` on the one mount at `path`.
pub(crate) fn mount_setattr_path(path: &Path, attr_set: u64) -> io::Result<()> {
    let c_path = path_cstring(path)?;
    mount_setattr_at(libc::AT_FDCWD, &c_path, 0, attr_set)
}

fn mount_setattr_at(dirfd: RawFd, path: &CStr, flags: u32, attr_set: u64) -> io::Result<()> {
    let attr = MountAttr { attr_set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: `path` is NUL-terminated and `attr` a properly sized mount_attr;
    // both outlive the call and the kernel only reads them.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a
/// detached tree at `target`.
pub fn move_mount(fd: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let c_target = path_cstring(target)?;
    // SAFETY: `fd` is live for the call; both strings are NUL-terminated and
    // outlive it.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c_target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Mark every descriptor from `first` up close-on-exec (`close_range` with
/// `CLOSE_RANGE_CLOEXEC`), so nothing we inherited survives exec (runc
/// CVE-2024-21626). Kernels before 5.11 know close_range but not the flag
/// (EINVAL): there each open descriptor, as `/proc/self/fd` lists them, is
/// flagged with fcntl; if that list cannot be read, the error stands.
pub(crate) fn cloexec_from(first: RawFd) -> io::Result<()> {
    // SAFETY: integer-only syscall; it changes descriptor flags, never memory.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC) };
    match check(ret) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => cloexec_listed(first),
        Err(e) => Err(e),
    }
}

/// The pre-5.11 path of [`cloexec_from`]: FD_CLOEXEC on every descriptor
/// `/proc/self/fd` lists from `first` up (the listing's own descriptor is
/// close-on-exec already).
fn cloexec_listed(first: RawFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let mut fds = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = entry?.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) {
            fds.push(fd);
        }
    }
    for fd in fds.into_iter().filter(|&fd| fd >= first) {
        match fcntl(fd, FcntlArg::F_GETFD) {
            Ok(flags) => {
                let flags = FdFlag::from_bits_truncate(flags) | FdFlag::FD_CLOEXEC;
                fcntl(fd, FcntlArg::F_SETFD(flags))?;
            }
            // The listing's own descriptor, closed since.
            Err(nix::Error::EBADF) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Close every descriptor from `first` up except `keep`.
pub(crate) fn close_from_except(first: RawFd, keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&k| k >= first).collect();
    keep.sort_unstable();
    let mut lo = first;
    for k in keep {
        if k > lo {
            close_range(lo, k - 1)?;
        }
        lo = k + 1;
    }
    close_range(lo, RawFd::MAX)
}

fn close_range(lo: RawFd, hi: RawFd) -> io::Result<()> {
    // SAFETY: closing descriptors the caller has decided it no longer needs;
    // the Rust objects that owned any of them are never used afterwards
    // because the caller only does this right before exec or _exit paths.
    check(unsafe { libc::syscall(libc::SYS_close_range, lo as libc::c_uint, hi as libc::c_uint, 0) })?;
    Ok(())
}

/// This process's peak resident set size in bytes: `VmHWM` from
/// `/proc/self/status`, which covers only the current image.
/// (getrusage's ru_maxrss keeps the peak of the image before execve, so a
/// jail started by a big process would report that process's size.)
pub(crate) fn self_max_rss_bytes() -> u64 {
    let hwm = proc_status_field("VmHWM").ok().and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok());
    match hwm {
        Some(kib) => kib * 1024,
        None => nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
            .map(|u| u.max_rss() as u64 * 1024)
            .unwrap_or(0),
    }
}

/// `wait4(pid, 0)`: the exit status and resource usage of one child.
pub fn wait4(pid: Pid) -> io::Result<(libc::c_int, libc::rusage)> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data, valid when zeroed.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both out-pointers point at live locals of the right type.
        let ret = unsafe { libc::wait4(pid.as_raw(), &mut status, 0, &mut usage) };
        if ret >= 0 {
            return Ok((status, usage));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Ignore or restore the default for a signal (used for SIGPIPE and
/// SIGXFSZ before exec, so the script sees EPIPE/EFBIG like any program).
pub(crate) fn set_default_signal(sig: nix::sys::signal::Signal) -> io::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
    let act = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: installing SIG_DFL runs no handler code, so none of sigaction's
    // async-signal-safety requirements apply.
    unsafe { sigaction(sig, &act) }.map(|_| ()).map_err(io::Error::from)
}

/// The Landlock ABI version the kernel offers
/// (`landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`).
pub(crate) fn landlock_abi() -> io::Result<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attr and size 0 this call only returns a number;
    // it reads and writes no memory.
    let v = check(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })?;
    Ok(v as i32)
}

/// Send one descriptor over a unix socket (`SCM_RIGHTS`), with one byte.
pub(crate) fn send_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<()> {
    send_fds(sock, &[fd])
}

/// Send up to [`MAX_FDS`] descriptors over a unix socket in one message
/// (`SCM_RIGHTS`), with one byte.
pub(crate) fn send_fds(sock: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("more than {MAX_FDS} descriptors in one message")));
    }
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let iov = [io::IoSlice::new(b"f")];
    sendmsg::<UnixAddr>(sock.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// The most descriptors [`send_fds`] sends and [`recv_fds`] takes at once.
pub(crate) const MAX_FDS: usize = 8;

/// Receive what [`send_fd`] sent; `None` when the peer closed the socket
/// without sending a descriptor.
pub(crate) fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    Ok(recv_fds(sock)?.into_iter().next())
}

/// Receive one message of descriptors ([`send_fds`]), owned the moment
/// they arrive; empty when the peer closed the socket without sending any.
/// A message that carried more than [`MAX_FDS`] is an error (the kernel
/// has closed the ones that did not fit).
pub(crate) fn recv_fds(sock: BorrowedFd<'_>) -> io::Result<Vec<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg = recvmsg::<UnixAddr>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut got = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel installed `raw` in our table for this
                // message (SCM_RIGHTS); nothing else owns it yet.
                got.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::other(format!("a message carried more than {MAX_FDS} descriptors")));
    }
    Ok(got)
}

/// Bring the loopback interface `lo` of this network namespace up
/// (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS` with `IFF_UP`; netdevice(7)). A new
/// network namespace starts with `lo` down. Needs CAP_NET_ADMIN in the
/// namespace's owning user namespace.
pub(crate) fn loopback_up() -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data (a name and a union of integers and
    // addresses), valid when zeroed.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `sock` is a live socket and `req` a properly sized ifreq that
    // outlives the call; SIOCGIFFLAGS writes only its flags member.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req as *mut libc::ifreq) } as libc::c_long)?;
    // SAFETY: SIOCGIFFLAGS just filled the flags member of the union, so
    // reading and updating that member is reading initialized data.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req as *const libc::ifreq) } as libc::c_long)?;
    Ok(())
}

/// Whether `fd` is an open descriptor of this process.
pub(crate) fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD on any number only reads its flags.
    fd >= 0 && unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0
}

/// Own an inherited descriptor another process handed us by number
/// (`jail session start --lifeline-fd`); `None` unless it is open.
pub(crate) fn take_inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    if !fd_is_open(fd) {
        return None;
    }
    // SAFETY: the descriptor is open and was given to this process to own;
    // nothing else here uses that number.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Make `cmd`'s child get `fd` as descriptor `target` (inheritable) and an
/// empty signal mask, whatever mask the spawning thread has.
pub fn pass_fd_on_exec(cmd: &mut std::process::Command, fd: RawFd, target: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps close-on-exec: clear it then.
            let ok = if fd == target {
                libc::fcntl(target, libc::F_SETFD, 0) >= 0
            } else {
                libc::dup2(fd, target) >= 0
            };
            if !ok {
                return Err(io::Error::last_os_error());
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            Ok(())
        });
    }
}

/// `_exit(2)`: leave at once, without running atexit handlers or flushing
/// stdio buffers that belong to the parent's copy of this process.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and never returns; it touches no memory
    // of ours.
    unsafe { libc::_exit(code) }
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, flags, &prog)`: load a classic BPF
/// filter into the calling thread. With `SECCOMP_FILTER_FLAG_NEW_LISTENER`
/// in `flags` the kernel returns a user-notification listener (close-on-exec).
pub(crate) fn seccomp_set_mode_filter(program: &[libc::sock_filter], flags: u32) -> io::Result<Option<OwnedFd>> {
    const SECCOMP_SET_MODE_FILTER: libc::c_uint = 1;
    const SECCOMP_FILTER_FLAG_NEW_LISTENER: u32 = 1 << 3;
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp program longer than 65535 instructions"))?;
    let prog = libc::sock_fprog { len, filter: program.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel
    // copies the instructions and does not keep the pointer.
    let ret =
        check(unsafe { libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog as *const libc::sock_fprog) })?;
    if flags & SECCOMP_FILTER_FLAG_NEW_LISTENER == 0 {
        return Ok(None);
    }
    // SAFETY: with NEW_LISTENER the return value is a fresh descriptor that
    // nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(ret as RawFd) }))
}

/// A `SOCK_STREAM` unix socket pair, both ends close-on-exec.
pub(crate) fn stream_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    Ok(socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?)
}

/// A `SOCK_SEQPACKET` unix socket pair, both ends close-on-exec.
pub(crate) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    Ok(socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?)
}

/// Have the kernel send `sig` to the command's process when the thread that
/// spawned it dies (`prctl(PR_SET_PDEATHSIG)` between fork and exec), and
/// check after setting it that the parent is still the spawner (it may have
/// died in between). `jail serve` uses it so its runs die with it.
pub(crate) fn set_parent_death_signal(cmd: &mut std::process::Command, sig: nix::sys::signal::Signal) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // prctl and getppid, both async-signal-safe; it allocates nothing and
    // touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent.as_raw() {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    };
}

/// CPython's fork hooks, as `os.fork` calls them around fork(2).
pub(crate) struct PythonForkHooks {
    pub before: extern "C" fn(),
    pub after_parent: extern "C" fn(),
    pub after_child: extern "C" fn(),
}

/// The hooks of the interpreter this process is (the template, which
/// loaded this crate's cdylib); `None` in a process without them.
pub(crate) fn python_fork_hooks() -> Option<PythonForkHooks> {
    let find = |name: &std::ffi::CStr| -> Option<extern "C" fn()> {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only
        // looks the symbol up; it reads no memory of ours.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: CPython exports these three as `void f(void)`
        // (Include/intrcheck.h), callable with the GIL held, as we are.
        Some(unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn()>(p) })
    };
    Some(PythonForkHooks {
        before: find(c"PyOS_BeforeFork")?,
        after_parent: find(c"PyOS_AfterFork_Parent")?,
        after_child: find(c"PyOS_AfterFork_Child")?,
    })
}
