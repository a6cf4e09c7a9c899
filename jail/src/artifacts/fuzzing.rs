//! Entry points for the cargo-fuzz targets in `fuzz/`, one per summariser:
//! not an API for anything else. Each runs one parser over bytes in memory,
//! within the same budgets a real artifact gets, and returns what the
//! result would carry, so a target can check the output's bounds too.

use std::io::Cursor;

pub use super::budget::{memory_budget, Deadline, Parser, FILE_SCAN_TIME};
use super::csv::{CsvScan, Emit};
use super::markup::MarkupScan;
use crate::result::{ContentFlag, Summary};

/// The parts of an artifact's description the summarisers make.
#[derive(Debug)]
pub struct Described {
    pub media_type: String,
    pub summary: Option<Summary>,
    pub flags: Vec<ContentFlag>,
}

/// The whole of `inspect` (sniffing, scanners, summaries) over `bytes`
/// named with extension `ext`.
pub fn describe(bytes: &[u8], ext: &str, deadline: Deadline) -> Described {
    let mut file = Cursor::new(bytes);
    match super::inspect::inspect(&mut file, bytes.len() as u64, ext, deadline, super::PastBudget::Flag) {
        Ok(i) => Described { media_type: i.media_type, summary: i.summary, flags: i.flags },
        Err(e) => Described { media_type: format!("error: {e}"), summary: None, flags: vec![] },
    }
}

/// A zip-based Office file, directory check included.
pub fn office(bytes: &[u8], deadline: Deadline) -> Described {
    let o = super::ooxml::inspect(&mut Cursor::new(bytes), bytes.len() as u64, deadline);
    Described { media_type: o.media_type.into(), summary: o.summary, flags: o.flags }
}

/// What the CSV/TSV scanner found, and its sanitised copy.
#[derive(Debug)]
pub struct CsvFound {
    pub rows: u64,
    pub columns: u64,
    pub header: Vec<String>,
    pub flagged: u64,
    pub examples: Vec<String>,
    pub sanitized: Vec<u8>,
}

/// The CSV/TSV scanner fed `bytes` in chunks of `chunk` bytes.
pub fn csv(bytes: &[u8], delimiter: u8, chunk: usize) -> CsvFound {
    let mut s = CsvScan::new(delimiter, Emit::SanitizedCopy);
    let mut sanitized = Vec::new();
    for c in bytes.chunks(chunk.max(1)) {
        s.feed(c);
        sanitized.extend(s.take_output());
    }
    s.finish();
    sanitized.extend(s.take_output());
    CsvFound {
        rows: s.rows,
        columns: s.columns,
        header: s.header,
        flagged: s.flagged,
        examples: s.examples,
        sanitized,
    }
}

/// The HTML/SVG active-content scanner fed in chunks: hits and examples.
pub fn markup(bytes: &[u8], chunk: usize) -> (u64, Vec<String>) {
    let mut m = MarkupScan::new();
    for c in bytes.chunks(chunk.max(1)) {
        m.feed(c);
    }
    (m.hits, m.examples)
}

/// Every image header reader over the same bytes: PNG, GIF, JPEG, SVG.
pub fn images(bytes: &[u8], deadline: Deadline) -> Vec<Option<Summary>> {
    vec![
        super::image::png_size(bytes),
        super::image::gif_size(bytes),
        super::image::jpeg_size(bytes),
        Some(super::image::svg_size(bytes, deadline).0),
    ]
}

/// The JSON summary of `bytes` (`None`: not JSON after all).
pub fn json(bytes: &[u8], deadline: Deadline) -> Option<Summary> {
    match super::json::summarise(bytes, deadline) {
        super::json::Outcome::Summary(s) | super::json::Outcome::Stopped(s) => Some(s),
        super::json::Outcome::NotJson => None,
    }
}

/// The entry count `zipdir` accepts the archive with, or `None` when it
/// refuses it (the target then checks the zip crate agrees on the count).
pub fn zip_directory(bytes: &[u8]) -> Option<u64> {
    super::zipdir::check(&mut Cursor::new(bytes), bytes.len() as u64).ok().map(|d| d.entries)
}
