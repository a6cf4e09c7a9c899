//! `jail run` cancelled: SIGTERM, SIGINT or SIGHUP end the run the way a
//! timeout does, not the `jail` process. [`arm`] blocks the three in the
//! (still single-threaded) supervisor and opens a signalfd for them; the
//! watch loop polls it, and once it is readable kills the whole tree, so the
//! run goes on to reap PID 1, remove its cgroup, drop its temp dirs and
//! lease, and report `status: "cancelled"` (exit 128 + the signal).
//!
//! The mask is inherited by every thread the supervisor starts later, and by
//! the clone: the child side restores an empty mask before exec
//! (child.rs, `Stage::Signals`), so the script never sees it. A signal that
//! comes before the watch loop waits in the signalfd and is seen at its
//! first poll; one that comes after it (while the artifacts are delivered)
//! lets the run finish as it was.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::OnceLock;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// The signals that cancel a run.
pub(crate) const SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

static ARMED: OnceLock<SignalFd> = OnceLock::new();

/// Take [`SIGNALS`] from their default (death) to the watch loop. Call it
/// before any thread is started: a thread that does not block them would
/// still die of them.
pub(crate) fn arm() -> nix::Result<()> {
    let mut set = SigSet::empty();
    for sig in SIGNALS {
        set.add(sig);
    }
    set.thread_block()?;
    let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
    // Armed twice: the first signalfd serves; this one closes.
    let _ = ARMED.set(fd);
    Ok(())
}

/// The signalfd to poll, when armed.
pub(crate) fn fd() -> Option<BorrowedFd<'static>> {
    ARMED.get().map(|f| f.as_fd())
}

/// The cancelling signal received, if one is pending (read once).
pub(crate) fn received() -> Option<Signal> {
    let info = ARMED.get()?.read_signal().ok().flatten()?;
    Signal::try_from(info.ssi_signo as i32).ok()
}

/// The exit status of a run cancelled by `name` (`SIGTERM` → 143), as a
/// shell reports a process the signal killed.
pub(crate) fn exit_code(name: Option<&str>) -> i32 {
    let sig = name.and_then(|n| n.parse::<Signal>().ok()).unwrap_or(Signal::SIGTERM);
    128 + sig as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_run_exits_as_the_signal_would_have_killed_it() {
        assert_eq!(exit_code(Some("SIGTERM")), 143);
        assert_eq!(exit_code(Some("SIGINT")), 130);
        assert_eq!(exit_code(Some("SIGHUP")), 129);
        assert_eq!(exit_code(None), 143);
    }
}
