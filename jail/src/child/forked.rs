//! A template's fork's own first steps (template/fork.rs): what a cloned
//! child's supervisor does for it from outside (its id maps, knowing its
//! pid, its death with the supervisor), a fork does itself; and it leaves
//! its template's root for the host's before the setup every jail gets.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::mounts::HOST_ROOT;
use crate::sys;

/// The fork's PID 1, before its release: every signal at its default (the
/// template's interpreter installed its handlers), its id maps written
/// (its uid map left to its supervisor when `uid_by_supervisor`: a uid
/// leased for it alone, template/uids.rs), and its pid and host ids said
/// on `hello`, which then closes.
pub(crate) fn begin(hello: &OwnedFd, inside: (u32, u32), outside: (u32, u32), uid_by_supervisor: bool) -> std::io::Result<()> {
    for sig in Signal::iterator().filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP)) {
        sys::set_default_signal(sig)?;
    }
    std::fs::write("/proc/self/setgroups", "deny")?;
    if !uid_by_supervisor {
        std::fs::write("/proc/self/uid_map", format!("{} {} 1\n", inside.0, outside.0))?;
    }
    std::fs::write("/proc/self/gid_map", format!("{} {} 1\n", inside.1, outside.1))?;
    // No credentials of our own: the supervisor's end passes them
    // (SO_PASSCRED), so the kernel attaches ours, our pid and host ids as
    // the supervisor sees them, whether our uid is mapped here yet or not.
    let sent = nix::sys::socket::send(hello.as_raw_fd(), b"forked", nix::sys::socket::MsgFlags::MSG_NOSIGNAL)?;
    if sent != 6 {
        return Err(std::io::Error::other("the fork's word was cut short"));
    }
    Ok(())
}

/// Zero the host paths of a fork's mount plan before its worker returns to
/// the interpreter, which a step could read its own memory from: freed,
/// they would still be there.
pub(super) fn scrub(mounts: Vec<crate::mounts::MountOp>, staging: std::path::PathBuf) {
    use crate::mounts::MountOp;
    use std::os::unix::ffi::OsStringExt;
    let zero = |p: std::path::PathBuf| {
        let mut bytes = p.into_os_string().into_vec();
        bytes.fill(0);
        // Not a dead store to the optimiser: the bytes are read once more.
        std::hint::black_box(&bytes);
    };
    for op in mounts {
        match op {
            MountOp::Bind { source, path, .. } => {
                zero(source);
                zero(path);
            }
            MountOp::ScriptCopy { source, .. } => zero(source),
            _ => {}
        }
    }
    zero(staging);
}

/// Leave the template's root for the host's, kept beneath it.
pub(crate) fn leave_template_root() -> nix::Result<()> {
    nix::unistd::chroot(HOST_ROOT)?;
    nix::unistd::chdir("/")
}

/// The signals the fork's reaper waits for, as a descriptor it can poll
/// beside the status pipe (they are blocked already).
pub(crate) fn signals(handled: &SigSet) -> Option<SignalFd> {
    SignalFd::with_flags(handled, SfdFlags::SFD_CLOEXEC).ok()
}

/// The fork's reaper's wait: the next of its signals, or `None` when
/// there is none yet; `Err` once the supervisor's end of `status` is
/// closed (it is gone, and the jail must go too, as a cloned jail's PID 1
/// goes by its parent-death signal) or the signals cannot be waited for.
pub(crate) fn wait_signal(sfd: Option<&SignalFd>, status: &OwnedFd) -> Result<Option<Signal>, ()> {
    let sfd = sfd.ok_or(())?;
    let mut fds = [
        PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
        PollFd::new(status.as_fd(), PollFlags::empty()),
    ];
    if poll(&mut fds, PollTimeout::NONE).is_err() {
        return Ok(None);
    }
    if fds[1].revents().is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP)) {
        return Err(());
    }
    match sfd.read_signal() {
        Ok(Some(info)) => Ok(Signal::try_from(info.ssi_signo as i32).ok()),
        _ => Ok(None),
    }
}
