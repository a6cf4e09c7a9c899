//! `jail session`: one jail for one sub-task, running many cells in one
//! Python interpreter whose globals persist.
//!
//! `start` binds the handle (handle.rs), forks one session supervisor
//! (setsid, stdio on /dev/null, owned by the caller; no daemon) and
//! returns once the jail's cell driver said `ready`. The supervisor runs
//! the ordinary `supervisor::run_with` with the embedded driver
//! (driver.py) as the script, the request's step
//! [`StepKind::Cells`](crate::request::StepKind) and the session's
//! [`cells::Cells`] as the watch's loop: the jail is made exactly as for
//! `jail run` — same namespaces, mounts, seccomp, landlock and limits, for
//! its whole life — and the watch loop (watch.rs) drives the cells in
//! place of one script's deadlines. When the session ends,
//! `supervisor::run_with` finishes as a run does (tree killed and reaped, cgroup removed, output judged
//! and delivered); the socket, the driver's folder and the cgroup go, and
//! a tombstone keeps why, for a later `exec`, and the closing result, for
//! a later `stop` (handle.rs, `Tombstone`). A janitor process
//! does the same cleanup should the supervisor itself be killed.
//!
//! A session made ahead (a `jail pool`'s) can take its caller's output
//! folder once, before any untrusted cell (adopt.rs): then it behaves as
//! one started with that `--output`. Asked to (`StartOptions::preload`),
//! `start` runs the policy's preload as the first, trusted cell before it
//! returns (preload.rs).
//!
//! Time limits: `limits.wall_time_secs` (or `--timeout`) and
//! `limits.cpu_time_secs` are per cell (SIGINT past them, then a kill
//! after `session.interrupt_grace_secs`); memory, pids and CPUs hold for
//! the whole session. Without a cgroup, RLIMIT_CPU counts the driver's
//! CPU time over the whole session: its SIGXCPU ends the session, and the
//! cell in flight is `timeout_cpu`, by the run's rules (cell.rs).

pub(crate) mod adopt;
pub mod cell;
pub(crate) mod cell_files;
pub(crate) mod cells;
pub mod files;
pub(crate) mod grace;
pub mod handle;
pub(crate) mod live;
pub(crate) mod preload;

use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use self::cells::Cells;
use crate::policy;
use crate::request::{RunRequest, StepKind};
use crate::result::RunResult;
use crate::streams::OutputMode;
use crate::sync::Pipe;
use crate::sys::{self, Forked};

/// The cell driver, trusted, stdlib only, after the rich results it
/// shares with the script runner (shown.py, display.py as text: see
/// `display::RUNNER`); copied into the jail read-only like any script.
pub(crate) const DRIVER: &str = concat!(
    include_str!("shown.py"),
    "\nDISPLAY = r'''",
    include_str!("display.py"),
    "'''\n\n",
    include_str!("session/driver.py")
);

/// How long `start` waits for the jail's driver to say `ready`.
const READY_WAIT: Duration = Duration::from_secs(120);

/// Each cell's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CellLimits {
    pub(crate) wall: Duration,
    pub(crate) stdout_cap: u64,
    pub(crate) stderr_cap: u64,
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Why {
    Stopped,
    IdleTimeout,
    MaxLifetime,
    /// This cell did not stop within the grace after its interrupt.
    CellKilled(u64),
    /// The interpreter died (segfault, `os._exit`, the OOM killer).
    Died(cell::Death),
    /// The driver stopped reading its cells.
    DriverDeaf,
    /// The jail never got as far as the driver's `ready`.
    NeverReady,
    /// The process whose lifeline the session held (a `jail pool`) ended.
    OwnerGone,
    /// The session supervisor got SIGTERM, SIGINT or SIGHUP (cancel.rs):
    /// the cell in flight, if any, is killed and ends `cancelled`.
    Cancelled(nix::sys::signal::Signal),
}

impl Why {
    pub fn code(&self) -> &'static str {
        match self {
            Why::Stopped => "stopped",
            Why::IdleTimeout => "idle_timeout",
            Why::MaxLifetime => "max_lifetime",
            Why::CellKilled(_) => "cell_killed",
            Why::Died(_) => "interpreter_died",
            Why::DriverDeaf => "driver_deaf",
            Why::NeverReady => "setup_failed",
            Why::OwnerGone => "owner_gone",
            Why::Cancelled(_) => "cancelled",
        }
    }

    fn describe(&self, s: &policy::SessionLimits) -> String {
        match self {
            Why::Stopped => "stopped by `jail session stop`".into(),
            Why::IdleTimeout => format!("no cell for session.idle_timeout_secs ({}s)", s.idle_timeout.as_secs_f64()),
            Why::MaxLifetime => format!("it reached session.max_lifetime_secs ({}s)", s.max_lifetime.as_secs_f64()),
            Why::CellKilled(n) => format!(
                "cell {n} ran past its time and did not stop within session.interrupt_grace_secs ({}s) of its KeyboardInterrupt, so it was killed",
                s.interrupt_grace.as_secs_f64()
            ),
            Why::Died(cell::Death::Exited(code)) => format!("the interpreter exited with code {code}"),
            Why::Died(cell::Death::Signaled(sig)) => {
                let name = nix::sys::signal::Signal::try_from(*sig).map(|s| s.as_str()).unwrap_or("?");
                format!("the interpreter was killed by signal {sig} ({name})")
            }
            Why::Died(cell::Death::Killed) => "the interpreter was killed".into(),
            Why::DriverDeaf => "the cell driver stopped reading its cells".into(),
            Why::NeverReady => "the jail failed before its interpreter was ready".into(),
            Why::OwnerGone => "the process that owned the session (its lifeline's other end) ended".into(),
            Why::Cancelled(sig) => format!("the session supervisor got {} (a `jail pool` cancel, or a kill)", sig.as_str()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Handle(#[from] handle::HandleError),
    #[error("write the cell driver to {0}")]
    Driver(PathBuf, #[source] io::Error),
    #[error("fork the session supervisor")]
    Fork(#[source] io::Error),
    /// The jail failed to start: its one-line setup error.
    #[error("{0}")]
    Setup(String),
}

/// Where a caller's sessions live (cli/session.rs passes `XDG_RUNTIME_DIR`).
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    pub runtime_dir: Option<PathBuf>,
    /// An inherited file descriptor, the read end of a pipe whose write end
    /// the owner holds: the session ends when every write end is closed, so
    /// a session dies with the process that started it even when that
    /// process is SIGKILLed (`jail pool` sets it). Taken over by `start`.
    pub lifeline: Option<std::os::fd::RawFd>,
    /// Run the policy's `preload` as the first cell before `start`
    /// returns (preload.rs): the one cell an output folder may still be
    /// taken after (adopt.rs). Never inferred from the lifeline.
    pub preload: bool,
}

/// A session that is up.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Started {
    pub handle: PathBuf,
    pub pid: u32,
    pub id: String,
    /// The jail's PID 1: a fork of a template is not the supervisor's
    /// descendant (a pool reads its memory by it).
    pub jail_pid: Option<u32>,
}

/// Start a session for `req` (its script is ignored: the driver runs).
/// Returns once the driver is ready, or with the jail's setup error.
pub fn start(mut req: RunRequest, opts: &StartOptions) -> Result<Started, StartError> {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = handle::session_dir(opts.runtime_dir.as_deref(), uid)?;
    sweep_tombstones(&dir);
    let id = handle::new_id()?;
    // The key each cell's word is bound to (cells.rs, `Cells::nonce`):
    // never in the jail, so no line written before a cell began can be its.
    let key = format!("{}{}", handle::new_id()?, handle::new_id()?);
    let (socket, tombstone) = handle::paths(&dir, &id);
    let driver_dir = dir.join(format!("{id}.d"));
    let driver = driver_dir.join("jail_cell_driver.py");
    let written = std::fs::DirBuilder::new().mode(0o700).create(&driver_dir).and_then(|()| {
        // Readable by the jail's uid (a script is given to the jail only if
        // it may read it: accept.rs); its folder keeps everyone else out.
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&driver)?;
        f.write_all(DRIVER.as_bytes())
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&driver_dir);
        return Err(StartError::Driver(driver, e));
    }
    let listener = match handle::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&driver_dir);
            return Err(e.into());
        }
    };
    let ready = Pipe::new().map_err(StartError::Fork)?;
    let limits = CellLimits {
        wall: req.timeout.unwrap_or(req.policy.limits.wall_time),
        stdout_cap: req.policy.limits.stdout_bytes,
        stderr_cap: req.policy.limits.stderr_bytes,
    };
    let session = req.policy.session;
    // The trusted preload, when asked for, is the first cell: the one cell
    // allowed before the session takes an output folder (adopt.rs).
    // A template's fork holds the template's preload already (template.rs).
    let preload = if opts.preload && req.template.is_none() {
        req.policy.preload.clone()
    } else {
        Vec::new()
    };
    let trusted_cells = u64::from(!preload.is_empty());
    let adoption = adopt::Adoption::new(req.policy.artifacts.clone(), req.input.clone(), trusted_cells);
    // The jail lives as long as the session may; each cell has its own
    // time (cells.rs).
    req.timeout = Some(session.max_lifetime);
    req.step = StepKind::Cells;
    req.script = driver.clone();
    req.args = Vec::new();
    req.mode = OutputMode::Capture;
    let paths = Leftovers { socket: socket.clone(), tombstone, driver_dir };
    match sys::fork_process() {
        Err(e) => {
            paths.remove();
            Err(StartError::Fork(e))
        }
        Ok(Forked::Child) => {
            drop(ready.read);
            let lifeline = opts.lifeline.and_then(sys::take_inherited_fd);
            let cells = Cells::new(id, key, listener, limits, session, ready.write, lifeline, adoption);
            supervise(req, cells, paths)
        }
        Ok(Forked::Parent(pid)) => {
            drop(ready.write);
            drop(listener);
            let jail_pid = wait_ready(ready.read)?;
            if !preload.is_empty() {
                if let Err(why) = preload::run(&socket, &preload, limits.wall) {
                    // Ended as `jail session stop` ends it: nothing left.
                    let _ = crate::client::session::stop(&socket);
                    return Err(StartError::Setup(why));
                }
            }
            Ok(Started { handle: socket, pid: pid.as_raw() as u32, id, jail_pid })
        }
    }
}

/// What a session leaves on the host, removed at its end.
struct Leftovers {
    socket: PathBuf,
    tombstone: PathBuf,
    driver_dir: PathBuf,
}

impl Leftovers {
    fn remove(&self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir_all(&self.driver_dir);
    }

    /// What a later client finds of the session: why it ended, for an
    /// `exec`, and its closing result, for a `stop` (a session that ended
    /// by itself, with nobody waiting for its closing, still reports what
    /// it delivered and refused: handle.rs, `Tombstone`).
    fn bury(&self, why: &str, closing: Option<&RunResult>) {
        let stone = handle::Tombstone {
            why: why.to_string(),
            closing: closing.and_then(|c| serde_json::to_value(c).ok()),
        };
        let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&self.tombstone);
        if let Ok(mut f) = f {
            let _ = f.write_all(&serde_json::to_vec(&stone).unwrap_or_default());
        }
    }
}

/// Read the session supervisor's word: `ready` (with the jail's PID 1),
/// or the setup error.
fn wait_ready(from: OwnedFd) -> Result<Option<u32>, StartError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let until = Instant::now() + READY_WAIT;
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(from.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(left.as_millis() as u64).unwrap_or(PollTimeout::MAX);
        if !matches!(poll(&mut fds, timeout), Ok(n) if n > 0) {
            return Err(StartError::Setup(format!("the jail was not ready within {}s", READY_WAIT.as_secs())));
        }
        let n = nix::unistd::read(from.as_raw_fd(), &mut buf).unwrap_or(0);
        if n == 0 || text.len() > 64 << 10 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
        if let Some(rest) = text.strip_prefix(b"ready") {
            if let Some(end) = rest.iter().position(|b| *b == b'\n') {
                return Ok(std::str::from_utf8(&rest[..end]).ok().and_then(|p| p.trim().parse().ok()));
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    match text.strip_prefix("error ") {
        Some(line) => Err(StartError::Setup(line.trim().to_string())),
        None => Err(StartError::Setup("the session supervisor ended before its jail was ready".into())),
    }
}

/// The session supervisor: its own session, no terminal, a janitor, then
/// the run that is the session; at its end, everything removed.
fn supervise(req: RunRequest, mut cells: Cells, paths: Leftovers) -> ! {
    let _ = nix::unistd::setsid();
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
    match start_janitor(&paths) {
        Ok(fd) => cells.janitor = Some(fd),
        Err(_) => {
            // Nothing could clean up after a kill: refuse rather than risk litter.
            cells.say_failed("fork the session's janitor failed");
            paths.remove();
            sys::exit_now(0);
        }
    }
    // After the janitor's fork (it keeps the default death), before any
    // thread: SIGTERM, SIGINT and SIGHUP end the session as a cancel
    // (cells.rs), its cell in flight `cancelled`, everything cleaned up as
    // a stop does. Unarmed, they kill us, and the janitor cleans up.
    let _ = crate::cancel::arm();
    let result = crate::supervisor::run_with(&req, &mut cells);
    let why = cells.end_why().unwrap_or(Why::NeverReady);
    if !cells.said_ready() {
        let line = match &result.setup_error {
            Some(e) if e.causes.is_empty() => format!("{} ({})", e.message, e.stage),
            Some(e) => format!("{} ({}): {}", e.message, e.stage, e.causes.join(": ")),
            None => format!("the jail ended before its interpreter was ready (status {:?})", result.status),
        };
        cells.say_failed(&line);
    }
    let mut result = result;
    result.session = Some(cells.info(0, Some(&why)));
    // Before the socket goes: a client that connected while the output was
    // judged reads the tombstone once we are gone.
    paths.bury(&why.describe(&cells.session), Some(&result));
    paths.remove();
    if let Some(stopper) = cells.stopper.take() {
        handle::answer(&stopper, &handle::Answer { result: serde_json::to_value(&result).ok(), error: None });
    }
    sys::exit_now(0)
}

/// Fork the janitor (janitor.rs): once the supervisor is gone, however
/// it went, it buries the session and removes its files, then the cgroup
/// folders the supervisor told it (one path a line).
fn start_janitor(paths: &Leftovers) -> io::Result<OwnedFd> {
    crate::janitor::fork(|told| {
        // If the supervisor ended normally all of this is done.
        paths.bury("the session supervisor was killed", None);
        paths.remove();
        crate::janitor::remove_told_cgroups(told);
    })
}

/// Tombstones kept in a caller's session folder: the newest ones, so the
/// folder stays bounded whatever the history (a pool makes a session per
/// step). A client asks an ended session for its closing at once (a
/// pool) or soon after; one that waits past this many later endings gets
/// "no session".
pub const MAX_TOMBSTONES: usize = 64;

/// Names read from the session folder per sweep: the folder holds live
/// sessions' sockets and driver folders besides the tombstones, and a
/// sweep that meets more stops there (the next start sweeps on).
const SWEEP_SCAN: usize = 65_536;

/// Forget tombstones older than a day, and all but the newest
/// [`MAX_TOMBSTONES`].
fn sweep_tombstones(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let mut kept: Vec<(SystemTime, PathBuf)> = Vec::new();
    for e in entries.take(SWEEP_SCAN).flatten() {
        if !e.file_name().as_encoded_bytes().ends_with(b".ended") {
            continue;
        }
        let Ok(meta) = e.metadata() else { continue };
        let at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if !meta.is_file() || now.duration_since(at).unwrap_or_default() > day {
            let _ = std::fs::remove_file(e.path());
        } else {
            kept.push((at, e.path()));
        }
    }
    if kept.len() > MAX_TOMBSTONES {
        kept.sort_unstable_by_key(|k| std::cmp::Reverse(k.0));
        for (_, path) in kept.drain(MAX_TOMBSTONES..) {
            let _ = std::fs::remove_file(path);
        }
    }
}
