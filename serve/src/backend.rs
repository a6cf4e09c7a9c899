//! Where a run runs. `Backend` is the seam: today each run is its own
//! `jail run --events` process (`SpawnBackend`), its supervisor a process of
//! its own so a crashing run cannot take the server down; a warm pool
//! (`jail pool`, JSON lines over stdin/stdout) can replace it behind the
//! same trait.

use std::ffi::OsString;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::Notify;

/// Bytes of one run's event stream (and so its result) read at most.
const MAX_EVENT_BYTES: u64 = 64 << 20;
const MAX_JAIL_STDERR_BYTES: u64 = 64 << 10;
/// How long past its deadline a run may take before it is deemed hung.
const HUNG_GRACE: Duration = Duration::from_secs(30);
/// How long a terminated run has to remove its cgroup before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// One run, staged: `dir/main.py`, `dir/input/` when there is input, and
/// the jail's fresh output folder is made in `dir` (TMPDIR).
#[derive(Debug, Clone)]
pub struct Job {
    pub dir: PathBuf,
    pub input: Option<PathBuf>,
    pub timeout: Duration,
    pub memory_mib: u64,
}

/// A run's live events (NDJSON lines, as `jail run --events` prints them),
/// kept for `GET /v1/runs/{id}/events`; `done` once the last is in.
#[derive(Default)]
pub struct EventLog {
    lines: Mutex<(Vec<Arc<str>>, bool)>,
    pub changed: Notify,
}

impl EventLog {
    pub fn push(&self, line: &str) {
        if let Ok(mut l) = self.lines.lock() {
            l.0.push(line.into());
        }
        self.changed.notify_waiters();
    }
    pub fn finish(&self) {
        if let Ok(mut l) = self.lines.lock() {
            l.1 = true;
        }
        self.changed.notify_waiters();
    }
    /// The lines from `from` on, and whether the log is complete.
    pub fn since(&self, from: usize) -> (Vec<Arc<str>>, bool) {
        match self.lines.lock() {
            Ok(l) => (l.0.get(from..).map(<[_]>::to_vec).unwrap_or_default(), l.1),
            Err(_) => (Vec::new(), true),
        }
    }
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait Backend: Send + Sync + 'static {
    /// Run `job`, appending its events to `log`; the result document.
    /// Dropping the future stops the run.
    fn run<'a>(&'a self, job: Job, log: Arc<EventLog>) -> BoxFuture<'a, Result<serde_json::Value, String>>;
}

/// Each run a `jail run --events` process: its own process group, SIGTERM
/// on the server's death (PR_SET_PDEATHSIG), the group terminated when the
/// request that owns it goes away.
pub struct SpawnBackend {
    pub jail: PathBuf,
    /// Flags every run gets (policy, rootfs).
    pub flags: Vec<OsString>,
}

impl SpawnBackend {
    fn command(&self, job: &Job) -> tokio::process::Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(&self.jail);
        cmd.arg("run").arg("--events").args(&self.flags);
        cmd.arg("--timeout").arg(job.timeout.as_secs_f64().to_string());
        cmd.arg("--memory").arg(format!("{}M", job.memory_mib));
        if let Some(input) = &job.input {
            cmd.arg("--input").arg(input);
        }
        cmd.arg(job.dir.join("main.py"));
        cmd.env("TMPDIR", &job.dir);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Its own group, so that stopping it reaches whatever it started.
        cmd.process_group(0);
        // SIGTERM, not SIGKILL: the jail kills its tree and removes its cgroup.
        jail::sys::set_parent_death_signal(&mut cmd, Signal::SIGTERM);
        tokio::process::Command::from(cmd)
    }
}

impl Backend for SpawnBackend {
    fn run<'a>(&'a self, job: Job, log: Arc<EventLog>) -> BoxFuture<'a, Result<serde_json::Value, String>> {
        Box::pin(async move {
            let mut child = self.command(&job).spawn().map_err(|e| format!("cannot start {}: {e}", self.jail.display()))?;
            let guard = Group::new(&child);
            // For the janitor, should the server die before the run ends:
            // the parent-death signal reaches the leader alone, the
            // janitor terminates the whole group.
            if let Some(pgid) = guard.pgid {
                let _ = std::fs::write(job.dir.join(crate::janitor::PGID_FILE), pgid.to_string());
            }
            let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
            let mut result = None;
            let read = async {
                let Some(out) = stdout else { return };
                let mut lines = BufReader::new(out.take(MAX_EVENT_BYTES)).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log.push(&line);
                    if let Ok(serde_json::Value::Object(mut event)) = serde_json::from_str(&line) {
                        if event.get("type").and_then(|t| t.as_str()) == Some("result") {
                            result = event.remove("result");
                        }
                    }
                }
            };
            let mut err = Vec::new();
            let read_err = async {
                if let Some(s) = stderr {
                    let _ = s.take(MAX_JAIL_STDERR_BYTES).read_to_end(&mut err).await;
                }
            };
            let waited = tokio::time::timeout(job.timeout + HUNG_GRACE, async {
                tokio::join!(read, read_err);
                child.wait().await
            })
            .await;
            log.finish();
            let status = match waited {
                Ok(Ok(status)) => status,
                Ok(Err(e)) => return Err(format!("waiting for the jail: {e}")),
                Err(_) => return Err("the jail did not finish after its deadline and was stopped".into()),
            };
            guard.done();
            let doc = result
                .ok_or_else(|| format!("the jail printed no result (exit {status}): {}", String::from_utf8_lossy(&err).trim()))?;
            jail::schema::check_version(&doc).map_err(|e| e.to_string())?;
            Ok(doc)
        })
    }
}

/// A started run's process group; dropped before `done`, it is
/// terminated, then killed after `STOP_GRACE`.
struct Group {
    pgid: Option<Pid>,
}

impl Group {
    fn new(child: &tokio::process::Child) -> Group {
        Group { pgid: child.id().and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw) }
    }
    fn done(mut self) {
        self.pgid = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let Some(pgid) = self.pgid.take() else { return };
        // The leader is not reaped until its Child is waited, so the group
        // id is still this run's.
        let _ = killpg(pgid, Signal::SIGTERM);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(STOP_GRACE).await;
                let _ = killpg(pgid, Signal::SIGKILL);
            });
        }
    }
}
