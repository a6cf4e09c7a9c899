//! What an idle pooled jail holds in memory, read from /proc: the pool's
//! `stats` and `make bench` report it (issue 18: "the idle cost of a
//! pooled jail measured and reported").
//!
//! Four figures, summed over the jail's processes: the descendants of its
//! session supervisor (itself the pool's, and not counted), and for a
//! fork of the pool's template (template.rs), its template's child, the
//! fork's PID 1 and its descendants:
//!
//! - `rss`: resident pages, each process counting every page it maps,
//!   shared or not (`VmRSS`);
//! - `pss`: the proportional set size, a page shared by n processes
//!   counted 1/n in each: the jails of one pool map the same rootfs files,
//!   so the pss of N ready jails sums to what they cost together;
//! - `anon`: anonymous memory (the interpreter's heap, what the preload
//!   built), which no other jail shares;
//! - `uss`: the unique set size, the pages mapped by this process alone
//!   (`Private_Clean` + `Private_Dirty`): what the kernel would free were
//!   the jail gone, so the cost of one more jail (issue 36's "private
//!   memory"). It counts private file pages too, which `anon` leaves out.
//!
//! `rss` and `anon` (`RssAnon`) come from `/proc/PID/status`, which anyone
//! may read; `pss` and `uss` from `/proc/PID/smaps_rollup`, which needs
//! ptrace read access: an ordinary user's pool is refused the jail's PID 1
//! (it is not dumpable), so for a process whose rollup is refused its
//! `rss` stands in for both (an upper bound of each: PID 1 is small, and
//! mostly shared pages). A figure held to a ceiling is overstated then,
//! never understated.

use crate::throttle::{children_of, read_bounded};

/// Processes of one jail looked at, at most (a bound on the reads).
const MAX_PROCESSES: usize = 4096;

/// One jail's memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub rss: u64,
    pub pss: u64,
    pub anon: u64,
    pub uss: u64,
}

impl Footprint {
    fn add(&mut self, other: Footprint) {
        self.rss += other.rss;
        self.pss += other.pss;
        self.anon += other.anon;
        self.uss += other.uss;
    }
}

/// The jail of the session supervisor `supervisor`, whose PID 1 is
/// `pid1` (as its start said), all four figures.
pub(crate) fn of_jail(supervisor: u32, pid1: Option<u32>) -> Footprint {
    let mut total = Footprint::default();
    for pid in jail_processes(supervisor, pid1) {
        total.add(of_process(pid));
    }
    total
}

/// The jail's `rss` alone: what the pool records as each jail is made,
/// without the rollup's walk of every mapping of the preloaded interpreter.
pub(crate) fn rss_of_jail(supervisor: u32, pid1: Option<u32>) -> u64 {
    jail_processes(supervisor, pid1).into_iter().map(|pid| status_of(pid).0).sum()
}

/// The descendants of `supervisor`, not itself, and of a PID 1 that is
/// not among them (a template's fork, its template's child: template.rs)
/// with it, at most [`MAX_PROCESSES`] looked at, each /proc file read
/// bounded and without following a link (throttle.rs's walk).
fn jail_processes(supervisor: u32, pid1: Option<u32>) -> Vec<i32> {
    let mut found = descendants(supervisor as i32, false);
    if let Some(p) = pid1.map(|p| p as i32).filter(|p| !found.contains(p)) {
        found.extend(descendants(p, true));
        found.truncate(MAX_PROCESSES);
    }
    found
}

/// `root`'s descendants, and `root` itself when `with_root`.
fn descendants(root: i32, with_root: bool) -> Vec<i32> {
    let supervisor = root;
    let mut todo = vec![root];
    let mut found = Vec::new();
    let mut seen = 0;
    while let Some(pid) = todo.pop() {
        seen += 1;
        if seen > MAX_PROCESSES {
            break;
        }
        if pid != supervisor || with_root {
            found.push(pid);
        }
        if todo.len() < MAX_PROCESSES {
            children_of(pid, &mut todo);
            todo.truncate(MAX_PROCESSES);
        }
    }
    found
}

/// The mean of several jails' footprints (`None` when there are none).
pub fn mean(jails: &[Footprint]) -> Option<Footprint> {
    let n = jails.len() as u64;
    if n == 0 {
        return None;
    }
    let mut sum = Footprint::default();
    for j in jails {
        sum.add(*j);
    }
    Some(Footprint { rss: sum.rss / n, pss: sum.pss / n, anon: sum.anon / n, uss: sum.uss / n })
}

fn of_process(pid: i32) -> Footprint {
    let (rss, anon) = status_of(pid);
    let rollup = text_of(&format!("/proc/{pid}/smaps_rollup"));
    Footprint {
        rss,
        pss: kib_field(&rollup, "Pss:").unwrap_or(rss),
        anon,
        uss: private_of(&rollup).unwrap_or(rss),
    }
}

/// `Private_Clean` + `Private_Dirty` of a rollup, in bytes; `None` unless
/// both are there (a refused or cut read).
fn private_of(rollup: &str) -> Option<u64> {
    Some(kib_field(rollup, "Private_Clean:")? + kib_field(rollup, "Private_Dirty:")?)
}

/// `VmRSS` and `RssAnon` of `/proc/PID/status`, in bytes (0 when unread).
fn status_of(pid: i32) -> (u64, u64) {
    let status = text_of(&format!("/proc/{pid}/status"));
    (kib_field(&status, "VmRSS:").unwrap_or(0), kib_field(&status, "RssAnon:").unwrap_or(0))
}

fn text_of(path: &str) -> String {
    read_bounded(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// A `Name:   123 kB` line of a /proc file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rollups_fields_are_read_in_bytes_and_a_missing_one_is_none() {
        let rollup =
            "55f0-7ffd ---p 00000000 00:00 0 [rollup]\nRss:  98392 kB\nPss:  98388 kB\nPss_Anon: 68612 kB\nAnonymous: 68612 kB\n";
        assert_eq!(kib_field(rollup, "Pss:"), Some(98388 * 1024));
        assert_eq!(kib_field(rollup, "Anonymous:"), Some(68612 * 1024));
        assert_eq!(kib_field("", "Pss:"), None);
        assert_eq!(kib_field("Pss: lots kB\n", "Pss:"), None);
    }

    #[test]
    fn the_unique_set_is_both_private_fields_and_none_unless_both_are_read() {
        let rollup = "Rss:  1668 kB\nPss:  345 kB\nShared_Clean:  1520 kB\nPrivate_Clean:  36 kB\nPrivate_Dirty:  112 kB\n";
        assert_eq!(private_of(rollup), Some((36 + 112) * 1024));
        assert_eq!(private_of("Rss:  1668 kB\nPrivate_Clean:  36 kB\n"), None, "a cut read");
        assert_eq!(private_of(""), None, "a refused read: rss stands in");
    }

    #[test]
    fn the_mean_is_per_figure() {
        let a = Footprint { rss: 100, pss: 60, anon: 40, uss: 50 };
        let b = Footprint { rss: 200, pss: 100, anon: 80, uss: 90 };
        assert_eq!(mean(&[a, b]), Some(Footprint { rss: 150, pss: 80, anon: 60, uss: 70 }));
        assert_eq!(mean(&[]), None);
    }

    #[test]
    fn this_process_has_a_footprint() {
        let me = of_process(std::process::id() as i32);
        assert!(me.rss > 0 && me.pss > 0 && me.pss <= me.rss && me.anon > 0, "{me:?}");
        // A page of ours alone counts whole in the PSS too.
        assert!(me.uss > 0 && me.uss <= me.pss, "{me:?}");
    }
}
