//! Who the supervisor is on the filesystem while it copies between the host
//! output folder and the jail's output tmpfs (output.rs, delivery.rs).
//!
//! Supervisor side. Two sides, two identities:
//!
//! - [`As::Host`], the host folder: the caller (this process's real uid and
//!   gid) **without** the capabilities that override file permissions, so
//!   the kernel checks plain mode bits. Root's own 0700 `mktemp -d` folder
//!   works; another user's 0600 file in it is unreadable, as it would be to
//!   an ordinary user; what the host receives is owned by the caller.
//! - [`As::Jail`], the output tmpfs: the sandbox's host uid and gid, so what
//!   is copied in belongs to the script, and what the script made (even
//!   0600) is its owner's to read back.
//!
//! The ids are the thread's filesystem uid and gid (setfsuid(2)). A change
//! of fsuid from 0 to anything else clears the filesystem capabilities from
//! the effective set, and a change back to 0 raises them again from the
//! permitted set (capabilities(7), "Effect of user ID changes on
//! capabilities"): fsuid 0 alone is root with every override, so every
//! switch to a side whose uid is 0 lowers them again. Both are per-thread
//! state: [`Acting`] is not `Send`, and restores what it found on drop.
//! For an ordinary caller both sides are the same uid and nothing switches.

use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::path::Path;

use caps::{CapSet, Capability, CapsHashSet};
use nix::fcntl::AtFlags;
use nix::unistd::{AccessFlags, Gid, Uid};

/// Filesystem ids: a uid and a gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FsIds {
    pub uid: u32,
    pub gid: u32,
}

impl FsIds {
    /// Whoever runs `jail`: this process's real ids.
    pub(crate) fn caller() -> FsIds {
        FsIds { uid: nix::unistd::getuid().as_raw(), gid: nix::unistd::getgid().as_raw() }
    }
}

/// Which side of the copy an operation touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum As {
    /// The host output folder: the caller, by mode bits.
    Host,
    /// The jail's output tmpfs: the sandbox's host ids.
    Jail,
}

/// The capabilities that override file permission checks: the set the
/// kernel clears from the effective set when fsuid leaves 0
/// (capabilities(7)).
const FS_CAPS: [Capability; 8] = [
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_LINUX_IMMUTABLE,
    Capability::CAP_MAC_OVERRIDE,
    Capability::CAP_MKNOD,
];

#[derive(Debug, thiserror::Error)]
pub(crate) enum FsIdError {
    #[error("read the effective capabilities")]
    ReadCaps(#[source] caps::errors::CapsError),
    #[error("lower the filesystem capabilities (CAP_DAC_OVERRIDE and the rest) for the output copy")]
    LowerCaps(#[source] caps::errors::CapsError),
}

impl From<FsIdError> for io::Error {
    fn from(e: FsIdError) -> io::Error {
        io::Error::other(e)
    }
}

/// The calling thread acting as one side or the other, from [`Acting::begin`]
/// until it is dropped. Start it once per walk and run each filesystem
/// operation through [`Acting::on`], naming its side.
pub(crate) struct Acting {
    host: FsIds,
    jail: FsIds,
    now: As,
    /// What the thread had before: restored on drop.
    saved_uid: Uid,
    saved_gid: Gid,
    saved_effective: CapsHashSet,
    /// The effective set without [`FS_CAPS`], on either side.
    lowered: CapsHashSet,
    /// setfsuid and capset act on the calling thread only.
    _thread: PhantomData<*const ()>,
}

impl Acting {
    /// Act as the caller on the host side and as `jail` on the tmpfs side;
    /// starts on the host side.
    pub(crate) fn begin(jail: FsIds) -> Result<Acting, FsIdError> {
        Acting::with(FsIds::caller(), jail)
    }

    fn with(host: FsIds, jail: FsIds) -> Result<Acting, FsIdError> {
        let saved_effective = caps::read(None, CapSet::Effective).map_err(FsIdError::ReadCaps)?;
        let mut lowered = saved_effective.clone();
        for c in FS_CAPS {
            lowered.remove(&c);
        }
        let saved_gid = nix::unistd::setfsgid(Gid::from_raw(host.gid));
        let saved_uid = nix::unistd::setfsuid(Uid::from_raw(host.uid));
        let acting = Acting {
            host,
            jail,
            now: As::Host,
            saved_uid,
            saved_gid,
            saved_effective,
            lowered,
            _thread: PhantomData,
        };
        // On drop from here, whatever happens next.
        caps::set(None, CapSet::Effective, &acting.lowered).map_err(FsIdError::LowerCaps)?;
        Ok(acting)
    }

    /// Run `op` as `side`.
    pub(crate) fn on<T>(&mut self, side: As, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.switch(side)?;
        op()
    }

    fn switch(&mut self, side: As) -> Result<(), FsIdError> {
        if side == self.now {
            return Ok(());
        }
        let ids = match side {
            As::Host => self.host,
            As::Jail => self.jail,
        };
        self.now = side;
        if self.host == self.jail {
            return Ok(());
        }
        nix::unistd::setfsgid(Gid::from_raw(ids.gid));
        nix::unistd::setfsuid(Uid::from_raw(ids.uid));
        if ids.uid == 0 {
            // Back to fsuid 0: the kernel raised the filesystem
            // capabilities again (capabilities(7)).
            caps::set(None, CapSet::Effective, &self.lowered).map_err(FsIdError::LowerCaps)?;
        }
        Ok(())
    }
}

impl Drop for Acting {
    fn drop(&mut self) {
        nix::unistd::setfsgid(self.saved_gid);
        nix::unistd::setfsuid(self.saved_uid);
        if let Err(e) = caps::set(None, CapSet::Effective, &self.saved_effective) {
            // Raising within the permitted set does not fail; should it, the
            // supervisor goes on with fewer privileges, never more.
            eprintln!("jail: the supervisor's capabilities were not restored after the output copy: {e}");
        }
    }
}

/// Whether the host side may list, create and remove entries in the
/// folder `dir` (the caller, without overrides: r, w and x by its mode bits
/// and the caller's groups). The folder is opened with the caller's full
/// rights, as the copy opens it; the kernel makes the check itself, with
/// the very credentials the copy will use (faccessat(2) `AT_EACCESS` checks
/// the filesystem ids and the effective capabilities).
pub(crate) fn host_may_write(dir: &Path) -> io::Result<bool> {
    let fd = crate::sys::openat2(None, dir, libc::O_RDONLY | libc::O_DIRECTORY, crate::sys::RESOLVE_NO_SYMLINKS)?;
    let caller = FsIds::caller();
    let mut fs = Acting::with(caller, caller)?;
    let rwx = AccessFlags::R_OK | AccessFlags::W_OK | AccessFlags::X_OK;
    match fs.on(As::Host, || Ok(nix::unistd::faccessat(Some(fd.as_raw_fd()), ".", rwx, AtFlags::AT_EACCESS)?)) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn effective_fs_caps() -> Vec<Capability> {
        let now = caps::read(None, CapSet::Effective).unwrap();
        FS_CAPS.into_iter().filter(|c| now.contains(c)).collect()
    }

    fn fsuid() -> u32 {
        // An invalid id changes nothing and returns the current one.
        nix::unistd::setfsuid(Uid::from_raw(u32::MAX)).as_raw()
    }

    #[test]
    fn as_root_the_host_side_keeps_no_override_even_after_the_jail_side() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // In a thread of its own: the ids and capabilities are per thread.
        std::thread::spawn(|| {
            let before = effective_fs_caps();
            assert!(!before.is_empty(), "root without filesystem capabilities cannot run this test");
            let secret = tempfile::tempdir().unwrap();
            std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o000)).unwrap();
            let probe = secret.path().join("x");
            {
                let mut fs = Acting::with(FsIds { uid: 0, gid: 0 }, FsIds { uid: 1_879_048_199, gid: 1_879_048_199 }).unwrap();
                for side in [As::Host, As::Jail, As::Host] {
                    let r = fs.on(side, || std::fs::write(&probe, "x"));
                    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied, "{side:?}");
                    assert_eq!(effective_fs_caps(), vec![], "{side:?}");
                }
                assert_eq!(fsuid(), 0);
            }
            assert_eq!(effective_fs_caps(), before, "restored on drop");
            std::fs::write(&probe, "x").expect("root again, with its overrides");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_jail_side_is_the_sandbox_uid_and_the_host_side_the_caller() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        std::thread::spawn(|| {
            let sandbox = FsIds { uid: 1_879_048_199, gid: 1_879_048_199 };
            let dir = tempfile::tempdir().unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
            let mut fs = Acting::with(FsIds { uid: 0, gid: 0 }, sandbox).unwrap();
            fs.on(As::Jail, || std::fs::create_dir(dir.path().join("j"))).unwrap();
            fs.on(As::Host, || std::fs::create_dir(dir.path().join("h"))).unwrap();
            drop(fs);
            use std::os::unix::fs::MetadataExt;
            let uid = |n: &str| std::fs::metadata(dir.path().join(n)).unwrap().uid();
            assert_eq!((uid("j"), uid("h")), (sandbox.uid, 0));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_host_side_may_write_a_folder_by_its_mode_bits_only() {
        let dir = tempfile::tempdir().unwrap();
        assert!(host_may_write(dir.path()).unwrap(), "a 0700 folder of the caller's own");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o500)).unwrap();
        // Root too: its CAP_DAC_OVERRIDE is not used.
        assert!(!host_may_write(dir.path()).unwrap());
        assert!(
            caps::has_cap(None, CapSet::Effective, Capability::CAP_DAC_OVERRIDE).unwrap() == nix::unistd::geteuid().is_root()
        );
    }
}
