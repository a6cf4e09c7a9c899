//! A session's handle: a unix socket in a 0700 folder of the caller's,
//! usable only by the caller (the socket is 0600 and the server checks
//! SO_PEERCRED), and the one-line protocol a `jail session exec|stop`
//! speaks over it: one request line, one answer line (before it, with an
//! exec's `events`, the cell's event lines: each has a `type`, the answer
//! has none).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The largest cell a client may send.
pub const MAX_CELL: usize = 8 << 20;
/// The largest reply a client reads (a result with its capped streams).
const MAX_ANSWER: u64 = crate::client::bounds::MAX_DOCUMENT;

#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    #[error("create the session folder {0}")]
    CreateDir(PathBuf, #[source] io::Error),
    #[error(
        "the session folder {0} is not a private folder of uid {1} (a symlink, another owner, or open to others): \
         remove it, or set XDG_RUNTIME_DIR to a folder of your own"
    )]
    NotPrivate(PathBuf, u32),
    #[error("bind the session socket {0}")]
    Bind(PathBuf, #[source] io::Error),
    #[error("read random bytes for the session id")]
    Random(#[source] io::Error),
}

/// Where a caller's sessions live: `$XDG_RUNTIME_DIR/jail/sessions` when
/// the caller has one (cli/session.rs reads the variable), else
/// `/tmp/jail-$UID/sessions`; every folder made 0700 and the last two
/// checked to be the caller's own, real folders.
pub fn session_dir(runtime_dir: Option<&Path>, uid: u32) -> Result<PathBuf, HandleError> {
    let base = match runtime_dir.filter(|d| d.is_absolute() && d.is_dir()) {
        Some(d) => d.join("jail"),
        None => PathBuf::from(format!("/tmp/jail-{uid}")),
    };
    let dir = base.join("sessions");
    for d in [&base, &dir] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(HandleError::CreateDir(d.clone(), e)),
        }
        // In a shared /tmp anyone may have made it first: it must be ours,
        // a real folder and closed to others, or we would hand them our
        // sockets.
        let meta = std::fs::symlink_metadata(d).map_err(|e| HandleError::CreateDir(d.clone(), e))?;
        if !meta.file_type().is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
            return Err(HandleError::NotPrivate(d.clone(), uid));
        }
    }
    Ok(dir)
}

/// 16 hex digits from the kernel's random source.
pub fn new_id() -> Result<String, HandleError> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(HandleError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The socket of session `id` in `dir`, and the file its end is noted in.
pub fn paths(dir: &Path, id: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{id}.sock")), dir.join(format!("{id}.ended")))
}

/// The tombstone beside a handle: `X.sock` → `X.ended`.
pub fn tombstone_of(handle: &Path) -> Option<PathBuf> {
    let name = handle.file_name()?.to_str()?.strip_suffix(".sock")?;
    Some(handle.with_file_name(format!("{name}.ended")))
}

/// What an ended session leaves beside its handle (`X.ended`, 0600, in
/// the caller's 0700 session folder): why it ended, and its closing
/// result when it got as far as one (a killed supervisor's janitor has
/// none). An `exec` gets the why; a `stop` the closing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tombstone {
    pub why: String,
    #[serde(default)]
    pub closing: Option<serde_json::Value>,
}

impl Tombstone {
    /// The tombstone beside `handle`, if the session left one: bounded in
    /// bytes (a closing is a result, capped as an answer is).
    pub fn read(handle: &Path) -> Option<Tombstone> {
        let mut text = Vec::new();
        std::fs::File::open(tombstone_of(handle)?).ok()?.take(MAX_ANSWER).read_to_end(&mut text).ok()?;
        // An older jail's tombstone is its one line of why.
        serde_json::from_slice(&text)
            .ok()
            .or_else(|| Some(Tombstone { why: String::from_utf8_lossy(&text).trim().to_string(), closing: None }))
    }
}

/// Bind the session's socket, 0600, non-blocking (the serve loop polls it).
pub fn bind(path: &Path) -> Result<UnixListener, HandleError> {
    let listener = UnixListener::bind(path).map_err(|e| HandleError::Bind(path.to_path_buf(), e))?;
    // The folder is 0700 already; the socket's own mode is the second wall.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| listener.set_nonblocking(true))
        .map_err(|e| HandleError::Bind(path.to_path_buf(), e))?;
    Ok(listener)
}

/// The uid of the process at the other end (SO_PEERCRED).
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok(cred.uid())
}

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
}

/// The session's answer: a result document, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Answer {
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    #[serde(default)]
    pub error: Option<String>,
}

/// Read one request line from a client, bounded in bytes and time.
pub fn read_request(stream: &UnixStream) -> Result<Request, String> {
    read_request_within(stream, Duration::from_secs(10))
}

/// [`read_request`] waiting at most `wait` for each read (the serve loop
/// reads a request while a cell runs within a short one: it must not hold
/// the cell's pipes and clocks for long).
pub fn read_request_within(stream: &UnixStream, wait: Duration) -> Result<Request, String> {
    let _ = stream.set_read_timeout(Some(wait));
    let mut line = Vec::new();
    let mut reader = BufReader::new(stream.take(MAX_CELL as u64 * 2 + 1024));
    reader.read_until(b'\n', &mut line).map_err(|e| format!("read the request: {e}"))?;
    if !line.ends_with(b"\n") {
        return Err(format!("the request is not one line of at most {} bytes", MAX_CELL * 2 + 1024));
    }
    let req: Request = serde_json::from_slice(&line).map_err(|e| format!("the request is not valid: {e}"))?;
    match &req {
        Request::Exec { code, .. } if code.len() > MAX_CELL => Err(format!("the cell is {} bytes, over {MAX_CELL}", code.len())),
        _ => Ok(req),
    }
}

/// Send one answer line; a client that went away loses it.
pub fn answer(mut stream: &UnixStream, answer: &Answer) {
    let mut line = serde_json::to_vec(answer).unwrap_or_default();
    line.push(b'\n');
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let _ = stream.write_all(&line);
}

/// Refuse a client: the answer, then its request read and dropped (a
/// unix socket closed with unread bytes resets the connection, and the
/// client would lose the answer), bounded in bytes and time.
pub fn refuse(stream: &UnixStream, error: String) {
    answer(stream, &Answer { result: None, error: Some(error) });
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = io::copy(&mut stream.take(MAX_CELL as u64 * 2 + 1024), &mut io::sink());
}

/// What a client could not do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("session {0} ended ({1}): start a new one with `jail session start`")]
    Ended(String, String),
    #[error("no session at {0} (wrong handle, or it ended): start one with `jail session start`")]
    Unknown(String),
    #[error("talk to session {0}: {1}")]
    Io(String, String),
    #[error("session {0} refused: {1}")]
    Refused(String, String),
}

/// Ask the session at `handle`; wait for its answer.
pub fn call(handle: &Path, request: &Request) -> Result<serde_json::Value, ClientError> {
    call_live(handle, request, &mut |_| {})
}

/// Ask the session at `handle`; hand each event line that comes before
/// the answer to `on_event` as it was written (one JSON object, without
/// its newline: an exec with `events`), then return the answer. A line
/// with a `type` is an event; the answer has none.
pub fn call_live(handle: &Path, request: &Request, on_event: &mut dyn FnMut(&str)) -> Result<serde_json::Value, ClientError> {
    let shown = handle.display().to_string();
    // The session is gone: a `stop` gets the closing it left, anything
    // else why it ended.
    let ended = || -> Option<Result<serde_json::Value, ClientError>> {
        let stone = Tombstone::read(handle)?;
        Some(match (request, stone.closing) {
            (Request::Stop, Some(closing)) => Ok(closing),
            _ => Err(ClientError::Ended(shown.clone(), stone.why.trim().chars().take(500).collect())),
        })
    };
    let is_socket = std::fs::symlink_metadata(handle).is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return ended().unwrap_or_else(|| Err(ClientError::Unknown(shown.clone())));
    }
    let mut stream = match UnixStream::connect(handle) {
        Ok(s) => s,
        Err(_) => return ended().unwrap_or_else(|| Err(ClientError::Unknown(shown.clone()))),
    };
    let mut line = serde_json::to_vec(request).map_err(|e| ClientError::Io(shown.clone(), e.to_string()))?;
    line.push(b'\n');
    // A session that ends while it holds our request (it was judging its
    // output, say) resets the connection or closes it: its tombstone is
    // there by then.
    let gone = |e: String| ended().unwrap_or_else(|| Err(ClientError::Io(shown.clone(), e)));
    if let Err(e) = stream.write_all(&line) {
        return gone(e.to_string());
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reader = BufReader::new(&stream);
    let mut text = Vec::new();
    loop {
        text.clear();
        // Each line bounded: an event is one chunk, the answer a result.
        if let Err(e) = (&mut reader).take(MAX_ANSWER).read_until(b'\n', &mut text) {
            return gone(e.to_string());
        }
        if text.is_empty() {
            return gone("the session closed without an answer".into());
        }
        let value: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| ClientError::Io(shown.clone(), e.to_string()))?;
        if value.get("type").is_some() {
            on_event(String::from_utf8_lossy(&text).trim_end());
            continue;
        }
        let answer: Answer = serde_json::from_value(value).map_err(|e| ClientError::Io(shown.clone(), e.to_string()))?;
        return match (answer.result, answer.error) {
            (Some(result), _) => Ok(result),
            (None, Some(e)) => Err(ClientError::Refused(shown, e)),
            (None, None) => Err(ClientError::Io(shown, "an empty answer".into())),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_folder_someone_else_made_is_refused() {
        let tmp = std::env::temp_dir().join(format!("jail-handle-test-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("jail")).unwrap();
        std::fs::set_permissions(tmp.join("jail"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let me = nix::unistd::getuid().as_raw();
        let err = session_dir(Some(&tmp), me).unwrap_err();
        assert!(matches!(err, HandleError::NotPrivate(..)), "{err}");
        std::fs::set_permissions(tmp.join("jail"), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(session_dir(Some(&tmp), me).unwrap(), tmp.join("jail/sessions"));
        let err = session_dir(Some(&tmp), me + 1).unwrap_err();
        assert!(matches!(err, HandleError::NotPrivate(..)), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn requests_are_one_tagged_line() {
        let r: Request = serde_json::from_str(r#"{"op":"exec","code":"x=1"}"#).unwrap();
        assert_eq!(r, Request::Exec { code: "x=1".into(), wall_secs: None, events: false });
        let r: Request = serde_json::from_str(r#"{"op":"exec","code":"x=1","events":true}"#).unwrap();
        assert_eq!(r, Request::Exec { code: "x=1".into(), wall_secs: None, events: true });
        // Without events the line is as it was: an older supervisor reads it.
        let line = serde_json::to_string(&Request::Exec { code: "x".into(), wall_secs: None, events: false }).unwrap();
        assert_eq!(line, r#"{"op":"exec","code":"x"}"#);
        assert!(serde_json::from_str::<Request>(r#"{"op":"exec","code":"x","more":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"shell"}"#).is_err());
    }

    #[test]
    fn a_tombstone_sits_beside_its_socket() {
        assert_eq!(tombstone_of(Path::new("/r/ab.sock")), Some(PathBuf::from("/r/ab.ended")));
        assert_eq!(tombstone_of(Path::new("/r/ab")), None);
    }

    #[test]
    fn an_ended_session_gives_stop_its_closing_and_exec_its_why() {
        let tmp = tempfile::tempdir().unwrap();
        let handle = tmp.path().join("ab.sock");
        let stone = Tombstone { why: "no cell for 1s".into(), closing: Some(serde_json::json!({"status": "ok"})) };
        std::fs::write(tmp.path().join("ab.ended"), serde_json::to_vec(&stone).unwrap()).unwrap();
        assert_eq!(call(&handle, &Request::Stop).unwrap(), serde_json::json!({"status": "ok"}));
        let exec = Request::Exec { code: "1".into(), wall_secs: None, events: false };
        assert!(matches!(call(&handle, &exec), Err(ClientError::Ended(_, why)) if why == "no cell for 1s"));
        // A killed supervisor's janitor leaves no closing; an older jail's
        // tombstone is its line of why: `stop` says the session ended.
        for text in [
            r#"{"why": "the session supervisor was killed"}"#,
            "the session supervisor was killed\n",
        ] {
            std::fs::write(tmp.path().join("ab.ended"), text).unwrap();
            let err = call(&handle, &Request::Stop).unwrap_err();
            assert!(matches!(&err, ClientError::Ended(_, why) if why == "the session supervisor was killed"), "{err}");
        }
    }
}
