//! Fuzz target (a): the policy loader on arbitrary bytes never panics, and
//! every policy it accepts round-trips (written back out, it parses to the
//! same file and validates to the same policy). The contract itself is
//! `jail::policy::check_round_trip`, which unit tests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Err(e) = jail::policy::check_round_trip(&text, std::path::Path::new("/etc/jail")) {
        panic!("{e}");
    }
});
