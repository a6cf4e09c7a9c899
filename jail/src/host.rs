//! The machine, read once before a run is planned: who called, which host
//! ids the sandbox gets (a leased uid for root), what the kernel offers
//! (seccomp user notification and its CONTINUE flag, the Landlock ABI),
//! the caller's hard rlimits, and the run cgroup (created here, or why
//! not). [`Host`] is the facts `plan::plan` reads, and plain data a test
//! can write by hand; [`Held`] is what must live as long as the jail.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cgroup::{self, Candidate, RunCgroup};
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
    /// Where the run cgroup was created, or `None` with `cgroup_why_not`.
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
/// uid (root only), read the kernel's features, and create the run cgroup
/// where the host offers one. Only the lease can fail; a cgroup that
/// cannot be made leaves the run to rlimits, with the reason kept.
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
    let cgroup = run_cgroup(policy, wall, &mut host);
    Ok((host, Held { _lease: ids.lease, cgroup }))
}

/// Choose the cgroup backend, sweep what killed jails left there, and
/// create the run cgroup with its limits; on failure, `None` and the
/// reason in `host.cgroup_why_not`.
fn run_cgroup(policy: &Policy, wall: Duration, host: &mut Host) -> Option<RunCgroup> {
    let l = &policy.limits;
    let wanted = cgroup::Settings { memory: l.memory, cpus: l.cpus, pids: l.pids, cpu_time: l.cpu_time.is_some() };
    let (_, choice) = cgroup::choose_here(l.cgroup_parent.as_deref(), &wanted);
    let (choice, scope) = crate::delegate::fill_in(choice, l.systemd_delegation, l.cgroup_parent.is_some(), &wanted);
    host.cgroup_why_not = choice.notes.join("; ");
    let candidate = choice.candidate?;
    cgroup::sweep(&candidate);
    // The settings it gets are those the plan will give it (limits.rs).
    let settings = limits::plan(policy, wall, Some(&candidate), "", &|k| host.hard(k)).settings;
    match RunCgroup::create(&candidate, &cgroup::run_name(), &settings) {
        Ok(cg) => {
            host.cgroup = Some(candidate);
            host.systemd_scope = scope;
            Some(cg)
        }
        Err(e) => {
            host.cgroup_why_not = format!("creating the run cgroup failed: {}", crate::stage::chain_line(&e));
            None
        }
    }
}
