//! Where a run runs. `Backend` is the seam: `spawn::SpawnBackend` runs each
//! run as a `jail run --events` process of its own; `pool::Link` sends it to
//! the warm pool (one `jail pool` child, JSON lines). Either way each run's
//! supervisor is a process of its own, so a crashing run cannot take the
//! server down; `route` says which backend takes a run.
//!
//! A backend appends a run's events to its log as they come, all but the
//! last: the caller (runs.rs, `record`) stores how the run ended, then
//! appends its `result` event (or an `error` event) and finishes the log,
//! so a follower that has seen the last event finds the run ended.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::cancel::Cancel;

/// One run, staged: `dir/main.py`, `dir/input/` when there is input; the
/// jail's output folder is made in `dir` (spawn: a fresh one, TMPDIR;
/// pool: `dir/output`, handed over by rename).
#[derive(Debug, Clone)]
pub struct Job {
    /// The run's id (the pool's request id too).
    pub id: String,
    pub dir: PathBuf,
    pub input: Option<PathBuf>,
    pub timeout: Duration,
    pub memory_mib: u64,
}

/// A run's live events (NDJSON lines, as `jail run --events` prints them),
/// kept for `GET /v1/runs/{id}/events`; `done` once the last is in.
#[derive(Default)]
pub struct EventLog {
    lines: Mutex<(Vec<Arc<str>>, bool)>,
    pub changed: Notify,
}

impl EventLog {
    pub fn push(&self, line: &str) {
        if let Ok(mut l) = self.lines.lock() {
            if !l.1 {
                l.0.push(line.into());
            }
        }
        self.changed.notify_waiters();
    }
    /// No more lines; a second call changes nothing.
    pub fn finish(&self) {
        if let Ok(mut l) = self.lines.lock() {
            l.1 = true;
        }
        self.changed.notify_waiters();
    }
    /// Wait until the log is finished, at most `within`: whether it is.
    pub async fn wait_finished(&self, within: std::time::Duration) -> bool {
        let finished = crate::cancel::until(&self.changed, || self.since(usize::MAX).1);
        tokio::time::timeout(within, finished).await.is_ok() || self.since(usize::MAX).1
    }

    /// The lines from `from` on, and whether the log is complete.
    pub fn since(&self, from: usize) -> (Vec<Arc<str>>, bool) {
        match self.lines.lock() {
            Ok(l) => (l.0.get(from..).map(<[_]>::to_vec).unwrap_or_default(), l.1),
            Err(_) => (Vec::new(), true),
        }
    }
}

/// The event that ends a finished run's log, as `jail run --events` ends it.
pub fn result_event(result: &serde_json::Value) -> String {
    serde_json::json!({"type": "result", "result": result}).to_string()
}

/// The event that ends the log of a run that ended without a result.
pub fn error_event(code: &str, message: &str) -> String {
    serde_json::json!({"type": "error", "error": {"code": code, "message": message}}).to_string()
}

/// Finishes a run's log however the run's future ends (a client that went
/// away drops it mid-run): followers of `/events` are not left waiting.
pub struct FinishOnDrop(pub Arc<EventLog>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// A run that ended without a result document.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The jail or the pool failed to run it (a 500).
    #[error("{0}")]
    Failed(String),
    /// The warm pool ended while the run was in it (a 502: send it again).
    #[error("{0}")]
    PoolLost(String),
    /// The pool's jail was dead before the run's code was sent: the run
    /// never started, and may run elsewhere (its log is left open).
    #[error("{0}")]
    NotStarted(String),
    /// Cancelled before it reached a jail: nothing ran (a 409).
    #[error("{0}")]
    Cancelled(String),
}

impl RunError {
    /// Cancelled while it waited for a jail: nothing ran.
    pub fn not_run() -> RunError {
        RunError::Cancelled("the run was cancelled before it reached a jail: nothing ran".into())
    }
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait Backend: Send + Sync + 'static {
    /// Run `job`, appending its events but the last to `log` (the log is
    /// not finished here); stop it when `cancel` is asked (it still ends
    /// with its result: `cancelled`). The result document.
    fn run<'a>(&'a self, job: Job, log: Arc<EventLog>, cancel: Arc<Cancel>)
        -> BoxFuture<'a, Result<serde_json::Value, RunError>>;
}
