//! Ending a step's `jail run` when its call is cancelled or hangs: SIGTERM
//! first, so the jail kills its own tree and removes its cgroup and
//! folders, then SIGKILL if it has not exited after `GRACE`.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Child;

/// How long a terminated `jail run` has to clean up before it is killed.
pub const GRACE: Duration = Duration::from_secs(10);

/// A running step; dropping it before `done` (the call was cancelled)
/// terminates the run.
pub struct Step {
    child: Option<Child>,
}

impl Step {
    pub fn new(child: Child) -> Step {
        Step { child: Some(child) }
    }

    pub fn child(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// The run exited and was waited for: nothing to stop.
    pub fn done(mut self) {
        self.child = None;
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        // Not yet waited for, so the pid is still this child's.
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        // Without a runtime (the server is shutting down) the SIGTERM stands
        // alone: the jail cleans up and exits by itself.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if tokio::time::timeout(GRACE, child.wait()).await.is_err() {
                    let _ = child.kill().await;
                }
            });
        }
    }
}
