//! Fuzz target: SVG/HTML/XML markup. The active-content scanner stays in
//! its fixed budget and finds the same hits whatever the chunking (a tag cut
//! between two 64 KiB reads is still seen); the whole inspection of the
//! bytes named `.svg` (sniffing, markup scan, XML size reader, JSON or CSV
//! if that is what they are) ends within the scan time and flags at most a
//! handful of kinds.
#![no_main]

use std::time::{Duration, Instant};

use jail::artifacts::fuzzing::{describe, markup, Deadline, Parser, FILE_SCAN_TIME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, text)) = data.split_first() else { return };
    let whole = jail_fuzz::within_budget(Parser::Markup, text.len(), || markup(text, text.len().max(1)));
    let pieces = markup(text, 1 + pick as usize);
    assert_eq!(whole, pieces);
    assert!(whole.1.len() <= 5);
    let ext = if pick & 1 == 0 { "svg" } else { "html" };
    let started = Instant::now();
    let d = describe(text, ext, Deadline::from_now());
    assert!(started.elapsed() <= FILE_SCAN_TIME + Duration::from_secs(1), "{:?}", started.elapsed());
    assert!(d.flags.len() <= 5, "{:?}", d.flags);
});
