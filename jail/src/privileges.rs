//! Privileges on the child side: stdio, capabilities.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use caps::CapSet;

#[derive(Debug, thiserror::Error)]
pub(crate) enum PrivilegeError {
    #[error("dup2 onto fd {fd}")]
    Dup2 { fd: i32, source: nix::Error },
    #[error("open /dev/null")]
    OpenNull(#[source] io::Error),
    #[error("drop capability set {set}")]
    DropCaps {
        set: &'static str,
        source: caps::errors::CapsError,
    },
}

fn dup_onto(from: i32, to: i32) -> Result<(), PrivilegeError> {
    nix::unistd::dup2(from, to).map(drop).map_err(|source| PrivilegeError::Dup2 { fd: to, source })
}

/// stdin from /dev/null, stdout and stderr onto the supervisor's pipes.
pub(crate) fn stdio_onto(stdout: &OwnedFd, stderr: &OwnedFd) -> Result<(), PrivilegeError> {
    let null = std::fs::File::open("/dev/null").map_err(PrivilegeError::OpenNull)?;
    dup_onto(null.as_raw_fd(), 0)?;
    dup_onto(stdout.as_raw_fd(), 1)?;
    dup_onto(stderr.as_raw_fd(), 2)
}

/// The worker's stdin onto a session's control socket (session.rs): the
/// one descriptor besides stdio the cell driver inherits.
pub(crate) fn stdin_onto(control: &OwnedFd) -> Result<(), PrivilegeError> {
    dup_onto(control.as_raw_fd(), 0)
}

/// PID 1 lets go of the output pipes so only the script holds them.
pub(crate) fn release_stdio() -> Result<(), PrivilegeError> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null").map_err(PrivilegeError::OpenNull)?;
    dup_onto(null.as_raw_fd(), 1)?;
    dup_onto(null.as_raw_fd(), 2)
}

/// Empty every capability set. The bounding set goes first, while we still
/// hold CAP_SETPCAP; with it empty even an exec as uid 0 gains nothing.
pub(crate) fn drop_all_capabilities() -> Result<(), PrivilegeError> {
    for (set, name) in [
        (CapSet::Bounding, "bounding"),
        (CapSet::Ambient, "ambient"),
        (CapSet::Inheritable, "inheritable"),
        (CapSet::Effective, "effective"),
        (CapSet::Permitted, "permitted"),
    ] {
        caps::clear(None, set).map_err(|source| PrivilegeError::DropCaps { set: name, source })?;
    }
    Ok(())
}
