//! What an idle pooled jail holds in memory, read from /proc: the pool's
//! `stats` and `make bench` report it (issue 18: "the idle cost of a
//! pooled jail measured and reported").
//!
//! Three figures, summed over the jail's processes (the descendants of its
//! session supervisor, which is the pool's and not counted):
//!
//! - `rss`: resident pages, each process counting every page it maps,
//!   shared or not (`VmRSS`);
//! - `pss`: the proportional set size, a page shared by n processes
//!   counted 1/n in each: the jails of one pool map the same rootfs files,
//!   so the pss of N ready jails sums to what they cost together;
//! - `anon`: anonymous memory (the interpreter's heap, what the preload
//!   built), which no other jail shares: the cost of one more jail.
//!
//! `pss` and `anon` come from `/proc/PID/smaps_rollup`, which needs ptrace
//! read access: the pool's user owns the jail's user namespace, so it has
//! it; where it is refused they are `None` and `rss` stands alone.

use std::fs;

/// Processes of one jail looked at, at most (a bound on the reads).
const MAX_PROCESSES: usize = 4096;

/// One jail's memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub rss: u64,
    pub pss: Option<u64>,
    pub anon: Option<u64>,
}

impl Footprint {
    fn add(&mut self, other: Footprint) {
        self.rss += other.rss;
        self.pss = self.pss.zip(other.pss).map(|(a, b)| a + b);
        self.anon = self.anon.zip(other.anon).map(|(a, b)| a + b);
    }
}

/// The jail under the session supervisor `supervisor`.
pub fn of_jail(supervisor: u32) -> Footprint {
    let mut total = Footprint { rss: 0, pss: Some(0), anon: Some(0) };
    let mut todo = vec![supervisor];
    let mut seen = 0;
    while let Some(pid) = todo.pop() {
        seen += 1;
        if seen > MAX_PROCESSES {
            break;
        }
        if pid != supervisor {
            total.add(of_process(pid));
        }
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for t in tasks.flatten() {
            let children = fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    total
}

/// The mean of several jails' footprints (`None` when there are none).
pub fn mean(jails: &[Footprint]) -> Option<Footprint> {
    let n = jails.len() as u64;
    if n == 0 {
        return None;
    }
    let mut sum = Footprint { rss: 0, pss: Some(0), anon: Some(0) };
    for j in jails {
        sum.add(*j);
    }
    Some(Footprint { rss: sum.rss / n, pss: sum.pss.map(|p| p / n), anon: sum.anon.map(|a| a / n) })
}

fn of_process(pid: u32) -> Footprint {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = kib_field(&status, "VmRSS:").unwrap_or(0);
    let rollup = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Footprint { rss, pss: kib_field(&rollup, "Pss:"), anon: kib_field(&rollup, "Anonymous:") }
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
    fn a_jail_whose_rollup_was_unreadable_has_no_pss_in_the_mean() {
        let a = Footprint { rss: 100, pss: Some(60), anon: Some(40) };
        let b = Footprint { rss: 200, pss: None, anon: None };
        assert_eq!(mean(&[a, a]), Some(Footprint { rss: 100, pss: Some(60), anon: Some(40) }));
        assert_eq!(mean(&[a, b]), Some(Footprint { rss: 150, pss: None, anon: None }));
        assert_eq!(mean(&[]), None);
    }

    #[test]
    fn this_process_has_a_footprint() {
        let me = of_process(std::process::id());
        assert!(me.rss > 0 && me.pss.is_some_and(|p| p > 0), "{me:?}");
    }
}
