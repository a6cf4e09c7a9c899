//! Reading what `jail` prints: one bounded NDJSON line reader for every
//! client (sans-IO: it is fed bytes, so a thread over a pipe and a tokio
//! task over its own pipe use the same one), and one `result_of` that
//! reads a result document as ours.
//!
//! What `jail` prints is made from what a script wrote, so the reader holds
//! at most `max` bytes of a line however long it is: a longer line is
//! counted, never kept. Lines are split at `\n`, which never occurs inside
//! a UTF-8 character, so a character split between two reads comes whole.

use std::io::Read;

use crate::events::{Event, RESULT_PREFIX};
use crate::result::RunResult;

/// A line buffer kept between lines at most: a long line's buffer is not
/// kept for the short ones after it.
const SMALL_LINE: usize = 256 << 10;

/// One line as the reader took it.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A line, its newline dropped, of at most `max` bytes.
    Whole(&'a [u8]),
    /// A line over `max` bytes: read and dropped.
    TooLong,
}

/// A bounded NDJSON reader: `feed` it bytes as they come, `finish` it at
/// the end of the stream.
#[derive(Debug)]
pub struct Lines {
    buf: Vec<u8>,
    max: usize,
    /// The line in progress passed `max`: the rest of it is skipped.
    over: bool,
}

impl Lines {
    /// A reader keeping at most `max` bytes of one line.
    pub fn new(max: usize) -> Lines {
        Lines { buf: Vec::new(), max, over: false }
    }

    /// Take `bytes`; `each` is called for every line they end.
    pub fn feed(&mut self, mut bytes: &[u8], mut each: impl FnMut(Line<'_>)) {
        while !bytes.is_empty() {
            let (part, ends) = match memchr::memchr(b'\n', bytes) {
                Some(at) => (&bytes[..at], Some(at + 1)),
                None => (bytes, None),
            };
            // A whole line within this read, nothing held: no copy.
            if ends.is_some() && self.buf.is_empty() && !self.over && part.len() <= self.max {
                each(Line::Whole(part));
            } else {
                self.take(part);
                if ends.is_some() {
                    self.end_line(&mut each);
                }
            }
            bytes = match ends {
                Some(next) => &bytes[next..],
                None => &[],
            };
        }
    }

    /// Whether the line in progress is already over `max` (a caller that
    /// wants no more of it stops reading here).
    pub fn over(&self) -> bool {
        self.over
    }

    /// The stream ended: a last line without its newline is a line too.
    pub fn finish(mut self, mut each: impl FnMut(Line<'_>)) {
        if self.over || !self.buf.is_empty() {
            self.end_line(&mut each);
        }
    }

    fn take(&mut self, part: &[u8]) {
        if self.over {
            return;
        }
        if self.buf.len() + part.len() > self.max {
            self.over = true;
            self.buf = Vec::new();
        } else {
            self.buf.extend_from_slice(part);
        }
    }

    fn end_line(&mut self, each: &mut impl FnMut(Line<'_>)) {
        if std::mem::take(&mut self.over) {
            each(Line::TooLong);
        } else {
            each(Line::Whole(&self.buf));
        }
        self.buf.clear();
        if self.buf.capacity() > SMALL_LINE {
            self.buf = Vec::new();
        }
    }
}

/// Feed everything `r` gives to `lines` until its end (or a read error,
/// taken as the end).
pub fn read_to_end(mut r: impl Read, mut lines: Lines, mut each: impl FnMut(Line<'_>)) {
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => lines.feed(&chunk[..n], &mut each),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    lines.finish(each);
}

/// Whether a whole line is the result event (the last line of `--events`).
pub fn is_result(line: &[u8]) -> bool {
    line.starts_with(RESULT_PREFIX)
}

/// One line of `jail run --events` read as what it says.
#[derive(Debug)]
pub enum Seen {
    Event(Event<'static>),
    Result(Box<Result<RunResult, ResultError>>),
    /// Over the cap, or not an event this client knows: counted.
    Dropped,
}

/// Read one line of `jail run --events` (or of a session cell's events).
pub fn seen(line: Line<'_>) -> Seen {
    let Line::Whole(text) = line else { return Seen::Dropped };
    if is_result(text) {
        #[derive(serde::Deserialize)]
        struct Doc {
            result: serde_json::Value,
        }
        return match serde_json::from_slice::<Doc>(text) {
            Ok(doc) => Seen::Result(Box::new(result_of(doc.result))),
            Err(e) => Seen::Result(Box::new(Err(ResultError::Contract(e.to_string())))),
        };
    }
    match serde_json::from_slice::<Event<'static>>(text) {
        Ok(event) => Seen::Event(event),
        Err(_) => Seen::Dropped,
    }
}

/// Why a result document is not read as ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    /// Another schema version: its fields may not mean what ours do.
    #[error("{0}")]
    Version(String),
    /// This version, but not our `RunResult`.
    #[error("{0}")]
    Contract(String),
}

/// A result document read as ours: the schema version checked first
/// (jail/src/schema.rs), then the type.
pub fn result_of(doc: serde_json::Value) -> Result<RunResult, ResultError> {
    crate::schema::check_version(&doc).map_err(|e| ResultError::Version(e.to_string()))?;
    serde_json::from_value(doc).map_err(|e| ResultError::Contract(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(max: usize, reads: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        let mut got = Vec::new();
        let mut each = |l: Line<'_>| {
            got.push(match l {
                Line::Whole(b) => Some(b.to_vec()),
                Line::TooLong => None,
            })
        };
        let mut lines = Lines::new(max);
        for r in reads {
            lines.feed(r, &mut each);
        }
        lines.finish(&mut each);
        got
    }

    #[test]
    fn a_line_over_the_cap_is_counted_and_the_next_is_read_whole() {
        let long = vec![b'x'; 100];
        let mut stream = b"short\n".to_vec();
        stream.extend(&long);
        stream.extend(b"\nafter\n");
        // Whole in one read, and a byte at a time: the same lines.
        assert_eq!(lines_of(10, &[&stream]), vec![Some(b"short".to_vec()), None, Some(b"after".to_vec())]);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(lines_of(10, &bytes), vec![Some(b"short".to_vec()), None, Some(b"after".to_vec())]);
    }

    #[test]
    fn a_line_of_the_cap_is_kept_and_one_byte_more_is_cut() {
        assert_eq!(lines_of(5, &[b"12345\n"]), vec![Some(b"12345".to_vec())]);
        assert_eq!(lines_of(5, &[b"123", b"45\n"]), vec![Some(b"12345".to_vec())]);
        assert_eq!(lines_of(5, &[b"123456\n"]), vec![None]);
        assert_eq!(lines_of(5, &[b"123", b"456\n"]), vec![None]);
        // The cut line is not held: the reader keeps nothing of it.
        let mut lines = Lines::new(5);
        lines.feed(b"123456789", |_| {});
        assert!(lines.over && lines.buf.capacity() == 0);
    }

    #[test]
    fn a_character_split_between_reads_comes_whole() {
        let line = "{\"type\":\"stdout\",\"data\":\"a☃b\"}\n".as_bytes();
        let at = line.iter().position(|&b| b == 0xE2).unwrap() + 1;
        let got = lines_of(1 << 10, &[&line[..at], &line[at..]]);
        assert_eq!(got, vec![Some(line[..line.len() - 1].to_vec())]);
        let Seen::Event(Event::Stdout { data, .. }) = seen(Line::Whole(got[0].as_deref().unwrap())) else {
            panic!()
        };
        assert_eq!(data, "a☃b");
    }

    #[test]
    fn a_last_line_without_its_newline_is_a_line() {
        assert_eq!(lines_of(10, &[b"one\ntwo"]), vec![Some(b"one".to_vec()), Some(b"two".to_vec())]);
        assert_eq!(lines_of(2, &[b"one\ntwo"]), vec![None, None]);
        assert_eq!(lines_of(10, &[b"one\n"]), vec![Some(b"one".to_vec())]);
        assert_eq!(lines_of(10, &[b""]), Vec::<Option<Vec<u8>>>::new());
    }

    #[test]
    fn read_to_end_reads_a_stream_through_the_same_reader() {
        let mut got = Vec::new();
        read_to_end(&b"a\nbb\nccc"[..], Lines::new(2), |l| got.push(matches!(l, Line::Whole(_))));
        assert_eq!(got, vec![true, true, false]);
    }

    #[test]
    fn what_the_jail_writes_is_what_a_client_reads() {
        let event = Event::Stderr { data: "oops\n".into(), base64: None };
        let text = serde_json::to_vec(&event).unwrap();
        let Seen::Event(back) = seen(Line::Whole(&text)) else { panic!() };
        assert_eq!(back, event);
        let truncated = br#"{"type":"truncated","stream":"stdout","limit_bytes":8}"#;
        assert!(matches!(seen(Line::Whole(truncated)), Seen::Event(Event::Truncated { limit_bytes: 8, .. })));
        assert!(matches!(seen(Line::Whole(b"{\"type\":\"new\"}")), Seen::Dropped));
        assert!(matches!(seen(Line::TooLong), Seen::Dropped));
    }

    #[test]
    fn a_result_of_another_version_is_refused_before_its_type_is_read() {
        let line = br#"{"type":"result","result":{"schema_version":999,"status":"ok"}}"#;
        let Seen::Result(r) = seen(Line::Whole(line)) else { panic!() };
        assert!(matches!(*r, Err(ResultError::Version(_))));
        let this = format!(r#"{{"type":"result","result":{{"schema_version":{}}}}}"#, crate::result::SCHEMA_VERSION);
        let Seen::Result(r) = seen(Line::Whole(this.as_bytes())) else { panic!() };
        assert!(matches!(*r, Err(ResultError::Contract(_))));
    }
}
