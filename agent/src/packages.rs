//! What the model may import: read from the rootfs the steps run on. The
//! rootfs's own manifest (`/usr/share/jail/manifest.json`, written when the
//! rootfs is built) is used when present; otherwise the rootfs's
//! site-packages folders are listed. The answer says which source it used.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where the manifest sits inside a rootfs.
pub const MANIFEST_PATH: &str = "usr/share/jail/manifest.json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Manifest(PathBuf),
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
    let manifest = rootfs.join(MANIFEST_PATH);
    if let Ok(text) = std::fs::read_to_string(&manifest) {
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("the rootfs manifest {} is not JSON: {e}", manifest.display()))?;
        let mut packages = from_manifest(&v);
        packages.sort_by_key(|p| p.name.to_lowercase());
        return Ok(Packages { source: Source::Manifest(manifest), stdlib, packages });
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
            let Some(stem) = name.strip_suffix(".dist-info").or_else(|| name.strip_suffix(".egg-info")) else { continue };
            let (n, v) = stem.split_once('-').unwrap_or((stem, "?"));
            let v = v.split('-').next().unwrap_or(v);
            packages.push(Package { name: n.replace('_', "-"), version: v.to_string() });
        }
    }
    packages.sort_by_key(|p| p.name.to_lowercase());
    packages.dedup();
    Ok(Packages { source: Source::SitePackages(dirs), stdlib, packages })
}

/// Accept the shapes a manifest may take: `{"packages": [{"name", "version"}]}`,
/// `{"packages": {"name": "version"}}`, or either at the top level.
fn from_manifest(v: &Value) -> Vec<Package> {
    let list = v.get("packages").or_else(|| v.get("python_packages")).unwrap_or(v);
    match list {
        Value::Array(items) => items
            .iter()
            .filter_map(|i| {
                let name = i.get("name").and_then(Value::as_str)?;
                let version = i.get("version").and_then(Value::as_str).unwrap_or("?");
                Some(Package { name: name.to_string(), version: version.to_string() })
            })
            .collect(),
        Value::Object(map) => map
            .iter()
            .filter(|(_, v)| v.is_string())
            .map(|(k, v)| Package { name: k.clone(), version: v.as_str().unwrap_or("?").to_string() })
            .collect(),
        _ => Vec::new(),
    }
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
            Source::Manifest(p) => out.push_str(&format!("source: the rootfs manifest ({})\n", p.display())),
            Source::SitePackages(dirs) if dirs.is_empty() => {
                out.push_str("source: no manifest in this rootfs and no site-packages folder: only the standard library is installed\n")
            }
            Source::SitePackages(_) => {
                out.push_str("source: no manifest in this rootfs; listed its site-packages folders\n")
            }
        }
        if !self.stdlib.is_empty() {
            out.push_str(&format!("standard library: {} (all of it, except tkinter, idlelib and the test suite)\n", self.stdlib.join(", ")));
        }
        if self.packages.is_empty() {
            out.push_str("third-party packages: none (no numpy, pandas or matplotlib: use the standard library)\n");
        } else {
            out.push_str(&format!("third-party packages ({}):\n", self.packages.len()));
            for p in &self.packages {
                out.push_str(&format!("{} {}\n", p.name, p.version));
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
        std::fs::write(t.path().join(MANIFEST_PATH), r#"{"packages":[{"name":"pandas","version":"2.2.3"}]}"#).unwrap();
        let p = list(t.path()).unwrap();
        assert!(matches!(p.source, Source::Manifest(_)));
        assert_eq!(p.packages, vec![Package { name: "pandas".into(), version: "2.2.3".into() }]);
        assert!(p.render().contains("rootfs manifest"));
        let v: Value = serde_json::from_str(r#"{"numpy":"2.1.0"}"#).unwrap();
        assert_eq!(from_manifest(&v)[0].name, "numpy");
    }

    #[test]
    fn without_a_manifest_site_packages_are_listed() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("usr/lib/python3.11/site-packages/python_pptx-1.0.2.dist-info")).unwrap();
        std::fs::write(t.path().join("usr/lib/python3.11/os.py"), "").unwrap();
        let p = list(t.path()).unwrap();
        assert!(matches!(p.source, Source::SitePackages(ref d) if d.len() == 1));
        assert_eq!(p.packages, vec![Package { name: "python-pptx".into(), version: "1.0.2".into() }]);
        assert_eq!(p.stdlib, vec!["python3.11"]);
        assert!(p.render().contains("site-packages"));
    }
}
