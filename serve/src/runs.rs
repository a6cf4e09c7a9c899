//! `/v1/runs`: start a run, follow its events, fetch its artifacts.

use std::convert::Infallible;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::{parse, ApiError, Limits, RunReply, RunRequest};
use crate::backend::{Backend, EventLog, FinishOnDrop, Job, RunError};
use crate::config::Tenant;
use crate::pool::Link;
use crate::state::{make_run_dir, new_id, run_dir_mode, Run, Shared, Slot};
use crate::{input, route};

/// Bytes of one artifact served at most.
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;
/// Input files one run may be sent.
const MAX_FILES: usize = 256;

/// Read a body of at most `limit` bytes, or refuse it with 413.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is over this token's {limit} bytes: send less code or fewer files"),
        )
    })
}

/// The limits asked for, checked against the tenant's.
pub fn checked_limits(limits: &Limits, tenant: &Tenant) -> Result<(Duration, u64), ApiError> {
    let most = tenant.max_timeout.as_secs_f64();
    let timeout = match limits.timeout_secs {
        None => tenant.max_timeout,
        Some(t) if t > 0.0 && t <= most => Duration::from_secs_f64(t),
        Some(t) => {
            return Err(ApiError::field(
                "limits.timeout_secs",
                format!("{t} is out of range: give seconds above 0 and at most {most} (this token's limit)"),
            ))
        }
    };
    let memory = match limits.memory_mib {
        None => tenant.max_memory_mib,
        Some(m) if (16..=tenant.max_memory_mib).contains(&m) => m,
        Some(m) => {
            return Err(ApiError::field(
                "limits.memory_mib",
                format!("{m} is out of range: give MiB from 16 to {} (this token's limit)", tenant.max_memory_mib),
            ))
        }
    };
    Ok((timeout, memory))
}

fn check_file_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty() && name.len() <= 255 && !name.contains('/') && name != "." && name != ".." && !name.contains('\0');
    if ok {
        Ok(())
    } else {
        Err(ApiError::field(format!("files.{name}"), "a file name is one path component: no `/`, not `.` or `..`"))
    }
}

/// The input planned from `files` and `input_tar`, off the async threads:
/// a bad archive is a 400 naming `input_tar` before anything is staged.
async fn plan_input(req: &mut RunRequest, bytes: usize) -> Result<input::Plan, ApiError> {
    let files = std::mem::take(&mut req.files);
    let tar = req.input_tar.take();
    let bounds = input::Bounds::with_bytes(bytes as u64);
    tokio::task::spawn_blocking(move || input::plan(&files, tar.as_deref(), &bounds))
        .await
        .map_err(|e| ApiError::failed(format!("planning the input: {e}")))?
        .map_err(|e| ApiError::field("input_tar", e.to_string()))
}

/// A run folder being staged: removed, whatever is in it, unless kept.
struct Staging(Option<PathBuf>);

impl Staging {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Stage the code and the planned input in a fresh run folder under the
/// tenant's: `dir/main.py`, `dir/input/` (when there is input).
async fn stage(dir: &Path, code: String, plan: input::Plan) -> Result<Option<PathBuf>, ApiError> {
    make_run_dir(dir)?;
    let staging = Staging(Some(dir.to_path_buf()));
    let (dir_mode, file_mode) = (run_dir_mode(), run_dir_mode() & 0o644);
    let main = input::Plan::one_file("main.py", code.into_bytes());
    let input = (!plan.is_empty()).then(|| dir.join("input"));
    if let Some(inner) = &input {
        make_run_dir(inner)?;
    }
    let (root, inner) = (dir.to_path_buf(), input.clone());
    tokio::task::spawn_blocking(move || {
        input::write(&main, &root, dir_mode, file_mode)?;
        if let Some(inner) = inner {
            input::write(&plan, &inner, dir_mode, file_mode)?;
        }
        Ok::<_, input::WriteError>(())
    })
    .await
    .map_err(|e| ApiError::failed(format!("staging the run: {e}")))?
    .map_err(|e| ApiError::failed(e.to_string()))?;
    staging.keep();
    Ok(input)
}

fn check_request(req: &RunRequest) -> Result<(), ApiError> {
    if req.code.trim().is_empty() {
        return Err(ApiError::field("code", "`code` is empty: send the Python source to run"));
    }
    if req.files.len() > MAX_FILES {
        return Err(ApiError::field("files", format!("more than {MAX_FILES} files: send them as `input_tar`")));
    }
    req.files.keys().try_for_each(|n| check_file_name(n))
}

#[utoipa::path(post, path = "/v1/runs", request_body = RunRequest,
    responses((status = 200, body = RunReply), (status = 202, body = RunReply),
              (status = 400, body = crate::api::ErrorBody), (status = 401, body = crate::api::ErrorBody),
              (status = 413, body = crate::api::ErrorBody), (status = 429, body = crate::api::ErrorBody),
              (status = 500, body = crate::api::ErrorBody), (status = 502, body = crate::api::ErrorBody),
              (status = 503, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(State(state): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    match start(&state, &headers, body).await {
        Ok(r) => r,
        Err(e) => {
            state.metrics.rejected(e.code);
            e.into_response()
        }
    }
}

/// Which backend takes a run, and the pool's link when it is the pool.
fn route(state: &Shared, shape: &route::Shape) -> Option<Arc<Link>> {
    let (pool_state, link) = match &state.pool {
        None => (route::PoolState::None, None),
        Some(pool) => match pool.link() {
            Some(link) => (route::PoolState::Up(pool.shape(&link)), Some(link)),
            None => (route::PoolState::Down, None),
        },
    };
    match route::choose(shape, pool_state) {
        route::Choice::Pool => link,
        route::Choice::Spawn(why) => {
            state.metrics.spawned(why.label());
            None
        }
    }
}

async fn start(state: &Shared, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let tenant = state.tenant(headers)?.clone();
    let bytes_in = tenant.max_bytes_in.min(state.max_body);
    let body = read_body(body, bytes_in).await?;
    let mut req: RunRequest = parse(&body)?;
    drop(body);
    check_request(&req)?;
    let (timeout, memory_mib) = checked_limits(&req.limits, &tenant)?;
    let plan = plan_input(&mut req, bytes_in).await?;
    let slot = state.take_slot(&tenant)?;
    let id = new_id()?;
    let dir = state.tenant_dir(&tenant)?.join(&id);
    let input = stage(&dir, std::mem::take(&mut req.code), plan).await?;
    let link = route(state, &route::Shape { memory_mib, timeout, followed: !req.wait });
    let backend = if link.is_some() { "pool" } else { "spawn" };
    let log = Arc::new(EventLog::default());
    let run = Arc::new(Run {
        dir: dir.clone(),
        log: Arc::clone(&log),
        result: Default::default(),
        backend: backend.into(),
    });
    state.keep_run(&tenant, &id, Arc::clone(&run));
    let job = Job { id: id.clone(), dir, input, timeout, memory_mib };
    let reply = |state: &str, run: &Run, result| RunReply {
        id: id.clone(),
        state: state.into(),
        backend: Some(run.backend().into()),
        result,
    };
    if req.wait {
        // Run inside the request: a client that goes away drops this
        // future, and with it the run (spawn: its group is stopped; pool:
        // see `execute`).
        let result = execute(state, job, Arc::clone(&run), slot, link).await?;
        return Ok(Json(reply("done", &run, Some(result))).into_response());
    }
    let running = reply("running", &run, None);
    let owned = Arc::clone(state);
    tokio::spawn(async move {
        let _ = execute(&owned, job, run, slot, link).await;
    });
    Ok((StatusCode::ACCEPTED, Json(running)).into_response())
}

/// Run `job` on the pool (`link`) or a `jail run` of its own, holding the
/// run's slot until it has really ended.
async fn execute(
    state: &Shared,
    job: Job,
    run: Arc<Run>,
    slot: Slot,
    link: Option<Arc<Link>>,
) -> Result<serde_json::Value, ApiError> {
    let started = Instant::now();
    let Some(link) = link else {
        // Followers of its events are not left waiting if the client goes away.
        let _finish = FinishOnDrop(Arc::clone(&run.log));
        let outcome = state.spawn.run(job, Arc::clone(&run.log)).await;
        drop(slot);
        return record(state, &run, started, outcome);
    };
    // The run goes on in a task of its own that holds the slot until the
    // pool answers: a client that goes away cannot start more runs than its
    // token allows. Dropping this future asks the pool to cancel the run,
    // which it answers at once (`cancelled`).
    let id = job.id.clone();
    let (owned, held) = (Arc::clone(state), Arc::clone(&link));
    let task = tokio::spawn(async move {
        let mut outcome = held.run(job.clone(), Arc::clone(&run.log)).await;
        if let Err(RunError::NotStarted(why)) = &outcome {
            // The pool handed out a dead jail (see wire::never_started):
            // the step never ran, so it runs once, on a jail of its own.
            eprintln!("jail serve: run {}: {why}: running it with jail run", job.id);
            owned.metrics.spawned("pool_jail_dead");
            if let Ok(mut b) = run.backend.lock() {
                *b = "spawn";
            }
            outcome = owned.spawn.run(job, Arc::clone(&run.log)).await;
        }
        drop(slot);
        record(&owned, &run, started, outcome)
    });
    let cancel = CancelOnDrop(Some((link, id)));
    let done = task.await;
    cancel.disarm();
    done.map_err(|e| ApiError::failed(format!("the run's task ended: {e}")))?
}

/// Asks the pool to cancel a request whose client went away.
struct CancelOnDrop(Option<(Arc<Link>, String)>);

impl CancelOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((link, id)) = self.0.take() {
            link.cancel(&id);
        }
    }
}

/// A run ended: its metrics, its result kept for `GET /v1/runs/{id}`.
fn record(
    state: &Shared,
    run: &Run,
    started: Instant,
    outcome: Result<serde_json::Value, RunError>,
) -> Result<serde_json::Value, ApiError> {
    state.metrics.ran_on(run.backend());
    match outcome {
        Ok(result) => {
            let status = result.get("status").and_then(|s| s.as_str()).unwrap_or("unknown").to_owned();
            let denials = result.get("denials").and_then(|d| d.as_array()).map_or(0, |d| d.len() as u64);
            state.metrics.run(&status, started.elapsed(), denials);
            if let Ok(mut r) = run.result.lock() {
                *r = Some(result.clone());
            }
            Ok(result)
        }
        Err(e) => {
            state.metrics.run("error", started.elapsed(), 0);
            Err(match e {
                RunError::Failed(m) | RunError::NotStarted(m) => ApiError::failed(m),
                RunError::PoolLost(m) => ApiError::pool_lost(m),
            })
        }
    }
}

#[utoipa::path(get, path = "/v1/runs/{id}", params(("id" = String, Path)),
    responses((status = 200, body = RunReply), (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>) -> Response {
    let reply = (|| {
        let tenant = state.tenant(&headers)?;
        let run = state.run(tenant, &id)?;
        let result = run.result.lock().map_err(|_| ApiError::failed("lock poisoned"))?.clone();
        let state = if result.is_some() { "done" } else { "running" };
        Ok::<_, ApiError>(RunReply { id, state: state.into(), backend: Some(run.backend().into()), result })
    })();
    match reply {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

#[utoipa::path(get, path = "/v1/runs/{id}/events", params(("id" = String, Path)),
    responses((status = 200, description = "text/event-stream: each event of `jail run --events` as one `data:` line, then `event: end`"),
              (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn events(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>) -> Response {
    let run = match state.tenant(&headers).and_then(|t| state.run(t, &id)) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let stream = futures_util::stream::unfold((run, 0usize, false), |(run, from, ended)| async move {
        if ended {
            return None;
        }
        loop {
            if let Some(step) = next_chunk(&run.log, from).await {
                return Some(match step {
                    Some((text, next)) => (Ok::<_, Infallible>(Bytes::from(text)), (run, next, false)),
                    None => (Ok(Bytes::from_static(b"event: end\ndata: {}\n\n")), (run, from, true)),
                });
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The events after `from` as SSE text and the next index; `Some(None)`
/// once the log is complete; `None` after waiting for a change.
async fn next_chunk(log: &EventLog, from: usize) -> Option<Option<(String, usize)>> {
    let waiting = log.changed.notified();
    tokio::pin!(waiting);
    // Registered before the look, so a push in between still wakes us.
    waiting.as_mut().enable();
    let (lines, done) = log.since(from);
    if !lines.is_empty() {
        let mut text = String::new();
        for line in &lines {
            text.push_str("data: ");
            text.push_str(line);
            text.push_str("\n\n");
        }
        return Some(Some((text, from + lines.len())));
    }
    if done {
        return Some(None);
    }
    waiting.await;
    None
}

#[utoipa::path(get, path = "/v1/runs/{id}/artifacts/{path}", params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 200, description = "the artifact's bytes"), (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn artifact(
    State(state): State<Shared>,
    headers: HeaderMap,
    UrlPath((id, path)): UrlPath<(String, String)>,
) -> Response {
    match read_artifact(&state, &headers, &id, &path) {
        Ok((bytes, media)) => ([(header::CONTENT_TYPE, media)], bytes).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Only a path the result lists as an accepted artifact is served, read
/// without following any link, bounded.
fn read_artifact(state: &Shared, headers: &HeaderMap, id: &str, path: &str) -> Result<(Vec<u8>, String), ApiError> {
    let tenant = state.tenant(headers)?;
    let run = state.run(tenant, id)?;
    let result = run.result.lock().map_err(|_| ApiError::failed("lock poisoned"))?.clone();
    let result = result.ok_or_else(|| ApiError::not_found("finished run"))?;
    let listed = result
        .get("artifacts")
        .and_then(|a| a.as_array())
        .and_then(|a| a.iter().find(|x| x.get("path").and_then(|p| p.as_str()) == Some(path)).cloned());
    let listed = listed.ok_or_else(|| ApiError::not_found("accepted artifact at this path"))?;
    let rel = Path::new(path);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(ApiError::not_found("artifact at this path"));
    }
    let out = result
        .get("output_dir")
        .and_then(|d| d.as_str())
        .map(PathBuf::from)
        .filter(|d| d.starts_with(&run.dir))
        .ok_or_else(|| ApiError::not_found("output folder for this run"))?;
    let bytes = read_beneath(&out, rel)?;
    let media = listed.get("media_type").and_then(|m| m.as_str()).unwrap_or("application/octet-stream").to_owned();
    Ok((bytes, media))
}

fn read_beneath(dir: &Path, rel: &Path) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    const RESOLVE_BENEATH: u64 = 0x08;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    let root = jail::sys::openat2(None, dir, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, RESOLVE_NO_SYMLINKS)
        .map_err(|e| ApiError::failed(format!("open {}: {e}", dir.display())))?;
    use std::os::fd::AsFd;
    let fd = jail::sys::openat2(
        Some(root.as_fd()),
        rel,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|_| ApiError::not_found("readable artifact at this path"))?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| ApiError::failed(format!("fstat: {e}")))?;
    if !meta.is_file() || meta.len() > MAX_ARTIFACT_BYTES {
        return Err(ApiError::not_found("regular artifact of a servable size at this path"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ARTIFACT_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| ApiError::failed(format!("read artifact: {e}")))?;
    Ok(bytes)
}
