//! THE client of `jail`: what every front end (the agent, the MCP server,
//! the service, the Python package's Rust side, the test harness) uses to
//! run a step, talk to a session or drive a pool, with one set of bounds.
//!
//! Built up by issue 35 in steps; `bounds` comes first so every reader
//! already takes its caps and grace periods from one place.
//!
//! - `bounds`: the caps and grace periods.
//! - `command`: a `jail run`, `jail session start` or `jail pool` command
//!   line from a typed spec.
//! - `group`: stopping a started `jail` (SIGTERM, SIGKILL after a grace).
//! - `lines`: THE bounded line reader (sans IO), for every reader of what `jail`
//!   prints and of what a pool is sent.
//! - `events`: each `--events` line read as what it says, and `result_of`.
//! - `run`: `spawn` a `RunSpec`, `Running::wait` for its result.
//! - `session`: a session's socket protocol, typed once, and its one
//!   client (exec, live exec, stop, interrupt, adoption, each with a
//!   deadline; typed answers and errors), and `start`.
//! - `pool`: the pool's wire, typed once: what a caller writes and reads,
//!   and what `jail pool` itself parses and writes.
//! - `pool_child`: one `jail pool` as a child, spoken to on threads.

pub mod bounds;
pub mod command;
pub mod events;
pub mod group;
pub mod lines;
pub mod pool;
pub mod pool_child;
pub mod run;
pub mod session;
