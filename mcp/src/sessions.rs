//! The session tools' state: `session_start` makes a jail (`jail session
//! start`, through jail::client) and returns its id, `session_exec` runs a
//! cell in it, `session_stop` ends it (which delivers its artifacts); the
//! files tools write, read and list its `/workspace/output` (files.rs). A
//! cell, a stop and a file request are each one round trip on the
//! session's socket, on a blocking thread, with the client's deadline (a
//! cell's wall-clock limit plus its graces; the session's own bound for a
//! file request, which is served while a cell runs too). Explicit ids, not one implicit session per
//! connection: an agent may hold several, and a client that restarts a
//! conversation knows which one it ends. Every session still open when the
//! server exits is stopped ([`Sessions::stop_all`]); a session's own
//! lifetime limit ends one whose server was killed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use jail::client::command::{Flags, StartSpec};
use jail::client::session::{self, FileAnswer, SessionError, StartError};
use jail::result::RunResult;

/// Sessions one server holds at once: each is a live jail.
pub const MAX_SESSIONS: usize = 8;

/// An open session: its handle, each cell's wall-clock limit, and the
/// folder its staged input lives in (removed when the session is stopped).
struct Open {
    handle: PathBuf,
    wall: Duration,
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

    /// Start a session with these flags (each cell's wall-clock limit is
    /// `wall`) and this input folder; its id.
    pub async fn start(
        &self,
        mut flags: Flags,
        input: Option<PathBuf>,
        staging: Option<tempfile::TempDir>,
        wall: Duration,
        env: jail::envs::Envs,
    ) -> Result<String, String> {
        if self.count() >= MAX_SESSIONS {
            return Err(format!("this server already holds {MAX_SESSIONS} sessions: stop one with session_stop"));
        }
        flags.limits.timeout = Some(wall);
        let spec = StartSpec { flags, input, envs: env, ..StartSpec::new(&self.jail) };
        let started = blocking(move || session::start(&spec)).await?.map_err(|e| match e {
            StartError::Failed { line, .. } => format!("the session did not start: {line}"),
            e => e.to_string(),
        })?;
        let open = Open { handle: started.handle, wall, _staging: staging };
        self.open
            .lock()
            .map_err(|_| "the session table is poisoned".to_string())?
            .insert(started.id.clone(), open);
        Ok(started.id)
    }

    fn handle(&self, id: &str) -> Result<(PathBuf, Duration), String> {
        let open = self.open.lock().map_err(|_| "the session table is poisoned".to_string())?;
        open.get(id).map(|o| (o.handle.clone(), o.wall)).ok_or_else(|| unknown(id))
    }

    /// Run `code` as the session's next cell.
    pub async fn exec(&self, id: &str, code: &str, env: jail::envs::Envs) -> Result<RunResult, String> {
        let (handle, wall) = self.handle(id)?;
        let code = code.to_string();
        blocking(move || session::exec(&handle, session::Cell::new(code, Some(wall)).with_env(env)))
            .await?
            .map_err(said)
    }

    /// One files API request (`session::put_file`, `get_file` or
    /// `list_files`, as `call`) on the session's handle: its answer, a
    /// refusal among them (files.rs says each in this server's terms).
    pub async fn file(
        &self,
        id: &str,
        call: impl FnOnce(&Path) -> Result<FileAnswer, SessionError> + Send + 'static,
    ) -> Result<FileAnswer, String> {
        let (handle, _) = self.handle(id)?;
        blocking(move || call(&handle)).await?.map_err(said)
    }

    /// End the session: its closing result (the artifacts delivered).
    pub async fn stop(&self, id: &str) -> Result<RunResult, String> {
        let open = self.open.lock().map_err(|_| "the session table is poisoned".to_string())?.remove(id);
        let open = open.ok_or_else(|| unknown(id))?;
        let handle = open.handle.clone();
        let closing = blocking(move || session::stop(&handle)).await?.map_err(said);
        // The staged input goes once the session is over.
        drop(open);
        closing
    }

    /// Stop every open session (the server is exiting).
    pub fn stop_all(&self) {
        let open: Vec<Open> = match self.open.lock() {
            Ok(mut o) => o.drain().map(|(_, v)| v).collect(),
            Err(_) => return,
        };
        for o in open {
            let _ = session::stop_value(&o.handle);
        }
    }
}

/// A session client's error in this server's terms, naming no socket path.
fn said(e: SessionError) -> String {
    match e {
        SessionError::Ended { detail, .. } => {
            format!("the session ended ({detail}): its variables are gone; start a new one with session_start")
        }
        SessionError::Unknown { .. } => "the session's jail is gone: start a new one with session_start".to_string(),
        e => e.to_string(),
    }
}

/// `work` on a blocking thread (a socket round trip, or `jail session
/// start`): the caller's task is not held.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(work).await.map_err(|e| format!("the session call failed: {e}"))
}

fn unknown(id: &str) -> String {
    format!("no open session `{id}`: start one with session_start (sessions end with session_stop and when the server exits)")
}
