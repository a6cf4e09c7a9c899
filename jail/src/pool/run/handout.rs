//! A made jail handed out as a session (`{"op": "session"}`): "a session
//! is a pooled jail that takes more than one cell from the same owner".
//!
//! The pool claims a ready jail (its preload already imported), copies the
//! request's input into the jail's read-only input folder, and has the
//! session take the request's output folder (session/adopt.rs: filled into
//! `/workspace/output` now, what passed delivered there when the session
//! ends, as `jail session start --output` does). The caller then runs cells
//! with `jail session exec HANDLE` and ends it with `jail session stop
//! HANDLE`; the pool makes a replacement at once. It watches the session's
//! supervisor through a pidfd and removes the jail's slot folder once it is
//! gone. The session still holds the pool's lifeline: it ends with the
//! pool, SIGKILL included, and a pool that drains stops it.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{broke, cancel::Flight, check_input, copy_input, fresh_output, not_run, refused, Claim, Failed, Jail, Pool};
use crate::accept;
use crate::client::pool::{self as wire, Body, ErrorCode, Handout, Reply, SessionRequest};
use crate::client::session;

impl Pool {
    /// One session request, start to reply line.
    pub(super) fn serve_session(self: &Arc<Self>, req: SessionRequest, flight: &Flight) -> Reply {
        let fail = |e: Failed| e.about(Some(&req.id)).reply();
        // Everything about the request is checked before a jail is claimed.
        if !self.cfg.output_capped {
            // Its message starts as a client tells it (`refuses_sessions`).
            return fail(refused(format!(
                "{} (filesystem.output_size \"unlimited\"), and a session from the pool takes yours later: \
                 start the pool with a capped output_size",
                wire::REFUSES_SESSIONS
            )));
        }
        // Opened now, used by descriptor once a jail is claimed (accept.rs).
        let input = match req.input.as_deref().map(|i| check_input(i, self.cfg.reach)).transpose() {
            Ok(i) => i,
            Err(e) => return fail(e),
        };
        let (out, made) = match &req.output {
            Some(dir) => match output_folder(dir) {
                Ok(made) => (dir.clone(), made),
                Err(e) => return fail(refused(e)),
            },
            None => match fresh_output(&self.cfg.temp_dir) {
                Ok(dir) => (dir, true),
                Err(e) => return fail(e),
            },
        };
        let jail = match self.claim(flight) {
            Ok(j) => j,
            Err(e) => {
                forget(&out, made);
                return match e {
                    Claim::Cancelled => fail(not_run()),
                    Claim::Failed(e) => fail(broke(e)),
                };
            }
        };
        if flight.is_cancelled() {
            forget(&out, made);
            self.give_back(jail);
            return fail(not_run());
        }
        let handed = self.hand_out(&jail, &req, input.as_ref(), &out).and_then(|()| {
            // A cancel while it was handed over: never handed out.
            if flight.is_cancelled() {
                Err(not_run())
            } else {
                Ok(())
            }
        });
        self.lock().in_use -= 1;
        // Its replacement at once: this jail is the caller's until it ends.
        self.refill();
        self.changed.notify_all();
        match handed {
            Ok(()) => {
                let handout = Handout {
                    handle: jail.handle.clone(),
                    id: jail.id.clone(),
                    output_dir: out,
                    pid: jail.supervisor,
                };
                self.watch_session(jail);
                Reply { id: Some(req.id), body: Body::Session(handout) }
            }
            Err(e) => {
                // Never handed out, never used again.
                jail.destroy();
                forget(&out, made);
                // Its own code otherwise: an input refused is the caller's
                // to fix (bad_request), a hand-over that broke the pool's.
                let code = if flight.is_cancelled() { ErrorCode::Cancelled } else { e.code };
                fail(wire::Error { code, ..e })
            }
        }
    }

    /// The request's input in, then its output folder taken by the
    /// session, then its variables set for every cell: an empty cell that
    /// keeps them (after the adoption, which takes a folder only before any
    /// cell but the trusted preload).
    fn hand_out(&self, jail: &Jail, req: &SessionRequest, input: Option<&OwnedFd>, out: &Path) -> Result<(), Failed> {
        if let (Some(from), Some(path)) = (input, &req.input) {
            copy_input(from, path, &jail.input(), self.cfg.reach)?;
        }
        session::adopt_output(&jail.handle, out).map_err(|e| broke(format!("hand the output folder to the session: {e}")))?;
        if !req.env.is_empty() {
            let cell = session::Cell { keep_env: true, ..session::Cell::new("", Some(self.cfg.ceilings.wall_time)) }
                .with_env(req.env.clone());
            let set = session::exec(&jail.handle, cell).map_err(|e| broke(format!("set the session's variables: {e}")))?;
            if set.status != crate::result::Status::Ok {
                return Err(broke(format!("set the session's variables: the cell ended {:?}", set.status)));
            }
        }
        Ok(())
    }

    /// Remove the jail's slot once its session supervisor is gone.
    fn watch_session(self: &Arc<Self>, jail: Jail) {
        self.lock().sessions.insert(jail.supervisor, jail.handle.clone());
        let p = Arc::clone(self);
        std::thread::spawn(move || {
            // Opened while the supervisor is certainly alive: it answered
            // the adoption just now, and only its end closes the socket.
            let pid = nix::unistd::Pid::from_raw(jail.supervisor as i32);
            if let Ok(pidfd) = crate::sys::pidfd_open(pid) {
                super::ended_by(&pidfd, None);
            }
            let _ = fs::remove_dir_all(&jail.slot);
            p.lock().sessions.remove(&jail.supervisor);
            p.changed.notify_all();
        });
    }
}

/// A session's output folder: an existing folder as it is, or made (0700)
/// when absent; true when made here. Named without a link on the way, and
/// never a link itself (accept.rs); the session opens it again the same
/// way when it takes it (output.rs).
fn output_folder(dir: &Path) -> Result<bool, String> {
    let place = accept::Place::name(dir).map_err(|e| match e.problem {
        accept::Problem::Missing => format!("make the output folder {e}: make its parent first"),
        _ => format!("output {e}: {}", e.fix()),
    })?;
    match place.found().map_err(|e| format!("output {e}"))? {
        accept::Found::Folder | accept::Found::EmptyFolder => Ok(false),
        accept::Found::Other => Err(format!("output {} is not a folder (a link is not followed): give a folder", dir.display())),
        accept::Found::Nothing => place
            .make_dir(0o700)
            .map(|()| true)
            .map_err(|e| format!("make the output folder {e}: make its parent first")),
    }
}

/// A folder made for a request that was not handed out goes again.
fn forget(dir: &PathBuf, made: bool) {
    if made {
        let _ = fs::remove_dir(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_folder_is_taken_as_it_is_made_when_absent_and_never_a_link() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("full")).unwrap();
        fs::write(t.path().join("full/keep.txt"), "x").unwrap();
        assert_eq!(output_folder(&t.path().join("full")), Ok(false));
        assert_eq!(output_folder(&t.path().join("new")), Ok(true));
        assert!(t.path().join("new").is_dir());
        std::os::unix::fs::symlink(t.path().join("full"), t.path().join("link")).unwrap();
        assert!(output_folder(&t.path().join("link")).unwrap_err().contains("link"));
        fs::write(t.path().join("file"), "").unwrap();
        assert!(output_folder(&t.path().join("file")).unwrap_err().contains("not a folder"));
        assert!(output_folder(&t.path().join("no/such")).unwrap_err().contains("parent"));
    }
}
