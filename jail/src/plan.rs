//! The plan: what one run will be, decided from the checked request and the
//! host's facts ([`plan`], pure: no I/O, no clock), before anything is made.
//! Id maps, mounts, landlock rules, the seccomp model the filter is compiled
//! from, the interpreter's argv and environment, every limit and what
//! enforces it, the network mode, where the output goes, and which channels
//! the launch needs. A test can say "this request produces this run" by
//! comparing the whole value (see the tests and `plan/testdata/`).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::child::Exec;
use crate::host::Host;
use crate::landlock::{self, PathRule};
use crate::mounts::{self, MountOp};
use crate::namespaces::IdMap;
use crate::policy::{Allowlist, Network, Policy};
use crate::proxy::Resolver;
use crate::request::{input_error, InputError, Prepared, RunRequest};
use crate::result::LimitReport;
use crate::stage::Stage;
use crate::streams::OutputMode;
use crate::{limits, seccomp, sync};

/// One run, decided.
#[derive(Debug)]
pub(crate) struct RunPlan {
    pub(crate) uid_map: IdMap,
    pub(crate) gid_map: IdMap,
    /// The sandbox's own ids and hostname, inside its namespaces.
    pub(crate) sandbox: Sandbox,
    /// The steps that build the new root (mounts.rs), tmpfs sizes applied.
    pub(crate) mounts: Vec<MountOp>,
    pub(crate) landlock: landlock::Plan,
    pub(crate) landlock_rules: Vec<PathRule>,
    pub(crate) seccomp: SeccompRef,
    pub(crate) exec: Exec,
    /// Every limit, what enforces it, and the rlimits the worker sets.
    pub(crate) limits: limits::Plan,
    pub(crate) network: NetworkPlan,
    pub(crate) output: OutputPlan,
    /// The optional channels the launch makes (sync.rs).
    pub(crate) channels: sync::Wanted,
    pub(crate) wall_time: Duration,
    /// The CPUs PID 1 pins the run to (inside.rs); `None`: left alone.
    pub(crate) cpus: Option<Vec<usize>>,
    /// The template whose fork the jail is (template.rs); `None`: cloned.
    pub(crate) template: Option<PathBuf>,
    /// A template's own jail: the host's root kept beneath its root, no
    /// landlock, no seccomp (pool/template.rs).
    pub(crate) is_template: bool,
    /// Root's lease range, where a template maps it for its forks, and a
    /// fork's supervisor maps the fork's own uid (template/uids.rs).
    pub(crate) root_uids: Option<crate::hostuid::UidRange>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sandbox {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) hostname: String,
}

/// The seccomp filter to load, by what it is compiled from: the model (the
/// policy's, with `added` refused on top) and the mode. Compiling it
/// (`layers::compile`) reads the cache, so it is not part of the plan.
pub(crate) struct SeccompRef {
    pub(crate) mode: seccomp::Mode,
    pub(crate) model: Rc<seccomp::Model>,
    /// Refused on top of the policy's rules (limits.rs, `refuse_syscalls`).
    pub(crate) added: Vec<&'static str>,
}

impl std::fmt::Debug for SeccompRef {
    /// The model by its size and digest: its few hundred rules would bury
    /// the rest of a plan's rendering, and any change to one shows anyway.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest = crate::digest::sha256_hex(format!("{:?}", self.model).as_bytes());
        f.debug_struct("SeccompRef")
            .field("mode", &self.mode)
            .field("added", &self.added)
            .field("rules", &self.model.rules.len())
            .field("model_sha256", &&digest[..16])
            .finish()
    }
}

/// How the run reaches the network.
#[derive(Debug)]
pub(crate) enum NetworkPlan {
    /// Loopback only, down.
    None,
    /// The supervisor's proxy on the listener PID 1 hands over; landlock
    /// lets connect(2) reach `tcp_connect` only.
    Allowlist {
        rules: Allowlist,
        resolver: Resolver,
        tcp_connect: Vec<u16>,
    },
}

/// Where the script's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutputPlan {
    pub(crate) streams: OutputMode,
    pub(crate) stdout_cap: u64,
    pub(crate) stderr_cap: u64,
    /// The output dir's tmpfs size; `None`: the host folder is bound.
    pub(crate) dir_size: Option<u64>,
    pub(crate) host_dir: PathBuf,
}

/// Why a request cannot run on this host, decided by the plan.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlanError {
    #[error(
        "required limit cannot be enforced on this host: {0}; give jail a writable cgroup (see `jail doctor`: run as root, \
         or pass a delegated cgroup with --cgroup-parent or JAIL_CGROUP_PARENT), or set limits.enforcement to best_effort"
    )]
    Limits(String),
    #[error(
        "network.mode allowlist needs seccomp user notification, which this kernel lacks (Linux 5.5 or later has it); \
         use network.mode none on this host"
    )]
    NoNotification,
    #[error(
        "network.mode allowlist needs Linux 5.5 or later (SECCOMP_USER_NOTIF_FLAG_CONTINUE), and this kernel is older; \
         use network.mode none on this host"
    )]
    NoContinue,
    #[error(transparent)]
    Landlock(landlock::LandlockError),
    #[error(transparent)]
    Exec(InputError),
}

impl PlanError {
    pub(crate) fn stage(&self) -> Stage {
        match self {
            PlanError::Limits(_) => Stage::Limits,
            PlanError::NoNotification | PlanError::NoContinue => Stage::Seccomp,
            PlanError::Landlock(_) => Stage::Landlock,
            PlanError::Exec(e) => e.stage,
        }
    }
}

/// A request this host cannot run, with what the limits came to (the
/// result reports them either way).
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) error: PlanError,
    pub(crate) limits: BTreeMap<String, LimitReport>,
}

/// Decide the run. Pure: everything read from the machine is in `host`,
/// everything read from the request's paths in `prepared`.
pub(crate) fn plan(req: &RunRequest, prepared: &Prepared, host: &Host) -> Result<RunPlan, Refused> {
    let policy = &req.policy;
    let wall_time = req.timeout.unwrap_or(policy.limits.wall_time);
    let mut limits = limits::plan(policy, wall_time, host.cgroup.as_ref(), &host.cgroup_why_not, &|k| host.hard(k));
    if let Some(scope) = &host.systemd_scope {
        crate::delegate::annotate(&mut limits, scope);
    }
    match plan_with(req, prepared, host, &limits, wall_time) {
        Ok(plan) => Ok(plan),
        Err(error) => Err(Refused { error, limits: limits.reports }),
    }
}

fn plan_with(
    req: &RunRequest,
    prepared: &Prepared,
    host: &Host,
    limits: &limits::Plan,
    wall_time: Duration,
) -> Result<RunPlan, PlanError> {
    let policy = &req.policy;
    // A required limit nothing here can enforce fails the run before
    // anything is made for it.
    if !limits.refused.is_empty() {
        return Err(PlanError::Limits(limits.refused.join("; ")));
    }
    let seccomp = seccomp_ref(policy, host, &limits.refuse_syscalls)?;
    let landlock = landlock::plan(host.landlock_abi, &policy.landlock).map_err(PlanError::Landlock)?;
    let mut mount_request = prepared.mount_request.clone();
    limits.tmpfs.apply(&mut mount_request);
    // The run's limits where programs inside read them (inside.rs).
    let view = crate::inside::view_of(policy, &host.inside);
    view.apply(&mut mount_request);
    let mut mounts = mounts::plan(&mount_request);
    if req.template.is_some() {
        // A fork runs the cell driver it already holds (template.py): the
        // driver's host copy, in a folder only the caller's uid reaches,
        // is not mounted.
        mounts.retain(
            |op| !matches!(op, mounts::MountOp::ScriptCopy { dir, .. } if dir.as_path() == Path::new(mounts::DRIVER_DIR)),
        );
    }
    let landlock_rules = landlock::rules(&mounts);
    let is_template = req.step == crate::request::StepKind::Template;
    // A template's forks mount and make namespaces before they confine
    // themselves, and landlock's domain is inherited: the template has
    // none (it runs only the trusted preload), each fork its own.
    let landlock = if is_template { landlock.not_applied() } else { landlock };
    // Root's sandbox writes a bound output folder as its leased uid, and the
    // next run may lease another (hostuid.rs, `sandbox_umask`).
    let umask = crate::hostuid::sandbox_umask(host.caller_uid == 0, mount_request.output_size.is_none());
    let exec = build_exec(policy, &prepared.script, &req.args, (req.mode, req.step), umask, &host.env, &req.env)
        .map_err(PlanError::Exec)?;
    let network = match (&policy.network, &prepared.resolver) {
        (Network::Allowlist(rules), Some(resolver)) => NetworkPlan::Allowlist {
            rules: rules.clone(),
            resolver: resolver.clone(),
            tcp_connect: vec![crate::network::PROXY_PORT],
        },
        _ => NetworkPlan::None,
    };
    let output = OutputPlan {
        streams: req.mode,
        stdout_cap: policy.limits.stdout_bytes,
        stderr_cap: policy.limits.stderr_bytes,
        dir_size: mount_request.output_size,
        host_dir: prepared.output_dir.clone(),
    };
    let channels = sync::Wanted {
        // A size-capped output dir comes back to us as a descriptor (output.rs).
        output: output.dir_size.is_some(),
        // The worker sends the seccomp notification listener over this.
        notify: seccomp.mode == seccomp::Mode::Notify,
        // With the allowlist, PID 1 hands us the proxy's listener (network.rs).
        proxy: matches!(network, NetworkPlan::Allowlist { .. }),
        // A session's cell driver reads its cells from this (session.rs);
        // a script's runner sends its rich results on it (script.rs).
        control: true,
        // A v1 run cgroup is made after the clone; its `tasks` files go
        // to PID 1 over this (cgroup.rs).
        cgroup: host.cgroup.as_ref().is_some_and(|c| c.version.made_after_clone()),
    };
    Ok(RunPlan {
        uid_map: IdMap { inside: policy.identity.uid, outside: host.host_uid },
        gid_map: IdMap { inside: policy.identity.gid, outside: host.host_gid },
        sandbox: Sandbox {
            uid: policy.identity.uid,
            gid: policy.identity.gid,
            hostname: policy.identity.hostname.clone(),
        },
        mounts,
        landlock,
        landlock_rules,
        seccomp,
        exec,
        limits: limits.clone(),
        network,
        output,
        channels,
        wall_time,
        cpus: view.cpus,
        template: req.template.clone(),
        is_template,
        root_uids: (host.caller_uid == 0)
            .then_some(policy.identity.root_host_uids)
            .filter(|range| crate::template::uids::maps_forks(policy.identity.uid, *range)),
    })
}

/// The filter's model and mode; a policy this kernel cannot honour fails.
fn seccomp_ref(policy: &Policy, host: &Host, refuse: &[&'static str]) -> Result<SeccompRef, PlanError> {
    if matches!(policy.network, Network::Allowlist(_)) {
        // Its TCP sockets are let through by the supervisor answering
        // seccomp notifications; without them the filter would either
        // refuse them all or have to allow UDP too.
        if host.seccomp_mode == seccomp::Mode::ErrnoOnly {
            return Err(PlanError::NoNotification);
        }
        // The answer that lets a TCP socket(2) through carries
        // SECCOMP_USER_NOTIF_FLAG_CONTINUE, which the kernel takes only from
        // Linux 5.5 on.
        if !host.notify_continue {
            return Err(PlanError::NoContinue);
        }
    }
    let model = match refuse {
        [] => policy.seccomp.clone(),
        names => policy.seccomp.with_refused(names, limits::UNCOUNTED_MEMORY_WHY),
    };
    Ok(SeccompRef { mode: host.seccomp_mode, model: Rc::new(model), added: refuse.to_vec() })
}

/// Variables that size the thread pools of OpenMP, OpenBLAS, MKL, numexpr
/// and Accelerate.
pub(crate) const THREAD_POOL_VARS: [&str; 5] = [
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
];

/// The interpreter's argv and its environment, rebuilt from the policy;
/// `passed` holds the values of its `environment.pass` variables, `given`
/// what the caller set for this run (envs.rs), which wins over both.
fn build_exec(
    policy: &Policy,
    script: &Path,
    args: &[String],
    (mode, step): (OutputMode, crate::request::StepKind),
    umask: u32,
    passed: &BTreeMap<String, String>,
    given: &crate::envs::Envs,
) -> Result<Exec, InputError> {
    let cstr =
        |s: &[u8], what: &str| CString::new(s).map_err(|_| input_error(format!("{what} contains a NUL byte"), "remove it"));
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
        if let Some(v) = passed.get(k) {
            env.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in given.iter() {
        env.insert(k.clone(), v.clone());
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
    for (k, v) in crate::inside::env(policy) {
        env.entry(k).or_insert(v);
    }
    if let Network::Allowlist(_) = policy.network {
        // After the policy's own values: the proxy is the only way out, and
        // a policy cannot point the script anywhere else.
        env.extend(crate::network::proxy_env());
    }
    if matches!(mode, OutputMode::Stream | OutputMode::Events) {
        // Streaming is only live if Python does not hold output in its buffers.
        env.insert("PYTHONUNBUFFERED".into(), "1".into());
    }
    let envp = env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}").as_bytes(), "an environment value"))
        .collect::<Result<Vec<_>, _>>()?;
    let path = cstr(policy.python.as_os_str().as_bytes(), "the python path")?;
    let mut argv = vec![path.clone()];
    if step == crate::request::StepKind::Script {
        // The runner runs the script, its rich results on the control channel.
        argv.push(cstr(b"-c", "")?);
        argv.push(cstr(crate::display::RUNNER.as_bytes(), "the script runner")?);
    }
    argv.push(cstr(script.as_os_str().as_bytes(), "the script path")?);
    for a in args {
        argv.push(cstr(a.as_bytes(), "an argument")?);
    }
    Ok(Exec { path, argv, envp, cwd: PathBuf::from(mounts::OUTPUT_DIR), umask })
}

#[cfg(test)]
mod tests;
