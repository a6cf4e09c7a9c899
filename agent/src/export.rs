//! What may leave a session, and how the host reads step output at all.
//!
//! A step's output folder is written by an untrusted script. The jail checks
//! it after each step and lists what it accepted (`artifacts`, exact names:
//! accepted names are printable UTF-8 by construction) and what it refused
//! (`rejected_artifacts`, names escaped for display). policies/README.md
//! says whoever hands outputs on must use `artifacts` only, so this is an
//! allowlist: [`Accepted`] is the accepted files of the latest step whose
//! output the jail checked (a step that could not start, `setup_failed`,
//! checked nothing and changes nothing), matched on the exact name, and the
//! export copies those and nothing else, each only if its content still has
//! the sha256 the jail reported.
//!
//! Every open beneath a folder is `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` with `O_NOFOLLOW`: no link left by a step, or found
//! in the destination, is followed. A link or special file already in the
//! destination where a file or folder is to go is an error naming it; files
//! are written to a fresh temporary name and renamed into place, so nothing
//! is ever written through an existing entry.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use jail::result::{Change, RunResult, Status};
use jail::sys::{RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, Mode, SFlag};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::escape::shown;

pub const BENEATH: u64 = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the destination {path} is a symbolic link or has one on the way; pass the real folder")]
    DestIsLink { path: PathBuf },
    #[error("{path} in the destination is {what}; remove it or pick another --output folder (links and special files there are never written through)")]
    Existing { path: PathBuf, what: &'static str },
    #[error("{op} {path}: {error}")]
    Io {
        op: &'static str,
        path: PathBuf,
        error: io::Error,
    },
}

/// One accepted file: what the jail saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedFile {
    pub bytes: u64,
    pub sha256: String,
}

/// The accepted files of the output, by exact relative path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub files: BTreeMap<String, AcceptedFile>,
}

impl Accepted {
    /// Take the accepted set from a step's result. A step that did not start
    /// checked nothing: the set stays what it was.
    pub fn update(&mut self, result: &RunResult) {
        if result.status == Status::SetupFailed {
            return;
        }
        self.files = result
            .artifacts
            .iter()
            .filter(|a| a.change != Change::Deleted)
            .filter_map(|a| Some((a.path.clone(), AcceptedFile { bytes: a.bytes, sha256: a.sha256.clone()? })))
            .collect();
    }

    pub fn get(&self, rel: &str) -> Option<&AcceptedFile> {
        self.files.get(rel)
    }

    /// Forget files no longer in `output` (after a delete).
    pub fn forget_missing(&mut self, output: &Path) {
        self.files.retain(|rel, _| std::fs::symlink_metadata(output.join(rel)).is_ok());
    }
}

/// Delete one entry (a file, a link or a special file, never a folder)
/// beneath `base`, without following any link on the way.
pub fn delete_beneath(base: &Path, rel: &Path) -> Result<(), String> {
    let name = shown(&rel.to_string_lossy());
    let (Some(file), parent) = (rel.file_name(), rel.parent().unwrap_or(Path::new(""))) else {
        return Err(format!("{name}: give a file's path"));
    };
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!("{name}: only plain relative paths are allowed"));
    }
    let root = open_dir(base).map_err(|e| format!("{}: {e}", base.display()))?;
    let dir = if parent.as_os_str().is_empty() {
        root
    } else {
        jail::sys::openat2(Some(root.as_fd()), parent, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, BENEATH)
            .map_err(|e| format!("{name}: the folder on the way cannot be opened without following links ({e})"))?
    };
    match lookup(&dir, Path::new(file)).map_err(|e| format!("{name}: {e}"))? {
        None => return Err(format!("{name}: no such file")),
        Some(st) if kind(&st) == Kind::Dir => return Err(format!("{name} is a folder; delete the files in it")),
        Some(_) => {}
    }
    nix::unistd::unlinkat(Some(dir.as_raw_fd()), file, nix::unistd::UnlinkatFlags::NoRemoveDir)
        .map_err(|e| format!("{name}: {e}"))
}

/// What an export did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exported {
    /// Paths copied, relative to the destination.
    pub copied: Vec<String>,
    /// Accepted files not copied, with why (escaped).
    pub skipped: Vec<String>,
}

/// Open a regular file beneath `base` for reading without following any
/// link; a fifo cannot block (`O_NONBLOCK`). The error is in plain words,
/// with the name escaped.
pub fn open_file_beneath(base: &Path, rel: &Path) -> Result<File, String> {
    let name = shown(&rel.to_string_lossy());
    if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!("{name}: only plain relative paths are allowed"));
    }
    let dir = open_dir(base).map_err(|e| format!("{}: {e}", base.display()))?;
    let fd = jail::sys::openat2(Some(dir.as_fd()), rel, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, BENEATH).map_err(
        |e| match e.raw_os_error() {
            Some(libc::ELOOP) => {
                format!("{name} is a symbolic link or has one on the way; links are not followed")
            }
            Some(libc::ENOENT) => format!("{name}: no such file"),
            Some(libc::ENOTDIR) => format!("{name}: not a folder on the way"),
            Some(libc::EXDEV) => format!("{name} leads outside its folder"),
            _ => format!("{name}: {e}"),
        },
    )?;
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| format!("{name}: {e}"))?;
    match kind(&st) {
        Kind::File => Ok(File::from(fd)),
        Kind::Dir => Err(format!("{name} is a folder; list it instead")),
        _ => Err(format!("{name} is not a regular file")),
    }
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    jail::sys::openat2(None, path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, jail::accept::RESOLVE)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Link,
    Other,
}

fn kind(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFLNK => Kind::Link,
        _ => Kind::Other,
    }
}

fn describe(k: Kind) -> &'static str {
    match k {
        Kind::Link => "a symbolic link",
        Kind::Dir => "a folder",
        Kind::File => "a file with more than one name (a hard link)",
        Kind::Other => "a special file (fifo, socket or device)",
    }
}

/// What is at `name` in `dir`, never following it.
fn lookup(dir: &OwnedFd, name: &Path) -> io::Result<Option<FileStat>> {
    match nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Copy the accepted files of `output` into `dest` (created if missing).
pub fn export(output: &Path, accepted: &Accepted, dest: &Path) -> Result<Exported, ExportError> {
    let io_err = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |error: io::Error| ExportError::Io { op, path, error }
    };
    // The user's folder, taken as the jail crate takes every caller's path
    // (`jail::accept`): made with its parents when missing, no link
    // followed on the way or at its end (a trailing slash included).
    let dest_fd = jail::accept::make_dirs(dest, 0o777).map_err(|e| match e.problem {
        jail::accept::Problem::Link => ExportError::DestIsLink { path: dest.to_path_buf() },
        jail::accept::Problem::NotAFolder => ExportError::Existing { path: dest.to_path_buf(), what: "not a folder" },
        _ => ExportError::Io {
            op: "open",
            path: dest.to_path_buf(),
            error: io::Error::other(e.problem.to_string()),
        },
    })?;
    let src_fd = open_dir(output).map_err(io_err("open", output))?;
    // Check every target first, so a planted link stops the export before
    // anything is written; the copy checks again on the descriptors.
    for rel in accepted.files.keys() {
        check_target(&dest_fd, dest, Path::new(rel))?;
    }
    let mut out = Exported::default();
    for (rel, want) in &accepted.files {
        let rel_path = Path::new(rel);
        let mut from = match open_source(&src_fd, rel_path, want) {
            Ok(f) => f,
            Err(why) => {
                out.skipped.push(format!("{}: {why}", shown(rel)));
                continue;
            }
        };
        let (dir, name) = target_dir(&dest_fd, dest, rel_path)?;
        if let Some(why) = copy_into(&mut from, &dir, &name, want).map_err(io_err("write", &dest.join(rel_path)))? {
            out.skipped.push(format!("{}: {why}", shown(rel)));
            continue;
        }
        out.copied.push(rel.clone());
    }
    Ok(out)
}

/// The source file, if it is still the regular, single-named file of the
/// size the jail accepted.
fn open_source(src: &OwnedFd, rel: &Path, want: &AcceptedFile) -> Result<File, String> {
    let fd = jail::sys::openat2(Some(src.as_fd()), rel, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, BENEATH)
        .map_err(|e| format!("cannot open it without following links ({e}); not copied"))?;
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| format!("{e}; not copied"))?;
    if kind(&st) != Kind::File || st.st_nlink != 1 {
        return Err("it is no longer a regular file with one name; not copied".into());
    }
    if st.st_size as u64 != want.bytes {
        return Err("it changed since the jail checked it; not copied".into());
    }
    Ok(File::from(fd))
}

/// Every folder on the way to `rel` in the destination must be a real
/// folder (or absent), and `rel` itself absent or a regular single-named file.
fn check_target(dest_fd: &OwnedFd, dest: &Path, rel: &Path) -> Result<(), ExportError> {
    let parts: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let mut at = dest.to_path_buf();
    let mut dir = dest_fd
        .try_clone()
        .map_err(|error| ExportError::Io { op: "dup", path: dest.to_path_buf(), error })?;
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let last = i + 1 == parts.len();
        let st = lookup(&dir, Path::new(part)).map_err(|error| ExportError::Io { op: "stat", path: at.clone(), error })?;
        let Some(st) = st else { return Ok(()) };
        let k = kind(&st);
        match (last, k) {
            (true, Kind::File) if st.st_nlink == 1 => return Ok(()),
            (false, Kind::Dir) => {
                dir = jail::sys::openat2(
                    Some(dir.as_fd()),
                    Path::new(part),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    BENEATH,
                )
                .map_err(|error| ExportError::Io { op: "open", path: at.clone(), error })?;
            }
            _ => return Err(ExportError::Existing { path: at, what: describe(k) }),
        }
    }
    Ok(())
}

/// The destination folder of `rel` (made as needed, never through a link)
/// and the file's name in it.
fn target_dir(dest_fd: &OwnedFd, dest: &Path, rel: &Path) -> Result<(OwnedFd, PathBuf), ExportError> {
    let parts: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let Some((name, dirs)) = parts.split_last() else {
        return Err(ExportError::Existing { path: dest.to_path_buf(), what: "an empty name" });
    };
    let mut at = dest.to_path_buf();
    let mut dir = dest_fd
        .try_clone()
        .map_err(|error| ExportError::Io { op: "dup", path: dest.to_path_buf(), error })?;
    for part in dirs {
        at.push(part);
        let p = Path::new(part);
        match lookup(&dir, p).map_err(|error| ExportError::Io { op: "stat", path: at.clone(), error })? {
            None => nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), p, Mode::from_bits_truncate(0o755))
                .map_err(|e| ExportError::Io { op: "mkdir", path: at.clone(), error: e.into() })?,
            Some(st) if kind(&st) == Kind::Dir => {}
            Some(st) => return Err(ExportError::Existing { path: at, what: describe(kind(&st)) }),
        }
        dir = jail::sys::openat2(Some(dir.as_fd()), p, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, BENEATH).map_err(
            |error| match error.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => ExportError::Existing { path: at.clone(), what: "a symbolic link" },
                _ => ExportError::Io { op: "open", path: at.clone(), error },
            },
        )?;
    }
    at.push(name);
    match lookup(&dir, Path::new(name)).map_err(|error| ExportError::Io { op: "stat", path: at.clone(), error })? {
        None => {}
        Some(st) if kind(&st) == Kind::File && st.st_nlink == 1 => {}
        Some(st) => return Err(ExportError::Existing { path: at, what: describe(kind(&st)) }),
    }
    Ok((dir, PathBuf::from(name)))
}

/// Write `from` to a fresh name in `dir`, hashing as it goes, and rename it
/// over `name` only when the content is what the jail accepted. Returns why
/// not, when it was not.
fn copy_into(from: &mut File, dir: &OwnedFd, name: &Path, want: &AcceptedFile) -> io::Result<Option<String>> {
    let tmp = PathBuf::from(format!(".jail-agent-{}-{}.part", std::process::id(), unique()));
    let fd = jail::sys::openat2_mode(
        Some(dir.as_fd()),
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o644,
        BENEATH,
    )?;
    let mut to = File::from(fd);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    let copied: io::Result<()> = (|| loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        total += n as u64;
        if total > want.bytes {
            return Ok(());
        }
        hash.update(&buf[..n]);
        to.write_all(&buf[..n])?;
    })();
    let same = total == want.bytes && hex(&hash.finalize()) == want.sha256;
    if copied.is_err() || !same {
        let _ = nix::unistd::unlinkat(Some(dir.as_raw_fd()), &tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
        copied?;
        return Ok(Some("its content changed since the jail checked it (sha256 differs); not copied".into()));
    }
    nix::fcntl::renameat(Some(dir.as_raw_fd()), &tmp, Some(dir.as_raw_fd()), name).map_err(io::Error::from)?;
    Ok(None)
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn accepted(dir: &Path, names: &[&str]) -> Accepted {
        let mut a = Accepted::default();
        for n in names {
            let data = std::fs::read(dir.join(n)).unwrap();
            a.files
                .insert(n.to_string(), AcceptedFile { bytes: data.len() as u64, sha256: hex(&Sha256::digest(&data)) });
        }
        a
    }

    #[test]
    fn only_accepted_files_are_copied_and_only_with_the_content_the_jail_saw() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::write(out.join("a.csv"), "x\n1\n").unwrap();
        std::fs::write(out.join("sub/b.txt"), "b").unwrap();
        std::fs::write(out.join("payload.sh"), "rm -rf /").unwrap();
        std::fs::write(out.join("c.txt"), "c").unwrap();
        let acc = accepted(&out, &["a.csv", "sub/b.txt", "c.txt"]);
        std::fs::write(out.join("c.txt"), "C").unwrap(); // same size, other content
        let dest = t.path().join("dest");
        let e = export(&out, &acc, &dest).unwrap();
        assert_eq!(e.copied, ["a.csv", "sub/b.txt"]);
        assert!(e.skipped[0].starts_with("c.txt: its content changed"), "{:?}", e.skipped);
        assert_eq!(std::fs::read_to_string(dest.join("sub/b.txt")).unwrap(), "b");
        assert!(!dest.join("payload.sh").exists() && !dest.join("c.txt").exists());
        let left: Vec<_> = std::fs::read_dir(&dest).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file is left: {left:?}");
    }

    #[test]
    fn a_link_or_fifo_in_the_destination_is_an_error_naming_it_and_nothing_is_written_through_it() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::write(out.join("a.txt"), "new").unwrap();
        std::fs::write(out.join("sub/b.txt"), "new").unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let acc = accepted(&out, &["a.txt", "sub/b.txt"]);

        let dest = t.path().join("dest1");
        std::fs::create_dir(&dest).unwrap();
        symlink(&victim, dest.join("a.txt")).unwrap();
        let e = export(&out, &acc, &dest).unwrap_err().to_string();
        assert!(e.contains(&format!("{}", dest.join("a.txt").display())) && e.contains("a symbolic link"), "{e}");

        let dest = t.path().join("dest2");
        std::fs::create_dir(&dest).unwrap();
        symlink(t.path(), dest.join("sub")).unwrap();
        let e = export(&out, &acc, &dest).unwrap_err().to_string();
        assert!(e.contains("dest2/sub in the destination is a symbolic link"), "{e}");

        let dest = t.path().join("dest3");
        std::fs::create_dir(&dest).unwrap();
        nix::unistd::mkfifo(&dest.join("a.txt"), Mode::from_bits_truncate(0o600)).unwrap();
        let e = export(&out, &acc, &dest).unwrap_err().to_string();
        assert!(e.contains("a special file"), "{e}");

        let dest = t.path().join("dest4");
        std::fs::create_dir(&dest).unwrap();
        std::fs::hard_link(&victim, dest.join("a.txt")).unwrap();
        let e = export(&out, &acc, &dest).unwrap_err().to_string();
        assert!(e.contains("hard link"), "{e}");

        let dest = t.path().join("dest5");
        symlink(t.path(), &dest).unwrap();
        assert!(matches!(export(&out, &acc, &dest), Err(ExportError::DestIsLink { .. })));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!t.path().join("sub").exists());
    }

    #[test]
    fn an_existing_regular_file_is_replaced_not_written_through() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("a.txt"), "new").unwrap();
        let dest = t.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        std::fs::write(dest.join("a.txt"), "old").unwrap();
        let e = export(&out, &accepted(&out, &["a.txt"]), &dest).unwrap();
        assert_eq!(e.copied, ["a.txt"]);
        assert_eq!(std::fs::read_to_string(dest.join("a.txt")).unwrap(), "new");
    }

    #[test]
    fn a_source_swapped_for_a_link_or_a_hard_link_is_not_copied() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("a.txt"), "abc").unwrap();
        std::fs::write(out.join("b.txt"), "abc").unwrap();
        let acc = accepted(&out, &["a.txt", "b.txt"]);
        let secret = t.path().join("secret");
        std::fs::write(&secret, "abc").unwrap();
        std::fs::remove_file(out.join("a.txt")).unwrap();
        symlink(&secret, out.join("a.txt")).unwrap();
        std::fs::remove_file(out.join("b.txt")).unwrap();
        std::fs::hard_link(&secret, out.join("b.txt")).unwrap();
        let e = export(&out, &acc, &t.path().join("dest")).unwrap();
        assert!(e.copied.is_empty(), "{e:?}");
        assert_eq!(e.skipped.len(), 2);
    }

    #[test]
    fn a_setup_failure_keeps_the_accepted_set() {
        let mut a = Accepted::default();
        a.files.insert("x".into(), AcceptedFile { bytes: 1, sha256: "00".into() });
        let r = RunResult::setup_failed(jail::result::SetupError { stage: "s".into(), message: "m".into(), causes: vec![] });
        a.update(&r);
        assert!(a.get("x").is_some());
    }
}
