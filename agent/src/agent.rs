//! The run: a plan-execute orchestrator over ReAct sub-agents.
//!
//! The orchestrator sees the task and the input files, plans a todo list,
//! and calls `start_next_todo` for each item; that starts a sub-agent with a
//! clean context (its own system prompt and the item's brief, nothing of the
//! orchestrator's conversation) which writes and runs scripts, one fresh
//! jail per run, until it calls `complete_todo` or `block_todo`. Its report is
//! the orchestrator's tool result. When nothing is pending, the orchestrator's
//! plain-text reply is the final answer.
//!
//! Caps: a step is one model call. Each sub-agent and the whole run have a
//! step cap and a token cap (tokens in plus out); a sub-agent at its cap is
//! stopped and its item blocked with the reason, and a run at its cap stops
//! cleanly with an answer the agent writes itself from the reports so far.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::llm::{self, Client, LlmConfig, LlmError, Message, Reply, ToolCall};
use crate::runner::Runner;
use crate::session::{Owner, Session, SessionError};
use crate::skills::{SkillError, Skills};
use crate::todo::{PlannedItem, State, TodoList};
use crate::tools::{self, parse_args, Context, Done, Role};
use crate::trace::{Event, Summary, Trace, TraceError};
use crate::view::Budget;

const ORCHESTRATOR_PROMPT: &str = include_str!("../prompts/orchestrator.md");
const SUBAGENT_PROMPT: &str = include_str!("../prompts/subagent.md");

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
}

impl Default for Caps {
    fn default() -> Caps {
        Caps { subagent_steps: 25, subagent_tokens: 400_000, run_steps: 150, run_tokens: 2_000_000 }
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
    /// Where the output's files are copied at the end, if anywhere.
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
}

/// Why the run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    Finished,
    RunStepCap(u32),
    RunTokenCap(u64),
}

impl Stop {
    pub fn describe(&self) -> String {
        match self {
            Stop::Finished => "finished".into(),
            Stop::RunStepCap(n) => format!("run step cap reached ({n} model calls)"),
            Stop::RunTokenCap(n) => format!("run token cap reached ({n} tokens)"),
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
    Llm(#[from] LlmError),
    #[error("the model answered {times} times without calling a tool (last reply: {reply:?}); this agent needs a model and server with tool calling (function calling): check LLM_MODEL and the server's tool support")]
    NoToolCalls { times: u32, reply: String },
}

/// A failed run, with the session it left (trace and summary are saved).
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
    /// Files copied to `Config::output`.
    pub exported: Vec<String>,
}

/// Run a task to its end.
pub fn run(config: &Config) -> Result<Outcome, Failure> {
    let started = Instant::now();
    let fail = |error: AgentError, session: Option<&Session>| Failure { error, session: session.map(|s| s.root.clone()) };
    let skills = Skills::load(config.skills_dir.as_deref()).map_err(|e| fail(e.into(), None))?;
    let session = Session::create(config.session_parent.as_deref(), &config.input, config.owner)
        .map_err(|e| fail(e.into(), None))?;
    let trace = Trace::create(&session.trace_path(), started).map_err(|e| fail(e.into(), Some(&session)))?;
    let mut run = Run {
        config,
        client: Client::new(config.llm.clone()),
        session: &session,
        skills: &skills,
        trace,
        todo: TodoList::default(),
        steps: 0,
        tokens: 0,
        subagents: 0,
        stop: None,
        refused: Vec::new(),
    };
    if config.progress == Progress::Stderr {
        eprintln!("jail-agent: session {}", session.root.display());
        for s in &session.skipped_input {
            eprintln!("jail-agent: input {s}");
        }
    }
    let result = run.orchestrate();
    let stop = match &result {
        Ok(_) => run.stop.clone().unwrap_or(Stop::Finished).describe(),
        Err(e) => format!("error: {e}"),
    };
    let wall_ms = run.trace.elapsed_ms();
    let end = run.trace.record("orchestrator", None, Event::RunEnd { stop: stop.clone(), wall_ms });
    let summary = Summary::from_records(&run.trace.records, wall_ms, &stop);
    let saved = summary.save(&session.root);
    let answer = match result {
        Ok(a) => a,
        Err(e) => return Err(fail(e, Some(&session))),
    };
    end.and(saved).map_err(|e| fail(e.into(), Some(&session)))?;
    std::fs::write(session.root.join("answer.md"), format!("{answer}\n"))
        .map_err(|error| fail(TraceError::Write { path: session.root.join("answer.md"), error }.into(), Some(&session)))?;
    let exported = match &config.output {
        Some(dest) => session.export(dest, &run.refused).map_err(|e| fail(e.into(), Some(&session)))?,
        None => Vec::new(),
    };
    let todo = run.todo.clone();
    let stop = run.stop.clone().unwrap_or(Stop::Finished);
    Ok(Outcome { session: session.clone(), answer, stop, todo, summary, exported })
}

struct Run<'a> {
    config: &'a Config,
    client: Client,
    session: &'a Session,
    skills: &'a Skills,
    trace: Trace,
    todo: TodoList,
    /// Model calls so far, every agent.
    steps: u32,
    /// Tokens in + out so far, every agent.
    tokens: u64,
    subagents: u32,
    stop: Option<Stop>,
    /// What the jail refused to hand on in the latest step.
    refused: Vec<String>,
}

/// How a sub-agent ended.
struct SubOutcome {
    state: State,
    report: String,
}

impl Run<'_> {
    fn say(&self, agent: &str, line: &str) {
        if self.config.progress == Progress::Stderr {
            eprintln!("[{agent}] {line}");
        }
    }

    /// The run cap, if it is reached.
    fn run_cap(&self) -> Option<Stop> {
        let caps = self.config.caps;
        if self.steps >= caps.run_steps {
            Some(Stop::RunStepCap(caps.run_steps))
        } else if self.tokens >= caps.run_tokens {
            Some(Stop::RunTokenCap(caps.run_tokens))
        } else {
            None
        }
    }

    fn model_call(&mut self, agent: &str, todo: Option<&str>, messages: &[Message], role: Role) -> Result<Reply, AgentError> {
        let specs = tools::specs(role, self.skills);
        let reply = self.client.chat(messages, &specs)?;
        self.steps += 1;
        self.tokens += reply.usage.input + reply.usage.output;
        self.trace.record(
            agent,
            todo,
            Event::ModelCall {
                model: self.config.llm.model.clone(),
                tokens_in: reply.usage.input,
                tokens_out: reply.usage.output,
                tokens_estimated: reply.usage.estimated,
                duration_ms: reply.duration.as_secs_f64() * 1000.0,
                attempts: reply.attempts,
                finish_reason: reply.finish_reason.clone(),
                tool_calls: reply.tool_calls.iter().map(|c| c.name.clone()).collect(),
            },
        )?;
        Ok(reply)
    }

    fn record_tool(&mut self, agent: &str, todo: Option<&str>, call: &ToolCall, done: &Done, ms: f64) -> Result<(), AgentError> {
        let error = (!done.ok).then(|| llm::excerpt(&done.content, 200));
        self.trace.record(
            agent,
            todo,
            Event::ToolCall { tool: call.name.clone(), ok: done.ok, duration_ms: ms, error, jail: done.jail.clone() },
        )?;
        Ok(())
    }

    fn context(&self) -> Context<'_> {
        Context {
            session: self.session,
            runner: &self.config.runner,
            skills: self.skills,
            rootfs: self.config.rootfs.as_deref(),
            budget: self.config.budget,
        }
    }

    // ------------------------------------------------------ orchestrator

    fn orchestrate(&mut self) -> Result<String, AgentError> {
        let agent = "orchestrator";
        let system = ORCHESTRATOR_PROMPT.replace("{skills}", &self.skills.index());
        let inputs = self.context().call("list_input_files", "{}").content;
        let mut messages = vec![
            Message::System(system),
            Message::User(format!("Task:\n{}\n\nInput files:\n{inputs}", self.config.task.trim())),
        ];
        let mut idle = 0;
        loop {
            if let Some(stop) = self.run_cap() {
                return Ok(self.stopped_answer(stop));
            }
            let reply = self.model_call(agent, None, &messages, Role::Orchestrator)?;
            messages.push(Message::Assistant { content: reply.content.clone(), tool_calls: reply.tool_calls.clone() });
            if reply.tool_calls.is_empty() {
                idle += 1;
                let text = reply.content.clone().unwrap_or_default();
                if !self.todo.is_created() {
                    if idle >= 2 {
                        return Err(AgentError::NoToolCalls { times: idle, reply: llm::excerpt(&text, 200) });
                    }
                    messages.push(Message::User(
                        "Do not answer yet: first call the create_todo_list tool with the plan.".into(),
                    ));
                    continue;
                }
                if self.todo.pending() > 0 && idle < 3 {
                    messages.push(Message::User(format!(
                        "{} items are still pending:\n{}\nCall start_next_todo, or block_todo the items that cannot be done, before the final answer.",
                        self.todo.pending(),
                        self.todo.render()
                    )));
                    continue;
                }
                if text.trim().is_empty() {
                    if idle >= 3 {
                        return Err(AgentError::NoToolCalls { times: idle, reply: String::new() });
                    }
                    messages.push(Message::User("Reply with the final answer as plain text.".into()));
                    continue;
                }
                self.say(agent, "final answer");
                return Ok(text.trim().to_string());
            }
            idle = 0;
            for call in &reply.tool_calls {
                let content = self.orchestrator_tool(call)?;
                messages.push(Message::Tool { tool_call_id: call.id.clone(), content });
                if let Some(stop) = self.stop.clone() {
                    return Ok(self.stopped_answer(stop));
                }
            }
        }
    }

    fn orchestrator_tool(&mut self, call: &ToolCall) -> Result<String, AgentError> {
        let agent = "orchestrator";
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
                        let r = if call.name == "create_todo_list" { self.todo.create(a.items) } else { self.todo.revise(a.items) };
                        match r {
                            Ok(()) => Done::ok(format!("the todo list:\n{}\nNow call start_next_todo.", self.todo.render())),
                            Err(e) => Done::error(e),
                        }
                    }
                }
            }
            "start_next_todo" => match parse_args::<serde_json::Value>(&call.name, &call.arguments) {
                Err(e) => Done::error(e),
                Ok(_) if !self.todo.is_created() => Done::error("there is no todo list yet; call create_todo_list first".into()),
                Ok(_) => match self.todo.start_next() {
                    None => Done::ok(format!(
                        "no item is pending; the list:\n{}\nWrite the final answer now, as plain text.",
                        self.todo.render()
                    )),
                    Some(index) => {
                        let sub_started = Instant::now();
                        let out = self.subagent(index)?;
                        nested_ms = sub_started.elapsed().as_secs_f64() * 1000.0;
                        self.todo.finish(index, out.state, out.report.clone());
                        let item = &self.todo.items[index];
                        let state = if out.state == State::Done { "done" } else { "blocked" };
                        let files = self.context().call("list_output_files", "{}").content;
                        Done::ok(format!(
                            "item {} `{}` is {state}.\nreport: {}\n\n{files}\nthe list now:\n{}",
                            index + 1,
                            item.name,
                            out.report,
                            self.todo.render()
                        ))
                    }
                },
            },
            "block_todo" => {
                #[derive(serde::Deserialize)]
                struct Block {
                    item: String,
                    reason: String,
                }
                match parse_args::<Block>(&call.name, &call.arguments) {
                    Err(e) => Done::error(e),
                    Ok(b) => match self.todo.block_pending(&b.item, b.reason) {
                        Ok(()) => Done::ok(format!("blocked `{}`; the list:\n{}", b.item, self.todo.render())),
                        Err(e) => Done::error(e),
                    },
                }
            }
            name if tools::names(Role::Orchestrator).contains(&name) => self.context().call(name, &call.arguments),
            other => Done::error(unknown_tool(other, Role::Orchestrator)),
        };
        let ms = (started.elapsed().as_secs_f64() * 1000.0 - nested_ms).max(0.0);
        self.say(agent, &format!("{} → {}", call.name, if done.ok { "ok" } else { "error" }));
        self.record_tool(agent, None, call, &done, ms)?;
        Ok(done.content)
    }

    /// The answer when the run stopped at a cap, written from the reports.
    fn stopped_answer(&mut self, stop: Stop) -> String {
        self.stop = Some(stop.clone());
        let mut out = format!("The run stopped before it finished: {}.\n", stop.describe());
        if self.todo.items.is_empty() {
            out.push_str("No plan was made.\n");
        }
        for (n, i) in self.todo.items.iter().enumerate() {
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

    fn subagent(&mut self, index: usize) -> Result<SubOutcome, AgentError> {
        self.subagents += 1;
        let agent = format!("subagent-{}", self.subagents);
        let started = Instant::now();
        let item = self.todo.items[index].clone();
        let todo = Some(item.name.as_str());
        let caps = self.config.caps;
        let (steps0, tokens0) = (self.steps, self.tokens);
        self.say(&agent, &format!("start `{}`", item.name));
        let system = SUBAGENT_PROMPT.replace("{skills}", &self.skills.index());
        let mut messages = vec![Message::System(system), Message::User(self.brief(index))];
        let mut idle = 0;
        let outcome = loop {
            let (steps, tokens) = (self.steps - steps0, self.tokens - tokens0);
            if let Some(stop) = self.run_cap() {
                let report = format!("stopped: the {} before this item was finished", stop.describe());
                self.stop = Some(stop);
                break SubOutcome { state: State::Blocked, report };
            }
            if steps >= caps.subagent_steps {
                break SubOutcome {
                    state: State::Blocked,
                    report: format!("stopped: the sub-agent reached its step cap ({} model calls) before finishing", caps.subagent_steps),
                };
            }
            if tokens >= caps.subagent_tokens {
                break SubOutcome {
                    state: State::Blocked,
                    report: format!("stopped: the sub-agent reached its token cap ({} tokens) before finishing", caps.subagent_tokens),
                };
            }
            let reply = self.model_call(&agent, todo, &messages, Role::SubAgent)?;
            messages.push(Message::Assistant { content: reply.content.clone(), tool_calls: reply.tool_calls.clone() });
            if reply.tool_calls.is_empty() {
                idle += 1;
                if idle >= 3 {
                    let said = llm::excerpt(reply.content.as_deref().unwrap_or(""), 300);
                    break SubOutcome {
                        state: State::Blocked,
                        report: format!("stopped: the sub-agent stopped calling tools without finishing; it last said: {said}"),
                    };
                }
                messages.push(Message::User(
                    "Keep working with the tools. When the item is done, call complete_todo with your report; if it cannot be done, call block_todo with the reason.".into(),
                ));
                continue;
            }
            idle = 0;
            let mut finished = None;
            for call in &reply.tool_calls {
                if finished.is_some() {
                    // The item is over; answer the remaining calls so the
                    // transcript stays well-formed.
                    messages.push(Message::Tool { tool_call_id: call.id.clone(), content: "skipped: the item is already finished".into() });
                    continue;
                }
                let (content, end) = self.subagent_tool(&agent, todo, &item.outputs, call)?;
                messages.push(Message::Tool { tool_call_id: call.id.clone(), content });
                finished = end;
            }
            if let Some(o) = finished {
                break o;
            }
        };
        let steps = self.steps - steps0;
        self.say(&agent, &format!("{} `{}`", if outcome.state == State::Done { "done" } else { "blocked" }, item.name));
        let end_tokens = self.subagent_tokens(&agent);
        self.trace.record(
            &agent,
            todo,
            Event::AgentEnd {
                outcome: if outcome.state == State::Done { "done".into() } else { outcome.report.clone() },
                steps,
                tokens_in: end_tokens.0,
                tokens_out: end_tokens.1,
                wall_ms: started.elapsed().as_secs_f64() * 1000.0,
            },
        )?;
        Ok(outcome)
    }

    /// Tokens in and out this agent used, from the trace.
    fn subagent_tokens(&self, agent: &str) -> (u64, u64) {
        self.trace.records.iter().filter(|r| r.agent == agent).fold((0, 0), |acc, r| match &r.event {
            Event::ModelCall { tokens_in, tokens_out, .. } => (acc.0 + tokens_in, acc.1 + tokens_out),
            _ => acc,
        })
    }

    /// The item's brief: all a sub-agent knows when it starts.
    fn brief(&self, index: usize) -> String {
        let i = &self.todo.items[index];
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
        let earlier: Vec<String> = self.todo.items[..index]
            .iter()
            .filter(|j| j.state.is_finished())
            .map(|j| format!("- {} [{:?}]: {}", j.name, j.state, llm::excerpt(j.report.as_deref().unwrap_or(""), 300)))
            .collect();
        if !earlier.is_empty() {
            out.push_str(&format!("\nEarlier items:\n{}\n", earlier.join("\n")));
        }
        out.push_str(&format!("\n{}", self.context().call("list_output_files", "{}").content));
        out
    }

    fn subagent_tool(
        &mut self,
        agent: &str,
        todo: Option<&str>,
        outputs: &[String],
        call: &ToolCall,
    ) -> Result<(String, Option<SubOutcome>), AgentError> {
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
                        let missing = self.missing_outputs(outputs);
                        if missing.is_empty() {
                            end = Some(SubOutcome { state: State::Done, report: c.report });
                            Done::ok("the item is done".into())
                        } else {
                            Done::error(format!(
                                "these outputs of the item are not in /workspace/output yet: {}; create them, or call block_todo with the reason",
                                missing.join(", ")
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
                        end = Some(SubOutcome { state: State::Blocked, report: b.reason });
                        Done::ok("the item is blocked".into())
                    }
                }
            }
            name if tools::names(Role::SubAgent).contains(&name) => self.context().call(name, &call.arguments),
            other => Done::error(unknown_tool(other, Role::SubAgent)),
        };
        if let Some(refused) = &done.refused {
            self.refused = refused.clone();
        }
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let note = match &done.jail {
            Some(j) => format!("{} → {}", call.name, j.status),
            None => format!("{} → {}", call.name, if done.ok { "ok" } else { "error" }),
        };
        self.say(agent, &note);
        self.record_tool(agent, todo, call, &done, ms)?;
        Ok((done.content, end))
    }

    /// Declared outputs that look like file paths and are not in the output.
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
                let looks_like_file = !rel.is_empty()
                    && !rel.contains(char::is_whitespace)
                    && !rel.contains('*')
                    && crate::session::clean_relative(rel).is_ok();
                (looks_like_file && std::fs::symlink_metadata(self.session.output.join(rel)).is_err()).then(|| o.to_string())
            })
            .collect()
    }
}

fn unknown_tool(name: &str, role: Role) -> String {
    format!(
        "there is no tool named `{}` for this agent; the tools are: {}",
        crate::session::display_path(name),
        tools::names(role).join(", ")
    )
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
