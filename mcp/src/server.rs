//! The server: its configuration, fixed at start, and its tools: the
//! `run_python` tool, each call of which is one `jail run --json` process,
//! the session tools (sessions.rs) and the files tools (files.rs).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;

use crate::content;
use crate::files;
use crate::inputs::{Allowlist, InputError, Staging};
use crate::sessions::Sessions;
use jail::client::command::{Flags, Limits, Mode, RunSpec, Script};
use jail::client::events::ResultError;
use jail::client::group::Group;
use jail::client::run::{self, RunError};
use jail::client::session::{self, FileAnswer};
use jail::envs::Envs;
use jail::policy::{Overrides, Policy};
use jail::result::{Artifact, RunResult, Status, EXIT_SETUP_FAILED};

/// Bytes of Python source one call may send.
pub const MAX_CODE_BYTES: usize = 1 << 20;

#[derive(clap::Args, Debug, Clone)]
pub struct McpArgs {
    /// A host folder `run_python` may take input from (repeatable). Nothing
    /// else on the host can be named.
    #[arg(long = "input-dir", value_name = "DIR")]
    pub input_dirs: Vec<PathBuf>,
    /// Policy file (default: the built-in policies/default.json).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Root filesystem folder (default: JAIL_ROOTFS, the policy's, then the
    /// rootfs named by --rootfs-name, as for `jail run`).
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// The rootfs to look up by name when no folder is given: `data`,
    /// `minimal` (default: `data` where one is built, else `minimal`).
    #[arg(long = "rootfs-name", value_name = "NAME")]
    pub rootfs_name: Option<String>,
    /// Wall-clock limit of a call in seconds, and the most a call may ask
    /// for (default: the policy's `limits.wall_time_secs`).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Memory of each run, swap 0: `512M`, `1G` or `unlimited`.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU quota of each run in cores.
    #[arg(long, value_name = "CORES")]
    pub cpus: Option<String>,
    /// Processes and threads of each run.
    #[arg(long, value_name = "N")]
    pub pids: Option<String>,
    /// CPU seconds of each run, or `unlimited`.
    #[arg(long = "cpu-time", value_name = "SECS")]
    pub cpu_time: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("{0}")]
    Input(#[from] InputError),
    #[error("policy: {0} (check it with `jail check FILE`)")]
    Policy(#[from] jail::policy::PolicyError),
    #[error("{0}")]
    Override(String),
    #[error("--timeout {0} is out of range: give seconds {range}", range = jail::seconds::range(jail::seconds::MOST))]
    Timeout(f64),
    #[error("cannot find this binary, to find `jail` beside it: {0}")]
    SelfExe(std::io::Error),
    #[error("no `jail` binary at {0}: jail-mcp runs each step with the `jail` beside it; install both (`make install`) or build it (`cargo build -p jail`)")]
    NoJail(PathBuf),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("serving stdio: {0}")]
    Serve(String),
}

/// What every call shares, fixed at start.
#[derive(Debug)]
struct Config {
    jail: PathBuf,
    allowlist: Allowlist,
    /// The call's default wall-clock limit, and the most it may ask.
    ceiling: Duration,
    /// `jail run` flags every call passes (policy, rootfs, limits).
    flags: Flags,
    policy_name: String,
}

impl Config {
    fn new(args: &McpArgs) -> Result<Config, McpError> {
        let mut policy = match &args.policy {
            Some(p) => Policy::load(p)?,
            None => Policy::builtin_default()?,
        };
        // What each run's jail may read of the host decides what is staged.
        let allowlist = Allowlist::new(&args.input_dirs, jail::accept::Reach::of_jails(policy.identity.root_host_gid))?;
        let overrides = Overrides {
            memory: args.memory.clone(),
            cpus: args.cpus.clone(),
            pids: args.pids.clone(),
            cpu_time: args.cpu_time.clone(),
            cgroup_parent: None,
            no_systemd_delegation: false,
        };
        // Refuse bad limits now, not on every call.
        policy.apply_overrides(&overrides).map_err(McpError::Override)?;
        let ceiling = match args.timeout {
            None => policy.limits.wall_time,
            Some(t) => jail::seconds::limit(t, jail::seconds::MOST).ok_or(McpError::Timeout(t))?,
        };
        let flags = Flags {
            policy: args.policy.clone(),
            rootfs: args.rootfs.clone(),
            rootfs_name: args.rootfs_name.clone(),
            cgroup_parent: None,
            limits: Limits {
                timeout: None,
                memory: args.memory.clone(),
                cpus: args.cpus.clone(),
                pids: args.pids.clone(),
                cpu_time: args.cpu_time.clone(),
            },
        };
        let jail = std::env::current_exe().map_err(McpError::SelfExe)?.with_file_name("jail");
        if !jail.is_file() {
            return Err(McpError::NoJail(jail));
        }
        Ok(Config { jail, allowlist, ceiling, flags, policy_name: policy.name })
    }

    /// Check one call's arguments; nothing runs unless they pass.
    fn check(&self, req: &RunPython) -> Result<(Duration, Staging, Envs), String> {
        if req.code.trim().is_empty() {
            return Err("`code` is empty: pass the Python source to run".into());
        }
        if req.code.len() > MAX_CODE_BYTES {
            return Err(format!(
                "`code` is {} bytes, above {MAX_CODE_BYTES}: send a shorter script, or put data in an input folder",
                req.code.len()
            ));
        }
        let max = self.ceiling.as_secs_f64();
        let timeout = match req.timeout_seconds {
            None => self.ceiling,
            Some(t) => jail::seconds::limit(t, max).ok_or_else(|| {
                format!(
                    "`timeout_seconds` {t} is out of range: give seconds {} (this server's limit; \
                     its operator raises it with `jail mcp --timeout SECS`)",
                    jail::seconds::range(max)
                )
            })?,
        };
        let staging = self.allowlist.stage(&req.input).map_err(|e| e.to_string())?;
        Ok((timeout, staging, envs(&req.env)?))
    }

    fn instructions(&self) -> String {
        format!(
            "run_python runs Python 3 code in a fresh Linux jail per call: no network, a read-only system, \
             nothing kept between calls (policy `{}`, at most {} s per call). Input folders the code may be given \
             (the `input` argument): {}. Write files to /workspace/output: they are checked and listed, and PNG \
             images come back as images. For state across calls: session_start returns a session_id, \
             session_exec runs cells in it, session_stop ends it; session_write_file, session_read_file and \
             session_list_files move files in and out of a session's /workspace/output while it runs.",
            self.policy_name,
            self.ceiling.as_secs_f64(),
            self.allowlist.describe()
        )
    }
}

/// A call's `env`, checked as every door's is (jail/src/envs.rs).
fn envs(vars: &BTreeMap<String, String>) -> Result<Envs, String> {
    Envs::check(vars.clone()).map_err(|e| format!("`env`: {e}"))
}

/// The arguments of `run_python`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPython {
    /// Python source, run as one script in a fresh jail (the current folder
    /// is /workspace/output; nothing persists between calls).
    pub code: String,
    /// Host files to copy to /workspace/input/<file name>, or one folder to
    /// mount read-only at /workspace/input. Each is an absolute path inside
    /// a folder this server allows, or `NAME/relative/path` where NAME is
    /// that folder's name (the server's instructions list them).
    #[serde(default)]
    pub input: Vec<String>,
    /// Wall-clock limit in seconds, at least 0.001 and at most the server's (its default).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Environment variables for the code, NAME to value (at most 64;
    /// names as in a shell, not JAIL_*, PYTHON*, LD_* or the proxy variables).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The arguments of `session_start`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionStart {
    /// Input for the whole session, as for run_python's `input`: files
    /// copied to /workspace/input, or one folder mounted there read-only.
    #[serde(default)]
    pub input: Vec<String>,
    /// Wall-clock limit of each cell in seconds, at least 0.001 and at most the server's (its default).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Environment variables for every cell, NAME to value (at most 64;
    /// names as in a shell, not JAIL_*, PYTHON*, LD_* or the proxy variables).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// What `session_start` answers as structured content.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct SessionStarted {
    /// The id to pass to session_exec and session_stop.
    pub session_id: String,
}

/// The arguments of `session_exec`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionExec {
    /// The id session_start returned.
    pub session_id: String,
    /// Python source, run as the session's next cell: the names earlier
    /// cells defined are still there.
    pub code: String,
    /// Environment variables for this cell only (over the session's), NAME to value (at most 64;
    /// names as in a shell, not JAIL_*, PYTHON*, LD_* or the proxy variables).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The arguments of `session_stop`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionStop {
    /// The id session_start returned.
    pub session_id: String,
}

#[derive(Clone)]
pub struct Server {
    config: Arc<Config>,
    sessions: Arc<Sessions>,
    tool_router: ToolRouter<Server>,
}

/// A jail result as the tool's reply: MCP content (text, images; a cell's
/// as `reads` gave them) and the whole document as structured content.
fn reply_of(result: &RunResult, reads: &content::SessionReads) -> CallToolResult {
    let blocks = content::blocks(result, reads);
    let mut reply = if result.status == Status::SetupFailed {
        CallToolResult::error(blocks)
    } else {
        CallToolResult::success(blocks)
    };
    reply.structured_content = serde_json::to_value(result).ok();
    reply
}

fn refused(message: String) -> Result<CallToolResult, ErrorData> {
    Ok(CallToolResult::error(vec![ContentBlock::text(message)]))
}

/// A files tool's reply: the session's answer (files.rs), or why there is
/// none (an unknown id, an ended session) as the other session tools say it.
fn file_reply(op: files::Op, answer: Result<FileAnswer, String>) -> Result<CallToolResult, ErrorData> {
    match answer {
        Ok(answer) => Ok(files::reply(op, answer)),
        Err(message) => refused(message),
    }
}

impl Server {
    /// The images a cell's result lists (content::cell_images), each read
    /// through the session's files API as session_read_file reads it: the
    /// judged copy in the session, since the host folder gets the cell's
    /// files only when the session ends.
    async fn cell_images(&self, id: &str, result: &RunResult) -> Vec<(String, Result<FileAnswer, String>)> {
        let mut reads = Vec::new();
        for a in content::cell_images(result) {
            let path = a.path.clone();
            let answer = self.sessions.file(id, move |h| session::get_file(h, &path)).await;
            reads.push((a.path.clone(), answer));
        }
        reads
    }
}

#[tool_router]
impl Server {
    fn new(config: Config, sessions: Arc<Sessions>) -> Server {
        Server { config: Arc::new(config), sessions, tool_router: Self::tool_router() }
    }

    #[tool(
        output_schema = rmcp::handler::server::common::schema_for_output::<SessionStarted>(),
        description = "Start a Python session: one Linux jail whose interpreter keeps its variables, imports and \
                       files from one session_exec call to the next. Returns its session_id. Stop it with \
                       session_stop (it also ends when this server exits)."
    )]
    async fn session_start(&self, Parameters(req): Parameters<SessionStart>) -> Result<CallToolResult, ErrorData> {
        let check = RunPython {
            code: "pass".into(),
            input: req.input,
            timeout_seconds: req.timeout_seconds,
            env: req.env,
        };
        let (timeout, staging, env) = match self.config.check(&check) {
            Ok(ok) => ok,
            Err(message) => return refused(message),
        };
        let dir = match step_dir() {
            Ok(d) => d,
            Err(message) => return refused(message),
        };
        let input = match stage_input(dir.path(), &staging, self.config.allowlist.reach()) {
            Ok(i) => i,
            Err(message) => return refused(message),
        };
        match self.sessions.start(self.config.flags.clone(), input, Some(dir), timeout, env).await {
            Ok(id) => {
                let mut reply = CallToolResult::success(vec![ContentBlock::text(format!(
                    "session {id} started: run cells with session_exec(session_id=\"{id}\", code=...)"
                ))]);
                reply.structured_content = serde_json::to_value(SessionStarted { session_id: id }).ok();
                Ok(reply)
            }
            Err(message) => refused(message),
        }
    }

    #[tool(
        output_schema = rmcp::handler::server::common::schema_for_output::<RunResult>(),
        description = "Run Python 3 code as the next cell of a session (session_start): names earlier cells \
                       defined are still there. Returns the cell's stdout, stderr, Python error and status, and \
                       the files it made, changed or deleted in /workspace/output, checked (PNG and JPEG images \
                       inline); they stay in the session (session_read_file reads one) until session_stop."
    )]
    async fn session_exec(&self, Parameters(req): Parameters<SessionExec>) -> Result<CallToolResult, ErrorData> {
        let check = RunPython { code: req.code, input: vec![], timeout_seconds: None, env: req.env };
        let env = match self.config.check(&check) {
            Ok((_, _, env)) => env,
            Err(message) => return refused(message),
        };
        match self.sessions.exec(&req.session_id, &check.code, env).await {
            Ok(result) => {
                let reads = self.cell_images(&req.session_id, &result).await;
                Ok(reply_of(&result, &reads))
            }
            Err(message) => refused(message),
        }
    }

    #[tool(
        output_schema = rmcp::handler::server::common::schema_for_output::<files::Written>(),
        description = "Write a file into a session's /workspace/output, where its cells see it: `path` relative to \
                       that folder, `content` text (or base64 with encoding \"base64\"), at most 8 MiB. It \
                       replaces a file of that name; folders on the way are made."
    )]
    async fn session_write_file(&self, Parameters(req): Parameters<files::WriteFile>) -> Result<CallToolResult, ErrorData> {
        let data = match files::content_bytes(&req) {
            Ok(d) => d,
            Err(message) => return refused(message),
        };
        let path = req.path;
        let answer = self.sessions.file(&req.session_id, move |h| session::put_file(h, &path, &data)).await;
        file_reply(files::Op::Write, answer)
    }

    #[tool(
        output_schema = rmcp::handler::server::common::schema_for_output::<Artifact>(),
        description = "Read a file of a session's /workspace/output (`path` relative to it), checked as a run's \
                       output files are: a PNG or JPEG comes back as an image, text as text (the first 128 KiB; \
                       a CSV's formula cells neutralised), another file as its type and size (and base64 up to \
                       48 KiB). A file the check refuses is not returned."
    )]
    async fn session_read_file(&self, Parameters(req): Parameters<files::ReadFile>) -> Result<CallToolResult, ErrorData> {
        let path = req.path;
        let answer = self.sessions.file(&req.session_id, move |h| session::get_file(h, &path)).await;
        file_reply(files::Op::Read, answer)
    }

    #[tool(
        output_schema = rmcp::handler::server::common::schema_for_output::<files::Listing>(),
        description = "List a folder of a session's /workspace/output (`path` relative to it; by default the \
                       folder itself): each entry's name, kind and size, at most 500. Links are listed, never \
                       followed."
    )]
    async fn session_list_files(&self, Parameters(req): Parameters<files::ListFiles>) -> Result<CallToolResult, ErrorData> {
        let path = req.path;
        let answer = self.sessions.file(&req.session_id, move |h| session::list_files(h, &path)).await;
        file_reply(files::Op::List, answer)
    }

    #[tool(
        output_schema = rmcp::handler::server::common::schema_for_output::<RunResult>(),
        description = "Stop a session: its jail ends, and the files its cells wrote to /workspace/output are \
                       checked again, delivered to the host folder and listed (PNG images inline)."
    )]
    async fn session_stop(&self, Parameters(req): Parameters<SessionStop>) -> Result<CallToolResult, ErrorData> {
        match self.sessions.stop(&req.session_id).await {
            Ok(result) => Ok(reply_of(&result, &[])),
            Err(message) => refused(message),
        }
    }

    #[tool(
        output_schema = rmcp::handler::server::common::schema_for_output::<RunResult>(),
        description = "Run Python 3 code in a fresh, network-less Linux jail and return its stdout, stderr, \
                       Python error, status and the files it wrote to /workspace/output (PNG images inline)."
    )]
    async fn run_python(&self, Parameters(req): Parameters<RunPython>) -> Result<CallToolResult, ErrorData> {
        let (timeout, staging, env) = match self.config.check(&req) {
            Ok(ok) => ok,
            Err(message) => return Ok(CallToolResult::error(vec![ContentBlock::text(message)])),
        };
        let result = match run_step(&self.config, &req.code, (timeout, env), &staging).await {
            Ok(r) => r,
            Err(message) => return Ok(CallToolResult::error(vec![ContentBlock::text(message)])),
        };
        Ok(reply_of(&result, &[]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("jail", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.config.instructions())
    }
}

/// One call: stage the code and input in a private folder, run `jail run
/// --json` on them, read its result (bounded) and check its version.
async fn run_step(config: &Config, code: &str, (timeout, env): (Duration, Envs), staging: &Staging) -> Result<RunResult, String> {
    let dir = step_dir()?;
    let script = dir.path().join("main.py");
    std::fs::write(&script, code).map_err(|e| format!("write {}: {e}", script.display()))?;
    readable(&script, 0o644)?;
    let input = stage_input(dir.path(), staging, config.allowlist.reach())?;
    let mut spec = RunSpec::new(&config.jail, Mode::Json, Script::File(script), timeout);
    spec.flags = config.flags.clone();
    spec.flags.limits.timeout = Some(timeout);
    spec.input = input;
    spec.envs = env;
    let running = run::spawn(&spec).map_err(|e| e.to_string())?;
    // A cancelled call (this future dropped) terminates the run, then kills
    // it after the grace: SIGTERM first, so that it removes its cgroup.
    let cancel = running.stopper().map(Group::from);
    let waited = tokio::task::spawn_blocking(move || running.wait(|_| {})).await;
    cancel.into_iter().for_each(Group::done);
    match waited {
        Ok(result) => result.map_err(|e| match e {
            RunError::Result(ResultError::Contract(cause)) => {
                format!("the jail's result does not match this server's contract: {cause}")
            }
            e => e.to_string(),
        }),
        Err(e) => Err(format!("waiting for the jail: {e}")),
    }
}

/// A private, world-readable step folder (a run started by root reads its
/// input as an unprivileged uid).
fn step_dir() -> Result<tempfile::TempDir, String> {
    let dir = tempfile::Builder::new()
        .prefix("jail-mcp-")
        .tempdir()
        .map_err(|e| format!("cannot make a step folder: {e}"))?;
    readable(dir.path(), 0o755)?;
    Ok(dir)
}

fn readable(path: &std::path::Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| format!("chmod {}: {e}", path.display()))
}

/// The folder to give as `--input`: an allowlisted folder as it is (bound
/// by `jail run`, which takes it as every door does), or the allowlisted
/// files copied into `dir/input` by the jail crate's acceptor: opened
/// again beneath their folder without following a link, each keeping its
/// own mode (never made readable for the jail), never a hard link.
fn stage_input(dir: &std::path::Path, staging: &Staging, reach: jail::accept::Reach) -> Result<Option<PathBuf>, String> {
    Ok(match staging {
        Staging::None => None,
        Staging::Folder(path) => Some(path.clone()),
        Staging::Files(files) => {
            let to = dir.join("input");
            std::fs::create_dir(&to).map_err(|e| format!("mkdir {}: {e}", to.display()))?;
            readable(&to, 0o755)?;
            let into = jail::accept::open_own_dir(&to).map_err(|e| e.to_string())?;
            for (name, from) in files {
                let copy_err = |e: jail::accept::AcceptError| format!("copy {e} to the jail's input: {}", e.fix());
                let file = from.open_file(reach).map_err(copy_err)?;
                jail::accept::copy_file(
                    file,
                    &from.path(),
                    &into,
                    std::ffi::OsStr::new(name),
                    reach,
                    crate::inputs::MAX_COPY_BYTES,
                )
                .map_err(copy_err)?;
            }
            Some(to)
        }
    })
}

/// `jail mcp`: check the configuration, then serve until the client closes stdin.
pub fn main(args: McpArgs) -> ExitCode {
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jail mcp: {e}");
            ExitCode::from(EXIT_SETUP_FAILED as u8)
        }
    }
}

fn serve(args: &McpArgs) -> Result<(), McpError> {
    let config = Config::new(args)?;
    // One thread for the protocol; steps are processes of their own.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(McpError::Runtime)?;
    let sessions = Arc::new(Sessions::new(config.jail.clone()));
    let served = runtime.block_on(async {
        let service = Server::new(config, Arc::clone(&sessions))
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| McpError::Serve(e.to_string()))?;
        service.waiting().await.map_err(|e| McpError::Serve(e.to_string()))?;
        Ok(())
    });
    // Sessions end with the server, however it ends.
    sessions.stop_all();
    served
}
