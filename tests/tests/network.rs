//! Network egress: `network.mode: allowlist` through the supervisor's proxy,
//! probed from inside the jail against servers these tests start on the
//! host's 127.0.0.1 only. Names reach the test server through the
//! resolver override (`JAIL_TEST_RESOLVE`), which only the trusted caller
//! can set; every name mapped to a forbidden address must be refused before
//! the proxy connects anywhere (the records' `address` stays null), so no
//! packet ever goes to anything but 127.0.0.1.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use jail::result::Connection;
use jail_tests::{data_rootfs, skip, RunResult, Sandbox, Status};

/// A small HTTP/1.1 server on 127.0.0.1: answers every request with
/// `hello <path> <body bytes>`, counting requests and body bytes received.
struct TestServer {
    port: u16,
    requests: Arc<AtomicU64>,
    body_bytes: Arc<AtomicU64>,
}

impl TestServer {
    fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind test server");
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicU64::new(0));
        let body_bytes = Arc::new(AtomicU64::new(0));
        let (r, b) = (Arc::clone(&requests), Arc::clone(&body_bytes));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (r, b) = (Arc::clone(&r), Arc::clone(&b));
                std::thread::spawn(move || serve(conn, &r, &b));
            }
        });
        TestServer { port, requests, body_bytes }
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

fn serve(mut conn: TcpStream, requests: &AtomicU64, body_bytes: &AtomicU64) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    requests.fetch_add(1, Ordering::SeqCst);
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let path = head.split(' ').nth(1).unwrap_or("").to_string();
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    let mut got = buf.len() - head_end;
    body_bytes.fetch_add(got as u64, Ordering::SeqCst);
    while got < length {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                got += n;
                body_bytes.fetch_add(n as u64, Ordering::SeqCst);
            }
        }
    }
    let body = format!("hello {path} {got}");
    let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let _ = conn.write_all(reply.as_bytes());
}

/// A sandbox running an allowlist policy, with resolver overrides.
fn allowlist(network: serde_json::Value, overrides: &str) -> (Sandbox, Vec<(String, String)>) {
    let mut sb = Sandbox::new();
    let policy = serde_json::json!({"version": 1, "name": "allowlist-test", "network": network});
    let path: PathBuf = sb.dir.path().join("policy.json");
    std::fs::write(&path, policy.to_string()).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    sb.extra_args = vec!["--policy".into(), path.display().to_string()];
    let env = if overrides.is_empty() {
        vec![]
    } else {
        vec![("JAIL_TEST_RESOLVE".to_string(), overrides.to_string())]
    };
    (sb, env)
}

fn run_with(sb: &Sandbox, env: &[(String, String)], src: &str) -> RunResult {
    let mut cmd = sb.command(src);
    cmd.env_remove("JAIL_TEST_RESOLVE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn jail");
    jail_tests::parse(&out)
}

fn stdout_json(r: &RunResult) -> serde_json::Value {
    assert_eq!(r.status, Status::Ok, "script failed: {}\nsetup: {:?}", r.stderr.text, r.setup_error);
    serde_json::from_str(r.stdout.text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.stdout.text))
}

fn record<'a>(r: &'a RunResult, host: &str) -> &'a Connection {
    r.network
        .connections
        .iter()
        .find(|c| c.host == host)
        .unwrap_or_else(|| panic!("no record for {host}: {:#?}", r.network))
}

/// Python: fetch each URL with urllib, print {url: body or error}.
const FETCH: &str = r#"
import json, sys, urllib.request
out = {}
for url in URLS:
    try:
        out[url] = urllib.request.urlopen(url, timeout=10).read().decode()
    except Exception as e:
        out[url] = "ERROR " + type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"#;

fn fetch(urls: &[String]) -> String {
    format!("URLS = {}\n{FETCH}", serde_json::to_string(urls).unwrap())
}

#[test]
fn an_allowed_name_is_reached_through_the_proxy_over_http_and_connect() {
    let server = TestServer::start();
    let p = server.port;
    let (sb, env) =
        allowlist(serde_json::json!({"mode": "allowlist", "hosts": ["api.test"], "ports": [p]}), "api.test=127.0.0.1");
    let src = format!(
        r#"
import http.client, json, os, urllib.request
body = urllib.request.urlopen("http://api.test:{p}/plain", timeout=10).read().decode()
# http.client's tunnel is the CONNECT path https clients take.
c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
c.set_tunnel("api.test", {p})
c.request("GET", "/tunnel")
tunnel = c.getresponse().read().decode()
listening = [l.split()[1] for l in open("/proc/net/tcp").read().splitlines()[1:] if l.split()[3] == "0A"]
print(json.dumps({{"plain": body, "tunnel": tunnel, "proxy": os.environ.get("HTTPS_PROXY"), "listening": listening}}))
"#
    );
    let r = run_with(&sb, &env, &src);
    let v = stdout_json(&r);
    assert_eq!(v["plain"], "hello /plain 0");
    assert_eq!(v["tunnel"], "hello /tunnel 0");
    assert_eq!(v["proxy"], "http://127.0.0.1:3128");
    // The only listener in the jail's namespace is the proxy's (0x0C38 = 3128).
    assert_eq!(v["listening"], serde_json::json!(["0100007F:0C38"]));
    assert_eq!(server.requests(), 2);
    let n = &r.network;
    assert_eq!(n.mode, "allowlist");
    assert_eq!(n.proxy.as_deref(), Some("http://127.0.0.1:3128"));
    assert_eq!(n.resolver_overrides, vec!["api.test".to_string()]);
    assert_eq!(n.connections.len(), 2, "{n:#?}");
    for (c, method) in n.connections.iter().zip(["GET", "CONNECT"]) {
        assert_eq!((c.method.as_str(), c.host.as_str(), c.port, c.allowed), (method, "api.test", p, true), "{c:#?}");
        assert_eq!(c.address.as_deref(), Some(format!("127.0.0.1:{p}").as_str()));
        assert!(c.bytes_up > 0 && c.bytes_down > 0, "{c:#?}");
    }
    assert_eq!(n.bytes_up, n.connections.iter().map(|c| c.bytes_up).sum::<u64>());
    assert!(!n.byte_cap_reached);
}

#[test]
fn requests_reaches_an_allowed_name_when_the_rootfs_has_it() {
    let server = TestServer::start();
    let p = server.port;
    let (mut sb, env) =
        allowlist(serde_json::json!({"mode": "allowlist", "hosts": ["api.test"], "ports": [p]}), "api.test=127.0.0.1");
    if data_rootfs().join("usr/bin/python3").exists() {
        sb.rootfs = data_rootfs();
    }
    let src = format!(
        r#"
import json
try:
    import requests
except ImportError:
    print(json.dumps({{"requests": None}}))
else:
    print(json.dumps({{"requests": requests.get("http://api.test:{p}/req", timeout=10).text}}))
"#
    );
    let v = stdout_json(&run_with(&sb, &env, &src));
    if v["requests"].is_null() {
        // The data rootfs ships requests (data.in); only the minimal one,
        // a copy of the host's standard library, may lack it.
        assert_ne!(sb.rootfs, data_rootfs(), "the data rootfs has no `requests`: rebuild it (make rootfs-data)");
        skip(&format!(
            "no data rootfs at {} (build it: make rootfs-data) and {} has no `requests`; urllib is covered above",
            data_rootfs().display(),
            sb.rootfs.display()
        ));
        return;
    }
    assert_eq!(v["requests"], "hello /req 0");
    assert_eq!(server.requests(), 1);
}

#[test]
fn names_and_ports_off_the_list_are_refused_and_wildcards_skip_the_apex() {
    let server = TestServer::start();
    let p = server.port;
    let (sb, env) = allowlist(
        serde_json::json!({"mode": "allowlist", "hosts": ["api.test", "*.wild.test"], "ports": [p]}),
        // Every name maps to the test server: only the list can stop them.
        "api.test=127.0.0.1,other.test=127.0.0.1,x.wild.test=127.0.0.1,wild.test=127.0.0.1",
    );
    let urls = [
        format!("http://other.test:{p}/"),
        format!("http://api.test:{}/", p.wrapping_add(1).max(1)),
        format!("http://x.wild.test:{p}/sub"),
        format!("http://wild.test:{p}/apex"),
    ];
    let r = run_with(&sb, &env, &fetch(&urls));
    let v = stdout_json(&r);
    assert!(v[&urls[0]].as_str().unwrap().contains("403"), "{v}");
    assert!(v[&urls[1]].as_str().unwrap().contains("403"), "{v}");
    assert_eq!(v[&urls[2]], "hello /sub 0");
    assert!(v[&urls[3]].as_str().unwrap().contains("403"), "{v}");
    assert_eq!(server.requests(), 1, "only the subdomain reached the server");
    assert_eq!(record(&r, "other.test").reason, "off_list");
    assert_eq!(record(&r, "api.test").reason, "port_off_list");
    assert!(record(&r, "x.wild.test").allowed);
    assert_eq!(record(&r, "wild.test").reason, "off_list");
    for host in ["other.test", "api.test", "wild.test"] {
        let c = record(&r, host);
        assert!(!c.allowed && c.address.is_none(), "{c:#?}");
    }
}

#[test]
fn names_that_resolve_to_internal_addresses_are_refused_before_any_connect() {
    let server = TestServer::start();
    let p = server.port;
    let hosts = [
        "localhost",
        "ten.test",
        "meta.test",
        "meta6.test",
        "mapped.test",
        "ula.test",
        "cgnat.test",
    ];
    let (sb, env) = allowlist(
        serde_json::json!({"mode": "allowlist", "hosts": hosts, "ports": [p]}),
        // localhost is not overridden: the host's own resolver answers it
        // (127.0.0.1), as in production. The others never see a packet.
        "ten.test=10.1.2.3,meta.test=169.254.169.254,meta6.test=fd00:ec2::254,mapped.test=::ffff:127.0.0.1,\
         ula.test=fd12::1,cgnat.test=100.64.0.1",
    );
    let urls: Vec<String> = hosts.iter().map(|h| format!("http://{h}:{p}/")).collect();
    let r = run_with(&sb, &env, &fetch(&urls));
    let v = stdout_json(&r);
    for u in &urls {
        assert!(v[u].as_str().unwrap().contains("403"), "{u}: {v}");
    }
    assert_eq!(server.requests(), 0);
    for (host, range) in [
        ("localhost", "loopback"),
        ("ten.test", "private (10.0.0.0/8)"),
        ("meta.test", "cloud metadata (169.254.169.254)"),
        ("meta6.test", "cloud metadata (fd00:ec2::254)"),
        ("mapped.test", "IPv4-mapped"),
        ("ula.test", "unique local"),
        ("cgnat.test", "carrier-grade NAT"),
    ] {
        let c = record(&r, host);
        assert_eq!((c.allowed, c.reason.as_str()), (false, "forbidden_range"), "{c:#?}");
        assert!(c.detail.as_deref().unwrap_or("").contains(range), "{host}: {c:#?}");
        assert!(c.address.is_none() && c.bytes_up == 0, "{host} was connected to: {c:#?}");
    }
}

#[test]
fn direct_sockets_from_inside_reach_nothing_but_the_proxy() {
    let server = TestServer::start();
    let p = server.port;
    let (sb, env) =
        allowlist(serde_json::json!({"mode": "allowlist", "hosts": ["api.test"], "ports": [p]}), "api.test=127.0.0.1");
    // The test server listens on the host's 127.0.0.1:p. Reaching it
    // without the proxy would mean the script left its network namespace.
    let src = format!(
        r#"
import json, socket
out = {{}}
for fam, addr in [(socket.AF_INET, ("127.0.0.1", {p})), (socket.AF_INET6, ("::1", {p}))]:
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(addr)
        out[str(fam)] = "connected"
    except OSError as e:
        out[str(fam)] = e.errno
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    out["packet"] = "created"
except OSError as e:
    out["packet"] = e.errno
print(json.dumps(out))
"#
    );
    let v = stdout_json(&run_with(&sb, &env, &src));
    for (k, val) in v.as_object().unwrap() {
        assert!(val.is_number(), "{k}: {val} (expected an errno)");
    }
    assert_eq!(server.requests(), 0);
}

#[test]
fn udp_and_dns_from_inside_are_refused() {
    let (sb, env) = allowlist(serde_json::json!({"mode": "allowlist", "hosts": ["api.test"]}), "api.test=127.0.0.1");
    // A DNS query for a name on the list, sent the way a tunnelling script
    // would: straight to a resolver over UDP. The only resolvers it could
    // name are in its own namespace, where nothing but the proxy listens.
    let src = r#"
import errno, json, socket
out = {}
query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03api\x04test\x00\x00\x01\x00\x01"
for fam, addr in ((socket.AF_INET, ("127.0.0.1", 53)), (socket.AF_INET6, ("::1", 53))):
    try:
        s = socket.socket(fam, socket.SOCK_DGRAM)
    except OSError as e:
        out[str(fam)] = "socket " + errno.errorcode.get(e.errno, str(e.errno))
        continue
    try:
        s.settimeout(2)
        # Connected, so the port-unreachable answer surfaces at once.
        s.connect(addr)
        s.send(query)
        s.recv(512)
        out[str(fam)] = "answered"
    except OSError as e:
        out[str(fam)] = "query " + (errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__)
try:
    socket.getaddrinfo("api.test", 443)
    out["resolve"] = "resolved"
except OSError:
    out["resolve"] = "failed"
print(json.dumps(out))
"#;
    let r = run_with(&sb, &env, src);
    let v = stdout_json(&r);
    for fam in ["2", "10"] {
        // The supervisor lets only TCP stream sockets through: the UDP
        // socket itself is refused, before any query could be sent.
        assert_eq!(v[fam], "socket EPERM", "{v}");
    }
    assert_eq!(v["resolve"], "failed", "{v}");
    for fam in ["AF_INET", "AF_INET6"] {
        assert!(
            r.denials.iter().any(|d| d.what == "socket" && d.family.as_deref() == Some(fam) && d.count >= 1),
            "{fam} UDP socket not reported: {:?}",
            r.denials
        );
    }
    assert!(r.network.connections.is_empty(), "{:#?}", r.network);
}

#[test]
fn only_plain_tcp_sockets_are_created_in_allowlist_mode() {
    let (sb, env) = allowlist(serde_json::json!({"mode": "allowlist", "hosts": ["api.test"]}), "api.test=127.0.0.1");
    // Everything an exfiltration script could reach for beside TCP: raw
    // IP (ICMP tunnels, forged packets), SCTP and UDP-lite on an inet
    // socket, a SOCK_SEQPACKET/RDM type. A TCP stream socket with the
    // flags Python and libc add must still work.
    let src = r#"
import errno, json, socket
out = {}
cases = {
    "raw4": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "raw6": (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    "sctp": (socket.AF_INET, socket.SOCK_STREAM, 132),
    "seqpacket": (socket.AF_INET, socket.SOCK_SEQPACKET, 132),
    "udplite": (socket.AF_INET, socket.SOCK_DGRAM, 136),
    "tcp": (socket.AF_INET, socket.SOCK_STREAM, 0),
    "tcp6": (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP),
    "tcp_flags": (socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, 0),
}
for name, (fam, typ, proto) in cases.items():
    try:
        socket.socket(fam, typ, proto).close()
        out[name] = "created"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"#;
    let r = run_with(&sb, &env, src);
    let v = stdout_json(&r);
    for name in ["raw4", "raw6", "sctp", "seqpacket", "udplite"] {
        assert_eq!(v[name], "EPERM", "{name}: {v}");
    }
    for name in ["tcp", "tcp6", "tcp_flags"] {
        assert_eq!(v[name], "created", "{name}: {v}");
    }
    let refused: u64 = r.denials.iter().filter(|d| d.what == "socket").map(|d| d.count).sum();
    assert_eq!(refused, 5, "{:?}", r.denials);
    let why = &r.denials.iter().find(|d| d.what == "socket").unwrap().detail;
    assert!(why.as_deref().is_some_and(|w| w.contains("TCP")), "the denial should say only TCP is allowed: {why:?}");
}

#[test]
fn the_byte_cap_stops_a_large_upload() {
    let server = TestServer::start();
    let p = server.port;
    let (sb, env) = allowlist(
        serde_json::json!({"mode": "allowlist", "hosts": ["api.test"], "ports": [p], "max_bytes": "64K"}),
        "api.test=127.0.0.1",
    );
    let src = format!(
        r#"
import json, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request("http://api.test:{p}/up", data=b"x" * (4 << 20)), timeout=10).read()
    print(json.dumps({{"upload": "completed"}}))
except Exception as e:
    print(json.dumps({{"upload": type(e).__name__}}))
"#
    );
    let r = run_with(&sb, &env, &src);
    let v = stdout_json(&r);
    assert_ne!(v["upload"], "completed", "{v}");
    let n = &r.network;
    assert!(n.byte_cap_reached, "{n:#?}");
    let c = record(&r, "api.test");
    assert_eq!((c.allowed, c.reason.as_str()), (true, "byte_cap"), "{c:#?}");
    assert!(n.bytes_up + n.bytes_down <= 64 << 10, "{n:#?}");
    assert!(server.body_bytes.load(Ordering::SeqCst) <= 64 << 10);
}

#[test]
fn connections_past_the_cap_are_refused() {
    let server = TestServer::start();
    let p = server.port;
    let (sb, env) = allowlist(
        serde_json::json!({"mode": "allowlist", "hosts": ["api.test"], "ports": [p], "max_connections": 2}),
        "api.test=127.0.0.1",
    );
    let urls: Vec<String> = (0..3).map(|i| format!("http://api.test:{p}/{i}")).collect();
    let r = run_with(&sb, &env, &fetch(&urls));
    let v = stdout_json(&r);
    assert!(v[&urls[2]].as_str().unwrap().contains("403"), "{v}");
    assert_eq!(server.requests(), 2);
    let reasons: Vec<&str> = r.network.connections.iter().map(|c| c.reason.as_str()).collect();
    assert_eq!(reasons, ["closed", "closed", "connection_cap"]);
}

#[test]
fn with_the_default_policy_nothing_of_the_proxy_runs() {
    let sb = Sandbox::new();
    let src = r#"
import json, os, socket
out = {"env": sorted(k for k in os.environ if "proxy" in k.lower())}
out["tcp_sockets"] = open("/proc/net/tcp").read().splitlines()[1:]
try:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=3)
    out["connect"] = "connected"
except OSError as e:
    out["connect"] = e.errno
print(json.dumps(out))
"#;
    let (r, _) = sb.run(src);
    let v = stdout_json(&r);
    assert_eq!(v["env"], serde_json::json!([]));
    assert_eq!(v["tcp_sockets"], serde_json::json!([]), "nothing listens in the jail's namespace");
    assert!(v["connect"].is_number(), "{v}");
    assert_eq!(r.network.mode, "none");
    assert_eq!(r.network.proxy, None);
    assert!(r.network.connections.is_empty() && r.network.resolver_overrides.is_empty());
    assert!(!r.timings.stages.contains_key("proxy"), "{:?}", r.timings.stages);
}

#[test]
fn a_malformed_resolver_override_is_refused_before_anything_starts() {
    let (sb, _) = allowlist(serde_json::json!({"mode": "allowlist", "hosts": ["api.test"]}), "");
    let out = sb.command("print(1)\n").env("JAIL_TEST_RESOLVE", "api.test=nowhere").output().unwrap();
    let r = jail_tests::parse(&out);
    assert_eq!(r.status, Status::SetupFailed);
    assert_eq!(out.status.code(), Some(125));
    assert!(r.setup_error.unwrap().message.contains("JAIL_TEST_RESOLVE"));
}

/// Past the seccomp answer cap (10,000 calls the supervisor answered), a
/// script must not be able to switch the jail's accounting off nor lose its
/// TCP sockets: refusals keep their errno, TCP sockets still go through,
/// and the result says the itemised count stopped.
#[test]
fn past_the_answer_cap_tcp_still_works_and_the_result_says_counting_stopped() {
    let server = TestServer::start();
    let p = server.port;
    let (sb, env) =
        allowlist(serde_json::json!({"mode": "allowlist", "hosts": ["api.test"], "ports": [p]}), "api.test=127.0.0.1");
    let n = jail::seccomp::MAX_ANSWERED + 20;
    let src = format!(
        r#"
import ctypes, errno, json, socket, urllib.request
libc = ctypes.CDLL(None, use_errno=True)
errs = set()
for _ in range({n}):
    # A UDP socket: refused by the supervisor, counted.
    if libc.socket(socket.AF_INET, socket.SOCK_DGRAM, 0) < 0:
        errs.add(errno.errorcode[ctypes.get_errno()])
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.close()
    tcp = "ok"
except OSError as e:
    tcp = errno.errorcode[e.errno]
body = urllib.request.urlopen("http://api.test:{p}/after-cap", timeout=10).read().decode()
print(json.dumps({{"errnos": sorted(errs), "tcp": tcp, "body": body}}))
"#
    );
    let r = run_with(&sb, &env, &src);
    let v = stdout_json(&r);
    assert_eq!(v["errnos"], serde_json::json!(["EPERM"]), "the same refusal before and after the cap: {v}");
    assert_eq!(v["tcp"], "ok", "{v}");
    assert_eq!(v["body"], "hello /after-cap 0");
    let s = &r.isolation.seccomp;
    assert!(s.denials_truncated, "{s:?}");
    // 20 UDP sockets past the cap, and the TCP sockets after them.
    assert!(s.calls_past_cap >= 22, "{s:?}");
    assert!(s.detail.as_deref().unwrap_or("").contains("calls_past_cap"), "{s:?}");
    let udp = r.denials.iter().find(|d| d.what == "socket").unwrap();
    assert_eq!(udp.count, jail::seccomp::MAX_ANSWERED, "itemised up to the cap");
}
