//! How many pooled jails fit in the memory available to the pool: `jail
//! pool --size N` is refused when N jails, each costing its memory limit
//! (or, with no limit, the idle cost measured on the first jail made),
//! need more than is available.
//!
//! Available is the lower of `MemAvailable` (/proc/meminfo) and the memory
//! limit of the pool's own cgroup, when it has one: the lowest `memory.max`
//! (cgroup v2) or `memory.limit_in_bytes` (v1) on the way from the pool's
//! cgroup up to the root of its hierarchy, since a parent's limit holds
//! its whole subtree. The limit, not the limit less what is in use: a
//! cgroup's usage counts page cache the kernel reclaims under pressure.
//!
//! The arithmetic ([`fits`]) and the parsers are pure; [`available`] reads
//! the files, under a root folder so tests run it against a temp dir.

use std::path::{Path, PathBuf};

use crate::cgroup::{Layout, Membership};

/// A v1 limit at or above this is the kernel's "no limit" (the page
/// counter's maximum, 0x7FFFFFFFFFFFF000 with 4 KiB pages).
const V1_UNLIMITED: u64 = 1 << 62;

/// Deeper cgroup paths are not walked (a bound on the reads, not a limit
/// any real hierarchy reaches).
const MAX_LEVELS: usize = 64;

/// The memory available to the pool, and where that figure comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    /// `MemAvailable in /proc/meminfo`, or the cgroup file that set it.
    pub from: String,
}

/// What one pooled jail costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerJail {
    /// Its memory limit (`limits.memory` or `--memory`).
    Limit(u64),
    /// It has no memory limit: its idle cost, measured on the first jail.
    Idle(u64),
}

impl PerJail {
    pub fn bytes(self) -> u64 {
        match self {
            PerJail::Limit(b) | PerJail::Idle(b) => b,
        }
    }
}

/// A size the memory cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", refusal_line(*.size, *.per_jail, .available, *.largest))]
pub struct TooMany {
    pub size: usize,
    pub per_jail: PerJail,
    pub available: Available,
    /// The largest size that fits.
    pub largest: u64,
}

fn refusal_line(size: usize, per_jail: PerJail, available: &Available, largest: u64) -> String {
    let what = match per_jail {
        PerJail::Limit(_) => "memory limit",
        PerJail::Idle(_) => "idle cost, measured on the first jail: it has no memory limit",
    };
    let need = (size as u128) * u128::from(per_jail.bytes());
    let fix = match (largest, per_jail) {
        (0, PerJail::Limit(_)) => "not one jail fits: give a lower --memory".to_string(),
        (0, PerJail::Idle(_)) => "not one jail fits: free some memory first".to_string(),
        (n, PerJail::Limit(_)) => format!("the largest size that fits is {n}: give --size {n} or less, or a lower --memory"),
        (n, PerJail::Idle(_)) => format!("the largest size that fits is {n}: give --size {n} or less"),
    };
    format!(
        "--size {size} needs {size} x {} ({what}) = {}, more than the {} available to the pool ({}); {fix}",
        human(u128::from(per_jail.bytes())),
        human(need),
        human(u128::from(available.bytes)),
        available.from,
    )
}

/// The largest number of jails costing `per_jail` each that `available` holds.
pub fn largest(available: u64, per_jail: u64) -> u64 {
    available.checked_div(per_jail).unwrap_or(u64::MAX)
}

/// Whether `size` jails costing `per_jail` each fit in `available`.
pub fn fits(size: usize, per_jail: PerJail, available: &Available) -> Result<(), TooMany> {
    let most = largest(available.bytes, per_jail.bytes());
    if size as u64 <= most {
        return Ok(());
    }
    Err(TooMany { size, per_jail, available: available.clone(), largest: most })
}

/// `MemAvailable` from the text of /proc/meminfo, in bytes.
pub(crate) fn mem_available(meminfo: &str) -> Option<u64> {
    let rest = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kb = rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kb.checked_mul(1024)
}

/// One cgroup memory limit file's value: `None` for no limit ("max", or
/// a v1 value at the page counter's maximum) or a value that is not one.
pub(crate) fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|&v| v < V1_UNLIMITED)
}

/// The folders, from the pool's cgroup up to its hierarchy's mount point,
/// of the hierarchy that holds the memory controller, and the limit file
/// each has: the cgroup v1 memory hierarchy when there is one (a hybrid
/// host), else the unified one. `root` prefixes every mount point (`/`
/// on a real host).
fn limit_files(layout: &Layout, me: &Membership, root: &Path) -> Vec<PathBuf> {
    let (mount, at, path, file) = match layout.v1.iter().find(|h| h.controllers.iter().any(|c| c == "memory")) {
        Some(h) => match me.v1.get("memory") {
            Some(p) => (&h.mount, &h.root, p, "memory.limit_in_bytes"),
            None => return Vec::new(),
        },
        None => match (&layout.unified, &me.unified) {
            (Some((mount, at)), Some(p)) => (mount, at, p, "memory.max"),
            _ => return Vec::new(),
        },
    };
    let base = root.join(mount.strip_prefix("/").unwrap_or(mount));
    let Some(mut dir) = crate::cgroup::dir_of(&base, at, path) else { return Vec::new() };
    let mut files = Vec::new();
    for _ in 0..MAX_LEVELS {
        files.push(dir.join(file));
        if dir == base || !dir.pop() || !dir.starts_with(&base) {
            break;
        }
    }
    files
}

/// The memory available to the pool: `MemAvailable`, or its cgroup's
/// limit when that is lower. `root` is `/` on a real host; `meminfo`,
/// `mountinfo` and `proc_cgroup` are the texts of /proc/meminfo,
/// /proc/self/mountinfo and /proc/self/cgroup. `None` when none of it
/// could be read (the pool then says so and is not bounded).
pub fn available(root: &Path, meminfo: &str, mountinfo: &str, proc_cgroup: &str) -> Option<Available> {
    let mut best = mem_available(meminfo).map(|bytes| Available { bytes, from: "MemAvailable in /proc/meminfo".into() });
    let layout = crate::cgroup::parse_mountinfo(mountinfo);
    let me = crate::cgroup::parse_proc_cgroup(proc_cgroup);
    for file in limit_files(&layout, &me, root) {
        let Some(limit) = std::fs::read_to_string(&file).ok().as_deref().and_then(parse_limit) else {
            continue;
        };
        if best.as_ref().is_none_or(|b| limit < b.bytes) {
            let shown = Path::new("/").join(file.strip_prefix(root).unwrap_or(&file));
            best = Some(Available { bytes: limit, from: format!("the limit in {}", shown.display()) });
        }
    }
    best
}

/// [`available`] on this host.
pub(crate) fn available_here() -> Option<Available> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    available(Path::new("/"), &read("/proc/meminfo"), &read("/proc/self/mountinfo"), &read("/proc/self/cgroup"))
}

/// Bytes for a person: `512 MiB`, `3.1 GiB`.
fn human(bytes: u128) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn avail(bytes: u64) -> Available {
        Available { bytes, from: "MemAvailable in /proc/meminfo".into() }
    }

    #[test]
    fn a_size_fits_while_size_times_the_cost_is_within_what_is_available() {
        assert_eq!(fits(4, PerJail::Limit(GIB / 2), &avail(2 * GIB)), Ok(()));
        let e = fits(5, PerJail::Limit(GIB / 2), &avail(2 * GIB)).unwrap_err();
        assert_eq!(e.largest, 4);
        assert_eq!(largest(2 * GIB + 1, GIB), 2);
        assert_eq!(largest(GIB - 1, GIB), 0);
        // A cost of nothing never bounds the size.
        assert_eq!(largest(GIB, 0), u64::MAX);
        // No overflow at the top of the range.
        assert!(fits(64, PerJail::Limit(u64::MAX), &avail(u64::MAX)).is_err());
    }

    #[test]
    fn the_refusal_is_one_line_naming_the_largest_size_and_the_fixes() {
        let e = fits(8, PerJail::Limit(GIB / 2), &avail(3 * GIB + GIB / 10)).unwrap_err();
        let line = e.to_string();
        assert_eq!(
            line,
            "--size 8 needs 8 x 512 MiB (memory limit) = 4 GiB, more than the 3.1 GiB available to the pool \
             (MemAvailable in /proc/meminfo); the largest size that fits is 6: give --size 6 or less, or a lower --memory"
        );
        let none = fits(1, PerJail::Limit(4 * GIB), &avail(GIB)).unwrap_err().to_string();
        assert!(none.ends_with("; not one jail fits: give a lower --memory"), "{none}");
        let idle = fits(64, PerJail::Idle(100 << 20), &avail(GIB)).unwrap_err().to_string();
        assert!(idle.contains("(idle cost, measured on the first jail") && idle.ends_with("give --size 10 or less"), "{idle}");
        assert!(!line.contains('\n') && !idle.contains('\n'));
    }

    #[test]
    fn meminfo_and_limit_files_are_read_as_the_kernel_writes_them() {
        let meminfo = "MemTotal:       24683792 kB\nMemFree:  1 kB\nMemAvailable:   23369388 kB\n";
        assert_eq!(mem_available(meminfo), Some(23369388 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_limit("junk"), None);
    }

    /// A fake hierarchy under a temp dir: `files` are (path, content).
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for (p, text) in files {
            let p = t.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        t
    }

    const MEMINFO: &str = "MemAvailable: 8388608 kB\n"; // 8 GiB

    #[test]
    fn on_a_hybrid_host_the_lowest_v1_limit_up_the_memory_hierarchy_wins() {
        let t = tree(&[
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("sys/fs/cgroup/memory/pools/memory.limit_in_bytes", "2147483648\n"),
            ("sys/fs/cgroup/memory/pools/p1/memory.limit_in_bytes", "4294967296\n"),
            ("sys/fs/cgroup/unified/memory.max", "1024\n"),
        ]);
        let mountinfo = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                         30 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let cgroup = "4:memory:/pools/p1\n0::/\n";
        let a = available(t.path(), MEMINFO, mountinfo, cgroup).unwrap();
        assert_eq!(a.bytes, 2 << 30, "the parent's limit holds its subtree: {a:?}");
        assert_eq!(a.from, "the limit in /sys/fs/cgroup/memory/pools/memory.limit_in_bytes");
    }

    #[test]
    fn on_a_v2_host_memory_max_counts_and_meminfo_wins_when_lower() {
        let t = tree(&[
            ("sys/fs/cgroup/user.slice/memory.max", "max\n"),
            ("sys/fs/cgroup/user.slice/u/memory.max", "1073741824\n"),
        ]);
        let mountinfo = "30 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let a = available(t.path(), MEMINFO, mountinfo, "0::/user.slice/u\n").unwrap();
        assert_eq!((a.bytes, a.from.as_str()), (1 << 30, "the limit in /sys/fs/cgroup/user.slice/u/memory.max"));
        let low = "MemAvailable: 1024 kB\n";
        assert_eq!(available(t.path(), low, mountinfo, "0::/user.slice/u\n").unwrap(), avail(1 << 20));
    }

    #[test]
    fn without_a_limit_or_a_cgroup_meminfo_is_what_is_available() {
        let t = tree(&[("sys/fs/cgroup/memory.max", "max\n")]);
        let mountinfo = "30 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(available(t.path(), MEMINFO, mountinfo, "0::/\n"), Some(avail(8 << 30)));
        assert_eq!(available(t.path(), MEMINFO, "", ""), Some(avail(8 << 30)));
        // A cgroup path outside the mount's root (a bind-mounted subtree)
        // is not guessed at.
        let sub = "30 25 0:27 /inner /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(available(t.path(), MEMINFO, sub, "0::/other\n"), Some(avail(8 << 30)));
        assert_eq!(available(t.path(), "", "", ""), None);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(512 << 20), "512 MiB");
        assert_eq!(human(3 * (1 << 30) + (1 << 30) / 10), "3.1 GiB");
        assert_eq!(human(64 * (4u128 << 40)), "256 TiB");
        assert_eq!(human(100), "100 B");
    }
}
