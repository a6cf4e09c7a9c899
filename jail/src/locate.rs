//! Which rootfs a run uses, wherever `jail` is installed: a pure lookup over
//! the places a rootfs may be, in this order (the first that applies wins):
//!
//! 1. `--rootfs DIR`;
//! 2. `$JAIL_ROOTFS`;
//! 3. the policy's `rootfs` (a path, taken from the policy file's folder);
//! 4. `$XDG_DATA_HOME/jail/rootfs/NAME` (default `~/.local/share/jail/rootfs/NAME`);
//! 5. `/var/lib/jail/rootfs/NAME`;
//! 6. only when this `jail` runs from its build tree (`target/*/jail`):
//!    `python-rootfs/out/NAME` there, so `make test` works without installing.
//!
//! 1-3 are explicit: the one given is used or the run fails, never a
//! fall-through to another rootfs. 4-6 are searched for NAME: the one
//! `--rootfs-name` gives (e.g. `data`), else `default`, which stands for
//! `data` in any of them, then `minimal` in any of them (issue 38: pandas
//! works wherever the data rootfs was built, and a host without it runs as
//! before). A name found nowhere fails with the command that builds it. The
//! caller reads the environment (cli.rs) and hands the values in.

use std::path::{Path, PathBuf};

/// The name a run looks up when nothing names a rootfs: an alias for the
/// names of [`DEFAULT_ORDER`], the first found winning.
pub const DEFAULT_NAME: &str = "default";

/// What [`DEFAULT_NAME`] stands for, in order: the data stack where it was
/// built, else the standard library alone.
pub(crate) const DEFAULT_ORDER: [&str; 2] = ["data", "minimal"];

/// The flavours `jail rootfs build` makes (python-rootfs/flavours).
pub(crate) const FLAVOURS: [&str; 2] = ["minimal", "data"];

/// Where root's `jail rootfs build` installs, and every user may read.
pub const SYSTEM_DIR: &str = "/var/lib/jail/rootfs";

/// Where a candidate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    Policy,
    User,
    System,
    BuildTree,
}

impl Source {
    pub fn describe(self) -> &'static str {
        match self {
            Source::Flag => "--rootfs",
            Source::Env => "$JAIL_ROOTFS",
            Source::Policy => "the policy's `rootfs`",
            Source::User => "the user's data folder",
            Source::System => "the system folder",
            Source::BuildTree => "the build tree",
        }
    }
}

/// Everything the lookup depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    pub flag: Option<PathBuf>,
    pub env: Option<PathBuf>,
    pub policy: Option<PathBuf>,
    /// The rootfs name searched for in the folders below.
    pub name: String,
    /// `$XDG_DATA_HOME/jail/rootfs` (or `$HOME/.local/share/jail/rootfs`).
    pub user_dir: Option<PathBuf>,
    pub system_dir: PathBuf,
    /// The repository this `jail` was built in, when it runs from there.
    pub build_tree: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LocateError {
    #[error("rootfs {path} (from {}) not found: build one with `jail rootfs build {name} --dest {path}`, or pass an existing folder", from.describe())]
    Missing { path: PathBuf, from: Source, name: String },
    #[error("no rootfs `{name}` found (looked in {looked}): build it with `{build}`, or pass --rootfs DIR")]
    NotFound { name: String, looked: String, build: String },
    #[error("no rootfs found (looked for `data`, then `minimal`, in {looked}): build one with `jail rootfs build minimal` (seconds), or `jail rootfs build data` for numpy, pandas and matplotlib (minutes), or pass --rootfs DIR")]
    NoDefault { looked: String },
    #[error("rootfs name `{0}` is not a name: use letters, digits, `-`, `_` and `.` (e.g. minimal, data)")]
    BadName(String),
}

/// A rootfs name: `[A-Za-z0-9][A-Za-z0-9._-]*`, at most 64 bytes, so it is
/// one path component.
pub(crate) fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// The user's rootfs folder from `XDG_DATA_HOME` and `HOME` (absolute only).
pub fn user_dir(xdg_data_home: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    let base = xdg_data_home
        .filter(|p| p.is_absolute())
        .or_else(|| home.filter(|p| p.is_absolute()).map(|h| h.join(".local/share")))?;
    Some(base.join("jail/rootfs"))
}

/// The repository `exe` was built in, when `exe` is `REPO/target/PROFILE/jail`
/// and REPO holds the rootfs recipes; `None` for an installed binary.
pub fn build_tree(exe: &Path) -> Option<PathBuf> {
    let profile = exe.parent()?;
    let target = profile.parent()?;
    let repo = target.parent()?;
    let ours =
        target.file_name()? == "target" && repo.join("python-rootfs/build.sh").is_file() && repo.join("Cargo.toml").is_file();
    ours.then(|| repo.to_path_buf())
}

impl Search {
    /// The names searched for, in order: [`DEFAULT_ORDER`] for
    /// [`DEFAULT_NAME`], else the one name.
    pub fn names(&self) -> Vec<&str> {
        if self.name == DEFAULT_NAME {
            DEFAULT_ORDER.to_vec()
        } else {
            vec![self.name.as_str()]
        }
    }

    /// The candidates in order: the first explicit one alone, else the
    /// named folders, every folder for the first name before the next name.
    pub fn candidates(&self) -> Vec<(Source, PathBuf)> {
        let explicit = [
            (Source::Flag, &self.flag),
            (Source::Env, &self.env),
            (Source::Policy, &self.policy),
        ];
        if let Some((source, Some(path))) = explicit.into_iter().find(|(_, p)| p.is_some()) {
            return vec![(source, path.clone())];
        }
        let mut named = Vec::new();
        for name in self.names() {
            if let Some(d) = &self.user_dir {
                named.push((Source::User, d.join(name)));
            }
            named.push((Source::System, self.system_dir.join(name)));
            if let Some(repo) = &self.build_tree {
                named.push((Source::BuildTree, repo.join("python-rootfs/out").join(name)));
            }
        }
        named
    }

    /// The rootfs this search picks, canonicalized, and where it came from.
    pub fn find(&self) -> Result<(Source, PathBuf), LocateError> {
        self.find_with(&|p: &Path| std::fs::canonicalize(p).ok().filter(|c| c.is_dir()))
    }

    /// [`Search::find`] over `exists`, which returns the canonical folder.
    pub(crate) fn find_with(&self, exists: &dyn Fn(&Path) -> Option<PathBuf>) -> Result<(Source, PathBuf), LocateError> {
        if !valid_name(&self.name) {
            return Err(LocateError::BadName(self.name.clone()));
        }
        let candidates = self.candidates();
        for (source, path) in &candidates {
            if let Some(found) = exists(path) {
                return Ok((*source, found));
            }
            if matches!(source, Source::Flag | Source::Env | Source::Policy) {
                // The flavour that would build it: the one named, else minimal.
                let flavour = if FLAVOURS.contains(&self.name.as_str()) {
                    self.name.as_str()
                } else {
                    "minimal"
                };
                return Err(LocateError::Missing { path: path.clone(), from: *source, name: flavour.to_string() });
            }
        }
        if self.name == DEFAULT_NAME {
            // The folders once, not once per name.
            let folders = candidates.iter().filter_map(|(_, p)| p.parent()).map(|p| p.display().to_string());
            let mut looked: Vec<String> = Vec::new();
            for f in folders {
                if !looked.contains(&f) {
                    looked.push(f);
                }
            }
            return Err(LocateError::NoDefault { looked: looked.join(", ") });
        }
        let looked = candidates.iter().map(|(_, p)| p.display().to_string()).collect::<Vec<_>>().join(", ");
        Err(LocateError::NotFound { name: self.name.clone(), looked, build: self.build_hint() })
    }

    /// The command that makes `self.name` findable: a flavour builds under
    /// its own name; any other name is a folder of that name.
    fn build_hint(&self) -> String {
        match (FLAVOURS.contains(&self.name.as_str()), &self.user_dir) {
            (true, _) => format!("jail rootfs build {}", self.name),
            (false, Some(dir)) => format!("jail rootfs build minimal --dest {}", dir.join(&self.name).display()),
            (false, None) => format!("jail rootfs build minimal --dest {}", self.system_dir.join(&self.name).display()),
        }
    }

    /// Where `jail rootfs build NAME` installs without `--dest`: the system
    /// folder for root, else the user's.
    pub(crate) fn install_dir(&self, root: bool) -> Option<PathBuf> {
        if root {
            Some(self.system_dir.clone())
        } else {
            self.user_dir.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search() -> Search {
        Search {
            flag: None,
            env: None,
            policy: None,
            name: "minimal".into(),
            user_dir: Some("/home/u/.local/share/jail/rootfs".into()),
            system_dir: SYSTEM_DIR.into(),
            build_tree: Some("/src/jail".into()),
        }
    }

    fn only(paths: &'static [&'static str]) -> impl Fn(&Path) -> Option<PathBuf> {
        move |p: &Path| paths.iter().any(|q| Path::new(q) == p).then(|| p.to_path_buf())
    }

    #[test]
    fn named_folders_are_searched_user_then_system_then_build_tree() {
        let s = search();
        assert_eq!(
            s.candidates(),
            vec![
                (Source::User, PathBuf::from("/home/u/.local/share/jail/rootfs/minimal")),
                (Source::System, PathBuf::from("/var/lib/jail/rootfs/minimal")),
                (Source::BuildTree, PathBuf::from("/src/jail/python-rootfs/out/minimal")),
            ]
        );
        let both = only(&["/var/lib/jail/rootfs/minimal", "/src/jail/python-rootfs/out/minimal"]);
        assert_eq!(s.find_with(&both), Ok((Source::System, PathBuf::from("/var/lib/jail/rootfs/minimal"))));
        let tree = only(&["/src/jail/python-rootfs/out/minimal"]);
        assert_eq!(s.find_with(&tree).unwrap().0, Source::BuildTree);
    }

    #[test]
    fn by_default_data_is_found_anywhere_before_minimal_is() {
        let s = Search { name: DEFAULT_NAME.into(), ..search() };
        let paths: Vec<PathBuf> = s.candidates().into_iter().map(|(_, p)| p).collect();
        assert_eq!(
            paths,
            [
                "/home/u/.local/share/jail/rootfs/data",
                "/var/lib/jail/rootfs/data",
                "/src/jail/python-rootfs/out/data",
                "/home/u/.local/share/jail/rootfs/minimal",
                "/var/lib/jail/rootfs/minimal",
                "/src/jail/python-rootfs/out/minimal",
            ]
            .map(PathBuf::from)
        );
        let both = only(&["/home/u/.local/share/jail/rootfs/minimal", "/src/jail/python-rootfs/out/data"]);
        assert_eq!(s.find_with(&both), Ok((Source::BuildTree, PathBuf::from("/src/jail/python-rootfs/out/data"))));
        let minimal = only(&["/home/u/.local/share/jail/rootfs/minimal"]);
        assert_eq!(s.find_with(&minimal).unwrap().1, PathBuf::from("/home/u/.local/share/jail/rootfs/minimal"));
        // A name given is that name alone: no fall-back to another flavour.
        let s = Search { name: "data".into(), ..search() };
        assert!(matches!(s.find_with(&minimal), Err(LocateError::NotFound { .. })));
    }

    #[test]
    fn no_default_rootfs_is_one_line_naming_both_builds() {
        let s = Search { name: DEFAULT_NAME.into(), ..search() };
        let err = s.find_with(&only(&[])).unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains("`jail rootfs build minimal`") && err.contains("`jail rootfs build data`"), "{err}");
        assert_eq!(err.matches("/var/lib/jail/rootfs").count(), 1, "each folder named once: {err}");
    }

    #[test]
    fn the_flag_wins_over_the_variable_and_the_policy() {
        let s = Search {
            flag: Some("/f".into()),
            env: Some("/e".into()),
            policy: Some("/p".into()),
            ..search()
        };
        assert_eq!(s.candidates(), vec![(Source::Flag, PathBuf::from("/f"))]);
        let s = Search { env: Some("/e".into()), policy: Some("/p".into()), ..search() };
        assert_eq!(s.candidates(), vec![(Source::Env, PathBuf::from("/e"))]);
    }

    #[test]
    fn a_missing_explicit_rootfs_never_falls_through_to_another() {
        let s = Search { env: Some("/gone".into()), ..search() };
        let err = s.find_with(&only(&["/var/lib/jail/rootfs/minimal"])).unwrap_err();
        assert!(matches!(err, LocateError::Missing { from: Source::Env, .. }), "{err}");
        // Asked by the default name too, it names a flavour that builds.
        let s = Search { flag: Some("/gone".into()), name: DEFAULT_NAME.into(), ..search() };
        let err = s.find_with(&only(&[])).unwrap_err().to_string();
        assert!(err.contains("`jail rootfs build minimal --dest /gone`"), "{err}");
        assert!(err.to_string().contains("jail rootfs build minimal"), "{err}");
    }

    #[test]
    fn a_name_found_nowhere_names_the_command_that_builds_it() {
        let s = Search { name: "data".into(), build_tree: None, ..search() };
        let err = s.find_with(&only(&[])).unwrap_err().to_string();
        assert!(err.contains("`jail rootfs build data`"), "{err}");
        assert!(err.contains("/var/lib/jail/rootfs/data"), "{err}");
    }

    #[test]
    fn a_name_is_one_path_component() {
        for bad in ["", "../x", "a/b", ".hidden", "-x", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
            let s = Search { name: bad.to_string(), ..search() };
            assert!(matches!(s.find_with(&only(&[])), Err(LocateError::BadName(_))));
        }
        assert!(valid_name("data") && valid_name("py3.11_x-1"));
    }

    #[test]
    fn a_name_that_is_no_flavour_is_built_into_a_folder_of_that_name() {
        let s = Search { name: "mine".into(), ..search() };
        let err = s.find_with(&only(&[])).unwrap_err().to_string();
        assert!(err.contains("`jail rootfs build minimal --dest /home/u/.local/share/jail/rootfs/mine`"), "{err}");
    }

    #[test]
    fn the_user_folder_follows_xdg_then_home() {
        assert_eq!(user_dir(Some("/x".into()), Some("/h".into())), Some(PathBuf::from("/x/jail/rootfs")));
        assert_eq!(user_dir(None, Some("/h".into())), Some(PathBuf::from("/h/.local/share/jail/rootfs")));
        assert_eq!(user_dir(Some("rel".into()), None), None);
    }

    #[test]
    fn root_installs_into_the_system_folder() {
        let s = search();
        assert_eq!(s.install_dir(true), Some(PathBuf::from(SYSTEM_DIR)));
        assert_eq!(s.install_dir(false), s.user_dir);
    }

    #[test]
    fn only_a_binary_in_the_build_trees_target_is_from_the_build_tree() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let repo = std::fs::canonicalize(repo).unwrap();
        assert_eq!(build_tree(&repo.join("target/debug/jail")), Some(repo.clone()));
        assert_eq!(build_tree(Path::new("/usr/local/bin/jail")), None);
        assert_eq!(build_tree(&repo.join("elsewhere/debug/jail")), None);
    }
}
