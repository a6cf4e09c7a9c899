//! The pool's JSON lines as the server speaks them, over the one wire
//! (jail::client::pool; the protocol is the module doc of
//! jail/src/pool.rs): the lines for a run, a session, stats and a cancel,
//! what a reply line is, the bounded line reader for the pool's stdout,
//! and the events a run's log gets from a result when the pool streamed
//! none. Pure but for the reader, which takes any `AsyncBufRead`.

use jail::client::pool::{self as wire, ErrorCode, Line as Asked, RequestLine, Source};
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::backend::Job;

pub use jail::client::lines::Read;
pub use jail::client::pool::{leading_id, result_id, Error, Handout, Stats};

/// Longest line read from the pool's stdout: a reply carries a result with
/// its capped streams, as `jail run --events`' result line does.
pub const MAX_LINE_BYTES: usize = jail::client::bounds::MAX_DOCUMENT as usize;

/// The request line for `job` (without its newline). The script is the
/// staged `main.py`, read by the pool without following a link; the
/// output folder is handed over to `dir/output` (absent until then, on
/// the pool's TMPDIR filesystem: the server's work folder).
pub fn run_line(job: &Job, events: bool) -> String {
    Asked::Run(wire::Request {
        id: job.id.clone(),
        source: Source::Script(job.dir.join("main.py")),
        input: job.input.clone(),
        output: Some(job.dir.join("output")),
        args: Vec::new(),
        wall_time: job.timeout,
        events,
        env: job.env.clone(),
    })
    .text()
}

/// A session from the pool (`{"op": "session"}`): a ready jail (its
/// preload imported) handed over with `input` copied into its read-only
/// `/workspace/input` and `output` (made when absent) as its output folder.
pub fn session_line(id: &str, input: Option<&std::path::Path>, output: &std::path::Path, env: &jail::envs::Envs) -> String {
    Asked::Session(wire::SessionRequest {
        id: id.to_owned(),
        input: input.map(ToOwned::to_owned),
        output: Some(output.to_owned()),
        env: env.clone(),
    })
    .text()
}

/// A line asking for the pool's stats.
pub fn stats_line(id: &str) -> String {
    Asked::Stats { id: Some(id.to_owned()) }.text()
}

/// The probe for live events: `events` on a request that is otherwise
/// incomplete (no code), so nothing runs. A pool that does not know the
/// field refuses it as `unknown_field` (the only field the probe has that
/// a pool may not know); one that does refuses the missing code
/// (`bad_request`).
pub fn events_probe_line(id: &str) -> String {
    RequestLine { id: Some(id.to_owned()), events: Some(true), ..RequestLine::default() }.text()
}

/// Whether the probe's reply says the pool takes `events`.
pub fn takes_events(reply: &Reply) -> bool {
    !matches!(reply, Reply::Error(e) if e.code == ErrorCode::UnknownField)
}

/// Ask the pool to stop request `id`: its jail is stopped, and its reply
/// (its result, `cancelled`) still comes; an id the pool has answered
/// already gets an `unknown_id` error line after that reply.
pub fn cancel_line(id: &str) -> String {
    Asked::Cancel { id: id.to_owned() }.text()
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
    Error(Error),
    Stats(Stats),
    /// A session handed out.
    Session(Handout),
    /// The pool ended before answering (said by the server, not the pool).
    Lost(String),
    /// The reply was over `MAX_LINE_BYTES` (said by the server).
    TooLong(String),
    /// A result's whole line, for its waiter to parse off the reader
    /// (`result_id`): a long result never holds up the replies after it.
    Unparsed(Vec<u8>),
}

/// What a line from the pool is, in one pass over it. An event is passed
/// on as the pool wrote it (its JSON validated, never decoded: a run's
/// output is most of what the pool sends, and decoding and encoding it
/// again cost the server more than all else).
pub fn parse_line(line: &[u8]) -> Line {
    let stray = || Line::Stray(String::from_utf8_lossy(&line[..line.len().min(300)]).into_owned());
    let Ok(reply) = wire::Reply::parse(line) else { return stray() };
    let Some(id) = reply.id else { return stray() };
    let reply = match reply.body {
        wire::Body::Event(event) => return Line::Event(id, Box::<str>::from(event).into_string()),
        wire::Body::Result(v) => Reply::Result(v),
        wire::Body::Error(e) => Reply::Error(e),
        wire::Body::Stats(s) => Reply::Stats(s),
        wire::Body::Session(h) => Reply::Session(h),
    };
    Line::Reply(id, reply)
}

/// Read one line into `buf` (cleared first), keeping at most `max` bytes
/// of it in memory however long it is (the one bounded reader,
/// `jail::client::lines::Lines`, fed by an async reader).
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Read> {
    let mut lines = jail::client::lines::Lines::with_buffer(std::mem::take(buf), max);
    let read = loop {
        let avail = match r.fill_buf().await {
            Ok(avail) => avail,
            Err(e) => {
                *buf = lines.into_buffer();
                return Err(e);
            }
        };
        if avail.is_empty() {
            break lines.finish();
        }
        let (used, done) = lines.feed(avail);
        r.consume(used);
        if let Some(read) = done {
            break read;
        }
    };
    *buf = lines.into_buffer();
    Ok(read)
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
            env: Default::default(),
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
            Line::Reply("a".into(), Reply::Error(Error::new(ErrorCode::BadRequest, "m").about(Some("a"))))
        );
        assert_eq!(
            parse_line(br#"{"id":"s","stats":{"ready":1}}"#),
            Line::Reply("s".into(), Reply::Stats(Stats { ready: 1, ..Stats::default() }))
        );
        let handout = br#"{"id":"s","session":{"handle":"/h.sock","id":"i","output_dir":"/o","pid":7}}"#;
        let Line::Reply(_, Reply::Session(h)) = parse_line(handout) else { panic!("not a session") };
        assert_eq!((h.handle.to_str(), h.pid), (Some("/h.sock"), 7));
        assert!(matches!(parse_line(br#"{"id":null,"error":{"code":"malformed"}}"#), Line::Stray(_)));
        assert!(matches!(parse_line(b"not json"), Line::Stray(_)));
    }

    #[test]
    fn the_events_probe_tells_an_unknown_field_from_a_missing_code() {
        let old = Reply::Error(Error::new(ErrorCode::UnknownField, "unknown field `events`, expected one of ..."));
        let new = Reply::Error(Error::new(ErrorCode::BadRequest, "give exactly one of \"code\" and \"script\""));
        assert!(!takes_events(&old));
        assert!(takes_events(&new));
    }

    #[test]
    fn a_session_line_names_its_folders() {
        let none = jail::envs::Envs::default();
        let v: Value = serde_json::from_str(&session_line("s1", Some("/w/in".as_ref()), "/w/out".as_ref(), &none)).unwrap();
        assert_eq!(v, json!({"id": "s1", "op": "session", "input": "/w/in", "output": "/w/out"}));
        let env = jail::envs::Envs::from_pairs(["S=1"]).unwrap();
        let v: Value = serde_json::from_str(&session_line("s2", None, "/w/out".as_ref(), &env)).unwrap();
        assert_eq!((v.get("input"), &v["env"]), (None, &json!({"S": "1"})));
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
