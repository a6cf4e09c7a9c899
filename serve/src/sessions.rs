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
//!
//! While a session lives, its files API (`PUT`/`GET
//! /v1/sessions/{id}/files/{path}`, `GET /v1/sessions/{id}/files`) puts a
//! file into its `/workspace/output`, gets one back judged as an artifact
//! is, or lists a folder: each one round trip of jail::client's
//! `put_file`, `get_file` or `list_files` on the session's socket (the
//! session checks every path and serves it while a cell runs, so no cell's
//! turn is waited for), the same for a pooled session and a spawned one.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use jail::client::command::StartSpec;
use jail::client::session::{self, FileAnswer, FileRefusal, SessionError, StartError};

use crate::api::{
    parse, ApiError, ExecRequest, FileListed, FileListing, FileQuery, FileWritten, RunReply, SessionReply, SessionRequest,
};
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

/// The live session `id` of this token and its handle.
fn find_handle(state: &Shared, headers: &HeaderMap, id: &str) -> Result<(Arc<Served>, PathBuf), ApiError> {
    let session = find(state, headers, id)?;
    let handle = PathBuf::from(session.handle.as_deref().unwrap_or_default());
    Ok((session, handle))
}

/// A file route's path, or a JSON 400 (not axum's text) when the URL's
/// percent-encoding is not UTF-8.
fn file_path(url: Result<UrlPath<(String, String)>, PathRejection>) -> Result<(String, String), ApiError> {
    url.map(|UrlPath(p)| p).map_err(|e| ApiError {
        field: Some("path".into()),
        ..ApiError::new(StatusCode::BAD_REQUEST, "bad_path", format!("{e}: give a UTF-8 path"))
    })
}

/// A refusal's code as the session says it: its serde name, as the
/// `&'static str` an [`ApiError`] (and so the rejections metric) takes; a
/// test below holds the two together.
fn refusal_code(code: FileRefusal) -> &'static str {
    match code {
        FileRefusal::BadPath => "bad_path",
        FileRefusal::NotFound => "not_found",
        FileRefusal::Link => "link",
        FileRefusal::NotAFile => "not_a_file",
        FileRefusal::TooLarge => "too_large",
        FileRefusal::Rejected => "rejected",
        FileRefusal::Unavailable => "unavailable",
        FileRefusal::Failed => "failed",
    }
}

/// A serde enum's name (a reject reason, a flag kind).
fn name_of<T: serde::Serialize>(v: &T) -> Option<String> {
    serde_json::to_value(v).ok()?.as_str().map(String::from)
}

/// The session's answer to a file request, when it is not the one asked
/// for: a refusal in the service's terms (the status the core gives it,
/// its code, its detail with no host path, the artifact check's reason).
/// `field` is `path` when the path itself is at fault, which is how a
/// client tells a missing file (404 `not_found`, `field: "path"`) from a
/// session that is not there (404 `not_found`, no field).
fn file_refused(state: &Shared, dir: &Path, answer: FileAnswer) -> ApiError {
    let FileAnswer::Refused { code, reason, detail } = answer else {
        return ApiError::failed("the session answered a file request with another's answer");
    };
    let status = StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let about_path = matches!(code, FileRefusal::BadPath | FileRefusal::NotFound | FileRefusal::Link | FileRefusal::NotAFile);
    ApiError {
        field: about_path.then(|| "path".to_string()),
        reason: reason.as_ref().and_then(name_of),
        ..ApiError::new(status, refusal_code(code), state.view_of_session(dir).text(&detail))
    }
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path,
        description = "relative to the session's /workspace/output (a path starting /workspace/output/ is taken too)")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "the file's bytes, at most 8 MiB and the token's `max_bytes_in`"),
    description = "Write a file into a live session's /workspace/output (folders on the way are made), whole: a cell \
never sees half of it, and it replaces what had its name. Served while a cell runs. The cells see it at once; it is \
judged and delivered with the rest of the output when the session ends.",
    responses((status = 200, body = FileWritten),
        (status = 400, description = "`bad_path` (`..`, absolute, a bad name), `link` (a link on the way)", body = crate::api::ErrorBody),
        (status = 404, description = "`not_found`: no session with this id for this token", body = crate::api::ErrorBody),
        (status = 409, description = "`not_a_file` (a folder has the name), `unavailable` (the session's output is a host folder)", body = crate::api::ErrorBody),
        (status = 410, description = "`session_ended`: the session ended by itself", body = crate::api::ErrorBody),
        (status = 413, description = "`too_large`", body = crate::api::ErrorBody),
        (status = 507, description = "`failed`: the session's output is full", body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_file(
    State(state): State<Shared>,
    headers: HeaderMap,
    url: Result<UrlPath<(String, String)>, PathRejection>,
    body: Body,
) -> Response {
    let r = put(&state, &headers, url, body).await;
    reply(&state, r)
}

async fn put(
    state: &Shared,
    headers: &HeaderMap,
    url: Result<UrlPath<(String, String)>, PathRejection>,
    body: Body,
) -> Result<(StatusCode, FileWritten), ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let (id, path) = file_path(url)?;
    let (session, handle) = find_handle(state, headers, &id)?;
    // Bounded as it is read, as every body is: a file the session would
    // refuse is never held whole.
    let most = session::MAX_FILE.min(tenant.max_bytes_in).min(state.max_body);
    let data = read_body(state, &tenant, body, most).await.map_err(|e| match e.code {
        "too_large" => ApiError {
            message: format!("the file is over {most} bytes, the most this token may put in a session: give a larger file as the session's input"),
            ..e
        },
        _ => e,
    })?;
    let answer = blocking(move || session::put_file(&handle, &path, &data)).await?;
    match answer.map_err(|e| session_error(state, &session.dir, e))? {
        FileAnswer::Written { path, bytes, sha256 } => Ok((StatusCode::OK, FileWritten { path, bytes, sha256 })),
        other => Err(file_refused(state, &session.dir, other)),
    }
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path,
        description = "relative to the session's /workspace/output (a path starting /workspace/output/ is taken too)")),
    description = "A file of a live session's /workspace/output, judged as an artifact is when the session ends (the \
policy's artifact rules: its extension allowed, a CSV/TSV's formula cells neutralised, ...): the bytes are those that \
passed, copied once, so a cell writing the file meanwhile changes nothing that was judged. Headers: `x-jail-sha256` \
(of the bytes sent), `x-jail-original-sha256` (of the file as the code wrote it, the sha256 a cell's result lists, \
when the bytes sent are a neutralised copy; absent otherwise), `x-jail-media-type` (sniffed from the content), \
`x-jail-flags` (the flag kinds found, comma-separated: `formula_injection`, `script`, `macros`, `media_type_mismatch`, \
`incomplete_scan`; absent when none).",
    responses((status = 200, description = "the file's judged bytes", content_type = "application/octet-stream"),
        (status = 400, description = "`bad_path`, `link` (a link on the way or the file itself: never followed)", body = crate::api::ErrorBody),
        (status = 404, description = "`not_found`: with `field: \"path\"` no such file, else no session with this id for this token", body = crate::api::ErrorBody),
        (status = 409, description = "`not_a_file`, `unavailable`", body = crate::api::ErrorBody),
        (status = 410, description = "`session_ended`", body = crate::api::ErrorBody),
        (status = 413, description = "`too_large`: over 8 MiB", body = crate::api::ErrorBody),
        (status = 422, description = "`rejected`: the artifact rules refused it; `reason` says which", body = crate::api::ErrorBody),
        (status = 429, description = "`busy`: file replies in flight hold this token's read budget (`max_artifact_reads`)", body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_file(
    State(state): State<Shared>,
    headers: HeaderMap,
    url: Result<UrlPath<(String, String)>, PathRejection>,
) -> Response {
    match get(&state, &headers, url).await {
        Ok(r) => r,
        Err(e) => {
            state.metrics.rejected(e.code);
            e.into_response()
        }
    }
}

async fn get(
    state: &Shared,
    headers: &HeaderMap,
    url: Result<UrlPath<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let (id, path) = file_path(url)?;
    let (session, handle) = find_handle(state, headers, &id)?;
    // Up to 8 MiB held, twice over while decoded: in the token's read
    // budget, as an artifact's reply is, until it is sent.
    let permit = artifacts::read_permit(state, &tenant)?;
    let answer = blocking(move || session::get_file(&handle, &path)).await?;
    let (artifact, data) = match answer.map_err(|e| session_error(state, &session.dir, e))? {
        FileAnswer::Read { artifact, data } => (artifact, data),
        other => return Err(file_refused(state, &session.dir, other)),
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| ApiError::failed(format!("the session's file is not base64: {e}")))?;
    let length = bytes.len().to_string();
    let body = artifacts::held_body(bytes, permit);
    let head = [
        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
        (header::CONTENT_LENGTH, length),
    ];
    let mut response = (StatusCode::OK, head, body).into_response();
    let mut kinds: Vec<String> = Vec::new();
    for kind in artifact.flags.iter().filter_map(|f| name_of(&f.kind)) {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    // A cell's result lists the file as the code wrote it; a neutralised
    // copy's own sha256 cannot be checked against that, the original's can.
    let original = artifact.neutralised.map(|n| n.original_sha256);
    let said = [
        ("x-jail-sha256", artifact.sha256),
        ("x-jail-original-sha256", original),
        ("x-jail-media-type", artifact.media_type),
        ("x-jail-flags", Some(kinds.join(",")).filter(|k| !k.is_empty())),
    ];
    for (name, value) in said {
        // A value a header cannot carry is left out, never sent broken.
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
            response.headers_mut().insert(HeaderName::from_static(name), v);
        }
    }
    Ok(response)
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", params(("id" = String, Path),
        ("path" = Option<String>, Query, description = "the folder, relative to /workspace/output (default: the folder itself)")),
    description = "A folder of a live session's /workspace/output: its entries sorted by name, at most 4096 \
(`truncated` past them). A link is listed as `symlink`, never followed.",
    responses((status = 200, body = FileListing),
        (status = 400, description = "`bad_path`, `link`", body = crate::api::ErrorBody),
        (status = 404, description = "`not_found`: with `field: \"path\"` no such folder, else no session with this id for this token", body = crate::api::ErrorBody),
        (status = 409, description = "`not_a_file` (not a folder), `unavailable`", body = crate::api::ErrorBody),
        (status = 410, description = "`session_ended`", body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_files(
    State(state): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Response {
    let r = list(&state, &headers, &id, query).await;
    reply(&state, r)
}

async fn list(
    state: &Shared,
    headers: &HeaderMap,
    id: &str,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<(StatusCode, FileListing), ApiError> {
    let Query(FileQuery { path }) =
        query.map_err(|e| ApiError::field("path", format!("{e}: the query is `?path=FOLDER` alone")))?;
    let (session, handle) = find_handle(state, headers, id)?;
    let answer = blocking(move || session::list_files(&handle, &path)).await?;
    match answer.map_err(|e| session_error(state, &session.dir, e))? {
        FileAnswer::Listed { path, entries, truncated } => {
            let entries = entries.into_iter().map(|e| FileListed { name: e.name, kind: e.kind, bytes: e.bytes }).collect();
            Ok((StatusCode::OK, FileListing { path, entries, truncated }))
        }
        other => Err(file_refused(state, &session.dir, other)),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusals_code_is_the_name_the_session_gives_it() {
        use FileRefusal::*;
        for code in [BadPath, NotFound, Link, NotAFile, TooLarge, Rejected, Unavailable, Failed] {
            assert_eq!(name_of(&code).as_deref(), Some(refusal_code(code)));
        }
    }
}
