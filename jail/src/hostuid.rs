//! Which host uid a run started by root maps its sandbox to: one from the
//! policy's `identity.root_host_uids`, never shared with another live run.
//!
//! Per-user kernel accounting (pipe buffers, inotify instances, user
//! namespace counts, RLIMIT_NPROC outside the run's namespace) goes by host
//! uid, so two concurrent runs on one uid share it, and a uid such as
//! `nobody` shares it with the host's daemons too. Each uid of the range has
//! a lock file under [`LOCK_DIR`]; a run holds an exclusive flock(2) on the
//! first one it can get for as long as the supervisor lives, so the kernel
//! releases it however the supervisor ends (the tree dies with it:
//! PR_SET_PDEATHSIG). The lowest free uid is taken, so runs one after
//! another keep the same uid and only concurrent ones differ.
//!
//! Ordinary callers need none of this: their sandbox maps to their own uid
//! (namespaces.rs), which is theirs alone to share.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the lock files live: root's own run-time dir, a tmpfs, so they go
/// with a reboot.
pub(crate) const LOCK_DIR: &str = "/run/jail/uids";

/// The default range: 65536 uids from 0x70000000 (1879048192), above the
/// `/etc/subuid` ranges useradd hands out (100000 up to 600100000) and
/// systemd's container ranges (up to 1879048191), below 2^31; far from
/// system users, regular users and `nobody` (65534).
pub const DEFAULT_FIRST: u32 = 0x7000_0000;
pub const DEFAULT_COUNT: u32 = 65536;
/// The default host gid of every root-started run: one group for all of
/// them, so a folder they must write to can be given to the group.
pub const DEFAULT_GID: u32 = DEFAULT_FIRST;

/// `count` host uids from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub count: u32,
}

impl UidRange {
    /// Every uid of the range, lowest first.
    pub fn uids(self) -> impl Iterator<Item = u32> {
        (0..self.count).map(move |i| self.first + i)
    }

    pub fn last(self) -> u32 {
        self.first + (self.count - 1)
    }

    /// Whether `uid` is one of the range's.
    pub fn holds(self, uid: u32) -> bool {
        uid >= self.first && uid - self.first < self.count
    }

    /// Why the range cannot be used, if it cannot: empty, past u32, or
    /// holding root, `nobody` (65534) or the 16- and 32-bit "no uid"
    /// values the kernel reserves.
    pub fn problem(self) -> Option<String> {
        if self.count == 0 {
            return Some("count must be at least 1".into());
        }
        let Some(last) = self.first.checked_add(self.count - 1) else {
            return Some(format!("first {} + count {} goes past the largest uid", self.first, self.count));
        };
        for (uid, what) in [
            (0, "root"),
            (65534, "nobody"),
            (65535, "the 16-bit \"no uid\""),
            (u32::MAX, "the \"no uid\" value"),
        ] {
            if (self.first..=last).contains(&uid) {
                return Some(format!("{}..{last} includes {uid} ({what})", self.first));
            }
        }
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HostUidError {
    #[error("create the uid lock dir {path}")]
    LockDir { path: PathBuf, source: io::Error },
    #[error("the uid lock dir {path} is not a directory owned by root and writable by root alone")]
    UnsafeLockDir { path: PathBuf },
    #[error("open the uid lock file {path}")]
    Open { path: PathBuf, source: io::Error },
    #[error("lock {path}")]
    Lock { path: PathBuf, source: io::Error },
    #[error(
        "every host uid of identity.root_host_uids ({first}..{last}) is taken by another live run; \
         widen the range (count) or wait for a run to end"
    )]
    Exhausted { first: u32, last: u32 },
}

/// A host uid held for this run; the flock goes when this is dropped (or
/// when the process dies).
#[derive(Debug)]
pub struct Lease {
    pub uid: u32,
    _lock: File,
}

/// The host ids a run's sandbox maps to, and the lease that keeps the uid
/// its own while it runs.
#[derive(Debug)]
pub(crate) struct HostIds {
    pub uid: u32,
    pub gid: u32,
    /// For a run started by root; `None` for an ordinary caller.
    pub lease: Option<Lease>,
}

/// The script's file mode creation mask: 077 (what it makes is its
/// owner's alone), except in a folder bound into a run root started
/// (`filesystem.output_size: "unlimited"`), where the script writes the
/// host files as its leased uid: the next run on that folder may get
/// another uid of the range (a concurrent run held the first), so there
/// what a run makes is also the shared group's (007), or that later run
/// could not read what an earlier one left. Others get nothing either way,
/// and no user has the group. A capped output needs no group bits: its
/// host files are the caller's (fsid.rs), copied in as the sandbox's.
pub(crate) fn sandbox_umask(started_by_root: bool, output_bound: bool) -> u32 {
    if started_by_root && output_bound {
        0o007
    } else {
        0o077
    }
}

/// What a run started by root maps to on the host: a uid leased from
/// `uids` and the gid `gid`. The policy's `identity` converts into it, so
/// this module never imports the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RootIds {
    pub uids: UidRange,
    pub gid: u32,
}

/// An ordinary caller's sandbox maps to the caller's own ids; root's to a
/// uid leased from the policy's range and the policy's gid, never to 0.
pub(crate) fn for_caller(caller_uid: u32, caller_gid: u32, root: impl Into<RootIds>) -> Result<HostIds, HostUidError> {
    if caller_uid != 0 {
        return Ok(HostIds { uid: caller_uid, gid: caller_gid, lease: None });
    }
    let root = root.into();
    let lease = take(root.uids)?;
    Ok(HostIds { uid: lease.uid, gid: root.gid, lease: Some(lease) })
}

/// Take the lowest uid of `range` that no live run holds.
pub fn take(range: UidRange) -> Result<Lease, HostUidError> {
    take_in(Path::new(LOCK_DIR), range)
}

/// [`take`] with the lock files in `dir` (tests use a temp dir).
pub(crate) fn take_in(dir: &Path, range: UidRange) -> Result<Lease, HostUidError> {
    private_dir(dir)?;
    for uid in range.uids() {
        let path = dir.join(uid.to_string());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            // A lock file is a plain file we made; never follow a link.
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| HostUidError::Open { path: path.clone(), source })?;
        match file.try_lock() {
            Ok(()) => return Ok(Lease { uid, _lock: file }),
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(source)) => return Err(HostUidError::Lock { path, source }),
        }
    }
    Err(HostUidError::Exhausted { first: range.first, last: range.last() })
}

/// Make `dir` (and its parent) if missing, and check that it is a real
/// directory of our own that no one else can write to: whoever could plant
/// files there could hold every uid, or point a lock at something else.
fn private_dir(dir: &Path) -> Result<(), HostUidError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| HostUidError::LockDir { path: dir.to_path_buf(), source })?;
    let me = nix::unistd::geteuid().as_raw();
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let ok = std::fs::symlink_metadata(d).is_ok_and(|m| m.file_type().is_dir() && m.uid() == me && m.mode() & 0o022 == 0);
        if !ok {
            return Err(HostUidError::UnsafeLockDir { path: d.to_path_buf() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_caller_keeps_its_own_ids_and_leases_nothing() {
        let p = crate::policy::Policy::builtin_default().unwrap();
        let host = for_caller(1234, 1235, &p.identity).unwrap();
        assert_eq!((host.uid, host.gid), (1234, 1235));
        assert!(host.lease.is_none());
    }

    #[test]
    fn the_default_policy_leases_root_runs_from_the_default_range() {
        let p = crate::policy::Policy::builtin_default().unwrap();
        let root = RootIds::from(&p.identity);
        assert_eq!(root, RootIds { uids: UidRange { first: DEFAULT_FIRST, count: DEFAULT_COUNT }, gid: DEFAULT_GID });
        assert_eq!(root.uids, UidRange { first: 0x7000_0000, count: 65536 });
    }

    #[test]
    fn concurrent_leases_get_different_uids_and_a_released_one_comes_back() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("uids");
        let range = UidRange { first: 100_000, count: 3 };
        let a = take_in(&dir, range).unwrap();
        let b = take_in(&dir, range).unwrap();
        let c = take_in(&dir, range).unwrap();
        assert_eq!((a.uid, b.uid, c.uid), (100_000, 100_001, 100_002));
        let e = take_in(&dir, range).unwrap_err();
        assert!(matches!(e, HostUidError::Exhausted { first: 100_000, last: 100_002 }), "{e}");
        assert!(e.to_string().contains("widen the range"), "{e}");
        drop(b);
        assert_eq!(take_in(&dir, range).unwrap().uid, 100_001);
        // Runs one after another keep the lowest uid.
        drop((a, c));
        assert_eq!(take_in(&dir, range).unwrap().uid, 100_000);
    }

    #[test]
    fn a_lock_dir_others_can_write_to_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("uids");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = take_in(&dir, UidRange { first: 100_000, count: 1 }).unwrap_err();
        assert!(matches!(e, HostUidError::UnsafeLockDir { .. }), "{e}");
        // A link in place of the dir is refused too.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        assert!(matches!(take_in(&link, UidRange { first: 100_000, count: 1 }), Err(HostUidError::UnsafeLockDir { .. })));
    }

    #[test]
    fn a_lock_file_that_is_a_link_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("uids");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let target = t.path().join("elsewhere");
        std::os::unix::fs::symlink(&target, dir.join("100000")).unwrap();
        let e = take_in(&dir, UidRange { first: 100_000, count: 2 }).unwrap_err();
        assert!(matches!(e, HostUidError::Open { .. }), "{e}");
        assert!(!target.exists());
    }

    #[test]
    fn ranges_that_hold_root_nobody_or_overflow_are_refused() {
        assert_eq!(UidRange { first: DEFAULT_FIRST, count: DEFAULT_COUNT }.problem(), None);
        for (first, count, needle) in [
            (0, 10, "root"),
            (65000, 1000, "nobody"),
            (65535, 1, "16-bit"),
            (u32::MAX - 1, 2, "no uid"),
            (u32::MAX, 2, "largest uid"),
            (1000, 0, "at least 1"),
        ] {
            let p = UidRange { first, count }.problem().unwrap_or_default();
            assert!(p.contains(needle), "{first}+{count}: {p}");
        }
    }
}
