//! The one way a door takes a path from its caller: `jail run` and `jail
//! session start` (request.rs), the pool's requests (pool/run.rs), the MCP
//! server's staging and the agent's input copy and export all come here.
//!
//! Supervisor (host) side; nothing here starts a process. Four rules:
//!
//! 1. **No link is followed.** Every component of a caller's path is
//!    resolved by the kernel with `openat2(RESOLVE_NO_SYMLINKS |
//!    RESOLVE_NO_MAGICLINKS)`: a symlink anywhere on the way or at its end
//!    (`dir/` with a trailing slash included), or a `/proc` magic link
//!    (`/proc/self/cwd/x`, `/proc/self/fd/N`), is refused with ELOOP. `..`
//!    is the kernel's (the real parent: no link is on the way to follow).
//!    What is opened is then used by descriptor (a walk opens each entry
//!    relative to its parent's descriptor, `RESOLVE_BENEATH` as well), so
//!    a component swapped for a link after the check changes nothing. A
//!    path handed on to another process (the jail's child, which opens its
//!    bind sources again) is resolved there with the same flags, so a swap
//!    between the two is refused there (mounts.rs).
//! 2. **The caller's reach, never root's on the caller's behalf.** What the
//!    jail is given is what the jail itself could read ([`Reach`]): for an
//!    ordinary caller the jail runs as the caller, so the kernel's checks
//!    with the caller's own credentials decide; for root the jail runs as
//!    an unprivileged host uid, so a file is given only if its mode bits
//!    let that uid read it. Root's overrides (CAP_DAC_OVERRIDE and the
//!    rest) never decide. A file the jail could not read is **refused**: a
//!    copy leaves it out and says so ([`Refusal`]), a script or a named
//!    file is an error. (A bound folder, `jail run --input`, is not
//!    walked: the kernel refuses such a file inside the jail, EACCES.)
//! 3. **Modes are never widened.** A copy keeps each entry's permission
//!    bits (set-id bits dropped) and belongs to the copier, which the jail
//!    reaches as it reached the original: the caller's copy as the caller
//!    (an ordinary caller); root's copy through its "other" bits, or its
//!    group when the original was the jails' group's (the copy keeps that
//!    group): exactly what [`Reach::of_jails`] judged by.
//! 4. **Hard links, one way: a file with more than one name is never
//!    copied.** A copy refuses it (`hard_link`), as the artifact check
//!    refuses one the script left and the output mirror leaves one on the
//!    host (output.rs): a second name may be a window onto a file the
//!    caller's folder does not hold. A bound folder shows it as the kernel
//!    does, read with the jail's own reach like any other file.
//!
//! Symlinks inside a copied folder are copied as links (their target text,
//! never followed on the host; inside the jail they resolve in the jail's
//! own root, as a bound folder's do); fifos, sockets and devices are
//! refused.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::AccessFlags;

use crate::result::RejectReason;
use crate::sys::{self, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};

/// How every caller's path is resolved: no symlink, no magic link.
pub const RESOLVE: u64 = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
/// How an entry beneath an opened folder is resolved: [`RESOLVE`], and
/// never out of that folder.
pub const BENEATH: u64 = RESOLVE | RESOLVE_BENEATH;

/// Deeper trees are not copied: a script could nest folders far past any
/// stack, and nothing legitimate needs this many levels. The one bound of
/// every walk of a tree (a caller's input, a step's output, the input's
/// digest).
pub const MAX_DEPTH: usize = 64;

/// A caller's path that cannot be taken: the path as given and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct AcceptError {
    pub path: PathBuf,
    #[source]
    pub problem: Problem,
}

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("a symbolic link (or a /proc magic link) is on the way or at its end, and no link is followed")]
    Link,
    #[error("no such file or folder")]
    Missing,
    #[error("not a folder")]
    NotAFolder,
    #[error("not a regular file")]
    NotAFile,
    #[error("leads outside its folder")]
    Outside,
    #[error("not a plain path (empty, `.`, `..` at its end, or a NUL byte)")]
    NotPlain,
    #[error("{0}")]
    Unreadable(String),
    #[error("{0} bytes, over the {1} allowed")]
    TooLarge(u64, u64),
    #[error("a file with {0} names (a hard link), never copied")]
    HardLink(u64),
    #[error("{0}")]
    Io(#[source] io::Error),
}

impl AcceptError {
    fn new(path: &Path, problem: Problem) -> AcceptError {
        AcceptError { path: path.to_path_buf(), problem }
    }

    fn io(path: &Path, e: io::Error) -> AcceptError {
        AcceptError::new(path, Problem::from_errno(e))
    }

    /// What the caller can do about it, in a few words.
    pub fn fix(&self) -> &'static str {
        match self.problem {
            Problem::Link => "give the real path: no component may be a link",
            Problem::Missing => "give an existing path",
            Problem::NotAFolder => "give a folder",
            Problem::NotAFile => "give a regular file",
            Problem::Outside => "name something inside the folder",
            Problem::NotPlain => "give a plain path that names its entry",
            Problem::Unreadable(_) => "make it readable by the jail (chmod o+r as root, u+r otherwise), or leave it out",
            Problem::TooLarge(..) => "give a smaller one",
            Problem::HardLink(_) => "copy it to a file of its own",
            Problem::Io(_) => "check the path",
        }
    }

    /// Whether the path refused was a link (or had one on the way).
    #[cfg(test)]
    pub(crate) fn is_link(&self) -> bool {
        matches!(self.problem, Problem::Link)
    }
}

impl Problem {
    fn from_errno(e: io::Error) -> Problem {
        match e.raw_os_error() {
            Some(libc::ELOOP) => Problem::Link,
            Some(libc::ENOENT) => Problem::Missing,
            Some(libc::ENOTDIR) => Problem::NotAFolder,
            Some(libc::EXDEV) => Problem::Outside,
            Some(libc::EACCES) | Some(libc::EPERM) => Problem::Unreadable(format!("the caller may not open it ({e})")),
            Some(libc::ENXIO) | Some(libc::ENODEV) => Problem::NotAFile,
            _ => Problem::Io(e),
        }
    }
}

/// Who reads what a door hands the jail: what decides whether the jail
/// may be given a file (rule 2 of the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// An ordinary caller: the jail runs as the caller's uid, with its
    /// groups, so the kernel's own checks with this process's credentials
    /// are the jail's.
    Caller,
    /// A root caller: the jail runs as an unprivileged host uid and gid,
    /// and what it may read is judged by mode bits as them. `None`: an id
    /// that owns nothing the caller names, so the group (or "other") bits
    /// decide.
    Sandbox { uid: Option<u32>, gid: Option<u32> },
}

/// What a reach needs of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A file read (r), a folder listed and searched (r-x).
    Read,
    /// A folder written (-wx).
    Write,
}

impl Reach {
    /// The reach of the jails this process starts: its own when it is an
    /// ordinary user; as root, the host gid every root-started jail shares
    /// (the policy's `identity.root_host_gid`) and the "other" bits (each
    /// jail's uid is its own and owns nothing a caller names).
    pub fn of_jails(root_host_gid: u32) -> Reach {
        if nix::unistd::geteuid().is_root() {
            Reach::Sandbox { uid: None, gid: Some(root_host_gid) }
        } else {
            Reach::Caller
        }
    }

    /// As [`Reach::of_jails`] with no group: as root, the "other" bits alone.
    pub fn here() -> Reach {
        if nix::unistd::geteuid().is_root() {
            Reach::Sandbox { uid: None, gid: None }
        } else {
            Reach::Caller
        }
    }

    /// A copy made as root reaches the jail as its source did: it is
    /// root's, so the "other" bits carry over as they are, and a source
    /// the jail reads through its group (`gid`) keeps that group.
    fn keep_group(&self, copy: &OwnedFd, source: &FileStat) -> io::Result<()> {
        match *self {
            Reach::Sandbox { gid: Some(g), .. } if source.st_gid == g => {
                nix::unistd::fchown(copy.as_raw_fd(), None, Some(nix::unistd::Gid::from_raw(g))).map_err(io::Error::from)
            }
            _ => Ok(()),
        }
    }

    /// Whether the jail may use the opened entry `fd` (a file, or with
    /// `is_dir` a folder) as `want` says.
    pub fn allows(&self, fd: &OwnedFd, st: &FileStat, want: Want) -> io::Result<bool> {
        let is_dir = kind_of(st) == Kind::Dir;
        match *self {
            Reach::Caller => {
                let mode = match (want, is_dir) {
                    (Want::Read, true) => AccessFlags::R_OK | AccessFlags::X_OK,
                    (Want::Read, false) => AccessFlags::R_OK,
                    (Want::Write, _) => AccessFlags::W_OK | AccessFlags::X_OK,
                };
                // The kernel's check, with our effective ids and groups
                // (the syscall, not glibc's: sys::access_fd says why).
                match sys::access_fd(fd.as_fd(), mode.bits()) {
                    Ok(()) => Ok(true),
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Reach::Sandbox { uid, gid } => Ok(mode_allows(st, uid, gid, want, is_dir)),
        }
    }

    fn describe(&self) -> String {
        match self {
            Reach::Caller => "the caller".into(),
            Reach::Sandbox { uid: Some(u), .. } => format!("the jail's host uid {u} (jail runs as root)"),
            Reach::Sandbox { gid: Some(g), .. } => {
                format!("the jail's unprivileged host uid, by its group ({g}) or \"other\" mode bits (jail runs as root)")
            }
            Reach::Sandbox { .. } => "the jail's unprivileged host uid, by its \"other\" mode bits (jail runs as root)".into(),
        }
    }

    /// The refusal of an entry this reach may not use.
    fn refuse(&self, st: &FileStat, want: Want) -> Problem {
        let need = match (want, kind_of(st) == Kind::Dir) {
            (Want::Read, true) => "list and search",
            (Want::Read, false) => "read",
            (Want::Write, _) => "write",
        };
        Problem::Unreadable(format!(
            "{} may not {need} it (mode {:04o}, owner {}:{})",
            self.describe(),
            st.st_mode & 0o7777,
            st.st_uid,
            st.st_gid
        ))
    }
}

/// Whether `uid`/`gid` may use an entry by its mode bits alone: the class
/// the kernel picks (owner, else group, else other), never root's
/// overrides; the jail has no capabilities it could use instead.
fn mode_allows(st: &FileStat, uid: Option<u32>, gid: Option<u32>, want: Want, is_dir: bool) -> bool {
    let bits = match (want, is_dir) {
        (Want::Read, true) => 0o5,
        (Want::Read, false) => 0o4,
        (Want::Write, _) => 0o3,
    };
    let shift = if uid == Some(st.st_uid) {
        6
    } else if gid == Some(st.st_gid) {
        3
    } else {
        0
    };
    (st.st_mode >> shift) & bits == bits
}

/// What kind of entry, as far as copying goes (output.rs's mirror too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    Device,
}

pub(crate) fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFLNK => Kind::Symlink,
        SFlag::S_IFIFO => Kind::Fifo,
        SFlag::S_IFSOCK => Kind::Socket,
        _ => Kind::Device,
    }
}

fn fstat(fd: &OwnedFd) -> io::Result<FileStat> {
    nix::sys::stat::fstat(fd.as_raw_fd()).map_err(io::Error::from)
}

pub(crate) fn stat_at(dir: &OwnedFd, name: &OsStr) -> io::Result<FileStat> {
    nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io::Error::from)
}

/// The caller's path made absolute against the current folder, as words
/// only (no link resolved: the kernel resolves it, following none).
pub fn absolute(path: &Path) -> Result<PathBuf, AcceptError> {
    if path.as_os_str().is_empty() || path.as_os_str().as_bytes().contains(&0) {
        return Err(AcceptError::new(path, Problem::NotPlain));
    }
    std::path::absolute(path).map_err(|e| AcceptError::io(path, e))
}

/// Open the caller's `path` for reading as the caller (its parents need be
/// open to the caller alone: they are its own path), following no link.
fn open(path: &Path, flags: libc::c_int) -> Result<OwnedFd, AcceptError> {
    let abs = absolute(path)?;
    sys::openat2(None, &abs, flags, RESOLVE).map_err(|e| AcceptError::io(path, e))
}

/// The caller's folder `path`, opened without following any link, and
/// checked to be one the jail may list and search with `reach`.
pub fn open_dir(path: &Path, reach: Reach) -> Result<OwnedFd, AcceptError> {
    let fd = open(path, libc::O_RDONLY | libc::O_DIRECTORY)?;
    check(path, &fd, reach, Want::Read)?;
    Ok(fd)
}

/// The caller's folder `path`, made with its missing parents (`mode`, less
/// the umask) as `mkdir -p` would, each component opened beneath the one
/// before without following a link; `..` is refused.
pub fn make_dirs(path: &Path, mode: u32) -> Result<OwnedFd, AcceptError> {
    let abs = absolute(path)?;
    let mut at =
        sys::openat2(None, Path::new("/"), libc::O_RDONLY | libc::O_DIRECTORY, RESOLVE).map_err(|e| AcceptError::io(path, e))?;
    for c in abs.components() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => n,
            Component::ParentDir | Component::Prefix(_) => return Err(AcceptError::new(path, Problem::NotPlain)),
        };
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        let next = match open_at(&at, name, flags, 0) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                match nix::sys::stat::mkdirat(Some(at.as_raw_fd()), name, Mode::from_bits_truncate(mode)) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(AcceptError::io(path, e.into())),
                }
                open_at(&at, name, flags, 0)
            }
            other => other,
        };
        at = next.map_err(|e| AcceptError::io(path, e))?;
    }
    Ok(at)
}

/// The caller's folder `path`, opened without following any link, for
/// the caller itself to work in (an output folder jail writes as the
/// caller): no reach is judged.
pub fn open_own_dir(path: &Path) -> Result<OwnedFd, AcceptError> {
    open(path, libc::O_RDONLY | libc::O_DIRECTORY)
}

/// Whether `reach` may use the opened `fd` (at `path`) as `want` says.
pub fn check(path: &Path, fd: &OwnedFd, reach: Reach, want: Want) -> Result<FileStat, AcceptError> {
    let st = fstat(fd).map_err(|e| AcceptError::io(path, e))?;
    match reach.allows(fd, &st, want) {
        Ok(true) => Ok(st),
        Ok(false) => Err(AcceptError::new(path, reach.refuse(&st, want))),
        Err(e) => Err(AcceptError::io(path, e)),
    }
}

/// The caller's regular file `path`, opened for reading without following
/// any link (a fifo cannot block the open), readable by `reach`.
pub fn open_file(path: &Path, reach: Reach) -> Result<File, AcceptError> {
    let fd = open(path, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?;
    file_checked(path, fd, reach)
}

fn file_checked(path: &Path, fd: OwnedFd, reach: Reach) -> Result<File, AcceptError> {
    let st = fstat(&fd).map_err(|e| AcceptError::io(path, e))?;
    if kind_of(&st) != Kind::File {
        return Err(AcceptError::new(path, Problem::NotAFile));
    }
    check(path, &fd, reach, Want::Read)?;
    Ok(File::from(fd))
}

/// `rel` beneath the opened folder `dir` (`dir_path` for messages): a
/// plain relative path, opened without following any link or leaving
/// `dir`.
pub fn open_beneath(dir: &OwnedFd, dir_path: &Path, rel: &Path, flags: libc::c_int) -> Result<OwnedFd, AcceptError> {
    let shown = dir_path.join(rel);
    if rel.as_os_str().is_empty() || rel.is_absolute() || rel.as_os_str().as_bytes().contains(&0) {
        return Err(AcceptError::new(&shown, Problem::NotPlain));
    }
    sys::openat2(Some(dir.as_fd()), rel, flags, BENEATH).map_err(|e| AcceptError::io(&shown, e))
}

/// A regular file `rel` beneath `dir`, readable by `reach`.
pub fn open_file_beneath(dir: &OwnedFd, dir_path: &Path, rel: &Path, reach: Reach) -> Result<File, AcceptError> {
    let fd = open_beneath(dir, dir_path, rel, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?;
    file_checked(&dir_path.join(rel), fd, reach)
}

/// Read the caller's regular file `path` (a script), at most `max` bytes,
/// as text.
pub(crate) fn read_text(path: &Path, reach: Reach, max: u64) -> Result<String, AcceptError> {
    read_file_text(path, open_file(path, reach)?, max)
}

/// Read an accepted file, at most `max` bytes, as UTF-8 text.
pub(crate) fn read_file_text(path: &Path, file: File, max: u64) -> Result<String, AcceptError> {
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| AcceptError::io(path, e))?;
    if bytes.len() as u64 > max {
        return Err(AcceptError::new(path, Problem::TooLarge(bytes.len() as u64, max)));
    }
    String::from_utf8(bytes).map_err(|_| AcceptError::new(path, Problem::Io(io::Error::other("not UTF-8 text"))))
}

/// A place the caller names for a folder that may not exist yet (an
/// output): its parent opened without following any link, its own name
/// one plain component, looked at and made beneath that descriptor only.
#[derive(Debug)]
pub struct Place {
    /// The path as the caller gave it, made absolute.
    pub path: PathBuf,
    parent: OwnedFd,
    name: OsString,
}

/// What is at a [`Place`] now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Nothing,
    EmptyFolder,
    Folder,
    /// A link, a file or a special file: never used.
    Other,
}

impl Place {
    /// The place `path` names; its parent must exist.
    pub fn name(path: &Path) -> Result<Place, AcceptError> {
        let abs = absolute(path)?;
        let (Some(parent), Some(Component::Normal(name))) = (abs.parent(), abs.components().next_back()) else {
            return Err(AcceptError::new(path, Problem::NotPlain));
        };
        let parent =
            sys::openat2(None, parent, libc::O_RDONLY | libc::O_DIRECTORY, RESOLVE).map_err(|e| AcceptError::io(parent, e))?;
        Ok(Place { path: abs.clone(), parent, name: name.to_os_string() })
    }

    /// The opened parent folder.
    pub fn parent(&self) -> &OwnedFd {
        &self.parent
    }

    /// What is there now, never following it.
    pub fn found(&self) -> Result<Found, AcceptError> {
        let st = match stat_at(&self.parent, &self.name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Found::Nothing),
            Err(e) => return Err(AcceptError::io(&self.path, e)),
        };
        if kind_of(&st) != Kind::Dir {
            return Ok(Found::Other);
        }
        let dir = self.open()?;
        let mut d = nix::dir::Dir::from(dir).map_err(|e| AcceptError::io(&self.path, e.into()))?;
        let any = d.iter().filter_map(Result::ok).any(|e| !matches!(e.file_name().to_bytes(), b"." | b".."));
        Ok(if any { Found::Folder } else { Found::EmptyFolder })
    }

    /// Make the folder (`mode`, less the umask) beneath the parent.
    pub(crate) fn make_dir(&self, mode: u32) -> Result<(), AcceptError> {
        nix::sys::stat::mkdirat(Some(self.parent.as_raw_fd()), self.name.as_os_str(), Mode::from_bits_truncate(mode))
            .map_err(|e| AcceptError::io(&self.path, e.into()))
    }

    /// The folder there, opened without following a link.
    pub fn open(&self) -> Result<OwnedFd, AcceptError> {
        open_beneath(
            &self.parent,
            self.path.parent().unwrap_or(Path::new("/")),
            Path::new(&self.name),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
    }

    /// Remove the empty folder there (a failure leaves it).
    pub(crate) fn remove_empty_dir(&self) -> Result<(), AcceptError> {
        nix::unistd::unlinkat(Some(self.parent.as_raw_fd()), self.name.as_os_str(), nix::unistd::UnlinkatFlags::RemoveDir)
            .map_err(|e| AcceptError::io(&self.path, e.into()))
    }

    /// Move `from` (a folder of the door's own, by a path it made) to this
    /// place: renamed into the opened parent, so no link on the caller's
    /// path is followed. Only an empty folder there is replaced.
    pub fn take(&self, from: &Path) -> Result<(), AcceptError> {
        nix::fcntl::renameat(None, from, Some(self.parent.as_raw_fd()), self.name.as_os_str())
            .map_err(|e| AcceptError::io(&self.path, e.into()))
    }

    /// The device of the parent's filesystem (a rename stays on one).
    pub fn device(&self) -> Result<u64, AcceptError> {
        fstat(&self.parent).map(|st| st.st_dev).map_err(|e| AcceptError::io(&self.path, e))
    }
}

/// One entry of a caller's folder that a copy left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Relative to the folder copied.
    pub path: PathBuf,
    pub reason: RejectReason,
    pub why: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", crate::artifacts::escape_name(self.path.as_os_str().as_bytes()), self.why)
    }
}

/// What a copy may hold in all.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Bytes of file content.
    pub bytes: u64,
    /// Entries of every kind.
    pub entries: u64,
}

/// What [`copy_tree`] did.
#[derive(Debug, Default)]
pub struct Copied {
    pub files: u64,
    pub bytes: u64,
    /// Every entry left out, with why.
    pub refused: Vec<Refusal>,
}

/// Why a copy stopped.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the folder holds more than {0} bytes")]
    TooLarge(u64),
    #[error("the folder holds more than {0} entries")]
    TooMany(u64),
    #[error("copy {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Copy the caller's opened folder `from` into the door's own empty
/// folder `to`, walking by descriptor and following no link, with the
/// module's four rules: what `reach` may not read, hard links, fifos,
/// sockets, devices and trees deeper than [`MAX_DEPTH`] are left out and
/// listed; files keep their permission bits (set-id dropped), folders too
/// (once filled), both their mtimes.
pub fn copy_tree(from: &OwnedFd, to: &OwnedFd, reach: Reach, bounds: Bounds) -> Result<Copied, CopyError> {
    let mut copied = Copied::default();
    let mut entries = 0u64;
    fill(from, to, Path::new(""), 0, reach, bounds, &mut entries, &mut copied)?;
    Ok(copied)
}

/// The permission bits a copy keeps: no set-id bit (the jail's mounts are
/// nosuid anyway), nothing added.
pub(crate) fn permission_bits(st: &FileStat) -> u32 {
    st.st_mode & 0o1777
}

pub(crate) fn times(st: &FileStat) -> [nix::sys::time::TimeSpec; 2] {
    use nix::sys::time::TimeSpec;
    [
        TimeSpec::new(st.st_atime, st.st_atime_nsec),
        TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
    ]
}

/// The names in a folder, without `.` and `..`, sorted.
pub(crate) fn names(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
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

fn open_at(dir: &OwnedFd, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    sys::openat2_mode(Some(dir.as_fd()), Path::new(name), flags, mode, BENEATH)
}

/// Copy one accepted file (`file`, opened by [`open_file`] or
/// [`open_file_beneath`] at `path`) into the door's folder `into` as
/// `name`, by the module's rules: a hard link refused, its permission bits
/// kept (set-id dropped), at most `max` bytes. Returns the bytes copied.
pub fn copy_file(file: File, path: &Path, into: &OwnedFd, name: &OsStr, reach: Reach, max: u64) -> Result<u64, AcceptError> {
    let st = nix::sys::stat::fstat(file.as_raw_fd()).map_err(|e| AcceptError::io(path, e.into()))?;
    if st.st_nlink > 1 {
        return Err(AcceptError::new(path, Problem::HardLink(st.st_nlink as u64)));
    }
    let size = st.st_size.max(0) as u64;
    if size > max {
        return Err(AcceptError::new(path, Problem::TooLarge(size, max)));
    }
    write_copy(file, &st, into, name, reach).map_err(|e| AcceptError::io(path, e))
}

/// A new file `name` in `into` (never through an existing entry) with at
/// most `st`'s size of `src`'s bytes (a file growing as it is copied cannot
/// pass a bound), then `st`'s permission bits (set-id dropped) and times.
fn write_copy(src: File, st: &FileStat, into: &OwnedFd, name: &OsStr, reach: Reach) -> io::Result<u64> {
    let dst = open_at(into, name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
    reach.keep_group(&dst, st)?;
    let dst = File::from(dst);
    let n = io::copy(&mut src.take(st.st_size.max(0) as u64), &mut &dst)?;
    nix::sys::stat::fchmod(dst.as_raw_fd(), Mode::from_bits_truncate(permission_bits(st)))?;
    let [a, m] = times(st);
    nix::sys::stat::futimens(dst.as_raw_fd(), &a, &m)?;
    Ok(n)
}

#[allow(clippy::too_many_arguments)]
fn fill(
    from: &OwnedFd,
    to: &OwnedFd,
    rel: &Path,
    depth: usize,
    reach: Reach,
    bounds: Bounds,
    entries: &mut u64,
    out: &mut Copied,
) -> Result<(), CopyError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| CopyError::Io { path, source }
    };
    for name in names(from).map_err(err(rel))? {
        let path = rel.join(&name);
        *entries += 1;
        if *entries > bounds.entries {
            return Err(CopyError::TooMany(bounds.entries));
        }
        let refuse = |out: &mut Copied, reason, why: String| out.refused.push(Refusal { path: path.clone(), reason, why });
        let st = match stat_at(from, &name) {
            Ok(st) => st,
            // Gone since it was listed.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(err(&path)(e)),
        };
        match kind_of(&st) {
            Kind::Dir if depth + 1 >= MAX_DEPTH => {
                refuse(out, RejectReason::TooDeep, format!("a folder deeper than {MAX_DEPTH} levels"));
            }
            Kind::Dir => {
                let sub = match open_at(from, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                        refuse(out, RejectReason::Unreadable, reach.refuse(&st, Want::Read).to_string());
                        continue;
                    }
                    Err(e) => return Err(err(&path)(e)),
                };
                let now = fstat(&sub).map_err(err(&path))?;
                if !reach.allows(&sub, &now, Want::Read).map_err(err(&path))? {
                    refuse(out, RejectReason::Unreadable, reach.refuse(&now, Want::Read).to_string());
                    continue;
                }
                nix::sys::stat::mkdirat(Some(to.as_raw_fd()), name.as_os_str(), Mode::from_bits_truncate(0o700))
                    .map_err(|e| err(&path)(e.into()))?;
                let tsub = open_at(to, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(err(&path))?;
                reach.keep_group(&tsub, &now).map_err(err(&path))?;
                fill(&sub, &tsub, &path, depth + 1, reach, bounds, entries, out)?;
                nix::sys::stat::fchmod(tsub.as_raw_fd(), Mode::from_bits_truncate(permission_bits(&now)))
                    .map_err(|e| err(&path)(e.into()))?;
                let [a, m] = times(&now);
                nix::sys::stat::futimens(tsub.as_raw_fd(), &a, &m).map_err(|e| err(&path)(e.into()))?;
            }
            Kind::File if st.st_nlink > 1 => {
                refuse(out, RejectReason::HardLink, Problem::HardLink(st.st_nlink as u64).to_string());
            }
            Kind::File => {
                let src = match open_at(from, &name, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                        refuse(out, RejectReason::Unreadable, reach.refuse(&st, Want::Read).to_string());
                        continue;
                    }
                    // Swapped for a link since it was listed.
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                        refuse(out, RejectReason::Symlink, "replaced by a link while it was copied".into());
                        continue;
                    }
                    Err(e) => return Err(err(&path)(e)),
                };
                // Judged on what was opened: the listing may be stale.
                let now = fstat(&src).map_err(err(&path))?;
                if kind_of(&now) != Kind::File || now.st_nlink > 1 {
                    refuse(out, RejectReason::Changed, "it changed while it was copied".into());
                    continue;
                }
                if !reach.allows(&src, &now, Want::Read).map_err(err(&path))? {
                    refuse(out, RejectReason::Unreadable, reach.refuse(&now, Want::Read).to_string());
                    continue;
                }
                if out.bytes.saturating_add(now.st_size.max(0) as u64) > bounds.bytes {
                    return Err(CopyError::TooLarge(bounds.bytes));
                }
                let n = write_copy(File::from(src), &now, to, &name, reach).map_err(err(&path))?;
                out.files += 1;
                out.bytes += n;
            }
            Kind::Symlink => {
                // Its text only, never followed here.
                let target =
                    nix::fcntl::readlinkat(Some(from.as_raw_fd()), name.as_os_str()).map_err(|e| err(&path)(e.into()))?;
                nix::unistd::symlinkat(target.as_os_str(), Some(to.as_raw_fd()), name.as_os_str())
                    .map_err(|e| err(&path)(e.into()))?;
            }
            Kind::Fifo => refuse(out, RejectReason::Fifo, "a fifo".into()),
            Kind::Socket => refuse(out, RejectReason::Socket, "a socket".into()),
            Kind::Device => refuse(out, RejectReason::Device, "a device node".into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
