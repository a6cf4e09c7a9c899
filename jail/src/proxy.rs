//! The supervisor's egress proxy for `network.mode: allowlist`.
//!
//! It accepts on the listener the jail's PID 1 created in the jail's
//! loopback-only network namespace (network.rs) and speaks just enough
//! HTTP/1.1 for clients that honour `HTTP_PROXY`/`HTTPS_PROXY`: `CONNECT
//! host:port` tunnels (https) and plain-http requests in absolute form
//! (`GET http://host/path`). For each request, in this order, it refuses a
//! malformed request, a host off `network.hosts`, a port off
//! `network.ports`, and a request past `network.max_connections`; then it
//! resolves the name itself, refuses the request if ANY answer lies in a
//! range the script must never reach ([`forbidden_range`]: loopback,
//! private, link-local, CGNAT, multicast, cloud metadata, ... in IPv4 and
//! IPv6, mapped forms included), and connects to exactly the address it
//! checked (pinned: no second lookup a rebinding DNS server could answer
//! differently). All bytes both ways count against `network.max_bytes` for
//! the whole run; at the cap every connection is cut. Every request ends as
//! one [`Connection`] record in the result's `network` section.
//!
//! Threads: one accept thread and one per connection, started only after
//! the clone (the clone needs a single-threaded process, sys.rs). A pipe
//! wakes every one of them when the run ends.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::network;
use crate::policy::{valid_host_name, Allowlist};
use crate::result::{Connection, NetworkReport};

/// Requests listed in the result; later ones are only counted.
pub(crate) const MAX_RECORDS: usize = 1000;
/// Connections served at once; more are answered 503 at once.
pub(crate) const MAX_ACTIVE: usize = 32;
/// The largest request head (request line and headers) accepted.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one upstream connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A write that makes no progress for this long ends the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The variable a trusted caller (the tests) sets to map names to fixed
/// addresses: `name=address,name=address`. Read from the supervisor's own
/// environment, which the script can never touch.
pub(crate) const TEST_RESOLVE_VAR: &str = "JAIL_TEST_RESOLVE";

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error("{TEST_RESOLVE_VAR}: `{0}` is not name=address (an IPv4 or IPv6 address)")]
    Override(String),
    #[error("create the proxy's wake-up pipe")]
    Pipe(#[source] io::Error),
    #[error("start the proxy thread")]
    Spawn(#[source] io::Error),
}

// ------------------------------------------------------------- resolution

/// Name resolution, with the tests' fixed answers first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Resolver {
    overrides: BTreeMap<String, IpAddr>,
}

impl Resolver {
    /// Parse `name=address,...`; names are lowercased.
    pub(crate) fn parse_overrides(text: &str) -> Result<Resolver, ProxyError> {
        let mut overrides = BTreeMap::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, addr) = item.split_once('=').ok_or_else(|| ProxyError::Override(item.to_string()))?;
            let name = name.trim().to_ascii_lowercase();
            let addr: IpAddr = addr.trim().parse().map_err(|_| ProxyError::Override(item.to_string()))?;
            if !valid_host_name(&name) {
                return Err(ProxyError::Override(item.to_string()));
            }
            overrides.insert(name, addr);
        }
        Ok(Resolver { overrides })
    }

    /// The resolver for this run: overrides from [`TEST_RESOLVE_VAR`] when
    /// the caller set it (read by the caller: hostenv.rs).
    pub(crate) fn from_override(text: Option<&str>) -> Result<Resolver, ProxyError> {
        match text {
            Some(text) => Resolver::parse_overrides(text),
            None => Ok(Resolver::default()),
        }
    }

    /// The overridden names, for the result.
    pub(crate) fn names(&self) -> Vec<String> {
        self.overrides.keys().cloned().collect()
    }

    /// Every address `host` resolves to, and whether it was overridden.
    fn resolve(&self, host: &str, port: u16) -> Result<(Vec<SocketAddr>, Origin), String> {
        if let Some(ip) = self.overrides.get(host) {
            return Ok((vec![SocketAddr::new(*ip, port)], Origin::Override));
        }
        let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(|e| format!("cannot resolve {host}: {e}"))?.collect();
        if addrs.is_empty() {
            return Err(format!("{host} has no addresses"));
        }
        Ok((addrs, Origin::Dns))
    }
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Dns,
    /// [`TEST_RESOLVE_VAR`]: loopback is allowed for these names only.
    Override,
}

/// The range an address lies in when the script must never reach it; `None`
/// for a public unicast address.
pub(crate) fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => v6_range(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], bits: u32) -> bool {
    let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

const V4_RANGES: &[([u8; 4], u32, &str)] = &[
    ([169, 254, 169, 254], 32, "cloud metadata (169.254.169.254)"),
    ([0, 0, 0, 0], 8, "unspecified / this network (0.0.0.0/8)"),
    ([127, 0, 0, 0], 8, "loopback (127.0.0.0/8)"),
    ([10, 0, 0, 0], 8, "private (10.0.0.0/8)"),
    ([172, 16, 0, 0], 12, "private (172.16.0.0/12)"),
    ([192, 168, 0, 0], 16, "private (192.168.0.0/16)"),
    ([169, 254, 0, 0], 16, "link-local (169.254.0.0/16)"),
    ([100, 64, 0, 0], 10, "carrier-grade NAT (100.64.0.0/10)"),
    ([192, 0, 0, 0], 24, "IETF protocol assignments (192.0.0.0/24)"),
    ([192, 0, 2, 0], 24, "documentation (192.0.2.0/24)"),
    ([198, 18, 0, 0], 15, "benchmarking (198.18.0.0/15)"),
    ([198, 51, 100, 0], 24, "documentation (198.51.100.0/24)"),
    ([203, 0, 113, 0], 24, "documentation (203.0.113.0/24)"),
    ([224, 0, 0, 0], 4, "multicast (224.0.0.0/4)"),
    ([255, 255, 255, 255], 32, "broadcast (255.255.255.255)"),
    ([240, 0, 0, 0], 4, "reserved (240.0.0.0/4)"),
];

fn v4_range(ip: Ipv4Addr) -> Option<&'static str> {
    V4_RANGES.iter().find(|(net, bits, _)| in_v4(ip, *net, *bits)).map(|(_, _, name)| *name)
}

fn v6_range(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    let embedded = |hi: usize| Ipv4Addr::new((s[hi] >> 8) as u8, s[hi] as u8, (s[hi + 1] >> 8) as u8, s[hi + 1] as u8);
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254) {
        return Some("cloud metadata (fd00:ec2::254)");
    }
    if ip.is_unspecified() {
        return Some("unspecified (::)");
    }
    if ip.is_loopback() {
        return Some("loopback (::1)");
    }
    if s[..5] == [0; 5] && s[5] == 0xffff {
        // ::ffff:a.b.c.d reaches the IPv4 address.
        return v4_range(embedded(6)).map(|_| "IPv4-mapped form of a forbidden address (::ffff:0:0/96)");
    }
    if s[..6] == [0; 6] {
        return Some("IPv4-compatible (::/96, deprecated)");
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        // NAT64 reaches the embedded IPv4 address.
        return v4_range(embedded(6)).map(|_| "NAT64 form of a forbidden address (64:ff9b::/96)");
    }
    if s[0] == 0x2002 {
        // 6to4 embeds an IPv4 relay address.
        return v4_range(embedded(1)).map(|_| "6to4 form of a forbidden address (2002::/16)");
    }
    let prefix = |net: u16, bits: u32| (s[0] & (u16::MAX << (16 - bits))) == net;
    let ranges: [(bool, &str); 7] = [
        (prefix(0xfc00, 7), "unique local (fc00::/7)"),
        (prefix(0xfe80, 10), "link-local (fe80::/10)"),
        (prefix(0xfec0, 10), "site-local (fec0::/10, deprecated)"),
        (prefix(0xff00, 8), "multicast (ff00::/8)"),
        (s[0] == 0x2001 && s[1] == 0x0db8, "documentation (2001:db8::/32)"),
        (s[0] == 0x2001 && s[1] == 0, "Teredo (2001::/32)"),
        (s[0] == 0x0100 && s[1..4] == [0; 3], "discard-only (100::/64)"),
    ];
    ranges.iter().find(|(hit, _)| *hit).map(|(_, name)| *name)
}

/// The addresses the proxy may connect to, in order, or why none: one
/// forbidden answer refuses them all (a name mixing public and internal
/// answers is an attack, not an accident). Overridden names may be loopback.
pub(crate) fn check_addresses(addrs: &[SocketAddr], origin: Origin) -> Result<Vec<SocketAddr>, String> {
    for a in addrs {
        if origin == Origin::Override && a.ip().is_loopback() {
            continue;
        }
        if let Some(range) = forbidden_range(a.ip()) {
            return Err(format!("{} is in a forbidden range: {range}", a.ip()));
        }
    }
    Ok(addrs.to_vec())
}

// ---------------------------------------------------------------- requests

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    /// Lowercased, without a trailing dot.
    pub host: String,
    pub port: u16,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `CONNECT host:port`: answer 200, then relay bytes.
    Connect,
    /// A plain-http request: send `head` (in origin form, with `Host` and
    /// `Connection: close` set by us), then relay.
    Http { head: Vec<u8> },
}

/// Headers the proxy consumes or sets itself.
const HOP_HEADERS: [&str; 5] = ["host", "connection", "proxy-connection", "proxy-authorization", "keep-alive"];

fn split_authority(authority: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    if authority.contains('@') {
        return Err("user info in the authority is not accepted".into());
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or("unclosed `[` in the authority")?;
        (h.to_string(), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = match (port, default_port) {
        (Some(p), _) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("`{p}` is not a port"))?,
        (None, Some(d)) => d,
        (None, None) => return Err("CONNECT needs host:port".into()),
    };
    let host = host.to_ascii_lowercase();
    let host = host.strip_suffix('.').unwrap_or(&host).to_string();
    if host.is_empty() {
        return Err("no host".into());
    }
    Ok((host, port))
}

/// Parse a request head (everything up to and including the blank line).
pub(crate) fn parse_head(head: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(format!("`{}` is not a request line", first.escape_debug()));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("`{}` is not a method", method.escape_debug()));
    }
    if !version.starts_with("HTTP/1.") {
        return Err(format!("`{}` is not HTTP/1.x", version.escape_debug()));
    }
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or_else(|| format!("`{}` is not a header", line.escape_debug()))?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return Err(format!("`{}` is not a header name", name.escape_debug()));
        }
        headers.push((name, value.trim()));
    }
    if method == "CONNECT" {
        let (host, port) = split_authority(target, None)?;
        return Ok(Request { method: method.into(), host, port, kind: Kind::Connect });
    }
    let rest = target
        .strip_prefix("http://")
        .ok_or_else(|| format!("`{}` is not an absolute http:// URL (use CONNECT for https)", target.escape_debug()))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('/') => p.to_string(),
        p => format!("/{p}"),
    };
    let (host, port) = split_authority(authority, Some(80))?;
    let mut out = format!("{method} {path} {version}\r\n");
    for (name, value) in headers {
        if !HOP_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    // One request per upstream connection: a kept-alive client could
    // otherwise send its next request, for another host, down this one.
    out.push_str(&format!("Host: {authority}\r\nConnection: close\r\n\r\n"));
    Ok(Request { method: method.into(), host, port, kind: Kind::Http { head: out.into_bytes() } })
}

// ------------------------------------------------------------------ runtime

/// What every connection thread shares.
struct Shared {
    rules: Allowlist,
    resolver: Resolver,
    /// Each record with its arrival number: connections end in any order,
    /// and the report lists them in the order they arrived.
    records: Mutex<(Vec<(u64, Connection)>, u64)>,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    /// Bytes both ways, against `max_bytes`.
    used: AtomicU64,
    cap_reached: AtomicBool,
    connections: AtomicU32,
    active: AtomicUsize,
    stop: AtomicBool,
    /// Readable once the run ends.
    wake: OwnedFd,
}

impl Shared {
    fn record(&self, arrival: u64, c: Connection) {
        let Ok(mut r) = self.records.lock() else { return };
        if r.0.len() < MAX_RECORDS {
            r.0.push((arrival, c));
        } else {
            r.1 += 1;
        }
    }

    /// Take `n` bytes from the run's budget; false once it is spent.
    fn take(&self, n: usize) -> bool {
        let before = self.used.fetch_add(n as u64, Ordering::SeqCst);
        if before + n as u64 > self.rules.max_bytes {
            self.cap_reached.store(true, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// The running proxy.
pub(crate) struct Proxy {
    shared: Arc<Shared>,
    wake_write: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

/// Start serving `listener` (the socket the jail's PID 1 handed over).
pub(crate) fn start(listener: OwnedFd, rules: Allowlist, resolver: Resolver) -> Result<Proxy, ProxyError> {
    let (wake_read, wake_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ProxyError::Pipe(e.into()))?;
    let shared = Arc::new(Shared {
        rules,
        resolver,
        records: Mutex::new((Vec::new(), 0)),
        bytes_up: AtomicU64::new(0),
        bytes_down: AtomicU64::new(0),
        used: AtomicU64::new(0),
        cap_reached: AtomicBool::new(false),
        connections: AtomicU32::new(0),
        active: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        wake: wake_read,
    });
    let listener = TcpListener::from(listener);
    let s = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("jail-proxy".into())
        .spawn(move || accept_loop(listener, s))
        .map_err(ProxyError::Spawn)?;
    Ok(Proxy { shared, wake_write: Some(wake_write), thread: Some(thread) })
}

impl Proxy {
    /// Stop (the jail is dead by now), wait for every thread, and report.
    pub(crate) fn finish(mut self) -> NetworkReport {
        self.stop();
        let s = &self.shared;
        let (mut records, dropped) = s.records.lock().map(|mut r| (std::mem::take(&mut r.0), r.1)).unwrap_or_default();
        records.sort_by_key(|(arrival, _)| *arrival);
        let connections = records.into_iter().map(|(_, c)| c).collect();
        NetworkReport {
            mode: "allowlist".into(),
            proxy: Some(network::proxy_url()),
            resolver_overrides: s.resolver.names(),
            connections,
            records_dropped: dropped,
            bytes_up: s.bytes_up.load(Ordering::SeqCst),
            bytes_down: s.bytes_down.load(Ordering::SeqCst),
            byte_cap_reached: s.cap_reached.load(Ordering::SeqCst),
        }
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.wake_write.take() {
            let _ = nix::unistd::write(&w, b"x");
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn readable(fds: &mut [PollFd<'_>], timeout: PollTimeout) -> Vec<bool> {
    match poll(fds, timeout) {
        Ok(_) => fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect(),
        Err(_) => vec![false; fds.len()],
    }
}

fn accept_loop(listener: TcpListener, s: Arc<Shared>) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    let mut arrivals = 0u64;
    loop {
        let ready = {
            let mut fds = [
                PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(s.wake.as_fd(), PollFlags::POLLIN),
            ];
            readable(&mut fds, PollTimeout::NONE)
        };
        if s.stop.load(Ordering::SeqCst) || ready.get(1).copied().unwrap_or(true) {
            break;
        }
        if !ready[0] {
            continue;
        }
        let Ok((client, _)) = listener.accept() else { continue };
        let arrival = arrivals;
        arrivals += 1;
        handlers.retain(|h| !h.is_finished());
        if s.active.load(Ordering::SeqCst) >= MAX_ACTIVE {
            let mut client = client;
            refuse(&mut client, 503, "busy", &format!("more than {MAX_ACTIVE} connections at once"));
            s.record(
                arrival,
                Connection {
                    reason: "busy".into(),
                    detail: Some(format!("more than {MAX_ACTIVE} at once")),
                    ..Default::default()
                },
            );
            continue;
        }
        s.active.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(&s);
        match std::thread::Builder::new().name("jail-proxy-conn".into()).spawn(move || {
            let record = serve(client, &shared);
            shared.record(arrival, record);
            shared.active.fetch_sub(1, Ordering::SeqCst);
        }) {
            Ok(h) => handlers.push(h),
            Err(_) => {
                s.active.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
    drop(listener);
    for h in handlers {
        let _ = h.join();
    }
}

fn refuse(client: &mut TcpStream, code: u16, reason: &str, detail: &str) {
    let phrase = match code {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        _ => "Service Unavailable",
    };
    let body = format!("jail proxy: {reason}: {detail}\n");
    let reply = format!(
        "HTTP/1.1 {code} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(reply.as_bytes());
    let _ = client.shutdown(Shutdown::Both);
}

/// Read the request head; returns it and whatever followed it.
fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("the request head is over {MAX_HEAD} bytes"));
        }
        match client.read(&mut chunk) {
            Ok(0) => return Err("the client closed before sending a request".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("reading the request: {e}")),
        }
    }
}

/// Serve one client connection; the record says what happened.
fn serve(mut client: TcpStream, s: &Shared) -> Connection {
    let mut rec = Connection::default();
    let _ = client.set_read_timeout(Some(HEAD_TIMEOUT));
    let _ = client.set_write_timeout(Some(WRITE_TIMEOUT));
    let fail = |client: &mut TcpStream, rec: &mut Connection, code: u16, reason: &str, detail: String| {
        refuse(client, code, reason, &detail);
        rec.reason = reason.into();
        rec.detail = Some(detail);
    };
    let (head, early) = match read_head(&mut client) {
        Ok(h) => h,
        Err(e) => {
            fail(&mut client, &mut rec, 400, "bad_request", e);
            return rec;
        }
    };
    let req = match parse_head(&head) {
        Ok(r) => r,
        Err(e) => {
            fail(&mut client, &mut rec, 400, "bad_request", e);
            return rec;
        }
    };
    rec.method = req.method.clone();
    rec.host = req.host.clone();
    rec.port = req.port;
    if !valid_host_name(&req.host) || !s.rules.allows_host(&req.host) {
        let why = if valid_host_name(&req.host) {
            "is not on network.hosts"
        } else {
            "is not a host name (addresses are never on the list)"
        };
        fail(&mut client, &mut rec, 403, "off_list", format!("{} {why}", req.host));
        return rec;
    }
    if !s.rules.allows_port(req.port) {
        fail(&mut client, &mut rec, 403, "port_off_list", format!("port {} is not on network.ports", req.port));
        return rec;
    }
    if s.connections.fetch_add(1, Ordering::SeqCst) >= s.rules.max_connections {
        fail(
            &mut client,
            &mut rec,
            403,
            "connection_cap",
            format!("network.max_connections ({}) reached", s.rules.max_connections),
        );
        return rec;
    }
    let addrs = match s.resolver.resolve(&req.host, req.port) {
        Ok((addrs, origin)) => match check_addresses(&addrs, origin) {
            Ok(a) => a,
            Err(e) => {
                fail(&mut client, &mut rec, 403, "forbidden_range", e);
                return rec;
            }
        },
        Err(e) => {
            fail(&mut client, &mut rec, 502, "resolve_failed", e);
            return rec;
        }
    };
    // Pinned: only the addresses just checked, never a second lookup.
    let mut upstream = None;
    let mut errors = Vec::new();
    for a in &addrs {
        if s.stop.load(Ordering::SeqCst) {
            break;
        }
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(u) => {
                rec.address = Some(a.to_string());
                upstream = Some(u);
                break;
            }
            Err(e) => errors.push(format!("{a}: {e}")),
        }
    }
    let Some(mut upstream) = upstream else {
        fail(&mut client, &mut rec, 502, "connect_failed", errors.join("; "));
        return rec;
    };
    rec.allowed = true;
    let _ = upstream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = client.set_read_timeout(None);
    let mut first_up = Vec::new();
    match &req.kind {
        Kind::Connect => {
            if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err() {
                rec.reason = "closed".into();
                return rec;
            }
        }
        Kind::Http { head } => first_up.extend_from_slice(head),
    }
    first_up.extend_from_slice(&early);
    rec.reason = relay(&mut client, &mut upstream, &first_up, s, &mut rec.bytes_up, &mut rec.bytes_down).into();
    if rec.reason == "byte_cap" {
        rec.detail = Some(format!("network.max_bytes ({}) reached; the connection was cut", s.rules.max_bytes));
    }
    rec
}

/// Copy bytes both ways until both sides are done, the run ends, or the
/// byte cap is reached. Returns how it ended.
fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    first_up: &[u8],
    s: &Shared,
    up: &mut u64,
    down: &mut u64,
) -> &'static str {
    let cut = |client: &TcpStream, upstream: &TcpStream| {
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
    };
    if !first_up.is_empty() {
        if !s.take(first_up.len()) {
            cut(client, upstream);
            return "byte_cap";
        }
        if upstream.write_all(first_up).is_err() {
            cut(client, upstream);
            return "closed";
        }
        *up += first_up.len() as u64;
        s.bytes_up.fetch_add(first_up.len() as u64, Ordering::SeqCst);
    }
    let mut buf = vec![0u8; 16 * 1024];
    // Which directions still flow: [client -> upstream, upstream -> client].
    let mut open = [true, true];
    while open[0] || open[1] {
        let ready = {
            let mut fds = Vec::with_capacity(3);
            let mut which = Vec::with_capacity(3);
            if open[0] {
                fds.push(PollFd::new(client.as_fd(), PollFlags::POLLIN));
                which.push(0);
            }
            if open[1] {
                fds.push(PollFd::new(upstream.as_fd(), PollFlags::POLLIN));
                which.push(1);
            }
            fds.push(PollFd::new(s.wake.as_fd(), PollFlags::POLLIN));
            which.push(2);
            let r = readable(&mut fds, PollTimeout::NONE);
            which.into_iter().zip(r).filter(|(_, r)| *r).map(|(w, _)| w).collect::<Vec<_>>()
        };
        if ready.contains(&2) || s.stop.load(Ordering::SeqCst) {
            cut(client, upstream);
            return "closed";
        }
        for dir in ready {
            let (from, to, counter, total): (&mut TcpStream, &mut TcpStream, &mut u64, &AtomicU64) = if dir == 0 {
                (&mut *client, &mut *upstream, &mut *up, &s.bytes_up)
            } else {
                (&mut *upstream, &mut *client, &mut *down, &s.bytes_down)
            };
            match from.read(&mut buf) {
                Ok(0) => {
                    open[dir] = false;
                    let _ = to.shutdown(Shutdown::Write);
                }
                Ok(n) => {
                    if !s.take(n) {
                        cut(client, upstream);
                        return "byte_cap";
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        cut(client, upstream);
                        return "closed";
                    }
                    *counter += n as u64;
                    total.fetch_add(n as u64, Ordering::SeqCst);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    cut(client, upstream);
                    return "closed";
                }
            }
        }
    }
    "closed"
}

/// The result's `network` section for a run without a proxy.
pub(crate) fn report_without_proxy(mode: &str) -> NetworkReport {
    NetworkReport { mode: mode.into(), ..NetworkReport::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_and_special_addresses_are_forbidden_and_public_ones_are_not() {
        for a in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "224.0.0.1",
            "239.1.1.1",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd00:ec2::254",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "2001:db8::1",
            "fec0::1",
        ] {
            assert!(forbidden_range(v4(a)).is_some(), "{a} should be forbidden");
        }
        for a in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "169.255.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::101:101",
        ] {
            assert_eq!(forbidden_range(v4(a)), None, "{a} should be allowed");
        }
        assert_eq!(forbidden_range(v4("169.254.169.254")), Some("cloud metadata (169.254.169.254)"));
        assert_eq!(forbidden_range(v4("fd00:ec2::254")), Some("cloud metadata (fd00:ec2::254)"));
    }

    #[test]
    fn one_forbidden_answer_refuses_the_name_and_overrides_allow_only_loopback() {
        let sa = |s: &str| SocketAddr::new(v4(s), 443);
        assert!(check_addresses(&[sa("1.1.1.1"), sa("10.0.0.1")], Origin::Dns).is_err());
        assert!(check_addresses(&[sa("127.0.0.1")], Origin::Dns).is_err());
        assert_eq!(check_addresses(&[sa("127.0.0.1")], Origin::Override).unwrap(), vec![sa("127.0.0.1")]);
        assert!(check_addresses(&[sa("10.1.2.3")], Origin::Override).unwrap_err().contains("private"));
        assert!(check_addresses(&[sa("169.254.169.254")], Origin::Override).unwrap_err().contains("metadata"));
    }

    #[test]
    fn overrides_parse_and_bad_ones_name_the_variable() {
        let r = Resolver::parse_overrides("API.test=127.0.0.1, meta.test=169.254.169.254").unwrap();
        assert_eq!(r.names(), vec!["api.test".to_string(), "meta.test".to_string()]);
        assert_eq!(r.resolve("api.test", 80).unwrap(), (vec![SocketAddr::new(v4("127.0.0.1"), 80)], Origin::Override));
        for bad in ["x", "a.test=", "a.test=nowhere", "=1.2.3.4"] {
            assert!(Resolver::parse_overrides(bad).unwrap_err().to_string().starts_with(TEST_RESOLVE_VAR), "{bad}");
        }
    }

    #[test]
    fn connect_requests_parse_to_host_and_port() {
        let r = parse_head(b"CONNECT API.Example.org.:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!((r.method.as_str(), r.host.as_str(), r.port, r.kind), ("CONNECT", "api.example.org", 443, Kind::Connect));
        assert_eq!(parse_head(b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n").unwrap().host, "::1");
        assert!(parse_head(b"CONNECT example.org HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_head(b"CONNECT example.org:0 HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn plain_http_is_rewritten_to_origin_form_with_our_host_and_connection_close() {
        let head = b"GET http://a.test:8080/p?q=1 HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n";
        let r = parse_head(head).unwrap();
        assert_eq!((r.host.as_str(), r.port), ("a.test", 8080));
        let Kind::Http { head } = r.kind else { panic!() };
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /p?q=1 HTTP/1.1\r\nAccept: */*\r\nHost: a.test:8080\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(parse_head(b"GET http://a.test HTTP/1.0\r\n\r\n").unwrap().port, 80);
        for bad in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"GET https://a.test/ HTTP/1.1\r\n\r\n",
            b"GET http://user@a.test/ HTTP/1.1\r\n\r\n",
            b"get http://a.test/ HTTP/1.1\r\n\r\n",
            b"GET http://a.test/ SPDY/3\r\n\r\n",
            b"GET http://a.test/ HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET  http://a.test/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse_head(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
