//! The trace as OpenTelemetry spans, in the GenAI semantic conventions,
//! exported over OTLP/HTTP (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: Langfuse, Arize Phoenix,
//! Jaeger and Grafana Tempo take it. The exporter's own variables apply
//! (`OTEL_EXPORTER_OTLP_HEADERS` for an API key, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `..._TIMEOUT`).
//!
//! Every trace record (see `trace`) closes one span, with the ids, parent and
//! times the record carries, so the exported tree is the JSONL's tree:
//!
//! ```text
//! invoke_agent orchestrator
//! ├── chat MODEL                      gen_ai.usage.input_tokens / output_tokens
//! ├── execute_tool create_todo_list   gen_ai.tool.name, gen_ai.tool.call.id
//! ├── execute_tool start_next_todo
//! │   └── invoke_agent subagent-1
//! │       ├── chat MODEL
//! │       ├── execute_tool run_python_file   jail.status, jail.from, jail.claim_ms, ...
//! │       └── jail_session_stop       jail.session.id, jail.session.accepted, jail.rejected_artifacts
//! └── jail_pool                       jail.pool.state, jail.pool.refill_ms.mean, jail.pool.idle.*
//! ```
//!
//! The spans are built as the SDK's `SpanData` and handed to the
//! opentelemetry-otlp exporter in batches (every 32 spans, and at the end of
//! the run), over a small `HttpClient` on the agent's own blocking client,
//! ureq: no async runtime, no second HTTP stack. An export that fails is
//! reported once on stderr and never stops the run.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use opentelemetry_sdk::Resource;

use crate::agent::Config;
use crate::trace::{Event, Record, Sink};

/// Spans buffered before an export.
const BATCH: usize = 32;
/// Longest string attribute, in bytes (prompts and results are cut).
const MAX_ATTR_BYTES: usize = 32 << 10;

/// The exporters the environment asks for: one OTLP/HTTP exporter when an
/// OTLP endpoint is set, none otherwise.
pub fn sinks_from_env(config: &Config) -> Result<Vec<Box<dyn Sink>>, String> {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Ok(Vec::new());
    }
    if std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").is_ok_and(|p| p == "grpc") {
        return Err("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: jail-agent exports OTLP over HTTP only; unset it or set http/protobuf, and point OTEL_EXPORTER_OTLP_ENDPOINT at the HTTP port (4318)".into());
    }
    Ok(vec![Box::new(Otlp::new(config)?)])
}

/// An OTLP/HTTP exporter of trace records.
pub struct Otlp {
    exporter: opentelemetry_otlp::SpanExporter,
    scope: InstrumentationScope,
    model: String,
    server: Option<(String, i64)>,
    buffer: Vec<SpanData>,
    failed: bool,
}

impl Otlp {
    pub fn new(config: &Config) -> Result<Otlp, String> {
        let timeout = Duration::from_secs(10);
        let client = UreqClient(
            ureq::Agent::config_builder()
                .timeout_global(Some(timeout))
                .http_status_as_error(false)
                .user_agent(concat!("jail-agent/", env!("CARGO_PKG_VERSION")))
                .build()
                .into(),
        );
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(timeout)
            .build()
            .map_err(|e| format!("OTLP exporter: {e} (check OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://localhost:4318)"))?;
        let resource = Resource::builder().with_service_name(service_name()).build();
        exporter.set_resource(&resource);
        let scope = InstrumentationScope::builder("jail-agent").with_version(env!("CARGO_PKG_VERSION")).build();
        Ok(Otlp {
            exporter,
            scope,
            model: config.llm.model.clone(),
            server: server_of(&config.llm.base_url),
            buffer: Vec::new(),
            failed: false,
        })
    }

    fn export(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.buffer);
        let n = batch.len();
        if let Err(e) = futures_executor::block_on(self.exporter.export(batch)) {
            if !self.failed {
                eprintln!("jail-agent: OTLP export of {n} spans failed: {e} (the run goes on; trace.jsonl has everything)");
            }
            self.failed = true;
        }
    }
}

impl Sink for Otlp {
    fn record(&mut self, r: &Record) {
        if let Some(span) = span_of(r, &self.model, self.server.as_ref(), &self.scope) {
            self.buffer.push(span);
        }
        if self.buffer.len() >= BATCH {
            self.export();
        }
    }

    fn flush(&mut self) {
        self.export();
        let _ = self.exporter.force_flush();
    }
}

fn service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "jail-agent".into())
}

/// Host and port of the model's endpoint, for `server.address`/`server.port`.
fn server_of(url: &str) -> Option<(String, i64)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.to_string();
    let port = uri.port_u16().map(i64::from).unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    Some((host, port))
}

fn hex_id<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn text(s: &str) -> Value {
    Value::String(crate::escape::cut(s, MAX_ATTR_BYTES).into())
}

fn strings(v: &[String]) -> Value {
    Value::Array(opentelemetry::Array::String(v.iter().map(|s| crate::escape::cut(s, 1024).into()).collect()))
}

fn int(n: u64) -> Value {
    Value::I64(i64::try_from(n).unwrap_or(i64::MAX))
}

/// The span one record closes, in the GenAI conventions.
pub fn span_of(r: &Record, model: &str, server: Option<&(String, i64)>, scope: &InstrumentationScope) -> Option<SpanData> {
    let trace_id = TraceId::from_bytes(hex_id::<16>(&r.run_id)?);
    let span_id = SpanId::from_bytes(hex_id::<8>(&r.span_id)?);
    let parent = r.parent_span_id.as_deref().and_then(hex_id::<8>).map(SpanId::from_bytes).unwrap_or(SpanId::INVALID);
    let mut attrs = vec![
        KeyValue::new("gen_ai.agent.name", r.agent.clone()),
        KeyValue::new("gen_ai.conversation.id", r.run_id.clone()),
    ];
    if let Some(t) = &r.todo {
        attrs.push(KeyValue::new("jail_agent.todo", text(t)));
    }
    let mut status = Status::Unset;
    let (name, kind) = match &r.event {
        Event::ModelCall {
            model: m,
            tokens_in,
            tokens_out,
            tokens_estimated,
            attempts,
            retries,
            finish_reason,
            tool_calls,
            tool_call_ids,
            input_messages,
            output_message,
            ..
        } => {
            attrs.push(KeyValue::new("gen_ai.operation.name", "chat"));
            attrs.push(KeyValue::new("gen_ai.request.model", m.clone()));
            attrs.push(KeyValue::new("gen_ai.usage.input_tokens", int(*tokens_in)));
            attrs.push(KeyValue::new("gen_ai.usage.output_tokens", int(*tokens_out)));
            if let Some(f) = finish_reason {
                attrs.push(KeyValue::new("gen_ai.response.finish_reasons", strings(std::slice::from_ref(f))));
            }
            if let Some((host, port)) = server {
                attrs.push(KeyValue::new("server.address", host.clone()));
                attrs.push(KeyValue::new("server.port", *port));
            }
            attrs.push(KeyValue::new("jail_agent.tokens_estimated", *tokens_estimated));
            attrs.push(KeyValue::new("jail_agent.http_attempts", i64::from(*attempts)));
            if !retries.is_empty() {
                attrs.push(KeyValue::new("jail_agent.retries", strings(retries)));
            }
            attrs.push(KeyValue::new("jail_agent.tool_calls", strings(tool_calls)));
            attrs.push(KeyValue::new("jail_agent.tool_call_ids", strings(tool_call_ids)));
            if let Some(m) = input_messages {
                attrs.push(KeyValue::new("gen_ai.input.messages", text(&serde_json::Value::Array(m.clone()).to_string())));
            }
            if let Some(m) = output_message {
                attrs.push(KeyValue::new("gen_ai.output.messages", text(&serde_json::Value::Array(vec![m.clone()]).to_string())));
            }
            (format!("chat {m}"), SpanKind::Client)
        }
        Event::ToolCall { tool, call_id, ok, error, jail, tokens_out, arguments, result, .. } => {
            attrs.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
            attrs.push(KeyValue::new("gen_ai.tool.name", tool.clone()));
            attrs.push(KeyValue::new("gen_ai.tool.call.id", call_id.clone()));
            attrs.push(KeyValue::new("gen_ai.tool.type", "function"));
            attrs.push(KeyValue::new("jail_agent.tool.tokens_out", int(*tokens_out)));
            if let Some(a) = arguments {
                attrs.push(KeyValue::new("gen_ai.tool.call.arguments", text(a)));
            }
            if let Some(r) = result {
                attrs.push(KeyValue::new("gen_ai.tool.call.result", text(r)));
            }
            if !ok {
                attrs.push(KeyValue::new("error.type", "tool_error"));
                status = Status::error(crate::escape::cut(error.as_deref().unwrap_or("the tool call failed"), 1024));
            }
            if let Some(j) = jail {
                attrs.push(KeyValue::new("jail.status", j.status.clone()));
                if let Some(c) = j.exit_code {
                    attrs.push(KeyValue::new("jail.exit_code", i64::from(c)));
                }
                attrs.push(KeyValue::new("jail.usage.wall_ms", j.wall_ms));
                if let Some(c) = j.cpu_ms {
                    attrs.push(KeyValue::new("jail.usage.cpu_ms", c));
                }
                if let Some(m) = j.peak_memory_bytes {
                    attrs.push(KeyValue::new("jail.usage.peak_memory_bytes", int(m)));
                }
                attrs.push(KeyValue::new("jail.total_ms", j.jail_total_ms));
                attrs.push(KeyValue::new("jail.denials", strings(&j.denials)));
                attrs.push(KeyValue::new("jail.rejected_artifacts", strings(&j.rejected_artifacts)));
                attrs.push(KeyValue::new("jail.artifacts", int(j.artifacts)));
                if let Some(s) = &j.setup_stage {
                    attrs.push(KeyValue::new("jail.setup_stage", s.clone()));
                }
                if !j.jail_from.is_empty() {
                    attrs.push(KeyValue::new("jail.from", j.jail_from.clone()));
                }
                if let Some(c) = j.claim_ms {
                    attrs.push(KeyValue::new("jail.claim_ms", c));
                }
                if let Some(w) = &j.not_pooled {
                    attrs.push(KeyValue::new("jail.not_pooled", text(w)));
                }
                if let Some(s) = &j.session {
                    attrs.push(KeyValue::new("jail.session.id", s.clone()));
                }
            }
            (format!("execute_tool {tool}"), SpanKind::Internal)
        }
        Event::AgentEnd { outcome, steps, tokens_in, tokens_out, .. } => {
            attrs.push(KeyValue::new("gen_ai.operation.name", "invoke_agent"));
            attrs.push(KeyValue::new("gen_ai.request.model", model.to_string()));
            // The agent's totals, under our own names: backends that sum
            // gen_ai.usage.* over a trace (Phoenix) would count them twice.
            attrs.push(KeyValue::new("jail_agent.agent.input_tokens", int(*tokens_in)));
            attrs.push(KeyValue::new("jail_agent.agent.output_tokens", int(*tokens_out)));
            attrs.push(KeyValue::new("jail_agent.model_calls", i64::from(*steps)));
            attrs.push(KeyValue::new("jail_agent.outcome", text(outcome)));
            (format!("invoke_agent {}", r.agent), SpanKind::Internal)
        }
        Event::Pool { size, state, note, start_ms, claims, stats } => {
            attrs.push(KeyValue::new("jail.pool.size", int(*size as u64)));
            attrs.push(KeyValue::new("jail.pool.state", state.clone()));
            attrs.push(KeyValue::new("jail.pool.claims", int(*claims)));
            if let Some(n) = note {
                attrs.push(KeyValue::new("jail.pool.note", text(n)));
            }
            if let Some(m) = start_ms {
                attrs.push(KeyValue::new("jail.pool.start_ms", *m));
            }
            if let Some(s) = stats {
                attrs.push(KeyValue::new("jail.pool.refill_ms.mean", s.refill_ms.mean));
                attrs.push(KeyValue::new("jail.pool.refill_ms.last", s.refill_ms.last));
                attrs.push(KeyValue::new("jail.pool.refill_ms.median", s.refill_ms.median));
                attrs.push(KeyValue::new("jail.pool.refill_ms.p99", s.refill_ms.p99));
                if let Some(i) = &s.idle {
                    for (k, v) in [
                        ("jail.pool.idle.rss_bytes", i.rss_bytes),
                        ("jail.pool.idle.pss_bytes", i.pss_bytes),
                        ("jail.pool.idle.anon_bytes", i.anon_bytes),
                        ("jail.pool.idle.uss_bytes", i.uss_bytes),
                    ] {
                        if let Some(v) = v {
                            attrs.push(KeyValue::new(k, int(v)));
                        }
                    }
                }
            }
            if state == "failed" {
                status = Status::error(crate::escape::cut(note.as_deref().unwrap_or("the warm pool failed"), 1024));
            }
            ("jail_pool".to_string(), SpanKind::Internal)
        }
        Event::SessionStop { session, why, accepted, rejected, error } => {
            if let Some(s) = session {
                attrs.push(KeyValue::new("jail.session.id", s.clone()));
            }
            attrs.push(KeyValue::new("jail.session.stop_reason", text(why)));
            attrs.push(KeyValue::new("jail.session.accepted", int(*accepted)));
            attrs.push(KeyValue::new("jail.rejected_artifacts", strings(rejected)));
            if let Some(e) = error {
                attrs.push(KeyValue::new("error.type", "session_stop"));
                status = Status::error(crate::escape::cut(e, 1024));
            }
            ("jail_session_stop".to_string(), SpanKind::Internal)
        }
        Event::RunEnd { stop, .. } => {
            attrs.push(KeyValue::new("gen_ai.operation.name", "invoke_agent"));
            attrs.push(KeyValue::new("gen_ai.request.model", model.to_string()));
            attrs.push(KeyValue::new("jail_agent.stop", text(stop)));
            if stop.starts_with("error") {
                attrs.push(KeyValue::new("error.type", "run_error"));
                status = Status::error(crate::escape::cut(stop, 1024));
            }
            (format!("invoke_agent {}", r.agent), SpanKind::Internal)
        }
    };
    Some(SpanData {
        span_context: SpanContext::new(trace_id, span_id, TraceFlags::SAMPLED, false, TraceState::default()),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: kind,
        name: Cow::Owned(name),
        start_time: time(r.start_unix_ns),
        end_time: time(r.end_unix_ns.max(r.start_unix_ns)),
        attributes: attrs,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    })
}

/// The exporter's HTTP client: one blocking POST over ureq, body capped.
#[derive(Debug)]
struct UreqClient(ureq::Agent);

#[async_trait::async_trait]
impl HttpClient for UreqClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, body.to_vec());
        let mut resp = self.0.run(request)?;
        let status = resp.status();
        let bytes = resp.body_mut().with_config().limit(4 << 20).read_to_vec()?;
        let mut out = Response::builder().status(status);
        for (k, v) in resp.headers() {
            out = out.header(k, v);
        }
        Ok(out.body(Bytes::from(bytes))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::JailFacts;

    fn record(event: Event) -> Record {
        Record {
            seq: 1,
            t_ms: 1.0,
            time: String::new(),
            run_id: "0123456789abcdef0123456789abcdef".into(),
            span_id: "00000000000000aa".into(),
            parent_span_id: Some("00000000000000bb".into()),
            start_unix_ns: 1_000,
            end_unix_ns: 2_000,
            agent: "subagent-1".into(),
            todo: Some("eda".into()),
            event,
        }
    }

    fn attr<'a>(s: &'a SpanData, k: &str) -> Option<&'a Value> {
        s.attributes.iter().find(|kv| kv.key.as_str() == k).map(|kv| &kv.value)
    }

    #[test]
    fn a_tool_record_is_an_execute_tool_span_with_the_jail_facts() {
        let scope = InstrumentationScope::builder("t").build();
        let r = record(Event::ToolCall {
            tool: "run_python_file".into(),
            call_id: "call_1".into(),
            ok: false,
            duration_ms: 1.0,
            error: Some("status: setup_failed".into()),
            jail: Some(Box::new(JailFacts {
                status: "setup_failed".into(),
                rejected_artifacts: vec!["big.csv: too_large".into()],
                ..JailFacts::default()
            })),
            tokens_out: 7,
            arguments: Some("{\"path\":\"a.py\"}".into()),
            result: None,
            result_bytes: 0,
        });
        let s = span_of(&r, "m", None, &scope).unwrap();
        assert_eq!(s.name, "execute_tool run_python_file");
        assert_eq!(s.span_context.span_id(), SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 0xaa]));
        assert_eq!(s.parent_span_id, SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 0xbb]));
        assert_eq!(attr(&s, "gen_ai.operation.name"), Some(&Value::from("execute_tool")));
        assert_eq!(attr(&s, "gen_ai.tool.call.id"), Some(&Value::from("call_1")));
        assert_eq!(attr(&s, "jail.status"), Some(&Value::from("setup_failed")));
        assert_eq!(attr(&s, "jail_agent.tool.tokens_out"), Some(&Value::I64(7)));
        assert!(matches!(s.status, Status::Error { .. }));
        assert_eq!(s.end_time.duration_since(s.start_time).unwrap(), Duration::from_nanos(1000));
    }

    #[test]
    fn a_record_without_valid_ids_is_no_span() {
        let scope = InstrumentationScope::builder("t").build();
        let mut r = record(Event::RunEnd { stop: "finished".into(), wall_ms: 1.0, items: Vec::new() });
        r.run_id = "nothex".into();
        assert!(span_of(&r, "m", None, &scope).is_none());
        assert_eq!(server_of("http://127.0.0.1:8080/v1"), Some(("127.0.0.1".into(), 8080)));
        assert_eq!(server_of("https://api.example/v1"), Some(("api.example".into(), 443)));
    }
}
