//! Fuzz target: the pool's request-line parser (pool/protocol.rs), which
//! reads what the pool's caller writes, code and paths an agent or a
//! service passes on from a model. Any bytes: no panic; an error is one
//! JSON line with a code from the protocol's list; a request that parses
//! names only absolute folders without `..`, and a wall limit within the
//! pool's.
#![no_main]

use std::path::{Component, Path};
use std::time::Duration;

use jail::pool::protocol::{parse_line, Ceilings, Line, Source};
use libfuzzer_sys::fuzz_target;

const CODES: [&str; 7] = [
    "malformed",
    "unknown_field",
    "bad_request",
    "limit_above_policy",
    "duplicate_id",
    "draining",
    "internal",
];

fn clean(p: &Path) -> bool {
    p.is_absolute() && !p.components().any(|c| matches!(c, Component::ParentDir))
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let ceilings = Ceilings { wall_time: Duration::from_secs(15) };
    match parse_line(&text, ceilings) {
        Err(e) => {
            assert!(CODES.contains(&e.code), "{}", e.code);
            let reply = e.reply();
            assert!(!reply.contains('\n'));
            let v: serde_json::Value = serde_json::from_str(&reply).expect("an error reply is JSON");
            assert_eq!(v["error"]["code"], e.code);
        }
        Ok(Line::Run(r)) => {
            assert!(r.wall_time > Duration::ZERO && r.wall_time <= ceilings.wall_time);
            assert!(r.input.iter().chain(&r.output).all(|p| clean(p)));
            if let Source::Script(p) = &r.source {
                assert!(clean(p));
            }
        }
        Ok(Line::Session(s)) => assert!(s.input.iter().chain(&s.output).all(|p| clean(p))),
        Ok(Line::Stats { .. }) => {}
        Ok(Line::Cancel { id }) => assert!(!id.is_empty() && !id.chars().any(char::is_control)),
    }
});
