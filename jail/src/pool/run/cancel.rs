//! Stopping a request in flight: `{"op": "cancel", "id": ID}` (the
//! protocol is in pool.rs).
//!
//! Each request in flight has a [`Flight`]. A cancel marks it; what that
//! does depends on where the request is:
//!
//! - still checked, or waiting for a jail (`claim`): it gives up there, a
//!   claimed jail that ran nothing goes back to the ready ones, and the
//!   reply is the error `cancelled` (nothing ran);
//! - its code sent to a claimed jail ([`Flight::enter`] to
//!   [`Flight::leave`]): the jail's session supervisor gets SIGTERM through
//!   a pidfd opened at the claim (never a process that reused its pid);
//!   the session kills the cell's tree at once and answers the cell
//!   `cancelled` (session/serve.rs), then ends as a stop ends it. The pool
//!   waits for that supervisor to be gone (so the jail is gone, cgroup and
//!   all, when the reply is written) and replies with the cell's result,
//!   `supervisor.cancelled_by: "pool_caller"`, no artifacts and no output
//!   folder, as a cancelled `jail run` leaves none;
//! - answered, or never known: the cancel's own answer is the error
//!   `unknown_id`, written after that request's reply ([`Flight::answered`]
//!   is marked while the pool holds its stdout to write the reply).
//!
//! Either way the request gets exactly one reply.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::Pool;
use crate::client::pool::{Error, Reply};
use crate::result::{RunResult, Status};

/// `supervisor.cancelled_by` of a step its pool's caller cancelled.
pub(super) const BY_POOL_CALLER: &str = "pool_caller";
/// How long a cancelled jail's session supervisor gets to kill the cell's
/// tree, remove its cgroup and end, before it is killed (its janitor then
/// cleans up).
const STOP_WAIT: Duration = Duration::from_secs(20);

/// One request in flight, as a cancel sees it.
#[derive(Default)]
pub(super) struct Flight {
    state: Mutex<Stage>,
}

#[derive(Default)]
struct Stage {
    /// A cancel came.
    cancelled: bool,
    /// While the step's code runs: the claimed jail's session supervisor.
    jail: Option<OwnedFd>,
    /// Once a cancel signalled it: the same, to wait for its end.
    signalled: Option<OwnedFd>,
    /// Its reply is being written: a cancel now is `unknown_id`.
    answered: bool,
}

impl Flight {
    fn stage(&self) -> MutexGuard<'_, Stage> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Cancel it; false when its reply is already out (or going out).
    fn cancel(&self) -> bool {
        let mut st = self.stage();
        if st.answered {
            return false;
        }
        st.cancelled = true;
        if let Some(pidfd) = st.jail.take() {
            // A supervisor that just ended (ESRCH) has nothing left to stop.
            let _ = crate::sys::pidfd_send_signal(pidfd.as_fd(), Signal::SIGTERM);
            st.signalled = Some(pidfd);
        }
        true
    }

    pub(super) fn is_cancelled(&self) -> bool {
        self.stage().cancelled
    }

    /// The step's code is about to go to the jail whose session supervisor
    /// is `supervisor`: from now on a cancel signals it. False when a
    /// cancel came first: send nothing.
    pub(super) fn enter(&self, supervisor: u32) -> bool {
        let mut st = self.stage();
        if st.cancelled {
            return false;
        }
        // The jail was alive at the claim (`Jail::alive`); a pidfd that
        // cannot be opened means it ended since, and the step fails on
        // its own.
        st.jail = crate::sys::pidfd_open(nix::unistd::Pid::from_raw(supervisor as i32)).ok();
        true
    }

    /// The step's cell returned: no signal from now on. The supervisor's
    /// pidfd when a cancel signalled it.
    pub(super) fn leave(&self) -> Option<OwnedFd> {
        let mut st = self.stage();
        st.jail = None;
        st.signalled.take()
    }

    /// Its reply is being written.
    fn answered(&self) {
        self.stage().answered = true;
    }
}

impl Pool {
    /// `{"op": "cancel", "id": id}`: no line of its own when `id` is in
    /// flight (its reply follows), else `unknown_id`.
    pub(super) fn cancel(&self, id: &str) {
        // Marked under the state lock: a claim that checks the mark under
        // it, then waits, cannot miss the wake-up below.
        let taken = self.lock().inflight.get(id).is_some_and(|f| f.cancel());
        if taken {
            self.changed.notify_all();
        } else {
            self.say(&Error::unknown_id(id).reply());
        }
    }

    /// Write request `id`'s reply, marked answered first while the output
    /// is held: a cancel that finds it answered says so after this line.
    pub(super) fn answer(&self, id: &str, reply: &Reply) {
        let out = self.out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = self.lock().inflight.get(id) {
            f.answered();
        }
        Pool::write_line(out, &reply.text());
    }
}

/// A flight for a request taken in.
pub(super) fn flight() -> Arc<Flight> {
    Arc::new(Flight::default())
}

/// Wait for the cancelled jail's supervisor to be gone (its tree killed,
/// its cgroup removed); past [`STOP_WAIT`] it is killed.
pub(super) fn wait_gone(pidfd: &OwnedFd) {
    let until = Instant::now() + STOP_WAIT;
    if !super::ended_by(pidfd, Some(until)) {
        let _ = crate::sys::pidfd_send_signal(pidfd.as_fd(), Signal::SIGKILL);
        super::ended_by(pidfd, Some(Instant::now() + Duration::from_secs(5)));
    }
}

/// The reply's result of a step a cancel reached: the cell's own, said to
/// be the caller's doing when it ended `cancelled` (a cell that finished
/// just before keeps its status); no artifacts and no output folder, as a
/// cancelled `jail run` leaves none.
pub(super) fn cancelled_result(mut cell: RunResult) -> RunResult {
    cell.session = None;
    cell.artifacts = Vec::new();
    cell.output_dir = None;
    if cell.status == Status::Cancelled {
        cell.supervisor.cancelled_by = Some(BY_POOL_CALLER.into());
    }
    cell
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cancel_before_the_code_stops_it_going_and_after_the_reply_is_refused() {
        let f = Flight::default();
        assert!(f.cancel() && f.is_cancelled());
        assert!(!f.enter(std::process::id()), "nothing is sent once cancelled");
        let f = Flight::default();
        f.answered();
        assert!(!f.cancel() && !f.is_cancelled(), "an answered request is not in flight");
    }

    #[test]
    fn a_cancel_while_the_code_runs_signals_the_jail_once_and_leave_ends_that() {
        let f = Flight::default();
        assert!(f.enter(std::process::id()));
        assert!(f.leave().is_none(), "not signalled");
        // After leave nothing is signalled (this test's own pid would be).
        assert!(f.cancel());
        assert!(f.leave().is_none());
    }

    #[test]
    fn a_cancelled_cells_result_names_the_caller_and_delivers_nothing() {
        let mut cell =
            RunResult::setup_failed(crate::result::SetupError { stage: "t".into(), message: "m".into(), causes: vec![] });
        cell.status = Status::Cancelled;
        cell.supervisor.cancelled_by = Some("SIGTERM".into());
        cell.session = Some(crate::result::SessionInfo {
            id: "ab".into(),
            cell: 1,
            ended: true,
            why: None,
            detail: None,
            artifacts: String::new(),
        });
        cell.output_dir = Some("/x".into());
        let before = cell.clone();
        let r = cancelled_result(cell);
        assert_eq!(r.supervisor.cancelled_by.as_deref(), Some(BY_POOL_CALLER));
        assert!(r.artifacts.is_empty() && r.output_dir.is_none() && r.session.is_none());
        // As a document: the same but for those fields.
        let (mut want, got) = (serde_json::to_value(&before).unwrap(), serde_json::to_value(&r).unwrap());
        let m = want.as_object_mut().unwrap();
        m.remove("session");
        m.insert("output_dir".into(), serde_json::Value::Null);
        m["supervisor"]["cancelled_by"] = json!(BY_POOL_CALLER);
        assert_eq!(got, want);
        let mut done = before;
        done.status = Status::Ok;
        done.supervisor.cancelled_by = None;
        assert_eq!(cancelled_result(done).supervisor.cancelled_by, None);
    }
}
