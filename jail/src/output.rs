//! The size-capped output dir. With `filesystem.output_size` set, the
//! jail's `/workspace/output` is a tmpfs of that size (so a script that
//! fills it meets ENOSPC, never the host's disk). The child hands the
//! supervisor a descriptor of that tmpfs; the supervisor fills it from the
//! host folder before the script starts ([`copy_in`]) and, once the whole
//! tree is dead, mirrors it back ([`copy_out`]).
//!
//! Supervisor side. Both walks open every entry relative to its parent's
//! descriptor, never following a symlink (openat2 `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`, `AT_SYMLINK_NOFOLLOW`). Each operation names its
//! side (fsid.rs): the host folder is read and written as the caller
//! without the capabilities that override permissions (plain mode bits,
//! so a root caller's 0700 folder works and another user's 0600 file in it
//! stays unread), the tmpfs as the sandbox's host ids (what is copied in
//! is the script's, and what the script made is readable back). The folder
//! itself is opened with the caller's full rights first, so its parents
//! need not be open to anyone else.
//!
//! What crosses in: regular files, directories, symlinks and fifos of the
//! host folder (hard-linked, set-id, device and socket entries stay on the
//! host, reported as refused; stale `.jail-partial-*` files of dead jails
//! are swept). What crosses out: only the files the artifact check accepted
//! ([`Wanted`], judged on the tmpfs by delivery.rs), each written to an
//! unnamed `O_TMPFILE` and linked in once complete, sparse files kept
//! sparse, at most `output_size` bytes allocated on the host in all, and
//! nothing after the deadline. What the script deleted is deleted on the
//! host, what it did not touch is not rewritten (mtimes stay), and host
//! entries that could not be copied in are left alone (an unreadable file
//! is not even replaced by a file the script made under its name).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::{Pid, UnlinkatFlags, Whence};

use crate::accept::{kind_of, names, permission_bits, stat_at, times, Kind, MAX_DEPTH};
use crate::artifacts::budget::Spend;
use crate::artifacts::neutralise::{self, NeutraliseError, Written};
use crate::artifacts::PastBudget;
use crate::fsid::{Acting, As};
use crate::result::{OutputSync, RejectReason};
use crate::sys::{self, RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS};

/// When the script used its whole wall time, the copy to the host still
/// gets this long after the artifact check (so what a script wrote before a
/// timeout reaches the host); otherwise it must end by the wall deadline.
pub(crate) const COPY_GRACE: Duration = Duration::from_secs(1);

/// Inodes of the output tmpfs: empty files cost no bytes, so the size cap
/// alone would let a script leave millions of them for the copy-out.
pub(crate) const MAX_INODES: u64 = 16_384;

#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputError {
    #[error("copy {path} into the jail's output dir")]
    CopyIn { path: PathBuf, source: io::Error },
    #[error("the output dir holds more than filesystem.output_size; raise it, or pass an emptier --output")]
    TooBig,
}

pub(crate) use crate::fsid::FsIds;

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
pub(crate) struct Inventory {
    seen: BTreeMap<PathBuf, Seen>,
    /// Host entries that were not copied in, with the reason.
    pub skipped: Vec<String>,
    /// The host entries among them the caller could not read: never
    /// replaced, since the script never saw them.
    unread: BTreeSet<PathBuf>,
    /// Stale `.jail-partial-*` files of dead jails removed from the host.
    pub swept: u64,
    /// Host entries the artifact check would refuse, not copied in (hard
    /// links, set-id files, devices, sockets): they stay on the host as they
    /// were, and are reported as refused.
    pub refused: Vec<(PathBuf, RejectReason, String)>,
}

impl Inventory {
    pub(crate) fn len(&self) -> usize {
        self.seen.len()
    }
}

fn ctime(st: &FileStat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

fn open_at(dir: &OwnedFd, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    sys::openat2_mode(Some(dir.as_fd()), Path::new(name), flags, mode, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
}

fn open_dir_at(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
}

/// Why a host entry was not copied in.
const UNREADABLE: &str = "not readable by its mode bits (jail reads the host folder as its caller, without capabilities)";

fn copy_data(from: OwnedFd, to: &OwnedFd) -> io::Result<()> {
    let mut src = std::fs::File::from(from);
    let mut dst = std::fs::File::from(to.try_clone()?);
    io::copy(&mut src, &mut dst).map(drop)
}

/// Open the host folder: its path with the caller's full rights (its
/// parents may be closed to everyone else, a root caller's 0700 temp dir),
/// then the folder itself again by mode bits, as the host side.
fn open_host(fs: &mut Acting, host: &Path) -> io::Result<OwnedFd> {
    // The caller's path, taken as every door takes one (accept.rs).
    let outer = sys::openat2(None, host, libc::O_RDONLY | libc::O_DIRECTORY, crate::accept::RESOLVE)?;
    fs.on(As::Host, || open_dir_at(&outer, OsStr::new(".")))
}

/// Fill the output tmpfs (`tmpfs`, a directory descriptor) from the host
/// folder. Runs before the script starts, so nothing races it inside.
/// `ids` are the sandbox's host ids (the tmpfs side).
pub(crate) fn copy_in(host: &Path, tmpfs: &OwnedFd, ids: FsIds) -> Result<Inventory, OutputError> {
    let err = |source: io::Error| OutputError::CopyIn { path: host.to_path_buf(), source };
    let mut fs = Acting::begin(ids).map_err(|e| err(e.into()))?;
    let root = open_host(&mut fs, host).map_err(err)?;
    let mut inv = Inventory::default();
    fill(&mut fs, &root, tmpfs, Path::new(""), 0, &mut inv).map_err(|e| match e {
        OutputError::CopyIn { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => OutputError::TooBig,
        other => other,
    })?;
    Ok(inv)
}

fn fill(
    fs: &mut Acting,
    host: &OwnedFd,
    tmp: &OwnedFd,
    rel: &Path,
    depth: usize,
    inv: &mut Inventory,
) -> Result<(), OutputError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| OutputError::CopyIn { path, source }
    };
    for name in fs.on(As::Host, || names(host)).map_err(err(rel))? {
        let path = rel.join(&name);
        let st = fs.on(As::Host, || stat_at(host, &name)).map_err(err(&path))?;
        let kind = kind_of(&st);
        if let Some(pid) = partial_owner(&name) {
            // A file another jail was writing here: never copied in; swept
            // when its writer is dead (killed mid-copy), like a stale cgroup.
            if kind == Kind::File && !pid_alive(pid) {
                let unlinked = fs.on(As::Host, || {
                    nix::unistd::unlinkat(Some(host.as_raw_fd()), name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                        .map_err(io::Error::from)
                });
                match unlinked {
                    Ok(()) => inv.swept += 1,
                    Err(e) => {
                        inv.skipped.push(format!("{}: a stale partial copy that could not be removed: {e}", path.display()))
                    }
                }
            }
            continue;
        }
        match kind {
            Kind::Dir if depth >= MAX_DEPTH => {
                inv.skipped.push(format!("{}: deeper than {MAX_DEPTH} levels", path.display()));
                continue;
            }
            Kind::Dir => {
                let sub = match fs.on(As::Host, || open_dir_at(host, &name)) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                        inv.skipped.push(format!("{}: {UNREADABLE}", path.display()));
                        inv.unread.insert(path);
                        continue;
                    }
                    Err(e) => return Err(err(&path)(e)),
                };
                let tsub = fs
                    .on(As::Jail, || {
                        nix::sys::stat::mkdirat(Some(tmp.as_raw_fd()), name.as_os_str(), Mode::from_bits_truncate(0o700))?;
                        open_dir_at(tmp, &name)
                    })
                    .map_err(err(&path))?;
                fill(fs, &sub, &tsub, &path, depth + 1, inv)?;
                fs.on(As::Jail, || {
                    nix::sys::stat::fchmod(tsub.as_raw_fd(), Mode::from_bits_truncate(permission_bits(&st)))?;
                    let [a, m] = times(&st);
                    Ok(nix::sys::stat::futimens(tsub.as_raw_fd(), &a, &m)?)
                })
                .map_err(err(&path))?;
            }
            Kind::File if st.st_nlink > 1 || st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 => {
                // Not copied in: the artifact check would have to refuse the
                // copy for what the host file is, and could not see it.
                let (reason, why) = if st.st_nlink > 1 {
                    (
                        RejectReason::HardLink,
                        format!("the file has {} names (hard links); left on the host, never copied in", st.st_nlink),
                    )
                } else {
                    (
                        RejectReason::SetId,
                        "the file has the set-user-ID or set-group-ID bit; left on the host, never copied in".into(),
                    )
                };
                inv.refused.push((path, reason, why));
                continue;
            }
            Kind::File => {
                let src = match fs.on(As::Host, || open_at(host, &name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                        inv.skipped.push(format!("{}: {UNREADABLE}", path.display()));
                        inv.unread.insert(path);
                        continue;
                    }
                    Err(e) => return Err(err(&path)(e)),
                };
                fs.on(As::Jail, || {
                    let dst = open_at(tmp, &name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)?;
                    copy_data(src, &dst)?;
                    nix::sys::stat::fchmod(dst.as_raw_fd(), Mode::from_bits_truncate(permission_bits(&st)))?;
                    let [a, m] = times(&st);
                    Ok(nix::sys::stat::futimens(dst.as_raw_fd(), &a, &m)?)
                })
                .map_err(err(&path))?;
            }
            Kind::Symlink => {
                let target = fs
                    .on(As::Host, || Ok(nix::fcntl::readlinkat(Some(host.as_raw_fd()), name.as_os_str())?))
                    .map_err(err(&path))?;
                fs.on(As::Jail, || Ok(nix::unistd::symlinkat(target.as_os_str(), Some(tmp.as_raw_fd()), name.as_os_str())?))
                    .map_err(err(&path))?;
            }
            Kind::Fifo => {
                fs.on(As::Jail, || {
                    Ok(nix::unistd::mkfifoat(
                        Some(tmp.as_raw_fd()),
                        name.as_os_str(),
                        Mode::from_bits_truncate(permission_bits(&st)),
                    )?)
                })
                .map_err(err(&path))?;
            }
            Kind::Socket | Kind::Device => {
                let (reason, why) = if st.st_mode & libc::S_IFMT == libc::S_IFSOCK {
                    (RejectReason::Socket, "a socket; left on the host, never copied in")
                } else {
                    (RejectReason::Device, "a device node; left on the host, never copied in")
                };
                inv.refused.push((path, reason, why.into()));
                continue;
            }
        }
        let now = fs.on(As::Jail, || stat_at(tmp, &name)).map_err(err(&path))?;
        inv.seen.insert(path, Seen { kind, ino: now.st_ino, ctime: ctime(&now) });
    }
    Ok(())
}

/// One accepted file the host is to receive, as the artifact check saw it
/// (the copy checks it is still that inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub ino: u64,
    pub ctime_ns: i128,
    pub size: u64,
    /// The CSV/TSV delimiter, when its formula cells are to be neutralised.
    pub neutralise: Option<u8>,
}

/// What the copy did with one wanted file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delivered {
    /// Written to the host as the script wrote it.
    Copied,
    /// On the host already: the script left it as it was.
    Unchanged,
    /// Written to the host with its formula cells neutralised.
    Neutralised(Written),
    /// Written as the script wrote it although its formula cells were to
    /// be neutralised: the judging budget ran out first and the policy
    /// says `past_budget: "flag"`. Why, for its `incomplete_scan` flag.
    AsWritten(String),
    /// Not written: why.
    Refused(RejectReason, String),
}

/// What one copy-out may spend: bytes on the host, time, and the run's
/// judging budget for neutralising (past it, `past` says what becomes of
/// the file).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub limit: u64,
    pub deadline: Instant,
    pub spend: Spend,
    pub past: PastBudget,
}

/// What [`copy_out`] did.
#[derive(Debug, Clone, Default)]
pub(crate) struct CopyOut {
    pub sync: OutputSync,
    /// One entry per wanted file the walk reached.
    pub delivered: BTreeMap<PathBuf, Delivered>,
}

/// What one copy may still spend: bytes on the host disk, time, and the
/// run's judging budget.
struct Budget {
    limit: u64,
    used: u64,
    deadline: Instant,
    spend: Spend,
    past: PastBudget,
}

impl Budget {
    fn room(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// A directory's cost on the host disk before it is made (one block on
/// most filesystems; the real figure is counted once it holds something).
const DIR_COST: u64 = 4096;

/// The state of one mirror walk.
struct Mirror<'a> {
    fs: Acting,
    inv: &'a Inventory,
    wanted: &'a BTreeMap<PathBuf, Wanted>,
    budget: Budget,
    out: CopyOut,
}

/// Mirror the output tmpfs back into the host folder: only the files in
/// `wanted` (what the artifact check accepted) are written; what the script
/// deleted is deleted; what it left alone stays; everything else stays in
/// the tmpfs. Runs once the whole tree is dead: nothing inside can change
/// the tmpfs under the walk. At most `limit` bytes are allocated on the
/// host, and nothing is written after `deadline` (both in `bounds`). Never
/// fails as a whole; what could not be mirrored is listed in `errors`
/// (and, for a wanted file, in `delivered`).
pub(crate) fn copy_out(
    tmpfs: &OwnedFd,
    host: &Path,
    inv: &Inventory,
    ids: FsIds,
    wanted: &BTreeMap<PathBuf, Wanted>,
    bounds: Bounds,
) -> CopyOut {
    let Bounds { limit, deadline, spend, past } = bounds;
    let mut sync = OutputSync {
        copied_in: inv.len() as u64,
        skipped: inv.skipped.clone(),
        ..OutputSync::default()
    };
    let mut fs = match Acting::begin(ids) {
        Ok(fs) => fs,
        Err(e) => {
            sync.errors
                .push(format!("{e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()));
            return CopyOut { sync, delivered: BTreeMap::new() };
        }
    };
    let root = open_host(&mut fs, host);
    let mut m = Mirror {
        fs,
        inv,
        wanted,
        budget: Budget { limit, used: 0, deadline, spend, past },
        out: CopyOut { sync, delivered: BTreeMap::new() },
    };
    match root {
        Ok(root) => m.mirror(tmpfs, &root, Path::new(""), 0),
        Err(e) => m.out.sync.errors.push(format!("open {}: {e}", host.display())),
    }
    m.out.sync.bytes_written = m.budget.used;
    m.out
}

static PARTIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Names of files being written beside their final name start with this;
/// the next run's copy-in sweeps those whose writer is dead.
pub(crate) const PARTIAL_PREFIX: &str = ".jail-partial-";

/// A name for a file being written beside its final name.
fn partial_name() -> OsString {
    let n = PARTIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    OsString::from(format!("{PARTIAL_PREFIX}{}-{n}", std::process::id()))
}

/// The pid in a partial file's name, if the name is one.
fn partial_owner(name: &OsStr) -> Option<i32> {
    let rest = name.to_str()?.strip_prefix(PARTIAL_PREFIX)?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

fn pid_alive(pid: i32) -> bool {
    !matches!(nix::sys::signal::kill(Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH))
}

/// Why a copy stopped.
enum CopyError {
    Io(io::Error),
    Full,
    Deadline,
    OverBudget,
}

impl From<io::Error> for CopyError {
    fn from(e: io::Error) -> CopyError {
        CopyError::Io(e)
    }
}

const COPY_CHUNK: usize = 1 << 20;

/// Copy `size` bytes of `src` into `dst`, data extents only (SEEK_DATA /
/// SEEK_HOLE, lseek(2)): holes stay holes, so a sparse file costs the host
/// what it cost the tmpfs. At most `room` bytes of data, before `deadline`.
fn copy_sparse(src: &File, dst: &File, size: u64, room: u64, deadline: Instant) -> Result<(), CopyError> {
    let mut buf = vec![0u8; COPY_CHUNK.min(size.max(1) as usize)];
    let mut data_written = 0u64;
    let mut off = 0u64;
    while off < size {
        let start = match nix::unistd::lseek(src.as_raw_fd(), off as i64, Whence::SeekData) {
            Ok(at) => at as u64,
            // No data past `off`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => break,
            // A filesystem without SEEK_DATA: all of it is data.
            Err(nix::errno::Errno::EINVAL) => off,
            Err(e) => return Err(CopyError::Io(e.into())),
        };
        let end = match nix::unistd::lseek(src.as_raw_fd(), start as i64, Whence::SeekHole) {
            Ok(at) => (at as u64).min(size),
            Err(nix::errno::Errno::EINVAL) => size,
            Err(e) => return Err(CopyError::Io(e.into())),
        };
        let mut at = start;
        while at < end {
            if Instant::now() >= deadline {
                return Err(CopyError::Deadline);
            }
            let want = (end - at).min(buf.len() as u64) as usize;
            if data_written + want as u64 > room {
                return Err(CopyError::Full);
            }
            let n = src.read_at(&mut buf[..want], at)?;
            if n == 0 {
                // Shorter than listed: the size check below catches it.
                break;
            }
            dst.write_all_at(&buf[..n], at)?;
            data_written += n as u64;
            at += n as u64;
        }
        off = end.max(start + 1);
    }
    dst.set_len(size)?;
    Ok(())
}

/// Where a file being written lives until it is complete.
pub(crate) enum Partial {
    /// An O_TMPFILE: no name at all until it is linked in, so a jail killed
    /// mid-copy leaves nothing behind (open(2)).
    Unnamed(File),
    /// A filesystem without O_TMPFILE: `.jail-partial-<pid>-<n>`, swept by
    /// the next run if we die before renaming it.
    Named(File, OsString),
}

impl Partial {
    pub(crate) fn create(host: &OwnedFd) -> io::Result<Partial> {
        match open_at(host, OsStr::new("."), libc::O_WRONLY | libc::O_TMPFILE, 0o600) {
            Ok(fd) => Ok(Partial::Unnamed(File::from(fd))),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)) => {
                let name = partial_name();
                let fd = open_at(host, &name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)?;
                Ok(Partial::Named(File::from(fd), name))
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn file(&self) -> &File {
        match self {
            Partial::Unnamed(f) | Partial::Named(f, _) => f,
        }
    }

    /// Give the complete file its name, replacing (never following) what is
    /// there.
    pub(crate) fn publish(self, host: &OwnedFd, name: &OsStr) -> io::Result<()> {
        let partial = match &self {
            Partial::Named(_, partial) => partial.clone(),
            Partial::Unnamed(file) => {
                // linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH; the
                // /proc/self/fd link with AT_SYMLINK_FOLLOW does not (linkat(2)).
                let partial = partial_name();
                let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
                nix::unistd::linkat(
                    None,
                    Path::new(&proc_path),
                    Some(host.as_raw_fd()),
                    Path::new(&partial),
                    AtFlags::AT_SYMLINK_FOLLOW,
                )
                .map_err(io::Error::from)?;
                partial
            }
        };
        let renamed = nix::fcntl::renameat(Some(host.as_raw_fd()), partial.as_os_str(), Some(host.as_raw_fd()), name)
            .map_err(io::Error::from);
        if renamed.is_err() {
            let _ = nix::unistd::unlinkat(Some(host.as_raw_fd()), partial.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        renamed
    }

    /// Throw it away.
    pub(crate) fn discard(self, host: &OwnedFd) {
        if let Partial::Named(_, partial) = self {
            let _ = nix::unistd::unlinkat(Some(host.as_raw_fd()), partial.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

impl Mirror<'_> {
    /// Remove a host entry the script deleted (see [`remove_copied`]).
    fn remove(&mut self, host: &OwnedFd, name: &OsStr, path: &Path) -> bool {
        let (inv, sync) = (self.inv, &mut self.out.sync);
        self.fs.on(As::Host, || Ok(remove_copied(host, name, path, inv, sync))).unwrap_or_else(|e| {
            self.out.sync.errors.push(format!("remove {}: {e}", path.display()));
            false
        })
    }

    fn mirror(&mut self, tmp: &OwnedFd, host: &OwnedFd, rel: &Path, depth: usize) {
        let present: Vec<OsString> = match self.fs.on(As::Jail, || names(tmp)) {
            Ok(n) => n,
            Err(e) => {
                self.out.sync.errors.push(format!("list {}: {e}", display(rel)));
                return;
            }
        };
        // What the script deleted: copied in from here, and gone now.
        let present_set: BTreeSet<&OsString> = present.iter().collect();
        let gone: Vec<PathBuf> = self
            .inv
            .seen
            .keys()
            .filter(|p| p.parent() == Some(rel) && p.file_name().is_some_and(|n| !present_set.contains(&n.to_os_string())))
            .cloned()
            .collect();
        for path in gone {
            if let Some(name) = path.file_name() {
                self.remove(host, name, &path);
            }
        }
        for name in present {
            let path = rel.join(&name);
            let st = match self.fs.on(As::Jail, || stat_at(tmp, &name)) {
                Ok(st) => st,
                Err(e) => {
                    self.out.sync.errors.push(format!("stat {}: {e}", path.display()));
                    continue;
                }
            };
            let kind = kind_of(&st);
            if let Some(s) = self.inv.seen.get(&path) {
                if kind != Kind::Dir && s.kind == kind && s.ino == st.st_ino && s.ctime == ctime(&st) {
                    self.out.sync.unchanged += 1;
                    if self.wanted.contains_key(&path) {
                        self.out.delivered.insert(path, Delivered::Unchanged);
                    }
                    continue;
                }
            }
            let wanted = self.wanted.get(&path).filter(|w| w.ino == st.st_ino && w.ctime_ns == ctime_ns(&st));
            match (kind, wanted) {
                (Kind::Dir, _) if depth >= MAX_DEPTH => {
                    self.out.sync.skipped.push(format!("{}: deeper than {MAX_DEPTH} levels", path.display()))
                }
                (Kind::Dir, _) => self.mirror_dir(tmp, host, &name, &path, &st, depth),
                (Kind::File, Some(_)) if self.inv.unread.contains(&path) => {
                    let why =
                        "not copied to the host: a host file of that name that jail's caller cannot read is there, and stays";
                    self.out.delivered.insert(path, Delivered::Refused(RejectReason::Unreadable, why.into()));
                }
                (Kind::File, Some(w)) => {
                    let w = *w;
                    let done = match self.place(tmp, host, &name, &path, &st, &w) {
                        Ok(d) => {
                            // A file refused at the copy (no room, no time) reached nothing.
                            if !matches!(d, Delivered::Refused(..)) {
                                self.out.sync.copied_out += 1;
                            }
                            d
                        }
                        Err(e) => {
                            self.out.sync.errors.push(format!("{}: {e}", path.display()));
                            Delivered::Refused(RejectReason::Unreadable, format!("not copied to the host: {e}"))
                        }
                    };
                    self.out.delivered.insert(path, done);
                }
                _ => {
                    // Refused by the artifact check, or never judged: it
                    // stays in the tmpfs. A host entry the script replaced
                    // with it goes, as the script meant.
                    self.out.sync.withheld += 1;
                    if self.inv.seen.contains_key(&path) {
                        self.remove(host, &name, &path);
                    }
                }
            }
        }
    }

    fn mirror_dir(&mut self, tmp: &OwnedFd, host: &OwnedFd, name: &OsStr, path: &Path, st: &FileStat, depth: usize) {
        let existing = self.fs.on(As::Host, || stat_at(host, name)).ok();
        if existing.is_some_and(|e| kind_of(&e) != Kind::Dir) && !self.remove(host, name, path) {
            self.out.sync.errors.push(format!("{}: a host entry of another kind is in the way", path.display()));
            return;
        }
        let created = !matches!(existing, Some(e) if kind_of(&e) == Kind::Dir);
        if created {
            if self.budget.room() < DIR_COST {
                self.out
                    .sync
                    .errors
                    .push(format!("mkdir {}: no room left within filesystem.output_size", path.display()));
                return;
            }
            let made = self
                .fs
                .on(As::Host, || Ok(nix::sys::stat::mkdirat(Some(host.as_raw_fd()), name, Mode::from_bits_truncate(0o700))?));
            if let Err(e) = made {
                self.out.sync.errors.push(format!("mkdir {}: {e}", path.display()));
                return;
            }
        }
        let hsub = self.fs.on(As::Host, || open_dir_at(host, name));
        let tsub = self.fs.on(As::Jail, || readable_dir(tmp, name, st));
        let (hsub, tsub) = match (hsub, tsub) {
            (Ok(h), Ok(t)) => (h, t),
            (Err(e), _) | (_, Err(e)) => {
                self.out.sync.errors.push(format!("open {}: {e}", path.display()));
                return;
            }
        };
        self.mirror(&tsub, &hsub, path, depth + 1);
        let _ = self.fs.on(As::Host, || {
            if created {
                // A folder reaches the host only to hold what was accepted.
                if names(&hsub).is_ok_and(|n| n.is_empty()) {
                    let _ = nix::unistd::unlinkat(Some(host.as_raw_fd()), name, UnlinkatFlags::RemoveDir);
                    return Ok(());
                }
                let blocks = nix::sys::stat::fstat(hsub.as_raw_fd()).map(|s| s.st_blocks.max(0) as u64 * 512).unwrap_or(DIR_COST);
                self.budget.used += blocks;
                self.out.sync.copied_out += 1;
            }
            let _ = nix::sys::stat::fchmod(hsub.as_raw_fd(), Mode::from_bits_truncate(permission_bits(st)));
            let [a, m] = times(st);
            let _ = nix::sys::stat::futimens(hsub.as_raw_fd(), &a, &m);
            Ok(())
        });
    }

    /// Write one accepted file into the host folder: into an unnamed file
    /// first, counted against the budget, then linked in under its name.
    fn place(
        &mut self,
        tmp: &OwnedFd,
        host: &OwnedFd,
        name: &OsStr,
        path: &Path,
        st: &FileStat,
        w: &Wanted,
    ) -> io::Result<Delivered> {
        if let Ok(existing) = self.fs.on(As::Host, || stat_at(host, name)) {
            if kind_of(&existing) == Kind::Dir && !self.remove(host, name, path) {
                return Err(io::Error::other("a host folder with entries the script never saw is in the way"));
            }
        }
        if Instant::now() >= self.budget.deadline {
            return Ok(Delivered::Refused(
                RejectReason::CopyDeadline,
                "the run's deadline passed before the copy to the host reached it".into(),
            ));
        }
        let src = self.fs.on(As::Jail, || {
            if st.st_mode & 0o400 == 0 {
                // The script's own file, made unreadable: its owner opens it up.
                nix::sys::stat::fchmodat(
                    Some(tmp.as_raw_fd()),
                    name,
                    Mode::from_bits_truncate((st.st_mode | 0o600) & 0o7777),
                    nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                )?;
            }
            Ok(File::from(open_at(tmp, name, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0)?))
        })?;
        let now = nix::sys::stat::fstat(src.as_raw_fd()).map_err(io::Error::from)?;
        if kind_of(&now) != Kind::File
            || now.st_ino != w.ino
            || ctime_ns(&now) != w.ctime_ns
            || now.st_size as u64 != w.size
            || now.st_nlink != 1
        {
            return Ok(Delivered::Refused(RejectReason::Changed, "the file changed after the artifact check".into()));
        }
        // The source is open (reading through a descriptor checks nothing
        // more): the rest is the host side's.
        let budget = &mut self.budget;
        self.fs.on(As::Host, || budget.write(host, name, st, w, &src))
    }
}

impl Budget {
    fn full_detail(&self) -> String {
        format!(
            "writing it to the host would pass filesystem.output_size ({} bytes; {} already written)",
            self.limit, self.used
        )
    }

    /// Write `src`, an accepted file, into the host folder under `name`:
    /// into an unnamed file first, counted, then linked in.
    fn write(&mut self, host: &OwnedFd, name: &OsStr, st: &FileStat, w: &Wanted, src: &File) -> io::Result<Delivered> {
        let mut partial = Partial::create(host)?;
        let room = self.room();
        let mut copied = match w.neutralise {
            Some(delim) => {
                let mut dst = io::BufWriter::new(partial.file());
                neutralise::neutralise(&mut &*src, w.size, delim, &mut dst, room, self.deadline, self.spend)
                    .map(Delivered::Neutralised)
                    .map_err(|e| match e {
                        NeutraliseError::TooBig { .. } => CopyError::Full,
                        NeutraliseError::Deadline => CopyError::Deadline,
                        NeutraliseError::OverBudget => CopyError::OverBudget,
                        NeutraliseError::Read(e) | NeutraliseError::Write(e) => CopyError::Io(e),
                    })
            }
            None => copy_sparse(src, partial.file(), w.size, room, self.deadline).map(|()| Delivered::Copied),
        };
        let unneutralised = || self.spend.why("its formula cells were not all neutralised");
        if matches!(copied, Err(CopyError::OverBudget)) && self.past == PastBudget::Flag {
            // The policy takes it as the script wrote it, flagged.
            partial.discard(host);
            partial = Partial::create(host)?;
            copied =
                copy_sparse(src, partial.file(), w.size, room, self.deadline).map(|()| Delivered::AsWritten(unneutralised()));
        }
        let refuse = |partial: Partial, reason: RejectReason, why: String| {
            partial.discard(host);
            Ok(Delivered::Refused(reason, why))
        };
        let done = match copied {
            Ok(d) => d,
            Err(CopyError::Io(e)) => {
                partial.discard(host);
                return Err(e);
            }
            Err(CopyError::Full) => return refuse(partial, RejectReason::OutputFull, self.full_detail()),
            Err(CopyError::Deadline) => {
                return refuse(
                    partial,
                    RejectReason::CopyDeadline,
                    "the run's deadline passed while it was being copied to the host".into(),
                )
            }
            Err(CopyError::OverBudget) => return refuse(partial, RejectReason::FormulaCells, unneutralised()),
        };
        let dst = partial.file();
        nix::sys::stat::fchmod(dst.as_raw_fd(), Mode::from_bits_truncate(permission_bits(st))).map_err(io::Error::from)?;
        let [a, m] = times(st);
        nix::sys::stat::futimens(dst.as_raw_fd(), &a, &m).map_err(io::Error::from)?;
        // What `du` will count: the blocks the host filesystem allocated.
        let cost = nix::sys::stat::fstat(dst.as_raw_fd())
            .map(|s| s.st_blocks.max(0) as u64 * 512)
            .map_err(io::Error::from)?;
        if cost > self.room() {
            return refuse(partial, RejectReason::OutputFull, self.full_detail());
        }
        partial.publish(host, name)?;
        self.used += cost;
        Ok(done)
    }
}

fn ctime_ns(st: &FileStat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}

fn display(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        rel.display().to_string()
    }
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
        unlink_counted(host, name, path, UnlinkatFlags::RemoveDir, sync)
    } else {
        unlink_counted(host, name, path, UnlinkatFlags::NoRemoveDir, sync)
    }
}

/// Removes `name` below `host`, counting it as deleted or recording why not.
fn unlink_counted(host: &OwnedFd, name: &OsStr, path: &Path, how: UnlinkatFlags, sync: &mut OutputSync) -> bool {
    let verb = match how {
        UnlinkatFlags::RemoveDir => "rmdir",
        UnlinkatFlags::NoRemoveDir => "unlink",
    };
    match nix::unistd::unlinkat(Some(host.as_raw_fd()), name, how) {
        Ok(()) => {
            sync.deleted += 1;
            true
        }
        Err(e) => {
            sync.errors.push(format!("{verb} {}: {e}", path.display()));
            false
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

    fn bounds(limit: u64, deadline: Instant) -> Bounds {
        Bounds { limit, deadline, spend: Spend::start(), past: PastBudget::Refuse }
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

    /// Every regular file of the tmpfs with one name, as an artifact check
    /// that accepts them all would hand it over.
    fn all_files(tmp: &Path) -> BTreeMap<PathBuf, Wanted> {
        let mut out = BTreeMap::new();
        fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Wanted>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let m = std::fs::symlink_metadata(e.path()).unwrap();
                if m.is_dir() {
                    walk(base, &e.path(), out);
                } else if m.file_type().is_file() && m.nlink() == 1 {
                    let w = Wanted {
                        ino: m.ino(),
                        ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
                        size: m.len(),
                        neutralise: None,
                    };
                    out.insert(e.path().strip_prefix(base).unwrap().to_path_buf(), w);
                }
            }
        }
        walk(tmp, tmp, &mut out);
        out
    }

    fn copy_all(t: &OwnedFd, tmp: &Path, host: &Path, inv: &Inventory) -> CopyOut {
        copy_out(t, host, inv, ids(), &all_files(tmp), bounds(1 << 30, Instant::now() + Duration::from_secs(30)))
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
        let sync = copy_all(&t, tmp.path(), host.path(), &inv).sync;
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
        std::fs::create_dir(tmp.path().join("empty")).unwrap();

        let sync = copy_all(&t, tmp.path(), host.path(), &inv).sync;
        assert!(sync.errors.is_empty(), "{sync:?}");
        // The link is not wanted (an artifact check refuses links): it stays
        // in the tmpfs, and so does a folder that would hold nothing.
        assert_eq!(tree(host.path()), vec!["edit = 2", "keep = k", "new/", "new/deep/", "new/deep/f.png = png"]);
        assert_eq!((sync.deleted, sync.withheld), (2, 1));
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
        let sync = copy_all(&t, tmp.path(), host.path(), &inv).sync;
        assert!(sync.errors.is_empty(), "{sync:?}");
        assert_eq!(std::fs::read_to_string(victim.path()).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(host.path().join("out.txt")).unwrap(), "mine");
        assert!(!std::fs::symlink_metadata(host.path().join("out.txt")).unwrap().file_type().is_symlink());
    }

    #[test]
    fn unreadable_host_entries_are_skipped_and_left_alone() {
        // Root too: the host side is read by mode bits, without overrides.
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), "s").unwrap();
        std::fs::set_permissions(host.path().join("secret"), std::fs::Permissions::from_mode(0o000)).unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        assert_eq!(inv.skipped.len(), 1, "{:?}", inv.skipped);
        let sync = copy_all(&t, tmp.path(), host.path(), &inv).sync;
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
        let sync = copy_all(&t, tmp.path(), host.path(), &inv).sync;
        assert!(!host.path().join("s.sock").exists());
        assert_eq!(sync.withheld, 1, "{sync:?}");
    }

    #[test]
    fn a_refused_entry_stays_inside_and_the_host_file_it_replaced_goes() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("x.txt"), "old").unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        std::fs::remove_file(tmp.path().join("x.txt")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tmp.path().join("x.txt")).unwrap();
        let sync = copy_all(&t, tmp.path(), host.path(), &inv).sync;
        assert!(std::fs::symlink_metadata(host.path().join("x.txt")).is_err(), "{sync:?}");
        assert_eq!((sync.deleted, sync.withheld), (1, 1));
    }

    #[test]
    fn sparse_files_stay_sparse_and_count_by_what_they_hold() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        let f = std::fs::File::create(tmp.path().join("sparse.bin")).unwrap();
        f.set_len(256 << 20).unwrap();
        f.write_all_at(b"data in the middle", 100 << 20).unwrap();
        drop(f);
        let out = copy_all(&t, tmp.path(), host.path(), &inv);
        assert_eq!(out.delivered[Path::new("sparse.bin")], Delivered::Copied);
        let m = std::fs::metadata(host.path().join("sparse.bin")).unwrap();
        assert_eq!(m.len(), 256 << 20);
        assert!(m.blocks() * 512 <= 1 << 20, "{} bytes allocated", m.blocks() * 512);
        assert!(out.sync.bytes_written <= 1 << 20, "{:?}", out.sync);
        let mut back = vec![0u8; 18];
        std::fs::File::open(host.path().join("sparse.bin"))
            .unwrap()
            .read_exact_at(&mut back, 100 << 20)
            .unwrap();
        assert_eq!(&back, b"data in the middle");
    }

    #[test]
    fn past_the_byte_budget_files_are_refused_and_nothing_of_them_is_left() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        for n in ["a.bin", "b.bin"] {
            std::fs::write(tmp.path().join(n), vec![7u8; 1 << 20]).unwrap();
        }
        let out = copy_out(
            &t,
            host.path(),
            &inv,
            ids(),
            &all_files(tmp.path()),
            bounds(3 << 19, Instant::now() + Duration::from_secs(30)),
        );
        assert_eq!(out.delivered[Path::new("a.bin")], Delivered::Copied);
        assert!(matches!(out.delivered[Path::new("b.bin")], Delivered::Refused(RejectReason::OutputFull, _)), "{out:?}");
        assert_eq!(tree(host.path()).len(), 1, "{:?}", tree(host.path()));
        assert!(out.sync.bytes_written <= 3 << 19);
    }

    #[test]
    fn after_the_deadline_nothing_is_written() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        std::fs::write(tmp.path().join("late.txt"), "x").unwrap();
        let out = copy_out(&t, host.path(), &inv, ids(), &all_files(tmp.path()), bounds(1 << 30, Instant::now()));
        assert!(matches!(out.delivered[Path::new("late.txt")], Delivered::Refused(RejectReason::CopyDeadline, _)));
        assert!(tree(host.path()).is_empty());
    }

    #[test]
    fn a_neutralised_file_is_what_the_host_receives() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        std::fs::write(tmp.path().join("r.csv"), "a,b\n=1,2\n").unwrap();
        let mut wanted = all_files(tmp.path());
        wanted.get_mut(Path::new("r.csv")).unwrap().neutralise = Some(b',');
        let out = copy_out(&t, host.path(), &inv, ids(), &wanted, bounds(1 << 30, Instant::now() + Duration::from_secs(30)));
        let Delivered::Neutralised(w) = &out.delivered[Path::new("r.csv")] else { panic!("{out:?}") };
        assert_eq!(w.cells, 1);
        assert_eq!(std::fs::read_to_string(host.path().join("r.csv")).unwrap(), "a,b\n'=1,2\n");
    }

    #[test]
    fn a_stale_partial_of_a_dead_jail_is_swept_and_a_live_ones_is_left() {
        let host = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        // Above the kernel's largest pid_max: no such process.
        std::fs::write(host.path().join(".jail-partial-4194305-0"), "half").unwrap();
        let live = format!(".jail-partial-{}-9", std::process::id());
        std::fs::write(host.path().join(&live), "mine").unwrap();
        let t = dir_fd(tmp.path());
        let inv = copy_in(host.path(), &t, ids()).unwrap();
        assert_eq!(inv.swept, 1);
        assert_eq!(tree(host.path()), vec![format!("{live} = mine")]);
        assert!(tree(tmp.path()).is_empty(), "partials are never copied in");
    }
}
