//! A step's rich results (Jupyter's display data), as the code's side
//! sends them on the control channel: one `display` line each, from the
//! cell driver (session/driver.py) or the script runner (runner.py), both
//! built on display.py. The lines are read bounded ([`Lines`]) and each
//! bundle is judged (artifacts/bundle.rs) before it is kept
//! ([`Collected`]). A session's cells (session/cells.rs) and one script
//! (script.rs) read them the same way.
//!
//! The code's own process writes these lines, so they are its word and
//! nothing more: a forged one is one more result of the same code, judged
//! as every other.

use serde::Deserialize;

use crate::artifacts::bundle::Judge;
use crate::result::DisplayResult;

/// The script runner: `python -c RUNNER SCRIPT ARGS` runs the script as
/// `python SCRIPT ARGS` would, its rich results sent on the control
/// channel: shown.py, display.py as its text `DISPLAY` (compiled on first
/// use), then runner.py. The cell driver is built the same way
/// (`session::DRIVER`, with driver.py last).
pub(crate) const RUNNER: &str =
    concat!(include_str!("shown.py"), "\nDISPLAY = r'''", include_str!("display.py"), "'''\n\n", include_str!("runner.py"));

/// The longest line read from the control channel; past it the line is
/// dropped up to its end. Room for an image at its cap in base64.
pub(crate) const MAX_LINE: usize = 4 << 20;

/// Whole lines out of what a channel gave, each at most [`MAX_LINE`].
#[derive(Debug, Default)]
pub(crate) struct Lines {
    buf: Vec<u8>,
    skipping: bool,
}

impl Lines {
    /// The lines `bytes` completes, without their newlines.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                if !std::mem::take(&mut self.skipping) {
                    lines.push(std::mem::take(&mut self.buf));
                }
                self.buf.clear();
            } else if !self.skipping {
                self.buf.push(b);
                if self.buf.len() > MAX_LINE {
                    // Bounded: an over-long line is dropped, not kept.
                    self.buf = Vec::new();
                    self.skipping = true;
                }
            }
        }
        lines
    }
}

/// One `display` line: `{"op": "display", "id": N, "nonce": "...",
/// "main": bool, "data": {MIME: ...}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct Display {
    op: String,
    /// The cell it belongs to (0 for a script).
    #[serde(default)]
    pub id: u64,
    /// The nonce of the cell's `exec` (empty for a script).
    #[serde(default)]
    pub nonce: String,
    /// The last expression's value, not a `display()` or a figure.
    #[serde(default)]
    pub main: bool,
    pub data: serde_json::Map<String, serde_json::Value>,
}

/// A `display` line, or `None` for any other line.
pub(crate) fn parse(line: &[u8]) -> Option<Display> {
    if line.len() > MAX_LINE || !line.starts_with(br#"{"op":"display""#) {
        return None;
    }
    serde_json::from_slice::<Display>(line).ok().filter(|d| d.op == "display")
}

/// One step's results as they come, each judged when it comes.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    judge: Judge,
    results: Vec<DisplayResult>,
}

impl Collected {
    pub(crate) fn take(&mut self, d: &Display) {
        if let Some(r) = self.judge.take(&d.data, d.main) {
            self.results.push(r);
        }
    }

    /// The results kept, and how many were dropped whole.
    pub(crate) fn finish(self) -> (Vec<DisplayResult>, u64) {
        let dropped = self.judge.dropped();
        (self.results, dropped)
    }
}

/// What a step's control channel comes to, read in these `pieces` as the
/// loops read it (script.rs, session/cells.rs, which also hold a cell's
/// lines to its id and nonce): the results kept, and how many were dropped
/// whole. The fuzz target's entry (fuzz/fuzz_targets/display_channel.rs).
pub fn read_channel<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> (Vec<DisplayResult>, u64) {
    let (mut lines, mut collected) = (Lines::default(), Collected::default());
    for piece in pieces {
        for line in lines.feed(piece) {
            if let Some(d) = parse(&line) {
                collected.take(&d);
            }
        }
    }
    collected.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_py_fits_in_the_raw_string_that_carries_it() {
        // r'''...''' holds it as written: no ''' inside, no backslash last.
        let text = include_str!("display.py");
        assert!(!text.contains("'''") && !text.trim_end().ends_with('\\'));
        assert!(RUNNER.contains("\nDISPLAY = r'''\"\"\"jail's rich results"));
        assert!(crate::session::DRIVER.contains("\nDISPLAY = r'''\"\"\"jail's rich results"));
    }

    #[test]
    fn lines_are_whole_and_bounded() {
        let mut l = Lines::default();
        assert_eq!(l.feed(b"ab"), Vec::<Vec<u8>>::new());
        assert_eq!(l.feed(b"c\nd\n"), vec![b"abc".to_vec(), b"d".to_vec()]);
        let long = vec![b'x'; MAX_LINE + 1];
        assert!(l.feed(&long).is_empty());
        // The over-long line is dropped up to its end; the next is whole.
        assert_eq!(l.feed(b"tail\nnext\n"), vec![b"next".to_vec()]);
    }

    #[test]
    fn only_display_lines_parse() {
        let d = parse(br#"{"op":"display","id":3,"nonce":"n","main":true,"data":{"text/plain":"2"}}"#).unwrap();
        assert_eq!((d.id, d.nonce.as_str(), d.main, d.data.len()), (3, "n", true, 1));
        assert!(parse(br#"{"op":"done","id":3}"#).is_none());
        assert!(parse(br#"{"op":"display","data":"x"}"#).is_none());
        assert!(parse(br#"{"op":"display","id":1}"#).is_none());
        let mut c = Collected::default();
        c.take(&d);
        let (results, dropped) = c.finish();
        assert_eq!((results.len(), dropped, results[0].is_main_result), (1, 0, true));
    }
}
