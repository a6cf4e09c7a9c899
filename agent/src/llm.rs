//! The model client: one chat-completions call to any OpenAI-compatible
//! endpoint with tool calling, retried with backoff on 429, 5xx, transport
//! failures and on a 200 whose body is not a chat completion (garbage, an
//! HTML page, an error object, no `choices`): a proxy or an overloaded
//! server sends those, and one of them must not end a run. `Retry-After` is
//! honoured in both its forms, seconds and an HTTP date. Each request is
//! bounded by a timeout, and the reply is parsed leniently: vendors add
//! fields (`reasoning_content`, `system_fingerprint`, ...), send `arguments`
//! as an object instead of a string, or leave out `usage`, and none of that
//! may break a run.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Where the model is and how to talk to it.
#[derive(Debug, Clone)]
pub struct LlmConfig {
    /// The endpoint's base URL (`http://localhost:11434/v1`), or the full
    /// `.../chat/completions` URL.
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// Timeout of one HTTP request, connection to last byte.
    pub timeout: Duration,
    /// Retries after the first attempt, on 429, 5xx and transport failures.
    pub max_retries: u32,
    /// First backoff; doubled each retry, capped at 30 s.
    pub retry_base: Duration,
    pub temperature: Option<f64>,
    /// `max_tokens` of each reply, when set.
    pub max_reply_tokens: Option<u32>,
}

impl LlmConfig {
    /// The chat-completions URL for this endpoint.
    pub fn url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        if base.ends_with("/chat/completions") {
            base.to_string()
        } else {
            format!("{base}/chat/completions")
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("cannot reach the model endpoint {url}: {cause} (check LLM_BASE_URL and that the server is running)")]
    Unreachable { url: String, cause: String },
    #[error("the model endpoint {url} did not answer within {secs} s (raise --llm-timeout, or check the server)")]
    Timeout { url: String, secs: u64 },
    #[error("the model endpoint {url} answered HTTP {status}{hint}: {body}")]
    Status {
        url: String,
        status: u16,
        hint: &'static str,
        body: String,
    },
    #[error("the model endpoint {url} answered with something that is not a chat completion ({cause}): {excerpt}")]
    Decode { url: String, cause: String, excerpt: String },
    #[error("the model endpoint {url} is not a valid URL: {cause} (set LLM_BASE_URL to e.g. http://localhost:8000/v1)")]
    BadUrl { url: String, cause: String },
    #[error("{last} (gave up after {attempts} attempts)")]
    GaveUp { attempts: u32, last: Box<LlmError> },
    #[error("the model endpoint {url} sent a reply of more than {} MiB, the most this agent reads; it was not retried (a reply that size is not a network failure): lower --max-reply-tokens (LLM_MAX_REPLY_TOKENS), or check what the server sends", MAX_REPLY_BYTES >> 20)]
    TooLarge { url: String },
    #[error("the agent was told to stop ({0}) while it waited for the model")]
    Stopped(String),
}

/// The largest reply body read; a larger one is refused, not retried.
pub const MAX_REPLY_BYTES: u64 = 32 << 20;

/// A failed attempt that is retried, as the caller is told of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    /// The attempt that failed, from 1, and the most attempts made.
    pub attempt: u32,
    pub attempts_max: u32,
    /// Why it failed, in one line.
    pub error: String,
    /// How long until the next attempt.
    pub wait: Duration,
}

/// What the helper thread of one call sends.
enum Progress {
    Retry(Retry),
    Done(Result<Reply, LlmError>),
}

/// A chat message, in the shape the endpoint expects back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        content: Option<String>,
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: String,
    },
}

impl Message {
    #[allow(non_snake_case)]
    pub fn System(content: String) -> Message {
        Message::System { content }
    }

    #[allow(non_snake_case)]
    pub fn User(content: String) -> Message {
        Message::User { content }
    }

    /// The message as the endpoint takes it.
    pub fn to_json(&self) -> Value {
        match self {
            Message::System { content: c } => json!({"role": "system", "content": c}),
            Message::User { content: c } => json!({"role": "user", "content": c}),
            Message::Assistant { content, tool_calls } => {
                // Some servers refuse an assistant turn with neither content
                // nor tool calls: send an empty string rather than null then.
                let content = match content {
                    None if tool_calls.is_empty() => Some(String::new()),
                    c => c.clone(),
                };
                let mut m = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    m["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                }
                m
            }
            Message::Tool { tool_call_id, content } => {
                json!({"role": "tool", "tool_call_id": tool_call_id, "content": content})
            }
        }
    }

    /// Characters of text, for estimating tokens when the endpoint reports none.
    fn chars(&self) -> usize {
        match self {
            Message::System { content: c } | Message::User { content: c } => c.len(),
            Message::Assistant { content, tool_calls } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>()
            }
            Message::Tool { content, .. } => content.len(),
        }
    }
}

/// One tool call the model asked for. `arguments` is the raw JSON text, which
/// may be malformed: the tool layer answers that with a tool error.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Tokens one call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input: u64,
    pub output: u64,
    /// The endpoint reported no usage; these are estimates (4 characters a token).
    pub estimated: bool,
}

/// The model's reply to one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: TokenUsage,
    /// HTTP attempts it took (1 when nothing was retried).
    pub attempts: u32,
    /// Why each retried attempt failed, in order.
    pub retries: Vec<String>,
    pub duration: Duration,
}

/// A blocking client for one endpoint.
#[derive(Clone)]
pub struct Client {
    http: ureq::Agent,
    config: LlmConfig,
    url: String,
}

/// What one HTTP attempt ended in.
enum Attempt {
    Done(String),
    Retry { error: LlmError, after: Option<Duration> },
    Fail(LlmError),
}

impl Client {
    pub fn new(config: LlmConfig) -> Client {
        let http: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("jail-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let url = config.url();
        Client { http, config, url }
    }

    pub fn config(&self) -> &LlmConfig {
        &self.config
    }

    /// One chat completion with the given tools offered.
    pub fn chat(&self, messages: &[Message], tools: &[Value]) -> Result<Reply, LlmError> {
        self.chat_watched(messages, tools, &mut |_| {})
    }

    /// [`Client::chat`], telling `on_retry` of each attempt that is retried.
    /// The HTTP attempts run on a thread of their own, so a stop (stop.rs)
    /// abandons the call at once (`LlmError::Stopped`) and no attempt
    /// starts after it.
    pub fn chat_watched(
        &self,
        messages: &[Message],
        tools: &[Value],
        on_retry: &mut dyn FnMut(&Retry),
    ) -> Result<Reply, LlmError> {
        let started = Instant::now();
        if let Some(sig) = crate::stop::requested() {
            return Err(LlmError::Stopped(sig.to_string()));
        }
        let mut body = json!({
            "model": self.config.model,
            "messages": messages.iter().map(Message::to_json).collect::<Vec<_>>(),
        });
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools.to_vec());
            body["tool_choice"] = json!("auto");
        }
        if let Some(t) = self.config.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = self.config.max_reply_tokens {
            body["max_tokens"] = json!(m);
        }
        let body = body.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        let client = self.clone();
        std::thread::spawn(move || {
            let done = client.attempts(&body, &tx);
            let _ = tx.send(Progress::Done(done));
        });
        let mut reply = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Progress::Retry(r)) => on_retry(&r),
                Ok(Progress::Done(done)) => break done?,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(LlmError::Unreachable { url: self.url.clone(), cause: "the request's thread ended".into() })
                }
            }
            if let Some(sig) = crate::stop::requested() {
                return Err(LlmError::Stopped(sig.to_string()));
            }
        };
        if reply.usage.estimated {
            let sent: usize =
                messages.iter().map(Message::chars).sum::<usize>() + tools.iter().map(|t| t.to_string().len()).sum::<usize>();
            let got = reply.content.as_ref().map_or(0, String::len)
                + reply.tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>();
            reply.usage.input = sent.div_ceil(4) as u64;
            reply.usage.output = got.div_ceil(4) as u64;
        }
        reply.duration = started.elapsed();
        Ok(reply)
    }

    /// The attempts of one call, with backoff (the call's own thread).
    fn attempts(&self, body: &str, tx: &std::sync::mpsc::Sender<Progress>) -> Result<Reply, LlmError> {
        let mut attempts = 0;
        let mut retries = Vec::new();
        loop {
            if let Some(sig) = crate::stop::requested() {
                return Err(LlmError::Stopped(sig.to_string()));
            }
            attempts += 1;
            let (error, after) = match self.attempt(body) {
                // A 200 that is not a chat completion is the server's fault,
                // like a 5xx: retried the same way.
                Attempt::Done(text) => match parse_reply(&text) {
                    Ok(mut reply) => {
                        reply.attempts = attempts;
                        reply.retries = retries;
                        return Ok(reply);
                    }
                    Err(cause) => (LlmError::Decode { url: self.url.clone(), cause, excerpt: excerpt(&text, 300) }, None),
                },
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry { error, after } => (error, after),
            };
            if attempts > self.config.max_retries {
                return Err(LlmError::GaveUp { attempts, last: Box::new(error) });
            }
            // Retry-After when the server sent one, else exponential backoff.
            let wait = match after {
                Some(a) => a.min(Duration::from_secs(60)),
                None => self.config.retry_base.saturating_mul(1 << (attempts - 1).min(16)).min(Duration::from_secs(30)),
            };
            let said = excerpt(&error.to_string(), 300);
            retries.push(said.clone());
            let _ = tx.send(Progress::Retry(Retry {
                attempt: attempts,
                attempts_max: self.config.max_retries + 1,
                error: said,
                wait,
            }));
            let until = Instant::now() + wait;
            while Instant::now() < until && crate::stop::requested().is_none() {
                std::thread::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)));
            }
        }
    }

    fn attempt(&self, body: &str) -> Attempt {
        let mut req = self.http.post(&self.url).header("Content-Type", "application/json");
        if let Some(key) = &self.config.api_key {
            req = req.header("Authorization", format!("Bearer {key}"));
        }
        let mut resp = match req.send(body) {
            Ok(r) => r,
            Err(e) => return self.transport_error(e),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, std::time::SystemTime::now()));
        let announced = resp.headers().get("content-length").and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        if announced.is_some_and(|n| n > MAX_REPLY_BYTES) {
            return Attempt::Fail(LlmError::TooLarge { url: self.url.clone() });
        }
        let text = match resp.body_mut().with_config().limit(MAX_REPLY_BYTES).read_to_string() {
            Ok(t) => t,
            Err(ureq::Error::BodyExceedsLimit(_)) => return Attempt::Fail(LlmError::TooLarge { url: self.url.clone() }),
            Err(e) => return self.transport_error(e),
        };
        if (200..300).contains(&status) {
            return Attempt::Done(text);
        }
        let error = LlmError::Status {
            url: self.url.clone(),
            status,
            hint: status_hint(status),
            body: excerpt(&text, 300),
        };
        if status == 429 || status >= 500 {
            Attempt::Retry { error, after: retry_after }
        } else {
            Attempt::Fail(error)
        }
    }

    fn transport_error(&self, e: ureq::Error) -> Attempt {
        let url = self.url.clone();
        match e {
            ureq::Error::Timeout(_) => Attempt::Retry {
                error: LlmError::Timeout { url, secs: self.config.timeout.as_secs() },
                after: None,
            },
            ureq::Error::BadUri(cause) => Attempt::Fail(LlmError::BadUrl { url, cause }),
            ureq::Error::Http(cause) => Attempt::Fail(LlmError::BadUrl { url, cause: cause.to_string() }),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => Attempt::Retry {
                error: LlmError::Timeout { url, secs: self.config.timeout.as_secs() },
                after: None,
            },
            ureq::Error::HostNotFound => Attempt::Retry {
                error: LlmError::Unreachable { url, cause: "host not found".into() },
                after: None,
            },
            other => Attempt::Retry { error: LlmError::Unreachable { url, cause: other.to_string() }, after: None },
        }
    }
}

/// A `Retry-After` value as a wait: delay-seconds, or an HTTP date
/// (RFC 9110 IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`) from `now`.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        // Past what a Duration holds (1e300) is as long as the caller's cap:
        // a server's header must not panic the conversion.
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX));
    }
    let at = http_date(v)?;
    let now = now.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
    Some(Duration::from_secs(at.saturating_sub(now).max(0) as u64))
}

/// Seconds since the epoch of an IMF-fixdate.
fn http_date(v: &str) -> Option<i64> {
    let (_, rest) = v.split_once(", ")?;
    let parts: Vec<&str> = rest.split_whitespace().collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else { return None };
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as i64
        + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let [h, m, s] = hms.as_slice() else { return None };
    if !(1..=31).contains(&day) || *h > 23 || *m > 59 || *s > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant), the inverse of trace::civil_from_days.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + m * 60 + s)
}

fn status_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (check LLM_API_KEY)",
        404 => " (check LLM_BASE_URL, usually ending in /v1, and LLM_MODEL)",
        400 | 422 => " (the server refused the request: does LLM_MODEL support tool calling?)",
        429 => " (rate limited; retried with backoff)",
        _ => "",
    }
}

/// At most `n` characters of `text`, on one line.
pub fn excerpt(text: &str, n: usize) -> String {
    let one_line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let one_line = one_line.trim();
    if one_line.chars().count() <= n {
        one_line.to_string()
    } else {
        format!("{}…", one_line.chars().take(n).collect::<String>())
    }
}

/// Parse a chat-completion body, taking only what the agent needs and
/// ignoring everything else.
pub fn parse_reply(text: &str) -> Result<Reply, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let msg = err.get("message").and_then(Value::as_str).map(String::from).unwrap_or_else(|| err.to_string());
        return Err(format!("the endpoint reported an error: {msg}"));
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or("no `choices` in the response")?;
    let message = choice.get("message").ok_or("no `message` in the first choice")?;
    let content = text_of(message.get("content"));
    let mut tool_calls = Vec::new();
    let calls = message.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, call) in calls.iter().enumerate() {
        let f = call.get("function").unwrap_or(call);
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let arguments = match f.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => "{}".to_string(),
            Some(other) => other.to_string(),
        };
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .unwrap_or_else(|| format!("call_{i}"));
        tool_calls.push(ToolCall { id, name, arguments });
    }
    // The legacy single `function_call` some servers still send.
    if tool_calls.is_empty() {
        if let Some(f) = message.get("function_call").filter(|f| f.is_object()) {
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(other) if !other.is_null() => other.to_string(),
                _ => "{}".to_string(),
            };
            tool_calls.push(ToolCall { id: "call_0".into(), name, arguments });
        }
    }
    let finish_reason = choice.get("finish_reason").and_then(Value::as_str).map(String::from);
    let usage = v.get("usage").filter(|u| u.is_object());
    let number = |keys: &[&str]| usage.and_then(|u| keys.iter().find_map(|k| u.get(*k).and_then(Value::as_u64)));
    let input = number(&["prompt_tokens", "input_tokens"]);
    let output = number(&["completion_tokens", "output_tokens"]);
    let usage = match (input, output) {
        (Some(input), Some(output)) => TokenUsage { input, output, estimated: false },
        _ => TokenUsage { input: 0, output: 0, estimated: true },
    };
    Ok(Reply {
        content,
        tool_calls,
        finish_reason,
        usage,
        attempts: 1,
        retries: Vec::new(),
        duration: Duration::ZERO,
    })
}

/// Message content as text: a string, or the text parts of a list of parts.
fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()).filter(|s| !s.trim().is_empty()),
        Value::Array(parts) => {
            let t: Vec<&str> = parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect();
            Some(t.join("")).filter(|s| !s.trim().is_empty())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_extra_fields_are_ignored() {
        let body = r#"{"id":"x","object":"chat.completion","system_fingerprint":"fp",
          "choices":[{"index":0,"finish_reason":"tool_calls","logprobs":null,
            "message":{"role":"assistant","content":null,"reasoning_content":"thinking hard",
              "tool_calls":[{"id":"c1","type":"function","function":{"name":"list_input_files","arguments":"{}"}}]}}],
          "usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        let r = parse_reply(body).unwrap();
        assert_eq!(r.tool_calls, vec![ToolCall { id: "c1".into(), name: "list_input_files".into(), arguments: "{}".into() }]);
        assert_eq!(r.usage, TokenUsage { input: 12, output: 3, estimated: false });
        assert_eq!(r.content, None);
    }

    #[test]
    fn object_arguments_missing_ids_and_missing_usage_are_tolerated() {
        let body = r#"{"choices":[{"message":{"content":[{"type":"text","text":"hi"}],
            "tool_calls":[{"function":{"name":"read_skill","arguments":{"name":"eda"}}}]}}]}"#;
        let r = parse_reply(body).unwrap();
        assert_eq!(r.tool_calls[0].id, "call_0");
        assert_eq!(r.tool_calls[0].arguments, r#"{"name":"eda"}"#);
        assert_eq!(r.content.as_deref(), Some("hi"));
        assert!(r.usage.estimated);
    }

    #[test]
    fn an_error_body_or_no_choices_is_a_decode_error() {
        assert!(parse_reply(r#"{"error":{"message":"model not found"}}"#).unwrap_err().contains("model not found"));
        assert!(parse_reply(r#"{"choices":[]}"#).unwrap_err().contains("choices"));
        assert!(parse_reply("<html>").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let now = UNIX_EPOCH + Duration::from_secs(784_111_770); // Sun, 06 Nov 1994 08:49:30 GMT
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after("0.5", now), Some(Duration::from_millis(500)));
        assert_eq!(retry_after("1e300", now), Some(Duration::MAX), "no panic: the caller caps it");
        assert_eq!(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now), Some(Duration::ZERO), "a date past is no wait");
        assert_eq!(retry_after("Tue, 29 Feb 2000 00:00:00 GMT", UNIX_EPOCH), Some(Duration::from_secs(951_782_400)));
        for bad in [
            "soon",
            "-3",
            "Sun, 06 Nov 1994 25:00:00 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "",
        ] {
            assert_eq!(retry_after(bad, SystemTime::now()), None, "{bad}");
        }
    }

    #[test]
    fn messages_round_trip_through_json_for_a_resumed_run() {
        let m = vec![
            Message::System("s".into()),
            Message::User("u".into()),
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall { id: "c".into(), name: "n".into(), arguments: "{}".into() }],
            },
            Message::Tool { tool_call_id: "c".into(), content: "r".into() },
        ];
        let back: Vec<Message> = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn base_url_gets_the_chat_completions_path_once() {
        let mut c = LlmConfig {
            base_url: "http://h:1/v1/".into(),
            model: "m".into(),
            api_key: None,
            timeout: Duration::from_secs(1),
            max_retries: 0,
            retry_base: Duration::from_millis(1),
            temperature: None,
            max_reply_tokens: None,
        };
        assert_eq!(c.url(), "http://h:1/v1/chat/completions");
        c.base_url = "http://h:1/v1/chat/completions".into();
        assert_eq!(c.url(), "http://h:1/v1/chat/completions");
    }
}
