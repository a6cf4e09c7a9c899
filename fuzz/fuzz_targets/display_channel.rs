//! Fuzz target: what a script sends on its control channel as rich
//! results (jail/src/display.rs, artifacts/bundle.rs), read by the
//! supervisor. Any bytes, in any split: no panic; the same results read
//! whole or in pieces; never more than the step's caps in count or bytes;
//! every kept PNG decodes to bytes that start with the PNG signature.
#![no_main]

use base64::Engine;
use jail::artifacts::bundle::{MAX_RESULTS, MAX_STEP_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(1, |b| usize::from(*b % 13) + 1);
    let whole = jail::display::read_channel(std::iter::once(data));
    assert_eq!(whole, jail::display::read_channel(data.chunks(split)));
    let (results, _) = &whole;
    assert!(results.len() <= MAX_RESULTS);
    let mut bytes = 0;
    for r in results {
        for (mime, v) in &r.data {
            match (mime.as_str(), v.as_str()) {
                ("image/png", Some(b64)) => {
                    let png = base64::engine::general_purpose::STANDARD.decode(b64).expect("a kept PNG is base64");
                    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a kept PNG is a PNG");
                    bytes += png.len();
                }
                (_, Some(s)) => bytes += s.len(),
                _ => bytes += serde_json::to_vec(v).unwrap().len(),
            }
        }
        assert!(serde_json::to_string(r).is_ok());
    }
    assert!(bytes <= MAX_STEP_BYTES, "{bytes} bytes kept");
});
