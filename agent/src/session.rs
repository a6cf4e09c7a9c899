//! One run's folders on the host: `input` (a copy of the user's files, bound
//! read-only at /workspace/input), `code` (the scripts the model writes,
//! read-only at /workspace/code), `output` (writable at /workspace/output and
//! carried from step to step), `pool` (the warm pool's temp dir: its own
//! folder and its jails' slots, see `pool`), plus the trace and the
//! summary. Every run gets a fresh session dir, and each jail step binds
//! only its own session's folders, so nothing from one session is visible
//! to another.
//!
//! Nothing in a session is readable by another local user. As an ordinary
//! user the session dir and its folders are 0700, the copied inputs keep
//! their own mode (never wider), scripts are 0600, and the trace, summary,
//! answer and state are 0600. When the agent runs as root, `jail` maps the
//! sandbox to an unprivileged host uid (one of the policy's
//! `identity.root_host_uids`, its own for each concurrent run) and the
//! policy's `root_host_gid`, which all of them share and no user has, and
//! refuses folders that uid cannot use. So the sandbox reaches the session
//! through that group alone: the session dir is 0710 with the group (root
//! and the group may pass, nobody may list it), input and code are root's
//! and the group's, 0750; code files get their owner bits for root and
//! the read bits for the group; and output is given to the range's first
//! uid and the group, 0770, whichever uid a step gets.
//!
//! The input is copied as the jail crate takes every caller's path
//! (`jail::accept`): no link followed, links inside copied as links, each
//! entry's own mode kept (never widened), and only what the jail itself
//! could read through a bind of the folder: as root, what the "other" bits
//! (or the sandbox's group) allow (a 0600 file, even root's own, is not
//! copied). Hard links, fifos,
//! sockets and devices are never copied. Each entry left out is named in
//! `skipped_input`.
//!
//! Everything the host side reads from the session is untrusted (a step may
//! leave symlinks or fifos in `output`): every open is `openat2` beneath its
//! folder with no link followed, and only regular files are opened (see
//! `export`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::escape::shown;

/// Largest input the agent copies into a session.
const MAX_INPUT_BYTES: u64 = 1 << 30;
/// Most entries of an input the agent copies into a session.
const MAX_INPUT_ENTRIES: u64 = 100_000;
/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 500;
const MAX_DEPTH: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot create a session dir in {path}: {error} (pass --session-dir DIR, a folder you can write)")]
    CreateRoot { path: PathBuf, error: io::Error },
    #[error("{path} is not searchable by the sandbox uid {uid} (needed when jail-agent runs as root): chmod o+x {path}, or pass --session-dir DIR")]
    NotSearchable { path: PathBuf, uid: u32 },
    #[error("input dir {path} cannot be read: {error} (pass an existing folder to --input)")]
    ReadInput { path: PathBuf, error: io::Error },
    #[error("input dir {path} holds more than {max} MiB (pass a smaller folder to --input)", max = MAX_INPUT_BYTES >> 20)]
    InputTooLarge { path: PathBuf },
    #[error("{op} {path}: {error}")]
    Io {
        op: &'static str,
        path: PathBuf,
        error: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SessionError + 'a {
    move |error| SessionError::Io { op, path: path.to_path_buf(), error }
}

/// Who the sandbox is on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The agent runs as an ordinary user: the sandbox maps to that user.
    Caller,
    /// The agent runs as root: the sandbox maps to an unprivileged uid from
    /// `uid` up (one per concurrent run) and to `gid`.
    Sandbox { uid: u32, gid: u32 },
}

/// The three folders a step sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    Input,
    Code,
    Output,
}

impl Area {
    pub fn jail_path(self) -> &'static str {
        match self {
            Area::Input => "/workspace/input",
            Area::Code => "/workspace/code",
            Area::Output => "/workspace/output",
        }
    }
}

/// One listed entry, never followed if it is a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to its area, `/`-separated.
    pub rel: String,
    pub bytes: u64,
    pub kind: EntryKind,
    pub mtime_ns: i128,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// A fresh session on the host.
#[derive(Debug, Clone)]
pub struct Session {
    pub root: PathBuf,
    pub input: PathBuf,
    pub code: PathBuf,
    pub output: PathBuf,
    pub owner: Owner,
    /// Input entries that were not copied (links, devices), in plain words.
    pub skipped_input: Vec<String>,
}

impl Session {
    /// Create a fresh session under `parent` (default: the temp dir) with a
    /// copy of `input`.
    pub fn create(parent: Option<&Path>, input: &Path, owner: Owner) -> Result<Session, SessionError> {
        let parent = parent.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        fs::create_dir_all(&parent).map_err(|error| SessionError::CreateRoot { path: parent.clone(), error })?;
        let parent = fs::canonicalize(&parent).map_err(|error| SessionError::CreateRoot { path: parent.clone(), error })?;
        if let Owner::Sandbox { uid, gid } = owner {
            check_searchable(&parent, uid, gid)?;
        }
        let root = tempfile::Builder::new()
            .prefix("jail-agent-")
            .tempdir_in(&parent)
            .map_err(|error| SessionError::CreateRoot { path: parent.clone(), error })?
            .keep();
        // As root, the sandbox uid must pass through to its folders: its
        // group may search the session dir (not list it), nobody else may.
        match owner {
            Owner::Caller => set_mode(&root, 0o700)?,
            Owner::Sandbox { gid, .. } => {
                std::os::unix::fs::chown(&root, None, Some(gid)).map_err(io_err("chown", &root))?;
                set_mode(&root, 0o710)?;
            }
        }
        let mk = |name: &str| -> Result<PathBuf, SessionError> {
            let p = root.join(name);
            fs::create_dir(&p).map_err(io_err("mkdir", &p))?;
            give(&p, owner, 0o700)?;
            Ok(p)
        };
        let input_dir = mk("input")?;
        let code = mk("code")?;
        let output = mk("output")?;
        if let Owner::Sandbox { gid, .. } = owner {
            // Root stays the owner: jail copies a size-capped output dir to
            // and from as root by its mode bits. The sandbox's group may
            // write it, for a bound one (each step may get another uid of
            // the range, all with this gid).
            std::os::unix::fs::chown(&output, None, Some(gid)).map_err(io_err("chown", &output))?;
            set_mode(&output, 0o770)?;
        }
        let mut session = Session { root, input: input_dir, code, output, owner, skipped_input: Vec::new() };
        session.skipped_input = copy_input(input, &session.input, owner)?;
        Ok(session)
    }

    /// Open an existing session dir again (for `jail-agent resume`).
    pub fn reopen(root: &Path, owner: Owner) -> Result<Session, SessionError> {
        let root = fs::canonicalize(root).map_err(|error| SessionError::CreateRoot { path: root.to_path_buf(), error })?;
        for name in ["input", "code", "output"] {
            let p = root.join(name);
            let m = fs::symlink_metadata(&p).map_err(io_err("stat", &p))?;
            if !m.is_dir() {
                return Err(SessionError::Io {
                    op: "open",
                    path: p,
                    error: io::Error::new(io::ErrorKind::InvalidData, "not a folder: this is not a session dir"),
                });
            }
        }
        Ok(Session {
            input: root.join("input"),
            code: root.join("code"),
            output: root.join("output"),
            root,
            owner,
            skipped_input: Vec::new(),
        })
    }

    /// Write a script beneath the code dir (0600, the sandbox's when root),
    /// making its folders, never through a link.
    pub fn write_code(&self, rel: &Path, content: &[u8]) -> Result<(), String> {
        let shown_rel = shown(&rel.to_string_lossy());
        let mut dir = self.code.clone();
        let parts: Vec<_> = rel.components().collect();
        for c in &parts[..parts.len().saturating_sub(1)] {
            let Component::Normal(n) = c else {
                return Err(format!("{shown_rel}: only plain relative paths are allowed"));
            };
            dir.push(n);
            match fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("{shown_rel}: a folder on the way is not a folder")),
                Err(_) => {
                    fs::create_dir(&dir).map_err(|e| format!("cannot create the folder for {shown_rel}: {e}"))?;
                    give(&dir, self.owner, 0o700).map_err(|e| e.to_string())?;
                }
            }
        }
        let base = jail::sys::openat2(None, &self.code, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
            .map_err(|e| format!("cannot open the code dir: {e}"))?;
        let fd = jail::sys::openat2_mode(
            Some(base.as_fd()),
            rel,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0o600,
            crate::export::BENEATH,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => format!("{shown_rel} is a symbolic link; pick another name"),
            _ => format!("cannot write {shown_rel}: {e}"),
        })?;
        let mut f = File::from(fd);
        if !f.metadata().map(|m| m.is_file()).unwrap_or(false) {
            return Err(format!("{shown_rel} is not a regular file; pick another name"));
        }
        f.write_all(content).map_err(|e| format!("cannot write {shown_rel}: {e}"))?;
        give(&self.code.join(rel), self.owner, 0o600).map_err(|e| e.to_string())
    }

    pub fn dir(&self, area: Area) -> &Path {
        match area {
            Area::Input => &self.input,
            Area::Code => &self.code,
            Area::Output => &self.output,
        }
    }

    pub fn trace_path(&self) -> PathBuf {
        self.root.join("trace.jsonl")
    }

    /// The run's warm pool's temp dir (`pool/`, its TMPDIR), made when
    /// absent: the pool's own folder and its jails' slots live beneath it,
    /// so whatever the pool makes is the run's. As root its group is the
    /// sandbox's, which must pass through it to a pooled jail's input.
    pub fn pool_dir(&self) -> Result<PathBuf, SessionError> {
        let p = self.root.join("pool");
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(SessionError::Io {
                    op: "mkdir",
                    path: p,
                    error: io::Error::new(io::ErrorKind::AlreadyExists, "not a folder"),
                })
            }
            Err(_) => fs::create_dir(&p).map_err(io_err("mkdir", &p))?,
        }
        give(&p, self.owner, 0o700)?;
        Ok(p)
    }

    /// Resolve a path the model gave (`/workspace/output/a.csv`, `output/a.csv`,
    /// or a bare `a.csv`, looked up in output, then input, then code) to its
    /// area and its path relative to it.
    pub fn resolve(&self, given: &str) -> Result<(Area, PathBuf), String> {
        let given = given.trim();
        let stripped = given.strip_prefix("/workspace/").or_else(|| given.strip_prefix("workspace/"));
        let candidates: Vec<(Area, &str)> = match stripped {
            Some(rest) => {
                let (head, tail) = rest.split_once('/').unwrap_or((rest, ""));
                match head {
                    "input" => vec![(Area::Input, tail)],
                    "code" => vec![(Area::Code, tail)],
                    "output" => vec![(Area::Output, tail)],
                    _ => {
                        return Err(format!(
                            "{} is outside the sandbox's folders: use /workspace/input, /workspace/output or /workspace/code",
                            shown(given)
                        ))
                    }
                }
            }
            None if given.starts_with('/') => {
                return Err(format!(
                    "{} is outside the sandbox's folders: use /workspace/input, /workspace/output or /workspace/code",
                    shown(given)
                ))
            }
            None => {
                let (head, tail) = given.split_once('/').unwrap_or((given, ""));
                match head {
                    "input" => vec![(Area::Input, tail)],
                    "code" => vec![(Area::Code, tail)],
                    "output" => vec![(Area::Output, tail)],
                    _ => vec![(Area::Output, given), (Area::Input, given), (Area::Code, given)],
                }
            }
        };
        for (i, (area, rel)) in candidates.iter().enumerate() {
            let rel = clean_relative(rel)?;
            let exists = fs::symlink_metadata(self.dir(*area).join(&rel)).is_ok();
            if exists || i + 1 == candidates.len() {
                return Ok((*area, rel));
            }
        }
        Err(format!("{}: no such file", shown(given)))
    }

    /// Open a regular file beneath an area without following any link.
    pub fn open(&self, area: Area, rel: &Path) -> Result<File, String> {
        crate::export::open_file_beneath(self.dir(area), rel)
    }

    /// Every entry beneath an area, links listed and never followed.
    pub fn list(&self, area: Area) -> Vec<Entry> {
        let mut out = Vec::new();
        walk(self.dir(area), "", 0, &mut out);
        out
    }

    /// The output dir's files by path, to tell what a step created or changed.
    pub fn snapshot(&self) -> BTreeMap<String, (u64, i128)> {
        self.list(Area::Output)
            .into_iter()
            .filter(|e| e.kind == EntryKind::File)
            .map(|e| (e.rel, (e.bytes, e.mtime_ns)))
            .collect()
    }
}

/// A path made only of normal components.
pub fn clean_relative(rel: &str) -> Result<PathBuf, String> {
    let p = Path::new(rel);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(format!("{}: only plain relative paths are allowed (no `..`, no leading `/`)", shown(rel))),
        }
    }
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<Entry>) {
    if depth > MAX_DEPTH || out.len() >= MAX_LIST_ENTRIES {
        return;
    }
    let Ok(read) = fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = read.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if out.len() >= MAX_LIST_ENTRIES {
            return;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let Ok(meta) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        let ft = meta.file_type();
        let kind = if ft.is_symlink() {
            EntryKind::Symlink
        } else if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        };
        let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        out.push(Entry { rel: rel.clone(), bytes: meta.len(), kind, mtime_ns });
        if kind == EntryKind::Dir {
            walk(&e.path(), &rel, depth + 1, out);
        }
    }
}

/// Copy the user's input folder into the session's, as the jail crate
/// takes every caller's path (`jail::accept`): no link followed (links
/// inside are copied as links), only what the jail may read (as root: by
/// the "other" bits or the sandbox's group, which the copy keeps), each
/// entry's own mode kept,
/// hard links and special files never copied. What was left out, in plain
/// words.
fn copy_input(input: &Path, into: &Path, owner: Owner) -> Result<Vec<String>, SessionError> {
    use jail::accept::{self, Reach};
    let reach = match owner {
        Owner::Caller => Reach::Caller,
        Owner::Sandbox { gid, .. } => Reach::Sandbox { uid: None, gid: Some(gid) },
    };
    let refused = |e: accept::AcceptError| SessionError::ReadInput {
        path: input.to_path_buf(),
        error: io::Error::other(format!("{}; {}", e.problem, e.fix())),
    };
    let from = accept::open_dir(input, reach).map_err(refused)?;
    let to = accept::open_own_dir(into).map_err(|e| SessionError::Io {
        op: "open",
        path: into.to_path_buf(),
        error: io::Error::other(e.to_string()),
    })?;
    let copied = accept::copy_tree(&from, &to, reach, accept::Bounds { bytes: MAX_INPUT_BYTES, entries: MAX_INPUT_ENTRIES })
        .map_err(|e| match e {
            accept::CopyError::TooLarge(_) => SessionError::InputTooLarge { path: input.to_path_buf() },
            other => SessionError::ReadInput { path: input.to_path_buf(), error: io::Error::other(other.to_string()) },
        })?;
    Ok(copied
        .refused
        .iter()
        .map(|r| format!("{} ({}; not copied)", input.join(&r.path).display(), r.why))
        .collect())
}

/// Set a session entry's mode (`mode`: what the caller, its owner, gets).
/// When root, the sandbox's group also gets the owner's read and search
/// bits, never write, and others nothing: every uid of the range shares
/// that group, and no user has it.
fn give(p: &Path, owner: Owner, mode: u32) -> Result<(), SessionError> {
    match owner {
        Owner::Caller => set_mode(p, mode & 0o700),
        Owner::Sandbox { gid, .. } => {
            std::os::unix::fs::lchown(p, None, Some(gid)).map_err(io_err("chown", p))?;
            set_mode(p, (mode & 0o700) | ((mode & 0o500) >> 3))
        }
    }
}

fn set_mode(p: &Path, mode: u32) -> Result<(), SessionError> {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", p))
}

/// Every ancestor of `dir` (and `dir`) must let the sandbox uid pass.
fn check_searchable(dir: &Path, uid: u32, gid: u32) -> Result<(), SessionError> {
    for p in dir.ancestors() {
        let meta = fs::metadata(p).map_err(io_err("stat", p))?;
        let mode = meta.permissions().mode();
        let bit = if meta.uid() == uid {
            0o100
        } else if meta.gid() == gid {
            0o010
        } else {
            0o001
        };
        if mode & bit == 0 {
            return Err(SessionError::NotSearchable { path: p.to_path_buf(), uid });
        }
    }
    Ok(())
}

/// A name from the sandbox, safe to show a model or a terminal: control,
/// bidi and invisible characters escaped, cut to a few hundred bytes.
pub fn display_path(name: &str) -> String {
    shown(name)
}

/// Create (or replace) a private file: 0600 from the start.
pub fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> (tempfile::TempDir, Session) {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in");
        fs::create_dir(&input).unwrap();
        fs::write(input.join("data.csv"), "a,b\n1,2\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", input.join("link")).unwrap();
        let s = Session::create(Some(t.path()), &input, Owner::Caller).unwrap();
        (t, s)
    }

    #[test]
    fn input_is_copied_following_no_link_and_without_hard_links() {
        let (t, s) = session();
        assert_eq!(fs::read_to_string(s.input.join("data.csv")).unwrap(), "a,b\n1,2\n");
        // A link is copied as a link (its text, never followed here).
        assert_eq!(fs::read_link(s.input.join("link")).unwrap(), Path::new("/etc/passwd"));
        assert_eq!(s.skipped_input, Vec::<String>::new());
        // A hard link is never copied, and is named.
        let input = t.path().join("in");
        fs::write(t.path().join("elsewhere"), "x").unwrap();
        fs::hard_link(t.path().join("elsewhere"), input.join("hard")).unwrap();
        let s = Session::create(Some(t.path()), &input, Owner::Caller).unwrap();
        assert!(fs::symlink_metadata(s.input.join("hard")).is_err());
        assert_eq!(s.skipped_input.len(), 1, "{:?}", s.skipped_input);
        assert!(s.skipped_input[0].contains("hard link"), "{:?}", s.skipped_input);
        // The input named through a link is refused.
        std::os::unix::fs::symlink(&input, t.path().join("inlink")).unwrap();
        for p in ["inlink", "inlink/"] {
            let e = Session::create(Some(t.path()), &t.path().join(p), Owner::Caller).unwrap_err();
            assert!(e.to_string().contains("link"), "{e}");
        }
    }

    #[test]
    fn model_paths_resolve_beneath_their_area() {
        let (_t, s) = session();
        assert_eq!(s.resolve("/workspace/input/data.csv").unwrap(), (Area::Input, PathBuf::from("data.csv")));
        assert_eq!(s.resolve("data.csv").unwrap(), (Area::Input, PathBuf::from("data.csv")));
        assert_eq!(s.resolve("output/x.csv").unwrap(), (Area::Output, PathBuf::from("x.csv")));
        assert!(s.resolve("/etc/passwd").is_err());
        assert!(s.resolve("/workspace/input/../../x").is_err());
        assert!(s.resolve("../x").is_err());
    }

    #[test]
    fn a_symlink_left_in_output_is_never_followed() {
        let (_t, s) = session();
        std::os::unix::fs::symlink("/etc/passwd", s.output.join("leak")).unwrap();
        fs::create_dir(s.output.join("d")).unwrap();
        std::os::unix::fs::symlink("/etc", s.output.join("d/e")).unwrap();
        assert!(s.open(Area::Output, Path::new("leak")).unwrap_err().contains("symbolic link"));
        assert!(s.open(Area::Output, Path::new("d/e/passwd")).unwrap_err().contains("symbolic link"));
    }

    #[test]
    fn control_characters_in_names_are_escaped() {
        assert_eq!(display_path("a\u{1b}[2Jb"), "a\\x1b[2Jb");
    }
}
