//! What one run is given: the task, its folders, the model, the runner,
//! and its caps (`Caps`). A leaf of the run (agent.rs) and its saved state
//! (checkpoint.rs), which both read it.

use std::path::PathBuf;
use std::time::Duration;

use crate::llm::LlmConfig;
use crate::runner::Runner;
use crate::session::Owner;
use crate::trace::Content;
use crate::view::Budget;

/// Step and token caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Model calls one sub-agent may make.
    pub subagent_steps: u32,
    /// Tokens (in + out) one sub-agent may use.
    pub subagent_tokens: u64,
    /// Model calls the whole run may make, orchestrator included.
    pub run_steps: u32,
    /// Tokens (in + out) the whole run may use.
    pub run_tokens: u64,
    /// Model calls the orchestrator itself may make (its sub-agents' not
    /// counted).
    pub orchestrator_steps: u32,
    /// Tokens (in + out) the orchestrator itself may use.
    pub orchestrator_tokens: u64,
    /// Tool calls run from one reply; the rest are answered with an error.
    pub calls_per_reply: usize,
    /// Wall-clock time the whole run may take (a resumed run: from resuming),
    /// at most [`MOST_DEADLINE`].
    pub deadline: Duration,
}

/// The longest `deadline` a run takes: a week.
pub const MOST_DEADLINE: Duration = Duration::from_secs(7 * 86_400);

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            subagent_steps: 25,
            subagent_tokens: 400_000,
            run_steps: 150,
            run_tokens: 2_000_000,
            orchestrator_steps: 60,
            orchestrator_tokens: 600_000,
            calls_per_reply: 8,
            deadline: Duration::from_secs(30 * 60),
        }
    }
}

/// Whether the run reports its progress on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Quiet,
    Stderr,
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub task: String,
    pub input: PathBuf,
    /// Where the output's accepted files are copied at the end, if anywhere.
    pub output: Option<PathBuf>,
    /// The folder the session dir is created in (default: the temp dir).
    pub session_parent: Option<PathBuf>,
    pub llm: LlmConfig,
    pub runner: Runner,
    /// The rootfs `list_available_packages` reads.
    pub rootfs: Option<PathBuf>,
    pub skills_dir: Option<PathBuf>,
    pub caps: Caps,
    pub budget: Budget,
    pub owner: Owner,
    pub progress: Progress,
    /// Whether the trace keeps prompts, completions and tool contents.
    pub trace_content: Content,
}
