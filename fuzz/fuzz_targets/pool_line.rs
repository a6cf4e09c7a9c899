//! Fuzz target: the pool's wire (client/pool.rs) both ways. A request line
//! is what the pool's caller writes, code and paths an agent or a service
//! passes on from a model; a reply line is what a client reads of a pool
//! that runs that code. Any bytes: no panic; an error is one JSON line
//! with a code from the protocol's list that reads back as written; a
//! request that parses names only absolute folders without `..`, a wall
//! limit within the pool's, and writes a line that parses back to itself;
//! a reply that parses writes a line that parses back to it; the bounded
//! reader keeps at most its bound of any line.
#![no_main]

use std::path::{Component, Path};
use std::time::Duration;

use jail::client::lines::{read_line, Lines, Read};
use jail::client::pool::{Ceilings, ErrorCode, Line, Reply, Source};
use libfuzzer_sys::fuzz_target;

const CODES: [ErrorCode; 4] = [ErrorCode::Malformed, ErrorCode::UnknownField, ErrorCode::BadRequest, ErrorCode::LimitAbovePolicy];

fn clean(p: &Path) -> bool {
    p.is_absolute() && !p.components().any(|c| matches!(c, Component::ParentDir))
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let ceilings = Ceilings { wall_time: Duration::from_secs(15) };
    match Line::parse(&text, ceilings) {
        Err(e) => {
            assert!(CODES.contains(&e.code), "{}", e.code);
            let reply = e.clone().reply();
            let line = reply.text();
            assert!(!line.contains('\n'));
            assert_eq!(Reply::parse(line.as_bytes()).expect("an error reply reads back"), reply);
        }
        Ok(line) => {
            match &line {
                Line::Run(r) => {
                    assert!(r.wall_time > Duration::ZERO && r.wall_time <= ceilings.wall_time);
                    assert!(r.input.iter().chain(&r.output).all(|p| clean(p)));
                    if let Source::Script(p) = &r.source {
                        assert!(clean(p));
                    }
                }
                Line::Session(s) => assert!(s.input.iter().chain(&s.output).all(|p| clean(p))),
                Line::Stats { .. } => {}
                Line::Cancel { id } => assert!(!id.is_empty() && !id.chars().any(char::is_control)),
            }
            // What a caller writes for it says the same. A wall time is
            // written in seconds, so it comes back within a nanosecond.
            let again = Line::parse(&line.text(), ceilings).expect("a written line parses");
            match (&line, again) {
                (Line::Run(a), Line::Run(b)) => {
                    assert!(a.wall_time.abs_diff(b.wall_time) <= Duration::from_nanos(1));
                    assert_eq!(Line::Run(a.clone()), Line::Run(jail::client::pool::Request { wall_time: a.wall_time, ..b }));
                }
                (a, b) => assert_eq!(a, &b),
            }
        }
    }
    if let Ok(reply) = Reply::parse(data) {
        let line = reply.text();
        assert!(!line.contains('\n'));
        assert_eq!(Reply::parse(line.as_bytes()).expect("a written reply reads back"), reply);
    }
    let mut lines = Lines::new(64);
    let mut r = std::io::BufReader::with_capacity(7, data);
    while let Ok(Read::Whole | Read::TooLong) = read_line(&mut r, &mut lines) {
        assert!(lines.line().len() <= 64 && !lines.line().contains(&b'\n'));
    }
});
