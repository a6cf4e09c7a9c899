//! A `jail run` command line built from a typed spec, by one function
//! (`argv`; `start_argv` for `jail session start`, `pool_argv` for `jail
//! pool`), and the process it runs as (`command`, `start_command`,
//! `pool_command`): its own process group,
//! so that stopping it reaches whatever it started (group.rs); the parent
//! death signal where the caller asks for one; the caller's environment
//! policy. The front ends fill a `RunSpec`; none writes a flag by hand.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::envs::Envs;

/// The flags every call of a front end passes (its configuration): which
/// policy and rootfs, where the cgroups go, the limits it sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags {
    pub policy: Option<PathBuf>,
    pub rootfs: Option<PathBuf>,
    pub rootfs_name: Option<String>,
    pub cgroup_parent: Option<PathBuf>,
    pub limits: Limits,
}

/// The limit flags, in the CLI's own syntax (`512M`, `0.5`, `unlimited`),
/// checked by `jail` as every door's are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// `--timeout`: seconds.
    pub timeout: Option<Duration>,
    pub memory: Option<String>,
    pub cpus: Option<String>,
    pub pids: Option<String>,
    pub cpu_time: Option<String>,
}

impl Flags {
    /// As command-line arguments (also for `jail session start` and `jail
    /// pool`, which take the same).
    pub fn args(&self) -> Vec<OsString> {
        let mut out = Vec::new();
        let mut flag = |name: &str, value: Option<OsString>| {
            if let Some(v) = value {
                out.push(name.into());
                out.push(v);
            }
        };
        flag("--policy", self.policy.clone().map(Into::into));
        flag("--rootfs", self.rootfs.clone().map(Into::into));
        flag("--rootfs-name", self.rootfs_name.clone().map(Into::into));
        flag("--cgroup-parent", self.cgroup_parent.clone().map(Into::into));
        let l = &self.limits;
        flag("--timeout", l.timeout.map(|t| t.as_secs_f64().to_string().into()));
        flag("--memory", l.memory.clone().map(Into::into));
        flag("--cpus", l.cpus.clone().map(Into::into));
        flag("--pids", l.pids.clone().map(Into::into));
        flag("--cpu-time", l.cpu_time.clone().map(Into::into));
        out
    }
}

/// How `jail run` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--events`: NDJSON events, the result last.
    Events,
    /// `--json`: one result document.
    Json,
}

/// What runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Script {
    /// A script file (relative to `dir` when one is given).
    File(PathBuf),
    /// `-c CODE`.
    Inline(String),
}

/// One `jail run`.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The `jail` binary.
    pub jail: PathBuf,
    pub mode: Mode,
    pub flags: Flags,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub code: Option<PathBuf>,
    pub script: Script,
    /// The script's arguments, after `--`, never read as jail options.
    pub args: Vec<String>,
    /// The wall-clock limit the jail will apply: the client waits that
    /// long plus `bounds::HUNG_GRACE` (run.rs).
    pub wall: Duration,
    /// The working folder (paths in the spec may be relative to it, so
    /// that no command line, readable in /proc, names them).
    pub dir: Option<PathBuf>,
    /// Variables set for `jail` itself (`TMPDIR`: where its folders go).
    pub env: Vec<(OsString, OsString)>,
    /// Variables set for the script (envs.rs): written to the child's
    /// stdin (`--env-fd 0`), never on its command line, which every local
    /// user may read.
    pub envs: Envs,
    /// Variables of ours the jail never gets (the agent's credentials):
    /// named by the caller, which reads its environment at its own edge.
    pub withhold: Vec<OsString>,
    /// Sent to the jail when its parent dies (`PR_SET_PDEATHSIG`).
    pub parent_death: Option<Signal>,
}

impl RunSpec {
    /// A run of `script` with no flags, waited for `wall` (+ the grace).
    pub fn new(jail: impl Into<PathBuf>, mode: Mode, script: Script, wall: Duration) -> RunSpec {
        RunSpec {
            jail: jail.into(),
            mode,
            flags: Flags::default(),
            input: None,
            output: None,
            code: None,
            script,
            args: Vec::new(),
            wall,
            dir: None,
            env: Vec::new(),
            envs: Envs::default(),
            withhold: Vec::new(),
            parent_death: None,
        }
    }
}

/// The arguments of `jail` for `spec` (the program not included).
pub fn argv(spec: &RunSpec) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["run".into()];
    out.push(
        match spec.mode {
            Mode::Events => "--events",
            Mode::Json => "--json",
        }
        .into(),
    );
    out.extend(spec.flags.args());
    env_flag(&mut out, &spec.envs);
    folders(&mut out, [&spec.input, &spec.output, &spec.code]);
    match &spec.script {
        Script::File(path) => out.push(path.into()),
        Script::Inline(code) => {
            out.push("-c".into());
            out.push(code.into());
        }
    }
    if !spec.args.is_empty() {
        out.push("--".into());
        out.extend(spec.args.iter().map(Into::into));
    }
    out
}

/// The process for `spec`: stdin null (or the script's variables),
/// stdout and stderr piped, a process group of its own, the environment
/// policy and parent death signal set. Fails only when no pipe can be made.
pub fn command(spec: &RunSpec) -> io::Result<Command> {
    let place = Place {
        dir: &spec.dir,
        env: &spec.env,
        withhold: &spec.withhold,
        parent_death: spec.parent_death,
    };
    let mut cmd = process(&spec.jail, argv(spec), &place);
    give_envs(&mut cmd, &spec.envs)?;
    Ok(cmd)
}

/// `--env-fd 0` when there are variables to give.
fn env_flag(out: &mut Vec<OsString>, envs: &Envs) {
    if !envs.is_empty() {
        out.push("--env-fd".into());
        out.push("0".into());
    }
}

/// The variables as the child's stdin: a pipe holding their JSON, its
/// write end closed. They fit in the pipe's buffer by construction
/// (`envs::MAX_JSON_BYTES`), so nothing waits for the child to read.
fn give_envs(cmd: &mut Command, envs: &Envs) -> io::Result<()> {
    if envs.is_empty() {
        return Ok(());
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    std::fs::File::from(write).write_all(&envs.to_json())?;
    cmd.stdin(Stdio::from(read));
    Ok(())
}

/// The lifeline's descriptor in a `jail session start` child.
pub(crate) const LIFELINE_FD: RawFd = 3;

/// One `jail session start --json` (session.rs starts it).
#[derive(Debug, Clone)]
pub struct StartSpec {
    /// The `jail` binary.
    pub jail: PathBuf,
    pub flags: Flags,
    /// Flags as the caller's own command line gave them (`jail pool`
    /// passes its own on to each session it starts).
    pub more: Vec<OsString>,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub code: Option<PathBuf>,
    /// The read end of the owner's lifeline: passed as descriptor
    /// [`LIFELINE_FD`] (`--lifeline-fd`); the session ends when every
    /// write end is closed.
    pub lifeline: Option<RawFd>,
    /// Run the policy's `preload` as the session's first, trusted cell
    /// before the handle comes back (`--preload`).
    pub preload: bool,
    /// The working folder (paths in the spec may be relative to it).
    pub dir: Option<PathBuf>,
    /// Variables set for `jail` itself (`XDG_RUNTIME_DIR`: where its handle goes).
    pub env: Vec<(OsString, OsString)>,
    /// Variables set for every cell, given as a run's are.
    pub envs: Envs,
    /// Variables of ours the jail never gets.
    pub withhold: Vec<OsString>,
    /// Sent to `jail session start` when its parent dies.
    pub parent_death: Option<Signal>,
    /// Make the jail as a fork of the template listening at this socket
    /// (`--template`; `jail pool` passes its template's).
    pub template: Option<PathBuf>,
}

impl StartSpec {
    /// A session with no flags.
    pub fn new(jail: impl Into<PathBuf>) -> StartSpec {
        StartSpec {
            jail: jail.into(),
            flags: Flags::default(),
            more: Vec::new(),
            input: None,
            output: None,
            code: None,
            lifeline: None,
            preload: false,
            dir: None,
            env: Vec::new(),
            envs: Envs::default(),
            withhold: Vec::new(),
            parent_death: None,
            template: None,
        }
    }
}

/// The arguments of `jail` for `spec` (the program not included).
pub(crate) fn start_argv(spec: &StartSpec) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["session".into(), "start".into(), "--json".into()];
    if spec.lifeline.is_some() {
        out.push("--lifeline-fd".into());
        out.push(LIFELINE_FD.to_string().into());
    }
    if spec.preload {
        out.push("--preload".into());
    }
    if let Some(socket) = &spec.template {
        out.push("--template".into());
        out.push(socket.into());
    }
    out.extend(spec.flags.args());
    out.extend(spec.more.iter().cloned());
    env_flag(&mut out, &spec.envs);
    folders(&mut out, [&spec.input, &spec.output, &spec.code]);
    out
}

/// The process for `spec`, as [`command`] makes a run's, holding the
/// lifeline at [`LIFELINE_FD`].
pub(crate) fn start_command(spec: &StartSpec) -> io::Result<Command> {
    let place = Place {
        dir: &spec.dir,
        env: &spec.env,
        withhold: &spec.withhold,
        parent_death: spec.parent_death,
    };
    let mut cmd = process(&spec.jail, start_argv(spec), &place);
    if let Some(fd) = spec.lifeline {
        crate::sys::pass_fd_on_exec(&mut cmd, fd, LIFELINE_FD);
    }
    give_envs(&mut cmd, &spec.envs)?;
    Ok(cmd)
}

/// A pool's template (`jail template`, pool/template.rs): the pool's own
/// run options, where it listens, and the pool's lifeline.
#[derive(Debug, Clone)]
pub struct TemplateSpec {
    /// The `jail` binary.
    pub jail: PathBuf,
    /// The pool's run options (policy, rootfs, limits).
    pub more: Vec<OsString>,
    pub socket: PathBuf,
    /// The read end of the owner's lifeline, as a session's.
    pub lifeline: Option<RawFd>,
}

/// The process for `spec`: stdout piped (its `ready` line), stderr piped
/// (its one line when it cannot be made), holding the lifeline at
/// [`LIFELINE_FD`].
pub fn template_command(spec: &TemplateSpec) -> Command {
    let mut args: Vec<OsString> = vec!["template".into(), "--socket".into(), spec.socket.clone().into()];
    if spec.lifeline.is_some() {
        args.push("--lifeline-fd".into());
        args.push(LIFELINE_FD.to_string().into());
    }
    args.extend(spec.more.iter().cloned());
    // No parent-death signal: a pool makes a new template on whichever of
    // its threads needs one, and that signal follows the thread, not the
    // process. The lifeline ends it with the pool, however the pool ends.
    let place = Place { dir: &None, env: &[], withhold: &[], parent_death: None };
    let mut cmd = process(&spec.jail, args, &place);
    if let Some(fd) = spec.lifeline {
        crate::sys::pass_fd_on_exec(&mut cmd, fd, LIFELINE_FD);
    }
    cmd
}

/// One `jail pool` (pool_child.rs speaks to it).
#[derive(Debug, Clone)]
pub struct PoolSpec {
    /// The `jail` binary.
    pub jail: PathBuf,
    /// `--size`: the jails it keeps ready.
    pub size: usize,
    /// Every pooled jail's flags; `limits.timeout` is the longest wall
    /// time a request may ask, `limits.memory` each jail's memory.
    pub flags: Flags,
    /// Flags as the caller's own command line gave them.
    pub more: Vec<OsString>,
    /// Its TMPDIR: its folders and the outputs it delivers.
    pub temp_dir: Option<PathBuf>,
    /// Its XDG_RUNTIME_DIR: its jails' session handles (a short path).
    pub runtime_dir: Option<PathBuf>,
    /// Variables of ours its jails never get.
    pub withhold: Vec<OsString>,
    /// Sent to `jail pool` when its parent dies: SIGKILL is what callers
    /// pass (its jails end with their lifeline, its janitor removes its
    /// folders; SIGTERM would make it wait for its runs).
    pub parent_death: Option<Signal>,
}

impl PoolSpec {
    /// A pool of `size` jails with no flags.
    pub fn new(jail: impl Into<PathBuf>, size: usize) -> PoolSpec {
        PoolSpec {
            jail: jail.into(),
            size,
            flags: Flags::default(),
            more: Vec::new(),
            temp_dir: None,
            runtime_dir: None,
            withhold: Vec::new(),
            parent_death: None,
        }
    }
}

/// The arguments of `jail` for `spec` (the program not included).
pub(crate) fn pool_argv(spec: &PoolSpec) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["pool".into(), "--size".into(), spec.size.to_string().into()];
    out.extend(spec.flags.args());
    out.extend(spec.more.iter().cloned());
    out
}

/// The process for `spec`, as [`command`] makes a run's, its stdin piped:
/// the pool reads its requests there.
pub fn pool_command(spec: &PoolSpec) -> Command {
    let mut env = Vec::new();
    if let Some(dir) = &spec.temp_dir {
        env.push(("TMPDIR".into(), dir.into()));
    }
    if let Some(dir) = &spec.runtime_dir {
        env.push(("XDG_RUNTIME_DIR".into(), dir.into()));
    }
    let place = Place { dir: &None, env: &env, withhold: &spec.withhold, parent_death: spec.parent_death };
    let mut cmd = process(&spec.jail, pool_argv(spec), &place);
    cmd.stdin(Stdio::piped());
    cmd
}

/// Where and with what a `jail` process runs.
struct Place<'a> {
    dir: &'a Option<PathBuf>,
    env: &'a [(OsString, OsString)],
    withhold: &'a [OsString],
    parent_death: Option<Signal>,
}

fn process(jail: &std::path::Path, args: Vec<OsString>, place: &Place<'_>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(jail);
    cmd.args(args);
    if let Some(dir) = place.dir {
        cmd.current_dir(dir);
    }
    for name in place.withhold {
        cmd.env_remove(name);
    }
    for (name, value) in place.env {
        cmd.env(name, value);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.process_group(0);
    if let Some(sig) = place.parent_death {
        // SIGTERM, not SIGKILL, is what a run's or a session's callers
        // pass: the jail kills its tree and removes its cgroup.
        crate::sys::set_parent_death_signal(&mut cmd, sig);
    }
    cmd
}

/// `--input`, `--output`, `--code` for the folders given.
fn folders(out: &mut Vec<OsString>, dirs: [&Option<PathBuf>; 3]) {
    for (name, dir) in ["--input", "--output", "--code"].into_iter().zip(dirs) {
        if let Some(d) = dir {
            out.push(name.into());
            out.push(d.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_becomes_its_flag_and_the_scripts_arguments_follow_a_double_dash() {
        let mut spec = RunSpec::new("jail", Mode::Events, Script::File("main.py".into()), Duration::from_secs(5));
        spec.flags = Flags {
            policy: Some("p.json".into()),
            rootfs: Some("/r".into()),
            rootfs_name: Some("data".into()),
            cgroup_parent: Some("/c".into()),
            limits: Limits {
                timeout: Some(Duration::from_millis(2500)),
                memory: Some("512M".into()),
                cpus: Some("0.5".into()),
                pids: Some("64".into()),
                cpu_time: Some("unlimited".into()),
            },
        };
        spec.input = Some("in".into());
        spec.output = Some("out".into());
        spec.code = Some("code".into());
        spec.args = vec!["--timeout".into(), "x".into()];
        let got: Vec<String> = argv(&spec).iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let want = "run --events --policy p.json --rootfs /r --rootfs-name data --cgroup-parent /c --timeout 2.5 \
                    --memory 512M --cpus 0.5 --pids 64 --cpu-time unlimited --input in --output out --code code \
                    main.py -- --timeout x";
        assert_eq!(got.join(" "), want);
        let mut start = StartSpec::new("jail");
        start.flags.limits.timeout = Some(Duration::from_secs(3));
        start.more = vec!["--no-systemd-delegation".into()];
        start.lifeline = Some(7);
        start.input = Some("in".into());
        let got: Vec<String> = start_argv(&start).iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(got.join(" "), "session start --json --lifeline-fd 3 --timeout 3 --no-systemd-delegation --input in");
        start.envs = Envs::from_pairs(["SECRET=s"]).unwrap();
        let got: Vec<String> = start_argv(&start).iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            got.join(" "),
            "session start --json --lifeline-fd 3 --timeout 3 --no-systemd-delegation --env-fd 0 --input in"
        );
        let judge = RunSpec::new("jail", Mode::Json, Script::Inline("pass".into()), Duration::from_secs(5));
        assert_eq!(argv(&judge), ["run", "--json", "-c", "pass"].map(OsString::from).to_vec());
        let mut pool = PoolSpec::new("jail", 2);
        pool.flags.rootfs = Some("/r".into());
        pool.flags.limits.timeout = Some(Duration::from_secs(30));
        pool.flags.limits.memory = Some("256M".into());
        pool.more = vec!["--no-systemd-delegation".into()];
        let got: Vec<String> = pool_argv(&pool).iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(got.join(" "), "pool --size 2 --rootfs /r --timeout 30 --memory 256M --no-systemd-delegation");
    }
}
