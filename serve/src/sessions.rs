//! `/v1/sessions`: one jail, one interpreter, many cells (a `jail
//! session`, through jail::client: a cell or a stop is one round trip on
//! the session's socket, on a blocking thread). A session's input
//! (`files`, `input_tar`) is planned and staged as a run's (input.rs) in
//! the session's own folder. Its jail comes from the warm pool when the
//! pool's jails fit its limits (`{"op": "session"}`: a jail made ahead,
//! its preload imported, the input copied in, each cell's wall time
//! lowered to the session's as it is sent), else from a `jail session
//! start` of its own (and always when the pool's policy binds each jail's
//! output folder, which it says once). Each session's supervisor is a process of its own; its
//! handle lives in a private folder (XDG_RUNTIME_DIR), so the janitor can
//! stop it should the server die. A session ended by `DELETE` is kept, its
//! closing result and folder, so its accepted artifacts can be fetched.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use jail::client::command::StartSpec;
use jail::client::session::{self, SessionError, StartError};

use crate::api::{parse, ApiError, ExecRequest, RunReply, SessionReply, SessionRequest};
use crate::config::Tenant;
use crate::pool::SessionRefused;
use crate::runs::{check_files, checked_limits, plan_input, read_body, stage_input};
use crate::served::{Ended, Served};
use crate::state::{make_private_dir, new_id, Shared};
use crate::{artifacts, input, route};

/// `work` (a round trip on a session's socket, or `jail session start`)
/// on a blocking thread: the caller's task is not held meanwhile.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::failed(format!("a session call failed: {e}")))
}

/// A session call's failure in the tenant's terms, naming no host path:
/// a session that ended is 410 `session_ended`; anything else is ours.
fn session_error(state: &Shared, dir: &Path, e: SessionError) -> ApiError {
    let view = state.view_of_session(dir);
    match e {
        SessionError::Ended { detail, .. } => ApiError::new(
            StatusCode::GONE,
            "session_ended",
            view.text(&format!("this session ended ({detail}): start a new one (POST /v1/sessions)")),
        ),
        SessionError::Unknown { .. } => {
            ApiError::new(StatusCode::GONE, "session_ended", "this session's jail is gone: start a new one (POST /v1/sessions)")
        }
        e => {
            eprintln!("jail serve: {e}");
            ApiError::failed(view.text(&format!("the session's jail failed: {e}")))
        }
    }
}

/// A result as the service passes it on.
fn document(result: &jail::result::RunResult) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(result).map_err(|e| ApiError::failed(format!("the session's result: {e}")))
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
              (status = 413, body = crate::api::ErrorBody), (status = 429, body = crate::api::ErrorBody),
              (status = 503, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let r = start(&state, &headers, body).await;
    reply(&state, r)
}

async fn start(state: &Shared, headers: &HeaderMap, body: Body) -> Result<(StatusCode, SessionReply), ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let bytes_in = tenant.max_bytes_in.min(state.max_body);
    let body = read_body(state, &tenant, body, bytes_in).await?;
    let mut req: SessionRequest = if body.is_empty() { SessionRequest::default() } else { parse(&body)? };
    drop(body);
    check_files(&req.files)?;
    let (timeout, memory) = checked_limits(&req.limits, &tenant)?;
    let plan = plan_input(&mut req.files, req.input_tar.take(), bytes_in, input::MAX_TIME).await?;
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::draining());
    }
    let id = new_id()?;
    let dir = reserve(state, &tenant, &id)?;
    let opened = open(state, &id, &dir, plan, (timeout, memory), std::mem::take(&mut req.env)).await;
    let mut h = state.holdings.lock().map_err(|_| ApiError::failed("state lock poisoned"))?;
    let mine = h.entry(tenant.name.clone()).or_default();
    let (handle, backend) = match opened {
        Ok(o) => o,
        Err(e) => {
            mine.sessions.remove(&id);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let session = Arc::new(Served {
        dir,
        handle: Some(handle),
        cell_timeout: timeout,
        busy: tokio::sync::Mutex::new(0),
    });
    mine.sessions.insert(id.clone(), session);
    Ok((StatusCode::CREATED, SessionReply { id, backend: backend.into() }))
}

/// Stage the input in `dir/input`, then start the session's jail: from the
/// pool when its jails fit, else `jail session start`. Its handle and
/// where it came from.
async fn open(
    state: &Shared,
    id: &str,
    dir: &Path,
    plan: input::Plan,
    (timeout, memory): (Duration, u64),
    env: jail::envs::Envs,
) -> Result<(String, &'static str), ApiError> {
    let entries = plan.items.len();
    let input = stage_input(dir, plan, std::time::Instant::now() + input::MAX_TIME).await?;
    if let Some(link) = pool_for(state, timeout, memory, entries) {
        // Its output folder: made by the pool, beneath the session's.
        match link.session(&format!("session-{id}"), input.as_deref(), &dir.join("output"), &env).await {
            Ok(handle) => return Ok((handle, "pool")),
            Err(SessionRefused::Never) => {
                eprintln!("jail serve: the warm pool's policy binds each jail's output folder: sessions start on their own")
            }
            Err(SessionRefused::Failed(why)) => {
                eprintln!("jail serve: session {id}: {why}: starting it with jail session start")
            }
        }
    }
    // Run in the session's folder, its paths given relative to it, so no
    // command line (which every local user may read in /proc) names them.
    // No --output: `jail session start` makes a fresh one in TMPDIR, the
    // session's folder, in the mode the policy's output needs; its handle
    // goes in XDG_RUNTIME_DIR, the session's folder too.
    let mut spec = StartSpec {
        more: state.session_flags.clone(),
        input: input.map(|i| i.strip_prefix(dir).map(Path::to_path_buf).unwrap_or(i)),
        dir: Some(dir.to_path_buf()),
        env: vec![("XDG_RUNTIME_DIR".into(), dir.into()), ("TMPDIR".into(), dir.into())],
        parent_death: Some(nix::sys::signal::Signal::SIGTERM),
        envs: env,
        ..StartSpec::new(&state.jail)
    };
    spec.flags.limits.timeout = Some(timeout);
    spec.flags.limits.memory = Some(format!("{memory}M"));
    let started = blocking(move || session::start(&spec)).await?.map_err(|e| {
        eprintln!("jail serve: session {id}: {e}");
        let said = match e {
            StartError::Failed { line, .. } => format!("the session's jail did not start: {line}"),
            e => format!("the service could not start a session: {e}"),
        };
        ApiError::failed(state.view_of_session(dir).text(&said))
    })?;
    Ok((started.handle.to_string_lossy().into_owned(), "spawn"))
}

/// The pool's link when a session of these limits can come from it: the
/// pool is up and takes sessions, its jails have this memory, and its
/// wall time is at least the session's cells' (each cell lowers it).
fn pool_for(state: &Shared, timeout: Duration, memory: u64, input_entries: usize) -> Option<Arc<crate::pool::Link>> {
    let pool = state.pool.as_ref()?;
    let link = pool.link().filter(|l| l.takes_sessions())?;
    let shape = route::Shape { memory_mib: memory, timeout, followed: false, input_entries };
    match route::choose(&shape, route::PoolState::Up(pool.shape(&link))) {
        route::Choice::Pool => Some(link),
        route::Choice::Spawn(_) => None,
    }
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
    let placeholder = Served {
        dir: dir.clone(),
        handle: None,
        cell_timeout: Duration::ZERO,
        busy: tokio::sync::Mutex::new(0),
    };
    mine.sessions.insert(id.into(), Arc::new(placeholder));
    Ok(dir)
}

fn find(state: &Shared, headers: &HeaderMap, id: &str) -> Result<Arc<Served>, ApiError> {
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
              (status = 404, body = crate::api::ErrorBody),
              (status = 410, description = "`session_ended`: the session ended by itself", body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>, body: Body) -> Response {
    let r = exec_cell(&state, &headers, &id, body).await;
    reply(&state, r)
}

async fn exec_cell(state: &Shared, headers: &HeaderMap, id: &str, body: Body) -> Result<(StatusCode, RunReply), ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let session = find(state, headers, id)?;
    let body = read_body(state, &tenant, body, tenant.max_bytes_in.min(state.max_body)).await?;
    let req: ExecRequest = parse(&body)?;
    if req.code.trim().is_empty() {
        return Err(ApiError::field("code", "`code` is empty: send the cell's Python source"));
    }
    let mut n = session.busy.lock().await;
    *n += 1;
    let handle = PathBuf::from(session.handle.as_deref().unwrap_or_default());
    let wall = session.cell_timeout;
    // The cell's code goes on the session's socket: it is in no file and
    // on no command line.
    let cell = blocking(move || session::exec(&handle, session::Cell::new(req.code, Some(wall)).with_env(req.env))).await?;
    let mut result = document(&cell.map_err(|e| session_error(state, &session.dir, e))?)?;
    state.view_of_session(&session.dir).result(&mut result);
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
    let handle = PathBuf::from(session.handle.as_deref().unwrap_or_default());
    let out = blocking(move || session::stop(&handle)).await;
    if let Ok(mut h) = state.holdings.lock() {
        if let Some(t) = h.get_mut(&tenant.name) {
            t.sessions.remove(id);
        }
    }
    let result = document(&out?.map_err(|e| session_error(state, &session.dir, e))?)?;
    // Kept, folder and all, for its artifacts (the oldest goes); the
    // tenant sees it without the host's paths.
    let mut shown = result.clone();
    state.view_of_session(&session.dir).result(&mut shown);
    let ended = Ended { session: Arc::clone(&session), closing: result };
    state.keep_ended(&tenant, id, Arc::new(ended));
    Ok((StatusCode::OK, RunReply::done(id, shown)))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/artifacts/{path}", params(("id" = String, Path), ("path" = String, Path)),
    description = "An accepted artifact of a session ended by `DELETE /v1/sessions/{id}`: only a path its closing result \
lists, read without following a link. The service keeps a token's last 64 ended sessions.",
    responses((status = 200, description = "the artifact's bytes"), (status = 404, body = crate::api::ErrorBody),
        (status = 409, description = "`changed`: the file no longer has the listed size and sha256", body = crate::api::ErrorBody),
        (status = 429, description = "`busy`: artifact replies in flight hold the read budget", body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn artifact(
    State(state): State<Shared>,
    headers: HeaderMap,
    UrlPath((id, path)): UrlPath<(String, String)>,
) -> Response {
    let tenant = match state.tenant(&headers) {
        Ok(t) => t.clone(),
        Err(e) => return e.into_response(),
    };
    let (owned, who) = (Arc::clone(&state), tenant.clone());
    artifacts::respond(&state, &tenant, move || {
        let ended = owned.ended_session(&who, &id)?;
        artifacts::listed(&ended.closing, &ended.session.dir, &path)
    })
    .await
}

/// Stop every open session (the drain's last step).
pub async fn stop_all(state: &Shared) {
    let all: Vec<Arc<Served>> = match state.holdings.lock() {
        Ok(mut h) => h.values_mut().flat_map(|t| t.sessions.drain().map(|(_, s)| s)).collect(),
        Err(_) => return,
    };
    for s in &all {
        if let Some(handle) = s.handle.clone().map(PathBuf::from) {
            let _ = blocking(move || session::stop_value(&handle)).await;
        }
    }
}
