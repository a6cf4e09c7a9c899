//! Stopping a `jail` a client started: SIGTERM to its process group first,
//! so the jail kills its own tree, removes its cgroup and folders and
//! prints its result (`cancelled`); SIGKILL to the group if it is still
//! there after `bounds::STOP_GRACE`. The wait runs on a thread of its own,
//! so neither a runtime nor the caller is needed for it.
//!
//! A group id stays the run's while its leader is not reaped (the caller
//! holds the child unwaited until it is `done`), or while any process of
//! the group lives: the stop thread looks every few milliseconds and ends
//! as soon as the group is gone.

use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::bounds::STOP_GRACE;

/// How often a stop looks whether the group is gone.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// A started `jail`'s process group (the child was spawned with
/// `process_group(0)`, command.rs). Dropped before `done`, it is stopped.
#[derive(Debug)]
pub struct Group {
    stopper: Option<Stopper>,
}

/// A handle that stops the group, for a cancel from another thread or task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopper {
    pgid: Pid,
}

impl Group {
    /// The group led by the child of id `pid` (`Child::id`).
    pub fn of(pid: Option<u32>) -> Group {
        let pgid = pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0).map(Pid::from_raw);
        Group { stopper: pgid.map(|pgid| Stopper { pgid }) }
    }

    /// The group's id, when known.
    pub fn pgid(&self) -> Option<i32> {
        self.stopper.map(|s| s.pgid.as_raw())
    }

    pub fn stopper(&self) -> Option<Stopper> {
        self.stopper
    }

    /// The run ended and was waited for: nothing to stop.
    pub fn done(mut self) {
        self.stopper = None;
    }
}

/// A guard of its own over a group another holds (an async caller's
/// cancel while `Running::wait` runs on a blocking thread): stops it when
/// dropped before `done`.
impl From<Stopper> for Group {
    fn from(stopper: Stopper) -> Group {
        Group { stopper: Some(stopper) }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(s) = self.stopper.take() {
            s.stop();
        }
    }
}

impl Stopper {
    /// SIGTERM to the group: the jail ends its run, `cancelled`.
    pub fn terminate(&self) {
        let _ = killpg(self.pgid, Signal::SIGTERM);
    }

    /// SIGTERM now, SIGKILL after `STOP_GRACE` if the group is still there.
    pub fn stop(&self) {
        self.stop_within(STOP_GRACE);
    }

    /// SIGTERM now, SIGKILL after `grace` if the group is still there; the
    /// wait on a thread of its own.
    pub(crate) fn stop_within(&self, grace: Duration) {
        self.terminate();
        let pgid = self.pgid;
        let wait = move || {
            let until = Instant::now() + grace;
            // Signal 0: whether any process of the group is left.
            while killpg(pgid, None).is_ok() {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    let _ = killpg(pgid, Signal::SIGKILL);
                    return;
                }
                std::thread::sleep(left.min(LOOK_EVERY));
            }
        };
        if std::thread::Builder::new().name("jail-stop".into()).spawn(wait).is_err() {
            // No thread: kill now rather than leave a jail that ignores SIGTERM.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, Stdio};

    fn started(script: &str) -> std::process::Child {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0);
        let mut child = cmd.spawn().unwrap();
        // The shell says when its trap is set, so the signal never comes first.
        let mut ready = [0u8; 6];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
        child
    }

    /// The child's end, or a failure (not a hang) if it outlives a minute.
    fn waited(child: &mut std::process::Child) -> std::process::ExitStatus {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        panic!("the group was not stopped");
    }

    #[test]
    fn a_group_that_ignores_sigterm_is_killed_after_the_grace() {
        let mut child = started("trap '' TERM; echo ready; while :; do sleep 1; done");
        let group = Group::of(Some(child.id()));
        let t0 = Instant::now();
        group.stopper().unwrap().stop_within(Duration::from_millis(300));
        let status = waited(&mut child);
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        // Not before the grace: SIGTERM alone did not end it.
        assert!(t0.elapsed() >= Duration::from_millis(300));
        group.done();
    }

    #[test]
    fn a_group_dropped_before_done_is_terminated() {
        let mut child = started("trap 'exit 7' TERM; echo ready; while :; do sleep 1; done");
        drop(Group::of(Some(child.id())));
        let status = waited(&mut child);
        assert_eq!(status.code(), Some(7), "{status:?}");
    }
}
