//! The machine, read once before a run is planned: who called, which host
//! ids the sandbox gets (a leased uid for root), what the kernel offers
//! (seccomp user notification and its CONTINUE flag, the Landlock ABI),
//! the caller's hard rlimits, and the run cgroup (its place chosen, or why
//! there is none; a v2 one created here, a v1 one planned for after the
//! clone). [`Host`] is the facts `plan::plan` reads, and plain data a test
//! can write by hand; [`Held`] is what must live as long as the jail.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cgroup::{self, Candidate, Planned, RunCgroup};
use crate::hostuid::{self, HostUidError, Lease};
use crate::policy::Policy;
use crate::rlimits::{self, Kind};
use crate::{landlock, limits, seccomp};

/// The facts a run is planned from. No I/O reads them after [`gather`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Host {
    pub(crate) caller_uid: u32,
    pub(crate) caller_gid: u32,
    /// The host ids the sandbox maps to: the caller's own, or for root a
    /// leased uid and the policy's shared gid (hostuid.rs).
    pub(crate) host_uid: u32,
    pub(crate) host_gid: u32,
    pub(crate) seccomp_mode: seccomp::Mode,
    /// Whether the kernel takes SECCOMP_USER_NOTIF_FLAG_CONTINUE (5.5).
    pub(crate) notify_continue: bool,
    pub(crate) landlock_abi: u32,
    /// The caller's hard rlimits: nothing the jail sets goes above them.
    pub(crate) rlimit_hard: Vec<(Kind, u64)>,
    /// Where the run cgroup is (v2) or will be made (v1), or `None` with
    /// `cgroup_why_not`.
    pub(crate) cgroup: Option<Candidate>,
    pub(crate) cgroup_why_not: String,
    /// The systemd scope the run cgroup lies in, when the jail asked the
    /// user manager for one (delegate.rs).
    pub(crate) systemd_scope: Option<crate::delegate::Scope>,
    /// The values of the policy's `environment.pass` variables that are set.
    pub(crate) env: BTreeMap<String, String>,
    /// What the run's view of its limits is made from (inside.rs).
    pub(crate) inside: crate::inside::HostFacts,
}

impl Host {
    /// The hard limit for `kind`, as `rlimits::current_hard` read it.
    pub(crate) fn hard(&self, kind: Kind) -> u64 {
        self.rlimit_hard.iter().find(|(k, _)| *k == kind).map_or(u64::MAX, |&(_, v)| v)
    }
}

/// What a run holds on the host until its tree is dead: the uid lease (no
/// other live run gets the uid) and the run cgroup (removed by the run, or
/// by its drop).
pub(crate) struct Held {
    pub(crate) _lease: Option<Lease>,
    pub(crate) cgroup: Option<RunCgroup>,
    /// A v1 run cgroup not made yet: the launch makes it after the clone,
    /// while the child builds its mounts, and moves it into `cgroup`.
    pub(crate) cgroup_later: Option<Planned>,
}

impl Held {
    /// Whether a host uid was leased for the run (a root caller).
    pub(crate) fn leased(&self) -> bool {
        self._lease.is_some()
    }
}

/// Who called, before any lease: what a failed lease reports.
pub(crate) fn caller() -> (u32, u32) {
    (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw())
}

const KINDS: [Kind; 7] = [
    Kind::As,
    Kind::Nproc,
    Kind::Cpu,
    Kind::Fsize,
    Kind::Nofile,
    Kind::Core,
    Kind::Memlock,
];

/// Read the machine for a run of `policy` lasting `wall`: lease the host
/// uid (root only), read the kernel's features, and choose the run cgroup
/// where the host offers one (a v2 one is created now). Only the lease can
/// fail; a v2 cgroup that cannot be made leaves the run to rlimits, with
/// the reason kept.
pub(crate) fn gather(
    policy: &Policy,
    wall: Duration,
    pass: &std::collections::BTreeMap<String, String>,
) -> Result<(Host, Held), HostUidError> {
    let (caller_uid, caller_gid) = caller();
    let ids = hostuid::for_caller(caller_uid, caller_gid, &policy.identity)?;
    let rlimit_hard: Vec<(Kind, u64)> = KINDS.iter().map(|&k| (k, rlimits::current_hard(k))).collect();
    let env = policy
        .environment
        .pass
        .iter()
        // The caller read them (hostenv.rs): the library reads no variable.
        .filter_map(|k| pass.get(k).map(|v| (k.clone(), v.clone())))
        .collect();
    let mut host = Host {
        caller_uid,
        caller_gid,
        host_uid: ids.uid,
        host_gid: ids.gid,
        seccomp_mode: seccomp::host_mode(),
        notify_continue: seccomp::host_can_continue(),
        landlock_abi: landlock::kernel_abi(),
        rlimit_hard,
        cgroup: None,
        cgroup_why_not: String::new(),
        systemd_scope: None,
        env,
        inside: crate::inside::HostFacts::read(),
    };
    let (cgroup, cgroup_later) = match run_cgroup(policy, wall, &mut host) {
        None => (None, None),
        Some(RunCgroupNow::Made(cg)) => (Some(cg), None),
        Some(RunCgroupNow::Later(planned)) => (None, Some(planned)),
    };
    Ok((host, Held { _lease: ids.lease, cgroup, cgroup_later }))
}

/// The run cgroup as `gather` leaves it.
enum RunCgroupNow {
    Made(RunCgroup),
    Later(Planned),
}

/// Choose the cgroup backend and plan the run cgroup. A v2 one is created
/// now, with what killed jails left there swept first; on failure, `None`
/// and the reason in `host.cgroup_why_not`. A v1 one is left for the
/// launch to make after the clone.
fn run_cgroup(policy: &Policy, wall: Duration, host: &mut Host) -> Option<RunCgroupNow> {
    let l = &policy.limits;
    let wanted = cgroup::Settings { memory: l.memory, cpus: l.cpus, pids: l.pids, cpu_time: l.cpu_time.is_some() };
    let (_, choice) = cgroup::choose_here(l.cgroup_parent.as_deref(), &wanted);
    let (choice, scope) = crate::delegate::fill_in(choice, l.systemd_delegation, l.cgroup_parent.is_some(), &wanted);
    host.cgroup_why_not = choice.notes.join("; ");
    let candidate = choice.candidate?;
    let planned = Planned {
        // The settings it gets are those the plan will give it (limits.rs).
        settings: limits::plan(policy, wall, Some(&candidate), "", &|k| host.hard(k)).settings,
        leaf: cgroup::leaf_for(candidate.version, host.caller_uid, host.host_uid),
        name: cgroup::run_name(),
        candidate,
    };
    if planned.candidate.version.made_after_clone() {
        // Made after the clone, while the child builds its mounts, which
        // takes it off the path (launch.rs); the plan counts on it, so a
        // failure to make it then fails the run before the script starts.
        host.cgroup = Some(planned.candidate.clone());
        host.systemd_scope = scope;
        return Some(RunCgroupNow::Later(planned));
    }
    // v2 before the clone: clone3 starts the child in it.
    cgroup::sweep(&planned.candidate);
    match RunCgroup::create(&planned) {
        Ok(cg) => {
            host.cgroup = Some(planned.candidate);
            host.systemd_scope = scope;
            Some(RunCgroupNow::Made(cg))
        }
        Err(e) => {
            host.cgroup_why_not = format!("creating the run cgroup failed: {}", crate::stage::chain_line(&e));
            None
        }
    }
}
