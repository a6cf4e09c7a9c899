//! The summarisers' budgets: how much time one artifact's scan may take, how
//! much of the whole collection's, and how much memory each summariser may
//! hold, as fixed numbers (not policy) checked by the code that spends them.
//!
//! Pipeline position: [`Clock::start`] runs once at the start of
//! `artifacts::collect`; each accepted file gets a [`Deadline`] from it, and
//! every scanner checks that deadline as it goes (per 64 KiB chunk, per
//! batch of XML events, per JSON value). Past it the scanner stops where it
//! is and the file is flagged `incomplete_scan` with the reason; the sha256
//! is still computed over every byte (its time is bounded by
//! `artifacts.max_total_bytes`, not by these budgets).
//!
//! Memory is bounded by construction rather than measured: every buffer a
//! summariser keeps has a cap below, and the fuzz targets in `fuzz/` check
//! the peak heap of each parse against [`memory_budget`].

use std::time::{Duration, Instant};

use crate::result::{ContentFlag, FlagKind};

/// Scanning time one file may take.
pub const FILE_SCAN_TIME: Duration = Duration::from_secs(2);
/// Scanning time all files of one collection may take together.
pub const STAGE_SCAN_TIME: Duration = Duration::from_secs(10);

/// Deepest element nesting an XML/SVG reader follows; deeper, it stops.
pub const MAX_XML_DEPTH: usize = 256;
/// Attributes read from one XML element (the ones we want come first in
/// every writer we know; a tag with a million attributes is not walked).
pub const MAX_XML_ATTRIBUTES: usize = 32;
/// Deepest JSON nesting followed (serde_json's own recursion limit).
pub const MAX_JSON_DEPTH: usize = 128;

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
        Parser::Image | Parser::Json => FIXED + 2 * input_bytes.min(super::inspect::KEEP_BYTES),
    }
}

/// Why a scan stopped short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// This file's own time.
    File,
    /// The whole collection's time.
    Stage,
}

/// The collection's scanning clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    stage_ends: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock { stage_ends: Instant::now() + STAGE_SCAN_TIME }
    }

    /// The deadline of the file whose scan starts now.
    pub fn file(&self) -> Deadline {
        let file_ends = Instant::now() + FILE_SCAN_TIME;
        if file_ends <= self.stage_ends {
            Deadline { at: file_ends, limit: Limit::File }
        } else {
            Deadline { at: self.stage_ends, limit: Limit::Stage }
        }
    }
}

/// When one file's scan must stop.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Limit,
}

impl Deadline {
    /// A deadline at `at` (tests and fuzz targets).
    pub fn at(at: Instant) -> Deadline {
        Deadline { at, limit: Limit::File }
    }

    /// A deadline of [`FILE_SCAN_TIME`] from now.
    pub fn from_now() -> Deadline {
        Deadline::at(Instant::now() + FILE_SCAN_TIME)
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The `incomplete_scan` line for a scan this deadline stopped.
    pub fn reason(&self, what: &str) -> String {
        match self.limit {
            Limit::File => format!("{what} stopped at the scan's time budget ({} s per file)", FILE_SCAN_TIME.as_secs()),
            Limit::Stage => {
                format!("{what} stopped at the artifact check's time budget ({} s for all files)", STAGE_SCAN_TIME.as_secs())
            }
        }
    }
}

/// Counts work between looks at the clock: `Instant::now` per XML event
/// would cost more than the event.
#[derive(Debug)]
pub struct Ticker {
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
        let clock = Clock { stage_ends: Instant::now() + Duration::from_millis(10) };
        let d = clock.file();
        assert_eq!(d.limit, Limit::Stage);
        assert!(d.reason("the CSV scan").contains("10 s for all files"));
        let clock = Clock::start();
        assert_eq!(clock.file().limit, Limit::File);
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
