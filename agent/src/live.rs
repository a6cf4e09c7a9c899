//! The jails this process has live, for the signal thread (stop.rs,
//! signals.rs): every session started and not yet stopped, starts under
//! way, and the step in flight (a session's cell or a stateless step's
//! `jail run`). Where a step's jail came from ([`JailFrom`]) and the
//! session a sub-task is using ([`Live`]) are here too, so the pool
//! (pool.rs) and the runner (runner.rs) that make them need nothing of
//! the sub-task's slot (cells.rs).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use jail::client::session::{self as socket, SessionError};
use jail::result::RunResult;

/// The live sessions of this process and the step in flight, for the
/// signal thread (signals.rs).
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

pub(crate) fn forget(handle: &Path) {
    let mut r = registry();
    r.live.retain(|h| h != handle);
}

/// A cell of the session at `handle` is in flight until the guard drops:
/// the signal thread interrupts it (signals.rs).
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

/// Stop the session at `handle` (jail::client): the closing result, or
/// None when the session had already ended and left none.
pub(crate) fn stop_handle(handle: &Path) -> Result<Option<RunResult>, SessionError> {
    match socket::stop(handle) {
        Ok(closing) => Ok(Some(closing)),
        Err(e) if e.is_gone() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The last resort (signals.rs): stop every live session of this process.
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

/// A closing result the signal path kept (it killed a running cell with
/// its session), once.
pub(crate) fn take_closed() -> Option<RunResult> {
    registry().closed.pop()
}
