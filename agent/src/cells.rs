//! One `jail session` per sub-task: the sub-agent's scripts run as cells of
//! one Python interpreter whose globals persist, so a DataFrame loaded in
//! step 1 is there in step 2. The session is taken lazily at the sub-task's
//! first `run_python_file` — claimed from the run's warm pool (pool.rs), or
//! started by the agent when the pool cannot give one — and is stopped at
//! the sub-task's end, on every error path (`Drop`), and when a signal
//! stops the run (stop.rs: the cell in flight interrupted, then killed with
//! its session after a grace; the registry here is what the signal thread
//! reaches): a session supervisor is its own process (setsid), so nothing
//! else would end it before its idle timeout (or, for a pooled one, its
//! pool's end).
//!
//! Output files reach the host only when a session ends (the jail judges
//! and delivers them then): the closing result of `jail session stop` is
//! what the agent's accepted set is taken from, never a cell's result.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use jail::client::session as socket;
use jail::result::RunResult;

use crate::pool::Pool;
use crate::runner::{Runner, RunnerError};
use crate::session::Session;

/// The live sessions of this process and the step in flight, for the
/// signal thread (stop.rs).
static LIVE: Mutex<Registry> = Mutex::new(Registry {
    live: Vec::new(),
    starting: 0,
    closing: false,
    running: None,
    run_pid: None,
    closed: Vec::new(),
});

struct Registry {
    /// The handle of every session started and not yet stopped.
    live: Vec<PathBuf>,
    /// `jail session start` processes under way.
    starting: usize,
    /// A signal arrived: no new session may start.
    closing: bool,
    /// The handle of the session whose cell is in flight.
    running: Option<PathBuf>,
    /// The `jail run` of a stateless step in flight (its own process group).
    run_pid: Option<u32>,
    /// Closing results of sessions the signal path stopped, for the run.
    closed: Vec<RunResult>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long the last-resort stop waits for a start under way to print its handle.
const START_WAIT: Duration = Duration::from_secs(1);

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
}

/// Mark a start as under way; false once a signal has arrived.
pub(crate) fn begin_start() -> bool {
    let mut r = registry();
    if r.closing {
        return false;
    }
    r.starting += 1;
    true
}

/// A start finished: register its handle (if any).
pub(crate) fn end_start(handle: Option<&Path>) {
    let mut r = registry();
    r.starting = r.starting.saturating_sub(1);
    if let Some(h) = handle {
        r.live.push(h.to_path_buf());
    }
}

fn forget(handle: &Path) {
    let mut r = registry();
    r.live.retain(|h| h != handle);
}

/// A cell of the session at `handle` is in flight until the guard drops:
/// the signal thread interrupts it (stop.rs).
pub(crate) fn cell_running(handle: &Path) -> Running {
    registry().running = Some(handle.to_path_buf());
    Running::Cell
}

/// A stateless step's `jail run` (process `pid`, its own group) is in
/// flight until the guard drops: the signal thread cancels it.
pub(crate) fn run_running(pid: u32) -> Running {
    registry().run_pid = Some(pid);
    if crate::stop::requested().is_some() {
        cancel_run(pid);
    }
    Running::Run
}

/// What is in flight; cleared from the registry when dropped.
pub(crate) enum Running {
    Cell,
    Run,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut r = registry();
        match self {
            Running::Cell => r.running = None,
            Running::Run => r.run_pid = None,
        }
    }
}

/// `jail run` cancels on SIGTERM: its tree is killed, its result says `cancelled`.
fn cancel_run(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
}

/// The signal path, at once: no session starts from now on; the cell in
/// flight gets KeyboardInterrupt; a `jail run` step in flight is cancelled.
pub(crate) fn interrupt_running() {
    let (cell, run) = {
        let mut r = registry();
        r.closing = true;
        (r.running.clone(), r.run_pid)
    };
    if let Some(pid) = run {
        cancel_run(pid);
    }
    if let Some(handle) = cell {
        let _ = socket::interrupt(&handle);
    }
}

/// The signal path, past the grace: a cell still in flight is killed with
/// its session (`jail session stop` is served while a cell runs); the
/// closing result is kept for the run.
pub(crate) fn kill_running() {
    let Some(handle) = registry().running.clone() else { return };
    let r = stop_handle(&handle);
    forget(&handle);
    if let Ok(Some(closing)) = r {
        registry().closed.push(closing);
    }
}

impl Live {
    pub(crate) fn new(handle: PathBuf, id: String, cell_limit: Duration, from: JailFrom) -> Live {
        Live { handle, id, cell_limit, cells: 0, from, claim_ms: None, not_pooled: None }
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

    /// The live session's id.
    pub fn live_id(&self) -> Option<String> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|l| l.id.clone())
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
        let r = stop_handle(&live.handle);
        forget(&live.handle);
        if let Some(closing) = r? {
            *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = Some(closing);
        }
        Ok(true)
    }

    /// The closing result of the session stopped last, once (the signal
    /// path's, when it killed a running cell with its session).
    pub fn take_closed(&self) -> Option<RunResult> {
        self.closed.lock().unwrap_or_else(|e| e.into_inner()).take().or_else(|| registry().closed.pop())
    }
}

impl Drop for Cells {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Stop the session at `handle` (jail::client): the closing result, or
/// None when the session had already ended and left none.
pub(crate) fn stop_handle(handle: &Path) -> Result<Option<RunResult>, RunnerError> {
    match socket::stop(handle) {
        Ok(closing) => Ok(Some(closing)),
        Err(e) if e.is_gone() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The last resort (stop.rs): stop every live session of this process.
pub(crate) fn stop_all() {
    let until = std::time::Instant::now() + START_WAIT;
    loop {
        let starting = {
            let mut r = registry();
            r.closing = true;
            r.starting
        };
        if starting == 0 || std::time::Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let live = std::mem::take(&mut registry().live);
    for handle in live {
        let _ = stop_handle(&handle);
    }
}
