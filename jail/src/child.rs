//! The child side: everything that runs inside the new namespaces.
//!
//! The cloned child is PID 1 of the new pid namespace. It builds the new root,
//! enters the run cgroup and makes its cgroup namespace, drops every
//! capability and sets no_new_privs, then forks the worker and stays behind
//! as a small reaper; the worker, inheriting that, applies the last
//! restrictions (rlimits, landlock, then seccomp right before exec) and
//! execs the interpreter.
//! Both return `!`: they end in exec or `_exit`, and any failure crosses back
//! to the supervisor as a `{stage, message, causes}` report, then exit 125.

use std::error::Error;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

mod forked;

use crate::mounts::{self, MountOp};
use crate::result::{SetupError, EXIT_SETUP_FAILED};
use crate::rlimits::Rlimit;
use crate::stage::Stage;
use crate::sync::{self, Report};
use crate::sys::{self, Forked};
use crate::{landlock, privileges, rlimits, seccomp};

/// Everything the child needs, prepared by the supervisor before the clone so
/// the child does as little as possible.
pub(crate) struct ChildSpec {
    pub release: OwnedFd,
    pub report: OwnedFd,
    pub status: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub mounts: Vec<MountOp>,
    /// Where the new root is assembled before pivot_root.
    pub staging: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    pub exec: Exec,
    /// Set by the worker right before exec (see `limits::plan`).
    pub rlimits: Vec<Rlimit>,
    /// With a size-capped output dir: the socket that hands the supervisor
    /// the output tmpfs, then says when it has been filled (output.rs).
    pub output: Option<OwnedFd>,
    pub confine: Confine,
    /// With `network.mode: allowlist`: the socket the proxy listener goes
    /// to the supervisor over (network.rs).
    pub proxy: Option<OwnedFd>,
    /// On cgroup v1: the channel the run cgroup's `tasks` files arrive on
    /// once the supervisor has made it (sync.rs); PID 1 writes itself into
    /// them before it forks the worker (cgroup.rs, `enter_sent`).
    pub cgroup: Option<OwnedFd>,
    /// The CPUs the run is pinned to (inside.rs); `None`: the supervisor's.
    pub cpus: Option<Vec<usize>>,
    /// `jail session`: the control socket the cell driver reads on fd 0
    /// (sync.rs); `None` leaves stdin on /dev/null.
    pub stdin: Option<OwnedFd>,
    /// A template's own jail: its old root stays beneath the new one, for
    /// its forks to leave by (template/fork.rs, `HOST_ROOT`).
    pub keep_host_root: bool,
    /// A fork whose supervisor writes its uid map, to a host uid leased
    /// for it alone (template/uids.rs); otherwise a fork maps itself.
    pub uid_mapped_by_supervisor: bool,
}

/// The last restrictions, planned and compiled by the supervisor.
pub(crate) struct Confine {
    pub landlock: landlock::Plan,
    pub landlock_rules: Vec<landlock::PathRule>,
    /// `None` for a template's own jail only (template.rs).
    pub seccomp: Option<seccomp::Filter>,
    /// Where the seccomp notification listener goes (notify mode only).
    pub notify: Option<OwnedFd>,
    /// TCP ports landlock lets connect(2) reach: the proxy's, with an allowlist.
    pub tcp_connect: Vec<u16>,
}

/// The interpreter's exec: path, argv and the rebuilt environment.
#[derive(Clone)]
pub(crate) struct Exec {
    pub path: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub cwd: PathBuf,
    /// The script's umask (`hostuid::sandbox_umask`).
    pub umask: u32,
}

impl std::fmt::Debug for Exec {
    /// As derived, the script runner's source (`python -c RUNNER`) named
    /// rather than written out: a plan shows what runs, not 10 KB of it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let argv: Vec<String> = self
            .argv
            .iter()
            .map(|a| match a.to_str() {
                Ok(s) if s == crate::display::RUNNER => "<runner.py>".to_string(),
                _ => format!("{a:?}"),
            })
            .collect();
        f.debug_struct("Exec")
            .field("path", &self.path)
            .field("argv", &DebugRaw(&argv))
            .field("envp", &self.envp)
            .field("cwd", &self.cwd)
            .field("umask", &self.umask)
            .finish()
    }
}

/// Strings printed as they are, in a list.
struct DebugRaw<'a>(&'a [String]);

impl std::fmt::Debug for DebugRaw<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|s| Raw(s))).finish()
    }
}

struct Raw<'a>(&'a str);

impl std::fmt::Debug for Raw<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// A failed step: which stage, and the error chain.
struct StageError {
    stage: Stage,
    error: Box<dyn Error>,
}

trait AtStage<T> {
    fn stage(self, stage: Stage) -> Result<T, StageError>;
}

impl<T, E: Error + 'static> AtStage<T> for Result<T, E> {
    fn stage(self, stage: Stage) -> Result<T, StageError> {
        self.map_err(|e| StageError { stage, error: Box::new(e) })
    }
}

impl StageError {
    fn into_setup_error(self) -> SetupError {
        self.stage.error(&*self.error)
    }
}

/// Stage timestamps, carried to the worker by fork and sent once before exec.
struct Marks(Vec<(String, u64)>);

impl Marks {
    fn mark(&mut self, name: &str) {
        self.0.push((name.to_string(), sync::monotonic_ns()));
    }
}

fn fail(report: &OwnedFd, e: StageError) -> ! {
    let _ = sync::send(report, &Report::Failed(e.into_setup_error()));
    sys::exit_now(EXIT_SETUP_FAILED)
}

/// How the worker ends once confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// In exec of the interpreter (a jail cloned by its supervisor).
    Exec,
    /// Returning to the interpreter it already is (a fork of a template,
    /// template/fork.rs), the report pipe closed as an exec would close it.
    Return,
}

/// PID 1's entry point, right after clone.
pub(crate) fn run(spec: ChildSpec) -> ! {
    live(spec, None);
    sys::exit_now(EXIT_SETUP_FAILED)
}

/// PID 1's entry point in a fork of a template (template/fork.rs), right
/// after the template's clone: `hello` is the connection the supervisor's
/// request came on. Returns only in the worker, confined as a cloned
/// jail's worker is right before its exec; PID 1 never returns.
pub(crate) fn run_forked(spec: ChildSpec, hello: OwnedFd, template_ids: (u32, u32)) {
    live(spec, Some((hello, template_ids)))
}

/// Everything from the release to the worker's end; returns only in a
/// forked jail's worker.
fn live(spec: ChildSpec, forked: Option<(OwnedFd, (u32, u32))>) {
    let ChildSpec {
        release,
        report,
        status,
        stdout,
        stderr,
        mounts,
        staging,
        uid,
        gid,
        hostname,
        exec,
        rlimits,
        output,
        confine,
        proxy,
        cgroup,
        cpus,
        stdin,
        keep_host_root,
        uid_mapped_by_supervisor,
    } = spec;
    let ends = match forked {
        None => Ends::Exec,
        Some((hello, template_ids)) => {
            // Not the supervisor's child: it can neither write our id maps
            // (it is not in our parent user namespace) nor see our pid.
            if let Err(e) = forked::begin(&hello, (uid, gid), template_ids, uid_mapped_by_supervisor).stage(Stage::IdMaps) {
                fail(&report, e);
            }
            Ends::Return
        }
    };
    // The supervisor writes our id maps (a fork wrote its own), then
    // releases us; until then we have no identity in the new user namespace.
    if !sync::wait_for_release(release) {
        sys::exit_now(EXIT_SETUP_FAILED);
    }
    let mut marks = Marks(Vec::new());
    marks.mark("released");
    // Before anything of ours can be seen from inside: we are a fork of the
    // supervisor, whose command line and environment name host paths.
    if let (Ends::Return, Err(e)) = (ends, forked::leave_template_root().stage(Stage::Mounts)) {
        fail(&report, e);
    }
    if let Err(e) = crate::conceal::scrub_pid1() {
        fail(&report, StageError { stage: Stage::Conceal, error: Box::new(e) });
    }
    let keep = keep_host_root.then_some(mounts::HOST_ROOT);
    match setup(&mut marks, &report, stdout, stderr, &mounts, &staging, (uid, gid), &hostname, output.as_ref(), proxy, keep) {
        Ok(()) => {}
        Err(e) => fail(&report, e),
    }
    if let Some(sock) = output {
        // The script may not start before the supervisor has copied the
        // host's output folder in; end-of-file means it gave up.
        if !sync::wait_for_release(sock) {
            sys::exit_now(EXIT_SETUP_FAILED);
        }
        marks.mark("output_filled");
    }
    if let Some(sock) = cgroup {
        // Into the v1 run cgroup, which the supervisor made with its limits
        // while we built the mounts: before the worker (which inherits it)
        // is forked, and before our cgroup namespace is made, whose root is
        // where we are then. We are one thread running only our code.
        if let Err(e) = crate::cgroup::enter_sent(&sock).stage(Stage::CgroupJoin) {
            fail(&report, e);
        }
        marks.mark("cgroup_join");
    }
    // Our cgroup namespace is made only now, once we are in the run cgroup:
    // its root is the cgroup of the run's processes, so nothing above it
    // (where a leaf keeps the files holding the run's limits) is ever
    // visible from inside.
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP).stage(Stage::CgroupNamespace) {
        fail(&report, e);
    }
    if let Some(ids) = &cpus {
        // Before the worker is forked, which inherits the mask: the CPU
        // count programs see (sched_getaffinity, nproc) follows `cpus`.
        if let Err(e) = crate::inside::pin(ids).stage(Stage::CpuAffinity) {
            fail(&report, e);
        }
    }
    // Block the signals PID 1 handles before forking, so none is lost between
    // the fork and the reaper's first sigwait.
    let handled = reaper_signals();
    if let Err(e) = handled.thread_block().stage(Stage::BlockSignals) {
        fail(&report, e);
    }
    // Non-dumpable before the fork, so the script, which runs as our uid,
    // can never open /proc/1/* or ptrace us, however the two are scheduled
    // (runc CVE-2019-5736). The worker inherits it until its exec resets it.
    if let Err(e) = nix::sys::prctl::set_dumpable(false).stage(Stage::Dumpable) {
        fail(&report, e);
    }
    // The cgroup namespace above was the last step that needed a
    // capability: neither we (the reaper) nor the worker needs one again.
    // Dropped once here, before no_new_privs, and inherited by the worker
    // (fork(2) keeps both), instead of by each after the fork on the CPU
    // they may share; nothing the script runs can regain them.
    if let Err(e) = privileges::drop_all_capabilities().stage(Stage::DropCapabilities) {
        fail(&report, e);
    }
    if let Err(e) = nix::sys::prctl::set_no_new_privs().stage(Stage::NoNewPrivs) {
        fail(&report, e);
    }
    marks.mark("drop_privileges");
    match sys::fork_process() {
        Err(e) => fail(&report, StageError { stage: Stage::ForkWorker, error: Box::new(e) }),
        Ok(Forked::Child) => {
            // PID 1's alone; closed now rather than by the worker's sweep
            // of descriptors, which a worker that returns (a fork's) must
            // not follow with a second close.
            drop(status);
            // A session's driver reads its cells on fd 0; PID 1 keeps no copy.
            if let Some(control) = stdin {
                if let Err(e) = privileges::stdin_onto(&control).stage(Stage::Stdio) {
                    fail(&report, e);
                }
            }
            worker(marks, report, exec, &rlimits, confine, ends);
            // Only a fork's worker gets here: the host paths its plan named
            // go from its memory before the step's code runs.
            forked::scrub(mounts, staging);
        }
        Ok(Forked::Parent(worker_pid)) => {
            drop(stdin);
            // Our copy of the report pipe must go, or the supervisor would
            // never see the end-of-file that means "exec happened".
            drop(report);
            drop(confine);
            reaper(worker_pid, status, handled, ends)
        }
    }
}

/// PID 1's setup: everything that needs privilege in the new namespaces.
#[allow(clippy::too_many_arguments)]
fn setup(
    marks: &mut Marks,
    report: &OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    plan: &[MountOp],
    staging: &std::path::Path,
    (uid, gid): (u32, u32),
    hostname: &str,
    output: Option<&OwnedFd>,
    proxy: Option<OwnedFd>,
    keep_host_root: Option<&str>,
) -> Result<(), StageError> {
    // stdio goes to the supervisor's pipes; stdin is /dev/null, never a tty
    // (TIOCSTI, bwrap CVE-2017-5226).
    privileges::stdio_onto(&stdout, &stderr).stage(Stage::Stdio)?;
    drop((stdout, stderr));
    marks.mark("stdio");
    // Nothing we mount may propagate back to the host.
    mounts::make_private().stage(Stage::Mounts)?;
    // Sources are opened with our original credentials (a root caller can
    // still traverse 0700 folders), before the staging tmpfs hides anything.
    let sources = mounts::open_sources(plan, staging).stage(Stage::Mounts)?;
    crate::namespaces::become_sandbox_ids(uid, gid).stage(Stage::Identity)?;
    // If the supervisor dies, so does the whole jail (PID 1's death ends the
    // pid namespace). Set only now: every uid change clears it
    // (commit_creds), and checked once, in case the supervisor died before.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).stage(Stage::DieWithSupervisor)?;
    if sync::reader_gone(report) {
        sys::exit_now(EXIT_SETUP_FAILED);
    }
    let applied = mounts::apply(plan, sources, staging).stage(Stage::Mounts)?;
    if !applied.degraded.is_empty() {
        let _ = sync::send(report, &Report::Degraded(applied.degraded));
    }
    marks.mark("mounts");
    if let Some(sock) = output {
        // The supervisor keeps this descriptor of the output tmpfs past the
        // jail's end, to mirror it back once the tree is dead.
        let dir = mounts::open_output(staging).stage(Stage::Output)?;
        sys::send_fd(sock.as_fd(), dir.as_fd()).stage(Stage::Output)?;
    }
    mounts::pivot_root(staging, keep_host_root).stage(Stage::PivotRoot)?;
    marks.mark("pivot_root");
    nix::unistd::sethostname(hostname).stage(Stage::Hostname)?;
    if let Some(sock) = proxy {
        // While we still hold CAP_NET_ADMIN in our namespaces (lo up) and
        // before the worker exists: the script never sees the listener.
        crate::network::hand_over_listener(sock.as_fd()).stage(Stage::Network)?;
        marks.mark("network");
    }
    Ok(())
}

/// The worker: drop everything, restrict, exec (or, in a fork of a
/// template, return to the interpreter). Runs as PID 2.
fn worker(mut marks: Marks, report: OwnedFd, exec: Exec, limits: &[Rlimit], confine: Confine, ends: Ends) {
    match worker_setup(&mut marks, &report, &exec, limits, &confine) {
        Ok(()) => {}
        Err(e) => fail(&report, e),
    }
    if ends == Ends::Return {
        // What the exec of a cloned jail's worker does: dumpable again
        // (PID 1 stays not), as any interpreter exec'd by its own uid is.
        if let Err(e) = nix::sys::prctl::set_dumpable(true).stage(Stage::Dumpable) {
            fail(&report, e);
        }
    }
    // Seccomp last: from here on every syscall passes the filter, and in
    // notify mode the listener reaches the supervisor before any other call.
    if let Some(filter) = &confine.seccomp {
        if let Err(e) = filter.load(confine.notify.as_ref()).stage(Stage::Seccomp) {
            fail(&report, e);
        }
        marks.mark("seccomp");
    }
    let _ = sync::send(&report, &Report::Stages(std::mem::take(&mut marks.0)));
    if ends == Ends::Return {
        // What an exec's close-on-exec would do: the supervisor reads the
        // end of the report pipe as "the interpreter runs".
        drop(report);
        return;
    }
    let err = nix::unistd::execve(&exec.path, &exec.argv, &exec.envp).unwrap_err();
    fail(&report, StageError { stage: Stage::Exec, error: Box::new(ExecError(exec.path.clone(), err)) })
}

#[derive(Debug, thiserror::Error)]
#[error("execve({0:?})")]
struct ExecError(CString, #[source] nix::Error);

fn worker_setup(
    marks: &mut Marks,
    report: &OwnedFd,
    exec: &Exec,
    limits: &[Rlimit],
    confine: &Confine,
) -> Result<(), StageError> {
    // The script gets a clean signal state: nothing blocked, every signal at
    // its default. An ignored signal survives fork and exec, so a caller
    // started with SIGINT ignored (`jail serve &` from a script: a shell
    // starts a background job so) would hand that on, and CPython installs
    // its KeyboardInterrupt handler only where SIGINT is at its default: a
    // cell past its time would then be killed, its session with it, instead
    // of interrupted. The Rust runtime ignores SIGPIPE; CPython ignores
    // SIGXFSZ itself, so a Python write past RLIMIT_FSIZE fails with EFBIG
    // (OSError errno 27); other programs it starts die of SIGXFSZ.
    SigSet::empty().thread_set_mask().stage(Stage::Signals)?;
    for sig in Signal::iterator().filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP)) {
        sys::set_default_signal(sig).stage(Stage::Signals)?;
    }
    // Every descriptor but stdio, the report pipe and the listener's way
    // out closes now; those two are close-on-exec (runc CVE-2024-21626).
    let mut keep = vec![report.as_raw_fd()];
    keep.extend(confine.notify.as_ref().map(|fd| fd.as_raw_fd()));
    sys::close_from_except(3, &keep).stage(Stage::CloseFds)?;
    sys::cloexec_from(3).stage(Stage::CloseFds)?;
    // A new session: no controlling terminal to inject keystrokes into.
    nix::unistd::setsid().stage(Stage::Setsid)?;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(exec.umask));
    nix::unistd::chdir(&exec.cwd).stage(Stage::Chdir)?;
    // Without capabilities (PID 1 dropped them before the fork): lowering a
    // limit needs none, and raising one never could (CAP_SYS_RESOURCE
    // counts only in the initial user namespace).
    rlimits::apply(limits).stage(Stage::Rlimits)?;
    marks.mark("rlimits");
    // Landlock needs no_new_privs, inherited from PID 1 (CAP_SYS_ADMIN,
    // the other way, is gone).
    landlock::restrict(&confine.landlock, &confine.landlock_rules, &confine.tcp_connect).stage(Stage::Landlock)?;
    marks.mark("landlock");
    Ok(())
}

fn reaper_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        set.add(sig);
    }
    set
}

/// PID 1 after the fork: reap every orphan, forward termination signals to
/// the worker, and exit with nothing left behind once the worker is gone
/// (the kernel kills the rest of the pid namespace when PID 1 exits).
fn reaper(worker: Pid, status: OwnedFd, handled: SigSet, ends: Ends) -> ! {
    let _ = privileges::release_stdio();
    let keep: [RawFd; 1] = [status.as_raw_fd()];
    let _ = sys::close_from_except(3, &keep);
    let sfd = match ends {
        Ends::Exec => None,
        Ends::Return => forked::signals(&handled),
    };
    loop {
        let sig = match ends {
            Ends::Exec => handled.wait().ok(),
            // A fork's parent is its template, not its supervisor, so no
            // parent-death signal tells us the supervisor is gone: its
            // end of the status pipe closing does, looked at between waits.
            Ends::Return => match forked::wait_signal(sfd.as_ref(), &status) {
                Ok(sig) => sig,
                Err(()) => {
                    let _ = nix::sys::signal::kill(worker, Signal::SIGKILL);
                    sys::exit_now(0);
                }
            },
        };
        let Some(sig) = sig else { continue };
        if sig != Signal::SIGCHLD {
            let _ = nix::sys::signal::kill(worker, sig);
            continue;
        }
        loop {
            match nix::sys::wait::waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == worker => {
                    let _ = sync::send(&status, &Report::Exited { code });
                    sys::exit_now(0);
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == worker => {
                    let _ = sync::send(&status, &Report::Signaled { signal: sig as i32 });
                    sys::exit_now(0);
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }
}
