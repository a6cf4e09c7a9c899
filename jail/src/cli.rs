//! The `jail` command line: parse arguments, hand off to the library, print
//! the result, exit with the script's status (124 timeout, 125 setup). One
//! file per subcommand; `main.rs` only calls [`main`].

mod beside;
mod check;
mod doctor;
mod packages;
mod pool;
mod rootfs;
mod run;
mod session;
mod template;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::hostenv;
use crate::locate::{self, Search};
use crate::policy::{Overrides, Policy, PolicyError};
use crate::result::{SetupError, EXIT_SETUP_FAILED};
use pool::PoolArgs;
use rootfs::RootfsCommand;
use run::RunArgs;
use session::SessionCommand;

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
    /// A pool's template: jails forked from an interpreter that imported
    /// the policy's preload (`jail pool` runs it).
    #[command(hide = true)]
    Template(template::TemplateArgs),
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
pub(crate) struct RootfsArgs {
    /// Root filesystem folder (default: JAIL_ROOTFS, the policy's, then the
    /// rootfs named by --rootfs-name in ~/.local/share/jail/rootfs,
    /// /var/lib/jail/rootfs, or the build tree).
    #[arg(long, value_name = "DIR")]
    pub(crate) rootfs: Option<PathBuf>,
    /// The rootfs to look up by name when no folder is given: `data`,
    /// `minimal`, or `default` (`data` where one is built, else `minimal`).
    #[arg(long = "rootfs-name", value_name = "NAME", default_value = locate::DEFAULT_NAME)]
    pub(crate) rootfs_name: String,
}

/// The limit flags `jail run`, `jail session start` and `jail pool` share,
/// in `jail run`'s words (a session or a pool rewords their help with
/// [`reword`]), and their one conversion into the policy's overrides.
#[derive(clap::Args)]
pub(crate) struct LimitArgs {
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
}

impl LimitArgs {
    /// `--timeout`, checked as every door checks a time limit (seconds.rs).
    pub(crate) fn timeout(&self) -> Result<Option<Duration>, SetupError> {
        self.timeout
            .map(|t| {
                crate::seconds::limit(t, crate::seconds::MOST).ok_or_else(|| SetupError {
                    stage: "input".into(),
                    message: format!(
                        "--timeout {t} is out of range: give seconds {}",
                        crate::seconds::range(crate::seconds::MOST)
                    ),
                    causes: vec![],
                })
            })
            .transpose()
    }

    /// The policy's overrides these flags ask for; the cgroup parent falls
    /// back on JAIL_CGROUP_PARENT.
    pub(crate) fn overrides(self) -> Overrides {
        Overrides {
            memory: self.memory,
            cpus: self.cpus,
            pids: self.pids,
            cpu_time: self.cpu_time,
            cgroup_parent: self
                .cgroup_parent
                .or_else(|| env_var(hostenv::CGROUP_PARENT_VAR).and_then(|v| v.into_string().ok()).filter(|v| !v.is_empty())),
            no_systemd_delegation: self.no_systemd_delegation,
        }
    }

    /// The flags again, as the arguments of a `jail session start` (the pool
    /// starts its jails so).
    pub(crate) fn push_args(&self, args: &mut Vec<OsString>) {
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                args.push(name.into());
                args.push(v.into());
            }
        };
        flag("--timeout", self.timeout.map(|t| t.to_string()));
        flag("--memory", self.memory.clone());
        flag("--cpus", self.cpus.clone());
        flag("--pids", self.pids.clone());
        flag("--cpu-time", self.cpu_time.clone());
        flag("--cgroup-parent", self.cgroup_parent.clone());
        if self.no_systemd_delegation {
            args.push("--no-systemd-delegation".into());
        }
    }
}

/// The variables a caller sets for a run or a session (envs.rs checks them).
#[derive(clap::Args, Default)]
pub(crate) struct EnvArgs {
    /// Set a variable for the code: NAME=VALUE (repeatable). A command line
    /// is visible to other users: pass secrets with --env-fd.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Read variables from this inherited descriptor (0: stdin), as one
    /// JSON object of strings (at most 32 KiB), over those of --env.
    #[arg(long = "env-fd", value_name = "FD")]
    env_fd: Option<i32>,
}

impl EnvArgs {
    /// Whether the variables come on stdin.
    pub(crate) fn on_stdin(&self) -> bool {
        self.env_fd == Some(0)
    }

    /// The variables, checked; the descriptor is read to its end and closed.
    pub(crate) fn envs(&self) -> Result<crate::envs::Envs, SetupError> {
        let input_err = |message: String| SetupError { stage: "input".into(), message, causes: vec![] };
        let flags = crate::envs::Envs::from_pairs(self.env.iter().map(String::as_str)).map_err(|e| input_err(e.to_string()))?;
        let Some(fd) = self.env_fd else { return Ok(flags) };
        let given = if fd == 0 {
            // Read to its end and left open: nothing else reads it (the
            // jail's stdin is /dev/null), and no later file takes fd 0.
            crate::envs::Envs::read_json(std::io::stdin().lock())
        } else {
            let owned = (fd > 2).then(|| crate::sys::take_inherited_fd(fd)).flatten().ok_or_else(|| {
                input_err(format!("--env-fd {fd} is not stdin (0) or an open descriptor above 2: pass the read end of a pipe"))
            })?;
            crate::envs::Envs::read_json(std::fs::File::from(owned))
        }
        .map_err(|e| input_err(e.to_string()))?;
        flags.and(&given).map_err(|e| input_err(e.to_string()))
    }
}

/// A flag's help in one door's words: the `(arg id, help)` pair that names
/// it, else its own (`#[command(mut_args(...))]` on the door's flags).
pub(crate) fn reword(arg: clap::Arg, words: &[(&str, &'static str)]) -> clap::Arg {
    match words.iter().find(|(id, _)| arg.get_id() == id) {
        Some((_, help)) => arg.help(*help),
        None => arg,
    }
}

/// The `jail` binary: parse the arguments, run the subcommand, exit with its status.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_SETUP_FAILED } else { 0 };
            let _ = e.print();
            return ExitCode::from(code as u8);
        }
    };
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Check { policy, bpf } => check::check(&policy, bpf),
        Command::Doctor { json, rootfs } => doctor::doctor(json, &rootfs),
        Command::Packages { rootfs, json } => packages::packages(&rootfs, json),
        Command::Rootfs(RootfsCommand::Build { flavour, dest }) => rootfs::rootfs_build(&flavour, dest),
        Command::Rootfs(RootfsCommand::List { json }) => rootfs::rootfs_list(json),
        Command::Session(command) => session::session(command),
        Command::Pool(args) => pool::pool(args),
        Command::Template(args) => template::template(args),
        Command::Schema => emit(&crate::schema::result_schema_text(), ExitCode::SUCCESS),
        Command::Mcp { args } => beside::exec(&args),
        Command::Serve { args } => beside::exec_beside(beside::SERVE, &args),
    }
}

pub(crate) fn load_policy(path: Option<&PathBuf>) -> Result<Policy, PolicyError> {
    match path {
        Some(p) => Policy::load(p),
        None => Policy::builtin_default(),
    }
}

/// The process environment: the one place `jail` reads it (hostenv.rs).
pub(crate) fn env_var(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

pub(crate) fn temp_dir() -> PathBuf {
    hostenv::path_var(&env_var, "TMPDIR")
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// The rootfs lookup for these flags and this policy, from the environment.
pub(crate) fn rootfs_search(args: &RootfsArgs, policy: Option<&Policy>) -> Search {
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

/// Print the whole output of a command that only prints (`packages`,
/// `rootfs list`, `doctor`, `schema`), then end with `status`. A reader
/// that closed early (`jail packages | head -3`) has what it wanted: a
/// broken pipe ends the command quietly with `status`, as it does `ls`'s
/// output into `head` under `set -o pipefail`, never as a panic.
pub(crate) fn emit(text: &str, status: ExitCode) -> ExitCode {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => status,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => status,
        Err(e) => {
            eprintln!("jail: writing to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The help of flag `id` of the subcommand at `path`.
    fn help(path: &[&str], id: &str) -> Option<String> {
        let mut cmd = Cli::command();
        for name in path {
            cmd = cmd.find_subcommand(name)?.clone();
        }
        let arg = cmd.get_arguments().find(|a| a.get_id() == id)?;
        arg.get_help().map(|h| h.to_string())
    }

    #[test]
    fn the_command_line_is_well_formed_and_each_door_words_the_shared_limits() {
        Cli::command().debug_assert();
        // One `LimitArgs`, three doors, each in its own words.
        assert_eq!(help(&["run"], "timeout").as_deref(), Some("Wall-clock limit in seconds (overrides the policy)"));
        assert_eq!(
            help(&["session", "start"], "timeout").as_deref(),
            Some("Wall-clock limit of each cell in seconds (overrides the policy)")
        );
        assert_eq!(help(&["pool"], "cpus").as_deref(), Some("CPU quota of each jail in cores"));
        assert_eq!(help(&["session", "start"], "rootfs_name"), help(&["run"], "rootfs_name"));
    }
}
