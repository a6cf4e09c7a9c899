//! The server's own cgroup, nested, so that every run in it gets a cgroup
//! of its own. cgroup v2's no-internal-processes rule keeps a cgroup that
//! holds processes (here: the server) from enabling controllers for its
//! children, so no `jail` the server starts could give its run a cgroup
//! with limits beneath the server's. A server whose own cgroup is a
//! writable cgroup v2 holding only the server and its janitor therefore
//! makes that cgroup a parent: it moves both into a new leaf `<own>/serve`,
//! enables memory, pids and cpu in `<own>/cgroup.subtree_control`, makes
//! `<own>/runs` with the same, and every `jail run`, `jail session start`
//! and `jail pool` it starts gets `--cgroup-parent <own>/runs`.
//!
//! At start (server.rs: after the janitor, before the async runtime's
//! threads): [`look`] reads the server's cgroup as jail's cgroup module
//! finds it, [`plan`] decides (pure: the steps, or why not, with the fix),
//! [`start`] tells the janitor what will be made, then applies the steps
//! one by one; a step that fails undoes those done, and the server goes on
//! as without nesting (each run finds its cgroup as `jail run` does and
//! reports a missing one in `isolation.degraded`), saying why once.
//!
//! At the end the janitor (janitor.rs), which outlives the server by
//! design, undoes it ([`teardown`]): a process cannot remove the cgroup it
//! is in, and `serve` held the server and the janitor itself. Once every
//! run cgroup is gone it removes `runs`, disables what the server enabled
//! in `<own>`, moves itself back into `<own>` (allowed again now that
//! `<own>` enables no controller) and removes `serve`. `<own>` is left as
//! it was found. What can remain: `runs` and `serve` while a process of a
//! run outlives the janitor's wait (one that cannot be killed), and both
//! when the janitor itself is killed; the janitor says so on stderr.
//! Nothing here writes to a cgroup above the server's own.

use std::io;
use std::path::{Path, PathBuf};

use jail::cgroup::{self, CgroupError, Parent, V2_CONTROLLERS};
use serde::{Deserialize, Serialize};

/// The leaf the server and its janitor move into.
pub const SERVE: &str = "serve";
/// The parent of every run's cgroup.
pub const RUNS: &str = "runs";

/// The server's cgroup as [`look`] found it: plain data a test can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Own {
    /// The cgroup path, as in /proc/self/cgroup (`0::PATH`).
    pub cgroup: PathBuf,
    /// Its directory in the cgroup2 mount.
    pub dir: PathBuf,
    /// `cgroup.controllers`: what it may enable for children.
    pub controllers: Vec<String>,
    /// `cgroup.subtree_control`: what it enables now.
    pub enabled: Vec<String>,
    /// `cgroup.procs`.
    pub procs: Vec<i32>,
    /// Whether the server may make cgroups in it and write its
    /// `cgroup.procs` and `cgroup.subtree_control`.
    pub writable: bool,
    /// Which of [`SERVE`] and [`RUNS`] exist in it already.
    pub taken: Vec<&'static str>,
}

/// Why the server does not nest, and what would let it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub why: String,
    pub fix: String,
}

impl Refusal {
    fn new(why: impl Into<String>, fix: impl Into<String>) -> Refusal {
        Refusal { why: why.into(), fix: fix.into() }
    }
}

/// One step on the server's cgroups, in the order [`plan`] and
/// [`teardown`] give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Mkdir(PathBuf),
    /// Write `pid` to `into/cgroup.procs`.
    Move {
        pid: i32,
        into: PathBuf,
    },
    /// `+c` for each controller not enabled yet, to `dir/cgroup.subtree_control`.
    Enable {
        dir: PathBuf,
        controllers: Vec<String>,
    },
    /// `-c` for each controller still enabled, to `dir/cgroup.subtree_control`.
    Disable {
        dir: PathBuf,
        controllers: Vec<String>,
    },
    Rmdir(PathBuf),
    /// Remove the run cgroups killed jails left in the folder (jail's
    /// sweep: only `jail-<pid>-<n>` of dead creators, only empty), then
    /// the folder.
    RmdirRuns(PathBuf),
}

/// What the janitor is told before the first step, and undoes after the
/// server's death: the server's cgroup and the controllers the server
/// enables in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub dir: PathBuf,
    pub enabled: Vec<String>,
}

/// The steps that nest the server, and what the janitor must know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ops: Vec<Op>,
    pub record: Record,
}

/// Where the runs of this server get their cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunCgroups {
    /// Beneath `runs` (a cgroup path), the server in `serve`.
    Nested { runs: PathBuf, serve: PathBuf },
    /// Not nested: each run finds its own cgroup as `jail run` does.
    Fallback(Refusal),
    /// `--no-nest-cgroup`.
    Off,
}

#[derive(Debug, thiserror::Error)]
pub enum NestError {
    #[error("mkdir {path}")]
    Mkdir { path: PathBuf, source: io::Error },
    #[error("move pid {pid} into {path}")]
    Move { pid: i32, path: PathBuf, source: io::Error },
    #[error("enable controllers")]
    Enable(#[source] CgroupError),
    #[error("write {value:?} to {path}")]
    Disable {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("rmdir {path}")]
    Rmdir { path: PathBuf, source: io::Error },
    #[error("tell the janitor what the server makes")]
    Tell(#[source] io::Error),
}

/// The server's own cgroup, from /proc/self/cgroup and the cgroup2 mount
/// in /proc/self/mountinfo (as `jail run` finds its own).
pub fn look() -> Result<Own, Refusal> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let layout = cgroup::parse_mountinfo(&read("/proc/self/mountinfo"));
    let me = cgroup::parse_proc_cgroup(&read("/proc/self/cgroup"));
    look_in(&layout, &me)
}

/// [`look`] from a layout and membership already read: the files are read
/// beneath the layout's mount, which a test points at a temp dir.
pub fn look_in(layout: &cgroup::Layout, me: &cgroup::Membership) -> Result<Own, Refusal> {
    let v2_host = "run the server on a cgroup v2 host (systemd.unified_cgroup_hierarchy=1)";
    let Some((mount, root)) = &layout.unified else {
        return Err(Refusal::new("no cgroup2 filesystem is mounted", v2_host));
    };
    let Some(own) = &me.unified else {
        return Err(Refusal::new("the server is in no cgroup v2 hierarchy (/proc/self/cgroup has no 0:: line)", v2_host));
    };
    let Some(dir) = cgroup::dir_of(mount, root, own) else {
        return Err(Refusal::new(
            format!("its cgroup {} lies outside the cgroup2 mount at {}", own.display(), mount.display()),
            "mount the cgroup2 filesystem where the server's cgroup is visible",
        ));
    };
    if !dir.is_dir() {
        return Err(Refusal::new(format!("its cgroup {} is not there", dir.display()), v2_host));
    }
    let may_write = |file: &str| nix::unistd::access(&dir.join(file), nix::unistd::AccessFlags::W_OK).is_ok();
    Ok(Own {
        cgroup: own.clone(),
        controllers: cgroup::read_words(&dir.join("cgroup.controllers")),
        enabled: cgroup::read_words(&dir.join("cgroup.subtree_control")),
        procs: cgroup::procs_of(&dir),
        writable: cgroup::writable(&dir) && may_write("cgroup.procs") && may_write("cgroup.subtree_control"),
        taken: [SERVE, RUNS].into_iter().filter(|n| dir.join(n).exists()).collect(),
        dir,
    })
}

/// The steps that nest the server (pid `ours[0]`, its janitor and any
/// other process in `ours`), in order, or why it cannot. Pure.
///
/// Every process must leave `own` before `own` may enable controllers for
/// its children (the no-internal-processes rule), and `runs` gets its
/// controllers only once `own` offers them.
pub fn plan(own: &Own, ours: &[i32]) -> Result<Plan, Refusal> {
    let lacking: Vec<&str> = V2_CONTROLLERS.into_iter().filter(|c| !own.controllers.iter().any(|o| o == c)).collect();
    if !lacking.is_empty() {
        let why =
            format!("its cgroup v2 {} offers [{}], not {}", own.dir.display(), own.controllers.join(" "), lacking.join(", "));
        return Err(if lacking.len() == V2_CONTROLLERS.len() {
            Refusal::new(
                format!("{why} (on a hybrid host they are bound to cgroup v1)"),
                "boot the host with cgroup v2 alone (systemd.unified_cgroup_hierarchy=1); meanwhile, as root, each run \
                 gets a cgroup v1 of its own",
            )
        } else {
            Refusal::new(
                why,
                "enable memory, pids and cpu for the server's cgroup in its parent (systemd: Delegate=yes; \
                 Kubernetes: deploy/k8s/README.md \"Cgroups\")",
            )
        });
    }
    if !own.writable {
        return Err(Refusal::new(
            format!("its cgroup {} is not writable by uid {}", own.dir.display(), nix::unistd::getuid()),
            "give the server a cgroup v2 it may write: a systemd unit with Delegate=yes, or a pod with a writable \
             cgroup (deploy/k8s/README.md \"Cgroups\")",
        ));
    }
    let others: Vec<String> = own.procs.iter().filter(|p| !ours.contains(p)).map(i32::to_string).collect();
    if !others.is_empty() {
        return Err(Refusal::new(
            format!("its cgroup {} holds processes other than the server's (pids {})", own.dir.display(), others.join(" ")),
            "start the server in a cgroup of its own (a container, or a systemd unit with Delegate=yes)",
        ));
    }
    if let Some(name) = own.taken.first() {
        return Err(Refusal::new(
            format!("{} exists already, and the server nests only in cgroups it makes", own.dir.join(name).display()),
            "remove it (rmdir) if an earlier server left it, or start the server in a cgroup of its own",
        ));
    }
    let (serve, runs) = (own.dir.join(SERVE), own.dir.join(RUNS));
    let want: Vec<String> = V2_CONTROLLERS.iter().map(|c| c.to_string()).collect();
    let missing: Vec<String> = want.iter().filter(|c| !own.enabled.contains(c)).cloned().collect();
    let mut ops = vec![Op::Mkdir(serve.clone())];
    // The server first: ours lists it first.
    ops.extend(ours.iter().filter(|p| own.procs.contains(p)).map(|&pid| Op::Move { pid, into: serve.clone() }));
    if !missing.is_empty() {
        ops.push(Op::Enable { dir: own.dir.clone(), controllers: missing.clone() });
    }
    ops.push(Op::Mkdir(runs.clone()));
    // Enabled here rather than by the first run: a failure shows at start.
    ops.push(Op::Enable { dir: runs, controllers: want });
    Ok(Plan { ops, record: Record { dir: own.dir.clone(), enabled: missing } })
}

/// The steps that undo `done` (a prefix of a plan's steps), last first,
/// moving processes back into `own`. Pure.
pub fn undo(done: &[Op], own: &Path) -> Vec<Op> {
    done.iter()
        .rev()
        .map(|op| match op {
            Op::Mkdir(p) => Op::Rmdir(p.clone()),
            Op::Move { pid, .. } => Op::Move { pid: *pid, into: own.to_path_buf() },
            Op::Enable { dir, controllers } => Op::Disable { dir: dir.clone(), controllers: controllers.clone() },
            other => other.clone(),
        })
        .collect()
}

/// What the janitor (pid `me`) does once the server is dead, in order:
/// `runs` first (the controllers cannot be disabled in `own` while a child
/// enables them), then `own`'s controllers (a process may join `own` only
/// while it enables none), then itself into `own`, then `serve`, which it
/// has left. Pure.
pub fn teardown(record: &Record, me: i32) -> Vec<Op> {
    let own = &record.dir;
    let mut ops = vec![Op::RmdirRuns(own.join(RUNS))];
    if !record.enabled.is_empty() {
        ops.push(Op::Disable { dir: own.clone(), controllers: record.enabled.clone() });
    }
    ops.push(Op::Move { pid: me, into: own.clone() });
    ops.push(Op::Rmdir(own.join(SERVE)));
    ops
}

/// Do one step. Idempotent where an undo needs it: a folder already gone,
/// a process already gone, a controller already disabled are no error.
pub fn apply(op: &Op) -> Result<(), NestError> {
    match op {
        Op::Mkdir(path) => std::fs::create_dir(path).map_err(|source| NestError::Mkdir { path: path.clone(), source }),
        Op::Move { pid, into } => {
            let path = into.join("cgroup.procs");
            match std::fs::write(&path, pid.to_string()) {
                // The kernel answers ESRCH for a process that is gone.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
                r => r.map_err(|source| NestError::Move { pid: *pid, path, source }),
            }
        }
        Op::Enable { dir, controllers } => {
            cgroup::enable_controllers(&Parent { dir: dir.clone(), controllers: controllers.clone() }).map_err(NestError::Enable)
        }
        Op::Disable { dir, controllers } => {
            let path = dir.join("cgroup.subtree_control");
            let enabled = cgroup::read_words(&path);
            let value: Vec<String> = controllers.iter().filter(|c| enabled.contains(c)).map(|c| format!("-{c}")).collect();
            if value.is_empty() {
                return Ok(());
            }
            let value = value.join(" ");
            std::fs::write(&path, &value).map_err(|source| NestError::Disable { path, value, source })
        }
        Op::Rmdir(path) => rmdir(path),
        Op::RmdirRuns(path) => {
            let swept = cgroup::Candidate {
                version: cgroup::Version::V2,
                parents: vec![Parent { dir: path.clone(), controllers: Vec::new() }],
            };
            cgroup::sweep(&swept);
            rmdir(path)
        }
    }
}

fn rmdir(path: &Path) -> Result<(), NestError> {
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r.map_err(|source| NestError::Rmdir { path: path.to_path_buf(), source }),
    }
}

/// Nest the server and its janitor (server.rs, while the server has no
/// thread yet: a process moves with all its threads, and none may be
/// made in `own` meanwhile). The janitor is told what will be made before
/// anything is, so a SIGKILL at any point leaves nothing it cannot undo:
/// `tell` hands it a record (`None`: nothing left to undo; janitor.rs's
/// `tell`), `janitor` is its pid.
pub fn start(janitor: u32, tell: &mut dyn FnMut(Option<&Record>) -> std::io::Result<()>, policy: Option<&Path>) -> RunCgroups {
    if let Some(r) = given_parent(policy) {
        return RunCgroups::Fallback(r);
    }
    let own = match look() {
        Ok(own) => own,
        Err(r) => return RunCgroups::Fallback(r),
    };
    let ours = [std::process::id(), janitor].map(|p| i32::try_from(p).unwrap_or(i32::MAX));
    let plan = match plan(&own, &ours) {
        Ok(p) => p,
        Err(r) => return RunCgroups::Fallback(r),
    };
    if let Err(e) = tell(Some(&plan.record)).map_err(NestError::Tell) {
        return RunCgroups::Fallback(Refusal::new(jail::stage::chain_line(&e), "see why the janitor ended"));
    }
    let mut done = Vec::new();
    for op in &plan.ops {
        if let Err(e) = apply(op) {
            let left: Vec<String> = undo(&done, &own.dir)
                .iter()
                .filter_map(|u| apply(u).err())
                .map(|e| jail::stage::chain_line(&e))
                .collect();
            let undone = if left.is_empty() {
                // Nothing of it is left: the janitor has nothing to undo.
                let _ = tell(None);
                "undone".to_string()
            } else {
                format!("not all undone, the janitor tries again at exit: {}", left.join("; "))
            };
            return RunCgroups::Fallback(Refusal::new(
                format!("{} ({undone})", jail::stage::chain_line(&e)),
                "give the server a cgroup v2 of its own that it may write (deploy/k8s/README.md \"Cgroups\")",
            ));
        }
        done.push(op.clone());
    }
    RunCgroups::Nested { runs: own.cgroup.join(RUNS), serve: own.cgroup.join(SERVE) }
}

/// A parent for run cgroups the operator chose (`JAIL_CGROUP_PARENT`, as
/// `jail run` reads it, or the policy's `limits.cgroup_parent`): it wins,
/// and the server does not nest. A policy that does not load is left to
/// the runs, which report it.
fn given_parent(policy: Option<&Path>) -> Option<Refusal> {
    let var = jail::hostenv::CGROUP_PARENT_VAR;
    if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return Some(Refusal::new(
            format!("{var}={} is set, so each run's cgroup goes beneath it", Path::new(&v).display()),
            format!("unset {var} for the server to nest its own"),
        ));
    }
    let parent = jail::policy::Policy::load(policy?).ok()?.limits.cgroup_parent?;
    Some(Refusal::new(
        format!("the policy's limits.cgroup_parent is {}, so each run's cgroup goes beneath it", parent.display()),
        "drop limits.cgroup_parent from the policy for the server to nest its own",
    ))
}

/// Undo what the server made, once it is dead (the janitor, pid `me`):
/// each step is tried again until `until` while processes of the runs
/// finish. The first step that still fails then stops it, with its error.
pub fn tear_down(record: &Record, me: i32, until: std::time::Instant) -> Result<(), NestError> {
    for op in teardown(record, me) {
        loop {
            match apply(&op) {
                Ok(()) => break,
                Err(_) if std::time::Instant::now() < until => std::thread::sleep(std::time::Duration::from_millis(100)),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

impl RunCgroups {
    pub fn mode(&self) -> &'static str {
        match self {
            RunCgroups::Nested { .. } => "nested",
            RunCgroups::Fallback(_) => "fallback",
            RunCgroups::Off => "off",
        }
    }

    /// The one line the server says at start, if any.
    pub fn said(&self) -> Option<String> {
        match self {
            RunCgroups::Nested { runs, serve } => Some(format!(
                "each run gets a cgroup of its own beneath {} (the server moved into {})",
                runs.display(),
                serve.display()
            )),
            RunCgroups::Fallback(r) => Some(format!(
                "runs' cgroups are not nested in the server's: {}; each run finds its own as `jail run` does \
                 (cgroup v1, a delegated cgroup, or rlimits, named in its isolation.degraded). Fix: {}; \
                 or --no-nest-cgroup to not try",
                r.why, r.fix
            )),
            RunCgroups::Off => None,
        }
    }

    /// For `/readyz`: one line.
    pub fn readiness(&self) -> String {
        match self {
            RunCgroups::Nested { runs, .. } => format!("run cgroups: nested beneath {}\n", runs.display()),
            RunCgroups::Fallback(r) => format!("run cgroups: fallback ({})\n", r.why),
            RunCgroups::Off => "run cgroups: off (--no-nest-cgroup)\n".into(),
        }
    }

    /// The `jail_run_cgroups` gauge: 1 on this server's mode.
    pub fn render(&self, s: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            s,
            "# HELP jail_run_cgroups Where runs get their cgroups (1 on the server's mode): nested, beneath the \
             server's own; fallback, the server could not nest (its start line says why) and each run finds its own \
             as jail run does; off, --no-nest-cgroup."
        );
        let _ = writeln!(s, "# TYPE jail_run_cgroups gauge");
        for mode in ["nested", "fallback", "off"] {
            let _ = writeln!(s, "jail_run_cgroups{{mode=\"{mode}\"}} {}", u8::from(mode == self.mode()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const ALL: &str = "cpuset cpu io memory hugetlb pids rdma misc";

    /// A temp dir standing in for a cgroup2 mount, the server's cgroup at
    /// `/pod` in it with the given files.
    fn fake(controllers: &str, subtree: &str, procs: &str) -> (tempfile::TempDir, cgroup::Layout, cgroup::Membership) {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("pod");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(dir.join("cgroup.subtree_control"), subtree).unwrap();
        std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
        let layout = cgroup::Layout { unified: Some((t.path().to_path_buf(), PathBuf::from("/"))), v1: vec![] };
        let me = cgroup::Membership { unified: Some(PathBuf::from("/pod")), v1: BTreeMap::new() };
        (t, layout, me)
    }

    fn own(dir: &str, procs: &[i32]) -> Own {
        Own {
            cgroup: PathBuf::from("/pod"),
            dir: PathBuf::from(dir),
            controllers: ALL.split(' ').map(String::from).collect(),
            enabled: vec![],
            procs: procs.to_vec(),
            writable: true,
            taken: vec![],
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn the_server_and_its_janitor_move_to_a_leaf_before_the_controllers_are_enabled() {
        let plan = plan(&own("/cg/pod", &[7, 9]), &[7, 9]).unwrap();
        let p = PathBuf::from;
        assert_eq!(
            plan.ops,
            vec![
                Op::Mkdir(p("/cg/pod/serve")),
                Op::Move { pid: 7, into: p("/cg/pod/serve") },
                Op::Move { pid: 9, into: p("/cg/pod/serve") },
                Op::Enable { dir: p("/cg/pod"), controllers: strings(&["memory", "pids", "cpu"]) },
                Op::Mkdir(p("/cg/pod/runs")),
                Op::Enable { dir: p("/cg/pod/runs"), controllers: strings(&["memory", "pids", "cpu"]) },
            ]
        );
        assert_eq!(plan.record, Record { dir: p("/cg/pod"), enabled: strings(&["memory", "pids", "cpu"]) });
    }

    #[test]
    fn controllers_already_enabled_are_neither_enabled_nor_disabled_again() {
        let mut o = own("/cg/pod", &[7]);
        o.enabled = strings(&["pids", "io"]);
        let plan = plan(&o, &[7, 9]).unwrap();
        assert!(plan
            .ops
            .contains(&Op::Enable { dir: PathBuf::from("/cg/pod"), controllers: strings(&["memory", "cpu"]) }));
        assert_eq!(plan.record.enabled, strings(&["memory", "cpu"]));
        // A janitor that is no longer in the cgroup is not moved.
        assert!(!plan.ops.iter().any(|op| matches!(op, Op::Move { pid: 9, .. })));
        let down = teardown(&plan.record, 9);
        assert_eq!(down[1], Op::Disable { dir: PathBuf::from("/cg/pod"), controllers: strings(&["memory", "cpu"]) });
    }

    #[test]
    fn a_missing_controller_is_refused_naming_it() {
        let mut o = own("/cg/pod", &[7]);
        o.controllers = strings(&["memory", "io"]);
        let r = plan(&o, &[7]).unwrap_err();
        assert!(r.why.contains("offers [memory io], not pids, cpu"), "{r:?}");
        assert!(r.fix.contains("Delegate=yes"), "{r:?}");
        // A hybrid host: the v2 hierarchy offers none of them.
        o.controllers = strings(&["hugetlb"]);
        let r = plan(&o, &[7]).unwrap_err();
        assert!(r.why.contains("offers [hugetlb], not memory, pids, cpu") && r.why.contains("hybrid"), "{r:?}");
        assert!(r.fix.contains("unified_cgroup_hierarchy"), "{r:?}");
    }

    #[test]
    fn a_cgroup_the_server_cannot_write_is_refused() {
        let mut o = own("/cg/pod", &[7]);
        o.writable = false;
        let r = plan(&o, &[7]).unwrap_err();
        assert!(r.why.contains("is not writable by uid"), "{r:?}");
    }

    #[test]
    fn a_cgroup_shared_with_other_processes_is_refused_naming_them() {
        let r = plan(&own("/cg/pod", &[7, 9, 11, 12]), &[7, 9]).unwrap_err();
        assert!(r.why.contains("holds processes other than the server's (pids 11 12)"), "{r:?}");
    }

    #[test]
    fn a_serve_or_runs_cgroup_the_server_did_not_make_is_never_taken_over() {
        let mut o = own("/cg/pod", &[7]);
        o.taken = vec![RUNS];
        let r = plan(&o, &[7]).unwrap_err();
        assert!(r.why.contains("/cg/pod/runs exists already"), "{r:?}");
    }

    #[test]
    fn undo_reverses_the_steps_done_and_moves_the_processes_back() {
        let plan = plan(&own("/cg/pod", &[7, 9]), &[7, 9]).unwrap();
        // The second mkdir failed: four steps were done.
        let p = PathBuf::from;
        assert_eq!(
            undo(&plan.ops[..4], Path::new("/cg/pod")),
            vec![
                Op::Disable { dir: p("/cg/pod"), controllers: strings(&["memory", "pids", "cpu"]) },
                Op::Move { pid: 9, into: p("/cg/pod") },
                Op::Move { pid: 7, into: p("/cg/pod") },
                Op::Rmdir(p("/cg/pod/serve")),
            ]
        );
    }

    #[test]
    fn the_janitor_removes_runs_then_disables_then_leaves_serve_then_removes_it() {
        let record = Record { dir: PathBuf::from("/cg/pod"), enabled: strings(&["memory", "pids", "cpu"]) };
        let p = PathBuf::from;
        assert_eq!(
            teardown(&record, 9),
            vec![
                Op::RmdirRuns(p("/cg/pod/runs")),
                Op::Disable { dir: p("/cg/pod"), controllers: strings(&["memory", "pids", "cpu"]) },
                Op::Move { pid: 9, into: p("/cg/pod") },
                Op::Rmdir(p("/cg/pod/serve")),
            ]
        );
    }

    #[test]
    fn on_a_fake_cgroup2_mount_the_files_are_written_in_order_and_undone() {
        let (t, layout, me) = fake(ALL, "", "7\n9\n");
        let o = look_in(&layout, &me).unwrap();
        let dir = t.path().join("pod");
        assert_eq!((o.dir.clone(), o.procs.clone(), o.taken.clone()), (dir.clone(), vec![7, 9], vec![]));
        assert!(o.writable);
        let plan = plan(&o, &[7, 9]).unwrap();
        for op in &plan.ops {
            apply(op).unwrap();
        }
        // A fake cgroup.procs keeps the last pid written.
        assert_eq!(std::fs::read_to_string(dir.join("serve/cgroup.procs")).unwrap(), "9");
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(), "+memory +pids +cpu");
        assert_eq!(std::fs::read_to_string(dir.join("runs/cgroup.subtree_control")).unwrap(), "+memory +pids +cpu");

        // As the kernel would show it once the controllers are on.
        std::fs::write(dir.join("cgroup.subtree_control"), "memory pids cpu").unwrap();
        // A run cgroup a killed jail left (its creator dead), and the
        // files the fake has where the kernel has none.
        std::fs::create_dir_all(dir.join("runs/jail-4194305-0/tree")).unwrap();
        for f in ["runs/cgroup.subtree_control", "serve/cgroup.procs"] {
            std::fs::remove_file(dir.join(f)).unwrap();
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        tear_down(&plan.record, 9, until).unwrap();
        assert!(!dir.join("runs").exists() && !dir.join("serve").exists());
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(), "-memory -pids -cpu");
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.procs")).unwrap(), "9");
        // Again: nothing left to do is no error.
        std::fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
        tear_down(&plan.record, 9, until).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(), "");
    }

    #[test]
    fn on_a_fake_mount_a_serve_left_by_someone_else_is_found_and_refused() {
        let (t, layout, me) = fake(ALL, "", "7\n");
        std::fs::create_dir(t.path().join("pod/serve")).unwrap();
        let o = look_in(&layout, &me).unwrap();
        assert_eq!(o.taken, vec![SERVE]);
        assert!(plan(&o, &[7]).is_err());
        assert!(t.path().join("pod/serve").is_dir(), "left as found");
    }

    #[test]
    fn a_failed_step_is_undone_on_the_fake_mount() {
        let (t, layout, me) = fake(ALL, "", "7\n");
        let dir = t.path().join("pod");
        let o = look_in(&layout, &me).unwrap();
        let plan = plan(&o, &[7]).unwrap();
        // `runs` appears between the look and its mkdir.
        std::fs::create_dir(dir.join("runs")).unwrap();
        let mut done = Vec::new();
        let failed = plan.ops.iter().find_map(|op| match apply(op) {
            Ok(()) => {
                done.push(op.clone());
                None
            }
            Err(e) => Some(e),
        });
        assert!(matches!(failed, Some(NestError::Mkdir { ref path, .. }) if path.ends_with("runs")), "{failed:?}");
        std::fs::write(dir.join("cgroup.subtree_control"), "memory pids cpu").unwrap();
        std::fs::remove_file(dir.join("serve/cgroup.procs")).unwrap();
        for op in undo(&done, &dir) {
            apply(&op).unwrap();
        }
        assert!(!dir.join("serve").exists());
        assert!(dir.join("runs").is_dir(), "not the server's: left");
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(), "-memory -pids -cpu");
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.procs")).unwrap(), "7");
    }

    #[test]
    fn no_cgroup2_mount_or_no_v2_membership_is_refused() {
        let none = cgroup::Layout::default();
        let me = cgroup::Membership { unified: Some(PathBuf::from("/")), v1: BTreeMap::new() };
        assert!(look_in(&none, &me).unwrap_err().why.contains("no cgroup2"));
        let (_t, layout, _) = fake(ALL, "", "");
        let r = look_in(&layout, &cgroup::Membership::default()).unwrap_err();
        assert!(r.why.contains("no cgroup v2 hierarchy"), "{r:?}");
    }

    #[test]
    fn the_gauge_marks_the_mode() {
        let mut s = String::new();
        RunCgroups::Fallback(Refusal::new("x", "y")).render(&mut s);
        assert!(s.contains("jail_run_cgroups{mode=\"fallback\"} 1"), "{s}");
        assert!(s.contains("jail_run_cgroups{mode=\"nested\"} 0"), "{s}");
        let nested = RunCgroups::Nested { runs: PathBuf::from("/pod/runs"), serve: PathBuf::from("/pod/serve") };
        assert_eq!(nested.readiness(), "run cgroups: nested beneath /pod/runs\n");
        assert!(RunCgroups::Off.said().is_none());
    }
}
