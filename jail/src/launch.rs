//! The launch: make the channels, clone the child into its namespaces,
//! write its id maps, place it in the run cgroup, release it, hand the
//! output tmpfs and the proxy listener across, and watch it until PID 1 is
//! reaped. A [`Child`] guard kills and reaps on every early return.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::artifacts::{self, TreeDead};
use crate::capture::{Capture, Target};
use crate::cgroup::{self, RunCgroup};
use crate::child::{self, ChildSpec, Confine, Exec};
use crate::layers::{Confinement, Resources};
use crate::mounts;
use crate::output;
use crate::policy::Network;
use crate::proxy;
use crate::request::{Prepared, RunRequest};
use crate::sync::{self, ms_since, Channels, Pair, Report, Wanted};
use crate::sys::{self, Forked};
use crate::watch::{ChildPipes, Deadlines, Ending, Watch};
use crate::{landlock, namespaces, seccomp};

#[derive(Debug, thiserror::Error)]
pub(crate) enum LaunchError {
    #[error(transparent)]
    Channel(sync::ChannelError),
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
    pub(crate) fn stage(&self) -> &'static str {
        match self {
            LaunchError::Channel(_) => "pipes",
            LaunchError::DropGroups(_) | LaunchError::Clone(_) => "clone",
            LaunchError::IdMaps(_) => "id_maps",
            LaunchError::JoinCgroup(_) => "cgroup",
            LaunchError::Output(_) => "output",
            LaunchError::Proxy(_) => "network",
            LaunchError::Release(_)
            | LaunchError::ReceiveOutput(_)
            | LaunchError::ReleaseOutput(_)
            | LaunchError::ReceiveListener(_) => "release",
            LaunchError::Pidfd(_) | LaunchError::Wait(_) => "wait",
        }
    }
}

/// What the watch loop saw.
pub(crate) struct Outcome {
    pub(crate) reports: Vec<Report>,
    pub(crate) tally: seccomp::Tally,
    pub(crate) stdout: Capture,
    pub(crate) stderr: Capture,
    pub(crate) ending: Ending,
    pub(crate) deadline: Instant,
    pub(crate) exec_at: Option<Instant>,
    pub(crate) released_at: Instant,
    pub(crate) ended_at: Instant,
    pub(crate) rusage: libc::rusage,
    pub(crate) pid1_status: libc::c_int,
    pub(crate) started_ns: u64,
    /// The jail's output tmpfs and what was copied into it, to be judged and
    /// mirrored (delivery.rs); `None` with a bound output dir.
    pub(crate) output: Option<(OwnedFd, output::Inventory)>,
    pub(crate) ids: output::FsIds,
    pub(crate) tree_dead: TreeDead,
    pub(crate) network: Option<crate::result::NetworkReport>,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
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
    // Every channel between us and the child, from what this run needs
    // (sync.rs has the table).
    let proxy_route = match (&req.policy.network, &prepared.resolver) {
        (Network::Allowlist(rules), Some(resolver)) => Some((rules.clone(), resolver.clone())),
        _ => None,
    };
    let Channels {
        release,
        report,
        status,
        stdout: out,
        stderr: err,
        output,
        notify,
        proxy,
        control,
    } = Channels::new(Wanted {
        // A size-capped output dir comes back to us as a descriptor (output.rs).
        output: prepared.mount_request.output_size.is_some(),
        // The worker sends the seccomp notification listener over this.
        notify: confinement.filter.mode == seccomp::Mode::Notify,
        // With the allowlist, PID 1 hands us the proxy's listener (network.rs).
        proxy: proxy_route.is_some(),
        // A session's cell driver reads its cells from this (session.rs).
        control: req.session.is_some(),
    })
    .map_err(LaunchError::Channel)?;
    let (output_ours, output_theirs) = split(output);
    let (notify_ours, notify_theirs) = split(notify);
    let (proxy_sock, proxy_theirs) = split(proxy);
    let (control_ours, control_theirs) = split(control);
    let proxy_ours = proxy_sock.zip(proxy_route).map(|(sock, (rules, resolver))| (sock, rules, resolver));
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
    let theirs = ChildEnds {
        release: release.read,
        report: report.write,
        status: status.write,
        stdout: out.write,
        stderr: err.write,
        output: output_theirs,
        notify: notify_theirs,
        proxy: proxy_theirs,
        control: control_theirs,
    };
    let spec = child_spec(req, prepared, resources, confinement, theirs, self_join);
    stages.insert("plan".into(), ms_since(started));
    let (pid, born_in_cgroup) = clone_child(spec, clone_into)?;
    let joined = born_in_cgroup || self_joins;
    stages.insert("clone".into(), ms_since(started));
    // From here every early return kills and reaps it (Child's drop).
    let jail = Child { pid: Some(pid) };
    namespaces::write_id_maps(pid, uid_map, gid_map).map_err(LaunchError::IdMaps)?;
    stages.insert("id_maps".into(), ms_since(started));
    if let (Some(cg), false) = (&resources.cgroup, joined) {
        // The slow way, on a kernel without CLONE_INTO_CGROUP; before the
        // release, so none of the child's code runs outside.
        cg.join(pid.as_raw() as u32).map_err(LaunchError::JoinCgroup)?;
        stages.insert("cgroup_join".into(), ms_since(started));
    }
    let pidfd = sys::pidfd_open(pid).map_err(LaunchError::Pidfd)?;
    sync::release(release.write).map_err(LaunchError::Release)?;
    let released_at = Instant::now();
    let ids = output::FsIds { uid: uid_map.outside, gid: gid_map.outside };
    let output = match output_ours {
        None => None,
        Some(sock) => {
            let snapshot = |dir: &OwnedFd| before.retake_output_at(dir, &req.policy.artifacts);
            fill_output(sock, &prepared.output_dir, ids, released_at + prepared.wall_time, snapshot)?
        }
    };
    if output.is_some() {
        stages.insert("output_copy_in".into(), ms_since(started));
    }
    // Threads may start now: the clone, which needs a single-threaded
    // process, is behind us.
    let proxy = match proxy_ours {
        None => None,
        Some((sock, rules, resolver)) => match receive_listener(sock, released_at + prepared.wall_time)? {
            None => None,
            Some(listener) => Some(proxy::start(listener, rules, resolver).map_err(LaunchError::Proxy)?),
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
    let pipes = ChildPipes { stdout: out.read, stderr: err.read, report: report.read, status: status.read };
    let ending = match (&req.session, control_ours) {
        // A session serves its cells over the control channel instead of
        // waiting for one script (session/serve.rs).
        (Some(session), Some(control)) => {
            crate::session::serve::serve(session, &mut watch, pid, &pidfd, pipes, control, &limits, resources.cgroup.as_ref())
        }
        _ => watch.run(pid, &pidfd, pipes, &limits, resources.cgroup.as_ref()),
    };
    // Streaming: the caller gets until the deadline to take what is queued,
    // never longer (a reader that stopped reading cannot hold the run).
    watch.stdout.end(deadline);
    watch.stderr.end(deadline);
    let (pid1_status, rusage) = jail.reap().map_err(LaunchError::Wait)?;
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
}

/// Everything the child side needs, with its ends of the channels.
fn child_spec(
    req: &RunRequest,
    prepared: &Prepared,
    resources: &Resources,
    confinement: Confinement,
    theirs: ChildEnds,
    cgroup_tasks: Vec<OwnedFd>,
) -> ChildSpec {
    let mount_ops = mounts::plan(&prepared.mount_request);
    let landlock_rules = landlock::rules(&mount_ops);
    ChildSpec {
        release: theirs.release,
        report: theirs.report,
        status: theirs.status,
        stdout: theirs.stdout,
        stderr: theirs.stderr,
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
        output: theirs.output,
        confine: Confine {
            landlock: confinement.landlock,
            landlock_rules,
            seccomp: confinement.filter,
            notify: theirs.notify,
            tcp_connect: match req.policy.network {
                Network::Allowlist(_) => vec![crate::network::PROXY_PORT],
                _ => vec![],
            },
        },
        proxy: theirs.proxy,
        cgroup_tasks,
        stdin: theirs.control,
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

/// A cloned child the supervisor has not reaped yet. Dropped, it is killed
/// and reaped, so no early return can leave a live jail behind.
struct Child {
    pid: Option<Pid>,
}

impl Child {
    /// Wait for PID 1 (and so for its whole pid namespace) to end.
    fn reap(mut self) -> io::Result<(libc::c_int, libc::rusage)> {
        match self.pid.take() {
            Some(pid) => sys::wait4(pid),
            None => Err(io::Error::other("the child was already reaped")),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            let _ = sys::wait4(pid);
        }
    }
}
