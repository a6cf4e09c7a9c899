//! One accepted file, read once through its descriptor: sha256, a media type
//! sniffed from the content, content flags and a small summary.
//!
//! The file is streamed in 64 KiB chunks, never past the size checked when it
//! was accepted; the scanners that need the whole file (CSV cells, HTML/SVG
//! markup, line counts) run on every chunk, and only formats whose summary
//! needs more than the first chunk keep a bounded prefix in memory
//! ([`KEEP_BYTES`]). Zip-based Office files are then read by `ooxml` within
//! its own caps.
//!
//! Time: every scanner stops at the file's [`Deadline`] (checked per chunk
//! here, and inside the JSON, SVG and Office readers); the file is then
//! flagged `incomplete_scan`, and only the sha256 still reads to the end.

use std::io::{self, Read, Seek};

use crate::digest::Hasher;
use crate::result::{ContentFlag, FlagKind, Summary};

use super::budget::{incomplete, Deadline, KEEP_BYTES};
use super::csv::{CsvScan, Emit};
use super::image::{self, SvgCut};
use super::json::{self, Outcome};
use super::markup::MarkupScan;
use super::ooxml;
use super::rules::PastBudget;

const CHUNK: usize = 64 << 10;
const FIRST_LINES: usize = 5;
const LINE_CHARS: usize = 160;
/// Lines looked at to tell CSV/TSV from other text.
const SNIFF_LINES: usize = 20;

/// What [`inspect`] found.
pub(super) struct Inspection {
    pub sha256: String,
    pub bytes: u64,
    pub media_type: String,
    pub flags: Vec<ContentFlag>,
    pub summary: Option<Summary>,
    /// The delimiter when the file was scanned as CSV/TSV (for sanitising).
    pub csv_delimiter: Option<u8>,
}

/// What the first chunk says the file is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    Png,
    Jpeg,
    Gif,
    Webp,
    Pdf,
    Zip,
    Gzip,
    Json,
    Svg,
    Html,
    Xml,
    Csv(u8),
    Text,
    Binary,
}

impl Family {
    fn media_type(self) -> &'static str {
        match self {
            Family::Png => "image/png",
            Family::Jpeg => "image/jpeg",
            Family::Gif => "image/gif",
            Family::Webp => "image/webp",
            Family::Pdf => "application/pdf",
            Family::Zip => ooxml::ZIP,
            Family::Gzip => "application/gzip",
            Family::Json => "application/json",
            Family::Svg => "image/svg+xml",
            Family::Html => "text/html",
            Family::Xml => "application/xml",
            Family::Csv(b'\t') => "text/tab-separated-values",
            Family::Csv(_) => "text/csv",
            Family::Text => "text/plain",
            Family::Binary => "application/octet-stream",
        }
    }
}

/// The media types an extension promises, for the mismatch flag. Extensions
/// not listed promise nothing in particular.
fn promised(ext: &str) -> Option<&'static [&'static str]> {
    Some(match ext {
        "png" => &["image/png"],
        "jpg" | "jpeg" => &["image/jpeg"],
        "gif" => &["image/gif"],
        "webp" => &["image/webp"],
        "pdf" => &["application/pdf"],
        "svg" => &["image/svg+xml"],
        "json" => &["application/json"],
        "csv" => &["text/csv"],
        "tsv" => &["text/tab-separated-values"],
        "html" | "htm" => &["text/html"],
        "xlsx" => &["application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"],
        "pptx" => &["application/vnd.openxmlformats-officedocument.presentationml.presentation"],
        "docx" => &["application/vnd.openxmlformats-officedocument.wordprocessingml.document"],
        _ => return None,
    })
}

/// Why a file has no description.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unjudged {
    #[error("read: {0}")]
    Read(#[from] io::Error),
    /// The run's CPU budget ran out before this file was judged in full
    /// (`PastBudget::Refuse`): nothing more of it was read.
    #[error("the run's judging budget ran out after {read} of its bytes")]
    OverBudget { read: u64 },
}

/// Read `file` (already checked to be a regular file of `size` bytes) once,
/// and describe it, scanning until `deadline`. `ext` is the lowercased
/// extension. Past the run's CPU budget (in `deadline`), with `past` at
/// `Refuse`, reading stops and the file is [`Unjudged::OverBudget`]; at
/// `Flag`, only the hash reads on, as past a scanning time budget.
pub(super) fn inspect<R: Read + Seek>(
    file: &mut R,
    size: u64,
    ext: &str,
    deadline: Deadline,
    past: PastBudget,
) -> Result<Inspection, Unjudged> {
    let refuse_past_budget = past == PastBudget::Refuse;
    let mut hasher = Hasher::new();
    let mut head = Vec::with_capacity(CHUNK.min(size as usize));
    (&mut *file).take(CHUNK.min(size as usize) as u64).read_to_end(&mut head)?;
    let family = sniff(&head, size, ext);
    // Spreadsheets open .csv/.tsv by name, whatever the content: scan those too.
    let csv_delim = match (family, ext) {
        (Family::Csv(d), _) => Some(d),
        (_, "csv") => Some(b','),
        (_, "tsv") => Some(b'\t'),
        _ => None,
    };
    let mut csv = csv_delim.map(|d| CsvScan::new(d, Emit::Nothing));
    // Browsers open .html/.svg by name too.
    let markup = matches!(family, Family::Html | Family::Svg | Family::Xml) || matches!(ext, "html" | "htm" | "xhtml" | "svg");
    let mut markup = markup.then(MarkupScan::new);
    let keep_limit = match family {
        Family::Json | Family::Svg | Family::Jpeg => KEEP_BYTES,
        _ => 0,
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut lines = 0u64;
    let mut last = None;
    let mut total = 0u64;
    let mut chunk = head.clone();
    let mut buf = vec![0u8; CHUNK];
    // Set once the deadline passes: from then on only the hash reads on.
    let mut stopped = false;
    loop {
        if chunk.is_empty() {
            break;
        }
        if refuse_past_budget && deadline.over_budget() {
            return Err(Unjudged::OverBudget { read: total });
        }
        total += chunk.len() as u64;
        hasher.update(&chunk);
        if !stopped && deadline.passed() {
            stopped = true;
        }
        if stopped {
            let want = (size - total).min(CHUNK as u64) as usize;
            let n = if want == 0 { 0 } else { read_some(file, &mut buf[..want])? };
            chunk.clear();
            chunk.extend_from_slice(&buf[..n]);
            continue;
        }
        if let Some(c) = &mut csv {
            c.feed(&chunk);
        }
        if let Some(m) = &mut markup {
            m.feed(&chunk);
        }
        lines += memchr::memchr_iter(b'\n', &chunk).count() as u64;
        last = chunk.last().copied();
        if kept.len() < keep_limit {
            let room = keep_limit - kept.len();
            kept.extend_from_slice(&chunk[..room.min(chunk.len())]);
        }
        let want = (size - total).min(CHUNK as u64) as usize;
        let n = if want == 0 { 0 } else { read_some(file, &mut buf[..want])? };
        chunk.clear();
        chunk.extend_from_slice(&buf[..n]);
    }
    if total != size {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("read {total} of {size} bytes")).into());
    }
    if last.is_some_and(|b| b != b'\n') {
        lines += 1;
    }
    let mut media_type = family.media_type().to_string();
    let mut flags = Vec::new();
    let mut summary = None;
    if stopped {
        flags.push(incomplete(deadline.reason("the content scan")));
    }
    match family {
        Family::Png => summary = image::png_size(&head),
        Family::Gif => summary = image::gif_size(&head),
        Family::Jpeg => summary = image::jpeg_size(&kept),
        Family::Svg => {
            let (s, cut) = image::svg_size(&kept, deadline);
            summary = Some(s);
            match cut {
                Some(SvgCut::Depth) => flags.push(incomplete(format!(
                    "the SVG nests deeper than {} levels before its root element",
                    super::budget::MAX_XML_DEPTH
                ))),
                Some(SvgCut::Time) if !stopped => flags.push(incomplete(deadline.reason("reading the SVG"))),
                _ => {}
            }
        }
        // The scan stopped before the prefix was kept: say what it promises.
        Family::Json if stopped => summary = json::promised(&kept),
        Family::Json if size as usize > kept.len() => {
            // Too large to parse here: say what its first byte promises.
            summary = json::promised(&kept);
            flags.push(incomplete(format!("the JSON is larger than the {} MiB the jail parses", KEEP_BYTES >> 20)));
        }
        Family::Json => match json::summarise(&kept, deadline) {
            Outcome::Summary(s) => summary = Some(s),
            Outcome::Stopped(s) => {
                summary = Some(s);
                if !stopped {
                    flags.push(incomplete(deadline.reason("parsing the JSON")));
                }
            }
            Outcome::NotJson => {
                media_type = Family::Text.media_type().into();
                summary = Some(text_summary(&head, lines));
            }
        },
        Family::Zip if stopped => {}
        Family::Zip => {
            let office = ooxml::inspect(file, size, deadline);
            media_type = office.media_type.into();
            summary = office.summary;
            flags.extend(office.flags);
        }
        Family::Html | Family::Xml | Family::Text => summary = Some(text_summary(&head, lines)),
        Family::Csv(_) => {}
        Family::Webp | Family::Pdf | Family::Gzip | Family::Binary => {}
    }
    if let Some(c) = &mut csv {
        c.finish();
        if matches!(family, Family::Csv(_)) {
            summary = Some(Summary::Csv { rows: c.rows, columns: c.columns, header: c.header.clone() });
        }
        if c.flagged > 0 {
            flags.push(ContentFlag {
                kind: FlagKind::FormulaInjection,
                count: c.flagged,
                detail: format!(
                    "{} {} with =, +, -, @, tab or CR and would run as {}",
                    c.flagged,
                    if c.flagged == 1 { "cell starts" } else { "cells start" },
                    if c.flagged == 1 { "a formula" } else { "formulas" }
                ),
                locations: c.examples.clone(),
            });
        }
    }
    if let Some(m) = &markup {
        if m.hits > 0 {
            flags.push(ContentFlag {
                kind: FlagKind::Script,
                count: m.hits,
                detail: "active content: script elements, event handlers or script URLs".into(),
                locations: m.examples.clone(),
            });
        }
    }
    if let Some(expected) = promised(ext) {
        if !expected.contains(&media_type.as_str()) {
            flags.push(ContentFlag {
                kind: FlagKind::MediaTypeMismatch,
                count: 1,
                detail: format!("named .{ext} but the content is {media_type}"),
                locations: vec![],
            });
        }
    }
    if refuse_past_budget && deadline.over_budget() {
        // A summary (an Office file's parts, a JSON parse) was cut short
        // by the budget: not judged in full.
        return Err(Unjudged::OverBudget { read: total });
    }
    Ok(Inspection {
        sha256: hasher.finish_hex(),
        bytes: total,
        media_type,
        flags,
        summary,
        csv_delimiter: csv_delim,
    })
}

fn read_some<R: Read>(file: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match file.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The family from magic bytes, else from what the text looks like.
fn sniff(head: &[u8], size: u64, ext: &str) -> Family {
    let magic: &[(&[u8], Family)] = &[
        (b"\x89PNG\r\n\x1a\n", Family::Png),
        (b"\xff\xd8\xff", Family::Jpeg),
        (b"GIF87a", Family::Gif),
        (b"GIF89a", Family::Gif),
        (b"%PDF-", Family::Pdf),
        (b"PK\x03\x04", Family::Zip),
        (b"PK\x05\x06", Family::Zip),
        (b"\x1f\x8b", Family::Gzip),
    ];
    for (m, f) in magic {
        if head.starts_with(m) {
            return *f;
        }
    }
    if head.len() >= 12 && head.starts_with(b"RIFF") && &head[8..12] == b"WEBP" {
        return Family::Webp;
    }
    if !looks_like_text(head) {
        return Family::Binary;
    }
    let text = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let start = text.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(text.len());
    let body = &text[start..];
    if matches!(body.first(), Some(b'{' | b'[')) {
        return Family::Json;
    }
    if body.first() == Some(&b'<') {
        let lower = body[..body.len().min(4096)].to_ascii_lowercase();
        let has = |needle: &[u8]| lower.windows(needle.len()).any(|w| w == needle);
        if has(b"<svg") {
            return Family::Svg;
        }
        if has(b"<!doctype html") || has(b"<html") || has(b"<head") || has(b"<body") || has(b"<script") {
            return Family::Html;
        }
        if body.starts_with(b"<?xml") {
            return Family::Xml;
        }
    }
    let complete = size as usize == head.len();
    if let Some(d) = delimiter(text, complete) {
        return Family::Csv(d);
    }
    match ext {
        "csv" => Family::Csv(b','),
        "tsv" => Family::Csv(b'\t'),
        _ => Family::Text,
    }
}

/// UTF-8 without NUL bytes (a character cut at the end of the chunk is fine).
fn looks_like_text(head: &[u8]) -> bool {
    if head.contains(&0) {
        return false;
    }
    match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && head.len() - e.valid_up_to() < 4,
    }
}

/// Tab or comma, when every one of the first lines (at least two) has the
/// same number of them outside quotes, and at least one.
fn delimiter(text: &[u8], complete: bool) -> Option<u8> {
    let mut lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    if !complete || lines.last().is_some_and(|l| l.is_empty()) {
        // A chunk's last line may be cut short; an empty one is the final newline.
        lines.pop();
    }
    let lines: Vec<&[u8]> = lines.into_iter().filter(|l| !l.iter().all(u8::is_ascii_whitespace)).take(SNIFF_LINES).collect();
    if lines.len() < 2 {
        return None;
    }
    for d in [b'\t', b','] {
        let counts: Vec<usize> = lines
            .iter()
            .map(|l| {
                let mut quoted = false;
                l.iter()
                    .filter(|&&b| {
                        if b == b'"' {
                            quoted = !quoted;
                        }
                        b == d && !quoted
                    })
                    .count()
            })
            .collect();
        if counts[0] > 0 && counts.iter().all(|&c| c == counts[0]) {
            return Some(d);
        }
    }
    None
}

fn text_summary(head: &[u8], lines: u64) -> Summary {
    let text = String::from_utf8_lossy(head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head));
    let first_lines = text.lines().take(FIRST_LINES).map(|l| super::text::printable(l, LINE_CHARS)).collect();
    Summary::Text { lines, first_lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_bytes_win_over_the_name() {
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n....", 12, "csv"), Family::Png);
        assert_eq!(sniff(b"%PDF-1.7\n", 9, "txt"), Family::Pdf);
        assert_eq!(sniff(b"PK\x03\x04rest", 8, "xlsx"), Family::Zip);
        assert_eq!(sniff(b"\x00\x01\x02", 3, "txt"), Family::Binary);
    }

    #[test]
    fn text_is_told_apart_by_its_shape() {
        assert_eq!(sniff(b"  {\"a\": 1}", 10, "txt"), Family::Json);
        assert_eq!(sniff(b"<?xml version=\"1.0\"?>\n<svg width=\"3\"/>", 38, "xml"), Family::Svg);
        assert_eq!(sniff(b"<!DOCTYPE html><p>x", 19, "txt"), Family::Html);
        assert_eq!(sniff(b"a,b\n1,2\n\"x,y\",3\n", 16, "txt"), Family::Csv(b','));
        assert_eq!(sniff(b"a\tb\n1\t2\n", 8, "txt"), Family::Csv(b'\t'));
        assert_eq!(sniff(b"hello, world\nbye\n", 17, "txt"), Family::Text);
        assert_eq!(sniff(b"just one column\n=1\n", 19, "csv"), Family::Csv(b','));
    }

    #[test]
    fn utf8_cut_at_the_chunk_end_is_still_text() {
        let s = "caf\u{e9}".as_bytes();
        assert!(looks_like_text(&s[..s.len() - 1]));
        assert!(!looks_like_text(b"\xff\xfe"));
    }
}
