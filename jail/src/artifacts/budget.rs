//! The judging's budgets: the supervisor CPU one run's judging may spend
//! ([`JUDGING_CPU`], [`Spend`]), how much time one artifact's scan may
//! take, how much of the whole collection's, and how much memory each
//! summariser may hold, as fixed numbers (not policy) checked by the code
//! that spends them.
//!
//! Pipeline position: a [`Spend`] starts once the jail's tree is dead
//! (delivery.rs) and is charged with everything the supervisor then does
//! to a file's content: hashing, scanning, neutralising formula cells.
//! [`Clock::start`] runs once at the start of the collection; each
//! accepted file gets a [`Deadline`] from it, and every scanner checks that
//! deadline, which includes the run's [`Spend`], as it goes (per 64 KiB
//! chunk, per batch of XML events, per JSON value). Past a scanning time
//! budget the scanner stops where it is and the file is flagged
//! `incomplete_scan` with the reason; the sha256 is still computed over
//! every byte. Past the CPU budget nothing more is read: what was not
//! judged (or neutralised) in full is refused, or, with
//! `artifacts.past_budget: "flag"`, delivered as written, flagged, its
//! hash still read to the end (bounded by `artifacts.max_total_bytes`).
//!
//! Memory is bounded by construction rather than measured: every buffer a
//! summariser keeps has a cap below, and the fuzz targets in `fuzz/` check
//! the peak heap of each parse against [`memory_budget`].

use std::time::{Duration, Instant};

use crate::result::{ContentFlag, FlagKind};

/// Supervisor CPU the judging of one run may spend once its tree is dead:
/// hashing, scanning and neutralising what the script left, all files
/// together. It is CPU, not wall time: a loaded host slows the judging
/// down but never changes what it decides. About 200 MiB of ordinary CSV
/// (hashed, scanned and neutralised) fit in it on a 2020s core (`make
/// bench` prints the figure); a script that leaves more pays with refusals,
/// never with the host's CPU.
pub const JUDGING_CPU: Duration = Duration::from_secs(1);

/// What the supervisor's thread has spent of the run's [`JUDGING_CPU`],
/// from when the tree died. Its own CPU clock (CLOCK_THREAD_CPUTIME_ID):
/// the supervisor judges on one thread, so nothing else is charged.
#[derive(Debug, Clone, Copy)]
pub struct Spend {
    start: Duration,
    limit: Duration,
}

impl Spend {
    pub fn start() -> Spend {
        Spend::with_limit(JUDGING_CPU)
    }

    /// A budget of `limit` (tests).
    pub(crate) fn with_limit(limit: Duration) -> Spend {
        Spend { start: thread_cpu(), limit }
    }

    /// CPU spent since the start.
    pub fn spent(&self) -> Duration {
        thread_cpu().saturating_sub(self.start)
    }

    /// Whether the budget is spent.
    pub fn out(&self) -> bool {
        self.spent() >= self.limit
    }

    /// The `detail` of a file the budget left unjudged.
    pub fn why(&self, what: &str) -> String {
        format!(
            "{what}: the run's judging budget ({} s of supervisor CPU, all files together) ran out",
            self.limit.as_secs_f64()
        )
    }
}

/// This thread's CPU time (clock_gettime(2), CLOCK_THREAD_CPUTIME_ID);
/// zero should the clock be missing, which would stop nothing early but
/// still stop at the wall-clock budgets.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| Duration::new(t.tv_sec().max(0) as u64, t.tv_nsec().clamp(0, 999_999_999) as u32))
        .unwrap_or_default()
}

/// Scanning time one file may take.
pub const FILE_SCAN_TIME: Duration = Duration::from_secs(2);
/// Scanning time all files of one collection may take together.
pub const STAGE_SCAN_TIME: Duration = Duration::from_secs(10);

/// Bytes of a file kept in memory for the summaries that need more than its
/// first chunk: JSON, SVG and JPEG (inspect.rs).
pub(crate) const KEEP_BYTES: usize = 4 << 20;

/// Deepest element nesting an XML/SVG reader follows; deeper, it stops.
pub(crate) const MAX_XML_DEPTH: usize = 256;
/// Attributes read from one XML element (the ones we want come first in
/// every writer we know; a tag with a million attributes is not walked).
pub(crate) const MAX_XML_ATTRIBUTES: usize = 32;

/// The parsers that have a budget, for [`memory_budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parser {
    /// A zip-based Office file: directory, parts and their XML.
    Office,
    /// The CSV/TSV cell scanner.
    Csv,
    /// The HTML/SVG active-content scanner.
    Markup,
    /// PNG/GIF/JPEG headers and the SVG root element.
    Image,
    /// The JSON top-level summary.
    Json,
}

/// Peak heap a parse of `input_bytes` may use, beyond the input itself.
///
/// - Office: the directory walk holds 64 KiB at a time and the zip reader at
///   most 10000 entries of a 4 MiB directory; one part is read whole (8 MiB)
///   and its XML events and the lists built from it are capped; 64 MiB in all.
/// - CSV and markup scanners hold fixed-size state (the first record, a few
///   examples, a tag name): 64 KiB.
/// - Image headers and JSON parse the kept prefix (at most 4 MiB) and hold
///   at most one copy of it (an XML event, a JSON string's unescaping) on
///   top of fixed state.
pub fn memory_budget(parser: Parser, input_bytes: usize) -> usize {
    const FIXED: usize = 64 << 10;
    match parser {
        Parser::Office => 64 << 20,
        Parser::Csv | Parser::Markup => FIXED,
        Parser::Image | Parser::Json => FIXED + 2 * input_bytes.min(KEEP_BYTES),
    }
}

/// Why a scan stopped short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// This file's own time.
    File,
    /// The whole collection's time.
    Stage,
}

/// The collection's scanning clock, and the run's CPU budget.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    stage_ends: Instant,
    spend: Spend,
}

impl Clock {
    pub fn start(spend: Spend) -> Clock {
        Clock { stage_ends: Instant::now() + STAGE_SCAN_TIME, spend }
    }

    /// The deadline of the file whose scan starts now.
    pub fn file(&self) -> Deadline {
        let file_ends = Instant::now() + FILE_SCAN_TIME;
        let spend = Some(self.spend);
        if file_ends <= self.stage_ends {
            Deadline { at: file_ends, limit: Limit::File, spend }
        } else {
            Deadline { at: self.stage_ends, limit: Limit::Stage, spend }
        }
    }

    pub fn spend(&self) -> Spend {
        self.spend
    }
}

/// When one file's scan must stop: its time, or the run's CPU budget.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Limit,
    spend: Option<Spend>,
}

impl Deadline {
    /// A deadline at `at` (tests and fuzz targets), with no CPU budget.
    pub fn at(at: Instant) -> Deadline {
        Deadline { at, limit: Limit::File, spend: None }
    }

    /// A deadline of [`FILE_SCAN_TIME`] from now.
    pub fn from_now() -> Deadline {
        Deadline::at(Instant::now() + FILE_SCAN_TIME)
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.at || self.over_budget()
    }

    /// Whether the run's CPU budget is spent.
    pub(crate) fn over_budget(&self) -> bool {
        self.spend.is_some_and(|s| s.out())
    }

    /// The `incomplete_scan` line for a scan this deadline stopped.
    pub fn reason(&self, what: &str) -> String {
        match (self.spend.filter(Spend::out), self.limit) {
            (Some(spend), _) => spend.why(&format!("{what} stopped")),
            (None, Limit::File) => {
                format!("{what} stopped at the scan's time budget ({} s per file)", FILE_SCAN_TIME.as_secs())
            }
            (None, Limit::Stage) => {
                format!("{what} stopped at the artifact check's time budget ({} s for all files)", STAGE_SCAN_TIME.as_secs())
            }
        }
    }
}

/// Counts work between looks at the clock: `Instant::now` per XML event
/// would cost more than the event.
#[derive(Debug)]
pub(crate) struct Ticker {
    deadline: Deadline,
    n: u32,
    stopped: bool,
}

impl Ticker {
    const EVERY: u32 = 256;

    pub fn new(deadline: Deadline) -> Ticker {
        Ticker { deadline, n: 0, stopped: false }
    }

    /// One unit of work done; true once the deadline has passed.
    pub fn tick(&mut self) -> bool {
        if !self.stopped {
            self.n += 1;
            if self.n >= Self::EVERY {
                self.n = 0;
                self.stopped = self.deadline.passed();
            }
        }
        self.stopped
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }
}

/// The `incomplete_scan` flag.
pub fn incomplete(detail: String) -> ContentFlag {
    ContentFlag { kind: FlagKind::IncompleteScan, count: 1, detail, locations: vec![] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_late_in_the_collection_gets_what_is_left_of_the_stage() {
        let clock = Clock { stage_ends: Instant::now() + Duration::from_millis(10), spend: Spend::start() };
        let d = clock.file();
        assert_eq!(d.limit, Limit::Stage);
        assert!(d.reason("the CSV scan").contains("10 s for all files"));
        let clock = Clock::start(Spend::start());
        assert_eq!(clock.file().limit, Limit::File);
    }

    #[test]
    fn the_cpu_budget_stops_a_scan_whatever_its_time_and_says_so() {
        let spent = Spend::with_limit(Duration::ZERO);
        assert!(spent.out());
        let d = Clock::start(spent).file();
        assert!(d.passed() && d.over_budget());
        assert!(d.reason("the CSV scan").contains("judging budget"), "{}", d.reason("the CSV scan"));
        let fresh = Spend::with_limit(Duration::from_secs(3600));
        // Spinning the CPU is charged; the budget is not spent by it.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            std::hint::black_box(0u64);
        }
        assert!(fresh.spent() > Duration::ZERO && !fresh.out());
        assert!(!Clock::start(fresh).file().passed());
    }

    #[test]
    fn the_ticker_stops_within_one_batch_of_the_deadline() {
        let mut t = Ticker::new(Deadline::at(Instant::now()));
        let ticks = (0..10_000).take_while(|_| !t.tick()).count();
        assert_eq!(ticks, Ticker::EVERY as usize - 1);
        assert!(t.stopped() && t.tick());
        let mut t = Ticker::new(Deadline::from_now());
        assert!(!(0..10_000).any(|_| t.tick()));
    }
}
