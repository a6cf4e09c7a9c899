//! `/v1/runs`: start a run, follow its events (a keepalive comment while
//! it is silent), cancel it, fetch its artifacts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::Value;

use crate::api::{parse, ApiError, ErrorDetail, Limits, RunReply, RunRequest};
use crate::backend::{Backend, FinishOnDrop, Job, RawResult, RunError};
use crate::cancel::CancelOnDrop;
use crate::config::Tenant;
use crate::files::View;
use crate::pool::Link;
use crate::state::{make_run_dir, new_id, run_modes, End, Run, Shared, Slot, EVENTS_FILE, LISTING_FILE, RESULT_FILE};
use crate::{artifacts, input, route};

/// Input files one run may be sent.
const MAX_FILES: usize = 256;

/// Read a body of at most `limit` bytes within the server's body timeout,
/// or refuse it: 413 when it is larger, 408 when it comes too slowly.
pub async fn read_body(state: &Shared, tenant: &Tenant, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let read = tokio::time::timeout(state.body_timeout, axum::body::to_bytes(body, limit)).await;
    let Ok(read) = read else {
        state.metrics.limit_hit("body_timeout", &tenant.name);
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "too_slow",
            format!("the request body did not arrive within {:?}: send it at once", state.body_timeout),
        ));
    };
    read.map_err(|_| {
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
    time: Duration,
) -> Result<input::Plan, ApiError> {
    let files = std::mem::take(files);
    let bounds = input::Bounds { time: time.min(input::MAX_TIME), ..input::Bounds::with_bytes(bytes as u64) };
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
async fn stage(dir: &Path, code: String, plan: input::Plan, deadline: Instant) -> Result<Option<PathBuf>, ApiError> {
    let (top, _, files) = run_modes();
    make_run_dir(dir, top)?;
    let staging = Staging(Some(dir.to_path_buf()));
    let main = input::Plan::one_file("main.py", code.into_bytes());
    write_plan(dir.to_path_buf(), main, deadline, (top, files)).await?;
    let input = stage_input(dir, plan, deadline).await?;
    staging.keep();
    Ok(input)
}

/// Write the planned input into `dir/input` (made for it; nothing when
/// the plan is empty): the input folder of a run, or of a session.
pub async fn stage_input(dir: &Path, plan: input::Plan, deadline: Instant) -> Result<Option<PathBuf>, ApiError> {
    if plan.is_empty() {
        return Ok(None);
    }
    let (_, folders, files) = run_modes();
    let inner = dir.join("input");
    make_run_dir(&inner, folders)?;
    let staging = Staging(Some(inner.clone()));
    write_plan(inner.clone(), plan, deadline, (folders, files)).await?;
    staging.keep();
    Ok(Some(inner))
}

/// Write `plan` beneath `root`, off the async threads, in `modes`
/// (folders, files).
async fn write_plan(root: PathBuf, plan: input::Plan, deadline: Instant, modes: (u32, u32)) -> Result<(), ApiError> {
    let (dir_mode, file_mode) = modes;
    tokio::task::spawn_blocking(move || input::write(&plan, &root, dir_mode, file_mode, deadline))
        .await
        .map_err(|e| ApiError::failed(format!("staging the input: {e}")))?
        .map_err(|e| match e {
            input::WriteError::TooSlow => ApiError::field("input_tar", e.to_string()),
            input::WriteError::Io { .. } => ApiError::failed(e.to_string()),
        })
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
    let body = read_body(state, &tenant, body, bytes_in).await?;
    let mut req: RunRequest = parse(&body)?;
    drop(body);
    check_request(&req)?;
    let (timeout, memory_mib) = checked_limits(&req.limits, &tenant)?;
    // The run's wall time counts from here: planning and staging its
    // input are taken from it (issue #33).
    let began = Instant::now();
    let plan = plan_input(&mut req.files, req.input_tar.take(), bytes_in, timeout).await?;
    let slot = state.take_slot(&tenant)?;
    let id = new_id()?;
    let dir = state.tenant_dir(&tenant)?.join(&id);
    let shape = route::Shape { memory_mib, timeout, followed: !req.wait, input_entries: plan.items.len() };
    let link = route(state, &shape);
    let input = stage(&dir, std::mem::take(&mut req.code), plan, began + timeout).await?;
    let run = Arc::new(Run::new(dir.clone(), if link.is_some() { "pool" } else { "spawn" }));
    state.keep_run(&tenant, &id, Arc::clone(&run));
    // What staging took is taken from the run's wall time: the jail's
    // result reports the wall limit it was held to (`limits`).
    let left = timeout.saturating_sub(began.elapsed()).max(MIN_WALL);
    let job = Job {
        id: id.clone(),
        dir,
        input,
        timeout: left,
        memory_mib,
        env: std::mem::take(&mut req.env),
    };
    let view = state.view_of_run(&job.dir);
    let ended = Ended { tenant: tenant.name.clone(), budget: tenant.max_kept_bytes, view };
    if req.wait {
        // Run inside the request: a client that goes away drops this
        // future, which cancels the run (see `execute`).
        execute(state, job, Arc::clone(&run), slot, link, ended).await?;
        return Ok(reply(&id, &run));
    }
    let running = reply(&id, &run);
    let owned = Arc::clone(state);
    tokio::spawn(async move {
        // Its end is recorded in the run (GET /v1/runs/{id}, its events).
        let _ = execute(&owned, job, run, slot, link, ended).await;
    });
    Ok((StatusCode::ACCEPTED, running).into_response())
}

/// The wall time a run whose staging took all of its own still gets, so
/// that it ends as a run that timed out (`timeout_wall`) with a result.
const MIN_WALL: Duration = Duration::from_millis(1);

/// What `record` needs to know of a run besides its outcome.
struct Ended {
    tenant: String,
    budget: u64,
    view: View,
}

/// The reply for run `id` now: its state, and its result streamed from
/// its file when it is done (never held whole in memory).
fn reply(id: &str, run: &Run) -> Response {
    let (state, error) = match run.end() {
        End::Running => ("running", None),
        End::Failed { code, message } => ("failed", Some(ErrorDetail { code: code.into(), field: None, message })),
        End::Done { result_bytes, .. } => return done_reply(id, run, result_bytes),
    };
    let body = RunReply {
        id: id.into(),
        state: state.into(),
        backend: Some(run.backend().into()),
        result: None,
        error,
    };
    Json(body).into_response()
}

/// `{"id", "state": "done", "backend", "result": <the result file>}`.
fn done_reply(id: &str, run: &Run, result_bytes: u64) -> Response {
    let file = match crate::files::open_in(&run.dir, RESULT_FILE) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("jail serve: run {id}: its result file: {e}");
            return ApiError::failed("the run's result could not be read back: it was lost on the service").into_response();
        }
    };
    let head = format!("{{\"id\":{},\"state\":\"done\",\"backend\":{},\"result\":", Value::from(id), Value::from(run.backend()));
    let length = head.len() as u64 + result_bytes + 1;
    let head = futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(head)) });
    let body = Body::from_stream(head.chain(crate::files::stream(file, result_bytes, b"}")));
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::CONTENT_LENGTH, length.to_string()),
        ],
        body,
    )
        .into_response()
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
    ended: Ended,
) -> Result<(), ApiError> {
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
        record(&owned, &run, started, outcome, ended).await
    });
    let done = task.await;
    cancel.disarm();
    done.map_err(|e| ApiError::failed(format!("the run's task ended: {e}")))?
}

/// A run on the pool; one whose pooled jail was dead before its code was
/// sent runs once more, on a jail of its own.
async fn on_pool(state: &Shared, link: &Link, job: Job, run: &Run) -> Result<RawResult, RunError> {
    let outcome = link.run(job.clone(), Arc::clone(&run.log), Arc::clone(&run.cancel)).await;
    let Err(RunError::NotStarted(why)) = &outcome else { return outcome };
    if run.cancel.asked() {
        return Err(RunError::not_run());
    }
    // The pool handed out a dead jail (see jail::client::pool::Error::never_started): the step
    // never ran, so it runs once, on a jail of its own.
    eprintln!("jail serve: run {}: {why}: running it with jail run", job.id);
    state.metrics.spawned("pool_jail_dead");
    if let Ok(mut b) = run.backend.lock() {
        *b = "spawn";
    }
    state.spawn.run(job, Arc::clone(&run.log), Arc::clone(&run.cancel)).await
}

/// A run ended: its metrics; how it ended kept in the run for `GET
/// /v1/runs/{id}` and its artifacts (its result as the tenant sees it in
/// `RESULT_FILE`, the listing its artifacts are served from in
/// `LISTING_FILE`, neither held in memory), and only then its log
/// finished, so a follower that has seen the end finds the run ended.
/// Then the tenant's oldest finished runs are forgotten while it keeps
/// more than its bytes.
async fn record(
    state: &Shared,
    run: &Arc<Run>,
    started: Instant,
    outcome: Result<RawResult, RunError>,
    ended: Ended,
) -> Result<(), ApiError> {
    state.metrics.ran_on(run.backend());
    let outcome = match outcome {
        Ok(result) => {
            // Off the async threads: a result is up to the jail's stream caps.
            let (dir, view) = (run.dir.clone(), ended.view.clone());
            match tokio::task::spawn_blocking(move || keep_result(&dir, &result, &view)).await {
                Ok(Ok(kept)) => {
                    state.metrics.run(&kept.status, started.elapsed(), kept.denials);
                    Ok(kept.end)
                }
                Ok(Err(e)) => Err(RunError::Failed(e)),
                Err(e) => Err(RunError::Failed(format!("keeping the run's result: {e}"))),
            }
        }
        Err(e) => Err(e),
    };
    let result = match outcome {
        Ok(end) => {
            run.set_end(end);
            Ok(())
        }
        Err(e) => {
            state.metrics.run("error", started.elapsed(), 0);
            let error = match e {
                RunError::Failed(m) | RunError::NotStarted(m) => ApiError::failed(ended.view.text(&m)),
                RunError::PoolLost(m) => ApiError::pool_lost(ended.view.text(&m)),
                RunError::Cancelled(m) => ApiError::cancelled(m),
            };
            run.set_end(End::Failed { code: error.code, message: error.message.clone() });
            Err(error)
        }
    };
    run.log.finish();
    state.shed_runs(&ended.tenant, ended.budget);
    result
}

/// A result kept: the run's end, and what its metrics say of it.
struct Kept {
    end: End,
    status: String,
    denials: u64,
}

/// Check the result's schema version, then write the result as the tenant
/// sees it and the listing its artifacts are served from into the run's
/// folder: its end. Only the top-level fields other than `stdout` and
/// `stderr` are decoded (to name no host path, and for the listing and
/// the metrics); the streams, most of a result, are copied as written.
fn keep_result(dir: &Path, result: &RawResult, view: &View) -> Result<Kept, String> {
    use std::io::Write;
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(borrow)]
        result: std::collections::BTreeMap<String, &'a serde_json::value::RawValue>,
    }
    let fields = serde_json::from_str::<Line>(result.text())
        .map_err(|e| format!("the jail's result is not a JSON object: {e}"))?
        .result;
    let field = |k: &str| fields.get(k).and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok());
    let version = match field("schema_version") {
        Some(v) => serde_json::json!({"schema_version": v}),
        None => serde_json::json!({}),
    };
    jail::schema::check_version(&version).map_err(|e| e.to_string())?;
    let artifacts = field("artifacts").unwrap_or(Value::Null);
    let artifact_bytes = artifacts
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["bytes"].as_u64()).fold(0u64, u64::saturating_add))
        .unwrap_or(0);
    let listing = serde_json::json!({"output_dir": field("output_dir").unwrap_or(Value::Null), "artifacts": artifacts});
    let lost = |e: std::io::Error| format!("the run's result could not be kept on the service: {e}");
    crate::files::write_json(dir, LISTING_FILE, &listing).map_err(lost)?;
    let file = crate::files::create_private(&dir.join(RESULT_FILE)).map_err(lost)?;
    let mut out = std::io::BufWriter::with_capacity(crate::files::CHUNK, file);
    let mut write = || -> std::io::Result<()> {
        out.write_all(b"{")?;
        for (i, (key, raw)) in fields.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            serde_json::to_writer(&mut out, key)?;
            out.write_all(b":")?;
            if View::untouched(key) {
                out.write_all(raw.get().as_bytes())?;
            } else {
                let mut v: Value = serde_json::from_str(raw.get())?;
                view.field(key, &mut v);
                serde_json::to_writer(&mut out, &v)?;
            }
        }
        out.write_all(b"}")?;
        out.flush()
    };
    write().map_err(lost)?;
    let result_bytes = out.get_ref().metadata().map_err(lost)?.len();
    Ok(Kept {
        end: End::Done { result_bytes, artifact_bytes },
        status: field("status").and_then(|s| s.as_str().map(str::to_owned)).unwrap_or_else(|| "unknown".into()),
        denials: field("denials").and_then(|d| d.as_array().map(|d| d.len() as u64)).unwrap_or(0),
    })
}

#[utoipa::path(get, path = "/v1/runs/{id}", params(("id" = String, Path)),
    responses((status = 200, body = RunReply), (status = 404, body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(State(state): State<Shared>, headers: HeaderMap, UrlPath(id): UrlPath<String>) -> Response {
    match state.tenant(&headers).and_then(|t| state.run(t, &id)) {
        Ok(run) => reply(&id, &run),
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
    let mut r = reply(&id, &run);
    if !ended {
        *r.status_mut() = StatusCode::ACCEPTED;
    }
    r
}

/// A comment line sent on an event stream that has been silent this long,
/// so that a client's read timeout need not cover the whole run.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// `GET /v1/runs/{id}/events?from=N`.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Follow {
    /// The first event to send (each event's SSE `id` is its index): a
    /// reader that was cut off resumes where it stopped.
    #[serde(default)]
    from: Option<u64>,
}

#[utoipa::path(get, path = "/v1/runs/{id}/events", params(("id" = String, Path),
        ("from" = Option<u64>, Query, description = "the index of the first event to send (each event's `id:`); default 0")),
    responses((status = 200, description = "text/event-stream: each event of `jail run --events` as one `data:` line, \
with `id:` its index, the last one `{\"type\": \"result\", \"result\": {...}}` or, for a run that ended without a \
result, `{\"type\": \"error\", \"error\": {\"code\", \"message\"}}`; then `event: end`. The run is recorded as ended \
(`GET /v1/runs/{id}`, its artifacts) before its last event is sent. A `: keepalive` comment comes after every 15 s \
without an event. The events are read from the run's file a bounded chunk at a time as the client takes them: a client \
that takes nothing for the server's send timeout is disconnected, and resumes with `?from=N` (or `Last-Event-ID`)."),
              (status = 404, body = crate::api::ErrorBody),
              (status = 429, description = "`busy`: this token has its most event streams open", body = crate::api::ErrorBody)),
    security(("bearer" = [])))]
pub async fn events(
    State(state): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    Query(follow): Query<Follow>,
) -> Response {
    let tenant = match state.tenant(&headers) {
        Ok(t) => t.clone(),
        Err(e) => return e.into_response(),
    };
    let run = match state.run(&tenant, &id) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let Some(permit) = state.gates.get(&tenant.name).and_then(|g| Arc::clone(&g.streams).try_acquire_owned().ok()) else {
        state.metrics.limit_hit("tenant_streams", &tenant.name);
        return ApiError::busy(format!(
            "this token has {} event streams open, its most: close one, or poll GET /v1/runs/{{id}}",
            tenant.max_streams
        ))
        .into_response();
    };
    // `Last-Event-ID` (the id of the last event seen) as the SSE spec
    // has browsers send it; `from` wins when both are given.
    let last_seen = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|n| n.saturating_add(1));
    let from = follow.from.or(last_seen).unwrap_or(0);
    let stream = futures_util::stream::unfold(Some(Reader::new(run, from, permit)), |reader| async move {
        let mut reader = reader?;
        match reader.next().await {
            Step::Send(bytes) => Some((Ok::<_, std::io::Error>(bytes), Some(reader))),
            Step::Last(bytes) => Some((Ok(bytes), None)),
            Step::Failed(e) => Some((Err(e), None)),
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

/// One follower of a run's events: where it is in the events file, and
/// which event comes next. It holds one read chunk at a time.
struct Reader {
    run: Arc<Run>,
    file: Option<std::fs::File>,
    /// The next event's index, and where the next bytes start.
    next: u64,
    offset: u64,
    /// Inside an event line (its `data:` sent, not yet its end).
    in_line: bool,
    /// Events still to skip before the first one sent (`from`).
    skip: u64,
    phase: Phase,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

enum Phase {
    Events,
    /// The result event's document, streamed from its file.
    Result {
        file: std::fs::File,
        offset: u64,
        len: u64,
    },
    Closing,
}

enum Step {
    Send(Bytes),
    Last(Bytes),
    Failed(std::io::Error),
}

const END_EVENT: &[u8] = b"event: end\ndata: {}\n\n";

impl Reader {
    fn new(run: Arc<Run>, from: u64, permit: tokio::sync::OwnedSemaphorePermit) -> Reader {
        let (next, offset) = run.log.mark_before(from);
        Reader {
            run,
            file: None,
            next,
            offset,
            in_line: false,
            skip: from - next,
            phase: Phase::Events,
            _permit: permit,
        }
    }

    async fn next(&mut self) -> Step {
        loop {
            match std::mem::replace(&mut self.phase, Phase::Closing) {
                Phase::Closing => return Step::Last(Bytes::from_static(END_EVENT)),
                Phase::Result { file, offset, len } if offset < len => {
                    return match crate::files::read_at(file, offset, len).await {
                        Ok((_, chunk)) if chunk.is_empty() => Step::Failed(std::io::Error::other("the result file is short")),
                        Ok((file, chunk)) => {
                            self.phase = Phase::Result { file, offset: offset + chunk.len() as u64, len };
                            Step::Send(chunk)
                        }
                        Err(e) => Step::Failed(e),
                    };
                }
                Phase::Result { .. } => return Step::Send(Bytes::from_static(b"}\n\n")),
                Phase::Events => {
                    self.phase = Phase::Events;
                    if let Some(step) = self.events().await {
                        return step;
                    }
                }
            }
        }
    }

    /// The next chunk of events, a keepalive, or the last event once the
    /// log is finished; `None` when a chunk held only skipped events, or
    /// the log changed while it waited.
    async fn events(&mut self) -> Option<Step> {
        let log = Arc::clone(&self.run.log);
        let waiting = log.changed.notified();
        tokio::pin!(waiting);
        // Registered before the look: a push in between still wakes us.
        waiting.as_mut().enable();
        let written = log.written();
        if self.offset < written.bytes {
            let file = match self.file.take() {
                Some(f) => f,
                None => match crate::files::open_in(&self.run.dir, EVENTS_FILE) {
                    Ok(f) => f,
                    Err(e) => return Some(Step::Failed(e)),
                },
            };
            let (file, chunk) = match crate::files::read_at(file, self.offset, written.bytes).await {
                Ok(r) => r,
                Err(e) => return Some(Step::Failed(e)),
            };
            self.file = Some(file);
            if chunk.is_empty() {
                return Some(Step::Failed(std::io::Error::other("the events file is shorter than its log")));
            }
            self.offset += chunk.len() as u64;
            let mut out = Vec::with_capacity(chunk.len() + 64);
            sse(&chunk, &mut self.next, &mut self.in_line, &mut self.skip, &mut out);
            return (!out.is_empty()).then(|| Step::Send(Bytes::from(out)));
        }
        if written.done {
            return Some(self.last(written.count));
        }
        if tokio::time::timeout(KEEPALIVE, waiting).await.is_err() {
            return Some(Step::Send(Bytes::from_static(b": keepalive\n\n")));
        }
        None
    }

    /// The run's last event, with index `count`: its result (the one event
    /// not in the events file, streamed from the run's result file), or
    /// the error it ended with. Skipped when `from` was past it.
    fn last(&mut self, count: u64) -> Step {
        self.file = None;
        self.phase = Phase::Closing;
        if self.skip > 0 {
            return Step::Last(Bytes::from_static(END_EVENT));
        }
        let head = format!("id: {count}\ndata: ");
        match self.run.end() {
            End::Done { result_bytes, .. } => match crate::files::open_in(&self.run.dir, RESULT_FILE) {
                Ok(file) => {
                    self.phase = Phase::Result { file, offset: 0, len: result_bytes };
                    Step::Send(Bytes::from(format!("{head}{{\"type\":\"result\",\"result\":")))
                }
                Err(e) => Step::Failed(e),
            },
            End::Failed { code, message } => {
                let event = crate::backend::error_event(code, &message);
                Step::Send(Bytes::from(format!("{head}{event}\n\n")))
            }
            End::Running => Step::Failed(std::io::Error::other("the run's log finished before its end was recorded")),
        }
    }
}

/// Events file bytes (whole JSON lines, the first maybe begun in an
/// earlier chunk, the last maybe ended in a later one) as SSE: each line
/// `id: N` and `data: LINE`, then a blank line; the first `skip` lines are
/// dropped. JSON lines hold no newline, so a line is one `data:` field
/// however it is cut. Pure.
fn sse(chunk: &[u8], next: &mut u64, in_line: &mut bool, skip: &mut u64, out: &mut Vec<u8>) {
    let mut rest = chunk;
    while !rest.is_empty() {
        let (part, ends) = match memchr::memchr(b'\n', rest) {
            Some(i) => (&rest[..i], Some(i + 1)),
            None => (rest, None),
        };
        if *skip == 0 {
            if !*in_line {
                out.extend_from_slice(format!("id: {next}\ndata: ").as_bytes());
            }
            out.extend_from_slice(part);
        }
        *in_line = true;
        match ends {
            Some(used) => {
                if *skip == 0 {
                    out.extend_from_slice(b"\n\n");
                } else {
                    *skip -= 1;
                }
                *next += 1;
                *in_line = false;
                rest = &rest[used..];
            }
            None => rest = &[],
        }
    }
}

#[utoipa::path(get, path = "/v1/runs/{id}/artifacts/{path}", params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 200, description = "the artifact's bytes"), (status = 404, body = crate::api::ErrorBody),
        (status = 409, description = "`changed`: the file no longer has the listed size and sha256", body = crate::api::ErrorBody),
        (status = 429, description = "`busy`: this token's artifact replies in flight hold its share of the read budget", body = crate::api::ErrorBody)),
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
    let owned = Arc::clone(&state);
    let name = tenant.name.clone();
    artifacts::respond(&state, &tenant, move || read_artifact(&owned, &name, &id, &path)).await
}

/// The run's result must be in (its end recorded) and list `path`.
fn read_artifact(state: &Shared, tenant: &str, id: &str, path: &str) -> Result<artifacts::Found, ApiError> {
    let run = state.run_of(tenant, id)?;
    let End::Done { .. } = run.end() else { return Err(ApiError::not_found("finished run")) };
    let listing = artifacts::read_listing(&run.dir)?;
    artifacts::listed(&listing, &run.dir, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lines` cut at every byte boundary `cuts`, through `sse`.
    fn through(lines: &[u8], cuts: &[usize], skip: u64) -> (String, u64) {
        let (mut next, mut in_line, mut skip, mut out) = (0, false, skip, Vec::new());
        let mut at = 0;
        for &cut in cuts.iter().chain([lines.len()].iter()) {
            sse(&lines[at..cut], &mut next, &mut in_line, &mut skip, &mut out);
            at = cut;
        }
        (String::from_utf8(out).unwrap(), next)
    }

    #[test]
    fn events_become_sse_with_their_index_however_the_file_is_cut() {
        let lines = b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n";
        let want = "id: 0\ndata: {\"a\":1}\n\nid: 1\ndata: {\"b\":2}\n\nid: 2\ndata: {\"c\":3}\n\n";
        assert_eq!(through(lines, &[], 0), (want.to_owned(), 3));
        for cut in 1..lines.len() {
            assert_eq!(through(lines, &[cut], 0).0, want, "cut at {cut}");
        }
        assert_eq!(through(lines, &[3, 9, 10], 0).0, want);
    }

    #[test]
    fn a_result_is_kept_with_its_streams_as_written_and_no_host_path() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("alice/r1");
        std::fs::create_dir_all(&run).unwrap();
        let out = run.join("output");
        let raw = format!(
            r#"{{"schema_version":{},"status":"ok","denials":[{{"syscall":"ptrace"}}],"stdout":{{"text":"\u0001{}","bytes":2}},"stderr":{{"text":""}},"output_dir":{},"setup_error":{{"message":"open {}/input/a"}},"artifacts":[{{"path":"a.txt","bytes":3}}]}}"#,
            jail::result::SCHEMA_VERSION,
            run.display(),
            Value::from(out.display().to_string()),
            run.display()
        );
        let view = View::of_run(&run, &[dir.path()]);
        let kept = keep_result(&run, &RawResult::line(format!(r#"{{"type":"result","result":{raw}}}"#)), &view).unwrap();
        assert_eq!((kept.status.as_str(), kept.denials), ("ok", 1));
        let text = std::fs::read_to_string(run.join(RESULT_FILE)).unwrap();
        assert!(
            text.contains(&format!(r#""stdout":{{"text":"\u0001{}","bytes":2}}"#, run.display())),
            "the stream as written: {text}"
        );
        let shown: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(shown["output_dir"], Value::Null);
        assert_eq!(shown["setup_error"]["message"], "open /workspace/input/a");
        assert!(matches!(kept.end, End::Done { artifact_bytes: 3, result_bytes } if result_bytes == text.len() as u64));
        let listing = artifacts::read_listing(&run).unwrap();
        assert_eq!(listing["output_dir"], Value::from(out.display().to_string()));
        // Another schema version is refused, and nothing is kept of it.
        let other = tempfile::tempdir().unwrap();
        let e = keep_result(other.path(), &RawResult::of(&serde_json::json!({"schema_version": 999})), &view)
            .err()
            .unwrap();
        assert!(e.contains("999"), "{e}");
    }

    #[test]
    fn the_first_events_are_skipped_to_resume_where_a_reader_stopped() {
        let lines = b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n";
        for cut in 1..lines.len() {
            assert_eq!(through(lines, &[cut], 2), ("id: 2\ndata: {\"c\":3}\n\n".to_owned(), 3), "cut at {cut}");
        }
        assert_eq!(through(lines, &[], 5), (String::new(), 3));
    }
}
