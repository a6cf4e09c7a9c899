//! The run's state on disk, so a run that stopped (the model's endpoint
//! gave up, the agent was killed) continues with `jail-agent resume
//! SESSION` from its last step: the todo list, the orchestrator's and the
//! running sub-agent's conversations with the tool calls not yet answered,
//! the counters behind the caps, the accepted outputs, and the settings
//! needed to rebuild the run (never the API key). Saved as `state.json`
//! (0600) after every model reply and every tool call, by writing a fresh
//! file and renaming it over the old one, so a kill leaves the last whole
//! state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::agent::{Caps, Config, Progress, MOST_DEADLINE};
use crate::export::Accepted;
use crate::llm::{LlmConfig, Message, ToolCall};
use crate::runner::Runner;
use crate::session::Owner;
use crate::todo::{State, TodoList};
use crate::view::Budget;

/// Bumped when the layout changes; an older state is refused with a reason.
pub const VERSION: u32 = 1;
pub const FILE: &str = "state.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot save the run's state {path}: {error}")]
    Save { path: PathBuf, error: std::io::Error },
    #[error("{path} cannot be read: {error} (is this a session dir of jail-agent?)")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path} is not a state this jail-agent can resume: {cause}")]
    Parse { path: PathBuf, cause: String },
    #[error("the run in {path} already finished; its answer is in answer.md")]
    Finished { path: PathBuf },
}

/// A tool call of the latest reply, not answered yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub call: ToolCall,
    /// Its place in the reply, from 0, and how many calls the reply made.
    pub n: usize,
    pub of: usize,
    /// Its share of the reply's completion tokens.
    #[serde(default)]
    pub tokens_out: u64,
    /// Its `execute_tool` span, once it started (kept for a resumed
    /// `start_next_todo`, whose sub-agent hangs below it).
    #[serde(default)]
    pub span: Option<crate::trace::SpanStart>,
}

/// One agent's conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<Message>,
    /// Calls of the last reply still to run, in order.
    pub pending: Vec<Pending>,
    /// Replies in a row without a tool call.
    pub idle: u32,
    /// Messages already written to the trace (the next call records the rest).
    #[serde(default)]
    pub recorded: usize,
    /// Span of this agent's `invoke_agent` (see `trace`).
    pub span: crate::trace::SpanStart,
}

/// How a sub-agent ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubOutcome {
    pub state: State,
    pub report: String,
}

/// The running sub-agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubRun {
    /// Its todo item.
    pub index: usize,
    /// `subagent-N`.
    pub agent: String,
    /// Run-wide model calls and tokens when it started.
    pub steps0: u32,
    pub tokens0: u64,
    pub conv: Conversation,
    /// Set once it finished, before the orchestrator took its report.
    pub outcome: Option<SubOutcome>,
}

/// Everything a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    pub settings: Settings,
    /// The run's trace id (32 hex digits): spans of a resumed run join it.
    pub run_id: String,
    pub todo: TodoList,
    pub orchestrator: Conversation,
    pub sub: Option<SubRun>,
    pub steps: u32,
    pub tokens: u64,
    pub subagents: u32,
    pub accepted: Accepted,
    /// Milliseconds of wall time of the earlier parts of a resumed run.
    pub wall_ms_before: f64,
    pub finished: bool,
    /// The handle of the sub-task's `jail session` while one is live: a
    /// killed agent's `resume` stops it, so its files are judged and
    /// delivered rather than lost with it.
    #[serde(default)]
    pub live_session: Option<std::path::PathBuf>,
}

impl Checkpoint {
    pub fn path(root: &Path) -> PathBuf {
        root.join(FILE)
    }

    /// Write the state: a fresh 0600 file renamed over the last one.
    pub fn save(&self, root: &Path) -> Result<(), CheckpointError> {
        let path = Checkpoint::path(root);
        let tmp = root.join(format!(".{FILE}.part"));
        let text = serde_json::to_vec(self).map_err(|e| CheckpointError::Save { path: path.clone(), error: e.into() })?;
        crate::session::write_private(&tmp, &text)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|error| CheckpointError::Save { path, error })
    }

    pub fn load(root: &Path) -> Result<Checkpoint, CheckpointError> {
        let path = Checkpoint::path(root);
        let text = std::fs::read(&path).map_err(|error| CheckpointError::Read { path: path.clone(), error })?;
        let c: Checkpoint =
            serde_json::from_slice(&text).map_err(|e| CheckpointError::Parse { path: path.clone(), cause: e.to_string() })?;
        if c.version != VERSION {
            return Err(CheckpointError::Parse {
                path,
                cause: format!("state version {} (this agent reads {VERSION})", c.version),
            });
        }
        if c.finished {
            return Err(CheckpointError::Finished { path: root.to_path_buf() });
        }
        Ok(c)
    }
}

/// The settings of a run, without secrets: what `resume` rebuilds it from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub task: String,
    pub input: PathBuf,
    pub output: Option<PathBuf>,
    pub policy: Option<PathBuf>,
    pub jail: PathBuf,
    pub step_rootfs: Option<PathBuf>,
    pub step_timeout: Option<f64>,
    pub wall_limit_ms: u64,
    pub rootfs: Option<PathBuf>,
    pub skills_dir: Option<PathBuf>,
    pub subagent_steps: u32,
    pub subagent_tokens: u64,
    pub run_steps: u32,
    pub run_tokens: u64,
    pub calls_per_reply: usize,
    pub deadline_secs: f64,
    pub base_url: String,
    pub model: String,
    pub llm_timeout_ms: u64,
    pub retries: u32,
    pub retry_base_ms: u64,
    pub temperature: Option<f64>,
    pub max_reply_tokens: Option<u32>,
    pub trace_content: bool,
    /// One jail per step instead of a session per sub-task.
    #[serde(default)]
    pub stateless: bool,
    /// `--pool-size` (a state saved before the pool: 1, the default).
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
}

fn default_pool_size() -> usize {
    1
}

impl Settings {
    pub fn of(c: &Config) -> Settings {
        Settings {
            task: c.task.clone(),
            input: c.input.clone(),
            output: c.output.clone(),
            policy: c.runner.policy.clone(),
            jail: c.runner.jail.clone(),
            step_rootfs: c.runner.rootfs.clone(),
            step_timeout: c.runner.timeout,
            wall_limit_ms: c.runner.wall_limit.as_millis() as u64,
            rootfs: c.rootfs.clone(),
            skills_dir: c.skills_dir.clone(),
            subagent_steps: c.caps.subagent_steps,
            subagent_tokens: c.caps.subagent_tokens,
            run_steps: c.caps.run_steps,
            run_tokens: c.caps.run_tokens,
            calls_per_reply: c.caps.calls_per_reply,
            deadline_secs: c.caps.deadline.as_secs_f64(),
            base_url: c.llm.base_url.clone(),
            model: c.llm.model.clone(),
            llm_timeout_ms: c.llm.timeout.as_millis() as u64,
            retries: c.llm.max_retries,
            retry_base_ms: c.llm.retry_base.as_millis() as u64,
            temperature: c.llm.temperature,
            max_reply_tokens: c.llm.max_reply_tokens,
            trace_content: c.trace_content == crate::trace::Content::Recorded,
            stateless: c.runner.stateless,
            pool_size: c.runner.pool_size,
        }
    }

    /// The run's config again; the API key is the caller's to give anew.
    pub fn config(&self, owner: Owner, progress: Progress, api_key: Option<String>) -> Config {
        Config {
            task: self.task.clone(),
            input: self.input.clone(),
            output: self.output.clone(),
            session_parent: None,
            llm: LlmConfig {
                base_url: self.base_url.clone(),
                model: self.model.clone(),
                api_key,
                timeout: Duration::from_millis(self.llm_timeout_ms),
                max_retries: self.retries,
                retry_base: Duration::from_millis(self.retry_base_ms),
                temperature: self.temperature,
                max_reply_tokens: self.max_reply_tokens,
            },
            runner: Runner {
                jail: self.jail.clone(),
                policy: self.policy.clone(),
                rootfs: self.step_rootfs.clone(),
                timeout: self.step_timeout,
                wall_limit: Duration::from_millis(self.wall_limit_ms),
                stateless: self.stateless,
                pool_size: self.pool_size,
            },
            rootfs: self.rootfs.clone(),
            skills_dir: self.skills_dir.clone(),
            caps: Caps {
                subagent_steps: self.subagent_steps,
                subagent_tokens: self.subagent_tokens,
                run_steps: self.run_steps,
                run_tokens: self.run_tokens,
                calls_per_reply: self.calls_per_reply,
                // A state.json edited by hand can hold any finite number
                // (1e300 would panic the conversion): held to --deadline's range.
                deadline: Duration::from_secs_f64(self.deadline_secs.clamp(1.0, MOST_DEADLINE.as_secs_f64())),
            },
            budget: Budget::default(),
            owner,
            progress,
            trace_content: if self.trace_content {
                crate::trace::Content::Recorded
            } else {
                crate::trace::Content::Omitted
            },
        }
    }
}
