//! One step through the `jail` binary: in a fresh jail, as a subprocess
//! (`jail run --events --input --output --code SCRIPT`, the script's output
//! shown as its events arrive), or as a cell of a session (a live exec on
//! the socket of a session claimed from the run's warm pool, pool.rs, or
//! started here with `jail session start`; cells.rs keeps it; its output
//! shown live the same way); either way the result is read as the `jail`
//! crate's own `RunResult`. All of it goes through `jail::client`: a fresh
//! jail's step, the resume judge and the preflight through its `run`, a
//! session's start and cells through its `session`; every `jail` runs in
//! a process group of its own (`RunSpec`, `StartSpec`, or `PoolSpec` for
//! the pool's, pool.rs): a signal reaches the agent alone, which stops its
//! steps in its own order (stop.rs).
//! Never in-process: the jail must fork from a single-threaded process, and
//! it is the jail's subprocess boundary that keeps a step's failure from
//! becoming ours. The jail gets the agent's environment minus `LLM_*` and
//! anything named like a credential.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use jail::client::command::{Mode, RunSpec, Script, StartSpec};
use jail::client::events::{self, Line, Seen};
use jail::client::run::{self, Progress, RunError};
use jail::client::session::{self as socket, SessionError, StartError};
use jail::events::Event;
use jail::result::RunResult;

use crate::live::{self, JailFrom, Live};
use crate::progress::StepWatch;
use crate::session::Session;

/// Longest line of live output shown; the rest of it is cut.
const MAX_LINE: usize = 4096;

/// What a cell's thread tells the step.
enum Output {
    /// A line of the script's own output (`stdout` or `stderr`).
    Script(&'static str, String),
    /// The cell's end.
    Done(Box<Result<RunResult, SessionError>>),
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("cannot start the jail binary {path}: {error} (build it with `cargo build`, or pass --jail PATH / set JAIL_BIN)")]
    Spawn { path: PathBuf, error: std::io::Error },
    #[error("the jail printed no result (exit status {status}): {stderr}")]
    NoResult { status: String, stderr: String },
    #[error("the jail's result does not match this agent's result type ({cause}); rebuild both from one checkout")]
    Contract { cause: String },
    #[error("the jail did not finish within {secs} s of its own deadline and was killed")]
    Hung { secs: u64 },
    #[error("the sandbox session could not start (exit status {status}): {stderr}")]
    NoSession { status: String, stderr: String },
    #[error("the agent is stopping on a signal: no new session starts")]
    Interrupted,
    /// The session's socket gave no result (it ended, hung, refused).
    #[error("{0}")]
    Session(SessionError),
}

impl From<SessionError> for RunnerError {
    fn from(e: SessionError) -> RunnerError {
        match e {
            SessionError::Result { error, .. } => RunnerError::Contract { cause: error.to_string() },
            e => RunnerError::Session(e),
        }
    }
}

/// How steps are run.
#[derive(Debug, Clone)]
pub struct Runner {
    pub jail: PathBuf,
    pub policy: Option<PathBuf>,
    pub rootfs: Option<PathBuf>,
    /// Wall-clock limit of one step, passed as `--timeout` (else the policy's).
    pub timeout: Option<f64>,
    /// The wall-clock limit the jail will apply, to bound our own wait.
    pub wall_limit: Duration,
    /// One fresh jail per step (`--stateless`) instead of one session per
    /// sub-task (cells.rs).
    pub stateless: bool,
    /// Jails the run's warm pool keeps made ahead (`--pool-size`); 0: no
    /// pool, each session is started by the agent (pool.rs).
    pub pool_size: usize,
}

/// One finished step.
#[derive(Debug, Clone)]
pub struct StepRun {
    pub result: RunResult,
    /// Wall time of the whole `jail` process, as the agent saw it.
    pub duration: Duration,
}

impl Runner {
    /// Run `script` (a path relative to the session's code dir), for at most
    /// `at_most` of wall-clock time when given (the run's deadline).
    pub fn run(
        &self,
        session: &Session,
        script: &Path,
        args: &[String],
        at_most: Option<Duration>,
        watch: &mut dyn StepWatch,
    ) -> Result<StepRun, RunnerError> {
        let started = Instant::now();
        let wall_limit = at_most.map_or(self.wall_limit, |m| m.min(self.wall_limit));
        let timeout = match (self.timeout, at_most) {
            (Some(t), Some(m)) => Some(t.min(m.as_secs_f64())),
            (None, Some(m)) if m < self.wall_limit => Some(m.as_secs_f64()),
            (t, _) => t,
        };
        let mut spec = self.spec(Mode::Events, Script::File(session.code.join(script)), wall_limit);
        spec.flags.limits.timeout = timeout.and_then(|t| Duration::try_from_secs_f64(t).ok());
        spec.input = Some(session.input.clone());
        spec.output = Some(session.output.clone());
        spec.code = Some(session.code.clone());
        spec.args = args.to_vec();
        let running = run::spawn(&spec).map_err(|e| self.error_of(e))?;
        // A signal to the agent cancels it (stop.rs).
        let _running = running.id().map(live::run_running);
        // The script's output shown line by line as its events come, the
        // jail's own stderr too; the jail kills its own tree at its
        // deadline, the client gives up on a jail that hangs past it.
        let mut shown = Shown::default();
        let result = running.wait(|p| match p {
            Progress::Event(e) => shown.event(&e, |stream, line| watch.output(stream, &line)),
            Progress::JailLine(l) => watch.line(l),
            Progress::Quiet(t) => watch.tick(t),
            Progress::Dropped => {}
        });
        shown.flush(|stream, line| watch.output(stream, &line));
        Ok(StepRun { result: result.map_err(|e| self.error_of(e))?, duration: started.elapsed() })
    }

    /// A `jail run` of `script`, with our `--policy` and `--rootfs`, in a
    /// process group of its own and without the model's credentials.
    pub(crate) fn spec(&self, mode: Mode, script: Script, wall: Duration) -> RunSpec {
        let mut spec = RunSpec::new(&self.jail, mode, script, wall);
        spec.flags.policy = self.policy.clone();
        spec.flags.rootfs = self.rootfs.clone();
        spec.withhold = secret_names();
        spec
    }

    /// The client's error in the agent's words.
    pub(crate) fn error_of(&self, e: RunError) -> RunnerError {
        match e {
            RunError::Spawn { error, .. } | RunError::Wait(error) => RunnerError::Spawn { path: self.jail.clone(), error },
            RunError::Hung { grace } => RunnerError::Hung { secs: grace.as_secs() },
            RunError::NoResult { status, stderr } => {
                RunnerError::NoResult { status: status.to_string(), stderr: crate::llm::excerpt(&stderr, 400) }
            }
            RunError::Result(e) => RunnerError::Contract { cause: e.to_string() },
        }
    }
}

impl Runner {
    /// `jail session start` for one sub-task, when the run's warm pool
    /// cannot give one (pool.rs): each cell's wall-clock limit is the
    /// step's, cut to `at_most` (what is left of the run).
    pub fn start_session(&self, session: &Session, at_most: Duration) -> Result<Live, RunnerError> {
        let cell_limit = self.wall_limit.min(at_most);
        // No --code: each cell's source is sent over the handle, and
        // `jail session start` refuses a code dir (its driver is not in it).
        let mut spec = StartSpec {
            input: Some(session.input.clone()),
            output: Some(session.output.clone()),
            withhold: secret_names(),
            ..StartSpec::new(&self.jail)
        };
        spec.flags.policy = self.policy.clone();
        spec.flags.rootfs = self.rootfs.clone();
        if self.timeout.is_some() || cell_limit < self.wall_limit {
            spec.flags.limits.timeout = Some(cell_limit);
        }
        if !live::begin_start() {
            return Err(RunnerError::Interrupted);
        }
        let started = Instant::now();
        let up = socket::start(&spec);
        let start_ms = started.elapsed().as_secs_f64() * 1000.0;
        live::end_start(up.as_ref().ok().map(|s| s.handle.as_path()));
        match up {
            Ok(s) => {
                let mut live = Live::new(s.handle, s.id, cell_limit, JailFrom::SessionStart);
                live.claim_ms = Some(start_ms);
                Ok(live)
            }
            Err(StartError::Failed { status, stderr, .. }) => {
                Err(RunnerError::NoSession { status: status.to_string(), stderr: crate::llm::excerpt(&stderr, 400) })
            }
            Err(StartError::Run(e)) => Err(self.error_of(e)),
            Err(e @ StartError::NoHandle(_)) => Err(RunnerError::Contract { cause: e.to_string() }),
        }
    }

    /// Have a fresh jail judge the run's output folder as it is now (`jail
    /// run --json -c pass`): its result lists every file there that passes
    /// the artifact check, unchanged ones too. For `resume`, when the killed
    /// run's session ended without the agent (a pooled session ends with
    /// its pool, which dies with the agent): its files were delivered, and
    /// its closing result, the verdict on them, went with it.
    pub fn judge_output(&self, session: &Session) -> Result<RunResult, RunnerError> {
        let mut spec = self.spec(Mode::Json, Script::Inline("pass".into()), self.wall_limit);
        spec.input = Some(session.input.clone());
        spec.output = Some(session.output.clone());
        run::spawn(&spec).and_then(|r| r.wait(|_| {})).map_err(|e| self.error_of(e))
    }

    /// Run `code` as the session's next cell, live on its socket
    /// (jail::client, on a thread of its own): the cell's stdout and stderr
    /// reach the watch line by line as it runs, then its result. While it
    /// runs, a signal to the agent interrupts it (stop.rs). The session
    /// kills a cell past its limit and its grace; the client gives up on a
    /// session that hangs past that.
    pub fn exec_cell(&self, live: &mut Live, code: &str, watch: &mut dyn StepWatch) -> Result<StepRun, RunnerError> {
        let started = Instant::now();
        let _running = live::cell_running(&live.handle);
        live.cells += 1;
        let (tx, rx) = mpsc::channel();
        let (handle, code, wall) = (live.handle.clone(), code.to_string(), live.cell_limit);
        std::thread::spawn(move || {
            let mut shown = Shown::default();
            let out = tx.clone();
            let mut send = move |name, text| {
                let _ = out.send(Output::Script(name, text));
            };
            let result = socket::exec_live(&handle, socket::Cell::new(code, Some(wall)), &mut |line| shown.line(line, &mut send));
            shown.flush(&mut send);
            let _ = tx.send(Output::Done(Box::new(result)));
        });
        let result = loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(Output::Script(stream, l)) => watch.output(stream, &l),
                Ok(Output::Done(r)) => break *r,
                Err(mpsc::RecvTimeoutError::Timeout) => watch.tick(started.elapsed()),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(RunnerError::Contract { cause: "the cell's thread ended without its result".into() })
                }
            }
        };
        let mut result = result?;
        // A cell's result reports the session's whole lifetime as its
        // `wall_time_secs`; the limit this cell ran under is the `--timeout`
        // the session was started with.
        if let Some(l) = result.limits.get_mut("wall_time_secs") {
            l.value = serde_json::json!(live.cell_limit.as_secs_f64());
        }
        Ok(StepRun { result, duration: started.elapsed() })
    }
}

/// The variables of ours a jail never gets (`is_secret`): the model's
/// credentials never reach a step, even under a policy that passes
/// variables through from the caller's environment.
pub(crate) fn secret_names() -> Vec<OsString> {
    std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| is_secret(&name.to_string_lossy()))
        .collect()
}

/// The script's output as whole lines, per stream, each cut at `MAX_LINE`.
#[derive(Default)]
struct Shown {
    partial: [String; 2],
}

impl Shown {
    /// One event line as the session wrote it: a chunk's lines to `line`.
    fn line(&mut self, event: &str, line: impl FnMut(&'static str, String)) {
        if let Seen::Event(e) = events::seen(Line::Whole(event.as_bytes())) {
            self.event(&e, line);
        }
    }

    /// A chunk event: `line` gets each line it ends.
    fn event(&mut self, event: &Event<'_>, mut line: impl FnMut(&'static str, String)) {
        let (i, name, data) = match event {
            Event::Stdout { data, .. } => (0, "stdout", data),
            Event::Stderr { data, .. } => (1, "stderr", data),
            _ => return,
        };
        let buf = &mut self.partial[i];
        for piece in data.split_inclusive('\n') {
            if buf.len() < MAX_LINE {
                let room = MAX_LINE - buf.len();
                let cut = piece.char_indices().map(|(at, _)| at).take_while(|&at| at <= room).last().unwrap_or(0);
                buf.push_str(if piece.len() <= room { piece } else { &piece[..cut] });
            }
            if piece.ends_with('\n') {
                let text = std::mem::take(buf);
                line(name, text.trim_end_matches('\n').to_string());
            }
        }
    }

    /// The stream ended: the lines not ended yet.
    fn flush(&mut self, mut line: impl FnMut(&'static str, String)) {
        for (buf, name) in self.partial.iter_mut().zip(["stdout", "stderr"]) {
            if !buf.is_empty() {
                line(name, std::mem::take(buf));
            }
        }
    }
}

/// Whether an environment variable is kept from the jail: the agent's own
/// `LLM_*` settings and anything named like a credential.
pub fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("LLM_") || ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"].iter().any(|w| upper.contains(w))
}

/// The jail binary: `explicit`, else `JAIL_BIN`, else `jail` beside our own
/// executable, else `jail` on PATH.
pub fn find_jail(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("JAIL_BIN").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let beside = dir.join("jail");
            if beside.is_file() {
                return beside;
            }
        }
    }
    PathBuf::from("jail")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cells_events_become_lines_per_stream() {
        let stream = [
            "{\"type\":\"stdout\",\"data\":\"one\"}",
            "{\"type\":\"stderr\",\"data\":\"warn\\n\"}",
            "{\"type\":\"stdout\",\"data\":\" two\\nthree\"}",
            "{\"type\":\"artifact\",\"artifact\":{}}",
            "not json",
        ];
        let mut lines = Vec::new();
        let mut shown = Shown::default();
        for event in stream {
            shown.line(event, |s, l| lines.push((s, l)));
        }
        shown.flush(|s, l| lines.push((s, l)));
        assert_eq!(
            lines,
            vec![
                ("stderr", "warn".to_string()),
                ("stdout", "one two".to_string()),
                ("stdout", "three".to_string())
            ]
        );
    }

    #[test]
    fn credentials_and_model_settings_are_kept_from_the_jail() {
        for name in [
            "LLM_API_KEY",
            "LLM_BASE_URL",
            "OPENAI_API_KEY",
            "GITHUB_TOKEN",
            "aws_secret_access_key",
            "DB_PASSWORD",
        ] {
            assert!(is_secret(name), "{name}");
        }
        for name in ["PATH", "JAIL_ROOTFS", "LANG", "HOME"] {
            assert!(!is_secret(name), "{name}");
        }
    }
}
