//! The run: a plan-execute orchestrator over ReAct sub-agents.
//!
//! The orchestrator sees the task and the input files, plans a todo list,
//! and calls `start_next_todo` for each item; that starts a sub-agent with a
//! clean context (its own system prompt and the item's brief, nothing of the
//! orchestrator's conversation) which writes and runs scripts — as cells of
//! the item's session, claimed from the run's warm pool (`pool`), or each in
//! a fresh jail with `--stateless` — until it calls `complete_todo` or
//! `block_todo`. Its report is the orchestrator's tool result. When nothing
//! is pending, the orchestrator's plain-text reply is the final answer. The
//! pool is closed at the end, however the run ended, and a `pool` record
//! says what became of it.
//!
//! Caps: a step is one model call. Each sub-agent and the whole run have a
//! step cap and a token cap (tokens in plus out); a sub-agent at its cap is
//! stopped and its item blocked with the reason, and a run at its cap or
//! past its deadline stops cleanly with an answer the agent writes itself
//! from the reports so far. At most `calls_per_reply` tool calls of one
//! reply run; the rest are answered with an error that says why.
//!
//! Every conversation is a list of messages plus the tool calls of the last
//! reply not yet answered; the run's state (`checkpoint`) is saved after
//! every reply and every call, so a run that stopped on an error (the
//! model's endpoint gave up) or was killed goes on with `resume` from there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::checkpoint::{Checkpoint, CheckpointError, Conversation, Pending, Settings, SubOutcome, SubRun, Whose};
pub use crate::config::{Caps, Config, Progress, MOST_DEADLINE};
use crate::escape::{cut, shown};
use crate::export::{Accepted, ExportError, Exported};
use crate::llm::{self, Client, LlmError, Message, Reply};
use crate::progress::Display;
use crate::session::{Owner, Session, SessionError};
use crate::skills::{SkillError, Skills};
use crate::todo::{PlannedItem, State, TodoList};
use crate::tools::{self, parse_args, Context, Done, Role};
use crate::trace::{self, Content, Event, SpanStart, Summary, Trace, TraceError};

const ORCHESTRATOR_PROMPT: &str = include_str!("../prompts/orchestrator.md");
const SUBAGENT_PROMPT: &str = include_str!("../prompts/subagent.md");

/// What the sub-agent is told about state, by mode.
const SESSION_NOTE: &str = "Your scripts run in one Python session for this item: variables, imports and DataFrames defined by one script are still defined in the next, so load each file once and reuse it. Files written to /workspace/output reach the host when the item ends; print them from a script to check them before that. If a result says the session ended, everything defined so far is gone: load the data again in the next script.";
const STATELESS_NOTE: &str = "Every run starts from scratch: nothing but the files in /workspace/output survives.";
const ORCHESTRATOR: &str = "orchestrator";
/// How long `resume` waits for a killed run's session to finish ending
/// (its delivery) before the output is judged again.
const ORPHAN_WAIT: Duration = Duration::from_secs(30);

/// Most bytes of a not-run call's arguments the trace keeps.
const NOT_RUN_ARGUMENTS: usize = 1024;

/// Longest report or reason a sub-agent may hand back, in bytes.
const MAX_REPORT_BYTES: usize = 2000;
/// Longest final answer shown on the terminal (the whole is in answer.md).
pub const ANSWER_PREVIEW_BYTES: usize = 8000;

/// Why the run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    Finished,
    RunStepCap(u32),
    /// The run's tokens reached `cap`; `reached` is where the last reply
    /// took them (past the cap when one reply overshot it).
    RunTokenCap {
        cap: u64,
        reached: u64,
    },
    OrchestratorStepCap(u32),
    OrchestratorTokenCap {
        cap: u64,
        reached: u64,
    },
    /// The run's wall-clock deadline passed.
    Deadline(Duration),
    /// A signal told the run to stop (stop.rs); `resume` goes on.
    Signal(Signal),
}

impl Stop {
    pub fn describe(&self) -> String {
        let over = |cap: u64, reached: u64| {
            if reached > cap {
                format!("; the last reply took it to {reached}, {} over", reached - cap)
            } else {
                String::new()
            }
        };
        match self {
            Stop::Finished => "finished".into(),
            Stop::RunStepCap(n) => format!("run step cap reached ({n} model calls)"),
            Stop::RunTokenCap { cap, reached } => format!("run token cap reached ({cap} tokens{})", over(*cap, *reached)),
            Stop::OrchestratorStepCap(n) => format!("orchestrator step cap reached ({n} model calls)"),
            Stop::OrchestratorTokenCap { cap, reached } => {
                format!("orchestrator token cap reached ({cap} tokens{})", over(*cap, *reached))
            }
            Stop::Deadline(d) => format!("run deadline reached ({} s)", d.as_secs()),
            Stop::Signal(sig) => format!("stopped by {sig}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Skills(#[from] SkillError),
    #[error(transparent)]
    Llm(LlmError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("export: {0}")]
    Export(#[from] ExportError),
    #[error("the model answered {times} times without calling a tool (last reply: {reply:?}); this agent needs a model and server with tool calling (function calling): check LLM_MODEL and the server's tool support")]
    NoToolCalls { times: u32, reply: String },
    #[error("the model stopped calling tools: after {calls} tool calls it answered {times} times in a row with text alone, {what} (last reply: {reply:?})")]
    StoppedCallingTools {
        calls: usize,
        times: u32,
        what: &'static str,
        reply: String,
    },
    #[error("stop the sub-task's sandbox session: {0}")]
    SandboxSession(String),
    #[error("{0}")]
    Preflight(String),
    /// A signal told the run to stop: not an error, the run ends as
    /// `Stop::Signal` (drive).
    #[error("stopped by {0}")]
    Stopped(Signal),
}

impl AgentError {
    /// Whether `resume` can go on after this error: the model's endpoint
    /// failed, the run's state is intact.
    pub fn resumable(&self) -> bool {
        matches!(self, AgentError::Llm(_) | AgentError::Stopped(_))
    }
}

impl From<LlmError> for AgentError {
    fn from(e: LlmError) -> AgentError {
        match (&e, crate::stop::requested()) {
            (LlmError::Stopped(_), Some(sig)) => AgentError::Stopped(sig),
            _ => AgentError::Llm(e),
        }
    }
}

/// A failed run, with the session it left (trace, summary and state saved).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Failure {
    pub error: AgentError,
    pub session: Option<PathBuf>,
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub session: Session,
    pub answer: String,
    pub stop: Stop,
    pub todo: TodoList,
    pub summary: Summary,
    /// Files copied to `Config::output`, and the accepted ones that were not.
    pub exported: Exported,
    /// Why the export to `Config::output` failed, when it did: the session
    /// keeps everything, and `jail-agent export SESSION` does it again.
    pub export_error: Option<String>,
}

impl Outcome {
    /// Whether every item of the plan was completed (there was a plan).
    pub fn all_done(&self) -> bool {
        !self.todo.items.is_empty() && self.todo.items.iter().all(|i| i.state == State::Done)
    }
}

fn fail(error: impl Into<AgentError>, session: Option<&Session>) -> Failure {
    Failure { error: error.into(), session: session.map(|s| s.root.clone()) }
}

fn display_for(config: &Config) -> Display {
    Display::new(config.progress == Progress::Quiet)
}

/// Run a task to its end.
pub fn run(config: &Config) -> Result<Outcome, Failure> {
    run_with(config, Vec::new())
}

/// Run a task, handing every trace record to `sinks` too (the OTLP exporter).
pub fn run_with(config: &Config, sinks: Vec<Box<dyn trace::Sink>>) -> Result<Outcome, Failure> {
    let started = Instant::now();
    let skills = Skills::load(config.skills_dir.as_deref()).map_err(|e| fail(e, None))?;
    let session = Session::create(config.session_parent.as_deref(), &config.input, config.owner).map_err(|e| fail(e, None))?;
    let run_id = trace::new_id(16);
    let mut trace = Trace::create(&session.trace_path(), started, run_id.clone(), config.trace_content)
        .map_err(|e| fail(e, Some(&session)))?;
    for s in sinks {
        trace.add_sink(s);
    }
    let display = display_for(config);
    if config.progress == Progress::Stderr {
        eprintln!("jail-agent: session {}", session.root.display());
        for s in &session.skipped_input {
            eprintln!("jail-agent: input {}", shown(s));
        }
    }
    let mut orchestrator = Conversation { span: SpanStart::now(None), ..Conversation::default() };
    let system = ORCHESTRATOR_PROMPT.replace("{skills}", &skills.index());
    let mut st = Checkpoint::new(Settings::of(config), run_id);
    let inputs = {
        let cells = crate::cells::Cells::default();
        let pool = crate::pool::Pool::new(&config.runner, &session, display.clone());
        let ctx = Context {
            session: &session,
            runner: &config.runner,
            cells: &cells,
            pool: &pool,
            skills: &skills,
            rootfs: config.rootfs.as_deref(),
            budget: config.budget,
            accepted: &st.accepted,
            deadline: started + config.caps.deadline,
            progress: &display,
            agent: ORCHESTRATOR,
        };
        ctx.call("list_input_files", "{}").content
    };
    orchestrator.messages = vec![
        Message::System(system),
        Message::User(format!("Task:\n{}\n\nInput files:\n{inputs}", config.task.trim())),
    ];
    st.orchestrator = orchestrator;
    st.save(&session.root).map_err(|e| fail(e, Some(&session)))?;
    drive(config, &session, &skills, trace, st, started, display)
}

/// Go on with the run saved in `root` (see `checkpoint`).
pub fn resume(config: &Config, root: &Path, sinks: Vec<Box<dyn trace::Sink>>) -> Result<Outcome, Failure> {
    let started = Instant::now();
    let mut st = Checkpoint::load(root).map_err(|e| fail(e, None))?;
    let session = Session::reopen(root, config.owner).map_err(|e| fail(e, None))?;
    let skills = Skills::load(config.skills_dir.as_deref()).map_err(|e| fail(e, Some(&session)))?;
    let before = trace::read(&session.trace_path()).unwrap_or_default();
    st.wall_ms_before = before
        .iter()
        .rev()
        .find_map(|r| match r.event {
            Event::RunEnd { wall_ms, .. } => Some(wall_ms),
            _ => None,
        })
        .unwrap_or_else(|| before.last().map_or(0.0, |r| r.t_ms));
    let mut trace = Trace::resume(&session.trace_path(), started, st.run_id.clone(), config.trace_content, st.wall_ms_before)
        .map_err(|e| fail(e, Some(&session)))?;
    for s in sinks {
        trace.add_sink(s);
    }
    let display = display_for(config);
    // The orchestrator's span of the earlier part ended (or was lost with
    // the process); this part gets its own, in the same trace.
    st.orchestrator.span = SpanStart::now(None);
    if config.progress == Progress::Stderr {
        eprintln!("jail-agent: session {} (resumed)", session.root.display());
    }
    drive(config, &session, &skills, trace, st, started, display)
}

fn drive(
    config: &Config,
    session: &Session,
    skills: &Skills,
    trace: Trace,
    st: Checkpoint,
    started: Instant,
    display: Display,
) -> Result<Outcome, Failure> {
    // Before the first model call: the steps' rootfs and policy, with one
    // tiny step (preflight.rs). A wrong one costs nothing but this.
    crate::preflight::check(&config.runner, session).map_err(|e| fail(AgentError::Preflight(e), Some(session)))?;
    let mut run = Run {
        config,
        client: Client::new(config.llm.clone()),
        session,
        skills,
        trace,
        st,
        stop: None,
        deadline: started + config.caps.deadline,
        cells: crate::cells::Cells::default(),
        pool: crate::pool::Pool::new(&config.runner, session, display.clone()),
        display,
    };
    // The pool makes its first jail while the orchestrator plans.
    run.pool.start_early(&config.runner);
    run.stop_orphaned_session();
    let result = match run.orchestrate() {
        // A signal: the run ends as at a cap, with what it has so far.
        Err(AgentError::Stopped(sig)) => Ok(run.stopped_answer(Stop::Signal(sig))),
        other => other,
    };
    // The pool goes before the run's last record, whatever happened: its
    // state and stats are the summary's.
    let pooled = run.close_pool();
    let stop = match &result {
        Ok(_) => run.stop.clone().unwrap_or(Stop::Finished).describe(),
        Err(e) if e.resumable() => format!("error (resumable): {e}"),
        Err(e) => format!("error: {e}"),
    };
    let wall_ms = run.trace.elapsed_ms();
    let span = run.st.orchestrator.span.clone();
    let items = run.st.todo.items.iter().map(crate::trace::ItemEnd::of).collect();
    let end = pooled.and(run.trace.record(ORCHESTRATOR, None, &span, Event::RunEnd { stop: stop.clone(), wall_ms, items }));
    run.trace.flush();
    let summary = Summary::from_records(&run.trace.records, wall_ms, &stop);
    let saved = summary.save(&session.root);
    let answer = match result {
        Ok(a) => a,
        Err(e) => return Err(fail(e, Some(session))),
    };
    end.and(saved).map_err(|e| fail(e, Some(session)))?;
    crate::session::write_private(&session.root.join("answer.md"), format!("{answer}\n").as_bytes())
        .map_err(|error| fail(TraceError::Write { path: session.root.join("answer.md"), error }, Some(session)))?;
    let stop = run.stop.clone().unwrap_or(Stop::Finished);
    // A run a signal stopped is not finished: `resume` goes on from here.
    run.st.finished = !matches!(stop, Stop::Signal(_));
    run.save().map_err(|e| fail(e, Some(session)))?;
    // A failed export loses nothing: the session keeps the files, the
    // answer and the summary are shown, and `jail-agent export SESSION`
    // copies them again. A stopped run is exported when it finishes.
    let (exported, export_error) = match &config.output {
        Some(dest) if !matches!(stop, Stop::Signal(_)) => match crate::export::export(&session.output, &run.st.accepted, dest) {
            Ok(e) => (e, None),
            Err(e) => (Exported::default(), Some(e.to_string())),
        },
        _ => (Exported::default(), None),
    };
    Ok(Outcome {
        session: session.clone(),
        answer,
        stop,
        todo: run.st.todo.clone(),
        summary,
        exported,
        export_error,
    })
}

struct Run<'a> {
    config: &'a Config,
    client: Client,
    session: &'a Session,
    skills: &'a Skills,
    trace: Trace,
    /// The state that is saved: todo, conversations, counters, accepted files.
    st: Checkpoint,
    stop: Option<Stop>,
    /// When the run must stop.
    deadline: Instant,
    display: Display,
    /// The running sub-task's `jail session` (cells.rs). Before `pool`:
    /// dropped first, so a session is stopped by us before its pool closes.
    cells: crate::cells::Cells,
    /// The run's warm pool (pool.rs), where each sub-task's session is claimed.
    pool: crate::pool::Pool,
}

/// What one agent is at, for its records.
struct Who<'a> {
    agent: &'a str,
    todo: Option<&'a str>,
    /// The agent's `invoke_agent` span: the parent of its calls.
    span: &'a str,
}

impl Run<'_> {
    fn say(&self, agent: &str, line: &str) {
        self.display.say(agent, line);
    }

    fn save(&mut self) -> Result<(), AgentError> {
        Ok(self.st.save(&self.session.root)?)
    }

    /// The run cap, if it is reached.
    fn run_cap(&self) -> Option<Stop> {
        let caps = self.config.caps;
        if self.st.steps >= caps.run_steps {
            Some(Stop::RunStepCap(caps.run_steps))
        } else if self.st.tokens >= caps.run_tokens {
            Some(Stop::RunTokenCap { cap: caps.run_tokens, reached: self.st.tokens })
        } else if Instant::now() >= self.deadline {
            Some(Stop::Deadline(caps.deadline))
        } else {
            None
        }
    }

    /// One model call on `conv`: the reply is added to it, its tool calls
    /// become its pending calls, each with its share of the tokens.
    fn model_call(&mut self, who: &Who, conv: &mut Conversation, role: Role) -> Result<Reply, AgentError> {
        let specs = tools::specs(role, self.skills, self.config.runner.stateless);
        if let Some(sig) = crate::stop::requested() {
            return Err(AgentError::Stopped(sig));
        }
        let span = SpanStart::now(Some(who.span));
        let reply = {
            let _status = self.display.waiting_for_model(who.agent, self.st.tokens);
            let display = self.display.clone();
            // Each retried attempt is shown as it happens.
            let mut tell = |r: &llm::Retry| {
                display.say(
                    who.agent,
                    &format!(
                        "model: attempt {} of {} failed ({}); retrying in {:.1} s",
                        r.attempt,
                        r.attempts_max,
                        r.error,
                        r.wait.as_secs_f64()
                    ),
                )
            };
            self.client.chat_watched(&conv.messages, &specs, &mut tell)?
        };
        self.st.steps += 1;
        self.st.tokens += reply.usage.input + reply.usage.output;
        if who.agent == ORCHESTRATOR {
            self.st.orchestrator_steps += 1;
            self.st.orchestrator_tokens += reply.usage.input + reply.usage.output;
        }
        let sizes: Vec<usize> = reply.tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).collect();
        let shares = trace::split_tokens(reply.usage.output, &sizes);
        let assistant = Message::Assistant { content: reply.content.clone(), tool_calls: reply.tool_calls.clone() };
        let recorded = self.trace.content == Content::Recorded;
        let input_messages =
            recorded.then(|| conv.messages[conv.recorded.min(conv.messages.len())..].iter().map(content_json).collect());
        // Bounded per call whatever the reply: each call's arguments get
        // their share of one record's budget.
        let output_message = recorded.then(|| reply_json(&assistant));
        self.trace.record(
            who.agent,
            who.todo,
            &span,
            Event::ModelCall {
                model: self.config.llm.model.clone(),
                tokens_in: reply.usage.input,
                tokens_out: reply.usage.output,
                tokens_estimated: reply.usage.estimated,
                duration_ms: reply.duration.as_secs_f64() * 1000.0,
                attempts: reply.attempts,
                retries: reply.retries.clone(),
                finish_reason: reply.finish_reason.clone(),
                tool_calls: reply.tool_calls.iter().map(|c| cut(&c.name, 100)).collect(),
                tool_call_ids: reply.tool_calls.iter().map(|c| cut(&c.id, 100)).collect(),
                input_messages,
                output_message,
            },
        )?;
        conv.messages.push(assistant);
        conv.recorded = conv.messages.len();
        let of = reply.tool_calls.len();
        conv.pending = reply
            .tool_calls
            .iter()
            .zip(shares)
            .enumerate()
            .map(|(n, (call, tokens_out))| Pending { call: call.clone(), n, of, tokens_out, span: None })
            .collect();
        Ok(reply)
    }

    fn record_tool(&mut self, who: &Who, p: &Pending, span: &SpanStart, done: &Done, ms: f64) -> Result<(), AgentError> {
        self.record_call(who, p, span, done, ms, trace::MAX_CONTENT_BYTES)
    }

    /// A call that was not run: its arguments kept to `NOT_RUN_ARGUMENTS`
    /// bytes (a reply of many large calls leaves a bounded trace).
    fn record_not_run(&mut self, who: &Who, p: &Pending, span: &SpanStart, done: &Done) -> Result<(), AgentError> {
        self.record_call(who, p, span, done, 0.0, NOT_RUN_ARGUMENTS)
    }

    fn record_call(
        &mut self,
        who: &Who,
        p: &Pending,
        span: &SpanStart,
        done: &Done,
        ms: f64,
        most: usize,
    ) -> Result<(), AgentError> {
        let error = (!done.ok).then(|| llm::excerpt(&done.content, 600));
        let arguments = self.trace.content_of(&p.call.arguments).map(|a| cut(&a, most));
        let result = self.trace.content_of(&done.content);
        self.trace.record(
            who.agent,
            who.todo,
            span,
            Event::ToolCall {
                tool: cut(&p.call.name, 100),
                call_id: cut(&p.call.id, 100),
                ok: done.ok,
                duration_ms: ms,
                error,
                jail: done.jail.clone().map(Box::new),
                tokens_out: p.tokens_out,
                arguments,
                result,
                result_bytes: done.content.len() as u64,
            },
        )?;
        Ok(())
    }

    fn context<'b>(&'b self, agent: &'b str) -> Context<'b> {
        Context {
            session: self.session,
            runner: &self.config.runner,
            cells: &self.cells,
            pool: &self.pool,
            skills: self.skills,
            rootfs: self.config.rootfs.as_deref(),
            budget: self.config.budget,
            accepted: &self.st.accepted,
            deadline: self.deadline,
            progress: &self.display,
            agent,
        }
    }

    // ------------------------------------------------------ orchestrator

    fn orchestrate(&mut self) -> Result<String, AgentError> {
        let span_id = self.st.orchestrator.span.span_id.clone();
        let who = Who { agent: ORCHESTRATOR, todo: None, span: &span_id };
        loop {
            if let Some(mut p) = self.st.orchestrator.pending.first().cloned() {
                if let Some(sig) = crate::stop::requested() {
                    return Err(AgentError::Stopped(sig));
                }
                let span = p.span.get_or_insert_with(|| SpanStart::now(Some(&span_id))).clone();
                self.st.orchestrator.pending[0] = p.clone();
                let (content, steers) = match self.not_run(&who, &p, &span)? {
                    Some(refusal) => (refusal, false),
                    None => (self.orchestrator_tool(&who, &p, &span)?, STEERING.contains(&p.call.name.as_str())),
                };
                let conv = &mut self.st.orchestrator;
                conv.messages.push(Message::Tool { tool_call_id: p.call.id.clone(), content: content.clone() });
                conv.pending.remove(0);
                if steers {
                    // The plan or the counters changed: the whole state.
                    self.save()?;
                } else {
                    // Only the conversation grew: this answer alone.
                    self.journal(Whose::Orchestrator, &p.call.id, content, None)?;
                }
                if let Some(stop) = self.stop.clone() {
                    return Ok(self.stopped_answer(stop));
                }
                continue;
            }
            if let Some(stop) = self.run_cap().or_else(|| self.orchestrator_cap()) {
                return Ok(self.stopped_answer(stop));
            }
            let mut conv = std::mem::take(&mut self.st.orchestrator);
            let reply = self.model_call(&who, &mut conv, Role::Orchestrator);
            self.st.orchestrator = conv;
            let reply = reply?;
            // This reply alone may have taken the run or the orchestrator
            // past a token cap: then none of its calls runs.
            if let Some(stop) = self.run_overshot().or_else(|| self.orchestrator_overshot()) {
                let mut conv = std::mem::take(&mut self.st.orchestrator);
                let refused = self.refuse_pending(&who, &mut conv, &format!("not run: {}", stop.describe()));
                self.st.orchestrator = conv;
                refused?;
                self.save()?;
                return Ok(self.stopped_answer(stop));
            }
            if !reply.tool_calls.is_empty() {
                self.st.orchestrator.idle = 0;
                self.save()?;
                continue;
            }
            let conv = &mut self.st.orchestrator;
            conv.idle += 1;
            let idle = conv.idle;
            let called = calls_made(&conv.messages);
            let text = reply.content.clone().unwrap_or_default();
            let said = shown(&llm::excerpt(&text, 200));
            let nudge = if !self.st.todo.is_created() {
                if idle >= 2 {
                    return Err(if called == 0 {
                        AgentError::NoToolCalls { times: idle, reply: said }
                    } else {
                        AgentError::StoppedCallingTools {
                            calls: called,
                            times: idle,
                            what: "before it made a plan with create_todo_list",
                            reply: said,
                        }
                    });
                }
                "Do not answer yet: first call the create_todo_list tool with the plan.".to_string()
            } else if self.st.todo.pending() > 0 && idle < 3 {
                format!(
                    "{} items are still pending:\n{}\nCall start_next_todo, or block_todo the items that cannot be done, before the final answer.",
                    self.st.todo.pending(),
                    self.st.todo.render()
                )
            } else if text.trim().is_empty() {
                if idle >= 3 {
                    return Err(AgentError::StoppedCallingTools {
                        calls: called,
                        times: idle,
                        what: "and empty: no final answer",
                        reply: String::new(),
                    });
                }
                "Reply with the final answer as plain text.".to_string()
            } else {
                self.say(ORCHESTRATOR, "final answer");
                return Ok(text.trim().to_string());
            };
            self.st.orchestrator.messages.push(Message::User(nudge));
            self.save()?;
        }
    }

    fn orchestrator_tool(&mut self, who: &Who, p: &Pending, span: &SpanStart) -> Result<String, AgentError> {
        let call = &p.call;
        let started = Instant::now();
        let mut nested_ms = 0.0;
        let done = match call.name.as_str() {
            "create_todo_list" | "revise_todo_list" => {
                #[derive(serde::Deserialize)]
                struct Items {
                    items: Vec<PlannedItem>,
                }
                match parse_args::<Items>(&call.name, &call.arguments) {
                    Err(e) => Done::error(e),
                    Ok(a) => {
                        let r = if call.name == "create_todo_list" {
                            self.st.todo.create(a.items)
                        } else {
                            self.st.todo.revise(a.items)
                        };
                        match r {
                            Ok(()) => Done::ok(format!("the todo list:\n{}\nNow call start_next_todo.", self.st.todo.render())),
                            Err(e) => Done::error(e),
                        }
                    }
                }
            }
            "start_next_todo" => match parse_args::<serde_json::Value>(&call.name, &call.arguments) {
                Err(e) => Done::error(e),
                Ok(_) if !self.st.todo.is_created() => {
                    Done::error("there is no todo list yet; call create_todo_list first".into())
                }
                Ok(_) => {
                    // A resumed run goes on with the sub-agent it had.
                    let next = match &self.st.sub {
                        Some(sub) => Some(sub.index),
                        None => self.st.todo.start_next(),
                    };
                    match next {
                        None => Done::ok(format!(
                            "no item is pending; the list:\n{}\nWrite the final answer now, as plain text.",
                            self.st.todo.render()
                        )),
                        Some(index) => {
                            let sub_started = Instant::now();
                            let out = self.subagent(index, &span.span_id)?;
                            nested_ms = sub_started.elapsed().as_secs_f64() * 1000.0;
                            self.st.todo.finish(index, out.state, out.report.clone());
                            self.st.sub = None;
                            let item = &self.st.todo.items[index];
                            let state = if out.state == State::Done { "done" } else { "blocked" };
                            let files = self.context(ORCHESTRATOR).call("list_output_files", "{}").content;
                            Done::ok(format!(
                                "item {} `{}` is {state}.\nreport: {}\n\n{files}\nthe list now:\n{}",
                                index + 1,
                                item.name,
                                out.report,
                                self.st.todo.render()
                            ))
                        }
                    }
                }
            },
            "block_todo" => {
                #[derive(serde::Deserialize)]
                struct Block {
                    item: String,
                    reason: String,
                }
                match parse_args::<Block>(&call.name, &call.arguments) {
                    Err(e) => Done::error(e),
                    Ok(b) => match self.st.todo.block_pending(&b.item, cut(&b.reason, MAX_REPORT_BYTES)) {
                        Ok(()) => Done::ok(format!("blocked `{}`; the list:\n{}", shown(&b.item), self.st.todo.render())),
                        Err(e) => Done::error(e),
                    },
                }
            }
            name if tools::names(Role::Orchestrator).contains(&name) => self.context(ORCHESTRATOR).call(name, &call.arguments),
            other => Done::error(unknown_tool(other, Role::Orchestrator)),
        };
        let ms = (started.elapsed().as_secs_f64() * 1000.0 - nested_ms).max(0.0);
        self.say(who.agent, &format!("{} → {}", shown(&call.name), if done.ok { "ok" } else { "error" }));
        self.record_tool(who, p, span, &done, ms)?;
        Ok(done.content)
    }

    /// The answer to a call that is not run: past the per-reply cap, or past
    /// the run's deadline. Recorded as a failed call.
    fn not_run(&mut self, who: &Who, p: &Pending, span: &SpanStart) -> Result<Option<String>, AgentError> {
        let cap = self.config.caps.calls_per_reply;
        let why = if p.n >= cap {
            format!(
                "not run: this reply asked for {} tool calls and at most {cap} are run per reply; the first {cap} ran. Call `{}` again in your next reply if it is still needed.",
                p.of,
                shown(&p.call.name)
            )
        } else if Instant::now() >= self.deadline {
            format!("not run: the run's deadline ({} s) has passed", self.config.caps.deadline.as_secs())
        } else {
            return Ok(None);
        };
        let done = Done::error(why);
        self.say(who.agent, &format!("{} → not run", shown(&p.call.name)));
        self.record_not_run(who, p, span, &done)?;
        Ok(Some(done.content))
    }

    /// The answer when the run stopped at a cap, written from the reports.
    fn stopped_answer(&mut self, stop: Stop) -> String {
        self.stop = Some(stop.clone());
        let mut out = format!("The run stopped before it finished: {}.\n", stop.describe());
        if self.st.todo.items.is_empty() {
            out.push_str("No plan was made.\n");
        }
        for (n, i) in self.st.todo.items.iter().enumerate() {
            let state = match i.state {
                State::Done => "done",
                State::Blocked => "blocked",
                State::InProgress | State::Pending => "not done",
            };
            out.push_str(&format!("\n{}. {} [{state}]", n + 1, i.name));
            if let Some(r) = &i.report {
                out.push_str(&format!(": {r}"));
            }
        }
        out.push_str("\n\nFiles produced are in the session's output folder.");
        out
    }

    // ---------------------------------------------------------- sub-agent

    /// Run (or, resumed, go on with) the sub-agent of item `index`, whose
    /// `invoke_agent` span hangs below the `start_next_todo` call `parent`.
    fn subagent(&mut self, index: usize, parent: &str) -> Result<SubOutcome, AgentError> {
        let started = Instant::now();
        let item = self.st.todo.items[index].clone();
        let mut sub = match self.st.sub.take() {
            Some(sub) if sub.index == index => {
                self.say(&sub.agent, &format!("resume `{}`", item.name));
                sub
            }
            _ => {
                self.st.subagents += 1;
                let agent = format!("subagent-{}", self.st.subagents);
                self.say(&agent, &format!("start `{}`", item.name));
                let system = SUBAGENT_PROMPT
                    .replace("{skills}", &self.skills.index())
                    .replace("{state}", if self.config.runner.stateless { STATELESS_NOTE } else { SESSION_NOTE });
                SubRun {
                    index,
                    agent,
                    steps0: self.st.steps,
                    tokens0: self.st.tokens,
                    conv: Conversation {
                        messages: vec![Message::System(system), Message::User(self.brief(index))],
                        span: SpanStart::now(Some(parent)),
                        ..Conversation::default()
                    },
                    outcome: None,
                }
            }
        };
        let outcome = self.subagent_loop(&mut sub, &item);
        // The sub-task is over, however it ended: its session goes, and
        // what the session delivered becomes the accepted set; what the
        // jail refused then is told to the orchestrator with the report.
        let span_id = sub.conv.span.span_id.clone();
        let ended = self.end_session(&sub.agent, Some(&item.name), &span_id, "the sub-task ended");
        let outcome = match outcome.and_then(|o| ended.map(|note| (o, note))) {
            Ok((mut o, note)) => {
                if let Some(note) = note {
                    o.report.push_str(&format!("\n({note})"));
                }
                o
            }
            Err(e) => {
                // Keep the sub-agent where it was, for `resume`.
                self.st.sub = Some(sub);
                let _ = self.save();
                return Err(e);
            }
        };
        sub.outcome = Some(outcome.clone());
        let (agent, span) = (sub.agent.clone(), sub.conv.span.clone());
        let steps = self.st.steps - sub.steps0;
        self.st.sub = Some(sub);
        self.save()?;
        self.say(&agent, &format!("{} `{}`", if outcome.state == State::Done { "done" } else { "blocked" }, item.name));
        let (tokens_in, tokens_out) = self.agent_tokens(&agent);
        self.trace.record(
            &agent,
            Some(&item.name),
            &span,
            Event::AgentEnd {
                outcome: if outcome.state == State::Done {
                    "done".into()
                } else {
                    outcome.report.clone()
                },
                steps,
                tokens_in,
                tokens_out,
                wall_ms: started.elapsed().as_secs_f64() * 1000.0,
            },
        )?;
        Ok(outcome)
    }

    fn subagent_loop(&mut self, sub: &mut SubRun, item: &crate::todo::TodoItem) -> Result<SubOutcome, AgentError> {
        if let Some(o) = &sub.outcome {
            return Ok(o.clone());
        }
        let caps = self.config.caps;
        let (agent, span_id) = (sub.agent.clone(), sub.conv.span.span_id.clone());
        let who = Who { agent: &agent, todo: Some(&item.name), span: &span_id };
        loop {
            if let Some(mut p) = sub.conv.pending.first().cloned() {
                if let Some(sig) = crate::stop::requested() {
                    return Err(AgentError::Stopped(sig));
                }
                let span = p.span.get_or_insert_with(|| SpanStart::now(Some(&span_id))).clone();
                let (accepted, live) = (self.st.accepted.clone(), self.st.live_session.clone());
                let (content, end) = match self.not_run(&who, &p, &span)? {
                    Some(refusal) => (refusal, None),
                    None => self.subagent_tool(&who, &item.outputs, &p, &span)?,
                };
                sub.conv.messages.push(Message::Tool { tool_call_id: p.call.id.clone(), content: content.clone() });
                sub.conv.pending.remove(0);
                if let Some(o) = end {
                    // The item is over; answer the remaining calls so the
                    // transcript stays well-formed.
                    for rest in sub.conv.pending.drain(..) {
                        sub.conv.messages.push(Message::Tool {
                            tool_call_id: rest.call.id.clone(),
                            content: "skipped: the item is already finished".into(),
                        });
                    }
                    return Ok(o);
                }
                // This answer alone, and what the call changed of the run.
                let changed = Changed {
                    accepted: (self.st.accepted != accepted).then(|| self.st.accepted.clone()),
                    live_session: (self.st.live_session != live).then(|| self.st.live_session.clone()),
                };
                self.journal(Whose::SubAgent, &p.call.id, content, Some(changed))?;
                continue;
            }
            let (steps, tokens) = (self.st.steps - sub.steps0, self.st.tokens - sub.tokens0);
            if let Some(stop) = self.run_cap() {
                let report = format!("stopped: the {} before this item was finished", stop.describe());
                self.stop = Some(stop);
                return Ok(SubOutcome { state: State::Blocked, report });
            }
            if steps >= caps.subagent_steps {
                return Ok(SubOutcome {
                    state: State::Blocked,
                    report: format!(
                        "stopped: the sub-agent reached its step cap ({} model calls) before finishing",
                        caps.subagent_steps
                    ),
                });
            }
            if tokens >= caps.subagent_tokens {
                return Ok(SubOutcome {
                    state: State::Blocked,
                    report: format!(
                        "stopped: the sub-agent reached its token cap ({} tokens) before finishing",
                        caps.subagent_tokens
                    ),
                });
            }
            let reply = self.model_call(&who, &mut sub.conv, Role::SubAgent)?;
            // This reply alone may have taken the run or the sub-agent past
            // a token cap: then none of its calls runs.
            let calls = sub.conv.pending.len();
            if let Some(stop) = self.run_overshot() {
                self.refuse_pending(&who, &mut sub.conv, &format!("not run: {}", stop.describe()))?;
                let report = format!("stopped: the {} before this item was finished", stop.describe());
                self.stop = Some(stop);
                return Ok(SubOutcome { state: State::Blocked, report });
            }
            let tokens = self.st.tokens - sub.tokens0;
            if tokens > caps.subagent_tokens {
                let over = format!(
                    "the sub-agent's last reply took it to {tokens} tokens, {} over its token cap of {}",
                    tokens - caps.subagent_tokens,
                    caps.subagent_tokens
                );
                self.refuse_pending(&who, &mut sub.conv, &format!("not run: {over}"))?;
                let report = format!("stopped: {over}; the {calls} tool calls of that reply were not run");
                return Ok(SubOutcome { state: State::Blocked, report });
            }
            if reply.tool_calls.is_empty() {
                sub.conv.idle += 1;
                if sub.conv.idle >= 3 {
                    let said = shown(&llm::excerpt(reply.content.as_deref().unwrap_or(""), 300));
                    return Ok(SubOutcome {
                        state: State::Blocked,
                        report: format!("stopped: the sub-agent stopped calling tools without finishing; it last said: {said}"),
                    });
                }
                sub.conv.messages.push(Message::User(
                    "Keep working with the tools. When the item is done, call complete_todo with your report; if it cannot be done, call block_todo with the reason.".into(),
                ));
            } else {
                sub.conv.idle = 0;
            }
            self.checkpoint_sub(sub)?;
        }
    }

    /// Save the whole state with the running sub-agent as it is now (after
    /// a reply: its conversation grew by one reply and its pending calls).
    fn checkpoint_sub(&mut self, sub: &SubRun) -> Result<(), AgentError> {
        self.st.sub = Some(sub.clone());
        let saved = self.save();
        self.st.sub = None;
        saved
    }

    /// Save one answered call (checkpoint.rs's journal): what it costs does
    /// not grow with the conversation.
    fn journal(&mut self, whose: Whose, call_id: &str, content: String, changed: Option<Changed>) -> Result<(), AgentError> {
        let changed = changed.unwrap_or_default();
        let entry = crate::checkpoint::Answered {
            after: self.st.saves,
            whose,
            tool_call_id: call_id.to_string(),
            content,
            accepted: changed.accepted,
            live_session: changed.live_session,
        };
        Ok(crate::checkpoint::Checkpoint::append(&self.session.root, &entry)?)
    }

    /// Answer every call of the last reply with `why`, none run; each is
    /// recorded as a failed call.
    fn refuse_pending(&mut self, who: &Who, conv: &mut Conversation, why: &str) -> Result<(), AgentError> {
        let done = Done::error(why.to_string());
        for p in std::mem::take(&mut conv.pending) {
            let span = SpanStart::now(Some(who.span));
            self.record_not_run(who, &p, &span, &done)?;
            conv.messages.push(Message::Tool { tool_call_id: p.call.id.clone(), content: done.content.clone() });
        }
        Ok(())
    }

    /// The orchestrator's own cap, if it is reached.
    fn orchestrator_cap(&self) -> Option<Stop> {
        let caps = self.config.caps;
        if self.st.orchestrator_steps >= caps.orchestrator_steps {
            Some(Stop::OrchestratorStepCap(caps.orchestrator_steps))
        } else if self.st.orchestrator_tokens >= caps.orchestrator_tokens {
            Some(Stop::OrchestratorTokenCap { cap: caps.orchestrator_tokens, reached: self.st.orchestrator_tokens })
        } else {
            None
        }
    }

    /// The run's token cap, when the last reply took the run past it.
    fn run_overshot(&self) -> Option<Stop> {
        let cap = self.config.caps.run_tokens;
        (self.st.tokens > cap).then_some(Stop::RunTokenCap { cap, reached: self.st.tokens })
    }

    /// The orchestrator's token cap, when its last reply took it past it.
    fn orchestrator_overshot(&self) -> Option<Stop> {
        let cap = self.config.caps.orchestrator_tokens;
        (self.st.orchestrator_tokens > cap).then_some(Stop::OrchestratorTokenCap { cap, reached: self.st.orchestrator_tokens })
    }

    /// Tokens in and out this agent used, from the trace.
    fn agent_tokens(&self, agent: &str) -> (u64, u64) {
        self.trace.records.iter().filter(|r| r.agent == agent).fold((0, 0), |acc, r| match &r.event {
            Event::ModelCall { tokens_in, tokens_out, .. } => (acc.0 + tokens_in, acc.1 + tokens_out),
            _ => acc,
        })
    }

    /// The item's brief: all a sub-agent knows when it starts.
    fn brief(&self, index: usize) -> String {
        let i = &self.st.todo.items[index];
        let list = |v: &[String]| if v.is_empty() { "(none given)".to_string() } else { v.join(", ") };
        let mut out = format!(
            "Your item: {}\nGoal: {}\nSkills to read: {}\nInputs: {}\nOutputs it must leave: {}\nSuccess criteria: {}\n",
            i.name,
            i.goal,
            list(&i.skills),
            list(&i.inputs),
            list(&i.outputs),
            i.success_criteria
        );
        out.push_str(&format!("\nThe whole task, for context only: {}\n", self.config.task.trim()));
        let earlier: Vec<String> = self.st.todo.items[..index]
            .iter()
            .filter(|j| j.state.is_finished())
            .map(|j| format!("- {} [{:?}]: {}", j.name, j.state, llm::excerpt(j.report.as_deref().unwrap_or(""), 300)))
            .collect();
        if !earlier.is_empty() {
            out.push_str(&format!("\nEarlier items:\n{}\n", earlier.join("\n")));
        }
        out.push_str(&format!("\n{}", self.context(ORCHESTRATOR).call("list_output_files", "{}").content));
        out
    }

    fn subagent_tool(
        &mut self,
        who: &Who,
        outputs: &[String],
        p: &Pending,
        span: &SpanStart,
    ) -> Result<(String, Option<SubOutcome>), AgentError> {
        let call = &p.call;
        let started = Instant::now();
        let mut end = None;
        let done = match call.name.as_str() {
            "complete_todo" => {
                #[derive(serde::Deserialize)]
                struct Complete {
                    report: String,
                }
                match parse_args::<Complete>(&call.name, &call.arguments) {
                    Err(e) => Done::error(e),
                    Ok(c) => {
                        // The session's files reach the host when it ends.
                        let had_session = self.cells.is_live();
                        let refused = self.end_session(who.agent, who.todo, who.span, "complete_todo")?;
                        let missing = self.missing_outputs(outputs);
                        if missing.is_empty() {
                            let mut report = cut(&c.report, MAX_REPORT_BYTES);
                            if let Some(note) = &refused {
                                report.push_str(&format!("\n({note})"));
                            }
                            end = Some(SubOutcome { state: State::Done, report });
                            Done::ok(match &refused {
                                Some(note) => format!("the item is done; {note}"),
                                None => "the item is done".into(),
                            })
                        } else {
                            Done::error(format!(
                                "these outputs of the item are not in /workspace/output yet (or the jail refused them): {}; create them, or call block_todo with the reason{}{}",
                                missing.join(", "),
                                refused.map(|n| format!(". {n}")).unwrap_or_default(),
                                if had_session {
                                    " (the item's Python session was ended to deliver its files: the next script starts a fresh session, so load the data again)"
                                } else {
                                    ""
                                }
                            ))
                        }
                    }
                }
            }
            "block_todo" => {
                #[derive(serde::Deserialize)]
                struct Block {
                    reason: String,
                }
                match parse_args::<Block>(&call.name, &call.arguments) {
                    Err(e) => Done::error(e),
                    Ok(b) => {
                        end = Some(SubOutcome { state: State::Blocked, report: cut(&b.reason, MAX_REPORT_BYTES) });
                        Done::ok("the item is blocked".into())
                    }
                }
            }
            "delete_output_file" if self.cells.is_live() => {
                // The session holds its own copy of the output until it
                // ends: end it first, so the delete is not undone.
                let refused = self.end_session(who.agent, who.todo, who.span, "delete_output_file")?;
                let mut done = self.context(who.agent).call(&call.name, &call.arguments);
                done.content.push_str("\n(the sub-task's Python session was ended first so that its files reached the host: the next run_python_file starts a fresh session, so load the data again)");
                if let Some(note) = refused {
                    done.content.push_str(&format!("\n({note})"));
                }
                done
            }
            name if tools::names(Role::SubAgent).contains(&name) => self.context(who.agent).call(name, &call.arguments),
            other => Done::error(unknown_tool(other, Role::SubAgent)),
        };
        if let Some(step) = done.step.as_ref().filter(|s| s.session.is_none()) {
            // A step that could not start checked nothing: keep what the
            // last checked step accepted. A session's cell checked nothing
            // yet: its session's closing result is what counts.
            self.st.accepted.update(step);
        }
        if let Some(closing) = self.cells.take_closed() {
            self.st.accepted.update(&closing);
        }
        self.st.live_session = self.cells.handle();
        if call.name == "delete_output_file" && done.ok {
            self.st.accepted.forget_missing(&self.session.output);
        }
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let note = match &done.jail {
            Some(j) => format!("{} → {}", shown(&call.name), j.status),
            None => format!("{} → {}", shown(&call.name), if done.ok { "ok" } else { "error" }),
        };
        self.say(who.agent, &note);
        self.record_tool(who, p, span, &done, ms)?;
        Ok((done.content, end))
    }

    /// On resume: a session the killed agent left live is stopped, so its
    /// files are judged and delivered; the sub-agent is told its state is
    /// gone. A session that ended without us (a pooled one ends with its
    /// pool, which dies with the agent; any one past its idle timeout)
    /// delivered its files, but its verdict went with it: once its socket
    /// is gone (the session removes it after the delivery), a fresh jail
    /// judges the output folder again.
    fn stop_orphaned_session(&mut self) {
        let Some(handle) = self.st.live_session.take() else {
            if self.st.sub.is_some() {
                // The sub-agent's session was stopped when the run stopped
                // (a signal, an error): its next step starts afresh.
                self.cells.set_ended_note("the agent was stopped and resumed".into());
            }
            return;
        };
        match crate::live::stop_handle(&handle).map_err(crate::runner::RunnerError::from) {
            Ok(Some(closing)) => {
                self.st.accepted.update(&closing);
                self.say(
                    ORCHESTRATOR,
                    &format!("stopped the earlier run's session: {} output files accepted", closing.artifacts.len()),
                );
            }
            other => {
                if let Err(e) = other {
                    self.say(ORCHESTRATOR, &format!("could not stop the earlier run's session: {e}"));
                }
                let until = Instant::now() + ORPHAN_WAIT;
                while std::fs::symlink_metadata(&handle).is_ok() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                match self.config.runner.judge_output(self.session) {
                    Ok(judged) => {
                        self.st.accepted.update(&judged);
                        self.say(
                            ORCHESTRATOR,
                            &format!(
                                "the earlier run's session had ended; a fresh jail judged the output again: {} files accepted",
                                judged.artifacts.len()
                            ),
                        );
                    }
                    Err(e) => self.say(ORCHESTRATOR, &format!("could not judge the earlier run's output again: {e}")),
                }
            }
        }
        self.cells.set_ended_note("the agent was restarted (resume)".into());
    }

    /// Stop any session still live, then close the warm pool and record
    /// what became of it (its span from its start to now).
    fn close_pool(&mut self) -> Result<(), TraceError> {
        let span_id = self.st.orchestrator.span.span_id.clone();
        let _ = self.end_session(ORCHESTRATOR, None, &span_id, "the run ended");
        let report = self.pool.close();
        let mut span = report.span.clone();
        span.parent_span_id = Some(self.st.orchestrator.span.span_id.clone());
        let event = Event::Pool {
            size: report.size,
            state: report.state.to_string(),
            note: report.note.clone(),
            start_ms: report.start_ms,
            claims: report.claims,
            stats: report.stats.clone(),
        };
        self.trace.record(ORCHESTRATOR, None, &span, event)
    }

    /// Stop the sub-task's session, if one is live, and take the accepted
    /// set from its closing result (the files it delivered). The stop is a
    /// `jail_session_stop` span of its own below `parent`; what the jail
    /// refused then is returned in words for the model and the
    /// orchestrator (a session's cells judge nothing: its closing is where
    /// a refusal is known).
    fn end_session(&mut self, agent: &str, todo: Option<&str>, parent: &str, why: &str) -> Result<Option<String>, AgentError> {
        let span = SpanStart::now(Some(parent));
        let id = self.cells.live_id();
        let stopped = self.cells.stop();
        self.st.live_session = None;
        self.cells.ended_note.lock().unwrap_or_else(|e| e.into_inner()).take();
        let closing = self.cells.take_closed();
        let rejected = closing.as_ref().map(tools::rejected_of).unwrap_or_default();
        if let Some(closing) = &closing {
            self.st.accepted.update(closing);
            let refused = if rejected.is_empty() {
                String::new()
            } else {
                format!(", {} refused", rejected.len())
            };
            self.say(agent, &format!("session ended: {} output files accepted{refused}", closing.artifacts.len()));
        }
        if id.is_some() || closing.is_some() {
            let event = Event::SessionStop {
                session: id.map(|i| shown(&i)),
                why: why.to_string(),
                accepted: closing.as_ref().map_or(0, |c| c.artifacts.len() as u64),
                rejected: rejected.clone(),
                error: stopped.as_ref().err().map(|e| crate::llm::excerpt(&e.to_string(), 600)),
            };
            self.trace.record(agent, todo, &span, event)?;
        }
        stopped.map_err(|e| AgentError::SandboxSession(e.to_string()))?;
        Ok((!rejected.is_empty()).then(|| {
            format!(
                "the jail refused {} file(s) of /workspace/output when the item's session ended, so they are not handed on: {}",
                rejected.len(),
                rejected.iter().take(20).cloned().collect::<Vec<_>>().join("; ")
            )
        }))
    }

    /// Declared outputs that look like file paths and the jail has not
    /// accepted (absent, or refused).
    fn missing_outputs(&self, outputs: &[String]) -> Vec<String> {
        outputs
            .iter()
            .filter_map(|o| {
                let o = o.trim();
                let rel = match o.strip_prefix("/workspace/output/").or_else(|| o.strip_prefix("output/")) {
                    Some(rel) => rel,
                    None if !o.starts_with('/') && o.contains('.') => o,
                    None => return None,
                };
                if rel.is_empty() || rel.contains(char::is_whitespace) || rel.contains('*') {
                    return None;
                }
                let rel = crate::session::clean_relative(rel).ok()?;
                self.st.accepted.get(&rel.to_string_lossy()).is_none().then(|| shown(o))
            })
            .collect()
    }
}

/// A message as the trace records it: the endpoint's shape, text cut.
fn content_json(m: &Message) -> serde_json::Value {
    let mut v = m.to_json();
    if let Some(c) = v.get_mut("content") {
        if let Some(s) = c.as_str() {
            *c = serde_json::Value::String(cut(s, trace::MAX_CONTENT_BYTES));
        }
    }
    v
}

/// A reply as the trace records it: its text cut, and its calls' names and
/// arguments cut so that all of them share one record's budget (a reply of
/// 150 calls of 300 KB each is not 45 MB of trace).
fn reply_json(m: &Message) -> serde_json::Value {
    let mut v = content_json(m);
    if let Some(calls) = v.get_mut("tool_calls").and_then(serde_json::Value::as_array_mut) {
        let each = (trace::MAX_CONTENT_BYTES / calls.len().max(1)).max(256);
        for c in calls.iter_mut() {
            for key in ["name", "arguments"] {
                if let Some(text) = c["function"][key].as_str() {
                    c["function"][key] = serde_json::Value::String(cut(text, each));
                }
            }
            if let Some(id) = c["id"].as_str() {
                c["id"] = serde_json::Value::String(cut(id, 100));
            }
        }
    }
    v
}

/// The orchestrator's tools that change the plan or run a sub-agent: the
/// whole state is saved after them; after any other call, its answer alone.
const STEERING: &[&str] = &["create_todo_list", "revise_todo_list", "start_next_todo", "block_todo"];

/// What a sub-agent's call changed of the run, for the journal.
#[derive(Default)]
struct Changed {
    accepted: Option<Accepted>,
    live_session: Option<Option<PathBuf>>,
}

/// Tool calls an agent's replies made so far.
fn calls_made(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| match m {
            Message::Assistant { tool_calls, .. } => tool_calls.len(),
            _ => 0,
        })
        .sum()
}

fn unknown_tool(name: &str, role: Role) -> String {
    format!("there is no tool named `{}` for this agent; the tools are: {}", shown(name), tools::names(role).join(", "))
}

/// The sandbox owner for this process: root runs map the sandbox to an
/// unprivileged host uid of the policy's `identity.root_host_uids` (each
/// concurrent run its own) and to its `root_host_gid`, which all share.
pub fn owner_for(policy: Option<&Path>) -> Result<Owner, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(Owner::Caller);
    }
    let p = match policy {
        Some(p) => jail::policy::Policy::load(p),
        None => jail::policy::Policy::builtin_default(),
    }
    .map_err(|e| format!("policy: {e}"))?;
    Ok(Owner::Sandbox { uid: p.identity.root_host_uids.first, gid: p.identity.root_host_gid })
}
