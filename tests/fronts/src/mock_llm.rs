//! A scripted OpenAI-compatible chat-completions server for the agent tests:
//! it listens on 127.0.0.1 (port 0), answers each POST with the next scripted
//! turn over real HTTP/1.1, and records every request body so a test can
//! check what the agent sent (for example the tool messages the model saw).
//! It serves only this process's own requests and stops when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{json, Value};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Turn {
    /// 200 with this chat-completion body.
    Reply(Value),
    /// An HTTP error status with a body (and `Retry-After: 0`).
    Status(u16, String),
    /// Any status, content type and body, no `Retry-After`: garbage, an
    /// HTML page with 200, an empty `choices`.
    Raw {
        status: u16,
        content_type: &'static str,
        body: String,
    },
    /// 503 with this `Retry-After` value (e.g. an HTTP date).
    RetryAfter(String),
    /// Wait this long before serving the turn (a slow model).
    Slow(std::time::Duration, Box<Turn>),
    /// Never answer: hold the connection until the client goes away (or a
    /// minute passes), as a model that is still thinking when the agent is
    /// killed.
    Hang,
    /// A 200 chat completion of about this many bytes, its text one long
    /// string, written as it is made with no Content-Length (a reply too
    /// large to read, found out only by reading it).
    Huge(usize),
}

impl Turn {
    /// The chat completion this turn serves, if it is one.
    fn reply(&self) -> Option<&Value> {
        match self {
            Turn::Reply(v) => Some(v),
            Turn::Slow(_, t) => t.reply(),
            _ => None,
        }
    }
}

/// A reply that calls tools: `(name, arguments)`, arguments as JSON text
/// (so a test can send malformed JSON), with the given token usage. Vendor
/// extras (`reasoning_content`, `system_fingerprint`) are included on purpose.
pub fn tool_turn(calls: &[(&str, String)], usage: (u64, u64)) -> Turn {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| json!({"id": format!("call_{i}_{name}"), "type": "function", "function": {"name": name, "arguments": args}}))
        .collect();
    Turn::Reply(json!({
        "id": "chatcmpl-test", "object": "chat.completion", "model": "scripted", "system_fingerprint": "fp_test",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null,
            "message": {"role": "assistant", "content": null, "reasoning_content": "(scripted reasoning)", "tool_calls": calls}}],
        "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1, "total_tokens": usage.0 + usage.1}
    }))
}

/// A plain-text reply with the given token usage.
pub fn text_turn(text: &str, usage: (u64, u64)) -> Turn {
    Turn::Reply(json!({
        "id": "chatcmpl-test", "object": "chat.completion", "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1, "total_tokens": usage.0 + usage.1}
    }))
}

/// Shorthand: one tool call with JSON arguments.
pub fn call(name: &str, args: Value) -> (&str, String) {
    (name, args.to_string())
}

pub struct MockLlm {
    pub base_url: String,
    requests: Arc<Mutex<Vec<(std::time::Instant, Value)>>>,
    served: Arc<Mutex<Vec<Turn>>>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
    handle: Option<JoinHandle<()>>,
}

impl MockLlm {
    /// Start a server that plays `turns` in order; past the end it answers
    /// 400 "script exhausted" (not retried), so a test fails clearly.
    pub fn start(turns: Vec<Turn>) -> MockLlm {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let served = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, st) = (requests.clone(), served.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut turns = turns.into_iter();
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = conn else { continue };
                let turn = turns.next();
                serve(stream, turn, &r, &s);
            }
        });
        MockLlm {
            base_url: format!("http://{addr}/v1"),
            requests,
            served,
            stop,
            addr,
            handle: Some(handle),
        }
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().map(|r| r.iter().map(|(_, v)| v.clone()).collect()).unwrap_or_default()
    }

    /// When each request arrived, in order.
    pub fn request_times(&self) -> Vec<std::time::Instant> {
        self.requests.lock().map(|r| r.iter().map(|(t, _)| *t).collect()).unwrap_or_default()
    }

    /// Token usage of every 200 reply served: (prompt, completion) sums.
    pub fn served_tokens(&self) -> (u64, u64) {
        let served = self.served.lock().map(|s| s.clone()).unwrap_or_default();
        served.iter().filter_map(Turn::reply).fold((0, 0), |acc, v| {
            (
                acc.0 + v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                acc.1 + v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            )
        })
    }

    /// Number of 200 replies served (HTTP error turns not counted).
    pub fn served_replies(&self) -> usize {
        self.served.lock().map(|s| s.iter().filter(|t| t.reply().is_some()).count()).unwrap_or(0)
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so the thread sees the flag and ends.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn serve(stream: TcpStream, turn: Option<Turn>, requests: &Mutex<Vec<(std::time::Instant, Value)>>, served: &Mutex<Vec<Turn>>) {
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut length = 0usize;
    let mut line = String::new();
    let mut first = true;
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if first {
            first = false;
            if !line.starts_with("POST ") || !line.contains("/chat/completions") {
                respond(&stream, 404, "{\"error\":{\"message\":\"mock: only POST /v1/chat/completions\"}}");
                return;
            }
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Ok(mut r) = requests.lock() {
        r.push((std::time::Instant::now(), parsed));
    }
    match turn {
        None => respond(&stream, 400, "{\"error\":{\"message\":\"mock: script exhausted\"}}"),
        Some(t) => {
            // Recorded before the reply goes out: once the client has it, a
            // test may already be counting what was served.
            if let Ok(mut s) = served.lock() {
                s.push(t.clone());
            }
            play(&stream, &t);
        }
    }
}

fn play(stream: &TcpStream, t: &Turn) {
    match t {
        Turn::Reply(v) => respond(stream, 200, &v.to_string()),
        Turn::Status(code, text) => respond(stream, *code, text),
        Turn::Raw { status, content_type, body } => respond_with(stream, *status, content_type, None, body),
        Turn::RetryAfter(when) => respond_with(stream, 503, "application/json", Some(when), "{\"error\":{\"message\":\"busy\"}}"),
        Turn::Slow(wait, t) => {
            std::thread::sleep(*wait);
            play(stream, t);
        }
        Turn::Huge(n) => {
            let (head, tail) = (r#"{"choices":[{"message":{"role":"assistant","content":""#, r#""}}]}"#);
            let pad = n.saturating_sub(head.len() + tail.len());
            let mut s = stream;
            // No Content-Length: the body ends when the connection closes,
            // so the client learns its size only by reading it.
            let start = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{head}");
            if s.write_all(start.as_bytes()).is_err() {
                return;
            }
            let chunk = vec![b'x'; 1 << 20];
            let mut left = pad;
            while left > 0 {
                let n = left.min(chunk.len());
                // The client stops reading at its limit: then this fails.
                if s.write_all(&chunk[..n]).is_err() {
                    return;
                }
                left -= n;
            }
            let _ = s.write_all(tail.as_bytes());
        }
        Turn::Hang => {
            let started = std::time::Instant::now();
            let mut buf = [0u8; 256];
            let mut s = stream;
            while started.elapsed() < std::time::Duration::from_secs(60) {
                match s.read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => return,
                }
            }
        }
    }
}

fn respond(stream: &TcpStream, status: u16, body: &str) {
    respond_with(stream, status, "application/json", Some("0"), body)
}

fn respond_with(mut stream: &TcpStream, status: u16, content_type: &str, retry_after: Option<&str>, body: &str) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let retry = retry_after.map(|r| format!("Retry-After: {r}\r\n")).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{retry}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
    let _ = stream.flush();
}
