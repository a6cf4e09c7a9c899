//! One script's time limits, as the [`Loop`] the watch loop (watch.rs)
//! drives for `jail run`: past the wall deadline, once the run cgroup's
//! CPU time reaches its limit (read every `limits::CPU_POLL`), or on a
//! cancel (cancel.rs), the whole tree is killed, and the step ends so.
//! A session's cells are the other loop (session/cells.rs).

use std::time::Instant;

use nix::sys::signal::Signal;

use crate::limits;
use crate::step::Ending;
use crate::sync::Report;
use crate::watch::{Loop, Started, Watched};

/// One script until PID 1 ends or a limit is reached.
pub(crate) struct Script {
    /// The wall-clock deadline: now until the step starts, so a script
    /// is never watched without one.
    wall: Instant,
    /// The run's CPU-time limit in nanoseconds, read from the run cgroup;
    /// `None` without a cpu cgroup (RLIMIT_CPU stands in, the kernel's).
    cpu_limit: Option<u64>,
    next_cpu_check: Instant,
    ending: Ending,
}

impl Script {
    pub(crate) fn new() -> Script {
        Script {
            wall: Instant::now(),
            cpu_limit: None,
            next_cpu_check: Instant::now(),
            ending: Ending::Exited,
        }
    }

    fn kill(&mut self, w: &Watched<'_>, ending: Ending) {
        w.tree.kill();
        self.ending = ending;
    }
}

impl Loop for Script {
    fn started(&mut self, s: Started<'_>) {
        self.wall = s.wall;
        self.cpu_limit = s.cpu_limit;
    }

    fn wake(&self) -> Option<Instant> {
        Some(match self.cpu_limit {
            Some(_) => self.wall.min(self.next_cpu_check),
            None => self.wall,
        })
    }

    fn tick(&mut self, now: Instant, w: &mut Watched<'_>) {
        if now >= self.wall {
            self.kill(w, Ending::WallTimeout);
        } else if let (Some(limit_ns), true) = (self.cpu_limit, now >= self.next_cpu_check) {
            self.next_cpu_check = now + limits::CPU_POLL;
            if w.tree.cpu_ns().is_some_and(|used| used >= limit_ns) {
                self.kill(w, Ending::CpuTimeout);
            }
        }
    }

    fn cancelled(&mut self, sig: Signal, w: &mut Watched<'_>) {
        self.kill(w, Ending::Cancelled(sig));
    }

    fn at_death(&mut self, _reports: &[Report], _w: &mut Watched<'_>) -> Ending {
        self.ending
    }
}
