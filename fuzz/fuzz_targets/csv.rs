//! Fuzz target: the CSV/TSV scanner. The first byte picks the delimiter and
//! a chunk size; the scan stays within its fixed memory budget, gives the
//! same answer whatever the chunking, keeps at most 50 header cells and 5
//! examples, and its sanitised copy is the input plus one `'` per flagged
//! cell, nothing lost and nothing else added.
#![no_main]

use jail::artifacts::fuzzing::{csv, Parser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, text)) = data.split_first() else { return };
    let delimiter = if pick & 1 == 0 { b',' } else { b'\t' };
    let chunk = 1 + (pick >> 1) as usize;
    let whole = jail_fuzz::within_budget(Parser::Csv, text.len(), || {
        let found = csv(text, delimiter, text.len().max(1));
        // The report, not the sanitised copy, is what must stay small.
        (found.rows, found.columns, found.header, found.flagged, found.examples, found.sanitized.len())
    });
    let pieces = csv(text, delimiter, chunk);
    assert_eq!(
        (whole.0, whole.1, &whole.2, whole.3, &whole.4),
        (pieces.rows, pieces.columns, &pieces.header, pieces.flagged, &pieces.examples)
    );
    assert!(whole.2.len() <= 50 && whole.4.len() <= 5);
    assert_eq!(pieces.sanitized.len() as u64, text.len() as u64 + pieces.flagged);
    assert_eq!(whole.5, pieces.sanitized.len());
});
