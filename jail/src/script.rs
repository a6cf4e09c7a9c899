//! One script's time limits, as the [`Loop`] the watch loop (watch.rs)
//! drives for `jail run`: past the wall deadline, once the run cgroup's
//! CPU time reaches its limit (read every `limits::CPU_POLL`), or on a
//! cancel (cancel.rs), the whole tree is killed, and the step ends so.
//! A session's cells are the other loop (session/serve.rs).

use std::time::Instant;

use nix::sys::signal::Signal;

use crate::limits;
use crate::sync::Report;
use crate::watch::{Ending, Loop, Tree};

/// One script until PID 1 ends or a limit is reached.
pub(crate) struct Script {
    /// The wall-clock deadline.
    wall: Instant,
    /// The run's CPU-time limit in nanoseconds, read from the run cgroup;
    /// `None` without a cpu cgroup (RLIMIT_CPU stands in, the kernel's).
    cpu_limit: Option<u64>,
    next_cpu_check: Instant,
    ending: Ending,
}

impl Script {
    pub(crate) fn new(wall: Instant, cpu_limit: Option<u64>) -> Script {
        Script { wall, cpu_limit, next_cpu_check: Instant::now(), ending: Ending::Exited }
    }

    fn kill(&mut self, tree: &Tree<'_>, ending: Ending) {
        tree.kill();
        self.ending = ending;
    }
}

impl Loop for Script {
    fn wake(&self) -> Option<Instant> {
        Some(match self.cpu_limit {
            Some(_) => self.wall.min(self.next_cpu_check),
            None => self.wall,
        })
    }

    fn tick(&mut self, now: Instant, tree: &Tree<'_>) {
        if now >= self.wall {
            self.kill(tree, Ending::WallTimeout);
        } else if let (Some(limit_ns), true) = (self.cpu_limit, now >= self.next_cpu_check) {
            self.next_cpu_check = now + limits::CPU_POLL;
            if tree.cpu_ns().is_some_and(|used| used >= limit_ns) {
                self.kill(tree, Ending::CpuTimeout);
            }
        }
    }

    fn cancelled(&mut self, sig: Signal, tree: &Tree<'_>) {
        self.kill(tree, Ending::Cancelled(sig));
    }

    fn at_death(&mut self, _reports: &[Report]) -> Ending {
        self.ending
    }
}
