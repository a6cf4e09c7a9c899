//! The session's cells, as the [`Loop`] the watch loop (watch.rs) drives
//! in place of one script's deadlines: wait for the driver's `ready`, then
//! serve one client at a time — each `exec` becomes one cell sent on the
//! control channel and one result back — until the session ends (stop,
//! idle timeout, lifetime, a cell killed after its grace, or a dead
//! interpreter). The watch reads the pipes, answers the seccomp listener,
//! holds the CPU quota and hands on a cancel; the loop adds its own
//! descriptors (the control channel, the clients' socket, the lifeline,
//! its live clients), says where each stream's bytes go, and interrupts or
//! kills the tree (watch.rs, `Tree`) when a cell or the session runs out.
//!
//! Streams are split per cell by time: a cell's stdout and stderr are what
//! reached the pipes between its `exec` and its `done`, and the pipes are
//! drained once more after `done` (the driver flushes before it replies).
//! Output written later by something the cell left running lands in the
//! next cell's streams.
//!
//! While a cell runs the clients are still served: an `interrupt` (a
//! KeyboardInterrupt for the cell, as at its time limit) or a `stop` at
//! once, any other request queued ([`MOST_WAITING`]) and served in order
//! once the cell is done.
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
use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use super::adopt::Adoption;
use super::cell::{self, Death, Overrun, Reply, Said};
use super::handle::{self, Answer, Request};
use super::live::{self, Tail};
use super::{cell_files, files, grace};
use super::{CellLimits, Why};
use crate::capture::Capture;
use crate::cgroup::CgroupUsage;
use crate::client::session::MOST_INTERRUPT_GRACE;
use crate::display;
use crate::events::Events;
use crate::limits;
use crate::policy;
use crate::result::{Denial, PythonError, RunResult, SessionInfo, Throttled, Timings, Usage};
use crate::step::{Delivery, Ending};
use crate::streams::{OutputMode, Target};
use crate::sync::Report;
use crate::watch::{Loop, PollSet, Started, Watched};

/// How long a closed session's driver gets to exit before the tree is killed.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// Most requests kept waiting for a running cell; more are refused.
const MOST_WAITING: usize = 16;
/// How long a request sent while a cell runs may take to arrive.
const RUNNING_READ_WAIT: Duration = Duration::from_secs(1);

/// The loop's own descriptors in the watch's poll set.
const CONTROL: u32 = 0;
const CLIENTS: u32 = 1;
const LIFELINE: u32 = 2;
/// The running cell's client can take more of its live events.
const LIVE_OUT: u32 = 3;
/// A finished cell's client can take more of its tail (live.rs): this
/// plus the tail's index.
const TAIL: u32 = 4;

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
    /// What its `done` must carry (`Cells::nonce`).
    nonce: String,
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
    /// The tree's CPU time when it did (grace.rs: the grace counts once
    /// the interpreter has run).
    run_at_interrupt: Option<Duration>,
    /// A stateless step (a pool's run): its grace is the wall clock's.
    stateless: bool,
    done: Option<(Said, Option<i32>, Option<PythonError>)>,
    /// With `--events`: the cell's streams, live on its client's socket
    /// (live.rs).
    live: Option<Rc<RefCell<Events>>>,
    /// Its rich results as they came, each judged when it came
    /// (display.rs), within the cell's caps.
    results: display::Collected,
    /// The output folder as it began (cell_files.rs); `None` for a
    /// stateless step, or without an output tmpfs.
    files_before: Option<cell_files::Noted>,
}

/// A session's cells: what the session supervisor (session.rs) holds, and
/// the loop that serves them.
pub(crate) struct Cells {
    id: String,
    /// The session's secret, from which each cell's nonce is made.
    key: String,
    listener: UnixListener,
    limits: CellLimits,
    pub(super) session: policy::SessionLimits,
    /// The write end `start` waits on for `ready` or the setup error.
    ready: Option<OwnedFd>,
    /// The jail's PID 1, said with `ready` (a pool reads its memory).
    jail_pid: Option<u32>,
    /// Where the janitor is told the cgroup folders (session.rs).
    pub(super) janitor: Option<OwnedFd>,
    /// The step's seed result: every cell's starts from it.
    template: Option<RunResult>,
    end: Option<Why>,
    /// A `stop` client, waiting for the closing result.
    pub(super) stopper: Option<UnixStream>,
    /// The read end of the owner's lifeline: when it hangs up the session
    /// ends (`StartOptions::lifeline`).
    lifeline: Option<OwnedFd>,
    /// Taking the caller's output folder after the jail was made (adopt.rs).
    adoption: Adoption,
    /// The driver's control channel, once the step started.
    control: Option<OwnedFd>,
    /// The run cgroup's per-cell CPU-time limit in nanoseconds.
    cpu_limit: Option<u64>,
    next_cpu_check: Instant,
    /// RLIMIT_CPU's soft limit, when it stands in for the cgroup's CPU check.
    cpu_rlimit: Option<Duration>,
    /// The driver's lines, read whole and bounded.
    ctl_lines: display::Lines,
    phase: Phase,
    cells: u64,
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
    waiting: VecDeque<(UnixStream, Request)>,
    ending: Ending,
}

impl Cells {
    // Each is a different thing the session was started with; a struct
    // of them would only be taken apart again here.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        id: String,
        key: String,
        listener: UnixListener,
        limits: CellLimits,
        session: policy::SessionLimits,
        ready: OwnedFd,
        lifeline: Option<OwnedFd>,
        adoption: Adoption,
    ) -> Cells {
        let now = Instant::now();
        Cells {
            id,
            key,
            listener,
            limits,
            session,
            ready: Some(ready),
            janitor: None,
            jail_pid: None,
            template: None,
            end: None,
            stopper: None,
            lifeline,
            adoption,
            control: None,
            cpu_limit: None,
            next_cpu_check: now,
            cpu_rlimit: None,
            ctl_lines: display::Lines::default(),
            phase: Phase::Starting,
            cells: 0,
            spill_out: Capture::new(limits.stdout_cap, OutputMode::Capture, Target::Stdout),
            spill_err: Capture::new(limits.stderr_cap, OutputMode::Capture, Target::Stderr),
            buf: vec![0u8; 64 * 1024],
            tails: Vec::new(),
            cancelled: None,
            lifetime: now + session.max_lifetime,
            waiting: VecDeque::new(),
            ending: Ending::Exited,
        }
    }

    /// Tell `start` the driver is up.
    fn say_ready(&mut self) {
        if let Some(fd) = self.ready.take() {
            let line = match self.jail_pid {
                Some(pid) => format!("ready {pid}\n"),
                None => "ready\n".to_string(),
            };
            let _ = std::fs::File::from(fd).write_all(line.as_bytes());
        }
    }

    /// Tell `start` the jail failed before the driver was up.
    pub(super) fn say_failed(&mut self, line: &str) {
        if let Some(fd) = self.ready.take() {
            let _ = std::fs::File::from(fd).write_all(format!("error {line}\n").as_bytes());
        }
    }

    pub(super) fn said_ready(&self) -> bool {
        self.ready.is_none()
    }

    /// The cgroup folders, for the janitor to remove should we be killed.
    fn tell_janitor(&self, dirs: &[&Path]) {
        if let Some(fd) = self.janitor.as_ref() {
            crate::janitor::tell_cgroups(fd, dirs);
        }
    }

    /// The session ends for `why` (the first reason given stands); a
    /// `stop` client waits for the closing result.
    fn set_end(&mut self, why: Why, stopper: Option<UnixStream>) {
        self.end.get_or_insert(why);
        if stopper.is_some() {
            self.stopper = stopper;
        }
    }

    pub(super) fn end_why(&self) -> Option<Why> {
        self.end.clone()
    }

    /// The `session` object of a result.
    pub(super) fn info(&self, cell: u64, ended: Option<&Why>) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            cell,
            ended: ended.is_some(),
            why: ended.map(|w| w.code().to_string()),
            detail: ended.map(|w| w.describe(&self.session)),
            // Delivered once, when the whole tree is dead (artifacts.rs);
            // a cell lists what it changed (cell_files.rs).
            artifacts: match self.adoption.place() {
                Some(_) => {
                    "each cell lists what it made, changed or deleted, judged; all is delivered when the session ends \
                            (jail session stop)"
                }
                None => "written to the output folder directly; judged when the session ends (jail session stop)",
            }
            .into(),
        }
    }

    /// The run's result as it stood before the launch: its isolation and
    /// limits are every cell's.
    fn template(&self) -> RunResult {
        self.template.clone().unwrap_or_else(|| {
            RunResult::setup_failed(crate::result::SetupError {
                stage: "session".into(),
                message: "a cell ran before the run's result was seeded".into(),
                causes: vec![],
            })
        })
    }
}

impl Loop for Cells {
    fn started(&mut self, s: Started<'_>) {
        // Each cell's result starts from this step's seed: its isolation and limits.
        self.template = Some(s.seed.clone());
        self.jail_pid = u32::try_from(s.pid.as_raw()).ok();
        self.adoption.hold(s.output, s.ids);
        if !s.cgroup_dirs.is_empty() {
            // The janitor removes these should we be killed (session.rs).
            self.tell_janitor(&s.cgroup_dirs);
        }
        if let Some(control) = &s.control {
            // A driver that stops reading cannot hold the supervisor on a write.
            let timeout = nix::sys::time::TimeVal::new(5, 0);
            let _ = nix::sys::socket::setsockopt(control, nix::sys::socket::sockopt::SendTimeout, &timeout);
        }
        self.control = s.control;
        self.cpu_limit = s.cpu_limit;
        self.cpu_rlimit = s.cpu_rlimit;
        self.next_cpu_check = Instant::now();
        self.lifetime = s.wall;
    }

    fn capture(&mut self, t: Target) -> Option<&mut Capture> {
        Some(match (&mut self.phase, t) {
            (Phase::Running(c), Target::Stdout) => &mut c.stdout,
            (Phase::Running(c), Target::Stderr) => &mut c.stderr,
            (_, Target::Stdout) => &mut self.spill_out,
            (_, Target::Stderr) => &mut self.spill_err,
        })
    }

    /// Whether the cell's stdout and stderr pipes may be read now: not
    /// while its live client has a full buffer to take (the cell waits,
    /// not us), until the cell is past its time and must be able to write
    /// its traceback.
    fn wants_input(&self) -> Option<(bool, bool)> {
        Some(match &self.phase {
            Phase::Running(c) if c.interrupted.is_none() => (c.stdout.wants_input(), c.stderr.wants_input()),
            _ => (true, true),
        })
    }

    fn add_fds<'a>(&'a self, set: &mut PollSet<'a>) {
        if let Some(fd) = &self.control {
            set.add(fd.as_fd(), PollFlags::POLLIN, CONTROL);
        }
        if let Some(fd) = self.lifeline.as_ref().filter(|_| !matches!(self.phase, Phase::Ending { .. })) {
            set.add(fd.as_fd(), PollFlags::POLLIN, LIFELINE);
        }
        if matches!(self.phase, Phase::Idle { .. } | Phase::Running(_)) {
            // While a cell runs too: an `interrupt` or a `stop` is served
            // then; an `exec` waits its turn (`waiting`).
            set.add(self.listener.as_fd(), PollFlags::POLLIN, CLIENTS);
        }
        if let Phase::Running(c) = &self.phase {
            if let Some(fd) = c.stdout.pending_out() {
                set.add(fd, PollFlags::POLLOUT, LIVE_OUT);
            }
        }
        for (i, t) in self.tails.iter().enumerate() {
            if let Some(fd) = t.pending_out() {
                set.add(fd, PollFlags::POLLOUT, TAIL + i as u32);
            }
        }
    }

    fn on_ready(&mut self, slot: u32, _flags: PollFlags, w: &mut Watched<'_>) {
        match slot {
            CONTROL => self.read_control(w),
            CLIENTS => self.accept(w),
            // The owner's end closed (or it wrote, which it never does):
            // the owner is gone, and so is the session.
            LIFELINE => self.end(Why::OwnerGone, None, w),
            LIVE_OUT => {
                if let Phase::Running(c) = &mut self.phase {
                    c.stdout.flush_out();
                }
            }
            tail => {
                if let Some(t) = self.tails.get_mut((tail - TAIL) as usize) {
                    t.flush();
                }
            }
        }
    }

    fn wake(&self) -> Option<Instant> {
        let mut wake = self.lifetime;
        match &self.phase {
            Phase::Starting => {}
            Phase::Idle { since } => wake = wake.min(*since + self.session.idle_timeout),
            Phase::Running(c) => {
                wake = wake.min(match c.interrupted {
                    None => c.deadline,
                    // At the grace; past it, while the interpreter has not
                    // run its floor, every `LOOK` up to the ceiling.
                    Some((_, at)) => {
                        let grace = self.session.interrupt_grace;
                        let now = Instant::now();
                        if now < at + grace {
                            at + grace
                        } else {
                            (now + grace::LOOK).min(at + grace::ceiling(grace, MOST_INTERRUPT_GRACE))
                        }
                    }
                });
                if self.cpu_limit.is_some() && c.interrupted.is_none() {
                    wake = wake.min(self.next_cpu_check);
                }
            }
            Phase::Ending { kill_at } => wake = wake.min(*kill_at),
        }
        for t in &self.tails {
            wake = wake.min(t.wake());
        }
        Some(wake)
    }

    fn tick(&mut self, now: Instant, w: &mut Watched<'_>) {
        if now >= self.lifetime && !matches!(self.phase, Phase::Ending { .. }) {
            self.ending = Ending::WallTimeout;
            self.end(Why::MaxLifetime, None, w);
        }
        if self.cpu_limit.is_some() && now >= self.next_cpu_check {
            self.next_cpu_check = now + limits::CPU_POLL;
            self.check_cpu(w);
        }
        self.check_timers(now, w);
        self.serve_waiting(w);
    }

    fn flush(&mut self, now: Instant) {
        self.tails.retain_mut(|t| t.step(now));
    }

    fn cancelled(&mut self, sig: Signal, w: &mut Watched<'_>) {
        if self.cancelled.is_none() {
            self.cancelled = Some(sig);
            self.end(Why::Cancelled(sig), None, w);
        }
    }

    fn at_death(&mut self, reports: &[Report], w: &mut Watched<'_>) -> Ending {
        self.finish_cell_at_death(reports, w);
        for (client, _) in self.waiting.drain(..) {
            let why = self.end.as_ref().map_or_else(|| "the session ended".to_string(), |w| w.describe(&self.session));
            handle::answer(
                &client,
                &Answer {
                    result: None,
                    error: Some(format!("the session ended before this request was served ({why})")),
                },
            );
        }
        if let Some(sig) = self.cancelled {
            // The closing result says so, as a cancelled run's does.
            self.ending = Ending::Cancelled(sig);
        }
        if matches!(self.phase, Phase::Starting) {
            self.set_end(Why::NeverReady, None);
        }
        // The session is over: its last live clients get a bounded moment,
        // as a plain answer's write has.
        let by = Instant::now() + live::ANSWER_WAIT;
        for t in self.tails.drain(..) {
            t.finish(by);
        }
        self.ending
    }

    /// A session that took its caller's output folder delivers there
    /// (adopt.rs).
    fn delivery(&mut self) -> Option<Delivery> {
        self.adoption.delivery()
    }
}

impl Cells {
    /// Read what the driver wrote; act on each whole line.
    fn read_control(&mut self, w: &mut Watched<'_>) {
        let Some(fd) = &self.control else { return };
        let n = nix::unistd::read(fd.as_raw_fd(), &mut self.buf).unwrap_or(0);
        if n == 0 {
            // The driver closed its end: it is exiting (the pidfd follows).
            self.control = None;
            return;
        }
        for line in self.ctl_lines.feed(&self.buf[..n]) {
            match display::parse(&line) {
                // A rich result of the cell in flight, before its `done`.
                Some(d) => {
                    if let Phase::Running(c) = &mut self.phase {
                        if d.id == c.id && d.nonce == c.nonce && c.done.is_none() {
                            c.results.take(&d);
                        }
                    }
                }
                None => self.on_reply(cell::parse_reply(&line), w),
            }
        }
    }

    fn on_reply(&mut self, reply: Reply, w: &mut Watched<'_>) {
        match (reply, &mut self.phase) {
            (Reply::Ready, Phase::Starting) => {
                self.say_ready();
                self.phase = Phase::Idle { since: Instant::now() };
            }
            // Only the cell in flight can end, and only once: a line
            // naming another cell, or a second `done`, is ignored.
            (Reply::Done { id, nonce, outcome, exit_code, error }, Phase::Running(c))
                if id == c.id && nonce == c.nonce && c.done.is_none() =>
            {
                c.done = Some((outcome, exit_code, error));
                self.finish_cell(w);
            }

            _ => {}
        }
    }

    /// One client: checked, its request read and acted on.
    fn accept(&mut self, w: &mut Watched<'_>) {
        let Ok((stream, _)) = self.listener.accept() else { return };
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
            Ok(Request::Stop) => self.end(Why::Stopped, Some(stream), w),
            Ok(Request::Interrupt) => self.interrupt_cell(&stream, w),
            // A files request is bounded in bytes and time (files.rs):
            // served at once, a cell running or not.
            Ok(request) if running && !request.is_file_op() => {
                if self.waiting.len() >= MOST_WAITING {
                    handle::refuse(&stream, format!("{MOST_WAITING} requests already wait for the running cell"));
                } else {
                    self.waiting.push_back((stream, request));
                }
            }
            Ok(request) => self.serve(stream, request, w),
        }
    }

    /// A request: an `exec` or an `adopt_output` between cells, a files
    /// request at any time.
    fn serve(&mut self, stream: UnixStream, request: Request, w: &mut Watched<'_>) {
        match request {
            Request::AdoptOutput { dir } => self.adopt_output(&stream, &dir),
            Request::Exec { code, wall_secs, events, stateless, env, keep_env } => {
                self.start_cell(stream, Exec { code, wall_secs, events, stateless, env, keep_env }, w)
            }
            Request::Stop => self.end(Why::Stopped, Some(stream), w),
            Request::Interrupt => self.interrupt_cell(&stream, w),
            Request::PutFile { .. } | Request::GetFile { .. } | Request::ListFiles { .. } => self.serve_file(&stream, &request),
        }
    }

    /// A request of the files API (files.rs).
    fn serve_file(&mut self, stream: &UnixStream, request: &Request) {
        let answer = files::answer(self.adoption.place(), request);
        let result = serde_json::to_value(&answer).ok();
        handle::answer(stream, &Answer { result, error: None });
    }

    /// The next request that waited for a cell, once the session is idle.
    fn serve_waiting(&mut self, w: &mut Watched<'_>) {
        if matches!(self.phase, Phase::Idle { .. }) {
            if let Some((stream, request)) = self.waiting.pop_front() {
                self.serve(stream, request, w);
            }
        }
    }

    /// KeyboardInterrupt for the cell in flight, as at its time limit (the
    /// grace, then the kill, follow from `check_timers`); it ends
    /// `cancelled`. Between cells there is nothing to interrupt.
    fn interrupt_cell(&mut self, client: &UnixStream, w: &Watched<'_>) {
        let id = match &mut self.phase {
            Phase::Running(c) => {
                if c.interrupted.is_none() {
                    c.interrupt(Overrun::Cancelled, Instant::now(), w);
                }
                Some(c.id)
            }
            _ => None,
        };
        handle::answer(client, &Answer { result: Some(serde_json::json!({ "interrupted": id })), error: None });
    }

    /// Take `dir` as the output folder (adopt.rs). Clients are served only
    /// between cells: nothing of the session runs but the driver, waiting.
    fn adopt_output(&mut self, client: &UnixStream, dir: &Path) {
        let answer = match self.adoption.take(dir, self.cells) {
            Ok(()) => {
                // The caller's session starts now: its idle time and its
                // lifetime too, however long the jail waited in the pool.
                let now = Instant::now();
                self.phase = Phase::Idle { since: now };
                self.lifetime = now + self.session.max_lifetime;
                // Every later cell's result names it.
                if let Some(t) = self.template.as_mut() {
                    t.output_dir = Some(dir.display().to_string());
                }
                Answer { result: Some(serde_json::json!({"output_dir": dir})), error: None }
            }
            Err(e) => Answer { result: None, error: Some(e) },
        };
        handle::answer(client, &answer);
    }

    fn start_cell(&mut self, client: UnixStream, exec: Exec, w: &Watched<'_>) {
        let Exec { code, wall_secs, events, stateless, env, keep_env } = exec;
        // Whatever the driver (or a thread a cell left) wrote since the
        // last cell is stale: it can never end this one.
        self.drain_control();
        self.cells += 1;
        let id = self.cells;
        let nonce = self.nonce(id);
        let mut msg = serde_json::json!({"op": "exec", "id": id, "nonce": nonce, "code": code});
        if events {
            // The driver runs a live cell unbuffered, as PYTHONUNBUFFERED
            // makes `jail run --events`.
            msg["live"] = true.into();
        }
        if !env.is_empty() {
            // Set for the cell, then back as they were (driver.py), unless kept.
            msg["env"] = serde_json::to_value(&env).unwrap_or_default();
            if keep_env {
                msg["keep_env"] = true.into();
            }
        }
        let mut line = serde_json::to_vec(&msg).unwrap_or_default();
        line.push(b'\n');
        let now = Instant::now();
        let (cap_out, cap_err) = (self.limits.stdout_cap, self.limits.stderr_cap);
        let live = events.then(|| live::open(&client, cap_out, cap_err));
        let mut c = Box::new(Cell {
            id,
            nonce,
            client,
            started: now,
            deadline: now + cell_wall(self.limits.wall, wall_secs),
            cpu_start: w.tree.cpu_ns(),
            usage_start: w.tree.usage(),
            throttled_start: w.throttled(now),
            denials_start: w.denials(),
            stdout: std::mem::replace(&mut self.spill_out, Capture::new(cap_out, OutputMode::Capture, Target::Stdout)),
            stderr: std::mem::replace(&mut self.spill_err, Capture::new(cap_err, OutputMode::Capture, Target::Stderr)),
            interrupted: None,
            run_at_interrupt: None,
            stateless,
            done: None,
            live: None,
            results: display::Collected::default(),
            files_before: if stateless { None } else { cell_files::noted(self.adoption.place()) },
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
        self.phase = Phase::Running(c);
        if sent.is_err() {
            // The driver is gone or stopped reading: the session is over.
            w.tree.kill();
            self.set_end(Why::DriverDeaf, None);
        }
    }

    /// What cell `id`'s `done` must carry: made from the session's key,
    /// which never enters the jail, and sent with the cell's `exec`. A cell
    /// shares the driver's process and may write to the control channel
    /// (driver.py): a line it wrote before cell `id` began cannot carry this,
    /// however late the line arrives (a write blocked on a full socket).
    fn nonce(&self, id: u64) -> String {
        let mut hex = crate::digest::sha256_hex(format!("{}:{id}", self.key).as_bytes());
        hex.truncate(32);
        hex
    }

    /// Discard whatever is readable on the control channel now.
    fn drain_control(&mut self) {
        self.ctl_lines = display::Lines::default();
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

    /// The cell in flight used its CPU time (the run cgroup's, since the
    /// cell began): KeyboardInterrupt, and the grace starts.
    fn check_cpu(&mut self, w: &Watched<'_>) {
        let (Phase::Running(c), Some(limit)) = (&mut self.phase, self.cpu_limit) else { return };
        if c.interrupted.is_some() {
            return;
        }
        if let (Some(used), Some(start)) = (w.tree.cpu_ns(), c.cpu_start) {
            if used.saturating_sub(start) >= limit {
                c.interrupt(Overrun::Cpu, Instant::now(), w);
            }
        }
    }

    fn check_timers(&mut self, now: Instant, w: &Watched<'_>) {
        match &mut self.phase {
            Phase::Starting => {}
            Phase::Idle { since } => {
                if now >= *since + self.session.idle_timeout {
                    self.end(Why::IdleTimeout, None, w);
                }
            }
            Phase::Running(c) => match c.interrupted {
                None if now >= c.deadline => {
                    // KeyboardInterrupt in the cell; the grace starts now.
                    c.interrupt(Overrun::Wall, now, w);
                }
                Some((_, at)) if c.grace_over(now.saturating_duration_since(at), self.session.interrupt_grace, w) => {
                    let id = c.id;
                    w.tree.kill();
                    self.set_end(Why::CellKilled(id), None);
                }
                _ => {}
            },
            Phase::Ending { kill_at } => {
                if now >= *kill_at && !w.tree.killed() {
                    w.tree.kill();
                }
            }
        }
    }

    /// End the session: the driver's channel closes (it exits at once
    /// when idle), and the tree is killed if it is not gone soon.
    fn end(&mut self, why: Why, stopper: Option<UnixStream>, w: &Watched<'_>) {
        if let Phase::Running(c) = &mut self.phase {
            // The cell in flight is cut short: its client learns why (a
            // cancel wins over a timeout, as it does for a run).
            if matches!(why, Why::Cancelled(_)) {
                c.interrupted = Some((Overrun::Cancelled, Instant::now()));
            } else if c.interrupted.is_none() {
                c.interrupted = Some((Overrun::Wall, Instant::now()));
            }
            w.tree.kill();
            self.set_end(why, stopper);
            return;
        }
        self.set_end(why, stopper);
        self.control = None;
        self.phase = Phase::Ending { kill_at: Instant::now() + CLOSE_GRACE };
    }

    /// The cell in flight got its `done`: its result to its client.
    fn finish_cell(&mut self, w: &mut Watched<'_>) {
        if let Phase::Running(c) = &mut self.phase {
            w.drain(&mut c.stdout, &mut c.stderr);
        }
        let Phase::Running(c) = std::mem::replace(&mut self.phase, Phase::Idle { since: Instant::now() }) else {
            return;
        };
        self.cell_result(*c, None, w);
    }

    /// The tree is gone: a cell still in flight ends with it.
    fn finish_cell_at_death(&mut self, reports: &[Report], w: &Watched<'_>) {
        let Phase::Running(_) = self.phase else { return };
        let death = if w.tree.killed() {
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
        if self.end.is_none() {
            self.set_end(Why::Died(death), None);
        }
        self.cell_result(*c, Some(death), w);
    }

    /// Build one cell's result and answer its client.
    fn cell_result(&mut self, c: Cell, death: Option<Death>, w: &Watched<'_>) {
        let usage_now = w.tree.usage();
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
            (Some(_), Some(_)) => crate::throttle::cpu_of(w.tree.pid()).unwrap_or_default(),
            _ => Duration::ZERO,
        };
        let facts = cell::Facts {
            done: c.done.as_ref().map(|(o, code, _)| (*o, *code)),
            overrun: c.interrupted.map(|(why, _)| why),
            death,
            oom,
            output_cut: stdout.truncated || stderr.truncated,
            cpu_rlimit: self.cpu_rlimit,
            cpu_used,
        };
        let (status, exit_code, signal) = cell::status_of(&facts);
        let mut result = self.template();
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
        (result.results, result.results_dropped) = c.results.finish();
        // A cell that ended the session is judged with the rest, its tree dead.
        if let (Some(before), None) = (&c.files_before, death) {
            (result.artifacts, result.rejected_artifacts) = cell_files::judged(self.adoption.place(), before, w.tree);
        }
        let wall_ms = c.started.elapsed().as_secs_f64() * 1000.0;
        result.usage = usage_of(wall_ms, c.usage_start.as_ref(), usage_now.as_ref());
        result.usage.throttled = c.throttled_start.as_ref().and_then(|before| w.throttled_since(before, Instant::now()));
        result.denials = cell::denials_since(&c.denials_start, &w.denials());
        result.timings = Timings { total_ms: wall_ms, setup_ms: None, stages: Default::default() };
        if facts.overrun == Some(Overrun::Cancelled) {
            result.supervisor.cancelled_by = self.cancelled.map(|s| s.as_str().to_string());
        }
        result.session = Some(self.info(c.id, self.end.as_ref()));
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

/// What an `exec` asked for.
struct Exec {
    code: String,
    wall_secs: Option<f64>,
    events: bool,
    stateless: bool,
    env: crate::envs::Envs,
    keep_env: bool,
}

impl Cell {
    /// KeyboardInterrupt in the cell (`why`): the grace starts now.
    fn interrupt(&mut self, why: Overrun, now: Instant, w: &Watched<'_>) {
        self.interrupted = Some((why, now));
        self.run_at_interrupt = w.tree.run_time();
        w.tree.interrupt();
    }

    /// Whether its grace is over, `wall` after the interrupt (grace.rs).
    fn grace_over(&self, wall: Duration, grace: Duration, w: &Watched<'_>) -> bool {
        let run = match (self.run_at_interrupt, w.tree.run_time()) {
            (Some(then), Some(now)) => Some(now.saturating_sub(then)),
            _ => None,
        };
        grace::over(wall, run, grace, MOST_INTERRUPT_GRACE, self.stateless)
    }
}
