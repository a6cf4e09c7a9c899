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

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::hostenv;
use crate::locate::{self, Search};
use crate::policy::{Policy, PolicyError};
use crate::result::EXIT_SETUP_FAILED;
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
        Command::Schema => {
            print!("{}", crate::schema::result_schema_text());
            ExitCode::SUCCESS
        }
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

/// An error and every cause, on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        line.push_str(&format!(": {s}"));
        src = s.source();
    }
    line
}
