//! THE client of `jail`: what every front end (the agent, the MCP server,
//! the service, the Python package's Rust side, the test harness) uses to
//! run a step, talk to a session or drive a pool, with one set of bounds.
//!
//! Built up by issue 35 in steps; `bounds` comes first so every reader
//! already takes its caps and grace periods from one place. `pool` is the
//! pool's wire, typed once: what a caller writes and reads, and what
//! `jail pool` itself parses and writes.

pub mod bounds;
pub mod pool;
