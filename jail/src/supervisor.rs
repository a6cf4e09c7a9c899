//! The supervisor side of one run, as the steps of DESIGN.md §6: lease a
//! host uid, set up the run cgroup, compile the confinement, check the
//! request, snapshot the folders, launch and watch the child (launch.rs,
//! watch.rs), remove the cgroup, and build the result (verdict.rs). Each
//! step lives in the module named for it; this file is the order.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use crate::artifacts;
use crate::cgroup::{CgroupUsage, RunCgroup};
use crate::hostuid::HostIds;
use crate::launch::launch;
use crate::layers::{confine, setup_resources, Resources};
use crate::namespaces::{self, IdMap};
use crate::policy::Policy;
use crate::request::{prepare, Identity};
use crate::result::{RunResult, Status};
use crate::sync::{self, ms_since};
use crate::sys;
use crate::verdict::{assemble, base_result, failed, report_confinement, report_prepared};

pub use crate::request::{InputError, OutputMode, RunRequest, THREAD_POOL_VARS};

/// Run one script and return its result. Never panics on bad input: every
/// problem becomes a result with `setup_error`.
pub fn run(req: &RunRequest) -> RunResult {
    let started = Instant::now();
    let started_ns = sync::monotonic_ns();
    let mut stages = BTreeMap::new();
    let policy = &req.policy;
    // Held until this function returns, after the whole tree is dead: no
    // other live run gets this host uid (hostuid.rs).
    let (_host, uid_map, gid_map, who) = match lease_identity(policy) {
        Ok(leased) => leased,
        Err((who, e)) => return failed(base_result(policy, &who), "identity", &e.to_string(), causes_of(&e), started),
    };
    let mut result = base_result(policy, &who);
    // The cgroup comes before the seccomp filter, which refuses more when no
    // cgroup counts the run's memory (limits.rs, `close_uncounted_memory`),
    // and before the clone: the child must be placed in it before it is
    // released (DESIGN.md §6).
    let mut resources = setup_resources(policy, req.timeout.unwrap_or(policy.limits.wall_time));
    stages.insert("cgroup".to_string(), ms_since(started));
    result.limits = resources.plan.reports.clone();
    // A required limit nothing here can enforce fails the run now, before
    // anything is made for it.
    if let Some(message) = refused_limits(&resources) {
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
    // Every path the user gave, checked for the uid the sandbox runs as.
    let mut prepared = match prepare(req, &who) {
        Ok(p) => p,
        Err(e) => return failed(result, "input", &e.to_string(), vec![], started),
    };
    resources.plan.tmpfs.apply(&mut prepared.mount_request);
    report_prepared(&mut result, &prepared);
    stages.insert("prepare".to_string(), ms_since(started));
    // The state the step's changes are measured against, taken before the
    // clone and so before the child is released.
    let mut before =
        match artifacts::Before::take(&prepared.output_dir, prepared.mount_request.input.as_deref(), &policy.artifacts) {
            Ok(b) => b,
            Err(e) => {
                if req.output.is_none() && std::fs::remove_dir(&prepared.output_dir).is_ok() {
                    result.output_dir = None;
                }
                return failed(result, "artifacts", &e.to_string(), vec![e.cause()], started);
            }
        };
    stages.insert("snapshot".to_string(), ms_since(started));
    if let Some(session) = &req.session {
        // Each cell's result starts from this run's isolation and limits.
        session.set_template(&result);
    }
    // Clone, release and watch the child until PID 1 is reaped (launch.rs).
    let model = Rc::clone(&confinement.model);
    let launched =
        launch(req, &prepared, &mut before, &resources, confinement, uid_map, gid_map, &mut stages, started, started_ns);
    // The tree is dead (PID 1 reaped): read what it used, then remove the
    // cgroup. A failed launch leaves it to RunCgroup's drop.
    let cgroup_usage = remove_cgroup(&mut resources);
    let mut result = match launched {
        // The verdict, then the output dir judged and delivered (verdict.rs).
        Ok(outcome) => {
            assemble(result, outcome, cgroup_usage, &resources.plan, &prepared, &before, policy, started, stages, &model)
        }
        Err(e) => failed(result, e.stage(), &e.to_string(), causes_of(&e), started),
    };
    result.supervisor.max_rss_bytes = sys::self_max_rss_bytes();
    if result.status == Status::SetupFailed && req.output.is_none() {
        // The run never started: the output dir we made for it would only be
        // litter. remove_dir refuses if anything is in it.
        if std::fs::remove_dir(&prepared.output_dir).is_ok() {
            result.output_dir = None;
        }
    }
    result
}

/// Lease the sandbox its host uid and plan the id maps. On failure no uid
/// was taken: the result reports the overflow uid, never one in use.
#[allow(clippy::type_complexity)]
fn lease_identity(policy: &Policy) -> Result<(HostIds, IdMap, IdMap, Identity), (Identity, crate::hostuid::HostUidError)> {
    let caller_uid = nix::unistd::getuid().as_raw();
    let caller_gid = nix::unistd::getgid().as_raw();
    let host = crate::hostuid::for_caller(caller_uid, caller_gid, &policy.identity)
        .map_err(|e| (Identity { caller_uid, host_uid: 65534, host_gid: 65534 }, e))?;
    let (uid_map, gid_map) = namespaces::plan_id_maps(&policy.identity, &host);
    let who = Identity { caller_uid, host_uid: uid_map.outside, host_gid: gid_map.outside };
    Ok((host, uid_map, gid_map, who))
}

/// The error for required limits this host cannot enforce, if any.
fn refused_limits(resources: &Resources) -> Option<String> {
    if resources.plan.refused.is_empty() {
        return None;
    }
    Some(format!(
        "required limit cannot be enforced on this host: {}; give jail a writable cgroup (see `jail doctor`: run as root, \
         or pass a delegated cgroup with --cgroup-parent or JAIL_CGROUP_PARENT), or set limits.enforcement to best_effort",
        resources.plan.refused.join("; ")
    ))
}

/// Read what the dead tree used, then remove the run cgroup.
fn remove_cgroup(resources: &mut Resources) -> Option<CgroupUsage> {
    let usage = resources.cgroup.as_ref().map(RunCgroup::usage);
    if let Some(cg) = resources.cgroup.take() {
        if let Err(e) = cg.remove() {
            eprintln!(
                "jail: the run cgroup was not removed: {e}: {}",
                std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()
            );
        }
    }
    usage
}

pub(crate) fn causes_of(e: &dyn std::error::Error) -> Vec<String> {
    let mut causes = Vec::new();
    let mut src = e.source();
    while let Some(s) = src {
        causes.push(s.to_string());
        src = s.source();
    }
    causes
}
