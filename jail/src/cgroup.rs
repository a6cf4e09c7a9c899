//! One cgroup per run: where it can go on this host (cgroup v2, v1 on hybrid
//! hosts, or nowhere), the limit files it gets, the child joining it before
//! any of the jail's code runs, usage read back, the whole tree killed, the
//! cgroup removed, and whatever a killed jail left behind swept away.
//!
//! Supervisor side only. Layout: `<parent>/jail-<pid>-<n>` carries the limits
//! and is read for usage. Where the sandbox's uid could write those files
//! (v2, whose delegated cgroups belong to the uid the sandbox maps to, and
//! an ordinary user's v1 hierarchy) the processes live in its leaf
//! `<parent>/jail-<pid>-<n>/tree`, and the child's cgroup namespace is rooted
//! at that leaf, so even a script that mounts cgroupfs from a nested
//! namespace never sees them; a root-made v1 run cgroup, whose files are
//! root's, holds the processes itself ([`leaf_for`]).
//!
//! When: a v2 run cgroup is made before the clone (`clone3` starts the child
//! in it); a v1 one is [`Planned`] before and made after the clone, while
//! the child builds its mounts, and the child moves itself in through the
//! `tasks` files the supervisor opened and sent it (launch.rs).
//!
//! Plain file writes rather than cgroups-rs: that crate creates a cgroup in
//! every mounted hierarchy beneath a hard-coded `/sys/fs/cgroup` and cannot
//! be pointed at a fake cgroupfs; a run needs exactly the controllers below,
//! and every write here is tested against a temp-dir fake of both layouts.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The controllers a run uses. On v1, `cpuacct` gives CPU usage and
/// `freezer` a race-free kill; on v2 both are built in.
pub const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
pub const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The leaf that holds the run's processes, where there is one ([`Leaf`]).
pub(crate) const LEAF: &str = "tree";

/// CFS period for the CPU quota: 100 ms, the kernel's default.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The name the result uses for what enforced a limit.
    pub(crate) fn enforcer(self) -> &'static str {
        match self {
            Version::V1 => "cgroup_v1",
            Version::V2 => "cgroup_v2",
        }
    }

    /// Whether a run cgroup of this version is made after the clone, while
    /// the child builds its mounts (v1: the child moves itself in through
    /// `tasks` files sent to it), rather than before it (v2: `clone3`
    /// starts the child in it).
    pub(crate) fn made_after_clone(self) -> bool {
        self == Version::V1
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("mkdir {path}")]
    Mkdir { path: PathBuf, source: io::Error },
    #[error("write {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("enable {controllers} in {path}")]
    EnableControllers {
        path: PathBuf,
        controllers: String,
        source: io::Error,
    },
    #[error("rmdir {path}")]
    Remove { path: PathBuf, source: io::Error },
    #[error("open {path}")]
    Open { path: PathBuf, source: io::Error },
}

// ------------------------------------------------------------------ layout

/// One mounted v1 hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hierarchy {
    pub mount: PathBuf,
    /// The cgroup the mount shows at its mount point (`/` unless a subtree
    /// was bind-mounted, as in some containers).
    pub root: PathBuf,
    pub controllers: Vec<String>,
}

/// The cgroup filesystems this process sees.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// The cgroup2 mount: mount point and the cgroup at it.
    pub unified: Option<(PathBuf, PathBuf)>,
    pub v1: Vec<Hierarchy>,
}

/// Parse `/proc/self/mountinfo`. Pure.
pub fn parse_mountinfo(text: &str) -> Layout {
    let mut layout = Layout::default();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let fields: Vec<&str> = left.split_whitespace().collect();
        let (Some(root), Some(mount)) = (fields.get(3), fields.get(4)) else { continue };
        let (root, mount) = (PathBuf::from(unescape(root)), PathBuf::from(unescape(mount)));
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or("");
        let _source = r.next();
        let options = r.next().unwrap_or("");
        match fstype {
            "cgroup2" => layout.unified = Some((mount, root)),
            "cgroup" => {
                let controllers: Vec<String> = options
                    .split(',')
                    .filter(|o| V1_CONTROLLERS.contains(o) || ["cpuset", "io", "blkio", "devices", "hugetlb"].contains(o))
                    .map(String::from)
                    .collect();
                if !controllers.is_empty() {
                    layout.v1.push(Hierarchy { mount, root, controllers });
                }
            }
            _ => {}
        }
    }
    layout
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// Which cgroup this process is in, per hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    pub unified: Option<PathBuf>,
    /// v1 controller → cgroup path.
    pub v1: BTreeMap<String, PathBuf>,
}

/// Parse `/proc/self/cgroup` (`id:controllers:path` lines). Pure.
pub fn parse_proc_cgroup(text: &str) -> Membership {
    let mut m = Membership::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            m.unified = Some(PathBuf::from(path));
            continue;
        }
        for c in controllers.split(',').filter(|c| !c.is_empty() && !c.starts_with("name=")) {
            m.v1.insert(c.to_string(), PathBuf::from(path));
        }
    }
    m
}

/// The directory of cgroup `path` in a hierarchy mounted at `mount` showing
/// cgroup `root` there; `None` when the cgroup lies outside the mount.
pub fn dir_of(mount: &Path, root: &Path, path: &Path) -> Option<PathBuf> {
    let rel = path.strip_prefix(root).ok()?;
    Some(if rel.as_os_str().is_empty() { mount.to_path_buf() } else { mount.join(rel) })
}

// --------------------------------------------------------------- discovery

/// One directory a run cgroup is created in, with the controllers it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Parent {
    pub dir: PathBuf,
    pub controllers: Vec<String>,
}

/// A place this host offers for the run's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub version: Version,
    /// One entry on v2; one per hierarchy on v1.
    pub parents: Vec<Parent>,
}

impl Candidate {
    pub fn controllers(&self) -> BTreeSet<&str> {
        self.parents.iter().flat_map(|p| p.controllers.iter().map(String::as_str)).collect()
    }

    pub fn has(&self, controller: &str) -> bool {
        self.parents.iter().any(|p| p.controllers.iter().any(|c| c == controller))
    }

    /// Whether the run's CPU usage can be read (for the CPU-time limit).
    pub(crate) fn has_cpu_usage(&self) -> bool {
        match self.version {
            // cpu.stat's usage_usec is there without the cpu controller.
            Version::V2 => true,
            Version::V1 => self.has("cpuacct"),
        }
    }
}

/// What the host offers, each backend with the reason it cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Discovery {
    pub v2: Result<Candidate, String>,
    pub v1: Result<Candidate, String>,
}

/// Whether this process may create cgroups in `dir` (write and search).
pub fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK).is_ok()
}

/// The words of a cgroup file (`cgroup.controllers`,
/// `cgroup.subtree_control`); none when it cannot be read.
pub fn read_words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().split_whitespace().map(String::from).collect()
}

/// Look at both hierarchies from this process's place in them. `parent`
/// (a cgroup path) replaces our own cgroup as the parent of run cgroups.
pub(crate) fn discover(layout: &Layout, me: &Membership, parent: Option<&Path>) -> Discovery {
    Discovery { v2: discover_v2(layout, me, parent), v1: discover_v1(layout, me, parent) }
}

fn discover_v2(layout: &Layout, me: &Membership, parent: Option<&Path>) -> Result<Candidate, String> {
    let Some((mount, root)) = &layout.unified else {
        return Err("no cgroup2 filesystem is mounted".into());
    };
    let Some(path) = parent.map(Path::to_path_buf).or_else(|| me.unified.clone()) else {
        return Err("this process is in no cgroup v2 hierarchy".into());
    };
    let Some(dir) = dir_of(mount, root, &path) else {
        return Err(format!("cgroup {} is outside the cgroup2 mount at {}", path.display(), mount.display()));
    };
    if !dir.is_dir() {
        return Err(format!("cgroup v2 parent {} does not exist", dir.display()));
    }
    let available: Vec<String> = read_words(&dir.join("cgroup.controllers"))
        .into_iter()
        .filter(|c| V2_CONTROLLERS.contains(&c.as_str()))
        .collect();
    if available.is_empty() {
        return Err(format!(
            "cgroup v2 at {} offers none of memory, pids, cpu (on a hybrid host they are bound to v1)",
            dir.display()
        ));
    }
    if !writable(&dir) {
        return Err(format!("cgroup v2 parent {} is not writable by uid {}", dir.display(), nix::unistd::getuid()));
    }
    let enabled = read_words(&dir.join("cgroup.subtree_control"));
    let missing: Vec<&String> = available.iter().filter(|c| !enabled.contains(c)).collect();
    let is_root = dir == *mount;
    let has_procs = !std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().trim().is_empty();
    if !missing.is_empty() && has_procs && !is_root {
        return Err(format!(
            "cgroup v2 parent {} holds processes, so controllers cannot be enabled for its children \
             (the no-internal-processes rule); give jail a delegated parent whose processes live in a leaf",
            dir.display()
        ));
    }
    Ok(Candidate { version: Version::V2, parents: vec![Parent { dir, controllers: available }] })
}

fn discover_v1(layout: &Layout, me: &Membership, parent: Option<&Path>) -> Result<Candidate, String> {
    if layout.v1.is_empty() {
        return Err("no cgroup v1 hierarchy is mounted".into());
    }
    let mut parents: Vec<Parent> = Vec::new();
    let mut problems = Vec::new();
    for c in V1_CONTROLLERS {
        let Some(h) = layout.v1.iter().find(|h| h.controllers.iter().any(|hc| hc == c)) else {
            problems.push(format!("{c}: not mounted"));
            continue;
        };
        let Some(path) = parent.map(Path::to_path_buf).or_else(|| me.v1.get(c).cloned()) else {
            problems.push(format!("{c}: this process is in no {c} cgroup"));
            continue;
        };
        let Some(dir) = dir_of(&h.mount, &h.root, &path) else {
            problems.push(format!("{c}: cgroup {} is outside the mount", path.display()));
            continue;
        };
        if !dir.is_dir() {
            problems.push(format!("{c}: {} does not exist", dir.display()));
            continue;
        }
        if !writable(&dir) {
            problems.push(format!("{c}: {} is not writable by uid {}", dir.display(), nix::unistd::getuid()));
            continue;
        }
        match parents.iter_mut().find(|p| p.dir == dir) {
            Some(p) => p.controllers.push(c.to_string()),
            None => parents.push(Parent { dir, controllers: vec![c.to_string()] }),
        }
    }
    let limiting = parents.iter().flat_map(|p| &p.controllers).any(|c| ["memory", "pids", "cpu"].contains(&c.as_str()));
    if !limiting {
        return Err(format!("no writable cgroup v1 memory, pids or cpu hierarchy ({})", problems.join("; ")));
    }
    Ok(Candidate { version: Version::V1, parents })
}

/// What a run asks of its cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Settings {
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    /// Whether the CPU-time limit needs the run's CPU usage.
    pub cpu_time: bool,
}

/// The backend for this run, or `None` (rlimits) with the reasons.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    pub candidate: Option<Candidate>,
    /// Why each backend not chosen was not, in plain words.
    pub notes: Vec<String>,
}

/// Pick the cgroup backend that enforces the most of what the run asks, v2
/// on a tie; neither when no cgroup is writable. Pure.
pub fn choose(d: &Discovery, s: &Settings) -> Choice {
    let score = |c: &Candidate| {
        let limits = [
            (s.memory.is_some(), c.has("memory")),
            (s.cpus.is_some(), c.has("cpu")),
            (s.pids.is_some(), c.has("pids")),
            (s.cpu_time, c.has_cpu_usage()),
        ];
        limits.iter().filter(|(wanted, has)| *wanted && *has).count()
    };
    let mut notes = Vec::new();
    let pick = match (&d.v2, &d.v1) {
        (Ok(v2), Ok(v1)) => {
            if score(v1) > score(v2) {
                notes
                    .push(format!("cgroup v2 offers less here ({})", v2.controllers().into_iter().collect::<Vec<_>>().join(" ")));
                Some(v1.clone())
            } else {
                notes.push("cgroup v1 is also writable; v2 preferred".into());
                Some(v2.clone())
            }
        }
        (Ok(v2), Err(e)) => {
            notes.push(format!("cgroup v1: {e}"));
            Some(v2.clone())
        }
        (Err(e), Ok(v1)) => {
            notes.push(format!("cgroup v2: {e}"));
            Some(v1.clone())
        }
        (Err(e2), Err(e1)) => {
            notes.push(format!("cgroup v2: {e2}"));
            notes.push(format!("cgroup v1: {e1}"));
            None
        }
    };
    Choice { candidate: pick, notes }
}

/// This host's choice for this process, from /proc.
pub(crate) fn choose_here(parent: Option<&Path>, s: &Settings) -> (Discovery, Choice) {
    let layout = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let me = parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
    let d = discover(&layout, &me, parent);
    let c = choose(&d, s);
    (d, c)
}

// ------------------------------------------------------------- limit files

/// Whether a write may be skipped when the file is not there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Required,
    /// Swap files exist only when the kernel accounts swap.
    IfPresent,
}

/// One limit file of the run cgroup: file name, value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub file: &'static str,
    pub value: String,
    pub need: Need,
}

fn w(file: &'static str, value: impl ToString, need: Need) -> Write {
    Write { file, value: value.to_string(), need }
}

fn quota_us(cpus: f64) -> u64 {
    ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000)
}

/// The limit files for a v2 run cgroup, in order. Pure.
pub(crate) fn v2_writes(s: &Settings, controllers: &BTreeSet<&str>) -> Vec<Write> {
    let mut out = Vec::new();
    if let (Some(m), true) = (s.memory, controllers.contains("memory")) {
        out.push(w("memory.max", m, Need::Required));
        out.push(w("memory.swap.max", 0, Need::IfPresent));
    }
    if let (Some(p), true) = (s.pids, controllers.contains("pids")) {
        out.push(w("pids.max", p, Need::Required));
    }
    if let (Some(c), true) = (s.cpus, controllers.contains("cpu")) {
        out.push(w("cpu.max", format!("{} {CPU_PERIOD_US}", quota_us(c)), Need::Required));
    }
    out
}

/// The limit files for one v1 controller of the run cgroup, in order. Pure.
pub(crate) fn v1_writes(s: &Settings, controller: &str) -> Vec<Write> {
    match (controller, s) {
        // The memory limit first: memsw may never be below it.
        ("memory", Settings { memory: Some(m), .. }) => vec![
            w("memory.limit_in_bytes", m, Need::Required),
            w("memory.memsw.limit_in_bytes", m, Need::IfPresent),
        ],
        ("pids", Settings { pids: Some(p), .. }) => vec![w("pids.max", p, Need::Required)],
        ("cpu", Settings { cpus: Some(c), .. }) => vec![
            w("cpu.cfs_period_us", CPU_PERIOD_US, Need::Required),
            w("cpu.cfs_quota_us", quota_us(*c), Need::Required),
        ],
        _ => vec![],
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
}

// ----------------------------------------------------------- the run cgroup

/// Child side, still single-threaded: move the calling thread (the whole
/// process) into the leaf through the supervisor's `tasks` descriptors,
/// and close them.
pub(crate) fn enter_self(tasks: Vec<OwnedFd>) -> io::Result<()> {
    for fd in tasks {
        let n = nix::unistd::write(&fd, b"0")?;
        if n != 1 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write to tasks"));
        }
    }
    Ok(())
}

/// Child side: receive the `tasks` files the supervisor sends once the v1
/// run cgroup is made (sync.rs, the `cgroup` channel) and move in through
/// them ([`enter_self`]). End-of-file without them means the supervisor
/// could not make it, and the run must not go on.
pub(crate) fn enter_sent(sock: &OwnedFd) -> io::Result<()> {
    let tasks = crate::sys::recv_fds(std::os::fd::AsFd::as_fd(sock))?;
    if tasks.is_empty() {
        return Err(io::Error::other("the supervisor closed the cgroup channel without sending the run cgroup's tasks files"));
    }
    enter_self(tasks)
}

/// What the run used, from the cgroup. `None`: this kernel does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CgroupUsage {
    pub user_ns: Option<u64>,
    pub system_ns: Option<u64>,
    pub memory_peak: Option<u64>,
    pub pids_peak: Option<u64>,
    pub oom_kills: Option<u64>,
}

/// Where the run's processes live in the run cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leaf {
    /// In the leaf [`LEAF`] beneath it, the root of their cgroup namespace:
    /// the files that hold their limits lie above what they can see.
    Below,
    /// In the run cgroup itself: one mkdir and one rmdir less per hierarchy.
    Itself,
}

/// Whether the run's processes need a leaf of their own, from who creates
/// the run cgroup and which host uid the sandbox runs as. Pure.
///
/// The kernel gives a new cgroup's files to its creator unless the creator
/// is root (`cgroup_kn_set_ugid`), so an ordinary user's run cgroup has
/// limit files (mode 0644) that its own sandbox, mapped to that same uid,
/// could write if it ever reached them; a root-made one's files are root's,
/// and a root-started sandbox runs as a leased uid, never 0, so it could
/// only read them. v2 keeps its leaf whoever creates it: a delegated v2
/// cgroup belongs to the uid the sandbox maps to, and the leaf costs v2 no
/// join (the child is cloned straight into it).
pub(crate) fn leaf_for(version: Version, creator_uid: u32, sandbox_host_uid: u32) -> Leaf {
    match version {
        Version::V2 => Leaf::Below,
        Version::V1 if creator_uid != 0 && creator_uid == sandbox_host_uid => Leaf::Below,
        Version::V1 => Leaf::Itself,
    }
}

/// A run cgroup decided but not made yet: its place, name, limits and leaf.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Planned {
    pub candidate: Candidate,
    pub name: String,
    pub settings: Settings,
    pub leaf: Leaf,
}

/// One run's cgroup, removed on drop if not removed before.
#[derive(Debug)]
pub(crate) struct RunCgroup {
    pub version: Version,
    /// The run cgroup in each hierarchy, with the controllers it serves.
    dirs: Vec<Parent>,
    leaf: Leaf,
    /// Setup time in ms, for the result's timings.
    pub created_in: Duration,
    removed: bool,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// `jail-<pid>-<n>`: recognisable, and its creator can be checked for life.
pub(crate) fn run_name() -> String {
    format!("jail-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// The creator pid and sequence number in a run cgroup's name, if it is
/// one of ours.
pub(crate) fn creator_of(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_prefix("jail-")?;
    let (pid, n) = rest.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((pid.parse().ok()?, n.parse().ok()?))
}

/// Whether a run cgroup named for (`pid`, `n`) may belong to a live jail.
/// One with our own pid and a number we have not handed out yet was left
/// by an earlier process that had our pid.
fn maybe_live(pid: u32, n: u32) -> bool {
    if pid == std::process::id() {
        return n < SEQ.load(Ordering::Relaxed);
    }
    alive(pid)
}

impl RunCgroup {
    /// Create the run cgroup `planned` describes (and its leaf, if it has
    /// one) in every parent and write its limits. On error nothing is left
    /// behind.
    pub fn create(planned: &Planned) -> Result<RunCgroup, CgroupError> {
        let started = Instant::now();
        let Planned { candidate: c, name, settings: s, leaf } = planned;
        let mut cg = RunCgroup {
            version: c.version,
            dirs: Vec::new(),
            leaf: *leaf,
            created_in: Duration::ZERO,
            removed: false,
        };
        if c.version == Version::V2 {
            for p in &c.parents {
                enable_controllers(p)?;
            }
        }
        for p in &c.parents {
            let dir = p.dir.join(name);
            std::fs::create_dir(&dir).map_err(|source| CgroupError::Mkdir { path: dir.clone(), source })?;
            cg.dirs.push(Parent { dir: dir.clone(), controllers: p.controllers.clone() });
            if *leaf == Leaf::Below {
                let leaf = dir.join(LEAF);
                std::fs::create_dir(&leaf).map_err(|source| CgroupError::Mkdir { path: leaf, source })?;
            }
            let writes = match c.version {
                Version::V2 => v2_writes(s, &p.controllers.iter().map(String::as_str).collect()),
                Version::V1 => p.controllers.iter().flat_map(|ctl| v1_writes(s, ctl)).collect(),
            };
            for wr in writes {
                let path = dir.join(wr.file);
                match write_file(&path, &wr.value) {
                    Ok(()) => {}
                    Err(e)
                        if wr.need == Need::IfPresent
                            && matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied) => {}
                    Err(source) => return Err(CgroupError::Write { path, value: wr.value, source }),
                }
            }
        }
        cg.created_in = started.elapsed();
        Ok(cg)
    }

    pub fn has(&self, controller: &str) -> bool {
        self.dirs.iter().any(|p| p.controllers.iter().any(|c| c == controller))
    }

    /// The run cgroup's directory in each hierarchy.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|p| p.dir.as_path())
    }

    /// Where the run's processes are in the hierarchy of `p`.
    fn procs_dir(&self, p: &Parent) -> PathBuf {
        match self.leaf {
            Leaf::Below => p.dir.join(LEAF),
            Leaf::Itself => p.dir.clone(),
        }
    }

    /// Every directory of the run cgroup, leaves first (the order rmdir needs).
    fn all_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for p in &self.dirs {
            if self.leaf == Leaf::Below {
                out.push(p.dir.join(LEAF));
            }
            out.push(p.dir.clone());
        }
        out
    }

    fn dir_for(&self, controller: &str) -> Option<&Path> {
        match self.version {
            Version::V2 => self.dirs.first().map(|p| p.dir.as_path()),
            Version::V1 => self.dirs.iter().find(|p| p.controllers.iter().any(|c| c == controller)).map(|p| p.dir.as_path()),
        }
    }

    // How the child enters the cgroup of the run's processes without being
    // moved by us. Writing another process's pid to `cgroup.procs` takes
    // the kernel's global threadgroup lock for writing, which waits out an
    // RCU grace period: 5 to 20 ms on this kind of host, more than the rest
    // of the jail's setup together. Two ways around it, both taken before
    // any of the script's code can run: on v2, `clone3(CLONE_INTO_CGROUP)`
    // creates the child in the leaf ([`RunCgroup::clone_into`]); on v1, the
    // child, single-threaded and running only our code, writes "0" to the
    // `tasks` file in each hierarchy ([`RunCgroup::tasks_files`],
    // [`enter_self`]), moving its one thread itself; the kernel skips that
    // lock when the current thread moves alone.

    /// v2: the leaf, opened for `clone3(CLONE_INTO_CGROUP)`; `None` on v1.
    pub(crate) fn clone_into(&self) -> Result<Option<OwnedFd>, CgroupError> {
        match (self.version, self.dirs.first()) {
            (Version::V2, Some(p)) => {
                let opts = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).clone();
                open_with(self.procs_dir(p), &opts).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// v1: the `tasks` file the run's processes go into, in each hierarchy;
    /// empty on v2. Opened here, so the permission check is ours (the
    /// kernel checks the opener's credentials, not the writer's).
    pub(crate) fn tasks_files(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        match self.version {
            Version::V1 => {
                let opts = std::fs::OpenOptions::new().write(true).clone();
                self.dirs.iter().map(|p| open_with(self.procs_dir(p).join("tasks"), &opts)).collect()
            }
            Version::V2 => Ok(Vec::new()),
        }
    }

    /// Move `pid` into the run's processes' cgroup in every hierarchy: the
    /// slow way, for a kernel without `clone3(CLONE_INTO_CGROUP)` (before
    /// 5.7). The child waits on the release pipe until this is done.
    pub fn join(&self, pid: u32) -> Result<(), CgroupError> {
        for p in &self.dirs {
            let procs = self.procs_dir(p).join("cgroup.procs");
            write_file(&procs, &pid.to_string()).map_err(|source| CgroupError::Write {
                path: procs,
                value: pid.to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// CPU time used so far by the whole run, in nanoseconds.
    pub(crate) fn cpu_ns(&self) -> Option<u64> {
        match self.version {
            Version::V2 => {
                let text = std::fs::read_to_string(self.dir_for("cpu")?.join("cpu.stat")).ok()?;
                keyed(&text, "usage_usec").map(|us| us * 1000)
            }
            Version::V1 => read_u64(&self.dir_for("cpuacct")?.join("cpuacct.usage")),
        }
    }

    /// What the run used. Read once the tree is dead, before removal.
    pub fn usage(&self) -> CgroupUsage {
        match self.version {
            Version::V2 => {
                let dir = self.dirs.first().map(|p| p.dir.as_path()).unwrap_or(Path::new("/nonexistent"));
                let stat = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
                let events = std::fs::read_to_string(dir.join("memory.events")).ok();
                CgroupUsage {
                    user_ns: keyed(&stat, "user_usec").map(|v| v * 1000),
                    system_ns: keyed(&stat, "system_usec").map(|v| v * 1000),
                    memory_peak: self.has("memory").then(|| read_u64(&dir.join("memory.peak"))).flatten(),
                    pids_peak: self.has("pids").then(|| read_u64(&dir.join("pids.peak"))).flatten(),
                    oom_kills: events.as_deref().and_then(|e| keyed(e, "oom_kill")),
                }
            }
            Version::V1 => {
                let acct = self.dir_for("cpuacct");
                let mem = self.dir_for("memory");
                let (user_ns, system_ns) = match acct {
                    Some(d) => split_v1_cpu(
                        read_u64(&d.join("cpuacct.usage")),
                        read_u64(&d.join("cpuacct.usage_user")),
                        read_u64(&d.join("cpuacct.usage_sys")),
                    ),
                    None => (None, None),
                };
                CgroupUsage {
                    user_ns,
                    system_ns,
                    memory_peak: mem.and_then(|d| read_u64(&d.join("memory.max_usage_in_bytes"))),
                    pids_peak: self.dir_for("pids").and_then(|d| read_u64(&d.join("pids.peak"))),
                    // v1 counts OOM kills only in the victim's own cgroup:
                    // the leaf where there is one, plus the run cgroup itself.
                    oom_kills: mem.and_then(|d| {
                        let count = |dir: &Path| {
                            std::fs::read_to_string(dir.join("memory.oom_control")).ok().and_then(|t| keyed(&t, "oom_kill"))
                        };
                        let in_leaf = match self.leaf {
                            Leaf::Below => count(&d.join(LEAF)).unwrap_or(0),
                            Leaf::Itself => 0,
                        };
                        Some(count(d)? + in_leaf)
                    }),
                }
            }
        }
    }

    /// Whether any process is still in the run cgroup.
    pub(crate) fn is_populated(&self) -> bool {
        self.all_dirs().iter().any(|d| !procs_of(d).is_empty())
    }

    /// Kill every process in the run cgroup: `cgroup.kill` on v2; on v1
    /// freeze (so nothing forks or exits under us), SIGKILL each, thaw.
    pub fn kill(&self) {
        match self.version {
            Version::V2 => {
                let Some(dir) = self.dirs.first().map(|p| p.dir.clone()) else { return };
                if write_file(&dir.join("cgroup.kill"), "1").is_ok() {
                    return;
                }
                // Before 5.14: freeze, kill, thaw.
                let frozen = write_file(&dir.join("cgroup.freeze"), "1").is_ok();
                self.kill_listed();
                if frozen {
                    let _ = write_file(&dir.join("cgroup.freeze"), "0");
                }
            }
            Version::V1 => {
                let freezer = self.dir_for("freezer").map(Path::to_path_buf);
                let frozen = freezer.as_ref().is_some_and(|d| freeze_v1(d));
                self.kill_listed();
                if let Some(d) = freezer {
                    let _ = write_file(&d.join("freezer.state"), "THAWED");
                }
                if !frozen {
                    // Without a freezer a fork can race the listing; go again.
                    for _ in 0..10 {
                        if !self.is_populated() {
                            break;
                        }
                        self.kill_listed();
                    }
                }
            }
        }
    }

    /// Freeze every process of the run cgroup and wait, up to `within`,
    /// until the kernel says all of them are frozen: v2's `cgroup.freeze`
    /// (`frozen 1` in `cgroup.events`), v1's `freezer.state`. A frozen
    /// task is held where it would take a signal, never inside a system
    /// call that has begun to change a file. `Ok(false)`: this cgroup has
    /// no freezer. An error (the time passed, a write refused) leaves the
    /// cgroup thawed.
    pub(crate) fn freeze(&self, within: Duration) -> Result<bool, String> {
        let (file, frozen): (PathBuf, fn(&Path) -> bool) = match self.version {
            Version::V2 => match self.dirs.first() {
                Some(p) => (p.dir.join("cgroup.freeze"), |dir| {
                    std::fs::read_to_string(dir.join("cgroup.events")).is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1"))
                }),
                None => return Ok(false),
            },
            Version::V1 => match self.dir_for("freezer") {
                Some(d) => (d.join("freezer.state"), |dir| {
                    std::fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
                }),
                None => return Ok(false),
            },
        };
        let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let value = if self.version == Version::V2 { "1" } else { "FROZEN" };
        write_file(&file, value).map_err(|e| format!("{}: {e}", file.display()))?;
        let deadline = Instant::now() + within;
        let (mut pause, mut passes) = (Duration::from_micros(20), 0);
        loop {
            if frozen(&dir) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                self.thaw();
                return Err(format!("not all of its processes were frozen within {} ms", within.as_millis()));
            }
            pause = next_pause(pause, &mut passes);
        }
    }

    /// Thaw what [`RunCgroup::freeze`] froze.
    pub(crate) fn thaw(&self) {
        let (dir, file, value) = match self.version {
            Version::V2 => (self.dirs.first().map(|p| p.dir.as_path()), "cgroup.freeze", "0"),
            Version::V1 => (self.dir_for("freezer"), "freezer.state", "THAWED"),
        };
        if let Some(d) = dir {
            let _ = write_file(&d.join(file), value);
        }
    }

    fn kill_listed(&self) {
        for dir in self.all_dirs() {
            for pid in procs_of(&dir) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }

    /// Remove the run cgroup. Exited tasks can linger for a moment after
    /// their parent reaped them, so a busy cgroup is retried for up to
    /// 200 ms, killing whatever is still inside.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.removed = true;
        let deadline = Instant::now() + Duration::from_millis(200);
        let mut pause = Duration::from_micros(100);
        loop {
            match self.try_remove() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {
                    self.kill();
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(10));
                }
            }
        }
    }

    fn try_remove(&self) -> Result<(), CgroupError> {
        for dir in self.all_dirs() {
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(CgroupError::Remove { path: dir, source }),
            }
        }
        Ok(())
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if !self.removed {
            self.kill();
            let _ = self.try_remove();
        }
    }
}

/// Open a cgroup file; std opens with O_CLOEXEC, so nothing of this
/// reaches the script.
fn open_with(path: PathBuf, opts: &std::fs::OpenOptions) -> Result<OwnedFd, CgroupError> {
    opts.open(&path).map(OwnedFd::from).map_err(|source| CgroupError::Open { path, source })
}

/// v2 needs each controller enabled in the parent's `cgroup.subtree_control`
/// before a child cgroup gets its files. Writes only those not enabled yet.
pub fn enable_controllers(p: &Parent) -> Result<(), CgroupError> {
    let path = p.dir.join("cgroup.subtree_control");
    let enabled = read_words(&path);
    let missing: Vec<String> = p.controllers.iter().filter(|c| !enabled.contains(c)).map(|c| format!("+{c}")).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let value = missing.join(" ");
    write_file(&path, &value).map_err(|source| CgroupError::EnableControllers { path, controllers: value, source })
}

/// The gap before the next look at a tree being held still (a freeze here,
/// a SIGSTOP sweep in still.rs): short while a hold usually settles (a stop
/// lands as soon as the task is scheduled; no gap is needed for the proof),
/// then growing, so that a tree that takes long costs little CPU.
pub(crate) fn next_pause(pause: Duration, passes: &mut u32) -> Duration {
    std::thread::sleep(pause);
    *passes += 1;
    if *passes < 16 {
        pause
    } else {
        (pause * 2).min(Duration::from_millis(2))
    }
}

/// Freeze a v1 cgroup and wait (up to 100 ms) until it is frozen.
fn freeze_v1(dir: &Path) -> bool {
    let state = dir.join("freezer.state");
    if write_file(&state, "FROZEN").is_err() {
        return false;
    }
    let deadline = Instant::now() + Duration::from_millis(100);
    while Instant::now() < deadline {
        if std::fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FROZEN") {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// The processes `dir/cgroup.procs` lists.
pub fn procs_of(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// v1's user/system split comes from tick sampling while its total
/// (`cpuacct.usage`) is exact: scale the split to the total, as getrusage
/// does for a process. Pure.
pub(crate) fn split_v1_cpu(total: Option<u64>, user: Option<u64>, system: Option<u64>) -> (Option<u64>, Option<u64>) {
    match (total, user, system) {
        (Some(t), Some(u), Some(s)) if u + s > 0 => {
            let user = (t as u128 * u as u128 / (u as u128 + s as u128)) as u64;
            (Some(user), Some(t - user))
        }
        (Some(t), Some(0), Some(0)) => (Some(t), Some(0)),
        (_, u, s) => (u, s),
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The value of `key` in a `key value` per line file (cpu.stat,
/// memory.events, memory.oom_control). Pure.
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Remove run cgroups left by jails that were killed before they could
/// clean up: only ours by name, only when their creator is dead, and only
/// when empty (rmdir refuses a populated cgroup). Errors are ignored: the
/// next run tries again.
pub fn sweep(c: &Candidate) -> usize {
    let mut removed = 0;
    for p in &c.parents {
        let Ok(entries) = std::fs::read_dir(&p.dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some((pid, n)) = name.to_str().and_then(creator_of) else { continue };
            if maybe_live(pid, n) {
                continue;
            }
            let dir = e.path();
            let _ = std::fs::remove_dir(dir.join(LEAF));
            if std::fs::remove_dir(&dir).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // EPERM means it exists but belongs to someone else.
    !matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
";

    #[test]
    fn a_hybrid_mountinfo_gives_both_layouts() {
        let l = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(l.unified, Some((PathBuf::from("/sys/fs/cgroup/unified"), PathBuf::from("/"))));
        let names: Vec<_> = l.v1.iter().map(|h| h.controllers.join(",")).collect();
        assert_eq!(names, vec!["cpu", "cpuacct", "memory", "freezer", "pids"]);
    }

    #[test]
    fn co_mounted_v1_controllers_share_a_hierarchy() {
        let l = parse_mountinfo("29 26 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n");
        assert_eq!(l.v1[0].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(l.v1[0].mount, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
    }

    #[test]
    fn proc_self_cgroup_gives_our_place_per_controller() {
        let m = parse_proc_cgroup(HYBRID_CGROUP);
        assert_eq!(m.unified, Some(PathBuf::from("/")));
        assert_eq!(m.v1["memory"], PathBuf::from("/process_api/abc"));
        assert_eq!(m.v1["pids"], PathBuf::from("/"));
        assert!(!m.v1.contains_key("name=systemd"));
    }

    #[test]
    fn a_cgroup_outside_a_bind_mounted_subtree_has_no_dir() {
        assert_eq!(dir_of(Path::new("/m"), Path::new("/a"), Path::new("/a/b")), Some(PathBuf::from("/m/b")));
        assert_eq!(dir_of(Path::new("/m"), Path::new("/a"), Path::new("/c")), None);
    }

    fn all() -> Settings {
        Settings { memory: Some(64 << 20), cpus: Some(0.5), pids: Some(32), cpu_time: true }
    }

    fn planned(c: &Candidate, name: &str, leaf: Leaf) -> Planned {
        Planned { candidate: c.clone(), name: name.into(), settings: all(), leaf }
    }

    #[test]
    fn v2_limit_files_are_memory_swap_pids_and_cpu_max() {
        let ctl: BTreeSet<&str> = ["memory", "pids", "cpu"].into();
        let got: Vec<(&str, String)> = v2_writes(&all(), &ctl).into_iter().map(|w| (w.file, w.value)).collect();
        assert_eq!(
            got,
            vec![
                ("memory.max", "67108864".to_string()),
                ("memory.swap.max", "0".to_string()),
                ("pids.max", "32".to_string()),
                ("cpu.max", "50000 100000".to_string()),
            ]
        );
        let only_pids: BTreeSet<&str> = ["pids"].into();
        assert_eq!(v2_writes(&all(), &only_pids).len(), 1);
        assert!(v2_writes(&Settings::default(), &ctl).is_empty());
    }

    #[test]
    fn v1_limit_files_put_the_memory_limit_before_memsw() {
        let files = |c| v1_writes(&all(), c).into_iter().map(|w| (w.file, w.value)).collect::<Vec<_>>();
        assert_eq!(
            files("memory"),
            vec![
                ("memory.limit_in_bytes", "67108864".to_string()),
                ("memory.memsw.limit_in_bytes", "67108864".to_string())
            ]
        );
        assert_eq!(files("pids"), vec![("pids.max", "32".to_string())]);
        assert_eq!(
            files("cpu"),
            vec![
                ("cpu.cfs_period_us", "100000".to_string()),
                ("cpu.cfs_quota_us", "50000".to_string())
            ]
        );
        assert!(files("cpuacct").is_empty());
        assert!(files("freezer").is_empty());
    }

    /// A fake cgroupfs: `root/<controller>/<path>` dirs with the listed files.
    fn fake(root: &Path, dirs: &[(&str, &[(&str, &str)])]) {
        for (dir, files) in dirs {
            let d = root.join(dir.trim_start_matches('/'));
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in *files {
                std::fs::write(d.join(f), v).unwrap();
            }
        }
    }

    fn v1_layout(root: &Path) -> Layout {
        Layout {
            unified: Some((root.join("unified"), PathBuf::from("/"))),
            v1: ["memory", "pids", "cpu", "cpuacct", "freezer"]
                .iter()
                .map(|c| Hierarchy { mount: root.join(c), root: PathBuf::from("/"), controllers: vec![c.to_string()] })
                .collect(),
        }
    }

    #[test]
    fn on_a_fake_hybrid_host_v1_is_chosen_and_gets_its_limit_files() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let d = fake_hybrid_host(root);
        assert!(d.v2.as_ref().unwrap_err().contains("offers none of memory, pids, cpu"), "{:?}", d.v2);
        let choice = choose(&d, &all());
        let c = choice.candidate.unwrap();
        assert_eq!(c.version, Version::V1);
        assert_eq!(c.parents[0].dir, root.join("memory/process_api/abc"));

        let cg = RunCgroup::create(&planned(&c, "jail-1-0", Leaf::Below)).unwrap();
        let mem = root.join("memory/process_api/abc/jail-1-0");
        assert_eq!(std::fs::read_to_string(mem.join("memory.limit_in_bytes")).unwrap(), "67108864");
        assert_eq!(std::fs::read_to_string(mem.join("memory.memsw.limit_in_bytes")).unwrap(), "67108864");
        assert!(mem.join(LEAF).is_dir());
        assert_eq!(std::fs::read_to_string(root.join("pids/jail-1-0/pids.max")).unwrap(), "32");
        assert_eq!(std::fs::read_to_string(root.join("cpu/jail-1-0/cpu.cfs_quota_us")).unwrap(), "50000");

        cg.join(4242).unwrap();
        for c in V1_CONTROLLERS {
            let base = if c == "memory" { root.join("memory/process_api/abc") } else { root.join(c) };
            assert_eq!(std::fs::read_to_string(base.join("jail-1-0").join(LEAF).join("cgroup.procs")).unwrap(), "4242");
        }

        // Usage, as the kernel would show it.
        std::fs::write(mem.join("memory.max_usage_in_bytes"), "1234\n").unwrap();
        std::fs::write(mem.join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n").unwrap();
        std::fs::write(mem.join(LEAF).join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        std::fs::write(root.join("cpuacct/jail-1-0/cpuacct.usage"), "5000000\n").unwrap();
        std::fs::write(root.join("cpuacct/jail-1-0/cpuacct.usage_user"), "3000000\n").unwrap();
        std::fs::write(root.join("cpuacct/jail-1-0/cpuacct.usage_sys"), "2000000\n").unwrap();
        std::fs::write(root.join("pids/jail-1-0/pids.peak"), "7\n").unwrap();
        assert_eq!(cg.cpu_ns(), Some(5_000_000));
        assert_eq!(
            cg.usage(),
            CgroupUsage {
                user_ns: Some(3_000_000),
                system_ns: Some(2_000_000),
                memory_peak: Some(1234),
                pids_peak: Some(7),
                oom_kills: Some(2)
            }
        );
    }

    /// A fake hybrid host: v2 mounted with no controllers, memory, pids
    /// and cpu on v1, this process in a memory cgroup of its own.
    fn fake_hybrid_host(root: &Path) -> Discovery {
        fake(
            root,
            &[
                ("unified", &[("cgroup.controllers", ""), ("cgroup.subtree_control", "")]),
                ("memory/process_api/abc", &[]),
                ("pids", &[]),
                ("cpu", &[]),
                ("cpuacct", &[]),
                ("freezer", &[]),
            ],
        );
        discover(&v1_layout(root), &parse_proc_cgroup(HYBRID_CGROUP), None)
    }

    /// The fake hybrid host, with v1 chosen.
    fn fake_hybrid(root: &Path) -> Candidate {
        choose(&fake_hybrid_host(root), &all()).candidate.unwrap()
    }

    #[test]
    fn a_root_made_v1_run_cgroup_holds_the_processes_itself_and_they_join_it_through_its_tasks_files() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let c = fake_hybrid(root);
        let cg = RunCgroup::create(&planned(&c, "jail-1-2", Leaf::Itself)).unwrap();
        let dirs: Vec<PathBuf> = cg.dirs().map(Path::to_path_buf).collect();
        assert_eq!(dirs.len(), V1_CONTROLLERS.len());
        for d in &dirs {
            assert!(!d.join(LEAF).exists(), "{} got a leaf", d.display());
            // What the kernel makes with every v1 cgroup.
            std::fs::write(d.join("tasks"), "").unwrap();
        }
        assert_eq!(cg.all_dirs(), dirs, "no leaf to remove first");
        let mem = root.join("memory/process_api/abc/jail-1-2");
        assert_eq!(std::fs::read_to_string(mem.join("memory.limit_in_bytes")).unwrap(), "67108864");
        assert_eq!(std::fs::read_to_string(root.join("pids/jail-1-2/pids.max")).unwrap(), "32");
        // The child's way in: the run cgroup's own tasks files, opened here.
        assert!(cg.clone_into().unwrap().is_none(), "v1 is not cloned into");
        let tasks = cg.tasks_files().unwrap();
        assert_eq!(tasks.len(), dirs.len());
        enter_self(tasks).unwrap();
        for d in &dirs {
            assert_eq!(std::fs::read_to_string(d.join("tasks")).unwrap(), "0", "{}", d.display());
        }
        cg.join(4242).unwrap();
        assert_eq!(std::fs::read_to_string(mem.join("cgroup.procs")).unwrap(), "4242");
        // OOM kills are the run cgroup's own count.
        std::fs::write(mem.join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n").unwrap();
        assert_eq!(cg.usage().oom_kills, Some(1));
    }

    #[test]
    fn a_v1_run_cgroup_with_a_leaf_is_joined_in_the_leaf_and_removed_leaf_first() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let c = fake_hybrid(root);
        let cg = RunCgroup::create(&planned(&c, "jail-1-3", Leaf::Below)).unwrap();
        let dirs: Vec<PathBuf> = cg.dirs().map(Path::to_path_buf).collect();
        for d in &dirs {
            std::fs::write(d.join(LEAF).join("tasks"), "").unwrap();
        }
        let expected: Vec<PathBuf> = dirs.iter().flat_map(|d| [d.join(LEAF), d.clone()]).collect();
        assert_eq!(cg.all_dirs(), expected);
        enter_self(cg.tasks_files().unwrap()).unwrap();
        for d in &dirs {
            assert_eq!(std::fs::read_to_string(d.join(LEAF).join("tasks")).unwrap(), "0");
            assert!(!d.join("tasks").exists(), "the limits' own cgroup was joined");
        }
    }

    #[test]
    fn a_name_already_taken_fails_the_creation_and_leaves_nothing_of_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let c = fake_hybrid(root);
        // A killed jail's, not swept yet: the third hierarchy's mkdir fails.
        std::fs::create_dir_all(root.join("cpu/jail-1-4")).unwrap();
        // No limits: the fake's directories stay empty, so rmdir works on them.
        let p = Planned { settings: Settings::default(), ..planned(&c, "jail-1-4", Leaf::Itself) };
        let err = RunCgroup::create(&p).unwrap_err();
        assert!(matches!(&err, CgroupError::Mkdir { path, .. } if path.ends_with("cpu/jail-1-4")), "{err:?}");
        assert!(!root.join("memory/process_api/abc/jail-1-4").exists());
        assert!(!root.join("pids/jail-1-4").exists());
    }

    #[test]
    fn only_a_cgroup_whose_files_the_sandbox_could_write_keeps_a_leaf() {
        // Root creates, the sandbox runs as a leased uid: root's files.
        assert_eq!(leaf_for(Version::V1, 0, 1_879_048_200), Leaf::Itself);
        // An ordinary user's v1 hierarchy: the files are the sandbox's own uid's.
        assert_eq!(leaf_for(Version::V1, 1000, 1000), Leaf::Below);
        // v2 keeps its leaf whoever makes it.
        assert_eq!(leaf_for(Version::V2, 0, 1_879_048_200), Leaf::Below);
        assert_eq!(leaf_for(Version::V2, 1000, 1000), Leaf::Below);
    }

    #[test]
    fn on_a_fake_v2_host_controllers_are_enabled_and_limits_written() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fake(
            root,
            &[(
                "deleg",
                &[
                    ("cgroup.controllers", "cpuset cpu io memory pids"),
                    ("cgroup.subtree_control", ""),
                    ("cgroup.procs", ""),
                ],
            )],
        );
        let layout = Layout { unified: Some((root.to_path_buf(), PathBuf::from("/"))), v1: vec![] };
        let me = Membership { unified: Some(PathBuf::from("/user.slice/x.scope")), v1: BTreeMap::new() };
        let d = discover(&layout, &me, Some(Path::new("/deleg")));
        assert!(d.v1.is_err());
        let c = choose(&d, &all()).candidate.unwrap();
        assert_eq!(c.version, Version::V2);
        assert_eq!(c.parents[0].controllers, vec!["cpu", "memory", "pids"]);

        let cg = RunCgroup::create(&planned(&c, "jail-1-1", Leaf::Below)).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("deleg/cgroup.subtree_control")).unwrap(), "+cpu +memory +pids");
        let dir = root.join("deleg/jail-1-1");
        assert_eq!(std::fs::read_to_string(dir.join("memory.max")).unwrap(), "67108864");
        assert_eq!(std::fs::read_to_string(dir.join("memory.swap.max")).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(dir.join("pids.max")).unwrap(), "32");
        assert_eq!(std::fs::read_to_string(dir.join("cpu.max")).unwrap(), "50000 100000");
        cg.join(77).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(LEAF).join("cgroup.procs")).unwrap(), "77");
        // The child is cloned into the leaf; it has no tasks files to write.
        let into = std::fs::File::from(cg.clone_into().unwrap().unwrap());
        use std::os::unix::fs::MetadataExt;
        assert_eq!(into.metadata().unwrap().ino(), std::fs::metadata(dir.join(LEAF)).unwrap().ino());
        assert!(cg.tasks_files().unwrap().is_empty());

        std::fs::write(dir.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n").unwrap();
        std::fs::write(dir.join("memory.peak"), "4096\n").unwrap();
        std::fs::write(dir.join("memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n").unwrap();
        assert_eq!(cg.cpu_ns(), Some(1_500_000));
        // No pids.peak on this kernel: null, never invented.
        assert_eq!(
            cg.usage(),
            CgroupUsage {
                user_ns: Some(1_000_000),
                system_ns: Some(500_000),
                memory_peak: Some(4096),
                pids_peak: None,
                oom_kills: Some(1)
            }
        );
        // cgroup.kill is the v2 kill.
        cg.kill();
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.kill")).unwrap(), "1");
    }

    #[test]
    fn a_v2_parent_with_processes_of_its_own_is_refused_with_the_reason() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fake(
            root,
            &[(
                "scope",
                &[
                    ("cgroup.controllers", "memory pids"),
                    ("cgroup.subtree_control", ""),
                    ("cgroup.procs", "123\n"),
                ],
            )],
        );
        let layout = Layout { unified: Some((root.to_path_buf(), PathBuf::from("/"))), v1: vec![] };
        let me = Membership { unified: Some(PathBuf::from("/scope")), v1: BTreeMap::new() };
        let d = discover(&layout, &me, None);
        assert!(d.v2.as_ref().unwrap_err().contains("no-internal-processes"), "{:?}", d.v2);
        let choice = choose(&d, &all());
        assert_eq!(choice.candidate, None);
        assert_eq!(choice.notes.len(), 2);
    }

    #[test]
    fn the_backend_that_enforces_more_wins_and_v2_wins_ties() {
        let cand = |version, ctl: &[&str]| Candidate {
            version,
            parents: vec![Parent {
                dir: PathBuf::from("/x"),
                controllers: ctl.iter().map(|s| s.to_string()).collect(),
            }],
        };
        let d = Discovery {
            v2: Ok(cand(Version::V2, &["pids"])),
            v1: Ok(cand(Version::V1, &["memory", "pids", "cpuacct"])),
        };
        assert_eq!(choose(&d, &all()).candidate.unwrap().version, Version::V1);
        let d = Discovery {
            v2: Ok(cand(Version::V2, &["memory", "pids", "cpu"])),
            v1: Ok(cand(Version::V1, &["memory", "pids", "cpu", "cpuacct"])),
        };
        assert_eq!(choose(&d, &all()).candidate.unwrap().version, Version::V2);
    }

    #[test]
    fn run_cgroup_names_carry_their_creator() {
        let n = run_name();
        assert_eq!(creator_of(&n).map(|(pid, _)| pid), Some(std::process::id()));
        assert_eq!(creator_of("jail-12-3"), Some((12, 3)));
        assert_eq!(creator_of("jail-12"), None);
        assert_eq!(creator_of("jail-x-1"), None);
        assert_eq!(creator_of("jail-+1-1"), None);
        assert_eq!(creator_of("user.slice"), None);
    }

    #[test]
    fn sweep_removes_only_empty_cgroups_of_dead_creators() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        // A pid that cannot exist (above pid_max's ceiling).
        let dead = "jail-4194305-0";
        let mine = run_name();
        // Our pid, a number we never handed out: an earlier process's.
        let reused = format!("jail-{}-{}", std::process::id(), u32::MAX);
        for d in [dead, mine.as_str(), reused.as_str(), "jail-1-0", "other"] {
            std::fs::create_dir_all(p.join(d).join(LEAF)).unwrap();
        }
        // A populated (here: non-empty) cgroup of a dead creator stays.
        std::fs::create_dir_all(p.join("jail-4194306-0").join(LEAF)).unwrap();
        std::fs::write(p.join("jail-4194306-0/tree/busy"), "").unwrap();
        let c = Candidate {
            version: Version::V1,
            parents: vec![Parent { dir: p.to_path_buf(), controllers: vec!["pids".into()] }],
        };
        assert_eq!(sweep(&c), 2);
        assert!(!p.join(dead).exists());
        assert!(!p.join(&reused).exists());
        assert!(p.join(&mine).exists());
        assert!(p.join("jail-1-0").exists(), "pid 1 is alive");
        assert!(p.join("other").exists());
        assert!(p.join("jail-4194306-0").exists());
    }

    #[test]
    fn the_v1_cpu_split_is_scaled_to_the_exact_total() {
        assert_eq!(split_v1_cpu(Some(1000), Some(300), Some(100)), (Some(750), Some(250)));
        assert_eq!(split_v1_cpu(Some(5), Some(0), Some(0)), (Some(5), Some(0)));
        assert_eq!(split_v1_cpu(None, Some(3), Some(1)), (Some(3), Some(1)));
    }

    #[test]
    fn keyed_files_are_read_by_key() {
        assert_eq!(keyed("usage_usec 10\nuser_usec 7\n", "user_usec"), Some(7));
        assert_eq!(keyed("oom_kill_disable 0\noom_kill 3\n", "oom_kill"), Some(3));
        assert_eq!(keyed("oom 1\n", "oom_kill"), None);
    }
}
