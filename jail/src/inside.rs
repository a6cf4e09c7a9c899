//! The run's limits where programs inside look for them: a `/proc/meminfo`
//! whose MemTotal is the memory limit, a `/sys/devices/system/cpu/online`
//! and a CPU affinity of `ceil(cpus)` CPUs, and the allocator settings that
//! let an allocation past the limit fail as `MemoryError` rather than end in
//! a kill. The supervisor plans the [`View`] (pure, but for reading the
//! host's meminfo and its own affinity); mounts.rs shows the files and PID 1
//! sets the affinity (child.rs).
//!
//! What the files are: snapshots taken before the run starts, not live
//! counters (that would need a FUSE filesystem, as lxcfs uses). MemFree
//! and MemAvailable are the whole limit, as they are at the start, and do
//! not fall as the script allocates. `sysinfo(2)` (`os.sysconf("SC_PHYS_PAGES")`),
//! `/proc/cpuinfo` and `/proc/stat` still show the host.

use std::path::PathBuf;

use nix::sched::CpuSet;
use nix::unistd::Pid;

use crate::policy::Policy;

/// What the run shows of its limits, planned by the supervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct View {
    /// The text bound over `/proc/meminfo`; `None` without a memory limit.
    pub meminfo: Option<String>,
    /// The CPUs the run is pinned to, `ceil(cpus)` of the supervisor's own;
    /// `None` without a CPU limit, or when it would leave none out.
    pub cpus: Option<Vec<usize>>,
    /// The files of the jail's `/sys` (paths relative to it): the CPU lists
    /// glibc's `get_nprocs` and `get_nprocs_conf` read. Empty: no `/sys`.
    pub sys_files: Vec<(PathBuf, String)>,
}

impl View {
    /// Put the files into the mount request.
    pub(crate) fn apply(&self, req: &mut crate::mounts::Request) {
        req.meminfo = self.meminfo.clone();
        req.sys_files = self.sys_files.clone();
    }
}

/// What the view is made from, read from the host once (host.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostFacts {
    /// The host's `/proc/meminfo` (its field names and order are kept).
    pub meminfo: String,
    /// The supervisor's own CPUs, ascending.
    pub cpus: Vec<usize>,
    /// Spreads concurrent runs over the CPUs: the supervisor's pid.
    pub seed: usize,
}

impl HostFacts {
    pub(crate) fn read() -> HostFacts {
        HostFacts {
            meminfo: std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
            cpus: allowed_cpus(),
            seed: std::process::id() as usize,
        }
    }
}

/// The view for a policy on a host. Pure.
pub(crate) fn view_of(policy: &Policy, host: &HostFacts) -> View {
    let (host_meminfo, allowed, seed) = (host.meminfo.as_str(), host.cpus.as_slice(), host.seed);
    let meminfo = policy.limits.memory.map(|limit| meminfo(host_meminfo, limit));
    let chosen = policy.limits.cpus.map(|c| choose_cpus(allowed, c, seed)).filter(|c| !c.is_empty());
    let sys_files = match &chosen {
        None => Vec::new(),
        Some(ids) => {
            let list = format!("{}\n", cpu_list(ids));
            ["online", "possible", "present"]
                .iter()
                .map(|f| (PathBuf::from("devices/system/cpu").join(f), list.clone()))
                .collect()
        }
    };
    // Pinning to every CPU we have changes nothing: leave the mask alone.
    let cpus = chosen.filter(|c| c.len() < allowed.len());
    View { meminfo, cpus, sys_files }
}

/// The supervisor's own CPUs, ascending; `[0]` if they cannot be read.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    match nix::sched::sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count()).filter(|&i| set.is_set(i).unwrap_or(false)).collect(),
        Err(_) => vec![0],
    }
}

/// `ceil(cpus)` of the `allowed` CPUs (at least one), consecutive from
/// `seed` modulo their number, so runs started together do not all land on
/// the first CPU. Pure.
pub(crate) fn choose_cpus(allowed: &[usize], cpus: f64, seed: usize) -> Vec<usize> {
    if allowed.is_empty() {
        return Vec::new();
    }
    let n = (cpus.ceil().max(1.0) as usize).min(allowed.len());
    let mut ids: Vec<usize> = (0..n).map(|i| allowed[(seed + i) % allowed.len()]).collect();
    ids.sort_unstable();
    ids
}

/// A CPU list as the kernel writes it in sysfs: `0-3,6`. Pure.
pub(crate) fn cpu_list(ids: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { ids[i].to_string() } else { format!("{}-{}", ids[i], ids[j]) });
        i = j + 1;
    }
    parts.join(",")
}

/// Child side, PID 1 before the worker is forked: pin the run to `ids`.
/// The script may call sched_setaffinity itself (BLAS pools pin their
/// threads); the CPU quota, not this, is what limits its CPU time.
pub(crate) fn pin(ids: &[usize]) -> nix::Result<()> {
    let mut set = CpuSet::new();
    for &i in ids {
        set.set(i)?;
    }
    nix::sched::sched_setaffinity(Pid::from_raw(0), &set)
}

/// Fields of meminfo that keep the host's value: sizes of the kernel's
/// page and address space, not amounts of memory in use.
const KEPT: [&str; 3] = ["Hugepagesize", "VmallocTotal", "VmallocChunk"];

/// `/proc/meminfo` for a run with `limit` bytes: the host's field names in
/// its order, MemTotal, MemFree, MemAvailable and CommitLimit the limit,
/// swap none (the run cgroup has swap 0), every amount in use 0 (the run
/// has not started). Lines that are not `Name: value [kB]` are dropped.
/// Pure. Without the host's text, the fields every reader looks for.
pub(crate) fn meminfo(host: &str, limit: u64) -> String {
    let kb = limit / 1024;
    let mut out = String::new();
    let mut names: Vec<&str> = host
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let rest = rest.trim();
            let digits = rest.strip_suffix(" kB").unwrap_or(rest);
            (!name.is_empty() && name.len() < 32 && digits.bytes().all(|b| b.is_ascii_digit()) && !digits.is_empty())
                .then_some(name)
        })
        .collect();
    if !names.contains(&"MemTotal") {
        names = vec![
            "MemTotal",
            "MemFree",
            "MemAvailable",
            "Buffers",
            "Cached",
            "SwapTotal",
            "SwapFree",
        ];
    }
    for name in names {
        let line = host.lines().find(|l| l.split_once(':').is_some_and(|(n, _)| n == name)).unwrap_or("");
        let unit = line.trim_end().ends_with(" kB") || !line.contains(':');
        let value = match name {
            "MemTotal" | "MemFree" | "MemAvailable" | "CommitLimit" => kb,
            n if KEPT.contains(&n) => line
                .split_once(':')
                .map(|(_, v)| v.trim().trim_end_matches(" kB"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            _ => 0,
        };
        let label = format!("{name}:");
        match unit {
            true => out.push_str(&format!("{label:<16}{value:>8} kB\n")),
            false => out.push_str(&format!("{label:<16}{value:>8}\n")),
        }
    }
    out
}

/// Per-process address space with a memory cgroup: the limit plus as much
/// again (at least 512 MiB) for what is reserved but never touched (thread
/// stacks, malloc arenas, BLAS buffers: numpy and pandas imported take
/// about 250 MiB of address space for 90 MiB resident). So one allocation
/// that could never fit fails at once with ENOMEM (`MemoryError`), while
/// ordinary programs keep their reservations; between the two, a touched
/// allocation past the limit is still the cgroup's kill.
pub(crate) fn address_space_with_cgroup(memory: u64) -> u64 {
    memory.saturating_add(memory.max(512 << 20))
}

/// The interpreter's `MALLOC_ARENA_MAX`: glibc reserves 64 MiB of address
/// space per arena and makes up to 8 per core, so under RLIMIT_AS a few
/// dozen threads would exhaust it (32 threads: 1.49 GB of address space
/// with the default, 576 MB with 2 arenas, measured with pandas imported).
/// One arena per CPU of the quota, at least 2.
pub(crate) fn malloc_arena_max(cpus: Option<f64>) -> String {
    let n = cpus.map(|c| c.ceil() as u64).unwrap_or(2).clamp(2, 64);
    n.to_string()
}

/// Variables added to the interpreter's environment when the policy does
/// not set them itself.
pub(crate) fn env(policy: &Policy) -> Vec<(String, String)> {
    match policy.limits.memory {
        Some(_) => vec![("MALLOC_ARENA_MAX".into(), malloc_arena_max(policy.limits.cpus))],
        None => Vec::new(),
    }
}

/// `limits.memory.detail` of an `oom_killed` run: who the kernel's OOM
/// killer took (the script itself when it died of SIGKILL, else processes
/// it started) and the run's peak usage. Pure.
pub(crate) fn oom_words(signal: Option<i32>, exit_code: Option<i32>, kills: u64, peak: Option<u64>) -> String {
    let who = match (signal, exit_code) {
        (Some(9), _) => format!("the script (killed by SIGKILL) and {} in all", processes(kills)),
        (_, Some(code)) => format!("{} the script started (the script itself exited with {code})", processes(kills)),
        _ => processes(kills),
    };
    let at = match peak {
        Some(bytes) => format!("at a peak of {} MiB", bytes >> 20),
        None => "at a peak this kernel does not report".into(),
    };
    format!("oom_killed: the kernel's OOM killer took {who}, {at}")
}

fn processes(n: u64) -> String {
    match n {
        1 => "1 process".into(),
        n => format!("{n} processes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::auto_tmp_size;
    use std::path::Path;

    const HOST: &str = "MemTotal:       24683664 kB\nMemFree:         6007244 kB\nMemAvailable:   23386120 kB\n\
Cached:         16719768 kB\nSwapTotal:       8000000 kB\nSwapFree:        8000000 kB\nCommitLimit:    12341832 kB\n\
VmallocTotal:   34359738367 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\nDirectMap1G:    25165824 kB\n";

    fn policy(limits: &str) -> Policy {
        Policy::from_json(&format!(r#"{{"version":1,"limits":{limits}}}"#), Path::new("/")).unwrap()
    }

    #[test]
    fn meminfo_shows_the_limit_as_total_free_and_available_and_nothing_in_use() {
        let m = meminfo(HOST, 1 << 30);
        assert_eq!(
            m,
            "MemTotal:        1048576 kB\nMemFree:         1048576 kB\nMemAvailable:    1048576 kB\n\
Cached:                0 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\nCommitLimit:     1048576 kB\n\
VmallocTotal:   34359738367 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\nDirectMap1G:           0 kB\n"
        );
    }

    #[test]
    fn meminfo_without_the_hosts_text_still_has_the_fields_readers_need() {
        let m = meminfo("", 512 << 20);
        assert!(
            m.starts_with("MemTotal:         524288 kB\nMemFree:          524288 kB\nMemAvailable:     524288 kB\n"),
            "{m}"
        );
        // A line that is not a meminfo field never reaches the jail.
        assert!(!meminfo("MemTotal: 1 kB\nevil: $(x)\n", 1 << 20).contains("evil"));
    }

    #[test]
    fn cpus_are_ceil_of_the_quota_spread_by_seed() {
        assert_eq!(choose_cpus(&[0, 1], 1.0, 0), vec![0]);
        assert_eq!(choose_cpus(&[0, 1], 1.0, 1), vec![1]);
        assert_eq!(choose_cpus(&[0, 1], 0.5, 7), vec![1]);
        assert_eq!(choose_cpus(&[0, 1, 2, 3], 1.5, 3), vec![0, 3]);
        assert_eq!(choose_cpus(&[2, 5], 8.0, 0), vec![2, 5]);
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(cpu_list(&[3]), "3");
    }

    #[test]
    fn the_view_follows_the_policy_and_pins_only_when_it_leaves_cpus_out() {
        let facts = |seed| HostFacts { meminfo: HOST.into(), cpus: vec![0, 1], seed };
        let v = view_of(&policy(r#"{"memory":"1G","cpus":1}"#), &facts(1));
        assert!(v.meminfo.as_deref().unwrap().starts_with("MemTotal:        1048576 kB\n"));
        assert_eq!(v.cpus, Some(vec![1]));
        assert_eq!(v.sys_files[0], (PathBuf::from("devices/system/cpu/online"), "1\n".to_string()));
        let all = view_of(&policy(r#"{"cpus":2}"#), &facts(1));
        assert_eq!(all.cpus, None);
        assert_eq!(all.sys_files[0].1, "0-1\n");
        let none = view_of(&policy(r#"{"memory":"unlimited","cpus":"unlimited"}"#), &facts(1));
        assert_eq!(none, View::default());
    }

    #[test]
    fn an_oom_kill_names_who_was_killed_and_the_peak() {
        assert_eq!(
            oom_words(Some(9), None, 1, Some(1 << 30)),
            "oom_killed: the kernel's OOM killer took the script (killed by SIGKILL) and 1 process in all, at a peak of 1024 MiB"
        );
        assert_eq!(
            oom_words(None, Some(1), 2, None),
            "oom_killed: the kernel's OOM killer took 2 processes the script started (the script itself exited with 1), at a \
             peak this kernel does not report"
        );
    }

    #[test]
    fn address_space_leaves_room_for_reservations_and_arenas_follow_the_quota() {
        assert_eq!(address_space_with_cgroup(64 << 20), 576 << 20);
        assert_eq!(address_space_with_cgroup(1 << 30), 2 << 30);
        assert_eq!(malloc_arena_max(Some(0.5)), "2");
        assert_eq!(malloc_arena_max(Some(3.5)), "4");
        assert_eq!(malloc_arena_max(None), "2");
        assert_eq!(auto_tmp_size(Some(1 << 30)), 512 << 20);
        assert_eq!(auto_tmp_size(Some(64 << 20)), 64 << 20);
        assert_eq!(auto_tmp_size(None), 1 << 30);
    }
}
