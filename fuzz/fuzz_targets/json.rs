//! Fuzz target: the JSON summary, within its budget (at most one copy of
//! the input beyond fixed state: no value tree), against serde_json's own
//! `Value` as the reference: whenever that parses to an object or array,
//! our summary has the same type and count (members for an object, whose
//! duplicates a map would merge), and the keys are the map's first 50.
#![no_main]

use jail::artifacts::fuzzing::{json, Deadline, Parser};
use jail::result::Summary;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ours = jail_fuzz::within_budget(Parser::Json, data.len(), || json(data, Deadline::from_now()));
    let text = data.strip_prefix(b"\xef\xbb\xbf").unwrap_or(data);
    let reference: Option<serde_json::Value> = serde_json::from_slice(text).ok();
    match (&ours, &reference) {
        (Some(Summary::Json { top_level, length, keys, partial: false }), Some(v)) => match v {
            serde_json::Value::Array(a) => assert_eq!((top_level.as_str(), *length), ("array", Some(a.len() as u64))),
            serde_json::Value::Object(m) => {
                assert_eq!(top_level, "object");
                assert!(length.is_some_and(|n| n >= m.len() as u64));
                let first: Vec<&String> = m.keys().take(50).collect();
                assert_eq!(keys.len(), first.len());
                for (k, r) in keys.iter().zip(first) {
                    assert!(k == r || k.ends_with('…') || k.contains('\\'), "{k:?} vs {r:?}");
                }
            }
            other => panic!("we summarised a scalar: {other:?}"),
        },
        (Some(Summary::Json { .. }), None) => {} // deeper than serde_json's recursion limit
        (None, Some(v)) => assert!(!v.is_object() && !v.is_array(), "not summarised: {v:?}"),
        (None, None) => {}
        (Some(other), _) => panic!("a JSON summary of another kind: {other:?}"),
    }
});
