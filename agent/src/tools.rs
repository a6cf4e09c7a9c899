//! The tools the model may call, each with its JSON schema, and the handlers
//! of those that do not steer the run (files, skills, packages, scripts).
//! Which role sees which tool is fixed here: the orchestrator plans and
//! delegates, a sub-agent writes and runs code. A bad call (unknown tool,
//! arguments that are not JSON or miss a field) is answered with a tool error
//! the model can act on, never a crash.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::cells::Cells;
use crate::escape::shown;
use crate::export::Accepted;
use crate::live::JailFrom;
use crate::packages;
use crate::pool::Pool;
use crate::runner::Runner;
use crate::session::{display_path, Area, EntryKind, Session};
use crate::skills::Skills;
use crate::trace::JailFacts;
use crate::view::{self, Budget};

/// Who is calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Orchestrator,
    SubAgent,
}

const ORCHESTRATOR_TOOLS: &[&str] = &[
    "create_todo_list",
    "start_next_todo",
    "revise_todo_list",
    "block_todo",
    "list_input_files",
    "list_output_files",
    "read_file_content",
    "read_skill",
    "list_available_packages",
];

const SUBAGENT_TOOLS: &[&str] = &[
    "complete_todo",
    "block_todo",
    "list_input_files",
    "list_output_files",
    "read_file_content",
    "read_skill",
    "list_available_packages",
    "write_python_file",
    "run_python_file",
    "delete_output_file",
];

pub fn names(role: Role) -> &'static [&'static str] {
    match role {
        Role::Orchestrator => ORCHESTRATOR_TOOLS,
        Role::SubAgent => SUBAGENT_TOOLS,
    }
}

/// The `tools` array of a chat request for `role`.
pub fn specs(role: Role, skills: &Skills, stateless: bool) -> Vec<Value> {
    names(role).iter().map(|n| spec(n, role, skills, stateless)).collect()
}

fn function(name: &str, description: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}})
}

fn spec(name: &str, role: Role, skills: &Skills, stateless: bool) -> Value {
    let strings = |d: &str| json!({"type": "array", "items": {"type": "string"}, "description": d});
    let item = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "short unique name, e.g. `eda-summary`"},
            "goal": {"type": "string", "description": "what this item must achieve, in one or two sentences"},
            "skills": {"type": "array", "items": {"type": "string", "enum": skills.names()}, "description": "skills the sub-agent should read"},
            "inputs": strings("files it reads, e.g. /workspace/input/data.csv or /workspace/output/summary.csv"),
            "outputs": strings("files it must leave, e.g. /workspace/output/summary.csv"),
            "success_criteria": {"type": "string", "description": "how to tell the item is done"}
        },
        "required": ["name", "goal", "success_criteria"]
    });
    let items = json!({"type": "object", "properties": {"items": {"type": "array", "items": item}}, "required": ["items"]});
    let none = json!({"type": "object", "properties": {}});
    match name {
        "create_todo_list" => function(name, "Create the plan: an ordered todo list. Call once.", items),
        "revise_todo_list" => function(
            name,
            "Replace every item that is not finished with these items; finished items and their reports stay.",
            items,
        ),
        "start_next_todo" => function(
            name,
            "Hand the next pending item to a sub-agent with a clean context; returns its report when it is done or blocked.",
            none,
        ),
        "complete_todo" => function(
            name,
            "Finish your item: it met its success criteria and its output files exist.",
            json!({"type": "object", "properties": {
                "report": {"type": "string", "description": "what you did, the key numbers, the files you wrote"}
            }, "required": ["report"]}),
        ),
        "block_todo" => match role {
            Role::SubAgent => function(
                name,
                "Give up on your item and say why (e.g. the data lacks a column, a package is missing).",
                json!({"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]}),
            ),
            Role::Orchestrator => function(
                name,
                "Mark a pending item as blocked (it will not be done) and say why.",
                json!({"type": "object", "properties": {
                    "item": {"type": "string", "description": "the item's name"},
                    "reason": {"type": "string"}
                }, "required": ["item", "reason"]}),
            ),
        },
        "list_input_files" => function(name, "List the user's files in /workspace/input (read-only).", none),
        "list_output_files" => function(name, "List the files in /workspace/output (what the steps produced).", none),
        "read_file_content" => function(
            name,
            "Read lines of a text file in /workspace/input, /workspace/output or /workspace/code.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "e.g. /workspace/input/data.csv"},
                "offset": {"type": "integer", "minimum": 0, "description": "first line to return, from 0 (default 0)"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "most lines to return (default 100)"}
            }, "required": ["path"]}),
        ),
        "read_skill" => function(
            name,
            "Read a skill: how to do one kind of step in this sandbox.",
            json!({"type": "object", "properties": {"name": {"type": "string", "enum": skills.names()}}, "required": ["name"]}),
        ),
        "list_available_packages" => function(name, "List the Python packages that scripts can import.", none),
        "write_python_file" => function(
            name,
            "Write (or overwrite) a Python script in /workspace/code.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "file name ending in .py, e.g. step1_load.py"},
                "content": {"type": "string", "description": "the whole script"}
            }, "required": ["path", "content"]}),
        ),
        "run_python_file" => function(
            name,
            run_description(stateless),
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "the script, e.g. step1_load.py"},
                "args": {"type": "array", "items": {"type": "string"}, "description": "command-line arguments (optional)"}
            }, "required": ["path"]}),
        ),
        "delete_output_file" => function(
            name,
            "Delete a file from /workspace/output (e.g. a large intermediate file that fills it).",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "e.g. /workspace/output/big.csv"}
            }, "required": ["path"]}),
        ),
        _ => function(name, "", none),
    }
}

/// Parse a call's arguments into `T`, or say what is wrong in words the
/// model can act on.
pub fn parse_args<T: DeserializeOwned>(tool: &str, text: &str) -> Result<T, String> {
    let text = if text.trim().is_empty() { "{}" } else { text };
    let v: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "the arguments of {tool} are not valid JSON ({}); send one JSON object that matches the tool's schema",
            crate::escape::shown_max(&e.to_string(), 400)
        )
    })?;
    let v = if v.is_null() { json!({}) } else { v };
    // serde names the value it could not take, whole: cut, it is the model's.
    serde_json::from_value(v).map_err(|e| {
        format!("bad arguments for {tool}: {}; see the tool's schema", crate::escape::shown_max(&e.to_string(), 400))
    })
}

/// What the tools need from the run.
pub struct Context<'a> {
    pub session: &'a Session,
    pub runner: &'a Runner,
    /// The sub-task's `jail session`, unless the runner is stateless.
    pub cells: &'a Cells,
    /// The run's warm pool, where a sub-task's session is claimed.
    pub pool: &'a Pool,
    pub skills: &'a Skills,
    /// The rootfs whose packages `list_available_packages` reports.
    pub rootfs: Option<&'a Path>,
    pub budget: Budget,
    /// What the jail accepted after the latest step: the only output files
    /// the host reads.
    pub accepted: &'a Accepted,
    /// The run's deadline: no step runs past it.
    pub deadline: std::time::Instant,
    /// Where a running step is shown, and for which agent.
    pub progress: &'a crate::progress::Display,
    pub agent: &'a str,
}

/// A finished tool call.
#[derive(Debug, Clone)]
pub struct Done {
    /// What the model is told.
    pub content: String,
    pub ok: bool,
    pub jail: Option<JailFacts>,
    /// The jail's result, from a `run_python_file` that ran.
    pub step: Option<Box<jail::result::RunResult>>,
}

impl Done {
    pub fn ok(content: String) -> Done {
        Done { content, ok: true, jail: None, step: None }
    }

    pub fn error(message: String) -> Done {
        Done { content: format!("error: {message}"), ok: false, jail: None, step: None }
    }
}

#[derive(Deserialize)]
struct PathArgs {
    path: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    limit: Option<u64>,
}

#[derive(Deserialize)]
struct SkillArgs {
    name: String,
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Deserialize)]
struct RunArgs {
    path: String,
    #[serde(default)]
    args: Vec<String>,
}

#[derive(Deserialize)]
struct NoArgs {}

/// Largest script `write_python_file` accepts.
const MAX_SCRIPT_BYTES: usize = 256 << 10;
/// Most characters `read_file_content` returns.
const MAX_READ_CHARS: usize = 12_000;

impl Context<'_> {
    /// Run one of the tools that do not steer the run.
    pub fn call(&self, tool: &str, args: &str) -> Done {
        let r = match tool {
            "list_input_files" => parse_args::<NoArgs>(tool, args).map(|_| self.list(Area::Input)),
            "list_output_files" => parse_args::<NoArgs>(tool, args).map(|_| self.list(Area::Output)),
            "read_file_content" => parse_args::<PathArgs>(tool, args).and_then(|a| self.read(&a)),
            "read_skill" => parse_args::<SkillArgs>(tool, args).and_then(|a| self.read_skill(&a.name)),
            "list_available_packages" => parse_args::<NoArgs>(tool, args).and_then(|_| self.packages()),
            "write_python_file" => parse_args::<WriteArgs>(tool, args).and_then(|a| self.write(&a)),
            "delete_output_file" => parse_args::<PathArgs>(tool, args).and_then(|a| self.delete(&a.path)),
            "run_python_file" => return parse_args::<RunArgs>(tool, args).map_or_else(Done::error, |a| self.run(&a)),
            other => Err(format!("no tool named `{}` here", shown(other))),
        };
        r.map_or_else(Done::error, Done::ok)
    }

    fn list(&self, area: Area) -> String {
        let entries = self.session.list(area);
        if entries.is_empty() {
            return format!("{}: empty", area.jail_path());
        }
        let mut out = format!("{} ({} entries):\n", area.jail_path(), entries.len());
        for e in &entries {
            let what = match e.kind {
                EntryKind::File => view::human_bytes(e.bytes),
                EntryKind::Dir => "folder".into(),
                EntryKind::Symlink => "symbolic link, not followed".into(),
                EntryKind::Other => "not a regular file".into(),
            };
            out.push_str(&format!("{}/{} ({what})\n", area.jail_path(), display_path(&e.rel)));
        }
        if entries.len() >= crate::session::MAX_LIST_ENTRIES {
            out.push_str("(listing cut at its cap)\n");
        }
        out
    }

    fn read(&self, a: &PathArgs) -> Result<String, String> {
        let (area, rel) = self.session.resolve(&a.path)?;
        let shown = format!("{}/{}", area.jail_path(), display_path(&rel.to_string_lossy()));
        if area == Area::Output && self.accepted.get(&rel.to_string_lossy()).is_none() {
            return Err(format!(
                "{shown} is not among the files the jail accepted after the last step (see its `refused by the jail` list), so the host does not read it"
            ));
        }
        let mut f = self.session.open(area, &rel).map_err(|e| format!("{}: {e}", area.jail_path()))?;
        let mut buf = Vec::new();
        f.by_ref().take(16 << 20).read_to_end(&mut buf).map_err(|e| format!("{shown}: {e}"))?;
        let size = f.metadata().map(|m| m.len()).unwrap_or(buf.len() as u64);
        let probe = &buf[..buf.len().min(8192)];
        if probe.contains(&0)
            || std::str::from_utf8(probe).is_err() && String::from_utf8_lossy(probe).matches('\u{FFFD}').count() > 8
        {
            let magic: String = buf.iter().take(8).map(|b| format!("{b:02x}")).collect();
            return Ok(format!(
                "{shown} is a binary file ({}, starts with {magic}); it cannot be shown as text. Inspect it with a script instead.",
                view::human_bytes(size)
            ));
        }
        let text = String::from_utf8_lossy(&buf);
        let lines: Vec<&str> = text.lines().collect();
        let offset = a.offset.unwrap_or(0) as usize;
        let limit = a.limit.unwrap_or(100).clamp(1, 1000) as usize;
        if offset >= lines.len() && !lines.is_empty() {
            return Err(format!("{shown} has {} lines; offset {offset} is past its end", lines.len()));
        }
        let mut body = String::new();
        let mut last = offset;
        for (i, l) in lines.iter().enumerate().skip(offset).take(limit) {
            let l = display_line(l);
            if body.len() + l.len() > MAX_READ_CHARS {
                body.push_str("[… cut at the read budget; use offset and limit to read on …]\n");
                break;
            }
            body.push_str(&l);
            body.push('\n');
            last = i + 1;
        }
        let more = if last < lines.len() {
            format!("; more from offset {last}")
        } else {
            String::new()
        };
        Ok(format!("{shown}: lines {offset}-{} of {} ({}){more}\n{body}", last, lines.len(), view::human_bytes(size)))
    }

    fn delete(&self, given: &str) -> Result<String, String> {
        let g = given.trim();
        let rel = g.strip_prefix("/workspace/output/").or_else(|| g.strip_prefix("output/")).unwrap_or(g);
        if rel.starts_with('/') {
            return Err(format!("{}: only files in /workspace/output can be deleted", shown(given)));
        }
        let rel = crate::session::clean_relative(rel)?;
        crate::export::delete_beneath(&self.session.output, &rel)?;
        Ok(format!("deleted /workspace/output/{}", shown(&rel.to_string_lossy())))
    }

    fn read_skill(&self, name: &str) -> Result<String, String> {
        match self.skills.get(name) {
            Some(s) => Ok(format!("# skill: {}\n{}", s.name, s.body)),
            None => Err(format!("no skill named `{}`; the skills are: {}", shown(name), self.skills.names().join(", "))),
        }
    }

    fn packages(&self) -> Result<String, String> {
        let Some(rootfs) = self.rootfs else {
            return Err("no rootfs is configured (pass --rootfs or set JAIL_ROOTFS), so the packages are unknown".into());
        };
        packages::list(rootfs).map(|p| p.render())
    }

    fn write(&self, a: &WriteArgs) -> Result<String, String> {
        let rel = script_path(&a.path)?;
        if a.content.len() > MAX_SCRIPT_BYTES {
            return Err(format!("the script is over {} KiB; split it into smaller files", MAX_SCRIPT_BYTES >> 10));
        }
        self.session.write_code(&rel, a.content.as_bytes())?;
        let lines = a.content.lines().count();
        Ok(format!("wrote /workspace/code/{} ({lines} lines); run it with run_python_file", rel.display()))
    }

    fn run(&self, a: &RunArgs) -> Done {
        let rel = match script_path(&a.path) {
            Ok(r) => r,
            Err(e) => return Done::error(e),
        };
        if !self.session.code.join(&rel).is_file() {
            return Done::error(format!(
                "/workspace/code/{} does not exist; write it with write_python_file first",
                rel.display()
            ));
        }
        let left = self.deadline.saturating_duration_since(std::time::Instant::now());
        if left < std::time::Duration::from_secs(1) {
            return Done::error("not run: the run's deadline has passed".into());
        }
        if let Some(sig) = crate::stop::requested() {
            return Done::error(format!("not run: the agent is stopping ({sig})"));
        }
        let before = self.session.snapshot();
        let mut watch = self.progress.step(self.agent, &rel.to_string_lossy());
        let in_session = !self.runner.stateless && self.cells.fits(left);
        let ran = if in_session {
            self.run_cell(&rel, &a.args, left, &mut watch)
        } else {
            let fresh = Origin { from: JailFrom::Run, claim_ms: None, not_pooled: None, session: None };
            self.runner
                .run(self.session, &rel, &a.args, Some(left), &mut watch)
                .map(|s| (s, String::new(), fresh))
        };
        let (step, note, origin) = match ran {
            Ok(s) => s,
            Err(e) => return Done::error(format!("the step could not be run: {e}")),
        };
        let after = self.session.list(Area::Output);
        let r = &step.result;
        let mut content = view::render(r, &before, &after, self.budget);
        if !self.runner.stateless && !in_session {
            content.push_str("session: this step ran in a fresh sandbox of its own, not in the sub-task's session, because the run's deadline is near: nothing from earlier steps was defined in it\n");
        }
        content.push_str(&note);
        let status = serde_json::to_value(r.status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        let ok = r.status == jail::result::Status::Ok;
        let jail = JailFacts {
            status,
            exit_code: r.exit_code,
            wall_ms: r.usage.wall_ms,
            cpu_ms: r.usage.user_cpu_ms.zip(r.usage.system_cpu_ms).map(|(u, s)| u + s),
            peak_memory_bytes: r.usage.peak_memory_bytes.or(r.usage.max_rss_bytes),
            jail_total_ms: r.timings.total_ms,
            denials: r.denials.iter().take(50).map(|d| shown(&format!("{} {}×{}", d.layer, d.what, d.count))).collect(),
            rejected_artifacts: rejected_of(r),
            artifacts: r.artifacts.len() as u64,
            setup_stage: r.setup_error.as_ref().map(|e| shown(&e.stage)),
            jail_from: origin.from.as_str().to_string(),
            claim_ms: origin.claim_ms,
            not_pooled: origin.not_pooled.map(|w| shown(&w)),
            session: origin.session.map(|s| shown(&s)),
        };
        Done { content, ok, jail: Some(jail), step: Some(Box::new(step.result)) }
    }
}

/// The entries the jail refused in a result, `path: reason` (escaped,
/// cut), at most 50.
pub(crate) fn rejected_of(r: &jail::result::RunResult) -> Vec<String> {
    r.rejected_artifacts
        .iter()
        .take(50)
        .map(|x| {
            let reason = serde_json::to_value(x.reason).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
            shown(&format!("{}: {reason}", x.path))
        })
        .collect()
}

/// What `run_python_file` does, told to the model.
fn run_description(stateless: bool) -> &'static str {
    if stateless {
        "Run one script from /workspace/code in a fresh sandbox and get its result: status, error, output head and tail, files produced. Nothing survives from one script to the next but the files in /workspace/output."
    } else {
        "Run one script from /workspace/code as the next step of this sub-task's Python session and get its result: status, error, output head and tail. State persists within the sub-task: variables, imports and DataFrames defined by an earlier script are still defined, so load a CSV once and reuse the DataFrame in later scripts. Files written to /workspace/output reach the host (and list_output_files, read_file_content) when the sub-task ends. If the result says the session ended (e.g. the interpreter died), that state is gone: the next script starts a fresh session and must load its data again."
    }
}

/// The cell that runs a script as `jail run` would, in the session's
/// globals: its `sys.argv` and `__file__`, and its source compiled under
/// its own name (tracebacks say `/workspace/code/step1.py`, line N, with
/// the line shown). The cell's own frame, the `exec` that runs the script,
/// is the agent's plumbing: it is taken off the traceback of anything the
/// script raises, so the model reads its own file and lines only (the
/// session's driver drops its frame the same way). A JSON string is a
/// valid Python string literal.
fn script_cell(rel: &Path, args: &[String], source: &str) -> String {
    let file = format!("/workspace/code/{}", rel.display());
    let argv: Vec<&str> = std::iter::once(file.as_str()).chain(args.iter().map(String::as_str)).collect();
    let argv = serde_json::to_string(&argv).unwrap_or_else(|_| "[]".into());
    let file = serde_json::to_string(&file).unwrap_or_else(|_| "''".into());
    let source = serde_json::to_string(source).unwrap_or_else(|_| "''".into());
    format!(
        "import sys as _jail_sys, linecache as _jail_lc\n_jail_sys.argv = {argv}\n__file__ = {file}\n_jail_src = {source}\n_jail_lc.cache[__file__] = (len(_jail_src), None, _jail_src.splitlines(True), __file__)\ndel _jail_sys, _jail_lc\ntry:\n    exec(compile(_jail_src, __file__, 'exec'))\nexcept BaseException as _jail_e:\n    if _jail_e.__traceback__ is not None:\n        _jail_e.__traceback__ = _jail_e.__traceback__.tb_next\n    raise\nfinally:\n    del _jail_src\n"
    )
}

/// Where a step's jail came from, for its trace record: the claim's (or
/// the start's) time and why the pool was passed over go with the first
/// step of a session.
struct Origin {
    from: JailFrom,
    claim_ms: Option<f64>,
    not_pooled: Option<String>,
    session: Option<String>,
}

impl Context<'_> {
    /// Run a script as the next cell of the sub-task's session (taken now
    /// if none is live: claimed from the pool, or started); returns the
    /// step, what the model is told about the session, and where its jail
    /// came from.
    fn run_cell(
        &self,
        rel: &Path,
        args: &[String],
        left: std::time::Duration,
        watch: &mut dyn crate::progress::StepWatch,
    ) -> Result<(crate::runner::StepRun, String, Origin), crate::runner::RunnerError> {
        let path = self.session.code.join(rel);
        let mut code = String::new();
        std::fs::File::open(&path)
            .and_then(|f| f.take(MAX_SCRIPT_BYTES as u64 + 1).read_to_string(&mut code))
            .map_err(|error| crate::runner::RunnerError::Spawn { path, error })?;
        let cell = script_cell(rel, args, &code);
        let attempt = |watch: &mut dyn crate::progress::StepWatch| {
            self.cells.with_live(self.runner, self.session, self.pool, left, |live| {
                let origin = Origin {
                    from: live.from,
                    claim_ms: live.claim_ms.take(),
                    not_pooled: live.not_pooled.take(),
                    session: Some(live.id.clone()),
                };
                let step = self.runner.exec_cell(live, &cell, watch);
                // The model's steps in this session, from 1: the session's
                // own cell count also holds the pool's preload.
                (step, origin, live.cells)
            })
        };
        let ((mut step, mut origin, mut number), mut fresh) = attempt(watch)?;
        let lost = matches!(&step, Err(crate::runner::RunnerError::Session(e)) if e.is_gone());
        if lost && !fresh {
            // The session ended between steps (its idle timeout, its
            // lifetime): start a fresh one, and say so.
            self.cells.forget_ended();
            let why = step.as_ref().err().map(|e| shown(&crate::llm::excerpt(&e.to_string(), 300))).unwrap_or_default();
            *self.cells.ended_note.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            ((step, origin, number), fresh) = attempt(watch)?;
        }
        let step = step?;
        let mut note = String::new();
        let earlier = self.cells.ended_note.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (true, Some(why)) = (fresh, earlier) {
            note.push_str(&format!("session: a fresh session started for this step because the last one ended ({why}): nothing from earlier steps is defined here\n"));
        }
        match step.result.session.clone() {
            Some(s) if s.ended => {
                self.cells.forget_ended();
                let why = format!("{}{}", s.why.as_deref().unwrap_or("ended"), s.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default());
                let why = shown(&crate::llm::excerpt(&why, 300));
                note.push_str(&format!("session: this sub-task's Python session ENDED ({why}). Every variable, import and DataFrame of the earlier steps is gone. The next run_python_file starts a fresh session: load the data again (re-run the loading code) before using it. Files it had written to /workspace/output are checked and kept as usual.\n"));
                *self.cells.ended_note.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            }
            Some(_) => note.push_str(&format!(
                "session: step {number} of this sub-task's session; its variables stay defined for the next step. Files written to /workspace/output reach the host when the sub-task ends.\n"
            )),
            None => {}
        }
        Ok((step, note, origin))
    }
}

/// Longest script path `write_python_file` and `run_python_file` accept.
const MAX_SCRIPT_NAME: usize = 120;

/// A script path relative to the code dir, ending in `.py`.
fn script_path(given: &str) -> Result<PathBuf, String> {
    let g = given.trim();
    let g = g.strip_prefix("/workspace/code/").or_else(|| g.strip_prefix("code/")).unwrap_or(g);
    if g.starts_with('/') {
        return Err(format!("{}: scripts live in /workspace/code; give a file name like step1.py", shown(given)));
    }
    let rel = crate::session::clean_relative(g)?;
    let ok_chars = g.chars().all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
    if g.len() > MAX_SCRIPT_NAME {
        return Err(format!("{}: a script name has at most {MAX_SCRIPT_NAME} bytes", shown(given)));
    }
    if rel.as_os_str().is_empty() || !ok_chars || rel.extension().is_none_or(|e| e != "py") {
        return Err(format!("{}: give a file name of letters, digits, `_`, `-` and `.`, ending in .py", shown(given)));
    }
    Ok(rel)
}

/// A line of a file, safe to show: control characters but tab escaped.
fn display_line(l: &str) -> String {
    l.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_an_object_schema_and_a_description() {
        let skills = Skills::load(None).unwrap();
        for role in [Role::Orchestrator, Role::SubAgent] {
            for s in specs(role, &skills, false) {
                let f = &s["function"];
                assert!(!f["description"].as_str().unwrap().is_empty(), "{f}");
                assert_eq!(f["parameters"]["type"], "object", "{f}");
            }
        }
        assert!(!names(Role::Orchestrator).contains(&"run_python_file"));
        assert!(!names(Role::SubAgent).contains(&"start_next_todo"));
    }

    #[test]
    fn bad_arguments_are_answered_in_words() {
        let e = parse_args::<WriteArgs>("write_python_file", "{not json").err().unwrap();
        assert!(e.contains("not valid JSON"), "{e}");
        let e = parse_args::<WriteArgs>("write_python_file", r#"{"path":"a.py"}"#).err().unwrap();
        assert!(e.contains("missing field `content`"), "{e}");
        assert!(parse_args::<NoArgs>("list_input_files", "").is_ok());
        // A value of the wrong type is named by serde, whole: not echoed whole.
        let huge = format!(r#"{{"path": "a.py", "offset": "{}"}}"#, "A".repeat(5 << 20));
        let e = parse_args::<PathArgs>("read_file_content", &huge).err().unwrap();
        assert!(e.len() < 600, "{} bytes", e.len());
    }

    #[test]
    fn script_paths_stay_in_the_code_dir() {
        assert_eq!(script_path("/workspace/code/a.py").unwrap(), PathBuf::from("a.py"));
        assert_eq!(script_path("lib/b.py").unwrap(), PathBuf::from("lib/b.py"));
        let long = format!("{}.py", "a".repeat(5 << 20));
        assert!(script_path(&long).unwrap_err().len() < 400);
        for bad in ["../a.py", "/etc/a.py", "a.sh", "a b.py", ""] {
            assert!(script_path(bad).is_err(), "{bad}");
        }
    }
}
