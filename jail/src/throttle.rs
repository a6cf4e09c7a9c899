//! The CPU quota (`limits.cpus`) without a cgroup: the supervisor measures
//! the run's tree and duty-cycles it with SIGSTOP/SIGCONT so that its
//! average stays at the quota. Used by the watch loop (watch.rs), for a
//! run and a session alike, only when limits.rs found no cpu controller.
//!
//! Design notes:
//! - The tree is found from the jail's PID 1 down, through
//!   `/proc/<pid>/task/<tid>/children` of every thread: everything in the
//!   run's pid namespace descends from its PID 1 (orphans are reparented to
//!   it, or to a subreaper that is itself in the tree). Bounded: at most
//!   [`MAX_PROCESSES`] processes and [`MAX_FILE_BYTES`] per file, opened with
//!   O_NOFOLLOW; the `stat` parser ([`parse_stat`]) cannot panic on any bytes
//!   (fuzz/fuzz_targets/proc_stat.rs).
//! - CPU time is utime+stime+cutime+cstime of every process of the tree, so
//!   a child that exited and was reaped still counts (in its parent's
//!   cutime/cstime). The kernel counts it in clock ticks (10 ms).
//! - A token bucket, checked every [`PERIOD`]: the tree earns `cores` CPU
//!   seconds per wall second, keeps at most one period's worth of credit
//!   (no bursts after idling, as CFS with no burst), and once in debt it is
//!   stopped until the debt is paid ([`decide`]). Overshoot is at most one
//!   period on every core the tree keeps busy, paid back by the next stop.
//! - Whom to signal: every process of the tree but PID 1. The jail's PID 1
//!   (child.rs, `reaper`) is our own code blocked in sigwait, using no CPU;
//!   it forwards only termination signals, none of which resumes a stopped
//!   process; left running, it keeps reaping, so the tree's CPU time moves
//!   into its cutime instead of being lost.
//! - A stop is a sweep repeated until a pass finds every process stopped:
//!   a process forked during the sweep, or one a sibling sent SIGCONT
//!   before it was stopped itself, is found and stopped by the next pass.
//!   Once all are stopped, none can fork or signal. A sweep that has not
//!   settled after [`STOP_PASSES`] goes on from the watch loop (so the
//!   supervisor keeps relaying and timing meanwhile), [`SETTLE_GAP`]
//!   apart, and the stop is not lifted before it has held
//!   the whole tree, up to [`SETTLE_LIMIT`] from its start. On a loaded
//!   host a process with a stop pending can wait tens of milliseconds for
//!   a CPU, and a sibling that gets one first resumes it (a SIGCONT
//!   discards a pending SIGSTOP): the race is won by persistence, not by
//!   a pass count. Only a stop given up at the limit is counted
//!   (`usage.throttled.unsettled`); whatever ran meanwhile is measured and
//!   paid back like any other CPU time.
//! - Resuming sends SIGCONT to every process of the tree, so a process the
//!   script stopped itself is resumed as well.
//! - SCHED_IDLE is not used: a supervisor that is not root cannot change
//!   the scheduling policy of processes of the leased uid, and the quota's
//!   precision does not depend on it.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::result::Throttled;

/// How often the tree's CPU time is measured while it runs.
pub(crate) const PERIOD: Duration = Duration::from_millis(50);

/// Processes of the tree looked at, at most, per scan.
pub(crate) const MAX_PROCESSES: usize = 8192;

/// Bytes read, at most, from one `/proc` file.
pub(crate) const MAX_FILE_BYTES: u64 = 64 * 1024;

/// Passes of a stop's first sweep, before the rest is left to the watch
/// loop: 16 a [`PASS_GAP`] apart, the rest a [`SLOW_PASS_GAP`] apart
/// (about 25 ms in all).
pub(crate) const STOP_PASSES: usize = 32;

/// Passes of each later sweep of a stop that has not settled yet.
const SETTLE_PASSES: usize = 8;

/// The pause between the first 16 passes of a stop sweep.
const PASS_GAP: Duration = Duration::from_micros(500);

/// The pause between later passes: on a loaded host a stopped process may
/// wait this long for a CPU before a SIGCONT it had in flight lands, and
/// a sweep that outruns the scheduler never sees the tree settle (a CI run
/// of the test suite, its CPU hogs in parallel, counted one unsettled stop
/// in eleven with 32 passes 0.5 ms apart).
const SLOW_PASS_GAP: Duration = Duration::from_millis(1);

/// Between the sweeps of a stop that has not settled yet (a CI run of the
/// test suite counted one unsettled stop in seventeen with 64 passes in
/// about 60 ms, so the sweep no longer ends at a pass count).
pub(crate) const SETTLE_GAP: Duration = Duration::from_millis(5);

/// How long, from its start, a stop that has not settled is held before
/// it is given up and counted as unsettled.
pub(crate) const SETTLE_LIMIT: Duration = Duration::from_millis(250);

/// The precision `limits.cpus.detail` states, in words.
pub(crate) fn precision_words() -> String {
    format!(
        "measured every {} ms from /proc/<pid>/stat (10 ms clock ticks): over the run the tree's CPU time stays within \
         cpus × wall time, plus at most one {} ms period on each core it keeps busy",
        PERIOD.as_millis(),
        PERIOD.as_millis()
    )
}

/// What one `/proc/<pid>/stat` says that the throttle needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    /// The state letter: `R`, `S`, `D`, `T` (stopped), `t`, `Z`, ...
    pub state: u8,
    pub ppid: i32,
    /// utime + stime + cutime + cstime, in clock ticks.
    pub cpu_ticks: u64,
}

impl Stat {
    /// Stopped, traced, or dead: it runs no code until resumed.
    fn held(&self) -> bool {
        matches!(self.state, b'T' | b't' | b'Z' | b'X' | b'x')
    }
}

/// Parse `/proc/<pid>/stat`: `pid (comm) state ppid ...`, where `comm` may
/// hold any bytes, spaces and parentheses included, so the fields start
/// after the last `)`. `None` on anything else; never panics.
pub fn parse_stat(bytes: &[u8]) -> Option<Stat> {
    let open = bytes.iter().position(|&b| b == b'(')?;
    let close = bytes.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let pid: i32 = number(bytes.get(..open)?.trim_ascii())?;
    let mut fields = bytes.get(close + 1..)?.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let state = match fields.next()? {
        [s] => *s,
        _ => return None,
    };
    let ppid: i32 = number(fields.next()?)?;
    // Fields 14 to 17 (1-based, man 5 proc): utime stime cutime cstime;
    // we are at field 5.
    let mut rest = fields.skip(9);
    let mut cpu_ticks: u64 = 0;
    for _ in 0..4 {
        let n: i64 = number(rest.next()?.trim_ascii())?;
        cpu_ticks = cpu_ticks.saturating_add(u64::try_from(n).ok()?);
    }
    Some(Stat { pid, state, ppid, cpu_ticks })
}

fn number<T: std::str::FromStr>(b: &[u8]) -> Option<T> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// At most [`MAX_FILE_BYTES`] of a `/proc` file, never through a link.
pub(crate) fn read_bounded(path: &str) -> Option<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let mut buf = Vec::new();
    file.take(MAX_FILE_BYTES).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// The children of every thread of `pid`, appended to `out`.
pub(crate) fn children_of(pid: i32, out: &mut Vec<i32>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for task in tasks.flatten().take(MAX_PROCESSES) {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else { continue };
        let Some(list) = read_bounded(&format!("/proc/{pid}/task/{tid}/children")) else { continue };
        out.extend(list.split(|&b| b == b' ').filter_map(|c| number::<i32>(c.trim_ascii())).filter(|&c| c > 0));
        if out.len() >= MAX_PROCESSES {
            return;
        }
    }
}

/// The CPU time of `pid` and of the children it reaped (utime + stime +
/// cutime + cstime of `/proc/<pid>/stat`): what RLIMIT_CPU counted of a
/// session's interpreter once the jail's PID 1 reaped it (session/cells.rs).
pub(crate) fn cpu_of(pid: Pid) -> Option<Duration> {
    let stat = read_bounded(&format!("/proc/{}/stat", pid.as_raw())).and_then(|b| parse_stat(&b))?;
    Some(Duration::from_secs_f64(stat.cpu_ticks as f64 * tick()))
}

/// The CPU time of every process of the tree under `root` (and of what
/// they reaped), from /proc; `None` when not even `root` could be read.
pub(crate) fn tree_cpu(root: Pid) -> Option<Duration> {
    let found = scan(root);
    if found.is_empty() {
        return None;
    }
    let ticks: u64 = found.iter().map(|s| s.cpu_ticks).fold(0, u64::saturating_add);
    Some(Duration::from_secs_f64(ticks as f64 * tick()))
}

/// Seconds per clock tick, the unit of `/proc/<pid>/stat`'s CPU times.
fn tick() -> f64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&n| n > 0)
        .unwrap_or(100);
    1.0 / hz as f64
}

/// Every process of the tree under `root` (itself first) that could be
/// read, breadth first, at most [`MAX_PROCESSES`].
pub(crate) fn scan(root: Pid) -> Vec<Stat> {
    let mut found = Vec::new();
    let mut queue = vec![root.as_raw()];
    let mut next = 0;
    while next < queue.len() && found.len() < MAX_PROCESSES {
        let pid = queue[next];
        next += 1;
        let Some(stat) = read_bounded(&format!("/proc/{pid}/stat")).and_then(|b| parse_stat(&b)) else {
            continue;
        };
        found.push(stat);
        if queue.len() < MAX_PROCESSES {
            children_of(pid, &mut queue);
            queue.truncate(MAX_PROCESSES);
        }
    }
    found
}

/// Whether SIGSTOP is pending on `pid` (its process-wide or own pending
/// set in `/proc/<pid>/status`, `ShdPnd`/`SigPnd`).
fn stop_pending(pid: i32) -> bool {
    read_bounded(&format!("/proc/{pid}/status")).is_some_and(|b| pending_has_stop(&b))
}

/// Whether a `status` text's `ShdPnd` or `SigPnd` mask has SIGSTOP's bit.
pub(crate) fn pending_has_stop(status: &[u8]) -> bool {
    let bit = 1u64 << (libc::SIGSTOP - 1);
    status.split(|&b| b == b'\n').any(|line| {
        let mask = line.strip_prefix(b"ShdPnd:").or_else(|| line.strip_prefix(b"SigPnd:"));
        mask.and_then(|m| std::str::from_utf8(m.trim_ascii()).ok())
            .and_then(|m| u64::from_str_radix(m, 16).ok())
            .is_some_and(|m| m & bit != 0)
    })
}

/// What to do after one measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Let it run; the credit left, in CPU seconds.
    Run { credit: f64 },
    /// Stop the tree this long, which pays back the (negative) credit.
    Stop { for_: Duration, credit: f64 },
}

/// The token bucket: `credit` CPU seconds before, `wall` seconds passed,
/// `used` CPU seconds spent in them, at `cores`; credit is capped at one
/// period's worth.
pub fn decide(credit: f64, cores: f64, wall: f64, used: f64) -> Decision {
    let cap = cores * PERIOD.as_secs_f64();
    let credit = (credit + cores * wall - used).min(cap);
    if credit >= 0.0 || cores <= 0.0 {
        return Decision::Run { credit };
    }
    Decision::Stop { for_: Duration::from_secs_f64((-credit / cores).min(3600.0)), credit }
}

/// The throttle of one run's tree.
pub(crate) struct Throttle {
    cores: f64,
    root: Pid,
    tick: f64,
    credit: f64,
    /// When the tree was last measured, and its CPU seconds then.
    measured: Option<(Instant, f64)>,
    /// While stopped: since when, and until when.
    stopped: Option<(Instant, Instant)>,
    /// While stopped: no sweep has found the whole tree held yet.
    settling: bool,
    next: Instant,
    stats: Throttled,
}

impl Throttle {
    /// A throttle holding the tree under `root` (the jail's PID 1, in our
    /// pid namespace) to `cores`.
    pub fn new(cores: f64, root: Pid) -> Throttle {
        Throttle {
            cores,
            root,
            tick: tick(),
            credit: 0.0,
            measured: None,
            stopped: None,
            settling: false,
            next: Instant::now(),
            stats: Throttled::default(),
        }
    }

    /// When [`Throttle::check`] must run next.
    pub(crate) fn next_wake(&self) -> Instant {
        self.next
    }

    /// Measure, and stop or resume the tree as the bucket says. A no-op
    /// before [`Throttle::next_wake`].
    pub fn check(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        if let Some((since, until)) = self.stopped {
            self.settling = self.settling && !self.sweep(SETTLE_PASSES);
            // A stop that has not held the whole tree yet outlasts its
            // time, up to SETTLE_LIMIT: resuming now would only start the
            // race again.
            let end = if self.settling { until.max(since + SETTLE_LIMIT) } else { until };
            if now < end {
                self.next = if self.settling { (now + SETTLE_GAP).min(end) } else { end };
                return;
            }
            if std::mem::take(&mut self.settling) {
                self.stats.unsettled += 1;
            }
            self.resume();
            self.stats.stopped_ms += (now - since).as_secs_f64() * 1000.0;
            self.stopped = None;
        }
        let tree = scan(self.root);
        let cpu = tree.iter().map(|s| s.cpu_ticks).fold(0u64, u64::saturating_add) as f64 * self.tick;
        let (wall, used) = match self.measured {
            Some((at, before)) => ((now - at).as_secs_f64(), (cpu - before).max(0.0)),
            None => (0.0, 0.0),
        };
        self.measured = Some((now, cpu.max(self.measured.map_or(0.0, |m| m.1))));
        match decide(self.credit, self.cores, wall, used) {
            Decision::Run { credit } => {
                self.credit = credit;
                self.next = now + PERIOD;
            }
            Decision::Stop { for_, credit } => {
                // The stop's own wall time pays it back, at the next check.
                self.credit = credit;
                self.stats.stops += 1;
                self.settling = !self.sweep(STOP_PASSES);
                self.stopped = Some((now, now + for_));
                self.next = if self.settling { now + SETTLE_GAP.min(for_) } else { now + for_ };
            }
        }
    }

    /// Stop every process of the tree but PID 1, pass after pass until one
    /// finds them all held and a confirming pass, a moment later, agrees
    /// (see the module doc); at most `passes`. Whether it settled.
    fn sweep(&self, passes: usize) -> bool {
        let mut quiet = 0;
        for pass in 0..passes {
            let mut sent = 0;
            for s in scan(self.root).iter().filter(|s| s.pid != self.root.as_raw() && !s.held()) {
                // Runnable but not yet scheduled, or in uninterruptible
                // sleep: the stop is pending and lands before it runs any
                // code of its own. Only a SIGCONT undoes that, and it is
                // sent again if one does.
                if stop_pending(s.pid) {
                    continue;
                }
                if nix::sys::signal::kill(Pid::from_raw(s.pid), Signal::SIGSTOP).is_ok() {
                    sent += 1;
                }
            }
            quiet = if sent == 0 { quiet + 1 } else { 0 };
            if quiet == 2 {
                return true;
            }
            // A SIGCONT some process had already in flight lands now.
            std::thread::sleep(if pass < 16 { PASS_GAP } else { SLOW_PASS_GAP });
        }
        false
    }

    /// Resume every process of the tree.
    fn resume(&self) {
        for s in scan(self.root).iter().filter(|s| s.pid != self.root.as_raw()) {
            let _ = nix::sys::signal::kill(Pid::from_raw(s.pid), Signal::SIGCONT);
        }
    }

    /// What the throttle did, for `usage.throttled`.
    pub fn report(&self, now: Instant) -> Throttled {
        let mut t = self.stats.clone();
        if let Some((since, _)) = self.stopped {
            t.stopped_ms += now.saturating_duration_since(since).as_secs_f64() * 1000.0;
        }
        t
    }

    /// What the throttle did since it reported `before` (a session's cell:
    /// the quota holds across cells, each cell's result says what it cost
    /// this one). A stop under way at `before` counts in the earlier
    /// report; its stopped time is split at `before`.
    pub(crate) fn report_since(&self, before: &Throttled, now: Instant) -> Throttled {
        let t = self.report(now);
        Throttled {
            stops: t.stops.saturating_sub(before.stops),
            stopped_ms: (t.stopped_ms - before.stopped_ms).max(0.0),
            unsettled: t.unsettled.saturating_sub(before.unsettled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] = b"1234 (py (x) y) R 1 1234 1234 0 -1 4194304 100 0 0 0 250 50 7 3 20 0 1 0 100 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";

    #[test]
    fn the_fields_start_after_the_last_parenthesis() {
        assert_eq!(parse_stat(LINE), Some(Stat { pid: 1234, state: b'R', ppid: 1, cpu_ticks: 310 }));
    }

    #[test]
    fn truncated_or_garbled_lines_are_none() {
        for bad in [
            &b""[..],
            b"1234",
            b"1234 (py",
            b"x (py) R 1 2 3 4 5 6 7 8 9 10 11 12 13",
            b"1 (py) R 1 2 3 4 5 6 7 8 9 10 11 12",
            b"1 (py) RR 1 2 3 4 5 6 7 8 9 10 11 12 13",
            b"1 (py) R 1 2 3 4 5 6 7 8 9 -10 11 12 13",
            b") 1 (",
        ] {
            assert_eq!(parse_stat(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        for n in 0..LINE.len() {
            let _ = parse_stat(&LINE[..n]);
        }
    }

    #[test]
    fn a_pending_sigstop_is_read_from_either_mask() {
        assert!(pending_has_stop(b"Name:\tpy\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000040000\n"));
        assert!(pending_has_stop(b"SigPnd:\t0000000000040000\n"));
        assert!(!pending_has_stop(b"SigPnd:\t0000000000020000\nShdPnd:\t0000000000000000\n"));
        assert!(!pending_has_stop(b"ShdPnd:\tzz\n"));
    }

    #[test]
    fn a_tree_within_its_quota_runs_and_keeps_at_most_one_period_of_credit() {
        match decide(0.0, 0.5, 0.05, 0.02) {
            Decision::Run { credit } => assert!((credit - 0.005).abs() < 1e-12, "{credit}"),
            d => panic!("{d:?}"),
        }
        // Idle for a second: no burst beyond one period.
        assert_eq!(decide(0.0, 0.5, 1.0, 0.0), Decision::Run { credit: 0.025 });
    }

    #[test]
    fn a_tree_in_debt_is_stopped_until_it_is_paid() {
        // Two busy cores for 50 ms at half a core: 75 ms of debt, 150 ms stopped.
        match decide(0.0, 0.5, 0.05, 0.1) {
            Decision::Stop { for_, credit } => {
                assert!((for_.as_secs_f64() - 0.15).abs() < 1e-9, "{for_:?}");
                assert!((credit + 0.075).abs() < 1e-9, "{credit}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn the_average_converges_to_the_quota() {
        // A hog on two cores, simulated: run a period, pay, run again.
        let (mut credit, mut wall, mut cpu) = (0.0, 0.0, 0.0);
        for _ in 0..100 {
            match decide(credit, 0.5, PERIOD.as_secs_f64(), 2.0 * PERIOD.as_secs_f64()) {
                Decision::Run { credit: c } => credit = c,
                Decision::Stop { for_, credit: c } => {
                    // The stop: that much wall time, no CPU.
                    wall += for_.as_secs_f64();
                    credit = c + 0.5 * for_.as_secs_f64();
                }
            }
            wall += PERIOD.as_secs_f64();
            cpu += 2.0 * PERIOD.as_secs_f64();
        }
        assert!((cpu / wall - 0.5).abs() < 0.01, "{}", cpu / wall);
    }

    #[test]
    fn our_own_tree_is_found_and_measured() {
        let me = Pid::this();
        let tree = scan(me);
        assert_eq!(tree.first().map(|s| s.pid), Some(me.as_raw()));
    }
}
