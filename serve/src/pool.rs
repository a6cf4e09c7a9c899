//! The warm pool: one `jail pool` child of the server, made with the
//! server's policy and rootfs, `--pool-size` jails, `--pool-memory` each
//! and the tenants' longest wall time, spoken to over its JSON lines
//! (wire.rs). Runs are pipelined on its stdin; its stdout is read a line
//! at a time (bounded) and each reply handed to the run with its `id`;
//! live `{"id", "event"}` lines go to the run's event log when the pool
//! streams them (probed at each start: `events` is a field the pool may
//! not know yet).
//!
//! Each pooled jail is a `jail session` supervisor of its own, so a run
//! that crashes takes nothing else down. The pool dies with the server
//! (PR_SET_PDEATHSIG SIGKILL: its jails end with their lifeline, its
//! janitor removes its folders, all in the server's work folder). When the
//! pool ends on its own, the runs in it get a 502, `/readyz` says so, runs
//! go to `jail run` meanwhile, and the keeper starts a new pool — at most
//! `MAX_RESTARTS` times in `RESTART_WINDOW`, then it gives up and says why.

pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use crate::backend::{Backend, BoxFuture, EventLog, Job, RawResult, RunError};
use crate::cancel::Cancel;
use crate::route::PoolShape;
use jail::client::bounds::START_WAIT;
use jail::client::command::{pool_command, PoolSpec};
use jail::client::pool::{ErrorCode, Stats};
use wire::{Line, Read, Reply};

/// Past a run's wall time: waiting for a jail (the pool queues requests
/// beyond its ready jails) and the jail's own teardown.
const QUEUE_GRACE: Duration = Duration::from_secs(60);
/// A stats question gets this long.
const STATS_WAIT: Duration = Duration::from_secs(2);
/// Restarts of a pool that keeps ending, at most, within the window.
const MAX_RESTARTS: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(600);
/// How long a closed pool has to destroy its jails before SIGKILL.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);
/// The line buffer kept between the pool's lines at most.
const KEPT_LINE_BYTES: usize = 1 << 20;
/// Bytes of one line of the pool's stderr forwarded.
const MAX_STDERR_LINE: usize = 4 << 10;

/// How the pool is made.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub jail: PathBuf,
    /// Flags every jail gets (policy, rootfs).
    pub flags: Vec<OsString>,
    pub size: usize,
    pub memory_mib: u64,
    /// The pool's `--timeout`: the longest wall time a request may ask.
    pub timeout: Duration,
    /// The pool's TMPDIR: its folders and the runs' outputs (the server's
    /// work folder, so outputs are renamed into the runs' folders).
    pub temp_dir: PathBuf,
    /// The pool's XDG_RUNTIME_DIR: its jails' session handles (a short path).
    pub runtime_dir: PathBuf,
}

/// The pool could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start {0} pool: {1}")]
    Spawn(PathBuf, std::io::Error),
    #[error("jail pool ended before it was ready ({0}){1}")]
    Exited(String, String),
    #[error("jail pool did not answer within {0:?} of its start{1}")]
    Silent(Duration, String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Up,
    /// Ended; a new one is being started.
    Restarting(String),
    /// Ended too often; runs go to `jail run` until the server restarts.
    Failed(String),
    /// Closed by the drain.
    Stopped,
}

/// What `/metrics` shows of the pool.
pub struct Snapshot {
    pub health: Health,
    pub restarts: u64,
    pub events: bool,
    pub size: usize,
    /// The pool's own `stats` answer, when it gave one in time.
    pub stats: Option<Stats>,
}

pub struct Pool {
    cfg: PoolConfig,
    /// Runs sent to the pool at once: twice its jails (one running, one
    /// waiting for each jail's replacement). The rest wait here, first come
    /// first served: the pool hands a freed jail to any of its waiters.
    gate: Arc<Semaphore>,
    link: Mutex<Option<Arc<Link>>>,
    health: Mutex<Health>,
    restarts: AtomicU64,
    stopping: AtomicBool,
    stopped: Notify,
}

impl Pool {
    /// Start the pool and wait until it answers (its first jail is made).
    pub async fn start(cfg: PoolConfig) -> Result<Arc<Pool>, StartError> {
        let pool = Arc::new(Pool {
            gate: Arc::new(Semaphore::new(2 * cfg.size.max(1))),
            cfg,
            link: Mutex::new(None),
            health: Mutex::new(Health::Up),
            restarts: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            stopped: Notify::new(),
        });
        let (link, child) = pool.launch().await?;
        *lock(&pool.link) = Some(link);
        tokio::spawn(Arc::clone(&pool).keep(child));
        Ok(pool)
    }

    /// The pool to send a run to, while it is up.
    pub fn link(&self) -> Option<Arc<Link>> {
        lock(&self.link).clone().filter(|l| !l.closed.load(Ordering::SeqCst))
    }

    pub fn shape(&self, link: &Link) -> PoolShape {
        PoolShape {
            memory_mib: self.cfg.memory_mib,
            timeout: self.cfg.timeout,
            events: link.streams_events(),
        }
    }

    pub fn health(&self) -> Health {
        lock(&self.health).clone()
    }

    pub async fn snapshot(&self) -> Snapshot {
        let link = self.link();
        let stats = match &link {
            Some(l) => l.stats().await,
            None => None,
        };
        Snapshot {
            health: self.health(),
            restarts: self.restarts.load(Ordering::SeqCst),
            events: link.is_some_and(|l| l.streams_events()),
            size: self.cfg.size,
            stats,
        }
    }

    /// Close the pool's stdin (it finishes what it has, destroys its jails
    /// and exits), then wait for it; SIGKILL after `SHUTDOWN_WAIT`.
    pub async fn shut_down(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let waiting = self.stopped.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        let link = lock(&self.link).clone();
        let Some(link) = link else { return };
        link.close();
        if tokio::time::timeout(SHUTDOWN_WAIT, waiting.as_mut()).await.is_err() {
            eprintln!("jail serve: the pool (pid {}) did not exit within {SHUTDOWN_WAIT:?}: killing it", link.pid);
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(link.pid as i32), nix::sys::signal::Signal::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        }
    }

    fn set_health(&self, h: Health) {
        *lock(&self.health) = h;
    }

    /// Start a `jail pool` child and wait for its first answer; probe
    /// whether it streams events.
    async fn launch(&self) -> Result<(Arc<Link>, tokio::process::Child), StartError> {
        let mut child = self.command().spawn().map_err(|e| StartError::Spawn(self.cfg.jail.clone(), e))?;
        let pid = child.id().unwrap_or(0);
        let tail = Arc::new(Mutex::new(String::new()));
        if let Some(err) = child.stderr.take() {
            tokio::spawn(forward_stderr(err, Arc::clone(&tail)));
        }
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.start_kill();
            return Err(StartError::Exited("no pipes".into(), String::new()));
        };
        let (send, lines) = mpsc::unbounded_channel::<String>();
        let link = Arc::new(Link {
            gate: Arc::clone(&self.gate),
            pid,
            events: AtomicBool::new(false),
            send: Mutex::new(Some(send)),
            waiting: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            next: AtomicU64::new(0),
            sessions: AtomicBool::new(true),
        });
        tokio::spawn(write_lines(stdin, lines));
        tokio::spawn(read_lines(Arc::clone(&link), stdout));
        let said = |tail: &Mutex<String>| {
            let t = lock(tail).clone();
            if t.is_empty() {
                String::new()
            } else {
                format!(": {t}")
            }
        };
        let handshake = async {
            let ready = link.call(wire::stats_line("start"), "start".into());
            let probe = link.call(wire::events_probe_line("probe-events"), "probe-events".into());
            tokio::join!(ready, probe)
        };
        let (ready, probe) = tokio::select! {
            r = tokio::time::timeout(START_WAIT, handshake) => match r {
                Ok(r) => r,
                Err(_) => {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    return Err(StartError::Silent(START_WAIT, said(&tail)));
                }
            },
            status = child.wait() => {
                // Its stderr's last line is the reason; give the reader a moment.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                return Err(StartError::Exited(status, said(&tail)));
            }
        };
        if !matches!(ready, Some(Reply::Stats(_))) {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(StartError::Exited(format!("its first answer was {ready:?}"), said(&tail)));
        }
        link.events.store(probe.as_ref().is_some_and(wire::takes_events), Ordering::SeqCst);
        Ok((link, child))
    }

    fn command(&self) -> tokio::process::Command {
        let c = &self.cfg;
        let mut spec = PoolSpec {
            more: c.flags.clone(),
            temp_dir: Some(c.temp_dir.clone()),
            runtime_dir: Some(c.runtime_dir.clone()),
            // SIGKILL: the pool's jails end with their lifeline, its
            // janitor removes its folders; a SIGTERM would wait for its runs.
            parent_death: Some(nix::sys::signal::Signal::SIGKILL),
            ..PoolSpec::new(&c.jail, c.size)
        };
        spec.flags.limits.timeout = Some(c.timeout);
        spec.flags.limits.memory = Some(format!("{}M", c.memory_mib));
        // Its own group (pool_command): a terminal's Ctrl-C reaches the
        // server, which drains and then closes the pool.
        tokio::process::Command::from(pool_command(&spec))
    }

    /// Watch the pool; when it ends, fail its runs and start another.
    async fn keep(self: Arc<Self>, mut child: tokio::process::Child) {
        let mut recent: VecDeque<Instant> = VecDeque::new();
        loop {
            let status = child.wait().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            let link = lock(&self.link).take();
            let pid = link.as_ref().map_or(0, |l| l.pid);
            let mut why = format!("the warm pool (jail pool, pid {pid}) ended ({status})");
            if let Some(l) = link {
                l.lose(&why);
            }
            if self.stopping.load(Ordering::SeqCst) {
                self.set_health(Health::Stopped);
                self.stopped.notify_waiters();
                return;
            }
            eprintln!("jail serve: {why}: starting a new one");
            loop {
                recent.retain(|t| t.elapsed() < RESTART_WINDOW);
                if recent.len() >= MAX_RESTARTS {
                    eprintln!("jail serve: {why}; {MAX_RESTARTS} restarts in {RESTART_WINDOW:?}: giving up, runs go to jail run");
                    self.set_health(Health::Failed(why));
                    self.stopped.notify_waiters();
                    return;
                }
                self.set_health(Health::Restarting(why.clone()));
                tokio::time::sleep(Duration::from_millis(500) * (1 << recent.len())).await;
                if self.stopping.load(Ordering::SeqCst) {
                    self.set_health(Health::Stopped);
                    self.stopped.notify_waiters();
                    return;
                }
                recent.push_back(Instant::now());
                self.restarts.fetch_add(1, Ordering::SeqCst);
                match self.launch().await {
                    Ok((link, c)) => {
                        // A drain that began while it started finds no link
                        // to close: close it here, and let it end as above.
                        if self.stopping.load(Ordering::SeqCst) {
                            link.close();
                        }
                        *lock(&self.link) = Some(link);
                        child = c;
                        self.set_health(Health::Up);
                        eprintln!("jail serve: a new warm pool is up");
                        break;
                    }
                    Err(e) => {
                        why = e.to_string();
                        eprintln!("jail serve: {why}");
                    }
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A run (or a stats question) waiting for its reply.
struct Waiter {
    log: Option<Arc<EventLog>>,
    reply: oneshot::Sender<Reply>,
}

/// One running `jail pool`: its stdin (a queue of lines), the runs
/// waiting for their replies, whether it streams events.
pub struct Link {
    /// The pool's gate (`Pool::gate`), shared by the links of its lives.
    gate: Arc<Semaphore>,
    pid: u32,
    /// Set by the start's probe, before any run is sent.
    events: AtomicBool,
    send: Mutex<Option<mpsc::UnboundedSender<String>>>,
    waiting: Mutex<HashMap<String, Waiter>>,
    /// Set once its stdout ended: nothing more is sent.
    closed: AtomicBool,
    next: AtomicU64,
    /// Cleared when the pool said it can never hand out a session.
    sessions: AtomicBool,
}

/// Why the pool gave no session.
#[derive(Debug)]
pub enum SessionRefused {
    /// This pool never hands sessions out (its policy binds each jail's
    /// output folder): start them on their own.
    Never,
    /// This time: the reason.
    Failed(String),
}

impl Link {
    fn streams_events(&self) -> bool {
        self.events.load(Ordering::SeqCst)
    }

    /// Send `line` and wait for the reply to `id` (`None` if the pool
    /// went away or the line could not be sent).
    async fn call(&self, line: String, id: String) -> Option<Reply> {
        let rx = self.send(line, id, None).ok()?;
        rx.await.ok()
    }

    /// Register `id`'s waiter, then send its line.
    fn send(&self, line: String, id: String, log: Option<Arc<EventLog>>) -> Result<oneshot::Receiver<Reply>, String> {
        let (tx, rx) = oneshot::channel();
        {
            let mut w = lock(&self.waiting);
            if self.closed.load(Ordering::SeqCst) {
                return Err("the warm pool has ended".into());
            }
            w.insert(id.clone(), Waiter { log, reply: tx });
        }
        let sent = lock(&self.send).as_ref().is_some_and(|s| s.send(line).is_ok());
        if !sent {
            lock(&self.waiting).remove(&id);
            return Err("the warm pool's stdin is closed".into());
        }
        Ok(rx)
    }

    async fn stats(&self) -> Option<Stats> {
        let id = format!("stats-{}", self.next.fetch_add(1, Ordering::SeqCst));
        let asked = tokio::time::timeout(STATS_WAIT, self.call(wire::stats_line(&id), id.clone())).await;
        match asked {
            Ok(Some(Reply::Stats(s))) => Some(s),
            _ => {
                lock(&self.waiting).remove(&id);
                None
            }
        }
    }

    /// Whether sessions may be asked of this pool.
    pub fn takes_sessions(&self) -> bool {
        self.sessions.load(Ordering::SeqCst)
    }

    /// A session from the pool (`{"op": "session"}`): a ready jail, its
    /// preload imported, with `input` copied in and `output` as its output
    /// folder. Its handle, from the answer's `{"handle", "id", "pid",
    /// "output_dir"}`.
    pub async fn session(
        &self,
        id: &str,
        input: Option<&std::path::Path>,
        output: &std::path::Path,
        env: &jail::envs::Envs,
    ) -> Result<String, SessionRefused> {
        let failed = |m: String| SessionRefused::Failed(m);
        // A turn like a run's while it claims a jail (not for the session's life).
        let _turn = self.gate.acquire().await.map_err(|_| failed("the warm pool was closed".into()))?;
        let rx = self.send(wire::session_line(id, input, output, env), id.into(), None).map_err(failed)?;
        match tokio::time::timeout(QUEUE_GRACE, rx).await {
            Err(_) => {
                lock(&self.waiting).remove(id);
                Err(failed(format!("the warm pool did not hand out a session within {QUEUE_GRACE:?}")))
            }
            Ok(Ok(Reply::Session(h))) => Ok(h.handle.to_string_lossy().into_owned()),
            Ok(Ok(Reply::Error(e))) if e.refuses_sessions() => {
                self.sessions.store(false, Ordering::SeqCst);
                Err(SessionRefused::Never)
            }
            Ok(Ok(Reply::Error(e))) => Err(failed(format!("the warm pool refused the session ({}): {}", e.code, e.message))),
            Ok(Ok(Reply::Lost(why))) => Err(failed(why)),
            Ok(Ok(other)) => Err(failed(format!("the warm pool answered a session with {other:?}"))),
            Ok(Err(_)) => Err(failed("the warm pool ended".into())),
        }
    }

    /// Stop request `id` (`{"op": "cancel"}`): its jail is stopped at once;
    /// its reply still comes (its result, `cancelled`), and releases what
    /// the run holds.
    pub fn cancel(&self, id: &str) {
        if let Some(s) = lock(&self.send).as_ref() {
            let _ = s.send(wire::cancel_line(id));
        }
    }

    /// Close the pool's stdin: it drains and exits.
    fn close(&self) {
        lock(&self.send).take();
    }

    /// The pool ended: every waiter gets `why`.
    fn lose(&self, why: &str) {
        self.closed.store(true, Ordering::SeqCst);
        lock(&self.send).take();
        let waiting: Vec<Waiter> = lock(&self.waiting).drain().map(|(_, w)| w).collect();
        for w in waiting {
            let _ = w.reply.send(Reply::Lost(why.to_owned()));
        }
    }

    /// Hand a line from the pool to whoever waits for it.
    fn dispatch(&self, line: Line) {
        match line {
            Line::Event(id, event) => {
                let mut w = lock(&self.waiting);
                let Some(waiter) = w.get_mut(&id) else { return };
                let Some(log) = &waiter.log else { return };
                // The log keeps what fits its bytes and counts the rest.
                log.push(&event);
            }
            // The answer to a cancel of a run already answered: nothing waits for it.
            Line::Reply(_, Reply::Error(e)) if e.code == ErrorCode::UnknownId => {}
            Line::Reply(id, reply) => {
                let Some(waiter) = lock(&self.waiting).remove(&id) else { return };
                let _ = waiter.reply.send(reply);
            }
            Line::Stray(text) => eprintln!("jail serve: the pool said, about no run of ours: {text}"),
        }
    }

    /// Fail the run whose reply was too long to read (its id from the
    /// line's head), rather than leave it to its deadline.
    fn too_long(&self, head: &[u8]) {
        let Some(id) = wire::leading_id(head) else {
            eprintln!("jail serve: a line from the pool was over {} bytes and named no run", wire::MAX_LINE_BYTES);
            return;
        };
        let message = format!("the pool's reply was over {} bytes: lower the run's output", wire::MAX_LINE_BYTES);
        self.dispatch(Line::Reply(id, Reply::TooLong(message)));
    }
}

impl Backend for Link {
    fn run<'a>(&'a self, job: Job, log: Arc<EventLog>, cancel: Arc<Cancel>) -> BoxFuture<'a, Result<RawResult, RunError>> {
        Box::pin(async move {
            // Waiting here is bounded by the runs ahead, each by its deadline.
            let _turn = tokio::select! {
                turn = self.gate.acquire() => turn.map_err(|_| RunError::PoolLost("the warm pool was closed".into()))?,
                () = cancel.wait() => return Err(RunError::not_run()),
            };
            let deadline = job.timeout + jail::client::bounds::HUNG_GRACE + QUEUE_GRACE;
            let events = self.streams_events();
            let rx = self
                .send(wire::run_line(&job, events), job.id.clone(), Some(Arc::clone(&log)))
                .map_err(|why| RunError::PoolLost(format!("{why}: the run did not start; send it again")))?;
            // Stopped, its reply still comes: its result, `cancelled`.
            let answered = cancel.until_done(rx, || self.cancel(&job.id));
            let reply = tokio::time::timeout(deadline, answered).await;
            let result = match reply {
                // A long result, read once, later, off the async threads.
                Ok(Ok(Reply::Unparsed(line))) => match String::from_utf8(line) {
                    Ok(line) => RawResult::line(line),
                    Err(_) => return Err(RunError::Failed("the warm pool's result is not UTF-8".into())),
                },
                Err(_) => {
                    lock(&self.waiting).remove(&job.id);
                    return Err(RunError::Failed(format!("the warm pool did not answer within {deadline:?}")));
                }
                Ok(Err(_)) => {
                    return Err(RunError::PoolLost("the warm pool ended: the run did not finish; send it again".into()))
                }
                Ok(Ok(Reply::Result(v))) => RawResult::of(&v),
                Ok(Ok(Reply::Lost(why))) => {
                    return Err(RunError::PoolLost(format!("{why}: the run did not finish; send it again")))
                }
                Ok(Ok(Reply::Error(e))) if e.never_started() => {
                    let why = e.message;
                    return Err(RunError::NotStarted(format!("the warm pool's jail was dead before the run started: {why}")));
                }
                Ok(Ok(Reply::Error(e))) if e.code == ErrorCode::Cancelled => return Err(RunError::Cancelled(e.message)),
                Ok(Ok(Reply::Error(e))) => {
                    return Err(RunError::Failed(format!("the warm pool refused the run ({}): {}", e.code, e.message)))
                }
                Ok(Ok(Reply::TooLong(message))) => {
                    return Err(RunError::Failed(format!("the warm pool refused the run (too_large): {message}")))
                }
                Ok(Ok(Reply::Stats(_) | Reply::Session(_))) => {
                    return Err(RunError::Failed("the warm pool answered the run with something else".into()))
                }
            };
            if !events {
                for line in wire::events_from_result(&result.value()) {
                    log.push(&line);
                }
            }
            Ok(result)
        })
    }
}

/// The pool's stdin: lines in order, each with its newline.
async fn write_lines(mut stdin: tokio::process::ChildStdin, mut lines: mpsc::UnboundedReceiver<String>) {
    while let Some(mut line) = lines.recv().await {
        line.push('\n');
        if stdin.write_all(line.as_bytes()).await.is_err() {
            return;
        }
    }
    // Every sender is gone: stdin closes as it drops, and the pool drains.
}

/// The pool's stdout, a bounded line at a time, to the waiting runs.
async fn read_lines(link: Arc<Link>, stdout: tokio::process::ChildStdout) {
    let mut reader = BufReader::with_capacity(64 << 10, stdout);
    let mut buf = Vec::new();
    loop {
        let read = wire::read_line(&mut reader, &mut buf, wire::MAX_LINE_BYTES).await;
        match read {
            // A long result goes to its run whole, to be parsed there off
            // this reader, which every run's replies share.
            Ok(Read::Whole) => match (buf.len() > KEPT_LINE_BYTES).then(|| wire::result_id(&buf)).flatten() {
                Some(id) => link.dispatch(Line::Reply(id, Reply::Unparsed(std::mem::take(&mut buf)))),
                None => link.dispatch(wire::parse_line(&buf)),
            },
            Ok(Read::TooLong) => link.too_long(&buf),
            Ok(Read::End) | Err(_) => {
                // Nothing more can come: no new run is sent here; the
                // keeper fails the waiting ones once the pool has exited.
                link.closed.store(true, Ordering::SeqCst);
                link.close();
                return;
            }
        }
        // A result's long line is not held between lines.
        if buf.capacity() > KEPT_LINE_BYTES {
            buf = Vec::new();
        }
    }
}

/// The pool's stderr to ours, a line at a time (each cut at
/// `MAX_STDERR_LINE`), the last one kept to say why it ended.
async fn forward_stderr(err: tokio::process::ChildStderr, tail: Arc<Mutex<String>>) {
    let mut reader = BufReader::new(err);
    let mut buf = Vec::new();
    while let Ok(Read::Whole | Read::TooLong) = wire::read_line(&mut reader, &mut buf, MAX_STDERR_LINE).await {
        let line = String::from_utf8_lossy(&buf).trim().to_owned();
        if line.is_empty() {
            continue;
        }
        eprintln!("jail serve: pool: {line}");
        *lock(&tail) = line;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in `jail pool` speaking the protocol: `old` knows no
    /// `events` and answers runs in pairs, the second first; `events`
    /// streams one event per run and holds the result until asked for
    /// stats with id `release`; `dies` exits at its first run in its first
    /// life; `broken` cannot make its first jail.
    const FAKE: &str = r#"#!/usr/bin/python3
import json, os, sys, threading
MODE, VERSION = sys.argv[-2], int(sys.argv[-1])
marker = os.path.join(os.environ["TMPDIR"], "lived")
first_life = not os.path.exists(marker)
open(marker, "a").close()
if MODE == "broken":
    print("jail pool: the first pooled jail failed: no module named pandas", file=sys.stderr, flush=True)
    sys.exit(125)
def say(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()
held = []
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "cancel":
        found = [h for h in held if h[0] == req["id"]]
        if found:
            held.remove(found[0])
            say({"id": req["id"], "result": dict(found[0][1], status="cancelled")})
        else:
            say({"id": req["id"], "error": {"code": "unknown_id", "message": "not in flight"}})
        continue
    if req.get("op") == "stats":
        say({"id": req.get("id"), "stats": {"size": 2, "ready": 2, "making": 0, "in_use": 0,
             "refill_ms": {"last": 40.0, "mean": 42.0}, "idle_rss_bytes": 1}})
        if req.get("id") == "release":
            for rid, r in held:
                say({"id": rid, "result": r})
            held = []
        continue
    if "events" in req and MODE != "events":
        say({"id": req["id"], "error": {"code": "unknown_field", "message": "unknown field `events`, expected one of `id`"}})
        continue
    if "script" not in req:
        say({"id": req["id"], "error": {"code": "bad_request", "message": "give exactly one of \"code\" and \"script\""}})
        continue
    if MODE == "dies" and first_life:
        os._exit(3)
    result = {"schema_version": VERSION, "status": "ok", "stdout": {"text": "ran " + req["id"]},
              "stderr": {"text": ""}, "artifacts": [{"path": "a.txt"}]}
    if req.get("events"):
        say({"id": req["id"], "event": {"type": "stdout", "data": "live " + req["id"]}})
    held.append((req["id"], result))
    if MODE == "old" and len(held) == 2:
        for rid, r in reversed(held):
            say({"id": rid, "result": r})
        held = []
    elif MODE == "dies":
        for rid, r in held:
            say({"id": rid, "result": r})
        held = []
"#;

    struct Fake {
        dir: tempfile::TempDir,
    }

    impl Fake {
        fn new() -> Fake {
            let dir = tempfile::tempdir().unwrap();
            let exe = dir.path().join("fake-pool");
            std::fs::write(&exe, FAKE).unwrap();
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
            Fake { dir }
        }

        fn config(&self, mode: &str) -> PoolConfig {
            PoolConfig {
                jail: self.dir.path().join("fake-pool"),
                flags: vec![mode.into(), jail::result::SCHEMA_VERSION.to_string().into()],
                size: 2,
                memory_mib: 256,
                timeout: Duration::from_secs(10),
                temp_dir: self.dir.path().to_path_buf(),
                runtime_dir: self.dir.path().to_path_buf(),
            }
        }

        fn job(&self, id: &str) -> Job {
            Job {
                id: id.into(),
                dir: self.dir.path().join(id),
                input: None,
                timeout: Duration::from_secs(5),
                memory_mib: 256,
                env: Default::default(),
            }
        }
    }

    fn lines(log: &EventLog) -> Vec<Value> {
        log.lines().iter().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// A log in a fresh folder of its own.
    fn scratch_log() -> Arc<EventLog> {
        let dir = tempfile::tempdir().unwrap().keep();
        Arc::new(EventLog::create(dir.join("events")))
    }

    async fn run(link: &Arc<Link>, job: Job) -> (Result<Value, RunError>, Arc<EventLog>) {
        let log = scratch_log();
        (link.run(job, Arc::clone(&log), Arc::default()).await.map(|r| r.value()), log)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_runs_each_get_their_own_reply_whatever_the_order() {
        let fake = Fake::new();
        let pool = Pool::start(fake.config("old")).await.unwrap();
        let link = pool.link().unwrap();
        assert!(!pool.shape(&link).events, "the old pool refused `events`");
        let (a, b) = tokio::join!(run(&link, fake.job("a")), run(&link, fake.job("b")));
        for (id, (r, log)) in [("a", a), ("b", b)] {
            assert_eq!(r.unwrap()["stdout"]["text"], format!("ran {id}"));
            let events = lines(&log);
            let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
            assert_eq!(kinds, ["stdout", "artifact"], "the events are made from the result: {events:?}");
            assert!(!log.written().done, "the log is the caller's to finish, once the run is recorded");
        }
        let snap = pool.snapshot().await;
        assert_eq!(snap.stats.unwrap().refill_ms.mean, 42.0);
        pool.shut_down().await;
        assert_eq!(pool.health(), Health::Stopped);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live_events_reach_the_runs_log_before_its_result() {
        let fake = Fake::new();
        let pool = Pool::start(fake.config("events")).await.unwrap();
        let link = pool.link().unwrap();
        assert!(pool.shape(&link).events, "the probe found `events` taken");
        let log = scratch_log();
        let task = tokio::spawn({
            let (link, log, job) = (Arc::clone(&link), Arc::clone(&log), fake.job("c"));
            async move { link.run(job, log, Arc::default()).await }
        });
        let until = Instant::now() + Duration::from_secs(10);
        while log.written().count == 0 {
            assert!(Instant::now() < until, "no live event");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!task.is_finished(), "the event came while the run was still going");
        assert_eq!(lines(&log)[0], serde_json::json!({"type": "stdout", "data": "live c"}));
        assert!(matches!(link.call(wire::stats_line("release"), "release".into()).await, Some(Reply::Stats(_))));
        assert_eq!(task.await.unwrap().unwrap().value()["status"], "ok");
        let kinds: Vec<String> = lines(&log).iter().map(|e| e["type"].as_str().unwrap().to_owned()).collect();
        assert_eq!(kinds, ["stdout"], "nothing made up when the pool streamed");
        pool.shut_down().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_pool_run_ends_with_its_reply_and_a_late_unknown_id_is_dropped() {
        let fake = Fake::new();
        let pool = Pool::start(fake.config("events")).await.unwrap();
        let link = pool.link().unwrap();
        let (log, cancel) = (scratch_log(), Arc::new(Cancel::default()));
        let task = tokio::spawn({
            let (link, log, cancel, job) = (Arc::clone(&link), Arc::clone(&log), Arc::clone(&cancel), fake.job("k"));
            async move { link.run(job, log, cancel).await }
        });
        let until = Instant::now() + Duration::from_secs(10);
        while log.written().count == 0 {
            assert!(Instant::now() < until, "the run never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.ask();
        let r = tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap().unwrap();
        assert_eq!(r.value()["status"], "cancelled");
        // A second cancel of the answered run: the pool says unknown_id, and
        // nothing waits for that.
        link.cancel("k");
        assert!(pool.snapshot().await.stats.is_some(), "the link serves on");
        // Cancelled before it was sent: nothing reaches the pool.
        let asked = Arc::new(Cancel::default());
        asked.ask();
        let held: Vec<_> = futures_util::future::join_all((0..4).map(|_| link.gate.acquire())).await;
        let e = link.run(fake.job("never"), scratch_log(), asked).await.unwrap_err();
        assert!(matches!(e, RunError::Cancelled(_)), "{e}");
        drop(held);
        pool.shut_down().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_that_dies_fails_its_runs_and_is_started_again() {
        let fake = Fake::new();
        let pool = Pool::start(fake.config("dies")).await.unwrap();
        let link = pool.link().unwrap();
        let (r, _) = run(&link, fake.job("d")).await;
        let e = r.unwrap_err();
        assert!(matches!(&e, RunError::PoolLost(m) if m.contains("ended")), "{e}");
        let until = Instant::now() + Duration::from_secs(20);
        let link = loop {
            if let Some(l) = pool.link() {
                break l;
            }
            assert!(Instant::now() < until, "no new pool: {:?}", pool.health());
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(pool.health(), Health::Up);
        assert_eq!(pool.restarts.load(Ordering::SeqCst), 1);
        assert_eq!(run(&link, fake.job("e")).await.0.unwrap()["stdout"]["text"], "ran e");
        pool.shut_down().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_that_cannot_start_says_why() {
        let fake = Fake::new();
        let e = Pool::start(fake.config("broken")).await.err().unwrap().to_string();
        assert!(e.contains("no module named pandas") && e.contains("125"), "{e}");
    }
}
