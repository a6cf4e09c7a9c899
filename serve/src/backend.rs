//! Where a run runs. `Backend` is the seam: `spawn::SpawnBackend` runs each
//! run as a `jail run --events` process of its own; `pool::Link` sends it to
//! the warm pool (one `jail pool` child, JSON lines). Either way each run's
//! supervisor is a process of its own, so a crashing run cannot take the
//! server down; `route` says which backend takes a run.
//!
//! A backend appends a run's events to its log (a file in the run's
//! folder) as they come, all but the last: the caller (runs.rs, `record`)
//! stores how the run ended (its result in a file of its own), then
//! finishes the log; a follower sends the `result` (or `error`) event from
//! the run's end once the log is finished, so a follower that has seen the
//! last event finds the run ended, and the result is never kept twice.

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
    /// Variables for the script (checked by envs.rs as the body was read).
    pub env: jail::envs::Envs,
}

/// Bytes of one run's events kept at most; the events past them are
/// counted, and a `{"type": "dropped", "events": N}` event says how many
/// (the result has the streams' text whatever was dropped).
pub const MAX_EVENT_BYTES: u64 = 64 << 20;

/// A mark in the log's index every so many events or bytes, whichever
/// comes first: a reader resuming at event N reads at most this far past
/// the mark before N. The index holds at most `MAX_EVENT_BYTES /
/// MARK_BYTES` + events / `MARK_EVENTS` marks (a few KiB).
const MARK_EVENTS: u64 = 4096;
const MARK_BYTES: u64 = 1 << 20;

/// A run's events (NDJSON lines, as `jail run --events` prints them, but
/// the last), for `GET /v1/runs/{id}/events`: written to a file of their
/// own in the run's folder as they come, never held in memory. What the
/// server holds of a log is its counters and a sparse index of where
/// every few thousandth event starts, whatever the run prints. `done`
/// once the last is in; the run's end (its result, or why it has none) is
/// the run's, not the log's (state.rs `End`).
pub struct EventLog {
    /// Read back by the tests; readers open it by name (runs.rs).
    #[cfg_attr(not(test), allow(dead_code))]
    path: PathBuf,
    state: Mutex<Log>,
    pub changed: Notify,
}

struct Log {
    /// Open while the run goes; `None` once finished, or when it could
    /// not be made (every event is then counted as dropped).
    file: Option<std::fs::File>,
    /// Bytes and events written: every line whole, so a reader never
    /// reads past `bytes` into a line half-written.
    bytes: u64,
    count: u64,
    dropped: u64,
    /// (event index, byte offset) of every mark, the first at (0, 0).
    marks: Vec<(u64, u64)>,
    done: bool,
}

/// Where a log is: what a reader may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub bytes: u64,
    pub count: u64,
    pub done: bool,
}

impl EventLog {
    /// A log written to `path` (made anew: no link followed, 0600).
    pub fn create(path: PathBuf) -> EventLog {
        let file = crate::files::create_private(&path);
        if let Err(e) = &file {
            eprintln!("jail serve: cannot keep a run's events ({e}): they are counted as dropped");
        }
        EventLog {
            path,
            state: Mutex::new(Log {
                file: file.ok(),
                bytes: 0,
                count: 0,
                dropped: 0,
                marks: vec![(0, 0)],
                done: false,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Append one event (a JSON line without its newline); past
    /// `MAX_EVENT_BYTES`, or once finished, it is only counted.
    pub fn push(&self, line: &str) {
        {
            let mut l = self.lock();
            if l.done {
                return;
            }
            if l.bytes + line.len() as u64 + 1 > MAX_EVENT_BYTES {
                l.dropped += 1;
                return;
            }
            l.append(line);
        }
        self.changed.notify_waiters();
    }

    /// An event that could not be kept (too long, not UTF-8): counted.
    pub fn dropped(&self) {
        self.lock().dropped += 1;
    }

    /// No more events (a `dropped` event first, when some were); a second
    /// call changes nothing.
    pub fn finish(&self) {
        {
            let mut l = self.lock();
            if l.done {
                return;
            }
            if l.dropped > 0 {
                let line = serde_json::json!({"type": "dropped", "events": l.dropped}).to_string();
                l.append(&line);
            }
            l.done = true;
            l.file = None;
        }
        self.changed.notify_waiters();
    }

    pub fn written(&self) -> Written {
        let l = self.lock();
        Written { bytes: l.bytes, count: l.count, done: l.done }
    }

    /// The last mark at or before event `n`: (its index, its offset).
    pub fn mark_before(&self, n: u64) -> (u64, u64) {
        let l = self.lock();
        let i = l.marks.partition_point(|(at, _)| *at <= n);
        l.marks.get(i.saturating_sub(1)).copied().unwrap_or((0, 0))
    }

    /// Wait until the log is finished, at most `within`: whether it is.
    pub async fn wait_finished(&self, within: std::time::Duration) -> bool {
        let finished = crate::cancel::until(&self.changed, || self.written().done);
        tokio::time::timeout(within, finished).await.is_ok() || self.written().done
    }
}

#[cfg(test)]
impl EventLog {
    /// Every line written, read back.
    pub fn lines(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let upto = (self.written().bytes as usize).min(text.len());
        text[..upto].lines().map(str::to_owned).collect()
    }
}

impl Log {
    fn append(&mut self, line: &str) {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.file else {
            self.dropped += 1;
            return;
        };
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        if file.write_all_at(&bytes, self.bytes).is_err() {
            // A full disk: the line may be half there, past `bytes`,
            // where no reader looks; the next one overwrites it.
            self.dropped += 1;
            return;
        }
        let (at, offset) = self.marks.last().copied().unwrap_or((0, 0));
        if self.count - at >= MARK_EVENTS || self.bytes - offset >= MARK_BYTES {
            self.marks.push((self.count, self.bytes));
        }
        self.bytes += bytes.len() as u64;
        self.count += 1;
    }
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

/// A run's result document as the jail (or the pool) wrote it: the line
/// that carries it (`{"type": "result", "result": {...}}` of `jail run
/// --events`, `{"id", "result": {...}}` of the pool), never decoded whole
/// by the server. Its streams are most of it (a control byte is six bytes
/// of it); `runs.rs` `keep_result` reads it once, decodes the few fields
/// it needs and passes `stdout` and `stderr` on as written.
#[derive(Debug, Clone, PartialEq)]
pub struct RawResult {
    line: String,
}

impl RawResult {
    /// A line whose `result` field is the document.
    pub fn line(line: String) -> RawResult {
        RawResult { line }
    }

    /// A document already decoded (a short reply of the pool's).
    pub fn of(result: &serde_json::Value) -> RawResult {
        RawResult { line: serde_json::json!({ "result": result }).to_string() }
    }

    pub fn text(&self) -> &str {
        &self.line
    }

    /// The whole document, decoded (a pool that streamed no events makes
    /// them from it; the tests read it).
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(&self.line)
            .map(|mut v| v["result"].take())
            .unwrap_or_default()
    }
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait Backend: Send + Sync + 'static {
    /// Run `job`, appending its events but the last to `log` (the log is
    /// not finished here); stop it when `cancel` is asked (it still ends
    /// with its result: `cancelled`). The result document.
    fn run<'a>(&'a self, job: Job, log: Arc<EventLog>, cancel: Arc<Cancel>) -> BoxFuture<'a, Result<RawResult, RunError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_past_the_bytes_are_counted_and_said_and_marks_index_them() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::create(dir.path().join("e"));
        let line = format!("{{\"type\":\"stdout\",\"data\":\"{}\"}}", "x".repeat(1000));
        let fits = MAX_EVENT_BYTES / (line.len() as u64 + 1);
        for _ in 0..fits + 5 {
            log.push(&line);
        }
        let before = log.written();
        assert_eq!(before.count, fits, "what passes the bytes is not written");
        assert!(before.bytes <= MAX_EVENT_BYTES);
        log.finish();
        let lines = log.lines();
        assert_eq!(lines.last().unwrap(), r#"{"events":5,"type":"dropped"}"#);
        log.push(&line);
        assert_eq!(log.written().count, fits + 1, "nothing after the finish");
        // Every mark is where its event starts.
        let text = std::fs::read(dir.path().join("e")).unwrap();
        for n in [0, 1, MARK_EVENTS, fits / 2, fits] {
            let (at, offset) = log.mark_before(n);
            assert!(at <= n && n - at <= MARK_EVENTS, "{n}: mark at {at}");
            let starts = text[..offset as usize].iter().filter(|b| **b == b'\n').count() as u64;
            assert_eq!(starts, at, "the mark for {n} is at the start of event {at}");
        }
        assert!(log.lock().marks.len() as u64 <= MAX_EVENT_BYTES / MARK_BYTES + fits / MARK_EVENTS + 2);
    }

    #[test]
    fn a_log_is_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("target"), b"kept").unwrap();
        std::os::unix::fs::symlink("target", dir.path().join("e")).unwrap();
        let log = EventLog::create(dir.path().join("e"));
        log.push("{}");
        log.finish();
        assert_eq!(std::fs::read(dir.path().join("target")).unwrap(), b"kept");
        assert_eq!(log.written().count, 0, "nothing was written anywhere");
    }
}
