//! The session's serve loop, in place of the one-script watch (watch.rs):
//! wait for the driver's `ready`, then serve one client at a time — each
//! `exec` becomes one cell sent on the control channel and one result
//! back — until the session ends (stop, idle timeout, lifetime, a cell
//! killed after its grace, or a dead interpreter). Meanwhile it does what
//! the watch does for a run: reads the pipes, answers the seccomp
//! listener, and kills the whole tree when it must.
//!
//! Streams are split per cell by time: a cell's stdout and stderr are what
//! reached the pipes between its `exec` and its `done`, and the pipes are
//! drained once more after `done` (the driver flushes before it replies).
//! Output written later by something the cell left running lands in the
//! next cell's streams.
//!
//! SIGTERM, SIGINT or SIGHUP to the session supervisor (armed in
//! session.rs, read from cancel.rs's signalfd) cancel the session: the
//! cell in flight is killed at once and answered `cancelled`
//! (`supervisor.cancelled_by` names the signal), and the session ends as a
//! stop ends it. This is how `jail pool` stops a step (pool/run/cancel.rs).
//!
//! A cell asked with `events` also sends its streams live to its client
//! (live.rs): the loop writes them without blocking, reads the cell's pipes
//! only while the client keeps up (until the cell is past its time), and
//! flushes each finished cell's tail as its client takes it while it serves
//! the next.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::cell::{self, Death, Facts, Outcome, Overrun, Reply};
use super::handle::{self, Answer, Request};
use super::live::{self, Tail};
use super::{Serve, Why};
use crate::capture::Capture;
use crate::cgroup::{CgroupUsage, RunCgroup};
use crate::events::Events;
use crate::result::{Denial, PythonError, Throttled, Timings, Usage};
use crate::streams::{OutputMode, Target};
use crate::sync::{self, Report};
use crate::watch::{ChildPipes, Deadlines, Ending, Tree, Watch};
use crate::{limits, seccomp, sys};

/// How long a closed session's driver gets to exit before the tree is killed.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

enum Phase {
    /// Waiting for the driver's `ready`.
    Starting,
    Idle {
        since: Instant,
    },
    Running(Box<Cell>),
    /// The session is over; waiting for the tree to go.
    Ending {
        kill_at: Instant,
    },
}

/// One cell in flight.
struct Cell {
    id: u64,
    client: UnixStream,
    started: Instant,
    deadline: Instant,
    cpu_start: Option<u64>,
    usage_start: Option<CgroupUsage>,
    /// The supervisor's throttle at the start (no cpu cgroup).
    throttled_start: Option<Throttled>,
    denials_start: Vec<Denial>,
    stdout: Capture,
    stderr: Capture,
    /// Why and when the supervisor sent SIGINT.
    interrupted: Option<(Overrun, Instant)>,
    done: Option<(Outcome, Option<i32>, Option<PythonError>)>,
    /// With `--events`: the cell's streams, live on its client's socket
    /// (live.rs).
    live: Option<Rc<RefCell<Events>>>,
}

struct Pipes {
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    report: Option<OwnedFd>,
    status: Option<OwnedFd>,
}

impl Pipes {
    fn any(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some() || self.report.is_some() || self.status.is_some()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Stdout,
    Stderr,
    Report,
    Status,
    Pidfd,
    Control,
    Clients,
    Notify,
    Listener,
    Lifeline,
    /// A cancelling signal came (cancel.rs).
    Cancel,
    /// The running cell's client can take more of its live events.
    LiveOut,
    /// A finished cell's client can take more of its tail (live.rs).
    Tail(usize),
}

struct Loop<'s, 'w, 'm> {
    s: &'s Serve,
    watch: &'w mut Watch<'m>,
    pid: Pid,
    cgroup: Option<&'s RunCgroup>,
    cpu_limit: Option<u64>,
    /// RLIMIT_CPU's soft limit, when it stands in for the cgroup's CPU check.
    cpu_rlimit: Option<Duration>,
    control: Option<OwnedFd>,
    pipes: Pipes,
    ctl_buf: Vec<u8>,
    /// Past an over-long reply line: dropping bytes up to its newline.
    ctl_skipping: bool,
    phase: Phase,
    cells: u64,
    exited: bool,
    killed: bool,
    /// Output that arrived between cells, for the next one.
    spill_out: Capture,
    spill_err: Capture,
    buf: Vec<u8>,
    /// Finished cells' live events still on their way to their clients.
    tails: Vec<Tail>,
    /// The signal that cancelled the session, once one came.
    cancelled: Option<Signal>,
    /// When `session.max_lifetime_secs` ends the session: from the jail's
    /// start, or from a pool's hand-over to its caller.
    lifetime: Instant,
    /// Requests that came while a cell ran (an `exec`, an output to adopt),
    /// served in order once it is done.
    waiting: std::collections::VecDeque<(UnixStream, Request)>,
}

/// Most requests kept waiting for a running cell; more are refused.
const MOST_WAITING: usize = 16;
/// How long a request sent while a cell runs may take to arrive.
const RUNNING_READ_WAIT: Duration = Duration::from_secs(1);

/// Serve the session until it ends; the tree is dead or dying when this
/// returns, and launch.rs reaps it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    s: &Serve,
    watch: &mut Watch<'_>,
    pid: Pid,
    pidfd: &OwnedFd,
    pipes: ChildPipes,
    control: OwnedFd,
    limits: &Deadlines<'_>,
    cgroup: Option<&RunCgroup>,
) -> Ending {
    if let Some(cg) = cgroup {
        // The janitor removes these should we be killed (session.rs).
        s.tell_janitor(cg.dirs());
    }
    // A driver that stops reading cannot hold the supervisor on a write.
    let _ = nix::sys::socket::setsockopt(&control, nix::sys::socket::sockopt::SendTimeout, &nix::sys::time::TimeVal::new(5, 0));
    let cap = (s.limits.stdout_cap, s.limits.stderr_cap);
    let mut l = Loop {
        s,
        watch,
        pid,
        cgroup,
        cpu_limit: limits.cpu.map(|(_, ns)| ns),
        cpu_rlimit: limits.cpu_rlimit,
        control: Some(control),
        pipes: Pipes {
            stdout: Some(pipes.stdout),
            stderr: Some(pipes.stderr),
            report: Some(pipes.report),
            status: Some(pipes.status),
        },
        ctl_buf: Vec::new(),
        ctl_skipping: false,
        phase: Phase::Starting,
        cells: 0,
        exited: false,
        killed: false,
        spill_out: Capture::new(cap.0, OutputMode::Capture, Target::Stdout),
        spill_err: Capture::new(cap.1, OutputMode::Capture, Target::Stderr),
        buf: vec![0u8; 64 * 1024],
        tails: Vec::new(),
        cancelled: None,
        lifetime: limits.wall,
        waiting: std::collections::VecDeque::new(),
    };
    let mut next_cpu_check = Instant::now();
    let mut ending = Ending::Exited;
    while !l.exited || l.pipes.any() {
        let now = Instant::now();
        let wake = l.next_wake(next_cpu_check);
        let timeout = if l.exited {
            PollTimeout::from(200u16)
        } else {
            let left = wake.saturating_duration_since(now);
            PollTimeout::try_from(left.as_millis().min(60_000) as u64 + 1).unwrap_or(PollTimeout::MAX)
        };
        let listener_fd = l.watch.listener.as_ref().filter(|_| l.watch.listener_rest.is_none_or(|t| t <= now));
        let mut fds = Vec::with_capacity(12);
        let mut which = Vec::with_capacity(12);
        let (want_out, want_err) = l.wants_input();
        for (slot, fd) in [
            (Slot::Stdout, l.pipes.stdout.as_ref().filter(|_| want_out)),
            (Slot::Stderr, l.pipes.stderr.as_ref().filter(|_| want_err)),
            (Slot::Report, l.pipes.report.as_ref()),
            (Slot::Status, l.pipes.status.as_ref()),
            (Slot::Pidfd, Some(pidfd).filter(|_| !l.exited)),
            (Slot::Control, l.control.as_ref()),
            (Slot::Notify, l.watch.notify.as_ref()),
            (Slot::Listener, listener_fd),
        ] {
            if let Some(fd) = fd {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                which.push(slot);
            }
        }
        if let Some(fd) = s.lifeline.as_ref().filter(|_| !matches!(l.phase, Phase::Ending { .. })) {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            which.push(Slot::Lifeline);
        }
        if let Some(fd) = crate::cancel::fd().filter(|_| !l.exited && l.cancelled.is_none()) {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            which.push(Slot::Cancel);
        }
        if matches!(l.phase, Phase::Idle { .. } | Phase::Running(_)) {
            // While a cell runs too: an `interrupt` or a `stop` is served
            // then; an `exec` waits its turn (`waiting`).
            fds.push(PollFd::new(s.listener.as_fd(), PollFlags::POLLIN));
            which.push(Slot::Clients);
        }
        if let Some(fd) = match &l.phase {
            Phase::Running(c) => c.stdout.pending_out(),
            _ => None,
        } {
            fds.push(PollFd::new(fd, PollFlags::POLLOUT));
            which.push(Slot::LiveOut);
        }
        for (i, t) in l.tails.iter().enumerate() {
            if let Some(fd) = t.pending_out() {
                fds.push(PollFd::new(fd, PollFlags::POLLOUT));
                which.push(Slot::Tail(i));
            }
        }
        let ready = poll(&mut fds, timeout);
        let events: Vec<(Slot, PollFlags)> =
            fds.iter().zip(&which).map(|(f, &w)| (w, f.revents().unwrap_or(PollFlags::empty()))).collect();
        drop(fds);
        if matches!(ready, Ok(0)) && l.exited {
            // A pipe that did not close with the tree: never hang on it.
            break;
        }
        for (slot, flags) in events {
            if !flags.is_empty() {
                l.on_event(slot, flags);
            }
        }
        let now = Instant::now();
        l.tails.retain_mut(|t| t.step(now));
        if l.exited {
            continue;
        }
        let now = Instant::now();
        if now >= l.lifetime && !matches!(l.phase, Phase::Ending { .. }) {
            ending = Ending::WallTimeout;
            l.end(Why::MaxLifetime, None);
        }
        if let Some(cg) = cgroup {
            if now >= next_cpu_check {
                next_cpu_check = now + limits::CPU_POLL;
                l.check_cpu(cg);
            }
        }
        if let Some(t) = &mut l.watch.throttle {
            // No cpu cgroup: the quota holds across cells, as a cgroup's would.
            t.check(now);
        }
        l.check_timers(now);
        l.serve_waiting();
    }
    l.finish_cell_at_death();
    for (client, _) in l.waiting.drain(..) {
        let why = s.end_why().map_or_else(|| "the session ended".to_string(), |w| w.describe(&s.session));
        handle::answer(
            &client,
            &Answer {
                result: None,
                error: Some(format!("the session ended before this request was served ({why})")),
            },
        );
    }
    if let Some(sig) = l.cancelled {
        // The closing result says so, as a cancelled run's does.
        ending = Ending::Cancelled(sig);
    }
    if matches!(l.phase, Phase::Starting) {
        s.set_end(Why::NeverReady, None);
    }
    // The session is over: its last live clients get a bounded moment,
    // as a plain answer's write has.
    let by = Instant::now() + live::ANSWER_WAIT;
    for t in l.tails.drain(..) {
        t.finish(by);
    }
    ending
}

impl Loop<'_, '_, '_> {
    /// The earliest time the loop must look at its clocks again.
    fn next_wake(&self, next_cpu_check: Instant) -> Instant {
        let mut wake = self.lifetime;
        match &self.phase {
            Phase::Starting => {}
            Phase::Idle { since } => wake = wake.min(*since + self.s.session.idle_timeout),
            Phase::Running(c) => {
                wake = wake.min(match c.interrupted {
                    None => c.deadline,
                    Some((_, at)) => at + self.s.session.interrupt_grace,
                });
                if self.cgroup.is_some() && self.cpu_limit.is_some() && c.interrupted.is_none() {
                    wake = wake.min(next_cpu_check);
                }
            }
            Phase::Ending { kill_at } => wake = wake.min(*kill_at),
        }
        if let Some(t) = &self.watch.throttle {
            wake = wake.min(t.next_wake());
        }
        if let Some(t) = self.watch.listener_rest {
            wake = wake.min(t);
        }
        for t in &self.tails {
            wake = wake.min(t.wake());
        }
        wake
    }

    /// Whether the cell's stdout and stderr pipes may be read now: not
    /// while its live client has a full buffer to take (the cell waits,
    /// not us), until the cell is past its time and must be able to write
    /// its traceback.
    fn wants_input(&self) -> (bool, bool) {
        match &self.phase {
            Phase::Running(c) if c.interrupted.is_none() => (c.stdout.wants_input(), c.stderr.wants_input()),
            _ => (true, true),
        }
    }

    fn on_event(&mut self, slot: Slot, flags: PollFlags) {
        match slot {
            Slot::Stdout | Slot::Stderr | Slot::Report | Slot::Status => self.read_pipe(slot),
            Slot::Pidfd => self.exited = true,
            Slot::Control => self.read_control(),
            Slot::Clients => self.accept(),
            // The owner's end closed (or it wrote, which it never does):
            // the owner is gone, and so is the session.
            Slot::Lifeline => self.end(Why::OwnerGone, None),
            Slot::Cancel => {
                if let Some(sig) = crate::cancel::received() {
                    self.cancelled = Some(sig);
                    self.end(Why::Cancelled(sig), None);
                }
            }
            Slot::LiveOut => {
                if let Phase::Running(c) = &mut self.phase {
                    c.stdout.flush_out();
                }
            }
            Slot::Tail(i) => {
                if let Some(t) = self.tails.get_mut(i) {
                    t.flush();
                }
            }
            Slot::Notify => {
                if let Some(sock) = self.watch.notify.take() {
                    self.watch.listener = sys::recv_fd(sock.as_fd()).ok().flatten();
                }
            }
            Slot::Listener => {
                let Some(listener) = &self.watch.listener else { return };
                if flags.contains(PollFlags::POLLIN) {
                    self.watch.listener_rest = match self.watch.tally.answer(self.watch.model, listener) {
                        seccomp::Next::Now => None,
                        seccomp::Next::After(pause) => Some(Instant::now() + pause),
                    };
                } else {
                    self.watch.listener = None;
                }
            }
        }
    }

    fn read_pipe(&mut self, slot: Slot) {
        let pipe = match slot {
            Slot::Stdout => &mut self.pipes.stdout,
            Slot::Stderr => &mut self.pipes.stderr,
            Slot::Report => &mut self.pipes.report,
            _ => &mut self.pipes.status,
        };
        let Some(fd) = pipe else { return };
        let n = nix::unistd::read(fd.as_raw_fd(), &mut self.buf).unwrap_or(0);
        if n == 0 {
            *pipe = None;
            if slot == Slot::Report {
                self.watch.exec_at = Some(Instant::now());
            }
            return;
        }
        let chunk = &self.buf[..n];
        let running = match &mut self.phase {
            Phase::Running(c) => Some(c),
            _ => None,
        };
        match (slot, running) {
            (Slot::Stdout, Some(c)) => c.stdout.push(chunk),
            (Slot::Stderr, Some(c)) => c.stderr.push(chunk),
            (Slot::Stdout, None) => self.spill_out.push(chunk),
            (Slot::Stderr, None) => self.spill_err.push(chunk),
            (Slot::Report, _) => self.watch.report_buf.extend_from_slice(chunk),
            _ => self.watch.status_buf.extend_from_slice(chunk),
        }
    }

    /// Read what the driver wrote; act on each whole line.
    fn read_control(&mut self) {
        let Some(fd) = &self.control else { return };
        let n = nix::unistd::read(fd.as_raw_fd(), &mut self.buf).unwrap_or(0);
        if n == 0 {
            // The driver closed its end: it is exiting (the pidfd follows).
            self.control = None;
            return;
        }
        let mut lines = Vec::new();
        for &b in &self.buf[..n] {
            if b == b'\n' {
                if !std::mem::take(&mut self.ctl_skipping) {
                    lines.push(std::mem::take(&mut self.ctl_buf));
                }
                self.ctl_buf.clear();
            } else if !self.ctl_skipping {
                self.ctl_buf.push(b);
                if self.ctl_buf.len() > cell::MAX_REPLY {
                    // Bounded: an over-long line is dropped, not kept.
                    self.ctl_buf.clear();
                    self.ctl_skipping = true;
                }
            }
        }
        for line in lines {
            self.on_reply(cell::parse_reply(&line));
        }
    }

    fn on_reply(&mut self, reply: Reply) {
        match (reply, &mut self.phase) {
            (Reply::Ready, Phase::Starting) => {
                self.s.say_ready();
                self.phase = Phase::Idle { since: Instant::now() };
            }
            // Only the cell in flight can end, and only once: a line
            // naming another cell, or a second `done`, is ignored.
            (Reply::Done { id, outcome, exit_code, error }, Phase::Running(c)) if id == c.id && c.done.is_none() => {
                c.done = Some((outcome, exit_code, error));
                self.finish_cell();
            }
            _ => {}
        }
    }

    /// One client: checked, its request read and acted on.
    fn accept(&mut self) {
        let Ok((stream, _)) = self.s.listener.accept() else { return };
        let _ = stream.set_nonblocking(false);
        let me = nix::unistd::geteuid().as_raw();
        match handle::peer_uid(&stream) {
            Ok(uid) if uid == me => {}
            Ok(uid) => return handle::refuse(&stream, format!("uid {uid} is not this session's owner (uid {me})")),
            Err(e) => return handle::refuse(&stream, format!("SO_PEERCRED: {e}")),
        }
        let running = matches!(self.phase, Phase::Running(_));
        let read = if running {
            handle::read_request_within(&stream, RUNNING_READ_WAIT)
        } else {
            handle::read_request(&stream)
        };
        match read {
            Err(error) => handle::answer(&stream, &Answer { result: None, error: Some(error) }),
            Ok(Request::Stop) => self.end(Why::Stopped, Some(stream)),
            Ok(Request::Interrupt) => self.interrupt_cell(&stream),
            Ok(request) if running => {
                if self.waiting.len() >= MOST_WAITING {
                    handle::refuse(&stream, format!("{MOST_WAITING} requests already wait for the running cell"));
                } else {
                    self.waiting.push_back((stream, request));
                }
            }
            Ok(request) => self.serve(stream, request),
        }
    }

    /// An `exec` or an `adopt_output`, between cells.
    fn serve(&mut self, stream: UnixStream, request: Request) {
        match request {
            Request::AdoptOutput { dir } => self.adopt_output(&stream, &dir),
            Request::Exec { code, wall_secs, events } => self.start_cell(stream, code, wall_secs, events),
            Request::Stop => self.end(Why::Stopped, Some(stream)),
            Request::Interrupt => self.interrupt_cell(&stream),
        }
    }

    /// The next request that waited for a cell, once the session is idle.
    fn serve_waiting(&mut self) {
        if matches!(self.phase, Phase::Idle { .. }) && !self.exited {
            if let Some((stream, request)) = self.waiting.pop_front() {
                self.serve(stream, request);
            }
        }
    }

    /// KeyboardInterrupt for the cell in flight, as at its time limit (the
    /// grace, then the kill, follow from `check_timers`); it ends
    /// `cancelled`. Between cells there is nothing to interrupt.
    fn interrupt_cell(&mut self, client: &UnixStream) {
        let id = match &mut self.phase {
            Phase::Running(c) => {
                if c.interrupted.is_none() {
                    c.interrupted = Some((Overrun::Cancelled, Instant::now()));
                    Tree::new(self.pid, self.cgroup).interrupt();
                }
                Some(c.id)
            }
            _ => None,
        };
        handle::answer(client, &Answer { result: Some(serde_json::json!({ "interrupted": id })), error: None });
    }

    /// Take `dir` as the output folder (adopt.rs). Clients are served only
    /// between cells: nothing of the session runs but the driver, waiting.
    fn adopt_output(&mut self, client: &UnixStream, dir: &std::path::Path) {
        let taken = self.s.adoption.borrow_mut().take(dir, self.cells);
        let answer = match taken {
            Ok(()) => {
                // The caller's session starts now: its idle time and its
                // lifetime too, however long the jail waited in the pool.
                let now = Instant::now();
                self.phase = Phase::Idle { since: now };
                self.lifetime = now + self.s.session.max_lifetime;
                self.s.retarget_template(dir);
                Answer { result: Some(serde_json::json!({"output_dir": dir})), error: None }
            }
            Err(e) => Answer { result: None, error: Some(e) },
        };
        handle::answer(client, &answer);
    }

    fn start_cell(&mut self, client: UnixStream, code: String, wall_secs: Option<f64>, events: bool) {
        // Whatever the driver (or a thread a cell left) wrote since the
        // last cell is stale: it can never end this one.
        self.drain_control();
        self.cells += 1;
        let id = self.cells;
        let mut msg = serde_json::json!({"op": "exec", "id": id, "code": code});
        if events {
            // The driver runs a live cell unbuffered, as PYTHONUNBUFFERED
            // makes `jail run --events`.
            msg["live"] = true.into();
        }
        let mut line = serde_json::to_vec(&msg).unwrap_or_default();
        line.push(b'\n');
        let now = Instant::now();
        let (cap_out, cap_err) = (self.s.limits.stdout_cap, self.s.limits.stderr_cap);
        let live = events.then(|| live::open(&client, cap_out, cap_err));
        let mut c = Box::new(Cell {
            id,
            client,
            started: now,
            deadline: now + cell_wall(self.s.limits.wall, wall_secs),
            cpu_start: self.cgroup.and_then(RunCgroup::cpu_ns),
            usage_start: self.cgroup.map(RunCgroup::usage),
            throttled_start: self.watch.throttle.as_ref().map(|t| t.report(now)),
            denials_start: self.watch.tally.denials(self.watch.model),
            stdout: std::mem::replace(&mut self.spill_out, Capture::new(cap_out, OutputMode::Capture, Target::Stdout)),
            stderr: std::mem::replace(&mut self.spill_err, Capture::new(cap_err, OutputMode::Capture, Target::Stderr)),
            interrupted: None,
            done: None,
            live: None,
        });
        if let Some(ev) = live {
            c.stdout.stream_to(Rc::clone(&ev));
            c.stderr.stream_to(Rc::clone(&ev));
            c.live = Some(ev);
        }
        let sent = match &self.control {
            Some(fd) => write_all(fd, &line),
            None => Err(io::Error::other("the control channel is closed")),
        };
        if sent.is_err() {
            // The driver is gone or stopped reading: the session is over.
            c.done = None;
            self.phase = Phase::Running(c);
            self.kill_tree();
            self.s.set_end(Why::DriverDeaf, None);
            return;
        }
        self.phase = Phase::Running(c);
    }

    /// Discard whatever is readable on the control channel now.
    fn drain_control(&mut self) {
        self.ctl_buf.clear();
        self.ctl_skipping = false;
        while let Some(fd) = &self.control {
            let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
                return;
            }
            if nix::unistd::read(fd.as_raw_fd(), &mut self.buf).unwrap_or(0) == 0 {
                self.control = None;
            }
        }
    }

    /// Read both output pipes until nothing more is there now.
    fn drain_streams(&mut self) {
        for _ in 0..1024 {
            let mut got = false;
            for slot in [Slot::Stdout, Slot::Stderr] {
                let fd = if slot == Slot::Stdout { &self.pipes.stdout } else { &self.pipes.stderr };
                let Some(fd) = fd else { continue };
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                if matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
                    self.read_pipe(slot);
                    got = true;
                }
            }
            if !got {
                return;
            }
        }
    }

    fn check_cpu(&mut self, cg: &RunCgroup) {
        let (Phase::Running(c), Some(limit)) = (&mut self.phase, self.cpu_limit) else { return };
        if c.interrupted.is_some() {
            return;
        }
        if let (Some(used), Some(start)) = (cg.cpu_ns(), c.cpu_start) {
            if used.saturating_sub(start) >= limit {
                c.interrupted = Some((Overrun::Cpu, Instant::now()));
                Tree::new(self.pid, self.cgroup).interrupt();
            }
        }
    }

    fn check_timers(&mut self, now: Instant) {
        match &mut self.phase {
            Phase::Starting => {}
            Phase::Idle { since } => {
                if now >= *since + self.s.session.idle_timeout {
                    self.end(Why::IdleTimeout, None);
                }
            }
            Phase::Running(c) => match c.interrupted {
                None if now >= c.deadline => {
                    // KeyboardInterrupt in the cell; the grace starts now.
                    c.interrupted = Some((Overrun::Wall, now));
                    Tree::new(self.pid, self.cgroup).interrupt();
                }
                Some((_, at)) if now >= at + self.s.session.interrupt_grace => {
                    let id = c.id;
                    self.kill_tree();
                    self.s.set_end(Why::CellKilled(id), None);
                }
                _ => {}
            },
            Phase::Ending { kill_at } => {
                if now >= *kill_at && !self.killed {
                    self.kill_tree();
                }
            }
        }
    }

    /// End the session: the driver's channel closes (it exits at once
    /// when idle), and the tree is killed if it is not gone soon.
    fn end(&mut self, why: Why, stopper: Option<UnixStream>) {
        if let Phase::Running(c) = &mut self.phase {
            // The cell in flight is cut short: its client learns why (a
            // cancel wins over a timeout, as it does for a run).
            if matches!(why, Why::Cancelled(_)) {
                c.interrupted = Some((Overrun::Cancelled, Instant::now()));
            } else if c.interrupted.is_none() {
                c.interrupted = Some((Overrun::Wall, Instant::now()));
            }
            self.kill_tree();
            self.s.set_end(why, stopper);
            return;
        }
        self.s.set_end(why, stopper);
        self.control = None;
        self.phase = Phase::Ending { kill_at: Instant::now() + CLOSE_GRACE };
    }

    fn kill_tree(&mut self) {
        Tree::new(self.pid, self.cgroup).kill();
        self.killed = true;
    }

    /// The cell in flight got its `done`: its result to its client.
    fn finish_cell(&mut self) {
        self.drain_streams();
        let Phase::Running(c) = std::mem::replace(&mut self.phase, Phase::Idle { since: Instant::now() }) else {
            return;
        };
        self.cell_result(*c, None);
    }

    /// The tree is gone: a cell still in flight ends with it.
    fn finish_cell_at_death(&mut self) {
        let Phase::Running(_) = self.phase else { return };
        let reports = sync::parse_reports(&self.watch.status_buf);
        let death = if self.killed {
            Death::Killed
        } else {
            match reports.iter().find_map(|r| match r {
                Report::Exited { code } => Some(Death::Exited(*code)),
                Report::Signaled { signal } => Some(Death::Signaled(*signal)),
                _ => None,
            }) {
                Some(d) => d,
                None => Death::Killed,
            }
        };
        let Phase::Running(c) = std::mem::replace(&mut self.phase, Phase::Ending { kill_at: Instant::now() }) else {
            return;
        };
        if self.s.end_why().is_none() {
            self.s.set_end(Why::Died(death), None);
        }
        self.cell_result(*c, Some(death));
    }

    /// Build one cell's result and answer its client.
    fn cell_result(&mut self, c: Cell, death: Option<Death>) {
        let usage_now = self.cgroup.map(RunCgroup::usage);
        let oom = match (&c.usage_start, &usage_now) {
            (Some(a), Some(b)) => b.oom_kills.unwrap_or(0) > a.oom_kills.unwrap_or(0),
            _ => false,
        };
        let stdout = c.stdout.into_stream();
        let stderr = c.stderr.into_stream();
        // What RLIMIT_CPU counted: once the interpreter died, PID 1 has
        // reaped it, so PID 1's own stat (PID 1 is reaped only after the
        // session ends, launch.rs) counts its CPU time.
        let cpu_used = match (self.cpu_rlimit, death) {
            (Some(_), Some(_)) => crate::throttle::cpu_of(self.pid).unwrap_or_default(),
            _ => Duration::ZERO,
        };
        let facts = Facts {
            done: c.done.as_ref().map(|(o, code, _)| (*o, *code)),
            overrun: c.interrupted.map(|(why, _)| why),
            death,
            oom,
            output_cut: stdout.truncated || stderr.truncated,
            cpu_rlimit: self.cpu_rlimit,
            cpu_used,
        };
        let (status, exit_code, signal) = cell::status_of(&facts);
        let mut result = self.s.template();
        result.status = status;
        result.exit_code = exit_code;
        result.signal = signal;
        result.signal_name = signal.and_then(|s| Signal::try_from(s).ok()).map(|s| s.as_str().to_string());
        result.error = match c.done {
            Some((_, _, error)) => error,
            None => crate::result::parse_python_error(&stderr.text),
        };
        result.stdout = stdout;
        result.stderr = stderr;
        let wall_ms = c.started.elapsed().as_secs_f64() * 1000.0;
        result.usage = usage_of(wall_ms, c.usage_start.as_ref(), usage_now.as_ref());
        result.usage.throttled = match (&self.watch.throttle, &c.throttled_start) {
            (Some(t), Some(before)) => Some(t.report_since(before, Instant::now())),
            _ => None,
        };
        let denials_now = self.watch.tally.denials(self.watch.model);
        result.denials = cell::denials_since(&c.denials_start, &denials_now);
        result.timings = Timings { total_ms: wall_ms, setup_ms: None, stages: Default::default() };
        if facts.overrun == Some(Overrun::Cancelled) {
            result.supervisor.cancelled_by = self.cancelled.map(|s| s.as_str().to_string());
        }
        result.session = Some(self.s.info(c.id, self.s.end_why().as_ref()));
        let answer = Answer { result: serde_json::to_value(&result).ok(), error: None };
        match c.live {
            // Behind the live events, as the client takes them (live.rs).
            Some(events) => {
                let mut line = serde_json::to_vec(&answer).unwrap_or_default();
                line.push(b'\n');
                self.tails.push(Tail::new(events, c.client, c.deadline, line));
            }
            None => handle::answer(&c.client, &answer),
        }
    }
}

/// A cell's wall-clock limit: the session's, or a shorter one the client
/// asked for (a longer, zero, negative or non-finite one is ignored).
fn cell_wall(session: Duration, asked: Option<f64>) -> Duration {
    match asked.and_then(|s| Duration::try_from_secs_f64(s).ok()) {
        Some(d) if !d.is_zero() => d.min(session),
        _ => session,
    }
}

/// Write all of `data` to the control socket (its send timeout bounds
/// each write).
fn write_all(fd: &OwnedFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => return Err(io::Error::other("the driver stopped reading")),
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What one cell used: its wall time, and the growth of the cgroup's CPU
/// counters (`null` without a cgroup); peaks are the session's so far.
fn usage_of(wall_ms: f64, before: Option<&CgroupUsage>, now: Option<&CgroupUsage>) -> Usage {
    let delta = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a.unwrap_or(0)) as f64 / 1e6);
    match (before, now) {
        (Some(a), Some(b)) => Usage {
            wall_ms,
            user_cpu_ms: delta(a.user_ns, b.user_ns),
            system_cpu_ms: delta(a.system_ns, b.system_ns),
            peak_memory_bytes: b.memory_peak,
            max_rss_bytes: None,
            pids_peak: b.pids_peak,
            oom_kills: b.oom_kills.map(|n| n.saturating_sub(a.oom_kills.unwrap_or(0))),
            throttled: None,
        },
        _ => Usage { wall_ms, ..Usage::default() },
    }
}
