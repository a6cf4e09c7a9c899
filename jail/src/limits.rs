//! Which mechanism enforces each resource limit on this run: the cgroup the
//! supervisor could create (v2 or v1), rlimits for what it cannot do, the
//! supervisor itself for time and output, tmpfs for sizes, and the report of
//! all of it. Pure: [`plan`] is data, unit-tested by value.
//!
//! A limit whose enforcement is `required` and that nothing here can enforce
//! lands in [`Plan::refused`], and the supervisor fails the run before the
//! script starts; a `best_effort` one lands in [`Plan::degraded`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::cgroup::{self, Candidate};
use crate::policy::{Enforcement, Policy};
use crate::result::LimitReport;
use crate::rlimits::{Kind, Rlimit};

/// How often, at least, the supervisor checks the run's CPU time.
pub(crate) const CPU_POLL: Duration = Duration::from_millis(100);

/// What the run's limits come down to on this host.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What goes into the run cgroup, when there is one.
    pub settings: cgroup::Settings,
    /// Set by the worker before exec, in order.
    pub rlimits: Vec<Rlimit>,
    /// Every limit: value, enforcer, and how.
    pub reports: BTreeMap<String, LimitReport>,
    /// Limits enforced less than the policy asked, in plain words.
    pub degraded: Vec<String>,
    /// Required limits that nothing on this host can enforce.
    pub refused: Vec<String>,
    /// The CPU-time limit the supervisor checks against the cgroup's usage.
    pub cpu_watch: Option<Duration>,
    /// The CPU quota (cores) the supervisor's throttle holds the tree to,
    /// when no cgroup can (throttle.rs).
    pub cpu_throttle: Option<f64>,
    /// Whether RLIMIT_CPU stands in for the CPU-time limit (so a SIGXCPU or
    /// SIGKILL at that much CPU time means `timeout_cpu`).
    pub cpu_rlimit: Option<Duration>,
    /// The sizes the run's tmpfs mounts get: the policy's, or smaller when
    /// no cgroup counts their pages (see [`close_uncounted_memory`]).
    pub tmpfs: TmpfsSizes,
    /// Syscalls the seccomp filter refuses (ENOSYS, counted) on this run on
    /// top of the policy's own refusals: the ways to hold memory that only a
    /// memory cgroup would count.
    pub refuse_syscalls: Vec<&'static str>,
}

/// The sizes of `/tmp`, `/dev/shm` and the output dir (`None`: the host
/// folder bound directly, no tmpfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TmpfsSizes {
    pub tmp: u64,
    pub shm: u64,
    pub output: Option<u64>,
}

impl TmpfsSizes {
    /// Put these sizes into the mount request.
    pub fn apply(&self, req: &mut crate::mounts::Request) {
        req.tmp_size = self.tmp;
        req.shm_size = self.shm;
        req.output_size = self.output;
    }
}

/// Calls that create kernel memory no rlimit bounds in total: memfds (each
/// a tmpfs file of up to RLIMIT_FSIZE, as many as there are descriptors and
/// mappings) and System V shared memory, semaphore sets and message queues
/// (which outlive their creator). The run's IPC namespace is its own, but
/// its limits (kernel.shmmax, msgmnb, ...) can be lowered only by the
/// namespace's root, and the sandbox uid is the only one mapped. Refused
/// with ENOSYS, which libraries read as "not on this system" and fall back
/// from; nothing in the data stack calls them (measured: numpy, pandas,
/// matplotlib, ctypes callbacks, multiprocessing pools and locks).
pub(crate) const UNCOUNTED_MEMORY_CALLS: [&str; 4] = ["memfd_create", "shmget", "semget", "msgget"];

/// The `why` of those refusals, as `denials` shows it.
pub(crate) const UNCOUNTED_MEMORY_WHY: &str =
    "no cgroup counts this run's memory (limits.memory is best_effort and no memory cgroup \
     could be had): memfds and System V shared memory, semaphores and message queues would hold memory outside every limit";

/// Without a memory cgroup, RLIMIT_MEMLOCK is held to this (the kernel's
/// own default): locked pages cannot be reclaimed under pressure.
pub(crate) const MEMLOCK_WITHOUT_CGROUP: u64 = 8 << 20;

/// Best effort when no cgroup counts the run's memory: refuse the calls in
/// [`UNCOUNTED_MEMORY_CALLS`], hold RLIMIT_MEMLOCK, and shrink the tmpfs
/// mounts (whose pages no rlimit sees) so that together they fit within the
/// memory limit, in proportion to the policy's sizes. Returns whether they
/// were shrunk.
fn close_uncounted_memory(p: &mut Plan, memory: u64, fs: &crate::policy::Filesystem, hard: &dyn Fn(Kind) -> u64) -> bool {
    p.refuse_syscalls = UNCOUNTED_MEMORY_CALLS.to_vec();
    let lock = MEMLOCK_WITHOUT_CGROUP.min(memory).min(hard(Kind::Memlock));
    p.rlimits.push(Rlimit { kind: Kind::Memlock, soft: lock, hard: lock });
    let total = u128::from(fs.tmp_size) + u128::from(fs.shm_size) + u128::from(fs.output_size.unwrap_or(0));
    if total <= u128::from(memory) {
        return false;
    }
    // Whole pages, at least one each: a tmpfs of size 0 would be unlimited.
    let scale = |n: u64| ((u128::from(n) * u128::from(memory) / total) as u64 / PAGE * PAGE).max(PAGE);
    p.tmpfs = TmpfsSizes {
        tmp: scale(fs.tmp_size),
        shm: scale(fs.shm_size),
        output: fs.output_size.map(scale),
    };
    true
}

const PAGE: u64 = 4096;

/// `isolation.degraded`'s words for memory that no cgroup counts.
fn uncounted_memory_words(per_process: u64, pids: Option<u64>, shrunk: bool, why: &str) -> String {
    let processes = match pids {
        Some(n) => format!("each of up to {n} processes"),
        None => "each process".into(),
    };
    let tmpfs = if shrunk {
        format!(
            "; /tmp, /dev/shm and the output dir were made smaller so that together they fit in {}",
            size_words(per_process)
        )
    } else {
        String::new()
    };
    format!(
        "memory: no total for the run ({why}): {processes} may use up to {} of address space (RLIMIT_AS), and data \
         held in pipes and unix sockets is not counted; memfd_create and System V shared memory, semaphores and message \
         queues are refused{tmpfs}",
        size_words(per_process)
    )
}

fn tmp_words(sizing: crate::policy::Sizing) -> &'static str {
    match sizing {
        crate::policy::Sizing::Auto => {
            "size of /tmp (auto: half the memory limit, at least 64M; its pages count against the memory limit)"
        }
        crate::policy::Sizing::Fixed => "size of /tmp",
    }
}

/// A size as a policy would write it: `512M`, `1G`, or bytes.
pub(crate) fn size_words(n: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n} bytes")
}

fn report(value: serde_json::Value, by: &str, detail: impl Into<String>) -> LimitReport {
    LimitReport { value, enforced_by: by.to_string(), detail: Some(detail.into()) }
}

fn unlimited() -> LimitReport {
    LimitReport {
        value: serde_json::Value::Null,
        enforced_by: "none".into(),
        detail: Some("unlimited by the policy".into()),
    }
}

/// Decide every limit. `cgroup` is the run cgroup's place when one will be
/// created, `why_not` the reason when none; `hard` gives the caller's hard
/// rlimits, which nothing in the jail can exceed.
pub(crate) fn plan(
    policy: &Policy,
    wall: Duration,
    cgroup: Option<&Candidate>,
    why_not: &str,
    hard: &dyn Fn(Kind) -> u64,
) -> Plan {
    let l = &policy.limits;
    let fs = &policy.filesystem;
    let mut p = Plan {
        settings: cgroup::Settings::default(),
        rlimits: Vec::new(),
        reports: BTreeMap::new(),
        degraded: Vec::new(),
        refused: Vec::new(),
        cpu_watch: None,
        cpu_throttle: None,
        cpu_rlimit: None,
        tmpfs: TmpfsSizes { tmp: fs.tmp_size, shm: fs.shm_size, output: fs.output_size },
        refuse_syscalls: Vec::new(),
    };
    let by = cgroup.map(|c| c.version.enforcer()).unwrap_or("none");
    let has = |ctl: &str| cgroup.is_some_and(|c| c.has(ctl));
    let rlimit = |p: &mut Plan, kind: Kind, soft: u64, hard_wanted: u64| -> (u64, u64) {
        let ceiling = hard(kind);
        let (s, h) = (soft.min(ceiling), hard_wanted.min(ceiling));
        p.rlimits.push(Rlimit { kind, soft: s, hard: h });
        (s, h)
    };
    let no_cgroup = |what: &str| {
        if cgroup.is_some() {
            format!("the run cgroup has no {what} controller")
        } else {
            format!("no writable cgroup: {why_not}")
        }
    };
    // A limit that fell back or was lost: degraded, or refused when required.
    let weaker = |p: &mut Plan, name: &str, level: Enforcement, enforced: bool, how: String| match (level, enforced) {
        (Enforcement::Required, false) => p.refused.push(format!("{name}: {how}")),
        _ => p.degraded.push(format!("{name}: {how}")),
    };

    // Memory: the cgroup's total for the whole run, swap 0. Without one,
    // nothing counts the run's total: RLIMIT_AS bounds each process's
    // address space, which leaves out pipes, sockets, memfds, System V IPC
    // and tmpfs pages. So it never counts as enforcing a `required` limit;
    // in best effort the routes this run's own namespaces can close are
    // closed (`close_uncounted_memory`) and the rest named.
    match l.memory {
        None => {
            p.reports.insert("memory".into(), unlimited());
        }
        Some(bytes) if has("memory") => {
            p.settings.memory = Some(bytes);
            let files = match cgroup.map(|c| c.version) {
                Some(cgroup::Version::V2) => "memory.max and memory.swap.max 0",
                _ => "memory.limit_in_bytes and memory.memsw.limit_in_bytes",
            };
            // And an address-space ceiling above it, so an allocation that
            // could never fit fails as MemoryError instead of a kill.
            let (s, _) = rlimit(&mut p, Kind::As, crate::inside::address_space_with_cgroup(bytes), u64::MAX);
            p.reports.insert(
                "memory".into(),
                report(
                    json!(bytes),
                    by,
                    format!(
                        "{files} on the run cgroup: all processes together, swap 0; RLIMIT_AS {} per process, so an \
                         allocation that cannot fit fails with ENOMEM (MemoryError) rather than a kill; /proc/meminfo \
                         shows the limit as MemTotal (a snapshot at the start: MemFree and MemAvailable do not follow usage)",
                        size_words(s)
                    ),
                ),
            );
        }
        Some(bytes) => {
            let (s, _) = rlimit(&mut p, Kind::As, bytes, bytes);
            let why = no_cgroup("memory");
            p.reports.insert(
                "memory".into(),
                report(
                    json!(s),
                    "rlimit",
                    format!(
                        "RLIMIT_AS per process (address space, not a total for the run; {why}); /proc/meminfo shows it \
                         as MemTotal (a snapshot at the start)"
                    ),
                ),
            );
            match l.enforcement.memory {
                Enforcement::Required => p.refused.push(format!(
                    "memory: only RLIMIT_AS is available, which bounds each process's address space, not the run's total \
                     (pipes, sockets, memfds, System V IPC and tmpfs pages escape it; {why})"
                )),
                Enforcement::BestEffort => {
                    let shrunk = close_uncounted_memory(&mut p, bytes, fs, hard);
                    p.degraded.push(uncounted_memory_words(s, l.pids, shrunk, &why));
                }
            }
        }
    }

    // Processes: the cgroup's pids.max; else RLIMIT_NPROC, which counts the
    // sandbox uid's tasks in the run's own fresh user namespace.
    match l.pids {
        None => {
            p.reports.insert("pids".into(), unlimited());
        }
        Some(n) if has("pids") => {
            p.settings.pids = Some(n);
            p.reports.insert(
                "pids".into(),
                report(json!(n), by, "pids.max on the run cgroup: processes and threads, the jail's PID 1 included"),
            );
        }
        Some(n) => {
            let (s, _) = rlimit(&mut p, Kind::Nproc, n, n);
            let why = no_cgroup("pids");
            p.reports.insert(
                "pids".into(),
                report(
                    json!(s),
                    "rlimit",
                    format!("RLIMIT_NPROC: tasks of the sandbox uid in this run's own user namespace, the jail's PID 1 included ({why})"),
                ),
            );
            weaker(&mut p, "pids", l.enforcement.pids, true, format!("RLIMIT_NPROC instead of a pids cgroup ({why})"));
        }
    }

    // CPU quota: the cgroup's; else the supervisor duty-cycles the tree.
    match l.cpus {
        None => {
            p.reports.insert("cpus".into(), unlimited());
        }
        Some(c) if has("cpu") => {
            p.settings.cpus = Some(c);
            let files = match cgroup.map(|c| c.version) {
                Some(cgroup::Version::V2) => "cpu.max",
                _ => "cpu.cfs_quota_us / cpu.cfs_period_us",
            };
            p.reports.insert("cpus".into(), report(json!(c), by, format!("{files} on the run cgroup")));
        }
        Some(c) => {
            let why = no_cgroup("cpu");
            p.cpu_throttle = Some(c);
            p.reports.insert(
                "cpus".into(),
                report(
                    json!(c),
                    "supervisor",
                    format!(
                        "the supervisor stops the whole tree (SIGSTOP, then SIGCONT) while it is over its share ({why}); {}; \
                         usage.throttled says what it did",
                        crate::throttle::precision_words()
                    ),
                ),
            );
        }
    }

    // CPU time: the supervisor polls the cgroup's usage; else RLIMIT_CPU.
    match l.cpu_time {
        None => {
            p.reports.insert("cpu_time_secs".into(), unlimited());
        }
        Some(t) if cgroup.is_some_and(Candidate::has_cpu_usage) => {
            p.settings.cpu_time = true;
            p.cpu_watch = Some(t);
            p.reports.insert(
                "cpu_time_secs".into(),
                report(
                    json!(t.as_secs_f64()),
                    "supervisor",
                    format!("the run cgroup's CPU usage, checked every {} ms", CPU_POLL.as_millis()),
                ),
            );
        }
        Some(t) => {
            // Whole seconds: SIGXCPU at the soft limit, SIGKILL a second later.
            let secs = t.as_secs_f64().ceil().max(1.0) as u64;
            let (s, _) = rlimit(&mut p, Kind::Cpu, secs, secs + 1);
            p.cpu_rlimit = Some(Duration::from_secs(s));
            let why = no_cgroup("cpuacct");
            p.reports.insert(
                "cpu_time_secs".into(),
                report(json!(s), "rlimit", format!("RLIMIT_CPU per process, in whole seconds ({why})")),
            );
            weaker(
                &mut p,
                "cpu_time",
                l.enforcement.cpu_time,
                true,
                format!("per-process RLIMIT_CPU instead of the run's total ({why})"),
            );
        }
    }

    p.reports.insert(
        "wall_time_secs".into(),
        report(json!(wall.as_secs_f64()), "supervisor", "the whole tree is killed at the deadline"),
    );
    for (name, cap) in [("stdout_bytes", l.stdout_bytes), ("stderr_bytes", l.stderr_bytes)] {
        p.reports.insert(
            name.into(),
            report(
                json!(cap),
                "supervisor",
                "the stream is truncated, keeping its first and last halves; the script is not stopped",
            ),
        );
    }
    let sized = |policy: u64, now: u64, what: &str| {
        if now == policy {
            what.to_string()
        } else {
            format!(
                "{what}, shrunk from {} so that the tmpfs mounts fit in the memory limit together (no cgroup counts their pages)",
                size_words(policy)
            )
        }
    };
    let t = p.tmpfs;
    p.reports
        .insert("tmp_size".into(), report(json!(t.tmp), "tmpfs", sized(fs.tmp_size, t.tmp, tmp_words(fs.tmp_sizing))));
    p.reports
        .insert("shm_size".into(), report(json!(t.shm), "tmpfs", sized(fs.shm_size, t.shm, "size of /dev/shm")));
    match (fs.output_size, t.output) {
        (Some(policy), Some(n)) => {
            let what = "the output dir is a tmpfs of this size, copied to the host folder after the run";
            p.reports.insert("output_size".into(), report(json!(n), "tmpfs", sized(policy, n, what)));
        }
        _ => {
            p.reports.insert("output_size".into(), unlimited());
        }
    }
    match l.file_size {
        Some(n) => {
            let (s, _) = rlimit(&mut p, Kind::Fsize, n, n);
            p.reports
                .insert("file_size".into(), report(json!(s), "rlimit", "RLIMIT_FSIZE: a larger write fails with EFBIG"));
        }
        None => {
            p.reports.insert("file_size".into(), unlimited());
        }
    }
    let (nofile, _) = rlimit(&mut p, Kind::Nofile, l.open_files, l.open_files);
    let capped = if nofile < l.open_files { " (capped by the caller's hard limit)" } else { "" };
    p.reports
        .insert("open_files".into(), report(json!(nofile), "rlimit", format!("RLIMIT_NOFILE per process{capped}")));
    rlimit(&mut p, Kind::Core, 0, 0);
    p.reports.insert("core_size".into(), report(json!(0), "rlimit", "RLIMIT_CORE 0: no core dumps"));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{Parent, Version};
    use std::path::{Path, PathBuf};

    fn policy(limits: &str) -> Policy {
        Policy::from_json(&format!(r#"{{"version":1,"limits":{limits}}}"#), Path::new("/")).unwrap()
    }

    fn v1(ctl: &[&str]) -> Candidate {
        Candidate {
            version: Version::V1,
            parents: ctl
                .iter()
                .map(|c| Parent { dir: PathBuf::from(format!("/cg/{c}")), controllers: vec![c.to_string()] })
                .collect(),
        }
    }

    fn no_ceiling(_: Kind) -> u64 {
        u64::MAX
    }

    const ALL: &str = r#"{"memory":"64M","cpus":0.5,"pids":16,"cpu_time_secs":1.5,"file_size":"1M","open_files":64}"#;

    #[test]
    fn a_full_v1_cgroup_enforces_memory_cpus_pids_and_cpu_time() {
        let p = plan(
            &policy(ALL),
            Duration::from_secs(5),
            Some(&v1(&["memory", "pids", "cpu", "cpuacct", "freezer"])),
            "",
            &no_ceiling,
        );
        assert_eq!(p.settings, cgroup::Settings { memory: Some(64 << 20), cpus: Some(0.5), pids: Some(16), cpu_time: true });
        for name in ["memory", "cpus", "pids"] {
            assert_eq!(p.reports[name].enforced_by, "cgroup_v1", "{name}");
        }
        assert_eq!(p.reports["cpu_time_secs"].enforced_by, "supervisor");
        assert_eq!(p.cpu_watch, Some(Duration::from_secs_f64(1.5)));
        assert_eq!(p.cpu_rlimit, None);
        assert_eq!(
            p.rlimits,
            vec![
                // Above the cgroup's limit: MemoryError for what can never fit.
                Rlimit { kind: Kind::As, soft: 576 << 20, hard: u64::MAX },
                Rlimit { kind: Kind::Fsize, soft: 1 << 20, hard: 1 << 20 },
                Rlimit { kind: Kind::Nofile, soft: 64, hard: 64 },
                Rlimit { kind: Kind::Core, soft: 0, hard: 0 },
            ]
        );
        assert!(p.degraded.is_empty() && p.refused.is_empty(), "{p:?}");
    }

    #[test]
    fn without_a_cgroup_rlimits_and_the_supervisor_stand_in() {
        let p = plan(&policy(ALL), Duration::from_secs(5), None, "not writable", &no_ceiling);
        assert_eq!(p.settings, cgroup::Settings::default());
        assert_eq!(p.reports["memory"].enforced_by, "rlimit");
        assert_eq!(p.reports["pids"].enforced_by, "rlimit");
        assert_eq!(p.reports["cpu_time_secs"].enforced_by, "rlimit");
        assert_eq!(p.reports["cpu_time_secs"].value, json!(2));
        assert_eq!(p.reports["cpus"].enforced_by, "supervisor");
        assert_eq!(p.cpu_throttle, Some(0.5));
        assert_eq!(p.cpu_rlimit, Some(Duration::from_secs(2)));
        let kinds: Vec<Kind> = p.rlimits.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            vec![
                Kind::As,
                Kind::Memlock,
                Kind::Nproc,
                Kind::Cpu,
                Kind::Fsize,
                Kind::Nofile,
                Kind::Core
            ]
        );
        assert!(p.rlimits.contains(&Rlimit { kind: Kind::Cpu, soft: 2, hard: 3 }));
        // Best effort by default: reported, not refused; the throttle
        // enforces the quota, so cpus is not among them.
        assert_eq!(p.degraded.len(), 3, "{:?}", p.degraded);
        assert!(p.refused.is_empty());
    }

    #[test]
    fn a_required_cpu_quota_without_a_cpu_cgroup_is_held_by_the_supervisor() {
        let limits = r#"{"cpus":1,"memory":"64M","enforcement":{"cpus":"required","memory":"required"}}"#;
        let p = plan(&policy(limits), Duration::from_secs(5), Some(&v1(&["memory", "pids"])), "", &no_ceiling);
        assert!(p.refused.is_empty(), "{:?}", p.refused);
        assert_eq!(p.cpu_throttle, Some(1.0));
        assert_eq!(p.settings.cpus, None);
        let detail = p.reports["cpus"].detail.as_deref().unwrap();
        assert!(detail.contains("the run cgroup has no cpu controller") && detail.contains("50 ms"), "{detail}");
        assert_eq!(p.reports["memory"].enforced_by, "cgroup_v1");
        assert!(p.refuse_syscalls.is_empty(), "a memory cgroup counts memfds and IPC: {:?}", p.refuse_syscalls);
    }

    #[test]
    fn rlimit_as_never_enforces_a_required_memory_limit() {
        let p = plan(
            &policy(r#"{"memory":"64M","enforcement":{"memory":"required"}}"#),
            Duration::from_secs(5),
            None,
            "nope",
            &no_ceiling,
        );
        assert_eq!(p.refused.len(), 1, "{:?}", p.refused);
        assert!(p.refused[0].starts_with("memory: only RLIMIT_AS"), "{:?}", p.refused);
        assert!(p.refused[0].contains("nope"), "the reason there is no cgroup: {:?}", p.refused);
        // A cgroup without the memory controller is no better.
        let p = plan(
            &policy(r#"{"memory":"64M","enforcement":{"memory":"required"}}"#),
            Duration::from_secs(5),
            Some(&v1(&["pids"])),
            "",
            &no_ceiling,
        );
        assert_eq!(p.refused.len(), 1, "{:?}", p.refused);
    }

    #[test]
    fn best_effort_memory_without_a_cgroup_closes_what_it_can_and_names_the_rest() {
        let fs = r#""filesystem":{"tmp_size":"64M","shm_size":"16M","output_size":"176M"}"#;
        let p = Policy::from_json(&format!(r#"{{"version":1,{fs},"limits":{{"memory":"128M","pids":32}}}}"#), Path::new("/"))
            .unwrap();
        let p = plan(&p, Duration::from_secs(5), None, "not writable", &no_ceiling);
        assert!(p.refused.is_empty());
        assert_eq!(p.refuse_syscalls, UNCOUNTED_MEMORY_CALLS.to_vec());
        assert!(p.rlimits.contains(&Rlimit { kind: Kind::Memlock, soft: 8 << 20, hard: 8 << 20 }), "{:?}", p.rlimits);
        // 256M of tmpfs in a 128M limit: each halved, so together they fit.
        assert_eq!(p.tmpfs, TmpfsSizes { tmp: 32 << 20, shm: 8 << 20, output: Some(88 << 20) });
        assert!(p.tmpfs.tmp + p.tmpfs.shm + p.tmpfs.output.unwrap() <= 128 << 20);
        assert_eq!(p.reports["tmp_size"].value, json!(32 << 20));
        assert!(
            p.reports["output_size"].detail.as_deref().unwrap().contains("shrunk from 176M"),
            "{:?}",
            p.reports["output_size"]
        );
        let words = p.degraded.iter().find(|d| d.starts_with("memory: ")).expect("memory is degraded");
        for part in [
            "not writable",
            "up to 32 processes",
            "128M of address space",
            "pipes and unix sockets",
            "memfd_create",
            "System V",
            "made smaller",
        ] {
            assert!(words.contains(part), "{part}: {words}");
        }
        // Sizes that already fit are left alone (/tmp auto: half of 1G).
        let p = plan(&policy(r#"{"memory":"1G"}"#), Duration::from_secs(5), None, "", &no_ceiling);
        assert_eq!(p.tmpfs, TmpfsSizes { tmp: 512 << 20, shm: 16 << 20, output: Some(256 << 20) });
        assert!(!p.degraded.iter().any(|d| d.contains("made smaller")), "{:?}", p.degraded);
        // Without a memory limit there is nothing to fit into.
        let p = plan(&policy(r#"{"memory":"unlimited"}"#), Duration::from_secs(5), None, "", &no_ceiling);
        assert!(p.refuse_syscalls.is_empty() && !p.rlimits.iter().any(|r| r.kind == Kind::Memlock));
    }

    #[test]
    fn sizes_are_written_the_way_a_policy_writes_them() {
        assert_eq!(size_words(512 << 20), "512M");
        assert_eq!(size_words(2 << 30), "2G");
        assert_eq!(size_words(1536 << 10), "1536K");
        assert_eq!(size_words(1000), "1000 bytes");
    }

    #[test]
    fn unlimited_limits_are_reported_as_none_and_never_degraded() {
        let limits = r#"{"memory":"unlimited","cpus":"unlimited","pids":"unlimited","cpu_time_secs":"unlimited","enforcement":{"cpus":"required"}}"#;
        let p = plan(&policy(limits), Duration::from_secs(5), None, "nope", &no_ceiling);
        for name in ["memory", "cpus", "pids", "cpu_time_secs", "file_size"] {
            assert_eq!(p.reports[name].enforced_by, "none", "{name}");
            assert_eq!(p.reports[name].value, serde_json::Value::Null);
        }
        assert!(p.refused.is_empty() && p.degraded.is_empty());
    }

    #[test]
    fn rlimits_never_exceed_the_callers_hard_limits() {
        let p = plan(&policy(r#"{"open_files":4096}"#), Duration::from_secs(5), None, "", &|k| {
            if k == Kind::Nofile {
                1024
            } else {
                u64::MAX
            }
        });
        assert!(p.rlimits.contains(&Rlimit { kind: Kind::Nofile, soft: 1024, hard: 1024 }));
        assert_eq!(p.reports["open_files"].value, json!(1024));
    }

    #[test]
    fn every_limit_has_a_report() {
        let p = plan(&policy(ALL), Duration::from_secs(5), None, "", &no_ceiling);
        let names: Vec<&str> = p.reports.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            vec![
                "core_size",
                "cpu_time_secs",
                "cpus",
                "file_size",
                "memory",
                "open_files",
                "output_size",
                "pids",
                "shm_size",
                "stderr_bytes",
                "stdout_bytes",
                "tmp_size",
                "wall_time_secs"
            ]
        );
    }
}
