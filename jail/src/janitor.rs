//! One janitor for whatever a process leaves should it be killed: a child
//! forked while the owner is still single-threaded, in a session of its own
//! (a Ctrl-C meant for the owner's group must not end it first), stdio on
//! /dev/null, holding nothing of the owner's but the read end of a pipe
//! whose only write end the owner keeps. The owner may tell it lines
//! on that pipe (what it should undo beyond what it was forked knowing,
//! [`MAX_TOLD`] bytes at most); when the pipe hangs up — the owner ended,
//! however it ended — the janitor runs its clean-up with what it was told,
//! and exits. An owner that ended normally has done the clean-up already:
//! a janitor's work must be harmless when repeated.
//!
//! Used by the session supervisor (session.rs: its socket, driver folder,
//! tombstone and cgroups) and `jail pool` (pool/run.rs: its work folder).
//! The lifeline a pool's sessions hold is the same kind of pipe, read by
//! the session's watch loop rather than by a janitor (session/cells.rs).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::sync::Pipe;
use crate::sys::{self, Forked};

/// Bytes of what the owner told the janitor that are kept.
pub(crate) const MAX_TOLD: u64 = 64 << 10;

/// Fork the janitor; the owner keeps the returned write end for its whole
/// life (dropping it is the signal). Call before any thread starts.
pub(crate) fn fork(clean_up: impl FnOnce(&[u8])) -> std::io::Result<OwnedFd> {
    let pipe = Pipe::new()?;
    match sys::fork_process()? {
        Forked::Child => {
            drop(pipe.write);
            let _ = nix::unistd::setsid();
            if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
                for fd in 0..3 {
                    let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
                }
            }
            // Hold nothing of the owner's: above all not a listening socket
            // or another pipe whose hang-up someone waits for.
            let _ = sys::close_from_except(3, &[pipe.read.as_raw_fd()]);
            let mut told = Vec::new();
            let _ = std::fs::File::from(pipe.read).take(MAX_TOLD).read_to_end(&mut told);
            clean_up(&told);
            sys::exit_now(0)
        }
        Forked::Parent(_) => Ok(pipe.write),
    }
}
