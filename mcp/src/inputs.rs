//! Which host files a `run_python` call may hand to the jail: the folders
//! allowlisted when `jail mcp` started (`--input-dir`), and nothing else.
//! A request names a file or folder by absolute path, or as `NAME/rel`
//! where NAME is an allowlisted folder's own name; either way it is taken
//! as the jail crate takes every caller's path (`jail::accept`): opened
//! beneath that folder's descriptor, following no link and never leaving
//! it, so neither `..` nor a link leads out of it. A named file is copied
//! only if the jail may read it (a root server does not hand the jail a
//! file only root may read), keeping its mode, and never a hard link.

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use jail::accept::{self, Reach};

/// How many entries one call may name.
pub const MAX_ENTRIES: usize = 64;
/// Bytes of input files one call may have copied into the jail.
pub const MAX_COPY_BYTES: u64 = 256 << 20;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InputError {
    #[error("--input-dir {path}: {cause}: give an existing folder")]
    NotAFolder { path: PathBuf, cause: String },
    #[error("--input-dir {a} and {b} have the same name `{name}`: give folders with different names")]
    SameName { name: String, a: PathBuf, b: PathBuf },
    #[error("input `{entry}` is outside the folders this server allows ({allowed}): name a file inside one of them")]
    Outside { entry: String, allowed: String },
    #[error("input `{entry}`: {cause}: name an existing file or folder inside {allowed}")]
    Missing { entry: String, cause: String, allowed: String },
    #[error("input `{entry}` is neither a regular file nor a folder: name a file or a folder")]
    NotAFile { entry: String },
    #[error("input `{entry}` is a link or has one on the way, and no link is followed: name the file itself")]
    Link { entry: String },
    #[error("input `{entry}` cannot be given to the jail: {cause}: name a file the jail may read, with one name")]
    Refused { entry: String, cause: String },
    #[error("input names a folder (`{entry}`) among other entries: give one folder alone, or only files")]
    FolderAmongOthers { entry: String },
    #[error("inputs `{a}` and `{b}` are both called `{name}` in /workspace/input: name files with different names")]
    Duplicate { name: String, a: String, b: String },
    #[error("{count} inputs named, at most {MAX_ENTRIES} allowed: name fewer files, or their folder")]
    TooMany { count: usize },
    #[error("the input files total {bytes} bytes, above {MAX_COPY_BYTES}: name their folder instead (bound, not copied)")]
    TooLarge { bytes: u64 },
}

/// The folders allowlisted at start, each by its name and absolute path
/// (no link on the way: each is opened again, the same way, per call).
#[derive(Debug, Clone)]
pub struct Allowlist {
    dirs: Vec<(String, PathBuf)>,
    /// What each run's jail may read of the host: a named file it could
    /// not read is refused.
    reach: Reach,
}

/// What one call's input becomes: nothing, one folder bound as
/// /workspace/input, or files copied into a fresh folder under their names
/// (each as its allowlisted folder and its path beneath it).
#[derive(Debug, Clone, PartialEq)]
pub enum Staging {
    None,
    Folder(PathBuf),
    Files(Vec<(String, Beneath)>),
}

/// An entry beneath an allowlisted folder.
#[derive(Debug, Clone, PartialEq)]
pub struct Beneath {
    pub root: PathBuf,
    pub rel: PathBuf,
}

impl Beneath {
    /// The host path, for messages and for binding a folder.
    pub fn path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }

    /// Open it again, as it was resolved: beneath its folder, following no
    /// link, a regular file the jail may read, with one name (a hard link
    /// is never copied).
    pub fn open_file(&self, reach: Reach) -> Result<std::fs::File, accept::AcceptError> {
        use std::os::unix::fs::MetadataExt;
        let root = accept::open_own_dir(&self.root)?;
        let file = accept::open_file_beneath(&root, &self.root, &self.rel, reach)?;
        match file.metadata() {
            Ok(m) if m.nlink() > 1 => {
                Err(accept::AcceptError { path: self.path(), problem: accept::Problem::HardLink(m.nlink()) })
            }
            _ => Ok(file),
        }
    }
}

impl Allowlist {
    pub fn new(dirs: &[PathBuf], reach: Reach) -> Result<Allowlist, InputError> {
        let mut list: Vec<(String, PathBuf)> = Vec::new();
        for d in dirs {
            let not_a_folder = |cause: String| InputError::NotAFolder { path: d.clone(), cause };
            accept::open_own_dir(d).map_err(|e| not_a_folder(e.problem.to_string()))?;
            let canon = accept::absolute(d).map_err(|e| not_a_folder(e.problem.to_string()))?;
            let name = canon.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".into());
            if let Some((_, other)) = list.iter().find(|(n, _)| *n == name) {
                return Err(InputError::SameName { name, a: other.clone(), b: canon });
            }
            list.push((name, canon));
        }
        Ok(Allowlist { dirs: list, reach })
    }

    /// What each run's jail may read of the host.
    pub fn reach(&self) -> Reach {
        self.reach
    }

    /// The folders, as a client is told them: `name (path)`.
    pub fn describe(&self) -> String {
        if self.dirs.is_empty() {
            return "none".into();
        }
        self.dirs.iter().map(|(n, p)| format!("{n} ({})", p.display())).collect::<Vec<_>>().join(", ")
    }

    /// One entry: its allowlisted folder and its path beneath it, and
    /// whether it is a folder. Opened beneath that folder's descriptor,
    /// following no link (`jail::accept`).
    pub fn resolve(&self, entry: &str) -> Result<(Beneath, bool), InputError> {
        let outside = || InputError::Outside { entry: entry.to_string(), allowed: self.describe() };
        let path = Path::new(entry);
        let (candidate, roots): (PathBuf, Vec<&PathBuf>) = if path.is_absolute() {
            (path.to_path_buf(), self.dirs.iter().map(|(_, p)| p).collect())
        } else {
            let mut parts = path.components();
            let Some(Component::Normal(first)) = parts.next() else { return Err(outside()) };
            let Some((_, root)) = self.dirs.iter().find(|(n, _)| n.as_str() == first.to_string_lossy()) else {
                return Err(outside());
            };
            (root.join(parts.as_path()), vec![root])
        };
        // Decided on the words first, so an answer never tells whether a
        // path outside the folders exists: no `..`, and an absolute path
        // must already name a place inside one.
        if entry.contains('\0') || path.components().any(|c| c == Component::ParentDir) {
            return Err(outside());
        }
        let Some(root) = roots.into_iter().find(|r| candidate.starts_with(r)) else {
            return Err(outside());
        };
        let rel = candidate.strip_prefix(root).map_err(|_| outside())?.to_path_buf();
        let at = Beneath { root: root.clone(), rel };
        if at.rel.as_os_str().is_empty() {
            return Ok((at, true));
        }
        let missing = |cause: String| InputError::Missing { entry: entry.to_string(), cause, allowed: self.describe() };
        let taken = |e: accept::AcceptError| match e.problem {
            accept::Problem::Link => InputError::Link { entry: entry.to_string() },
            accept::Problem::Outside => outside(),
            accept::Problem::Unreadable(_) | accept::Problem::HardLink(_) => {
                InputError::Refused { entry: entry.to_string(), cause: e.problem.to_string() }
            }
            _ => missing(e.problem.to_string()),
        };
        let dir = accept::open_own_dir(&at.root).map_err(taken)?;
        let fd: OwnedFd =
            accept::open_beneath(&dir, &at.root, &at.rel, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY).map_err(taken)?;
        let meta = std::fs::File::from(fd).metadata().map_err(|e| missing(e.to_string()))?;
        if meta.is_dir() {
            return Ok((at, true));
        }
        if !meta.is_file() {
            return Err(InputError::NotAFile { entry: entry.to_string() });
        }
        // A file is copied: the jail must be able to read it.
        at.open_file(self.reach).map_err(taken)?;
        Ok((at, false))
    }

    /// Resolve every entry of a call and decide how it reaches the jail.
    pub fn stage(&self, entries: &[String]) -> Result<Staging, InputError> {
        if entries.len() > MAX_ENTRIES {
            return Err(InputError::TooMany { count: entries.len() });
        }
        let mut files: Vec<(String, Beneath)> = Vec::new();
        let mut origin: Vec<&str> = Vec::new();
        let mut total = 0u64;
        for entry in entries {
            let (at, is_dir) = self.resolve(entry)?;
            if is_dir {
                if entries.len() > 1 {
                    return Err(InputError::FolderAmongOthers { entry: entry.clone() });
                }
                return Ok(Staging::Folder(at.path()));
            }
            let path = at.path();
            let meta = std::fs::symlink_metadata(&path).map_err(|e| InputError::Missing {
                entry: entry.clone(),
                cause: e.to_string(),
                allowed: self.describe(),
            })?;
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if let Some(i) = files.iter().position(|(n, _)| *n == name) {
                return Err(InputError::Duplicate { name, a: origin[i].to_string(), b: entry.clone() });
            }
            total = total.saturating_add(meta.len());
            if total > MAX_COPY_BYTES {
                return Err(InputError::TooLarge { bytes: total });
            }
            files.push((name, at));
            origin.push(entry);
        }
        Ok(if files.is_empty() { Staging::None } else { Staging::Files(files) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, Allowlist) {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("data");
        std::fs::create_dir_all(data.join("sub")).unwrap();
        std::fs::write(data.join("a.csv"), "x\n1\n").unwrap();
        std::fs::write(data.join("sub/a.csv"), "y\n").unwrap();
        std::fs::write(t.path().join("secret"), "no").unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), data.join("link")).unwrap();
        let list = Allowlist::new(&[data], Reach::here()).unwrap();
        (t, list)
    }

    #[test]
    fn files_are_named_by_folder_name_or_absolute_path() {
        let (t, list) = tree();
        let data = t.path().join("data").canonicalize().unwrap();
        assert_eq!(list.resolve("data/a.csv").unwrap().0.path(), data.join("a.csv"));
        assert_eq!(list.resolve(&data.join("sub/a.csv").display().to_string()).unwrap().0.path(), data.join("sub/a.csv"));
        assert_eq!(list.stage(&["data".into()]).unwrap(), Staging::Folder(data.clone()));
        assert_eq!(list.stage(&[]).unwrap(), Staging::None);
    }

    #[test]
    fn nothing_outside_the_allowlisted_folders_is_reachable() {
        let (t, list) = tree();
        for entry in [
            "data/../secret".to_string(),
            t.path().join("secret").display().to_string(),
            "/etc/passwd".into(),
            "other/a.csv".into(),
            "../data/a.csv".into(),
            "".into(),
            "data/../../nowhere".into(),
            "/nowhere/at/all".into(),
        ] {
            assert!(matches!(list.resolve(&entry), Err(InputError::Outside { .. })), "{entry}: {:?}", list.resolve(&entry));
        }
        assert!(matches!(Allowlist::new(&[], Reach::here()).unwrap().resolve("/etc/passwd"), Err(InputError::Outside { .. })));
        // A link inside the folder is never followed, whatever it points at.
        for entry in ["data/link", "data/link/", "data/sub/../link"] {
            assert!(matches!(list.resolve(entry), Err(InputError::Link { .. } | InputError::Outside { .. })), "{entry}");
        }
        std::os::unix::fs::symlink(t.path().join("data/sub"), t.path().join("data/dirlink")).unwrap();
        assert!(matches!(list.resolve("data/dirlink/a.csv"), Err(InputError::Link { .. })));
    }

    #[test]
    fn a_file_the_jail_may_not_read_or_a_hard_link_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (t, list) = tree();
        let data = t.path().join("data");
        std::fs::hard_link(t.path().join("secret"), data.join("hard")).unwrap();
        assert!(matches!(list.resolve("data/hard"), Err(InputError::Refused { .. })), "{:?}", list.resolve("data/hard"));
        std::fs::write(data.join("private"), "p").unwrap();
        std::fs::set_permissions(data.join("private"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let r = list.resolve("data/private");
        if nix::unistd::geteuid().is_root() {
            // Root's own 0600 file: the jail's unprivileged uid may not read it.
            assert!(matches!(r, Err(InputError::Refused { .. })), "{r:?}");
        } else {
            assert!(r.is_ok(), "{r:?}");
        }
    }

    #[test]
    fn staging_refuses_mixtures_duplicates_and_missing_files() {
        let (_t, list) = tree();
        assert!(matches!(list.stage(&["data".into(), "data/a.csv".into()]), Err(InputError::FolderAmongOthers { .. })));
        assert!(matches!(list.stage(&["data/a.csv".into(), "data/sub/a.csv".into()]), Err(InputError::Duplicate { .. })));
        assert!(matches!(list.stage(&["data/nope.csv".into()]), Err(InputError::Missing { .. })));
        let Staging::Files(files) = list.stage(&["data/a.csv".into()]).unwrap() else { panic!() };
        assert_eq!(files[0].0, "a.csv");
    }

    #[test]
    fn allowlisted_folders_must_exist_and_have_distinct_names() {
        let t = tempfile::tempdir().unwrap();
        assert!(matches!(Allowlist::new(&[t.path().join("none")], Reach::here()), Err(InputError::NotAFolder { .. })));
        std::fs::create_dir_all(t.path().join("x/data")).unwrap();
        std::fs::create_dir_all(t.path().join("y/data")).unwrap();
        let r = Allowlist::new(&[t.path().join("x/data"), t.path().join("y/data")], Reach::here());
        assert!(matches!(r, Err(InputError::SameName { .. })));
    }
}
