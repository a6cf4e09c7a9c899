//! The session tools' state: `session_start` makes a jail with `jail
//! session start` and returns its id, `session_exec` runs a cell in it
//! (`jail session exec`), `session_stop` ends it (`jail session stop`, which
//! delivers its artifacts). Explicit ids, not one implicit session per
//! connection: an agent may hold several, and a client that restarts a
//! conversation knows which one it ends. Every session still open when the
//! server exits is stopped ([`Sessions::stop_all`]); a session's own lifetime
//! limit ends one whose server was killed.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use jail::result::RunResult;

/// Sessions one server holds at once: each is a live jail.
pub const MAX_SESSIONS: usize = 8;
/// Bytes of a cell's JSON result read back (the policy caps its streams).
const MAX_RESULT_BYTES: u64 = 64 << 20;
const MAX_STDERR_BYTES: u64 = 64 << 10;

/// An open session: its handle, and the folder its staged input lives in
/// (removed when the session is stopped).
struct Open {
    handle: PathBuf,
    _staging: Option<tempfile::TempDir>,
}

pub struct Sessions {
    jail: PathBuf,
    open: Mutex<HashMap<String, Open>>,
}

impl Sessions {
    pub fn new(jail: PathBuf) -> Sessions {
        Sessions { jail, open: Mutex::new(HashMap::new()) }
    }

    fn count(&self) -> usize {
        self.open.lock().map(|o| o.len()).unwrap_or(MAX_SESSIONS)
    }

    /// Start a session with these `jail session start` flags; its id.
    pub async fn start(
        &self,
        flags: Vec<OsString>,
        staging: Option<tempfile::TempDir>,
        limit: Duration,
    ) -> Result<String, String> {
        if self.count() >= MAX_SESSIONS {
            return Err(format!("this server already holds {MAX_SESSIONS} sessions: stop one with session_stop"));
        }
        let mut cmd = tokio::process::Command::new(&self.jail);
        cmd.arg("session").arg("start").arg("--json").args(flags);
        let (out, err, code) = call(cmd, None, limit).await?;
        let started: serde_json::Value = serde_json::from_slice(&out)
            .map_err(|_| format!("the session did not start (exit {code}): {}", String::from_utf8_lossy(&err).trim()))?;
        let (Some(id), Some(handle)) = (started["id"].as_str(), started["handle"].as_str()) else {
            return Err("jail session start printed no id and handle".into());
        };
        let open = Open { handle: PathBuf::from(handle), _staging: staging };
        self.open
            .lock()
            .map_err(|_| "the session table is poisoned".to_string())?
            .insert(id.to_string(), open);
        Ok(id.to_string())
    }

    fn handle(&self, id: &str) -> Result<PathBuf, String> {
        let open = self.open.lock().map_err(|_| "the session table is poisoned".to_string())?;
        open.get(id).map(|o| o.handle.clone()).ok_or_else(|| unknown(id))
    }

    /// Run `code` as the session's next cell.
    pub async fn exec(&self, id: &str, code: &str, limit: Duration) -> Result<RunResult, String> {
        let handle = self.handle(id)?;
        let mut cmd = tokio::process::Command::new(&self.jail);
        cmd.arg("session").arg("exec").arg(&handle).arg("-");
        let (out, err, code) = call(cmd, Some(code.as_bytes()), limit).await?;
        parse(&out, &err, code)
    }

    /// End the session: its closing result (the artifacts delivered).
    pub async fn stop(&self, id: &str, limit: Duration) -> Result<RunResult, String> {
        let open = self.open.lock().map_err(|_| "the session table is poisoned".to_string())?.remove(id);
        let open = open.ok_or_else(|| unknown(id))?;
        let mut cmd = tokio::process::Command::new(&self.jail);
        cmd.arg("session").arg("stop").arg(&open.handle);
        let (out, err, code) = call(cmd, None, limit).await?;
        parse(&out, &err, code)
    }

    /// Stop every open session (the server is exiting).
    pub fn stop_all(&self) {
        let open: Vec<Open> = match self.open.lock() {
            Ok(mut o) => o.drain().map(|(_, v)| v).collect(),
            Err(_) => return,
        };
        for o in open {
            let _ = std::process::Command::new(&self.jail)
                .arg("session")
                .arg("stop")
                .arg(&o.handle)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn unknown(id: &str) -> String {
    format!("no open session `{id}`: start one with session_start (sessions end with session_stop and when the server exits)")
}

/// Run one `jail session …` command: its stdout and stderr (bounded) and exit code.
async fn call(
    mut cmd: tokio::process::Command,
    stdin: Option<&[u8]>,
    limit: Duration,
) -> Result<(Vec<u8>, Vec<u8>, i32), String> {
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("cannot start jail: {e}"))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (input, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let work = async {
        let write = async {
            if let (Some(mut pipe), Some(data)) = (input, stdin) {
                let _ = pipe.write_all(data).await;
            }
        };
        let read = async {
            if let Some(s) = stdout {
                let _ = s.take(MAX_RESULT_BYTES).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr {
                let _ = s.take(MAX_STDERR_BYTES).read_to_end(&mut err).await;
            }
        };
        tokio::join!(write, read, read_err);
        child.wait().await
    };
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(status)) => Ok((out, err, status.code().unwrap_or(-1))),
        Ok(Err(e)) => Err(format!("waiting for jail: {e}")),
        Err(_) => Err(format!("jail session did not answer within {} s", limit.as_secs())),
    }
}

fn parse(out: &[u8], err: &[u8], code: i32) -> Result<RunResult, String> {
    let doc: serde_json::Value = serde_json::from_slice(out)
        .map_err(|_| format!("the session gave no result (exit {code}): {}", String::from_utf8_lossy(err).trim()))?;
    jail::schema::check_version(&doc).map_err(|e| e.to_string())?;
    serde_json::from_value(doc).map_err(|e| format!("the session's result does not match this server's contract: {e}"))
}
