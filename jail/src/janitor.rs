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
//! tombstone and cgroups), `jail pool` (pool/run.rs: its work folder) and
//! the service (jail-serve's janitor.rs: its sessions, runs, folders and
//! nested cgroups, through [`start`], which names the janitor and keeps
//! the owner's stderr for the one line it may have to say). The lifeline
//! a pool's sessions hold is the same kind of pipe, read by the session's
//! watch loop rather than by a janitor (session/cells.rs).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::sync::Pipe;
use crate::sys::{self, Forked};

/// Tell the janitor `dirs`, the run cgroup's folders, one a line.
pub(crate) fn tell_cgroups(janitor: &OwnedFd, dirs: &[&std::path::Path]) {
    let mut text = String::new();
    for d in dirs {
        text.push_str(&d.display().to_string());
        text.push('\n');
    }
    let _ = nix::unistd::write(janitor, text.as_bytes());
}

/// In the janitor: remove the cgroup folders it was told
/// ([`tell_cgroups`]), once they are empty. The jail's PID 1 dies with its
/// supervisor (PR_SET_PDEATHSIG): they empty within moments, and rmdir
/// refuses until they do.
pub(crate) fn remove_told_cgroups(told: &[u8]) {
    use std::time::{Duration, Instant};
    let dirs: Vec<std::path::PathBuf> = String::from_utf8_lossy(told)
        .lines()
        .filter(|l| l.starts_with('/'))
        .map(std::path::PathBuf::from)
        .collect();
    let until = Instant::now() + Duration::from_secs(10);
    while dirs.iter().any(|d| d.exists()) && Instant::now() < until {
        for d in &dirs {
            if let Ok(entries) = std::fs::read_dir(d) {
                for e in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            let _ = std::fs::remove_dir(d);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bytes of what the owner told the janitor that are kept.
pub(crate) const MAX_TOLD: u64 = 64 << 10;

/// How a janitor another crate starts is made.
#[derive(Debug, Clone, Copy)]
pub struct Spec<'a> {
    /// Its process name (`/proc/PID/comm`, at most 15 bytes), so that
    /// the owner's tests and its operator can tell it from the owner.
    pub name: &'a std::ffi::CStr,
    /// Keep the owner's stderr: the one place a janitor that could not
    /// undo something can say so.
    pub keep_stderr: bool,
}

/// A janitor started by [`start`].
#[derive(Debug)]
pub struct Janitor {
    pub pid: u32,
    /// The owner's end of the pipe: lines written here are what the
    /// janitor is told; closing it (the owner's end, however it comes)
    /// starts the clean-up.
    pub pipe: OwnedFd,
}

/// Fork a janitor as `spec` says. Call before any thread starts.
pub fn start(spec: Spec<'_>, clean_up: impl FnOnce(&[u8])) -> std::io::Result<Janitor> {
    forked(Some(spec), clean_up)
}

/// Fork the janitor; the owner keeps the returned write end for its whole
/// life (dropping it is the signal). Call before any thread starts.
pub(crate) fn fork(clean_up: impl FnOnce(&[u8])) -> std::io::Result<OwnedFd> {
    forked(None, clean_up).map(|j| j.pipe)
}

fn forked(spec: Option<Spec<'_>>, clean_up: impl FnOnce(&[u8])) -> std::io::Result<Janitor> {
    let pipe = Pipe::new()?;
    match sys::fork_process()? {
        Forked::Child => {
            drop(pipe.write);
            let _ = nix::unistd::setsid();
            if let Some(spec) = spec {
                let _ = nix::sys::prctl::set_name(spec.name);
            }
            let keep_stderr = spec.is_some_and(|s| s.keep_stderr);
            if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
                for fd in 0..if keep_stderr { 2 } else { 3 } {
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
        Forked::Parent(pid) => Ok(Janitor { pid: pid.as_raw().unsigned_abs(), pipe: pipe.write }),
    }
}
