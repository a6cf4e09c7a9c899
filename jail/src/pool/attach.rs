//! Attach a host folder read-only to a jail that is already made (the
//! pool's claim step, supervisor side).
//!
//! A helper process joins the jail's user namespace, unshares a mount
//! namespace of its own (owned by that user namespace, so cloning a mount
//! is allowed to an ordinary user), resolves the host folder without
//! following a link, clones it, makes the clone read-only, nosuid, nodev
//! and noexec recursively, joins the jail's mount namespace and moves the
//! clone onto the mount point. Settled on 6.18 as root and as an ordinary
//! user by scripts/experiments/attach_mount.py. The jail is named by a
//! pidfd, so a recycled pid can never receive the folder.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};

use crate::sys::{self, Forked};

/// Longest failure text the helper sends back.
const MAX_REPORT: u64 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("make the attach helper's report pipe")]
    Pipe(#[source] io::Error),
    #[error("fork the attach helper")]
    Fork(#[source] io::Error),
    #[error("wait for the attach helper")]
    Wait(#[source] nix::Error),
    #[error("attach {host} at {mount_point}: {detail}")]
    Failed {
        host: String,
        mount_point: String,
        detail: String,
    },
}

/// Attach `host` (an absolute host path, every component resolved without
/// following a link) read-only at `mount_point` (an absolute path in the
/// jail whose PID 1 `jail` names). Blocks until the helper is done: a few
/// milliseconds.
pub fn attach_read_only(jail: BorrowedFd<'_>, host: &Path, mount_point: &Path) -> Result<(), AttachError> {
    let (read, write) = nix::unistd::pipe().map_err(|e| AttachError::Pipe(e.into()))?;
    match sys::fork_process().map_err(AttachError::Fork)? {
        Forked::Child => {
            drop(read);
            helper(jail, host, mount_point, write)
        }
        Forked::Parent(pid) => {
            drop(write);
            let mut detail = String::new();
            let _ = File::from(read).take(MAX_REPORT).read_to_string(&mut detail);
            match waitpid(pid, None).map_err(AttachError::Wait)? {
                WaitStatus::Exited(_, 0) if detail.is_empty() => Ok(()),
                status => Err(AttachError::Failed {
                    host: host.display().to_string(),
                    mount_point: mount_point.display().to_string(),
                    detail: if detail.is_empty() { format!("the helper ended: {status:?}") } else { detail },
                }),
            }
        }
    }
}

/// The helper: each step, or the step that failed written to `report`
/// and exit 1.
fn helper(jail: BorrowedFd<'_>, host: &Path, mount_point: &Path, report: OwnedFd) -> ! {
    match helper_steps(jail, host, mount_point) {
        Ok(()) => sys::exit_now(0),
        Err(text) => {
            let _ = File::from(report).write_all(text.as_bytes());
            sys::exit_now(1)
        }
    }
}

fn helper_steps(jail: BorrowedFd<'_>, host: &Path, mount_point: &Path) -> Result<(), String> {
    let step = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    // The jail's user namespace first: the mount namespace unshared next is
    // then owned by it, which lets an ordinary user clone a mount there.
    setns(jail, CloneFlags::CLONE_NEWUSER).map_err(|e| step("join the jail's user namespace", &e))?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| step("unshare a mount namespace", &e))?;
    // Resolved after the unshare: open_tree clones only mounts of the
    // caller's own mount namespace.
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let resolve = sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS;
    let source = sys::openat2(None, host, flags, resolve)
        .map_err(|e| step("open the host folder (no link may be on its path; it must be a folder)", &e))?;
    let tree = sys::open_tree_clone(source.as_fd()).map_err(|e| step("clone the host folder (open_tree)", &e))?;
    let attrs = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOEXEC;
    sys::mount_setattr(tree.as_fd(), attrs).map_err(|e| step("make the clone read-only (mount_setattr)", &e))?;
    // The detached clone moves into whichever mount namespace we are in.
    setns(jail, CloneFlags::CLONE_NEWNS).map_err(|e| step("join the jail's mount namespace", &e))?;
    // No untrusted code has run in the jail yet, so its mount point is
    // still the one its plan made.
    sys::move_mount(tree.as_fd(), mount_point).map_err(|e| step("attach the clone (move_mount)", &e))?;
    Ok(())
}
