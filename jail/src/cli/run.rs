//! `jail run`: one script in a fresh jail; its flags become the `RunRequest`
//! that `jail session start` and `jail pool` build too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{env_var, load_policy, rootfs_search, temp_dir, EnvArgs, LimitArgs, RootfsArgs};
use crate::hostenv::HostEnv;
use crate::inline::InlineScript;
use crate::result::{RunResult, SetupError, Status};
use crate::supervisor::{OutputMode, RunRequest};

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Policy file (default: the built-in policies/default.json).
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,
    /// Folder bound read-only at /workspace/input.
    #[arg(long, value_name = "DIR")]
    pub(crate) input: Option<PathBuf>,
    /// Folder bound writable at /workspace/output (default: a fresh one).
    #[arg(long, value_name = "DIR")]
    pub(crate) output: Option<PathBuf>,
    /// Folder granted read-only at /workspace/code (default: the script alone, copied in).
    #[arg(long, value_name = "DIR")]
    pub(crate) code: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) rootfs: RootfsArgs,
    /// Run this code instead of a script file (as `python3 -c`).
    #[arg(short = 'c', value_name = "CODE")]
    pub(crate) command: Option<String>,
    #[command(flatten)]
    pub(crate) limits: LimitArgs,
    #[command(flatten)]
    pub(crate) env: EnvArgs,
    /// Capture the output and print one JSON result document on stdout.
    #[arg(long, conflicts_with = "events")]
    pub(crate) json: bool,
    /// Print NDJSON events on stdout as the step runs: stdout/stderr chunks,
    /// each artifact, then the result document (see README "Live events").
    #[arg(long)]
    pub(crate) events: bool,
    /// The Python script to run; `-` reads it from stdin.
    pub(crate) script: Option<PathBuf>,
    /// Arguments passed to the script.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) args: Vec<String>,
}

impl RunArgs {
    /// The flags of a jail whose script the cell driver replaces
    /// (session.rs): a session's, and each of a pool's jails.
    pub(crate) fn for_cells(policy: Option<PathBuf>, rootfs: RootfsArgs, limits: LimitArgs) -> RunArgs {
        RunArgs {
            policy,
            input: None,
            output: None,
            code: None,
            rootfs,
            command: None,
            limits,
            env: EnvArgs::default(),
            json: true,
            events: false,
            script: Some(PathBuf::new()),
            args: Vec::new(),
        }
    }
}

pub(crate) fn run(args: RunArgs) -> ExitCode {
    let json = args.json;
    // First, before any thread: SIGTERM, SIGINT and SIGHUP cancel the run
    // (its tree killed, its cgroup and folders removed) instead of killing us.
    if let Err(e) = crate::cancel::arm() {
        eprintln!("jail: SIGTERM, SIGINT and SIGHUP will kill jail without cleaning up: block them and open a signalfd: {e}");
    }
    // Opened before the run: the captures write the chunk events to it.
    let events = args.events.then(crate::events::open);
    // `cleanup` holds what no caller waits for (the run cgroup, the uid
    // lease, the temp dir of a script from -c or stdin): dropped once the
    // result is out.
    let (mut result, cleanup) = match prepare_request(args) {
        Ok((req, script)) => {
            let (result, leftovers) = crate::supervisor::run_leaving_cleanup(&req);
            (result, Some((leftovers, script)))
        }
        Err(e) => (RunResult::setup_failed(e), None),
    };
    if result.supervisor.max_rss_bytes == 0 {
        // A run that stopped early: what the binary itself needs (make
        // bench uses it as the baseline for the supervisor's peak).
        result.supervisor.max_rss_bytes = crate::sys::self_max_rss_bytes();
    }
    if let Some(e) = &result.setup_error {
        // One line a person can act on; the JSON carries the rest.
        let causes = if e.causes.is_empty() {
            String::new()
        } else {
            format!(": {}", e.causes.join(": "))
        };
        eprintln!("jail: {} ({}){causes}", e.message, e.stage);
    } else if !json && events.is_none() {
        // Never a blocking write here: a caller that stopped reading our
        // stderr must not keep `jail` from exiting (relay.rs).
        let mut lines = String::new();
        match result.status {
            Status::TimeoutWall => lines.push_str("jail: the script ran past its wall-clock limit and was killed\n"),
            Status::TimeoutCpu => lines.push_str("jail: the script used up its CPU-time limit and was killed\n"),
            Status::OomKilled => lines.push_str("jail: the kernel killed the script at its memory limit\n"),
            Status::Cancelled => lines.push_str("jail: cancelled by a signal; the script was killed\n"),
            Status::OutputLimit => lines.push_str(
                "jail: the script's output passed limits.stdout_bytes or limits.stderr_bytes; the rest was dropped (status output_limit)\n",
            ),
            _ => {}
        }
        // Where the files that passed are: a fresh folder has a name
        // no one typed (issue 38), and one with nothing in it is gone.
        if let (Some(dir), false) = (&result.output_dir, result.artifacts.is_empty()) {
            let n = result.artifacts.len();
            lines.push_str(&format!("jail: {n} file{} in {dir}\n", if n == 1 { "" } else { "s" }));
        }
        // What the jail refused, so a person reading the output learns it.
        for d in &result.denials {
            let family = d.family.as_deref().map(|f| format!("({f})")).unwrap_or_default();
            let errno = d.errno.as_deref().unwrap_or("refused");
            let why = d.detail.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
            lines.push_str(&format!("jail: refused {}{family} x{} with {errno}{why}\n", d.what, d.count));
        }
        crate::relay::tell_stderr(&lines);
    }
    if let Some(events) = events {
        events.finish(&result);
    } else if json {
        // One write: stdout is line-buffered, and a result is ~200 lines.
        let mut text = serde_json::to_vec_pretty(&result).unwrap_or_default();
        text.push(b'\n');
        let _ = std::io::stdout().lock().write_all(&text);
    }
    drop(cleanup);
    ExitCode::from(result.jail_exit_code().clamp(0, 255) as u8)
}

pub(crate) fn prepare_request(args: RunArgs) -> Result<(RunRequest, Option<InlineScript>), SetupError> {
    let input_err = |message: String| SetupError { stage: "input".into(), message, causes: vec![] };
    if args.env.on_stdin() && args.script.as_deref() == Some(Path::new("-")) {
        return Err(input_err("the script (-) and --env-fd 0 both read stdin: pass one of them another way".into()));
    }
    let (script, inline) =
        script_source(args.command.as_deref(), args.script.as_deref(), args.code.is_some()).map_err(input_err)?;
    let mut policy = load_policy(args.policy.as_ref()).map_err(|e| SetupError {
        stage: "policy".into(),
        message: format!("{e} (check it with `jail check FILE`)"),
        causes: vec![],
    })?;
    let timeout = args.limits.timeout()?;
    let env = args.env.envs()?;
    let overrides = args.limits.overrides();
    policy
        .apply_overrides(&overrides)
        .map_err(|m| SetupError { stage: "input".into(), message: m, causes: vec![] })?;
    let (_, rootfs) = rootfs_search(&args.rootfs, Some(&policy)).find().map_err(|e| input_err(e.to_string()))?;
    let host = HostEnv::read(&policy, &env_var);
    let req = RunRequest {
        template: None,
        policy,
        script,
        args: args.args,
        input: args.input,
        output: args.output,
        code: args.code,
        rootfs: Some(rootfs),
        timeout,
        mode: match (args.json, args.events) {
            (_, true) => OutputMode::Events,
            (true, false) => OutputMode::Capture,
            (false, false) => OutputMode::Stream,
        },
        host,
        env,
        step: crate::request::StepKind::Script,
    };
    Ok((req, inline))
}

/// The script to run: a file, or `-c CODE` / `-` (stdin) written to a
/// private temp file that lives as long as the returned guard.
fn script_source(code: Option<&str>, file: Option<&Path>, code_dir: bool) -> Result<(PathBuf, Option<InlineScript>), String> {
    match (code, file) {
        (Some(_), Some(f)) => {
            return Err(format!(
                "both -c and the script {} were given: pass one (arguments for -c are not supported)",
                f.display()
            ))
        }
        (None, None) => return Err("no script given: pass a file, `-` to read it from stdin, or -c CODE".into()),
        (None, Some(f)) if f != Path::new("-") => return Ok((f.to_path_buf(), None)),
        _ if code_dir => {
            return Err("-c and `-` cannot be combined with --code DIR: put the script in the folder and pass its path".into())
        }
        _ => {}
    }
    let inline = match code {
        Some(c) => InlineScript::from_code(c, &temp_dir()),
        None => InlineScript::from_reader(std::io::stdin().lock(), &temp_dir()),
    }
    .map_err(|e| e.to_string())?;
    Ok((inline.path(), Some(inline)))
}
