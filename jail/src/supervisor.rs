//! The supervisor side: validate the request, compile the seccomp filter and
//! plan landlock, clone the child into its namespaces, write its id maps,
//! release it, watch it (answering the seccomp refusals it reports) until it
//! exits or its deadline passes, kill the whole tree, and build the result.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::artifacts::{self, TreeDead};
use crate::delivery;
use crate::relay;
use crate::cgroup::{self, CgroupUsage, RunCgroup};
use crate::child::{self, ChildSpec, Confine, Exec};
use crate::limits;
use crate::mounts::{self, RootfsEntry};
use crate::output;
use crate::policy::Network;
use crate::proxy;
use crate::policy::Policy;
use crate::result::{
    Isolation, LandlockReport, LayerStatus, RunResult, SeccompReport, SetupError, Status, Stream,
    Timings, Usage,
};
use crate::rlimits;
use crate::{landlock, namespaces, seccomp};
use crate::sync::{self, Pipe, Report};
use crate::sys::{self, Forked};

/// How the script's stdout and stderr reach the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Captured with byte caps into the result (`--json`).
    Capture,
    /// Copied live to our own stdout and stderr.
    Stream,
}

/// One `jail run`.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub policy: Policy,
    pub script: PathBuf,
    pub args: Vec<String>,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub code: Option<PathBuf>,
    pub rootfs: Option<PathBuf>,
    pub timeout: Option<Duration>,
    pub mode: OutputMode,
}

/// A request that failed before anything was started: what is wrong and how
/// to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{problem}: {fix}")]
pub struct InputError {
    pub problem: String,
    pub fix: String,
}

fn input_error(problem: impl Into<String>, fix: impl Into<String>) -> InputError {
    InputError { problem: problem.into(), fix: fix.into() }
}

/// Who the sandbox is on the host, and what that means for permissions.
struct Identity {
    caller_uid: u32,
    host_uid: u32,
    host_gid: u32,
}

/// Everything prepared before the clone.
struct Prepared {
    mount_request: mounts::Request,
    exec: Exec,
    output_dir: PathBuf,
    rootfs: PathBuf,
    rootfs_id: Option<String>,
    wall_time: Duration,
    /// With `network.mode: allowlist`: how the proxy resolves names.
    resolver: Option<proxy::Resolver>,
}

/// Run one script and return its result. Never panics on bad input: every
/// problem becomes a result with `setup_error`.
pub fn run(req: &RunRequest) -> RunResult {
    let started = Instant::now();
    let started_ns = sync::monotonic_ns();
    let mut stages = BTreeMap::new();
    let policy = &req.policy;
    let caller_uid = nix::unistd::getuid().as_raw();
    let caller_gid = nix::unistd::getgid().as_raw();
    // Held until this function returns, after the whole tree is dead: no
    // other live run gets this host uid (hostuid.rs).
    let host = match crate::hostuid::for_caller(caller_uid, caller_gid, &policy.identity) {
        Ok(h) => h,
        Err(e) => {
            // No uid was taken: report the overflow uid, never one in use.
            let who = Identity { caller_uid, host_uid: 65534, host_gid: 65534 };
            return failed(base_result(policy, &who), "identity", &e.to_string(), causes_of(&e), started);
        }
    };
    let (uid_map, gid_map) = namespaces::plan_id_maps(&policy.identity, &host);
    let who = Identity { caller_uid, host_uid: uid_map.outside, host_gid: gid_map.outside };

    let mut result = base_result(policy, &who);
    // The cgroup comes before the seccomp filter, which refuses more when no
    // cgroup counts the run's memory (limits.rs, `close_uncounted_memory`),
    // and before the clone: the child must be placed in it before it is
    // released (DESIGN.md §6). A required limit nothing here can enforce
    // fails the run now, before anything is made for it.
    let mut resources = setup_resources(policy, req.timeout.unwrap_or(policy.limits.wall_time));
    stages.insert("cgroup".to_string(), ms_since(started));
    result.limits = resources.plan.reports.clone();
    if !resources.plan.refused.is_empty() {
        let message = format!(
            "required limit cannot be enforced on this host: {}; give jail a writable cgroup (see `jail doctor`: run as root, \
             or pass a delegated cgroup with --cgroup-parent or JAIL_CGROUP_PARENT), or set limits.enforcement to best_effort",
            resources.plan.refused.join("; ")
        );
        return failed(result, "limits", &message, vec![], started);
    }
    // Before anything is forked: a policy the kernel cannot honour fails here.
    let confinement = match confine(policy, &resources.plan.refuse_syscalls) {
        Ok(c) => c,
        Err((stage, e)) => return failed(result, stage, &e.to_string(), causes_of(&*e), started),
    };
    report_confinement(&mut result, &confinement);
    result.isolation.degraded.extend(resources.plan.degraded.iter().map(|d| format!("limit {d}")));
    stages.insert("confine".to_string(), ms_since(started));
    let mut prepared = match prepare(req, &who) {
        Ok(p) => p,
        Err(e) => return failed(result, "input", &e.to_string(), vec![], started),
    };
    resources.plan.tmpfs.apply(&mut prepared.mount_request);
    result.isolation.rootfs = prepared.rootfs.display().to_string();
    result.isolation.rootfs_id = prepared.rootfs_id.clone();
    result.output_dir = Some(prepared.output_dir.display().to_string());
    for (path, source) in mounts::still_showing(&mounts::plan(&prepared.mount_request)) {
        result.isolation.degraded.push(format!(
            "/proc/self/mountinfo shows where {} comes from on the host ({}, as its path within its filesystem): \
             a writable folder is a plain bind",
            path.display(),
            source.display()
        ));
    }
    stages.insert("prepare".to_string(), ms_since(started));
    // The state the step's changes are measured against, taken before the
    // clone and so before the child is released.
    let mut before = match artifacts::Before::take(&prepared.output_dir, prepared.mount_request.input.as_deref(), &policy.artifacts) {
        Ok(b) => b,
        Err(e) => {
            if req.output.is_none() && std::fs::remove_dir(&prepared.output_dir).is_ok() {
                result.output_dir = None;
            }
            return failed(result, "artifacts", &e.to_string(), vec![e.cause()], started);
        }
    };
    stages.insert("snapshot".to_string(), ms_since(started));

    let model = Rc::clone(&confinement.model);
    let launched = launch(req, &prepared, &mut before, &resources, confinement, uid_map, gid_map, &mut stages, started, started_ns);
    // The tree is dead (PID 1 reaped): read what it used, then remove the
    // cgroup. A failed launch leaves it to RunCgroup's drop.
    let cgroup_usage = resources.cgroup.as_ref().map(RunCgroup::usage);
    if let Some(cg) = resources.cgroup.take() {
        if let Err(e) = cg.remove() {
            eprintln!("jail: the run cgroup was not removed: {e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default());
        }
    }
    let result = match launched {
        Ok(mut outcome) => {
            let dead = outcome.tree_dead;
            let tmpfs = outcome.output.take();
            let (deadline, ids) = (outcome.deadline, outcome.ids);
            let mut result = finish(result, outcome, cgroup_usage, &resources.plan, started, stages, &model);
            let dir = match &tmpfs {
                Some((fd, inventory)) => {
                    let limit = prepared.mount_request.output_size.unwrap_or(u64::MAX);
                    delivery::OutputDir::Mirrored { tmpfs: fd, inventory, limit }
                }
                None => delivery::OutputDir::Bound,
            };
            collect_artifacts(&mut result, &prepared.output_dir, dir, &before, policy, ids, deadline, dead, started);
            result
        }
        Err(e) => {
            let causes = causes_of(&e);
            failed(result, e.stage(), &e.to_string(), causes, started)
        }
    };
    let mut result = result;
    result.supervisor.max_rss_bytes = sys::self_max_rss_bytes();
    if result.status == Status::SetupFailed && req.output.is_none() {
        // The run never started: the output dir we made for it would only be
        // litter. remove_dir refuses if anything is in it.
        if std::fs::remove_dir(&prepared.output_dir).is_ok() {
            result.output_dir = None;
            return result;
        }
    }
    result
}

fn causes_of(e: &dyn std::error::Error) -> Vec<String> {
    let mut causes = Vec::new();
    let mut src = e.source();
    while let Some(s) = src {
        causes.push(s.to_string());
        src = s.source();
    }
    causes
}

/// The seccomp program, the model it was compiled from (the policy's, or
/// that with `refuse` added), and the landlock plan for this run.
struct Confinement {
    filter: seccomp::Filter,
    model: Rc<seccomp::Model>,
    landlock: landlock::Plan,
}

fn confine(policy: &Policy, refuse: &[&str]) -> Result<Confinement, (&'static str, Box<dyn std::error::Error>)> {
    confine_in(policy, seccomp::host_mode(), refuse)
}

fn confine_in(
    policy: &Policy,
    mode: seccomp::Mode,
    refuse: &[&str],
) -> Result<Confinement, (&'static str, Box<dyn std::error::Error>)> {
    if matches!(policy.network, Network::Allowlist(_)) && mode == seccomp::Mode::ErrnoOnly {
        // Its TCP sockets are let through by the supervisor answering
        // seccomp notifications; without them the filter would either
        // refuse them all or have to allow UDP too.
        return Err((
            "seccomp",
            "network.mode allowlist needs seccomp user notification, which this kernel lacks (Linux 5.5 or later has it); \
             use network.mode none on this host"
                .into(),
        ));
    }
    let model = match refuse {
        [] => policy.seccomp.clone(),
        names => policy.seccomp.with_refused(names, limits::UNCOUNTED_MEMORY_WHY),
    };
    let filter = seccomp::cache::compile(&model, mode).map_err(|e| ("seccomp", e.into()))?;
    let landlock = landlock::plan(landlock::kernel_abi(), &policy.landlock).map_err(|e| ("landlock", e.into()))?;
    Ok(Confinement { filter, model: Rc::new(model), landlock })
}

fn report_confinement(result: &mut RunResult, c: &Confinement) {
    let counted = c.filter.mode == seccomp::Mode::Notify;
    result.isolation.seccomp = SeccompReport {
        status: LayerStatus::Enforced,
        default_action: match c.model.default {
            seccomp::Action::Errno { errno, .. } => {
                format!("errno {}", seccomp::model::errno_name(errno).unwrap_or("?"))
            }
            seccomp::Action::Allow => "allow".into(),
            seccomp::Action::KillProcess => "kill_process".into(),
        },
        rules: c.model.rules.len(),
        instructions: c.filter.program.len(),
        filter_sha256: c.filter.sha256.clone(),
        denials_counted: counted,
        denials_truncated: false,
        calls_past_cap: 0,
        detail: (!counted).then(|| "refusals are not counted: this kernel has no seccomp user notification".into()),
    };
    result.isolation.landlock = c.landlock.report();
    result.isolation.degraded.extend(c.landlock.degraded());
}

fn base_result(policy: &Policy, who: &Identity) -> RunResult {
    let mut r = RunResult::setup_failed(SetupError { stage: String::new(), message: String::new(), causes: vec![] });
    r.setup_error = None;
    r.network = proxy::report_without_proxy(policy.network.mode());
    r.isolation = Isolation {
        policy: policy.name.clone(),
        policy_hash: policy.hash.clone(),
        rootfs: String::new(),
        rootfs_id: None,
        namespaces: namespaces::NAMES.iter().map(|s| s.to_string()).collect(),
        uid: policy.identity.uid,
        gid: policy.identity.gid,
        host_uid: who.host_uid,
        host_gid: who.host_gid,
        capabilities: vec![],
        no_new_privs: true,
        // Filled in by report_confinement once the layers are planned.
        landlock: LandlockReport { mode: policy.landlock.enforcement.as_str().into(), ..LandlockReport::default() },
        seccomp: SeccompReport::default(),
        degraded: vec![],
    };
    r
}

fn failed(mut result: RunResult, stage: &str, message: &str, causes: Vec<String>, started: Instant) -> RunResult {
    result.status = Status::SetupFailed;
    result.setup_error = Some(SetupError { stage: stage.into(), message: message.into(), causes });
    result.timings.total_ms = ms_since(started);
    result
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// The run's cgroup, when this host gives one, and what enforces each limit.
struct Resources {
    cgroup: Option<RunCgroup>,
    plan: limits::Plan,
}

/// Choose the cgroup backend, sweep what killed jails left there, create
/// the run cgroup with its limits, and plan the rest. A cgroup that cannot
/// be created leaves the run to rlimits, with the reason in the result.
fn setup_resources(policy: &Policy, wall: Duration) -> Resources {
    let l = &policy.limits;
    let wanted = cgroup::Settings { memory: l.memory, cpus: l.cpus, pids: l.pids, cpu_time: l.cpu_time.is_some() };
    let (_, choice) = cgroup::choose_here(l.cgroup_parent.as_deref(), &wanted);
    let mut why_not = choice.notes.join("; ");
    if let Some(candidate) = &choice.candidate {
        cgroup::sweep(candidate);
        let plan = limits::plan(policy, wall, Some(candidate), "", &rlimits::current_hard);
        match RunCgroup::create(candidate, &cgroup::run_name(), &plan.settings) {
            Ok(cg) => return Resources { cgroup: Some(cg), plan },
            Err(e) => {
                let cause = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
                why_not = format!("creating the run cgroup failed: {e}{cause}");
            }
        }
    }
    Resources { cgroup: None, plan: limits::plan(policy, wall, None, &why_not, &rlimits::current_hard) }
}

// ------------------------------------------------------------------ prepare

/// Check every path the user gave and resolve what the child will need.
fn prepare(req: &RunRequest, who: &Identity) -> Result<Prepared, InputError> {
    let policy = &req.policy;
    let rootfs = resolve_rootfs(req)?;
    let python_host = rootfs.join(policy.python.strip_prefix("/").unwrap_or(&policy.python));
    if !python_host.exists() {
        return Err(input_error(
            format!("the rootfs {} has no interpreter at {}", rootfs.display(), policy.python.display()),
            "rebuild it with `make rootfs`, or set `python` in the policy",
        ));
    }
    let rootfs_entries = list_rootfs(&rootfs)?;
    let rootfs_id = rootfs_identity(&rootfs)?;

    let (code, script_rel) = resolve_script(&req.script, req.code.as_deref())?;
    if let mounts::Code::Dir(dir) = &code {
        check_readable(dir, "code dir", who)?;
    }
    let input = match &req.input {
        Some(dir) => {
            let d = existing_dir(dir, "input dir", "--input")?;
            check_readable(&d, "input dir", who)?;
            Some(d)
        }
        None => None,
    };
    let output_dir = match &req.output {
        Some(dir) => {
            let d = existing_dir(dir, "output dir", "--output")?;
            check_writable(&d, who, policy.filesystem.output_size)?;
            d
        }
        None => fresh_output_dir(who, policy.filesystem.output_size)?,
    };

    let wall_time = req.timeout.unwrap_or(policy.limits.wall_time);
    let script_in_jail = Path::new(mounts::CODE_DIR).join(&script_rel);
    let umask = crate::hostuid::sandbox_umask(who.caller_uid == 0, policy.filesystem.output_size.is_none());
    let exec = build_exec(policy, &script_in_jail, &req.args, req.mode, umask)?;
    let resolver = match &policy.network {
        Network::None => None,
        Network::Allowlist(_) => Some(proxy::Resolver::from_env().map_err(|e| {
            input_error(e.to_string(), format!("write {}=name=address,... or unset it", proxy::TEST_RESOLVE_VAR))
        })?),
    };
    Ok(Prepared {
        mount_request: mounts::Request {
            rootfs: rootfs.clone(),
            rootfs_entries,
            input,
            code,
            output: output_dir.clone(),
            tmp_size: policy.filesystem.tmp_size,
            shm_size: policy.filesystem.shm_size,
            output_size: policy.filesystem.output_size,
        },
        exec,
        output_dir,
        rootfs,
        rootfs_id,
        wall_time,
        resolver,
    })
}

/// The sha256 of the rootfs's manifest, for `isolation.rootfs_id`; `None`
/// for a rootfs without one.
fn rootfs_identity(rootfs: &Path) -> Result<Option<String>, InputError> {
    match crate::rootfs::read_manifest_bytes(rootfs) {
        Ok(bytes) => Ok(bytes.as_deref().map(crate::rootfs::identity)),
        Err(e) => {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
            Err(input_error(format!("{e}{cause}"), "rebuild the rootfs (`make rootfs` or `make rootfs-data`)"))
        }
    }
}

fn resolve_rootfs(req: &RunRequest) -> Result<PathBuf, InputError> {
    let from_env = std::env::var_os("JAIL_ROOTFS").filter(|v| !v.is_empty()).map(PathBuf::from);
    let Some(rootfs) = req.rootfs.clone().or(from_env).or_else(|| req.policy.rootfs.clone()) else {
        return Err(input_error(
            "no rootfs given",
            "pass --rootfs DIR, set JAIL_ROOTFS, or set `rootfs` in the policy",
        ));
    };
    match std::fs::canonicalize(&rootfs) {
        Ok(p) if p.is_dir() => Ok(p),
        _ => Err(input_error(
            format!("rootfs {} not found", rootfs.display()),
            "build it with `make rootfs` (or pass --rootfs DIR)",
        )),
    }
}

fn list_rootfs(rootfs: &Path) -> Result<Vec<RootfsEntry>, InputError> {
    let read = std::fs::read_dir(rootfs).map_err(|e| {
        input_error(format!("cannot list rootfs {}: {e}", rootfs.display()), "check its permissions or rebuild it with `make rootfs`")
    })?;
    let mut entries = Vec::new();
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if mounts::RESERVED_TOP_LEVEL.contains(&name.as_str()) || name.starts_with('.') {
            continue;
        }
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_symlink() {
            if let Ok(target) = std::fs::read_link(entry.path()) {
                entries.push(RootfsEntry::Symlink(name, target));
            }
        } else if ft.is_dir() {
            entries.push(RootfsEntry::Dir(name));
        }
    }
    entries.sort_by(|a, b| entry_name(a).cmp(entry_name(b)));
    Ok(entries)
}

fn entry_name(e: &RootfsEntry) -> &str {
    match e {
        RootfsEntry::Dir(n) | RootfsEntry::Symlink(n, _) => n,
    }
}

/// What `/workspace/code` holds (the script alone, or the `--code` folder)
/// and the script's path relative to it.
fn resolve_script(script: &Path, code: Option<&Path>) -> Result<(mounts::Code, PathBuf), InputError> {
    let code_dir = match code {
        Some(dir) => Some(existing_dir(dir, "code dir", "--code")?),
        None => None,
    };
    let candidate = match (&code_dir, script.is_relative() && !script.exists()) {
        (Some(dir), true) => dir.join(script),
        _ => script.to_path_buf(),
    };
    let meta = std::fs::metadata(&candidate).map_err(|e| {
        input_error(format!("script {} cannot be read: {e}", script.display()), "check the path; it must be a Python file")
    })?;
    if !meta.is_file() {
        return Err(input_error(format!("script {} is not a regular file", script.display()), "pass the path of a Python file"));
    }
    std::fs::File::open(&candidate).map_err(|e| {
        input_error(format!("script {} cannot be read: {e}", script.display()), "make it readable (chmod a+r)")
    })?;
    let full = std::fs::canonicalize(&candidate)
        .map_err(|e| input_error(format!("script {}: {e}", script.display()), "check the path"))?;
    let Some(code_dir) = code_dir else {
        // Only the script is granted: its folder may hold anything (~/.ssh
        // beside ~/analysis.py), and none of that is the script's business.
        if meta.len() > mounts::MAX_SCRIPT_BYTES {
            return Err(input_error(
                format!("script {} is {} bytes, over {} MiB", script.display(), meta.len(), mounts::MAX_SCRIPT_BYTES >> 20),
                "pass its folder with --code DIR",
            ));
        }
        let name = PathBuf::from(full.file_name().unwrap_or(full.as_os_str()));
        return Ok((mounts::Code::Script { file: full, name: name.clone() }, name));
    };
    let rel = full.strip_prefix(&code_dir).map_err(|_| {
        input_error(
            format!("script {} is not inside the code dir {}", full.display(), code_dir.display()),
            "put the script inside --code DIR, or leave --code out",
        )
    })?;
    Ok((mounts::Code::Dir(code_dir), rel.to_path_buf()))
}

/// An existing directory that is not a symlink, canonicalized.
fn existing_dir(dir: &Path, what: &str, flag: &str) -> Result<PathBuf, InputError> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| {
        input_error(format!("{what} {} cannot be used: {e}", dir.display()), format!("create it, or pass an existing folder to {flag}"))
    })?;
    if meta.file_type().is_symlink() {
        return Err(input_error(
            format!("{what} {} is a symlink", dir.display()),
            format!("pass the real folder to {flag}, not a link to it"),
        ));
    }
    if !meta.is_dir() {
        return Err(input_error(format!("{what} {} is not a directory", dir.display()), format!("pass a folder to {flag}")));
    }
    std::fs::canonicalize(dir).map_err(|e| input_error(format!("{what} {}: {e}", dir.display()), "check the path"))
}

#[derive(Clone, Copy)]
enum Want {
    Read,
    Write,
}

/// Whether `host_uid`/`host_gid` may read (r-x) or write (-wx) a folder, from
/// its mode bits alone: the sandbox has no capabilities and no supplementary
/// groups it could use instead.
fn mode_allows(meta: &std::fs::Metadata, uid: u32, gid: u32, want: Want) -> bool {
    let mode = meta.permissions().mode();
    let bits = match want {
        Want::Read => 0o5,
        Want::Write => 0o3,
    };
    let shift = if meta.uid() == uid {
        6
    } else if meta.gid() == gid {
        3
    } else {
        0
    };
    (mode >> shift) & bits == bits
}

fn check_readable(dir: &Path, what: &str, who: &Identity) -> Result<(), InputError> {
    if who.caller_uid != 0 {
        if nix::unistd::access(dir, nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::X_OK).is_err() {
            return Err(input_error(format!("{what} {} is not readable", dir.display()), "make it readable (chmod u+rx)"));
        }
        return Ok(());
    }
    let meta = std::fs::metadata(dir).map_err(|e| input_error(format!("{what} {}: {e}", dir.display()), "check the path"))?;
    if !mode_allows(&meta, who.host_uid, who.host_gid, Want::Read) {
        return Err(input_error(
            format!("{what} {} is not readable by the sandbox (host uid {}, used when jail runs as root)", dir.display(), who.host_uid),
            format!("chmod o+rx {}, or run jail as an ordinary user", dir.display()),
        ));
    }
    Ok(())
}

/// `output_size`: `None` when the folder is bound into the jail (the script
/// writes it as its host uid), else the copy writes it as the caller.
fn check_writable(dir: &Path, who: &Identity, output_size: Option<u64>) -> Result<(), InputError> {
    if who.caller_uid == 0 && output_size.is_some() {
        // Mirrored: the copy works on the folder as root without
        // capabilities, by its mode bits (fsid.rs).
        return match crate::fsid::host_may_write(dir) {
            Ok(true) => Ok(()),
            Ok(false) => Err(input_error(
                format!(
                    "output dir {} is not writable by root through its mode bits (jail copies to it as root without capabilities)",
                    dir.display()
                ),
                format!("chown root {d} && chmod u+rwx {d}, or run jail as the folder's owner", d = dir.display()),
            )),
            Err(e) => Err(input_error(format!("output dir {}: {e}", dir.display()), "check the path")),
        };
    }
    if who.caller_uid != 0 {
        if nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK).is_err() {
            return Err(input_error(format!("output dir {} is not writable", dir.display()), "make it writable (chmod u+rwx)"));
        }
        return Ok(());
    }
    let meta = std::fs::metadata(dir).map_err(|e| input_error(format!("output dir {}: {e}", dir.display()), "check the path"))?;
    if !mode_allows(&meta, who.host_uid, who.host_gid, Want::Write) {
        return Err(input_error(
            format!(
                "output dir {} is not writable by the sandbox (host uid {}, used when jail runs as root)",
                dir.display(),
                who.host_uid
            ),
            // The uid differs between concurrent runs; the gid is shared.
            format!("chgrp {} {d} && chmod g+rwx {d}, or run jail as an ordinary user", who.host_gid, d = dir.display()),
        ));
    }
    Ok(())
}

/// A new, empty output dir under the temp dir: the caller's, or, bound into
/// the jail (`output_size` `None`), the sandbox's.
fn fresh_output_dir(who: &Identity, output_size: Option<u64>) -> Result<PathBuf, InputError> {
    let dir = tempfile::Builder::new()
        .prefix("jail-output-")
        .tempdir()
        .map_err(|e| input_error(format!("cannot create an output dir: {e}"), "pass --output DIR, or check TMPDIR"))?
        .keep();
    if who.caller_uid == 0 && output_size.is_none() {
        std::os::unix::fs::chown(&dir, Some(who.host_uid), Some(who.host_gid)).map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            input_error(format!("cannot hand {} to the sandbox uid: {e}", dir.display()), "pass --output DIR")
        })?;
    }
    Ok(dir)
}

/// Variables that size the thread pools of OpenMP, OpenBLAS, MKL, numexpr
/// and Accelerate.
pub const THREAD_POOL_VARS: [&str; 5] =
    ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"];

/// The interpreter's argv and its environment, rebuilt from the policy.
fn build_exec(policy: &Policy, script: &Path, args: &[String], mode: OutputMode, umask: u32) -> Result<Exec, InputError> {
    let cstr = |s: &[u8], what: &str| {
        CString::new(s).map_err(|_| input_error(format!("{what} contains a NUL byte"), "remove it"))
    };
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
    ] {
        env.insert(k.into(), v.into());
    }
    for (k, v) in &policy.environment.set {
        env.insert(k.clone(), v.clone());
    }
    for k in &policy.environment.pass {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.clone(), v);
        }
    }
    // Thread pools follow the CPU limit: a BLAS or OpenMP pool sized to the
    // host's cores under a one-core quota only thrashes. A value the policy
    // sets itself wins.
    if let Some(cpus) = policy.limits.cpus {
        let n = (cpus.ceil() as u64).max(1).to_string();
        for var in THREAD_POOL_VARS {
            env.entry(var.to_string()).or_insert_with(|| n.clone());
        }
    }
    if let Network::Allowlist(_) = policy.network {
        // After the policy's own values: the proxy is the only way out, and
        // a policy cannot point the script anywhere else.
        env.extend(crate::network::proxy_env());
    }
    if mode == OutputMode::Stream {
        // Streaming is only live if Python does not hold output in its buffers.
        env.insert("PYTHONUNBUFFERED".into(), "1".into());
    }
    let envp = env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}").as_bytes(), "an environment value"))
        .collect::<Result<Vec<_>, _>>()?;
    let path = cstr(policy.python.as_os_str().as_bytes(), "the python path")?;
    let mut argv = vec![path.clone(), cstr(script.as_os_str().as_bytes(), "the script path")?];
    for a in args {
        argv.push(cstr(a.as_bytes(), "an argument")?);
    }
    Ok(Exec { path, argv, envp, cwd: PathBuf::from(mounts::OUTPUT_DIR), umask })
}

// ------------------------------------------------------------------- launch

#[derive(Debug, thiserror::Error)]
enum LaunchError {
    #[error("create pipes")]
    Pipes(#[source] io::Error),
    #[error("drop supplementary groups before clone")]
    DropGroups(#[source] nix::Error),
    #[error("clone into new namespaces")]
    Clone(#[source] io::Error),
    #[error("write id maps")]
    IdMaps(#[source] namespaces::NamespaceError),
    #[error("place the child in the run cgroup")]
    JoinCgroup(#[source] cgroup::CgroupError),
    #[error("fill the jail's output dir")]
    Output(#[source] output::OutputError),
    #[error("start the network proxy")]
    Proxy(#[source] proxy::ProxyError),
    #[error("release the child")]
    Release(#[source] io::Error),
    #[error("pidfd_open")]
    Pidfd(#[source] io::Error),
    #[error("wait for the jail")]
    Wait(#[source] io::Error),
}

impl LaunchError {
    fn stage(&self) -> &'static str {
        match self {
            LaunchError::Pipes(_) => "pipes",
            LaunchError::DropGroups(_) | LaunchError::Clone(_) => "clone",
            LaunchError::IdMaps(_) => "id_maps",
            LaunchError::JoinCgroup(_) => "cgroup",
            LaunchError::Output(_) => "output",
            LaunchError::Proxy(_) => "network",
            LaunchError::Release(_) => "release",
            LaunchError::Pidfd(_) | LaunchError::Wait(_) => "wait",
        }
    }
}

/// What the watch loop saw.
struct Outcome {
    reports: Vec<Report>,
    tally: seccomp::Tally,
    stdout: Capture,
    stderr: Capture,
    ending: Ending,
    deadline: Instant,
    exec_at: Option<Instant>,
    released_at: Instant,
    ended_at: Instant,
    rusage: libc::rusage,
    pid1_status: libc::c_int,
    started_ns: u64,
    /// The jail's output tmpfs and what was copied into it, to be judged and
    /// mirrored (delivery.rs); `None` with a bound output dir.
    output: Option<(OwnedFd, output::Inventory)>,
    ids: output::FsIds,
    tree_dead: TreeDead,
    network: Option<crate::result::NetworkReport>,
}

#[allow(clippy::too_many_arguments)]
fn launch(
    req: &RunRequest,
    prepared: &Prepared,
    before: &mut artifacts::Before,
    resources: &Resources,
    confinement: Confinement,
    uid_map: namespaces::IdMap,
    gid_map: namespaces::IdMap,
    stages: &mut BTreeMap<String, f64>,
    started: Instant,
    started_ns: u64,
) -> Result<Outcome, LaunchError> {
    // The model the filter was compiled from: the supervisor answers the
    // refusals it reports by it.
    let model = Rc::clone(&confinement.model);
    let release = Pipe::new().map_err(LaunchError::Pipes)?;
    let report = Pipe::new().map_err(LaunchError::Pipes)?;
    let status = Pipe::new().map_err(LaunchError::Pipes)?;
    let out = Pipe::new().map_err(LaunchError::Pipes)?;
    let err = Pipe::new().map_err(LaunchError::Pipes)?;
    // A size-capped output dir comes back to us as a descriptor (output.rs).
    let output_channel = match prepared.mount_request.output_size {
        Some(_) => Some(
            nix::sys::socket::socketpair(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::SeqPacket,
                None,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            )
            .map_err(|e| LaunchError::Pipes(e.into()))?,
        ),
        None => None,
    };
    let (output_ours, output_theirs) = match output_channel {
        Some((a, b)) => (Some(a), Some(b)),
        None => (None, None),
    };
    // The worker sends the seccomp notification listener over this.
    let (notify_ours, notify_theirs) = match confinement.filter.mode {
        seccomp::Mode::Notify => {
            let (a, b) = sys::seqpacket_pair().map_err(LaunchError::Pipes)?;
            (Some(a), Some(b))
        }
        seccomp::Mode::ErrnoOnly => (None, None),
    };
    // With the allowlist, PID 1 hands us the proxy's listener (network.rs).
    let (proxy_ours, proxy_theirs) = match (&req.policy.network, &prepared.resolver) {
        (Network::Allowlist(rules), Some(resolver)) => {
            let (a, b) = nix::sys::socket::socketpair(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::SeqPacket,
                None,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            )
            .map_err(|e| LaunchError::Pipes(e.into()))?;
            (Some((a, rules.clone(), resolver.clone())), Some(b))
        }
        _ => (None, None),
    };
    if nix::unistd::getuid().is_root() {
        // The child can never call setgroups (it is denied in its user
        // namespace), so root's supplementary groups must go before the clone.
        nix::unistd::setgroups(&[]).map_err(LaunchError::DropGroups)?;
    }
    // How the child enters the run cgroup: born in it (v2), or moving
    // itself (v1) before it runs anything else (cgroup.rs, `entry`).
    let (clone_into, self_join) = match resources.cgroup.as_ref().map(RunCgroup::entry).transpose() {
        Ok(Some(cgroup::Entry::CloneInto(dir))) => (Some(dir), Vec::new()),
        Ok(Some(cgroup::Entry::SelfJoin(tasks))) => (None, tasks),
        Ok(None) => (None, Vec::new()),
        Err(e) => return Err(LaunchError::JoinCgroup(e)),
    };
    let self_joins = !self_join.is_empty();
    let mount_ops = mounts::plan(&prepared.mount_request);
    let landlock_rules = landlock::rules(&mount_ops);
    let spec = ChildSpec {
        release: release.read,
        report: report.write,
        status: status.write,
        stdout: out.write,
        stderr: err.write,
        mounts: mount_ops,
        // A private tmpfs over /tmp, in the child's own mount namespace only.
        staging: PathBuf::from("/tmp"),
        uid: req.policy.identity.uid,
        gid: req.policy.identity.gid,
        hostname: req.policy.identity.hostname.clone(),
        exec: Exec {
            path: prepared.exec.path.clone(),
            argv: prepared.exec.argv.clone(),
            envp: prepared.exec.envp.clone(),
            cwd: prepared.exec.cwd.clone(),
            umask: prepared.exec.umask,
        },
        rlimits: resources.plan.rlimits.clone(),
        output: output_theirs,
        confine: Confine {
            landlock: confinement.landlock,
            landlock_rules,
            seccomp: confinement.filter,
            notify: notify_theirs,
            tcp_connect: match req.policy.network {
                Network::Allowlist(_) => vec![crate::network::PROXY_PORT],
                _ => vec![],
            },
        },
        proxy: proxy_theirs,
        cgroup_tasks: self_join,
    };
    stages.insert("plan".into(), ms_since(started));
    let born_in_cgroup = match &clone_into {
        Some(dir) => sys::clone_into_cgroup(namespaces::CLONE_FLAGS, dir.as_fd()).map_err(LaunchError::Clone)?,
        None => None,
    };
    let joined = born_in_cgroup.is_some() || self_joins;
    let forked = match born_in_cgroup {
        Some(f) => f,
        None => sys::clone_process(namespaces::CLONE_FLAGS).map_err(LaunchError::Clone)?,
    };
    let pid = match forked {
        Forked::Child => child::run(spec),
        Forked::Parent(pid) => pid,
    };
    // Our copies of the child's ends must close, or we would never see EOF.
    drop(spec);
    drop(clone_into);
    stages.insert("clone".into(), ms_since(started));
    let kill_and_reap = |pid: Pid| {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        let _ = sys::wait4(pid);
    };
    if let Err(e) = namespaces::write_id_maps(pid, uid_map, gid_map) {
        kill_and_reap(pid);
        return Err(LaunchError::IdMaps(e));
    }
    stages.insert("id_maps".into(), ms_since(started));
    if let (Some(cg), false) = (&resources.cgroup, joined) {
        // The slow way, on a kernel without CLONE_INTO_CGROUP; before the
        // release, so none of the child's code runs outside.
        if let Err(e) = cg.join(pid.as_raw() as u32) {
            kill_and_reap(pid);
            return Err(LaunchError::JoinCgroup(e));
        }
        stages.insert("cgroup_join".into(), ms_since(started));
    }
    let pidfd = match sys::pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) => {
            kill_and_reap(pid);
            return Err(LaunchError::Pidfd(e));
        }
    };
    if let Err(e) = sync::release(release.write) {
        kill_and_reap(pid);
        return Err(LaunchError::Release(e));
    }
    let released_at = Instant::now();
    let ids = output::FsIds { uid: uid_map.outside, gid: gid_map.outside };
    let output = match output_ours {
        None => None,
        Some(sock) => match fill_output(sock, &prepared.output_dir, ids, released_at + prepared.wall_time) {
            Ok(o) => {
                if let Some((dir, _)) = &o {
                    // Changes are judged where the script makes them: on the
                    // tmpfs, as it is before the script is let go.
                    before.retake_output_at(dir, &req.policy.artifacts);
                }
                o
            }
            Err(e) => {
                kill_and_reap(pid);
                return Err(e);
            }
        },
    };
    if output.is_some() {
        stages.insert("output_copy_in".into(), ms_since(started));
    }
    // Threads may start now: the clone, which needs a single-threaded
    // process, is behind us.
    let proxy = match proxy_ours {
        None => None,
        Some((sock, rules, resolver)) => match receive_listener(sock, released_at + prepared.wall_time) {
            Ok(None) => None,
            Ok(Some(listener)) => match proxy::start(listener, rules, resolver) {
                Ok(p) => Some(p),
                Err(e) => {
                    kill_and_reap(pid);
                    return Err(LaunchError::Proxy(e));
                }
            },
            Err(e) => {
                kill_and_reap(pid);
                return Err(e);
            }
        },
    };
    if proxy.is_some() {
        stages.insert("proxy".into(), ms_since(started));
    }
    let deadline = Instant::now() + prepared.wall_time;
    let mut watch = Watch {
        stdout: Capture::new(req.policy.limits.stdout_bytes, req.mode, Target::Stdout),
        stderr: Capture::new(req.policy.limits.stderr_bytes, req.mode, Target::Stderr),
        report_buf: Vec::new(),
        status_buf: Vec::new(),
        exec_at: None,
        notify: notify_ours,
        listener: None,
        listener_rest: None,
        tally: match req.policy.network {
            Network::Allowlist(_) => seccomp::Tally::new().tcp_only(),
            Network::None => seccomp::Tally::new(),
        },
        model: &model,
    };
    let limits = Deadlines {
        wall: deadline,
        cpu: match (&resources.cgroup, resources.plan.cpu_watch) {
            (Some(cg), Some(limit)) => Some((cg, limit.as_nanos() as u64)),
            _ => None,
        },
    };
    let ending = watch.run(pid, &pidfd, out.read, err.read, report.read, status.read, &limits, resources.cgroup.as_ref());
    // Streaming: the caller gets until the deadline to take what is queued,
    // never longer (a reader that stopped reading cannot hold the run).
    watch.stdout.end(deadline);
    watch.stderr.end(deadline);
    let (pid1_status, rusage) = sys::wait4(pid).map_err(LaunchError::Wait)?;
    let ended_at = Instant::now();
    stages.insert("reaped".into(), ms_since(started));
    // The tree is dead: every client socket is closed, so every relay ends.
    let network = proxy.map(proxy::Proxy::finish);
    // PID 1 is reaped only once its pid namespace is empty: nothing can
    // change the output tmpfs under the mirror now, nor the output dir
    // under the artifact walk.
    let tree_dead = TreeDead::after_reaping_pid1();
    let mut reports = sync::parse_reports(&watch.report_buf);
    reports.extend(sync::parse_reports(&watch.status_buf));
    Ok(Outcome {
        reports,
        tally: watch.tally,
        stdout: watch.stdout,
        stderr: watch.stderr,
        ending,
        deadline,
        exec_at: watch.exec_at,
        released_at,
        ended_at,
        rusage,
        pid1_status,
        started_ns,
        output,
        ids,
        tree_dead,
        network,
    })
}

/// Take the output tmpfs from the child, copy the host output folder into
/// it, and let the child go on. `None` when the child ended before handing
/// it over (its report says why).
fn fill_output(
    sock: OwnedFd,
    host: &Path,
    ids: output::FsIds,
    deadline: Instant,
) -> Result<Option<(OwnedFd, output::Inventory)>, LaunchError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as u64).unwrap_or(PollTimeout::MAX);
    if !matches!(poll(&mut fds, timeout), Ok(n) if n > 0) {
        return Ok(None);
    }
    let Some(dir) = sys::recv_fd(sock.as_fd()).map_err(LaunchError::Release)? else { return Ok(None) };
    let inventory = output::copy_in(host, &dir, ids).map_err(LaunchError::Output)?;
    sync::release(sock).map_err(LaunchError::Release)?;
    Ok(Some((dir, inventory)))
}

/// The proxy listener from PID 1; `None` when PID 1 ended before sending
/// it (its report says why).
fn receive_listener(sock: OwnedFd, deadline: Instant) -> Result<Option<OwnedFd>, LaunchError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as u64).unwrap_or(PollTimeout::MAX);
    if !matches!(poll(&mut fds, timeout), Ok(n) if n > 0) {
        return Ok(None);
    }
    sys::recv_fd(sock.as_fd()).map_err(LaunchError::Release)
}

struct Watch<'m> {
    stdout: Capture,
    stderr: Capture,
    report_buf: Vec<u8>,
    status_buf: Vec<u8>,
    exec_at: Option<Instant>,
    /// Our end of the socketpair the seccomp listener arrives on.
    notify: Option<OwnedFd>,
    /// The seccomp user-notification listener, once the worker sent it.
    listener: Option<OwnedFd>,
    /// Not to be read again before this (seccomp::Next::After).
    listener_rest: Option<Instant>,
    tally: seccomp::Tally,
    model: &'m seccomp::Model,
}

/// How the watch loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// PID 1 exited by itself.
    Exited,
    /// The wall-clock deadline passed and the tree was killed.
    WallTimeout,
    /// The run cgroup's CPU usage reached the limit and the tree was killed.
    CpuTimeout,
}

/// What the watch loop enforces besides the pipes.
struct Deadlines<'a> {
    wall: Instant,
    /// The run cgroup and its CPU-time limit in nanoseconds.
    cpu: Option<(&'a RunCgroup, u64)>,
}


/// Poll slots beyond the four pipes.
const SLOT_PIDFD: usize = 4;
const SLOT_NOTIFY: usize = 5;
const SLOT_LISTENER: usize = 6;
/// The caller's stdout and stderr, polled for POLLOUT while a relay has bytes.
const SLOT_RELAY_OUT: usize = 7;
const SLOT_RELAY_ERR: usize = 8;

impl Watch<'_> {
    /// Poll every pipe and the child's pidfd until the child is gone and the
    /// pipes are drained; kill the whole tree at the wall deadline, or once
    /// the run's CPU time (checked every `limits::CPU_POLL`) reaches its
    /// limit.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        pid: Pid,
        pidfd: &OwnedFd,
        out: OwnedFd,
        err: OwnedFd,
        report: OwnedFd,
        status: OwnedFd,
        limits: &Deadlines<'_>,
        cgroup: Option<&RunCgroup>,
    ) -> Ending {
        let mut open: [Option<OwnedFd>; 4] = [Some(out), Some(err), Some(report), Some(status)];
        let mut exited = false;
        let mut ending = Ending::Exited;
        let mut buf = vec![0u8; 64 * 1024];
        let mut next_cpu_check = Instant::now();
        let kill_tree = || {
            // PID 1's death takes every process of the namespace with it;
            // the cgroup kill is the belt to that.
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            if let Some(cg) = cgroup {
                cg.kill();
            }
        };
        while !exited || open.iter().any(Option::is_some) {
            let killed = ending != Ending::Exited;
            if (exited || killed) && Instant::now() >= limits.wall {
                // Past the deadline a caller that is not reading gets nothing
                // more: stop waiting on the streams it holds up.
                for (i, capture) in [(0, &self.stdout), (1, &self.stderr)] {
                    if !capture.wants_input() {
                        open[i] = None;
                    }
                }
            }
            let timeout = if exited || killed {
                // The tree is dead or dying; the pipes close as soon as it is.
                PollTimeout::from(200u16)
            } else {
                let mut left = limits.wall.saturating_duration_since(Instant::now());
                if limits.cpu.is_some() {
                    left = left.min(next_cpu_check.saturating_duration_since(Instant::now()));
                }
                PollTimeout::try_from(left.as_millis().min(60_000) as u64 + 1).unwrap_or(PollTimeout::MAX)
            };
            let mut fds: Vec<PollFd> = Vec::with_capacity(9);
            let mut which: Vec<usize> = Vec::with_capacity(9);
            for (i, fd) in open.iter().enumerate() {
                // A stream whose caller has a full buffer to take is not
                // read until it catches up: the script waits, we do not.
                let wanted = match i {
                    0 => self.stdout.wants_input(),
                    1 => self.stderr.wants_input(),
                    _ => true,
                };
                if let (Some(fd), true) = (fd, wanted) {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    which.push(i);
                }
            }
            for (slot, capture) in [(SLOT_RELAY_OUT, &self.stdout), (SLOT_RELAY_ERR, &self.stderr)] {
                if let Some(fd) = capture.relay.as_ref().filter(|r| r.pending()).and_then(relay::Relay::fd) {
                    fds.push(PollFd::new(fd, PollFlags::POLLOUT));
                    which.push(slot);
                }
            }
            if !exited {
                fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
                which.push(SLOT_PIDFD);
            }
            // Past the answer cap the listener is read at a pace (seccomp.rs,
            // PAST_CAP_PACE): left out of the poll until its time comes.
            let now = Instant::now();
            let resting = self.listener_rest.filter(|&t| t > now);
            let timeout = match resting {
                Some(t) => timeout.min(PollTimeout::try_from((t - now).as_millis() as u64 + 1).unwrap_or(PollTimeout::MAX)),
                None => timeout,
            };
            let listener = if resting.is_some() { &None } else { &self.listener };
            for (slot, fd) in [(SLOT_NOTIFY, &self.notify), (SLOT_LISTENER, listener)] {
                if let Some(fd) = fd {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    which.push(slot);
                }
            }
            let ready = poll(&mut fds, timeout);
            let revents: Vec<(usize, PollFlags)> =
                fds.iter().zip(&which).map(|(f, &i)| (i, f.revents().unwrap_or(PollFlags::empty()))).collect();
            drop(fds);
            if matches!(ready, Ok(0)) && exited {
                // Exited but a pipe did not close: a descriptor escaped the
                // tree somehow. Never hang on it.
                break;
            }
            for (i, flags) in revents {
                if flags.is_empty() {
                    continue;
                }
                match i {
                    SLOT_PIDFD => {
                        exited = true;
                        continue;
                    }
                    SLOT_RELAY_OUT | SLOT_RELAY_ERR => {
                        let capture = if i == SLOT_RELAY_OUT { &mut self.stdout } else { &mut self.stderr };
                        if let Some(r) = capture.relay() {
                            r.flush();
                        }
                        continue;
                    }
                    SLOT_NOTIFY => {
                        // One message: the listener, or end-of-file when the
                        // worker failed before loading the filter.
                        if let Some(sock) = self.notify.take() {
                            self.listener = sys::recv_fd(sock.as_fd()).ok().flatten();
                        }
                        continue;
                    }
                    SLOT_LISTENER => {
                        let Some(listener) = &self.listener else { continue };
                        if flags.contains(PollFlags::POLLIN) {
                            self.listener_rest = match self.tally.answer(self.model, listener) {
                                seccomp::Next::Now => None,
                                seccomp::Next::After(pause) => Some(Instant::now() + pause),
                            };
                        } else {
                            // Every process under the filter is gone.
                            self.listener = None;
                        }
                        continue;
                    }
                    _ => {}
                }
                let Some(fd) = &open[i] else { continue };
                let n = nix::unistd::read(fd.as_raw_fd(), &mut buf).unwrap_or(0);
                if n == 0 {
                    open[i] = None;
                    if i == 2 {
                        self.exec_at = Some(Instant::now());
                    }
                    continue;
                }
                let chunk = &buf[..n];
                match i {
                    0 => self.stdout.push(chunk),
                    1 => self.stderr.push(chunk),
                    2 => self.report_buf.extend_from_slice(chunk),
                    _ => self.status_buf.extend_from_slice(chunk),
                }
            }
            if exited || ending != Ending::Exited {
                continue;
            }
            let now = Instant::now();
            if now >= limits.wall {
                kill_tree();
                ending = Ending::WallTimeout;
            } else if let Some((cg, limit_ns)) = limits.cpu {
                if now >= next_cpu_check {
                    next_cpu_check = now + limits::CPU_POLL;
                    if cg.cpu_ns().is_some_and(|used| used >= limit_ns) {
                        kill_tree();
                        ending = Ending::CpuTimeout;
                    }
                }
            }
        }
        ending
    }
}

#[derive(Clone, Copy)]
enum Target {
    Stdout,
    Stderr,
}

/// One output stream: streamed live (through a [`relay::Relay`], cut at the
/// cap), or captured as head and tail within a byte cap.
struct Capture {
    cap: u64,
    mode: OutputMode,
    head: Vec<u8>,
    tail: Vec<u8>,
    total: u64,
    relay: Option<relay::Relay>,
    relayed: Option<relay::Relayed>,
}

impl Capture {
    fn new(cap: u64, mode: OutputMode, target: Target) -> Capture {
        let relay = match (mode, target) {
            (OutputMode::Capture, _) => None,
            (OutputMode::Stream, Target::Stdout) => Some(relay::to_stdout(cap)),
            (OutputMode::Stream, Target::Stderr) => Some(relay::to_stderr(cap)),
        };
        Capture { cap, mode, head: Vec::new(), tail: Vec::new(), total: 0, relay, relayed: None }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if let Some(r) = &mut self.relay {
            r.push(chunk);
            return;
        }
        let half = (self.cap / 2) as usize;
        let head_room = half.saturating_sub(self.head.len());
        let (to_head, rest) = chunk.split_at(head_room.min(chunk.len()));
        self.head.extend_from_slice(to_head);
        if rest.is_empty() {
            return;
        }
        let tail_cap = self.cap as usize - half;
        self.tail.extend_from_slice(rest);
        if self.tail.len() > tail_cap * 2 {
            let cut = self.tail.len() - tail_cap;
            self.tail.drain(..cut);
        }
    }

    /// The relay, if any, while the watch loop runs.
    fn relay(&mut self) -> Option<&mut relay::Relay> {
        self.relay.as_mut()
    }

    /// Whether the watch loop may read more of this stream's pipe.
    fn wants_input(&self) -> bool {
        self.relay.as_ref().is_none_or(relay::Relay::wants_input)
    }

    /// The script's end of the stream is closed: hand the caller what it
    /// takes by `until`.
    fn end(&mut self, until: Instant) {
        if let Some(r) = self.relay.take() {
            self.relayed = Some(r.finish(until));
        }
    }

    fn into_stream(mut self) -> Stream {
        if self.mode == OutputMode::Stream {
            let r = self.relayed.unwrap_or_default();
            return Stream {
                text: String::new(),
                bytes: self.total,
                truncated: r.truncated,
                streamed: true,
                undelivered_bytes: r.undelivered,
            };
        }
        let tail_cap = self.cap as usize - (self.cap / 2) as usize;
        if self.tail.len() > tail_cap {
            let cut = self.tail.len() - tail_cap;
            self.tail.drain(..cut);
        }
        let kept = (self.head.len() + self.tail.len()) as u64;
        let truncated = kept < self.total;
        let text = if truncated {
            format!(
                "{}\n[... {} bytes cut by the jail ...]\n{}",
                String::from_utf8_lossy(&self.head),
                self.total - kept,
                String::from_utf8_lossy(&self.tail)
            )
        } else {
            let mut all = self.head;
            all.extend_from_slice(&self.tail);
            String::from_utf8_lossy(&all).into_owned()
        };
        Stream { text, bytes: self.total, truncated, streamed: false, undelivered_bytes: 0 }
    }
}

// ------------------------------------------------------------------- finish

/// Judge the output dir, deliver what passed to the host folder
/// (delivery.rs), and re-digest the input. Needs a [`TreeDead`]: only a
/// dead tree cannot swap a file for a link between our look and our open.
#[allow(clippy::too_many_arguments)]
fn collect_artifacts(
    result: &mut RunResult,
    output_dir: &Path,
    dir: delivery::OutputDir<'_>,
    before: &artifacts::Before,
    policy: &Policy,
    ids: output::FsIds,
    deadline: Instant,
    dead: TreeDead,
    started: Instant,
) {
    result.timings.stages.insert("artifacts_start".into(), ms_since(started));
    // The copy ends by the wall deadline, or a moment after the verdict
    // when the script used all of it (output.rs, COPY_GRACE).
    let copy_deadline = deadline.max(Instant::now() + output::COPY_GRACE);
    let d = delivery::deliver(output_dir, dir, before, &policy.artifacts, ids, copy_deadline, dead);
    result.timings.stages.insert("artifacts".into(), (d.judged_at - started).as_secs_f64() * 1000.0);
    result.timings.stages.insert("output_copy_out".into(), ms_since(started));
    result.artifacts = d.collected.artifacts;
    result.rejected_artifacts = d.collected.rejected;
    result.input = d.collected.input;
    result.output_sync = d.output_sync;
    result.quarantine_dir = d.quarantine_dir.map(|p| p.display().to_string());
    result.timings.total_ms = ms_since(started);
}

fn finish(
    mut result: RunResult,
    o: Outcome,
    cg: Option<CgroupUsage>,
    plan: &limits::Plan,
    started: Instant,
    mut stages: BTreeMap<String, f64>,
    model: &seccomp::Model,
) -> RunResult {
    result.denials = o.tally.denials(model);
    let mut notes = Vec::new();
    if o.tally.capped {
        result.isolation.seccomp.denials_truncated = true;
        result.isolation.seccomp.calls_past_cap = o.tally.past_cap;
        notes.push(format!(
            "denials itemises the first {} answered calls; {} more were answered the same way (refused with the same errno, \
             allowlist TCP sockets let through) at most one per {} ms, and counted only in calls_past_cap",
            seccomp::MAX_ANSWERED,
            o.tally.past_cap,
            seccomp::PAST_CAP_PACE.as_millis()
        ));
    }
    if o.tally.anomalies > 0 {
        notes.push(format!("{} notified calls the policy does not refuse were refused anyway", o.tally.anomalies));
    }
    if !notes.is_empty() {
        result.isolation.seccomp.detail = Some(notes.join("; "));
    }
    let tv_ms = |tv: libc::timeval| tv.tv_sec as f64 * 1000.0 + tv.tv_usec as f64 / 1000.0;
    let ns_ms = |ns: u64| ns as f64 / 1e6;
    let cg = cg.unwrap_or_default();
    // The cgroup sees every process of the run; getrusage only what PID 1
    // reaped, so the cgroup's numbers win where there are any.
    let user_ms = cg.user_ns.map(ns_ms).unwrap_or_else(|| tv_ms(o.rusage.ru_utime));
    let system_ms = cg.system_ns.map(ns_ms).unwrap_or_else(|| tv_ms(o.rusage.ru_stime));
    result.usage = Usage {
        wall_ms: (o.ended_at - o.released_at).as_secs_f64() * 1000.0,
        user_cpu_ms: Some(user_ms),
        system_cpu_ms: Some(system_ms),
        peak_memory_bytes: cg.memory_peak,
        max_rss_bytes: Some(o.rusage.ru_maxrss as u64 * 1024),
        pids_peak: cg.pids_peak,
        oom_kills: cg.oom_kills,
    };
    let mut failure = None;
    let mut exit = None;
    for r in o.reports {
        match r {
            Report::Stages(marks) => {
                for (name, at_ns) in marks {
                    let ms = at_ns.saturating_sub(o.started_ns) as f64 / 1e6;
                    stages.insert(format!("child_{name}"), ms);
                }
            }
            Report::Failed(e) => failure = Some(e),
            Report::Degraded(notes) => result.isolation.degraded.extend(notes),
            Report::Exited { .. } | Report::Signaled { .. } => exit = Some(r),
        }
    }
    result.stdout = o.stdout.into_stream();
    result.stderr = o.stderr.into_stream();
    if let Some(n) = o.network {
        result.network = n;
    }
    result.timings = Timings {
        total_ms: ms_since(started),
        setup_ms: o.exec_at.map(|t| (t - started).as_secs_f64() * 1000.0),
        stages,
    };
    if let Some(e) = failure {
        result.status = Status::SetupFailed;
        result.setup_error = Some(e);
        return result;
    }
    if o.ending == Ending::WallTimeout {
        result.supervisor.deadline_overrun_ms = Some(o.ended_at.saturating_duration_since(o.deadline).as_secs_f64() * 1000.0);
    }
    match exit {
        Some(Report::Exited { code }) => result.exit_code = Some(code),
        Some(Report::Signaled { signal }) => {
            result.signal = Some(signal);
            result.signal_name = Signal::try_from(signal).ok().map(|s| s.as_str().to_string());
        }
        _ => {}
    }
    let facts = Facts {
        ending: o.ending,
        exit_code: result.exit_code,
        signal: result.signal,
        oom_kills: cg.oom_kills.unwrap_or(0),
        truncated: result.stdout.truncated || result.stderr.truncated,
        cpu_rlimit: plan.cpu_rlimit,
        cpu_used: Duration::from_secs_f64((user_ms + system_ms).max(0.0) / 1000.0),
    };
    match status_of(&facts) {
        Some(status) => result.status = status,
        None => {
            result.status = Status::SetupFailed;
            result.setup_error = Some(SetupError {
                stage: "reaper".into(),
                message: format!("the jail's PID 1 ended without reporting the script's status (wait status {:#x})", o.pid1_status),
                causes: vec![],
            });
            return result;
        }
    }
    if !result.stderr.streamed {
        result.error = crate::result::parse_python_error(&result.stderr.text);
    }
    result
}

/// What the status of a run that started is decided from.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Facts {
    ending: Ending,
    exit_code: Option<i32>,
    signal: Option<i32>,
    oom_kills: u64,
    truncated: bool,
    /// RLIMIT_CPU's soft limit, when it stands in for the CPU-time limit.
    cpu_rlimit: Option<Duration>,
    cpu_used: Duration,
}

/// The run's status, in the order `Status` documents; `None` when PID 1
/// vanished without a word and nothing explains it. Pure.
fn status_of(f: &Facts) -> Option<Status> {
    match f.ending {
        Ending::WallTimeout => return Some(Status::TimeoutWall),
        Ending::CpuTimeout => return Some(Status::TimeoutCpu),
        Ending::Exited => {}
    }
    let by_signal = |s: Signal| f.signal == Some(s as i32);
    // RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL at the hard one.
    if let Some(limit) = f.cpu_rlimit {
        if by_signal(Signal::SIGXCPU) || (by_signal(Signal::SIGKILL) && f.cpu_used >= limit) {
            return Some(Status::TimeoutCpu);
        }
    }
    if f.oom_kills > 0 && f.exit_code != Some(0) {
        return Some(Status::OomKilled);
    }
    let own = match (f.exit_code, f.signal) {
        (Some(0), _) => Status::Ok,
        (Some(_), _) => Status::NonzeroExit,
        (None, Some(_)) => Status::Signaled,
        (None, None) => return None,
    };
    if f.truncated {
        return Some(Status::OutputLimit);
    }
    Some(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            ending: Ending::Exited,
            exit_code: Some(0),
            signal: None,
            oom_kills: 0,
            truncated: false,
            cpu_rlimit: None,
            cpu_used: Duration::ZERO,
        }
    }

    #[test]
    fn an_allowlist_without_seccomp_notification_fails_instead_of_allowing_udp() {
        let policy = Policy::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/allowlist-example.json"))).unwrap();
        let Err((stage, e)) = confine_in(&policy, seccomp::Mode::ErrnoOnly, &[]) else { panic!("confined without notification") };
        assert_eq!(stage, "seccomp");
        assert!(e.to_string().contains("network.mode none"), "{e}");
        assert!(confine_in(&policy, seccomp::Mode::Notify, &[]).is_ok());
        assert!(confine_in(&Policy::builtin_default().unwrap(), seccomp::Mode::ErrnoOnly, &[]).is_ok());
    }

    #[test]
    fn timeouts_win_over_everything_the_script_did() {
        let f = Facts { ending: Ending::WallTimeout, oom_kills: 1, truncated: true, ..facts() };
        assert_eq!(status_of(&f), Some(Status::TimeoutWall));
        let f = Facts { ending: Ending::CpuTimeout, exit_code: None, signal: Some(9), ..facts() };
        assert_eq!(status_of(&f), Some(Status::TimeoutCpu));
    }

    #[test]
    fn rlimit_cpu_signals_mean_timeout_cpu() {
        let xcpu = Facts { exit_code: None, signal: Some(libc::SIGXCPU), cpu_rlimit: Some(Duration::from_secs(1)), ..facts() };
        assert_eq!(status_of(&xcpu), Some(Status::TimeoutCpu));
        let kill = Facts { signal: Some(9), cpu_used: Duration::from_millis(1500), ..xcpu };
        assert_eq!(status_of(&kill), Some(Status::TimeoutCpu));
        // A SIGKILL well short of the limit is something else.
        let early = Facts { cpu_used: Duration::from_millis(100), ..kill };
        assert_eq!(status_of(&early), Some(Status::Signaled));
        // Without RLIMIT_CPU in force, SIGXCPU is just a signal.
        let plain = Facts { cpu_rlimit: None, ..xcpu };
        assert_eq!(status_of(&plain), Some(Status::Signaled));
    }

    #[test]
    fn an_oom_kill_is_oom_killed_unless_the_script_still_exited_0() {
        let killed = Facts { exit_code: None, signal: Some(9), oom_kills: 1, ..facts() };
        assert_eq!(status_of(&killed), Some(Status::OomKilled));
        let child_killed = Facts { exit_code: Some(1), oom_kills: 1, ..facts() };
        assert_eq!(status_of(&child_killed), Some(Status::OomKilled));
        let survived = Facts { oom_kills: 1, ..facts() };
        assert_eq!(status_of(&survived), Some(Status::Ok));
        // PID 1 itself OOM-killed: explained, not a setup failure.
        let pid1 = Facts { exit_code: None, signal: None, oom_kills: 1, ..facts() };
        assert_eq!(status_of(&pid1), Some(Status::OomKilled));
    }

    #[test]
    fn a_truncated_stream_is_output_limit_over_the_exit() {
        assert_eq!(status_of(&Facts { truncated: true, ..facts() }), Some(Status::OutputLimit));
        assert_eq!(status_of(&Facts { truncated: true, exit_code: Some(2), ..facts() }), Some(Status::OutputLimit));
        assert_eq!(status_of(&Facts { exit_code: Some(2), ..facts() }), Some(Status::NonzeroExit));
        assert_eq!(status_of(&Facts { exit_code: None, signal: None, ..facts() }), None);
    }
}
