//! `jail-mcp` (also started as `jail mcp`): a Model Context Protocol server
//! over stdio (rmcp) with the tool `run_python`. Each call runs as its own
//! `jail run --json` process, the `jail` binary installed beside this one:
//! the jail must fork from a single-threaded process, and this one runs a
//! tokio runtime, so it never calls the supervisor in-process. What a call
//! may touch on the host is fixed when the server starts: the policy and
//! its limits, and the folders given with `--input-dir` (see `inputs.rs`).
//! `session_start`, `session_exec` and `session_stop` drive one jail's
//! stateful cells (`jail session`, see `sessions.rs`);
//! `session_write_file`, `session_read_file` and `session_list_files`
//! move files in and out of its `/workspace/output` (`files.rs`).
//!
//! - `server`: the configuration and the tool (each run through
//!   `jail::client::run`, which also stops a cancelled call's run).
//! - `inputs`: the allowlisted input folders; `content`: the result as MCP content.
//! - `sessions`: the open sessions the session tools drive.
//! - `files`: the files tools' arguments, caps and replies.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod content;
mod files;
mod inputs;
mod server;
mod sessions;

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "jail mcp",
    version,
    about = "Serve MCP over stdio: a `run_python` tool that runs each step in a fresh jail"
)]
struct Cli {
    #[command(flatten)]
    args: server::McpArgs,
}

fn main() -> ExitCode {
    server::main(Cli::parse().args)
}
