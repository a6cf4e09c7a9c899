//! `jail session start|exec|stop|interrupt`: one jail whose cells share one
//! interpreter's state.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::run::{prepare_request, RunArgs};
use super::{env_var, reword, EnvArgs, LimitArgs, RootfsArgs};
use crate::client::session::{self, SessionError};
use crate::result::{RunResult, EXIT_SETUP_FAILED};
use crate::stage::chain_line;

#[derive(Subcommand)]
// Parsed once per process, like `Command`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum SessionCommand {
    /// Make the jail and start its interpreter; print the handle once it is ready.
    Start(SessionStartArgs),
    /// Run a file (or `-`, stdin) as the session's next cell; print its JSON result.
    Exec {
        /// Print NDJSON events while the cell runs: stdout/stderr chunks as
        /// `jail run --events` prints them, then {"type":"result","result":...}.
        #[arg(long)]
        events: bool,
        /// This cell's wall-clock limit in seconds: lowers the session's
        /// (`--timeout` at start, or the policy's), never raises it.
        #[arg(long, value_name = "SECS", value_parser = seconds_arg)]
        timeout: Option<std::time::Duration>,
        /// Variables for this cell only, over the session's, set back once
        /// it ends.
        #[command(flatten)]
        env: EnvArgs,
        /// The handle `jail session start` printed.
        handle: PathBuf,
        /// The cell's code: a file, or `-` for stdin.
        file: PathBuf,
    },
    /// End the session; print its closing JSON result (artifacts delivered).
    /// A cell still running is killed first.
    Stop {
        /// The handle `jail session start` printed.
        handle: PathBuf,
    },
    /// Interrupt the running cell (KeyboardInterrupt in it; killed after
    /// the session's grace if it goes on); print `{"interrupted": ID}`.
    Interrupt {
        /// The handle `jail session start` printed.
        handle: PathBuf,
    },
}

/// The rootfs and limit flags in a session's words: its limits hold for
/// each cell or for the whole session.
const WORDS: &[(&str, &str)] = &[
    (
        "rootfs",
        "Root filesystem folder (default: JAIL_ROOTFS, the policy's, then the rootfs named by --rootfs-name, as for `jail run`)",
    ),
    ("timeout", "Wall-clock limit of each cell in seconds (overrides the policy)"),
    ("memory", "Memory of the whole session, swap 0: `512M`, `1G` or `unlimited`"),
    ("cpus", "CPU quota of the session in cores"),
    ("pids", "Processes and threads of the session"),
    ("cpu_time", "CPU seconds of each cell (with a cgroup; else of the whole session)"),
    ("cgroup_parent", "Create the session's cgroup beneath this cgroup"),
    ("no_systemd_delegation", "With no writable cgroup, do not ask the systemd user manager for a delegated scope"),
];

/// `jail run`'s options, less the script: the driver runs instead.
#[derive(clap::Args)]
#[command(mut_args(|a| reword(a, WORDS)))]
pub(crate) struct SessionStartArgs {
    /// Policy file (default: the built-in policies/default.json).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Folder bound read-only at /workspace/input.
    #[arg(long, value_name = "DIR")]
    input: Option<PathBuf>,
    /// Folder bound writable at /workspace/output (default: a fresh one).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Folder granted read-only at /workspace/code.
    #[arg(long, value_name = "DIR")]
    code: Option<PathBuf>,
    #[command(flatten)]
    rootfs: RootfsArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    env: EnvArgs,
    /// Print {"handle": ..., "pid": ..., "id": ...} instead of the handle alone.
    #[arg(long)]
    json: bool,
    /// End the session when every write end of the pipe whose read end is
    /// this inherited descriptor is closed (`jail pool` passes it).
    #[arg(long = "lifeline-fd", value_name = "FD", hide = true)]
    lifeline_fd: Option<i32>,
    /// Run the policy's `preload` as the session's first cell, trusted,
    /// before printing the handle: a session made ahead of its caller may
    /// then still take an output folder (`jail pool` asks for it).
    #[arg(long)]
    preload: bool,
}

/// Seconds from 1 ms to a day, as a limit (`jail session exec --timeout`).
fn seconds_arg(text: &str) -> Result<std::time::Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|t| crate::seconds::limit(t, crate::seconds::MOST))
        .ok_or_else(|| format!("{text} is not seconds {}", crate::seconds::range(crate::seconds::MOST)))
}

pub(crate) fn session(command: SessionCommand) -> ExitCode {
    let fail = |line: String| {
        eprintln!("jail: {line}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    let print = |value: &serde_json::Value| {
        let mut text = serde_json::to_vec_pretty(value).unwrap_or_default();
        text.push(b'\n');
        let _ = std::io::stdout().lock().write_all(&text);
    };
    match command {
        SessionCommand::Start(a) => {
            let json = a.json;
            if let Some(fd) = a.lifeline_fd {
                if fd < 3 || !crate::sys::fd_is_open(fd) {
                    return fail(format!("--lifeline-fd {fd} is not an open descriptor above 2: pass the read end of a pipe"));
                }
            }
            let args = RunArgs {
                input: a.input,
                output: a.output,
                code: a.code,
                env: a.env,
                ..RunArgs::for_cells(a.policy, a.rootfs, a.limits)
            };
            let req = match prepare_request(args) {
                Ok((req, _)) => req,
                Err(e) => return fail(format!("{} ({})", e.message, e.stage)),
            };
            let opts = crate::session::StartOptions {
                runtime_dir: env_var("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()).map(PathBuf::from),
                lifeline: a.lifeline_fd,
                preload: a.preload,
            };
            match crate::session::start(req, &opts) {
                Ok(started) if json => {
                    println!("{}", serde_json::to_string(&started).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Ok(started) => {
                    println!("{}", started.handle.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(chain_line(&e)),
            }
        }
        SessionCommand::Exec { events, timeout: wall, env, handle, file } => {
            if env.on_stdin() && file.as_os_str() == "-" {
                return fail("the cell (-) and --env-fd 0 both read stdin: pass one of them another way".into());
            }
            let env = match env.envs() {
                Ok(env) => env,
                Err(e) => return fail(e.message),
            };
            let code = if file.as_os_str() == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map(|_| text)
            } else {
                std::fs::read_to_string(&file)
            };
            let code = match code {
                Ok(c) => c,
                Err(e) => {
                    return fail(format!("read the cell {}: {e}: give a readable UTF-8 file, or - for stdin", file.display()))
                }
            };
            let done = if events {
                // One line per event as it comes; our reader sets the pace
                // here, and the session supervisor never waits for it.
                let line = |text: &str| {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.write_all(b"\n");
                    let _ = out.flush();
                };
                let cell = session::Cell::new(code, wall).with_env(env);
                let result = session::exec_value(&handle, cell, Some(&mut |ev| line(ev)));
                result.inspect(|value| line(&format!(r#"{{"type":"result","result":{value}}}"#)))
            } else {
                session::exec_value(&handle, session::Cell::new(code, wall).with_env(env), None).inspect(print)
            };
            match done {
                Ok(value) => {
                    let code = serde_json::from_value::<RunResult>(value).map_or(EXIT_SETUP_FAILED, |r| r.jail_exit_code());
                    ExitCode::from(code.clamp(0, 255) as u8)
                }
                Err(e) => fail(said(&e)),
            }
        }
        SessionCommand::Stop { handle } => match session::stop_value(&handle) {
            Ok(value) => {
                print(&value);
                ExitCode::SUCCESS
            }
            Err(e) => fail(said(&e)),
        },
        SessionCommand::Interrupt { handle } => match session::interrupt(&handle) {
            Ok(interrupted) => {
                print(&serde_json::json!(interrupted));
                ExitCode::SUCCESS
            }
            Err(e) => fail(said(&e)),
        },
    }
}

/// A session client's error, with what to do on this command line.
fn said(e: &SessionError) -> String {
    match e {
        SessionError::Ended { .. } => format!("{e}: start a new one with `jail session start`"),
        SessionError::Unknown { .. } => format!("{e}: start one with `jail session start`"),
        _ => e.to_string(),
    }
}
