//! Accounting: every model call and tool call of a run, one JSON line each
//! in the session's `trace.jsonl` (written as it happens, so a crash leaves a
//! usable trace), and at the end a summary of tokens and time by agent and by
//! tool, built from those same records, printed and saved as `summary.txt`
//! and `summary.json`.
//!
//! Each record closes one span of the OpenTelemetry GenAI shape (see
//! `otel`): `chat` for a model call, `execute_tool` for a tool call,
//! `invoke_agent` for a sub-agent (`agent_end`) and for the orchestrator
//! (`run_end`). A record carries the run's id (the trace id), its span id and
//! parent, and absolute start and end times, so the JSONL is the same tree
//! as the exported spans, usable offline. Unless the run was started with
//! `--no-trace-content`, it also holds the prompts (the messages each call
//! added), the completions, the tool arguments and the tool results.
//!
//! Tokens per tool: a reply's completion tokens are split over the tool
//! calls it produced, in proportion to the characters of each call (its
//! name and arguments: what the model generated for it); a reply without a
//! tool call counts as text. The summary shows what each tool cost to
//! write, so a `write_python_file` that carries a whole script shows up
//! against the `run_python_file` that only names it.
//!
//! Times never overlap: a tool call's time excludes a sub-agent it started
//! (that is the sub-agent's own model and tool calls), so model time plus
//! tool time never exceeds the run's wall time.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot write the trace {path}: {error}")]
    Write { path: PathBuf, error: io::Error },
}

/// Whether prompts, completions, tool arguments and results are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    Recorded,
    /// `--no-trace-content`: only names, sizes, tokens and times.
    Omitted,
}

/// Most bytes of one recorded text (a tool result, arguments, a message).
pub const MAX_CONTENT_BYTES: usize = 64 << 10;

/// Where a span began: its id, its parent's, and its start time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpanStart {
    /// 16 hex digits.
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub start_unix_ns: u64,
}

impl SpanStart {
    /// A new span beginning now under `parent`.
    pub fn now(parent: Option<&str>) -> SpanStart {
        SpanStart {
            span_id: new_id(8),
            parent_span_id: parent.map(String::from),
            start_unix_ns: unix_ns(),
        }
    }
}

/// One line of the trace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub seq: u64,
    /// Milliseconds since the run started, at the end of the event.
    pub t_ms: f64,
    /// When the event ended, RFC 3339 UTC.
    #[serde(default)]
    pub time: String,
    /// The run's id: the trace id of its spans (32 hex digits).
    #[serde(default)]
    pub run_id: String,
    /// The span this record closes, and its parent.
    #[serde(default)]
    pub span_id: String,
    #[serde(default)]
    pub parent_span_id: Option<String>,
    #[serde(default)]
    pub start_unix_ns: u64,
    #[serde(default)]
    pub end_unix_ns: u64,
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
        /// Why each retried attempt failed, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        retries: Vec<String>,
        finish_reason: Option<String>,
        /// Names of the tools the model called in this reply.
        tool_calls: Vec<String>,
        /// Ids of those calls, in the same order.
        #[serde(default)]
        tool_call_ids: Vec<String>,
        /// The messages this call added to the agent's conversation (the
        /// whole prompt, for its first call); omitted with `--no-trace-content`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_messages: Option<Vec<Value>>,
        /// The reply: its text and its tool calls; omitted likewise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_message: Option<Value>,
    },
    ToolCall {
        tool: String,
        #[serde(default)]
        call_id: String,
        ok: bool,
        duration_ms: f64,
        /// The error the model was given, when the call failed.
        error: Option<String>,
        /// For `run_python_file`: what the jail reported.
        jail: Option<Box<JailFacts>>,
        /// The completion tokens of the reply that asked for this call, its share.
        #[serde(default)]
        tokens_out: u64,
        /// The arguments as the model sent them; omitted with `--no-trace-content`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<String>,
        /// What the model was told; omitted likewise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<String>,
        /// The size of what the model was told, in bytes (kept with
        /// `--no-trace-content` too): the input tokens it adds to the
        /// agent's later calls are attributed to this tool.
        #[serde(default)]
        result_bytes: u64,
    },
    /// A sub-agent finished its item.
    AgentEnd {
        outcome: String,
        steps: u32,
        tokens_in: u64,
        tokens_out: u64,
        wall_ms: f64,
    },
    /// The run's warm pool (pool.rs), from its start to its close; one per
    /// run (and per resumed part), written just before `run_end`, whether
    /// it started or not.
    Pool {
        /// `--pool-size`.
        size: usize,
        /// `up` (it started), `off` (`--pool-size 0`, `--stateless`),
        /// `not_started` (no sub-task needed a session), `failed` (it
        /// could not start, or ended mid-run).
        state: String,
        /// Why it was off or failed.
        note: Option<String>,
        /// Milliseconds from its start until it answered (its first jail made).
        start_ms: Option<f64>,
        /// Sessions it handed out.
        claims: u64,
        /// Its own `stats` just before it was closed: refill time, what an
        /// idle jail holds.
        stats: Option<jail::client::pool::Stats>,
    },
    /// A sub-task's session was stopped (cells.rs): the jail judged its
    /// output and delivered what passed.
    SessionStop {
        /// The session's id.
        session: Option<String>,
        /// Why it was stopped: `complete_todo`, `delete_output_file`, the
        /// sub-task's end, the run's end.
        why: String,
        /// Files the jail accepted, and the ones it refused (`path:
        /// reason`, names escaped).
        accepted: u64,
        #[serde(default)]
        rejected: Vec<String>,
        /// The stop could not get the closing result: why.
        #[serde(default)]
        error: Option<String>,
    },
    /// The run ended (or stopped, to be resumed).
    RunEnd {
        stop: String,
        wall_ms: f64,
        /// Each item of the plan as the run ended.
        #[serde(default)]
        items: Vec<ItemEnd>,
    },
}

/// One item of the plan as the run ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ItemEnd {
    pub name: String,
    /// `done`, `blocked`, or `not_done` (pending or in progress when the
    /// run stopped).
    pub outcome: String,
    /// Why it was blocked or not done, in the sub-agent's or the
    /// orchestrator's words (cut).
    pub reason: Option<String>,
}

impl ItemEnd {
    pub fn of(item: &crate::todo::TodoItem) -> ItemEnd {
        use crate::todo::State;
        let (outcome, reason) = match item.state {
            State::Done => ("done", None),
            State::Blocked => ("blocked", item.report.clone()),
            State::Pending => ("not_done", Some("not started: the run ended first".to_string())),
            State::InProgress => ("not_done", Some("in progress when the run stopped".to_string())),
        };
        ItemEnd {
            name: item.name.clone(),
            outcome: outcome.into(),
            reason: reason.map(|r| crate::escape::cut(&r, 600)),
        }
    }
}

/// The jail's own account of one step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct JailFacts {
    pub status: String,
    pub exit_code: Option<i32>,
    pub wall_ms: f64,
    pub cpu_ms: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
    /// `timings.total_ms`: the whole jail run, setup included.
    pub jail_total_ms: f64,
    /// Refused calls, `layer what×count`.
    #[serde(default)]
    pub denials: Vec<String>,
    /// Output entries the jail refused, `path: reason` (names escaped).
    #[serde(default)]
    pub rejected_artifacts: Vec<String>,
    /// Accepted output files.
    #[serde(default)]
    pub artifacts: u64,
    /// The setup failure's stage, when it could not start.
    #[serde(default)]
    pub setup_stage: Option<String>,
    /// Where the step's jail came from: `pool` (a session claimed from the
    /// run's warm pool), `session_start` (a session the agent started
    /// itself), `run` (a fresh `jail run` for this step); empty in the
    /// traces of agents before the pool.
    #[serde(default)]
    pub jail_from: String,
    /// On the first step of a session: how long it waited for its jail —
    /// the claim from the pool, or the `jail session start`; null on the
    /// session's later steps and for `run` (whose set-up is in
    /// `jail_total_ms`).
    #[serde(default)]
    pub claim_ms: Option<f64>,
    /// On the first step of a session the agent started while the pool
    /// was on: why the pool did not give it.
    #[serde(default)]
    pub not_pooled: Option<String>,
    /// The session's id, for a step run as a session's cell.
    #[serde(default)]
    pub session: Option<String>,
}

/// Something that wants each record as it is written (the OTLP exporter).
pub trait Sink {
    fn record(&mut self, record: &Record);
    /// Deliver what is buffered; called at the end of a run.
    fn flush(&mut self) {}
}

pub struct Trace {
    path: PathBuf,
    file: File,
    started: Instant,
    /// Wall time of the earlier parts of a resumed run.
    offset_ms: f64,
    pub run_id: String,
    pub records: Vec<Record>,
    pub content: Content,
    sinks: Vec<Box<dyn Sink>>,
}

impl Trace {
    /// A new trace file (0600: it holds the prompts and the model's words).
    pub fn create(path: &Path, started: Instant, run_id: String, content: Content) -> Result<Trace, TraceError> {
        let file = open(path, true).map_err(|error| TraceError::Write { path: path.to_path_buf(), error })?;
        Ok(Trace {
            path: path.to_path_buf(),
            file,
            started,
            offset_ms: 0.0,
            run_id,
            records: Vec::new(),
            content,
            sinks: Vec::new(),
        })
    }

    /// Append to the trace of a run that is resumed.
    pub fn resume(path: &Path, started: Instant, run_id: String, content: Content, offset_ms: f64) -> Result<Trace, TraceError> {
        let records = read(path).map_err(|error| TraceError::Write { path: path.to_path_buf(), error })?;
        let file = open(path, false).map_err(|error| TraceError::Write { path: path.to_path_buf(), error })?;
        Ok(Trace {
            path: path.to_path_buf(),
            file,
            started,
            offset_ms,
            run_id,
            records,
            content,
            sinks: Vec::new(),
        })
    }

    pub fn add_sink(&mut self, sink: Box<dyn Sink>) {
        self.sinks.push(sink);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Milliseconds since the run started, earlier parts included.
    pub fn elapsed_ms(&self) -> f64 {
        self.offset_ms + self.started.elapsed().as_secs_f64() * 1000.0
    }

    /// Text to record, or none with `--no-trace-content`.
    pub fn content_of(&self, text: &str) -> Option<String> {
        (self.content == Content::Recorded).then(|| crate::escape::cut(text, MAX_CONTENT_BYTES))
    }

    /// Write one record closing `span` now.
    pub fn record(&mut self, agent: &str, todo: Option<&str>, span: &SpanStart, event: Event) -> Result<(), TraceError> {
        let end = unix_ns().max(span.start_unix_ns);
        let r = Record {
            seq: self.records.last().map_or(0, |r| r.seq) + 1,
            t_ms: self.elapsed_ms(),
            time: rfc3339(end),
            run_id: self.run_id.clone(),
            span_id: span.span_id.clone(),
            parent_span_id: span.parent_span_id.clone(),
            start_unix_ns: span.start_unix_ns,
            end_unix_ns: end,
            agent: agent.to_string(),
            todo: todo.map(String::from),
            event,
        };
        let mut line = serde_json::to_string(&r).unwrap_or_default();
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .map_err(|error| TraceError::Write { path: self.path.clone(), error })?;
        for s in &mut self.sinks {
            s.record(&r);
        }
        self.records.push(r);
        Ok(())
    }

    pub fn flush(&mut self) {
        for s in &mut self.sinks {
            s.flush();
        }
    }
}

fn open(path: &Path, truncate: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    if truncate {
        o.write(true).create(true).truncate(true);
    } else {
        o.append(true);
    }
    o.mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Split a reply's completion tokens over its tool calls by the characters
/// each call took (name and arguments), so the shares add up exactly.
pub fn split_tokens(tokens: u64, sizes: &[usize]) -> Vec<u64> {
    if sizes.is_empty() {
        return Vec::new();
    }
    let total: u128 = sizes.iter().map(|&s| s.max(1) as u128).sum();
    let mut shares: Vec<u64> = sizes.iter().map(|&s| (tokens as u128 * s.max(1) as u128 / total) as u64).collect();
    let mut left = tokens - shares.iter().sum::<u64>();
    // The remainder goes to the largest calls first.
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
}

/// `n` random bytes as hex (span ids: 8, trace ids: 16).
pub fn new_id(n: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    let ok = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).is_ok();
    if !ok || buf.iter().all(|&b| b == 0) {
        // Never all zero (an invalid id in OpenTelemetry).
        use sha2::Digest;
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(1);
        let seed = format!("{}-{}-{}", unix_ns(), std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        buf = sha2::Sha256::digest(seed.as_bytes())[..n].to_vec();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// `2026-12-03T13:30:21.123Z` for nanoseconds since the epoch.
pub fn rfc3339(unix_ns: u64) -> String {
    let secs = (unix_ns / 1_000_000_000) as i64;
    let ms = (unix_ns / 1_000_000) % 1000;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Howard Hinnant's days-to-civil: (year, month, day) of a day count since
/// 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
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
    /// Completion tokens the model spent asking for these calls.
    #[serde(default)]
    pub tokens_out: u64,
    /// Prompt tokens its results cost: each result is sent again with every
    /// later call of the agent that got it, and is counted each time.
    #[serde(default)]
    pub tokens_in: u64,
}

/// One item of the plan: who worked on it, how it ended, what it cost.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ItemRow {
    /// Its place in the plan, from 1.
    pub n: usize,
    pub name: String,
    /// The sub-agents that worked on it (none: never started).
    pub agents: Vec<String>,
    /// `done`, `blocked` or `not_done`.
    pub outcome: String,
    pub reason: Option<String>,
    /// The sub-agents' wall time, and its share of the run's.
    pub wall_ms: f64,
    pub wall_share: f64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Its tokens (in + out) as a share of the run's.
    pub token_share: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub by_agent: Vec<AgentRow>,
    pub by_tool: Vec<ToolRow>,
    /// The sums over every agent (and, for tool fields, over every tool).
    pub total: AgentRow,
    /// Completion tokens of replies that called no tool (plain text).
    #[serde(default)]
    pub text_tokens_out: u64,
    pub tokens_estimated: bool,
    pub jail_wall_ms: f64,
    pub run_wall_ms: f64,
    pub stop: String,
    /// Where the steps' jails came from, and the warm pool's state and stats.
    #[serde(default)]
    pub jails: Jails,
    /// The plan, item by item.
    #[serde(default)]
    pub items: Vec<ItemRow>,
    /// The orchestrator's own share: its tokens and its model and tool time.
    #[serde(default)]
    pub orchestrator: ItemRow,
    /// Prompt tokens that are not a tool's result: the system prompts, the
    /// task and briefs, nudges (`prompt`) and the model's own earlier
    /// replies sent back (`replies`). With the tools' `tokens_in` they add
    /// up to the run's tokens in.
    #[serde(default)]
    pub prompt_tokens_in: u64,
    #[serde(default)]
    pub reply_tokens_in: u64,
    /// Model requests retried (429, 5xx, transport failures, garbage).
    #[serde(default)]
    pub retries: u64,
    /// Output entries the jail refused over the run (`path: reason`, each once).
    #[serde(default)]
    pub refused: Vec<String>,
    /// Sessions stopped, and their closing's time in all.
    #[serde(default)]
    pub session_stops: u64,
    #[serde(default)]
    pub session_stop_ms: f64,
}

/// Where the steps' jails came from, from the step records, and what the
/// last `pool` record says.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Jails {
    /// Sessions claimed from the warm pool, and the mean claim time.
    pub pooled_sessions: u64,
    pub claim_ms_mean: Option<f64>,
    /// Sessions the agent started itself, and the mean start time.
    pub started_sessions: u64,
    pub start_ms_mean: Option<f64>,
    /// Steps in a fresh `jail run` each.
    pub fresh_jails: u64,
    /// Why sessions were started while the pool was on, each once.
    pub not_pooled: Vec<String>,
    pub pool_size: Option<usize>,
    /// `up`, `off`, `not_started`, `failed` (see `Event::Pool`).
    pub pool_state: Option<String>,
    pub pool_note: Option<String>,
    pub pool_start_ms: Option<f64>,
    pub refill_ms_mean: Option<f64>,
    pub refill_ms_last: Option<f64>,
    /// What one idle pooled jail holds (the mean over the ready ones).
    pub idle_rss_bytes: Option<u64>,
    pub idle_pss_bytes: Option<u64>,
    pub idle_anon_bytes: Option<u64>,
}

impl Jails {
    fn from_records(records: &[Record]) -> Jails {
        let mut j = Jails::default();
        let (mut claims, mut starts) = (Vec::new(), Vec::new());
        for r in records {
            match &r.event {
                Event::ToolCall { jail: Some(f), .. } => match f.jail_from.as_str() {
                    "pool" if f.claim_ms.is_some() => claims.extend(f.claim_ms),
                    "session_start" if f.claim_ms.is_some() => {
                        starts.extend(f.claim_ms);
                        if let Some(why) = f.not_pooled.as_ref().filter(|w| !j.not_pooled.contains(w)) {
                            j.not_pooled.push(why.clone());
                        }
                    }
                    "run" => j.fresh_jails += 1,
                    _ => {}
                },
                Event::Pool { size, state, note, start_ms, stats, .. } => {
                    j.pool_size = Some(*size);
                    j.pool_state = Some(state.clone());
                    j.pool_note = note.clone();
                    j.pool_start_ms = *start_ms;
                    let refilled = stats.as_ref().filter(|s| s.refill_ms.mean > 0.0);
                    j.refill_ms_mean = refilled.map(|s| s.refill_ms.mean);
                    j.refill_ms_last = refilled.map(|s| s.refill_ms.last);
                    let idle = stats.as_ref().and_then(|s| s.idle.as_ref());
                    // With no jail ready at the close (a replacement being
                    // made), the RSS of the last one made stands in.
                    let last = stats.as_ref().map(|s| s.idle_rss_bytes).filter(|&b| b > 0);
                    j.idle_rss_bytes = idle.and_then(|i| i.rss_bytes).or(last);
                    j.idle_pss_bytes = idle.and_then(|i| i.pss_bytes);
                    j.idle_anon_bytes = idle.and_then(|i| i.anon_bytes);
                }
                _ => {}
            }
        }
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        j.pooled_sessions = claims.len() as u64;
        j.claim_ms_mean = mean(&claims);
        j.started_sessions = starts.len() as u64;
        j.start_ms_mean = mean(&starts);
        j
    }

    /// The summary's lines about the jails and the pool.
    fn render(&self) -> String {
        use crate::escape::{escape, Lines};
        let ms = |v: Option<f64>| v.map_or(String::new(), |m| format!(" ({m:.0} ms mean)"));
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
        if self.pool_state.is_none() && self.pooled_sessions + self.started_sessions + self.fresh_jails == 0 {
            // A trace of an agent before the pool: nothing to say.
            return String::new();
        }
        let mut out = format!(
            "\njails: {} sessions claimed from the warm pool{}, {} sessions started by the agent{}, {} fresh jails (jail run)\n",
            self.pooled_sessions,
            ms(self.claim_ms_mean),
            self.started_sessions,
            ms(self.start_ms_mean),
            self.fresh_jails
        );
        for why in &self.not_pooled {
            out.push_str(&format!("  started, not pooled: {}\n", escape(why, Lines::One)));
        }
        let Some(state) = &self.pool_state else { return out };
        let note = self.pool_note.as_deref().map(|n| format!(" ({})", escape(n, Lines::One))).unwrap_or_default();
        out.push_str(&format!("warm pool: size {}, {}{note}", self.pool_size.unwrap_or(0), escape(state, Lines::One)));
        if let Some(m) = self.pool_start_ms {
            out.push_str(&format!("; first jail made in {m:.0} ms"));
        }
        if let (Some(mean), Some(last)) = (self.refill_ms_mean, self.refill_ms_last) {
            out.push_str(&format!("; refill {mean:.0} ms mean, {last:.0} ms last"));
        }
        let held: Vec<String> = [
            (self.idle_rss_bytes, "RSS"),
            (self.idle_pss_bytes, "PSS"),
            (self.idle_anon_bytes, "anonymous"),
        ]
        .iter()
        .filter_map(|(b, what)| b.map(|b| format!("{} {what}", mib(b))))
        .collect();
        if !held.is_empty() {
            out.push_str(&format!("; an idle jail holds {}", held.join(", ")));
        }
        out.push('\n');
        out
    }
}

impl Summary {
    /// Build the summary from trace records alone.
    pub fn from_records(records: &[Record], run_wall_ms: f64, stop: &str) -> Summary {
        let mut agents: Vec<AgentRow> = Vec::new();
        let mut tools: BTreeMap<String, ToolRow> = BTreeMap::new();
        let mut estimated = false;
        let (mut text_tokens_out, mut retries) = (0, 0);
        let mut refused: Vec<String> = Vec::new();
        let (mut session_stops, mut session_stop_ms) = (0, 0.0);
        let mut refuse = |list: &[String]| {
            for r in list {
                if !refused.contains(r) && refused.len() < 200 {
                    refused.push(r.clone());
                }
            }
        };
        for r in records {
            let idx = match agents.iter().position(|a| a.agent == r.agent) {
                Some(i) => i,
                None => {
                    agents.push(AgentRow { agent: r.agent.clone(), ..AgentRow::default() });
                    agents.len() - 1
                }
            };
            let row = &mut agents[idx];
            match &r.event {
                Event::ModelCall { tokens_in, tokens_out, tokens_estimated, duration_ms, tool_calls, attempts, .. } => {
                    row.model_calls += 1;
                    row.tokens_in += tokens_in;
                    row.tokens_out += tokens_out;
                    row.model_ms += duration_ms;
                    estimated |= tokens_estimated;
                    retries += u64::from(attempts.saturating_sub(1));
                    if tool_calls.is_empty() {
                        text_tokens_out += tokens_out;
                    }
                }
                Event::ToolCall { tool, ok, duration_ms, jail, tokens_out, .. } => {
                    row.tool_calls += 1;
                    row.tool_ms += duration_ms;
                    let t = tools.entry(tool.clone()).or_insert_with(|| ToolRow { tool: tool.clone(), ..ToolRow::default() });
                    t.calls += 1;
                    t.errors += u64::from(!ok);
                    t.tool_ms += duration_ms;
                    t.jail_wall_ms += jail.as_ref().map_or(0.0, |j| j.wall_ms);
                    t.tokens_out += tokens_out;
                    if let Some(j) = jail {
                        refuse(&j.rejected_artifacts);
                    }
                }
                Event::SessionStop { rejected, .. } => {
                    session_stops += 1;
                    session_stop_ms += (r.end_unix_ns.saturating_sub(r.start_unix_ns)) as f64 / 1e6;
                    refuse(rejected);
                }
                Event::AgentEnd { .. } | Event::RunEnd { .. } | Event::Pool { .. } => {}
            }
        }
        let inputs = tokens_in_by_tool(records);
        for (tool, n) in &inputs.by_tool {
            if let Some(t) = tools.get_mut(tool) {
                t.tokens_in = *n;
            }
        }
        agents.retain(|a| a.model_calls > 0 || a.tool_calls > 0);
        let mut total = AgentRow { agent: "total".into(), ..AgentRow::default() };
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
        let (items, orchestrator) = items_of(records, &agents, &total, run_wall_ms);
        Summary {
            by_agent: agents,
            by_tool,
            total,
            text_tokens_out,
            tokens_estimated: estimated,
            jail_wall_ms,
            run_wall_ms,
            stop: stop.to_string(),
            jails: Jails::from_records(records),
            items,
            orchestrator,
            prompt_tokens_in: inputs.prompt,
            reply_tokens_in: inputs.replies,
            retries,
            refused,
            session_stops,
            session_stop_ms,
        }
    }

    /// The summary as plain-text tables; every name escaped.
    pub fn render(&self) -> String {
        use crate::escape::{escape, shown_max, Lines};
        let s = |ms: f64| format!("{:.2}", ms / 1000.0);
        let pct = |f: f64| format!("{:.0}%", f * 100.0);
        let mut out = String::new();
        if !self.items.is_empty() {
            out.push_str("by item (wall: the sub-agent's; share: of the run's wall time and tokens)\n");
            out.push_str(&format!(
                "{:>2} {:<24} {:<12} {:<9} {:>8} {:>6} {:>10} {:>10} {:>6}\n",
                "#", "item", "sub-agent", "outcome", "wall s", "share", "tokens in", "tokens out", "share"
            ));
            for i in self.items.iter().chain(std::iter::once(&self.orchestrator)) {
                let n = if i.n == 0 { String::new() } else { i.n.to_string() };
                out.push_str(&format!(
                    "{:>2} {:<24} {:<12} {:<9} {:>8} {:>6} {:>10} {:>10} {:>6}\n",
                    n,
                    shown_max(&i.name, 24),
                    shown_max(&i.agents.join(","), 12),
                    i.outcome,
                    s(i.wall_ms),
                    pct(i.wall_share),
                    i.tokens_in,
                    i.tokens_out,
                    pct(i.token_share)
                ));
            }
            for i in self.items.iter().filter(|i| i.outcome != "done") {
                if let Some(r) = &i.reason {
                    out.push_str(&format!("   {} {}: {}\n", i.n, i.outcome, shown_max(r, 300)));
                }
            }
            out.push('\n');
        }
        out.push_str("tokens and time by agent\n");
        out.push_str(&format!(
            "{:<24} {:>6} {:>10} {:>10} {:>9} {:>6} {:>9}\n",
            "agent", "calls", "tokens in", "tokens out", "model s", "tools", "tool s"
        ));
        for a in self.by_agent.iter().chain(std::iter::once(&self.total)) {
            out.push_str(&format!(
                "{:<24} {:>6} {:>10} {:>10} {:>9} {:>6} {:>9}\n",
                shown_max(&a.agent, 24),
                a.model_calls,
                a.tokens_in,
                a.tokens_out,
                s(a.model_ms),
                a.tool_calls,
                s(a.tool_ms)
            ));
        }
        out.push_str("\ntime and tokens by tool (tokens in: what its results cost the later calls; tokens out: what the model wrote to call it)\n");
        let line = |name: &str, calls: String, errors: String, tool_s: String, jail_s: String, tin: String, tout: String| {
            format!("{name:<24} {calls:>6} {errors:>6} {tool_s:>9} {jail_s:>11} {tin:>10} {tout:>10}\n")
        };
        out.push_str(&line(
            "tool",
            "calls".into(),
            "errors".into(),
            "tool s".into(),
            "jail wall s".into(),
            "tokens in".into(),
            "tokens out".into(),
        ));
        for t in &self.by_tool {
            out.push_str(&line(
                &shown_max(&t.tool, 40),
                t.calls.to_string(),
                t.errors.to_string(),
                s(t.tool_ms),
                s(t.jail_wall_ms),
                t.tokens_in.to_string(),
                t.tokens_out.to_string(),
            ));
        }
        let blank = String::new;
        out.push_str(&line(
            "(prompts and briefs)",
            blank(),
            blank(),
            blank(),
            blank(),
            self.prompt_tokens_in.to_string(),
            blank(),
        ));
        out.push_str(&line("(earlier replies)", blank(), blank(), blank(), blank(), self.reply_tokens_in.to_string(), blank()));
        if self.text_tokens_out > 0 {
            out.push_str(&line("(text replies)", blank(), blank(), blank(), blank(), blank(), self.text_tokens_out.to_string()));
        }
        let errors: u64 = self.by_tool.iter().map(|t| t.errors).sum();
        out.push_str(&line(
            "total",
            self.total.tool_calls.to_string(),
            errors.to_string(),
            s(self.total.tool_ms),
            s(self.jail_wall_ms),
            self.total.tokens_in.to_string(),
            self.total.tokens_out.to_string(),
        ));
        let write = self.by_tool.iter().find(|t| t.tool == "write_python_file").map_or(0, |t| t.tokens_out);
        let run = self.by_tool.iter().find(|t| t.tool == "run_python_file").map_or(0, |t| t.tokens_out);
        if write + run > 0 {
            out.push_str(&format!("\nwriting scripts cost {write} tokens out, running them {run}\n"));
        }
        out.push_str(&self.jails.render());
        if self.session_stops > 0 {
            out.push_str(&format!(
                "sessions stopped: {} ({:.0} ms mean to judge and deliver their files)\n",
                self.session_stops,
                self.session_stop_ms / self.session_stops as f64
            ));
        }
        if !self.refused.is_empty() {
            out.push_str(&format!("refused by the jail ({}, not handed on):\n", self.refused.len()));
            for r in self.refused.iter().take(20) {
                out.push_str(&format!("  {}\n", shown_max(r, 300)));
            }
            if self.refused.len() > 20 {
                out.push_str(&format!("  … and {} more (summary.json lists them)\n", self.refused.len() - 20));
            }
        }
        if self.retries > 0 {
            out.push_str(&format!("model requests retried: {}\n", self.retries));
        }
        let other = (self.run_wall_ms - self.total.model_ms - self.total.tool_ms).max(0.0);
        out.push_str(&format!(
            "\nrun: {} s wall ({} s waiting for the model, {} s in tools, {} s other); stopped: {}{}\n",
            s(self.run_wall_ms),
            s(self.total.model_ms),
            s(self.total.tool_ms),
            s(other),
            escape(&self.stop, Lines::One),
            if self.tokens_estimated {
                " (some token counts are estimates: the endpoint reported no usage)"
            } else {
                ""
            }
        ));
        out
    }

    pub fn save(&self, dir: &Path) -> Result<(), TraceError> {
        let write = |name: &str, text: String| {
            let p = dir.join(name);
            crate::session::write_private(&p, text.as_bytes()).map_err(|error| TraceError::Write { path: p, error })
        };
        write("summary.txt", self.render())?;
        write("summary.json", serde_json::to_string_pretty(self).unwrap_or_default())
    }
}

/// Prompt tokens attributed: to each tool whose results the later calls
/// carried, to the prompts, and to the model's own replies sent back.
#[derive(Debug, Default, PartialEq)]
struct Inputs {
    by_tool: BTreeMap<String, u64>,
    prompt: u64,
    replies: u64,
}

/// Split every call's prompt tokens by what is in the prompt. Per agent,
/// in order: a call's prompt is its previous one, plus the previous reply,
/// plus what came since (the tools' results, and nudges); the growth past
/// the reply is split over the new results by their size, and each result
/// then counts in every later call of that agent. What no result accounts
/// for is the prompts' (system prompt, task or brief, nudges). Integer sums
/// that add up to the run's tokens in exactly.
fn tokens_in_by_tool(records: &[Record]) -> Inputs {
    #[derive(Default)]
    struct Conv {
        prev: Option<(u64, u64)>,
        /// Results since the last call: (tool, bytes).
        fresh: Vec<(String, u64)>,
        /// Tokens of each tool's results in the conversation, and of replies.
        live: BTreeMap<String, f64>,
        replies: f64,
    }
    let mut convs: BTreeMap<&str, Conv> = BTreeMap::new();
    let mut by_tool: BTreeMap<String, f64> = BTreeMap::new();
    let (mut replies, mut total) = (0.0, 0u64);
    for r in records {
        let c = convs.entry(r.agent.as_str()).or_default();
        match &r.event {
            Event::ToolCall { tool, result_bytes, .. } => c.fresh.push((tool.clone(), *result_bytes)),
            Event::ModelCall { tokens_in, tokens_out, .. } => {
                total += tokens_in;
                if let Some((pin, pout)) = c.prev {
                    c.replies += pout as f64;
                    let grown = tokens_in.saturating_sub(pin + pout) as f64;
                    let bytes: u64 = c.fresh.iter().map(|(_, b)| b).sum();
                    if bytes > 0 {
                        for (tool, b) in c.fresh.drain(..) {
                            *c.live.entry(tool).or_default() += grown * b as f64 / bytes as f64;
                        }
                    }
                }
                c.fresh.clear();
                c.prev = Some((*tokens_in, *tokens_out));
                // What this call carried, never more than its prompt.
                let carried: f64 = c.live.values().sum::<f64>() + c.replies;
                let scale = if carried > *tokens_in as f64 { *tokens_in as f64 / carried } else { 1.0 };
                for (tool, n) in &c.live {
                    *by_tool.entry(tool.clone()).or_default() += n * scale;
                }
                replies += c.replies * scale;
            }
            _ => {}
        }
    }
    let by_tool: BTreeMap<String, u64> = by_tool.into_iter().map(|(t, n)| (t, n.round() as u64)).collect();
    let replies = (replies.round() as u64).min(total);
    let prompt = total.saturating_sub(replies + by_tool.values().sum::<u64>());
    Inputs { by_tool, prompt, replies }
}

/// The plan's items as the run ended (the last `run_end`), each with the
/// sub-agents that worked on it and what they cost; and the orchestrator's
/// own share.
fn items_of(records: &[Record], agents: &[AgentRow], total: &AgentRow, run_wall_ms: f64) -> (Vec<ItemRow>, ItemRow) {
    let ends: Vec<ItemEnd> = records
        .iter()
        .rev()
        .find_map(|r| match &r.event {
            Event::RunEnd { items, .. } => Some(items.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let tokens_all = (total.tokens_in + total.tokens_out).max(1) as f64;
    let wall_all = run_wall_ms.max(1.0);
    let mut rows = Vec::new();
    for (i, end) in ends.iter().enumerate() {
        let mut row = ItemRow {
            n: i + 1,
            name: end.name.clone(),
            outcome: end.outcome.clone(),
            reason: end.reason.clone(),
            ..ItemRow::default()
        };
        let mut ended_ms = None::<f64>;
        let mut spent_ms = 0.0;
        for r in records.iter().filter(|r| r.todo.as_deref() == Some(end.name.as_str()) && r.agent != "orchestrator") {
            if !row.agents.contains(&r.agent) {
                row.agents.push(r.agent.clone());
            }
            match &r.event {
                Event::ModelCall { tokens_in, tokens_out, duration_ms, .. } => {
                    row.tokens_in += tokens_in;
                    row.tokens_out += tokens_out;
                    spent_ms += duration_ms;
                }
                Event::ToolCall { duration_ms, .. } => spent_ms += duration_ms,
                Event::AgentEnd { wall_ms, .. } => *ended_ms.get_or_insert(0.0) += wall_ms,
                _ => {}
            }
        }
        // A sub-agent that ended says its wall time; one that was stopped
        // has only its calls' time.
        row.wall_ms = ended_ms.unwrap_or(spent_ms);
        row.wall_share = row.wall_ms / wall_all;
        row.token_share = (row.tokens_in + row.tokens_out) as f64 / tokens_all;
        rows.push(row);
    }
    let o = agents.iter().find(|a| a.agent == "orchestrator").cloned().unwrap_or_default();
    let wall = o.model_ms + o.tool_ms;
    let orchestrator = ItemRow {
        n: 0,
        name: "(orchestrator)".into(),
        agents: Vec::new(),
        outcome: String::new(),
        reason: None,
        wall_ms: wall,
        wall_share: wall / wall_all,
        tokens_in: o.tokens_in,
        tokens_out: o.tokens_out,
        token_share: (o.tokens_in + o.tokens_out) as f64 / tokens_all,
    };
    (rows, orchestrator)
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

    fn rec(agent: &str, event: Event) -> Record {
        Record {
            seq: 0,
            t_ms: 0.0,
            time: String::new(),
            run_id: String::new(),
            span_id: String::new(),
            parent_span_id: None,
            start_unix_ns: 0,
            end_unix_ns: 0,
            agent: agent.into(),
            todo: None,
            event,
        }
    }

    fn model(agent: &str, tin: u64, tout: u64, ms: f64, calls: &[&str]) -> Record {
        rec(
            agent,
            Event::ModelCall {
                model: "m".into(),
                tokens_in: tin,
                tokens_out: tout,
                tokens_estimated: false,
                duration_ms: ms,
                attempts: 1,
                retries: Vec::new(),
                finish_reason: None,
                tool_calls: calls.iter().map(|c| c.to_string()).collect(),
                tool_call_ids: vec![],
                input_messages: None,
                output_message: None,
            },
        )
    }

    fn tool(agent: &str, name: &str, ok: bool, ms: f64, tokens_out: u64) -> Record {
        rec(
            agent,
            Event::ToolCall {
                tool: name.into(),
                call_id: String::new(),
                ok,
                duration_ms: ms,
                error: None,
                jail: None,
                tokens_out,
                arguments: None,
                result: None,
                result_bytes: 0,
            },
        )
    }

    #[test]
    fn the_summary_adds_up_by_agent_and_by_tool() {
        let recs = vec![
            model("orchestrator", 10, 2, 5.0, &["create_todo_list"]),
            tool("orchestrator", "create_todo_list", true, 1.0, 2),
            model("subagent-1", 20, 4, 7.0, &["run_python_file", "run_python_file"]),
            tool("subagent-1", "run_python_file", false, 30.0, 2),
            tool("subagent-1", "run_python_file", true, 20.0, 2),
            model("orchestrator", 5, 9, 1.0, &[]),
        ];
        let s = Summary::from_records(&recs, 100.0, "finished");
        assert_eq!(s.by_agent.len(), 2);
        assert_eq!((s.total.tokens_in, s.total.tokens_out, s.total.model_calls), (35, 15, 3));
        assert_eq!(s.total.tool_ms, 51.0);
        let run = s.by_tool.iter().find(|t| t.tool == "run_python_file").unwrap();
        assert_eq!((run.calls, run.errors, run.tool_ms, run.tokens_out), (2, 1, 50.0, 4));
        assert_eq!(s.text_tokens_out, 9);
        assert_eq!(s.by_tool.iter().map(|t| t.tokens_out).sum::<u64>() + s.text_tokens_out, s.total.tokens_out);
        let text = s.render();
        assert!(text.contains("subagent-1") && text.contains("stopped: finished"), "{text}");
        assert!(text.contains("writing scripts cost 0 tokens out, running them 4"), "{text}");
    }

    fn step(from: &str, claim_ms: Option<f64>, not_pooled: Option<&str>) -> Record {
        let mut r = tool("subagent-1", "run_python_file", true, 1.0, 0);
        if let Event::ToolCall { jail, .. } = &mut r.event {
            *jail = Some(Box::new(JailFacts {
                jail_from: from.into(),
                claim_ms,
                not_pooled: not_pooled.map(String::from),
                ..JailFacts::default()
            }));
        }
        r
    }

    #[test]
    fn the_summary_says_where_the_jails_came_from_and_what_the_pool_held() {
        let stats = jail::client::pool::Stats {
            size: 1,
            ready: 0,
            refill_ms: jail::client::pool::Refill { last: 90.0, mean: 80.0, ..Default::default() },
            idle_rss_bytes: 3 << 20,
            idle: None,
            ..Default::default()
        };
        let recs = vec![
            step("pool", Some(4.0), None),
            step("pool", None, None),
            step("pool", Some(6.0), None),
            step("session_start", Some(100.0), Some("the warm pool ended")),
            step("session_start", Some(120.0), Some("the warm pool ended")),
            step("run", None, None),
            rec(
                "orchestrator",
                Event::Pool {
                    size: 1,
                    state: "failed".into(),
                    note: Some("the warm pool ended".into()),
                    start_ms: Some(50.0),
                    claims: 2,
                    stats: Some(stats),
                },
            ),
        ];
        let j = Summary::from_records(&recs, 10.0, "finished").jails;
        assert_eq!((j.pooled_sessions, j.claim_ms_mean), (2, Some(5.0)));
        assert_eq!((j.started_sessions, j.start_ms_mean, j.fresh_jails), (2, Some(110.0), 1));
        assert_eq!(j.not_pooled, ["the warm pool ended"], "each reason once");
        // No jail was ready at the close: the last one made's RSS stands in.
        assert_eq!((j.idle_rss_bytes, j.idle_pss_bytes), (Some(3 << 20), None));
        let text = j.render();
        assert!(text.contains("jails: 2 sessions claimed from the warm pool (5 ms mean), 2 sessions started by the agent (110 ms mean), 1 fresh jails"), "{text}");
        assert!(text.contains("warm pool: size 1, failed (the warm pool ended); first jail made in 50 ms; refill 80 ms mean, 90 ms last; an idle jail holds 3.0 MiB RSS"), "{text}");
        // A trace of an agent before the pool has none of it, and says so.
        let old = Summary::from_records(&[tool("a", "run_python_file", true, 1.0, 0)], 1.0, "finished").jails;
        assert_eq!((&old.pool_state, old.pooled_sessions), (&None, 0));
        assert_eq!(old.render(), "");
    }

    fn result(agent: &str, name: &str, bytes: u64) -> Record {
        let mut r = tool(agent, name, true, 1.0, 0);
        if let Event::ToolCall { result_bytes, .. } = &mut r.event {
            *result_bytes = bytes;
        }
        r
    }

    #[test]
    fn prompt_tokens_are_attributed_to_the_tool_whose_result_each_call_carries_and_add_up() {
        let recs = vec![
            model("orchestrator", 100, 10, 1.0, &["create_todo_list"]),
            result("orchestrator", "create_todo_list", 400),
            // 50 tokens more than the last prompt and reply: the plan's result.
            model("orchestrator", 160, 5, 1.0, &["start_next_todo"]),
            model("subagent-1", 200, 20, 1.0, &["read_file_content", "run_python_file"]),
            result("subagent-1", "read_file_content", 4000),
            result("subagent-1", "run_python_file", 1000),
            // 500 more: split 4:1 by the results' sizes.
            model("subagent-1", 720, 5, 1.0, &["complete_todo"]),
            result("subagent-1", "complete_todo", 10),
            result("orchestrator", "start_next_todo", 800),
            model("orchestrator", 365, 9, 1.0, &[]),
        ];
        let i = tokens_in_by_tool(&recs);
        // Each result counts in every later call of its agent.
        assert_eq!(i.by_tool["create_todo_list"], 100, "{i:?}");
        assert_eq!(i.by_tool["start_next_todo"], 200, "{i:?}");
        assert_eq!((i.by_tool["read_file_content"], i.by_tool["run_python_file"]), (400, 100), "{i:?}");
        assert_eq!(i.replies, 10 + 15 + 20, "{i:?}");
        let total: u64 = [100, 160, 200, 720, 365].iter().sum();
        assert_eq!(i.by_tool.values().sum::<u64>() + i.replies + i.prompt, total);
        let s = Summary::from_records(&recs, 100.0, "finished");
        assert_eq!(
            s.by_tool.iter().map(|t| t.tokens_in).sum::<u64>() + s.prompt_tokens_in + s.reply_tokens_in,
            s.total.tokens_in
        );
        assert!(s.render().contains("(prompts and briefs)"), "{}", s.render());
    }

    #[test]
    fn the_summary_has_each_item_with_its_sub_agent_outcome_and_shares() {
        let mut recs = vec![
            model("orchestrator", 100, 10, 10.0, &["create_todo_list"]),
            model("subagent-1", 300, 30, 20.0, &["block_todo"]),
            rec(
                "subagent-1",
                Event::AgentEnd { outcome: "no".into(), steps: 1, tokens_in: 300, tokens_out: 30, wall_ms: 40.0 },
            ),
            rec(
                "orchestrator",
                Event::RunEnd {
                    stop: "finished".into(),
                    wall_ms: 100.0,
                    items: vec![
                        ItemEnd {
                            name: "a".into(),
                            outcome: "blocked".into(),
                            reason: Some("no \u{1b}data".into()),
                        },
                        ItemEnd { name: "b".into(), outcome: "not_done".into(), reason: Some("not started".into()) },
                    ],
                },
            ),
        ];
        recs[1].todo = Some("a".into());
        recs[2].todo = Some("a".into());
        let s = Summary::from_records(&recs, 100.0, "finished");
        assert_eq!(s.items.len(), 2);
        let a = &s.items[0];
        assert_eq!(
            (a.n, a.agents.clone(), a.outcome.as_str(), a.tokens_in, a.tokens_out),
            (1, vec!["subagent-1".to_string()], "blocked", 300, 30)
        );
        assert_eq!((a.wall_ms, a.wall_share), (40.0, 0.4));
        assert!((a.token_share - 330.0 / 440.0).abs() < 1e-9);
        assert_eq!((s.items[1].agents.len(), s.items[1].tokens_in), (0, 0));
        assert_eq!((s.orchestrator.tokens_in, s.orchestrator.wall_ms), (100, 10.0));
        let text = s.render();
        assert!(text.contains("by item") && text.contains("1 blocked: no \\x1bdata"), "{text}");
    }

    #[test]
    fn completion_tokens_split_by_what_each_call_took_and_add_up() {
        assert_eq!(split_tokens(100, &[900, 100]), vec![90, 10]);
        let s = split_tokens(7, &[1, 1, 1]);
        assert_eq!(s.iter().sum::<u64>(), 7);
        assert_eq!(split_tokens(0, &[5]), vec![0]);
        assert!(split_tokens(5, &[]).is_empty());
        let s = split_tokens(1_000_003, &[12_345, 6, 0, 999]);
        assert_eq!(s.iter().sum::<u64>(), 1_000_003);
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_304_621_123_000_000), "2026-12-03T13:30:21.123Z");
        assert_eq!(rfc3339(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(new_id(8).len(), 16);
        assert_ne!(new_id(16), new_id(16));
    }

    #[test]
    fn records_round_trip_through_a_trace_file_and_a_resumed_trace_appends() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("trace.jsonl");
        let span = SpanStart::now(None);
        let mut tr = Trace::create(&p, Instant::now(), new_id(16), Content::Recorded).unwrap();
        tr.record("orchestrator", Some("a"), &span, Event::RunEnd { stop: "finished".into(), wall_ms: 1.0, items: Vec::new() })
            .unwrap();
        let back = read(&p).unwrap();
        assert_eq!(back, tr.records);
        assert!(std::fs::read_to_string(&p).unwrap().contains(r#""kind":"run_end""#));
        assert!(back[0].time.ends_with('Z') && back[0].span_id == span.span_id && back[0].run_id.len() == 32);
        let mut again = Trace::resume(&p, Instant::now(), tr.run_id.clone(), Content::Recorded, 5000.0).unwrap();
        again
            .record("orchestrator", None, &span, Event::RunEnd { stop: "finished".into(), wall_ms: 2.0, items: Vec::new() })
            .unwrap();
        let back = read(&p).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].seq, 2);
        assert!(back[1].t_ms >= 5000.0);
    }
}
