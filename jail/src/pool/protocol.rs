//! The pool's wire format: one request or `stats` line in, one reply line
//! out (the protocol is written down in pool.rs). Pure: parsing and
//! checking a line touches no file.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::seconds;

/// Longest request line the pool reads; a longer one is `malformed`.
pub const MAX_LINE_BYTES: usize = 4 << 20;
const MAX_ID_CHARS: usize = 128;

/// A request line as written (serde, unknown fields refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineFile {
    id: Option<String>,
    op: Option<String>,
    code: Option<String>,
    script: Option<PathBuf>,
    input: Option<PathBuf>,
    output: Option<PathBuf>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    limits: LimitsFile,
    events: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    wall_time_secs: Option<f64>,
}

/// What a line asks for, checked.
#[derive(Debug, PartialEq)]
pub enum Line {
    Run(Request),
    Stats {
        id: Option<String>,
    },
    Session(SessionRequest),
    /// `{"op": "cancel", "id": ID}`: stop request ID (run/cancel.rs).
    Cancel {
        id: String,
    },
}

/// A made jail handed out as a session (`"op": "session"`): the caller
/// runs its cells with `jail session exec` and ends it with `jail session
/// stop`, as for a session it started itself.
#[derive(Debug, PartialEq)]
pub struct SessionRequest {
    pub id: String,
    /// Copied into the jail's read-only `/workspace/input`.
    pub input: Option<PathBuf>,
    /// The session's output folder, as `jail session start --output`: it
    /// may hold files; made when absent.
    pub output: Option<PathBuf>,
}

/// One step to run in a claimed jail.
#[derive(Debug, PartialEq)]
pub struct Request {
    pub id: String,
    pub source: Source,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub args: Vec<String>,
    pub wall_time: Duration,
    /// `{"id", "event"}` lines while the step runs, before the reply.
    pub events: bool,
}

#[derive(Debug, PartialEq)]
pub enum Source {
    Code(String),
    Script(PathBuf),
}

/// The pool's ceilings a request's `limits` must stay within. CPU time,
/// memory, pids and CPUs are the pool's, set when a jail is made: a
/// request cannot change them (`limits.cpu_time_secs` is an unknown field).
#[derive(Debug, Clone, Copy)]
pub struct Ceilings {
    pub wall_time: Duration,
}

/// An error reply: a code from the protocol's list and one line naming
/// the fix.
#[derive(Debug, PartialEq)]
pub struct ProtocolError {
    pub id: Option<String>,
    pub code: &'static str,
    pub message: String,
}

impl ProtocolError {
    fn new(id: Option<&str>, code: &'static str, message: impl Into<String>) -> Self {
        ProtocolError { id: id.map(str::to_owned), code, message: message.into() }
    }

    /// The reply line, without its newline.
    pub fn reply(&self) -> String {
        json!({"id": self.id, "error": {"code": self.code, "message": self.message}}).to_string()
    }
}

/// A result reply line, without its newline.
pub fn result_reply(id: &str, result: &Value) -> String {
    json!({"id": id, "result": result}).to_string()
}

/// An event line of a step asked with `events`, without its newline:
/// `event` is one event line as `jail run --events` writes it (a JSON
/// object from our own session supervisor), carried as it is.
pub fn event_line(id: &str, event: &str) -> String {
    format!(r#"{{"id":{},"event":{event}}}"#, Value::from(id))
}

/// Parse and check one line against the policy's ceilings.
pub fn parse_line(line: &str, ceilings: Ceilings) -> Result<Line, ProtocolError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(ProtocolError::new(
            None,
            "malformed",
            format!("the line is over {MAX_LINE_BYTES} bytes: send a script path instead of the code"),
        ));
    }
    let value: Value = serde_json::from_str(line)
        .map_err(|e| ProtocolError::new(None, "malformed", format!("not JSON ({e}): send one JSON object per line")))?;
    let id = value.get("id").and_then(Value::as_str).map(str::to_owned);
    let file: LineFile = serde_json::from_value(value).map_err(|e| {
        let text = e.to_string();
        let code = if text.starts_with("unknown field") { "unknown_field" } else { "malformed" };
        ProtocolError::new(id.as_deref(), code, format!("{text}: see the pool protocol in README.md"))
    })?;
    if let Some(id) = &file.id {
        check_id(id)?;
    }
    match file.op.as_deref() {
        Some("stats") => stats(file),
        Some("session") => session(file).map(Line::Session),
        Some("cancel") => cancel(file),
        Some(op) => Err(ProtocolError::new(
            id.as_deref(),
            "bad_request",
            format!("op {op:?} is unknown: the ops are \"stats\", \"session\" and \"cancel\""),
        )),
        None => request(file, ceilings).map(Line::Run),
    }
}

fn check_id(id: &str) -> Result<(), ProtocolError> {
    let n = id.chars().count();
    if n == 0 || n > MAX_ID_CHARS || id.chars().any(char::is_control) {
        return Err(ProtocolError::new(None, "bad_request", format!("id must be 1 to {MAX_ID_CHARS} printable characters")));
    }
    Ok(())
}

fn stats(file: LineFile) -> Result<Line, ProtocolError> {
    let extra =
        file.code.is_some() || file.script.is_some() || file.input.is_some() || file.output.is_some() || file.events.is_some();
    if extra || !file.args.is_empty() {
        let msg = "a stats line takes only \"op\" and \"id\": send the run fields in their own request";
        return Err(ProtocolError::new(file.id.as_deref(), "bad_request", msg));
    }
    Ok(Line::Stats { id: file.id })
}

fn cancel(file: LineFile) -> Result<Line, ProtocolError> {
    let Some(id) = file.id.clone() else {
        return Err(ProtocolError::new(None, "bad_request", "the cancel line has no \"id\": name the request to stop"));
    };
    let extra = file.code.is_some()
        || file.script.is_some()
        || file.input.is_some()
        || file.output.is_some()
        || file.events.is_some()
        || !file.args.is_empty()
        || file.limits.wall_time_secs.is_some();
    if extra {
        let msg = "a cancel line takes only \"op\" and \"id\" (the id of the request to stop)";
        return Err(ProtocolError::new(Some(&id), "bad_request", msg));
    }
    Ok(Line::Cancel { id })
}

/// The answer to a cancel of `id` when no request of that id is in flight
/// (never sent, refused, or already answered: then it comes after that
/// reply), without its newline.
pub fn unknown_id_reply(id: &str) -> String {
    ProtocolError::new(
        Some(id),
        "unknown_id",
        "no request with this id is in flight (unknown, or already answered): nothing to cancel",
    )
    .reply()
}

fn session(file: LineFile) -> Result<SessionRequest, ProtocolError> {
    let Some(id) = file.id.clone() else {
        return Err(ProtocolError::new(
            None,
            "bad_request",
            "the session request has no \"id\": give it an id to match its reply",
        ));
    };
    let bad = |msg: String| ProtocolError::new(Some(&id), "bad_request", msg);
    let extra = file.code.is_some()
        || file.script.is_some()
        || file.events.is_some()
        || !file.args.is_empty()
        || file.limits.wall_time_secs.is_some();
    if extra {
        return Err(bad(
            "a session line takes only \"id\", \"input\" and \"output\": send its code with `jail session exec`".into()
        ));
    }
    let input = file.input.map(|p| absolute("input", p)).transpose().map_err(bad)?;
    let output = file.output.map(|p| absolute("output", p)).transpose().map_err(bad)?;
    Ok(SessionRequest { id, input, output })
}

fn request(file: LineFile, ceilings: Ceilings) -> Result<Request, ProtocolError> {
    let Some(id) = file.id.clone() else {
        return Err(ProtocolError::new(
            None,
            "bad_request",
            "the request has no \"id\": give each request an id to match its reply",
        ));
    };
    let bad = |msg: String| ProtocolError::new(Some(&id), "bad_request", msg);
    let source = match (file.code, file.script) {
        (Some(code), None) => Source::Code(code),
        (None, Some(path)) => Source::Script(absolute("script", path).map_err(bad)?),
        _ => return Err(bad("give exactly one of \"code\" and \"script\"".into())),
    };
    let input = file.input.map(|p| absolute("input", p)).transpose().map_err(bad)?;
    let output = file.output.map(|p| absolute("output", p)).transpose().map_err(bad)?;
    let wall_time = within("wall_time_secs", file.limits.wall_time_secs, ceilings.wall_time)
        .map_err(|(code, msg)| ProtocolError::new(Some(&id), code, msg))?;
    Ok(Request {
        id,
        source,
        input,
        output,
        args: file.args,
        wall_time,
        events: file.events.unwrap_or(false),
    })
}

fn absolute(field: &str, path: PathBuf) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err(format!("{field} {} is relative: give an absolute path", path.display()));
    }
    if path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(format!("{field} {} has a `..`: give the folder's own path", path.display()));
    }
    Ok(path)
}

type LimitError = (&'static str, String);

fn within(name: &str, value: Option<f64>, most: Duration) -> Result<Duration, LimitError> {
    let Some(v) = value else { return Ok(most) };
    // Bounded before any conversion: 1e300 would panic `from_secs_f64`,
    // and a panic aborts the pool.
    if let Some(asked) = seconds::limit(v, most.as_secs_f64()) {
        return Ok(asked);
    }
    if !(v >= seconds::LEAST && v.is_finite()) {
        return Err(("bad_request", format!("limits.{name} is {v}: give a number of seconds of at least {}", seconds::LEAST)));
    }
    Err((
        "limit_above_policy",
        format!(
            "limits.{name} is {v}, above the pool's {}: lower it or start the pool with a larger --timeout",
            most.as_secs_f64()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEIL: Ceilings = Ceilings { wall_time: Duration::from_secs(15) };

    fn err(line: &str) -> ProtocolError {
        parse_line(line, CEIL).unwrap_err()
    }

    #[test]
    fn a_code_request_takes_the_policy_limits_unless_lowered() {
        let line = r#"{"id":"r1","code":"print(1)","input":"/in","output":"/out","args":["a"]}"#;
        let want = Request {
            id: "r1".into(),
            source: Source::Code("print(1)".into()),
            input: Some("/in".into()),
            output: Some("/out".into()),
            args: vec!["a".into()],
            wall_time: CEIL.wall_time,
            events: false,
        };
        assert_eq!(parse_line(line, CEIL).unwrap(), Line::Run(want));
        let Line::Run(r) = parse_line(r#"{"id":"r2","script":"/s.py","limits":{"wall_time_secs":2.5}}"#, CEIL).unwrap() else {
            panic!("not a run")
        };
        assert_eq!((r.source, r.wall_time), (Source::Script("/s.py".into()), Duration::from_millis(2500)));
        let Line::Run(r) = parse_line(r#"{"id":"r3","code":"1","events":true}"#, CEIL).unwrap() else {
            panic!("not a run")
        };
        assert!(r.events);
    }

    #[test]
    fn stats_is_its_own_line() {
        assert_eq!(parse_line(r#"{"op":"stats"}"#, CEIL).unwrap(), Line::Stats { id: None });
        assert_eq!(parse_line(r#"{"op":"stats","id":"s"}"#, CEIL).unwrap(), Line::Stats { id: Some("s".into()) });
        assert_eq!(err(r#"{"op":"stats","code":"x"}"#).code, "bad_request");
        assert_eq!(err(r#"{"op":"restart"}"#).code, "bad_request");
        assert_eq!(err(r#"{"op":"stats","events":true}"#).code, "bad_request");
    }

    #[test]
    fn a_session_line_takes_an_id_and_its_folders_only() {
        let line = r#"{"id":"s1","op":"session","input":"/in","output":"/out"}"#;
        let want = SessionRequest { id: "s1".into(), input: Some("/in".into()), output: Some("/out".into()) };
        assert_eq!(parse_line(line, CEIL).unwrap(), Line::Session(want));
        let bare = SessionRequest { id: "s2".into(), input: None, output: None };
        assert_eq!(parse_line(r#"{"op":"session","id":"s2"}"#, CEIL).unwrap(), Line::Session(bare));
        for (line, id) in [
            (r#"{"op":"session"}"#, None),
            (r#"{"op":"session","id":"s","code":"1"}"#, Some("s")),
            (r#"{"op":"session","id":"s","events":true}"#, Some("s")),
            (r#"{"op":"session","id":"s","limits":{"wall_time_secs":1}}"#, Some("s")),
            (r#"{"op":"session","id":"s","output":"rel"}"#, Some("s")),
            (r#"{"op":"session","id":"s","input":"/a/../b"}"#, Some("s")),
        ] {
            let e = err(line);
            assert_eq!((e.code, e.id.as_deref()), ("bad_request", id), "{line}: {}", e.message);
        }
        assert_eq!(err(r#"{"op":"session","id":"s","shell":1}"#).code, "unknown_field");
    }

    #[test]
    fn a_cancel_line_names_the_request_and_nothing_else() {
        assert_eq!(parse_line(r#"{"op":"cancel","id":"r1"}"#, CEIL).unwrap(), Line::Cancel { id: "r1".into() });
        for (line, id) in [
            (r#"{"op":"cancel"}"#, None),
            (r#"{"op":"cancel","id":"r","code":"1"}"#, Some("r")),
            (r#"{"op":"cancel","id":"r","limits":{"wall_time_secs":1}}"#, Some("r")),
            (r#"{"op":"cancel","id":""}"#, None),
        ] {
            let e = err(line);
            assert_eq!((e.code, e.id.as_deref()), ("bad_request", id), "{line}: {}", e.message);
        }
        let v: Value = serde_json::from_str(&unknown_id_reply("gone")).unwrap();
        assert_eq!((&v["id"], &v["error"]["code"]), (&json!("gone"), &json!("unknown_id")));
    }

    #[test]
    fn bad_lines_get_a_code_and_keep_the_id_they_had() {
        for (line, code, id) in [
            ("not json", "malformed", None),
            ("[1]", "malformed", None),
            (r#"{"id":"x","code":"1","shell":true}"#, "unknown_field", Some("x")),
            (r#"{"id":"x","limits":{"memory":"1G"},"code":"1"}"#, "unknown_field", Some("x")),
            (r#"{"code":"1"}"#, "bad_request", None),
            (r#"{"id":"","code":"1"}"#, "bad_request", None),
            (r#"{"id":"x"}"#, "bad_request", Some("x")),
            (r#"{"id":"x","code":"1","script":"/a"}"#, "bad_request", Some("x")),
            (r#"{"id":"x","script":"rel.py"}"#, "bad_request", Some("x")),
            (r#"{"id":"x","code":"1","input":"/a/../etc"}"#, "bad_request", Some("x")),
            (r#"{"id":"x","code":"1","limits":{"wall_time_secs":0}}"#, "bad_request", Some("x")),
            // A positive number under 1 ms would be a zero Duration (found by fuzz/pool_line).
            (r#"{"id":"x","code":"1","limits":{"wall_time_secs":1e-15}}"#, "bad_request", Some("x")),
            (r#"{"id":"x","code":"1","limits":{"wall_time_secs":16}}"#, "limit_above_policy", Some("x")),
            (r#"{"id":"x","code":"1","limits":{"wall_time_secs":1e300}}"#, "limit_above_policy", Some("x")),
            (r#"{"id":"x","code":"1","limits":{"cpu_time_secs":1}}"#, "unknown_field", Some("x")),
            (r#"{"id":"x","code":"1","events":"yes"}"#, "malformed", Some("x")),
        ] {
            let e = err(line);
            assert_eq!((e.code, e.id.as_deref()), (code, id), "{line}: {}", e.message);
            assert!(!e.message.contains('\n'), "{line}: one line");
        }
    }

    #[test]
    fn replies_are_one_json_line() {
        let e = err(r#"{"id":"x","code":"1","limits":{"wall_time_secs":99}}"#);
        let v: Value = serde_json::from_str(&e.reply()).unwrap();
        assert_eq!(v["id"], "x");
        assert_eq!(v["error"]["code"], "limit_above_policy");
        let r: Value = serde_json::from_str(&result_reply("y", &json!({"status": "ok"}))).unwrap();
        assert_eq!(r, json!({"id": "y", "result": {"status": "ok"}}));
        // An event is carried as it was written, whatever the id holds.
        let line = event_line("a\"b\n", r#"{"type":"stdout","data":"x"}"#);
        assert_eq!(line, r#"{"id":"a\"b\n","event":{"type":"stdout","data":"x"}}"#);
        assert!(!line.contains('\n'));
    }
}
