//! The server: routes, the OpenAPI document, start (the janitor, then the
//! server's cgroup nested for the runs, then the warm pool, then the
//! listener) and drain (in-flight runs, sessions, then the pool closed;
//! the janitor removes the nested cgroups once the server is gone).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use utoipa::OpenApi;

use crate::config::{load_tenants, ConfigError, ServeArgs, Tenant};
use crate::nest::RunCgroups;
use crate::pool::{Health, Pool, PoolConfig};
use crate::spawn::SpawnBackend;
use crate::state::{AppState, Shared};
use crate::{janitor, nest, runs, sessions};

/// How long open connections (event streams) get after the drain.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("cannot find this binary, to find `jail` beside it: {0}")]
    SelfExe(std::io::Error),
    #[error("no `jail` binary at {0}: jail-serve runs each request with the `jail` beside it; install both (`make install`) or build it (`cargo build -p jail`)")]
    NoJail(PathBuf),
    #[error("cannot make the work folder in {0}: {1} (give --work-dir a writable folder)")]
    Work(PathBuf, std::io::Error),
    #[error("cannot start the janitor: {0}")]
    Janitor(std::io::Error),
    #[error("cannot listen on {0}: {1} (give --listen a free address)")]
    Listen(std::net::SocketAddr, std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("the warm pool did not start: {0} (fix the cause, or serve without it: --pool-size 0)")]
    Pool(#[from] crate::pool::StartError),
    #[error("the work folder {0} is not UTF-8, which the pool's protocol needs: give --work-dir a UTF-8 path")]
    NotUtf8(PathBuf),
    #[error("serving: {0}")]
    Serve(std::io::Error),
    #[error("the open-files limit leaves no descriptor for connections once {0} are kept for runs: raise `ulimit -n`, or lower --max-runs")]
    Files(u64),
}

/// Descriptors kept for the server itself (its pool, its janitor, its
/// listener, the files it reads) and for each run it may have in flight
/// (a `jail run`'s pipes, its events and result files), out of the
/// open-files limit, before any go to connections.
const FD_RESERVE: u64 = 256;
const FD_PER_RUN: u64 = 8;

#[derive(OpenApi)]
#[openapi(
    info(title = "jail serve", description = "Python runs and sessions, each in a fresh Linux jail"),
    paths(runs::create, runs::get, runs::cancel, runs::events, runs::artifact, sessions::create, sessions::exec,
          sessions::delete, sessions::artifact, sessions::put_file, sessions::get_file, sessions::list_files, healthz,
          readyz, metrics),
    modifiers(&Bearer)
)]
struct Doc;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        let scheme = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build();
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "the process serves")))]
async fn healthz() -> &'static str {
    "ok\n"
}

#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "takes runs (a second line says where runs get their cgroups)"),
    (status = 503, description = "draining, full, or the warm pool is restarting or was given up (the body says which and why)")))]
async fn readyz(State(state): State<Shared>) -> Response {
    if state.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    if state.in_flight.load(Ordering::SeqCst) >= state.max_runs {
        return (StatusCode::SERVICE_UNAVAILABLE, "full\n").into_response();
    }
    // Runs still run (on `jail run`) while the pool is down, but slower:
    // a load balancer should prefer a replica whose pool is up.
    match state.pool.as_ref().map(|p| p.health()) {
        Some(Health::Restarting(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("pool restarting: {why}\n")).into_response(),
        Some(Health::Failed(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("pool failed: {why}\n")).into_response(),
        _ => format!("ready\n{}", state.run_cgroups.readiness()).into_response(),
    }
}

#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format")))]
async fn metrics(State(state): State<Shared>) -> Response {
    let pool = match &state.pool {
        Some(p) => Some(p.snapshot().await),
        None => None,
    };
    let mut text = state.metrics.render(
        state.in_flight.load(Ordering::SeqCst),
        state.sessions_open(),
        state.draining.load(Ordering::SeqCst),
        pool.as_ref(),
    );
    state.run_cgroups.render(&mut text);
    let bounds = crate::metrics::Bounds {
        open: state.conns.open(),
        unauthenticated: state.conns.unauthenticated(),
        max_connections: state.max_connections,
        kept: state.kept(),
        kept_limits: state.tenants.values().map(|t| (t.name.clone(), t.max_kept_bytes)).collect(),
    };
    state.metrics.render_bounds(&mut text, &bounds);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Response {
    Json(Doc::openapi()).into_response()
}

async fn not_found() -> Response {
    crate::api::ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint: see GET /openapi.json").into_response()
}

/// Every request passes here first. One under `/v1/` must carry a valid
/// token (else 401, and its connection is closed: a client with no token
/// keeps none open); it then marks its connection authenticated (conn.rs)
/// and takes one of its tenant's requests in flight, held until its
/// reply's last byte is sent, or gets 429. Any other request takes one of
/// the few shared by requests without a token.
async fn admit(State(state): State<Shared>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let conn = req.extensions().get::<Arc<crate::conn::Conn>>().cloned();
    let active = conn.as_ref().map(|c| c.started());
    let permit = if req.uri().path().starts_with("/v1/") {
        let tenant = match state.tenant(req.headers()) {
            Ok(t) => t,
            Err(e) => {
                state.metrics.rejected(e.code);
                let mut r = e.into_response();
                r.headers_mut().insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
                return r;
            }
        };
        if let Some(c) = &conn {
            c.authenticated(&tenant.name);
        }
        let gate = state.gates.get(&tenant.name).map(|g| Arc::clone(&g.requests));
        match gate.and_then(|g| g.try_acquire_owned().ok()) {
            Some(p) => p,
            None => {
                state.metrics.limit_hit("tenant_requests", &tenant.name);
                state.metrics.rejected("busy");
                let why = format!("this token has {} requests in flight, its most: wait for one to end", tenant.max_requests);
                return crate::api::ApiError::busy(why).into_response();
            }
        }
    } else {
        match Arc::clone(&state.anonymous).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                state.metrics.limit_hit("anonymous_requests", "");
                let why = format!(
                    "{} requests without a token are in flight, the most: retry shortly",
                    crate::state::ANONYMOUS_REQUESTS
                );
                return crate::api::ApiError::busy(why).into_response();
            }
        }
    };
    let response = next.run(req).await;
    response.map(|body| axum::body::Body::new(Held { body, _permit: permit, _active: active }))
}

/// A reply's body and what it holds until it is sent or dropped: its
/// tenant's request in flight, its connection's activity.
struct Held {
    body: axum::body::Body,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _active: Option<crate::conn::Active>,
}

impl axum::body::HttpBody for Held {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/runs", post(runs::create))
        .route("/v1/runs/{id}", get(runs::get).delete(runs::cancel))
        .route("/v1/runs/{id}/events", get(runs::events))
        .route("/v1/runs/{id}/artifacts/{*path}", get(runs::artifact))
        .route("/v1/sessions", post(sessions::create))
        .route("/v1/sessions/{id}/exec", post(sessions::exec))
        .route("/v1/sessions/{id}", delete(sessions::delete))
        .route("/v1/sessions/{id}/artifacts/{*path}", get(sessions::artifact))
        .route("/v1/sessions/{id}/files", get(sessions::list_files))
        .route("/v1/sessions/{id}/files/{*path}", get(sessions::get_file).put(sessions::put_file))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), admit))
        .with_state(state)
}

/// `jail serve`: check the configuration, then serve until SIGTERM/SIGINT and a drain.
pub fn main(args: ServeArgs) -> ExitCode {
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jail serve: {e}");
            ExitCode::from(jail::result::EXIT_SETUP_FAILED as u8)
        }
    }
}

fn serve(args: &ServeArgs) -> Result<(), ServeError> {
    let tenants = load_tenants(&args.tokens)?;
    let jail = std::env::current_exe().map_err(ServeError::SelfExe)?.with_file_name("jail");
    if !jail.is_file() {
        return Err(ServeError::NoJail(jail));
    }
    let parent = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new()
        .prefix("jail-serve-")
        .tempdir_in(&parent)
        .map_err(|e| ServeError::Work(parent.clone(), e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::Permissions::from_mode(crate::state::private_mode());
        std::fs::set_permissions(work.path(), mode).map_err(|e| ServeError::Work(parent.clone(), e))?;
    }
    // Session handles are unix sockets, whose paths must be short
    // (SUN_LEN): their folders live in a short folder of the system's.
    let tmp = std::env::temp_dir();
    let sessions = tempfile::Builder::new()
        .prefix("jsv-")
        .tempdir_in(&tmp)
        .map_err(|e| ServeError::Work(tmp.clone(), e))?;
    {
        // As the work folder: a root server's jails reach their session's
        // input folder beneath it.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::Permissions::from_mode(crate::state::private_mode());
        std::fs::set_permissions(sessions.path(), mode).map_err(|e| ServeError::Work(tmp.clone(), e))?;
    }
    // Before the runtime and its threads: the janitor must outlive us.
    let mut janitor = janitor::start(&[work.path(), sessions.path()]).map_err(ServeError::Janitor)?;
    // Before the runtime too: a process joins a cgroup with all its
    // threads, and every jail must be started after it (nest.rs).
    let run_cgroups = match args.no_nest_cgroup {
        true => RunCgroups::Off,
        false => nest::start(janitor.pid, &mut |record| janitor::tell(&mut janitor, record), args.policy.as_deref()),
    };
    if let Some(line) = run_cgroups.said() {
        eprintln!("jail serve: {line}");
    }
    // Runs, sessions and the pool's jails alike.
    let run_flags = jail::client::command::Flags {
        policy: args.policy.clone(),
        rootfs: args.rootfs.clone(),
        rootfs_name: args.rootfs_name.clone(),
        cgroup_parent: match &run_cgroups {
            RunCgroups::Nested { runs, .. } => Some(runs.clone()),
            _ => None,
        },
        limits: Default::default(),
    };
    let flags = run_flags.args();
    let timeouts = args.timeouts()?;
    // Every run, session and the pool keep their descriptors whatever the
    // clients hold: the connections get what is left.
    let reserve = FD_RESERVE + FD_PER_RUN * args.max_runs as u64;
    let max_connections = crate::conn::connections_the_fd_limit_allows(reserve)
        .ok_or(ServeError::Files(reserve))?
        .min(args.max_connections);
    if max_connections < args.max_connections {
        eprintln!(
            "jail serve: at most {max_connections} connections (--max-connections {}): the open-files limit keeps {reserve} \
             for runs (raise `ulimit -n`, or lower --max-runs)",
            args.max_connections
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(ServeError::Runtime)?;
    let pool = match args.pool_size {
        0 => None,
        size => {
            let cfg = pool_config(args, &tenants, &jail, &flags, work.path(), sessions.path())?;
            // Started from this (the main) thread, which lives as long as the
            // server: the pool's parent-death signal is tied to it.
            let pool = runtime.block_on(Pool::start(cfg))?;
            eprintln!("jail serve: warm pool of {size} jails up");
            Some(pool)
        }
    };
    let gates = tenants.values().map(|t| (t.name.clone(), crate::state::Gates::of(t))).collect();
    let limits = crate::conn::Limits {
        max_connections: max_connections as usize,
        max_unauthenticated: args.max_unauthenticated as usize,
        timeouts,
    };
    let state = Arc::new(AppState {
        tenants,
        gates,
        anonymous: Arc::new(tokio::sync::Semaphore::new(crate::state::ANONYMOUS_REQUESTS)),
        conns: Arc::default(),
        limits,
        max_connections: limits.max_connections,
        body_timeout: timeouts.body,
        holdings: Default::default(),
        spawn: SpawnBackend { jail: jail.clone(), flags: run_flags },
        pool,
        work: work.path().to_path_buf(),
        sessions: sessions.path().to_path_buf(),
        jail,
        session_flags: flags,
        max_runs: args.max_runs,
        max_body: args.max_body,
        in_flight: Default::default(),
        draining: Default::default(),
        metrics: Default::default(),
        run_cgroups,
    });
    runtime.block_on(run(args, Arc::clone(&state)))?;
    drop(runtime);
    drop(state);
    drop(work);
    drop(sessions);
    // Its end of the pipe closes as the process exits: the janitor then
    // removes the nested cgroups, which the server, in one, cannot.
    drop(janitor);
    Ok(())
}

/// The pool is made like every spawned run (policy, rootfs), with the
/// tenants' longest wall time as its ceiling (a request lowers it), its
/// folders in the work folder and its jails' handles in the short one.
fn pool_config(
    args: &ServeArgs,
    tenants: &std::collections::BTreeMap<String, Tenant>,
    jail: &std::path::Path,
    flags: &[OsString],
    work: &std::path::Path,
    short: &std::path::Path,
) -> Result<PoolConfig, ServeError> {
    if work.to_str().is_none() {
        return Err(ServeError::NotUtf8(work.to_path_buf()));
    }
    let longest = tenants.values().map(|t| t.max_timeout).max().unwrap_or(Duration::from_secs(30));
    let runtime_dir = short.join("p");
    crate::state::make_private_dir(&runtime_dir)
        .map_err(|e| ServeError::Work(runtime_dir.clone(), std::io::Error::other(e.message)))?;
    Ok(PoolConfig {
        jail: jail.to_path_buf(),
        flags: flags.to_vec(),
        size: usize::from(args.pool_size),
        memory_mib: args.pool_memory,
        // Whole seconds, rounded up: every tenant's most is within it exactly.
        timeout: Duration::from_secs(longest.as_secs_f64().ceil() as u64),
        temp_dir: work.to_path_buf(),
        runtime_dir,
    })
}

async fn run(args: &ServeArgs, state: Shared) -> Result<(), ServeError> {
    // Handlers first: a SIGTERM right after "listening" must drain, not kill.
    let signals = Signals::install().map_err(ServeError::Serve)?;
    let listener = tokio::net::TcpListener::bind(args.listen).await.map_err(|e| ServeError::Listen(args.listen, e))?;
    eprintln!("jail serve: listening on {}", listener.local_addr().map_err(ServeError::Serve)?);
    let drain = drain(Arc::clone(&state), Duration::from_secs(args.drain_secs), signals);
    let (limits, table, metrics) = (state.limits, Arc::clone(&state.conns), Arc::clone(&state.metrics));
    let serving = crate::conn::serve(listener, router(state), limits, table, metrics, drain);
    tokio::select! {
        () = serving => Ok(()),
        () = closed_after_drain() => Ok(()),
    }
}

/// Resolves after a SIGTERM or SIGINT once in-flight runs ended (or the
/// drain time passed) and the sessions are stopped; until then new
/// requests get 503.
async fn drain(state: Shared, most: Duration, mut signals: Signals) {
    signals.wait().await;
    state.draining.store(true, Ordering::SeqCst);
    eprintln!("jail serve: draining ({} runs in flight)", state.in_flight.load(Ordering::SeqCst));
    let until = Instant::now() + most;
    while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sessions::stop_all(&state).await;
    // The pool finishes nothing more (no run is in flight), destroys its
    // jails and exits, leaving nothing.
    if let Some(pool) = &state.pool {
        pool.shut_down().await;
    }
    DRAINED.notify_one();
}

static DRAINED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Open connections (an event stream) get `CLOSE_GRACE` after the drain.
async fn closed_after_drain() {
    DRAINED.notified().await;
    tokio::time::sleep(CLOSE_GRACE).await;
}

/// SIGTERM and SIGINT, caught from the moment they are installed.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
    }
}
