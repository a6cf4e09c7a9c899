//! Neutralising formula cells in what the host receives
//! (`artifacts.formula_cells: "neutralise"`, the default).
//!
//! A CSV/TSV the artifact check flagged `formula_injection` is not handed
//! to the host as the script wrote it: it is streamed through the CSV
//! scanner, which puts a `'` before every cell a spreadsheet would run as a
//! formula (OWASP "CSV Injection"), straight into the file the host gets.
//! Memory is one chunk and the scanner's constant state; the output is at
//! most twice the input plus one byte (one `'` per flagged cell, and every
//! flagged cell has at least one byte and a delimiter), and the caller's
//! `limit` caps it exactly. The sha256 of what was written is computed on
//! the way, so the result describes the file the host holds.
//!
//! XLSX is not rewritten here: the artifact check refuses a flagged XLSX
//! under `neutralise` (`formula_cells`), because a bounded rewrite of a zip
//! package is a parser of its own and a refusal is the fail-closed answer.

use std::io::{self, Read, Write};
use std::time::Instant;

use crate::digest::Hasher;

use super::budget::Spend;
use super::csv::{CsvScan, Emit};

const CHUNK: usize = 64 << 10;

/// What the neutralised copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub bytes: u64,
    pub sha256: String,
    /// Cells given a `'`.
    pub cells: u64,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NeutraliseError {
    #[error("read the file")]
    Read(#[source] io::Error),
    #[error("write the neutralised copy")]
    Write(#[source] io::Error),
    #[error("the neutralised copy would be over {limit} bytes")]
    TooBig { limit: u64 },
    #[error("the run's deadline passed")]
    Deadline,
    /// The run's judging budget (`budget::JUDGING_CPU`) ran out.
    #[error("the run's judging budget ran out")]
    OverBudget,
}

/// Copy `size` bytes of `src` into `dst` with every formula cell
/// neutralised, writing at most `limit` bytes, before `deadline` and
/// within the run's judging budget `spend` (checked per 64 KiB).
pub(crate) fn neutralise(
    src: &mut impl Read,
    size: u64,
    delim: u8,
    dst: &mut impl Write,
    limit: u64,
    deadline: Instant,
    spend: Spend,
) -> Result<Written, NeutraliseError> {
    let mut scan = CsvScan::new(delim, Emit::SanitizedCopy);
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut reader = src.take(size);
    let mut written = 0u64;
    let mut emit = |out: Vec<u8>, written: &mut u64| -> Result<(), NeutraliseError> {
        *written += out.len() as u64;
        if *written > limit {
            return Err(NeutraliseError::TooBig { limit });
        }
        hasher.update(&out);
        dst.write_all(&out).map_err(NeutraliseError::Write)
    };
    loop {
        if Instant::now() >= deadline {
            return Err(NeutraliseError::Deadline);
        }
        if spend.out() {
            return Err(NeutraliseError::OverBudget);
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(NeutraliseError::Read(e)),
        };
        scan.feed(&buf[..n]);
        emit(scan.take_output(), &mut written)?;
    }
    scan.finish();
    emit(scan.take_output(), &mut written)?;
    dst.flush().map_err(NeutraliseError::Write)?;
    Ok(Written { bytes: written, sha256: hasher.finish_hex(), cells: scan.flagged })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run(text: &[u8], delim: u8, limit: u64) -> Result<(Vec<u8>, Written), NeutraliseError> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        let w = neutralise(&mut &text[..], text.len() as u64, delim, &mut out, limit, deadline, Spend::start())?;
        Ok((out, w))
    }

    #[test]
    fn formula_cells_get_a_quote_and_everything_else_stays_byte_for_byte() {
        let text = b"name,note,delta\r\nada,\"=HYPERLINK(\"\"http://evil/\"\")\",-3.5\r\nbob,@SUM(1),-2+3\r\n";
        let (out, w) = run(text, b',', 1 << 20).unwrap();
        assert_eq!(out, b"name,note,delta\r\nada,\"'=HYPERLINK(\"\"http://evil/\"\")\",-3.5\r\nbob,'@SUM(1),'-2+3\r\n");
        assert_eq!(w.cells, 3);
        assert_eq!(w.bytes, out.len() as u64);
        assert_eq!(w.sha256, crate::digest::sha256_hex(&out));
        let (tsv, w) = run(b"a\tb\n1\t=1+1\n", b'\t', 100).unwrap();
        assert_eq!((tsv.as_slice(), w.cells), (&b"a\tb\n1\t'=1+1\n"[..], 1));
    }

    #[test]
    fn the_output_is_capped_and_the_worst_case_doubles_at_most() {
        let text = b"=,=,=,=,=\n".repeat(1000);
        let (out, _) = run(&text, b',', 2 * text.len() as u64 + 1).unwrap();
        assert!(out.len() <= 2 * text.len() + 1);
        assert!(matches!(run(&text, b',', text.len() as u64), Err(NeutraliseError::TooBig { .. })));
    }

    #[test]
    fn a_passed_deadline_stops_the_copy() {
        let mut out = Vec::new();
        let r = neutralise(&mut &b"=1\n"[..], 3, b',', &mut out, 100, Instant::now(), Spend::start());
        assert!(matches!(r, Err(NeutraliseError::Deadline)));
    }

    #[test]
    fn a_spent_budget_stops_the_copy() {
        let mut out = Vec::new();
        let later = Instant::now() + Duration::from_secs(5);
        let r = neutralise(&mut &b"=1\n"[..], 3, b',', &mut out, 100, later, Spend::with_limit(Duration::ZERO));
        assert!(matches!(r, Err(NeutraliseError::OverBudget)));
    }
}
