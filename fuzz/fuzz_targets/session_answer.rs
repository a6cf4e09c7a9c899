//! Fuzz target: a session's reply as its one client reads it
//! (client/session.rs, `Reply`): event lines, then the answer line, which
//! the session supervisor makes from what a script printed. Any bytes, in
//! any split: no panic; every line handed on as an event is one JSON
//! object with a `type`; the bytes read whole or in pieces come to the
//! same end with the same events; a line over the cap ends the reading.
#![no_main]

use std::collections::HashMap;

use jail::client::session::{Heard, Reply};
use serde_json::value::RawValue;
use libfuzzer_sys::fuzz_target;

/// A small cap, so that inputs reach it.
const MAX: usize = 256;

fn read<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> (Heard, Vec<String>) {
    let (mut reply, mut events) = (Reply::within(MAX), Vec::new());
    for p in pieces {
        if reply.done() {
            break;
        }
        reply.feed(p, &mut |e| events.push(e.to_owned()));
    }
    (reply.end(&mut |e| events.push(e.to_owned())), events)
}

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(1, |b| usize::from(*b % 7) + 1);
    let whole = read(std::iter::once(data));
    assert_eq!(whole, read(data.chunks(split)));
    for e in &whole.1 {
        assert!(e.len() <= MAX);
        // An object with a `type`, as JSON's grammar reads it (a number
        // past f64's range is JSON, if no `Value`).
        let fields: HashMap<String, &RawValue> = serde_json::from_str(e).expect("an event is a JSON object");
        assert!(fields.get("type").is_some_and(|t| t.get() != "null"), "{e}");
    }
    if let Heard::Answer(a) = &whole.0 {
        assert!(serde_json::to_string(a).is_ok());
    }
});
