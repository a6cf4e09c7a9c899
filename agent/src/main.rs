//! The `jail-agent` command line: read the flags and the LLM_* environment,
//! run the task (or resume a stopped one, or export a finished one's files
//! again), print the final answer and the summary of tokens and time.
//!
//! Exit status (`EXIT_*`): 0 every item of the plan was completed; 1 the
//! run failed (the message says why); 2 bad usage; 3 stopped at a cap or
//! the deadline; 4 finished, but not every item was completed (one was
//! blocked: `summary.json`'s `items` say which and why); 5 finished, but
//! the export to `--output` failed (`jail-agent export SESSION` does it
//! again); 128 + N stopped by signal N (130 for Ctrl-C; `jail-agent resume
//! SESSION` goes on).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};

use agent::agent::{self as run, Caps, Config, Outcome, Progress, Stop};
use agent::checkpoint::Checkpoint;
use agent::escape::{cut, escape, Lines};
use agent::llm::LlmConfig;
use agent::runner::{self, Runner};
use agent::stop::exit_status;
use agent::trace::Content;
use agent::view::Budget;

#[derive(Parser)]
#[command(
    name = "jail-agent",
    version,
    about = "An agent that plans, writes Python and runs each sub-task in a jail session from a warm pool"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one task on a folder of input files.
    Run(Box<RunArgs>),
    /// Go on with a run that stopped on an error or a signal, or was
    /// killed, from its last step (the session dir's state.json).
    Resume(Box<ResumeArgs>),
    /// Copy a run's accepted files to its --output (or DIR) again: after an
    /// export that failed, or to another folder.
    Export(ExportArgs),
}

/// The exit statuses (see the module's doc).
const EXIT_DONE: u8 = 0;
const EXIT_FAILED: u8 = 1;
const EXIT_STOPPED: u8 = 3;
const EXIT_NOT_ALL_DONE: u8 = 4;
const EXIT_EXPORT_FAILED: u8 = 5;

#[derive(clap::Args)]
struct ExportArgs {
    /// The session dir of the run (printed as `jail-agent: session DIR`).
    session: PathBuf,
    /// Where to copy the files (default: the run's --output).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
}

/// How to reach the model (shared by `run` and `resume`).
#[derive(clap::Args)]
struct LlmArgs {
    /// OpenAI-compatible endpoint, e.g. http://localhost:11434/v1.
    #[arg(long, env = "LLM_BASE_URL", value_name = "URL")]
    base_url: Option<String>,
    /// Model name the endpoint knows.
    #[arg(long, env = "LLM_MODEL")]
    model: Option<String>,
    /// API key, sent as a bearer token (prefer the environment variable).
    #[arg(long, env = "LLM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Timeout of one model request, in seconds.
    #[arg(long, env = "LLM_TIMEOUT_SECS")]
    llm_timeout: Option<u64>,
    /// Retries of a model request on 429, 5xx, garbage replies and connection failures.
    #[arg(long, env = "LLM_RETRIES")]
    retries: Option<u32>,
    /// First retry backoff in milliseconds (doubled each retry).
    #[arg(long, env = "LLM_RETRY_BASE_MS")]
    retry_base_ms: Option<u64>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The task, in plain words.
    #[arg(long, required_unless_present = "task_file")]
    task: Option<String>,
    /// Read the task from a file instead.
    #[arg(long, value_name = "FILE", conflicts_with = "task")]
    task_file: Option<PathBuf>,
    /// The input files (copied into the session, read-only in the jail).
    #[arg(long, value_name = "DIR")]
    input: PathBuf,
    /// Copy the files the jail accepted here at the end.
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Jail policy for every step (default: the jail's built-in default).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The `jail` binary (default: JAIL_BIN, then `jail` beside this binary, then PATH).
    #[arg(long, value_name = "PATH")]
    jail: Option<PathBuf>,
    /// Root filesystem of the steps (default: JAIL_ROOTFS, the policy's,
    /// then the rootfs named by --rootfs-name, looked up as `jail run
    /// --rootfs-name` does).
    #[arg(long, value_name = "DIR", conflicts_with = "rootfs_name")]
    rootfs: Option<PathBuf>,
    /// The rootfs to look up by name (`minimal`, `data`) when no folder is
    /// given. Default: `data` when the policy preloads modules; else `data`
    /// where it is installed, then `minimal`.
    #[arg(long = "rootfs-name", value_name = "NAME")]
    rootfs_name: Option<String>,
    /// Folder the session dir is created in (default: the temp dir).
    #[arg(long, value_name = "DIR")]
    session_dir: Option<PathBuf>,
    /// Extra skills (*.md) that add to or replace the built-in ones.
    #[arg(long, value_name = "DIR")]
    skills: Option<PathBuf>,

    #[command(flatten)]
    llm: LlmArgs,
    /// Sampling temperature (default: the server's).
    #[arg(long, env = "LLM_TEMPERATURE")]
    temperature: Option<f64>,
    /// Most tokens of one reply (default: the server's).
    #[arg(long, env = "LLM_MAX_REPLY_TOKENS")]
    max_reply_tokens: Option<u32>,

    /// Wall-clock limit of one step in seconds (default: the policy's).
    #[arg(long, value_name = "SECS")]
    step_timeout: Option<f64>,
    /// Model calls one sub-agent may make.
    #[arg(long, default_value_t = Caps::default().subagent_steps)]
    subagent_steps: u32,
    /// Tokens (in + out) one sub-agent may use.
    #[arg(long, default_value_t = Caps::default().subagent_tokens)]
    subagent_tokens: u64,
    /// Model calls the whole run may make.
    #[arg(long, default_value_t = Caps::default().run_steps)]
    run_steps: u32,
    /// Tokens (in + out) the whole run may use.
    #[arg(long, default_value_t = Caps::default().run_tokens)]
    run_tokens: u64,
    /// Model calls the orchestrator itself may make.
    #[arg(long, default_value_t = Caps::default().orchestrator_steps)]
    orchestrator_steps: u32,
    /// Tokens (in + out) the orchestrator itself may use.
    #[arg(long, default_value_t = Caps::default().orchestrator_tokens)]
    orchestrator_tokens: u64,
    /// Tool calls run from one model reply; the rest are answered with an error.
    #[arg(long, default_value_t = Caps::default().calls_per_reply)]
    calls_per_reply: usize,
    /// Wall-clock limit of the whole run: seconds, or with a unit (90s, 30m, 2h).
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    deadline: Duration,
    /// Keep prompts, completions, tool arguments and results out of the
    /// trace (trace.jsonl and the exported spans): names, sizes, tokens and
    /// times only.
    #[arg(long)]
    no_trace_content: bool,
    /// Run every step in a fresh jail of its own, instead of one Python
    /// session per sub-task whose variables persist from step to step
    /// (stateless steps do not use the warm pool: they see /workspace/code).
    #[arg(long)]
    stateless: bool,
    /// Jails kept made ahead in the run's warm pool (`jail pool`), each
    /// sub-task's session claimed from it with the policy's `preload`
    /// imported; 0: no pool, each session is started when needed.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pool_size: usize,
    /// Print no progress on stderr.
    #[arg(long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct ResumeArgs {
    /// The session dir of the stopped run (printed as `jail-agent: session DIR`).
    session: PathBuf,
    /// The endpoint, model and key (default: what the run used; the key is never saved).
    #[command(flatten)]
    llm: LlmArgs,
    /// The `jail` binary (default: what the run used).
    #[arg(long, value_name = "PATH")]
    jail: Option<PathBuf>,
    /// Wall-clock limit of the resumed part (default: the run's).
    #[arg(long, value_parser = parse_duration)]
    deadline: Option<Duration>,
    /// Print no progress on stderr.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    // Before any thread: Ctrl-C, SIGTERM and SIGHUP stop the run (stop.rs).
    if let Err(e) = agent::signals::guard_signals() {
        eprintln!("jail-agent: cannot take SIGINT/SIGTERM/SIGHUP ({e}): a session would outlive a killed agent; not starting");
        return ExitCode::from(EXIT_FAILED);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run_task(*args),
        Command::Resume(args) => resume_task(*args),
        Command::Export(args) => export_again(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("jail-agent: {}", escape(&cut(&format!("{e:#}"), 4000), Lines::One));
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn apply_llm(llm: &mut LlmConfig, a: &LlmArgs) {
    if let Some(u) = a.base_url.as_ref().filter(|u| !u.trim().is_empty()) {
        llm.base_url = u.clone();
    }
    if let Some(m) = a.model.as_ref().filter(|m| !m.trim().is_empty()) {
        llm.model = m.clone();
    }
    llm.api_key = a.api_key.clone().filter(|k| !k.is_empty());
    if let Some(t) = a.llm_timeout {
        llm.timeout = Duration::from_secs(t.max(1));
    }
    if let Some(r) = a.retries {
        llm.max_retries = r;
    }
    if let Some(b) = a.retry_base_ms {
        llm.retry_base = Duration::from_millis(b);
    }
}

fn run_task(a: RunArgs) -> anyhow::Result<ExitCode> {
    let task = match (&a.task, &a.task_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => std::fs::read_to_string(f).with_context(|| format!("cannot read the task file {}", f.display()))?,
        (None, None) => bail!("give the task with --task TEXT or --task-file FILE"),
    };
    let Some(base_url) = a.llm.base_url.clone().filter(|u| !u.trim().is_empty()) else {
        bail!(
            "no model endpoint: set LLM_BASE_URL (or --base-url) to an OpenAI-compatible server, e.g. http://localhost:11434/v1"
        );
    };
    let Some(model) = a.llm.model.clone().filter(|m| !m.trim().is_empty()) else {
        bail!("no model: set LLM_MODEL (or --model) to a model the endpoint serves");
    };
    if !a.input.is_dir() {
        bail!("input dir {} is not a folder: pass an existing folder to --input", a.input.display());
    }
    let policy = match &a.policy {
        Some(p) => jail::policy::Policy::load(p),
        None => jail::policy::Policy::builtin_default(),
    }
    .map_err(|e| anyhow::anyhow!("policy: {e} (check it with `jail check FILE`)"))?;
    let owner = run::owner_for(a.policy.as_deref()).map_err(anyhow::Error::msg)?;
    let jail_bin = runner::find_jail(a.jail.as_deref());
    // Found once, as `jail run --rootfs-name` finds it, and given to every
    // jail of the run: the steps and `list_available_packages` agree.
    let rootfs = steps_rootfs(a.rootfs.clone(), a.rootfs_name.as_deref(), &policy, &jail_bin)?;
    if let Some(t) = a.step_timeout {
        if jail::seconds::limit(t, jail::seconds::MOST).is_none() {
            bail!("--step-timeout {t} is out of range: give seconds {}", jail::seconds::range(jail::seconds::MOST));
        }
    }
    if a.pool_size > agent::pool::MAX_SIZE {
        bail!("--pool-size {} is out of range: give 0 (no pool) to {}", a.pool_size, agent::pool::MAX_SIZE);
    }
    let wall_limit = a.step_timeout.map(Duration::from_secs_f64).unwrap_or(policy.limits.wall_time);
    let mut llm = LlmConfig {
        base_url,
        model,
        api_key: None,
        timeout: Duration::from_secs(300),
        max_retries: 4,
        retry_base: Duration::from_millis(1000),
        temperature: a.temperature,
        max_reply_tokens: a.max_reply_tokens,
    };
    apply_llm(&mut llm, &a.llm);
    let config = Config {
        task,
        input: a.input,
        output: a.output,
        session_parent: a.session_dir,
        llm,
        runner: Runner {
            jail: jail_bin,
            policy: a.policy,
            rootfs: Some(rootfs.clone()),
            timeout: a.step_timeout,
            wall_limit,
            stateless: a.stateless,
            pool_size: a.pool_size,
        },
        rootfs: Some(rootfs),
        skills_dir: a.skills,
        caps: Caps {
            subagent_steps: a.subagent_steps,
            subagent_tokens: a.subagent_tokens,
            run_steps: a.run_steps,
            run_tokens: a.run_tokens,
            orchestrator_steps: a.orchestrator_steps,
            orchestrator_tokens: a.orchestrator_tokens,
            calls_per_reply: a.calls_per_reply.max(1),
            deadline: a.deadline,
        },
        budget: Budget::default(),
        owner,
        progress: if a.quiet { Progress::Quiet } else { Progress::Stderr },
        trace_content: if a.no_trace_content { Content::Omitted } else { Content::Recorded },
    };
    let sinks = agent::otel::sinks_from_env(&config).map_err(anyhow::Error::msg)?;
    finish(&config, run::run_with(&config, sinks))
}

fn resume_task(a: ResumeArgs) -> anyhow::Result<ExitCode> {
    let root = a.session.as_path();
    let state = Checkpoint::load(root).map_err(anyhow::Error::new)?;
    let owner = run::owner_for(state.settings.policy.as_deref()).map_err(anyhow::Error::msg)?;
    let progress = if a.quiet { Progress::Quiet } else { Progress::Stderr };
    let mut config = state.settings.config(owner, progress, None);
    apply_llm(&mut config.llm, &a.llm);
    if let Some(j) = a.jail {
        config.runner.jail = j;
    }
    if let Some(d) = a.deadline {
        config.caps.deadline = d;
    }
    let sinks = agent::otel::sinks_from_env(&config).map_err(anyhow::Error::msg)?;
    finish(&config, run::resume(&config, root, sinks))
}

fn finish(config: &Config, result: Result<Outcome, run::Failure>) -> anyhow::Result<ExitCode> {
    let outcome = match result {
        Ok(o) => o,
        Err(f) => {
            if let Some(s) = &f.session {
                eprintln!("jail-agent: the trace and summary are in {}", s.display());
                if f.error.resumable() {
                    eprintln!("jail-agent: the run's state is saved; continue it with `jail-agent resume {}`", quote(s));
                }
            }
            return Err(f.into());
        }
    };
    // The answer is the model's text: shown with every control, bidi and
    // invisible character escaped, and cut (answer.md has all of it).
    let preview = escape(&cut(&outcome.answer, run::ANSWER_PREVIEW_BYTES), Lines::Keep);
    println!("{preview}\n");
    print!("{}", outcome.summary.render());
    let root = &outcome.session.root;
    eprintln!("jail-agent: session {} (answer.md, trace.jsonl, summary.txt; files in output/)", root.display());
    if let Stop::Signal(sig) = outcome.stop {
        eprintln!(
            "jail-agent: stopped by {sig}; the state is saved: continue with `jail-agent resume {}`, or copy the files so far with `jail-agent export {} --output DIR`",
            quote(root),
            quote(root)
        );
        return Ok(ExitCode::from(exit_status(sig)));
    }
    if let Some(dest) = &config.output {
        match &outcome.export_error {
            Some(e) => {
                eprintln!("jail-agent: the export to {} failed: {}", dest.display(), escape(e, Lines::One));
                eprintln!(
                    "jail-agent: nothing is lost: the files are in {}; copy them again with `jail-agent export {}` (or `--output DIR` for another folder)",
                    outcome.session.output.display(),
                    quote(root)
                );
                return Ok(ExitCode::from(EXIT_EXPORT_FAILED));
            }
            None => report_export(&outcome.exported, dest),
        }
    }
    Ok(ExitCode::from(match outcome.stop {
        Stop::Finished if outcome.all_done() => EXIT_DONE,
        Stop::Finished => {
            eprintln!("jail-agent: not every item was completed (see `by item` above; summary.json's `items`)");
            EXIT_NOT_ALL_DONE
        }
        _ => EXIT_STOPPED,
    }))
}

fn report_export(exported: &agent::export::Exported, dest: &Path) {
    eprintln!("jail-agent: copied {} files the jail accepted to {}", exported.copied.len(), dest.display());
    for s in &exported.skipped {
        eprintln!("jail-agent: not copied: {s}");
    }
}

/// `jail-agent export SESSION [--output DIR]`: the accepted files of the
/// run's state, copied as the run's end would have.
fn export_again(a: &ExportArgs) -> anyhow::Result<ExitCode> {
    let state = Checkpoint::load_any(&a.session).map_err(anyhow::Error::new)?;
    let Some(dest) = a.output.clone().or(state.settings.output.clone()) else {
        bail!("the run in {} had no --output: give one with --output DIR", a.session.display());
    };
    let output = a.session.join("output");
    let exported = agent::export::export(&output, &state.accepted, &dest)
        .map_err(|e| anyhow::anyhow!("the export to {} failed: {e}", dest.display()))?;
    report_export(&exported, &dest);
    Ok(ExitCode::from(EXIT_DONE))
}

/// A path as a shell word, for the resume hint.
fn quote(p: &Path) -> String {
    let s = p.display().to_string();
    if s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c)) {
        s
    } else {
        format!("'{}'", escape(&s.replace('\'', r"'\''"), Lines::One))
    }
}

/// `90`, `90s`, `30m`, `2h`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a duration: give seconds, or 90s, 30m, 2h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: the unit is s, m or h")),
    };
    if !(secs > 0.0 && secs <= run::MOST_DEADLINE.as_secs_f64()) {
        return Err(format!("`{s}` is out of range: give more than 0 and at most a week"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The rootfs the steps run on, found once as `jail run` finds it
/// (jail/src/locate.rs): `--rootfs`, `$JAIL_ROOTFS`, the policy's, else
/// the one named by `--rootfs-name` in the user's, the system's or the
/// build tree's folder. With no name given: `data` when the policy
/// preloads modules (they are the data stack's), else `data` where it is
/// installed and `minimal` where it is not. A rootfs that is not there is
/// one line naming the command that builds it.
fn steps_rootfs(
    flag: Option<PathBuf>,
    name: Option<&str>,
    policy: &jail::policy::Policy,
    jail_bin: &Path,
) -> anyhow::Result<PathBuf> {
    use jail::locate;
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let exe = std::fs::canonicalize(jail_bin).ok();
    let search = |name: &str| locate::Search {
        flag: flag.clone(),
        env: var("JAIL_ROOTFS"),
        policy: policy.rootfs.clone(),
        name: name.into(),
        user_dir: locate::user_dir(var("XDG_DATA_HOME"), var("HOME")),
        system_dir: PathBuf::from(locate::SYSTEM_DIR),
        build_tree: exe.as_deref().and_then(locate::build_tree),
    };
    let explicit = search(locate::DEFAULT_NAME)
        .candidates()
        .first()
        .is_some_and(|(from, _)| matches!(from, locate::Source::Flag | locate::Source::Env | locate::Source::Policy));
    let found: anyhow::Result<(locate::Source, PathBuf)> = match name {
        Some(n) => search(n).find().map_err(Into::into),
        None if !policy.preload.is_empty() && !explicit => search("data").find().map_err(|e| {
            anyhow::anyhow!(
                "the policy preloads {} (the data stack), so the steps need the data rootfs: {e}",
                policy.preload.join(", ")
            )
        }),
        None => search("data").find().or_else(|_| search(locate::DEFAULT_NAME).find()).map_err(Into::into),
    };
    found.map(|(_, p)| p)
}
