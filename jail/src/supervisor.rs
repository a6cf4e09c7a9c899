//! The supervisor side of one run, as the steps of DESIGN.md §6: read the
//! host (lease a host uid, choose the run cgroup and make it if it is v2),
//! check the request, plan the run, compile the filter, snapshot the
//! folders, make the jail and run the step in it (launch.rs: a v1 run
//! cgroup is made there, while the child builds its mounts), which ends
//! with the verdict (verdict.rs). What no caller waits for (the run
//! cgroup's removal, the lease's return) is left to [`Leftovers`], dropped
//! by [`run`] before it returns and by `jail run` once the result is
//! printed ([`run_leaving_cleanup`]). Each step lives in the module named
//! for it; this file is the order.

use crate::artifacts;
use crate::host;
use crate::launch::Jail;
pub(crate) use crate::launch::Leftovers;
use crate::layers;
use crate::plan;
use crate::request::{prepare, Identity};
use crate::result::RunResult;
use crate::script::Script;
use crate::stage::Stage;
use crate::step::{Clock, Step};
use crate::sys;
use crate::verdict::{base_result, failed, report_plan};
use crate::watch::Loop;

pub(crate) use crate::request::RunRequest;
pub(crate) use crate::streams::OutputMode;

/// Run one step and return its result, with nothing of it left on the
/// host, `lp` saying what the step's clocks mean (watch.rs): a script's
/// deadlines ([`run_leaving_cleanup`]), or a session's cells (session.rs).
/// Never panics on bad input: every problem becomes a result with
/// `setup_error`.
pub(crate) fn run_with(req: &RunRequest, lp: &mut dyn Loop) -> RunResult {
    let (result, leftovers) = leaving_cleanup(req, lp);
    drop(leftovers);
    result
}

/// Run one script as [`run_with`] does, but the clean-up no caller waits
/// for is left to the [`Leftovers`]' drop, so the caller can hand the
/// result on first.
pub(crate) fn run_leaving_cleanup(req: &RunRequest) -> (RunResult, Option<Leftovers>) {
    leaving_cleanup(req, &mut Script::new())
}

fn leaving_cleanup(req: &RunRequest, lp: &mut dyn Loop) -> (RunResult, Option<Leftovers>) {
    let mut clock = Clock::start();
    let policy = &req.policy;
    // The machine, read once: the host uid leased (held until the jail is
    // gone, so no other live run gets it: hostuid.rs), the kernel's
    // features, and the run cgroup, made before the seccomp filter (which
    // refuses more when no cgroup counts memory) and before the clone (the
    // child is placed in it before it is released).
    let (host, held) = match host::gather(policy, req.timeout.unwrap_or(policy.limits.wall_time), &req.host.pass) {
        Ok(gathered) => gathered,
        Err(e) => {
            // No uid was taken: the result reports the overflow uid, never one in use.
            return (failed(base_result(policy, 65534, 65534), Stage::Identity.error(&e), clock.started), None);
        }
    };
    let mut result = base_result(policy, host.host_uid, host.host_gid);
    clock.mark("host");
    // Every path the user gave, checked for the uid the sandbox runs as.
    let prepared = match prepare(req, &Identity::of(&host)) {
        Ok(p) => p,
        Err(e) => return (failed(result, e.stage.error(&e), clock.started), None),
    };
    clock.mark("prepare");
    let (result, leftovers) = match plan_and_make(req, &prepared, host, held, &mut result, &mut clock) {
        Ok((jail, before)) => {
            let (result, leftovers) = jail.run(Step { policy, before, result, clock }, lp);
            (result, Some(leftovers))
        }
        Err(e) => (failed(result, e, clock.started), None),
    };
    (finish(req, &prepared, result), leftovers)
}

/// Plan the run, compile its filter, take the snapshot its changes are
/// measured against, and make the jail; the result so far gets what the
/// plan says.
fn plan_and_make(
    req: &RunRequest,
    prepared: &crate::request::Prepared,
    host: host::Host,
    held: host::Held,
    result: &mut RunResult,
    clock: &mut Clock,
) -> Result<(Jail, artifacts::Before), crate::result::SetupError> {
    // Pure: what this request on this host will be. A policy the kernel
    // cannot honour, or a required limit nothing enforces, fails here.
    let plan = plan::plan(req, prepared, &host).map_err(|refused| {
        result.limits = refused.limits;
        refused.error.stage().error(&refused.error)
    })?;
    // Before anything is forked: the filter the plan names.
    let filter = layers::compile(&plan.seccomp, req.host.cache_dir.as_deref()).map_err(|e| Stage::Seccomp.error(&e))?;
    report_plan(result, &plan, &filter, prepared);
    clock.mark("confine");
    // The state the step's changes are measured against, taken before the
    // clone and so before the child is released.
    let before = artifacts::Before::take(&prepared.output_dir, prepared.mount_request.input.as_deref(), &req.policy.artifacts)
        .map_err(|e| Stage::Artifacts.error(&e))?;
    clock.mark("snapshot");
    // Clone, map and place the child; it waits at the release (launch.rs).
    let jail = Jail::make(plan, filter, held, clock).map_err(|e| e.stage().error(&e))?;
    Ok((jail, before))
}

/// The supervisor's own figures, and no litter: an output dir we made for
/// the run (no `--output`) that holds nothing once the run is over (it
/// never started, was cancelled, or left no file that passed) is removed
/// and the result names none (issue 38: `jail run -c 'print(1)'` used to
/// leave an empty `jail-output-*` folder every time). A folder the caller
/// gave is never touched.
fn finish(req: &RunRequest, prepared: &crate::request::Prepared, mut result: RunResult) -> RunResult {
    result.supervisor.max_rss_bytes = sys::self_max_rss_bytes();
    // remove_dir refuses if anything is in it, so an artifact is never lost.
    if req.output.is_none() && std::fs::remove_dir(&prepared.output_dir).is_ok() {
        result.output_dir = None;
    }
    result
}
