//! One `jail session` per sub-task: the sub-agent's scripts run as cells of
//! one Python interpreter whose globals persist, so a DataFrame loaded in
//! step 1 is there in step 2. The session is taken lazily at the sub-task's
//! first `run_python_file` — claimed from the run's warm pool (pool.rs), or
//! started by the agent when the pool cannot give one — and is stopped at
//! the sub-task's end, on every error path (`Drop`), and on SIGINT, SIGTERM
//! or SIGHUP (`guard_signals`, which then ends the pool too): a session
//! supervisor is its own process (setsid), so nothing else would end it
//! before its idle timeout (or, for a pooled one, its pool's end).
//!
//! Output files reach the host only when a session ends (the jail judges
//! and delivers them then): the closing result of `jail session stop` is
//! what the agent's accepted set is taken from, never a cell's result.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use jail::result::RunResult;

use crate::pool::Pool;
use crate::runner::{Runner, RunnerError};
use crate::session::Session;

/// The live sessions of this process, for the signal thread.
static LIVE: Mutex<Registry> = Mutex::new(Registry { live: Vec::new(), starting: 0, closing: false });

struct Registry {
    /// (jail binary, handle) of every session started and not yet stopped.
    live: Vec<(PathBuf, PathBuf)>,
    /// `jail session start` processes under way.
    starting: usize,
    /// A signal arrived: no new session may start.
    closing: bool,
}

/// How long the signal thread waits for a start under way to print its handle.
const START_WAIT: Duration = Duration::from_secs(30);

/// Where a step's jail came from (the trace's `jail_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JailFrom {
    /// A session claimed from the run's warm pool (pool.rs).
    Pool,
    /// A session the agent started itself (`jail session start`).
    SessionStart,
    /// A fresh jail for this one step (`jail run`).
    Run,
}

impl JailFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            JailFrom::Pool => "pool",
            JailFrom::SessionStart => "session_start",
            JailFrom::Run => "run",
        }
    }
}

/// The session a sub-task is using.
#[derive(Debug)]
pub struct Live {
    pub handle: PathBuf,
    pub id: String,
    /// The wall-clock limit of each cell, fixed when the session started.
    pub cell_limit: Duration,
    /// Cells run so far.
    pub cells: u64,
    /// Claimed from the pool, or started by the agent.
    pub from: JailFrom,
    /// How long the claim (or the start) took, until the first cell's step
    /// takes it for its trace record.
    pub claim_ms: Option<f64>,
    /// Why it was started by the agent while the pool was on.
    pub not_pooled: Option<String>,
    jail: PathBuf,
}

/// Mark a start as under way; false once a signal has arrived.
pub(crate) fn begin_start() -> bool {
    let mut r = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    if r.closing {
        return false;
    }
    r.starting += 1;
    true
}

/// A start finished: register its handle (if any).
pub(crate) fn end_start(jail: &Path, handle: Option<&Path>) {
    let mut r = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    r.starting = r.starting.saturating_sub(1);
    if let Some(h) = handle {
        r.live.push((jail.to_path_buf(), h.to_path_buf()));
    }
}

fn forget(handle: &Path) {
    let mut r = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    r.live.retain(|(_, h)| h != handle);
}

impl Live {
    pub(crate) fn new(jail: PathBuf, handle: PathBuf, id: String, cell_limit: Duration, from: JailFrom) -> Live {
        Live { handle, id, cell_limit, cells: 0, from, claim_ms: None, not_pooled: None, jail }
    }
}

/// The sub-task's session slot: empty until the first step, emptied when
/// the session ends.
#[derive(Debug, Default)]
pub struct Cells {
    live: Mutex<Option<Live>>,
    /// Why the last session ended by itself, told to the model once.
    pub ended_note: Mutex<Option<String>>,
    /// The closing result of the last session stopped, for the agent's
    /// accepted set.
    closed: Mutex<Option<RunResult>>,
}

impl Cells {
    /// Run `f` with the live session, taking one first (from the pool, or
    /// started) if there is none.
    pub fn with_live<T>(
        &self,
        runner: &Runner,
        session: &Session,
        pool: &Pool,
        at_most: Duration,
        f: impl FnOnce(&mut Live) -> T,
    ) -> Result<(T, bool), RunnerError> {
        let mut slot = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = slot.is_none();
        if fresh {
            *slot = Some(pool.session(runner, session, at_most)?);
        }
        let live = slot.as_mut().ok_or(RunnerError::Contract { cause: "no session".into() })?;
        Ok((f(live), fresh))
    }

    /// Whether a step with `left` of the run's time fits the live session's
    /// cell limit (a new session is made to fit).
    pub fn fits(&self, left: Duration) -> bool {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_none_or(|l| l.cell_limit <= left)
    }

    /// The live session's handle, for the checkpoint.
    pub fn handle(&self) -> Option<PathBuf> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|l| l.handle.clone())
    }

    /// What the model is told when the next step starts a fresh session.
    pub fn set_ended_note(&self, why: String) {
        *self.ended_note.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    /// Whether a session is live.
    pub fn is_live(&self) -> bool {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The session ended by itself (a dead interpreter, a killed cell):
    /// forget it, nothing to stop.
    pub fn forget_ended(&self) {
        if let Some(live) = self.live.lock().unwrap_or_else(|e| e.into_inner()).take() {
            forget(&live.handle);
        }
    }

    /// Stop the live session, if any: its closing result (artifacts judged
    /// and delivered), or None when there was none or it had already ended.
    /// The closing result is kept for `take_closed`. Returns whether a
    /// session was live.
    pub fn stop(&self) -> Result<bool, RunnerError> {
        let Some(live) = self.live.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(false);
        };
        let r = stop_handle(&live.jail, &live.handle);
        forget(&live.handle);
        if let Some(closing) = r? {
            *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = Some(closing);
        }
        Ok(true)
    }

    /// The closing result of the session stopped last, once.
    pub fn take_closed(&self) -> Option<RunResult> {
        self.closed.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Drop for Cells {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// `jail session stop HANDLE`: the closing result, or None when the
/// session had already ended (exit 125, "session ended").
pub(crate) fn stop_handle(jail: &Path, handle: &Path) -> Result<Option<RunResult>, RunnerError> {
    let out = std::process::Command::new(jail)
        .args(["session", "stop"])
        .arg(handle)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|error| RunnerError::Spawn { path: jail.to_path_buf(), error })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("ended") || stderr.contains("no session") {
            return Ok(None);
        }
        return Err(RunnerError::NoResult { status: out.status.to_string(), stderr: crate::llm::excerpt(&stderr, 400) });
    }
    let value: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| RunnerError::Contract { cause: e.to_string() })?;
    crate::runner::result_of(value).map(Some)
}

/// Stop every live session of this process (the signal path).
fn stop_all() {
    let until = std::time::Instant::now() + START_WAIT;
    loop {
        let starting = {
            let mut r = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            r.closing = true;
            r.starting
        };
        if starting == 0 || std::time::Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let live = std::mem::take(&mut LIVE.lock().unwrap_or_else(|e| e.into_inner()).live);
    for (jail, handle) in live {
        let _ = stop_handle(&jail, &handle);
    }
}

/// Take SIGINT, SIGTERM and SIGHUP on a thread of their own: the live
/// sessions are stopped, then the warm pool (pool.rs), then the process
/// exits 130 (128 + the signal for the others). Call before any other
/// thread starts, so every thread inherits the blocked mask; children get
/// a clear mask from `Command`.
pub fn guard_signals() -> std::io::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block().map_err(std::io::Error::from)?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let sig = set.wait().unwrap_or(Signal::SIGINT);
        eprintln!("jail-agent: {sig}: stopping the running sessions");
        stop_all();
        // Then the pool: the sessions it handed out are stopped already,
        // each once, by us.
        crate::pool::end_on_signal();
        std::process::exit(128 + sig as i32);
    })?;
    Ok(())
}
