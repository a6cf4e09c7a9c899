//! Accounting: every model call and tool call of a run, one JSON line each
//! in the session's `trace.jsonl` (written as it happens, so a crash leaves a
//! usable trace), and at the end a summary of tokens and time by agent and by
//! tool, built from those same records, printed and saved as `summary.txt`
//! and `summary.json`.
//!
//! Times never overlap: a tool call's time excludes a sub-agent it started
//! (that is the sub-agent's own model and tool calls), so model time plus
//! tool time never exceeds the run's wall time.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot write the trace {path}: {error}")]
    Write { path: PathBuf, error: io::Error },
}

/// One line of the trace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub seq: u64,
    /// Milliseconds since the run started, at the end of the event.
    pub t_ms: f64,
    /// `orchestrator`, or `subagent-N` for the N-th sub-agent.
    pub agent: String,
    /// The todo item the agent was working on.
    pub todo: Option<String>,
    #[serde(flatten)]
    pub event: Event,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    ModelCall {
        model: String,
        tokens_in: u64,
        tokens_out: u64,
        /// The endpoint reported no usage; the counts are estimates.
        tokens_estimated: bool,
        duration_ms: f64,
        /// HTTP attempts, 1 when nothing was retried.
        attempts: u32,
        finish_reason: Option<String>,
        /// Names of the tools the model called in this reply.
        tool_calls: Vec<String>,
    },
    ToolCall {
        tool: String,
        ok: bool,
        duration_ms: f64,
        /// The error the model was given, when the call failed.
        error: Option<String>,
        /// For `run_python_file`: what the jail reported.
        jail: Option<JailFacts>,
    },
    /// A sub-agent finished its item.
    AgentEnd {
        outcome: String,
        steps: u32,
        tokens_in: u64,
        tokens_out: u64,
        wall_ms: f64,
    },
    /// The run ended.
    RunEnd { stop: String, wall_ms: f64 },
}

/// The jail's own account of one step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JailFacts {
    pub status: String,
    pub exit_code: Option<i32>,
    pub wall_ms: f64,
    pub cpu_ms: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
    /// `timings.total_ms`: the whole jail run, setup included.
    pub jail_total_ms: f64,
}

pub struct Trace {
    path: PathBuf,
    file: File,
    started: Instant,
    pub records: Vec<Record>,
}

impl Trace {
    pub fn create(path: &Path, started: Instant) -> Result<Trace, TraceError> {
        use std::os::unix::fs::OpenOptionsExt;
        // Private from the start: it holds the prompts and the model's words.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|error| TraceError::Write {
                path: path.to_path_buf(),
                error,
            })?;
        Ok(Trace {
            path: path.to_path_buf(),
            file,
            started,
            records: Vec::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    pub fn record(
        &mut self,
        agent: &str,
        todo: Option<&str>,
        event: Event,
    ) -> Result<(), TraceError> {
        let r = Record {
            seq: self.records.len() as u64 + 1,
            t_ms: self.elapsed_ms(),
            agent: agent.to_string(),
            todo: todo.map(String::from),
            event,
        };
        let mut line = serde_json::to_string(&r).unwrap_or_default();
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .map_err(|error| TraceError::Write {
                path: self.path.clone(),
                error,
            })?;
        self.records.push(r);
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentRow {
    pub agent: String,
    pub model_calls: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub model_ms: f64,
    pub tool_calls: u64,
    pub tool_ms: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ToolRow {
    pub tool: String,
    pub calls: u64,
    pub errors: u64,
    pub tool_ms: f64,
    /// Sum of the jail's own wall time over the runs of this tool.
    pub jail_wall_ms: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub by_agent: Vec<AgentRow>,
    pub by_tool: Vec<ToolRow>,
    /// The sums over every agent (and, for tool fields, over every tool).
    pub total: AgentRow,
    pub tokens_estimated: bool,
    pub jail_wall_ms: f64,
    pub run_wall_ms: f64,
    pub stop: String,
}

impl Summary {
    /// Build the summary from trace records alone.
    pub fn from_records(records: &[Record], run_wall_ms: f64, stop: &str) -> Summary {
        let mut agents: Vec<AgentRow> = Vec::new();
        let mut tools: BTreeMap<String, ToolRow> = BTreeMap::new();
        let mut estimated = false;
        for r in records {
            let idx = match agents.iter().position(|a| a.agent == r.agent) {
                Some(i) => i,
                None => {
                    agents.push(AgentRow {
                        agent: r.agent.clone(),
                        ..AgentRow::default()
                    });
                    agents.len() - 1
                }
            };
            let row = &mut agents[idx];
            match &r.event {
                Event::ModelCall {
                    tokens_in,
                    tokens_out,
                    tokens_estimated,
                    duration_ms,
                    ..
                } => {
                    row.model_calls += 1;
                    row.tokens_in += tokens_in;
                    row.tokens_out += tokens_out;
                    row.model_ms += duration_ms;
                    estimated |= tokens_estimated;
                }
                Event::ToolCall {
                    tool,
                    ok,
                    duration_ms,
                    jail,
                    ..
                } => {
                    row.tool_calls += 1;
                    row.tool_ms += duration_ms;
                    let t = tools.entry(tool.clone()).or_insert_with(|| ToolRow {
                        tool: tool.clone(),
                        ..ToolRow::default()
                    });
                    t.calls += 1;
                    t.errors += u64::from(!ok);
                    t.tool_ms += duration_ms;
                    t.jail_wall_ms += jail.as_ref().map_or(0.0, |j| j.wall_ms);
                }
                Event::AgentEnd { .. } | Event::RunEnd { .. } => {}
            }
        }
        agents.retain(|a| a.model_calls > 0 || a.tool_calls > 0);
        let mut total = AgentRow {
            agent: "total".into(),
            ..AgentRow::default()
        };
        for a in &agents {
            total.model_calls += a.model_calls;
            total.tokens_in += a.tokens_in;
            total.tokens_out += a.tokens_out;
            total.model_ms += a.model_ms;
            total.tool_calls += a.tool_calls;
            total.tool_ms += a.tool_ms;
        }
        let by_tool: Vec<ToolRow> = tools.into_values().collect();
        let jail_wall_ms = by_tool.iter().map(|t| t.jail_wall_ms).sum();
        Summary {
            by_agent: agents,
            by_tool,
            total,
            tokens_estimated: estimated,
            jail_wall_ms,
            run_wall_ms,
            stop: stop.to_string(),
        }
    }

    /// The summary as two plain-text tables.
    pub fn render(&self) -> String {
        let s = |ms: f64| format!("{:.2}", ms / 1000.0);
        let mut out = String::from("tokens and time by agent\n");
        out.push_str(&format!(
            "{:<24} {:>6} {:>10} {:>10} {:>9} {:>6} {:>9}\n",
            "agent", "calls", "tokens in", "tokens out", "model s", "tools", "tool s"
        ));
        for a in self.by_agent.iter().chain(std::iter::once(&self.total)) {
            out.push_str(&format!(
                "{:<24} {:>6} {:>10} {:>10} {:>9} {:>6} {:>9}\n",
                crate::escape::shown_max(&a.agent, 24),
                a.model_calls,
                a.tokens_in,
                a.tokens_out,
                s(a.model_ms),
                a.tool_calls,
                s(a.tool_ms)
            ));
        }
        out.push_str("\ntime by tool\n");
        out.push_str(&format!(
            "{:<24} {:>6} {:>6} {:>9} {:>11}\n",
            "tool", "calls", "errors", "tool s", "jail wall s"
        ));
        for t in &self.by_tool {
            let name = crate::escape::shown_max(&t.tool, 40);
            out.push_str(&format!(
                "{:<24} {:>6} {:>6} {:>9} {:>11}\n",
                name,
                t.calls,
                t.errors,
                s(t.tool_ms),
                s(t.jail_wall_ms)
            ));
        }
        let errors: u64 = self.by_tool.iter().map(|t| t.errors).sum();
        out.push_str(&format!(
            "{:<24} {:>6} {:>6} {:>9} {:>11}\n",
            "total",
            self.total.tool_calls,
            errors,
            s(self.total.tool_ms),
            s(self.jail_wall_ms)
        ));
        let other = (self.run_wall_ms - self.total.model_ms - self.total.tool_ms).max(0.0);
        out.push_str(&format!(
            "\nrun: {} s wall ({} s waiting for the model, {} s in tools, {} s other); stopped: {}{}\n",
            s(self.run_wall_ms),
            s(self.total.model_ms),
            s(self.total.tool_ms),
            s(other),
            crate::escape::escape(&self.stop, crate::escape::Lines::One),
            if self.tokens_estimated { " (some token counts are estimates: the endpoint reported no usage)" } else { "" }
        ));
        out
    }

    pub fn save(&self, dir: &Path) -> Result<(), TraceError> {
        let write = |name: &str, text: String| {
            let p = dir.join(name);
            crate::session::write_private(&p, text.as_bytes())
                .map_err(|error| TraceError::Write { path: p, error })
        };
        write("summary.txt", self.render())?;
        write(
            "summary.json",
            serde_json::to_string_pretty(self).unwrap_or_default(),
        )
    }
}

/// Read a trace file back.
pub fn read(path: &Path) -> io::Result<Vec<Record>> {
    std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(agent: &str, tin: u64, tout: u64, ms: f64) -> Record {
        Record {
            seq: 0,
            t_ms: 0.0,
            agent: agent.into(),
            todo: None,
            event: Event::ModelCall {
                model: "m".into(),
                tokens_in: tin,
                tokens_out: tout,
                tokens_estimated: false,
                duration_ms: ms,
                attempts: 1,
                finish_reason: None,
                tool_calls: vec![],
            },
        }
    }

    fn tool(agent: &str, name: &str, ok: bool, ms: f64) -> Record {
        Record {
            seq: 0,
            t_ms: 0.0,
            agent: agent.into(),
            todo: None,
            event: Event::ToolCall {
                tool: name.into(),
                ok,
                duration_ms: ms,
                error: None,
                jail: None,
            },
        }
    }

    #[test]
    fn the_summary_adds_up_by_agent_and_by_tool() {
        let recs = vec![
            model("orchestrator", 10, 2, 5.0),
            tool("orchestrator", "create_todo_list", true, 1.0),
            model("subagent-1", 20, 4, 7.0),
            tool("subagent-1", "run_python_file", false, 30.0),
            tool("subagent-1", "run_python_file", true, 20.0),
        ];
        let s = Summary::from_records(&recs, 100.0, "finished");
        assert_eq!(s.by_agent.len(), 2);
        assert_eq!(
            (s.total.tokens_in, s.total.tokens_out, s.total.model_calls),
            (30, 6, 2)
        );
        assert_eq!(s.total.tool_ms, 51.0);
        let run = s
            .by_tool
            .iter()
            .find(|t| t.tool == "run_python_file")
            .unwrap();
        assert_eq!((run.calls, run.errors, run.tool_ms), (2, 1, 50.0));
        let text = s.render();
        assert!(
            text.contains("subagent-1") && text.contains("stopped: finished"),
            "{text}"
        );
    }

    #[test]
    fn records_round_trip_through_a_trace_file() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("trace.jsonl");
        let mut tr = Trace::create(&p, Instant::now()).unwrap();
        tr.record(
            "orchestrator",
            Some("a"),
            Event::RunEnd {
                stop: "finished".into(),
                wall_ms: 1.0,
            },
        )
        .unwrap();
        let back = read(&p).unwrap();
        assert_eq!(back, tr.records);
        assert!(std::fs::read_to_string(&p)
            .unwrap()
            .contains(r#""kind":"run_end""#));
    }
}
