//! The watch loop: poll the child's pipes, its pidfd, the seccomp listener
//! and the streaming relays until PID 1 is gone and the pipes are drained;
//! answer the refusals the filter reports; hold the tree to its CPU quota
//! when no cgroup does (throttle.rs). What the step's clocks mean (a
//! script's deadlines, script.rs) is the [`Loop`] the watch drives, and
//! the [`Tree`] is what it may interrupt or kill.

use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::capture::Capture;
use crate::cgroup::RunCgroup;
use crate::seccomp;
use crate::sync::{self, Report};
use crate::sys;
use crate::throttle::Throttle;

/// The supervisor's read ends of the four pipes the child side writes to.
pub(crate) struct ChildPipes {
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
    pub(crate) report: OwnedFd,
    pub(crate) status: OwnedFd,
}

pub(crate) struct Watch<'m> {
    /// The step's wall deadline: past it, a caller that is not reading its
    /// stream gets nothing more (capture.rs).
    deadline: Instant,
    pub(crate) stdout: Capture,
    pub(crate) stderr: Capture,
    pub(crate) report_buf: Vec<u8>,
    pub(crate) status_buf: Vec<u8>,
    pub(crate) exec_at: Option<Instant>,
    /// Our end of the socketpair the seccomp listener arrives on.
    pub(crate) notify: Option<OwnedFd>,
    /// The seccomp user-notification listener, once the worker sent it.
    pub(crate) listener: Option<OwnedFd>,
    /// Not to be read again before this (seccomp::Next::After).
    pub(crate) listener_rest: Option<Instant>,
    pub(crate) tally: seccomp::Tally,
    pub(crate) model: &'m seccomp::Model,
    /// The CPU quota's enforcer when no cgroup has a cpu controller.
    pub(crate) throttle: Option<Throttle>,
}

/// How the watch loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// PID 1 exited by itself.
    Exited,
    /// The wall-clock deadline passed and the tree was killed.
    WallTimeout,
    /// The run cgroup's CPU usage reached the limit and the tree was killed.
    CpuTimeout,
    /// `jail` got this signal (cancel.rs) and the tree was killed.
    Cancelled(Signal),
}

/// What one step's clocks mean, for the watch loop that drives it: a
/// script's deadlines (script.rs); the session's cells loop is still its
/// own (session/serve.rs).
pub(crate) trait Loop {
    /// The earliest time the loop must look at its clocks again.
    fn wake(&self) -> Option<Instant>;
    /// The clocks, while the tree lives: past a limit, the tree is
    /// interrupted or killed.
    fn tick(&mut self, now: Instant, tree: &Tree<'_>);
    /// `jail` got `sig` (cancel.rs).
    fn cancelled(&mut self, sig: Signal, tree: &Tree<'_>);
    /// PID 1 is gone and the pipes drained, with the child side's
    /// `reports`: how the step ended.
    fn at_death(&mut self, reports: &[Report]) -> Ending;
}

/// The jail's process tree, as a loop may act on it.
pub(crate) struct Tree<'a> {
    pid: Pid,
    cgroup: Option<&'a RunCgroup>,
    killed: Cell<bool>,
}

impl<'a> Tree<'a> {
    pub(crate) fn new(pid: Pid, cgroup: Option<&'a RunCgroup>) -> Tree<'a> {
        Tree { pid, cgroup, killed: Cell::new(false) }
    }

    /// KeyboardInterrupt for the script: PID 1 forwards SIGINT to it
    /// (child.rs, `reaper`).
    pub(crate) fn interrupt(&self) {
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGINT);
    }

    /// Kill the whole tree: PID 1's death takes every process of the
    /// namespace with it; the cgroup kill is the belt to that.
    pub(crate) fn kill(&self) {
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        if let Some(cg) = self.cgroup {
            cg.kill();
        }
        self.killed.set(true);
    }

    /// The CPU time the whole tree has used, from the run cgroup; `None`
    /// without a cpu cgroup.
    pub(crate) fn cpu_ns(&self) -> Option<u64> {
        self.cgroup.and_then(RunCgroup::cpu_ns)
    }

    fn killed(&self) -> bool {
        self.killed.get()
    }
}

/// A step's limits, as the plan gives them: a script's [`Loop`] is built
/// from them (script.rs), and a session's loop reads them (session/serve.rs).
pub(crate) struct Deadlines<'a> {
    pub(crate) wall: Instant,
    /// The run cgroup and its CPU-time limit in nanoseconds.
    pub(crate) cpu: Option<(&'a RunCgroup, u64)>,
    /// Without that cgroup, RLIMIT_CPU's soft limit: the kernel enforces
    /// it, and a session's cells read its signals (session/serve.rs).
    pub(crate) cpu_rlimit: Option<std::time::Duration>,
}

/// A pipe the child side writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    Stdout,
    Stderr,
    /// End-of-file here means the interpreter was exec'd (sync.rs).
    Report,
    Status,
}

/// What one entry of the poll set is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pipe(From),
    /// The child's pidfd: readable once PID 1 has exited.
    Pidfd,
    /// The socketpair the seccomp listener arrives on.
    Notify,
    /// The seccomp user-notification listener.
    Listener,
    /// The caller's stdout or stderr, polled for POLLOUT while a relay has bytes.
    RelayOut,
    RelayErr,
    /// The signalfd of cancel.rs: `jail` was asked to stop.
    Cancel,
}

/// The pipes still open, by name.
struct Open {
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    report: Option<OwnedFd>,
    status: Option<OwnedFd>,
}

impl Open {
    fn get(&mut self, from: From) -> &mut Option<OwnedFd> {
        match from {
            From::Stdout => &mut self.stdout,
            From::Stderr => &mut self.stderr,
            From::Report => &mut self.report,
            From::Status => &mut self.status,
        }
    }

    fn any(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some() || self.report.is_some() || self.status.is_some()
    }
}

/// Where the loop stands.
struct Progress {
    /// PID 1 has exited (its pidfd was readable).
    exited: bool,
    /// A cancelling signal came (cancel.rs), not yet told to the loop.
    cancel: Option<Signal>,
}

impl Progress {
    /// The tree is dead or dying: only the pipes are left to drain.
    fn dying(&self, tree: &Tree<'_>) -> bool {
        self.exited || tree.killed()
    }
}

impl<'m> Watch<'m> {
    pub(crate) fn new(
        deadline: Instant,
        stdout: Capture,
        stderr: Capture,
        notify: Option<OwnedFd>,
        tally: seccomp::Tally,
        model: &'m seccomp::Model,
    ) -> Watch<'m> {
        Watch {
            deadline,
            stdout,
            stderr,
            report_buf: Vec::new(),
            status_buf: Vec::new(),
            exec_at: None,
            notify,
            listener: None,
            listener_rest: None,
            tally,
            model,
            throttle: None,
        }
    }
}

impl Watch<'_> {
    /// Poll every pipe and the child's pidfd until the child is gone and the
    /// pipes are drained, with `lp`'s clocks ticking while the tree lives;
    /// how the step ended, and the child side's reports.
    pub(crate) fn run(
        &mut self,
        lp: &mut dyn Loop,
        tree: &Tree<'_>,
        pidfd: &OwnedFd,
        pipes: ChildPipes,
    ) -> (Ending, Vec<Report>) {
        let mut open = Open {
            stdout: Some(pipes.stdout),
            stderr: Some(pipes.stderr),
            report: Some(pipes.report),
            status: Some(pipes.status),
        };
        let mut at = Progress { exited: false, cancel: None };
        let mut buf = vec![0u8; 64 * 1024];
        while !at.exited || open.any() {
            if at.dying(tree) && Instant::now() >= self.deadline {
                // Past the deadline a caller that is not reading gets nothing
                // more: stop waiting on the streams it holds up.
                if !self.stdout.wants_input() {
                    open.stdout = None;
                }
                if !self.stderr.wants_input() {
                    open.stderr = None;
                }
            }
            let (ready, revents) = self.poll_once(&open, pidfd, &at, at.dying(tree), lp.wake());
            if matches!(ready, Ok(0)) && at.exited {
                // Exited but a pipe did not close: a descriptor escaped the
                // tree somehow. Never hang on it.
                break;
            }
            for (slot, flags) in revents {
                if !flags.is_empty() {
                    self.on_ready(slot, flags, &mut open, &mut at, &mut buf);
                }
            }
            if !at.dying(tree) {
                match at.cancel.take() {
                    Some(sig) => lp.cancelled(sig, tree),
                    None => lp.tick(Instant::now(), tree),
                }
            }
            if let (Some(t), false) = (&mut self.throttle, at.dying(tree)) {
                t.check(Instant::now());
            }
        }
        let reports = self.reports();
        (lp.at_death(&reports), reports)
    }

    /// What the child side reported: its stages, failure and the script's
    /// exit (sync.rs).
    pub(crate) fn reports(&self) -> Vec<Report> {
        let mut reports = sync::parse_reports(&self.report_buf);
        reports.extend(sync::parse_reports(&self.status_buf));
        reports
    }

    /// One poll(2) over everything that may be ready now; what each entry
    /// reported, by slot.
    fn poll_once(
        &self,
        open: &Open,
        pidfd: &OwnedFd,
        at: &Progress,
        dying: bool,
        wake: Option<Instant>,
    ) -> (nix::Result<i32>, Vec<(Slot, PollFlags)>) {
        let timeout = if dying {
            // The tree is dead or dying; the pipes close as soon as it is.
            PollTimeout::from(200u16)
        } else {
            let mut left = std::time::Duration::MAX;
            if let Some(wake) = wake {
                left = wake.saturating_duration_since(Instant::now());
            }
            if let Some(t) = &self.throttle {
                left = left.min(t.next_wake().saturating_duration_since(Instant::now()));
            }
            PollTimeout::try_from(left.as_millis().min(60_000) as u64 + 1).unwrap_or(PollTimeout::MAX)
        };
        let mut fds: Vec<PollFd> = Vec::with_capacity(9);
        let mut which: Vec<Slot> = Vec::with_capacity(9);
        // A stream whose caller has a full buffer to take is not read
        // until it catches up: the script waits, we do not.
        for (from, fd, wanted) in [
            (From::Stdout, &open.stdout, self.stdout.wants_input()),
            (From::Stderr, &open.stderr, self.stderr.wants_input()),
            (From::Report, &open.report, true),
            (From::Status, &open.status, true),
        ] {
            if let (Some(fd), true) = (fd, wanted) {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                which.push(Slot::Pipe(from));
            }
        }
        for (slot, capture) in [(Slot::RelayOut, &self.stdout), (Slot::RelayErr, &self.stderr)] {
            if let Some(fd) = capture.pending_out() {
                fds.push(PollFd::new(fd, PollFlags::POLLOUT));
                which.push(slot);
            }
        }
        if !at.exited {
            fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
            which.push(Slot::Pidfd);
        }
        if let (Some(fd), false) = (crate::cancel::fd(), dying) {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            which.push(Slot::Cancel);
        }
        // Past the answer cap the listener is read at a pace (seccomp/notify.rs,
        // PAST_CAP_PACE): left out of the poll until its time comes.
        let now = Instant::now();
        let resting = self.listener_rest.filter(|&t| t > now);
        let timeout = match resting {
            Some(t) => timeout.min(PollTimeout::try_from((t - now).as_millis() as u64 + 1).unwrap_or(PollTimeout::MAX)),
            None => timeout,
        };
        let listener = if resting.is_some() { &None } else { &self.listener };
        for (slot, fd) in [(Slot::Notify, &self.notify), (Slot::Listener, listener)] {
            if let Some(fd) = fd {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                which.push(slot);
            }
        }
        let ready = poll(&mut fds, timeout);
        let revents = fds.iter().zip(&which).map(|(f, &s)| (s, f.revents().unwrap_or(PollFlags::empty()))).collect();
        (ready, revents)
    }

    /// Act on one ready entry of the poll set.
    fn on_ready(&mut self, slot: Slot, flags: PollFlags, open: &mut Open, at: &mut Progress, buf: &mut [u8]) {
        match slot {
            Slot::Pidfd => at.exited = true,
            Slot::Cancel => at.cancel = at.cancel.or(crate::cancel::received()),
            Slot::RelayOut | Slot::RelayErr => {
                let capture = if slot == Slot::RelayOut { &mut self.stdout } else { &mut self.stderr };
                capture.flush_out();
            }
            Slot::Notify => {
                // One message: the listener, or end-of-file when the
                // worker failed before loading the filter.
                if let Some(sock) = self.notify.take() {
                    self.listener = sys::recv_fd(sock.as_fd()).ok().flatten();
                }
            }
            Slot::Listener => {
                let Some(listener) = &self.listener else { return };
                if flags.contains(PollFlags::POLLIN) {
                    self.listener_rest = match self.tally.answer(self.model, listener) {
                        seccomp::Next::Now => None,
                        seccomp::Next::After(pause) => Some(Instant::now() + pause),
                    };
                } else {
                    // Every process under the filter is gone.
                    self.listener = None;
                }
            }
            Slot::Pipe(from) => self.read_pipe(open.get(from), from, buf),
        }
    }

    /// One read from a ready pipe: its bytes to where they belong, or, at
    /// end-of-file, the pipe closed (and, for `report`, the exec noted).
    fn read_pipe(&mut self, pipe: &mut Option<OwnedFd>, from: From, buf: &mut [u8]) {
        let Some(fd) = pipe else { return };
        let n = nix::unistd::read(fd.as_raw_fd(), buf).unwrap_or(0);
        if n == 0 {
            *pipe = None;
            if from == From::Report {
                self.exec_at = Some(Instant::now());
            }
            return;
        }
        let chunk = &buf[..n];
        match from {
            From::Stdout => self.stdout.push(chunk),
            From::Stderr => self.stderr.push(chunk),
            From::Report => self.report_buf.extend_from_slice(chunk),
            From::Status => self.status_buf.extend_from_slice(chunk),
        }
    }
}
