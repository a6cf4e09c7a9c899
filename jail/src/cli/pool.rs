//! `jail pool`: jails made ahead, each serving one request of the JSON-lines
//! protocol on stdin.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use super::run::{prepare_request, RunArgs};
use super::{reword, temp_dir, LimitArgs, RootfsArgs};
use crate::result::EXIT_SETUP_FAILED;

/// The limit flags in a pool's words: its limits hold for each jail or
/// each request.
const WORDS: &[(&str, &str)] = &[
    ("timeout", "Wall-clock limit of each request in seconds (overrides the policy; a request may lower it)"),
    ("memory", "Memory of each jail, swap 0: `512M`, `1G` or `unlimited`"),
    ("cpus", "CPU quota of each jail in cores"),
    ("pids", "Processes and threads of each jail"),
    ("cpu_time", "CPU seconds of each request (with a cgroup; else of the jail's life)"),
    ("cgroup_parent", "Create each jail's cgroup beneath this cgroup"),
    ("no_systemd_delegation", "With no writable cgroup, do not ask the systemd user manager for a delegated scope"),
];

/// `jail pool`: the run options every pooled jail is made with.
#[derive(clap::Args)]
#[command(mut_args(|a| reword(a, WORDS)))]
pub(crate) struct PoolArgs {
    /// Jails kept made ahead: at most 64, and no more than the memory
    /// available to the pool holds at each jail's memory limit.
    #[arg(long, value_name = "N", default_value_t = 2)]
    size: usize,
    /// Policy file (default: the built-in policies/default.json).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[command(flatten)]
    rootfs: RootfsArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// With a preload, make a new template (and so a new address-space
    /// layout) after this many jails forked from the last one.
    #[arg(long, value_name = "N", default_value_t = crate::pool::run::TEMPLATE_FORKS)]
    template_forks: u64,
    /// ... or once the last one is this many seconds old.
    #[arg(long, value_name = "SECS", default_value_t = crate::pool::run::TEMPLATE_SECS)]
    template_secs: u64,
}

pub(crate) fn pool(a: PoolArgs) -> ExitCode {
    let fail = |line: String| {
        eprintln!("jail pool: {line}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    if a.size == 0 || a.size > crate::pool::run::MAX_SIZE {
        return fail(format!("--size {} is out of range: give 1 to {} jails", a.size, crate::pool::run::MAX_SIZE));
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
    a.limits.push_args(&mut start_args);
    let req = match prepare_request(RunArgs::for_cells(a.policy, a.rootfs, a.limits)) {
        Ok((req, _)) => req,
        Err(e) => return fail(format!("{} ({})", e.message, e.stage)),
    };
    let jail_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fail(format!("find this binary (/proc/self/exe): {e}")),
    };
    let cfg = crate::pool::run::Config {
        size: a.size,
        jail_exe,
        start_args,
        ceilings: crate::client::pool::Ceilings { wall_time: req.timeout.unwrap_or(req.policy.limits.wall_time) },
        temp_dir: req.host.temp_dir.clone().unwrap_or_else(temp_dir),
        // Only a bound output folder is written by the sandbox's own uid; a
        // capped one is copied back as the caller (output.rs), as `jail run`
        // hands its fresh folder over only when bound (request.rs).
        sandbox_gid: (nix::unistd::geteuid().is_root() && req.policy.filesystem.output_size.is_none())
            .then_some(req.policy.identity.root_host_gid),
        memory_limit: req.policy.limits.memory,
        output_capped: req.policy.filesystem.output_size.is_some(),
        reach: crate::accept::Reach::of_jails(req.policy.identity.root_host_gid),
        preload: !req.policy.preload.is_empty(),
        renew_template: crate::pool::run::Renew {
            forks: a.template_forks.max(1),
            age: std::time::Duration::from_secs(a.template_secs.max(1)),
        },
    };
    match crate::pool::run::run(cfg) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => fail(e.to_string()),
    }
}
