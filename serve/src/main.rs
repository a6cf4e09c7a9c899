//! `jail-serve` (also started as `jail serve`): a multi-tenant HTTP service
//! (axum on tokio) whose runs and sessions are each a `jail` process of
//! their own: the jail must fork from a single-threaded process, and a
//! crashing run cannot take the server down. Runs die with the server
//! (PR_SET_PDEATHSIG), and a janitor process removes the work folder and
//! stops leftover sessions should the server be killed.
//!
//! - `config`: flags and the tenants file; `state`: quotas, slots, ids.
//! - `api`: wire types and the JSON error; `runs`, `sessions`: handlers.
//! - `backend`: the seam where a run runs (`jail run --events` today).
//! - `metrics`: Prometheus text; `janitor`: cleanup after the server's death.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod api;
mod backend;
mod config;
mod janitor;
mod metrics;
mod runs;
mod server;
mod sessions;
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
    /// Internal: be the janitor of this work folder (started by the server).
    #[arg(long, hide = true, value_name = "DIR", exclusive = true)]
    janitor: Option<std::path::PathBuf>,
    #[command(flatten)]
    args: Option<config::ServeArgs>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(dir) = cli.janitor {
        return janitor::main(&dir);
    }
    match cli.args {
        Some(args) => server::main(args),
        None => {
            eprintln!("jail serve: give --listen ADDR and --tokens FILE (`jail serve --help`)");
            ExitCode::from(jail::result::EXIT_SETUP_FAILED as u8)
        }
    }
}
