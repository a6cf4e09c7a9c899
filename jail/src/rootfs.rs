//! What a Python rootfs holds and what it is called: its package manifest
//! (`/usr/share/jail/manifest.json`, written at build time by
//! `python-rootfs/manifest.py`) and its identity, the sha256 of that file.
//! The supervisor reports the identity in every result (`isolation.rootfs_id`);
//! `jail packages` prints the manifest.
//!
//! The manifest is read from the host side, but resolved as the jail would
//! see it: every symlink stays inside the rootfs (`RESOLVE_IN_ROOT`), so a
//! rootfs can never make the supervisor read a host file.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::sha256_hex;
use crate::sys::{self, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};

/// Where the manifest lives inside a rootfs.
pub const MANIFEST_PATH: &str = "/usr/share/jail/manifest.json";

/// A manifest larger than this is refused (a real one is a few KiB).
const MAX_MANIFEST_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("open rootfs {path}")]
    OpenRootfs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("read {MANIFEST_PATH} in rootfs {rootfs}")]
    ReadManifest {
        rootfs: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{MANIFEST_PATH} in rootfs {rootfs} is over {MAX_MANIFEST_BYTES} bytes")]
    ManifestTooLarge { rootfs: PathBuf },
    #[error("parse {MANIFEST_PATH} in rootfs {rootfs}")]
    ParseManifest {
        rootfs: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The manifest document, as `manifest.py` writes it. Unknown fields are
/// kept out of the type but tolerated, so an older `jail` reads a newer
/// rootfs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub schema_version: u32,
    /// The recipe that built the rootfs: `minimal`, `data`.
    pub flavour: String,
    pub python: PythonInfo,
    /// sha256 of the lock the Python packages were installed from (`null`
    /// for a flavour without one: the standard library only).
    pub lock_sha256: Option<String>,
    /// Every installed Python distribution, sorted by name.
    pub packages: Vec<Package>,
    /// Every Debian package in the rootfs, name to version (empty when the
    /// rootfs was not built from Debian packages).
    #[serde(default)]
    pub debian_packages: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PythonInfo {
    /// The interpreter's version, `3.11.2`.
    pub version: String,
    pub implementation: String,
    /// The Debian package version of the interpreter, when it is Debian's.
    pub debian_package: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Package {
    /// The distribution's normalized name (PEP 503): `scikit-learn`.
    pub name: String,
    pub version: String,
    /// The public top-level modules it provides: `sklearn`.
    pub imports: Vec<String>,
}

/// What `jail packages --json` prints: the rootfs, its identity and its manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub rootfs: String,
    pub rootfs_id: String,
    pub manifest: Manifest,
}

/// The raw manifest bytes, or `None` when the rootfs has none (built before
/// manifests existed, or by hand).
pub(crate) fn read_manifest_bytes(rootfs: &Path) -> Result<Option<Vec<u8>>, RootfsError> {
    let dir = sys::openat2(None, rootfs, libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(|source| RootfsError::OpenRootfs { path: rootfs.to_path_buf(), source })?;
    let relative = MANIFEST_PATH.trim_start_matches('/');
    let read_err = |source| RootfsError::ReadManifest { rootfs: rootfs.to_path_buf(), source };
    let fd = match sys::openat2(
        Some(dir.as_fd()),
        Path::new(relative),
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
        RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    ) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let mut file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(read_err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file")));
    }
    let mut bytes = Vec::new();
    file.by_ref().take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes).map_err(read_err)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(RootfsError::ManifestTooLarge { rootfs: rootfs.to_path_buf() });
    }
    Ok(Some(bytes))
}

/// The rootfs's identity: the sha256 of its manifest, which itself names
/// every package and version and the sha256 of the lock they came from.
pub fn identity(manifest_bytes: &[u8]) -> String {
    sha256_hex(manifest_bytes)
}

/// The parsed manifest and the identity, or `None` when there is no manifest.
pub fn load(rootfs: &Path) -> Result<Option<(Manifest, String)>, RootfsError> {
    let Some(bytes) = read_manifest_bytes(rootfs)? else { return Ok(None) };
    let manifest =
        serde_json::from_slice(&bytes).map_err(|source| RootfsError::ParseManifest { rootfs: rootfs.to_path_buf(), source })?;
    Ok(Some((manifest, identity(&bytes))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const DOC: &str = r#"{"schema_version":1,"flavour":"data","python":{"version":"3.11.2","implementation":"cpython","debian_package":"3.11.2-6"},
        "lock_sha256":"ab","packages":[{"name":"numpy","version":"2.4.6","imports":["numpy"]}],"debian_packages":{"bash":"5.2"},"later_field":1}"#;

    fn rootfs_with(doc: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/share/jail")).unwrap();
        std::fs::write(dir.path().join("usr/share/jail/manifest.json"), doc).unwrap();
        dir
    }

    #[test]
    fn manifest_is_parsed_and_identified_by_its_sha256() {
        let dir = rootfs_with(DOC);
        let (m, id) = load(dir.path()).unwrap().unwrap();
        assert_eq!(m.flavour, "data");
        assert_eq!(m.packages[0].name, "numpy");
        assert_eq!(m.debian_packages["bash"], "5.2");
        assert_eq!(id, sha256_hex(DOC.as_bytes()));
    }

    #[test]
    fn rootfs_without_a_manifest_has_no_identity() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_manifest_bytes(dir.path()).unwrap(), None);
    }

    #[test]
    fn manifest_symlink_cannot_reach_a_host_file() {
        let host = rootfs_with(DOC);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/share/jail")).unwrap();
        // An absolute link is resolved inside the rootfs, where it leads nowhere.
        let target = host.path().join("usr/share/jail/manifest.json");
        symlink(&target, dir.path().join("usr/share/jail/manifest.json")).unwrap();
        assert_eq!(read_manifest_bytes(dir.path()).unwrap(), None);
        // A relative link that climbs out is clamped at the rootfs's root too.
        std::fs::remove_file(dir.path().join("usr/share/jail/manifest.json")).unwrap();
        let climb = format!("../../../../../../../../..{}", target.display());
        symlink(climb, dir.path().join("usr/share/jail/manifest.json")).unwrap();
        assert_eq!(read_manifest_bytes(dir.path()).unwrap(), None);
    }

    #[test]
    fn malformed_manifest_is_an_error_naming_the_file() {
        let dir = rootfs_with("{not json");
        let e = load(dir.path()).unwrap_err();
        assert!(e.to_string().contains("manifest.json"), "{e}");
    }
}
