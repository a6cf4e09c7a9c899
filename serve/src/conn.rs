//! The HTTP connections: hyper's HTTP/1 server (`http1::Builder`) on each
//! accepted socket, serving the axum router, held to what a hostile client
//! meets (issue #33):
//!
//! - a global cap on open connections (`--max-connections`): one over it
//!   is closed as it is accepted, before hyper reads a byte;
//! - a cap on connections that have not yet sent a request with a valid
//!   token (`--max-unauthenticated`): a new one past it closes the oldest
//!   of them once that one is [`EVICTABLE_AFTER`] old, so held sockets
//!   cannot keep a newcomer out (and a burst of fresh clients does not
//!   close each other), and none of them holds more than its socket and
//!   hyper's buffer;
//! - hyper's header read timeout (`--header-timeout`), which hyper starts
//!   when a connection waits for a request (its accept, or its last
//!   reply's end): a slow header is closed;
//! - an idle timeout (`--idle-timeout`): a connection with no request in
//!   flight that received nothing for this long is closed;
//! - a send timeout (`--send-timeout`): a write the client does not take
//!   for this long fails with `TimedOut`, which ends the connection, so a
//!   stalled reader of an event stream, an artifact or a result holds its
//!   socket and its reply's bounded buffers no longer than that;
//! - hyper's buffer bound (`max_buf_size`), so a connection holds at most
//!   [`MAX_BUF`] of reply bytes in the server, whatever the client reads.
//!
//! Each closure is counted in `/metrics` (`jail_limit_hits_total`). The
//! per-tenant caps on requests, streams and artifact replies are the
//! router's (`admit` in server.rs, with the tenants in state.rs).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::config::Timeouts;
use crate::metrics::Metrics;

/// How long a connection may go without a request with a valid token
/// before a newcomer past `--max-unauthenticated` may close it: a client
/// sends its header at once, so only a slow or silent one is that old, and
/// a burst of fresh clients is never turned away by each other.
const EVICTABLE_AFTER: Duration = Duration::from_secs(2);

/// Bytes hyper buffers per connection at most (its read buffer for a
/// request's head, its write queue for a reply). hyper's minimum is 8 KiB.
pub const MAX_BUF: usize = 64 << 10;

/// The connection limits, as the flags give them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_unauthenticated: usize,
    pub timeouts: Timeouts,
}

/// The open connections: how many, and the unauthenticated ones by age.
#[derive(Default)]
pub struct Table {
    open: AtomicUsize,
    next: AtomicU64,
    /// Connections with no authenticated request yet, oldest first, with
    /// when each was accepted.
    unauthenticated: Mutex<BTreeMap<u64, (Instant, Arc<Notify>)>>,
    ended: Notify,
}

impl Table {
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    pub fn unauthenticated(&self) -> usize {
        lock(&self.unauthenticated).len()
    }

    fn forget(&self, id: u64) {
        lock(&self.unauthenticated).remove(&id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One connection, shared by its task, its socket's reads and writes, and
/// the requests on it (a request extension).
pub struct Conn {
    id: u64,
    table: Arc<Table>,
    born: Instant,
    /// Milliseconds after `born` of the last byte received, or of the end
    /// of the last reply.
    last: AtomicU64,
    /// Requests in flight (until their reply's last byte).
    active: AtomicUsize,
    authenticated: AtomicBool,
    /// The tenant of its first request with a valid token, for the limits
    /// it hits after.
    tenant: std::sync::OnceLock<String>,
    evict: Arc<Notify>,
    send_timed_out: AtomicBool,
}

impl Conn {
    fn touch(&self) {
        let ms = self.born.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
        self.last.fetch_max(ms, Ordering::SeqCst);
    }

    /// A request with `tenant`'s valid token came on it: it leaves the
    /// unauthenticated ones.
    pub fn authenticated(&self, tenant: &str) {
        if !self.authenticated.swap(true, Ordering::SeqCst) {
            let _ = self.tenant.set(tenant.to_owned());
            self.table.forget(self.id);
        }
    }

    fn tenant(&self) -> &str {
        self.tenant.get().map_or("", String::as_str)
    }

    /// A request began; it is in flight until the guard is dropped (with
    /// its reply's body).
    pub fn started(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Ordering::SeqCst);
        Active(Arc::clone(self))
    }

    /// When the connection will have been idle for `idle`, if nothing comes.
    fn idle_at(&self, idle: Duration) -> Instant {
        if self.active.load(Ordering::SeqCst) > 0 {
            return Instant::now() + idle;
        }
        self.born + Duration::from_millis(self.last.load(Ordering::SeqCst)) + idle
    }
}

impl Conn {
    fn new(id: u64, table: Arc<Table>) -> Conn {
        Conn {
            id,
            table,
            born: Instant::now(),
            last: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            authenticated: AtomicBool::new(false),
            tenant: std::sync::OnceLock::new(),
            evict: Arc::new(Notify::new()),
            send_timed_out: AtomicBool::new(false),
        }
    }
}

/// A request in flight on its connection.
pub struct Active(Arc<Conn>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serve `router` on `listener` until `stop` resolves, then let each
/// connection finish its request in flight (hyper's graceful shutdown) and
/// return once all have ended.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    table: Arc<Table>,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()>,
) {
    let (stopping, stopped) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            a = listener.accept() => a,
        };
        let socket = match accepted {
            Ok((socket, _)) => socket,
            Err(e) => {
                // EMFILE and the like: the connections that hold the
                // descriptors end by their timeouts; try again shortly.
                metrics.limit_hit("accept_failed", "");
                eprintln!("jail serve: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if table.open.load(Ordering::SeqCst) >= limits.max_connections {
            metrics.limit_hit("max_connections", "");
            drop(socket);
            continue;
        }
        table.open.fetch_add(1, Ordering::SeqCst);
        let conn = Arc::new(Conn::new(table.next.fetch_add(1, Ordering::SeqCst), Arc::clone(&table)));
        {
            let mut waiting = lock(&table.unauthenticated);
            let old_enough = waiting.first_key_value().is_some_and(|(_, (born, _))| born.elapsed() >= EVICTABLE_AFTER);
            if waiting.len() >= limits.max_unauthenticated && old_enough {
                if let Some((_, (_, oldest))) = waiting.pop_first() {
                    metrics.limit_hit("max_unauthenticated", "");
                    oldest.notify_one();
                }
            }
            waiting.insert(conn.id, (conn.born, Arc::clone(&conn.evict)));
        }
        tokio::spawn(connection(socket, conn, router.clone(), limits.timeouts, Arc::clone(&metrics), stopped.clone()));
    }
    let _ = stopping.send(true);
    loop {
        let ended = table.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if table.open.load(Ordering::SeqCst) == 0 {
            return;
        }
        ended.await;
    }
}

/// How a connection ended, when the server ended it.
fn closed_by_us(conn: &Conn, served: &Result<(), hyper::Error>) -> Option<&'static str> {
    match served {
        Err(_) if conn.send_timed_out.load(Ordering::SeqCst) => Some("send_timeout"),
        Err(e) if e.is_timeout() => Some("header_timeout"),
        _ => None,
    }
}

async fn connection(
    socket: TcpStream,
    conn: Arc<Conn>,
    router: Router,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    mut stopped: watch::Receiver<bool>,
) {
    let _ = socket.set_nodelay(true);
    let io = hyper_util::rt::TokioIo::new(Watched { io: socket, conn: Arc::clone(&conn), send: timeouts.send, stall: None });
    let service = {
        let conn = Arc::clone(&conn);
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(Arc::clone(&conn));
            let mut router = router.clone();
            async move { tower::Service::call(&mut router, req).await }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeouts.header)
        .max_buf_size(MAX_BUF);
    let mut served = Box::pin(builder.serve_connection(io, service));
    let mut stopping = false;
    let evict = Arc::clone(&conn.evict);
    loop {
        if !stopping && *stopped.borrow() {
            stopping = true;
            served.as_mut().graceful_shutdown();
        }
        let idle_at = conn.idle_at(timeouts.idle);
        tokio::select! {
            // The connection first: bytes that came are read (and a request
            // begun) before its idleness is judged.
            biased;
            r = served.as_mut() => {
                if let Some(why) = closed_by_us(&conn, &r) {
                    metrics.limit_hit(why, conn.tenant());
                }
                break;
            }
            () = evict.notified() => break,
            changed = stopped.changed(), if !stopping => {
                if changed.is_err() {
                    stopping = true;
                    served.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep_until(idle_at) => {
                if conn.active.load(Ordering::SeqCst) == 0 && Instant::now() >= conn.idle_at(timeouts.idle) {
                    metrics.limit_hit("idle_timeout", conn.tenant());
                    break;
                }
            }
        }
    }
    // Dropping hyper's connection closes the socket.
    drop(served);
    conn.table.forget(conn.id);
    conn.table.open.fetch_sub(1, Ordering::SeqCst);
    conn.table.ended.notify_waiters();
}

/// A socket whose reads mark the connection live and whose writes fail
/// with `TimedOut` once one has waited `send` for the client.
struct Watched {
    io: TcpStream,
    conn: Arc<Conn>,
    send: Duration,
    /// Armed while a write waits for the client.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Watched {
    /// A write is pending: fail it once it has waited `send`.
    fn stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let send = self.send;
        let stall = self.stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(send)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.conn.send_timed_out.store(true, Ordering::SeqCst);
                Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "the client took no bytes within the send timeout"))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn wrote<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stall = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.stalled(cx).map(Err),
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.conn.touch();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(cx, r)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.wrote(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.wrote(cx, r)
    }
}

/// What the open-files limit leaves for connections: the soft limit is
/// raised to the hard one, and every run, session and the pool keep
/// `reserve` descriptors. `None` when it leaves none.
pub fn connections_the_fd_limit_allows(reserve: u64) -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    soft.checked_sub(reserve).filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn conn() -> Arc<Conn> {
        Arc::new(Conn::new(0, Arc::default()))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_is_idle_only_without_a_request_in_flight() {
        let c = conn();
        let idle = Duration::from_millis(200);
        assert_eq!(c.idle_at(idle), c.born + idle, "idle counts from the accept");
        let active = c.started();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(c.idle_at(idle) > Instant::now(), "a request in flight is never idle");
        drop(active);
        assert!(c.idle_at(idle) + Duration::from_millis(20) >= Instant::now() + idle, "idle counts from the reply's end");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(c.idle_at(idle) <= Instant::now());
    }

    /// A server side of a loopback connection, watched, and its client.
    async fn pair(send: Duration) -> (Watched, TcpStream, Arc<Conn>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let c = conn();
        (Watched { io: server, conn: Arc::clone(&c), send, stall: None }, client, c)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_write_the_client_does_not_take_fails_after_the_send_timeout() {
        let (mut w, _client, c) = pair(Duration::from_millis(300)).await;
        let chunk = vec![0u8; 1 << 16];
        let started = std::time::Instant::now();
        // The client reads nothing: the socket's buffers fill, then a write waits.
        let err = loop {
            if let Err(e) = w.write_all(&chunk).await {
                break e;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "the writes never stalled");
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(c.send_timed_out.load(Ordering::SeqCst));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_client_that_takes_the_bytes_is_never_cut() {
        let (mut w, mut client, c) = pair(Duration::from_millis(300)).await;
        let reader = tokio::spawn(async move {
            let mut sink = vec![0u8; 1 << 16];
            let mut total = 0usize;
            while let Ok(n @ 1..) = client.read(&mut sink).await {
                total += n;
            }
            total
        });
        let chunk = vec![0u8; 1 << 16];
        for _ in 0..256 {
            w.write_all(&chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
        drop(w);
        assert_eq!(reader.await.unwrap(), 256 << 16);
        assert!(!c.send_timed_out.load(Ordering::SeqCst));
    }
}
