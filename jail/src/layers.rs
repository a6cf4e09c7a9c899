//! What confines the run, made before anything is cloned: the run cgroup
//! and the plan of what enforces each limit, the seccomp filter (compiled
//! from the policy's model, with more refused when no cgroup counts memory)
//! and the landlock plan. A policy the kernel cannot honour fails here.

use std::rc::Rc;
use std::time::Duration;

use crate::cgroup::{self, RunCgroup};
use crate::policy::{Network, Policy};
use crate::{delegate, landlock, limits, rlimits, seccomp};

/// The seccomp program, the model it was compiled from (the policy's, or
/// that with `refuse` added), and the landlock plan for this run.
pub(crate) struct Confinement {
    pub(crate) filter: seccomp::Filter,
    pub(crate) model: Rc<seccomp::Model>,
    pub(crate) landlock: landlock::Plan,
}

pub(crate) fn confine(policy: &Policy, refuse: &[&str]) -> Result<Confinement, (&'static str, Box<dyn std::error::Error>)> {
    confine_in(policy, seccomp::host_mode(), seccomp::host_can_continue(), refuse)
}

fn confine_in(
    policy: &Policy,
    mode: seccomp::Mode,
    can_continue: bool,
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
    if matches!(policy.network, Network::Allowlist(_)) && !can_continue {
        // The supervisor lets a TCP socket(2) through by answering its
        // notification with SECCOMP_USER_NOTIF_FLAG_CONTINUE, which the
        // kernel takes only from Linux 5.5 on.
        return Err((
            "seccomp",
            "network.mode allowlist needs Linux 5.5 or later (SECCOMP_USER_NOTIF_FLAG_CONTINUE), and this kernel is older; \
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

/// The run's cgroup, when this host gives one, and what enforces each limit.
pub(crate) struct Resources {
    pub(crate) cgroup: Option<RunCgroup>,
    pub(crate) plan: limits::Plan,
}

/// Choose the cgroup backend, sweep what killed jails left there, create
/// the run cgroup with its limits, and plan the rest. A cgroup that cannot
/// be created leaves the run to rlimits, with the reason in the result.
pub(crate) fn setup_resources(policy: &Policy, wall: Duration) -> Resources {
    let l = &policy.limits;
    let wanted = cgroup::Settings { memory: l.memory, cpus: l.cpus, pids: l.pids, cpu_time: l.cpu_time.is_some() };
    let (_, choice) = cgroup::choose_here(l.cgroup_parent.as_deref(), &wanted);
    let (choice, scope) = delegate::fill_in(choice, l.systemd_delegation, l.cgroup_parent.is_some(), &wanted);
    let mut why_not = choice.notes.join("; ");
    if let Some(candidate) = &choice.candidate {
        cgroup::sweep(candidate);
        let mut plan = limits::plan(policy, wall, Some(candidate), "", &rlimits::current_hard);
        if let Some(scope) = &scope {
            delegate::annotate(&mut plan, scope);
        }
        match RunCgroup::create(candidate, &cgroup::run_name(), &plan.settings) {
            Ok(cg) => return Resources { cgroup: Some(cg), plan },
            Err(e) => {
                let cause = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
                why_not = format!("creating the run cgroup failed: {e}{cause}");
            }
        }
    }
    Resources {
        cgroup: None,
        plan: limits::plan(policy, wall, None, &why_not, &rlimits::current_hard),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn an_allowlist_without_seccomp_notification_fails_instead_of_allowing_udp() {
        let policy = Policy::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/allowlist-example.json"))).unwrap();
        let Err((stage, e)) = confine_in(&policy, seccomp::Mode::ErrnoOnly, true, &[]) else {
            panic!("confined without notification")
        };
        assert_eq!(stage, "seccomp");
        assert!(e.to_string().contains("network.mode none"), "{e}");
        assert!(confine_in(&policy, seccomp::Mode::Notify, true, &[]).is_ok());
        assert!(confine_in(&Policy::builtin_default().unwrap(), seccomp::Mode::ErrnoOnly, false, &[]).is_ok());
    }

    #[test]
    fn an_allowlist_on_a_kernel_without_notification_continue_fails_with_the_version() {
        let policy = Policy::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/allowlist-example.json"))).unwrap();
        let Err((stage, e)) = confine_in(&policy, seccomp::Mode::Notify, false, &[]) else {
            panic!("allowlist on Linux 5.0-5.4")
        };
        assert_eq!(stage, "seccomp");
        assert!(e.to_string().contains("Linux 5.5"), "{e}");
        // Network off needs no CONTINUE.
        assert!(confine_in(&Policy::builtin_default().unwrap(), seccomp::Mode::Notify, false, &[]).is_ok());
    }
}
