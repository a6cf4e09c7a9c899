//! Landlock: the second wall behind the mounts (DESIGN.md §3.4). The worker
//! restricts itself after no_new_privs and before seccomp, so the script and
//! everything it starts live in one Landlock domain:
//! - the filesystem: read (and execute) on the rootfs, read on input and
//!   code, read-write on output, /tmp and /dev/shm (never execute there),
//!   read and write on the granted device nodes only, listing everywhere;
//! - TCP bind and connect denied (ABI 4);
//! - abstract unix sockets and signals scoped to the domain (ABI 6): the
//!   script can neither signal the jail's PID 1 nor reach an abstract socket
//!   that something outside its domain created.
//!
//! The supervisor plans before the clone: from the kernel's ABI and the
//! policy it decides the ABI the rules are built for and what that leaves
//! out. A policy marking landlock `required` fails there, before any fork,
//! when the kernel offers less than it asks for; `best_effort` runs with the
//! gap reported in the result's `isolation`.

use std::path::{Path, PathBuf};

use landlock::{
    Access as _, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use serde::{Deserialize, Serialize};

use crate::field::FieldError;
use crate::mounts::{self, Kind, MountOp};
use crate::result::{LandlockReport, LayerStatus};

/// The ABI whose features these rules use; newer ABIs add nothing we use
/// yet (ABI 7 adds only audit logging).
pub const TARGET_ABI: u32 = 6;

/// What each ABI below [`TARGET_ABI`] leaves out of this jail's rules.
const MISSING_BELOW: [(u32, &str); 5] = [
    (2, "renames and links across folders are refused, not controlled (ABI 2)"),
    (3, "truncate is not controlled (ABI 3)"),
    (4, "TCP bind and connect are not controlled (ABI 4)"),
    (5, "ioctl on device files is not controlled (ABI 5)"),
    (6, "abstract unix sockets and signals are not scoped (ABI 6)"),
];

/// The `landlock` section of a policy file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct LandlockFile {
    /// `best_effort` (the default) or `required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// With `required`: the lowest kernel ABI the run accepts (default 6,
    /// every rule this jail has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_abi: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Enforcement {
    /// Fail the run, before the script starts, below `min_abi`.
    Required,
    /// Enforce what the kernel offers and report the rest as degraded.
    BestEffort,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Required => "required",
            Enforcement::BestEffort => "best_effort",
        }
    }
}

/// The validated `landlock` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub enforcement: Enforcement,
    /// Only meaningful with `Required`.
    pub min_abi: u32,
}

/// Validate the `landlock` section of a policy.
pub(crate) fn validate(f: &LandlockFile) -> Result<Settings, FieldError> {
    let field = |name: &str, message: String| FieldError::new(format!("landlock.{name}"), message);
    let enforcement = match f.mode.as_deref().unwrap_or("best_effort") {
        "best_effort" => Enforcement::BestEffort,
        "required" => Enforcement::Required,
        other => return Err(field("mode", format!("`{other}` is not a mode (use \"required\" or \"best_effort\")"))),
    };
    let min_abi = match (enforcement, f.min_abi) {
        (Enforcement::BestEffort, Some(_)) => {
            return Err(field("min_abi", "only applies with mode \"required\"; remove it or set the mode".into()))
        }
        (_, Some(n)) if n == 0 || n > 255 => return Err(field("min_abi", format!("is {n}, must be 1 to 255"))),
        (_, Some(n)) => n,
        (_, None) => TARGET_ABI,
    };
    Ok(Settings { enforcement, min_abi })
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error(
        "this kernel offers Landlock ABI {kernel} (0: none) and the policy requires at least {need} \
         (landlock.mode is \"required\"); boot a newer kernel with landlock in lsm=, or use \"best_effort\""
    )]
    Unavailable { kernel: u32, need: u32 },
    #[error("build the landlock ruleset")]
    Ruleset(#[source] landlock::RulesetError),
    #[error("open {path} for a landlock rule")]
    Open { path: PathBuf, source: landlock::PathFdError },
    #[error("add the landlock rule for {path}")]
    AddRule { path: PathBuf, source: landlock::RulesetError },
    #[error("landlock_restrict_self")]
    Restrict(#[source] landlock::RulesetError),
    #[error("the kernel enforced the landlock ruleset only partly at ABI {0}")]
    Partial(u32),
}

/// What this run gets from Landlock, decided before the clone.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// The ABI the ruleset is built for; 0 means none is applied.
    pub abi: u32,
    pub kernel_abi: u32,
    pub enforcement: Enforcement,
    pub status: LayerStatus,
    pub missing: Vec<String>,
}

/// The kernel's Landlock ABI, 0 when it has none (not built in, or not in
/// the boot-time `lsm=` list).
pub fn kernel_abi() -> u32 {
    crate::sys::landlock_abi().map(|v| v.max(0) as u32).unwrap_or(0)
}

/// Decide the ABI and status for a kernel. Pure.
pub fn plan(kernel_abi: u32, settings: &Settings) -> Result<Plan, LandlockError> {
    if settings.enforcement == Enforcement::Required && kernel_abi < settings.min_abi {
        return Err(LandlockError::Unavailable { kernel: kernel_abi, need: settings.min_abi });
    }
    let abi = kernel_abi.min(TARGET_ABI);
    let status = match abi {
        0 => LayerStatus::NotEnforced,
        TARGET_ABI => LayerStatus::Enforced,
        _ => LayerStatus::Partial,
    };
    let missing = if abi == 0 {
        vec!["no Landlock on this kernel: no filesystem, TCP or IPC rules beyond the mounts".to_string()]
    } else {
        MISSING_BELOW.iter().filter(|(need, _)| abi < *need).map(|(_, m)| m.to_string()).collect()
    };
    Ok(Plan { abi, kernel_abi, enforcement: settings.enforcement, status, missing })
}

impl Plan {
    /// None applied: a template's own jail (template.rs), whose forks
    /// each get their own.
    pub(crate) fn not_applied(self) -> Plan {
        Plan {
            abi: 0,
            status: LayerStatus::NotEnforced,
            missing: vec!["a template runs only its trusted preload, and its forks apply their own".to_string()],
            ..self
        }
    }

    /// The result's `isolation.landlock`.
    pub fn report(&self) -> LandlockReport {
        LandlockReport {
            status: self.status,
            mode: self.enforcement.as_str().to_string(),
            abi: self.abi,
            kernel_abi: self.kernel_abi,
            missing: self.missing.clone(),
            detail: match self.status {
                LayerStatus::Enforced if self.kernel_abi > TARGET_ABI => {
                    Some(format!("rules built for ABI {TARGET_ABI}; the kernel's ABI {} adds nothing they use", self.kernel_abi))
                }
                _ => None,
            },
        }
    }

    /// The line for the result's `degraded`, when there is one.
    pub fn degraded(&self) -> Option<String> {
        match self.status {
            LayerStatus::Enforced => None,
            _ => Some(format!(
                "landlock: {} (kernel ABI {}): {}",
                status_word(self.status),
                self.kernel_abi,
                self.missing.join("; ")
            )),
        }
    }
}

fn status_word(s: LayerStatus) -> &'static str {
    match s {
        LayerStatus::Enforced => "enforced",
        LayerStatus::Partial => "partial",
        LayerStatus::NotEnforced => "not enforced",
    }
}

/// What one path beneath grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Access {
    /// List folders (the root, /dev).
    List,
    /// Read files and list folders (input, code, /proc).
    Read,
    /// Read and execute (the rootfs).
    ReadExec,
    /// Everything but execute, device nodes and device ioctls (output,
    /// /tmp, /dev/shm).
    ReadWrite,
    /// Open for reading and writing, nothing else (a granted device node).
    Device,
}

/// One Landlock rule: everything beneath `path` gets `access`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathRule {
    pub path: PathBuf,
    pub access: Access,
}

/// The rules for a mount plan, so the two can never disagree about what
/// exists. Pure.
pub fn rules(ops: &[MountOp]) -> Vec<PathRule> {
    let mut out = vec![PathRule { path: PathBuf::from("/"), access: Access::List }];
    let workspace = Path::new(mounts::WORKSPACE);
    for op in ops {
        let rule = match op {
            MountOp::Bind { path, kind: Kind::Dir, access: mounts::Access::ReadOnly, .. } if path.starts_with(workspace) => {
                Some((path, Access::Read))
            }
            MountOp::Bind { path, kind: Kind::Dir, access: mounts::Access::ReadOnly, .. } => Some((path, Access::ReadExec)),
            MountOp::Bind { path, kind: Kind::Dir, access: mounts::Access::ReadWrite, .. } => Some((path, Access::ReadWrite)),
            MountOp::Bind { path, kind: Kind::File, access: mounts::Access::ReadWrite, .. } => Some((path, Access::Device)),
            MountOp::Bind { path, kind: Kind::File, access: mounts::Access::ReadOnly, .. } => Some((path, Access::Read)),
            MountOp::Tmpfs { path, .. } if path == Path::new("/dev") => Some((path, Access::List)),
            MountOp::Tmpfs { path, .. } => Some((path, Access::ReadWrite)),
            // The size-capped output dir (output.rs) is writable like its bind.
            MountOp::OutputTmpfs { path, .. } => Some((path, Access::ReadWrite)),
            MountOp::Proc { path } => Some((path, Access::Read)),
            // The code dir holding the script alone: read-only like its bind.
            MountOp::ScriptCopy { dir, .. } => Some((dir, Access::Read)),
            // The generated /sys (inside.rs): read-only files.
            MountOp::Files { dir, .. } => Some((dir, Access::Read)),
            _ => None,
        };
        if let Some((path, access)) = rule {
            out.retain(|r| &r.path != path);
            out.push(PathRule { path: path.clone(), access });
        }
    }
    out
}

/// The filesystem rights of an access at an ABI.
pub(crate) fn fs_rights(access: Access, abi: ABI) -> BitFlags<AccessFs> {
    let all = AccessFs::from_all(abi);
    let wanted = match access {
        Access::List => AccessFs::ReadDir.into(),
        Access::Read => AccessFs::ReadFile | AccessFs::ReadDir,
        Access::ReadExec => AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute,
        Access::ReadWrite => all & !(AccessFs::Execute | AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev),
        // open("/dev/null", "w") truncates.
        Access::Device => AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
    };
    wanted & all
}

/// Child side: build the ruleset the plan describes and restrict this
/// process (and everything it will start) to it. Needs no_new_privs.
///
/// `tcp_connect` lists the only TCP ports connect(2) may reach (ABI >= 4):
/// empty with `network.mode: none`, the proxy's port with an allowlist.
pub fn restrict(plan: &Plan, rules: &[PathRule], tcp_connect: &[u16]) -> Result<(), LandlockError> {
    if plan.abi == 0 {
        return Ok(());
    }
    let abi = ABI::from(plan.abi as i32);
    // Hard requirement: the plan only asks for what the kernel offers, so
    // anything less than all of it is an error, never a silent downgrade.
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(LandlockError::Ruleset)?;
    if plan.abi >= 4 {
        // Handled with no rule: every TCP bind and connect is denied.
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(LandlockError::Ruleset)?;
    }
    if plan.abi >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(LandlockError::Ruleset)?;
    }
    let mut created = ruleset.create().map_err(LandlockError::Ruleset)?;
    for r in rules {
        let fd = PathFd::new(&r.path).map_err(|source| LandlockError::Open { path: r.path.clone(), source })?;
        let is_dir = std::fs::metadata(&r.path).map(|m| m.is_dir()).unwrap_or(true);
        let mut rights = fs_rights(r.access, abi);
        if !is_dir {
            rights &= AccessFs::from_file(abi);
        }
        created = created
            .add_rule(PathBeneath::new(fd, rights))
            .map_err(|source| LandlockError::AddRule { path: r.path.clone(), source })?;
    }
    if plan.abi >= 4 {
        for &port in tcp_connect {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|source| LandlockError::AddRule { path: PathBuf::from(format!("tcp:{port}")), source })?;
        }
    }
    let status = created.restrict_self().map_err(LandlockError::Restrict)?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(LandlockError::Partial(plan.abi));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn required(min_abi: u32) -> Settings {
        Settings { enforcement: Enforcement::Required, min_abi }
    }
    const BEST: Settings = Settings { enforcement: Enforcement::BestEffort, min_abi: TARGET_ABI };

    #[test]
    fn best_effort_reports_what_each_abi_leaves_out() {
        let p = plan(7, &BEST).unwrap();
        assert_eq!((p.abi, p.status), (6, LayerStatus::Enforced));
        assert!(p.missing.is_empty() && p.degraded().is_none());
        let p = plan(3, &BEST).unwrap();
        assert_eq!((p.abi, p.status), (3, LayerStatus::Partial));
        assert_eq!(p.missing.len(), 3, "{:?}", p.missing);
        assert!(p.missing[0].contains("TCP"));
        assert!(p.degraded().unwrap().starts_with("landlock: partial (kernel ABI 3)"));
        let p = plan(0, &BEST).unwrap();
        assert_eq!((p.abi, p.status), (0, LayerStatus::NotEnforced));
        assert!(p.degraded().unwrap().contains("no Landlock"));
    }

    #[test]
    fn required_fails_closed_below_its_minimum() {
        assert!(matches!(plan(0, &required(1)), Err(LandlockError::Unavailable { kernel: 0, need: 1 })));
        assert!(matches!(plan(5, &required(6)), Err(LandlockError::Unavailable { kernel: 5, need: 6 })));
        assert_eq!(plan(4, &required(4)).unwrap().status, LayerStatus::Partial);
        assert_eq!(plan(6, &required(6)).unwrap().status, LayerStatus::Enforced);
    }

    #[test]
    fn the_policy_section_is_validated() {
        let v = |mode: Option<&str>, min| validate(&LandlockFile { mode: mode.map(String::from), min_abi: min });
        assert_eq!(v(None, None).unwrap(), BEST);
        assert_eq!(v(Some("required"), None).unwrap(), required(TARGET_ABI));
        assert_eq!(v(Some("required"), Some(4)).unwrap(), required(4));
        assert!(v(Some("strict"), None).unwrap_err().to_string().contains("landlock.mode"));
        assert!(v(Some("best_effort"), Some(3)).unwrap_err().to_string().contains("landlock.min_abi"));
        assert!(v(Some("required"), Some(0)).unwrap_err().to_string().contains("landlock.min_abi"));
    }

    #[test]
    fn the_size_capped_output_dir_is_writable() {
        let req = mounts::Request {
            rootfs: PathBuf::from("/r"),
            rootfs_entries: vec![],
            input: None,
            code: mounts::Code::Dir(PathBuf::from("/code")),
            output: PathBuf::from("/out"),
            tmp_size: 1 << 20,
            shm_size: 1 << 20,
            output_size: Some(1 << 20),
            meminfo: None,
            sys_files: vec![],
        };
        let rules = rules(&mounts::plan(&req));
        assert!(rules.iter().any(|r| r.path == Path::new(mounts::OUTPUT_DIR) && r.access == Access::ReadWrite), "{rules:?}");
    }

    #[test]
    fn rules_follow_the_mount_plan() {
        let req = mounts::Request {
            rootfs: PathBuf::from("/r"),
            rootfs_entries: vec![
                mounts::RootfsEntry::Dir("usr".into()),
                mounts::RootfsEntry::Symlink("bin".into(), "usr/bin".into()),
            ],
            input: Some(PathBuf::from("/in")),
            // The script alone: its copy is read-only like a granted folder.
            code: mounts::Code::Script { file: PathBuf::from("/code/main.py"), name: PathBuf::from("main.py") },
            output: PathBuf::from("/out"),
            tmp_size: 1 << 20,
            shm_size: 1 << 20,
            output_size: None,
            meminfo: None,
            sys_files: vec![],
        };
        let got: Vec<(String, Access)> =
            rules(&mounts::plan(&req)).into_iter().map(|r| (r.path.display().to_string(), r.access)).collect();
        let want: Vec<(String, Access)> = [
            ("/", Access::List),
            ("/usr", Access::ReadExec),
            ("/dev", Access::List),
            ("/dev/null", Access::Device),
            ("/dev/zero", Access::Device),
            ("/dev/full", Access::Device),
            ("/dev/random", Access::Device),
            ("/dev/urandom", Access::Device),
            ("/dev/shm", Access::ReadWrite),
            ("/proc", Access::Read),
            ("/tmp", Access::ReadWrite),
            ("/workspace/input", Access::Read),
            ("/workspace/code", Access::Read),
            ("/workspace/output", Access::ReadWrite),
        ]
        .into_iter()
        .map(|(p, a)| (p.to_string(), a))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn writable_folders_never_get_execute_or_device_rights() {
        let rw = fs_rights(Access::ReadWrite, ABI::V6);
        for denied in [AccessFs::Execute, AccessFs::MakeChar, AccessFs::MakeBlock, AccessFs::IoctlDev] {
            assert!(!rw.contains(denied), "{denied:?}");
        }
        assert!(rw.contains(AccessFs::Refer | AccessFs::Truncate | AccessFs::MakeSock | AccessFs::MakeReg));
        assert_eq!(fs_rights(Access::Device, ABI::V1), AccessFs::ReadFile | AccessFs::WriteFile);
        assert!(!fs_rights(Access::Read, ABI::V6).contains(AccessFs::Execute));
    }
}
