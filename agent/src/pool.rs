//! The run's warm pool: one `jail pool` child for the whole run, from which
//! each sub-task's session is claimed (`{"op": "session", "input", "output"}`
//! on its JSON lines: a jail made ahead, the policy's trusted `preload`
//! already imported in it), then used with `jail session exec` and `stop`
//! exactly as a session the agent started itself (cells.rs). The session's
//! `/workspace/output` is filled from the run's output folder when it is
//! claimed, and what passed is delivered back there when it ends, so the
//! output still carries from sub-task to sub-task.
//!
//! Isolation: a pooled jail is a `jail session` the pool started with the
//! agent's own policy, rootfs and step time limit (`--policy`, `--rootfs`,
//! `--timeout`): the same namespaces, mounts, seccomp, landlock and limits
//! as `jail session start`, for its whole life; only the policy's trusted
//! preload ran in it before it was handed over. Claiming instead of
//! starting changes the latency, never what a step can do or see.
//!
//! Started at the run's start (`start_early`), so it makes its first jail
//! while the orchestrator plans; the first claim waits for that jail if it
//! is not made yet, and the wait is the claim's (`claim_ms`, in the step's
//! span). `--size` is `--pool-size`, default 1; 0: no pool. The pool's temp dir is
//! the run's `pool/` folder, so its folders are the run's. The agent falls
//! back to `jail session start` (runner.rs) visibly — one line on stderr,
//! the step's `jail_from` and `not_pooled` in the trace, the pool's state
//! in the summary — when the pool is off (`--pool-size 0`, `--stateless`),
//! cannot start (a preload module the rootfs lacks, more jails than memory
//! holds: `jail pool` says why in one line and exits 125), ended, refused
//! a claim, or when the run's deadline is nearer than a step's time limit
//! (a pooled jail's cell limit was fixed when it was made; a session
//! started now gets the shorter one).
//!
//! `--stateless` never starts the pool: each stateless step is `jail run
//! --code DIR SCRIPT`, whose `/workspace/code` is the run's code folder
//! (scripts import one another from it, `sys.path[0]` is it), and a pool
//! step takes its script as text with input and output folders only: it
//! has no code folder, so a pooled step would see less than the step asks
//! for. Stateless steps stay on `jail run` until the pool's step protocol
//! takes a code folder.
//!
//! Lifetime: the pool is this process's child in a process group of its
//! own (a terminal's Ctrl-C reaches the agent alone, which stops its
//! sessions first and then the pool), and it ends with the agent on every
//! path: closed (stdin closed, waited for, killed past a grace) when the
//! run ends, fails or is stopped by a signal (then with a short grace) and
//! when this value drops; sent SIGTERM by the signal thread's last resort
//! (stop.rs); and killed by the
//! kernel (PR_SET_PDEATHSIG SIGKILL) when the agent dies any other way,
//! SIGKILL included — its jails then end with their lifeline (each holds a
//! pipe only the pool writes) and its janitor removes its folder.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use jail::client::bounds::{CLAIM_WAIT, START_WAIT};
use jail::client::command::PoolSpec;
use jail::client::pool::{Body, Line, Reply, SessionRequest, Stats};
use jail::client::pool_child::{self, Gone, PoolChild};

use crate::escape::{escape, Lines};
use crate::live::{self, JailFrom, Live};
use crate::progress::Display;
use crate::runner::{Runner, RunnerError};
use crate::session::Session;
use crate::trace::SpanStart;

/// How long the closing `stats` question waits.
const STATS_WAIT: Duration = Duration::from_secs(2);
/// How long a closed pool has to destroy its jails before SIGKILL.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);
/// The same when the agent stops on a signal: the whole stop is to take at
/// most 2 s; a killed pool's jails end with their lifeline all the same.
const STOP_WAIT: Duration = Duration::from_millis(500);
/// How long the last-resort stop (stop.rs) waits for a pool it sent SIGTERM.
const SIGNAL_WAIT: Duration = Duration::from_secs(1);
/// The most jails `jail pool` keeps.
pub const MAX_SIZE: usize = 64;

/// What became of the pool, for the trace's `pool` record.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub size: usize,
    /// `off`, `not_started` (no sub-task needed a session), `up`, `failed`.
    pub state: &'static str,
    /// Why it was off or failed, in words.
    pub note: Option<String>,
    /// Milliseconds from its start until it answered (its first jail made).
    pub start_ms: Option<f64>,
    /// Sessions it handed out.
    pub claims: u64,
    /// Its `stats` just before it was closed.
    pub stats: Option<Stats>,
    /// Its span: from its start (or the close, when it never started).
    pub span: SpanStart,
}

/// Why a claim did not give a session.
enum NoClaim {
    /// A signal arrived: nothing new starts.
    Interrupted,
    /// The pool could not serve it: this is why.
    Unavailable(String),
}

enum State {
    NotStarted,
    /// Spawned; its first jail may not be made yet (`ready` not read).
    Starting(Link),
    Up(Link),
    /// It could not start or it ended: sessions are started by the agent.
    Failed(String),
    Closed,
}

/// A pool that is up.
struct Link {
    pool: PoolChild,
    started: SpanStart,
    start_ms: f64,
    next_id: u64,
}

/// The run's warm pool (not started until a sub-task needs a session).
pub struct Pool {
    size: usize,
    /// Why it never starts (`--pool-size 0`, `--stateless`).
    off: Option<String>,
    display: Display,
    /// The run's folders: its `pool/` is the pool's TMPDIR.
    session: Session,
    state: Mutex<State>,
    claims: Mutex<u64>,
}

/// The pool's pid while it runs, for the signal thread.
static REGISTRY: Mutex<Registry> = Mutex::new(Registry { pid: None, closing: false });

struct Registry {
    pid: Option<i32>,
    /// A signal arrived: no pool may start.
    closing: bool,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// The pool of a run whose steps `runner` runs in `session`'s folders.
    pub fn new(runner: &Runner, session: &Session, display: Display) -> Pool {
        let off = if runner.stateless {
            Some("--stateless: each step is a `jail run` whose /workspace/code is the run's code folder, and a pool step has no code folder".to_string())
        } else if runner.pool_size == 0 {
            Some("--pool-size 0".to_string())
        } else {
            None
        };
        Pool {
            size: runner.pool_size,
            off,
            display,
            session: session.clone(),
            state: Mutex::new(State::NotStarted),
            claims: Mutex::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session for one sub-task: claimed from the pool (started now if
    /// this is its first claim), else started by the agent itself, the
    /// reason kept in the session's `not_pooled`. Each cell's wall-clock
    /// limit is the step's, cut to `at_most` (what is left of the run).
    pub fn session(&self, runner: &Runner, session: &Session, at_most: Duration) -> Result<Live, RunnerError> {
        let why = if at_most < runner.wall_limit {
            "the run's deadline is nearer than a step's time limit, and a pooled jail's limit was fixed when it was made"
                .to_string()
        } else {
            match self.claim(runner, session) {
                Ok(live) => return Ok(live),
                Err(NoClaim::Interrupted) => return Err(RunnerError::Interrupted),
                Err(NoClaim::Unavailable(why)) => why,
            }
        };
        let mut live = runner.start_session(session, at_most)?;
        if self.off.is_none() {
            live.not_pooled = Some(why);
        }
        Ok(live)
    }

    /// Spawn the pool now, so its first jail is made while the model plans
    /// (the run's start). Nothing waits for it here.
    pub fn start_early(&self, runner: &Runner) {
        if self.off.is_some() {
            return;
        }
        let mut state = self.state();
        if matches!(*state, State::NotStarted) {
            *state = self.spawn(runner);
        }
    }

    /// `jail pool` spawned, or why it could not be.
    fn spawn(&self, runner: &Runner) -> State {
        match self.start(runner) {
            Ok(link) => State::Starting(link),
            Err(NoClaim::Interrupted) => State::Failed("the agent is stopping".into()),
            Err(NoClaim::Unavailable(why)) => self.failed(&why),
        }
    }

    fn failed(&self, why: &str) -> State {
        self.display.warn(&format!(
            "the warm pool could not start ({why}): each sub-task's session is started by the agent itself instead, with the same isolation"
        ));
        State::Failed(format!("the warm pool could not start: {why}"))
    }

    fn claim(&self, runner: &Runner, session: &Session) -> Result<Live, NoClaim> {
        if let Some(off) = &self.off {
            return Err(NoClaim::Unavailable(off.clone()));
        }
        // The claim's time is all the step waited for its jail: the pool's
        // first jail too, when it is not made yet.
        let started = Instant::now();
        let mut state = self.state();
        if matches!(*state, State::NotStarted) {
            *state = self.spawn(runner);
        }
        if matches!(*state, State::Starting(_)) {
            let Some(link) = take_link(&mut state) else {
                return Err(NoClaim::Unavailable("the warm pool is closed".into()));
            };
            *state = match self.ready(link) {
                Ok(link) => {
                    self.display
                        .say("pool", &format!("warm pool up: {} jail(s), the first made in {:.0} ms", self.size, link.start_ms));
                    State::Up(link)
                }
                Err(NoClaim::Interrupted) => return Err(NoClaim::Interrupted),
                Err(NoClaim::Unavailable(why)) => self.failed(&why),
            };
        }
        let link = match &mut *state {
            State::Up(link) => link,
            State::Failed(why) => return Err(NoClaim::Unavailable(why.clone())),
            State::Closed | State::NotStarted | State::Starting(_) => {
                return Err(NoClaim::Unavailable("the warm pool is closed".into()))
            }
        };
        link.next_id += 1;
        let id = format!("s{}", link.next_id);
        let line = Line::Session(SessionRequest {
            id: id.clone(),
            input: Some(session.input.clone()),
            output: Some(session.output.clone()),
            env: Default::default(),
        });
        if !live::begin_start() {
            return Err(NoClaim::Interrupted);
        }
        let answer = link.ask(&line, &id, CLAIM_WAIT);
        let claim_ms = started.elapsed().as_secs_f64() * 1000.0;
        let handed = match &answer {
            Ok(Reply { body: Body::Session(h), .. }) => Some((h.handle.clone(), h.id.clone())),
            _ => None,
        };
        live::end_start(handed.as_ref().map(|(h, _)| h.as_path()));
        if let Some((handle, sid)) = handed {
            *self.claims.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            let mut live = Live::new(handle, sid, runner.wall_limit, JailFrom::Pool);
            live.claim_ms = Some(claim_ms);
            return Ok(live);
        }
        let why = match answer {
            Ok(Reply { body: Body::Error(e), .. }) => format!("the warm pool refused the claim ({}: {})", e.code, e.message),
            Ok(_) => "the warm pool refused the claim (no code: no message)".to_string(),
            Err(Gone::Stopped) => {
                drop(state);
                return Err(NoClaim::Interrupted);
            }
            Err(gone) => {
                // The pool is gone for this run: later sub-tasks start their
                // own sessions without asking it again.
                let why = match gone {
                    Gone::Ended | Gone::Stopped => format!("the warm pool ended ({})", link.exit_words()),
                    Gone::Silent => format!("the warm pool did not answer a claim within {} s", CLAIM_WAIT.as_secs()),
                };
                if let Some(link) = take_link(&mut state) {
                    link.end(SHUTDOWN_WAIT);
                }
                *state = State::Failed(why.clone());
                why
            }
        };
        drop(state);
        self.display
            .warn(&format!("{why}: this sub-task's session is started by the agent itself, with the same isolation"));
        Err(NoClaim::Unavailable(why))
    }

    /// `jail pool` as our child; it is asked for its `stats` at once, and
    /// answers once its first jail is made (`ready`).
    fn start(&self, runner: &Runner) -> Result<Link, NoClaim> {
        let dir = self.session.pool_dir().map_err(|e| NoClaim::Unavailable(format!("its folder: {e}")))?;
        let mut spec = PoolSpec {
            temp_dir: Some(dir),
            withhold: crate::runner::secret_names(),
            // Killed by the kernel when the thread spawning it dies: the
            // agent calls this from its main thread, which lives as long as
            // the run.
            parent_death: Some(nix::sys::signal::Signal::SIGKILL),
            ..PoolSpec::new(&runner.jail, self.size)
        };
        spec.flags.policy = runner.policy.clone();
        spec.flags.rootfs = runner.rootfs.clone();
        spec.flags.limits.timeout = runner.timeout.and_then(|t| Duration::try_from_secs_f64(t).ok());
        let started = SpanStart::now(None);
        let display = self.display.clone();
        let on_stderr = move |line: &str| {
            let text = escape(line, Lines::One);
            if text.is_empty() {
                return None;
            }
            display.say("pool", &text);
            Some(text)
        };
        let pool = {
            let mut reg = registry();
            if reg.closing || crate::stop::requested().is_some() {
                return Err(NoClaim::Interrupted);
            }
            let pool = pool_child::spawn(&spec, on_stderr)
                .map_err(|e| NoClaim::Unavailable(format!("cannot start {} pool: {e}", runner.jail.display())))?;
            reg.pid = Some(pool.id() as i32);
            pool
        };
        let mut link = Link { pool, started, start_ms: 0.0, next_id: 0 };
        // The pool reads its first line once its first jail is made.
        if link.send(&Line::Stats { id: Some("ready".into()) }).is_err() {
            let why = link.exit_words();
            link.end(SHUTDOWN_WAIT);
            return Err(NoClaim::Unavailable(why));
        }
        Ok(link)
    }

    /// Wait for the pool's first answer, the sign its first jail is made.
    fn ready(&self, mut link: Link) -> Result<Link, NoClaim> {
        let left = START_WAIT.saturating_sub(link.pool.spawned().elapsed());
        match link.wait_for("ready", left) {
            Ok((at, Reply { body: Body::Stats(_), .. })) => {
                link.start_ms = at.saturating_duration_since(link.pool.spawned()).as_secs_f64() * 1000.0;
                Ok(link)
            }
            Err(Gone::Stopped) => {
                link.end(STOP_WAIT);
                Err(NoClaim::Interrupted)
            }
            answer => {
                let why = match answer {
                    Err(Gone::Silent) => format!("jail pool did not answer within {} s of its start", START_WAIT.as_secs()),
                    Err(Gone::Ended | Gone::Stopped) => link.exit_words(),
                    Ok((_, v)) => {
                        format!("jail pool's first answer was not its stats: {}", crate::llm::excerpt(&v.text(), 200))
                    }
                };
                link.end(SHUTDOWN_WAIT);
                Err(NoClaim::Unavailable(why))
            }
        }
    }

    /// Close the pool (its `stats` taken first) and say what became of it.
    pub fn close(&self) -> Report {
        let claims = *self.claims.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self.state();
        let mut was = std::mem::replace(&mut *state, State::Closed);
        // Stopping on a signal: no question, and a short wait (stop.rs).
        let stopping = crate::stop::requested().is_some();
        let (stats_wait, end_wait) = if stopping { (Duration::ZERO, STOP_WAIT) } else { (STATS_WAIT, SHUTDOWN_WAIT) };
        if let State::Starting(mut link) = was {
            // No claim waited for it: it is up if its first answer came.
            was = match link.wait_for("ready", Duration::ZERO) {
                Ok((at, _)) => {
                    link.start_ms = at.saturating_duration_since(link.pool.spawned()).as_secs_f64() * 1000.0;
                    State::Up(link)
                }
                Err(_) => {
                    let span = link.started.clone();
                    link.end(end_wait);
                    let note = Some("closed before its first jail was made".to_string());
                    return Report {
                        size: self.size,
                        state: "not_ready",
                        note,
                        start_ms: None,
                        claims,
                        stats: None,
                        span,
                    };
                }
            };
        }
        let (state_name, note, start_ms, stats, span) = match was {
            State::Up(mut link) => {
                let stats = (!stopping)
                    .then(|| link.ask(&Line::Stats { id: Some("last-stats".into()) }, "last-stats", stats_wait).ok())
                    .flatten()
                    .and_then(|r| match r.body {
                        Body::Stats(s) => Some(s),
                        _ => None,
                    });
                let (span, start_ms) = (link.started.clone(), link.start_ms);
                link.end(end_wait);
                ("up", None, Some(start_ms), stats, span)
            }
            State::Starting(_) => ("not_ready", None, None, None, SpanStart::now(None)),
            State::Failed(why) => ("failed", Some(why), None, None, SpanStart::now(None)),
            State::NotStarted if self.off.is_some() => ("off", self.off.clone(), None, None, SpanStart::now(None)),
            State::NotStarted => ("not_started", None, None, None, SpanStart::now(None)),
            State::Closed => ("closed", None, None, None, SpanStart::now(None)),
        };
        Report { size: self.size, state: state_name, note, start_ms, claims, stats, span }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let State::Up(link) | State::Starting(link) = std::mem::replace(&mut *self.state(), State::Closed) {
            link.end(SHUTDOWN_WAIT);
        }
    }
}

fn take_link(state: &mut State) -> Option<Link> {
    match std::mem::replace(state, State::Closed) {
        State::Up(link) | State::Starting(link) => Some(link),
        other => {
            *state = other;
            None
        }
    }
}

impl Link {
    /// Send one line and wait for the reply carrying `id`.
    fn ask(&mut self, line: &Line, id: &str, wait: Duration) -> Result<Reply, Gone> {
        self.pool.ask(line, id, wait, &stopping)
    }

    /// Send one line.
    fn send(&mut self, line: &Line) -> Result<(), Gone> {
        self.pool.send(line)
    }

    /// The reply carrying `id` and when it came, waiting at most `wait`,
    /// and no longer once the agent is told to stop.
    fn wait_for(&mut self, id: &str, wait: Duration) -> Result<(Instant, Reply), Gone> {
        self.pool.wait_for(id, wait, &stopping)
    }

    /// How the pool ended, with its last stderr line.
    fn exit_words(&mut self) -> String {
        self.pool.exit_words()
    }

    /// Close its stdin (it drains: its ready jails destroyed, the sessions it
    /// handed out stopped) and wait for it; kill it past the grace.
    fn end(mut self, wait: Duration) {
        // The signal thread may own it already: then it waits for it.
        let ours = {
            let mut reg = registry();
            let ours = reg.pid == Some(self.pool.id() as i32);
            if ours {
                reg.pid = None;
            }
            ours
        };
        if ours {
            self.pool.end(wait);
        } else {
            self.pool.close();
        }
    }
}

/// The agent is told to stop (stop.rs): no wait goes on.
fn stopping() -> bool {
    crate::stop::requested().is_some()
}

/// The signal path (signals.rs): no pool starts from now on, and a pool
/// that runs gets SIGTERM (it drains: its jails destroyed, the sessions it
/// handed out stopped) and is waited for, then killed past a grace.
pub(crate) fn end_on_signal() {
    let pid = {
        let mut reg = registry();
        reg.closing = true;
        reg.pid.take()
    };
    let Some(pid) = pid else { return };
    use nix::sys::signal::{kill, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGTERM);
    let until = Instant::now() + SIGNAL_WAIT;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Ok(WaitStatus::StillAlive) => {
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                return;
            }
            _ => return,
        }
    }
}
