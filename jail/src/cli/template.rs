//! `jail template`: a pool's template (pool/template.rs). Hidden from
//! `--help`: `jail pool` runs it.

use std::path::PathBuf;
use std::process::ExitCode;

use super::run::{prepare_request, RunArgs};
use super::{EnvArgs, LimitArgs, RootfsArgs};
use crate::result::EXIT_SETUP_FAILED;
use crate::stage::chain_line;

#[derive(clap::Args)]
pub(crate) struct TemplateArgs {
    /// Policy file (default: the built-in policies/default.json); its
    /// `preload` is what the template imports.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[command(flatten)]
    rootfs: RootfsArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    env: EnvArgs,
    /// Where to listen for fork requests (a unix socket made 0600).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// End when every write end of the pipe whose read end is this
    /// inherited descriptor is closed.
    #[arg(long = "lifeline-fd", value_name = "FD")]
    lifeline_fd: Option<i32>,
}

pub(crate) fn template(a: TemplateArgs) -> ExitCode {
    let fail = |line: String| {
        eprintln!("jail: {line}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    if let Some(fd) = a.lifeline_fd {
        if fd < 3 || !crate::sys::fd_is_open(fd) {
            return fail(format!("--lifeline-fd {fd} is not an open descriptor above 2: pass the read end of a pipe"));
        }
    }
    let args = RunArgs { env: a.env, ..RunArgs::for_cells(a.policy, a.rootfs, a.limits) };
    let req = match prepare_request(args) {
        Ok((req, _)) => req,
        Err(e) => return fail(format!("{} ({})", e.message, e.stage)),
    };
    let opts = crate::pool::template::Options { socket: a.socket, lifeline: a.lifeline_fd };
    match crate::pool::template::run(req, &opts) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => fail(chain_line(&e)),
    }
}
