//! The run's state on disk, so a run that stopped (the model's endpoint
//! gave up, the agent was killed) continues with `jail-agent resume
//! SESSION` from its last step: the todo list, the orchestrator's and the
//! running sub-agent's conversations with the tool calls not yet answered,
//! the counters behind the caps, the accepted outputs, and the settings
//! needed to rebuild the run (never the API key).
//!
//! Saved as `state.json` (0600) after every model reply and every call that
//! changes the plan, by writing a fresh file and renaming it over the old
//! one, so a kill leaves the last whole state. Between two such saves each
//! answered call is appended to `state.journal` (0600) as one line — its
//! answer and what it changed — so a call costs what its answer weighs,
//! never the whole conversation again: a reply of 150 calls is one save and
//! 150 short appends. Loading replays the journal lines that follow the
//! saved state (each names the save it follows; a line torn by a kill, or
//! one of an older save, is not replayed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{Caps, Config, Progress, MOST_DEADLINE};
use crate::export::Accepted;
use crate::llm::{LlmConfig, Message, ToolCall};
use crate::runner::Runner;
use crate::session::Owner;
use crate::todo::{State, TodoList};
use crate::view::Budget;

/// Bumped when the layout changes; an older state is refused with a reason.
pub const VERSION: u32 = 1;
pub const FILE: &str = "state.json";
/// The calls answered since `state.json` was written.
pub const JOURNAL: &str = "state.journal";
/// The longest journal line read back (an answer is bounded far below).
const MOST_JOURNAL_LINE: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot save the run's state {path}: {error}")]
    Save { path: PathBuf, error: std::io::Error },
    #[error("{path} cannot be read: {error} (is this a session dir of jail-agent?)")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path} is not a state this jail-agent can resume: {cause}")]
    Parse { path: PathBuf, cause: String },
    #[error(
        "the run in {path} already finished; its answer is in answer.md (to copy its files again: jail-agent export {path})"
    )]
    Finished { path: PathBuf },
}

/// Whose conversation a journal line answers a call of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Whose {
    Orchestrator,
    /// The running sub-agent (`Checkpoint::sub`).
    SubAgent,
}

/// One answered call, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answered {
    /// The save of `state.json` this follows (`Checkpoint::saves`).
    pub after: u64,
    pub whose: Whose,
    /// The call it answers: the first pending call of that conversation.
    pub tool_call_id: String,
    /// What the model was told.
    pub content: String,
    /// The accepted outputs after the call, when it changed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<Accepted>,
    /// The live session's handle after the call, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_session: Option<Option<PathBuf>>,
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
    /// The orchestrator's own model calls and tokens (its cap's counters).
    #[serde(default)]
    pub orchestrator_steps: u32,
    #[serde(default)]
    pub orchestrator_tokens: u64,
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
    /// How many times this state was saved whole: the journal's lines
    /// name the save they follow.
    #[serde(default)]
    pub saves: u64,
}

impl Checkpoint {
    /// The state of a run that has not begun.
    pub fn new(settings: Settings, run_id: String) -> Checkpoint {
        Checkpoint {
            version: VERSION,
            settings,
            run_id,
            todo: TodoList::default(),
            orchestrator: Conversation::default(),
            sub: None,
            steps: 0,
            tokens: 0,
            orchestrator_steps: 0,
            orchestrator_tokens: 0,
            subagents: 0,
            accepted: Accepted::default(),
            wall_ms_before: 0.0,
            finished: false,
            live_session: None,
            saves: 0,
        }
    }

    pub fn path(root: &Path) -> PathBuf {
        root.join(FILE)
    }

    /// Write the state: a fresh 0600 file renamed over the last one; the
    /// journal of the calls since the last save is then emptied.
    pub fn save(&mut self, root: &Path) -> Result<(), CheckpointError> {
        let path = Checkpoint::path(root);
        let tmp = root.join(format!(".{FILE}.part"));
        self.saves += 1;
        let text = serde_json::to_vec(self).map_err(|e| CheckpointError::Save { path: path.clone(), error: e.into() })?;
        crate::session::write_private(&tmp, &text)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|error| CheckpointError::Save { path, error })?;
        // Its lines name the save before this one: stale either way, and
        // a kill between the rename and this leaves them unread.
        match std::fs::remove_file(root.join(JOURNAL)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(CheckpointError::Save { path: root.join(JOURNAL), error: e })
            }
            _ => Ok(()),
        }
    }

    /// Append one answered call to the journal (one write of one line).
    pub fn append(root: &Path, entry: &Answered) -> Result<(), CheckpointError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = root.join(JOURNAL);
        let mut line = serde_json::to_vec(entry).map_err(|e| CheckpointError::Save { path: path.clone(), error: e.into() })?;
        line.push(b'\n');
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| f.write_all(&line))
            .map_err(|error| CheckpointError::Save { path, error })
    }

    /// The state of a run that can go on: refused once it finished.
    pub fn load(root: &Path) -> Result<Checkpoint, CheckpointError> {
        let c = Checkpoint::load_any(root)?;
        if c.finished {
            return Err(CheckpointError::Finished { path: root.to_path_buf() });
        }
        Ok(c)
    }

    /// The saved state with the journal's calls replayed, finished or not.
    pub fn load_any(root: &Path) -> Result<Checkpoint, CheckpointError> {
        let path = Checkpoint::path(root);
        let text = std::fs::read(&path).map_err(|error| CheckpointError::Read { path: path.clone(), error })?;
        let mut c: Checkpoint =
            serde_json::from_slice(&text).map_err(|e| CheckpointError::Parse { path: path.clone(), cause: e.to_string() })?;
        if c.version != VERSION {
            return Err(CheckpointError::Parse {
                path,
                cause: format!("state version {} (this agent reads {VERSION})", c.version),
            });
        }
        c.replay(root);
        Ok(c)
    }

    /// Apply the journal's lines that follow this save, in order, up to
    /// the first that does not fit (torn, stale, or not the next call).
    fn replay(&mut self, root: &Path) {
        use std::io::{BufRead as _, Read as _};
        let Ok(f) = crate::export::open_file_beneath(root, Path::new(JOURNAL)) else { return };
        let mut r = std::io::BufReader::new(f);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.by_ref().take(MOST_JOURNAL_LINE as u64).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let Ok(a) = serde_json::from_slice::<Answered>(&line) else { return };
            if a.after != self.saves || !self.apply(a) {
                return;
            }
        }
    }

    /// One answered call: its conversation's first pending call answered.
    fn apply(&mut self, a: Answered) -> bool {
        let conv = match a.whose {
            Whose::Orchestrator => &mut self.orchestrator,
            Whose::SubAgent => match &mut self.sub {
                Some(sub) => &mut sub.conv,
                None => return false,
            },
        };
        if conv.pending.first().is_none_or(|p| p.call.id != a.tool_call_id) {
            return false;
        }
        conv.pending.remove(0);
        conv.messages.push(Message::Tool { tool_call_id: a.tool_call_id, content: a.content });
        if let Some(accepted) = a.accepted {
            self.accepted = accepted;
        }
        if let Some(live) = a.live_session {
            self.live_session = live;
        }
        true
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
    #[serde(default = "default_orchestrator_steps")]
    pub orchestrator_steps: u32,
    #[serde(default = "default_orchestrator_tokens")]
    pub orchestrator_tokens: u64,
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

fn default_orchestrator_steps() -> u32 {
    Caps::default().orchestrator_steps
}

fn default_orchestrator_tokens() -> u64 {
    Caps::default().orchestrator_tokens
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
            orchestrator_steps: c.caps.orchestrator_steps,
            orchestrator_tokens: c.caps.orchestrator_tokens,
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
                orchestrator_steps: self.orchestrator_steps,
                orchestrator_tokens: self.orchestrator_tokens,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> Pending {
        Pending {
            call: ToolCall { id: id.into(), name: "list_input_files".into(), arguments: "{}".into() },
            n: 0,
            of: 1,
            tokens_out: 0,
            span: None,
        }
    }

    fn state(dir: &Path) -> Checkpoint {
        let config = Config {
            task: "t".into(),
            input: dir.into(),
            output: None,
            session_parent: None,
            llm: LlmConfig {
                base_url: "http://h/v1".into(),
                model: "m".into(),
                api_key: None,
                timeout: Duration::from_secs(1),
                max_retries: 0,
                retry_base: Duration::from_millis(1),
                temperature: None,
                max_reply_tokens: None,
            },
            runner: Runner {
                jail: "jail".into(),
                policy: None,
                rootfs: None,
                timeout: None,
                wall_limit: Duration::from_secs(1),
                stateless: false,
                pool_size: 1,
            },
            rootfs: None,
            skills_dir: None,
            caps: Caps::default(),
            budget: Budget::default(),
            owner: Owner::Caller,
            progress: Progress::Quiet,
            trace_content: crate::trace::Content::Recorded,
        };
        let mut st = Checkpoint::new(Settings::of(&config), "0".repeat(32));
        st.orchestrator.pending = vec![call("a"), call("b"), call("c")];
        st
    }

    fn answered(after: u64, id: &str) -> Answered {
        Answered {
            after,
            whose: Whose::Orchestrator,
            tool_call_id: id.into(),
            content: format!("answer {id}"),
            accepted: None,
            live_session: None,
        }
    }

    #[test]
    fn answered_calls_are_appended_and_replayed_on_load_and_a_save_empties_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state(dir.path());
        st.save(dir.path()).unwrap();
        assert_eq!(st.saves, 1);
        for id in ["a", "b"] {
            Checkpoint::append(dir.path(), &answered(st.saves, id)).unwrap();
        }
        let back = Checkpoint::load(dir.path()).unwrap();
        assert_eq!(back.orchestrator.pending.iter().map(|p| p.call.id.as_str()).collect::<Vec<_>>(), ["c"]);
        let told: Vec<&Message> = back.orchestrator.messages.iter().collect();
        assert_eq!(
            told,
            [
                &Message::Tool { tool_call_id: "a".into(), content: "answer a".into() },
                &Message::Tool { tool_call_id: "b".into(), content: "answer b".into() }
            ]
        );
        // A whole save replaces the journal.
        let mut st = back;
        st.save(dir.path()).unwrap();
        assert!(!dir.path().join(JOURNAL).exists());
        assert_eq!(Checkpoint::load(dir.path()).unwrap().orchestrator.messages.len(), 2);
    }

    #[test]
    fn a_stale_a_torn_or_an_out_of_order_journal_line_is_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state(dir.path());
        st.save(dir.path()).unwrap();
        // A line of an older save (a kill between the rename and the
        // journal's removal), then one that does not answer the next call.
        Checkpoint::append(dir.path(), &answered(0, "a")).unwrap();
        assert!(Checkpoint::load(dir.path()).unwrap().orchestrator.messages.is_empty());
        std::fs::remove_file(dir.path().join(JOURNAL)).unwrap();
        Checkpoint::append(dir.path(), &answered(1, "b")).unwrap();
        assert!(Checkpoint::load(dir.path()).unwrap().orchestrator.messages.is_empty());
        // A good line, then a torn one: the good one stands.
        std::fs::remove_file(dir.path().join(JOURNAL)).unwrap();
        Checkpoint::append(dir.path(), &answered(1, "a")).unwrap();
        let mut torn = serde_json::to_vec(&answered(1, "b")).unwrap();
        torn.truncate(torn.len() / 2);
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(JOURNAL))
            .unwrap()
            .write_all(&torn)
            .unwrap();
        let back = Checkpoint::load(dir.path()).unwrap();
        assert_eq!(back.orchestrator.messages.len(), 1);
        assert_eq!(back.orchestrator.pending.len(), 2);
    }

    #[test]
    fn a_journal_line_carries_what_the_call_changed() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state(dir.path());
        st.save(dir.path()).unwrap();
        let mut accepted = Accepted::default();
        accepted.files.insert("n.txt".into(), crate::export::AcceptedFile { bytes: 3, sha256: "ab".into() });
        let mut a = answered(1, "a");
        a.accepted = Some(accepted.clone());
        a.live_session = Some(Some("/run/s.sock".into()));
        Checkpoint::append(dir.path(), &a).unwrap();
        let back = Checkpoint::load(dir.path()).unwrap();
        assert_eq!((back.accepted, back.live_session), (accepted, Some(PathBuf::from("/run/s.sock"))));
    }
}
