//! One script's time limits, as the [`Loop`] the watch loop (watch.rs)
//! drives for `jail run`: past the wall deadline, once the run cgroup's
//! CPU time reaches its limit (read every `limits::CPU_POLL`), or on a
//! cancel (cancel.rs), the whole tree is killed, and the step ends so.
//! A session's cells are the other loop (session/cells.rs).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use nix::poll::PollFlags;
use nix::sys::signal::Signal;

use crate::display::{self, Collected, Lines};
use crate::limits;
use crate::result::DisplayResult;
use crate::step::Ending;
use crate::sync::Report;
use crate::watch::{Loop, PollSet, Started, Watched};

/// The loop's one descriptor slot: the control channel.
const CONTROL: u32 = 0;

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
    /// The runner's end of the control channel: its rich results.
    control: Option<OwnedFd>,
    lines: Lines,
    results: Collected,
    /// What each read of the control channel takes: made at the first.
    buf: Vec<u8>,
}

impl Script {
    pub(crate) fn new() -> Script {
        Script {
            wall: Instant::now(),
            cpu_limit: None,
            next_cpu_check: Instant::now(),
            ending: Ending::Exited,
            control: None,
            lines: Lines::default(),
            results: Collected::default(),
            buf: Vec::new(),
        }
    }

    /// Read what the runner wrote (`wait`: poll first, so a drain at
    /// death never blocks); each whole `display` line judged and kept.
    fn read_control(&mut self, wait: bool) {
        if self.buf.is_empty() {
            self.buf.resize(64 << 10, 0);
        }
        while let Some(fd) = &self.control {
            if wait {
                let mut fds = [nix::poll::PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                if !matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(1)) {
                    return;
                }
            }
            let n = nix::unistd::read(fd.as_raw_fd(), &mut self.buf).unwrap_or(0);
            if n == 0 {
                self.control = None;
                return;
            }
            for line in self.lines.feed(&self.buf[..n]) {
                if let Some(d) = display::parse(&line) {
                    self.results.take(&d);
                }
            }
            if !wait {
                return;
            }
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
        self.control = s.control;
    }

    fn add_fds<'a>(&'a self, set: &mut PollSet<'a>) {
        if let Some(fd) = &self.control {
            set.add(fd.as_fd(), PollFlags::POLLIN, CONTROL);
        }
    }

    fn on_ready(&mut self, _slot: u32, _flags: PollFlags, _w: &mut Watched<'_>) {
        self.read_control(false);
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
        // What the runner wrote before it died is still queued: the tree
        // is dead, so this ends.
        self.read_control(true);
        self.ending
    }

    fn results(&mut self) -> (Vec<DisplayResult>, u64) {
        std::mem::take(&mut self.results).finish()
    }
}
