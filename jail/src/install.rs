//! `jail rootfs build|list`: the rootfs recipes (python-rootfs/build.sh and
//! every file it uses, the data flavour's root-free path data-wheels.sh and
//! its per-Python locks in wheels/ too) are embedded in the binary, so an installed `jail`
//! (`make install`, `cargo install --path jail`) can build its own rootfs
//! with no source tree. A build unpacks them into a private temp folder and
//! runs build.sh there with the install folder as its destination; build.sh
//! builds into DEST.new and renames it, so a failed build leaves no half
//! rootfs where a run would find it.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::locate::{Search, Source};

/// Every file of the recipes, as in python-rootfs/, with its mode.
const RECIPES: &[(&str, &str, u32)] = &[
    ("build.sh", include_str!("../../python-rootfs/build.sh"), 0o755),
    ("flavours/minimal.sh", include_str!("../../python-rootfs/flavours/minimal.sh"), 0o755),
    ("flavours/data.sh", include_str!("../../python-rootfs/flavours/data.sh"), 0o755),
    ("manifest.py", include_str!("../../python-rootfs/manifest.py"), 0o644),
    ("wheel-target.sh", include_str!("../../python-rootfs/wheel-target.sh"), 0o755),
    ("data.lock", include_str!("../../python-rootfs/data.lock"), 0o644),
    ("libs.sh", include_str!("../../python-rootfs/libs.sh"), 0o644),
    ("data-wheels.sh", include_str!("../../python-rootfs/data-wheels.sh"), 0o755),
    ("wheels/cp39.lock", include_str!("../../python-rootfs/wheels/cp39.lock"), 0o644),
    ("wheels/cp310.lock", include_str!("../../python-rootfs/wheels/cp310.lock"), 0o644),
    ("wheels/cp311.lock", include_str!("../../python-rootfs/wheels/cp311.lock"), 0o644),
    ("wheels/cp312.lock", include_str!("../../python-rootfs/wheels/cp312.lock"), 0o644),
    ("wheels/cp313.lock", include_str!("../../python-rootfs/wheels/cp313.lock"), 0o644),
    ("data-site/sitecustomize.py", include_str!("../../python-rootfs/data-site/sitecustomize.py"), 0o644),
];

pub(crate) use crate::locate::FLAVOURS;

#[derive(Debug, thiserror::Error)]
pub(crate) enum InstallError {
    #[error("no rootfs flavour `{0}`: build one of minimal, data")]
    Flavour(String),
    #[error("no folder to install into (HOME is not set): pass --dest DIR")]
    NoDest,
    #[error(
        "{0} exists and is not a rootfs (no usr/share/jail/manifest.json): pass a new folder to --dest, a build replaces it"
    )]
    NotARootfs(PathBuf),
    #[error("unpack the recipes into {path}: {source}")]
    Unpack { path: PathBuf, source: std::io::Error },
    #[error("run build.sh: {0}")]
    Spawn(std::io::Error),
    #[error("building the {flavour} rootfs failed (build.sh exited with {status}); its messages are above")]
    Failed {
        flavour: String,
        status: std::process::ExitStatus,
    },
}

/// Where `flavour` is installed without `--dest`.
pub(crate) fn default_dest(search: &Search, flavour: &str, root: bool) -> Result<PathBuf, InstallError> {
    Ok(search.install_dir(root).ok_or(InstallError::NoDest)?.join(flavour))
}

/// Write the recipes into `dir` (a fresh private folder).
pub(crate) fn unpack(dir: &Path) -> Result<(), InstallError> {
    for (name, text, mode) in RECIPES {
        let path = dir.join(name);
        let fail = |source| InstallError::Unpack { path: path.clone(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(fail)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(*mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(fail)?;
        std::io::Write::write_all(&mut f, text.as_bytes()).map_err(fail)?;
        f.set_permissions(std::fs::Permissions::from_mode(*mode)).map_err(fail)?;
    }
    Ok(())
}

/// Build `flavour` into `dest` from the embedded recipes; build.sh's
/// messages go to our stdout and stderr. `temp` holds the unpacked recipes.
pub(crate) fn build(flavour: &str, dest: &Path, temp: &Path) -> Result<(), InstallError> {
    if !FLAVOURS.contains(&flavour) {
        return Err(InstallError::Flavour(flavour.to_string()));
    }
    // build.sh replaces DEST: never a folder that is not a rootfs (a
    // mistyped --dest $HOME must not be wiped).
    let is_empty_dir = std::fs::read_dir(dest).is_ok_and(|mut d| d.next().is_none());
    if std::fs::symlink_metadata(dest).is_ok() && !is_empty_dir && !dest.join("usr/share/jail/manifest.json").is_file() {
        return Err(InstallError::NotARootfs(dest.to_path_buf()));
    }
    let recipes = tempfile::Builder::new()
        .prefix("jail-recipes-")
        .tempdir_in(temp)
        .map_err(|source| InstallError::Unpack { path: temp.to_path_buf(), source })?;
    unpack(recipes.path())?;
    let status = std::process::Command::new("bash")
        .arg(recipes.path().join("build.sh"))
        .arg(flavour)
        .arg(dest)
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(InstallError::Spawn)?;
    if !status.success() {
        return Err(InstallError::Failed { flavour: flavour.to_string(), status });
    }
    Ok(())
}

/// One rootfs `jail rootfs list` shows.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Listed {
    pub name: String,
    pub path: PathBuf,
    /// `user`, `system` or `build tree`.
    pub location: &'static str,
    /// `minimal`, `data`, or `null` without a manifest.
    pub flavour: Option<String>,
    pub python: Option<String>,
    /// Whether a run asking for this name gets this one (the first found).
    pub default_for_name: bool,
}

/// Every rootfs in the named folders of `search`, in lookup order.
pub(crate) fn list(search: &Search) -> Vec<Listed> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let folders = [
        (Source::User, search.user_dir.clone()),
        (Source::System, Some(search.system_dir.clone())),
        (Source::BuildTree, search.build_tree.as_ref().map(|r| r.join("python-rootfs/out"))),
    ];
    for (source, dir) in folders {
        let Some(dir) = dir else { continue };
        let Ok(read) = std::fs::read_dir(&dir) else { continue };
        let mut names: Vec<String> = read
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| crate::locate::valid_name(n) && !n.ends_with(".new"))
            .collect();
        names.sort();
        for name in names {
            let path = std::fs::canonicalize(dir.join(&name)).unwrap_or_else(|_| dir.join(&name));
            let manifest = crate::rootfs::load(&path).ok().flatten().map(|(m, _)| m);
            out.push(Listed {
                default_for_name: seen.insert(name.clone()),
                flavour: manifest.as_ref().map(|m| m.flavour.clone()),
                python: manifest.map(|m| m.python.version),
                location: match source {
                    Source::User => "user",
                    Source::System => "system",
                    _ => "build tree",
                },
                name,
                path,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_recipes_are_the_source_trees() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python-rootfs");
        for (name, text, _) in RECIPES {
            assert_eq!(std::fs::read_to_string(repo.join(name)).unwrap(), *text, "{name}");
        }
        // Every flavour's recipe is embedded, and every lock of the data
        // flavour without root.
        for f in FLAVOURS {
            assert!(RECIPES.iter().any(|(n, _, _)| *n == format!("flavours/{f}.sh")), "{f}");
        }
        for lock in std::fs::read_dir(repo.join("wheels")).unwrap() {
            let name = format!("wheels/{}", lock.unwrap().file_name().to_string_lossy());
            assert!(RECIPES.iter().any(|(n, _, _)| *n == name), "{name} is not in RECIPES");
        }
        let t = tempfile::tempdir().unwrap();
        unpack(t.path()).unwrap();
        let mode = std::fs::metadata(t.path().join("build.sh")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
    }

    #[test]
    fn a_build_never_replaces_a_folder_that_is_not_a_rootfs() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("precious"), "x").unwrap();
        assert!(matches!(build("minimal", t.path(), t.path()), Err(InstallError::NotARootfs(_))));
        assert!(t.path().join("precious").exists());
        assert!(matches!(build("nope", t.path(), t.path()), Err(InstallError::Flavour(_))));
    }
}
