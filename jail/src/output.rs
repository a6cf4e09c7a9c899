//! The size-capped output dir. With `filesystem.output_size` set, the
//! jail's `/workspace/output` is a tmpfs of that size (so a script that
//! fills it meets ENOSPC, never the host's disk). The child hands the
//! supervisor a descriptor of that tmpfs; the supervisor fills it from the
//! host folder before the script starts ([`copy_in`]) and, once the whole
//! tree is dead, mirrors it back ([`copy_out`]).
//!
//! Supervisor side. Both walks open every entry relative to its parent's
//! descriptor, never following a symlink (openat2 `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`, `AT_SYMLINK_NOFOLLOW`), and run with the
//! sandbox's host uid as the filesystem uid, so they can read and write
//! exactly what the sandbox could through a bind mount and nothing more.
//!
//! What crosses: regular files (content, mode, times), directories,
//! symlinks (their target text, never followed) and fifos. Sockets and
//! devices do not: they are listed in `skipped`. Hard links arrive as
//! separate files. Entries the host folder had that could not be copied in
//! (unreadable, sockets) are left alone on the host; of the rest, what the
//! script deleted is deleted on the host and what it did not touch is not
//! rewritten (mtimes stay).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};

use crate::result::OutputSync;
use crate::sys::{self, RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS};

/// Deeper trees are not copied: a script could nest folders far past any
/// stack, and nothing legitimate needs this many levels.
pub const MAX_DEPTH: usize = 64;

/// Inodes of the output tmpfs: empty files cost no bytes, so the size cap
/// alone would let a script leave millions of them for the copy-out.
pub const MAX_INODES: u64 = 16_384;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("copy {path} into the jail's output dir")]
    CopyIn { path: PathBuf, source: io::Error },
    #[error("the output dir holds more than filesystem.output_size; raise it, or pass an emptier --output")]
    TooBig,
}

/// Filesystem ids for the walks: the sandbox's host uid and gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsIds {
    pub uid: u32,
    pub gid: u32,
}

/// Switches the filesystem uid and gid for as long as it lives. Changing
/// fsuid away from 0 drops root's filesystem capabilities (capabilities(7)),
/// which is the point.
struct AsSandbox {
    uid: Uid,
    gid: Gid,
}

impl AsSandbox {
    fn enter(ids: FsIds) -> AsSandbox {
        let gid = nix::unistd::setfsgid(Gid::from_raw(ids.gid));
        let uid = nix::unistd::setfsuid(Uid::from_raw(ids.uid));
        AsSandbox { uid, gid }
    }
}

impl Drop for AsSandbox {
    fn drop(&mut self) {
        nix::unistd::setfsuid(self.uid);
        nix::unistd::setfsgid(self.gid);
    }
}

/// What kind of entry, as far as copying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    Other,
}

fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFLNK => Kind::Symlink,
        SFlag::S_IFIFO => Kind::Fifo,
        _ => Kind::Other,
    }
}

/// An entry copied into the tmpfs, as it was right after the copy: if it
/// is still the same inode with the same ctime, the script never touched it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    kind: Kind,
    ino: u64,
    ctime: (i64, i64),
}

/// What [`copy_in`] put into the tmpfs, by path relative to the output dir.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    seen: BTreeMap<PathBuf, Seen>,
    /// Host entries that were not copied in, with the reason.
    pub skipped: Vec<String>,
}

impl Inventory {
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

fn ctime(st: &FileStat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

fn stat_at(dir: &OwnedFd, name: &OsStr) -> io::Result<FileStat> {
    nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io::Error::from)
}

fn open_at(dir: &OwnedFd, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    sys::openat2_mode(Some(dir.as_fd()), Path::new(name), flags, mode, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
}

fn open_dir_at(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
}

/// The names in a directory, without `.` and `..`, sorted.
fn names(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut d = nix::dir::Dir::from(dir.try_clone()?).map_err(io::Error::from)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(io::Error::from)?;
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name != "." && name != ".." {
            out.push(name.to_os_string());
        }
    }
    out.sort();
    Ok(out)
}

fn times(st: &FileStat) -> (TimeSpec, TimeSpec) {
    (TimeSpec::new(st.st_atime, st.st_atime_nsec), TimeSpec::new(st.st_mtime, st.st_mtime_nsec))
}

fn permission_bits(st: &FileStat) -> u32 {
    // No set-id bits travel either way.
    st.st_mode & 0o1777
}

fn copy_data(from: OwnedFd, to: &OwnedFd) -> io::Result<()> {
    let mut src = std::fs::File::from(from);
    let mut dst = std::fs::File::from(to.try_clone()?);
    io::copy(&mut src, &mut dst).map(drop)
}

/// Fill the output tmpfs (`tmpfs`, a directory descriptor) from the host
/// folder. Runs before the script starts, so nothing races it inside.
pub fn copy_in(host: &Path, tmpfs: &OwnedFd, ids: FsIds) -> Result<Inventory, OutputError> {
    // Opened as the caller, who may traverse parents the sandbox cannot (a
    // root caller's 0700 temp dir); everything beneath, as the sandbox.
    let root = sys::openat2(None, host, libc::O_RDONLY | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS)
        .map_err(|source| OutputError::CopyIn { path: host.to_path_buf(), source })?;
    let _as = AsSandbox::enter(ids);
    let mut inv = Inventory::default();
    fill(&root, tmpfs, Path::new(""), 0, &mut inv).map_err(|e| match e {
        OutputError::CopyIn { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => OutputError::TooBig,
        other => other,
    })?;
    Ok(inv)
}

fn fill(host: &OwnedFd, tmp: &OwnedFd, rel: &Path, depth: usize, inv: &mut Inventory) -> Result<(), OutputError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| OutputError::CopyIn { path, source }
    };
    for name in names(host).map_err(err(rel))? {
        let path = rel.join(&name);
        let st = stat_at(host, &name).map_err(err(&path))?;
        let kind = kind_of(&st);
        match kind {
            Kind::Dir if depth >= MAX_DEPTH => {
                inv.skipped.push(format!("{}: deeper than {MAX_DEPTH} levels", path.display()));
                continue;
            }
            Kind::Dir => {
                let sub = match open_dir_at(host, &name) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                        inv.skipped.push(format!("{}: not readable by the sandbox", path.display()));
                        continue;
                    }
                    Err(e) => return Err(err(&path)(e)),
                };
                nix::sys::stat::mkdirat(Some(tmp.as_raw_fd()), name.as_os_str(), Mode::from_bits_truncate(0o700))
                    .map_err(|e| err(&path)(e.into()))?;
                let tsub = open_dir_at(tmp, &name).map_err(err(&path))?;
                fill(&sub, &tsub, &path, depth + 1, inv)?;
                nix::sys::stat::fchmod(tsub.as_raw_fd(), Mode::from_bits_truncate(permission_bits(&st)))
                    .map_err(|e| err(&path)(e.into()))?;
                let (a, m) = times(&st);
                nix::sys::stat::futimens(tsub.as_raw_fd(), &a, &m).map_err(|e| err(&path)(e.into()))?;
            }
            Kind::File => {
                let src = match open_at(host, &name, libc::O_RDONLY | libc::O_NOFOLLOW, 0) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                        inv.skipped.push(format!("{}: not readable by the sandbox", path.display()));
                        continue;
                    }
                    Err(e) => return Err(err(&path)(e)),
                };
                let dst = open_at(tmp, &name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)
                    .map_err(err(&path))?;
                copy_data(src, &dst).map_err(err(&path))?;
                nix::sys::stat::fchmod(dst.as_raw_fd(), Mode::from_bits_truncate(permission_bits(&st)))
                    .map_err(|e| err(&path)(e.into()))?;
                let (a, m) = times(&st);
                nix::sys::stat::futimens(dst.as_raw_fd(), &a, &m).map_err(|e| err(&path)(e.into()))?;
            }
            Kind::Symlink => {
                let target = nix::fcntl::readlinkat(Some(host.as_raw_fd()), name.as_os_str()).map_err(|e| err(&path)(e.into()))?;
                nix::unistd::symlinkat(target.as_os_str(), Some(tmp.as_raw_fd()), name.as_os_str())
                    .map_err(|e| err(&path)(e.into()))?;
            }
            Kind::Fifo => {
                nix::unistd::mkfifoat(Some(tmp.as_raw_fd()), name.as_os_str(), Mode::from_bits_truncate(permission_bits(&st)))
                    .map_err(|e| err(&path)(e.into()))?;
            }
            Kind::Other => {
                inv.skipped.push(format!("{}: not a file, folder, symlink or fifo", path.display()));
                continue;
            }
        }
        let now = stat_at(tmp, &name).map_err(err(&path))?;
        inv.seen.insert(path, Seen { kind, ino: now.st_ino, ctime: ctime(&now) });
    }
    Ok(())
}

/// Mirror the output tmpfs back into the host folder. Runs once the whole
/// tree is dead: nothing inside can change the tmpfs under the walk. Never
/// fails as a whole; what could not be mirrored is listed in `errors`.
pub fn copy_out(tmpfs: &OwnedFd, host: &Path, inv: &Inventory, ids: FsIds) -> OutputSync {
    let mut sync = OutputSync { copied_in: inv.len() as u64, skipped: inv.skipped.clone(), ..OutputSync::default() };
    // Opened as the caller, walked as the sandbox (see copy_in).
    let root = sys::openat2(None, host, libc::O_RDONLY | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS);
    let _as = AsSandbox::enter(ids);
    match root {
        Ok(root) => mirror(tmpfs, &root, Path::new(""), 0, inv, &mut sync),
        Err(e) => sync.errors.push(format!("open {}: {e}", host.display())),
    }
    sync
}

static PARTIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A name for a file being written beside its final name.
fn partial_name() -> OsString {
    let n = PARTIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    OsString::from(format!(".jail-partial-{}-{n}", std::process::id()))
}

fn mirror(tmp: &OwnedFd, host: &OwnedFd, rel: &Path, depth: usize, inv: &Inventory, sync: &mut OutputSync) {
    let present: Vec<OsString> = match names(tmp) {
        Ok(n) => n,
        Err(e) => {
            sync.errors.push(format!("list {}: {e}", display(rel)));
            return;
        }
    };
    // What the script deleted: copied in from here, and gone now.
    let present_set: BTreeSet<&OsString> = present.iter().collect();
    let gone: Vec<PathBuf> = inv
        .seen
        .keys()
        .filter(|p| p.parent() == Some(rel) && p.file_name().is_some_and(|n| !present_set.contains(&n.to_os_string())))
        .cloned()
        .collect();
    for path in gone {
        if let Some(name) = path.file_name() {
            remove_copied(host, name, &path, inv, sync);
        }
    }
    for name in present {
        let path = rel.join(&name);
        let st = match stat_at(tmp, &name) {
            Ok(st) => st,
            Err(e) => {
                sync.errors.push(format!("stat {}: {e}", path.display()));
                continue;
            }
        };
        let kind = kind_of(&st);
        if let Some(s) = inv.seen.get(&path) {
            if kind != Kind::Dir && s.kind == kind && s.ino == st.st_ino && s.ctime == ctime(&st) {
                sync.unchanged += 1;
                continue;
            }
        }
        match kind {
            Kind::Dir if depth >= MAX_DEPTH => sync.skipped.push(format!("{}: deeper than {MAX_DEPTH} levels", path.display())),
            Kind::Dir => mirror_dir(tmp, host, &name, &path, &st, depth, inv, sync),
            Kind::File | Kind::Symlink | Kind::Fifo => match place(tmp, host, &name, &path, &st, kind, inv, sync) {
                Ok(()) => sync.copied_out += 1,
                Err(e) => sync.errors.push(format!("{}: {e}", path.display())),
            },
            Kind::Other => sync.skipped.push(format!("{}: a socket or device does not leave the jail", path.display())),
        }
    }
}

fn display(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        rel.display().to_string()
    }
}

#[allow(clippy::too_many_arguments)]
fn mirror_dir(tmp: &OwnedFd, host: &OwnedFd, name: &OsStr, path: &Path, st: &FileStat, depth: usize, inv: &Inventory, sync: &mut OutputSync) {
    let existing = stat_at(host, name).ok();
    if existing.is_some_and(|e| kind_of(&e) != Kind::Dir) && !remove_copied(host, name, path, inv, sync) {
        sync.errors.push(format!("{}: a host entry of another kind is in the way", path.display()));
        return;
    }
    let created = !matches!(existing, Some(e) if kind_of(&e) == Kind::Dir);
    if created {
        if let Err(e) = nix::sys::stat::mkdirat(Some(host.as_raw_fd()), name, Mode::from_bits_truncate(0o700)) {
            sync.errors.push(format!("mkdir {}: {e}", path.display()));
            return;
        }
        sync.copied_out += 1;
    }
    let (hsub, tsub) = match (open_dir_at(host, name), readable_dir(tmp, name, st)) {
        (Ok(h), Ok(t)) => (h, t),
        (Err(e), _) | (_, Err(e)) => {
            sync.errors.push(format!("open {}: {e}", path.display()));
            return;
        }
    };
    mirror(&tsub, &hsub, path, depth + 1, inv, sync);
    let _ = nix::sys::stat::fchmod(hsub.as_raw_fd(), Mode::from_bits_truncate(permission_bits(st)));
    let (a, m) = times(st);
    let _ = nix::sys::stat::futimens(hsub.as_raw_fd(), &a, &m);
}

/// Open a tmpfs folder to read it, granting ourselves (its owner) read
/// access if the script took it away.
fn readable_dir(tmp: &OwnedFd, name: &OsStr, st: &FileStat) -> io::Result<OwnedFd> {
    if st.st_mode & 0o500 != 0o500 {
        nix::sys::stat::fchmodat(
            Some(tmp.as_raw_fd()),
            name,
            Mode::from_bits_truncate((st.st_mode | 0o700) & 0o7777),
            nix::sys::stat::FchmodatFlags::NoFollowSymlink,
        )
        .map_err(io::Error::from)?;
    }
    open_dir_at(tmp, name)
}

/// Write one file, symlink or fifo beside its host name, then rename it
/// over that name (which replaces a symlink there rather than following it).
#[allow(clippy::too_many_arguments)]
fn place(tmp: &OwnedFd, host: &OwnedFd, name: &OsStr, path: &Path, st: &FileStat, kind: Kind, inv: &Inventory, sync: &mut OutputSync) -> io::Result<()> {
    if let Ok(existing) = stat_at(host, name) {
        if kind_of(&existing) == Kind::Dir && !remove_copied(host, name, path, inv, sync) {
            return Err(io::Error::other("a host folder with entries the script never saw is in the way"));
        }
    }
    let partial = partial_name();
    let result = write_partial(tmp, host, name, &partial, st, kind);
    if let Err(e) = result {
        let _ = nix::unistd::unlinkat(Some(host.as_raw_fd()), partial.as_os_str(), UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    nix::fcntl::renameat(Some(host.as_raw_fd()), partial.as_os_str(), Some(host.as_raw_fd()), name).map_err(io::Error::from)
}

fn write_partial(tmp: &OwnedFd, host: &OwnedFd, name: &OsStr, partial: &OsStr, st: &FileStat, kind: Kind) -> io::Result<()> {
    match kind {
        Kind::File => {
            if st.st_mode & 0o400 == 0 {
                nix::sys::stat::fchmodat(
                    Some(tmp.as_raw_fd()),
                    name,
                    Mode::from_bits_truncate((st.st_mode | 0o600) & 0o7777),
                    nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                )
                .map_err(io::Error::from)?;
            }
            let src = open_at(tmp, name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
            let dst = open_at(host, partial, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)?;
            copy_data(src, &dst)?;
            nix::sys::stat::fchmod(dst.as_raw_fd(), Mode::from_bits_truncate(permission_bits(st))).map_err(io::Error::from)?;
            let (a, m) = times(st);
            nix::sys::stat::futimens(dst.as_raw_fd(), &a, &m).map_err(io::Error::from)
        }
        Kind::Symlink => {
            let target = nix::fcntl::readlinkat(Some(tmp.as_raw_fd()), name).map_err(io::Error::from)?;
            nix::unistd::symlinkat(target.as_os_str(), Some(host.as_raw_fd()), partial).map_err(io::Error::from)
        }
        Kind::Fifo => nix::unistd::mkfifoat(Some(host.as_raw_fd()), partial, Mode::from_bits_truncate(permission_bits(st)))
            .map_err(io::Error::from),
        Kind::Dir | Kind::Other => Err(io::Error::other("not a file, symlink or fifo")),
    }
}

/// Remove a host entry the script deleted, if it is one we copied in: a
/// folder only through the entries we copied in, then itself if that left
/// it empty. Returns whether the name is free now.
fn remove_copied(host: &OwnedFd, name: &OsStr, path: &Path, inv: &Inventory, sync: &mut OutputSync) -> bool {
    let Ok(st) = stat_at(host, name) else { return true };
    if !inv.seen.contains_key(path) {
        return false;
    }
    if kind_of(&st) == Kind::Dir {
        let Ok(sub) = open_dir_at(host, name) else { return false };
        let children: Vec<PathBuf> = inv.seen.keys().filter(|p| p.parent() == Some(path)).cloned().collect();
        for child in children {
            if let Some(n) = child.file_name() {
                remove_copied(&sub, n, &child, inv, sync);
            }
        }
        drop(sub);
        match nix::unistd::unlinkat(Some(host.as_raw_fd()), name, UnlinkatFlags::RemoveDir) {
            Ok(()) => {
                sync.deleted += 1;
                true
            }
            Err(e) => {
                sync.errors.push(format!("rmdir {}: {e}", path.display()));
                false
            }
        }
    } else {
        match nix::unistd::unlinkat(Some(host.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => {
                sync.deleted += 1;
                true
            }
            Err(e) => {
                sync.errors.push(format!("unlink {}: {e}", path.display()));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn ids() -> FsIds {
        FsIds { uid: nix::unistd::geteuid().as_raw(), gid: nix::unistd::getegid().as_raw() }
    }

    fn dir_fd(p: &Path) -> OwnedFd {
        sys::openat2(None, p, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap()
    }

    fn tree(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let p = e.path();
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                let m = std::fs::symlink_metadata(&p).unwrap();
                if m.file_type().is_symlink() {
                    out.push(format!("{rel} -> {}", std::fs::read_link(&p).unwrap().display()));
                } else if m.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(base, &p, out);
                } else if m.file_type().is_file() {
                    out.push(format!("{rel} = {}", std::fs::read_to_string(&p).unwrap_or_default()));
                } else {
                    out.push(format!("{rel} (special)"));
                }
            }
        }
        walk(root, root, &mut out);
        out
    }

    #[test]
    fn a_round_trip_with_no_changes_leaves_the_host_as_it_was() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(host.path().join("d")).unwrap();
        std::fs::write(host.path().join("d/a.txt"), "a").unwrap();
        std::fs::write(host.path().join("b.csv"), "b").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", host.path().join("link")).unwrap();
        nix::unistd::mkfifo(&host.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let before = tree(host.path());
        let mtime = std::fs::metadata(host.path().join("b.csv")).unwrap().mtime_nsec();

        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        assert_eq!(inv.len(), 5);
        assert_eq!(tree(tmp.path()), before);
        let sync = copy_out(&t, host.path(), &inv, ids());
        assert_eq!((sync.copied_out, sync.deleted, sync.unchanged), (0, 0, 4), "{sync:?}");
        assert!(sync.errors.is_empty(), "{sync:?}");
        assert_eq!(tree(host.path()), before);
        assert_eq!(std::fs::metadata(host.path().join("b.csv")).unwrap().mtime_nsec(), mtime);
    }

    #[test]
    fn creations_changes_and_deletions_inside_reach_the_host() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(host.path().join("old")).unwrap();
        std::fs::write(host.path().join("old/x"), "x").unwrap();
        std::fs::write(host.path().join("keep"), "k").unwrap();
        std::fs::write(host.path().join("edit"), "1").unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();

        // The script's doing, on the tmpfs side.
        std::fs::remove_dir_all(tmp.path().join("old")).unwrap();
        std::fs::write(tmp.path().join("edit"), "2").unwrap();
        std::fs::create_dir_all(tmp.path().join("new/deep")).unwrap();
        std::fs::write(tmp.path().join("new/deep/f.png"), "png").unwrap();
        std::os::unix::fs::symlink("../keep", tmp.path().join("new/l")).unwrap();

        let sync = copy_out(&t, host.path(), &inv, ids());
        assert!(sync.errors.is_empty(), "{sync:?}");
        assert_eq!(
            tree(host.path()),
            vec!["edit = 2", "keep = k", "new/", "new/deep/", "new/deep/f.png = png", "new/l -> ../keep"]
        );
        assert_eq!(sync.deleted, 2);
    }

    #[test]
    fn a_host_symlink_in_the_way_is_replaced_not_followed() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let victim = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(victim.path(), "precious").unwrap();
        std::os::unix::fs::symlink(victim.path(), host.path().join("out.txt")).unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        std::fs::remove_file(tmp.path().join("out.txt")).unwrap();
        std::fs::write(tmp.path().join("out.txt"), "mine").unwrap();
        let sync = copy_out(&t, host.path(), &inv, ids());
        assert!(sync.errors.is_empty(), "{sync:?}");
        assert_eq!(std::fs::read_to_string(victim.path()).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(host.path().join("out.txt")).unwrap(), "mine");
        assert!(!std::fs::symlink_metadata(host.path().join("out.txt")).unwrap().file_type().is_symlink());
    }

    #[test]
    fn unreadable_host_entries_are_skipped_and_left_alone() {
        if nix::unistd::geteuid().is_root() {
            // Root reads everything; the walk as the sandbox uid is what
            // the end-to-end tests exercise for root.
            return;
        }
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), "s").unwrap();
        std::fs::set_permissions(host.path().join("secret"), std::fs::Permissions::from_mode(0o000)).unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        assert_eq!(inv.skipped.len(), 1, "{:?}", inv.skipped);
        let sync = copy_out(&t, host.path(), &inv, ids());
        assert_eq!(sync.deleted, 0);
        assert!(host.path().join("secret").exists());
    }

    #[test]
    fn sockets_do_not_leave_and_are_listed() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(tmp.path().join("s.sock")).unwrap();
        let sync = copy_out(&t, host.path(), &inv, ids());
        assert!(!host.path().join("s.sock").exists());
        assert_eq!(sync.skipped.len(), 1, "{sync:?}");
    }
}
