//! The pool's JSON lines as the server speaks them (the protocol is the
//! module doc of jail/src/pool.rs): the request line for a run, what a
//! reply line is, the bounded line reader for the pool's stdout, and the
//! events a run's log gets from a result when the pool streamed none.
//! Pure but for the reader, which takes any `AsyncBufRead`.

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::backend::Job;

/// Longest line read from the pool's stdout: a reply carries a result with
/// its capped streams, as `jail run --events`' result line does.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The request line for `job` (without its newline). The script is the
/// staged `main.py`, read by the pool without following a link; the
/// output folder is handed over to `dir/output` (absent until then, on
/// the pool's TMPDIR filesystem: the server's work folder).
pub fn run_line(job: &Job, events: bool) -> String {
    let mut req = json!({
        "id": job.id,
        "script": job.dir.join("main.py").to_string_lossy(),
        "output": job.dir.join("output").to_string_lossy(),
        "limits": {"wall_time_secs": job.timeout.as_secs_f64()},
    });
    if let Some(input) = &job.input {
        req["input"] = Value::from(input.to_string_lossy());
    }
    if events {
        req["events"] = Value::Bool(true);
    }
    req.to_string()
}

/// A session from the pool (`{"op": "session"}`): a ready jail (its
/// preload imported) handed over with `input` copied into its read-only
/// `/workspace/input` and `output` (made when absent) as its output folder.
pub fn session_line(id: &str, input: Option<&std::path::Path>, output: &std::path::Path) -> String {
    let mut req = json!({"id": id, "op": "session", "output": output.to_string_lossy()});
    if let Some(input) = input {
        req["input"] = Value::from(input.to_string_lossy());
    }
    req.to_string()
}

/// Whether an error reply to a session request says this pool can never
/// hand one out: its policy binds each jail's output folder when it is
/// made (`output_size: "unlimited"`). Sessions then start on their own.
pub fn refuses_sessions(code: &str, message: &str) -> bool {
    code == "bad_request" && message.contains("output_size")
}

/// A line asking for the pool's stats.
pub fn stats_line(id: &str) -> String {
    json!({"op": "stats", "id": id}).to_string()
}

/// The probe for live events: `events` on a request that is otherwise
/// incomplete (no code), so nothing runs. A pool that does not know the
/// field refuses it as `unknown_field`; one that does refuses the missing
/// code (`bad_request`).
pub fn events_probe_line(id: &str) -> String {
    json!({"id": id, "events": true}).to_string()
}

/// Whether the probe's reply says the pool takes `events`.
pub fn takes_events(reply: &Reply) -> bool {
    !matches!(reply, Reply::Error { code, message } if code == "unknown_field" && message.contains("events"))
}

/// Ask the pool to stop request `id`: its jail is stopped, and its reply
/// (its result, `cancelled`) still comes; an id the pool has answered
/// already gets an `unknown_id` error line after that reply.
pub fn cancel_line(id: &str) -> String {
    json!({"op": "cancel", "id": id}).to_string()
}

/// Whether an error reply says the claimed jail was dead before the
/// step's code was sent: the pool sets `sys.argv` in a cell of its own
/// first, and a jail that ended while it waited (the policy's session
/// `idle_timeout_secs` or `max_lifetime_secs` passed; the pool does not
/// check a ready jail before handing it out) fails there. The step never
/// ran, so running it elsewhere cannot run it twice.
pub fn never_started(code: &str, message: &str) -> bool {
    code == "internal" && message.starts_with("set sys.argv")
}

/// One line from the pool.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// `{"id", "event"}`: one live event of a running request, its JSON
    /// as the pool wrote it.
    Event(String, String),
    /// The end of a request (or a stats answer): its `id` and the reply.
    Reply(String, Reply),
    /// A line with no id of ours (an error about a line it could not read).
    Stray(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Result(Value),
    Error {
        code: String,
        message: String,
    },
    Stats(Value),
    /// A session handed out: `{"handle", "id", "pid", "output_dir"}`.
    Session(Value),
    /// The pool ended before answering (said by the server, not the pool).
    Lost(String),
    /// A result's whole line, for its waiter to parse off the reader
    /// (`result_id`): a long result never holds up the replies after it.
    Unparsed(Vec<u8>),
}

/// What a line from the pool is, in one pass over it. An event is passed
/// on as the pool wrote it (its JSON validated, never decoded: a run's
/// output is most of what the pool sends, and decoding and encoding it
/// again cost the server more than all else).
pub fn parse_line(line: &[u8]) -> Line {
    #[derive(serde::Deserialize)]
    struct Raw<'a> {
        id: Option<String>,
        #[serde(borrow)]
        event: Option<&'a serde_json::value::RawValue>,
        result: Option<Value>,
        stats: Option<Value>,
        session: Option<Value>,
        error: Option<Value>,
    }
    let stray = || Line::Stray(String::from_utf8_lossy(&line[..line.len().min(300)]).into_owned());
    let Ok(raw) = serde_json::from_slice::<Raw>(line) else { return stray() };
    let Some(id) = raw.id else { return stray() };
    if let Some(event) = raw.event {
        return Line::Event(id, event.get().to_owned());
    }
    if let Some(result) = raw.result {
        return Line::Reply(id, Reply::Result(result));
    }
    if let Some(stats) = raw.stats {
        return Line::Reply(id, Reply::Stats(stats));
    }
    if let Some(session) = raw.session {
        return Line::Reply(id, Reply::Session(session));
    }
    if let Some(error) = raw.error {
        let text = |k: &str| error.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        return Line::Reply(id, Reply::Error { code: text("code"), message: text("message") });
    }
    stray()
}

/// The id at the start of a line too long to read whole (`{"id":"...",`:
/// a reply's keys are written sorted, `id` before `result`), so that its
/// request can be told rather than left to its deadline.
pub fn leading_id(head: &[u8]) -> Option<String> {
    let rest = head.strip_prefix(br#"{"id":""#)?;
    let end = rest.iter().take(129).position(|b| *b == b'"')?;
    String::from_utf8(rest[..end].to_vec()).ok()
}

/// The id of a result line (`{"id":"...","result":`, the pool writes a
/// reply's keys sorted), read from its head alone.
pub fn result_id(line: &[u8]) -> Option<String> {
    let id = leading_id(line)?;
    let rest = line.get(r#"{"id":""#.len() + id.len()..)?;
    rest.starts_with(br#"","result":"#).then_some(id)
}

/// How a bounded read of one line ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// The stream ended before any byte of a new line.
    End,
    /// A line (its newline dropped) is in the buffer.
    Whole,
    /// The line was over the bound: the buffer holds its first `max`
    /// bytes, the rest was read and dropped.
    TooLong,
}

/// Read one line into `buf` (cleared first), keeping at most `max` bytes
/// of it in memory however long it is.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Read> {
    buf.clear();
    let mut over = false;
    let mut any = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(match (any, over) {
                (false, _) => Read::End,
                (true, true) => Read::TooLong,
                (true, false) => Read::Whole,
            });
        }
        any = true;
        let (chunk, used, done) = match memchr::memchr(b'\n', avail) {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if chunk.len() > room {
            over = true;
        }
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        r.consume(used);
        if done {
            return Ok(if over { Read::TooLong } else { Read::Whole });
        }
    }
}

/// The events of a finished run for a pool that streamed none: each
/// stream's text as one chunk, each accepted artifact, as `jail run
/// --events` would have ended (the result line is added by the caller).
pub fn events_from_result(result: &Value) -> Vec<String> {
    let mut events = Vec::new();
    for stream in ["stdout", "stderr"] {
        if let Some(text) = result[stream]["text"].as_str().filter(|t| !t.is_empty()) {
            events.push(json!({"type": stream, "data": text}).to_string());
        }
    }
    for artifact in result["artifacts"].as_array().into_iter().flatten() {
        events.push(json!({"type": "artifact", "artifact": artifact}).to_string());
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_run_line_names_the_staged_script_input_output_and_wall_time() {
        let job = Job {
            id: "ab".into(),
            dir: "/w/t/ab".into(),
            input: Some("/w/t/ab/input".into()),
            timeout: Duration::from_millis(2500),
            memory_mib: 256,
        };
        let v: Value = serde_json::from_str(&run_line(&job, false)).unwrap();
        assert_eq!(
            v,
            json!({"id": "ab", "script": "/w/t/ab/main.py", "input": "/w/t/ab/input", "output": "/w/t/ab/output",
                   "limits": {"wall_time_secs": 2.5}})
        );
        let v: Value = serde_json::from_str(&run_line(&Job { input: None, ..job }, true)).unwrap();
        assert_eq!((v.get("input"), &v["events"]), (None, &json!(true)));
    }

    #[test]
    fn a_result_line_is_known_by_its_head() {
        assert_eq!(result_id(br#"{"id":"r1","result":{"status":"ok"}}"#).as_deref(), Some("r1"));
        assert_eq!(result_id(br#"{"id":"r1","event":{}}"#), None);
        assert_eq!(result_id(br#"{"id":"r1","error":{}}"#), None);
    }

    #[test]
    fn lines_are_told_apart_by_their_key() {
        assert_eq!(
            parse_line(br#"{"id":"a","event":{"type":"stdout","data":"x\u0001"}}"#),
            Line::Event("a".into(), r#"{"type":"stdout","data":"x\u0001"}"#.into()),
            "passed on as written"
        );
        assert!(matches!(parse_line(br#"{"id":"a","event":{"type":"stdout","data":"x}}"#), Line::Stray(_)), "not JSON");
        assert_eq!(
            parse_line(br#"{"id":"a","result":{"status":"ok"}}"#),
            Line::Reply("a".into(), Reply::Result(json!({"status":"ok"})))
        );
        assert_eq!(
            parse_line(br#"{"error":{"code":"bad_request","message":"m"},"id":"a"}"#),
            Line::Reply("a".into(), Reply::Error { code: "bad_request".into(), message: "m".into() })
        );
        assert_eq!(parse_line(br#"{"id":"s","stats":{"ready":1}}"#), Line::Reply("s".into(), Reply::Stats(json!({"ready":1}))));
        assert_eq!(
            parse_line(br#"{"id":"s","session":{"handle":"/h.sock"}}"#),
            Line::Reply("s".into(), Reply::Session(json!({"handle":"/h.sock"})))
        );
        assert!(matches!(parse_line(br#"{"id":null,"error":{"code":"malformed"}}"#), Line::Stray(_)));
        assert!(matches!(parse_line(b"not json"), Line::Stray(_)));
    }

    #[test]
    fn the_events_probe_tells_an_unknown_field_from_a_missing_code() {
        let old = Reply::Error {
            code: "unknown_field".into(),
            message: "unknown field `events`, expected one of ...".into(),
        };
        let new = Reply::Error {
            code: "bad_request".into(),
            message: "give exactly one of \"code\" and \"script\"".into(),
        };
        assert!(!takes_events(&old));
        assert!(takes_events(&new));
    }

    #[test]
    fn only_a_failure_before_the_steps_code_counts_as_never_started() {
        let dead = "set sys.argv: session /s.sock ended (no cell for session.idle_timeout_secs (600s)): start a new one";
        assert!(never_started("internal", dead));
        assert!(!never_started("internal", "run the step: the session ended"));
        assert!(!never_started("bad_request", dead));
    }

    #[test]
    fn a_session_line_names_its_folders_and_a_pool_that_binds_outputs_refuses_for_good() {
        let v: Value = serde_json::from_str(&session_line("s1", Some("/w/in".as_ref()), "/w/out".as_ref())).unwrap();
        assert_eq!(v, json!({"id": "s1", "op": "session", "input": "/w/in", "output": "/w/out"}));
        let v: Value = serde_json::from_str(&session_line("s2", None, "/w/out".as_ref())).unwrap();
        assert_eq!(v.get("input"), None);
        let unlimited =
            "this pool's policy binds each jail's output folder when it is made (filesystem.output_size \"unlimited\")";
        assert!(refuses_sessions("bad_request", unlimited));
        assert!(!refuses_sessions("bad_request", "input /x: no such folder"));
        assert!(!refuses_sessions("internal", unlimited));
    }

    #[test]
    fn a_long_lines_id_is_read_from_its_head() {
        assert_eq!(leading_id(br#"{"id":"0123abcd","result":{"#), Some("0123abcd".into()));
        assert_eq!(leading_id(br#"{"event":{},"id":"x"}"#), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_line_over_the_bound_is_cut_and_the_next_one_read_whole() {
        let data = [vec![b'x'; 100], b"\nnext\nlast".to_vec()].concat();
        let mut r = tokio::io::BufReader::with_capacity(8, &data[..]);
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, &mut buf, 10).await.unwrap(), Read::TooLong);
        assert_eq!(buf, vec![b'x'; 10]);
        assert_eq!(read_line(&mut r, &mut buf, 10).await.unwrap(), Read::Whole);
        assert_eq!(buf, b"next");
        assert_eq!(read_line(&mut r, &mut buf, 10).await.unwrap(), Read::Whole);
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut r, &mut buf, 10).await.unwrap(), Read::End);
    }

    #[test]
    fn a_result_gives_its_streams_and_artifacts_as_events() {
        let r = json!({"stdout": {"text": "hi\n"}, "stderr": {"text": ""}, "artifacts": [{"path": "a.png"}]});
        let got: Vec<Value> = events_from_result(&r).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(
            got,
            vec![
                json!({"type": "stdout", "data": "hi\n"}),
                json!({"type": "artifact", "artifact": {"path": "a.png"}})
            ]
        );
    }
}
