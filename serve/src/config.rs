//! What the server is given at start: its flags and the tenants file.
//! Both are checked before it listens; a bad one stops it with one line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Bytes of the tenants file read at most.
const MAX_TENANTS_FILE_BYTES: u64 = 1 << 20;

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on, e.g. 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// The tenants file: JSON, one entry per bearer token (see README "As a service").
    #[arg(long, value_name = "FILE")]
    pub tokens: PathBuf,
    /// Runs in flight on this node at most, all tenants together; beyond it, 429.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_runs: usize,
    /// Largest request body in bytes, for any tenant.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Folder for the tenants' work folders (default: a fresh one in $TMPDIR,
    /// removed when the server exits, even by SIGKILL).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Policy file passed to every run (default: the built-in policy).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Root filesystem folder passed to every run (default: jail's lookup,
    /// by --rootfs-name).
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// The rootfs jail looks up by name when --rootfs is not given: `data`,
    /// `minimal` (default: `data` where one is built, else `minimal`).
    #[arg(long = "rootfs-name", value_name = "NAME")]
    pub rootfs_name: Option<String>,
    /// Seconds a SIGTERM waits for in-flight runs before the server exits anyway.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub drain_secs: u64,
    /// Jails the warm pool keeps made ahead (a `jail pool` child; 0: every
    /// run is a `jail run` of its own). Each idle jail holds an interpreter
    /// with the policy's preload imported (`jail_pool_idle_rss_bytes`).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u8).range(0..=64))]
    pub pool_size: u8,
    /// Memory of each pooled jail in MiB: runs whose memory limit (asked,
    /// or their tenant's most) is this go to the pool, others to `jail run`.
    #[arg(long, value_name = "MIB", default_value_t = 512, value_parser = clap::value_parser!(u64).range(16..))]
    pub pool_memory: u64,
    /// Do not nest the server's cgroup. By default, when its own cgroup is
    /// a cgroup v2 it may write, offering memory, pids and cpu and holding
    /// no other process, the server moves itself and its janitor into a
    /// new leaf `<own>/serve` and gives every run, session and pooled jail
    /// a cgroup of its own beneath `<own>/runs` (`--cgroup-parent`),
    /// removed again at exit; when it cannot, it says why once and each
    /// run finds its cgroup as `jail run` does. `/metrics`
    /// `jail_run_cgroups{mode}` and `/readyz` say which.
    #[arg(long)]
    pub no_nest_cgroup: bool,
    /// Open HTTP connections at most, all clients together; one over it is
    /// closed as it is accepted. Lowered at start to what the open-files
    /// limit leaves once every run has its descriptors.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Connections that have not yet sent a request with a valid token, at
    /// most; a new one past it closes the oldest of them (once that one has
    /// been open 2 s: fresh clients are not closed for each other).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_unauthenticated: u64,
    /// Seconds a connection has to send a request's whole header, counted
    /// from its accept or from the end of its previous reply (hyper's
    /// header read timeout): a slow header is closed.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a connection with no request in flight may stay silent
    /// (nothing received) before it is closed; above --header-timeout it
    /// changes nothing.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub idle_timeout: f64,
    /// Seconds a reply (an event stream, an artifact, a result) may wait
    /// for the client to take its next bytes before the connection is
    /// closed; an event stream is reopened with `?from=N`.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub send_timeout: f64,
    /// Seconds a request's body may take to arrive; past it, 408.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub body_timeout: f64,
}

/// The connection timeouts, checked.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
    pub send: Duration,
    pub body: Duration,
}

impl ServeArgs {
    /// The timeouts, each at least 1 ms and at most a day.
    pub fn timeouts(&self) -> Result<Timeouts, ConfigError> {
        let check = |flag: &str, secs: f64| {
            jail::seconds::limit(secs, jail::seconds::MOST).ok_or_else(|| {
                ConfigError::Flag(flag.into(), format!("give seconds {}", jail::seconds::range(jail::seconds::MOST)))
            })
        };
        Ok(Timeouts {
            header: check("--header-timeout", self.header_timeout)?,
            idle: check("--idle-timeout", self.idle_timeout)?,
            send: check("--send-timeout", self.send_timeout)?,
            body: check("--body-timeout", self.body_timeout)?,
        })
    }
}

/// One tenant as the tokens file gives it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    /// A name for logs and metrics (letters, digits, `-`, `_`).
    pub name: String,
    /// The bearer token (at least 16 characters).
    pub token: String,
    /// Runs in flight at most.
    #[serde(default = "default_runs")]
    pub max_runs: usize,
    /// Sessions open at most.
    #[serde(default = "default_sessions")]
    pub max_sessions: usize,
    /// Bytes of one request body at most.
    #[serde(default = "default_bytes_in")]
    pub max_bytes_in: usize,
    /// The longest wall-clock limit a run may ask for, in seconds.
    #[serde(default = "default_timeout")]
    pub max_timeout_secs: f64,
    /// The most memory a run may ask for, in MiB.
    #[serde(default = "default_memory")]
    pub max_memory_mib: u64,
    /// Requests in flight at most (event streams and artifact replies
    /// included, until their last byte is sent); beyond it, 429.
    #[serde(default = "default_requests")]
    pub max_requests: usize,
    /// Event streams (`GET /v1/runs/{id}/events`) open at most.
    #[serde(default = "default_streams")]
    pub max_streams: usize,
    /// Replies of a file's bytes in flight at most (an artifact's, a live
    /// session file's): this token's share of the service's read budget,
    /// which no other token's replies touch.
    #[serde(default = "default_artifact_reads")]
    pub max_artifact_reads: usize,
    /// Bytes kept for this token's finished runs (their events, results
    /// and artifacts on disk, and what the server holds of each in
    /// memory); past it the oldest finished run is forgotten, as past the
    /// last 64 runs.
    #[serde(default = "default_kept_bytes")]
    pub max_kept_bytes: u64,
}

fn default_runs() -> usize {
    4
}
fn default_sessions() -> usize {
    2
}
fn default_bytes_in() -> usize {
    1 << 20
}
fn default_timeout() -> f64 {
    30.0
}
fn default_memory() -> u64 {
    512
}
fn default_requests() -> usize {
    16
}
fn default_streams() -> usize {
    4
}
fn default_artifact_reads() -> usize {
    2
}
fn default_kept_bytes() -> u64 {
    256 << 20
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tenants: Vec<TenantFile>,
}

/// A checked tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub max_runs: usize,
    pub max_sessions: usize,
    pub max_bytes_in: usize,
    pub max_timeout: Duration,
    pub max_memory_mib: u64,
    pub max_requests: usize,
    pub max_streams: usize,
    pub max_artifact_reads: usize,
    pub max_kept_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the tokens file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("the tokens file {0} is larger than {MAX_TENANTS_FILE_BYTES} bytes")]
    TooLarge(PathBuf),
    #[error("the tokens file {0}: {1} (expected {{\"tenants\": [{{\"name\", \"token\", ...}}]}})")]
    Parse(PathBuf, String),
    #[error("the tokens file {0}: tenant {1:?}: {2}")]
    Tenant(PathBuf, String, String),
    #[error("{0}: {1}")]
    Flag(String, String),
}

/// Read and check the tokens file: token → tenant.
pub fn load_tenants(path: &Path) -> Result<BTreeMap<String, Tenant>, ConfigError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| ConfigError::Read(path.into(), e))?;
    let mut text = String::new();
    file.take(MAX_TENANTS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| ConfigError::Read(path.into(), e))?;
    if text.len() as u64 > MAX_TENANTS_FILE_BYTES {
        return Err(ConfigError::TooLarge(path.into()));
    }
    let parsed: TokensFile = serde_json::from_str(&text).map_err(|e| ConfigError::Parse(path.into(), e.to_string()))?;
    let mut tenants = BTreeMap::new();
    for t in parsed.tenants {
        let bad = |why: &str| ConfigError::Tenant(path.into(), t.name.clone(), why.into());
        if t.name.is_empty() || !t.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(bad("`name` must be letters, digits, `-` or `_`"));
        }
        if t.token.len() < 16 {
            return Err(bad("`token` must be at least 16 characters"));
        }
        if jail::seconds::limit(t.max_timeout_secs, jail::seconds::MOST).is_none() {
            return Err(bad(&format!("`max_timeout_secs` must be {}", jail::seconds::range(jail::seconds::MOST))));
        }
        if t.max_memory_mib < 16 {
            return Err(bad("`max_memory_mib` must be at least 16"));
        }
        if t.max_requests == 0 || t.max_streams == 0 || t.max_artifact_reads == 0 {
            return Err(bad("`max_requests`, `max_streams` and `max_artifact_reads` must be at least 1"));
        }
        let tenant = Tenant {
            name: t.name.clone(),
            max_runs: t.max_runs,
            max_sessions: t.max_sessions,
            max_bytes_in: t.max_bytes_in,
            max_timeout: Duration::from_secs_f64(t.max_timeout_secs),
            max_memory_mib: t.max_memory_mib,
            max_requests: t.max_requests,
            max_streams: t.max_streams,
            max_artifact_reads: t.max_artifact_reads,
            max_kept_bytes: t.max_kept_bytes,
        };
        if tenants.values().any(|o: &Tenant| o.name == tenant.name) {
            return Err(bad("two tenants have this name"));
        }
        if tenants.insert(t.token.clone(), tenant).is_some() {
            return Err(bad("its token is another tenant's too"));
        }
    }
    Ok(tenants)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<BTreeMap<String, Tenant>, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        std::fs::write(&path, text).unwrap();
        load_tenants(&path)
    }

    #[test]
    fn a_tenant_gets_the_defaults() {
        let t = load(r#"{"tenants":[{"name":"a","token":"0123456789abcdef"}]}"#).unwrap();
        let a = &t["0123456789abcdef"];
        assert_eq!((a.max_runs, a.max_sessions, a.max_memory_mib), (4, 2, 512));
        assert_eq!((a.max_requests, a.max_streams, a.max_artifact_reads, a.max_kept_bytes), (16, 4, 2, 256 << 20));
    }

    #[test]
    fn short_tokens_unknown_fields_and_shared_tokens_are_refused() {
        assert!(load(r#"{"tenants":[{"name":"a","token":"short"}]}"#).unwrap_err().to_string().contains("16"));
        assert!(load(r#"{"tenants":[{"name":"a","token":"0123456789abcdef","x":1}]}"#)
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
        let two = r#"{"tenants":[{"name":"a","token":"0123456789abcdef"},{"name":"b","token":"0123456789abcdef"}]}"#;
        assert!(load(two).unwrap_err().to_string().contains("another tenant"));
    }
}
