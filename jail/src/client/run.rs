//! One `jail run`, started and read to its result: `spawn` a `RunSpec`
//! (command.rs), then `Running::wait`, which reads stdout through the one
//! bounded reader (events.rs), keeps the tail of the jail's own stderr
//! for an error message, and gives up at the run's wall-clock limit plus
//! `bounds::HUNG_GRACE`: the jail kills its own tree at its deadline, so
//! this only guards against the jail itself hanging. A `Running` dropped
//! before its end (a cancelled caller, a hung jail) is stopped (group.rs)
//! and reaped on a thread.
//!
//! Synchronous, on threads: an async caller runs `wait` in
//! `spawn_blocking` and cancels through the `Stopper`.

use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::bounds::{HUNG_GRACE, MAX_DOCUMENT, MAX_STDERR};
use super::command::{self, Mode, RunSpec};
use super::events::{self, Lines, ResultError, Seen};
use super::group::{Group, Stopper};
use crate::events::Event;
use crate::result::RunResult;

/// Longest line of the jail's own stderr handed to the caller at once.
const STDERR_LINE: u64 = 4096;

/// How often the caller hears that nothing came.
const QUIET: Duration = Duration::from_secs(1);

/// Messages on the way from the reading threads, a few at a time.
const IN_FLIGHT: usize = 64;

/// Why a run has no result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start {}: {error}", path.display())]
    Spawn { path: PathBuf, error: std::io::Error },
    #[error("waiting for the jail: {0}")]
    Wait(std::io::Error),
    #[error("the jail did not finish within {} s of its deadline and was stopped", grace.as_secs())]
    Hung { grace: Duration },
    #[error("the jail printed no result (exit {status}): {stderr}")]
    NoResult { status: ExitStatus, stderr: String },
    #[error("{0}")]
    Result(ResultError),
}

/// What the caller hears while the run goes.
#[derive(Debug)]
pub enum Progress<'a> {
    /// An event (`--events`), the result excepted.
    Event(Event<'static>),
    /// An event line over `MAX_DOCUMENT`, or one this client does not know.
    Dropped,
    /// A line of the jail's own stderr (cut at 4 KiB).
    JailLine(&'a str),
    /// Nothing came for a second: the time since the start.
    Quiet(Duration),
}

/// A started `jail run`.
#[derive(Debug)]
pub struct Running {
    child: Option<Child>,
    group: Option<Group>,
    started: Instant,
    wall: Duration,
    reading: Reading,
}

/// How a started `jail`'s stdout is read.
#[derive(Debug, Clone, Copy)]
enum Reading {
    /// `jail run`'s, as its mode says.
    Run(Mode),
    /// One document kept as bytes (`jail session start --json`).
    Document,
}

/// What a `jail` that prints one document left (`Running::output`).
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    /// Its stdout, at most `MAX_DOCUMENT` bytes.
    pub stdout: Vec<u8>,
    /// The tail of its stderr (`MAX_STDERR`), trimmed.
    pub stderr: String,
}

/// How a read ended.
struct Ended {
    status: ExitStatus,
    result: Option<Result<RunResult, ResultError>>,
    document: Vec<u8>,
    stderr: String,
}

/// Start `spec`.
pub fn spawn(spec: &RunSpec) -> Result<Running, RunError> {
    let cmd = command::command(spec).map_err(|error| RunError::Spawn { path: spec.jail.clone(), error })?;
    started(cmd, &spec.jail, spec.wall, Reading::Run(spec.mode))
}

/// Start a `jail` that prints one document (command.rs made `cmd`), given
/// `wall` (+ the grace) to print it and exit: read by [`Running::output`].
pub(crate) fn spawn_document(cmd: std::process::Command, jail: &std::path::Path, wall: Duration) -> Result<Running, RunError> {
    started(cmd, jail, wall, Reading::Document)
}

fn started(
    mut cmd: std::process::Command,
    jail: &std::path::Path,
    wall: Duration,
    reading: Reading,
) -> Result<Running, RunError> {
    let started = Instant::now();
    let child = cmd.spawn().map_err(|error| RunError::Spawn { path: jail.to_path_buf(), error })?;
    let group = Group::of(Some(child.id()));
    Ok(Running { child: Some(child), group: Some(group), started, wall, reading })
}

enum Msg {
    Event(Event<'static>),
    Dropped,
    Result(Box<Result<RunResult, ResultError>>),
    Document(Vec<u8>),
    OutEnd,
    Line(String),
    ErrEnd(Vec<u8>),
}

impl Running {
    /// The jail's process id (its group's id too).
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the run from anywhere: SIGTERM, then SIGKILL after the grace.
    pub fn stopper(&self) -> Option<Stopper> {
        self.group.as_ref().and_then(Group::stopper)
    }

    /// Read the run to its result; `on` hears its events as they come.
    pub fn wait(mut self, on: impl FnMut(Progress<'_>)) -> Result<RunResult, RunError> {
        let ended = self.read(on)?;
        match ended.result {
            Some(r) => r.map_err(RunError::Result),
            None => Err(RunError::NoResult { status: ended.status, stderr: ended.stderr }),
        }
    }

    /// Read a `jail` that prints one document to its end (`spawn_document`).
    pub fn output(mut self) -> Result<Output, RunError> {
        let ended = self.read(|_| {})?;
        Ok(Output { status: ended.status, stdout: ended.document, stderr: ended.stderr })
    }

    fn read(&mut self, mut on: impl FnMut(Progress<'_>)) -> Result<Ended, RunError> {
        let Some(child) = self.child.as_mut() else { return Err(RunError::Hung { grace: HUNG_GRACE }) };
        let (tx, rx) = mpsc::sync_channel(IN_FLIGHT);
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (reading, tx_err) = (self.reading, tx.clone());
        std::thread::spawn(move || {
            if let Some(out) = stdout {
                read_stdout(out, reading, &tx);
            }
            let _ = tx.send(Msg::OutEnd);
        });
        std::thread::spawn(move || {
            let tail = stderr.map(|s| read_stderr(s, &tx_err)).unwrap_or_default();
            let _ = tx_err.send(Msg::ErrEnd(tail));
        });
        let deadline = self.started + self.wall + HUNG_GRACE;
        let (mut result, mut document, mut out_done, mut err) = (None, Vec::new(), false, None);
        while !out_done || err.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Dropping `self` stops the group and reaps the jail.
                return Err(RunError::Hung { grace: HUNG_GRACE });
            }
            match rx.recv_timeout(left.min(QUIET)) {
                Ok(Msg::Event(e)) => on(Progress::Event(e)),
                Ok(Msg::Dropped) => on(Progress::Dropped),
                Ok(Msg::Result(r)) => result = Some(*r),
                Ok(Msg::Document(d)) => document = d,
                Ok(Msg::OutEnd) => out_done = true,
                Ok(Msg::Line(l)) => on(Progress::JailLine(&l)),
                Ok(Msg::ErrEnd(tail)) => err = Some(tail),
                Err(mpsc::RecvTimeoutError::Timeout) => on(Progress::Quiet(self.started.elapsed())),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = self.reap(deadline)?;
        let stderr = String::from_utf8_lossy(&err.unwrap_or_default()).trim().to_string();
        Ok(Ended { status, result, document, stderr })
    }

    /// The jail closed its output: wait for its exit (by `deadline`). Its
    /// pidfd wakes the wait the moment it exits (a pool makes each jail
    /// through here: a sleep's latency would be every refill's); where no
    /// pidfd can be had, short sleeps.
    fn reap(&mut self, deadline: Instant) -> Result<ExitStatus, RunError> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let Some(child) = self.child.as_mut() else { return Err(RunError::Hung { grace: HUNG_GRACE }) };
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let pidfd = crate::sys::pidfd_open(pid).ok();
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(status) = child.try_wait().map_err(RunError::Wait)? {
                self.child = None;
                if let Some(g) = self.group.take() {
                    g.done();
                }
                return Ok(status);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RunError::Hung { grace: HUNG_GRACE });
            }
            match &pidfd {
                Some(fd) => {
                    let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX).clamp(1, 50);
                    let _ = poll(&mut [PollFd::new(fd.as_fd(), PollFlags::POLLIN)], PollTimeout::from(ms));
                }
                None => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // Stopped while its leader is unreaped, so the group is still its.
        drop(self.group.take());
        let _ = std::thread::Builder::new().name("jail-reap".into()).spawn(move || child.wait());
    }
}

/// stdout: events one bounded line at a time, or one bounded document.
fn read_stdout(out: impl Read, reading: Reading, tx: &mpsc::SyncSender<Msg>) {
    match reading {
        Reading::Run(Mode::Events) => events::read_to_end(out, Lines::new(MAX_DOCUMENT as usize), |line| {
            let _ = tx.send(match events::seen(line) {
                Seen::Event(e) => Msg::Event(e),
                Seen::Result(r) => Msg::Result(r),
                Seen::Dropped => Msg::Dropped,
            });
        }),
        Reading::Document => {
            let mut doc = Vec::new();
            let _ = out.take(MAX_DOCUMENT).read_to_end(&mut doc);
            let _ = tx.send(Msg::Document(doc));
        }
        Reading::Run(Mode::Json) => {
            let mut doc = Vec::new();
            let _ = out.take(MAX_DOCUMENT).read_to_end(&mut doc);
            // A document that is not JSON is no result (the caller says
            // what the jail's stderr said).
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&doc) {
                let _ = tx.send(Msg::Result(Box::new(events::result_of(value))));
            }
        }
    }
}

/// The jail's own stderr, line by line to the caller; its last
/// `MAX_STDERR` bytes are kept.
fn read_stderr(err: impl Read, tx: &mpsc::SyncSender<Msg>) -> Vec<u8> {
    let mut r = std::io::BufReader::new(err);
    let (mut tail, mut line) = (Vec::new(), Vec::new());
    loop {
        line.clear();
        match r.by_ref().take(STDERR_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        tail.extend_from_slice(&line);
        if tail.len() as u64 > 2 * MAX_STDERR {
            tail.drain(..tail.len() - MAX_STDERR as usize);
        }
        let _ = tx.send(Msg::Line(String::from_utf8_lossy(&line).trim_end().to_string()));
    }
    if tail.len() as u64 > MAX_STDERR {
        tail.drain(..tail.len() - MAX_STDERR as usize);
    }
    tail
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::client::command::Script;

    /// A stand-in for `jail`: a shell script that ignores its arguments.
    pub(crate) fn fake(dir: &std::path::Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("jail");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn events_reach_the_caller_and_a_result_of_another_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let body =
            r#"printf '%s\n' '{"type":"stdout","data":"hi"}' 'not json' '{"type":"result","result":{"schema_version":999}}'"#;
        let spec = RunSpec::new(fake(dir.path(), body), Mode::Events, Script::File("x.py".into()), Duration::from_secs(30));
        let mut seen = Vec::new();
        let got = spawn(&spec).unwrap().wait(|p| match p {
            Progress::Event(e) => seen.push(format!("{e:?}")),
            Progress::Dropped => seen.push("dropped".into()),
            _ => {}
        });
        assert!(matches!(got, Err(RunError::Result(ResultError::Version(_)))), "{got:?}");
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[0].contains("hi") && seen[1] == "dropped", "{seen:?}");
    }

    #[test]
    fn no_result_says_the_exit_and_the_tail_of_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let spec = RunSpec::new(
            fake(dir.path(), "echo broken >&2; exit 3"),
            Mode::Json,
            Script::Inline("pass".into()),
            Duration::from_secs(30),
        );
        let got = spawn(&spec).unwrap().wait(|_| {});
        let Err(RunError::NoResult { status, stderr }) = got else { panic!("{got:?}") };
        assert_eq!((status.code(), stderr.as_str()), (Some(3), "broken"));
    }
}
