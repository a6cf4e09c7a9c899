//! What the model may import: read from the rootfs the steps run on. The
//! rootfs's own manifest (`/usr/share/jail/manifest.json`, written when the
//! rootfs is built, read with the `jail` crate's own reader and type) is used
//! when present; otherwise the rootfs's site-packages folders are listed. The
//! answer says which source it used.

use std::path::{Path, PathBuf};

pub use jail::rootfs::MANIFEST_PATH;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub version: String,
    /// The modules it provides, when the manifest says (`sklearn`).
    pub imports: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The manifest, with the rootfs's flavour, Python version and identity.
    Manifest {
        flavour: String,
        python: String,
        rootfs_id: String,
    },
    SitePackages(Vec<PathBuf>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packages {
    pub source: Source,
    /// `python3.11` folders found under usr/lib: the standard library.
    pub stdlib: Vec<String>,
    pub packages: Vec<Package>,
}

/// Read the packages of `rootfs`.
pub fn list(rootfs: &Path) -> Result<Packages, String> {
    if !rootfs.is_dir() {
        return Err(format!("the rootfs {} does not exist (build it with `make rootfs`)", rootfs.display()));
    }
    let stdlib = stdlib_versions(rootfs);
    match jail::rootfs::load(rootfs) {
        Ok(Some((m, id))) => {
            let mut packages: Vec<Package> = m
                .packages
                .into_iter()
                .map(|p| Package { name: p.name, version: p.version, imports: p.imports })
                .collect();
            packages.sort_by_key(|p| p.name.to_lowercase());
            let source = Source::Manifest { flavour: m.flavour, python: m.python.version, rootfs_id: id };
            return Ok(Packages { source, stdlib, packages });
        }
        Ok(None) => {}
        Err(e) => return Err(format!("the rootfs manifest cannot be read: {}", jail::stage::chain_line(&e))),
    }
    let mut dirs = Vec::new();
    for lib in ["usr/lib", "usr/local/lib"] {
        let Ok(read) = std::fs::read_dir(rootfs.join(lib)) else { continue };
        let mut pys: Vec<PathBuf> = read
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pys.sort();
        for py in pys {
            for sub in ["site-packages", "dist-packages"] {
                let d = py.join(sub);
                if d.is_dir() {
                    dirs.push(d);
                }
            }
        }
    }
    let mut packages = Vec::new();
    for d in &dirs {
        let Ok(read) = std::fs::read_dir(d) else { continue };
        for e in read.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".dist-info").or_else(|| name.strip_suffix(".egg-info")) else {
                continue;
            };
            let (n, v) = stem.split_once('-').unwrap_or((stem, "?"));
            let v = v.split('-').next().unwrap_or(v);
            packages.push(Package {
                name: n.replace('_', "-").to_lowercase(),
                version: v.to_string(),
                imports: Vec::new(),
            });
        }
    }
    packages.sort_by_key(|p| p.name.to_lowercase());
    packages.dedup();
    Ok(Packages { source: Source::SitePackages(dirs), stdlib, packages })
}

fn stdlib_versions(rootfs: &Path) -> Vec<String> {
    let Ok(read) = std::fs::read_dir(rootfs.join("usr/lib")) else { return Vec::new() };
    let mut v: Vec<String> = read
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("python3.") && rootfs.join("usr/lib").join(n).join("os.py").exists())
        .collect();
    v.sort();
    v
}

impl Packages {
    /// The tool's answer to the model.
    pub fn render(&self) -> String {
        let mut out = String::new();
        match &self.source {
            Source::Manifest { flavour, python, rootfs_id } => out.push_str(&format!(
                "source: the rootfs manifest ({MANIFEST_PATH}): flavour {flavour}, Python {python}, rootfs id {}\n",
                rootfs_id.get(..12).unwrap_or(rootfs_id)
            )),
            Source::SitePackages(dirs) if dirs.is_empty() => out.push_str(
                "source: no manifest in this rootfs and no site-packages folder: only the standard library is installed\n",
            ),
            Source::SitePackages(_) => out.push_str("source: no manifest in this rootfs; listed its site-packages folders\n"),
        }
        if !self.stdlib.is_empty() {
            out.push_str(&format!(
                "standard library: {} (all of it, except tkinter, idlelib and the test suite)\n",
                self.stdlib.join(", ")
            ));
        }
        if self.packages.is_empty() {
            out.push_str("third-party packages: none (no numpy, pandas or matplotlib: use the standard library)\n");
        } else {
            out.push_str(&format!("third-party packages ({}):\n", self.packages.len()));
            for p in &self.packages {
                let imports = if p.imports.is_empty() || p.imports == [p.name.clone()] {
                    String::new()
                } else {
                    format!(" (import {})", p.imports.join(", "))
                };
                out.push_str(&format!("{} {}{imports}\n", p.name, p.version));
            }
        }
        out.push_str("Nothing else can be installed: the sandbox has no network and a read-only system.");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_is_preferred_and_named() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("usr/share/jail")).unwrap();
        let manifest = r#"{"schema_version":1,"flavour":"data","lock_sha256":"ab","debian_packages":{},
            "python":{"version":"3.11.2","implementation":"cpython","debian_package":null},
            "packages":[{"name":"scikit-learn","version":"1.9.1","imports":["sklearn"]},{"name":"pandas","version":"3.1.1","imports":["pandas"]}]}"#;
        std::fs::write(t.path().join(MANIFEST_PATH.trim_start_matches('/')), manifest).unwrap();
        let p = list(t.path()).unwrap();
        assert!(matches!(&p.source, Source::Manifest { flavour, .. } if flavour == "data"));
        assert_eq!(p.packages[0].name, "pandas");
        let text = p.render();
        assert!(text.contains("rootfs manifest") && text.contains("Python 3.11.2"), "{text}");
        assert!(text.contains("scikit-learn 1.9.1 (import sklearn)") && text.contains("pandas 3.1.1\n"), "{text}");
    }

    #[test]
    fn without_a_manifest_site_packages_are_listed() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("usr/lib/python3.11/site-packages/python_pptx-1.0.2.dist-info")).unwrap();
        std::fs::write(t.path().join("usr/lib/python3.11/os.py"), "").unwrap();
        let p = list(t.path()).unwrap();
        assert!(matches!(p.source, Source::SitePackages(ref d) if d.len() == 1));
        assert_eq!(p.packages, vec![Package { name: "python-pptx".into(), version: "1.0.2".into(), imports: vec![] }]);
        assert_eq!(p.stdlib, vec!["python3.11"]);
        assert!(p.render().contains("site-packages"));
    }
}
