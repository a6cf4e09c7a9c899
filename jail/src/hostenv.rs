//! What the caller's environment contributes to one run, as a value: the
//! library reads no environment variable itself (issue 17 item 5). The edge
//! (the CLI, `cli.rs`) calls [`HostEnv::read`] once with `std::env::var_os`, and the
//! request carries the result, so every input of a run is in the request.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::policy::Policy;

/// The variable a trusted caller (the tests) sets to map names to fixed
/// addresses for the allowlist proxy: `name=address,name=address`.
pub(crate) use crate::proxy::TEST_RESOLVE_VAR;

/// Overrides where compiled seccomp programs are kept; empty turns the cache off.
pub(crate) const CACHE_DIR_VAR: &str = "JAIL_CACHE_DIR";

/// The rootfs folder to use instead of looking one up by name.
pub(crate) const ROOTFS_VAR: &str = "JAIL_ROOTFS";

/// The cgroup to create run cgroups beneath when `--cgroup-parent` is not given.
pub const CGROUP_PARENT_VAR: &str = "JAIL_CGROUP_PARENT";

/// The environment's part of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostEnv {
    /// Values of the policy's `environment.pass` variables that are set.
    pub pass: BTreeMap<String, String>,
    /// [`TEST_RESOLVE_VAR`]'s value, when set.
    pub resolve_override: Option<String>,
    /// The seccomp program cache folder; `None` compiles afresh every run.
    pub cache_dir: Option<PathBuf>,
    /// Where a fresh output folder is made (`$TMPDIR`); `None` means `/tmp`.
    pub temp_dir: Option<PathBuf>,
}

impl HostEnv {
    /// Read what `policy` lets through, the resolver override and the cache
    /// folder through `var` (the process environment at the edge, a map in tests).
    pub fn read(policy: &Policy, var: &dyn Fn(&str) -> Option<OsString>) -> HostEnv {
        let text = |k: &str| var(k).and_then(|v| v.into_string().ok());
        let pass = policy.environment.pass.iter().filter_map(|k| text(k).map(|v| (k.clone(), v))).collect();
        let temp_dir = path_var(var, "TMPDIR").filter(|p| p.is_absolute());
        HostEnv {
            pass,
            resolve_override: text(TEST_RESOLVE_VAR),
            cache_dir: cache_dir(var),
            temp_dir,
        }
    }
}

/// Where compiled seccomp programs are kept: `$JAIL_CACHE_DIR` (empty turns
/// the cache off), else `$XDG_CACHE_HOME/jail`, else `$HOME/.cache/jail`;
/// only an absolute path counts.
pub(crate) fn cache_dir(var: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = match var(CACHE_DIR_VAR) {
        Some(v) if v.is_empty() => return None,
        Some(v) => PathBuf::from(v),
        None => set("XDG_CACHE_HOME").or_else(|| set("HOME").map(|h| h.join(".cache")))?.join("jail"),
    };
    dir.is_absolute().then_some(dir)
}

/// A non-empty variable as a path.
pub(crate) fn path_var(var: &dyn Fn(&str) -> Option<OsString>, name: &str) -> Option<PathBuf> {
    var(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: BTreeMap<String, OsString> = pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        move |k: &str| map.get(k).cloned()
    }

    #[test]
    fn only_the_policys_pass_through_variables_are_read() {
        let mut policy = Policy::builtin_default().unwrap();
        policy.environment.pass = vec!["KEEP".into(), "UNSET".into()];
        let env = HostEnv::read(&policy, &vars(&[("KEEP", "1"), ("SECRET_TOKEN", "x"), (TEST_RESOLVE_VAR, "a.test=1.2.3.4")]));
        assert_eq!(env.pass, BTreeMap::from([("KEEP".to_string(), "1".to_string())]));
        assert_eq!(env.resolve_override.as_deref(), Some("a.test=1.2.3.4"));
    }

    #[test]
    fn the_cache_folder_follows_jail_cache_dir_then_xdg_then_home() {
        assert_eq!(cache_dir(&vars(&[(CACHE_DIR_VAR, "/c"), ("HOME", "/h")])), Some(PathBuf::from("/c")));
        assert_eq!(cache_dir(&vars(&[(CACHE_DIR_VAR, ""), ("HOME", "/h")])), None);
        assert_eq!(cache_dir(&vars(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])), Some(PathBuf::from("/x/jail")));
        assert_eq!(cache_dir(&vars(&[("HOME", "/h")])), Some(PathBuf::from("/h/.cache/jail")));
        assert_eq!(cache_dir(&vars(&[("HOME", "rel")])), None);
        assert_eq!(cache_dir(&vars(&[])), None);
    }

    /// Issue 17 item 5: every environment variable is read at the edge.
    /// A read anywhere else in the library fails this test.
    #[test]
    fn the_library_reads_no_environment_variable() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        // Built from pieces so this file does not match itself.
        let needles = [
            concat!("env::", "var("),
            concat!("env::", "var_os("),
            concat!("env::", "vars("),
            concat!("env::", "vars_os("),
            concat!("env::", "temp_dir("),
        ];
        let mut offenders = Vec::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                // Test code may read test-only switches (JAIL_BLESS): a
                // `tests.rs` file, and a file's `#[cfg(test)]` module, which
                // ends it by convention.
                if path.extension().is_none_or(|e| e != "rs") || path == src.join("cli.rs") || path.ends_with("tests.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate().take_while(|(_, l)| l.trim() != "#[cfg(test)]") {
                    if needles.iter().any(|needle| line.contains(needle)) {
                        offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(offenders.is_empty(), "read these in cli.rs and pass them in the request:\n{}", offenders.join("\n"));
    }
}
