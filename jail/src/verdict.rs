//! The verdict: what the run's facts mean ([`status_of`], pure) and the one
//! place the result is assembled from what the launch saw, the cgroup's
//! usage and the delivery of the output dir.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::artifacts::{self, TreeDead};
use crate::cgroup::CgroupUsage;
use crate::delivery;
use crate::launch::Outcome;
use crate::layers::Confinement;
use crate::limits;
use crate::mounts;
use crate::namespaces;
use crate::output;
use crate::policy::Policy;
use crate::proxy;
use crate::request::{Identity, Prepared};
use crate::result::{Isolation, LandlockReport, LayerStatus, RunResult, SeccompReport, SetupError, Status, Timings, Usage};
use crate::seccomp;
use crate::sync::{ms_since, Report};
use crate::watch::Ending;

pub(crate) fn report_confinement(result: &mut RunResult, c: &Confinement) {
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

pub(crate) fn base_result(policy: &Policy, who: &Identity) -> RunResult {
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

pub(crate) fn failed(mut result: RunResult, stage: &str, message: &str, causes: Vec<String>, started: Instant) -> RunResult {
    result.status = Status::SetupFailed;
    result.setup_error = Some(SetupError { stage: stage.into(), message: message.into(), causes });
    result.timings.total_ms = ms_since(started);
    result
}

/// What the prepared request says about the run: its rootfs, output dir,
/// and the mounts whose host source /proc/self/mountinfo would show.
pub(crate) fn report_prepared(result: &mut RunResult, prepared: &Prepared) {
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
}

/// The result of a run that was launched: the verdict from what the watch
/// saw, then the output dir judged and delivered.
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble(
    result: RunResult,
    mut outcome: Outcome,
    cgroup_usage: Option<CgroupUsage>,
    plan: &limits::Plan,
    prepared: &Prepared,
    before: &artifacts::Before,
    policy: &Policy,
    started: Instant,
    stages: BTreeMap<String, f64>,
    model: &seccomp::Model,
) -> RunResult {
    let dead = outcome.tree_dead;
    let tmpfs = outcome.output.take();
    let (deadline, ids) = (outcome.deadline, outcome.ids);
    let mut result = finish(result, outcome, cgroup_usage, plan, started, stages, model);
    let dir = match &tmpfs {
        Some((fd, inventory)) => {
            let limit = prepared.mount_request.output_size.unwrap_or(u64::MAX);
            delivery::OutputDir::Mirrored { tmpfs: fd, inventory, limit }
        }
        None => delivery::OutputDir::Bound,
    };
    collect_artifacts(&mut result, &prepared.output_dir, dir, before, policy, ids, deadline, dead, started);
    result
}

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
    if o.tally.failed_answers > 0 {
        notes.push(format!(
            "{} seccomp notification answers were refused by the kernel (last: {}); those callers waited until the listener closed",
            o.tally.failed_answers,
            o.tally.last_answer_error.as_deref().unwrap_or("?")
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
                message: format!(
                    "the jail's PID 1 ended without reporting the script's status (wait status {:#x})",
                    o.pid1_status
                ),
                causes: vec![],
            });
            return result;
        }
    }
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
    fn timeouts_win_over_everything_the_script_did() {
        let f = Facts { ending: Ending::WallTimeout, oom_kills: 1, truncated: true, ..facts() };
        assert_eq!(status_of(&f), Some(Status::TimeoutWall));
        let f = Facts { ending: Ending::CpuTimeout, exit_code: None, signal: Some(9), ..facts() };
        assert_eq!(status_of(&f), Some(Status::TimeoutCpu));
    }

    #[test]
    fn rlimit_cpu_signals_mean_timeout_cpu() {
        let xcpu = Facts {
            exit_code: None,
            signal: Some(libc::SIGXCPU),
            cpu_rlimit: Some(Duration::from_secs(1)),
            ..facts()
        };
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
