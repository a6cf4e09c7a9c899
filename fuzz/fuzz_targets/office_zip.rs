//! Fuzz target: zip-based Office files. Every input is summarised within
//! the Office budgets (`jail_fuzz::within_budget`), the summary stays within
//! its caps, and whenever our directory check accepts an archive the zip
//! crate reads no more entries than the check counted: the crate sees the
//! directory we bounded, not another one it could fall back to.
#![no_main]

use std::io::Cursor;

use jail::artifacts::fuzzing::{office, zip_directory, Deadline, Parser};
use jail::result::Summary;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let described = jail_fuzz::within_budget(Parser::Office, data.len(), || office(data, Deadline::from_now()));
    match &described.summary {
        Some(Summary::Xlsx { sheets, .. }) => assert!(sheets.len() <= 64),
        Some(Summary::Pptx { titles, .. }) => assert!(titles.len() <= 100),
        Some(other) => panic!("an Office summary of another kind: {other:?}"),
        None => {}
    }
    assert!(described.flags.len() <= 4, "{:?}", described.flags);
    if let Some(entries) = zip_directory(data) {
        assert!(entries <= 10_000);
        if let Ok(zip) = zip::ZipArchive::new(Cursor::new(data)) {
            assert!(zip.len() as u64 <= entries, "the zip crate read {} entries, our check counted {entries}", zip.len());
        }
    }
});
