//! `jail-serve` (also started as `jail serve`): a multi-tenant HTTP service
//! (axum on tokio) whose runs and sessions are each a `jail` process of
//! their own: the jail must fork from a single-threaded process, and a
//! crashing run cannot take the server down. Runs go to a warm pool (one
//! `jail pool` child, `--pool-size`) or, when the pool's jails cannot honour
//! them, to a `jail run` of their own; sessions likewise take a pooled jail
//! or a `jail session start` of their own. Runs die with the server
//! (PR_SET_PDEATHSIG; the pool's jails hold its lifeline), and a janitor
//! process removes the work folder and stops leftover sessions should the
//! server be killed.
//!
//! - `config`: flags and the tenants file; `state`: quotas, slots, ids.
//! - `api`: wire types and the JSON error; `runs`, `sessions`: handlers;
//!   `served`: what is kept of a tenant's session.
//! - `backend`: the seam where a run runs; `spawn` (`jail run --events`
//!   per run), `pool` (the warm pool's client and keeper), `route` (which
//!   of the two takes a run).
//! - `cancel`: a run's cancel (DELETE, or a waiting client that left);
//!   `artifacts`: an accepted artifact's bytes, of a run or a session.
//! - `input`: a run's or a session's input folder from `files` and
//!   `input_tar`, planned in memory and written without following a link.
//! - `metrics`: Prometheus text; `janitor`: cleanup after the server's death.
//! - `conn`: the HTTP connections (hyper) and their limits and timeouts;
//!   `files`: what is kept of a run on disk, read back a chunk at a time,
//!   and what a tenant sees of a result (no host path).
//! - `nest`: the server's own cgroup made the parent of every run's cgroup
//!   (`--no-nest-cgroup` turns it off).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod api;
mod artifacts;
mod backend;
mod cancel;
mod config;
mod conn;
mod files;
pub mod input;
mod janitor;
mod metrics;
mod nest;
mod pool;
mod route;
mod runs;
mod served;
mod server;
mod sessions;
mod spawn;
mod state;

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "jail serve",
    version,
    about = "Serve runs and sessions over HTTP, each in a fresh jail"
)]
struct Cli {
    #[command(flatten)]
    args: Option<config::ServeArgs>,
}

/// The binary's whole life: the server (its janitor is forked, janitor.rs).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.args {
        Some(args) => server::main(args),
        None => {
            eprintln!("jail serve: give --listen ADDR and --tokens FILE (`jail serve --help`)");
            ExitCode::from(jail::result::EXIT_SETUP_FAILED as u8)
        }
    }
}
