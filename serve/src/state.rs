//! What the handlers share: tenants and what each holds now (runs in
//! flight, sessions, finished runs), each tenant's gates (requests,
//! streams, artifact replies in flight), the node's run slots, the drain
//! flag.
//!
//! What the server holds of a run in memory is bounded by construction:
//! its events and its result live in files in its folder (backend.rs
//! `EventLog`, runs.rs `record`), so a kept run costs the server a few
//! hundred bytes however much it printed; what a tenant keeps on disk is
//! bounded by its `max_kept_bytes` and the last `KEPT_RUNS` runs.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use tokio::sync::Semaphore;

use crate::api::ApiError;
use crate::backend::EventLog;
use crate::cancel::Cancel;
use crate::config::Tenant;
use crate::metrics::Metrics;

/// Finished runs a tenant keeps (their results, events and artifacts);
/// the oldest goes, folder and all, when a new one would pass it, or when
/// the tenant's kept bytes would pass its `max_kept_bytes`.
pub const KEPT_RUNS: usize = 64;

/// In a run's folder: its events, its result as the tenant sees it, and
/// the listing its artifacts are served from (0600, the server's).
pub const EVENTS_FILE: &str = ".events";
pub const RESULT_FILE: &str = ".result.json";
pub const LISTING_FILE: &str = ".artifacts.json";

/// What the server holds in memory for a kept run besides its id and
/// folder name, counted in its kept bytes (a generous round figure: the
/// `Run`, its log's counters and index, its map entry).
const RUN_MEMORY_BYTES: u64 = 1 << 10;

/// One run, started or finished.
pub struct Run {
    pub dir: PathBuf,
    pub log: Arc<EventLog>,
    /// How it ended: set before its log is finished (runs.rs, `record`).
    pub end: Mutex<End>,
    /// `pool` or `spawn`: where it runs (a run the pool could not start
    /// moves to `spawn`).
    pub backend: Mutex<&'static str>,
    /// Asked by `DELETE /v1/runs/{id}`, or by a waiting client that left.
    pub cancel: Arc<Cancel>,
}

/// Where a run is.
#[derive(Debug, Clone, Default)]
pub enum End {
    #[default]
    Running,
    /// It ended with a result document (whatever its status), in
    /// `RESULT_FILE` as the tenant sees it: `result_bytes` long, and
    /// `artifact_bytes` of accepted artifacts in its output folder.
    Done { result_bytes: u64, artifact_bytes: u64 },
    /// It ended without one: the error code and message.
    Failed { code: &'static str, message: String },
}

impl Run {
    pub fn new(dir: PathBuf, backend: &'static str) -> Run {
        Run {
            log: Arc::new(EventLog::create(dir.join(EVENTS_FILE))),
            dir,
            end: Mutex::default(),
            backend: Mutex::new(backend),
            cancel: Arc::default(),
        }
    }

    /// What keeping it costs: its events, result and artifacts on disk and
    /// what the server holds of it.
    pub fn kept_bytes(&self) -> u64 {
        let end = match self.end() {
            End::Running => 0,
            End::Done { result_bytes, artifact_bytes } => result_bytes.saturating_add(artifact_bytes),
            End::Failed { message, .. } => message.len() as u64,
        };
        RUN_MEMORY_BYTES + self.log.written().bytes + end
    }

    pub fn finished(&self) -> bool {
        !matches!(self.end(), End::Running)
    }

    pub fn backend(&self) -> &'static str {
        self.backend.lock().map(|b| *b).unwrap_or("spawn")
    }

    pub fn end(&self) -> End {
        self.end.lock().map(|e| e.clone()).unwrap_or_default()
    }

    pub fn set_end(&self, end: End) {
        if let Ok(mut e) = self.end.lock() {
            *e = end;
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one tenant holds now.
#[derive(Default)]
pub struct Holdings {
    pub runs_in_flight: usize,
    pub sessions: HashMap<String, Arc<crate::served::Served>>,
    runs: Kept<Arc<Run>>,
    /// Sessions ended by a DELETE: their closing result and folder, for
    /// their artifacts.
    ended: Kept<Arc<crate::served::Ended>>,
}

/// The last `KEPT_RUNS` of something a tenant made, by id; the oldest goes
/// first (and with it, by its Drop, its folder).
struct Kept<T> {
    by_id: HashMap<String, T>,
    order: VecDeque<String>,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept { by_id: HashMap::new(), order: VecDeque::new() }
    }
}

impl<T> Kept<T> {
    fn insert(&mut self, id: &str, value: T) {
        if self.by_id.insert(id.into(), value).is_none() {
            self.order.push_back(id.into());
        }
        while self.order.len() > KEPT_RUNS {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }

    fn get(&self, id: &str) -> Option<&T> {
        self.by_id.get(id)
    }

    /// Forget the oldest ones that `may_go` while the bytes kept are over
    /// `budget`; those that may not go (runs still running) stay. How many went.
    fn shed(&mut self, budget: u64, bytes: impl Fn(&T) -> u64, may_go: impl Fn(&T) -> bool) -> usize {
        let mut total: u64 = self.by_id.values().map(&bytes).fold(0, u64::saturating_add);
        let mut gone = 0;
        let mut i = 0;
        while total > budget && i < self.order.len() {
            let id = &self.order[i];
            match self.by_id.get(id) {
                Some(v) if may_go(v) => {
                    total = total.saturating_sub(bytes(v));
                    let id = id.clone();
                    self.by_id.remove(&id);
                    self.order.remove(i);
                    gone += 1;
                }
                Some(_) => i += 1,
                None => {
                    self.order.remove(i);
                }
            }
        }
        gone
    }

    fn len(&self) -> usize {
        self.by_id.len()
    }
}

pub struct AppState {
    pub tenants: BTreeMap<String, Tenant>,
    pub holdings: Mutex<HashMap<String, Holdings>>,
    /// Runs the pool cannot take, or all of them without a pool.
    pub spawn: crate::spawn::SpawnBackend,
    /// The warm pool (`--pool-size` above 0).
    pub pool: Option<Arc<crate::pool::Pool>>,
    pub work: PathBuf,
    /// Sessions' folders (a short path: their handles are unix sockets).
    pub sessions: PathBuf,
    pub jail: PathBuf,
    pub session_flags: Vec<std::ffi::OsString>,
    pub max_runs: usize,
    pub max_body: usize,
    pub body_timeout: std::time::Duration,
    pub in_flight: AtomicUsize,
    pub draining: AtomicBool,
    pub metrics: Arc<Metrics>,
    /// Each tenant's gates, by name.
    pub gates: HashMap<String, Gates>,
    /// Requests without a token (`/healthz`, `/readyz`, `/metrics`,
    /// `/openapi.json`) in flight, all clients together.
    pub anonymous: Arc<Semaphore>,
    /// The open HTTP connections (conn.rs), and their limits.
    pub conns: Arc<crate::conn::Table>,
    pub limits: crate::conn::Limits,
    pub max_connections: usize,
    /// Where the runs get their cgroups (nest.rs).
    pub run_cgroups: crate::nest::RunCgroups,
}

pub type Shared = Arc<AppState>;

/// Requests without a token in flight at most, all clients together.
pub const ANONYMOUS_REQUESTS: usize = 16;

/// What one tenant may have in flight at once: requests (until their
/// reply's last byte), event streams, artifact replies.
pub struct Gates {
    pub requests: Arc<Semaphore>,
    pub streams: Arc<Semaphore>,
    pub artifacts: Arc<Semaphore>,
}

impl Gates {
    pub fn of(tenant: &Tenant) -> Gates {
        Gates {
            requests: Arc::new(Semaphore::new(tenant.max_requests)),
            streams: Arc::new(Semaphore::new(tenant.max_streams)),
            artifacts: Arc::new(Semaphore::new(tenant.max_artifact_reads)),
        }
    }
}

/// Run slot held for a request; released on drop (also when the client
/// goes away mid-run).
pub struct Slot {
    state: Shared,
    tenant: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut h) = self.state.holdings.lock() {
            if let Some(t) = h.get_mut(&self.tenant) {
                t.runs_in_flight = t.runs_in_flight.saturating_sub(1);
            }
        }
    }
}

impl AppState {
    /// The tenant the request's bearer token names.
    pub fn tenant(&self, headers: &HeaderMap) -> Result<&Tenant, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let value = headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("no Authorization header: send `Authorization: Bearer TOKEN`"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("the Authorization header is not `Bearer TOKEN`"))?;
        // Every token is compared, in constant time each, so the time
        // taken does not tell how much of a guess was right.
        let mut found = None;
        for (known, tenant) in &self.tenants {
            if constant_time_eq(known.as_bytes(), token.as_bytes()) {
                found = Some(tenant);
            }
        }
        found.ok_or_else(|| unauthorized("unknown token: check the token the operator gave you"))
    }

    /// Refuse when draining, or when the node or the tenant is at its run limit.
    pub fn take_slot(self: &Arc<Self>, tenant: &Tenant) -> Result<Slot, ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::draining());
        }
        let mut h = self.holdings.lock().map_err(|_| ApiError::failed("state lock poisoned"))?;
        let mine = h.entry(tenant.name.clone()).or_default();
        if mine.runs_in_flight >= tenant.max_runs {
            self.metrics.limit_hit("tenant_runs", &tenant.name);
            return Err(ApiError::busy(format!(
                "this token has {} runs in flight, its most: wait for one to end",
                tenant.max_runs
            )));
        }
        let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
        if before >= self.max_runs {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.metrics.limit_hit("node_runs", &tenant.name);
            return Err(ApiError::busy("this node is full: retry after Retry-After seconds"));
        }
        mine.runs_in_flight += 1;
        Ok(Slot { state: Arc::clone(self), tenant: tenant.name.clone() })
    }

    /// The tenant's own work folder, 0700, made on first use.
    pub fn tenant_dir(&self, tenant: &Tenant) -> Result<PathBuf, ApiError> {
        let dir = self.work.join(&tenant.name);
        make_private_dir(&dir)?;
        Ok(dir)
    }

    /// Keep a run of the tenant's for its result, events and artifacts.
    pub fn keep_run(&self, tenant: &Tenant, id: &str, run: Arc<Run>) {
        let Ok(mut h) = self.holdings.lock() else { return };
        let mine = h.entry(tenant.name.clone()).or_default();
        mine.runs.insert(id, run);
        let gone = mine.runs.shed(tenant.max_kept_bytes, |r| r.kept_bytes(), |r| r.finished());
        (0..gone).for_each(|_| self.metrics.limit_hit("kept_bytes", &tenant.name));
    }

    /// A run of the tenant's ended: forget its oldest finished runs while
    /// what it keeps is over its `max_kept_bytes`.
    pub fn shed_runs(&self, tenant: &str, budget: u64) {
        let Ok(mut h) = self.holdings.lock() else { return };
        if let Some(mine) = h.get_mut(tenant) {
            let gone = mine.runs.shed(budget, |r| r.kept_bytes(), |r| r.finished());
            (0..gone).for_each(|_| self.metrics.limit_hit("kept_bytes", tenant));
        }
    }

    /// Each tenant's kept runs and their bytes (for `/metrics`).
    pub fn kept(&self) -> Vec<(String, usize, u64)> {
        let Ok(h) = self.holdings.lock() else { return Vec::new() };
        self.gates
            .keys()
            .map(|name| match h.get(name) {
                Some(t) => (name.clone(), t.runs.len(), t.runs.by_id.values().map(|r| r.kept_bytes()).sum()),
                None => (name.clone(), 0, 0),
            })
            .collect()
    }

    /// Keep an ended session of the tenant's for its artifacts.
    pub fn keep_ended(&self, tenant: &Tenant, id: &str, ended: Arc<crate::served::Ended>) {
        let Ok(mut h) = self.holdings.lock() else { return };
        let mine = h.entry(tenant.name.clone()).or_default();
        mine.ended.insert(id, ended);
    }

    /// The tenant's ended session `id`.
    pub fn ended_session(&self, tenant: &Tenant, id: &str) -> Result<Arc<crate::served::Ended>, ApiError> {
        let h = self.holdings.lock().map_err(|_| ApiError::failed("state lock poisoned"))?;
        h.get(&tenant.name)
            .and_then(|t| t.ended.get(id))
            .cloned()
            .ok_or_else(|| ApiError::not_found("ended session"))
    }

    /// How paths of the host are shown to a tenant in a run's result.
    pub fn view_of_run(&self, dir: &Path) -> crate::files::View {
        crate::files::View::of_run(dir, &[&self.work, &self.sessions, &self.jail])
    }

    /// How paths of the host are shown to a tenant in a session's results.
    pub fn view_of_session(&self, dir: &Path) -> crate::files::View {
        crate::files::View::of_session(dir, &[&self.work, &self.sessions, &self.jail])
    }

    /// The run `id` of the tenant named `tenant`.
    pub fn run_of(&self, tenant: &str, id: &str) -> Result<Arc<Run>, ApiError> {
        let h = self.holdings.lock().map_err(|_| ApiError::failed("state lock poisoned"))?;
        h.get(tenant).and_then(|t| t.runs.get(id)).cloned().ok_or_else(|| ApiError::not_found("run"))
    }

    /// The tenant's run `id`; another tenant's is not found either.
    pub fn run(&self, tenant: &Tenant, id: &str) -> Result<Arc<Run>, ApiError> {
        self.run_of(&tenant.name, id)
    }

    pub fn sessions_open(&self) -> usize {
        self.holdings.lock().map(|h| h.values().map(|t| t.sessions.len()).sum()).unwrap_or(0)
    }
}

/// The mode of a tenant's folders. 0700 when the server runs as an ordinary
/// user: its jails run as that uid too. As root, a jail runs as an
/// unprivileged host uid that must traverse to its own folder, so 0711:
/// nobody can list it, and the names below are unguessable ids.
pub fn private_mode() -> u32 {
    if nix::unistd::geteuid().is_root() {
        0o711
    } else {
        0o700
    }
}

/// The modes of a run's staged folder, its input's folders, and their
/// files (its `main.py` too): what the jail's uid must read. Every door
/// takes a script and an input only when the jail's own uid could read
/// them (jail/src/accept.rs: modes are never widened for it), and as root
/// that uid is an unprivileged host uid: the run's folder is 0711 (crossed,
/// never listed), its input 0755 and its files 0644. No other local user
/// is told where they are: nothing names the folder on a command line,
/// and its name is 128 random bits beneath folders nobody may list. As an
/// ordinary user the jail's uid is the server's: 0700 and 0600.
pub fn run_modes() -> (u32, u32, u32) {
    if nix::unistd::geteuid().is_root() {
        (0o711, 0o755, 0o644)
    } else {
        (0o700, 0o700, 0o600)
    }
}

pub fn make_private_dir(dir: &Path) -> Result<(), ApiError> {
    let mode = private_mode();
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => {
            eprintln!("jail serve: mkdir {}: {e}", dir.display());
            Err(ApiError::failed(format!("the service could not make a folder for this request: {e}")))
        }
    }
}

/// A run's folder (or its `input/`), in `mode` whatever the umask.
pub fn make_run_dir(dir: &Path, mode: u32) -> Result<(), ApiError> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)))
        .map_err(|e| {
            eprintln!("jail serve: mkdir {}: {e}", dir.display());
            ApiError::failed(format!("the service could not make a folder for this run: {e}"))
        })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 128 random bits, hex: an id nobody can guess.
pub fn new_id() -> Result<String, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::failed(format!("getrandom: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_holds_the_last_ones_and_a_second_insert_of_an_id_is_not_a_second_place() {
        let mut kept = Kept::default();
        for i in 0..KEPT_RUNS + 10 {
            kept.insert(&format!("r{i}"), i);
        }
        assert_eq!(kept.by_id.len(), KEPT_RUNS);
        assert!(kept.get("r9").is_none() && kept.get("r10") == Some(&10));
        // Replaced in place: the queue does not grow, so nothing newer goes.
        kept.insert("r10", 100);
        assert_eq!((kept.order.len(), kept.get("r10")), (KEPT_RUNS, Some(&100)));
        kept.insert("new", 0);
        assert!(kept.get("r10").is_none() && kept.get("r11").is_some() && kept.get("new").is_some());
    }

    #[test]
    fn kept_sheds_the_oldest_finished_ones_past_the_byte_budget() {
        // (bytes, finished)
        let mut kept = Kept::default();
        kept.insert("a", (40u64, true));
        kept.insert("b", (40, false));
        kept.insert("c", (40, true));
        kept.insert("d", (40, true));
        assert_eq!(kept.shed(100, |v| v.0, |v| v.1), 2);
        assert!(kept.get("a").is_none() && kept.get("c").is_none(), "the oldest finished ones go");
        assert!(kept.get("b").is_some(), "a running one stays, whatever its age");
        assert!(kept.get("d").is_some());
        assert_eq!(kept.order, ["b", "d"]);
        kept.shed(0, |v| v.0, |v| v.1);
        assert_eq!(kept.order, ["b"], "never the running one");
    }
}
