//! The spawn backend: each run a `jail run --events` process of its own,
//! in its own process group, SIGTERM on the server's death
//! (PR_SET_PDEATHSIG). A cancel (a DELETE, or a waiting client that went
//! away) sends the group SIGTERM: `jail run` kills its tree, cleans up and
//! prints its result, `cancelled` (cancel.rs in jail). Dropping the run's
//! future terminates the group too, then kills it after `STOP_GRACE`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, BufReader};

use crate::backend::{Backend, BoxFuture, EventLog, Job, RawResult, RunError};
use crate::cancel::Cancel;
use crate::pool::wire::{self, Read};

/// Bytes of one line (an event, or the result, which carries the run's
/// capped streams) read at most; a longer event is counted as dropped.
pub const MAX_RESULT_BYTES: usize = jail::client::bounds::MAX_DOCUMENT as usize;
/// How the result event, and only it, begins (the jail writes the tag first).
const RESULT_PREFIX: &[u8] = br#"{"type":"result","#;
const MAX_JAIL_STDERR_BYTES: u64 = jail::client::bounds::MAX_STDERR;
/// How long past its deadline a run may take before it is deemed hung.
pub const HUNG_GRACE: Duration = jail::client::bounds::HUNG_GRACE;
/// How long a terminated run has to remove its cgroup before SIGKILL.
const STOP_GRACE: Duration = jail::client::bounds::STOP_GRACE;

pub struct SpawnBackend {
    pub jail: PathBuf,
    /// Flags every run gets (policy, rootfs).
    pub flags: Vec<OsString>,
}

impl SpawnBackend {
    /// `jail run --events ... --input input main.py`, in the run's folder:
    /// the tenant's paths are relative to the working folder, so no
    /// command line (which every local user may read in /proc) names them.
    fn command(&self, job: &Job) -> tokio::process::Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(&self.jail);
        cmd.arg("run").arg("--events").args(&self.flags);
        cmd.arg("--timeout").arg(job.timeout.as_secs_f64().to_string());
        cmd.arg("--memory").arg(format!("{}M", job.memory_mib));
        if let Some(input) = &job.input {
            cmd.arg("--input").arg(input.strip_prefix(&job.dir).unwrap_or(input));
        }
        cmd.arg("main.py");
        cmd.current_dir(&job.dir);
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
    fn run<'a>(&'a self, job: Job, log: Arc<EventLog>, cancel: Arc<Cancel>) -> BoxFuture<'a, Result<RawResult, RunError>> {
        Box::pin(async move {
            let failed = |m: String| RunError::Failed(m);
            let mut child = self
                .command(&job)
                .spawn()
                .map_err(|e| failed(format!("cannot start {}: {e}", self.jail.display())))?;
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
                if let Some(out) = stdout {
                    result = read_events(out, &log).await;
                }
            };
            let mut err = Vec::new();
            let read_err = async {
                if let Some(s) = stderr {
                    let _ = s.take(MAX_JAIL_STDERR_BYTES).read_to_end(&mut err).await;
                }
            };
            let work = async {
                tokio::join!(read, read_err);
                child.wait().await
            };
            // Stopped, it goes on to print its result: `cancelled`.
            let waited = tokio::time::timeout(job.timeout + HUNG_GRACE, cancel.until_done(work, || guard.terminate())).await;
            let status = match waited {
                Ok(Ok(status)) => status,
                Ok(Err(e)) => return Err(failed(format!("waiting for the jail: {e}"))),
                Err(_) => return Err(failed("the jail did not finish after its deadline and was stopped".into())),
            };
            guard.done();
            let doc = result.ok_or_else(|| {
                failed(format!("the jail printed no result (exit {status}): {}", String::from_utf8_lossy(&err).trim()))
            })?;
            Ok(doc)
        })
    }
}

/// Each event line of a `jail run --events` into `log`, each held only
/// while it is written there (one line at a time, bounded), until the
/// result, which is returned rather than logged: the caller keeps it.
async fn read_events(out: impl tokio::io::AsyncRead + Unpin, log: &EventLog) -> Option<RawResult> {
    let mut reader = BufReader::with_capacity(64 << 10, out);
    let mut line = Vec::new();
    loop {
        match wire::read_line(&mut reader, &mut line, MAX_RESULT_BYTES).await {
            // Read once, later, off the async threads (runs.rs `keep_result`).
            Ok(Read::Whole) if line.starts_with(RESULT_PREFIX) => return String::from_utf8(line).ok().map(RawResult::line),
            Ok(Read::Whole) => match std::str::from_utf8(&line) {
                Ok(text) => log.push(text),
                Err(_) => log.dropped(),
            },
            Ok(Read::TooLong) => log.dropped(),
            Ok(Read::End) | Err(_) => return None,
        }
        // A long line's buffer is not kept for the short ones after it.
        if line.capacity() > SMALL_LINE {
            line = Vec::new();
        }
    }
}

/// A line buffer kept between lines at most.
const SMALL_LINE: usize = 256 << 10;

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
    /// SIGTERM to the group, which stays ours (its leader is not reaped).
    fn terminate(&self) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, Signal::SIGTERM);
        }
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
