//! A session's socket, from the client's side: the protocol a `jail
//! session` supervisor serves, typed once (session/handle.rs serves it with
//! these types), and the one client of it that every door uses — the CLI's
//! `jail session exec|stop|interrupt`, the pool, the service, the MCP
//! server, the agent — plus `start`, which runs `jail session start --json`.
//!
//! One request line, one answer line; before the answer, with an exec's
//! `events`, the cell's event lines (each has a `type`, the answer has
//! none). What comes back is read through the one bounded line reader
//! (events.rs): no line is kept past `bounds::MAX_DOCUMENT`. Every call
//! has a deadline: a cell's wall-clock limit (the session kills the cell
//! there itself), the longest interrupt grace a policy may give it, and
//! `bounds::HUNG_GRACE` for the session's own work; past it the session is
//! deemed hung and the call gives up. A session that ended says why: its
//! tombstone (the supervisor's, or its janitor's) beside the handle.
//!
//! Results are typed (`RunResult`, its schema version checked first);
//! the `*_value` calls give the document as the session wrote it, for a
//! caller that checks it against the schema or passes it on as it is.

use std::io::{self, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::bounds::{HUNG_GRACE, MAX_DOCUMENT, START_WAIT};
use super::command::{self, StartSpec};
use super::events::{self, ResultError};
use super::lines::{Line, Lines};
use super::run::{self, RunError};
use crate::envs::Envs;
use crate::result::RunResult;

/// The largest cell a client may send.
pub(crate) const MAX_CELL: usize = 8 << 20;

/// The longest `session.interrupt_grace_secs` a policy may set
/// (policy.rs): a cell past its time is killed that long after its
/// KeyboardInterrupt, before its answer comes.
pub(crate) const MOST_INTERRUPT_GRACE: Duration = Duration::from_secs(60);

/// A cell's wait when the caller does not know its wall-clock limit (the
/// session's own): the longest limit a policy or a flag may set.
const MOST_WALL: Duration = Duration::from_secs(crate::seconds::MOST as u64);

/// What a client asks of a session.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Run this code as the next cell; `wall_secs` shortens this cell's
    /// wall-clock limit (never lengthens it: the session's stays the ceiling).
    Exec {
        code: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wall_secs: Option<f64>,
        /// Send the cell's output live, as `jail run --events` chunk
        /// events, one per line before the answer (live.rs).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        events: bool,
        /// A stateless step (a pool's run, whose jail is destroyed after
        /// it): past its time, its grace is the wall clock's alone (a
        /// session cell's counts once its interpreter ran, session/grace.rs).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stateless: bool,
        /// Variables for this cell, over the session's (envs.rs checks
        /// them as it reads the request); set back once the cell ends.
        #[serde(default, skip_serializing_if = "Envs::is_empty")]
        env: Envs,
        /// Keep `env` for every later cell too: the session's own from
        /// now on (a pool's handout sets a session's variables so).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keep_env: bool,
    },
    /// End the session; the answer is the session's closing result. Served
    /// while a cell runs too: the cell is killed (it ends `cancelled` if an
    /// `interrupt` came first, else `timeout_wall`), then the session ends.
    Stop,
    /// Interrupt the cell in flight: KeyboardInterrupt in it, as at its time
    /// limit, and killed after the session's `interrupt_grace_secs` if it
    /// goes on; it ends `cancelled`. Served while a cell runs; answered at
    /// once with `{"interrupted": ID}` (the cell's id, `null` when none was
    /// running). Only the owner's clients are served, as for every request.
    Interrupt,
    /// Take `dir` as the session's output folder, before any untrusted
    /// cell has run (adopt.rs; `jail pool` sends it when it hands a made
    /// jail out as a session). The answer's result is `{"output_dir": DIR}`.
    AdoptOutput { dir: PathBuf },
    /// Write a file into the session's `/workspace/output` (session/files.rs):
    /// `path` relative to it, `data` its content in base64, at most
    /// [`MAX_FILE`] bytes. Served while a cell runs too. The answer's
    /// result is a [`FileAnswer`].
    PutFile { path: String, data: String },
    /// Read a file of `/workspace/output` back, judged as an artifact is.
    GetFile { path: String },
    /// List a folder of `/workspace/output` (`""`: the folder itself).
    ListFiles {
        #[serde(default)]
        path: String,
    },
}

impl Request {
    /// A request of the files API: bounded in bytes and time, so served
    /// at once, a cell running or not (session/files.rs).
    pub fn is_file_op(&self) -> bool {
        matches!(self, Request::PutFile { .. } | Request::GetFile { .. } | Request::ListFiles { .. })
    }
}

/// The largest file the files API moves either way: the size of the
/// largest cell, so that its request, in base64, is a line the session
/// reads (handle.rs).
pub const MAX_FILE: usize = MAX_CELL;

/// A file request's answer: what was done, or why not. A refusal is an
/// answer too, so every door can say it in its own terms.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum FileAnswer {
    /// The file is in place, whole (it replaced what had its name).
    Written { path: String, bytes: u64, sha256: String },
    /// The file as judged: its artifact entry, and the bytes that passed
    /// (a CSV/TSV's formula cells neutralised), base64.
    Read {
        artifact: crate::result::Artifact,
        data: String,
    },
    /// A folder's entries, sorted by name; `truncated` past [`MAX_LISTED`].
    Listed {
        path: String,
        entries: Vec<FileEntry>,
        truncated: bool,
    },
    Refused {
        code: FileRefusal,
        /// The artifact check's reason, when it refused the file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<crate::result::RejectReason>,
        detail: String,
    },
}

/// Entries one listing gives at most.
pub const MAX_LISTED: usize = 4096;

/// One entry of a listing.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
pub struct FileEntry {
    /// Printable: a control or bidi character in the name is escaped.
    pub name: String,
    /// `file`, `dir`, `symlink` (never followed) or `other`.
    pub kind: String,
    /// A file's size; 0 for the others.
    pub bytes: u64,
}

/// Why a file request was refused.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileRefusal {
    /// Not a path the files API takes (`..`, absolute, a bad name).
    BadPath,
    NotFound,
    /// A link on the way, or the name itself: never followed.
    Link,
    /// Not a regular file (or, for a listing, not a folder).
    NotAFile,
    /// Over [`MAX_FILE`].
    TooLarge,
    /// The artifact check refused it (`reason` says which rule).
    Rejected,
    /// The session's output is the host folder itself
    /// (`filesystem.output_size: "unlimited"`): use that folder.
    Unavailable,
    /// The output filled up, or another error of the filesystem.
    Failed,
}

impl FileRefusal {
    /// The HTTP status a service gives it.
    pub fn http_status(self) -> u16 {
        match self {
            FileRefusal::BadPath | FileRefusal::Link => 400,
            FileRefusal::NotFound => 404,
            FileRefusal::NotAFile | FileRefusal::Unavailable => 409,
            FileRefusal::TooLarge => 413,
            FileRefusal::Rejected => 422,
            FileRefusal::Failed => 507,
        }
    }
}

/// The session's answer: a result document, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Answer {
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<String>,
}

/// An `interrupt`'s answer: the cell interrupted, `None` when none ran.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Interrupted {
    pub interrupted: Option<u64>,
}

/// An `adopt_output`'s answer: the folder the session delivers to now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Adopted {
    pub output_dir: PathBuf,
}

/// The tombstone beside a handle: `X.sock` → `X.ended`.
pub(crate) fn tombstone_of(handle: &Path) -> Option<PathBuf> {
    let name = handle.file_name()?.to_str()?.strip_suffix(".sock")?;
    Some(handle.with_file_name(format!("{name}.ended")))
}

/// What an ended session leaves beside its handle (`X.ended`, 0600, in
/// the caller's 0700 session folder): why it ended, and its closing
/// result when it got as far as one (a killed supervisor's janitor has
/// none). An `exec` gets the why; a `stop` the closing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Tombstone {
    pub why: String,
    #[serde(default)]
    pub closing: Option<Value>,
}

impl Tombstone {
    /// The tombstone beside `handle`, if the session left one: bounded in
    /// bytes (a closing is a result, capped as an answer is).
    pub fn read(handle: &Path) -> Option<Tombstone> {
        let mut text = Vec::new();
        std::fs::File::open(tombstone_of(handle)?).ok()?.take(MAX_DOCUMENT).read_to_end(&mut text).ok()?;
        // An older jail's tombstone is its one line of why.
        serde_json::from_slice(&text)
            .ok()
            .or_else(|| Some(Tombstone { why: String::from_utf8_lossy(&text).trim().to_string(), closing: None }))
    }

    /// Why, as the closing's `session.why` says it.
    pub fn cause(&self) -> EndCause {
        let said = self.closing.as_ref().and_then(|c| c.pointer("/session/why")).and_then(Value::as_str);
        match said {
            Some(code) => serde_json::from_value(Value::from(code)).unwrap_or(EndCause::Other),
            // Only a janitor leaves no closing: its supervisor was killed.
            None => EndCause::SupervisorGone,
        }
    }
}

/// Why a session ended: a result's `session.why` (session.rs, `Why::code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndCause {
    /// `jail session stop` (or its door's stop).
    Stopped,
    IdleTimeout,
    MaxLifetime,
    /// A cell ran past its time and did not stop within the grace.
    CellKilled,
    /// The interpreter died (segfault, `os._exit`, the OOM killer).
    InterpreterDied,
    DriverDeaf,
    /// The jail failed before its interpreter was ready.
    SetupFailed,
    /// The process whose lifeline the session held (a pool) ended.
    OwnerGone,
    /// Its supervisor got SIGTERM, SIGINT or SIGHUP.
    Cancelled,
    /// Its supervisor ended with no closing result (it was killed; its
    /// janitor cleaned up).
    SupervisorGone,
    /// A cause this client does not know.
    #[serde(other)]
    Other,
}

/// Why a call gave no answer. The session is over for `Ended` and
/// `Unknown`: a caller starts a new one ([`SessionError::is_gone`]); each
/// door says so in its own terms (the CLI names `jail session start`).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The session ended; nothing more runs in it.
    #[error("session {handle} ended ({detail})")]
    Ended { handle: String, why: EndCause, detail: String },
    /// No session at this handle, and no word of one.
    #[error("no session at {handle} (wrong handle, or it ended)")]
    Unknown { handle: String },
    /// The session answered with an error: the request was not taken.
    #[error("session {handle} refused: {error}")]
    Refused { handle: String, error: String },
    /// No answer within the call's deadline: the session is deemed hung.
    #[error("session {handle} did not answer within {} s", wait.as_secs())]
    Hung { handle: String, wait: Duration },
    /// The conversation broke (a reset, an answer that is not one).
    #[error("talk to session {handle}: {error}")]
    Io { handle: String, error: String },
    /// The answer is not a result of this client's schema.
    #[error("session {handle}: {error}")]
    Result { handle: String, error: ResultError },
}

impl SessionError {
    /// The session is over (ended, or not there): start a new one.
    pub fn is_gone(&self) -> bool {
        matches!(self, SessionError::Ended { .. } | SessionError::Unknown { .. })
    }
}

/// How long a call may take for a cell of `wall` (the session's own, up
/// to a day, when `None`): its time, the interrupt grace, the hung grace.
pub(crate) fn cell_wait(wall: Option<Duration>) -> Duration {
    wall.unwrap_or(MOST_WALL) + MOST_INTERRUPT_GRACE + HUNG_GRACE
}

/// One cell as a client sends it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cell {
    pub code: String,
    /// Cuts this cell's wall-clock limit (the session's own when that is
    /// shorter); the client waits that long plus the graces.
    pub wall: Option<Duration>,
    /// Variables for this cell (envs.rs), over the session's.
    pub env: Envs,
    /// Keep `env` for every later cell too.
    pub keep_env: bool,
}

impl Cell {
    /// `code` within `wall`, with no variables of its own.
    pub fn new(code: impl Into<String>, wall: Option<Duration>) -> Cell {
        Cell { code: code.into(), wall, ..Cell::default() }
    }

    /// The same cell with `env` for it.
    pub fn with_env(self, env: Envs) -> Cell {
        Cell { env, ..self }
    }
}

/// Run `cell` as the session's next: its result.
pub fn exec(handle: &Path, cell: Cell) -> Result<RunResult, SessionError> {
    typed(handle, exec_value(handle, cell, None)?)
}

/// [`exec`] (live when `on_event` is given) as a stateless step: the
/// jail is destroyed after it, so past its time its grace is the wall
/// clock's alone (a pool's run).
pub fn exec_step(handle: &Path, cell: Cell, on_event: Option<&mut dyn FnMut(&str)>) -> Result<RunResult, SessionError> {
    typed(handle, exec_request(handle, cell, true, on_event)?)
}

/// [`exec`] with the cell's output live: each event line (`stdout`,
/// `stderr`, `truncated`, `dropped`), exactly as `jail run --events`
/// writes it, goes to `on_event` while the cell runs.
pub fn exec_live(handle: &Path, cell: Cell, on_event: &mut dyn FnMut(&str)) -> Result<RunResult, SessionError> {
    typed(handle, exec_value(handle, cell, Some(on_event))?)
}

/// [`exec`] (live when `on_event` is given), its result document as the
/// session wrote it.
pub(crate) fn exec_value(handle: &Path, cell: Cell, on_event: Option<&mut dyn FnMut(&str)>) -> Result<Value, SessionError> {
    exec_request(handle, cell, false, on_event)
}

/// One `exec` on the socket: a session cell, or a stateless step.
fn exec_request(
    handle: &Path,
    cell: Cell,
    stateless: bool,
    on_event: Option<&mut dyn FnMut(&str)>,
) -> Result<Value, SessionError> {
    let events = on_event.is_some();
    let Cell { code, wall, env, keep_env } = cell;
    let request = Request::Exec { code, wall_secs: wall.map(|w| w.as_secs_f64()), events, stateless, env, keep_env };
    let mut quiet = |_: &str| {};
    call(handle, &request, cell_wait(wall), on_event.unwrap_or(&mut quiet))
}

/// End the session: its closing result (the whole session's usage,
/// denials, delivered artifacts and refusals). A cell in flight is killed
/// first. A session that already ended by itself (a cell that killed its
/// interpreter, an idle timeout) gives the closing it left.
pub fn stop(handle: &Path) -> Result<RunResult, SessionError> {
    typed(handle, stop_value(handle)?)
}

/// [`stop`], the closing as the session wrote it.
pub fn stop_value(handle: &Path) -> Result<Value, SessionError> {
    call(handle, &Request::Stop, HUNG_GRACE, &mut |_| {})
}

/// Interrupt the cell in flight (KeyboardInterrupt; killed after the
/// session's grace): the cell's id, `None` when none ran.
pub fn interrupt(handle: &Path) -> Result<Interrupted, SessionError> {
    let v = call(handle, &Request::Interrupt, HUNG_GRACE, &mut |_| {})?;
    serde_json::from_value(v).map_err(|e| io_error(handle, format!("an interrupt's answer: {e}")))
}

/// Take `dir` (absolute, an existing folder) as the session's output
/// folder: `/workspace/output` is filled from it, and what passed is
/// delivered there when the session ends. Once, before any untrusted cell
/// (adopt.rs).
pub fn adopt_output(handle: &Path, dir: &Path) -> Result<Adopted, SessionError> {
    let v = call(handle, &Request::AdoptOutput { dir: dir.to_path_buf() }, HUNG_GRACE, &mut |_| {})?;
    serde_json::from_value(v).map_err(|e| io_error(handle, format!("an adoption's answer: {e}")))
}

/// Write `data` as `path` (relative to `/workspace/output`) in the session.
pub fn put_file(handle: &Path, path: &str, data: &[u8]) -> Result<FileAnswer, SessionError> {
    use base64::Engine;
    if data.len() > MAX_FILE {
        let detail = format!(
            "{} bytes, over the {} MiB a file may be here: give a larger file as input instead",
            data.len(),
            MAX_FILE >> 20
        );
        return Ok(FileAnswer::Refused { code: FileRefusal::TooLarge, reason: None, detail });
    }
    let data = base64::engine::general_purpose::STANDARD.encode(data);
    file_call(handle, &Request::PutFile { path: path.to_string(), data })
}

/// Read `path` back, judged; [`FileAnswer::Read`]'s data is base64.
pub fn get_file(handle: &Path, path: &str) -> Result<FileAnswer, SessionError> {
    file_call(handle, &Request::GetFile { path: path.to_string() })
}

/// List the folder `path` (`""`: `/workspace/output` itself).
pub fn list_files(handle: &Path, path: &str) -> Result<FileAnswer, SessionError> {
    file_call(handle, &Request::ListFiles { path: path.to_string() })
}

fn file_call(handle: &Path, request: &Request) -> Result<FileAnswer, SessionError> {
    let v = call(handle, request, HUNG_GRACE, &mut |_| {})?;
    serde_json::from_value(v).map_err(|e| io_error(handle, format!("a file request's answer: {e}")))
}

fn typed(handle: &Path, doc: Value) -> Result<RunResult, SessionError> {
    events::result_of(doc).map_err(|error| SessionError::Result { handle: shown(handle), error })
}

fn shown(handle: &Path) -> String {
    handle.display().to_string()
}

fn io_error(handle: &Path, error: impl Into<String>) -> SessionError {
    SessionError::Io { handle: shown(handle), error: error.into() }
}

/// Ask the session at `handle` and wait at most `wait` for its answer's
/// result; each event line before it goes to `on_event` as it was
/// written (one JSON object, without its newline).
pub fn call(handle: &Path, request: &Request, wait: Duration, on_event: &mut dyn FnMut(&str)) -> Result<Value, SessionError> {
    let until = Instant::now() + wait;
    // The session is gone: a `stop` gets the closing it left, anything
    // else why it ended.
    let ended = || -> Option<Result<Value, SessionError>> {
        let stone = Tombstone::read(handle)?;
        let why = stone.cause();
        Some(match (request, stone.closing) {
            (Request::Stop, Some(closing)) => Ok(closing),
            _ => Err(SessionError::Ended { handle: shown(handle), why, detail: stone.why.trim().chars().take(500).collect() }),
        })
    };
    let unknown = || Err(SessionError::Unknown { handle: shown(handle) });
    let is_socket = std::fs::symlink_metadata(handle).is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return ended().unwrap_or_else(unknown);
    }
    let Ok(mut stream) = UnixStream::connect(handle) else { return ended().unwrap_or_else(unknown) };
    let mut line = serde_json::to_vec(request).map_err(|e| io_error(handle, e.to_string()))?;
    line.push(b'\n');
    // A session that ends while it holds our request (it was judging its
    // output, say) resets the connection or closes it: its tombstone is
    // there by then.
    let gone = |e: String| ended().unwrap_or_else(|| Err(io_error(handle, e)));
    let _ = stream.set_write_timeout(Some(wait));
    if let Err(e) = stream.write_all(&line) {
        return gone(e.to_string());
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let heard = match read_answer(&stream, until, on_event) {
        Reading::Heard(heard) => heard,
        Reading::Hung => return Err(SessionError::Hung { handle: shown(handle), wait }),
        Reading::Broke(e) => return gone(e),
    };
    match heard {
        Heard::Answer(Answer { result: Some(result), .. }) => Ok(result),
        Heard::Answer(Answer { error: Some(error), .. }) => Err(SessionError::Refused { handle: shown(handle), error }),
        Heard::Answer(_) => Err(io_error(handle, "an empty answer")),
        Heard::NotAnswer(e) => Err(io_error(handle, e)),
        Heard::TooLong => Err(io_error(handle, format!("its answer is over {MAX_DOCUMENT} bytes"))),
        Heard::Nothing => gone("the session closed without an answer".into()),
    }
}

/// How reading the socket ended.
enum Reading {
    Heard(Heard),
    /// Nothing more by the deadline.
    Hung,
    /// The connection broke.
    Broke(String),
}

/// Read event lines, then the answer, by `until`.
fn read_answer(mut stream: &UnixStream, until: Instant, on_event: &mut dyn FnMut(&str)) -> Reading {
    let mut reply = Reply::new();
    let mut chunk = vec![0u8; 64 << 10];
    while !reply.done() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Reading::Hung;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => reply.feed(&chunk[..n], on_event),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Reading::Hung,
            Err(e) => return Reading::Broke(e.to_string()),
        }
    }
    Reading::Heard(reply.end(on_event))
}

/// What a session's reply came to.
#[derive(Debug, PartialEq)]
pub enum Heard {
    /// The answer.
    Answer(Answer),
    /// A line that is neither an event nor an answer.
    NotAnswer(String),
    /// A line over the cap: events are chunks far below it, so it was the
    /// answer; nothing more of it is read.
    TooLong,
    /// The stream ended with no answer.
    Nothing,
}

/// A session's reply as it is read: event lines (each handed on as it was
/// written), then the answer line. Sans IO: [`call`] feeds it what the
/// socket gives, and so can a test or a fuzz target; it keeps at most its
/// cap of any line (the one line reader, client/lines.rs).
#[derive(Debug)]
pub struct Reply {
    lines: Lines,
    heard: Option<Heard>,
}

impl Default for Reply {
    fn default() -> Reply {
        Reply::new()
    }
}

impl Reply {
    /// A reply whose lines are read up to `bounds::MAX_DOCUMENT`.
    pub fn new() -> Reply {
        Reply::within(MAX_DOCUMENT as usize)
    }

    /// A reply whose lines are read up to `max` bytes.
    pub fn within(max: usize) -> Reply {
        Reply { lines: Lines::new(max), heard: None }
    }

    /// Whether it came to something: nothing more need be read.
    pub fn done(&self) -> bool {
        self.heard.is_some()
    }

    /// Take `bytes`; each event line they end before the answer goes to
    /// `on_event`.
    pub fn feed(&mut self, bytes: &[u8], on_event: &mut dyn FnMut(&str)) {
        if self.heard.is_some() {
            return;
        }
        let heard = &mut self.heard;
        self.lines.feed_all(bytes, |l| said(l, heard, on_event));
        // Cut at the cap: the rest of that line is not waited for.
        if self.heard.is_none() && self.lines.over() {
            self.heard = Some(Heard::TooLong);
        }
    }

    /// The stream ended: what the reply came to.
    pub fn end(self, on_event: &mut dyn FnMut(&str)) -> Heard {
        let Reply { lines, mut heard } = self;
        if heard.is_none() {
            lines.finish_all(|l| said(l, &mut heard, on_event));
        }
        heard.unwrap_or(Heard::Nothing)
    }
}

/// One line of a reply: an event (it has a `type`) handed on, or the end.
fn said(line: Line<'_>, heard: &mut Option<Heard>, on_event: &mut dyn FnMut(&str)) {
    /// One line, before it is known to be an event or the answer.
    #[derive(Deserialize)]
    struct Said {
        #[serde(rename = "type")]
        kind: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        error: Option<String>,
    }
    if heard.is_some() {
        return;
    }
    let Line::Whole(text) = line else {
        *heard = Some(Heard::TooLong);
        return;
    };
    // An object (a struct is read from an array too).
    if text.trim_ascii_start().first() != Some(&b'{') {
        *heard = Some(Heard::NotAnswer("a line that is not a JSON object".into()));
        return;
    }
    match serde_json::from_slice::<Said>(text) {
        Ok(Said { kind: Some(_), .. }) => {
            if let Ok(event) = std::str::from_utf8(text) {
                on_event(event);
            }
        }
        Ok(Said { result, error, .. }) => *heard = Some(Heard::Answer(Answer { result, error })),
        Err(e) => *heard = Some(Heard::NotAnswer(e.to_string())),
    }
}

/// A session that is up, as `jail session start --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// Its socket: what every later call is given.
    pub handle: PathBuf,
    /// Its session supervisor.
    pub pid: u32,
    pub id: String,
    /// The jail's PID 1 (for a template's fork, not the supervisor's
    /// descendant); absent from an older `jail`.
    #[serde(default)]
    pub jail_pid: Option<u32>,
}

/// Why no session started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `jail` could not be run, or hung.
    #[error("{0}")]
    Run(#[from] RunError),
    /// It failed: its status, the tail of its stderr, and the jail's own
    /// one-line reason (its last line: the setup error, a bad flag).
    #[error("jail session start failed: {line}")]
    Failed {
        status: std::process::ExitStatus,
        line: String,
        stderr: String,
    },
    /// It printed no handle.
    #[error("jail session start printed no handle: {0}")]
    NoHandle(String),
}

/// Start a session: `jail session start --json` (command.rs), given the
/// jail's own wait for its interpreter (`bounds::START_WAIT`) plus the
/// hung grace, its output bounded.
pub fn start(spec: &StartSpec) -> Result<Started, StartError> {
    let cmd = command::start_command(spec).map_err(|error| RunError::Spawn { path: spec.jail.clone(), error })?;
    let running = run::spawn_document(cmd, &spec.jail, START_WAIT)?;
    let out = running.output()?;
    if !out.status.success() {
        let line = out.stderr.lines().last().unwrap_or("").trim_start_matches("jail: ").to_string();
        return Err(StartError::Failed { status: out.status, line, stderr: out.stderr });
    }
    serde_json::from_slice(&out.stdout).map_err(|e| StartError::NoHandle(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn requests_are_the_lines_they_always_were() {
        let lines = [
            (
                Request::Exec {
                    code: "x".into(),
                    wall_secs: None,
                    events: false,
                    stateless: false,
                    env: Envs::default(),
                    keep_env: false,
                },
                r#"{"op":"exec","code":"x"}"#,
            ),
            (
                Request::Exec {
                    code: "print(1)\n".into(),
                    wall_secs: Some(2.5),
                    events: true,
                    stateless: false,
                    env: Envs::from_pairs(["A=1"]).unwrap(),
                    keep_env: true,
                },
                r#"{"op":"exec","code":"print(1)\n","wall_secs":2.5,"events":true,"env":{"A":"1"},"keep_env":true}"#,
            ),
            (Request::Stop, r#"{"op":"stop"}"#),
            (Request::Interrupt, r#"{"op":"interrupt"}"#),
            (Request::AdoptOutput { dir: "/o/ut".into() }, r#"{"op":"adopt_output","dir":"/o/ut"}"#),
        ];
        for (request, line) in lines {
            assert_eq!(serde_json::to_string(&request).unwrap(), line);
            assert_eq!(serde_json::from_str::<Request>(line).unwrap(), request);
        }
        let r: Request = serde_json::from_str(r#"{"op":"exec","code":"x=1","events":true}"#).unwrap();
        assert_eq!(
            r,
            Request::Exec {
                code: "x=1".into(),
                wall_secs: None,
                events: true,
                stateless: false,
                env: Envs::default(),
                keep_env: false
            }
        );
        // The variables are checked as the request is read.
        assert!(serde_json::from_str::<Request>(r#"{"op":"exec","code":"x","env":{"LD_PRELOAD":"/x"}}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"exec","code":"x","more":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"shell"}"#).is_err());
    }

    #[test]
    fn a_tombstone_sits_beside_its_socket() {
        assert_eq!(tombstone_of(Path::new("/r/ab.sock")), Some(PathBuf::from("/r/ab.ended")));
        assert_eq!(tombstone_of(Path::new("/r/ab")), None);
    }

    #[test]
    fn every_cause_a_session_gives_is_one_this_client_knows() {
        use crate::session::Why;
        let whys = [
            Why::Stopped,
            Why::IdleTimeout,
            Why::MaxLifetime,
            Why::CellKilled(1),
            Why::Died(crate::session::cell::Death::Killed),
            Why::DriverDeaf,
            Why::NeverReady,
            Why::OwnerGone,
            Why::Cancelled(nix::sys::signal::Signal::SIGTERM),
        ];
        for why in whys {
            let cause: EndCause = serde_json::from_value(Value::from(why.code())).unwrap();
            assert_ne!(cause, EndCause::Other, "{why:?}");
        }
        assert_eq!(serde_json::from_value::<EndCause>(Value::from("new")).unwrap(), EndCause::Other);
    }

    #[test]
    fn an_ended_session_gives_stop_its_closing_and_exec_its_why() {
        let tmp = tempfile::tempdir().unwrap();
        let handle = tmp.path().join("ab.sock");
        let closing = serde_json::json!({"status": "ok", "session": {"why": "cell_killed"}});
        let stone = Tombstone { why: "cell 2 ran past its time".into(), closing: Some(closing.clone()) };
        std::fs::write(tmp.path().join("ab.ended"), serde_json::to_vec(&stone).unwrap()).unwrap();
        assert_eq!(stop_value(&handle).unwrap(), closing);
        let err = exec_value(&handle, Cell::new("1", None), None).unwrap_err();
        let SessionError::Ended { why, detail, .. } = &err else { panic!("{err}") };
        assert_eq!((*why, detail.as_str()), (EndCause::CellKilled, "cell 2 ran past its time"));
        assert!(err.is_gone());
        // A killed supervisor's janitor leaves no closing; an older jail's
        // tombstone is its line of why: `stop` says the session ended.
        for text in [
            r#"{"why": "the session supervisor was killed"}"#,
            "the session supervisor was killed\n",
        ] {
            std::fs::write(tmp.path().join("ab.ended"), text).unwrap();
            let err = stop(&handle).unwrap_err();
            assert!(
                matches!(&err, SessionError::Ended { why: EndCause::SupervisorGone, detail, .. } if detail == "the session supervisor was killed"),
                "{err}"
            );
        }
        std::fs::remove_file(tmp.path().join("ab.ended")).unwrap();
        let err = stop(&handle).unwrap_err();
        assert!(matches!(err, SessionError::Unknown { .. }) && err.is_gone(), "{err}");
    }

    /// A session at a socket in `dir` whose server reads the request line
    /// and hands it to `serve`, which answers on the stream (or not).
    fn fake_session(
        dir: &Path,
        serve: impl FnOnce(String, &mut UnixStream) + Send + 'static,
    ) -> (PathBuf, std::thread::JoinHandle<()>) {
        let handle = dir.join("cd.sock");
        let listener = UnixListener::bind(&handle).unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while stream.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            serve(String::from_utf8(line).unwrap(), &mut stream);
        });
        (handle, server)
    }

    /// `call` on a thread: its error, or a failure (not a hang) when it
    /// has not given up within a minute.
    fn call_gives_up(handle: PathBuf, wait: Duration) -> (SessionError, usize) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut events = 0;
            let got = call(&handle, &Request::Stop, wait, &mut |_| events += 1);
            let _ = tx.send((got, events));
        });
        let (got, events) = rx.recv_timeout(Duration::from_secs(60)).expect("the client never gave up");
        (got.unwrap_err(), events)
    }

    #[test]
    fn a_session_that_never_answers_is_given_up_at_the_wait() {
        let tmp = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (handle, server) = fake_session(tmp.path(), move |line, _stream| {
            assert_eq!(line, r#"{"op":"stop"}"#);
            // Holds the connection open, silent, until the test is done.
            let _ = rx.recv();
        });
        let wait = Duration::from_millis(300);
        let t0 = Instant::now();
        let (err, _) = call_gives_up(handle, wait);
        assert!(matches!(err, SessionError::Hung { wait: w, .. } if w == wait), "{err}");
        assert!(t0.elapsed() >= wait && t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
        drop(tx);
        server.join().unwrap();
    }

    #[test]
    fn a_session_that_trickles_events_is_given_up_at_the_wait_too() {
        let tmp = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (handle, server) = fake_session(tmp.path(), move |_, stream| {
            // An event every 50 ms, never the answer: each read comes in
            // time, the whole does not.
            while rx.recv_timeout(Duration::from_millis(50)).is_err() {
                if stream.write_all(b"{\"type\":\"stdout\",\"data\":\".\"}\n").is_err() {
                    return;
                }
            }
        });
        let (err, events) = call_gives_up(handle, Duration::from_millis(400));
        assert!(matches!(err, SessionError::Hung { .. }), "{err}");
        assert!(events > 0);
        drop(tx);
        server.join().unwrap();
    }

    #[test]
    fn events_come_before_the_typed_answer() {
        let tmp = tempfile::tempdir().unwrap();
        let (handle, server) = fake_session(tmp.path(), |line, stream| {
            assert_eq!(line, r#"{"op":"exec","code":"print(1)","wall_secs":2.0,"events":true}"#);
            stream.write_all(b"{\"type\":\"stdout\",\"data\":\"1\\n\"}\n").unwrap();
            stream.write_all(b"{\"result\":{\"interrupted\":null}}\n").unwrap();
        });
        let mut seen = Vec::new();
        let got =
            exec_value(&handle, Cell::new("print(1)", Some(Duration::from_secs(2))), Some(&mut |e| seen.push(e.to_string())));
        assert_eq!(got.unwrap(), serde_json::json!({"interrupted": null}));
        assert_eq!(seen, [r#"{"type":"stdout","data":"1\n"}"#]);
        server.join().unwrap();
        // A result of another schema version is refused before its type is read.
        let tmp = tempfile::tempdir().unwrap();
        let (handle, server) = fake_session(tmp.path(), |_, stream| {
            stream.write_all(b"{\"result\":{\"schema_version\":999}}\n").unwrap();
        });
        let err = exec(&handle, Cell::new("1", None)).unwrap_err();
        assert!(matches!(err, SessionError::Result { error: ResultError::Version(_), .. }), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn an_answer_over_the_cap_is_cut_there() {
        let tmp = tempfile::tempdir().unwrap();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = std::sync::Arc::clone(&sent);
        let (handle, server) = fake_session(tmp.path(), move |_, stream| {
            // One line that never ends: the client stops at the cap, not
            // at a newline or at its wait.
            let big = vec![b'x'; 1 << 20];
            let _ = stream.write_all(b"{\"error\":\"");
            while stream.write_all(&big).is_ok() {
                counted.fetch_add(big.len() as u64, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let err = call(&handle, &Request::Stop, Duration::from_secs(600), &mut |_| {}).unwrap_err();
        assert!(matches!(&err, SessionError::Io { error, .. } if error.contains("over")), "{err}");
        server.join().unwrap();
        // Sent until the client hung up: the cap, and what the socket held.
        let sent = sent.load(std::sync::atomic::Ordering::SeqCst);
        assert!((MAX_DOCUMENT - (8 << 20)..MAX_DOCUMENT + (16 << 20)).contains(&sent), "{sent}");
    }

    #[test]
    fn a_reply_read_whole_or_a_byte_at_a_time_comes_to_the_same() {
        let reply = b"{\"type\":\"stdout\",\"data\":\"a\"}\n{\"result\":{\"x\":1}}\n{\"type\":\"late\"}\n";
        let read = |pieces: Vec<&[u8]>| {
            let (mut r, mut events) = (Reply::within(64), Vec::new());
            for p in pieces {
                r.feed(p, &mut |e| events.push(e.to_string()));
            }
            (r.end(&mut |e| events.push(e.to_string())), events)
        };
        let whole = read(vec![&reply[..]]);
        assert_eq!(whole, read(reply.chunks(1).collect()));
        let answer = Answer { result: Some(serde_json::json!({"x": 1})), error: None };
        assert_eq!(whole, (Heard::Answer(answer), vec![r#"{"type":"stdout","data":"a"}"#.to_string()]));
        // Over the cap, ended or not: the answer was too long.
        assert_eq!(read(vec![&[b'x'; 65]]).0, Heard::TooLong);
        assert_eq!(read(vec![b"[1]\n"]).0, Heard::NotAnswer("a line that is not a JSON object".into()));
        assert_eq!(read(vec![b"{\"type\":1}"]).0, Heard::Nothing);
    }

    #[test]
    fn a_refusal_is_typed() {
        let tmp = tempfile::tempdir().unwrap();
        let (handle, server) = fake_session(tmp.path(), |_, stream| {
            stream.write_all(b"{\"result\":null,\"error\":\"16 requests already wait\"}\n").unwrap();
        });
        let err = interrupt(&handle).unwrap_err();
        assert!(matches!(&err, SessionError::Refused { error, .. } if error == "16 requests already wait"), "{err}");
        assert!(!err.is_gone());
        server.join().unwrap();
    }

    #[test]
    fn start_reads_the_handle_or_the_jails_last_line() {
        let tmp = tempfile::tempdir().unwrap();
        let ok = crate::client::run::tests::fake(tmp.path(), r#"echo '{"handle":"/r/ab.sock","pid":42,"id":"ab"}'"#);
        let started = start(&StartSpec::new(ok)).unwrap();
        assert_eq!(started, Started { handle: "/r/ab.sock".into(), pid: 42, id: "ab".into(), jail_pid: None });
        let dir = tempfile::tempdir().unwrap();
        let failed = crate::client::run::tests::fake(
            dir.path(),
            "echo 'jail: warming up' >&2; echo 'jail: no rootfs: build one' >&2; exit 125",
        );
        let err = start(&StartSpec::new(failed)).unwrap_err();
        assert_eq!(err.to_string(), "jail session start failed: no rootfs: build one");
    }
}
