//! `jail session start|exec|stop|interrupt|put|get|ls`: one jail whose
//! cells share one interpreter's state, and its files while it lives.

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
    /// Write a file into the session's /workspace/output (at most 8 MiB),
    /// whole, while it lives; the code sees it, and it is delivered with
    /// the rest at the end. Prints what was written.
    Put {
        /// Print the answer as JSON (a refusal too, on stdout, exit 1).
        #[arg(long)]
        json: bool,
        /// The handle `jail session start` printed.
        handle: PathBuf,
        /// Where, relative to /workspace/output (or starting with it).
        path: String,
        /// The content: a file, or `-` for stdin.
        #[arg(default_value = "-")]
        from: PathBuf,
    },
    /// Read a file of the session's /workspace/output, judged as an
    /// artifact is (a CSV's formula cells neutralised, a refused file not
    /// given); its bytes to stdout or --to.
    Get {
        /// Print the answer as JSON, the bytes in base64 (a refusal too, exit 1).
        #[arg(long)]
        json: bool,
        /// Write the bytes to this file (replaced) instead of stdout.
        #[arg(long, value_name = "FILE")]
        to: Option<PathBuf>,
        /// The handle `jail session start` printed.
        handle: PathBuf,
        /// The file, relative to /workspace/output (or starting with it).
        path: String,
    },
    /// List a folder of the session's /workspace/output: kind, bytes, name.
    Ls {
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
        /// The handle `jail session start` printed.
        handle: PathBuf,
        /// The folder, relative to /workspace/output; empty: itself.
        #[arg(default_value = "")]
        path: String,
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
    /// Make the jail as a fork of the template listening at this socket
    /// (`jail template`; `jail pool` passes it): its preload is the
    /// template's.
    #[arg(long, value_name = "SOCKET", hide = true)]
    template: Option<PathBuf>,
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
            let mut req = match prepare_request(args) {
                Ok((req, _)) => req,
                Err(e) => return fail(format!("{} ({})", e.message, e.stage)),
            };
            req.template = a.template;
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
        SessionCommand::Put { json, handle, path, from } => {
            let data = if from.as_os_str() == "-" {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut std::io::Read::take(std::io::stdin(), session::MAX_FILE as u64 + 1), &mut data)
                    .map(|_| data)
            } else {
                std::fs::File::open(&from).and_then(|f| {
                    let mut data = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::Read::take(f, session::MAX_FILE as u64 + 1), &mut data).map(|_| data)
                })
            };
            match data {
                Ok(data) => file_answer(session::put_file(&handle, &path, &data), json, |_| None),
                Err(e) => fail(format!("read {}: {e}: give a readable file, or - for stdin", from.display())),
            }
        }
        SessionCommand::Get { json, to, handle, path } => file_answer(session::get_file(&handle, &path), json, |answer| {
            let session::FileAnswer::Read { data, .. } = answer else { return None };
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default();
            let written = match &to {
                Some(to) => std::fs::write(to, &bytes),
                None => std::io::stdout().lock().write_all(&bytes),
            };
            Some(written.map_err(|e| format!("write {}: {e}", to.as_ref().map_or("stdout".into(), |t| t.display().to_string()))))
        }),
        SessionCommand::Ls { json, handle, path } => file_answer(session::list_files(&handle, &path), json, |answer| {
            let session::FileAnswer::Listed { entries, truncated, .. } = answer else { return None };
            let mut out = std::io::stdout().lock();
            for e in entries {
                let _ = writeln!(out, "{:<7} {:>10} {}", e.kind, e.bytes, e.name);
            }
            if *truncated {
                let _ = writeln!(out, "... (more than {} entries)", session::MAX_LISTED);
            }
            Some(Ok(()))
        }),
    }
}

/// A files API answer on the command line: as JSON with `--json`, else by
/// `human` (`None`: as JSON anyway); a refusal exits 1, saying why.
fn file_answer(
    answer: Result<session::FileAnswer, SessionError>,
    json: bool,
    human: impl FnOnce(&session::FileAnswer) -> Option<Result<(), String>>,
) -> ExitCode {
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            eprintln!("jail: {}", said(&e));
            return ExitCode::from(EXIT_SETUP_FAILED as u8);
        }
    };
    let refused = matches!(answer, session::FileAnswer::Refused { .. });
    if let (session::FileAnswer::Refused { code, detail, .. }, false) = (&answer, json) {
        eprintln!("jail: refused ({}): {detail}", serde_json::to_value(code).unwrap_or_default().as_str().unwrap_or("?"));
        return ExitCode::from(1);
    }
    let shown = if json { None } else { human(&answer) };
    match shown {
        Some(Err(e)) => {
            eprintln!("jail: {e}");
            return ExitCode::from(1);
        }
        Some(Ok(())) => {}
        None => {
            let mut text = serde_json::to_vec_pretty(&answer).unwrap_or_default();
            text.push(b'\n');
            let _ = std::io::stdout().lock().write_all(&text);
        }
    }
    if refused {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
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
