//! A host uid of its own for every fork of a root-started template.
//!
//! A jail started by root runs as a host uid leased for it alone
//! (hostuid.rs). A fork's user namespace is nested in its template's, so
//! it can only map ids the template's namespace maps. The template's
//! supervisor therefore maps the whole lease range into the template's
//! namespace, each uid to itself, beside the template's own sandbox uid
//! (which maps to the template's lease, left out of the range):
//!
//! ```text
//! 1000 T 1                  the template's sandbox uid: its own lease T
//! F F (T - F)               the range below T, each uid as itself
//! T+1 T+1 (L - T)           the range above T, up to its last uid L
//! ```
//!
//! The template itself has no capability, so it cannot take any of those
//! uids. Each fork's supervisor leases a uid for its fork as for any jail
//! and writes the fork's uid map, `1000 U 1` where U is that uid (the same
//! number in the template's namespace as on the host): only a process in
//! the fork's parent namespace with `CAP_SETUID` there may map another
//! id than its own, so a helper joins the template's namespace to write
//! it. The fork then takes its sandbox uid (child.rs) and is that host
//! uid from its first step on: per-uid kernel accounting (RLIMIT_NPROC,
//! pipe buffers, inotify) is its own, not shared with other tenants'
//! forks. An ordinary user's jails all run as that user, forked or not,
//! so none of this applies.
//!
//! Where the layout cannot be made (the policy's sandbox uid falls in its
//! own lease range), forks share their template's host uid as before, and
//! each result's `isolation.degraded` says so (template.rs, `note`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::hostuid::UidRange;
use crate::sys::{self, Forked};

/// No link followed on the way to a /proc entry.
const NO_LINKS: u64 = sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS;

/// The uid map of a root-started template whose sandbox uid `inside` maps
/// to its lease `leased`, every other uid of `range` mapped as itself;
/// `None` where `inside` lies in `range` (the lines would overlap).
pub(crate) fn template_uid_map(inside: u32, leased: u32, range: UidRange) -> Option<String> {
    if range.holds(inside) || !range.holds(leased) {
        return None;
    }
    let mut lines = format!("{inside} {leased} 1\n");
    if leased > range.first {
        lines.push_str(&format!("{0} {0} {1}\n", range.first, leased - range.first));
    }
    if leased < range.last() {
        lines.push_str(&format!("{0} {0} {1}\n", leased + 1, range.last() - leased));
    }
    Some(lines)
}

/// Whether a fork's supervisor maps its fork's uid: the template's map
/// (above) holds the range.
pub(crate) fn maps_forks(inside: u32, range: UidRange) -> bool {
    !range.holds(inside)
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MapError {
    #[error("open the fork's /proc entry")]
    Proc(#[source] io::Error),
    #[error("the fork ended before its uid map was written")]
    Gone,
    #[error("find the template's user namespace (NS_GET_PARENT)")]
    Parent(#[source] io::Error),
    #[error("fork the uid map helper")]
    Fork(#[source] io::Error),
    #[error("wait for the uid map helper")]
    Wait(#[source] nix::Error),
    #[error("write the fork's uid map ({0})")]
    Write(String),
}

/// Write `inside uid 1` as the uid map of the fork `pid` (named by its
/// `pidfd` too, so that a pid reused meanwhile is never mapped): a helper
/// joins the fork's parent user namespace (its template's) and writes it
/// from there. Root only: joining that namespace takes `CAP_SYS_ADMIN`
/// over it.
pub(crate) fn map_fork(pid: Pid, pidfd: BorrowedFd<'_>, inside: u32, uid: u32) -> Result<(), MapError> {
    let dir = sys::openat2(None, Path::new(&format!("/proc/{}", pid.as_raw())), libc::O_DIRECTORY | libc::O_RDONLY, NO_LINKS)
        .map_err(MapError::Proc)?;
    // The folder is the fork's only if the fork still lives now.
    if !sys::pidfd_alive(pidfd) {
        return Err(MapError::Gone);
    }
    // A namespace is named by a magic link, this one the kernel's own.
    let ns = sys::openat2(Some(dir.as_fd()), Path::new("ns/user"), libc::O_RDONLY, 0).map_err(MapError::Proc)?;
    let parent = sys::namespace_parent(ns.as_fd()).map_err(MapError::Parent)?;
    let line = format!("{inside} {uid} 1\n");
    match sys::fork_process().map_err(MapError::Fork)? {
        Forked::Child => {
            let code = match write_from(parent.as_fd(), dir.as_fd(), line.as_bytes()) {
                Ok(()) => 0,
                Err(step) => step,
            };
            sys::exit_now(code)
        }
        Forked::Parent(helper) => match wait(helper)? {
            WaitStatus::Exited(_, 0) => Ok(()),
            WaitStatus::Exited(_, code) => Err(MapError::Write(match code {
                1 => "join the template's user namespace".into(),
                2 => "open uid_map from there".into(),
                _ => "write uid_map".into(),
            })),
            other => Err(MapError::Write(format!("the helper ended: {other:?}"))),
        },
    }
}

/// The helper's end, however many signals interrupt the wait.
fn wait(helper: Pid) -> Result<WaitStatus, MapError> {
    loop {
        match waitpid(helper, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            done => return done.map_err(MapError::Wait),
        }
    }
}

/// The helper's steps: its exit code names the one that failed.
fn write_from(parent: BorrowedFd<'_>, dir: BorrowedFd<'_>, line: &[u8]) -> Result<(), i32> {
    nix::sched::setns(parent, nix::sched::CloneFlags::CLONE_NEWUSER).map_err(|_| 1)?;
    // Opened from the template's namespace: the kernel takes a map written
    // by its opener only from the target's parent namespace or its own.
    let map = sys::openat2(Some(dir), Path::new("uid_map"), libc::O_WRONLY, NO_LINKS).map_err(|_| 2)?;
    match nix::unistd::write(&map, line) {
        Ok(n) if n == line.len() => Ok(()),
        _ => Err(3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: UidRange = UidRange { first: 100, count: 10 };

    #[test]
    fn the_template_maps_the_range_around_its_own_lease_never_twice() {
        assert_eq!(template_uid_map(1000, 104, RANGE).unwrap(), "1000 104 1\n100 100 4\n105 105 5\n");
        assert_eq!(template_uid_map(1000, 100, RANGE).unwrap(), "1000 100 1\n101 101 9\n");
        assert_eq!(template_uid_map(1000, 109, RANGE).unwrap(), "1000 109 1\n100 100 9\n");
        let one = UidRange { first: 100, count: 1 };
        assert_eq!(template_uid_map(1000, 100, one).unwrap(), "1000 100 1\n");
    }

    #[test]
    fn a_sandbox_uid_inside_the_range_leaves_forks_on_the_templates_uid() {
        assert_eq!(template_uid_map(105, 104, RANGE), None);
        assert!(!maps_forks(105, RANGE));
        assert!(maps_forks(1000, RANGE));
        // A lease is always of the range.
        assert_eq!(template_uid_map(1000, 99, RANGE), None);
    }
}
