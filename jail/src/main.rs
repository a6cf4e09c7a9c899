//! The `jail` command line: parse arguments, hand off to the library, print
//! the result, exit with the script's status (124 timeout, 125 setup).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use jail::hostenv::{self, HostEnv};
use jail::inline::InlineScript;
use jail::locate::{self, Search};
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
        #[command(flatten)]
        rootfs: RootfsArgs,
    },
    /// Build or list the Python root filesystems runs use.
    #[command(subcommand)]
    Rootfs(RootfsCommand),
    /// One jail for one sub-task: cells share one interpreter's state.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Keep jails made ahead (preload imported) and run each request of a
    /// JSON-lines protocol on stdin in one of them, then destroy it.
    Pool(PoolArgs),
    /// List the Python packages a rootfs provides, from its manifest.
    Packages {
        #[command(flatten)]
        rootfs: RootfsArgs,
        /// Print the rootfs, its id and its whole manifest as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of the `jail run --json` result (schema/result.schema.json).
    Schema,
    /// Serve MCP over stdio: a `run_python` tool that runs each step in a
    /// fresh jail (runs `jail-mcp`, installed beside this binary; `jail mcp --help`).
    #[command(disable_help_flag = true)]
    Mcp {
        /// The arguments of `jail-mcp`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Serve runs and sessions over HTTP, each in a fresh jail, for many
    /// tenants (runs `jail-serve`, installed beside this binary; `jail serve --help`).
    #[command(disable_help_flag = true)]
    Serve {
        /// The arguments of `jail-serve`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// Which rootfs: the lookup in jail/src/locate.rs.
#[derive(clap::Args, Clone)]
struct RootfsArgs {
    /// Root filesystem folder (default: JAIL_ROOTFS, the policy's, then the
    /// rootfs named by --rootfs-name in ~/.local/share/jail/rootfs,
    /// /var/lib/jail/rootfs, or the build tree).
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// The rootfs to look up by name when no folder is given: `minimal`, `data`.
    #[arg(long = "rootfs-name", value_name = "NAME", default_value = locate::DEFAULT_NAME)]
    rootfs_name: String,
}

#[derive(Subcommand)]
enum RootfsCommand {
    /// Build a rootfs from the recipes built into this binary and install it
    /// (as root into /var/lib/jail/rootfs/NAME, else ~/.local/share/jail/rootfs/NAME).
    Build {
        /// `minimal` (the host's Python, seconds) or `data` (Debian and the
        /// data-science stack; root and the network).
        flavour: String,
        /// Install into this folder instead (it is replaced).
        #[arg(long, value_name = "DIR")]
        dest: Option<PathBuf>,
    },
    /// List the installed rootfs folders, in lookup order.
    List {
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
// Parsed once per process, like `Command`.
#[allow(clippy::large_enum_variant)]
enum SessionCommand {
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
    /// Root filesystem folder (default: JAIL_ROOTFS, the policy's, then the
    /// rootfs named by --rootfs-name, as for `jail run`).
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// The rootfs to look up by name when no folder is given: `minimal`, `data`.
    #[arg(long = "rootfs-name", value_name = "NAME", default_value = locate::DEFAULT_NAME)]
    rootfs_name: String,
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
    /// With no writable cgroup, do not ask the systemd user manager for a
    /// delegated scope.
    #[arg(long = "no-systemd-delegation")]
    no_systemd_delegation: bool,
    /// Print {"handle": ..., "pid": ..., "id": ...} instead of the handle alone.
    #[arg(long)]
    json: bool,
    /// End the session when every write end of the pipe whose read end is
    /// this inherited descriptor is closed (`jail pool` passes it).
    #[arg(long = "lifeline-fd", value_name = "FD", hide = true)]
    lifeline_fd: Option<i32>,
}

/// `jail pool`: the run options every pooled jail is made with.
#[derive(clap::Args)]
struct PoolArgs {
    /// Jails kept made ahead: at most 64, and no more than the memory
    /// available to the pool holds at each jail's memory limit.
    #[arg(long, value_name = "N", default_value_t = 2)]
    size: usize,
    /// Policy file (default: the built-in policies/default.json).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[command(flatten)]
    rootfs: RootfsArgs,
    /// Wall-clock limit of each request in seconds (overrides the policy;
    /// a request may lower it).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Memory of each jail, swap 0: `512M`, `1G` or `unlimited`.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// CPU quota of each jail in cores.
    #[arg(long, value_name = "CORES")]
    cpus: Option<String>,
    /// Processes and threads of each jail.
    #[arg(long, value_name = "N")]
    pids: Option<String>,
    /// CPU seconds of each request (with a cgroup; else of the jail's life).
    #[arg(long = "cpu-time", value_name = "SECS")]
    cpu_time: Option<String>,
    /// Create each jail's cgroup beneath this cgroup.
    #[arg(long = "cgroup-parent", value_name = "CGROUP")]
    cgroup_parent: Option<String>,
    /// With no writable cgroup, do not ask the systemd user manager for a
    /// delegated scope.
    #[arg(long = "no-systemd-delegation")]
    no_systemd_delegation: bool,
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
    #[command(flatten)]
    rootfs: RootfsArgs,
    /// Run this code instead of a script file (as `python3 -c`).
    #[arg(short = 'c', value_name = "CODE")]
    command: Option<String>,
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
    /// With no writable cgroup, do not ask the systemd user manager for a
    /// delegated scope (the policy's limits.systemd_delegation "off").
    #[arg(long = "no-systemd-delegation")]
    no_systemd_delegation: bool,
    /// Capture the output and print one JSON result document on stdout.
    #[arg(long, conflicts_with = "events")]
    json: bool,
    /// Print NDJSON events on stdout as the step runs: stdout/stderr chunks,
    /// each artifact, then the result document (see README "Live events").
    #[arg(long)]
    events: bool,
    /// The Python script to run; `-` reads it from stdin.
    script: Option<PathBuf>,
    /// Arguments passed to the script.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// Seconds from 1 ms to a day, as a limit (`jail session exec --timeout`).
fn seconds_arg(text: &str) -> Result<std::time::Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|t| jail::seconds::limit(t, jail::seconds::MOST))
        .ok_or_else(|| format!("{text} is not seconds {}", jail::seconds::range(jail::seconds::MOST)))
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
        Command::Doctor { json, rootfs } => doctor(json, &rootfs),
        Command::Packages { rootfs, json } => packages(&rootfs, json),
        Command::Rootfs(RootfsCommand::Build { flavour, dest }) => rootfs_build(&flavour, dest),
        Command::Rootfs(RootfsCommand::List { json }) => rootfs_list(json),
        Command::Session(command) => session(command),
        Command::Pool(args) => pool(args),
        Command::Schema => {
            print!("{}", jail::schema::result_schema_text());
            ExitCode::SUCCESS
        }
        Command::Mcp { args } => jail::mcp::exec(&args),
        Command::Serve { args } => jail::mcp::exec_beside(jail::mcp::SERVE, &args),
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
    // First, before any thread: SIGTERM, SIGINT and SIGHUP cancel the run
    // (its tree killed, its cgroup and folders removed) instead of killing us.
    if let Err(e) = jail::cancel::arm() {
        eprintln!("jail: SIGTERM, SIGINT and SIGHUP will kill jail without cleaning up: block them and open a signalfd: {e}");
    }
    // Opened before the run: the captures write the chunk events to it.
    let events = args.events.then(jail::events::open);
    // `cleanup` holds what no caller waits for (the run cgroup, the uid
    // lease, the temp dir of a script from -c or stdin): dropped once the
    // result is out.
    let (mut result, cleanup) = match prepare_request(args) {
        Ok((req, script)) => {
            let (result, leftovers) = jail::supervisor::run_leaving_cleanup(&req);
            (result, Some((leftovers, script)))
        }
        Err(e) => (RunResult::setup_failed(e), None),
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
        // What the jail refused, so a person reading the output learns it.
        for d in &result.denials {
            let family = d.family.as_deref().map(|f| format!("({f})")).unwrap_or_default();
            let errno = d.errno.as_deref().unwrap_or("refused");
            let why = d.detail.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
            lines.push_str(&format!("jail: refused {}{family} x{} with {errno}{why}\n", d.what, d.count));
        }
        jail::relay::tell_stderr(&lines);
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

fn prepare_request(args: RunArgs) -> Result<(RunRequest, Option<InlineScript>), SetupError> {
    let input_err = |message: String| SetupError { stage: "input".into(), message, causes: vec![] };
    let (script, inline) =
        script_source(args.command.as_deref(), args.script.as_deref(), args.code.is_some()).map_err(input_err)?;
    let mut policy = load_policy(args.policy.as_ref()).map_err(|e| SetupError {
        stage: "policy".into(),
        message: format!("{e} (check it with `jail check FILE`)"),
        causes: vec![],
    })?;
    let timeout = args
        .timeout
        .map(|t| {
            jail::seconds::limit(t, jail::seconds::MOST).ok_or_else(|| SetupError {
                stage: "input".into(),
                message: format!("--timeout {t} is out of range: give seconds {}", jail::seconds::range(jail::seconds::MOST)),
                causes: vec![],
            })
        })
        .transpose()?;
    let overrides = Overrides {
        memory: args.memory,
        cpus: args.cpus,
        pids: args.pids,
        cpu_time: args.cpu_time,
        cgroup_parent: args
            .cgroup_parent
            .or_else(|| env_var(hostenv::CGROUP_PARENT_VAR).and_then(|v| v.into_string().ok()).filter(|v| !v.is_empty())),
        no_systemd_delegation: args.no_systemd_delegation,
    };
    policy
        .apply_overrides(&overrides)
        .map_err(|m| SetupError { stage: "input".into(), message: m, causes: vec![] })?;
    let (_, rootfs) = rootfs_search(&args.rootfs, Some(&policy)).find().map_err(|e| input_err(e.to_string()))?;
    let host = HostEnv::read(&policy, &env_var);
    let req = RunRequest {
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
        session: None,
    };
    Ok((req, inline))
}

/// The process environment: the one place `jail` reads it (hostenv.rs).
fn env_var(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

fn temp_dir() -> PathBuf {
    hostenv::path_var(&env_var, "TMPDIR")
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
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

/// The rootfs lookup for these flags and this policy, from the environment.
fn rootfs_search(args: &RootfsArgs, policy: Option<&Policy>) -> Search {
    let exe = std::env::current_exe().ok().and_then(|e| std::fs::canonicalize(e).ok());
    Search {
        flag: args.rootfs.clone(),
        env: hostenv::path_var(&env_var, hostenv::ROOTFS_VAR),
        policy: policy.and_then(|p| p.rootfs.clone()),
        name: args.rootfs_name.clone(),
        user_dir: locate::user_dir(hostenv::path_var(&env_var, "XDG_DATA_HOME"), hostenv::path_var(&env_var, "HOME")),
        system_dir: PathBuf::from(locate::SYSTEM_DIR),
        build_tree: exe.as_deref().and_then(locate::build_tree),
    }
}

fn rootfs_build(flavour: &str, dest: Option<PathBuf>) -> ExitCode {
    let search = rootfs_search(&RootfsArgs { rootfs: None, rootfs_name: flavour.to_string() }, None);
    let dest = match dest {
        Some(d) => Ok(d),
        None => jail::install::default_dest(&search, flavour, nix::unistd::geteuid().is_root()),
    };
    match dest.and_then(|d| jail::install::build(flavour, &d, &temp_dir()).map(|()| d)) {
        Ok(d) => {
            println!("installed the {flavour} rootfs at {}", d.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("jail: {e}");
            ExitCode::from(EXIT_SETUP_FAILED as u8)
        }
    }
}

fn rootfs_list(json: bool) -> ExitCode {
    let search = rootfs_search(&RootfsArgs { rootfs: None, rootfs_name: locate::DEFAULT_NAME.into() }, None);
    let listed = jail::install::list(&search);
    if json {
        println!("{}", serde_json::to_string_pretty(&listed).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if let Some(env) = &search.env {
        println!("$JAIL_ROOTFS is set: runs use {} unless --rootfs names another", env.display());
    }
    if listed.is_empty() {
        println!("no rootfs installed: build one with `jail rootfs build minimal`");
    }
    for l in &listed {
        let what = match (&l.flavour, &l.python) {
            (Some(f), Some(p)) => format!("{f}, python {p}"),
            _ => "no manifest".into(),
        };
        let shadow = if l.default_for_name { "" } else { " (shadowed by the one above)" };
        println!("{:<10} {:<10} {} ({what}){shadow}", l.name, l.location, l.path.display());
    }
    ExitCode::SUCCESS
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
            if let Some(fd) = a.lifeline_fd {
                if fd < 3 || !jail::sys::fd_is_open(fd) {
                    return fail(format!("--lifeline-fd {fd} is not an open descriptor above 2: pass the read end of a pipe"));
                }
            }
            let args = RunArgs {
                policy: a.policy,
                input: a.input,
                output: a.output,
                code: a.code,
                rootfs: RootfsArgs { rootfs: a.rootfs, rootfs_name: a.rootfs_name },
                command: None,
                timeout: a.timeout,
                memory: a.memory,
                cpus: a.cpus,
                pids: a.pids,
                cpu_time: a.cpu_time,
                cgroup_parent: a.cgroup_parent,
                no_systemd_delegation: a.no_systemd_delegation,
                json: true,
                events: false,
                // Replaced by the cell driver (session.rs).
                script: Some(PathBuf::new()),
                args: Vec::new(),
            };
            let req = match prepare_request(args) {
                Ok((req, _)) => req,
                Err(e) => return fail(format!("{} ({})", e.message, e.stage)),
            };
            let opts = jail::session::StartOptions {
                runtime_dir: std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()).map(PathBuf::from),
                lifeline: a.lifeline_fd,
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
        SessionCommand::Exec { events, timeout: wall, handle, file } => {
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
                let result = jail::session::exec_live(&handle, code, wall, &mut |ev| line(ev));
                result.inspect(|value| line(&format!(r#"{{"type":"result","result":{value}}}"#)))
            } else {
                jail::session::exec_within(&handle, code, wall).inspect(print)
            };
            match done {
                Ok(value) => {
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
        SessionCommand::Interrupt { handle } => match jail::session::interrupt(&handle) {
            Ok(value) => {
                print(&value);
                ExitCode::SUCCESS
            }
            Err(e) => fail(e.to_string()),
        },
    }
}

fn pool(a: PoolArgs) -> ExitCode {
    let fail = |line: String| {
        eprintln!("jail pool: {line}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    if a.size == 0 || a.size > jail::pool::run::MAX_SIZE {
        return fail(format!("--size {} is out of range: give 1 to {} jails", a.size, jail::pool::run::MAX_SIZE));
    }
    // Everything a jail is made with is checked once, here, as `jail run`
    // checks it: bad input is one line and exit 125 before any jail.
    let mut start_args: Vec<OsString> = Vec::new();
    let mut flag = |name: &str, value: Option<OsString>| {
        if let Some(v) = value {
            start_args.push(name.into());
            start_args.push(v);
        }
    };
    flag("--policy", a.policy.clone().map(Into::into));
    flag("--rootfs", a.rootfs.rootfs.clone().map(Into::into));
    flag("--rootfs-name", Some(a.rootfs.rootfs_name.clone().into()));
    flag("--timeout", a.timeout.map(|t| t.to_string().into()));
    flag("--memory", a.memory.clone().map(Into::into));
    flag("--cpus", a.cpus.clone().map(Into::into));
    flag("--pids", a.pids.clone().map(Into::into));
    flag("--cpu-time", a.cpu_time.clone().map(Into::into));
    flag("--cgroup-parent", a.cgroup_parent.clone().map(Into::into));
    if a.no_systemd_delegation {
        start_args.push("--no-systemd-delegation".into());
    }
    let args = RunArgs {
        policy: a.policy,
        input: None,
        output: None,
        code: None,
        rootfs: a.rootfs,
        command: None,
        timeout: a.timeout,
        memory: a.memory,
        cpus: a.cpus,
        pids: a.pids,
        cpu_time: a.cpu_time,
        cgroup_parent: a.cgroup_parent,
        no_systemd_delegation: a.no_systemd_delegation,
        json: true,
        events: false,
        script: Some(PathBuf::new()),
        args: Vec::new(),
    };
    let req = match prepare_request(args) {
        Ok((req, _)) => req,
        Err(e) => return fail(format!("{} ({})", e.message, e.stage)),
    };
    let jail_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fail(format!("find this binary (/proc/self/exe): {e}")),
    };
    let cfg = jail::pool::run::Config {
        size: a.size,
        jail_exe,
        start_args,
        preload: req.policy.preload.clone(),
        ceilings: jail::pool::protocol::Ceilings { wall_time: req.timeout.unwrap_or(req.policy.limits.wall_time) },
        temp_dir: req.host.temp_dir.clone().unwrap_or_else(temp_dir),
        // Only a bound output folder is written by the sandbox's own uid; a
        // capped one is copied back as the caller (output.rs), as `jail run`
        // hands its fresh folder over only when bound (request.rs).
        sandbox_gid: (nix::unistd::geteuid().is_root() && req.policy.filesystem.output_size.is_none())
            .then_some(req.policy.identity.root_host_gid),
        memory_limit: req.policy.limits.memory,
        output_capped: req.policy.filesystem.output_size.is_some(),
        reach: jail::accept::Reach::of_jails(req.policy.identity.root_host_gid),
    };
    match jail::pool::run::run(cfg) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => fail(e.to_string()),
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

fn doctor(json: bool, rootfs: &RootfsArgs) -> ExitCode {
    let policy = Policy::builtin_default();
    let ctx = jail::doctor::Context {
        rootfs: rootfs_search(rootfs, policy.as_ref().ok())
            .find()
            .map(|(source, path)| (path, source.describe().to_string()))
            .map_err(|e| e.to_string()),
        cgroup_parent: hostenv::path_var(&env_var, hostenv::CGROUP_PARENT_VAR),
        policy: match &policy {
            Ok(p) => {
                format!("the built-in default (policies/default.json compiled in), sha256 {}; --policy FILE overrides", p.hash)
            }
            Err(e) => format!("the built-in default does not load: {e}"),
        },
    };
    let report = jail::doctor::run(&ctx);
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

fn packages(args: &RootfsArgs, json: bool) -> ExitCode {
    let fail = |problem: String, fix: &str| {
        eprintln!("jail: {problem}: {fix}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    let rootfs = match rootfs_search(args, Policy::builtin_default().ok().as_ref()).find() {
        Ok((_, rootfs)) => rootfs,
        Err(e) => {
            eprintln!("jail: {e}");
            return ExitCode::from(EXIT_SETUP_FAILED as u8);
        }
    };
    let (manifest, rootfs_id) = match jail::rootfs::load(&rootfs) {
        Ok(Some(found)) => found,
        Ok(None) => {
            return fail(
                format!("rootfs {} has no manifest ({})", rootfs.display(), jail::rootfs::MANIFEST_PATH),
                "rebuild it with `jail rootfs build minimal` (or `data`)",
            )
        }
        Err(e) => {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
            return fail(format!("{e}{cause}"), "rebuild it with `jail rootfs build minimal` (or `data`)");
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
