//! The `jail` command line: parse arguments, hand off to the library, print
//! the result, exit with the script's status (124 timeout, 125 setup).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use jail::policy::{Overrides, Policy};
use jail::result::{RunResult, SetupError, Status, EXIT_SETUP_FAILED};
use jail::supervisor::{OutputMode, RunRequest};

#[derive(Parser)]
#[command(name = "jail", version, about = "Run untrusted Python in a fresh, unprivileged Linux jail")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once per process; boxing `RunArgs` would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run one Python script in a fresh jail.
    Run(RunArgs),
    /// Validate a policy file and compile its seccomp filter.
    Check {
        /// The policy file.
        policy: PathBuf,
        /// Also print the compiled BPF program, one instruction per line.
        #[arg(long)]
        bpf: bool,
    },
    /// Show what this host provides to the jail, and how to fix what is missing.
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the Python packages a rootfs provides, from its manifest.
    /// One jail for one sub-task: cells share one interpreter's state.
    #[command(subcommand)]
    Session(SessionCommand),
    Packages {
        /// Root filesystem folder (default: JAIL_ROOTFS, then the default policy's).
        #[arg(long, value_name = "DIR")]
        rootfs: Option<PathBuf>,
        /// Print the rootfs, its id and its whole manifest as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of the `jail run --json` result (schema/result.schema.json).
    Schema,
    /// Serve MCP over stdio: a `run_python` tool that runs each step in a fresh jail.
    #[cfg(feature = "mcp")]
    Mcp(jail::mcp::McpArgs),
}

#[derive(Subcommand)]
// Parsed once per process, like `Command`.
#[allow(clippy::large_enum_variant)]
enum SessionCommand {
    /// Make the jail and start its interpreter; print the handle once it is ready.
    Start(SessionStartArgs),
    /// Run a file (or `-`, stdin) as the session's next cell; print its JSON result.
    Exec {
        /// The handle `jail session start` printed.
        handle: PathBuf,
        /// The cell's code: a file, or `-` for stdin.
        file: PathBuf,
    },
    /// End the session; print its closing JSON result (artifacts delivered).
    Stop {
        /// The handle `jail session start` printed.
        handle: PathBuf,
    },
}

/// `jail run`'s options, less the script: the driver runs instead.
#[derive(clap::Args)]
struct SessionStartArgs {
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
    /// Root filesystem folder (default: JAIL_ROOTFS, then the policy's).
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// Wall-clock limit of each cell in seconds (overrides the policy).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Memory of the whole session, swap 0: `512M`, `1G` or `unlimited`.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// CPU quota of the session in cores.
    #[arg(long, value_name = "CORES")]
    cpus: Option<String>,
    /// Processes and threads of the session.
    #[arg(long, value_name = "N")]
    pids: Option<String>,
    /// CPU seconds of each cell (with a cgroup; else of the whole session).
    #[arg(long = "cpu-time", value_name = "SECS")]
    cpu_time: Option<String>,
    /// Create the session's cgroup beneath this cgroup.
    #[arg(long = "cgroup-parent", value_name = "CGROUP")]
    cgroup_parent: Option<String>,
    /// Print {"handle": ..., "pid": ..., "id": ...} instead of the handle alone.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Policy file (default: the built-in policies/default.json).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Folder bound read-only at /workspace/input.
    #[arg(long, value_name = "DIR")]
    input: Option<PathBuf>,
    /// Folder bound writable at /workspace/output (default: a fresh one).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Folder granted read-only at /workspace/code (default: the script alone, copied in).
    #[arg(long, value_name = "DIR")]
    code: Option<PathBuf>,
    /// Root filesystem folder (default: JAIL_ROOTFS, then the policy's).
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// Wall-clock limit in seconds (overrides the policy).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Memory of the whole run, swap 0: `512M`, `1G` or `unlimited`.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// CPU quota in cores: `1`, `0.5` or `unlimited`.
    #[arg(long, value_name = "CORES")]
    cpus: Option<String>,
    /// Processes and threads of the run, the jail's PID 1 included.
    #[arg(long, value_name = "N")]
    pids: Option<String>,
    /// CPU seconds of the whole run (user + system), or `unlimited`.
    #[arg(long = "cpu-time", value_name = "SECS")]
    cpu_time: Option<String>,
    /// Create the run's cgroup beneath this cgroup (a path as in
    /// /proc/self/cgroup; default: JAIL_CGROUP_PARENT, then the policy's,
    /// then jail's own cgroup).
    #[arg(long = "cgroup-parent", value_name = "CGROUP")]
    cgroup_parent: Option<String>,
    /// Capture the output and print one JSON result document on stdout.
    #[arg(long)]
    json: bool,
    /// The Python script to run.
    script: PathBuf,
    /// Arguments passed to the script.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_SETUP_FAILED } else { 0 };
            let _ = e.print();
            return ExitCode::from(code as u8);
        }
    };
    match cli.command {
        Command::Run(args) => run(args),
        Command::Check { policy, bpf } => check(&policy, bpf),
        Command::Doctor { json } => doctor(json),
        Command::Packages { rootfs, json } => packages(rootfs, json),
        Command::Session(command) => session(command),
        Command::Schema => {
            print!("{}", jail::schema::result_schema_text());
            ExitCode::SUCCESS
        }
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => jail::mcp::main(args),
    }
}

fn load_policy(path: Option<&PathBuf>) -> Result<Policy, jail::policy::PolicyError> {
    match path {
        Some(p) => Policy::load(p),
        None => Policy::builtin_default(),
    }
}

fn run(args: RunArgs) -> ExitCode {
    let json = args.json;
    let mut result = match prepare_request(args) {
        Ok(req) => jail::supervisor::run(&req),
        Err(e) => RunResult::setup_failed(e),
    };
    if result.supervisor.max_rss_bytes == 0 {
        // A run that stopped early: what the binary itself needs (make
        // bench uses it as the baseline for the supervisor's peak).
        result.supervisor.max_rss_bytes = jail::sys::self_max_rss_bytes();
    }
    if let Some(e) = &result.setup_error {
        // One line a person can act on; the JSON carries the rest.
        let causes = if e.causes.is_empty() {
            String::new()
        } else {
            format!(": {}", e.causes.join(": "))
        };
        eprintln!("jail: {} ({}){causes}", e.message, e.stage);
    } else if !json {
        // Never a blocking write here: a caller that stopped reading our
        // stderr must not keep `jail` from exiting (relay.rs).
        let mut lines = String::new();
        match result.status {
            Status::TimeoutWall => lines.push_str("jail: the script ran past its wall-clock limit and was killed\n"),
            Status::TimeoutCpu => lines.push_str("jail: the script used up its CPU-time limit and was killed\n"),
            Status::OomKilled => lines.push_str("jail: the kernel killed the script at its memory limit\n"),
            Status::OutputLimit => lines.push_str(
                "jail: the script's output passed limits.stdout_bytes or limits.stderr_bytes; the rest was dropped (status output_limit)\n",
            ),
            _ => {}
        }
        // What the jail refused, so a person reading the output learns it.
        for d in &result.denials {
            let family = d.family.as_deref().map(|f| format!("({f})")).unwrap_or_default();
            let errno = d.errno.as_deref().unwrap_or("refused");
            let why = d.detail.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
            lines.push_str(&format!("jail: refused {}{family} x{} with {errno}{why}\n", d.what, d.count));
        }
        jail::relay::tell_stderr(&lines);
    }
    if json {
        // One write: stdout is line-buffered, and a result is ~200 lines.
        let mut text = serde_json::to_vec_pretty(&result).unwrap_or_default();
        text.push(b'\n');
        let _ = std::io::stdout().lock().write_all(&text);
    }
    ExitCode::from(result.jail_exit_code().clamp(0, 255) as u8)
}

fn prepare_request(args: RunArgs) -> Result<RunRequest, SetupError> {
    let mut policy = load_policy(args.policy.as_ref()).map_err(|e| SetupError {
        stage: "policy".into(),
        message: format!("{e} (check it with `jail check FILE`)"),
        causes: vec![],
    })?;
    let timeout = match args.timeout {
        None => None,
        Some(t) if t > 0.0 && t <= 86_400.0 => Some(Duration::from_secs_f64(t)),
        Some(t) => {
            return Err(SetupError {
                stage: "input".into(),
                message: format!("--timeout {t} is out of range: give seconds above 0 and at most 86400"),
                causes: vec![],
            })
        }
    };
    let overrides = Overrides {
        memory: args.memory,
        cpus: args.cpus,
        pids: args.pids,
        cpu_time: args.cpu_time,
        cgroup_parent: args.cgroup_parent.or_else(|| std::env::var("JAIL_CGROUP_PARENT").ok().filter(|v| !v.is_empty())),
    };
    policy
        .apply_overrides(&overrides)
        .map_err(|m| SetupError { stage: "input".into(), message: m, causes: vec![] })?;
    Ok(RunRequest {
        policy,
        script: args.script,
        args: args.args,
        input: args.input,
        output: args.output,
        code: args.code,
        rootfs: args.rootfs,
        timeout,
        mode: if args.json { OutputMode::Capture } else { OutputMode::Stream },
        session: None,
    })
}

fn session(command: SessionCommand) -> ExitCode {
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
            let args = RunArgs {
                policy: a.policy,
                input: a.input,
                output: a.output,
                code: a.code,
                rootfs: a.rootfs,
                timeout: a.timeout,
                memory: a.memory,
                cpus: a.cpus,
                pids: a.pids,
                cpu_time: a.cpu_time,
                cgroup_parent: a.cgroup_parent,
                json: true,
                // Replaced by the cell driver (session.rs).
                script: PathBuf::new(),
                args: Vec::new(),
            };
            let req = match prepare_request(args) {
                Ok(req) => req,
                Err(e) => return fail(format!("{} ({})", e.message, e.stage)),
            };
            let opts = jail::session::StartOptions {
                runtime_dir: std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()).map(PathBuf::from),
            };
            match jail::session::start(req, &opts) {
                Ok(started) if json => {
                    println!("{}", serde_json::to_string(&started).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Ok(started) => {
                    println!("{}", started.handle.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(chain(&e)),
            }
        }
        SessionCommand::Exec { handle, file } => {
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
            match jail::session::exec(&handle, code) {
                Ok(value) => {
                    print(&value);
                    let code = serde_json::from_value::<RunResult>(value).map_or(EXIT_SETUP_FAILED, |r| r.jail_exit_code());
                    ExitCode::from(code.clamp(0, 255) as u8)
                }
                Err(e) => fail(e.to_string()),
            }
        }
        SessionCommand::Stop { handle } => match jail::session::stop(&handle) {
            Ok(value) => {
                print(&value);
                ExitCode::SUCCESS
            }
            Err(e) => fail(e.to_string()),
        },
    }
}

/// An error and every cause, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        line.push_str(&format!(": {s}"));
        src = s.source();
    }
    line
}

fn check(path: &std::path::Path, bpf: bool) -> ExitCode {
    let fail = |e: &dyn std::error::Error| {
        let mut line = format!("{}: {e}", path.display());
        let mut src = e.source();
        while let Some(s) = src {
            line.push_str(&format!(": {s}"));
            src = s.source();
        }
        eprintln!("{line}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    let p = match Policy::load(path) {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    let mode = jail::seccomp::host_mode();
    let filter = match jail::seccomp::compile(&p.seccomp, mode) {
        Ok(f) => f,
        Err(e) => return fail(&e),
    };
    println!(
        "{}: ok (policy `{}`, sha256 {}; seccomp: {} rules, {} BPF instructions, filter sha256 {}; landlock: {})",
        path.display(),
        p.name,
        p.hash,
        p.seccomp.rules.len(),
        filter.program.len(),
        filter.sha256,
        p.landlock.enforcement.as_str(),
    );
    if bpf {
        print!("{}", jail::seccomp::bpf::disassemble(&filter.program));
    }
    ExitCode::SUCCESS
}

fn doctor(json: bool) -> ExitCode {
    let rootfs = std::env::var_os("JAIL_ROOTFS")
        .map(PathBuf::from)
        .or_else(|| Policy::builtin_default().ok().and_then(|p| p.rootfs));
    let report = jail::doctor::run(rootfs.as_deref());
    if json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    } else {
        println!("kernel {} (running as uid {})", report.kernel, report.uid);
        for c in &report.checks {
            println!("{:<4} {:<16} {}", if c.ok { "ok" } else { "MISSING" }, c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("     {:<16} fix: {fix}", "");
            }
        }
    }
    if report.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn packages(rootfs: Option<PathBuf>, json: bool) -> ExitCode {
    let fail = |problem: String, fix: &str| {
        eprintln!("jail: {problem}: {fix}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    let Some(rootfs) = rootfs.or_else(default_rootfs) else {
        return fail("no rootfs given".into(), "pass --rootfs DIR or set JAIL_ROOTFS");
    };
    let (manifest, rootfs_id) = match jail::rootfs::load(&rootfs) {
        Ok(Some(found)) => found,
        Ok(None) => {
            return fail(
                format!("rootfs {} has no manifest ({})", rootfs.display(), jail::rootfs::MANIFEST_PATH),
                "rebuild it with `make rootfs` or `make rootfs-data`",
            )
        }
        Err(e) => {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
            return fail(format!("{e}{cause}"), "rebuild it with `make rootfs` or `make rootfs-data`");
        }
    };
    if json {
        let report = jail::rootfs::Report { rootfs: rootfs.display().to_string(), rootfs_id, manifest };
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    let py = &manifest.python;
    println!("rootfs {} (flavour {}, id {rootfs_id})", rootfs.display(), manifest.flavour);
    match &py.debian_package {
        Some(deb) => println!("python {} ({}, Debian package {deb})", py.version, py.implementation),
        None => println!("python {} ({})", py.version, py.implementation),
    }
    if manifest.packages.is_empty() {
        println!("no packages beyond the standard library");
    } else {
        println!("{} packages (name, version, import as):", manifest.packages.len());
        for p in &manifest.packages {
            println!("  {:<20} {:<12} {}", p.name, p.version, p.imports.join(", "));
        }
    }
    ExitCode::SUCCESS
}

/// The rootfs a command without `--rootfs` looks at: JAIL_ROOTFS, then the
/// built-in default policy's.
fn default_rootfs() -> Option<PathBuf> {
    std::env::var_os("JAIL_ROOTFS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| Policy::builtin_default().ok().and_then(|p| p.rootfs))
}
