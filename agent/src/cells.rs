//! One `jail session` per sub-task: the sub-agent's scripts run as cells of
//! one Python interpreter whose globals persist, so a DataFrame loaded in
//! step 1 is there in step 2. The session is taken lazily at the sub-task's
//! first `run_python_file` — claimed from the run's warm pool (pool.rs), or
//! started by the agent when the pool cannot give one — and is stopped at
//! the sub-task's end, on every error path (`Drop`), and when a signal
//! stops the run (stop.rs: the cell in flight interrupted, then killed with
//! its session after a grace; the registry of live.rs is what the signal
//! thread reaches): a session supervisor is its own process (setsid), so nothing
//! else would end it before its idle timeout (or, for a pooled one, its
//! pool's end).
//!
//! Output files reach the host only when a session ends (the jail judges
//! and delivers them then): the closing result of `jail session stop` is
//! what the agent's accepted set is taken from, never a cell's result.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use jail::result::RunResult;

use crate::live::Live;
use crate::live::{forget, stop_handle};
use crate::pool::Pool;
use crate::runner::{Runner, RunnerError};
use crate::session::Session;

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
        self.closed.lock().unwrap_or_else(|e| e.into_inner()).take().or_else(crate::live::take_closed)
    }
}

impl Drop for Cells {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
