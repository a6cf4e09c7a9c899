//! One step through the `jail` binary, as a subprocess: in a fresh jail
//! (`jail run --events --input --output --code SCRIPT`, the script's output
//! shown as its events arrive), or as a cell of a session (`jail session
//! exec --events` on a session claimed from the run's warm pool, pool.rs,
//! or started here with `jail session start`; cells.rs keeps it; its
//! output shown live the same way); either way the result is deserialized
//! into the `jail` crate's own `RunResult`. A fresh jail's step, the
//! resume judge and the preflight go through `jail::client::run`; every
//! `jail` runs in a process group of its own (`RunSpec`, or
//! `jail_command` for a session's): a signal reaches the agent alone,
//! which stops its steps in its own order (stop.rs).
//! Never in-process: the jail must fork from a single-threaded process, and
//! it is the jail's subprocess boundary that keeps a step's failure from
//! becoming ours. The jail gets the agent's environment minus `LLM_*` and
//! anything named like a credential.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use jail::client::bounds::MAX_DOCUMENT;
use jail::client::command::{Mode, RunSpec, Script};
use jail::client::events::{self, Lines, ResultError, Seen};
use jail::client::run::{self, Progress, RunError};
use jail::events::Event;
use jail::result::RunResult;

use crate::cells::{self, JailFrom, Live};
use crate::progress::StepWatch;
use crate::session::Session;

/// Most bytes of the jail's own stderr kept for an error message.
const MAX_STDERR: usize = 64 << 10;

/// Longest line of live output shown; the rest of it is cut.
const MAX_LINE: usize = 4096;

enum Output {
    /// The `result` event, read as ours, if the stream had one.
    Result(Option<Box<Result<RunResult, ResultError>>>),
    Stderr(Vec<u8>),
    /// A line of the script's own output (`stdout` or `stderr`).
    Script(&'static str, String),
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
pub struct Step {
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
    ) -> Result<Step, RunnerError> {
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
        let _running = running.id().map(cells::run_running);
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
        Ok(Step { result: result.map_err(|e| self.error_of(e))?, duration: started.elapsed() })
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
    /// `--policy` and `--rootfs`, as given.
    pub(crate) fn jail_options(&self, cmd: &mut Command) {
        if let Some(p) = &self.policy {
            cmd.arg("--policy").arg(p);
        }
        if let Some(r) = &self.rootfs {
            cmd.arg("--rootfs").arg(r);
        }
    }

    /// `jail session start` for one sub-task, when the run's warm pool
    /// cannot give one (pool.rs): each cell's wall-clock limit is the
    /// step's, cut to `at_most` (what is left of the run).
    pub fn start_session(&self, session: &Session, at_most: Duration) -> Result<Live, RunnerError> {
        let cell_limit = self.wall_limit.min(at_most);
        let mut cmd = jail_command(&self.jail);
        cmd.args(["session", "start", "--json"]);
        self.jail_options(&mut cmd);
        if self.timeout.is_some() || cell_limit < self.wall_limit {
            cmd.arg("--timeout").arg(format!("{:.3}", cell_limit.as_secs_f64()));
        }
        // No --code: each cell's source is sent over the handle, and
        // `jail session start` refuses a code dir (its driver is not in it).
        cmd.arg("--input").arg(&session.input);
        cmd.arg("--output").arg(&session.output);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if !cells::begin_start() {
            return Err(RunnerError::Interrupted);
        }
        let started = Instant::now();
        let out = cmd.output();
        let start_ms = started.elapsed().as_secs_f64() * 1000.0;
        let up = out.as_ref().ok().filter(|o| o.status.success()).and_then(|o| {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            Some((PathBuf::from(v["handle"].as_str()?), v["id"].as_str().unwrap_or_default().to_string()))
        });
        cells::end_start(&self.jail, up.as_ref().map(|(h, _)| h.as_path()));
        let out = out.map_err(|error| RunnerError::Spawn { path: self.jail.clone(), error })?;
        match up {
            Some((handle, id)) => {
                let mut live = Live::new(self.jail.clone(), handle, id, cell_limit, JailFrom::SessionStart);
                live.claim_ms = Some(start_ms);
                Ok(live)
            }
            None => Err(RunnerError::NoSession {
                status: out.status.to_string(),
                stderr: crate::llm::excerpt(String::from_utf8_lossy(&out.stderr).trim(), 400),
            }),
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

    /// Run `code` as the session's next cell (`jail session exec --events
    /// HANDLE -`): the cell's stdout and stderr reach the watch line by
    /// line as it runs, then its result. While it runs, a signal to the
    /// agent interrupts it (stop.rs).
    pub fn exec_cell(&self, live: &mut Live, code: &str, watch: &mut dyn StepWatch) -> Result<Step, RunnerError> {
        let started = Instant::now();
        let mut cmd = jail_command(&self.jail);
        cmd.args(["session", "exec", "--events"]).arg(&live.handle).arg("-");
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let _running = cells::cell_running(&self.jail, &live.handle);
        let mut child = cmd.spawn().map_err(|error| RunnerError::Spawn { path: self.jail.clone(), error })?;
        live.cells += 1;
        let stdin = child.stdin.take();
        let code = code.to_string();
        std::thread::spawn(move || {
            if let Some(mut w) = stdin {
                let _ = std::io::Write::write_all(&mut w, code.as_bytes());
            }
        });
        let (tx, rx) = mpsc::channel();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let tx_err = tx.clone();
        // The event stream, bounded as a run's: each chunk shown line by
        // line, the result event kept.
        std::thread::spawn(move || {
            let result = stdout.and_then(|s| read_events(s, &tx));
            let _ = tx.send(Output::Result(result));
        });
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(s) = stderr {
                let _ = s.take(MAX_STDERR as u64).read_to_end(&mut buf);
            }
            let _ = tx_err.send(Output::Stderr(buf));
        });
        // The session kills a cell past its limit and its grace; this only
        // guards against the client itself hanging.
        let grace = Duration::from_secs(30);
        let deadline = started + live.cell_limit + grace;
        let (mut out, mut err) = (None, None);
        while out.is_none() || err.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunnerError::Hung { secs: grace.as_secs() });
            }
            match rx.recv_timeout(left.min(Duration::from_secs(1))) {
                Ok(Output::Result(v)) => out = Some(v),
                Ok(Output::Stderr(b)) => err = Some(b),
                Ok(Output::Script(stream, l)) => watch.output(stream, &l),
                Err(mpsc::RecvTimeoutError::Timeout) => watch.tick(started.elapsed()),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait().map_err(|error| RunnerError::Spawn { path: self.jail.clone(), error })?;
        let (out, err) = (out.flatten(), err.unwrap_or_default());
        let read = out.ok_or_else(|| RunnerError::NoResult {
            status: status.to_string(),
            stderr: crate::llm::excerpt(String::from_utf8_lossy(&err).trim(), 400),
        })?;
        let mut result = (*read).map_err(|e| RunnerError::Contract { cause: e.to_string() })?;
        // A cell's result reports the session's whole lifetime as its
        // `wall_time_secs`; the limit this cell ran under is the `--timeout`
        // the session was started with.
        if let Some(l) = result.limits.get_mut("wall_time_secs") {
            l.value = serde_json::json!(live.cell_limit.as_secs_f64());
        }
        Ok(Step { result, duration: started.elapsed() })
    }
}

/// A result document read as ours. One of another schema version is
/// refused before it is read (jail/src/schema.rs): its fields may not mean
/// what ours do.
pub(crate) fn result_of(value: serde_json::Value) -> Result<RunResult, RunnerError> {
    events::result_of(value).map_err(|e| RunnerError::Contract { cause: e.to_string() })
}

/// `jail` as our child: in a process group of its own, so a terminal's
/// Ctrl-C reaches the agent alone, which stops its steps in its own order
/// (stop.rs: a cell interrupted before it is killed), and with the model's
/// credentials kept from it (`keep_secrets`).
pub(crate) fn jail_command(jail: &Path) -> Command {
    let mut cmd = Command::new(jail);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    keep_secrets(&mut cmd);
    cmd
}

/// The model's credentials never reach a step, even under a policy that
/// passes variables through from the caller's environment.
pub(crate) fn keep_secrets(cmd: &mut Command) {
    for name in secret_names() {
        cmd.env_remove(name);
    }
}

/// The variables of ours a jail never gets (`is_secret`).
fn secret_names() -> Vec<OsString> {
    std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| is_secret(&name.to_string_lossy()))
        .collect()
}

/// Read a cell's `--events` NDJSON through the client's one bounded
/// reader: send the script's output on as lines, return the result.
fn read_events(stream: impl Read, tx: &mpsc::Sender<Output>) -> Option<Box<Result<RunResult, ResultError>>> {
    let mut shown = Shown::default();
    let mut result = None;
    events::read_to_end(stream, Lines::new(MAX_DOCUMENT as usize), |line| match events::seen(line) {
        Seen::Event(e) => shown.event(&e, |name, text| {
            let _ = tx.send(Output::Script(name, text));
        }),
        Seen::Result(r) => result = Some(r),
        Seen::Dropped => {}
    });
    shown.flush(|name, text| {
        let _ = tx.send(Output::Script(name, text));
    });
    result
}

/// The script's output as whole lines, per stream, each cut at `MAX_LINE`.
#[derive(Default)]
struct Shown {
    partial: [String; 2],
}

impl Shown {
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
    fn events_become_lines_per_stream_and_the_result_is_kept() {
        let stream = concat!(
            "{\"type\":\"stdout\",\"data\":\"one\"}\n",
            "{\"type\":\"stderr\",\"data\":\"warn\\n\"}\n",
            "{\"type\":\"stdout\",\"data\":\" two\\nthree\"}\n",
            "{\"type\":\"artifact\",\"artifact\":{}}\n",
            "{\"type\":\"result\",\"result\":{\"status\":\"ok\"}}\n",
        );
        let (tx, rx) = mpsc::channel();
        let result = read_events(stream.as_bytes(), &tx);
        drop(tx);
        let lines: Vec<(&str, String)> = rx
            .iter()
            .map(|o| match o {
                Output::Script(s, l) => (s, l),
                _ => ("other", String::new()),
            })
            .collect();
        assert_eq!(
            lines,
            vec![
                ("stderr", "warn".to_string()),
                ("stdout", "one two".to_string()),
                ("stdout", "three".to_string())
            ]
        );
        // The result is read as ours: a document without our schema
        // version is refused, not taken.
        assert!(matches!(result.as_deref(), Some(Err(ResultError::Version(_)))), "{result:?}");
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
