//! `jail mcp ARGS`: exec `jail-mcp ARGS`, the MCP server (the mcp/ crate),
//! found beside this binary; `jail serve ARGS` likewise execs `jail-serve`
//! (the serve/ crate). Each is a binary of its own so that this one
//! carries no async runtime: the supervisor's resident memory grows with the
//! binary it runs from.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::result::EXIT_SETUP_FAILED;

/// The server's binary name, beside `jail`.
pub(crate) const SERVER: &str = "jail-mcp";
/// The HTTP service's binary name, beside `jail`.
pub(crate) const SERVE: &str = "jail-serve";

#[derive(Debug, thiserror::Error)]
pub(crate) enum McpError {
    #[error("cannot find this binary, to find {SERVER} beside it: {0}")]
    SelfExe(std::io::Error),
    #[error("no {1} at {0}: install it beside jail (`make install`) or build it (`cargo build -p {1}`)")]
    Missing(PathBuf, &'static str),
    #[error("cannot run {0}: {1}")]
    Exec(PathBuf, std::io::Error),
}

/// Where NAME is: beside the running binary (links resolved, so a `jail` on
/// PATH that links to a build tree finds that tree's server).
fn companion_path(name: &'static str) -> Result<PathBuf, McpError> {
    let exe = std::env::current_exe().map_err(McpError::SelfExe)?;
    let server = exe.with_file_name(name);
    if server.is_file() {
        Ok(server)
    } else {
        Err(McpError::Missing(server, name))
    }
}

/// Replace this process with `jail-mcp ARGS`; returns only on failure.
pub(crate) fn exec(args: &[OsString]) -> ExitCode {
    exec_beside(SERVER, args)
}

/// Replace this process with `NAME ARGS`, NAME found beside this binary;
/// returns only on failure.
pub(crate) fn exec_beside(name: &'static str, args: &[OsString]) -> ExitCode {
    let e = match companion_path(name) {
        Ok(server) => {
            let e = std::process::Command::new(&server).args(args).exec();
            McpError::Exec(server, e)
        }
        Err(e) => e,
    };
    eprintln!("jail {}: {e}", name.trim_start_matches("jail-"));
    ExitCode::from(EXIT_SETUP_FAILED as u8)
}
