//! The watch loop: poll the child's pipes, its pidfd, the seccomp listener
//! and the streaming relays until PID 1 is gone and the pipes are drained;
//! answer the refusals the filter reports; hold the tree to its CPU quota
//! when no cgroup does (throttle.rs). What the step's clocks mean (a
//! script's deadlines, script.rs) is the [`Loop`] the watch drives, and
//! the [`Tree`] is what it may interrupt or kill. A session's cells
//! (session/cells.rs) are the other loop: they add their own descriptors
//! to the poll set (the driver's control channel, the clients, the
//! lifeline), say where the streams go (each cell's capture), and drain
//! the pipes when a cell is done ([`Watched::drain`]).

use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::capture::Capture;
use crate::cgroup::RunCgroup;
use crate::output::FsIds;
use crate::result::{Denial, DisplayResult, RunResult, Throttled};
use crate::seccomp;
use crate::step::{Delivery, Ending};
use crate::streams::Target;
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
    report_buf: Vec<u8>,
    status_buf: Vec<u8>,
    pub(crate) exec_at: Option<Instant>,
    /// Our end of the socketpair the seccomp listener arrives on.
    notify: Option<OwnedFd>,
    /// The seccomp user-notification listener, once the worker sent it.
    listener: Option<OwnedFd>,
    /// Not to be read again before this (seccomp::Next::After).
    listener_rest: Option<Instant>,
    pub(crate) tally: seccomp::Tally,
    model: &'m seccomp::Model,
    /// The CPU quota's enforcer when no cgroup has a cpu controller.
    pub(crate) throttle: Option<Throttle>,
}

/// What one step's clocks mean, for the watch loop that drives it: a
/// script's deadlines (script.rs), or a session's cells (session/cells.rs).
/// The watch owns the poll, the pipes, the pidfd, the seccomp listener,
/// the relays, the cancel and the throttle; the loop says what they mean.
/// What only the cells need (their streams, their descriptors, their
/// tails, an adopted folder) has a default, which is what a script needs.
pub(crate) trait Loop {
    /// The jail is released and its hand-overs made: the step's clocks
    /// start now.
    fn started(&mut self, s: Started<'_>);
    /// Where the script's `t` bytes go now; `None`: the step's own
    /// capture (the watch's).
    fn capture(&mut self, _t: Target) -> Option<&mut Capture> {
        None
    }
    /// Whether the stdout and stderr pipes may be read now; `None`: as the
    /// step's own captures say.
    fn wants_input(&self) -> Option<(bool, bool)> {
        None
    }
    /// The loop's own descriptors, for this round's poll.
    fn add_fds<'a>(&'a self, _set: &mut PollSet<'a>) {}
    /// One of the loop's descriptors (its `slot`, as added) is ready.
    fn on_ready(&mut self, _slot: u32, _flags: PollFlags, _w: &mut Watched<'_>) {}
    /// The earliest time the loop must look at its clocks again.
    fn wake(&self) -> Option<Instant>;
    /// The clocks, while the tree lives: past a limit, the tree is
    /// interrupted or killed.
    fn tick(&mut self, now: Instant, w: &mut Watched<'_>);
    /// After every poll round, the tree alive or not: what the loop owes
    /// its clients moves on.
    fn flush(&mut self, _now: Instant) {}
    /// `jail` got `sig` (cancel.rs).
    fn cancelled(&mut self, sig: Signal, w: &mut Watched<'_>);
    /// PID 1 is gone and the pipes drained, with the child side's
    /// `reports`: how the step ended.
    fn at_death(&mut self, reports: &[Report], w: &mut Watched<'_>) -> Ending;
    /// Where the step's output is judged and delivered, when not where
    /// the plan says (a session that adopted a folder, session/adopt.rs).
    fn delivery(&mut self) -> Option<Delivery> {
        None
    }
    /// The step's rich results, judged (display.rs), and how many were
    /// dropped whole: a script's; a session's are each cell's own.
    fn results(&mut self) -> (Vec<DisplayResult>, u64) {
        (Vec::new(), 0)
    }
}

/// What a loop is handed when the step starts.
pub(crate) struct Started<'a> {
    /// The step's result so far: its isolation and limits.
    pub(crate) seed: &'a RunResult,
    /// The jail's PID 1, in our pid namespace.
    pub(crate) pid: Pid,
    /// The wall-clock deadline of the whole step.
    pub(crate) wall: Instant,
    /// The run cgroup's CPU-time limit in nanoseconds, when a cpu cgroup
    /// counts it.
    pub(crate) cpu_limit: Option<u64>,
    /// Without that cgroup, RLIMIT_CPU's soft limit: the kernel enforces
    /// it.
    pub(crate) cpu_rlimit: Option<Duration>,
    /// The run cgroup's folders.
    pub(crate) cgroup_dirs: Vec<&'a std::path::Path>,
    /// The jail's output tmpfs, as the launch filled it; `None` with a
    /// bound output folder.
    pub(crate) output: Option<&'a OwnedFd>,
    pub(crate) ids: FsIds,
    /// Our end of the control channel, when the plan opened one.
    pub(crate) control: Option<OwnedFd>,
}

/// The descriptors of one poll round.
pub(crate) struct PollSet<'a> {
    fds: Vec<PollFd<'a>>,
    which: Vec<Slot>,
}

impl<'a> PollSet<'a> {
    fn push(&mut self, fd: BorrowedFd<'a>, flags: PollFlags, slot: Slot) {
        self.fds.push(PollFd::new(fd, flags));
        self.which.push(slot);
    }

    /// Poll `fd` for `flags`; `slot` is what the loop is told it is.
    pub(crate) fn add(&mut self, fd: BorrowedFd<'a>, flags: PollFlags, slot: u32) {
        self.push(fd, flags, Slot::Loop(slot));
    }
}

/// What a loop sees of the watch, and may act on, when it is called.
pub(crate) struct Watched<'w> {
    pub(crate) tree: &'w Tree<'w>,
    tally: &'w seccomp::Tally,
    model: &'w seccomp::Model,
    throttle: Option<&'w Throttle>,
    open: &'w mut Open,
    buf: &'w mut [u8],
}

impl Watched<'_> {
    /// The refusals so far (seccomp).
    pub(crate) fn denials(&self) -> Vec<Denial> {
        self.tally.denials(self.model)
    }

    /// What the CPU throttle did so far, when it enforces the quota.
    pub(crate) fn throttled(&self, now: Instant) -> Option<Throttled> {
        self.throttle.map(|t| t.report(now))
    }

    /// What the CPU throttle did since `before`.
    pub(crate) fn throttled_since(&self, before: &Throttled, now: Instant) -> Option<Throttled> {
        self.throttle.map(|t| t.report_since(before, now))
    }

    /// Read the stdout and stderr pipes into `out` and `err` until nothing
    /// more is there now (a session's driver flushes before it says a
    /// cell is done).
    pub(crate) fn drain(&mut self, out: &mut Capture, err: &mut Capture) {
        for _ in 0..1024 {
            let mut got = false;
            for (from, capture) in [(From::Stdout, &mut *out), (From::Stderr, &mut *err)] {
                let pipe = self.open.get(from);
                let Some(fd) = pipe else { continue };
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
                    continue;
                }
                got = true;
                let n = nix::unistd::read(fd.as_raw_fd(), self.buf).unwrap_or(0);
                if n == 0 {
                    *pipe = None;
                } else {
                    capture.push(&self.buf[..n]);
                }
            }
            if !got {
                return;
            }
        }
    }
}

/// The jail's process tree, as a loop may act on it.
pub(crate) struct Tree<'a> {
    pid: Pid,
    /// PID 1's pidfd: what every signal to it goes through.
    pidfd: BorrowedFd<'a>,
    cgroup: Option<&'a RunCgroup>,
    killed: Cell<bool>,
}

impl<'a> Tree<'a> {
    pub(crate) fn new(pid: Pid, pidfd: BorrowedFd<'a>, cgroup: Option<&'a RunCgroup>) -> Tree<'a> {
        Tree { pid, pidfd, cgroup, killed: Cell::new(false) }
    }

    /// KeyboardInterrupt for the script: PID 1 forwards SIGINT to it
    /// (child.rs, `reaper`).
    pub(crate) fn interrupt(&self) {
        let _ = crate::sys::pidfd_send_signal(self.pidfd, Signal::SIGINT);
    }

    /// Kill the whole tree: PID 1's death takes every process of the
    /// namespace with it; the cgroup kill is the belt to that.
    pub(crate) fn kill(&self) {
        // By pidfd: a template's fork is not our child, and once its
        // template has reaped it its pid may be another process's.
        let _ = crate::sys::pidfd_send_signal(self.pidfd, Signal::SIGKILL);
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

    /// The CPU time the tree has run: the run cgroup's, else the sum over
    /// its processes in /proc (10 ms ticks; what PID 1 reaped counted in
    /// its own); `None` when neither can be read.
    pub(crate) fn run_time(&self) -> Option<Duration> {
        match self.cpu_ns() {
            Some(ns) => Some(Duration::from_nanos(ns)),
            None => crate::throttle::tree_cpu(self.pid),
        }
    }

    /// The run cgroup's counters now; `None` without a cgroup.
    pub(crate) fn usage(&self) -> Option<crate::cgroup::CgroupUsage> {
        self.cgroup.map(RunCgroup::usage)
    }

    /// PID 1, whose own stat counts the CPU time of what it reaped.
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Hold the tree still until the hold is dropped (still.rs).
    pub(crate) fn hold(&self, within: Duration) -> Result<crate::still::Hold<'a>, String> {
        crate::still::hold(self.pid, self.cgroup, within)
    }

    /// Whether a loop killed the tree.
    pub(crate) fn killed(&self) -> bool {
        self.killed.get()
    }
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
    /// One of the loop's own descriptors (`Loop::add_fds`).
    Loop(u32),
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
            let (ready, revents) = self.poll_once(&open, pidfd, &at, at.dying(tree), &*lp);
            if matches!(ready, Ok(0)) && at.exited {
                // Exited but a pipe did not close: a descriptor escaped the
                // tree somehow. Never hang on it.
                break;
            }
            for (slot, flags) in revents {
                if flags.is_empty() {
                    continue;
                }
                match slot {
                    Slot::Loop(i) => lp.on_ready(i, flags, &mut self.watched(tree, &mut open, &mut buf)),
                    _ => self.on_ready(slot, flags, &mut open, &mut at, &mut buf, lp),
                }
            }
            lp.flush(Instant::now());
            if !at.dying(tree) {
                let mut w = self.watched(tree, &mut open, &mut buf);
                match at.cancel.take() {
                    Some(sig) => lp.cancelled(sig, &mut w),
                    None => lp.tick(Instant::now(), &mut w),
                }
            }
            if let (Some(t), false) = (&mut self.throttle, at.dying(tree)) {
                t.check(Instant::now());
            }
        }
        let reports = self.reports();
        (lp.at_death(&reports, &mut self.watched(tree, &mut open, &mut buf)), reports)
    }

    /// What a loop sees of the watch now.
    fn watched<'w>(&'w self, tree: &'w Tree<'w>, open: &'w mut Open, buf: &'w mut [u8]) -> Watched<'w> {
        Watched {
            tree,
            tally: &self.tally,
            model: self.model,
            throttle: self.throttle.as_ref(),
            open,
            buf,
        }
    }

    /// What the child side reported: its stages, failure and the script's
    /// exit (sync.rs).
    fn reports(&self) -> Vec<Report> {
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
        lp: &dyn Loop,
    ) -> (nix::Result<i32>, Vec<(Slot, PollFlags)>) {
        let timeout = if dying {
            // The tree is dead or dying; the pipes close as soon as it is.
            PollTimeout::from(200u16)
        } else {
            let mut left = Duration::MAX;
            if let Some(wake) = lp.wake() {
                left = wake.saturating_duration_since(Instant::now());
            }
            if let Some(t) = &self.throttle {
                left = left.min(t.next_wake().saturating_duration_since(Instant::now()));
            }
            PollTimeout::try_from(left.as_millis().min(60_000) as u64 + 1).unwrap_or(PollTimeout::MAX)
        };
        let mut set = PollSet { fds: Vec::with_capacity(12), which: Vec::with_capacity(12) };
        // A stream whose caller has a full buffer to take is not read
        // until it catches up: the script waits, we do not.
        let (want_out, want_err) = lp.wants_input().unwrap_or((self.stdout.wants_input(), self.stderr.wants_input()));
        for (from, fd, wanted) in [
            (From::Stdout, &open.stdout, want_out),
            (From::Stderr, &open.stderr, want_err),
            (From::Report, &open.report, true),
            (From::Status, &open.status, true),
        ] {
            if let (Some(fd), true) = (fd, wanted) {
                set.push(fd.as_fd(), PollFlags::POLLIN, Slot::Pipe(from));
            }
        }
        for (slot, capture) in [(Slot::RelayOut, &self.stdout), (Slot::RelayErr, &self.stderr)] {
            if let Some(fd) = capture.pending_out() {
                set.push(fd, PollFlags::POLLOUT, slot);
            }
        }
        if !at.exited {
            set.push(pidfd.as_fd(), PollFlags::POLLIN, Slot::Pidfd);
        }
        if let (Some(fd), false) = (crate::cancel::fd(), dying) {
            set.push(fd, PollFlags::POLLIN, Slot::Cancel);
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
                set.push(fd.as_fd(), PollFlags::POLLIN, slot);
            }
        }
        lp.add_fds(&mut set);
        let PollSet { mut fds, which } = set;
        let ready = poll(&mut fds, timeout);
        let revents = fds.iter().zip(&which).map(|(f, &s)| (s, f.revents().unwrap_or(PollFlags::empty()))).collect();
        (ready, revents)
    }

    /// Act on one ready entry of the poll set.
    fn on_ready(&mut self, slot: Slot, flags: PollFlags, open: &mut Open, at: &mut Progress, buf: &mut [u8], lp: &mut dyn Loop) {
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
            Slot::Pipe(from) => self.read_pipe(open.get(from), from, buf, lp),
            Slot::Loop(_) => {}
        }
    }

    /// One read from a ready pipe: its bytes to where they belong (the
    /// loop's capture, or the step's own), or, at end-of-file, the pipe
    /// closed (and, for `report`, the exec noted).
    fn read_pipe(&mut self, pipe: &mut Option<OwnedFd>, from: From, buf: &mut [u8], lp: &mut dyn Loop) {
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
            From::Stdout => lp.capture(Target::Stdout).unwrap_or(&mut self.stdout).push(chunk),
            From::Stderr => lp.capture(Target::Stderr).unwrap_or(&mut self.stderr).push(chunk),
            From::Report => self.report_buf.extend_from_slice(chunk),
            From::Status => self.status_buf.extend_from_slice(chunk),
        }
    }
}
