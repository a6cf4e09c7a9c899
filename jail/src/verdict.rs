//! The verdict: what the run's facts mean ([`status_of`], pure, in
//! status.rs, the rules a session's cells use too) and the
//! result assembled in one place: seeded from the plan ([`base_result`],
//! [`report_plan`]), failed at a stage ([`failed`]), or finished from what
//! the launch saw, the cgroup's usage and the delivery ([`assemble`]).

pub(crate) mod status;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::artifacts::{self, TreeDead};
use crate::cgroup::CgroupUsage;
use crate::delivery;
use crate::mounts;
use crate::namespaces;
use crate::output;
use crate::plan::RunPlan;
use crate::policy::Policy;
use crate::proxy;
use crate::request::Prepared;
use crate::result::{Isolation, LandlockReport, LayerStatus, RunResult, SeccompReport, SetupError, Status, Timings, Usage};
use crate::seccomp;
use crate::stage::Stage;
use crate::step::Ending;
use crate::step::{Clock, Delivery, Seen, Step};
use crate::sync::{ms_since, Report};
use status::{status_of, Cut, Facts};

/// The result before anything is known: the policy's isolation, the
/// sandbox's host ids, and no network.
pub(crate) fn base_result(policy: &Policy, host_uid: u32, host_gid: u32) -> RunResult {
    let mut r = RunResult::setup_failed(SetupError { stage: String::new(), message: String::new(), causes: vec![] });
    r.setup_error = None;
    r.network = proxy::report_without_proxy(policy.network.mode());
    r.isolation = Isolation {
        policy: policy.name.clone(),
        policy_hash: policy.hash.clone(),
        policy_source: policy.source.clone(),
        rootfs: String::new(),
        rootfs_id: None,
        namespaces: namespaces::NAMES.iter().map(|s| s.to_string()).collect(),
        uid: policy.identity.uid,
        gid: policy.identity.gid,
        host_uid,
        host_gid,
        capabilities: vec![],
        no_new_privs: true,
        // Filled in by report_plan once the layers are planned.
        landlock: LandlockReport { mode: policy.landlock.enforcement.as_str().into(), ..LandlockReport::default() },
        seccomp: SeccompReport::default(),
        degraded: vec![],
        forked_from_template: false,
    };
    r
}

/// The run failed at a stage before its script could run.
pub(crate) fn failed(mut result: RunResult, error: SetupError, started: Instant) -> RunResult {
    result.status = Status::SetupFailed;
    result.setup_error = Some(error);
    result.timings.total_ms = ms_since(started);
    result
}

/// What the plan says about the run before it starts: the limits and their
/// enforcers, the layers, what is degraded, the rootfs and the output dir.
pub(crate) fn report_plan(result: &mut RunResult, plan: &RunPlan, filter: &seccomp::Filter, prepared: &Prepared) {
    result.limits = plan.limits.reports.clone();
    let counted = filter.mode == seccomp::Mode::Notify;
    let model = &plan.seccomp.model;
    result.isolation.seccomp = SeccompReport {
        status: LayerStatus::Enforced,
        default_action: match model.default {
            seccomp::Action::Errno { errno, .. } => {
                format!("errno {}", seccomp::model::errno_name(errno).unwrap_or("?"))
            }
            seccomp::Action::Allow => "allow".into(),
            seccomp::Action::KillProcess => "kill_process".into(),
        },
        rules: model.rules.len(),
        instructions: filter.program.len(),
        filter_sha256: filter.sha256.clone(),
        denials_counted: counted,
        denials_truncated: false,
        calls_past_cap: 0,
        detail: (!counted).then(|| "refusals are not counted: this kernel has no seccomp user notification".into()),
    };
    result.isolation.landlock = plan.landlock.report();
    result.isolation.degraded.extend(plan.landlock.degraded());
    result.isolation.degraded.extend(plan.limits.degraded.iter().map(|d| format!("limit {d}")));
    result.isolation.rootfs = prepared.rootfs.display().to_string();
    result.isolation.rootfs_id = prepared.rootfs_id.clone();
    result.output_dir = Some(prepared.output_dir.display().to_string());
    // The mounts whose host source /proc/self/mountinfo would show.
    for (path, source) in mounts::still_showing(&plan.mounts) {
        result.isolation.degraded.push(format!(
            "/proc/self/mountinfo shows where {} comes from on the host ({}, as its path within its filesystem): \
             a writable folder is a plain bind",
            path.display(),
            source.display()
        ));
    }
}

/// The result of a step that was launched: the verdict from what the watch
/// saw, then the output dir judged and delivered, where `delivery` says
/// (`None`: as planned).
pub(crate) fn assemble(
    step: Step<'_>,
    mut outcome: Seen,
    cgroup_usage: Option<CgroupUsage>,
    plan: &RunPlan,
    delivery: Option<Delivery>,
) -> RunResult {
    let Step { policy, before, result, clock, .. } = step;
    let dead = outcome.tree_dead;
    let (tmpfs, inventory) = outcome.output.take().unzip();
    let delivery = delivery.unwrap_or_else(|| Delivery::planned(plan, before, inventory, &result));
    let (deadline, ids, started) = (outcome.deadline, outcome.ids, clock.started);
    let mut result = finish(result, outcome, cgroup_usage, plan, clock);
    result.output_dir = delivery.output_dir;
    let dir = match (&tmpfs, &delivery.inventory) {
        (Some(fd), Some(inventory)) => {
            let limit = plan.output.dir_size.unwrap_or(u64::MAX);
            delivery::OutputDir::Mirrored { tmpfs: fd, inventory, limit }
        }
        _ => delivery::OutputDir::Bound,
    };
    let judged = Judged { before: &delivery.before, policy, ids, deadline, dead, started };
    collect_artifacts(&mut result, &delivery.host_dir, dir, judged);
    result
}

/// What the output dir is judged with.
struct Judged<'a> {
    before: &'a artifacts::Before,
    policy: &'a Policy,
    ids: output::FsIds,
    deadline: Instant,
    dead: TreeDead,
    started: Instant,
}

/// Judge the output dir, deliver what passed to the host folder
/// (delivery.rs), and re-digest the input. Needs a [`TreeDead`]: only a
/// dead tree cannot swap a file for a link between our look and our open.
fn collect_artifacts(result: &mut RunResult, output_dir: &std::path::Path, dir: delivery::OutputDir<'_>, j: Judged<'_>) {
    let started = j.started;
    result.timings.stages.insert("artifacts_start".into(), ms_since(started));
    let d = delivery::deliver(output_dir, dir, j.before, &j.policy.artifacts, j.ids, j.deadline, j.dead);
    result.timings.stages.insert("artifacts".into(), (d.judged_at - started).as_secs_f64() * 1000.0);
    result.timings.stages.insert("output_copy_out".into(), ms_since(started));
    result.artifacts = d.collected.artifacts;
    result.rejected_artifacts = d.collected.rejected;
    result.input = d.collected.input;
    result.output_sync = d.output_sync;
    result.quarantine_dir = d.quarantine_dir.map(|p| p.display().to_string());
    result.supervisor.judging_cpu_ms = Some(d.judging_cpu.as_secs_f64() * 1000.0);
    result.timings.total_ms = ms_since(started);
}

/// The verdict from what the watch saw: denials, usage, the child's
/// reports, the streams, then the status.
fn finish(mut result: RunResult, o: Seen, cg: Option<CgroupUsage>, plan: &RunPlan, clock: Clock) -> RunResult {
    let model = &plan.seccomp.model;
    result.denials = o.tally.denials(model);
    if o.tally.capped {
        result.isolation.seccomp.denials_truncated = true;
        result.isolation.seccomp.calls_past_cap = o.tally.past_cap;
    }
    if let Some(detail) = tally_notes(&o.tally) {
        result.isolation.seccomp.detail = Some(detail);
    }
    let cg = cg.unwrap_or_default();
    result.usage = usage_of(&o, &cg);
    let Clock { started, started_ns, mut stages } = clock;
    let (failure, exit) = read_reports(&mut result, o.reports, started_ns, &mut stages);
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
    if let Ending::Cancelled(sig) = o.ending {
        result.supervisor.cancelled_by = Some(sig.as_str().to_string());
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
    let cpu_ms = result.usage.user_cpu_ms.unwrap_or(0.0) + result.usage.system_cpu_ms.unwrap_or(0.0);
    let facts = Facts {
        cut: cut_of(o.ending),
        exit_code: result.exit_code,
        signal: result.signal,
        oom_kills: cg.oom_kills.unwrap_or(0),
        truncated: result.stdout.truncated || result.stderr.truncated,
        cpu_rlimit: plan.limits.cpu_rlimit,
        cpu_used: Duration::from_secs_f64(cpu_ms.max(0.0) / 1000.0),
    };
    let Some(status) = status_of(&facts) else {
        let message = match o.pid1_status {
            Some(status) => format!("the jail's PID 1 ended without reporting the script's status (wait status {status:#x})"),
            None => "the jail's PID 1 ended without reporting the script's status".to_string(),
        };
        return failed(result, Stage::Reaper.message(message), started);
    };
    result.status = status;
    if result.status == Status::OomKilled {
        // What the OOM killer took, and at what usage (inside.rs).
        let words = crate::inside::oom_words(result.signal, result.exit_code, facts.oom_kills, cg.memory_peak);
        if let Some(m) = result.limits.get_mut("memory") {
            m.detail = Some(format!("{words}; {}", m.detail.take().unwrap_or_default()));
        }
    }
    if !result.stderr.streamed {
        result.error = crate::result::parse_python_error(&result.stderr.text);
    }
    result
}

/// `isolation.seccomp.detail` for what the tally could not itemise or
/// answer; `None` when it has nothing to say.
fn tally_notes(t: &seccomp::Tally) -> Option<String> {
    let mut notes = Vec::new();
    if t.capped {
        notes.push(format!(
            "denials itemises the first {} answered calls; {} more were answered the same way (refused with the same errno, \
             allowlist TCP sockets let through) at most one per {} ms, and counted only in calls_past_cap",
            seccomp::MAX_ANSWERED,
            t.past_cap,
            seccomp::PAST_CAP_PACE.as_millis()
        ));
    }
    if t.failed_answers > 0 {
        notes.push(format!(
            "{} seccomp notification answers were refused by the kernel (last: {}); those callers waited until the listener closed",
            t.failed_answers,
            t.last_answer_error.as_deref().unwrap_or("?")
        ));
    }
    if t.anomalies > 0 {
        notes.push(format!("{} notified calls the policy does not refuse were refused anyway", t.anomalies));
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// What the run used: the cgroup sees every process of the run, getrusage
/// only what PID 1 reaped, so the cgroup's numbers win where there are any.
fn usage_of(o: &Seen, cg: &CgroupUsage) -> Usage {
    let tv_ms = |tv: libc::timeval| tv.tv_sec as f64 * 1000.0 + tv.tv_usec as f64 / 1000.0;
    let ns_ms = |ns: u64| ns as f64 / 1e6;
    Usage {
        wall_ms: (o.ended_at - o.released_at).as_secs_f64() * 1000.0,
        user_cpu_ms: cg.user_ns.map(ns_ms).or_else(|| o.rusage.map(|r| tv_ms(r.ru_utime))),
        system_cpu_ms: cg.system_ns.map(ns_ms).or_else(|| o.rusage.map(|r| tv_ms(r.ru_stime))),
        peak_memory_bytes: cg.memory_peak,
        max_rss_bytes: o.rusage.map(|r| r.ru_maxrss as u64 * 1024),
        pids_peak: cg.pids_peak,
        oom_kills: cg.oom_kills,
        throttled: o.throttled.clone(),
    }
}

/// The child side's reports: its stage marks into `stages`, what it
/// degraded into the result; returns its setup failure and the script's
/// exit, if any.
fn read_reports(
    result: &mut RunResult,
    reports: Vec<Report>,
    started_ns: u64,
    stages: &mut std::collections::BTreeMap<String, f64>,
) -> (Option<SetupError>, Option<Report>) {
    let mut failure = None;
    let mut exit = None;
    for r in reports {
        match r {
            Report::Stages(marks) => {
                for (name, at_ns) in marks {
                    let ms = at_ns.saturating_sub(started_ns) as f64 / 1e6;
                    stages.insert(format!("child_{name}"), ms);
                }
            }
            Report::Failed(e) => failure = Some(e),
            Report::Degraded(notes) => result.isolation.degraded.extend(notes),
            Report::Exited { .. } | Report::Signaled { .. } => exit = Some(r),
        }
    }
    (failure, exit)
}

/// The supervisor's cut, from how the watch ended.
fn cut_of(ending: Ending) -> Option<Cut> {
    match ending {
        Ending::Exited => None,
        Ending::WallTimeout => Some(Cut::Wall),
        Ending::CpuTimeout => Some(Cut::Cpu),
        Ending::Cancelled(_) => Some(Cut::Cancelled),
    }
}
