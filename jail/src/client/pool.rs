//! The pool's wire (`jail pool`; the protocol is written down in pool.rs),
//! typed once for both ends: the lines a caller writes ([`Line`], built
//! and checked here, written as a [`RequestLine`]), the replies the pool
//! writes ([`Reply`]: a result, an error with its [`ErrorCode`], the
//! [`Stats`], a session's [`Handout`], a live event); both sides read
//! them with the one bounded line reader, `client::lines`. Pure: nothing
//! here touches a file.
//!
//! The reply lines are the bytes the pool wrote before they were typed
//! (the fixtures in the tests): an object's keys in sorted order, as
//! `serde_json` wrote a `json!` value, so every struct here declares its
//! fields sorted. A reply's `id` is its first key, except in an error
//! reply, whose `error` sorts before it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::envs::Envs;
use crate::seconds;

/// Longest request line the pool reads; a longer one is `malformed`.
pub(crate) const MAX_REQUEST_LINE: usize = 4 << 20;
const MAX_ID_CHARS: usize = 128;

// ---- Lines in ----

/// A request line as written: every field a caller may send (unknown
/// fields refused). Absent fields are not written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestLine {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "lossy")]
    pub script: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "lossy")]
    pub input: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "lossy")]
    pub output: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "LimitsLine::is_empty")]
    pub limits: LimitsLine,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<bool>,
    /// Variables for the step or the session, checked by envs.rs when the
    /// line is (a refusal is `bad_request`, naming the variable).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// A request's `limits`: the wall time alone (the rest is the pool's).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsLine {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_time_secs: Option<f64>,
}

impl LimitsLine {
    fn is_empty(&self) -> bool {
        self.wall_time_secs.is_none()
    }
}

/// A path as text, as a caller's JSON carries it (a name that is not
/// UTF-8 is written with U+FFFD, and then not found).
fn lossy<S: Serializer>(path: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match path {
        Some(p) => s.serialize_str(&p.to_string_lossy()),
        None => s.serialize_none(),
    }
}

impl RequestLine {
    /// The line, without its newline.
    pub fn text(&self) -> String {
        // Strings, paths as text and a finite or null number: never fails.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What a line asks for, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Run(Request),
    Stats {
        id: Option<String>,
    },
    Session(SessionRequest),
    /// `{"op": "cancel", "id": ID}`: stop request ID (pool/run/cancel.rs).
    Cancel {
        id: String,
    },
}

/// A made jail handed out as a session (`"op": "session"`): the caller
/// runs its cells with `jail session exec` and ends it with `jail session
/// stop`, as for a session it started itself.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRequest {
    pub id: String,
    /// Copied into the jail's read-only `/workspace/input`.
    pub input: Option<PathBuf>,
    /// The session's output folder, as `jail session start --output`: it
    /// may hold files; made when absent.
    pub output: Option<PathBuf>,
    /// Variables for every cell of the session (envs.rs).
    pub env: Envs,
}

/// One step to run in a claimed jail.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: String,
    pub source: Source,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub args: Vec<String>,
    pub wall_time: Duration,
    /// `{"id", "event"}` lines while the step runs, before the reply.
    pub events: bool,
    /// Variables for the step (envs.rs).
    pub env: Envs,
}

#[derive(Debug, Clone, PartialEq)]
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

impl Line {
    /// The line a caller writes for this, without its newline.
    pub fn text(&self) -> String {
        self.written().text()
    }

    fn written(&self) -> RequestLine {
        match self {
            Line::Run(r) => {
                let (code, script) = match &r.source {
                    Source::Code(c) => (Some(c.clone()), None),
                    Source::Script(p) => (None, Some(p.clone())),
                };
                RequestLine {
                    id: Some(r.id.clone()),
                    code,
                    script,
                    input: r.input.clone(),
                    output: r.output.clone(),
                    args: r.args.clone(),
                    limits: LimitsLine { wall_time_secs: Some(r.wall_time.as_secs_f64()) },
                    events: r.events.then_some(true),
                    env: r.env.clone().into(),
                    ..RequestLine::default()
                }
            }
            Line::Stats { id } => RequestLine { id: id.clone(), op: Some("stats".into()), ..RequestLine::default() },
            Line::Session(s) => RequestLine {
                id: Some(s.id.clone()),
                op: Some("session".into()),
                input: s.input.clone(),
                output: s.output.clone(),
                env: s.env.clone().into(),
                ..RequestLine::default()
            },
            Line::Cancel { id } => RequestLine { id: Some(id.clone()), op: Some("cancel".into()), ..RequestLine::default() },
        }
    }

    /// Parse and check one line against the pool's ceilings.
    pub fn parse(line: &str, ceilings: Ceilings) -> Result<Line, Error> {
        if line.len() > MAX_REQUEST_LINE {
            return Err(too_long());
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|e| Error::new(ErrorCode::Malformed, format!("not JSON ({e}): send one JSON object per line")))?;
        let id = value.get("id").and_then(Value::as_str).map(str::to_owned);
        let file: RequestLine = serde_json::from_value(value).map_err(|e| {
            let text = e.to_string();
            let code = if text.starts_with("unknown field") {
                ErrorCode::UnknownField
            } else {
                ErrorCode::Malformed
            };
            Error::new(code, format!("{text}: see the pool protocol in README.md")).about(id.as_deref())
        })?;
        if let Some(id) = &file.id {
            check_id(id)?;
        }
        match file.op.as_deref() {
            Some("stats") => stats(file),
            Some("session") => session(file).map(Line::Session),
            Some("cancel") => cancel(file),
            Some(op) => Err(Error::new(
                ErrorCode::BadRequest,
                format!("op {op:?} is unknown: the ops are \"stats\", \"session\" and \"cancel\""),
            )
            .about(id.as_deref())),
            None => request(file, ceilings).map(Line::Run),
        }
    }
}

/// The error of a line over [`MAX_REQUEST_LINE`] bytes.
pub fn too_long() -> Error {
    Error::new(
        ErrorCode::Malformed,
        format!("the line is over {MAX_REQUEST_LINE} bytes: send a script path instead of the code"),
    )
}

fn bad(id: &str, message: impl Into<String>) -> Error {
    Error::new(ErrorCode::BadRequest, message).about(Some(id))
}

fn check_id(id: &str) -> Result<(), Error> {
    let n = id.chars().count();
    if n == 0 || n > MAX_ID_CHARS || id.chars().any(char::is_control) {
        return Err(Error::new(ErrorCode::BadRequest, format!("id must be 1 to {MAX_ID_CHARS} printable characters")));
    }
    Ok(())
}

fn stats(file: RequestLine) -> Result<Line, Error> {
    let extra =
        file.code.is_some() || file.script.is_some() || file.input.is_some() || file.output.is_some() || file.events.is_some();
    if extra || !file.args.is_empty() || !file.env.is_empty() {
        let msg = "a stats line takes only \"op\" and \"id\": send the run fields in their own request";
        return Err(Error::new(ErrorCode::BadRequest, msg).about(file.id.as_deref()));
    }
    Ok(Line::Stats { id: file.id })
}

fn cancel(file: RequestLine) -> Result<Line, Error> {
    let Some(id) = file.id.clone() else {
        return Err(Error::new(ErrorCode::BadRequest, "the cancel line has no \"id\": name the request to stop"));
    };
    let extra = file.code.is_some()
        || file.script.is_some()
        || file.input.is_some()
        || file.output.is_some()
        || file.events.is_some()
        || !file.args.is_empty()
        || !file.env.is_empty()
        || file.limits.wall_time_secs.is_some();
    if extra {
        return Err(bad(&id, "a cancel line takes only \"op\" and \"id\" (the id of the request to stop)"));
    }
    Ok(Line::Cancel { id })
}

fn session(file: RequestLine) -> Result<SessionRequest, Error> {
    let Some(id) = file.id.clone() else {
        return Err(Error::new(ErrorCode::BadRequest, "the session request has no \"id\": give it an id to match its reply"));
    };
    let extra = file.code.is_some()
        || file.script.is_some()
        || file.events.is_some()
        || !file.args.is_empty()
        || file.limits.wall_time_secs.is_some();
    if extra {
        return Err(bad(
            &id,
            "a session line takes only \"id\", \"input\", \"output\" and \"env\": send its code with `jail session exec`",
        ));
    }
    let input = file.input.map(|p| absolute("input", p)).transpose().map_err(|m| bad(&id, m))?;
    let output = file.output.map(|p| absolute("output", p)).transpose().map_err(|m| bad(&id, m))?;
    let env = envs(&id, file.env)?;
    Ok(SessionRequest { id, input, output, env })
}

fn request(file: RequestLine, ceilings: Ceilings) -> Result<Request, Error> {
    let Some(id) = file.id.clone() else {
        return Err(Error::new(ErrorCode::BadRequest, "the request has no \"id\": give each request an id to match its reply"));
    };
    let source = match (file.code, file.script) {
        (Some(code), None) => Source::Code(code),
        (None, Some(path)) => Source::Script(absolute("script", path).map_err(|m| bad(&id, m))?),
        _ => return Err(bad(&id, "give exactly one of \"code\" and \"script\"")),
    };
    let input = file.input.map(|p| absolute("input", p)).transpose().map_err(|m| bad(&id, m))?;
    let output = file.output.map(|p| absolute("output", p)).transpose().map_err(|m| bad(&id, m))?;
    let wall_time = within("wall_time_secs", file.limits.wall_time_secs, ceilings.wall_time)
        .map_err(|(code, msg)| Error::new(code, msg).about(Some(&id)))?;
    let env = envs(&id, file.env)?;
    Ok(Request {
        id,
        source,
        input,
        output,
        args: file.args,
        wall_time,
        events: file.events.unwrap_or(false),
        env,
    })
}

/// A request's `env`, checked as every door's is.
fn envs(id: &str, vars: BTreeMap<String, String>) -> Result<Envs, Error> {
    Envs::check(vars).map_err(|e| bad(id, format!("env: {e}")))
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

fn within(name: &str, value: Option<f64>, most: Duration) -> Result<Duration, (ErrorCode, String)> {
    let Some(v) = value else { return Ok(most) };
    // Bounded before any conversion: 1e300 would panic `from_secs_f64`,
    // and a panic aborts the pool.
    if let Some(asked) = seconds::limit(v, most.as_secs_f64()) {
        return Ok(asked);
    }
    if !(v >= seconds::LEAST && v.is_finite()) {
        return Err((
            ErrorCode::BadRequest,
            format!("limits.{name} is {v}: give a number of seconds of at least {}", seconds::LEAST),
        ));
    }
    Err((
        ErrorCode::LimitAbovePolicy,
        format!(
            "limits.{name} is {v}, above the pool's {}: lower it or start the pool with a larger --timeout",
            most.as_secs_f64()
        ),
    ))
}

// ---- Replies ----

/// The code of an error reply: every code the pool writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not a JSON object, or a field of the wrong type.
    Malformed,
    UnknownField,
    /// A field with a bad value (the message names it and the fix).
    BadRequest,
    LimitAbovePolicy,
    /// An id still in flight.
    DuplicateId,
    /// Stdin ended or SIGTERM: no new request is taken.
    Draining,
    Internal,
    /// The request was cancelled before its code reached a jail.
    Cancelled,
    /// The answer to a cancel of an id not in flight.
    UnknownId,
    /// A code this side does not know (a newer pool's).
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// As written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::UnknownField => "unknown_field",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::LimitAbovePolicy => "limit_above_policy",
            ErrorCode::DuplicateId => "duplicate_id",
            ErrorCode::Draining => "draining",
            ErrorCode::Internal => "internal",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::UnknownId => "unknown_id",
            ErrorCode::Other => "other",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error reply's body: a code from the protocol's list and one line
/// naming the fix. `id` is the request's, when the line had one that could
/// be read (not written inside the body: it is the reply's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
    #[serde(skip)]
    pub id: Option<String>,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error { code, message: message.into(), id: None }
    }

    /// The same, about request `id`.
    pub fn about(mut self, id: Option<&str>) -> Error {
        self.id = id.map(str::to_owned);
        self
    }

    /// The reply that carries it.
    pub fn reply(self) -> Reply {
        Reply { id: self.id.clone(), body: Body::Error(self) }
    }

    /// The answer to a cancel of `id` when no request of that id is in
    /// flight (never sent, refused, or already answered: then it comes
    /// after that reply).
    pub fn unknown_id(id: &str) -> Error {
        Error::new(ErrorCode::UnknownId, "no request with this id is in flight (unknown, or already answered): nothing to cancel")
            .about(Some(id))
    }

    /// Whether it says this pool never hands out a session: its policy
    /// binds each jail's output folder when it is made (the message the
    /// pool writes is [`REFUSES_SESSIONS`]).
    pub fn refuses_sessions(&self) -> bool {
        self.code == ErrorCode::BadRequest && self.message.starts_with(REFUSES_SESSIONS)
    }

    /// Whether it says the claimed jail failed before the step's code was
    /// sent (the pool sets `sys.argv` in a cell of its own first: the
    /// message starts [`SET_ARGV`]), so that running the step elsewhere
    /// cannot run it twice.
    pub fn never_started(&self) -> bool {
        self.code == ErrorCode::Internal && self.message.starts_with(SET_ARGV)
    }
}

/// How the pool's refusal of a session starts when its policy binds each
/// jail's output folder.
pub(crate) const REFUSES_SESSIONS: &str = "this pool's policy binds each jail's output folder when it is made";
/// How the pool's error starts when the claimed jail failed before the
/// step's code was sent (setting `sys.argv`).
pub(crate) const SET_ARGV: &str = "set sys.argv";

/// The pool's `stats` answer (pool.rs says what each field means). Each
/// field is read as 0 or `null` when a pool did not write it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub available_memory_bytes: Option<u64>,
    /// The mean over the ready jails now; none when no jail was ready.
    pub idle: Option<Idle>,
    /// What the last jail made held once its preload ran (shared pages in
    /// each process).
    pub idle_rss_bytes: u64,
    pub in_use: u64,
    pub making: u64,
    pub max_size: Option<u64>,
    pub ready: u64,
    pub refill_ms: Refill,
    /// Sessions handed out and not ended.
    pub sessions: u64,
    pub size: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Refill {
    pub last: f64,
    pub mean: f64,
    /// The median and p99 of the recent refills (pool/run/refills.rs).
    pub median: f64,
    pub p99: f64,
}

/// Resident, proportional, anonymous and private (unique) memory of a
/// ready jail, each `null` when it was not said.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Idle {
    pub anon_bytes: Option<u64>,
    pub pss_bytes: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub uss_bytes: Option<u64>,
}

/// A session handed out (`"op": "session"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handout {
    /// Its socket, for `jail session exec` and `stop`.
    pub handle: PathBuf,
    /// The session's id.
    pub id: String,
    pub output_dir: PathBuf,
    /// Its session supervisor.
    pub pid: u32,
}

/// One line the pool writes: `{"id": ..., KIND: ...}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "ReplyLine")]
pub struct Reply {
    /// `null` for an error about a line that had no id, or a stats answer
    /// asked without one.
    pub id: Option<String>,
    pub body: Body,
}

#[derive(Debug, Clone)]
pub enum Body {
    /// The step's result, as `jail run --json` prints it.
    Result(Value),
    Error(Error),
    Stats(Stats),
    Session(Handout),
    /// One live event of a running request, as `jail run --events` writes
    /// it, carried as it is.
    Event(Box<RawValue>),
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        match (self, other) {
            (Body::Result(a), Body::Result(b)) => a == b,
            (Body::Error(a), Body::Error(b)) => a == b,
            (Body::Stats(a), Body::Stats(b)) => a == b,
            (Body::Session(a), Body::Session(b)) => a == b,
            (Body::Event(a), Body::Event(b)) => a.get() == b.get(),
            _ => false,
        }
    }
}

impl Reply {
    pub fn result(id: &str, result: Value) -> Reply {
        Reply { id: Some(id.to_owned()), body: Body::Result(result) }
    }

    /// A live event of request `id`: `event` is one line as `jail run
    /// --events` writes it. `None` when it is not one JSON value on one
    /// line.
    pub fn event(id: &str, event: &str) -> Option<Reply> {
        if event.contains('\n') {
            return None;
        }
        let raw = RawValue::from_string(event.to_owned()).ok()?;
        Some(Reply { id: Some(id.to_owned()), body: Body::Event(raw) })
    }

    /// The event of an artifact accepted once the step's jail is stopped:
    /// `{"type": "artifact", "artifact": {...}}`, as `jail run --events`
    /// ends.
    pub fn artifact(id: &str, artifact: &Value) -> Option<Reply> {
        #[derive(Serialize)]
        struct Artifact<'a> {
            r#type: &'static str,
            artifact: &'a Value,
        }
        let raw = serde_json::value::to_raw_value(&Artifact { r#type: "artifact", artifact }).ok()?;
        Some(Reply { id: Some(id.to_owned()), body: Body::Event(raw) })
    }

    /// The line, without its newline.
    pub fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            // A path that is not UTF-8: said, as an error of the same request.
            let failed = Error::new(ErrorCode::Internal, format!("the reply could not be written: {e}"));
            serde_json::to_string(&failed.about(self.id.as_deref()).reply()).unwrap_or_default()
        })
    }

    /// Read one line the pool wrote.
    pub fn parse(line: &[u8]) -> serde_json::Result<Reply> {
        serde_json::from_slice(line)
    }
}

impl Serialize for Reply {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        match &self.body {
            // Sorted, as the pool's replies have always been written.
            Body::Error(e) => {
                m.serialize_entry("error", e)?;
                m.serialize_entry("id", &self.id)?;
            }
            body => {
                m.serialize_entry("id", &self.id)?;
                match body {
                    Body::Result(v) => m.serialize_entry("result", v)?,
                    Body::Stats(v) => m.serialize_entry("stats", v)?,
                    Body::Session(v) => m.serialize_entry("session", v)?,
                    Body::Event(v) => m.serialize_entry("event", v)?,
                    Body::Error(_) => {}
                }
            }
        }
        m.end()
    }
}

/// A reply as read, before its kind is known.
#[derive(Deserialize)]
struct ReplyLine {
    id: Option<String>,
    event: Option<Box<RawValue>>,
    result: Option<Value>,
    stats: Option<Stats>,
    session: Option<Handout>,
    error: Option<Error>,
}

impl TryFrom<ReplyLine> for Reply {
    type Error = &'static str;

    fn try_from(r: ReplyLine) -> Result<Reply, &'static str> {
        let body = if let Some(v) = r.event {
            // Carried as written, so it must stay one line when written
            // again: JSON may have newlines between its tokens.
            if v.get().contains('\n') {
                return Err("a pool's event is one line");
            }
            Body::Event(v)
        } else if let Some(v) = r.result {
            Body::Result(v)
        } else if let Some(v) = r.stats {
            Body::Stats(v)
        } else if let Some(v) = r.session {
            Body::Session(v)
        } else if let Some(mut e) = r.error {
            e.id.clone_from(&r.id);
            Body::Error(e)
        } else {
            return Err("a pool's reply has one of event, result, stats, session and error");
        };
        Ok(Reply { id: r.id, body })
    }
}

/// The id at the start of a reply line too long to read whole
/// (`{"id":"...",`: a result's `id` is its first key), so that its request
/// can be told rather than left to its deadline.
pub fn leading_id(head: &[u8]) -> Option<String> {
    let rest = head.strip_prefix(br#"{"id":""#)?;
    let end = rest.iter().take(MAX_ID_CHARS * 4 + 1).position(|b| *b == b'"')?;
    String::from_utf8(rest[..end].to_vec()).ok()
}

/// The id of a result line (`{"id":"...","result":`), read from its head
/// alone.
pub fn result_id(line: &[u8]) -> Option<String> {
    let id = leading_id(line)?;
    let rest = line.get(r#"{"id":""#.len() + id.len()..)?;
    rest.starts_with(br#"","result":"#).then_some(id)
}

#[cfg(test)]
mod tests;
