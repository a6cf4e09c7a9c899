//! The `jail-agent` command line: read the flags and the LLM_* environment,
//! run the task (or resume a stopped one), print the final answer and the
//! summary of tokens and time. Exit status: 0 finished, 1 the run failed,
//! 2 bad usage, 3 stopped at a cap or the deadline.

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
    /// Go on with a run that stopped on an error or was killed, from its
    /// last step (the session dir's state.json).
    Resume(Box<ResumeArgs>),
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
    /// Root filesystem of the steps (default: JAIL_ROOTFS, then the policy's).
    #[arg(long, value_name = "DIR", env = "JAIL_ROOTFS")]
    rootfs: Option<PathBuf>,
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
    // Before any thread: Ctrl-C, SIGTERM and SIGHUP stop the live sessions.
    if let Err(e) = agent::cells::guard_signals() {
        eprintln!("jail-agent: cannot take SIGINT/SIGTERM/SIGHUP ({e}): a session would outlive a killed agent; not starting");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run_task(*args),
        Command::Resume(args) => resume_task(*args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("jail-agent: {}", escape(&format!("{e:#}"), Lines::One));
            ExitCode::from(1)
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
    let rootfs = a.rootfs.clone().or_else(|| packages_rootfs(&policy, &jail_bin));
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
            rootfs: a.rootfs,
            timeout: a.step_timeout,
            wall_limit,
            stateless: a.stateless,
            pool_size: a.pool_size,
        },
        rootfs,
        skills_dir: a.skills,
        caps: Caps {
            subagent_steps: a.subagent_steps,
            subagent_tokens: a.subagent_tokens,
            run_steps: a.run_steps,
            run_tokens: a.run_tokens,
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
    if let Some(dest) = &config.output {
        eprintln!("jail-agent: copied {} files the jail accepted to {}", outcome.exported.copied.len(), dest.display());
        for s in &outcome.exported.skipped {
            eprintln!("jail-agent: not copied: {s}");
        }
    }
    Ok(match outcome.stop {
        Stop::Finished => ExitCode::SUCCESS,
        Stop::RunStepCap(_) | Stop::RunTokenCap(_) | Stop::Deadline(_) => ExitCode::from(3),
    })
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

/// The rootfs the steps run on when --rootfs is not given, found the way
/// `jail` finds it (jail/src/locate.rs), for `list_available_packages`.
fn packages_rootfs(policy: &jail::policy::Policy, jail_bin: &std::path::Path) -> Option<PathBuf> {
    use jail::locate;
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let exe = std::fs::canonicalize(jail_bin).ok();
    let search = locate::Search {
        flag: None,
        env: var("JAIL_ROOTFS"),
        policy: policy.rootfs.clone(),
        name: locate::DEFAULT_NAME.into(),
        user_dir: locate::user_dir(var("XDG_DATA_HOME"), var("HOME")),
        system_dir: PathBuf::from(locate::SYSTEM_DIR),
        build_tree: exe.as_deref().and_then(locate::build_tree),
    };
    search.find().ok().map(|(_, p)| p)
}
