//! A session's files API (`put_file`, `get_file`, `list_files` on its
//! socket; `jail session put|get|ls`): the caller writes a file into the
//! session, reads one back, lists a folder, while the session lives.
//!
//! Session supervisor side. The place is the jail's own writable folder,
//! `/workspace/output`, held as the output tmpfs the launch filled (the
//! rootfs, the input and the code stay read-only, so nothing here can
//! write them). What a caller puts there is the session's like anything a
//! cell writes: the code sees it, and at the end it is judged and
//! delivered with the rest. A session whose output is the host folder
//! itself (`filesystem.output_size: "unlimited"`) has no tmpfs: the API
//! says so, and the caller uses that folder.
//!
//! Every path is the caller's words: checked as an artifact's name is
//! (artifacts/single.rs, `check_rel`) before anything is opened, then each
//! component opened beneath the tmpfs without following a link, as the
//! sandbox's host ids (fsid.rs), so the caller gets no right the code
//! lacks. A put is written whole to an unnamed file and linked in
//! (output.rs, `Partial`): a cell never sees half of it. A get copies the
//! file, at most [`MAX_FILE`] bytes, into the supervisor's memory and
//! judges that copy by the artifact rules (artifacts/single.rs): a cell
//! writing the file meanwhile changes nothing that was judged, and what
//! is returned is exactly what passed. A listing reads at most
//! [`MAX_LISTED`] names. All three are bounded in bytes and time, so they
//! are served while a cell runs too.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use base64::Engine;

use crate::artifacts::link_refusal;
use crate::artifacts::single::{check_rel, judge_copy};
use crate::artifacts::ArtifactRules;
use crate::client::session::{FileAnswer, FileEntry, FileRefusal, Request, MAX_FILE, MAX_LISTED};
use crate::digest::sha256_hex;
use crate::fsid::{Acting, As, FsIds};
use crate::output::Partial;
use crate::result::RejectReason;
use crate::sys::{self, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};

/// The folder the API works in, as the code sees it.
pub(crate) const PLACE: &str = "/workspace/output";

/// The output tmpfs and who owns what is in it.
pub(crate) struct Place<'a> {
    pub(crate) tmpfs: &'a OwnedFd,
    pub(crate) ids: FsIds,
    pub(crate) rules: &'a ArtifactRules,
}

type Refusal = (FileRefusal, Option<RejectReason>, String);

fn refused((code, reason, detail): Refusal) -> FileAnswer {
    FileAnswer::Refused { code, reason, detail }
}

fn bad_path((reason, detail): (RejectReason, String)) -> Refusal {
    (FileRefusal::BadPath, Some(reason), detail)
}

/// `rel`'s components (artifacts/single.rs, `check_rel`), none of them a
/// name the jail keeps for a file it is writing (output.rs, `Partial`).
fn components<'a>(rel: &'a str, rules: &ArtifactRules, folder_ok: bool) -> Result<Vec<&'a str>, Refusal> {
    let parts = check_rel(rel, rules, folder_ok).map_err(bad_path)?;
    match parts.iter().find(|p| p.starts_with(crate::output::PARTIAL_PREFIX)) {
        Some(p) => Err(bad_path((RejectReason::BadName, format!("{p:?} is a name the jail keeps for files it is writing")))),
        None => Ok(parts),
    }
}

/// Write `data` (base64) as `path`.
pub(crate) fn put(place: Option<Place<'_>>, path: &str, data: &str) -> FileAnswer {
    with_place(place, |p| {
        let rel = inside(path);
        let parts = components(rel, p.rules, false)?;
        if data.len() / 4 * 3 > MAX_FILE + 3 {
            return Err(too_large(data.len() / 4 * 3));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .map_err(|e| (FileRefusal::BadPath, None, format!("the content is not base64 ({e})")))?;
        if bytes.len() > MAX_FILE {
            return Err(too_large(bytes.len()));
        }
        let (dirs, name) = parts.split_at(parts.len() - 1);
        write(p.tmpfs, dirs, OsStr::new(name[0]), &bytes)?;
        Ok(FileAnswer::Written { path: rel.to_string(), bytes: bytes.len() as u64, sha256: sha256_hex(&bytes) })
    })
}

/// Read `path` back, judged.
pub(crate) fn get(place: Option<Place<'_>>, path: &str) -> FileAnswer {
    with_place(place, |p| {
        let rel = inside(path);
        let parts = components(rel, p.rules, false)?;
        let bytes = read(p.tmpfs, &parts)?;
        let (artifact, bytes) =
            judge_copy(rel, bytes, p.rules).map_err(|(reason, detail)| (FileRefusal::Rejected, Some(reason), detail))?;
        Ok(FileAnswer::Read { artifact, data: base64::engine::general_purpose::STANDARD.encode(bytes) })
    })
}

/// List the folder `path`.
pub(crate) fn list(place: Option<Place<'_>>, path: &str) -> FileAnswer {
    with_place(place, |p| {
        let rel = inside(path);
        let parts = components(rel, p.rules, true)?;
        let (entries, truncated) = entries(p.tmpfs, &parts)?;
        Ok(FileAnswer::Listed { path: rel.to_string(), entries, truncated })
    })
}

fn with_place(place: Option<Place<'_>>, op: impl FnOnce(Place<'_>) -> Result<FileAnswer, Refusal>) -> FileAnswer {
    let Some(place) = place else {
        return refused((
            FileRefusal::Unavailable,
            None,
            "this session's output is the host folder itself (filesystem.output_size \"unlimited\"): \
             read and write that folder, or start the session with a capped output_size"
                .into(),
        ));
    };
    // Every open, made and read as the sandbox's host ids.
    let mut fs = match Acting::begin(place.ids) {
        Ok(fs) => fs,
        Err(e) => return refused(failed(&e.into())),
    };
    match fs.on(As::Jail, || Ok(op(place))) {
        Ok(answer) => answer.unwrap_or_else(refused),
        Err(e) => refused(failed(&e)),
    }
}

/// The caller's path relative to the place: a path the code would use
/// (`/workspace/output/a.csv`) is taken too.
fn inside(path: &str) -> &str {
    match path.strip_prefix(PLACE) {
        Some("") => "",
        Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
        _ => path,
    }
}

fn too_large(n: usize) -> Refusal {
    (
        FileRefusal::TooLarge,
        None,
        format!("{n} bytes, over the {} MiB a file may be here: give a larger file as the session's input", MAX_FILE >> 20),
    )
}

fn failed(e: &io::Error) -> Refusal {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        return (FileRefusal::Failed, None, "the session's output is full (filesystem.output_size)".into());
    }
    (FileRefusal::Failed, None, e.to_string())
}

/// What an open of `name` in `dir` came to, in the API's words (`what`:
/// the path so far). A link refused by `RESOLVE_NO_SYMLINKS` is `ELOOP`,
/// or `ENOTDIR` when a folder was asked for: the entry itself says which.
fn opened(dir: &OwnedFd, name: &str, e: io::Error, what: &str) -> Refusal {
    let is_link = || {
        nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
    };
    match e.raw_os_error() {
        Some(libc::ENOTDIR | libc::ELOOP) if is_link() => {
            (FileRefusal::Link, None, format!("{what} is a link: the files API follows none"))
        }
        Some(libc::ENOENT) => (FileRefusal::NotFound, None, format!("{what} is not there")),
        Some(libc::ELOOP | libc::EXDEV) => (FileRefusal::Link, None, format!("{what} is a link: the files API follows none")),
        Some(libc::ENOTDIR) => (FileRefusal::NotAFile, None, format!("{what}: a component on the way is not a folder")),
        _ => failed(&e),
    }
}

const BENEATH: u64 = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

fn open_dir(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    sys::openat2(Some(dir.as_fd()), Path::new(name), flags, BENEATH)
}

/// The folders `dirs` beneath `root`, one component at a time; made
/// (0755) where missing when `make`.
fn walk(root: &OwnedFd, dirs: &[&str], make: bool) -> Result<OwnedFd, Refusal> {
    let mut at = root.try_clone().map_err(|e| failed(&e))?;
    for (i, name) in dirs.iter().enumerate() {
        let shown = dirs[..=i].join("/");
        at = match open_dir(&at, name) {
            Ok(fd) => fd,
            Err(e) if make && e.raw_os_error() == Some(libc::ENOENT) => {
                match nix::sys::stat::mkdirat(Some(at.as_raw_fd()), *name, nix::sys::stat::Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(failed(&e.into())),
                }
                open_dir(&at, name).map_err(|e| opened(&at, name, e, &shown))?
            }
            Err(e) => return Err(opened(&at, name, e, &shown)),
        };
    }
    Ok(at)
}

fn write(root: &OwnedFd, dirs: &[&str], name: &OsStr, bytes: &[u8]) -> Result<(), Refusal> {
    let dir = walk(root, dirs, true)?;
    let partial = Partial::create(&dir).map_err(|e| failed(&e))?;
    let done = (|| -> io::Result<()> {
        let mut f = partial.file();
        f.write_all(bytes)?;
        nix::sys::stat::fchmod(f.as_raw_fd(), nix::sys::stat::Mode::from_bits_truncate(0o644))?;
        Ok(())
    })();
    if let Err(e) = done {
        partial.discard(&dir);
        return Err(failed(&e));
    }
    partial.publish(&dir, name).map_err(|e| match e.raw_os_error() {
        Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST) => {
            (FileRefusal::NotAFile, None, format!("{} is a folder", name.to_string_lossy()))
        }
        _ => failed(&e),
    })
}

fn read(root: &OwnedFd, parts: &[&str]) -> Result<Vec<u8>, Refusal> {
    let (dirs, name) = parts.split_at(parts.len() - 1);
    let dir = walk(root, dirs, false)?;
    let shown = parts.join("/");
    // O_NONBLOCK: a fifo in its place does not hang the open.
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let fd = sys::openat2(Some(dir.as_fd()), Path::new(name[0]), flags, BENEATH).map_err(|e| opened(&dir, name[0], e, &shown))?;
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| failed(&e.into()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err((FileRefusal::NotAFile, None, format!("{shown} is not a regular file")));
    }
    if let Some((reason, detail)) = link_refusal(st.st_nlink, st.st_mode) {
        return Err((FileRefusal::Rejected, Some(reason), detail));
    }
    if st.st_size as u64 > MAX_FILE as u64 {
        return Err(too_large(st.st_size as usize));
    }
    // Bounded whatever the file does while it is read: it may grow.
    let mut bytes = Vec::with_capacity(st.st_size as usize);
    std::fs::File::from(fd).take(MAX_FILE as u64 + 1).read_to_end(&mut bytes).map_err(|e| failed(&e))?;
    if bytes.len() > MAX_FILE {
        return Err(too_large(bytes.len()));
    }
    Ok(bytes)
}

fn entries(root: &OwnedFd, parts: &[&str]) -> Result<(Vec<FileEntry>, bool), Refusal> {
    let dir = walk(root, parts, false)?;
    let mut listing =
        nix::dir::Dir::from_fd(dir.try_clone().map_err(|e| failed(&e))?.into_raw_fd()).map_err(|e| failed(&e.into()))?;
    let mut entries = Vec::new();
    let mut truncated = false;
    for entry in listing.iter() {
        let entry = entry.map_err(|e| failed(&e.into()))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." || name.starts_with(crate::output::PARTIAL_PREFIX.as_bytes()) {
            continue;
        }
        if entries.len() >= MAX_LISTED {
            truncated = true;
            break;
        }
        let st =
            nix::sys::stat::fstatat(Some(dir.as_raw_fd()), OsStr::from_bytes(name), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
        let (kind, bytes) = match st {
            Ok(st) => match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => ("file", st.st_size as u64),
                libc::S_IFDIR => ("dir", 0),
                libc::S_IFLNK => ("symlink", 0),
                _ => ("other", 0),
            },
            Err(_) => ("other", 0),
        };
        entries.push(FileEntry { name: crate::artifacts::escape_name(name), kind: kind.into(), bytes });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((entries, truncated))
}

/// The fuzz target's entry (fuzz/fuzz_targets/session_files.rs), not an
/// API for anything else: one request of the files API served in the
/// folder `dir`, standing for the output tmpfs, as its owner, by `rules`
/// (none: the built-in policy's).
pub fn serve_in(dir: &Path, request: &Request, rules: Option<&ArtifactRules>) -> FileAnswer {
    let default = crate::policy::Policy::builtin_default().map(|p| p.artifacts);
    let rules = match (rules, &default) {
        (Some(r), _) => r,
        (None, Ok(r)) => r,
        (None, Err(e)) => return refused((FileRefusal::Failed, None, e.to_string())),
    };
    let root = match sys::openat2(None, dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0) {
        Ok(fd) => fd,
        Err(e) => return refused(failed(&e)),
    };
    answer(Some(Place { tmpfs: &root, ids: FsIds::caller(), rules }), request)
}

/// The answer to a request of the files API; any other request is refused.
pub(crate) fn answer(place: Option<Place<'_>>, request: &Request) -> FileAnswer {
    match request {
        Request::PutFile { path, data } => put(place, path, data),
        Request::GetFile { path } => get(place, path),
        Request::ListFiles { path } => list(place, path),
        _ => refused((FileRefusal::BadPath, None, "not a request of the files API".into())),
    }
}
