//! `/v1/sessions`: one jail, one interpreter, many cells (`jail session
//! start|exec|stop`). Each session's supervisor is a process of its own;
//! its handle lives in the session's private folder (XDG_RUNTIME_DIR), so
//! the janitor can stop it should the server die.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::io::AsyncReadExt;

use crate::api::{parse, ApiError, ExecRequest, RunReply, SessionReply, SessionRequest};
use crate::config::Tenant;
use crate::runs::{checked_limits, read_body};
use crate::state::{make_private_dir, new_id, Shared};

/// Bytes of a session command's output read at most.
const MAX_REPLY_BYTES: u64 = 64 << 20;

pub struct Session {
    pub dir: PathBuf,
    /// `None` while `jail session start` runs (the place is reserved).
    handle: Option<String>,
    /// One cell at a time.
    busy: tokio::sync::Mutex<u64>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // A reservation's folder belongs to the start that made it.
        if self.handle.is_some() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Run `jail ARGS` with the session's environment; its stdout, bounded.
async fn jail(state: &Shared, dir: &Path, args: &[&std::ffi::OsStr]) -> Result<Vec<u8>, ApiError> {
    let mut cmd = std::process::Command::new(&state.jail);
    cmd.args(args).env("XDG_RUNTIME_DIR", dir).env("TMPDIR", dir);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    jail::sys::set_parent_death_signal(&mut cmd, nix::sys::signal::Signal::SIGTERM);
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(|e| ApiError::failed(format!("cannot start {}: {e}", state.jail.display())))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let read = async {
        if let Some(s) = stdout {
            let _ = s.take(MAX_REPLY_BYTES).read_to_end(&mut out).await;
        }
    };
    let read_err = async {
        if let Some(s) = stderr {
            let _ = s.take(64 << 10).read_to_end(&mut err).await;
        }
    };
    tokio::join!(read, read_err);
    let status = child.wait().await.map_err(|e| ApiError::failed(format!("waiting for jail: {e}")))?;
    if out.is_empty() {
        return Err(ApiError::failed(format!(
            "jail {} printed nothing (exit {status}): {}",
            args.first().map(|a| a.to_string_lossy()).unwrap_or_default(),
            String::from_utf8_lossy(&err).trim()
        )));
    }
    Ok(out)
}

fn json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::failed(format!("jail printed no JSON: {e}")))
}

fn reply<T: serde::Serialize>(state: &Shared, r: Result<(StatusCode, T), ApiError>) -> Response {
    match r {
        Ok((code, body)) => (code, Json(body)).into_response(),
        Err(e) => {
            state.metrics.rejected(e.code);
            e.into_response()
        }
    }
}

#[utoipa::path(post, path = "/v1/sessions", request_body = SessionRequest,
    responses((status = 201, body = SessionReply), (status = 400, body = crate::api::ErrorBody),
              (status = 429, body = crate::api::ErrorBody), (status = 503, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let r = start(&state, &headers, body).await;
    reply(&state, r)
}

async fn start(state: &Shared, headers: &HeaderMap, body: Body) -> Result<(StatusCode, SessionReply), ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let body = read_body(body, tenant.max_bytes_in.min(state.max_body)).await?;
    let req: SessionRequest = if body.is_empty() { SessionRequest::default() } else { parse(&body)? };
    let (timeout, memory) = checked_limits(&req.limits, &tenant)?;
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::draining());
    }
    let id = new_id()?;
    let dir = reserve(state, &tenant, &id)?;
    let mut args: Vec<std::ffi::OsString> = vec!["session".into(), "start".into(), "--json".into()];
    args.extend(state.session_flags.iter().cloned());
    args.extend(["--timeout".into(), timeout.as_secs_f64().to_string().into()]);
    args.extend(["--memory".into(), format!("{memory}M").into()]);
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let started = jail(state, &dir, &refs).await.and_then(|o| json(&o));
    let handle = started.as_ref().ok().and_then(|v| v.get("handle")).and_then(|h| h.as_str()).map(str::to_owned);
    let mut h = state.holdings.lock().map_err(|_| ApiError::failed("state lock poisoned"))?;
    let mine = h.entry(tenant.name.clone()).or_default();
    let Some(handle) = handle else {
        mine.sessions.remove(&id);
        let _ = std::fs::remove_dir_all(&dir);
        return Err(started.err().unwrap_or_else(|| ApiError::failed("jail session start gave no handle")));
    };
    let session = Arc::new(Session { dir, handle: Some(handle), busy: tokio::sync::Mutex::new(0) });
    mine.sessions.insert(id.clone(), session);
    Ok((StatusCode::CREATED, SessionReply { id }))
}

/// Count the session against the tenant's quota before it starts (a
/// placeholder entry that the start replaces), so two requests racing for
/// the last place cannot both have it.
fn reserve(state: &Shared, tenant: &Tenant, id: &str) -> Result<PathBuf, ApiError> {
    // 64 of the id's 128 bits name the folder: the socket path stays short.
    let dir = state.sessions.join(&id[..16]);
    let mut h = state.holdings.lock().map_err(|_| ApiError::failed("state lock poisoned"))?;
    let mine = h.entry(tenant.name.clone()).or_default();
    if mine.sessions.len() >= tenant.max_sessions {
        return Err(ApiError::busy(format!(
            "this token has {} sessions open, its most: end one (DELETE /v1/sessions/ID)",
            tenant.max_sessions
        )));
    }
    make_private_dir(&dir)?;
    let placeholder = Session { dir: dir.clone(), handle: None, busy: tokio::sync::Mutex::new(0) };
    mine.sessions.insert(id.into(), Arc::new(placeholder));
    Ok(dir)
}

fn find(state: &Shared, headers: &HeaderMap, id: &str) -> Result<Arc<Session>, ApiError> {
    let tenant = state.tenant(headers)?;
    let h = state.holdings.lock().map_err(|_| ApiError::failed("state lock poisoned"))?;
    h.get(&tenant.name)
        .and_then(|t| t.sessions.get(id))
        .filter(|s| s.handle.is_some())
        .cloned()
        .ok_or_else(|| ApiError::not_found("session"))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/exec", request_body = ExecRequest, params(("id" = String, Path)),
    responses((status = 200, body = RunReply), (status = 400, body = crate::api::ErrorBody),
              (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>, body: Body) -> Response {
    let r = exec_cell(&state, &headers, &id, body).await;
    reply(&state, r)
}

async fn exec_cell(state: &Shared, headers: &HeaderMap, id: &str, body: Body) -> Result<(StatusCode, RunReply), ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let session = find(state, headers, id)?;
    let body = read_body(body, tenant.max_bytes_in.min(state.max_body)).await?;
    let req: ExecRequest = parse(&body)?;
    if req.code.trim().is_empty() {
        return Err(ApiError::field("code", "`code` is empty: send the cell's Python source"));
    }
    let mut n = session.busy.lock().await;
    *n += 1;
    let cell = session.dir.join(format!("cell-{n}.py"));
    std::fs::write(&cell, &req.code).map_err(|e| ApiError::failed(format!("write {}: {e}", cell.display())))?;
    let handle = session.handle.as_deref().unwrap_or_default();
    let out = jail(state, &session.dir, &["session".as_ref(), "exec".as_ref(), handle.as_ref(), cell.as_os_str()]).await;
    let _ = std::fs::remove_file(&cell);
    let result = json(&out?)?;
    Ok((StatusCode::OK, RunReply::done(id, result)))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", params(("id" = String, Path)),
    responses((status = 200, body = RunReply), (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>) -> Response {
    let r = stop(&state, &headers, &id).await;
    reply(&state, r)
}

async fn stop(state: &Shared, headers: &HeaderMap, id: &str) -> Result<(StatusCode, RunReply), ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let session = find(state, headers, id)?;
    let _busy = session.busy.lock().await;
    let handle = session.handle.as_deref().unwrap_or_default();
    let out = jail(state, &session.dir, &["session".as_ref(), "stop".as_ref(), handle.as_ref()]).await;
    if let Ok(mut h) = state.holdings.lock() {
        if let Some(t) = h.get_mut(&tenant.name) {
            t.sessions.remove(id);
        }
    }
    let result = json(&out?)?;
    Ok((StatusCode::OK, RunReply::done(id, result)))
}

/// Stop every open session (the drain's last step).
pub async fn stop_all(state: &Shared) {
    let all: Vec<Arc<Session>> = match state.holdings.lock() {
        Ok(mut h) => h.values_mut().flat_map(|t| t.sessions.drain().map(|(_, s)| s)).collect(),
        Err(_) => return,
    };
    for s in &all {
        if let Some(handle) = &s.handle {
            let _ = jail(state, &s.dir, &["session".as_ref(), "stop".as_ref(), handle.as_ref()]).await;
        }
    }
}
