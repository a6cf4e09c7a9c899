//! Fuzz target: `jail serve`'s `input_tar` planner (serve/src/input.rs),
//! which reads a client's tar (plain or gzip) into the list of files and
//! folders to write. Any bytes: no panic, and within its budgets (the
//! counting allocator's peak, the time). Whatever it accepts is only
//! regular files and folders, each path relative, with no `.`, `..`,
//! empty or control-character component, no deeper than its bound, named
//! once, every folder before what it holds, the bytes and entries within
//! their bounds.
#![no_main]

use std::collections::HashSet;
use std::time::Duration;

use jail_serve::input::{plan_archive, Bounds, Item};
use libfuzzer_sys::fuzz_target;

const BOUNDS: Bounds = Bounds { bytes: 64 << 10, entries: 64, depth: 8, time: Duration::from_secs(2) };

fuzz_target!(|data: &[u8]| {
    // Files are held in memory (at most the byte bound); the stream's
    // buffers and a gzip window besides; the input itself.
    let budget = 8 << 20;
    let Ok(plan) = jail_fuzz::within(budget, BOUNDS.time + Duration::from_secs(1), || plan_archive(data, &BOUNDS)) else {
        return;
    };
    assert!(plan.items.len() <= BOUNDS.entries, "{} entries", plan.items.len());
    assert!(plan.bytes() <= BOUNDS.bytes, "{} bytes", plan.bytes());
    let mut dirs = HashSet::new();
    let mut seen = HashSet::new();
    let mut bytes = 0u64;
    for item in &plan.items {
        let (path, is_dir) = match item {
            Item::Dir(p) => (p, true),
            Item::File(p, b) => {
                bytes += b.len() as u64;
                (p, false)
            }
        };
        let parts: Vec<&str> = path.split('/').collect();
        assert!(parts.len() <= BOUNDS.depth, "{path:?} too deep");
        for part in &parts {
            assert!(!part.is_empty() && *part != "." && *part != "..", "{path:?} has a bad component");
            assert!(!part.chars().any(char::is_control), "{path:?} has a control character");
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            assert!(dirs.contains(parent), "{path:?} comes before its folder");
        }
        assert!(seen.insert(path.clone()), "{path:?} planned twice");
        if is_dir {
            dirs.insert(path.clone());
        }
    }
    assert_eq!(bytes, plan.bytes());
});
