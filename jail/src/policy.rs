//! Policies: the JSON wire format (`PolicyFile`) and the validated domain type
//! (`Policy`) the rest of the jail is built from.
//!
//! A `PolicyFile` becomes a `Policy` only through [`Policy::load`] or
//! [`Policy::from_json`]; unknown fields are rejected and every error names the
//! field it is about, so a user editing a policy learns exactly what to fix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::seconds;

// The validated `artifacts` section is the artifacts module's own type, as
// `seccomp::Model` and `landlock::Settings` are theirs: the judgement never
// imports the policy.
pub use crate::artifacts::FormulaCells;
pub(crate) use crate::artifacts::{ArtifactRules, Extensions, PastBudget};

/// The default policy shipped in `policies/default.json`, built in so the
/// binary works without `--policy`.
pub(crate) const DEFAULT_POLICY_JSON: &str = include_str!("../../policies/default.json");

/// Where relative paths in the built-in default policy are resolved from.
pub(crate) const DEFAULT_POLICY_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies");

/// [`Policy::source`] of the built-in default.
pub(crate) const BUILTIN_SOURCE: &str = "built-in";

/// The only policy format version this build understands.
pub(crate) const POLICY_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("policy field `{field}`: {message}")]
    Field { field: String, message: String },
}

/// A facility's validator (`seccomp`, `landlock`) names the field; the
/// policy's error says it the same way as its own.
impl From<crate::field::FieldError> for PolicyError {
    fn from(e: crate::field::FieldError) -> PolicyError {
        PolicyError::Field { field: e.field, message: e.message }
    }
}

impl PolicyError {
    fn field(field: &str, message: impl Into<String>) -> Self {
        PolicyError::Field { field: field.to_string(), message: message.into() }
    }
}

// ---------------------------------------------------------------- wire types

/// The policy file exactly as written on disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyFile {
    pub version: u32,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Root filesystem folder; relative paths are taken from the policy's folder.
    #[serde(default)]
    pub rootfs: Option<String>,
    /// Interpreter path inside the jail.
    #[serde(default)]
    pub python: Option<String>,
    #[serde(default)]
    pub identity: IdentityFile,
    #[serde(default)]
    pub environment: EnvironmentFile,
    #[serde(default)]
    pub filesystem: FilesystemFile,
    #[serde(default)]
    pub limits: LimitsFile,
    #[serde(default)]
    pub network: NetworkFile,
    #[serde(default)]
    pub artifacts: ArtifactsFile,
    /// The syscall allowlist; absent means the built-in default policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<crate::seccomp::SeccompFile>,
    #[serde(default)]
    pub landlock: crate::landlock::LandlockFile,
    /// `jail session`: the interrupt grace, idle timeout and lifetime.
    #[serde(default, skip_serializing_if = "SessionFile::is_unset")]
    pub session: SessionFile,
    /// `jail pool`: trusted modules a pooled jail imports before any
    /// untrusted code exists in it (`["numpy", "pandas", "matplotlib.pyplot"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preload: Vec<String>,
}

/// The `session` section (`jail session`, session.rs).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionFile {
    /// Seconds a cell past its time limit gets to stop after SIGINT
    /// (KeyboardInterrupt) before the tree is killed and the session ends.
    pub interrupt_grace_secs: Option<f64>,
    /// Seconds without a cell after which the session is destroyed.
    pub idle_timeout_secs: Option<f64>,
    /// Seconds after its start at which the session is destroyed.
    pub max_lifetime_secs: Option<f64>,
}

impl SessionFile {
    fn is_unset(&self) -> bool {
        *self == SessionFile::default()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdentityFile {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub hostname: Option<String>,
    /// Replaced by `root_host_uids`; kept to say so by name.
    pub root_host_uid: Option<u32>,
    /// Host uids the sandbox maps to when the jail is run by root, one per
    /// concurrent run (never 0).
    pub root_host_uids: Option<UidRangeFile>,
    /// Host gid of every run started by root.
    pub root_host_gid: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct UidRangeFile {
    pub first: u32,
    pub count: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnvironmentFile {
    /// Variables set to fixed values.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Names copied from the caller's environment when present.
    #[serde(default)]
    pub pass: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilesystemFile {
    pub tmp_size: Option<Size>,
    pub shm_size: Option<Size>,
    /// Size cap of `/workspace/output`, or `"unlimited"`.
    pub output_size: Option<Size>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct LimitsFile {
    pub wall_time_secs: Option<f64>,
    /// CPU seconds of the whole run (user + system), or `"unlimited"`.
    pub cpu_time_secs: Option<Amount>,
    /// Memory of the whole run, swap 0, or `"unlimited"`.
    pub memory: Option<Size>,
    /// CPU quota in cores (`0.5` is half a core), or `"unlimited"`.
    pub cpus: Option<Amount>,
    /// Processes and threads of the run, counting the jail's own PID 1, or
    /// `"unlimited"`.
    pub pids: Option<Amount>,
    /// Largest file the script may write (RLIMIT_FSIZE), or `"unlimited"`.
    pub file_size: Option<Size>,
    /// Open descriptors per process (RLIMIT_NOFILE).
    pub open_files: Option<u64>,
    pub stdout_bytes: Option<Size>,
    pub stderr_bytes: Option<Size>,
    /// `required` or `best_effort` for `memory`, `cpus`, `pids` and
    /// `cpu_time`; a limit not named here is `best_effort`.
    #[serde(default)]
    pub enforcement: BTreeMap<String, String>,
    /// The cgroup the run's cgroup is created beneath, as a path in the
    /// cgroup hierarchy (`/jail.slice`); default: the jail's own cgroup.
    pub cgroup_parent: Option<String>,
    /// `auto` (the default): with no writable cgroup, ask the systemd user
    /// manager for a delegated scope; `off`: never ask.
    pub systemd_delegation: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct NetworkFile {
    /// `none` (the default) or `allowlist`.
    pub mode: Option<String>,
    /// With `allowlist`: host names the script may reach through the proxy,
    /// exact (`api.example.org`) or `*.example.org` (subdomains only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// With `allowlist`: destination ports (default 443 and 80).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
    /// With `allowlist`: bytes both ways, all connections of the run together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<Size>,
    /// With `allowlist`: connections the proxy opens for the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

/// What may leave the output dir, and how it is checked (artifacts.rs).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArtifactsFile {
    pub max_file_bytes: Option<Size>,
    pub max_total_bytes: Option<Size>,
    pub max_files: Option<u64>,
    pub max_entries: Option<u64>,
    pub max_dir_entries: Option<u64>,
    pub max_depth: Option<u32>,
    pub max_name_bytes: Option<u32>,
    pub allowed_extensions: Option<Vec<String>>,
    /// `neutralise` (the default) or `flag`.
    pub formula_cells: Option<String>,
    pub input_hash_max_bytes: Option<Size>,
    /// What becomes of a file the judging budget left unjudged: `refuse`
    /// (the default) or `flag`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_budget: Option<String>,
}

/// A byte size: a number of bytes, or a string with a K, M or G suffix (powers
/// of 1024).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    pub fn to_bytes(&self) -> Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(s) => parse_size(s),
        }
    }
}

/// A number, or a string: `"unlimited"` or the number written as text.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub(crate) enum Amount {
    Number(f64),
    Text(String),
}

/// The word that lifts a limit.
pub(crate) const UNLIMITED: &str = "unlimited";

/// Parse `"512M"`, `"1G"`, `"64k"`, `"4096"` into bytes.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("`{text}` has an unknown unit (use K, M, G or T)")),
            };
            (&t[..i], mult)
        }
        _ => (t, 1),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a size (write bytes, or a number with K, M or G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("`{text}` is too large"))
}

// -------------------------------------------------------------- domain types

/// A validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub name: String,
    /// Absolute or relative-to-cwd rootfs path, if the policy names one.
    pub rootfs: Option<PathBuf>,
    pub python: PathBuf,
    pub identity: Identity,
    pub environment: Environment,
    pub filesystem: Filesystem,
    pub limits: Limits,
    pub network: Network,
    pub artifacts: ArtifactRules,
    pub seccomp: crate::seccomp::Model,
    pub landlock: crate::landlock::Settings,
    pub session: SessionLimits,
    /// Dotted module names a pooled jail imports ahead (`jail pool`).
    pub preload: Vec<String>,
    /// sha256 of the policy's canonical JSON form, reported in every result.
    pub hash: String,
    /// Where it came from, for the result and `jail doctor`: `built-in`
    /// (policies/default.json, compiled in), the file's path, or `inline`.
    pub source: String,
}

/// A session's times (`jail session`), validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionLimits {
    pub interrupt_grace: Duration,
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    /// Where a run started by root takes its host uid from (hostuid.rs).
    pub root_host_uids: crate::hostuid::UidRange,
    pub root_host_gid: u32,
}

/// The host ids of a run started by root (`hostuid::for_caller`).
impl From<&Identity> for crate::hostuid::RootIds {
    fn from(identity: &Identity) -> crate::hostuid::RootIds {
        crate::hostuid::RootIds { uids: identity.root_host_uids, gid: identity.root_host_gid }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Environment {
    pub set: BTreeMap<String, String>,
    pub pass: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Filesystem {
    /// The size of `/tmp`: the policy's, or with [`Sizing::Auto`] the one
    /// [`auto_tmp_size`] gives for the memory limit.
    pub tmp_size: u64,
    pub tmp_sizing: Sizing,
    pub shm_size: u64,
    /// `None`: the output dir is the host folder itself, with no size cap.
    pub output_size: Option<u64>,
}

/// Whether a size was given or follows the memory limit (`"auto"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    Auto,
    Fixed,
}

/// The word that sizes `/tmp` from the memory limit.
pub(crate) const AUTO: &str = "auto";

/// Resource limits; `None` means unlimited.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub wall_time: Duration,
    pub cpu_time: Option<Duration>,
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub file_size: Option<u64>,
    pub open_files: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub enforcement: Enforcements,
    /// A cgroup path (as in /proc/self/cgroup) to create run cgroups beneath.
    pub cgroup_parent: Option<PathBuf>,
    /// Whether a run with no writable cgroup asks systemd for a delegated
    /// scope (`limits.systemd_delegation`, delegate.rs).
    pub systemd_delegation: bool,
}

/// What happens when the host cannot enforce a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// The run fails before the script starts (setup_failed, exit 125).
    Required,
    /// The run goes on; the result names the limit in `isolation.degraded`.
    BestEffort,
}

/// The enforcement of each limit whose enforcement depends on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enforcements {
    pub memory: Enforcement,
    pub cpus: Enforcement,
    pub pids: Enforcement,
    pub cpu_time: Enforcement,
}

/// The limits `limits.enforcement` may name.
pub(crate) const ENFORCEABLE: [&str; 4] = ["memory", "cpus", "pids", "cpu_time"];

/// Limit overrides from the command line; each is a value as the user typed
/// it (`512M`, `0.5`, `unlimited`), validated like the policy field it
/// replaces, with errors that name the flag.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub memory: Option<String>,
    pub cpus: Option<String>,
    pub pids: Option<String>,
    pub cpu_time: Option<String>,
    pub cgroup_parent: Option<String>,
    /// `--no-systemd-delegation`.
    pub no_systemd_delegation: bool,
}

/// Network mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// A net namespace with only loopback, which stays down; nothing of the
    /// proxy runs.
    None,
    /// Loopback only as well, but with a listener on it that the
    /// supervisor's proxy serves (proxy.rs): named hosts and ports only.
    Allowlist(Allowlist),
}

impl Network {
    /// The mode's name, as the policy and the result spell it.
    pub fn mode(&self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Allowlist(_) => "allowlist",
        }
    }
}

/// What `network.mode: allowlist` lets through the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist {
    pub hosts: Vec<HostPattern>,
    pub ports: Vec<u16>,
    pub max_bytes: u64,
    pub max_connections: u32,
}

/// One entry of `network.hosts`, lowercased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name only.
    Exact(String),
    /// `*.suffix`: any name ending in `.suffix`, not `suffix` itself.
    Subdomains(String),
}

impl Allowlist {
    /// Whether a (lowercased, dot-free-at-the-end) host name is on the list.
    pub(crate) fn allows_host(&self, host: &str) -> bool {
        self.hosts.iter().any(|p| match p {
            HostPattern::Exact(name) => host == name,
            HostPattern::Subdomains(suffix) => {
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix.as_str())
                    && host[..host.len() - suffix.len()].ends_with('.')
            }
        })
    }

    pub(crate) fn allows_port(&self, port: u16) -> bool {
        self.ports.contains(&port)
    }
}

/// Whether `name` is a DNS host name: dot-separated labels of letters,
/// digits and inner dashes, 1 to 63 bytes each, 253 in all, and not an IP
/// address. Expects lowercase.
pub(crate) fn valid_host_name(name: &str) -> bool {
    name.len() <= 253
        && name.parse::<std::net::IpAddr>().is_err()
        && !name.rsplit('.').next().is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

fn validate_network(f: &NetworkFile) -> Result<Network, PolicyError> {
    let mode = f.mode.as_deref().unwrap_or("none");
    match mode {
        "none" => {
            for (set, name) in [
                (f.hosts.is_some(), "hosts"),
                (f.ports.is_some(), "ports"),
                (f.max_bytes.is_some(), "max_bytes"),
                (f.max_connections.is_some(), "max_connections"),
            ] {
                if set {
                    return Err(PolicyError::field(
                        &format!("network.{name}"),
                        "only applies with network.mode \"allowlist\"; remove it or set the mode",
                    ));
                }
            }
            Ok(Network::None)
        }
        "allowlist" => {
            let hosts = f.hosts.as_deref().unwrap_or_default();
            if hosts.is_empty() {
                return Err(PolicyError::field(
                    "network.hosts",
                    "must list at least one host name with network.mode \"allowlist\" (use \"none\" for no network)",
                ));
            }
            let mut patterns = Vec::new();
            for (i, h) in hosts.iter().enumerate() {
                let lower = h.trim().to_ascii_lowercase();
                let (pattern, name) = match lower.strip_prefix("*.") {
                    Some(rest) => (HostPattern::Subdomains(rest.to_string()), rest.to_string()),
                    None => (HostPattern::Exact(lower.clone()), lower.clone()),
                };
                if !valid_host_name(&name) {
                    return Err(PolicyError::field(
                        &format!("network.hosts[{i}]"),
                        format!("`{h}` is not a host name or `*.name` pattern (IP addresses are not accepted: list names)"),
                    ));
                }
                if matches!(pattern, HostPattern::Subdomains(_)) && !name.contains('.') {
                    return Err(PolicyError::field(
                        &format!("network.hosts[{i}]"),
                        format!("`{h}` would allow a whole top-level domain; name a registered domain (`*.example.org`)"),
                    ));
                }
                patterns.push(pattern);
            }
            let ports = f.ports.clone().unwrap_or_else(|| vec![443, 80]);
            if ports.is_empty() {
                return Err(PolicyError::field("network.ports", "must list at least one port (the default is [443, 80])"));
            }
            if let Some(i) = ports.iter().position(|p| *p == 0) {
                return Err(PolicyError::field(&format!("network.ports[{i}]"), "is 0, must be 1 to 65535"));
            }
            let max_bytes = size_field("network.max_bytes", &f.max_bytes, 64 << 20)?;
            let max_connections = f.max_connections.unwrap_or(64);
            if !(1..=100_000).contains(&max_connections) {
                return Err(PolicyError::field("network.max_connections", format!("is {max_connections}, must be 1 to 100000")));
            }
            Ok(Network::Allowlist(Allowlist { hosts: patterns, ports, max_bytes, max_connections }))
        }
        other => Err(PolicyError::field(
            "network.mode",
            format!("`{other}` is not a network mode this jail has (use \"none\" or \"allowlist\")"),
        )),
    }
}

impl Policy {
    /// Read, parse and validate a policy file; relative paths in it are taken
    /// from the file's own folder.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read { path: path.to_path_buf(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut policy = Policy::from_json(&text, base)?;
        policy.source = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string();
        Ok(policy)
    }

    /// The built-in default policy.
    pub fn builtin_default() -> Result<Policy, PolicyError> {
        let mut policy = Policy::from_json(DEFAULT_POLICY_JSON, Path::new(DEFAULT_POLICY_DIR))?;
        policy.source = BUILTIN_SOURCE.into();
        Ok(policy)
    }

    /// Parse and validate policy JSON; `base` resolves relative paths.
    pub(crate) fn from_json(text: &str, base: &Path) -> Result<Policy, PolicyError> {
        let file = parse_file(text)?;
        Policy::validate(file, base)
    }

    fn validate(mut file: PolicyFile, base: &Path) -> Result<Policy, PolicyError> {
        if file.version != POLICY_VERSION {
            return Err(PolicyError::field(
                "version",
                format!("is {}, this jail understands version {POLICY_VERSION}", file.version),
            ));
        }
        if file.seccomp.is_none() {
            // The hash below then covers the allowlist the run really gets.
            file.seccomp = parse_file(DEFAULT_POLICY_JSON)?.seccomp;
            if file.network.mode.as_deref() == Some("allowlist") {
                if let Some(section) = file.seccomp.as_mut() {
                    crate::seccomp::adapt_for_allowlist(section);
                }
            }
        }
        let hash = crate::digest::sha256_hex(serde_json::to_string(&file).unwrap_or_default().as_bytes());
        let python = PathBuf::from(file.python.clone().unwrap_or_else(|| "/usr/bin/python3".into()));
        if !python.is_absolute() {
            return Err(PolicyError::field("python", "must be an absolute path inside the jail"));
        }
        let rootfs = file.rootfs.as_ref().map(|r| {
            let p = PathBuf::from(r);
            if p.is_absolute() {
                p
            } else {
                base.join(p)
            }
        });
        let identity = validate_identity(&file.identity)?;
        let environment = validate_environment(&file.environment)?;
        let wall = file.limits.wall_time_secs.unwrap_or(15.0);
        if seconds::limit(wall, seconds::MOST).is_none() {
            return Err(PolicyError::field(
                "limits.wall_time_secs",
                format!("is {wall}, must be {}", seconds::range(seconds::MOST)),
            ));
        }
        let limits = validate_limits(&file.limits, wall)?;
        let tmp_sizing = match &file.filesystem.tmp_size {
            None => Sizing::Auto,
            Some(Size::Text(t)) if t.trim() == AUTO => Sizing::Auto,
            Some(_) => Sizing::Fixed,
        };
        let filesystem = Filesystem {
            tmp_size: match tmp_sizing {
                Sizing::Auto => auto_tmp_size(limits.memory),
                Sizing::Fixed => size_field("filesystem.tmp_size", &file.filesystem.tmp_size, 0)?,
            },
            tmp_sizing,
            shm_size: size_field("filesystem.shm_size", &file.filesystem.shm_size, 16 << 20)?,
            output_size: limit_size("filesystem.output_size", &file.filesystem.output_size, Some(256 << 20))?,
        };
        let network = validate_network(&file.network)?;
        let artifacts = validate_artifacts(&file.artifacts)?;
        let seccomp = match &file.seccomp {
            Some(section) => crate::seccomp::Model::from_file(section, "seccomp")?,
            None => return Err(PolicyError::field("seccomp", "is missing, and so is the built-in default's")),
        };
        crate::seccomp::check_jail_needs(&seccomp)?;
        crate::seccomp::check_floor(&seccomp)?;
        match network {
            Network::None => crate::seccomp::check_network_none(&seccomp)?,
            Network::Allowlist(_) => crate::seccomp::check_network_allowlist(&seccomp)?,
        }
        let landlock = crate::landlock::validate(&file.landlock)?;
        let session = validate_session(&file.session)?;
        let preload = validate_preload(&file.preload)?;
        Ok(Policy {
            name: file.name.clone().unwrap_or_else(|| "unnamed".into()),
            rootfs,
            python,
            identity,
            environment,
            filesystem,
            limits,
            network,
            artifacts,
            seccomp,
            landlock,
            session,
            preload,
            hash,
            source: "inline".into(),
        })
    }
}

/// At most this many preload modules: each is imported in every pooled jail.
const MAX_PRELOAD: usize = 64;

/// `preload`: each entry a dotted Python module name (`matplotlib.pyplot`),
/// since the pool's driver hands it to `importlib.import_module` and nothing
/// else; whether the rootfs has it is checked when the pool starts.
fn validate_preload(names: &[String]) -> Result<Vec<String>, PolicyError> {
    if names.len() > MAX_PRELOAD {
        return Err(PolicyError::field("preload", format!("has {} modules, at most {MAX_PRELOAD}", names.len())));
    }
    for (i, name) in names.iter().enumerate() {
        if !is_module_name(name) {
            return Err(PolicyError::field(
                &format!("preload[{i}]"),
                format!("is {name:?}, not a dotted module name like \"matplotlib.pyplot\""),
            ));
        }
    }
    Ok(names.to_vec())
}

fn is_module_name(name: &str) -> bool {
    let part = |p: &str| {
        let mut chars = p.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    name.len() <= 200 && name.split('.').all(part)
}

fn validate_session(f: &SessionFile) -> Result<SessionLimits, PolicyError> {
    let secs = |name: &str, value: Option<f64>, default: f64, most: f64| {
        let v = value.unwrap_or(default);
        seconds::limit(v, most)
            .ok_or_else(|| PolicyError::field(&format!("session.{name}"), format!("is {v}, must be {}", seconds::range(most))))
    };
    let session = SessionLimits {
        interrupt_grace: secs("interrupt_grace_secs", f.interrupt_grace_secs, 2.0, 60.0)?,
        idle_timeout: secs("idle_timeout_secs", f.idle_timeout_secs, 600.0, seconds::MOST)?,
        max_lifetime: secs("max_lifetime_secs", f.max_lifetime_secs, 3_600.0, seconds::MOST)?,
    };
    if session.idle_timeout > session.max_lifetime {
        return Err(PolicyError::field("session.idle_timeout_secs", "is longer than session.max_lifetime_secs: lower it"));
    }
    Ok(session)
}

/// What [`check_round_trip`] found wrong.
#[derive(Debug, thiserror::Error)]
#[error("an accepted policy does not round-trip: {0}")]
pub struct RoundTripError(pub String);

/// The loader's contract, for the fuzzer (fuzz/policy_loader) and tests:
/// any text is either rejected with an error or accepted, and an accepted
/// policy written back out parses to the same file and validates to the
/// same policy (hash included). Returns whether `text` was accepted.
pub fn check_round_trip(text: &str, base: &Path) -> Result<bool, RoundTripError> {
    let Ok(file) = parse_file(text) else { return Ok(false) };
    let Ok(policy) = Policy::validate(file.clone(), base) else { return Ok(false) };
    let written = serde_json::to_string(&file).map_err(|e| RoundTripError(format!("serialize: {e}")))?;
    let again = parse_file(&written).map_err(|e| RoundTripError(format!("reparse `{written}`: {e}")))?;
    if again != file {
        return Err(RoundTripError(format!("reparsed file differs: {file:?} became {again:?}")));
    }
    let rewritten = serde_json::to_string(&again).map_err(|e| RoundTripError(format!("serialize: {e}")))?;
    if rewritten != written {
        return Err(RoundTripError(format!("serialization is not stable: `{written}` then `{rewritten}`")));
    }
    let revalidated = Policy::validate(again, base).map_err(|e| RoundTripError(format!("revalidate: {e}")))?;
    if revalidated != policy {
        return Err(RoundTripError(format!("revalidated policy differs: {policy:?} became {revalidated:?}")));
    }
    Ok(true)
}

/// Parse the wire form, naming the JSON path of whatever is wrong.
pub(crate) fn parse_file(text: &str) -> Result<PolicyFile, PolicyError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "(top level)".to_string() } else { path };
        PolicyError::Field { field, message: e.into_inner().to_string() }
    })
}

fn size_field(name: &str, value: &Option<Size>, default: u64) -> Result<u64, PolicyError> {
    let n = match value {
        None => default,
        Some(s) => s.to_bytes().map_err(|m| PolicyError::field(name, m))?,
    };
    if n == 0 {
        return Err(PolicyError::field(name, "must be above zero"));
    }
    Ok(n)
}

fn validate_limits(f: &LimitsFile, wall: f64) -> Result<Limits, PolicyError> {
    let field = |name: &str, r: Result<Option<f64>, String>| r.map_err(|m| PolicyError::field(name, m));
    let cpu_time = field("limits.cpu_time_secs", amount(&f.cpu_time_secs, None, check_cpu_time))?;
    let cpus = field("limits.cpus", amount(&f.cpus, Some(1.0), check_cpus))?;
    let pids = field("limits.pids", amount(&f.pids, Some(128.0), check_pids))?;
    let open_files = f.open_files.unwrap_or(1024);
    if !(16..=1 << 20).contains(&open_files) {
        return Err(PolicyError::field(
            "limits.open_files",
            format!("is {open_files}, must be at least 16 (Python needs a few) and at most 1048576"),
        ));
    }
    let mut enforcement = Enforcements {
        memory: Enforcement::BestEffort,
        cpus: Enforcement::BestEffort,
        pids: Enforcement::BestEffort,
        cpu_time: Enforcement::BestEffort,
    };
    for (name, value) in &f.enforcement {
        let level = parse_enforcement(value).map_err(|m| PolicyError::field(&format!("limits.enforcement.{name}"), m))?;
        match name.as_str() {
            "memory" => enforcement.memory = level,
            "cpus" => enforcement.cpus = level,
            "pids" => enforcement.pids = level,
            "cpu_time" => enforcement.cpu_time = level,
            _ => {
                return Err(PolicyError::field(
                    &format!("limits.enforcement.{name}"),
                    format!("is not a limit whose enforcement can be chosen (use one of {})", ENFORCEABLE.join(", ")),
                ))
            }
        }
    }
    let cgroup_parent = match &f.cgroup_parent {
        None => None,
        Some(p) => Some(check_cgroup_parent(p).map_err(|m| PolicyError::field("limits.cgroup_parent", m))?),
    };
    let systemd_delegation = match f.systemd_delegation.as_deref() {
        None | Some("auto") => true,
        Some("off") => false,
        Some(other) => {
            return Err(PolicyError::field(
                "limits.systemd_delegation",
                format!("`{other}` is not a choice (use \"auto\" or \"off\")"),
            ))
        }
    };
    Ok(Limits {
        wall_time: Duration::from_secs_f64(wall),
        cpu_time: cpu_time.map(Duration::from_secs_f64),
        memory: memory_limit("limits.memory", &f.memory, Some(512 << 20))?,
        cpus,
        pids: pids.map(|n| n as u64),
        file_size: limit_size("limits.file_size", &f.file_size, None)?,
        open_files,
        stdout_bytes: size_field("limits.stdout_bytes", &f.stdout_bytes, 1 << 20)?,
        stderr_bytes: size_field("limits.stderr_bytes", &f.stderr_bytes, 1 << 20)?,
        enforcement,
        cgroup_parent,
        systemd_delegation,
    })
}

fn parse_enforcement(value: &str) -> Result<Enforcement, String> {
    match value {
        "required" => Ok(Enforcement::Required),
        "best_effort" => Ok(Enforcement::BestEffort),
        other => Err(format!("`{other}` is not an enforcement (use \"required\" or \"best_effort\")")),
    }
}

/// A cgroup path: absolute, without `.` or `..` components.
fn check_cgroup_parent(p: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(p);
    let clean = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
    if !clean {
        return Err(format!("`{p}` must be an absolute cgroup path without `.` or `..`, as in /proc/self/cgroup"));
    }
    Ok(path)
}

fn check_cpu_time(v: f64) -> Result<f64, String> {
    match seconds::limit(v, seconds::MOST) {
        Some(_) => Ok(v),
        None => Err(format!("is {v}, must be {} seconds", seconds::range(seconds::MOST))),
    }
}

fn check_cpus(v: f64) -> Result<f64, String> {
    // The CFS quota is at least 1 ms per 100 ms period.
    if (0.01..=4096.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("is {v}, must be at least 0.01 and at most 4096 cores"))
    }
}

fn check_pids(v: f64) -> Result<f64, String> {
    // The jail's PID 1 and the interpreter count: two is the floor.
    if v.fract() == 0.0 && (2.0..=4_194_304.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("is {v}, must be a whole number from 2 (the jail's PID 1 and the script) to 4194304"))
    }
}

/// A number, `"unlimited"`, or a number written as text, checked by `check`.
fn amount(value: &Option<Amount>, default: Option<f64>, check: fn(f64) -> Result<f64, String>) -> Result<Option<f64>, String> {
    let v = match value {
        None => return Ok(default),
        Some(Amount::Number(n)) => *n,
        Some(Amount::Text(t)) if t.trim() == UNLIMITED => return Ok(None),
        Some(Amount::Text(t)) => t.trim().parse::<f64>().map_err(|_| format!("`{t}` is not a number (or \"{UNLIMITED}\")"))?,
    };
    check(v).map(Some)
}

/// A byte size or `"unlimited"`; absent means `default`.
fn limit_size(name: &str, value: &Option<Size>, default: Option<u64>) -> Result<Option<u64>, PolicyError> {
    match value {
        None => Ok(default),
        Some(Size::Text(t)) if t.trim() == UNLIMITED => Ok(None),
        Some(_) => size_field(name, value, 0).map(Some),
    }
}

/// The smallest memory limit: below it the interpreter cannot even start,
/// and the jail's own setup would be what the kernel kills.
pub(crate) const MIN_MEMORY: u64 = 16 << 20;

fn memory_limit(name: &str, value: &Option<Size>, default: Option<u64>) -> Result<Option<u64>, PolicyError> {
    let m = limit_size(name, value, default)?;
    if let Some(bytes) = m {
        if bytes < MIN_MEMORY {
            return Err(PolicyError::field(name, format!("is {bytes} bytes, must be at least 16M")));
        }
    }
    Ok(m)
}

impl Policy {
    /// Apply command-line overrides; an error names the flag and the fix.
    pub fn apply_overrides(&mut self, o: &Overrides) -> Result<(), String> {
        let flag = |name: &str, r: Result<Option<f64>, String>| r.map_err(|m| format!("--{name}: {m}"));
        let text = |v: &str| Some(Amount::Text(v.to_string()));
        if let Some(v) = &o.memory {
            self.limits.memory = memory_limit("--memory", &Some(Size::Text(v.clone())), None).map_err(|e| match e {
                PolicyError::Field { message, .. } => format!("--memory: {message}"),
                other => other.to_string(),
            })?;
            if self.filesystem.tmp_sizing == Sizing::Auto {
                self.filesystem.tmp_size = auto_tmp_size(self.limits.memory);
            }
        }
        if let Some(v) = &o.cpus {
            self.limits.cpus = flag("cpus", amount(&text(v), None, check_cpus))?;
        }
        if let Some(v) = &o.pids {
            self.limits.pids = flag("pids", amount(&text(v), None, check_pids))?.map(|n| n as u64);
        }
        if let Some(v) = &o.cpu_time {
            self.limits.cpu_time = flag("cpu-time", amount(&text(v), None, check_cpu_time))?.map(Duration::from_secs_f64);
        }
        if let Some(v) = &o.cgroup_parent {
            self.limits.cgroup_parent = Some(check_cgroup_parent(v).map_err(|m| format!("--cgroup-parent: {m}"))?);
        }
        if o.no_systemd_delegation {
            self.limits.systemd_delegation = false;
        }
        Ok(())
    }
}

fn validate_identity(f: &IdentityFile) -> Result<Identity, PolicyError> {
    let hostname = f.hostname.clone().unwrap_or_else(|| "jail".into());
    let valid_host = !hostname.is_empty()
        && hostname.len() <= 64
        && hostname.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !valid_host {
        return Err(PolicyError::field("identity.hostname", "must be 1 to 64 letters, digits, dots or dashes"));
    }
    if f.root_host_uid.is_some() {
        return Err(PolicyError::field(
            "identity.root_host_uid",
            "is replaced by identity.root_host_uids {\"first\": UID, \"count\": N}: each concurrent run started by root \
             takes its own host uid from that range",
        ));
    }
    let root_host_uids = match &f.root_host_uids {
        Some(r) => crate::hostuid::UidRange { first: r.first, count: r.count },
        None => crate::hostuid::UidRange { first: crate::hostuid::DEFAULT_FIRST, count: crate::hostuid::DEFAULT_COUNT },
    };
    if let Some(problem) = root_host_uids.problem() {
        return Err(PolicyError::field(
            "identity.root_host_uids",
            format!("{problem}: the sandbox never maps to host root or nobody"),
        ));
    }
    let root_host_gid = f.root_host_gid.unwrap_or(crate::hostuid::DEFAULT_GID);
    if root_host_gid == 0 {
        return Err(PolicyError::field("identity.root_host_gid", "must not be 0: the sandbox never maps to host root"));
    }
    Ok(Identity {
        uid: f.uid.unwrap_or(1000),
        gid: f.gid.unwrap_or(1000),
        hostname,
        root_host_uids,
        root_host_gid,
    })
}

fn count_field(name: &str, value: Option<u64>, default: u64, max: u64) -> Result<u64, PolicyError> {
    let n = value.unwrap_or(default);
    if n == 0 || n > max {
        return Err(PolicyError::field(name, format!("is {n}, must be from 1 to {max}")));
    }
    Ok(n)
}

fn validate_artifacts(f: &ArtifactsFile) -> Result<ArtifactRules, PolicyError> {
    // The walk keeps one record per entry: these caps bound its memory too.
    let max_entries = count_field("artifacts.max_entries", f.max_entries, 10_000, 1_000_000)?;
    let max_files = count_field("artifacts.max_files", f.max_files, 1_000, max_entries)?;
    let max_dir_entries = count_field("artifacts.max_dir_entries", f.max_dir_entries, 1_000, max_entries)?;
    let max_depth = count_field("artifacts.max_depth", f.max_depth.map(u64::from), 16, 256)? as u32;
    let max_name_bytes = count_field("artifacts.max_name_bytes", f.max_name_bytes.map(u64::from), 128, 255)? as u32;
    let allowed_extensions = match &f.allowed_extensions {
        None => Extensions::Only(DEFAULT_EXTENSIONS.iter().map(|e| e.to_string()).collect()),
        Some(list) if list.iter().any(|e| e == "*") => {
            if list.len() != 1 {
                return Err(PolicyError::field(
                    "artifacts.allowed_extensions",
                    "\"*\" admits every extension and must stand alone",
                ));
            }
            Extensions::Any
        }
        Some(list) => {
            let mut set = std::collections::BTreeSet::new();
            for (i, e) in list.iter().enumerate() {
                let ok = e.len() <= 16 && e.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
                if !ok {
                    return Err(PolicyError::field(
                        &format!("artifacts.allowed_extensions[{i}]"),
                        format!("`{e}` must be at most 16 lowercase letters or digits, without the dot (\"\" admits names without one)"),
                    ));
                }
                set.insert(e.clone());
            }
            Extensions::Only(set)
        }
    };
    let formula_cells = match f.formula_cells.as_deref().unwrap_or("neutralise") {
        "flag" => FormulaCells::Flag,
        "neutralise" | "neutralize" => FormulaCells::Neutralise,
        "sanitize" => {
            return Err(PolicyError::field(
                "artifacts.formula_cells",
                "`sanitize` (a copy beside the file) is gone: use \"neutralise\" (the host receives the neutralised file) or \"flag\"",
            ))
        }
        other => {
            return Err(PolicyError::field(
                "artifacts.formula_cells",
                format!("`{other}` is not a formula mode (use \"neutralise\" or \"flag\")"),
            ))
        }
    };
    let past_budget = match f.past_budget.as_deref().unwrap_or("refuse") {
        "refuse" => PastBudget::Refuse,
        "flag" => PastBudget::Flag,
        other => {
            return Err(PolicyError::field(
                "artifacts.past_budget",
                format!("`{other}` is not a choice (use \"refuse\" or \"flag\")"),
            ))
        }
    };
    Ok(ArtifactRules {
        max_file_bytes: size_field("artifacts.max_file_bytes", &f.max_file_bytes, 100 << 20)?,
        max_total_bytes: size_field("artifacts.max_total_bytes", &f.max_total_bytes, 1 << 30)?,
        max_files,
        max_entries,
        max_dir_entries,
        max_depth,
        max_name_bytes,
        allowed_extensions,
        formula_cells,
        input_hash_max_bytes: size_field("artifacts.input_hash_max_bytes", &f.input_hash_max_bytes, 256 << 20)?,
        past_budget,
    })
}

/// Extensions admitted when a policy gives no `artifacts.allowed_extensions`.
pub(crate) const DEFAULT_EXTENSIONS: &[&str] = &[
    "csv", "tsv", "txt", "md", "json", "jsonl", "xml", "yaml", "yml", "log", "html", "svg", "png", "jpg", "jpeg", "gif", "webp",
    "pdf", "xlsx", "pptx", "docx", "parquet",
];

fn validate_environment(f: &EnvironmentFile) -> Result<Environment, PolicyError> {
    for (k, v) in &f.set {
        if !crate::envs::valid_name(k) {
            return Err(PolicyError::field(&format!("environment.set.{k}"), "is not a valid variable name"));
        }
        if v.contains('\0') {
            return Err(PolicyError::field(&format!("environment.set.{k}"), "contains a NUL byte"));
        }
    }
    for (i, k) in f.pass.iter().enumerate() {
        if !crate::envs::valid_name(k) {
            return Err(PolicyError::field(&format!("environment.pass[{i}]"), format!("`{k}` is not a valid variable name")));
        }
    }
    Ok(Environment { set: f.set.clone(), pass: f.pass.clone() })
}

/// `/tmp` with `filesystem.tmp_size: "auto"` (the default): half the
/// memory limit, at least 64 MiB; 1 GiB without a memory limit. Its pages
/// count against the run's memory (a memory cgroup counts tmpfs pages;
/// without one, limits.rs shrinks the tmpfs mounts to fit), so data work
/// can spill a file the size of half its memory (numpy's own tests write
/// 32-64 MiB temp files). Pure.
pub(crate) fn auto_tmp_size(memory: Option<u64>) -> u64 {
    match memory {
        Some(m) => (m / 2 / 4096 * 4096).max(64 << 20),
        None => 1 << 30,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_names_dotted_modules_and_nothing_else() {
        let p = Policy::from_json(r#"{"version":1,"preload":["numpy","matplotlib.pyplot","_x1"]}"#, Path::new("/")).unwrap();
        assert_eq!(p.preload, ["numpy", "matplotlib.pyplot", "_x1"]);
        for bad in [
            r#""""#,
            r#""os; import x""#,
            r#""a..b""#,
            r#""1abc""#,
            r#"".hidden""#,
            r#""a b""#,
        ] {
            let err = Policy::from_json(&format!(r#"{{"version":1,"preload":[{bad}]}}"#), Path::new("/")).unwrap_err();
            assert!(err.to_string().contains("preload[0]"), "{bad}: {err}");
        }
        let many = vec!["\"m\""; MAX_PRELOAD + 1].join(",");
        let err = Policy::from_json(&format!(r#"{{"version":1,"preload":[{many}]}}"#), Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("preload"), "{err}");
        // An absent or empty list leaves the policy's hash as it was.
        let a = Policy::from_json(r#"{"version":1}"#, Path::new("/")).unwrap();
        let b = Policy::from_json(r#"{"version":1,"preload":[]}"#, Path::new("/")).unwrap();
        assert_eq!(a.hash, b.hash);
    }

    #[test]
    fn session_times_default_and_are_checked() {
        let p = Policy::from_json(r#"{"version":1}"#, Path::new("/")).unwrap();
        assert_eq!(p.session.interrupt_grace, Duration::from_secs(2));
        assert_eq!(p.session.idle_timeout, Duration::from_secs(600));
        assert_eq!(p.session.max_lifetime, Duration::from_secs(3600));
        for (json, field) in [
            (r#"{"interrupt_grace_secs":0}"#, "session.interrupt_grace_secs"),
            (r#"{"idle_timeout_secs":-1}"#, "session.idle_timeout_secs"),
            (r#"{"max_lifetime_secs":100000}"#, "session.max_lifetime_secs"),
            (r#"{"idle_timeout_secs":20,"max_lifetime_secs":10}"#, "session.idle_timeout_secs"),
        ] {
            let err = Policy::from_json(&format!(r#"{{"version":1,"session":{json}}}"#), Path::new("/")).unwrap_err();
            assert!(err.to_string().contains(field), "{json}: {err}");
        }
        // An absent section leaves the policy's hash as it was.
        let a = Policy::from_json(r#"{"version":1}"#, Path::new("/")).unwrap();
        let b = Policy::from_json(r#"{"version":1,"session":{}}"#, Path::new("/")).unwrap();
        assert_eq!(a.hash, b.hash);
    }

    #[test]
    fn an_allowlist_policy_sends_inet_sockets_to_the_supervisor_and_refuses_other_families() {
        let p = Policy::from_json(r#"{"version":1,"network":{"mode":"allowlist","hosts":["api.example.org"]}}"#, Path::new("/"))
            .unwrap();
        let verdict = |fam: u64, ty: u64| p.seccomp.evaluate_named("socket", [fam, ty, 0, 0, 0, 0]).map(|v| v.action);
        let allow = Some(crate::seccomp::Action::Allow);
        // Counted refusals: the supervisor sees each and lets the TCP ones
        // through (seccomp::Tally::answer).
        let to_supervisor =
            Some(crate::seccomp::Action::Errno { errno: libc::EPERM, report: crate::seccomp::model::Report::Counted });
        assert_eq!(verdict(libc::AF_INET as u64, (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64), to_supervisor);
        assert_eq!(verdict(libc::AF_INET6 as u64, libc::SOCK_DGRAM as u64), to_supervisor);
        assert_eq!(verdict(libc::AF_UNIX as u64, libc::SOCK_DGRAM as u64), allow);
        assert_ne!(verdict(libc::AF_NETLINK as u64, libc::SOCK_RAW as u64), allow);
        assert_ne!(verdict(libc::AF_PACKET as u64, libc::SOCK_RAW as u64), allow);
        // The default policy keeps refusing AF_INET altogether.
        let d = Policy::builtin_default().unwrap();
        assert_ne!(
            d.seccomp
                .evaluate_named("socket", [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0])
                .map(|v| v.action),
            allow
        );
    }

    #[test]
    fn builtin_default_policy_validates() {
        let p = Policy::builtin_default().unwrap();
        assert_eq!(p.identity.uid, 1000);
        assert_eq!(p.network, Network::None);
        // No rootfs path: an installed binary looks it up (locate.rs).
        assert!(p.rootfs.is_none());
        assert_eq!(p.source, BUILTIN_SOURCE);
    }

    #[test]
    fn unknown_field_is_rejected_with_its_path() {
        let err = Policy::from_json(r#"{"version":1,"limits":{"wall_time":3}}"#, Path::new("/")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("limits"), "{msg}");
        assert!(msg.contains("unknown field `wall_time`"), "{msg}");
    }

    #[test]
    fn wrong_version_names_the_field() {
        let err = Policy::from_json(r#"{"version":2}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().starts_with("policy field `version`"), "{err}");
    }

    #[test]
    fn root_host_uid_ranges_that_hold_root_are_refused_and_the_old_field_names_the_new() {
        let err = Policy::from_json(r#"{"version":1,"identity":{"root_host_uids":{"first":0,"count":5}}}"#, Path::new("/"))
            .unwrap_err();
        assert!(err.to_string().contains("identity.root_host_uids") && err.to_string().contains("root"), "{err}");
        let err = Policy::from_json(r#"{"version":1,"identity":{"root_host_gid":0}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("identity.root_host_gid"), "{err}");
        let err = Policy::from_json(r#"{"version":1,"identity":{"root_host_uid":65534}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("replaced by identity.root_host_uids"), "{err}");
        let p = Policy::from_json(r#"{"version":1,"identity":{"root_host_uids":{"first":200000,"count":8}}}"#, Path::new("/"))
            .unwrap();
        assert_eq!(p.identity.root_host_uids, crate::hostuid::UidRange { first: 200_000, count: 8 });
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("abc").is_err());
    }

    #[test]
    fn relative_rootfs_is_taken_from_the_policy_folder() {
        let p = Policy::from_json(r#"{"version":1,"rootfs":"../r"}"#, Path::new("/etc/jail")).unwrap();
        assert_eq!(p.rootfs.unwrap(), PathBuf::from("/etc/jail/../r"));
    }

    #[test]
    fn bad_network_mode_names_the_field() {
        let err = Policy::from_json(r#"{"version":1,"network":{"mode":"host"}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("network.mode"), "{err}");
    }

    #[test]
    fn limits_parse_with_units_defaults_and_unlimited() {
        let p = Policy::from_json(
            r#"{"version":1,"limits":{"memory":"64M","cpus":0.5,"pids":"32","cpu_time_secs":2.5,"file_size":"unlimited",
                "open_files":64,"enforcement":{"memory":"required","cpus":"best_effort"},"cgroup_parent":"/jail.slice"},
                "filesystem":{"output_size":"8M"}}"#,
            Path::new("/"),
        )
        .unwrap();
        let l = &p.limits;
        assert_eq!(l.memory, Some(64 << 20));
        assert_eq!(l.cpus, Some(0.5));
        assert_eq!(l.pids, Some(32));
        assert_eq!(l.cpu_time, Some(Duration::from_millis(2500)));
        assert_eq!(l.file_size, None);
        assert_eq!(l.open_files, 64);
        assert_eq!(l.enforcement.memory, Enforcement::Required);
        assert_eq!(l.enforcement.pids, Enforcement::BestEffort);
        assert_eq!(l.cgroup_parent, Some(PathBuf::from("/jail.slice")));
        assert_eq!(p.filesystem.output_size, Some(8 << 20));
        // Absent: the reference recipe's values; CPU time bounded by the wall.
        let d = Policy::from_json(r#"{"version":1}"#, Path::new("/")).unwrap().limits;
        assert_eq!((d.memory, d.cpus, d.pids, d.cpu_time), (Some(512 << 20), Some(1.0), Some(128), None));
        let u = Policy::from_json(
            r#"{"version":1,"limits":{"memory":"unlimited","cpus":"unlimited","pids":"unlimited"}}"#,
            Path::new("/"),
        )
        .unwrap()
        .limits;
        assert_eq!((u.memory, u.cpus, u.pids), (None, None, None));
    }

    #[test]
    fn bad_limits_name_their_field() {
        for (json, field) in [
            (r#"{"memory":"1M"}"#, "limits.memory"),
            (r#"{"memory":"lots"}"#, "limits.memory"),
            (r#"{"cpus":0}"#, "limits.cpus"),
            (r#"{"cpus":"many"}"#, "limits.cpus"),
            (r#"{"pids":1}"#, "limits.pids"),
            (r#"{"pids":2.5}"#, "limits.pids"),
            (r#"{"cpu_time_secs":-1}"#, "limits.cpu_time_secs"),
            (r#"{"open_files":3}"#, "limits.open_files"),
            (r#"{"enforcement":{"memory":"always"}}"#, "limits.enforcement.memory"),
            (r#"{"enforcement":{"wall_time":"required"}}"#, "limits.enforcement.wall_time"),
            (r#"{"cgroup_parent":"../x"}"#, "limits.cgroup_parent"),
            (r#"{"systemd_delegation":"yes"}"#, "limits.systemd_delegation"),
            (r#"{"swap":0}"#, "limits"),
        ] {
            let err = Policy::from_json(&format!(r#"{{"version":1,"limits":{json}}}"#), Path::new("/")).unwrap_err();
            assert!(err.to_string().contains(field), "{json}: {err}");
        }
    }

    #[test]
    fn accepted_policies_round_trip_and_rejected_ones_are_reported() {
        let base = Path::new("/");
        assert!(check_round_trip(DEFAULT_POLICY_JSON, base).unwrap());
        assert!(check_round_trip(
            r#"{"version":1,"limits":{"wall_time_secs":0.1,"stdout_bytes":"64k"},"landlock":{"mode":"required","min_abi":2}}"#,
            base
        )
        .unwrap());
        assert!(!check_round_trip(r#"{"version":1,"limits":{"wall_time_secs":0}}"#, base).unwrap());
        // Under 1 ms a time limit would be a zero Duration: refused, not a limit already past.
        assert!(!check_round_trip(r#"{"version":1,"limits":{"wall_time_secs":1e-15}}"#, base).unwrap());
        assert!(!check_round_trip(r#"{"version":1,"limits":{"cpu_time_secs":0.0001}}"#, base).unwrap());
        assert!(!check_round_trip(r#"{"version":1,"session":{"interrupt_grace_secs":1e-9}}"#, base).unwrap());
        assert!(!check_round_trip("\u{0}{", base).unwrap());
        // The corpus the fuzzer starts from must round-trip too.
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/policy_loader");
        if let Ok(dir) = std::fs::read_dir(&corpus) {
            for e in dir.flatten() {
                let text = String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned();
                check_round_trip(&text, base).unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            }
        }
    }

    #[test]
    fn command_line_overrides_replace_limits_and_name_the_flag() {
        let mut p = Policy::builtin_default().unwrap();
        let o = Overrides {
            memory: Some("1G".into()),
            cpus: Some("unlimited".into()),
            pids: Some("64".into()),
            cpu_time: Some("3".into()),
            cgroup_parent: Some("/x".into()),
            no_systemd_delegation: true,
        };
        assert!(p.limits.systemd_delegation, "on by default");
        p.apply_overrides(&o).unwrap();
        assert!(!p.limits.systemd_delegation);
        assert_eq!(p.limits.memory, Some(1 << 30));
        assert_eq!(p.limits.cpus, None);
        assert_eq!(p.limits.pids, Some(64));
        assert_eq!(p.limits.cpu_time, Some(Duration::from_secs(3)));
        assert_eq!(p.limits.cgroup_parent, Some(PathBuf::from("/x")));
        for (o, flag) in [
            (Overrides { memory: Some("12Q".into()), ..Default::default() }, "--memory"),
            (Overrides { cpus: Some("0".into()), ..Default::default() }, "--cpus"),
            (Overrides { pids: Some("x".into()), ..Default::default() }, "--pids"),
            (Overrides { cpu_time: Some("0".into()), ..Default::default() }, "--cpu-time"),
            (Overrides { cgroup_parent: Some("rel".into()), ..Default::default() }, "--cgroup-parent"),
        ] {
            let err = p.clone().apply_overrides(&o).unwrap_err();
            assert!(err.starts_with(flag), "{err}");
        }
    }

    #[test]
    fn artifact_rules_default_and_name_their_fields() {
        let p = Policy::from_json(r#"{"version":1}"#, Path::new("/")).unwrap();
        assert_eq!(p.artifacts.max_depth, 16);
        assert_eq!(p.artifacts.formula_cells, FormulaCells::Neutralise);
        assert!(p.artifacts.allowed_extensions.allows("csv"));
        assert!(!p.artifacts.allowed_extensions.allows("exe"));
        let err = Policy::from_json(r#"{"version":1,"artifacts":{"formula_cells":"strip"}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("artifacts.formula_cells"), "{err}");
        assert_eq!(p.artifacts.past_budget, PastBudget::Refuse);
        let flag = Policy::from_json(r#"{"version":1,"artifacts":{"past_budget":"flag"}}"#, Path::new("/")).unwrap();
        assert_eq!(flag.artifacts.past_budget, PastBudget::Flag);
        let err = Policy::from_json(r#"{"version":1,"artifacts":{"past_budget":"skip"}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("artifacts.past_budget"), "{err}");
        let err = Policy::from_json(r#"{"version":1,"artifacts":{"max_depth":0}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("artifacts.max_depth"), "{err}");
        let err =
            Policy::from_json(r#"{"version":1,"artifacts":{"allowed_extensions":["csv",".png"]}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("artifacts.allowed_extensions[1]"), "{err}");
        let err = Policy::from_json(r#"{"version":1,"artifacts":{"max_files":5,"max_entries":2}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("artifacts.max_files"), "{err}");
        let err = Policy::from_json(r#"{"version":1,"artifacts":{"max_size":5}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("unknown field `max_size`"), "{err}");
        let p =
            Policy::from_json(r#"{"version":1,"artifacts":{"allowed_extensions":["*"],"formula_cells":"flag"}}"#, Path::new("/"))
                .unwrap();
        assert_eq!(p.artifacts.allowed_extensions, Extensions::Any);
        assert_eq!(p.artifacts.formula_cells, FormulaCells::Flag);
        let err = Policy::from_json(r#"{"version":1,"artifacts":{"formula_cells":"sanitize"}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("neutralise"), "{err}");
    }

    #[test]
    fn allowlist_parses_with_defaults_and_matches_subdomains_not_the_apex() {
        let p = Policy::from_json(
            r#"{"version":1,"network":{"mode":"allowlist","hosts":["API.example.org","*.data.example.net"]}}"#,
            Path::new("/"),
        )
        .unwrap();
        let Network::Allowlist(a) = &p.network else { panic!("{:?}", p.network) };
        assert_eq!(a.ports, vec![443, 80]);
        assert_eq!((a.max_bytes, a.max_connections), (64 << 20, 64));
        assert!(a.allows_host("api.example.org"));
        assert!(!a.allows_host("x.api.example.org"));
        assert!(!a.allows_host("example.org"));
        assert!(a.allows_host("eu.data.example.net"));
        assert!(a.allows_host("a.b.data.example.net"));
        assert!(!a.allows_host("data.example.net"));
        assert!(!a.allows_host("evildata.example.net"));
        assert!(!a.allows_host("data.example.net.evil.org"));
        assert!(a.allows_port(443) && !a.allows_port(22));
    }

    #[test]
    fn bad_allowlists_name_their_field() {
        for (json, field) in [
            (r#"{"mode":"allowlist"}"#, "network.hosts"),
            (r#"{"mode":"allowlist","hosts":[]}"#, "network.hosts"),
            (r#"{"mode":"allowlist","hosts":["ok.org","10.0.0.1"]}"#, "network.hosts[1]"),
            (r#"{"mode":"allowlist","hosts":["a..b"]}"#, "network.hosts[0]"),
            (r#"{"mode":"allowlist","hosts":["*.org"]}"#, "network.hosts[0]"),
            (r#"{"mode":"allowlist","hosts":["a.*.org"]}"#, "network.hosts[0]"),
            (r#"{"mode":"allowlist","hosts":["a.org"],"ports":[]}"#, "network.ports"),
            (r#"{"mode":"allowlist","hosts":["a.org"],"ports":[443,0]}"#, "network.ports[1]"),
            (r#"{"mode":"allowlist","hosts":["a.org"],"ports":[70000]}"#, "network.ports"),
            (r#"{"mode":"allowlist","hosts":["a.org"],"max_bytes":0}"#, "network.max_bytes"),
            (r#"{"mode":"allowlist","hosts":["a.org"],"max_connections":0}"#, "network.max_connections"),
            (r#"{"mode":"none","hosts":["a.org"]}"#, "network.hosts"),
            (r#"{"mode":"none","ports":[80]}"#, "network.ports"),
            (r#"{"mode":"allowlist","hosts":["a.org"],"proxy":1}"#, "network"),
        ] {
            let err = Policy::from_json(&format!(r#"{{"version":1,"network":{json}}}"#), Path::new("/")).unwrap_err();
            assert!(err.to_string().contains(field), "{json}: {err}");
        }
    }

    #[test]
    fn the_allowlist_example_policy_validates_to_an_allowlist() {
        let p = Policy::load(&Path::new(DEFAULT_POLICY_DIR).join("allowlist-example.json")).unwrap();
        let Network::Allowlist(a) = &p.network else { panic!("{:?}", p.network) };
        assert!(a.allows_host("api.example.org") && a.allows_host("eu.data.example.net"));
        assert!(!a.allows_host("data.example.net") && !a.allows_host("example.org"));
    }

    #[test]
    fn the_default_policy_hash_does_not_see_the_new_network_fields() {
        // Absent allowlist fields are not written, so `none` policies keep
        // the hash they had before the allowlist existed.
        let file = parse_file(r#"{"version":1,"network":{"mode":"none"}}"#).unwrap();
        assert_eq!(serde_json::to_value(&file.network).unwrap(), serde_json::json!({"mode": "none"}));
    }

    #[test]
    fn an_allowlist_policy_with_its_own_seccomp_section_must_send_inet_sockets_to_the_supervisor() {
        // The default's own section: AF_UNIX allowed, every other family a
        // counted EPERM, which is what the supervisor's TCP check needs.
        let mut file: serde_json::Value = serde_json::from_str(DEFAULT_POLICY_JSON).unwrap();
        file["network"] = serde_json::json!({"mode": "allowlist", "hosts": ["api.example.org"]});
        // The same section with its two socket rules replaced.
        let with_socket_rules = |rules: serde_json::Value| {
            let mut f = file.clone();
            let list = f["seccomp"]["rules"].as_array_mut().unwrap();
            list.retain(|r| r["syscalls"] != serde_json::json!(["socket"]));
            list.extend(rules.as_array().unwrap().iter().cloned());
            Policy::from_json(&f.to_string(), Path::new("/"))
        };
        let family = |fam: &str, action: serde_json::Value| serde_json::json!({"syscalls": ["socket"], "action": action, "when": [{"arg": 0, "op": "eq", "value": fam}], "why": "test"});
        let counted = serde_json::json!({"errno": "EPERM"});
        let unix = family("AF_UNIX", "allow".into());
        assert!(Policy::from_json(&file.to_string(), Path::new("/")).is_ok());
        assert!(with_socket_rules(serde_json::json!([
            unix,
            family("AF_INET", counted.clone()),
            family("AF_INET6", counted.clone())
        ]))
        .is_ok());
        // Allowing AF_INET outright would let UDP and raw sockets through.
        let e =
            with_socket_rules(serde_json::json!([unix, family("AF_INET", "allow".into()), family("AF_INET6", counted.clone())]))
                .unwrap_err()
                .to_string();
        assert!(e.contains("seccomp.rules[") && e.contains("AF_INET"), "{e}");
        // Refusing it without a report would leave the proxy unreachable.
        let silent = serde_json::json!({"errno": "EPERM", "report": false});
        let e = with_socket_rules(serde_json::json!([unix, family("AF_INET", counted), family("AF_INET6", silent)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("AF_INET6") && e.contains("report"), "{e}");
    }

    #[test]
    fn a_socket_rule_that_allows_by_type_alone_is_refused_in_either_network_mode() {
        // Without a family condition, `arg 1 eq SOCK_DGRAM` allows UDP on
        // AF_INET: the family check must probe more than one type.
        let mut file: serde_json::Value = serde_json::from_str(DEFAULT_POLICY_JSON).unwrap();
        let list = file["seccomp"]["rules"].as_array_mut().unwrap();
        list.retain(|r| r["syscalls"] != serde_json::json!(["socket"]));
        // (Alone: the model refuses a second rule on another argument.)
        list.push(serde_json::json!({"syscalls": ["socket"], "action": "allow",
            "when": [{"arg": 1, "op": "eq", "value": libc::SOCK_DGRAM}], "why": "test"}));
        for network in [
            serde_json::json!({"mode": "none"}),
            serde_json::json!({"mode": "allowlist", "hosts": ["api.example.org"]}),
        ] {
            file["network"] = network;
            let e = Policy::from_json(&file.to_string(), Path::new("/")).unwrap_err().to_string();
            assert!(e.contains("seccomp.rules[") && e.contains("allows socket()"), "{e}");
        }
    }

    #[test]
    fn a_policy_without_a_seccomp_section_gets_the_default_allowlist() {
        let p = Policy::from_json(r#"{"version":1}"#, Path::new("/")).unwrap();
        assert_eq!(p.seccomp, Policy::builtin_default().unwrap().seccomp);
        assert_eq!(p.landlock.enforcement, crate::landlock::Enforcement::BestEffort);
    }

    #[test]
    fn malformed_json_is_an_error_not_a_panic() {
        assert!(Policy::from_json("{", Path::new("/")).is_err());
        assert!(Policy::from_json("[]", Path::new("/")).is_err());
    }
}
