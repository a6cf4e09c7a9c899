//! The spawn backend: each run a `jail run --events` process of its own,
//! in its own process group, SIGTERM on the server's death
//! (PR_SET_PDEATHSIG). A cancel (a DELETE, or a waiting client that went
//! away) sends the group SIGTERM: `jail run` kills its tree, cleans up and
//! prints its result, `cancelled` (cancel.rs in jail). Dropping the run's
//! future terminates the group too, then kills it after
//! `jail::client::bounds::STOP_GRACE` (jail::client::group).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jail::client::command::{self, Flags, Mode, RunSpec, Script};
use jail::client::events::{self, Line, Lines};
use jail::client::group::Group;
use nix::sys::signal::Signal;
use tokio::io::AsyncReadExt;

use crate::backend::{Backend, BoxFuture, EventLog, Job, RawResult, RunError};
use crate::cancel::Cancel;

/// Bytes of one line (an event, or the result, which carries the run's
/// capped streams) read at most; a longer event is counted as dropped.
const MAX_RESULT_BYTES: usize = jail::client::bounds::MAX_DOCUMENT as usize;
const MAX_JAIL_STDERR_BYTES: u64 = jail::client::bounds::MAX_STDERR;
/// How long past its deadline a run may take before it is deemed hung.
pub const HUNG_GRACE: Duration = jail::client::bounds::HUNG_GRACE;

pub struct SpawnBackend {
    pub jail: PathBuf,
    /// Flags every run gets (policy, rootfs, cgroup parent).
    pub flags: Flags,
}

impl SpawnBackend {
    /// `jail run --events ... --input input main.py`, in the run's folder:
    /// the tenant's paths are relative to the working folder, so no
    /// command line (which every local user may read in /proc) names them.
    /// Its own group, so that stopping it reaches whatever it started;
    /// SIGTERM on the server's death, not SIGKILL: the jail kills its
    /// tree and removes its cgroup.
    fn command(&self, job: &Job) -> std::io::Result<tokio::process::Command> {
        let mut spec = RunSpec::new(&self.jail, Mode::Events, Script::File("main.py".into()), job.timeout);
        spec.flags = self.flags.clone();
        spec.flags.limits.timeout = Some(job.timeout);
        spec.flags.limits.memory = Some(format!("{}M", job.memory_mib));
        spec.input = job.input.as_ref().map(|input| input.strip_prefix(&job.dir).unwrap_or(input).to_path_buf());
        spec.dir = Some(job.dir.clone());
        spec.env.push(("TMPDIR".into(), job.dir.clone().into()));
        spec.envs = job.env.clone();
        spec.parent_death = Some(Signal::SIGTERM);
        command::command(&spec).map(tokio::process::Command::from)
    }
}

impl Backend for SpawnBackend {
    fn run<'a>(&'a self, job: Job, log: Arc<EventLog>, cancel: Arc<Cancel>) -> BoxFuture<'a, Result<RawResult, RunError>> {
        Box::pin(async move {
            let failed = |m: String| RunError::Failed(m);
            let mut child = self
                .command(&job)
                .and_then(|mut c| c.spawn())
                .map_err(|e| failed(format!("cannot start {}: {e}", self.jail.display())))?;
            // Dropped before `done` (the run's future was), the group is
            // terminated, then killed after the grace.
            let guard = Group::of(child.id());
            let stopper = guard.stopper();
            // For the janitor, should the server die before the run ends:
            // the parent-death signal reaches the leader alone, the
            // janitor terminates the whole group.
            if let Some(pgid) = guard.pgid() {
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
            let waited = tokio::time::timeout(
                job.timeout + HUNG_GRACE,
                cancel.until_done(work, || stopper.iter().for_each(|s| s.terminate())),
            )
            .await;
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
/// while it is written there (one line at a time, bounded: the one reader
/// of jail::client::events), until the result, which is returned rather
/// than logged: the caller keeps it.
async fn read_events(mut out: impl tokio::io::AsyncRead + Unpin, log: &EventLog) -> Option<RawResult> {
    let mut lines = Lines::new(MAX_RESULT_BYTES);
    let mut chunk = vec![0u8; 64 << 10];
    let mut result = None;
    let mut take = |line: Line<'_>| match line {
        // Read once, later, off the async threads (runs.rs `keep_result`).
        Line::Whole(l) if events::is_result(l) => result = String::from_utf8(l.to_vec()).ok().map(RawResult::line),
        Line::Whole(l) => match std::str::from_utf8(l) {
            Ok(text) => log.push(text),
            Err(_) => log.dropped(),
        },
        Line::TooLong => log.dropped(),
    };
    loop {
        match out.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => lines.feed_all(&chunk[..n], &mut take),
        }
    }
    lines.finish_all(&mut take);
    result
}
