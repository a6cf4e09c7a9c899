//! `/v1/runs`: start a run, follow its events (a keepalive comment while
//! it is silent), cancel it, fetch its artifacts.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::{parse, ApiError, ErrorDetail, Limits, RunReply, RunRequest};
use crate::backend::{Backend, EventLog, FinishOnDrop, Job, RunError};
use crate::cancel::CancelOnDrop;
use crate::config::Tenant;
use crate::pool::Link;
use crate::state::{make_run_dir, new_id, run_dir_mode, End, Run, Shared, Slot};
use crate::{artifacts, input, route};

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
        Some(t) => jail::seconds::limit(t, most).ok_or_else(|| {
            ApiError::field(
                "limits.timeout_secs",
                format!("{t} is out of range: give seconds {} (this token's limit)", jail::seconds::range(most)),
            )
        })?,
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
pub async fn plan_input(
    files: &mut std::collections::BTreeMap<String, String>,
    tar: Option<String>,
    bytes: usize,
) -> Result<input::Plan, ApiError> {
    let files = std::mem::take(files);
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
    let main = input::Plan::one_file("main.py", code.into_bytes());
    write_plan(dir.to_path_buf(), main).await?;
    let input = stage_input(dir, plan).await?;
    staging.keep();
    Ok(input)
}

/// Write the planned input into `dir/input` (made for it; nothing when
/// the plan is empty): the input folder of a run, or of a session.
pub async fn stage_input(dir: &Path, plan: input::Plan) -> Result<Option<PathBuf>, ApiError> {
    if plan.is_empty() {
        return Ok(None);
    }
    let inner = dir.join("input");
    make_run_dir(&inner)?;
    let staging = Staging(Some(inner.clone()));
    write_plan(inner.clone(), plan).await?;
    staging.keep();
    Ok(Some(inner))
}

/// Write `plan` beneath `root`, off the async threads, in the modes a
/// run's jail reads.
async fn write_plan(root: PathBuf, plan: input::Plan) -> Result<(), ApiError> {
    let (dir_mode, file_mode) = (run_dir_mode(), run_dir_mode() & 0o644);
    tokio::task::spawn_blocking(move || input::write(&plan, &root, dir_mode, file_mode))
        .await
        .map_err(|e| ApiError::failed(format!("staging the input: {e}")))?
        .map_err(|e| ApiError::failed(e.to_string()))
}

fn check_request(req: &RunRequest) -> Result<(), ApiError> {
    if req.code.trim().is_empty() {
        return Err(ApiError::field("code", "`code` is empty: send the Python source to run"));
    }
    check_files(&req.files)
}

/// `files`: at most `MAX_FILES`, each name one path component.
pub fn check_files(files: &std::collections::BTreeMap<String, String>) -> Result<(), ApiError> {
    if files.len() > MAX_FILES {
        return Err(ApiError::field("files", format!("more than {MAX_FILES} files: send them as `input_tar`")));
    }
    files.keys().try_for_each(|n| check_file_name(n))
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
    let plan = plan_input(&mut req.files, req.input_tar.take(), bytes_in).await?;
    let slot = state.take_slot(&tenant)?;
    let id = new_id()?;
    let dir = state.tenant_dir(&tenant)?.join(&id);
    let input = stage(&dir, std::mem::take(&mut req.code), plan).await?;
    let link = route(state, &route::Shape { memory_mib, timeout, followed: !req.wait });
    let run = Arc::new(Run::new(dir.clone(), if link.is_some() { "pool" } else { "spawn" }));
    state.keep_run(&tenant, &id, Arc::clone(&run));
    let job = Job { id: id.clone(), dir, input, timeout, memory_mib };
    if req.wait {
        // Run inside the request: a client that goes away drops this
        // future, which cancels the run (see `execute`).
        let result = execute(state, job, Arc::clone(&run), slot, link).await?;
        return Ok(Json(reply_of(&id, &run, End::Done(result))).into_response());
    }
    let running = reply_of(&id, &run, End::Running);
    let owned = Arc::clone(state);
    tokio::spawn(async move {
        // Its end is recorded in the run (GET /v1/runs/{id}, its events).
        let _ = execute(&owned, job, run, slot, link).await;
    });
    Ok((StatusCode::ACCEPTED, Json(running)).into_response())
}

/// The reply for run `id` at `end`.
fn reply_of(id: &str, run: &Run, end: End) -> RunReply {
    let (state, result, error) = match end {
        End::Running => ("running", None, None),
        End::Done(result) => ("done", Some(result), None),
        End::Failed { code, message } => ("failed", None, Some(ErrorDetail { code: code.into(), field: None, message })),
    };
    RunReply {
        id: id.into(),
        state: state.into(),
        backend: Some(run.backend().into()),
        result,
        error,
    }
}

/// Run `job` on the pool (`link`) or a `jail run` of its own, in a task of
/// its own that holds the run's slot until the run has really ended and
/// records how it ended: a client that goes away cannot start more runs
/// than its token allows. Dropping this future (the waiting client went
/// away) cancels the run, which then ends at once (`cancelled`).
async fn execute(
    state: &Shared,
    job: Job,
    run: Arc<Run>,
    slot: Slot,
    link: Option<Arc<Link>>,
) -> Result<serde_json::Value, ApiError> {
    let started = Instant::now();
    let cancel = CancelOnDrop::new(Arc::clone(&run.cancel));
    let owned = Arc::clone(state);
    let task = tokio::spawn(async move {
        // Followers of its events are never left waiting, even on a panic.
        let _finish = FinishOnDrop(Arc::clone(&run.log));
        let outcome = match link {
            Some(link) => on_pool(&owned, &link, job, &run).await,
            None => owned.spawn.run(job, Arc::clone(&run.log), Arc::clone(&run.cancel)).await,
        };
        drop(slot);
        record(&owned, &run, started, outcome)
    });
    let done = task.await;
    cancel.disarm();
    done.map_err(|e| ApiError::failed(format!("the run's task ended: {e}")))?
}

/// A run on the pool; one whose pooled jail was dead before its code was
/// sent runs once more, on a jail of its own.
async fn on_pool(state: &Shared, link: &Link, job: Job, run: &Run) -> Result<serde_json::Value, RunError> {
    let outcome = link.run(job.clone(), Arc::clone(&run.log), Arc::clone(&run.cancel)).await;
    let Err(RunError::NotStarted(why)) = &outcome else { return outcome };
    if run.cancel.asked() {
        return Err(RunError::not_run());
    }
    // The pool handed out a dead jail (see wire::never_started): the step
    // never ran, so it runs once, on a jail of its own.
    eprintln!("jail serve: run {}: {why}: running it with jail run", job.id);
    state.metrics.spawned("pool_jail_dead");
    if let Ok(mut b) = run.backend.lock() {
        *b = "spawn";
    }
    state.spawn.run(job, Arc::clone(&run.log), Arc::clone(&run.cancel)).await
}

/// A run ended: its metrics; how it ended kept in the run for `GET
/// /v1/runs/{id}` and its artifacts, and only then its last event (its
/// result, or an `error` event) logged and the log finished, so a follower
/// that has seen the end finds the run ended.
fn record(
    state: &Shared,
    run: &Run,
    started: Instant,
    outcome: Result<serde_json::Value, RunError>,
) -> Result<serde_json::Value, ApiError> {
    state.metrics.ran_on(run.backend());
    let ended = match outcome {
        Ok(result) => {
            let status = result.get("status").and_then(|s| s.as_str()).unwrap_or("unknown").to_owned();
            let denials = result.get("denials").and_then(|d| d.as_array()).map_or(0, |d| d.len() as u64);
            state.metrics.run(&status, started.elapsed(), denials);
            run.set_end(End::Done(result.clone()));
            run.log.push(&crate::backend::result_event(&result));
            Ok(result)
        }
        Err(e) => {
            state.metrics.run("error", started.elapsed(), 0);
            let error = match e {
                RunError::Failed(m) | RunError::NotStarted(m) => ApiError::failed(m),
                RunError::PoolLost(m) => ApiError::pool_lost(m),
                RunError::Cancelled(m) => ApiError::cancelled(m),
            };
            run.set_end(End::Failed { code: error.code, message: error.message.clone() });
            run.log.push(&crate::backend::error_event(error.code, &error.message));
            Err(error)
        }
    };
    run.log.finish();
    ended
}

#[utoipa::path(get, path = "/v1/runs/{id}", params(("id" = String, Path)),
    responses((status = 200, body = RunReply), (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>) -> Response {
    let reply = state.tenant(&headers).and_then(|t| state.run(t, &id)).map(|run| reply_of(&id, &run, run.end()));
    match reply {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

/// How long `DELETE /v1/runs/{id}` waits for the run to end: a cancelled
/// `jail run` kills its tree and removes its cgroup, a pool's jail the same.
const CANCEL_WAIT: Duration = Duration::from_secs(15);

#[utoipa::path(delete, path = "/v1/runs/{id}", params(("id" = String, Path)),
    description = "Cancel a run of this token: its jail is stopped at once (a `jail run`: SIGTERM; a pooled jail: the pool's cancel). \
Answers once it has ended (at most 15 s): `done` with its result, status `cancelled` (or its own status when it had \
just ended), or `failed` with `error.code` `cancelled` when it had not reached a jail. A run that ended already is \
left as it is. 202 with `running` when it has not ended within the wait.",
    responses((status = 200, body = RunReply), (status = 202, body = RunReply), (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>) -> Response {
    let run = match state.tenant(&headers).and_then(|t| state.run(t, &id)) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    run.cancel.ask();
    let ended = run.log.wait_finished(CANCEL_WAIT).await;
    let reply = reply_of(&id, &run, run.end());
    let code = if ended { StatusCode::OK } else { StatusCode::ACCEPTED };
    (code, Json(reply)).into_response()
}

/// A comment line sent on an event stream that has been silent this long,
/// so that a client's read timeout need not cover the whole run.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

#[utoipa::path(get, path = "/v1/runs/{id}/events", params(("id" = String, Path)),
    responses((status = 200, description = "text/event-stream: each event of `jail run --events` as one `data:` line, \
the last one `{\"type\": \"result\", \"result\": {...}}` or, for a run that ended without a result, \
`{\"type\": \"error\", \"error\": {\"code\", \"message\"}}`; then `event: end`. The run is recorded as ended \
(`GET /v1/runs/{id}`, its artifacts) before its last event is sent. A `: keepalive` comment comes after every 15 s \
without an event."),
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
            let step = match tokio::time::timeout(KEEPALIVE, next_chunk(&run.log, from)).await {
                Err(_) => return Some((Ok::<_, Infallible>(Bytes::from_static(b": keepalive\n\n")), (run, from, false))),
                Ok(None) => continue,
                Ok(Some(step)) => step,
            };
            return Some(match step {
                Some((text, next)) => (Ok(Bytes::from(text)), (run, next, false)),
                None => (Ok(Bytes::from_static(b"event: end\ndata: {}\n\n")), (run, from, true)),
            });
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
    responses((status = 200, description = "the artifact's bytes"), (status = 404, body = crate::api::ErrorBody),
        (status = 409, description = "`changed`: the file no longer has the listed size and sha256", body = crate::api::ErrorBody),
        (status = 429, description = "`busy`: artifact replies in flight hold the read budget", body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn artifact(
    State(state): State<Shared>,
    headers: HeaderMap,
    UrlPath((id, path)): UrlPath<(String, String)>,
) -> Response {
    artifacts::respond(move || read_artifact(&state, &headers, &id, &path)).await
}

/// The run's result must be in (its end recorded) and list `path`.
fn read_artifact(state: &Shared, headers: &HeaderMap, id: &str, path: &str) -> Result<artifacts::Found, ApiError> {
    let tenant = state.tenant(headers)?;
    let run = state.run(tenant, id)?;
    let End::Done(result) = run.end() else { return Err(ApiError::not_found("finished run")) };
    artifacts::listed(&result, &run.dir, path)
}
