//! The seam between making a jail and running one step in it.
//!
//! [`Jail::make`] takes a [`RunPlan`] and the compiled filter and makes
//! the jail: every channel (sync.rs), the clone into fresh namespaces
//! (born in a v2 run cgroup where the kernel can), the id maps; the child
//! then waits at the release barrier, and nothing of the script has run.
//! [`Jail::run`] runs one [`Step`] (step.rs) in it: the release, the
//! hand-overs (a v1 run cgroup made while the child builds its mounts and
//! its `tasks` files sent, the output tmpfs filled, the proxy listener),
//! the watch (watch.rs, capture.rs) until PID 1 is reaped, the cgroup's
//! usage read, and the verdict and delivery (verdict.rs); the run cgroup
//! itself is removed by [`Leftovers`], which the caller drops once the
//! result is out. `supervisor::run_with` is the two in a row. A [`Child`] guard
//! kills and reaps on every early return.
//!
//! What the step's clocks mean is the [`Loop`] the caller passes
//! (watch.rs): one script's deadlines for `jail run` (script.rs), or a
//! session's cells served over the control channel (session/cells.rs),
//! whose loop may also name another output folder to deliver to
//! ([`Loop::delivery`], session/adopt.rs). The seam knows no session: a
//! session is `supervisor::run_with` the cell driver as the script, the
//! request's `step` [`StepKind::Cells`](crate::request::StepKind) (the
//! plan opens the control channel), and its loop. A warm pool (pool.rs) is
//! sessions started ahead, one per request, and calls neither `make` nor
//! `run` itself.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::artifacts::TreeDead;
use crate::capture::Capture;
use crate::cgroup::{self, CgroupUsage, RunCgroup};
use crate::child::{self, ChildSpec, Confine};
use crate::host::Held;
use crate::output;
use crate::plan::{NetworkPlan, RunPlan};
use crate::proxy;
use crate::result::RunResult;
use crate::stage::Stage;
use crate::step::{Clock, Seen, Step};
use crate::streams::Target;
use crate::sync::{self, Channels, Pair};
use crate::sys::{self, Forked};
use crate::throttle::Throttle;
use crate::watch::{ChildPipes, Loop, Started, Tree, Watch};
use crate::{namespaces, seccomp, verdict};

#[derive(Debug, thiserror::Error)]
pub(crate) enum LaunchError {
    #[error(transparent)]
    Channel(sync::ChannelError),
    #[error(transparent)]
    Template(crate::template::TemplateError),
    #[error("drop supplementary groups before clone")]
    DropGroups(#[source] nix::Error),
    #[error("clone into new namespaces")]
    Clone(#[source] io::Error),
    #[error("write id maps")]
    IdMaps(#[source] namespaces::NamespaceError),
    #[error("map the fork's own host uid")]
    ForkUid(#[source] crate::template::uids::MapError),
    #[error("place the child in the run cgroup")]
    JoinCgroup(#[source] cgroup::CgroupError),
    #[error("make the run cgroup")]
    CreateCgroup(#[source] cgroup::CgroupError),
    #[error("fill the jail's output dir")]
    Output(#[source] output::OutputError),
    #[error("start the network proxy")]
    Proxy(#[source] proxy::ProxyError),
    #[error("release the child (the release pipe)")]
    Release(#[source] io::Error),
    #[error("receive the output tmpfs from PID 1")]
    ReceiveOutput(#[source] io::Error),
    #[error("let PID 1 go on once its output tmpfs was filled")]
    ReleaseOutput(#[source] io::Error),
    #[error("receive the proxy listener from PID 1")]
    ReceiveListener(#[source] io::Error),
    #[error("pidfd_open")]
    Pidfd(#[source] io::Error),
    #[error("wait for the jail")]
    Wait(#[source] io::Error),
}

impl LaunchError {
    pub(crate) fn stage(&self) -> Stage {
        match self {
            LaunchError::Channel(_) => Stage::Pipes,
            LaunchError::DropGroups(_) | LaunchError::Clone(_) | LaunchError::Template(_) => Stage::Clone,
            LaunchError::IdMaps(_) | LaunchError::ForkUid(_) => Stage::IdMaps,
            LaunchError::JoinCgroup(_) | LaunchError::CreateCgroup(_) => Stage::Cgroup,
            LaunchError::Output(_) => Stage::Output,
            LaunchError::Proxy(_) => Stage::Network,
            LaunchError::Release(_)
            | LaunchError::ReceiveOutput(_)
            | LaunchError::ReleaseOutput(_)
            | LaunchError::ReceiveListener(_) => Stage::Release,
            LaunchError::Pidfd(_) | LaunchError::Wait(_) => Stage::Wait,
        }
    }
}

/// The supervisor's ends of the channels, until the step takes them.
struct Ours {
    release: OwnedFd,
    pipes: ChildPipes,
    output: Option<OwnedFd>,
    notify: Option<OwnedFd>,
    proxy: Option<OwnedFd>,
    control: Option<OwnedFd>,
    cgroup: Option<OwnedFd>,
}

/// A made jail: its child cloned, mapped and, on v2, in its cgroup (a v1
/// one is made after the release), waiting at the release barrier.
/// Dropped unrun, the child is killed and reaped before the lease and the
/// cgroup go (fields drop in order).
pub(crate) struct Jail {
    child: Child,
    pid: Pid,
    pidfd: OwnedFd,
    ours: Option<Ours>,
    plan: RunPlan,
    held: Held,
    /// A fork of a template (template.rs) rather than our clone.
    forked: Option<crate::template::Forked>,
}

impl Jail {
    /// Make the jail `plan` describes, confined by `filter` (compiled from
    /// `plan.seccomp`), with what `held` holds on the host.
    pub(crate) fn make(mut plan: RunPlan, filter: seccomp::Filter, held: Held, clock: &mut Clock) -> Result<Jail, LaunchError> {
        // Every channel between us and the child, from what this run needs
        // (sync.rs has the table).
        let Channels { release, report, status, stdout, stderr, output, notify, proxy, control, cgroup } =
            Channels::new(plan.channels).map_err(LaunchError::Channel)?;
        let (output_ours, output_theirs) = split(output);
        let (notify_ours, notify_theirs) = split(notify);
        let (proxy_ours, proxy_theirs) = split(proxy);
        let (control_ours, control_theirs) = split(control);
        let (cgroup_ours, cgroup_theirs) = split(cgroup);
        if nix::unistd::getuid().is_root() {
            // The child can never call setgroups (it is denied in its user
            // namespace), so root's supplementary groups must go before the clone.
            nix::unistd::setgroups(&[]).map_err(LaunchError::DropGroups)?;
        }
        // How the child enters the run cgroup: born in it (v2), or moving
        // itself in (v1) through the `tasks` files the `cgroup` channel
        // brings it once the run cgroup is made, after the release.
        let clone_into = held
            .cgroup
            .as_ref()
            .map(RunCgroup::clone_into)
            .transpose()
            .map_err(LaunchError::JoinCgroup)?
            .flatten();
        let joins_later = cgroup_ours.is_some();
        let theirs = ChildEnds {
            release: release.read,
            report: report.write,
            status: status.write,
            stdout: stdout.write,
            stderr: stderr.write,
            output: output_theirs,
            notify: notify_theirs,
            proxy: proxy_theirs,
            control: control_theirs,
            cgroup: cgroup_theirs,
        };
        let spec = child_spec(&plan, filter, theirs);
        clock.mark("plan");
        let (pid, born_in_cgroup, forked) = match plan.template.as_deref() {
            None => {
                let (pid, born_in) = clone_child(spec, clone_into)?;
                (pid, born_in, None)
            }
            Some(socket) => {
                drop(clone_into);
                let forked = crate::template::fork(socket, spec).map_err(LaunchError::Template)?;
                (forked.pid, false, Some(forked))
            }
        };
        clock.mark(if forked.is_some() { "fork" } else { "clone" });
        let pidfd = sys::pidfd_open(pid).map_err(LaunchError::Pidfd)?;
        // From here every early return kills it, and reaps our own child
        // (Child's drop), before `held` goes.
        let child = Child {
            pid: Some(pid),
            fork: forked.is_some().then(|| pidfd.try_clone()).transpose().map_err(LaunchError::Pidfd)?,
        };
        match (forked, plan.root_uids) {
            // Root's fork: its own leased host uid, mapped from its
            // template's namespace (template/uids.rs); its gid is the
            // template's, the one every root-started jail shares.
            (Some(f), Some(_)) => {
                crate::template::uids::map_fork(pid, pidfd.as_fd(), plan.uid_map.inside, plan.uid_map.outside)
                    .map_err(LaunchError::ForkUid)?;
                plan.gid_map.outside = f.gid;
                clock.mark("id_maps");
            }
            // The fork mapped itself; it runs as its template's host ids,
            // which the output is written and judged as.
            (Some(f), None) => (plan.uid_map.outside, plan.gid_map.outside) = (f.uid, f.gid),
            (None, _) => {
                // Root's template maps the lease range too, for its forks.
                let uid_lines = plan
                    .root_uids
                    .filter(|_| plan.is_template)
                    .and_then(|range| crate::template::uids::template_uid_map(plan.uid_map.inside, plan.uid_map.outside, range));
                namespaces::write_id_maps(pid, plan.uid_map, plan.gid_map, uid_lines.as_deref()).map_err(LaunchError::IdMaps)?;
                clock.mark("id_maps");
            }
        }
        if let (Some(cg), false) = (&held.cgroup, born_in_cgroup || joins_later) {
            // The slow way, on a kernel without CLONE_INTO_CGROUP; before the
            // release, so none of the child's code runs outside.
            cg.join(pid.as_raw() as u32).map_err(LaunchError::JoinCgroup)?;
            clock.mark("cgroup_join");
        }
        let pipes = ChildPipes {
            stdout: stdout.read,
            stderr: stderr.read,
            report: report.read,
            status: status.read,
        };
        let ours = Ours {
            release: release.write,
            pipes,
            output: output_ours,
            notify: notify_ours,
            proxy: proxy_ours,
            control: control_ours,
            cgroup: cgroup_ours,
        };
        Ok(Jail { child, pid, pidfd, ours: Some(ours), plan, held, forked })
    }

    /// Run one step: release the child, watch it until PID 1 is reaped,
    /// read the run cgroup's usage, and build the result; what holds the
    /// host (the run cgroup, the uid lease) goes with the [`Leftovers`].
    /// Consumes the jail: a one-shot step ends with its PID 1. `lp` is
    /// what the step's clocks mean (watch.rs).
    pub(crate) fn run(mut self, mut step: Step<'_>, lp: &mut dyn Loop) -> (RunResult, Leftovers) {
        if self.forked.is_some() {
            let ids = (self.plan.uid_map.outside, self.plan.gid_map.outside);
            crate::template::note(&mut step.result, ids, self.held.leased() && self.plan.root_uids.is_none());
        }
        let launched = self.release_and_watch(&mut step, lp);
        if launched.is_err() {
            // Whatever failed, the tree dies before its cgroup is read.
            self.child.kill();
        }
        // The tree is dead (PID 1 reaped): what it used, before the verdict.
        let cgroup_usage = self.cgroup_usage();
        let result = match launched {
            // The verdict, then the output dir judged and delivered (verdict.rs).
            // Where the loop says (a session's adopted folder), else as planned.
            Ok(outcome) => {
                let mut result = verdict::assemble(step, outcome, cgroup_usage, &self.plan, lp.delivery());
                (result.results, result.results_dropped) = lp.results();
                result
            }
            Err(e) => verdict::failed(step.result, e.stage().error(&e), step.clock.started),
        };
        let Jail { held, .. } = self;
        (result, Leftovers { held })
    }

    /// Release the child, hand it what it asks for after the release, and
    /// watch until PID 1 is reaped.
    fn release_and_watch(&mut self, step: &mut Step<'_>, lp: &mut dyn Loop) -> Result<Seen, LaunchError> {
        let ours = self
            .ours
            .take()
            .ok_or_else(|| LaunchError::Release(io::Error::other("the jail already ran a step")))?;
        sync::release(ours.release).map_err(LaunchError::Release)?;
        let released_at = Instant::now();
        if let Some(sock) = ours.cgroup {
            // While the child builds its mounts, which need no cgroup: the
            // v1 run cgroup, made with its limits, then its `tasks` files
            // to the child, which moves itself in before it forks the
            // worker. A failure here fails the run before the script starts.
            self.give_cgroup(sock)?;
            step.clock.mark("cgroup");
        }
        let ids = output::FsIds { uid: self.plan.uid_map.outside, gid: self.plan.gid_map.outside };
        let handover_by = released_at + self.plan.wall_time;
        let output = match ours.output {
            None => None,
            Some(sock) => {
                let snapshot = |dir: &OwnedFd| step.before.retake_output_at(dir, &step.policy.artifacts);
                fill_output(sock, &self.plan.output.host_dir, ids, handover_by, snapshot)?
            }
        };
        if output.is_some() {
            step.clock.mark("output_copy_in");
        }
        // Threads may start now: the clone, which needs a single-threaded
        // process, is behind us.
        let proxy = match (ours.proxy, &self.plan.network) {
            (Some(sock), NetworkPlan::Allowlist { rules, resolver, .. }) => match receive_listener(sock, handover_by)? {
                None => None,
                Some(listener) => Some(proxy::start(listener, rules.clone(), resolver.clone()).map_err(LaunchError::Proxy)?),
            },
            _ => None,
        };
        if proxy.is_some() {
            step.clock.mark("proxy");
        }
        let handed = Handed {
            seed: &step.result,
            output: output.as_ref().map(|(fd, _)| fd),
            control: ours.control,
        };
        let seen = self.watch(ours.pipes, ours.notify, handed, lp)?;
        step.clock.mark("reaped");
        // The tree is dead: every client socket is closed, so every relay ends.
        let network = proxy.map(proxy::Proxy::finish);
        Ok(Seen { released_at, output, network, ..seen })
    }

    /// The watch loop until PID 1 is gone and the pipes drained, then the
    /// reaping.
    fn watch(
        &mut self,
        pipes: ChildPipes,
        notify: Option<OwnedFd>,
        handed: Handed<'_>,
        lp: &mut dyn Loop,
    ) -> Result<Seen, LaunchError> {
        let plan = &self.plan;
        let deadline = Instant::now() + plan.wall_time;
        let model = Rc::clone(&plan.seccomp.model);
        let mut watch = Watch::new(
            deadline,
            Capture::new(plan.output.stdout_cap, plan.output.streams, Target::Stdout),
            Capture::new(plan.output.stderr_cap, plan.output.streams, Target::Stderr),
            notify,
            match plan.network {
                NetworkPlan::Allowlist { .. } => seccomp::Tally::new().tcp_only(),
                NetworkPlan::None => seccomp::Tally::new(),
            },
            &model,
        );
        // No cpu cgroup: the supervisor holds the tree to the quota itself.
        watch.throttle = plan.limits.cpu_throttle.map(|cores| Throttle::new(cores, self.pid));
        let cgroup = self.held.cgroup.as_ref();
        lp.started(Started {
            seed: handed.seed,
            pid: self.pid,
            wall: deadline,
            cpu_limit: match (cgroup, plan.limits.cpu_watch) {
                (Some(_), Some(limit)) => Some(limit.as_nanos() as u64),
                _ => None,
            },
            cpu_rlimit: plan.limits.cpu_rlimit,
            cgroup_dirs: cgroup.map(|cg| cg.dirs().collect()).unwrap_or_default(),
            output: handed.output,
            ids: output::FsIds { uid: plan.uid_map.outside, gid: plan.gid_map.outside },
            control: handed.control,
        });
        let tree = Tree::new(self.pid, self.pidfd.as_fd(), cgroup);
        let (ending, reports) = watch.run(lp, &tree, &self.pidfd, pipes);
        // Streaming: the caller gets until the deadline to take what is queued,
        // never longer (a reader that stopped reading cannot hold the run).
        let throttled = watch.throttle.as_ref().map(|t| t.report(Instant::now()));
        watch.stdout.end(deadline);
        watch.stderr.end(deadline);
        let reaped = self.child.reap().map_err(LaunchError::Wait)?;
        let (pid1_status, rusage) = (reaped.map(|r| r.0), reaped.map(|r| r.1));
        let ended_at = Instant::now();
        // PID 1 is reaped only once its pid namespace is empty: nothing can
        // change the output tmpfs under the mirror now, nor the output dir
        // under the artifact walk.
        let tree_dead = TreeDead::after_reaping_pid1();
        Ok(Seen {
            reports,
            tally: watch.tally,
            stdout: watch.stdout,
            stderr: watch.stderr,
            ending,
            deadline,
            exec_at: watch.exec_at,
            released_at: Instant::now(),
            ended_at,
            rusage,
            pid1_status,
            output: None,
            ids: output::FsIds { uid: plan.uid_map.outside, gid: plan.gid_map.outside },
            tree_dead,
            network: None,
            throttled,
        })
    }

    /// Make the run cgroup if it is not made yet (sweeping first what
    /// killed jails left where it goes: a name of ours they left would
    /// refuse the mkdir), and send the child its `tasks` files.
    fn give_cgroup(&mut self, sock: OwnedFd) -> Result<(), LaunchError> {
        if let Some(planned) = self.held.cgroup_later.take() {
            cgroup::sweep(&planned.candidate);
            self.held.cgroup = Some(RunCgroup::create(&planned).map_err(LaunchError::CreateCgroup)?);
        }
        let tasks = match &self.held.cgroup {
            Some(cg) => cg.tasks_files().map_err(LaunchError::JoinCgroup)?,
            None => Vec::new(),
        };
        // Not sending (none to send, or the child already gone) leaves the
        // child the end-of-file it fails on, with its own report of why.
        let fds: Vec<_> = tasks.iter().map(AsFd::as_fd).collect();
        if !fds.is_empty() {
            let _ = sys::send_fds(sock.as_fd(), &fds);
        }
        Ok(())
    }

    /// Read what the dead tree used; the run cgroup goes with the
    /// [`Leftovers`].
    fn cgroup_usage(&self) -> Option<CgroupUsage> {
        self.held.cgroup.as_ref().map(RunCgroup::usage)
    }
}

/// What the launch hands the step's loop besides the clocks (watch.rs,
/// `Started`).
struct Handed<'a> {
    seed: &'a RunResult,
    output: Option<&'a OwnedFd>,
    control: Option<OwnedFd>,
}

/// What a finished run still holds on the host: the run cgroup (empty, its
/// tree dead and its usage read) and the uid lease. Dropped, the cgroup is
/// removed and the lease returned; `jail run` drops it once the result is
/// printed, since no caller waits for either.
pub(crate) struct Leftovers {
    held: Held,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if let Some(cg) = self.held.cgroup.take() {
            if let Err(e) = cg.remove() {
                crate::relay::tell_stderr(&format!("jail: the run cgroup was not removed: {}\n", crate::stage::chain_line(&e)));
            }
        }
    }
}

/// The child's ends of its channels (sync.rs), moved into its spec.
struct ChildEnds {
    release: OwnedFd,
    report: OwnedFd,
    status: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    output: Option<OwnedFd>,
    notify: Option<OwnedFd>,
    proxy: Option<OwnedFd>,
    control: Option<OwnedFd>,
    cgroup: Option<OwnedFd>,
}

/// Everything the child side needs, from the plan, with its ends of the
/// channels.
fn child_spec(plan: &RunPlan, filter: seccomp::Filter, theirs: ChildEnds) -> ChildSpec {
    ChildSpec {
        release: theirs.release,
        report: theirs.report,
        status: theirs.status,
        stdout: theirs.stdout,
        stderr: theirs.stderr,
        mounts: plan.mounts.clone(),
        // A private tmpfs over /tmp, in the child's own mount namespace only.
        staging: PathBuf::from("/tmp"),
        uid: plan.sandbox.uid,
        gid: plan.sandbox.gid,
        hostname: plan.sandbox.hostname.clone(),
        exec: plan.exec.clone(),
        rlimits: plan.limits.rlimits.clone(),
        output: theirs.output,
        confine: Confine {
            landlock: plan.landlock.clone(),
            landlock_rules: plan.landlock_rules.clone(),
            seccomp: (!plan.is_template).then_some(filter),
            notify: theirs.notify,
            tcp_connect: match &plan.network {
                NetworkPlan::Allowlist { tcp_connect, .. } => tcp_connect.clone(),
                NetworkPlan::None => vec![],
            },
        },
        proxy: theirs.proxy,
        cgroup: theirs.cgroup,
        cpus: plan.cpus.clone(),
        stdin: theirs.control,
        keep_host_root: plan.is_template,
        uid_mapped_by_supervisor: plan.template.is_some() && plan.root_uids.is_some(),
    }
}

/// Clone the child into its namespaces (born in the run cgroup when the
/// kernel can), and close our copies of its ends, or we would never see
/// EOF. Returns its pid and whether it was born in the cgroup.
fn clone_child(spec: ChildSpec, clone_into: Option<OwnedFd>) -> Result<(Pid, bool), LaunchError> {
    let born_in_cgroup = match &clone_into {
        Some(dir) => sys::clone_into_cgroup(namespaces::CLONE_FLAGS, dir.as_fd()).map_err(LaunchError::Clone)?,
        None => None,
    };
    let born_in = born_in_cgroup.is_some();
    let forked = match born_in_cgroup {
        Some(f) => f,
        None => sys::clone_process(namespaces::CLONE_FLAGS).map_err(LaunchError::Clone)?,
    };
    let pid = match forked {
        Forked::Child => child::run(spec),
        Forked::Parent(pid) => pid,
    };
    drop(spec);
    drop(clone_into);
    Ok((pid, born_in))
}

/// Take the output tmpfs from the child, copy the host output folder into
/// it, take the `snapshot` the script's changes are judged against, and
/// only then let the child go on. `None` when the child ended before
/// handing it over (its report says why).
fn fill_output(
    sock: OwnedFd,
    host: &Path,
    ids: output::FsIds,
    deadline: Instant,
    snapshot: impl FnOnce(&OwnedFd),
) -> Result<Option<(OwnedFd, output::Inventory)>, LaunchError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as u64).unwrap_or(PollTimeout::MAX);
    if !matches!(poll(&mut fds, timeout), Ok(n) if n > 0) {
        return Ok(None);
    }
    let Some(dir) = sys::recv_fd(sock.as_fd()).map_err(LaunchError::ReceiveOutput)? else {
        return Ok(None);
    };
    let inventory = output::copy_in(host, &dir, ids).map_err(LaunchError::Output)?;
    // Changes are judged where the script makes them, on the tmpfs, against
    // the state before its script can run: the release comes after.
    snapshot(&dir);
    sync::release(sock).map_err(LaunchError::ReleaseOutput)?;
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
    sys::recv_fd(sock.as_fd()).map_err(LaunchError::ReceiveListener)
}

/// A channel's two ends, apart; both `None` for a channel the run lacks.
fn split(pair: Option<Pair>) -> (Option<OwnedFd>, Option<OwnedFd>) {
    match pair {
        Some(Pair { ours, theirs }) => (Some(ours), Some(theirs)),
        None => (None, None),
    }
}

/// A jail's PID 1 the supervisor has not seen end yet. Dropped, it is
/// killed and, when it is our child, reaped, so no early return can leave
/// a live jail behind.
struct Child {
    pid: Option<Pid>,
    /// A template's fork (not our child: its template reaps it), by its
    /// pidfd, which a reused pid can never stand for.
    fork: Option<OwnedFd>,
}

impl Child {
    /// Wait for PID 1 (and so for its whole pid namespace) to end: its
    /// wait status and usage, which only its parent can read (`None` for
    /// a fork, whose pidfd has said it ended).
    fn reap(&mut self) -> io::Result<Option<(libc::c_int, libc::rusage)>> {
        match (self.pid.take(), &self.fork) {
            (Some(_), Some(pidfd)) => {
                ended_within(pidfd, None);
                Ok(None)
            }
            (Some(pid), None) => sys::wait4(pid).map(Some),
            (None, _) => Err(io::Error::other("the child was already reaped")),
        }
    }

    /// Kill the tree (PID 1 takes its namespace with it) and reap it.
    fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            match &self.fork {
                Some(pidfd) => {
                    let _ = sys::pidfd_send_signal(pidfd.as_fd(), Signal::SIGKILL);
                    ended_within(pidfd, None);
                }
                None => {
                    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                    let _ = sys::wait4(pid);
                }
            }
        }
    }
}

/// Wait until the process of `pidfd` has ended (its pidfd readable).
fn ended_within(pidfd: &OwnedFd, _limit: Option<std::time::Duration>) {
    loop {
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}
