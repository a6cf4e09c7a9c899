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

/// The default policy shipped in `policies/default.json`, built in so the
/// binary works without `--policy`.
pub const DEFAULT_POLICY_JSON: &str = include_str!("../../policies/default.json");

/// Where relative paths in the built-in default policy are resolved from.
pub const DEFAULT_POLICY_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies");

/// The only policy format version this build understands.
pub const POLICY_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("policy field `{field}`: {message}")]
    Field { field: String, message: String },
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
pub struct PolicyFile {
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
    /// The syscall allowlist; absent means the built-in default policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<crate::seccomp::SeccompFile>,
    #[serde(default)]
    pub landlock: crate::landlock::LandlockFile,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IdentityFile {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub hostname: Option<String>,
    /// Host uid the sandbox maps to when the jail is run by root (never 0).
    pub root_host_uid: Option<u32>,
    pub root_host_gid: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentFile {
    /// Variables set to fixed values.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Names copied from the caller's environment when present.
    #[serde(default)]
    pub pass: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FilesystemFile {
    pub tmp_size: Option<Size>,
    pub shm_size: Option<Size>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    pub wall_time_secs: Option<f64>,
    pub stdout_bytes: Option<Size>,
    pub stderr_bytes: Option<Size>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    pub mode: Option<String>,
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

/// Parse `"512M"`, `"1G"`, `"64k"`, `"4096"` into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
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
    pub seccomp: crate::seccomp::Model,
    pub landlock: crate::landlock::Settings,
    /// sha256 of the policy's canonical JSON form, reported in every result.
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    pub root_host_uid: u32,
    pub root_host_gid: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Environment {
    pub set: BTreeMap<String, String>,
    pub pass: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Filesystem {
    pub tmp_size: u64,
    pub shm_size: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub wall_time: Duration,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// Network mode. Only `none` exists so far: a net namespace with loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    None,
}

impl Policy {
    /// Read, parse and validate a policy file; relative paths in it are taken
    /// from the file's own folder.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| PolicyError::Read { path: path.to_path_buf(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Policy::from_json(&text, base)
    }

    /// The built-in default policy.
    pub fn builtin_default() -> Result<Policy, PolicyError> {
        Policy::from_json(DEFAULT_POLICY_JSON, Path::new(DEFAULT_POLICY_DIR))
    }

    /// Parse and validate policy JSON; `base` resolves relative paths.
    pub fn from_json(text: &str, base: &Path) -> Result<Policy, PolicyError> {
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
        }
        let hash = crate::digest::sha256_hex(
            serde_json::to_string(&file).unwrap_or_default().as_bytes(),
        );
        let python = PathBuf::from(file.python.clone().unwrap_or_else(|| "/usr/bin/python3".into()));
        if !python.is_absolute() {
            return Err(PolicyError::field("python", "must be an absolute path inside the jail"));
        }
        let rootfs = file.rootfs.as_ref().map(|r| {
            let p = PathBuf::from(r);
            if p.is_absolute() { p } else { base.join(p) }
        });
        let identity = validate_identity(&file.identity)?;
        let environment = validate_environment(&file.environment)?;
        let filesystem = Filesystem {
            tmp_size: size_field("filesystem.tmp_size", &file.filesystem.tmp_size, 64 << 20)?,
            shm_size: size_field("filesystem.shm_size", &file.filesystem.shm_size, 16 << 20)?,
        };
        let wall = file.limits.wall_time_secs.unwrap_or(15.0);
        if !(wall > 0.0 && wall <= 86_400.0) {
            return Err(PolicyError::field(
                "limits.wall_time_secs",
                format!("is {wall}, must be above 0 and at most 86400"),
            ));
        }
        let limits = Limits {
            wall_time: Duration::from_secs_f64(wall),
            stdout_bytes: size_field("limits.stdout_bytes", &file.limits.stdout_bytes, 1 << 20)?,
            stderr_bytes: size_field("limits.stderr_bytes", &file.limits.stderr_bytes, 1 << 20)?,
        };
        let network = match file.network.mode.as_deref().unwrap_or("none") {
            "none" => Network::None,
            other => {
                return Err(PolicyError::field(
                    "network.mode",
                    format!("`{other}` is not a network mode this jail has (use \"none\")"),
                ))
            }
        };
        let seccomp = match &file.seccomp {
            Some(section) => crate::seccomp::Model::from_file(section, "seccomp")?,
            None => return Err(PolicyError::field("seccomp", "is missing, and so is the built-in default's")),
        };
        crate::seccomp::check_jail_needs(&seccomp)?;
        crate::seccomp::check_floor(&seccomp)?;
        match network {
            Network::None => crate::seccomp::check_network_none(&seccomp)?,
        }
        let landlock = crate::landlock::validate(&file.landlock)?;
        Ok(Policy {
            name: file.name.clone().unwrap_or_else(|| "unnamed".into()),
            rootfs,
            python,
            identity,
            environment,
            filesystem,
            limits,
            network,
            seccomp,
            landlock,
            hash,
        })
    }
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
pub fn parse_file(text: &str) -> Result<PolicyFile, PolicyError> {
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

fn validate_identity(f: &IdentityFile) -> Result<Identity, PolicyError> {
    let hostname = f.hostname.clone().unwrap_or_else(|| "jail".into());
    let valid_host = !hostname.is_empty()
        && hostname.len() <= 64
        && hostname.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !valid_host {
        return Err(PolicyError::field(
            "identity.hostname",
            "must be 1 to 64 letters, digits, dots or dashes",
        ));
    }
    let root_host_uid = f.root_host_uid.unwrap_or(65534);
    let root_host_gid = f.root_host_gid.unwrap_or(65534);
    if root_host_uid == 0 {
        return Err(PolicyError::field("identity.root_host_uid", "must not be 0: the sandbox never maps to host root"));
    }
    if root_host_gid == 0 {
        return Err(PolicyError::field("identity.root_host_gid", "must not be 0: the sandbox never maps to host root"));
    }
    Ok(Identity {
        uid: f.uid.unwrap_or(1000),
        gid: f.gid.unwrap_or(1000),
        hostname,
        root_host_uid,
        root_host_gid,
    })
}

fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn validate_environment(f: &EnvironmentFile) -> Result<Environment, PolicyError> {
    for (k, v) in &f.set {
        if !valid_env_name(k) {
            return Err(PolicyError::field(&format!("environment.set.{k}"), "is not a valid variable name"));
        }
        if v.contains('\0') {
            return Err(PolicyError::field(&format!("environment.set.{k}"), "contains a NUL byte"));
        }
    }
    for (i, k) in f.pass.iter().enumerate() {
        if !valid_env_name(k) {
            return Err(PolicyError::field(&format!("environment.pass[{i}]"), format!("`{k}` is not a valid variable name")));
        }
    }
    Ok(Environment { set: f.set.clone(), pass: f.pass.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_default_policy_validates() {
        let p = Policy::builtin_default().unwrap();
        assert_eq!(p.identity.uid, 1000);
        assert_eq!(p.network, Network::None);
        assert!(p.rootfs.is_some());
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
    fn root_host_uid_zero_is_refused() {
        let err = Policy::from_json(r#"{"version":1,"identity":{"root_host_uid":0}}"#, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("identity.root_host_uid"), "{err}");
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
    fn accepted_policies_round_trip_and_rejected_ones_are_reported() {
        let base = Path::new("/");
        assert!(check_round_trip(DEFAULT_POLICY_JSON, base).unwrap());
        assert!(check_round_trip(r#"{"version":1,"limits":{"wall_time_secs":0.1,"stdout_bytes":"64k"},"landlock":{"mode":"required","min_abi":2}}"#, base).unwrap());
        assert!(!check_round_trip(r#"{"version":1,"limits":{"wall_time_secs":0}}"#, base).unwrap());
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
