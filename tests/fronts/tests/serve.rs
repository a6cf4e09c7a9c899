//! `jail serve` end to end: a real server (the jail-serve beside the jail
//! under test) on a loopback port, spoken to over plain HTTP/1.1. Each test
//! starts its own server with its own work folder, so what a run leaves
//! (processes, cgroups, folders) is found by that folder's path, which
//! every `jail run` and pooled `jail session` command line of the server
//! carries. Servers run on the warm pool (`Server::start`: two jails of
//! alice's and bob's memory) unless a test says `Server::without_pool`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use jail_tests::*;
use serde_json::{json, Value};

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789abc";
const LOAD: &str = "load-token-0123456789abc";
/// The pooled jails' memory: alice's, bob's and the load tenant's most, so
/// their runs go to the pool.
const POOL_MEMORY: &str = "256";

struct Server {
    child: Child,
    addr: SocketAddr,
    /// The parent of the server's work folder (`--work-dir`).
    work: tempfile::TempDir,
    _tokens: tempfile::NamedTempFile,
    /// What the server said on stderr (drained, so it never blocks).
    said: Arc<Mutex<Vec<String>>>,
}

/// How the server is started.
#[derive(Clone, Copy)]
enum Wrap<'a> {
    Plain,
    /// Moved into this cgroup first.
    Cgroup(&'a TestCgroup),
    /// With SIGINT and SIGQUIT ignored, as a shell starts a background job
    /// (`jail serve ... &` from a script): inherited by everything it starts.
    IgnoringSigint,
}

impl Server {
    /// A server on the warm pool.
    fn start(extra: &[&str]) -> Server {
        let mut args = vec!["--pool-size", "2", "--pool-memory", POOL_MEMORY];
        args.extend_from_slice(extra);
        Server::launch(&args)
    }

    /// A server whose every run is a `jail run` of its own.
    fn without_pool(extra: &[&str]) -> Server {
        let mut args = vec!["--pool-size", "0"];
        args.extend_from_slice(extra);
        Server::launch(&args)
    }

    fn launch(extra: &[&str]) -> Server {
        Server::launch_in(Wrap::Plain, extra)
    }

    /// A server started in `cgroup` (a wrapper moves itself there, then
    /// execs the server), with no `JAIL_CGROUP_PARENT`: it nests its own.
    fn launch_in(cgroup: Wrap<'_>, extra: &[&str]) -> Server {
        let tenants = json!({"tenants": [
            {"name": "alice", "token": ALICE, "max_runs": 8, "max_sessions": 2, "max_bytes_in": 65536,
             "max_timeout_secs": 60, "max_memory_mib": 256},
            {"name": "bob", "token": BOB, "max_runs": 1, "max_sessions": 1, "max_memory_mib": 256},
            {"name": "load", "token": LOAD, "max_runs": 256, "max_requests": 512, "max_sessions": 1,
             "max_timeout_secs": 30, "max_memory_mib": 256}
        ]});
        Server::launch_with(cgroup, &tenants, extra)
    }

    /// A server with these tenants (the tokens file's JSON).
    fn launch_with(cgroup: Wrap<'_>, tenants: &Value, extra: &[&str]) -> Server {
        let bin = jail_bin().with_file_name("jail-serve");
        assert!(bin.is_file(), "no {} (cargo build -p jail-serve)", bin.display());
        let mut tokens = tempfile::NamedTempFile::new().unwrap();
        tokens.write_all(tenants.to_string().as_bytes()).unwrap();
        let work = tempfile::Builder::new().prefix("serve-test-").tempdir().unwrap();
        // The jails of a root server run as an unprivileged uid that must
        // reach its run folder beneath this one.
        std::fs::set_permissions(work.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
        let mut cmd = match cgroup {
            Wrap::Plain => Command::new(&bin),
            Wrap::Cgroup(cg) => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c").arg("echo $$ > \"$0\" && exec \"$@\"").arg(cg.dir.join("cgroup.procs")).arg(&bin);
                c.env_remove("JAIL_CGROUP_PARENT");
                c
            }
            Wrap::IgnoringSigint => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c").arg("trap '' INT QUIT; exec \"$@\"").arg("sh").arg(&bin);
                c
            }
        };
        let mut child = cmd
            .args(["--listen", "127.0.0.1:0", "--tokens"])
            .arg(tokens.path())
            .arg("--work-dir")
            .arg(work.path())
            .arg("--rootfs")
            .arg(rootfs())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let said = Arc::new(Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .and_then(Result::ok)
                .unwrap_or_else(|| panic!("the server ended: {:?}", said.lock().unwrap()));
            said.lock().unwrap().push(line.clone());
            if let Some(a) = line.trim().strip_prefix("jail serve: listening on ") {
                break a.parse().unwrap();
            }
        };
        let keep = Arc::clone(&said);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut k = keep.lock().unwrap();
                if k.len() < 10_000 {
                    k.push(line);
                }
            }
        });
        Server { child, addr, work, _tokens: tokens, said }
    }

    fn marker(&self) -> String {
        self.work.path().display().to_string()
    }

    fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Reply {
        request(self.addr, method, path, token, body)
    }

    fn run(&self, token: &str, body: Value) -> Reply {
        self.call("POST", "/v1/runs", Some(token), Some(&body.to_string()))
    }

    /// Folders in the tenant's work folder (run and session folders).
    fn tenant_entries(&self, tenant: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for root in std::fs::read_dir(self.work.path()).unwrap().flatten() {
            if let Ok(d) = std::fs::read_dir(root.path().join(tenant)) {
                found.extend(d.flatten().map(|e| e.path()).filter(|p| !p.ends_with("sessions")));
            }
        }
        found
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// A sample's value in /metrics (`name` with its labels, as printed);
    /// `None` also when the server closed the connection unanswered (a
    /// connection cap reached: a caller in `eventually` asks again).
    fn metric(&self, name: &str) -> Option<f64> {
        let text = try_request(self.addr, "GET", "/metrics", None, None).ok()?.body;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    }

    /// The server's `jail pool` child and what it forked (its janitor).
    fn pool_processes(&self) -> Vec<u32> {
        let mut found = Vec::new();
        for pid in children_of(self.child.id()) {
            if cmdline(pid).contains(" pool ") {
                found.push(pid);
                found.extend(children_of(pid).into_iter().filter(|c| cmdline(*c).contains(" pool ")));
            }
        }
        found
    }

    fn said(&self) -> String {
        self.said.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        found.extend(text.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    found
}

/// Gone, or a zombie its new parent has yet to reap.
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
    /// A header's value (the first of its name).
    fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
    /// A refusal's `error.field` and `error.message`, checked to be the JSON error.
    fn error(&self) -> (Option<String>, String) {
        let v = self.json();
        let e = &v["error"];
        assert!(e["code"].is_string() && e["message"].is_string(), "not the JSON error: {self:?}");
        (e["field"].as_str().map(String::from), e["message"].as_str().unwrap().into())
    }
}

fn connect(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> TcpStream {
    try_connect(addr, method, path, token, body).unwrap()
}

fn try_connect(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    let body = body.unwrap_or("");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    Ok(s)
}

fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Reply {
    try_request(addr, method, path, token, body).unwrap()
}

/// A request whose connection the server may close before answering (a
/// cap closes it as it is accepted): the error, not a panic.
fn try_request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> std::io::Result<Reply> {
    read_reply(try_connect(addr, method, path, token, body)?)
}

/// A request with a raw body (`application/octet-stream`): a file of a
/// session's files API.
fn send_bytes(addr: SocketAddr, method: &str, path: &str, token: &str, body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // The server may answer (a 413) before it took the whole body.
    let _ = s.write_all(body);
    read_reply(s).unwrap()
}

fn read_reply(mut s: TcpStream) -> std::io::Result<Reply> {
    s.set_read_timeout(Some(Duration::from_secs(90)))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    if raw.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed without a reply"));
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (headers, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no reply: {raw:?}"));
    let status = headers.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
    let body = if headers.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        unchunk(body)
    } else {
        body.to_owned()
    };
    Ok(Reply { status, headers: headers.to_owned(), body })
}

/// A chunked body's data; a last chunk cut short is taken as far as it goes.
fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        if rest.len() < n {
            out.push_str(rest);
            break;
        }
        out.push_str(&rest[..n]);
        body = rest.get(n + 2..).unwrap_or_default();
    }
    out
}

/// The data of a raw HTTP reply read so far (its head dropped, unchunked).
fn body_of_raw(raw: &str) -> String {
    let (headers, body) = raw.split_once("\r\n\r\n").unwrap_or(("", raw));
    if headers.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        unchunk(body)
    } else {
        body.to_owned()
    }
}

/// Wait until `f` holds, or fail with `what` after `within`.
fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < until, "{what} (after {within:?})");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes of a server whose work folder is `marker`: the server and its
/// janitor name it on their command lines; its runs, sessions and pool do
/// not (no tenant's path is on a command line, which every local user may
/// read), but carry it in their environment (TMPDIR, XDG_RUNTIME_DIR),
/// which only their owner and root may read.
fn server_processes(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return found };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let has = |f: &str| std::fs::read(e.path().join(f)).is_ok_and(|b| String::from_utf8_lossy(&b).contains(marker));
        if has("cmdline") || has("environ") {
            found.push(pid);
        }
    }
    found
}

/// The `jail run` processes of this server's spawned runs.
fn runs_of(server: &Server) -> Vec<u32> {
    jails_of(server).into_iter().filter(|p| cmdline(*p).contains(" run --events ")).collect()
}

/// The `jail` processes of this server (spawned runs, pooled jails'
/// supervisors: their environment carries its work folder).
fn jails_of(server: &Server) -> Vec<u32> {
    // Compared as resolved paths: the server may name the binary `…/target/debug/jail`
    // while the harness found it as `…/tests/../target/debug/jail`.
    let jail = std::fs::canonicalize(jail_bin()).unwrap_or_else(|_| jail_bin());
    server_processes(&server.marker())
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let arg0 = std::path::PathBuf::from(String::from_utf8_lossy(c.split(|b| *b == 0).next().unwrap_or(&[])).as_ref());
                std::fs::canonicalize(&arg0).unwrap_or(arg0) == jail
            })
        })
        .collect()
}

/// The server's janitor (forked by it, so it carries the work folder too,
/// and outlives the server by design), told apart by its name.
fn is_janitor(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "serve-janitor")
}

fn assert_left_nothing(server: &Server, pids: &[u32]) {
    eventually(Duration::from_secs(15), "a process of a run outlived it", || {
        server_processes(&server.marker()).iter().all(|p| *p == server.child.id() || is_janitor(*p))
    });
    // A terminated jail removes its cgroups as it exits.
    eventually(Duration::from_secs(15), "a run left a cgroup", || pids.iter().all(|p| cgroups_left_by(*p).is_empty()));
}

/// Whether the server's pool streams live events (the pool's `events`
/// field, probed at its start): followed runs go to the pool only then.
fn pool_streams_events(s: &Server) -> bool {
    s.metric("jail_pool_live_events") == Some(1.0)
}

/// Wait until the pool has `n` jails ready.
fn wait_ready(s: &Server, n: f64) {
    eventually(Duration::from_secs(60), "the pool's jails were not made", || s.metric("jail_pool_ready") >= Some(n));
}

#[test]
fn every_endpoint_answers_and_a_run_sends_back_its_result_events_and_artifacts() {
    let s = Server::start(&[]);
    assert_eq!(s.call("GET", "/healthz", None, None).status, 200);
    assert_eq!(s.call("GET", "/readyz", None, None).status, 200);
    let doc = s.call("GET", "/openapi.json", None, None).json();
    for path in [
        "/v1/runs",
        "/v1/runs/{id}/events",
        "/v1/runs/{id}/artifacts/{path}",
        "/v1/sessions",
        "/v1/sessions/{id}/exec",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/artifacts/{path}",
        "/metrics",
    ] {
        assert!(doc["paths"][path].is_object(), "/openapi.json lacks {path}");
    }
    assert!(doc["paths"]["/v1/runs/{id}"]["delete"].is_object(), "/openapi.json lacks DELETE /v1/runs/{{id}}");
    assert!(doc["components"]["schemas"]["RunReply"]["properties"]["error"].is_object(), "{doc}");
    let session = &doc["components"]["schemas"]["SessionRequest"]["properties"];
    assert!(session["files"].is_object() && session["input_tar"]["format"] == "byte", "{session}");
    let props = &doc["components"]["schemas"]["RunRequest"]["properties"];
    assert!(props["code"].is_object(), "{doc}");
    assert_eq!(props["input_tar"]["format"], "byte", "input_tar is documented as base64: {props}");
    assert!(doc["components"]["schemas"]["RunReply"]["properties"]["backend"].is_object(), "{doc}");

    let code = "import sys\nprint(open('/workspace/input/in.txt').read().upper())\nopen('out.txt','w').write('made')\n";
    let r = s.run(ALICE, json!({"code": code, "files": {"in.txt": "hello"}, "limits": {"timeout_secs": 20}}));
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    validate_result(&v["result"]).unwrap();
    assert_eq!(v["result"]["status"], "ok", "{v}");
    assert_eq!(v["result"]["stdout"]["text"], "HELLO\n");
    assert_eq!(v["backend"], "pool", "alice's runs fit the pool's jails: {v}");
    let id = v["id"].as_str().unwrap();
    assert_eq!(id.len(), 32, "an id is 128 random bits");
    let art = s.call("GET", &format!("/v1/runs/{id}/artifacts/out.txt"), Some(ALICE), None);
    assert_eq!((art.status, art.body.as_str()), (200, "made"), "{art:?}");
    assert_eq!(s.call("GET", &format!("/v1/runs/{id}/artifacts/main.py"), Some(ALICE), None).status, 404);
    let got = s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json();
    assert_eq!((&got["state"], &got["backend"]), (&json!("done"), &json!("pool")));
    // A pool run's events, after the fact: its artifact, then its result.
    let ev = s.call("GET", &format!("/v1/runs/{id}/events"), Some(ALICE), None);
    assert!(ev.body.contains("\"type\":\"artifact\"") && ev.body.contains("\"type\":\"result\""), "{}", ev.body);

    // Live events of a run that is still going: on the pool when it
    // streams events, else on a `jail run` of its own.
    let r = s.run(
        ALICE,
        json!({"code": "import time\nfor i in range(3):\n    print('tick', i, flush=True); time.sleep(0.3)\n", "wait": false}),
    );
    assert_eq!(r.status, 202, "{r:?}");
    let followed_on = if pool_streams_events(&s) { "pool" } else { "spawn" };
    assert_eq!(r.json()["backend"], followed_on, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let ev = s.call("GET", &format!("/v1/runs/{id}/events"), Some(ALICE), None);
    assert!(ev.headers.contains("text/event-stream"), "{ev:?}");
    let events: Vec<Value> = ev
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let out: String = events.iter().filter(|e| e["type"] == "stdout").map(|e| e["data"].as_str().unwrap()).collect();
    assert_eq!(out, "tick 0\ntick 1\ntick 2\n", "{}", ev.body);
    assert!(events.iter().any(|e| e["type"] == "result" && e["result"]["status"] == "ok"), "{}", ev.body);
    assert!(ev.body.contains("event: end"), "{}", ev.body);

    // A session keeps its interpreter's state between cells.
    let sess = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
    assert_eq!(sess.status, 201, "{sess:?}");
    let sid = sess.json()["id"].as_str().unwrap().to_owned();
    let exec =
        |code: &str| s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()));
    assert_eq!(exec("x = 41").status, 200);
    let second = exec("print(x + 1)");
    assert_eq!(second.json()["result"]["stdout"]["text"], "42\n", "{second:?}");
    assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
    assert_eq!(exec("print(x)").status, 404, "a stopped session is gone");

    let metrics = s.call("GET", "/metrics", None, None).body;
    let pooled = if followed_on == "pool" { 2 } else { 1 };
    for needle in [
        "jail_runs_total{status=\"ok\"} 2".to_string(),
        "jail_runs_in_flight 0".into(),
        "jail_run_seconds_count 2".into(),
        "jail_sessions_open 0".into(),
        "jail_pool_up 1".into(),
        "jail_pool_size 2".into(),
        format!("jail_runs_by_backend_total{{backend=\"pool\"}} {pooled}"),
        format!("jail_runs_by_backend_total{{backend=\"spawn\"}} {}", 2 - pooled),
    ] {
        assert!(metrics.contains(&needle), "/metrics lacks {needle}:\n{metrics}");
    }
    assert!(s.metric("jail_pool_refill_seconds{stat=\"mean\"}").is_some_and(|m| m > 0.0), "{metrics}");
}

/// A served session's cell past its time gets its KeyboardInterrupt and
/// the session lives, its variables with it: with the server started as
/// a background job is (SIGINT ignored, inherited by its pool's jails) and
/// with busy loops on every core beside it (issue 37: both once killed the
/// session, `cell_killed`, and the next cell was a 500). The pooled
/// session's interpreter starts with every signal at its default (child.rs)
/// and its grace counts once it has run (session/grace.rs).
#[test]
fn a_served_cell_past_its_time_is_interrupted_under_load_and_its_session_lives() {
    let s = Server::launch_in(Wrap::IgnoringSigint, &["--pool-size", "1", "--pool-memory", POOL_MEMORY]);
    let sess = s.call("POST", "/v1/sessions", Some(ALICE), Some(r#"{"limits": {"timeout_secs": 1}}"#));
    assert_eq!(sess.status, 201, "{sess:?}");
    assert_eq!(sess.json()["backend"], "pool", "the issue's case is a pooled session: {sess:?}");
    let sid = sess.json()["id"].as_str().unwrap().to_owned();
    let exec =
        |code: &str| s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()));
    assert_eq!(exec("x = 41").status, 200);
    let hogs = Hogs::start(2 * std::thread::available_parallelism().map_or(2, |n| n.get()) + 2);
    let late = exec("import time\nwhile True:\n    time.sleep(0.1)\n");
    drop(hogs);
    assert_eq!(late.status, 200, "{late:?}");
    let r = &late.json()["result"];
    assert_eq!(
        (&r["status"], &r["error"]["type"], &r["session"]["ended"]),
        (&json!("timeout_wall"), &json!("KeyboardInterrupt"), &json!(false)),
        "{late:?}"
    );
    let after = exec("print(x + 1)");
    assert_eq!(after.status, 200, "{after:?}");
    assert_eq!(after.json()["result"]["stdout"]["text"], "42\n", "{after:?}");
    assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
}

#[test]
fn a_cell_sent_to_a_session_that_ended_by_itself_is_410_session_ended() {
    let s = Server::start(&[]);
    let sess = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
    assert_eq!(sess.status, 201, "{sess:?}");
    let sid = sess.json()["id"].as_str().unwrap().to_owned();
    let exec =
        |code: &str| s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()));
    // The cell that ends it is answered as any cell is.
    let died = exec("import os\nos._exit(3)\n");
    assert_eq!(died.status, 200, "{died:?}");
    assert_eq!(died.json()["result"]["session"]["ended"], true, "{died:?}");
    // The next is the caller's to act on: a 4xx that says what happened
    // and what to do, naming no host path and no command line.
    let after = exec("print(1)");
    assert_eq!(after.status, 410, "{after:?}");
    let err = after.json();
    assert_eq!(err["error"]["code"], "session_ended", "{after:?}");
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("exited with code 3") && message.contains("start a new one"), "{message}");
    assert!(!message.contains(".sock") && !message.contains("jail session"), "{message}");
    // Its closing is still there for DELETE.
    assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
}

#[test]
fn a_run_the_pools_jails_cannot_honour_goes_to_jail_run_and_says_so() {
    let s = Server::start(&[]);
    // The pooled jails have 256 MiB: 128 cannot be lowered into them.
    let r = s.run(ALICE, json!({"code": "print('small')", "limits": {"memory_mib": 128}})).json();
    assert_eq!((&r["backend"], &r["result"]["stdout"]["text"]), (&json!("spawn"), &json!("small\n")), "{r}");
    let r = s
        .run(ALICE, json!({"code": "print('fits')", "limits": {"memory_mib": 256, "timeout_secs": 5}}))
        .json();
    assert_eq!(r["backend"], "pool", "{r}");
    assert_eq!(s.metric("jail_runs_spawned_total{reason=\"memory\"}"), Some(1.0));
}

/// What is sent, with which token, and the status, field and words the refusal must have.
type Case<'a> = (&'a str, Option<&'a str>, String, u16, Option<&'a str>, &'a str);

#[test]
fn bad_input_gets_a_4xx_json_error_naming_the_field_and_runs_nothing() {
    let s = Server::start(&[]);
    let cases: Vec<Case> = vec![
        ("malformed JSON", Some(ALICE), "{\"code\": ".into(), 400, Some("code"), "EOF"),
        (
            "unknown field",
            Some(ALICE),
            json!({"code": "1", "cpus": 2}).to_string(),
            400,
            Some("cpus"),
            "unknown field `cpus`",
        ),
        (
            "unknown limit",
            Some(ALICE),
            json!({"code": "1", "limits": {"memory": 1}}).to_string(),
            400,
            Some("limits.memory"),
            "unknown field `memory`",
        ),
        ("no code", Some(ALICE), "{}".into(), 400, None, "missing field `code`"),
        ("empty code", Some(ALICE), json!({"code": " "}).to_string(), 400, Some("code"), "empty"),
        (
            "script over the limit",
            Some(ALICE),
            json!({"code": "#".repeat(70_000)}).to_string(),
            413,
            None,
            "65536 bytes",
        ),
        ("no token", None, json!({"code": "1"}).to_string(), 401, None, "Authorization"),
        ("wrong token", Some("not-a-token-of-anyone"), json!({"code": "1"}).to_string(), 401, None, "unknown token"),
        (
            "timeout above the tenant's",
            Some(ALICE),
            json!({"code": "1", "limits": {"timeout_secs": 61}}).to_string(),
            400,
            Some("limits.timeout_secs"),
            "at most 60",
        ),
        (
            "memory above the tenant's",
            Some(ALICE),
            json!({"code": "1", "limits": {"memory_mib": 4096}}).to_string(),
            400,
            Some("limits.memory_mib"),
            "16 to 256",
        ),
        (
            "a file name with a slash",
            Some(ALICE),
            json!({"code": "1", "files": {"../x": ""}}).to_string(),
            400,
            Some("files.../x"),
            "one path component",
        ),
    ];
    for (what, token, body, status, field, says) in cases {
        let r = s.call("POST", "/v1/runs", token, Some(&body));
        assert_eq!(r.status, status, "{what}: {r:?}");
        let (f, message) = r.error();
        assert_eq!(f.as_deref(), field, "{what}: {r:?}");
        assert!(message.contains(says), "{what}: {message:?} lacks {says:?}");
    }
    let unknown = s.call("POST", "/v1/sessions/0123456789abcdef0123456789abcdef/exec", Some(ALICE), Some("{\"code\":\"1\"}"));
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert!(unknown.error().1.contains("no session"));
    assert_eq!(s.call("POST", "/v1/sessions", Some(ALICE), Some("{\"limits\":{\"timeout_secs\":0}}")).status, 400);
    assert_eq!(s.call("GET", "/v2/nothing", None, None).status, 404);
    assert_eq!(s.tenant_entries("alice"), Vec::<PathBuf>::new(), "a refused request left a folder (so something was staged)");
    assert!(runs_of(&s).is_empty());
    assert_eq!(s.metric("jail_runs_by_backend_total{backend=\"pool\"}"), Some(0.0), "nothing ran on the pool either");
    // The server keeps serving.
    let ok = s.run(ALICE, json!({"code": "print('still here')"}));
    assert_eq!(ok.json()["result"]["stdout"]["text"], "still here\n", "{ok:?}");
    let metrics = s.call("GET", "/metrics", None, None).body;
    assert!(metrics.contains("jail_rejections_total{reason=\"bad_request\"} 9"), "{metrics}");
}

/// One tar entry: name (written raw, so names a tar tool refuses can be
/// made), type, content, link target.
type Entry<'a> = (&'a str, tar::EntryType, &'a [u8], &'a str);

fn tar_of(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, data, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        if !link.is_empty() {
            h.set_link_name(link).unwrap();
        }
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Prints every path under /workspace/input with its bytes' sha256 (or `dir`).
const LIST_INPUT: &str = r#"
import hashlib, json, os
seen = {}
for root, dirs, files in os.walk('/workspace/input'):
    for d in dirs:
        seen[os.path.relpath(os.path.join(root, d), '/workspace/input')] = 'dir'
    for f in files:
        p = os.path.join(root, f)
        seen[os.path.relpath(p, '/workspace/input')] = hashlib.sha256(open(p, 'rb').read()).hexdigest()[:16]
print(json.dumps(seen, sort_keys=True))
"#;

#[test]
fn input_tar_is_unpacked_beside_files_into_the_runs_input_on_either_backend() {
    use tar::EntryType::{Directory, Regular};
    let binary: Vec<u8> = (0..=255u8).collect();
    let tar = tar_of(&[
        ("./", Directory, b"", ""),
        ("./data/a.csv", Regular, b"x,y\n1,2\n", ""),
        ("data/deep/er/b.bin", Regular, &binary, ""),
        ("empty/", Directory, b"", ""),
    ]);
    let short = |b: &[u8]| jail::digest::sha256_hex(b)[..16].to_string();
    let want = json!({
        "data": "dir", "data/a.csv": short(b"x,y\n1,2\n"), "data/deep": "dir", "data/deep/er": "dir",
        "data/deep/er/b.bin": short(&binary), "empty": "dir", "in.txt": short(b"text")
    });
    for (server, backend, archive) in [
        (Server::start(&[]), "pool", gzip(&tar)),
        (Server::without_pool(&[]), "spawn", tar.clone()),
    ] {
        let r = server
            .run(ALICE, json!({"code": LIST_INPUT, "files": {"in.txt": "text"}, "input_tar": b64(&archive)}))
            .json();
        assert_eq!(r["backend"], backend, "{r}");
        assert_eq!(r["result"]["status"], "ok", "{r}");
        let got: Value = serde_json::from_str(r["result"]["stdout"]["text"].as_str().unwrap().trim()).unwrap();
        assert_eq!(got, want, "{backend}");
    }
}

#[test]
fn a_bad_input_tar_is_refused_naming_the_entry_and_nothing_is_staged() {
    use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};
    let s = Server::start(&[]);
    let mut bomb = tar::Header::new_gnu();
    bomb.set_path("big").unwrap();
    bomb.set_size(16 << 20);
    bomb.set_cksum();
    let mut bomb = bomb.as_bytes().to_vec();
    bomb.resize(512 + (16 << 20), 0);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "a symlink",
            b64(&tar_of(&[("ok", Regular, b"1", ""), ("passwd", Symlink, b"", "/etc/passwd")])),
            "\"passwd\" is a symbolic link",
        ),
        (
            "a hard link",
            b64(&tar_of(&[("ok", Regular, b"1", ""), ("again", Link, b"", "ok")])),
            "\"again\" is a hard link",
        ),
        ("a char device", b64(&tar_of(&[("null", Char, b"", "")])), "\"null\" is a device"),
        ("a block device", b64(&tar_of(&[("sda", Block, b"", "")])), "\"sda\" is a device"),
        ("a fifo", b64(&tar_of(&[("pipe", Fifo, b"", "")])), "\"pipe\" is a FIFO"),
        (
            "an absolute name",
            b64(&tar_of(&[("/etc/cron.d/x", Regular, b"1", "")])),
            "\"/etc/cron.d/x\" is an absolute name",
        ),
        ("a dot-dot", b64(&tar_of(&[("a/../../x", Regular, b"1", "")])), "\"a/../../x\" has a `..` component"),
        ("a name in files", b64(&tar_of(&[("in.txt", Regular, b"1", "")])), "\"in.txt\" is also in `files`"),
        ("a file twice", b64(&tar_of(&[("d/", Directory, b"", ""), ("d", Regular, b"1", "")])), "\"d\" appears twice"),
        ("a gzip bomb", b64(&gzip(&bomb)), "unpacks to more than 65536 bytes"),
        ("not base64", "%%%".into(), "not base64"),
        ("not a tar", b64(b"just some text"), "not a readable tar"),
    ];
    for (what, tar, says) in &cases {
        let r = s.run(ALICE, json!({"code": "print(1)", "files": {"in.txt": "x"}, "input_tar": tar}));
        assert_eq!(r.status, 400, "{what}: {r:?}");
        let (field, message) = r.error();
        assert_eq!(field.as_deref(), Some("input_tar"), "{what}: {r:?}");
        assert!(message.contains(says), "{what}: {message:?} lacks {says:?}");
        assert!(message.contains(": "), "{what}: a fix follows the problem: {message}");
    }
    assert_eq!(s.tenant_entries("alice"), Vec::<PathBuf>::new(), "a refused archive left a folder");
    assert_eq!(s.metric("jail_runs_by_backend_total{backend=\"pool\"}"), Some(0.0), "a refused archive ran");
    let ok = s.run(ALICE, json!({"code": "print('still here')", "input_tar": b64(&tar_of(&[]))}));
    assert_eq!(ok.json()["result"]["stdout"]["text"], "still here\n", "{ok:?}");
    assert_eq!(s.metric("jail_rejections_total{reason=\"bad_request\"}"), Some(cases.len() as f64));
}

#[test]
fn a_tenant_never_reaches_another_tenants_runs_sessions_or_files() {
    let s = Server::start(&[]);
    let r = s.run(ALICE, json!({"code": "open('secret.txt','w').write('alice only')"})).json();
    let id = r["id"].as_str().unwrap().to_owned();
    assert_eq!(r["result"]["status"], "ok", "{r}");
    for path in [
        format!("/v1/runs/{id}"),
        format!("/v1/runs/{id}/events"),
        format!("/v1/runs/{id}/artifacts/secret.txt"),
    ] {
        let theirs = s.call("GET", &path, Some(BOB), None);
        assert_eq!(theirs.status, 404, "bob reached {path}: {theirs:?}");
        assert!(!theirs.body.contains("alice only"));
        assert_eq!(s.call("GET", &path, Some(ALICE), None).status, 200, "{path}");
    }
    let sid = s.call("POST", "/v1/sessions", Some(ALICE), None).json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(BOB), Some("{\"code\":\"print(1)\"}"))
            .status,
        404
    );
    assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(BOB), None).status, 404);
    assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
    // Each tenant's folder is its own and closed to other users.
    let root = std::fs::read_dir(s.work.path()).unwrap().flatten().next().unwrap().path();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(root.join("alice")).unwrap().permissions());
    let want = if is_root() { 0o711 } else { 0o700 };
    assert_eq!(mode & 0o777, want, "alice's folder mode");
    // A jail cannot see the server's folders at all: its /workspace is all it has.
    let probe = s
        .run(BOB, json!({"code": format!("import os\nprint(os.path.exists({:?}))", root.display().to_string())}))
        .json();
    assert_eq!(probe["result"]["stdout"]["text"], "False\n", "{probe}");
    assert_eq!(probe["backend"], "pool", "{probe}");
}

#[test]
fn a_full_tenant_or_node_gets_429_with_retry_after() {
    let s = Server::start(&["--max-runs", "2"]);
    let slow = json!({"code": "import time; time.sleep(3)", "wait": false});
    assert_eq!(s.run(BOB, slow.clone()).status, 202);
    let second = s.run(BOB, slow.clone());
    assert_eq!(second.status, 429, "bob's max_runs is 1: {second:?}");
    assert!(second.headers.to_ascii_lowercase().contains("retry-after: 1"), "{second:?}");
    assert_eq!(s.run(ALICE, slow.clone()).status, 202);
    let full = s.run(ALICE, slow);
    assert_eq!(full.status, 429, "the node holds 2: {full:?}");
    assert!(full.error().1.contains("node is full"));
    assert_eq!(s.call("GET", "/readyz", None, None).status, 503, "a full node is not ready");
    assert_eq!(s.call("POST", "/v1/sessions", Some(BOB), None).status, 201);
    assert_eq!(s.call("POST", "/v1/sessions", Some(BOB), None).status, 429, "bob's max_sessions is 1");
}

#[test]
fn a_client_that_disconnects_mid_run_kills_the_run() {
    let s = Server::without_pool(&[]);
    let body = json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"}).to_string();
    let conn = connect(s.addr, "POST", "/v1/runs", Some(ALICE), Some(&body));
    let mut pids = Vec::new();
    eventually(Duration::from_secs(10), "the run did not start", || {
        pids = runs_of(&s);
        !pids.is_empty()
    });
    std::thread::sleep(Duration::from_millis(500));
    drop(conn);
    let started = Instant::now();
    assert_left_nothing(&s, &pids);
    eprintln!("run gone {:?} after the disconnect", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(s.call("GET", "/metrics", None, None).body.contains("jail_runs_in_flight 0"));
}

/// The pool's cancel op (`{"op": "cancel"}`): a pool run whose client goes
/// away is stopped at once, its jail gone, its tenant's slot free again.
#[test]
fn a_client_that_disconnects_mid_pool_run_kills_it() {
    let s = Server::start(&[]);
    let marker = format!("abandoned-{}", std::process::id());
    let code = format!(
        "import subprocess, time\nsubprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\ntime.sleep(60)"
    );
    let body = json!({"code": code}).to_string();
    let conn = connect(s.addr, "POST", "/v1/runs", Some(BOB), Some(&body));
    eventually(Duration::from_secs(10), "the run did not start in a pooled jail", || !host_processes_with(&marker).is_empty());
    assert_eq!(s.metric("jail_pool_in_use"), Some(1.0));
    drop(conn);
    let gone = Instant::now();
    eventually(Duration::from_secs(5), "the run outlived its client", || s.metric("jail_runs_in_flight") == Some(0.0));
    eprintln!("pool run ended {:?} after its client went away", gone.elapsed());
    assert!(host_processes_with(&marker).is_empty(), "the run's process outlived it");
    assert_eq!(s.metric("jail_runs_total{status=\"cancelled\"}"), Some(1.0), "{}", s.call("GET", "/metrics", None, None).body);
    // Bob's one slot is free again, and the pool serves on.
    let next = s.run(BOB, json!({"code": "print('next')"})).json();
    assert_eq!((&next["backend"], &next["result"]["stdout"]["text"]), (&json!("pool"), &json!("next\n")), "{next}");
}

/// A session's input is `files` and `input_tar` as a run's; its jail
/// comes from the pool when the pool's jails fit (its cells' wall time
/// lowered to the session's), else from `jail session start`; once it is
/// deleted, the artifacts its closing result lists are served, and nothing
/// else.
#[test]
fn a_session_takes_input_files_and_its_artifacts_are_served_once_it_ends() {
    use tar::EntryType::{Directory, Regular};
    let tar = tar_of(&[("data/", Directory, b"", ""), ("data/a.csv", Regular, b"x,y\n1,2\n", "")]);
    let short = |b: &[u8]| jail::digest::sha256_hex(b)[..16].to_string();
    let want = json!({"data": "dir", "data/a.csv": short(b"x,y\n1,2\n"), "in.txt": short(b"hello")});
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        let body = json!({"files": {"in.txt": "hello"}, "input_tar": b64(&gzip(&tar)), "limits": {"timeout_secs": 2}});
        let made = s.call("POST", "/v1/sessions", Some(ALICE), Some(&body.to_string()));
        assert_eq!(made.status, 201, "{made:?}");
        assert_eq!(made.json()["backend"], backend, "{made:?}");
        let sid = made.json()["id"].as_str().unwrap().to_owned();
        let exec = |code: &str| {
            s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()))
                .json()
        };
        let seen = exec(LIST_INPUT);
        let got: Value = serde_json::from_str(seen["result"]["stdout"]["text"].as_str().unwrap().trim()).unwrap();
        assert_eq!(got, want, "{backend}: {seen}");
        // Each cell has the session's wall time (2 s), the pool's jail too.
        let started = Instant::now();
        let slow = exec("import time\ntime.sleep(30)");
        assert_eq!(slow["result"]["status"], "timeout_wall", "{backend}: {slow}");
        assert!(started.elapsed() < Duration::from_secs(10), "{backend}: the cell ran {:?}", started.elapsed());
        let wrote = exec("open('/workspace/output/report.txt', 'w').write('from the session')");
        assert_eq!(wrote["result"]["status"], "ok", "{backend}: {wrote}");
        let art = format!("/v1/sessions/{sid}/artifacts/report.txt");
        assert_eq!(s.call("GET", &art, Some(ALICE), None).status, 404, "served before the session ended");
        let closing = s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).json();
        let paths: Vec<&str> = closing["result"]["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a["path"].as_str())
            .collect();
        assert_eq!(paths, ["report.txt"], "{backend}: {closing}");
        let got = s.call("GET", &art, Some(ALICE), None);
        assert_eq!((got.status, got.body.as_str()), (200, "from the session"), "{backend}: {got:?}");
        assert_eq!(s.call("GET", &art, Some(BOB), None).status, 404, "bob reached alice's session artifact");
        for other in ["main.py", "../report.txt", "in.txt"] {
            let r = s.call("GET", &format!("/v1/sessions/{sid}/artifacts/{other}"), Some(ALICE), None);
            assert_eq!(r.status, 404, "{backend}: {other}: {r:?}");
        }
        // A bad archive: 400 naming input_tar, nothing started or left.
        let bad = json!({"input_tar": b64(&tar_of(&[("passwd", tar::EntryType::Symlink, b"", "/etc/passwd")]))});
        let r = s.call("POST", "/v1/sessions", Some(ALICE), Some(&bad.to_string()));
        assert_eq!((r.status, r.error().0.as_deref()), (400, Some("input_tar")), "{r:?}");
        let bad = json!({"files": {"a/b": "x"}});
        let r = s.call("POST", "/v1/sessions", Some(ALICE), Some(&bad.to_string()));
        assert_eq!((r.status, r.error().0.as_deref()), (400, Some("files.a/b")), "{r:?}");
        assert_eq!(s.metric("jail_sessions_open"), Some(0.0));
    }
}

/// A pool whose policy binds each jail's output folder (`output_size:
/// "unlimited"`) hands out no session: it says so once, and sessions start
/// on their own, input and artifacts alike.
#[test]
fn a_session_the_pool_cannot_hand_out_starts_on_its_own() {
    let policy = policy_with(|p| {
        p["filesystem"]["output_size"] = "unlimited".into();
        p["limits"]["file_size"] = "unlimited".into();
    });
    let s = Server::start(&["--policy", policy.path().to_str().unwrap()]);
    for _ in 0..2 {
        let made = s.call("POST", "/v1/sessions", Some(ALICE), Some(&json!({"files": {"in.txt": "x"}}).to_string()));
        assert_eq!((made.status, &made.json()["backend"]), (201, &json!("spawn")), "{made:?}");
        let sid = made.json()["id"].as_str().unwrap().to_owned();
        let code = json!({"code": "open('/workspace/output/o.txt', 'w').write(open('/workspace/input/in.txt').read())"});
        let cell = s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&code.to_string())).json();
        assert_eq!(cell["result"]["status"], "ok", "{cell}");
        assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
        let art = s.call("GET", &format!("/v1/sessions/{sid}/artifacts/o.txt"), Some(ALICE), None);
        assert_eq!((art.status, art.body.as_str()), (200, "x"), "{art:?}");
    }
    assert_eq!(s.said().matches("sessions start on their own").count(), 1, "{}", s.said());
}

/// A policy with a preload: the server's pool forks each jail, a run's
/// and a session's, from its template (issue 36), each a jail of its own
/// that says so, and nothing of one run reaches the next.
#[test]
fn a_pool_with_a_preload_forks_runs_and_sessions_from_its_template() {
    let policy = policy_with(|p| p["preload"] = json!(["json"]));
    let s = Server::start(&["--policy", policy.path().to_str().unwrap()]);
    let code = "import json, sys\nprint(json.dumps(['json' in sys.modules, globals().get('planted')]))\nplanted = 1\n";
    for _ in 0..2 {
        let r = s.run(ALICE, json!({"code": code}));
        assert_eq!(r.status, 200, "{r:?}");
        let v = r.json();
        validate_result(&v["result"]).unwrap();
        assert_eq!((&v["backend"], &v["result"]["status"]), (&json!("pool"), &json!("ok")), "{v}");
        assert_eq!(v["result"]["isolation"]["forked_from_template"], true, "not a fork: {v}");
        assert_eq!(v["result"]["stdout"]["text"], "[true, null]\n", "{v}");
    }
    let sess = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
    assert_eq!((sess.status, &sess.json()["backend"]), (201, &json!("pool")), "{sess:?}");
    let sid = sess.json()["id"].as_str().unwrap().to_owned();
    let cell = s
        .call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()))
        .json();
    assert_eq!(cell["result"]["status"], "ok", "{cell}");
    assert_eq!(cell["result"]["isolation"]["forked_from_template"], true, "not a fork: {cell}");
    assert_eq!(cell["result"]["stdout"]["text"], "[true, null]\n", "{cell}");
    assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
}

/// The run's events in an SSE body, parsed: each block's `data:`, less
/// the `event: end` block and comments.
fn sse_events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|block| !block.lines().any(|l| l.starts_with("event:")))
        .filter_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// Read an open event stream until its `result` (or `error`) event:
/// the text so far.
fn read_until_last_event(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if text.contains("\"type\":\"result\"") || text.contains("\"type\":\"error\"") {
            return text;
        }
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its last event: {text}");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// The last event of a run's stream comes once the run is recorded: its
/// state is `done` and its artifact is served at once, never a 404 "no
/// finished run", on either backend.
#[test]
fn a_run_is_recorded_before_its_last_event_so_its_artifacts_are_there_at_once() {
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        for i in 0..8 {
            let code = format!("open('/workspace/output/n.txt', 'w').write('{i}')");
            let r = s.run(ALICE, json!({"code": code, "wait": false})).json();
            let id = r["id"].as_str().unwrap().to_owned();
            let mut stream = connect(s.addr, "GET", &format!("/v1/runs/{id}/events"), Some(ALICE), None);
            stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            read_until_last_event(&mut stream);
            let now = s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json();
            assert_eq!((&now["state"], &now["backend"]), (&json!("done"), &json!(backend)), "{now}");
            let art = s.call("GET", &format!("/v1/runs/{id}/artifacts/n.txt"), Some(ALICE), None);
            assert_eq!((art.status, art.body.as_str()), (200, i.to_string().as_str()), "{backend}: {art:?}");
        }
    }
}

/// A `"wait": false` run that ends without a result (here: its pool is
/// killed under it) is `failed` with the error, and its events end with an
/// `error` event, never left `running`.
#[test]
fn a_followed_run_that_fails_in_the_backend_says_failed_and_its_events_end_with_an_error() {
    let s = Server::start(&[]);
    let pool = s.pool_processes();
    let r = s
        .run(ALICE, json!({"code": "import time\nprint('going', flush=True)\ntime.sleep(30)", "wait": false}))
        .json();
    assert_eq!(r["backend"], "pool", "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(20), "the run did not reach the pool", || s.metric("jail_pool_in_use") == Some(1.0));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pool[0] as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let mut got = Value::Null;
    eventually(Duration::from_secs(20), "the run stayed running", || {
        got = s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json();
        got["state"] != "running"
    });
    assert_eq!((&got["state"], &got["error"]["code"]), (&json!("failed"), &json!("pool_lost")), "{got}");
    assert!(got["error"]["message"].as_str().unwrap().contains("send it again"), "{got}");
    assert!(got["result"].is_null(), "{got}");
    let ev = s.call("GET", &format!("/v1/runs/{id}/events"), Some(ALICE), None);
    let events = sse_events(&ev.body);
    let last = events.last().unwrap();
    assert_eq!((&last["type"], &last["error"]["code"]), (&json!("error"), &json!("pool_lost")), "{}", ev.body);
    assert!(ev.body.trim_end().ends_with("event: end\ndata: {}"), "{}", ev.body);
}

/// `DELETE /v1/runs/{id}` on either backend: the run is stopped at once,
/// the reply (and later GETs, and its events) say `done` with a
/// `cancelled` result; nothing of it is left; a waiting POST of the same
/// run gets that result; another tenant's run, or an unknown one, is 404;
/// a finished run is left as it was.
#[test]
fn delete_cancels_a_run_of_its_tenant_on_either_backend() {
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        let marker = format!("deleted-{backend}-{}", std::process::id());
        let code = format!(
            "import subprocess, time\nsubprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\n\
             print('going', flush=True)\ntime.sleep(60)"
        );
        let r = s.run(ALICE, json!({"code": code, "wait": false})).json();
        assert_eq!(r["backend"], backend, "{r}");
        let id = r["id"].as_str().unwrap().to_owned();
        eventually(Duration::from_secs(20), "the run did not start", || !host_processes_with(&marker).is_empty());
        let path = format!("/v1/runs/{id}");
        assert_eq!(s.call("DELETE", &path, Some(BOB), None).status, 404, "bob cancelled alice's run");
        assert!(!host_processes_with(&marker).is_empty(), "bob's DELETE stopped it");
        let asked = Instant::now();
        let d = s.call("DELETE", &path, Some(ALICE), None);
        let took = asked.elapsed();
        assert_eq!(d.status, 200, "{d:?}");
        let v = d.json();
        assert_eq!((&v["state"], &v["result"]["status"]), (&json!("done"), &json!("cancelled")), "{v}");
        let by = if backend == "pool" { "pool_caller" } else { "SIGTERM" };
        assert_eq!(v["result"]["supervisor"]["cancelled_by"], by, "{v}");
        validate_result(&v["result"]).unwrap();
        eprintln!("{backend}: DELETE answered in {took:?}");
        assert!(took < Duration::from_secs(5), "{backend}: the cancel took {took:?}");
        assert!(host_processes_with(&marker).is_empty(), "{backend}: the run's process outlived the DELETE");
        assert_eq!(s.call("GET", &path, Some(ALICE), None).json()["result"]["status"], "cancelled");
        let ev = s.call("GET", &format!("{path}/events"), Some(ALICE), None);
        let events = sse_events(&ev.body);
        assert_eq!(events.last().unwrap()["result"]["status"], "cancelled", "{}", ev.body);
        eventually(Duration::from_secs(5), "the slot stayed taken", || s.metric("jail_runs_in_flight") == Some(0.0));
        // Again, and on a finished run: as it was.
        let again = s.call("DELETE", &path, Some(ALICE), None);
        assert_eq!((again.status, &again.json()["result"]["status"]), (200, &json!("cancelled")));
        let ok = s.run(ALICE, json!({"code": "print('kept')"})).json();
        let done = s.call("DELETE", &format!("/v1/runs/{}", ok["id"].as_str().unwrap()), Some(ALICE), None).json();
        assert_eq!((&done["state"], &done["result"]["status"]), (&json!("done"), &json!("ok")), "{done}");
        assert_eq!(s.call("DELETE", "/v1/runs/0123456789abcdef0123456789abcdef", Some(ALICE), None).status, 404);
        // A waiting POST whose run is cancelled from elsewhere gets its result.
        let addr = s.addr;
        // It is cancelled once its code runs (its process is seen): cancelled
        // before it reached a jail, it would rightly be a 409 instead.
        let waits = format!("waits-{backend}-{}", std::process::id());
        let body = json!({"code": format!(
            "import subprocess, time\nsubprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{waits}'])\ntime.sleep(60)"
        )})
        .to_string();
        let waiting = std::thread::spawn(move || request(addr, "POST", "/v1/runs", Some(ALICE), Some(&body)));
        eventually(Duration::from_secs(20), "the waited run did not start", || !host_processes_with(&waits).is_empty());
        let mut wid = String::new();
        eventually(Duration::from_secs(20), "the waited run is not listed", || {
            wid = newest_running(&s, &id);
            !wid.is_empty()
        });
        assert_eq!(s.call("DELETE", &format!("/v1/runs/{wid}"), Some(ALICE), None).status, 200);
        let w = waiting.join().unwrap();
        assert_eq!((w.status, &w.json()["result"]["status"]), (200, &json!("cancelled")), "{w:?}");
        assert!(host_processes_with(&waits).is_empty(), "{backend}: the waited run's process outlived the DELETE");
    }
}

/// The id of a run of alice's that is running, other than `not`: found
/// through its folder in the work folder.
fn newest_running(s: &Server, not: &str) -> String {
    for dir in s.tenant_entries("alice") {
        let id = dir.file_name().unwrap().to_string_lossy().into_owned();
        if id != not && s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json()["state"] == "running" {
            return id;
        }
    }
    String::new()
}

/// An event stream that has nothing to say for 15 s says `: keepalive`, so a
/// client's read timeout below the run's length is enough.
#[test]
fn a_silent_event_stream_sends_a_keepalive_every_15_seconds() {
    let s = Server::start(&[]);
    let r = s.run(ALICE, json!({"code": "import time\ntime.sleep(17)\nprint('late')", "wait": false})).json();
    let id = r["id"].as_str().unwrap();
    let mut stream = connect(s.addr, "GET", &format!("/v1/runs/{id}/events"), Some(ALICE), None);
    // Past the keepalive's 15 s, short of the run's 17.
    stream.set_read_timeout(Some(Duration::from_secs(16))).unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while !text.contains("event: end") {
        let n = stream.read(&mut buf).unwrap_or_else(|e| panic!("16 s without a byte ({e}): {text}"));
        assert!(n > 0, "the stream ended early: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let keepalive = text.find(": keepalive\n\n").unwrap_or_else(|| panic!("no keepalive: {text}"));
    assert!(keepalive < text.find("late").unwrap(), "{text}");
    assert_eq!(sse_events(&body_of_raw(&text)).last().unwrap()["result"]["stdout"]["text"], "late\n", "{text}");
}

/// SIGTERM with a run in flight: it finishes, new ones get 503, the server
/// exits 0 and leaves its work folder empty (and its pool gone).
fn drain(s: Server) {
    let mut s = s;
    let addr = s.addr;
    let pool = s.pool_processes();
    let inflight = std::thread::spawn(move || {
        request(
            addr,
            "POST",
            "/v1/runs",
            Some(ALICE),
            Some(&json!({"code": "import time; time.sleep(2); print('finished')"}).to_string()),
        )
    });
    eventually(Duration::from_secs(10), "the run did not start", || s.metric("jail_runs_in_flight") == Some(1.0));
    std::thread::sleep(Duration::from_millis(300));
    s.signal(nix::sys::signal::Signal::SIGTERM);
    eventually(Duration::from_secs(5), "readyz did not turn 503", || s.call("GET", "/readyz", None, None).status == 503);
    let refused = s.run(ALICE, json!({"code": "print(1)"}));
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.headers.to_ascii_lowercase().contains("retry-after"), "{refused:?}");
    assert_eq!(refused.json()["error"]["code"], "draining");
    let done = inflight.join().unwrap();
    assert_eq!(done.json()["result"]["stdout"]["text"], "finished\n", "{done:?}");
    let status = s.child.wait().unwrap();
    assert!(status.success(), "the server exits 0 after a drain: {status}\n{}", s.said());
    assert_eq!(std::fs::read_dir(s.work.path()).unwrap().count(), 0, "the work folder stayed");
    // The pool exits before the server; its janitor a moment after it.
    eventually(Duration::from_secs(5), "the pool outlived the drain", || pool.iter().all(|p| is_gone(*p)));
    assert!(server_processes(&s.marker()).iter().all(|p| is_janitor(*p)), "a jail outlived the drain");
}

#[test]
fn sigterm_drains_in_flight_runs_finish_and_new_ones_get_503() {
    let s = Server::start(&[]);
    // The pool and its janitor; while it makes its jails a fork of it can
    // show a moment with the pool's command line, before its exec.
    eventually(Duration::from_secs(5), "the pool and its janitor are not two processes", || s.pool_processes().len() == 2);
    drain(s);
}

#[test]
fn sigterm_drains_without_a_pool_too() {
    drain(Server::without_pool(&[]));
}

/// SIGKILL the server with two runs and a session going; what then must go.
fn kill_server_mid_runs() -> (Server, Vec<u32>) {
    let s = Server::without_pool(&[]);
    for _ in 0..2 {
        assert_eq!(s.run(ALICE, json!({"code": "import time; time.sleep(60)", "wait": false})).status, 202);
    }
    assert_eq!(s.call("POST", "/v1/sessions", Some(ALICE), None).status, 201);
    let mut pids = Vec::new();
    eventually(Duration::from_secs(10), "the runs did not start", || {
        pids = runs_of(&s);
        pids.len() >= 2
    });
    s.signal(nix::sys::signal::Signal::SIGKILL);
    (s, pids)
}

#[test]
fn sigkill_of_the_server_leaves_no_process_mount_or_folder() {
    let (s, _) = kill_server_mid_runs();
    eventually(Duration::from_secs(15), "a process of a run or session outlived the server", || {
        server_processes(&s.marker()).iter().all(|p| *p == s.child.id() || is_janitor(*p))
    });
    eventually(Duration::from_secs(25), "the work folder outlived the server", || {
        std::fs::read_dir(s.work.path()).map(|d| d.count() == 0).unwrap_or(true)
    });
    assert!(host_mounts_with(&s.marker()).is_empty());
}

/// A `jail run` the server's death terminates (its parent-death signal,
/// then the janitor) removes its cgroup on the way out, as `jail run`
/// does on SIGTERM (cancel.rs).
#[test]
fn sigkill_of_the_server_leaves_no_cgroup() {
    let (s, pids) = kill_server_mid_runs();
    assert_left_nothing(&s, &pids);
}

/// The pool's session handles folder, from its environment.
fn pool_runtime_dir(pid: u32) -> Option<PathBuf> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"XDG_RUNTIME_DIR="))
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()))
}

#[test]
fn sigkill_of_a_pooled_server_leaves_no_pool_jail_cgroup_mount_or_folder() {
    let s = Server::start(&[]);
    let pool = s.pool_processes();
    assert!(!pool.is_empty(), "no pool: {}", s.said());
    let handles = pool_runtime_dir(pool[0]).unwrap();
    // Both pooled jails busy with a run whose client waits, and a session.
    let body = json!({"code": "import time; time.sleep(60)"}).to_string();
    let _clients: Vec<TcpStream> = (0..2).map(|_| connect(s.addr, "POST", "/v1/runs", Some(ALICE), Some(&body))).collect();
    assert_eq!(s.call("POST", "/v1/sessions", Some(ALICE), None).status, 201);
    eventually(Duration::from_secs(20), "the runs did not reach the pool", || s.metric("jail_pool_in_use") == Some(2.0));
    let jails = jails_of(&s);
    assert!(jails.len() >= 2, "{jails:?}");
    s.signal(nix::sys::signal::Signal::SIGKILL);
    eventually(Duration::from_secs(15), "the pool outlived the server", || pool.iter().all(|p| is_gone(*p)));
    eventually(Duration::from_secs(15), "a pooled jail or session outlived the server", || {
        server_processes(&s.marker()).iter().all(|p| *p == s.child.id() || is_janitor(*p))
    });
    eventually(Duration::from_secs(15), "a pooled jail left a cgroup", || {
        jails.iter().all(|p| cgroups_left_by(*p).is_empty())
    });
    eventually(Duration::from_secs(25), "the work folder outlived the server", || {
        std::fs::read_dir(s.work.path()).map(|d| d.count() == 0).unwrap_or(true)
    });
    eventually(Duration::from_secs(25), "the pool's handles folder outlived the server", || !handles.exists());
    assert!(host_mounts_with(&s.marker()).is_empty());
}

#[test]
fn a_pool_that_dies_is_said_in_readyz_its_runs_get_502_and_a_new_one_serves() {
    let s = Server::start(&[]);
    let pool = s.pool_processes();
    let addr = s.addr;
    let inflight = std::thread::spawn(move || {
        request(addr, "POST", "/v1/runs", Some(ALICE), Some(&json!({"code": "import time; time.sleep(30)"}).to_string()))
    });
    eventually(Duration::from_secs(20), "the run did not reach the pool", || s.metric("jail_pool_in_use") == Some(1.0));
    let jails = jails_of(&s);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pool[0] as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let lost = inflight.join().unwrap();
    assert_eq!(lost.status, 502, "{lost:?}");
    assert_eq!(lost.json()["error"]["code"], "pool_lost", "{lost:?}");
    assert!(lost.error().1.contains("send it again"), "{lost:?}");
    // Until the new pool is up, /readyz says why and runs go to jail run.
    let ready = s.call("GET", "/readyz", None, None);
    if ready.status == 503 {
        assert!(ready.body.contains("pool restarting"), "{ready:?}");
    }
    eventually(Duration::from_secs(60), "no new pool", || s.call("GET", "/readyz", None, None).status == 200);
    assert_eq!(s.metric("jail_pool_restarts_total"), Some(1.0));
    // The dead pool's jails ended with it (their lifeline), cgroups and all.
    eventually(Duration::from_secs(15), "a jail of the dead pool lived on", || jails.iter().all(|p| is_gone(*p)));
    eventually(Duration::from_secs(15), "a jail of the dead pool left a cgroup", || {
        jails.iter().all(|p| cgroups_left_by(*p).is_empty())
    });
    let again = s.run(ALICE, json!({"code": "print('again')"})).json();
    assert_eq!((&again["backend"], &again["result"]["stdout"]["text"]), (&json!("pool"), &json!("again\n")), "{again}");
}

#[test]
fn a_pool_that_cannot_start_stops_the_server_with_one_line_and_leaves_nothing() {
    let policy = policy_with(|p| p["preload"] = json!(["no_such_module_anywhere"]));
    let work = tempfile::Builder::new().prefix("serve-test-").tempdir().unwrap();
    let mut tokens = tempfile::NamedTempFile::new().unwrap();
    tokens
        .write_all(json!({"tenants": [{"name": "a", "token": ALICE}]}).to_string().as_bytes())
        .unwrap();
    let out = Command::new(jail_bin().with_file_name("jail-serve"))
        .args(["--listen", "127.0.0.1:0", "--pool-size", "1", "--tokens"])
        .arg(tokens.path())
        .arg("--work-dir")
        .arg(work.path())
        .arg("--rootfs")
        .arg(rootfs())
        .arg("--policy")
        .arg(policy.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{said}");
    let last = said.lines().last().unwrap_or_default();
    assert!(last.contains("the warm pool did not start") && last.contains("no_such_module_anywhere"), "{said}");
    assert!(last.contains("--pool-size 0"), "the line says how to serve anyway: {last}");
    eventually(Duration::from_secs(25), "the work folder outlived the server", || {
        std::fs::read_dir(work.path()).map(|d| d.count() == 0).unwrap_or(true)
    });
    // The pool's jails (whose environment names the work folder) end with it.
    eventually(Duration::from_secs(15), "a process of the server outlived it", || {
        server_processes(&work.path().display().to_string()).iter().all(|p| is_janitor(*p))
    });
}

/// A policy like the default one whose sessions end after `secs` idle.
fn idle_policy(secs: f64) -> tempfile::NamedTempFile {
    policy_with(|p| p["session"] = json!({"idle_timeout_secs": secs, "max_lifetime_secs": 3600}))
}

/// The default policy with `change` made to it, in a file any user reads.
fn policy_with(change: impl FnOnce(&mut Value)) -> tempfile::NamedTempFile {
    let mut p: Value = serde_json::from_slice(&std::fs::read(repo().join("policies/default.json")).unwrap()).unwrap();
    change(&mut p);
    let mut f = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    f.write_all(p.to_string().as_bytes()).unwrap();
    std::fs::set_permissions(f.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    f
}

/// A ready jail that waited past the policy's session idle timeout is dead
/// by the time a run claims it. The run must not fail: either the pool
/// passes over dead jails (branch pool-events) or, where it hands one out,
/// the server sees that the step never started and runs it on `jail run`
/// (`client::pool::Error::never_started`).
#[test]
fn a_run_that_claims_a_pooled_jail_dead_of_idleness_still_runs() {
    let policy = idle_policy(2.0);
    let s = Server::start(&["--policy", policy.path().to_str().unwrap()]);
    wait_ready(&s, 2.0);
    std::thread::sleep(Duration::from_secs(4));
    let r = s.run(ALICE, json!({"code": "print('ran')"}));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["result"]["stdout"]["text"], "ran\n", "{r:?}");
    if r.json()["backend"] == "spawn" {
        assert!(s.metric("jail_runs_spawned_total{reason=\"pool_jail_dead\"}") >= Some(1.0), "{}", s.said());
    }
}

/// Needs the pool's live events (the `events` request field, on branch
/// pool-events): then a followed run goes to the pool and its stdout
/// reaches `/events` while it runs.
#[test]
fn a_followed_pool_run_streams_its_events_while_it_runs() {
    let s = Server::start(&[]);
    assert!(pool_streams_events(&s), "the pool does not stream events");
    let code = "import time\nprint('tick 0', flush=True)\ntime.sleep(2)\nprint('tick 1', flush=True)\n";
    let r = s.run(ALICE, json!({"code": code, "wait": false})).json();
    assert_eq!(r["backend"], "pool", "{r}");
    let id = r["id"].as_str().unwrap();
    let mut stream = connect(s.addr, "GET", &format!("/v1/runs/{id}/events"), Some(ALICE), None);
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("tick 0") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended without tick 0: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let now = s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json();
    assert_eq!(now["state"], "running", "tick 0 came after the run ended: {now}");
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("tick 1") && rest.contains("event: end"), "{rest}");
}

/// `make load-test`: LOAD_CLIENTS concurrent clients (default 200) for
/// LOAD_SECS seconds (default 60) against a server on a pool of
/// LOAD_POOL_SIZE jails (default 4), each client sending a small run and
/// waiting for it, honouring 429's Retry-After. Prints runs/s, p50/p99,
/// errors and the pool's refill time; fails on any error, on a run that
/// did not run on the pool, on a client that stalls (each request has a
/// deadline, the whole test a watchdog), and on anything left once the
/// server has drained: a process, a cgroup, a mount, a folder. With
/// LOAD_PRELOAD=1 the policy has a preload, so the pool forks each jail
/// from its template (issue 36), and a run that was not a fork fails.
#[test]
#[ignore]
fn load_on_loopback() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (clients, secs, pool_size) = (env("LOAD_CLIENTS", 200) as usize, env("LOAD_SECS", 60), env("LOAD_POOL_SIZE", 4));
    let max_runs = env("LOAD_MAX_RUNS", 64).to_string();
    let size = pool_size.to_string();
    let forked = env("LOAD_PRELOAD", 0) == 1;
    let policy = policy_with(|p| p["preload"] = json!(["json"]));
    let mut args = vec!["--pool-size", &size, "--pool-memory", POOL_MEMORY, "--max-runs", &max_runs];
    if forked {
        args.extend(["--policy", policy.path().to_str().unwrap()]);
    }
    let mut s = Server::launch(&args);
    let pool = s.pool_processes();
    let handles = pool.first().and_then(|p| pool_runtime_dir(*p));
    let addr = s.addr;
    // Every jail of the server seen during the load, to look for their cgroups after.
    let jails = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (jails, sampling, marker) = (Arc::clone(&jails), Arc::clone(&sampling), s.marker());
        std::thread::spawn(move || {
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                jails.lock().unwrap().extend(server_processes(&marker));
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..clients {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let (mut ok, mut busy, mut errors, mut lat) = (0u64, 0u64, Vec::new(), Vec::new());
            while Instant::now() < until {
                let t = Instant::now();
                let body = json!({"code": format!("print({i} * 2)"), "limits": {"timeout_secs": 10}}).to_string();
                match bounded_request(addr, &body, Duration::from_secs(60)) {
                    Ok(r)
                        if r.status == 200
                            && r.json()["result"]["status"] == "ok"
                            && r.json()["backend"] == "pool"
                            && r.json()["result"]["isolation"]["forked_from_template"] == forked =>
                    {
                        ok += 1;
                        lat.push(t.elapsed());
                    }
                    Ok(r) if r.status == 429 => {
                        busy += 1;
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    Ok(r) => errors.push(format!("{} {}", r.status, &r.body[..r.body.len().min(300)])),
                    Err(e) => errors.push(e),
                }
            }
            let _ = tx.send((ok, busy, errors, lat));
        });
    }
    drop(tx);
    let (mut ok, mut busy, mut errors, mut lat) = (0, 0, Vec::new(), Vec::new());
    // The watchdog: every client is done within its last request's deadline.
    let watchdog = until + Duration::from_secs(90);
    for _ in 0..clients {
        let left = watchdog.saturating_duration_since(Instant::now());
        let (o, b, e, l) = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("a client stalled past {watchdog:?}: the server hangs"));
        ok += o;
        busy += b;
        errors.extend(e);
        lat.extend(l);
    }
    let took = started.elapsed().as_secs_f64();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let refill = s.metric("jail_pool_refill_seconds{stat=\"mean\"}").unwrap_or(f64::NAN);
    let spawned = s.metric("jail_runs_by_backend_total{backend=\"spawn\"}");
    println!(
        "load: {clients} clients x {secs} s on a pool of {pool_size}{} (node max {max_runs} runs): {ok} runs ok ({:.1}/s), \
         {busy} answered 429, {} errors, p50 {:?}, p99 {:?}, pool refill mean {:.1} ms",
        if forked { " forked from a template" } else { "" },
        ok as f64 / took,
        errors.len(),
        pct(0.50),
        pct(0.99),
        refill * 1000.0,
    );
    let metrics = s.call("GET", "/metrics", None, None).body;
    for l in metrics.lines().filter(|l| l.starts_with("jail_limit_hits_total{")) {
        println!("load: limit hit: {l}");
    }
    assert!(errors.is_empty(), "{} errors: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    assert!(ok > 0);
    assert_eq!(spawned, Some(0.0), "a run went to jail run, not the pool");
    // Drain, then nothing of the server may be left.
    s.signal(nix::sys::signal::Signal::SIGTERM);
    let exit_by = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < exit_by, "the server did not exit after SIGTERM: {}", s.said());
        std::thread::sleep(Duration::from_millis(100));
    };
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    sampler.join().unwrap();
    assert!(status.success(), "{status}: {}", s.said());
    let jails: Vec<u32> = jails.lock().unwrap().iter().copied().collect();
    eventually(Duration::from_secs(15), "a process outlived the server", || {
        server_processes(&s.marker()).iter().all(|p| is_janitor(*p)) && pool.iter().all(|p| is_gone(*p))
    });
    eventually(Duration::from_secs(15), "a jail left a cgroup", || jails.iter().all(|p| cgroups_left_by(*p).is_empty()));
    assert!(host_mounts_with(&s.marker()).is_empty(), "a mount was left");
    assert_eq!(std::fs::read_dir(s.work.path()).unwrap().count(), 0, "the work folder was left");
    assert!(handles.is_some_and(|h| !h.exists()), "the pool's handles folder was left");
    println!(
        "load: nothing left: {} jails seen, their processes, cgroups and mounts gone, the folders removed",
        jails.len()
    );
}

/// A load-test request with a deadline on everything (connect, write,
/// read): an `Err` rather than a hang when the server stalls.
fn bounded_request(addr: SocketAddr, body: &str, deadline: Duration) -> Result<Reply, String> {
    bounded_request_as(addr, LOAD, body, deadline)
}

/// `POST /v1/runs` with `body` sent on a fresh connection, every step
/// bounded: the socket, its reply to be read.
fn post_run(addr: SocketAddr, token: &str, body: &str, deadline: Duration) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(deadline)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body.as_bytes()))
        .map_err(|e| format!("send: {e}"))?;
    Ok(s)
}

/// `bounded_request` with another tenant's token.
fn bounded_request_as(addr: SocketAddr, token: &str, body: &str, deadline: Duration) -> Result<Reply, String> {
    let mut s = post_run(addr, token, body, deadline)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("no reply within {deadline:?}: {e}"))?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (headers, body) = raw.split_once("\r\n\r\n").ok_or_else(|| format!("no reply: {raw:?}"))?;
    let status = headers.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or("no status")?;
    let body = if headers.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        unchunk(body)
    } else {
        body.to_owned()
    };
    Ok(Reply { status, headers: headers.to_owned(), body })
}

// ------------------------------------------------------------ run cgroups

/// The controllers a nested server gives each run (jail's `V2_CONTROLLERS`).
const RUN_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// A cgroup v2 this test makes for one server, beneath the v2 root (as
/// root) or `JAIL_CGROUP_PARENT` (a delegated cgroup given to an ordinary
/// user, as tests/vm/guest.sh gives one), offering memory, pids and cpu:
/// what a pod's container or a systemd unit with `Delegate=yes` gives the
/// server. Removed on drop, once the server's janitor has left it.
struct TestCgroup {
    /// As in /proc/self/cgroup.
    path: PathBuf,
    dir: PathBuf,
}

impl TestCgroup {
    /// `None` after recording why this host cannot have one.
    fn make() -> Option<TestCgroup> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let layout = jail::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
        let elsewhere = "the VM matrix's pure cgroup v2 guests run it (tests/vm/tests.txt)";
        let Some((mount, root)) = layout.unified else {
            covered_elsewhere(&format!("no cgroup2 filesystem is mounted here; {elsewhere}"));
            return None;
        };
        let offered = jail::cgroup::read_words(&mount.join("cgroup.controllers"));
        if !RUN_CONTROLLERS.iter().all(|c| offered.iter().any(|o| o == c)) {
            covered_elsewhere(&format!(
                "this host's cgroup v2 offers [{}], not memory, pids and cpu (a hybrid host: they are on v1); {elsewhere}",
                offered.join(" ")
            ));
            return None;
        }
        let given = std::env::var_os("JAIL_CGROUP_PARENT").filter(|v| !v.is_empty()).map(PathBuf::from);
        let parent = match (is_root(), given) {
            (true, _) => root.clone(),
            (false, Some(p)) => p,
            (false, None) => {
                skip("no cgroup v2 this user may write: run as root, or give JAIL_CGROUP_PARENT a delegated cgroup");
                return None;
            }
        };
        let pdir = jail::cgroup::dir_of(&mount, &root, &parent).unwrap();
        let enabled = jail::cgroup::read_words(&pdir.join("cgroup.subtree_control"));
        if !RUN_CONTROLLERS.iter().all(|c| enabled.iter().any(|e| e == c)) {
            if parent == root {
                // The host's own root: not the test's to change.
                skip(&format!("the cgroup v2 root {} does not enable memory, pids and cpu for its children", pdir.display()));
                return None;
            }
            // A delegated parent given for runs: enabled as `jail run` enables them.
            let want = jail::cgroup::Parent { dir: pdir.clone(), controllers: RUN_CONTROLLERS.map(String::from).to_vec() };
            jail::cgroup::enable_controllers(&want).unwrap();
        }
        let name = format!("serve-test-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let dir = pdir.join(&name);
        std::fs::create_dir(&dir).unwrap();
        Some(TestCgroup { path: parent.join(&name), dir })
    }

    /// The cgroups beneath it.
    fn children(&self) -> Vec<String> {
        std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn procs(&self) -> Vec<i32> {
        jail::cgroup::procs_of(&self.dir)
    }

    fn enabled(&self) -> Vec<String> {
        jail::cgroup::read_words(&self.dir.join("cgroup.subtree_control"))
    }

    /// The server's cgroups are gone and nothing is left in its own: the
    /// janitor has moved back into it, undone it, and exited.
    fn wait_left_as_made(&self, within: Duration) {
        eventually(within, "the server's cgroups outlived it", || self.children().is_empty());
        assert_eq!(self.enabled(), Vec::<String>::new(), "the controllers the server enabled stayed enabled");
        eventually(within, "the janitor did not exit", || self.procs().is_empty());
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let until = Instant::now() + Duration::from_secs(30);
        while std::fs::remove_dir(&self.dir).is_err() && self.dir.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The cgroup of `pid`, as in /proc/self/cgroup.
fn cgroup_of(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    jail::cgroup::parse_proc_cgroup(&text).unified.unwrap_or_default()
}

/// The result's memory, pids and cpus are each enforced by a cgroup v2.
fn assert_limits_by_cgroup_v2(result: &Value, what: &str) {
    for limit in ["memory", "pids", "cpus"] {
        assert_eq!(result["limits"][limit]["enforced_by"], "cgroup_v2", "{what}: limits.{limit}: {result}");
    }
}

/// A server in a cgroup v2 of its own nests it: it moves into `serve`,
/// and its pooled jails, spawned runs and sessions each get a cgroup of
/// their own beneath `runs`; after a SIGTERM drain the janitor removes both
/// and leaves the server's cgroup as it was made.
#[test]
fn a_server_in_a_cgroup_v2_of_its_own_gives_every_run_a_cgroup_and_removes_them_after_a_drain() {
    let Some(cg) = TestCgroup::make() else { return };
    let mut s = Server::launch_in(Wrap::Cgroup(&cg), &["--pool-size", "1", "--pool-memory", POOL_MEMORY]);
    let runs = cg.path.join("runs");
    assert!(s.said().contains(&format!("each run gets a cgroup of its own beneath {}", runs.display())), "{}", s.said());
    assert_eq!(cgroup_of(s.child.id()), cg.path.join("serve"), "the server is not in its leaf");
    assert_eq!(cg.procs(), Vec::<i32>::new(), "a process stayed in the server's own cgroup");
    for c in RUN_CONTROLLERS {
        assert!(cg.enabled().iter().any(|e| e == c), "{c} is not enabled for the runs: {:?}", cg.enabled());
    }
    assert_eq!(s.metric("jail_run_cgroups{mode=\"nested\"}"), Some(1.0));
    let ready = s.call("GET", "/readyz", None, None);
    assert_eq!((ready.status, ready.body.contains(&format!("nested beneath {}", runs.display()))), (200, true), "{ready:?}");

    // The pool's jail (`jail pool`, made with --cgroup-parent).
    wait_ready(&s, 1.0);
    let r = s.run(ALICE, json!({"code": "print('pooled')", "limits": {"timeout_secs": 60}})).json();
    assert_eq!(r["backend"], "pool", "{r}");
    assert_limits_by_cgroup_v2(&r["result"], "a pooled run");
    // A `jail run` of its own, seen in `runs` while it runs.
    let r = s.run(
        ALICE,
        json!({"code": "import time; time.sleep(4); print('spawned')", "limits": {"memory_mib": 128, "timeout_secs": 60},
               "wait": false}),
    );
    assert_eq!(r.status, 202, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let runs_dir = cg.dir.join("runs");
    eventually(Duration::from_secs(30), "the spawned run's cgroup never appeared beneath runs", || {
        std::fs::read_dir(&runs_dir).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("jail-") && e.path().join("tree").is_dir())
        })
    });
    let mut got = Value::Null;
    eventually(Duration::from_secs(60), "the spawned run did not finish", || {
        got = s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json();
        got["state"] == "done"
    });
    assert_eq!((&got["backend"], &got["result"]["stdout"]["text"]), (&json!("spawn"), &json!("spawned\n")), "{got}");
    assert_limits_by_cgroup_v2(&got["result"], "a spawned run");
    // A session (`jail session start`).
    let sess = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
    assert_eq!(sess.status, 201, "{sess:?}");
    let sid = sess.json()["id"].as_str().unwrap().to_owned();
    let cell = s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": "print(1)"}).to_string()));
    assert_eq!(cell.status, 200, "{cell:?}");
    assert_limits_by_cgroup_v2(&cell.json()["result"], "a session's cell");

    s.signal(nix::sys::signal::Signal::SIGTERM);
    let status = s.child.wait().unwrap();
    assert!(status.success(), "the server exits 0 after a drain: {status}\n{}", s.said());
    cg.wait_left_as_made(Duration::from_secs(60));
    assert!(!s.said().contains("janitor: left"), "{}", s.said());
}

/// After a SIGKILL of a nested server with a run and a session going, its
/// janitor removes the server's cgroups once their processes are gone.
#[test]
fn sigkill_of_a_nested_server_leaves_none_of_its_cgroups() {
    let Some(cg) = TestCgroup::make() else { return };
    let s = Server::launch_in(Wrap::Cgroup(&cg), &["--pool-size", "0"]);
    assert_eq!(s.metric("jail_run_cgroups{mode=\"nested\"}"), Some(1.0), "{}", s.said());
    assert_eq!(s.run(ALICE, json!({"code": "import time; time.sleep(60)", "wait": false})).status, 202);
    assert_eq!(s.call("POST", "/v1/sessions", Some(ALICE), None).status, 201);
    let runs_dir = cg.dir.join("runs");
    eventually(Duration::from_secs(30), "the run's and the session's cgroups never appeared", || {
        std::fs::read_dir(&runs_dir).map(|d| d.flatten().count() >= 2).unwrap_or(false)
    });
    s.signal(nix::sys::signal::Signal::SIGKILL);
    cg.wait_left_as_made(Duration::from_secs(90));
    eventually(Duration::from_secs(15), "a process of a run or session outlived the server", || {
        server_processes(&s.marker()).iter().all(|p| *p == s.child.id())
    });
    assert!(!s.said().contains("janitor: left"), "{}", s.said());
}

/// A server that cannot nest (here: its cgroup is shared with this test,
/// or a hybrid host's cgroup v2 offers no controller, or a parent is
/// given) says why once, and each run gets what `jail run` alone would
/// give it, reported in its result; `--no-nest-cgroup` says nothing.
#[test]
fn a_server_that_cannot_nest_its_cgroup_says_why_once_and_its_runs_report_their_own() {
    let s = Server::without_pool(&[]);
    let lines: Vec<String> = s.said().lines().filter(|l| l.contains("not nested")).map(String::from).collect();
    assert_eq!(lines.len(), 1, "{}", s.said());
    assert!(lines[0].contains("Fix: ") && lines[0].contains("--no-nest-cgroup"), "{}", lines[0]);
    assert_eq!(s.metric("jail_run_cgroups{mode=\"fallback\"}"), Some(1.0));
    assert_eq!(s.metric("jail_run_cgroups{mode=\"nested\"}"), Some(0.0));
    let ready = s.call("GET", "/readyz", None, None);
    assert_eq!((ready.status, ready.body.contains("run cgroups: fallback (")), (200, true), "{ready:?}");
    let r = s.run(ALICE, json!({"code": "print(1)"})).json();
    assert_eq!(r["result"]["status"], "ok", "{r}");
    let memory = &r["result"]["limits"]["memory"]["enforced_by"];
    assert_eq!(memory.as_str(), Some(expected_backend().as_str()), "{r}");
    if memory == "rlimit" {
        let degraded = r["result"]["isolation"]["degraded"].to_string();
        assert!(degraded.contains("memory"), "no cgroup, and the result does not say so: {r}");
    }
    drop(s);

    let s = Server::without_pool(&["--no-nest-cgroup"]);
    assert!(!s.said().contains("not nested"), "{}", s.said());
    assert_eq!(s.metric("jail_run_cgroups{mode=\"off\"}"), Some(1.0));
}

// ------------------------------------------------------------ a noisy neighbour

const NOISY: &str = "noisy-token-0123456789abc";
const STEADY: &str = "steady-token-0123456789ab";

/// What the noisy tenant's clients do while the attack is on.
#[derive(Default)]
struct Attack {
    on: std::sync::atomic::AtomicBool,
    over: std::sync::atomic::AtomicBool,
    flood_left: std::sync::atomic::AtomicI64,
    flooded: std::sync::atomic::AtomicU64,
}

impl Attack {
    fn on(&self) -> bool {
        self.on.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn over(&self) -> bool {
        self.over.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Park while the attack is off; false once it is over.
    fn wait_on(&self) -> bool {
        while !self.on() {
            if self.over() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        !self.over()
    }
}

/// A request's head sent on a socket whose receive buffer is 4 KiB; its
/// reply's status once its head is read (the body is left unread).
fn stalled(addr: SocketAddr, path: &str, token: &str) -> Option<(TcpStream, u16)> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &4096);
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n");
    (&s).write_all(head.as_bytes()).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        match (&s).read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let status = String::from_utf8_lossy(&head).split(' ').nth(1).and_then(|c| c.parse().ok())?;
    Some((s, status))
}

/// Whether the server has closed `s` (its FIN came, read or not).
fn closed_by_server(s: &TcpStream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    // POLLRDHUP (Linux): the peer's FIN, even with its bytes unread.
    let rdhup = PollFlags::from_bits_retain(0x2000);
    let mut fds = [PollFd::new(s.as_fd(), rdhup)];
    poll(&mut fds, PollTimeout::ZERO)
        .is_ok_and(|n| n > 0 && fds[0].revents().is_some_and(|r| r.intersects(rdhup | PollFlags::POLLHUP | PollFlags::POLLERR)))
}

/// Hold `n` stalled readers of `path` while the attack is on: each opened,
/// its head read, then nothing for `hold`, then opened again (a server
/// that cut it off cannot say so: its FIN waits behind the unread bytes).
fn stalled_readers(addr: SocketAddr, path: String, n: usize, hold: Duration, attack: Arc<Attack>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut held: Vec<(TcpStream, Instant)> = Vec::new();
        while attack.wait_on() {
            held.retain(|(_, since)| since.elapsed() < hold);
            while held.len() < n && attack.on() {
                match stalled(addr, &path, NOISY) {
                    Some((s, 200)) => held.push((s, Instant::now())),
                    // Refused (429): its cap was hit; try again shortly.
                    _ => break,
                }
            }
            std::thread::sleep(Duration::from_millis(200));
            if !attack.on() {
                held.clear();
            }
        }
    })
}

/// Hold `n` connections that never finish a header (a byte a second) and
/// `n` that send nothing, while the attack is on; reopen those closed.
fn slow_and_idle(addr: SocketAddr, n: usize, attack: Arc<Attack>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut slow: Vec<TcpStream> = Vec::new();
        let mut idle: Vec<TcpStream> = Vec::new();
        let mut tick = Instant::now();
        while attack.wait_on() {
            slow.retain(|s| !closed_by_server(s));
            idle.retain(|s| !closed_by_server(s));
            // At most 2 new ones of each a tick (40 a second): those over
            // the server's caps are closed, and come back at that rate.
            for _ in 0..2 {
                if slow.len() >= n || !attack.on() {
                    break;
                }
                let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { break };
                let _ = (&s).write_all(b"GET /healthz HTTP/1.1\r\n");
                slow.push(s);
            }
            for _ in 0..2 {
                if idle.len() >= n || !attack.on() {
                    break;
                }
                let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { break };
                idle.push(s);
            }
            if tick.elapsed() >= Duration::from_secs(1) {
                tick = Instant::now();
                slow.retain(|s| (&*s).write_all(b"X").is_ok());
            }
            std::thread::sleep(Duration::from_millis(100));
            if !attack.on() {
                slow.clear();
                idle.clear();
            }
        }
    })
}

/// The flood: runs that print 1 MiB of control bytes on each stream,
/// `threads` at once, until `attack.flood_left` is spent; a 429 (the
/// tenant's runs in flight) is tried again.
fn flood(addr: SocketAddr, threads: usize, attack: Arc<Attack>) -> Vec<std::thread::JoinHandle<()>> {
    let code = "import sys\nsys.stdout.write('\\x01' * (1 << 20))\nsys.stderr.write('\\x01' * (1 << 20))\n";
    let body = json!({"code": code, "limits": {"timeout_secs": 30}}).to_string();
    (0..threads)
        .map(|_| {
            let (attack, body) = (Arc::clone(&attack), body.clone());
            std::thread::spawn(move || {
                while attack.wait_on() {
                    // One more run to do, taken only while some are left.
                    let ord = std::sync::atomic::Ordering::SeqCst;
                    if attack.flood_left.fetch_update(ord, ord, |n| (n > 0).then(|| n - 1)).is_err() {
                        if attack.flooded.load(ord) >= 70 {
                            return;
                        }
                        // The last ones are in flight elsewhere: one may come back.
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                    match status_of_post(addr, NOISY, &body, Duration::from_secs(120)) {
                        Ok(200) => {
                            attack.flooded.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        _ => {
                            attack.flood_left.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
            })
        })
        .collect()
}

/// POST a run and read its reply to the end, keeping only its status: the
/// flood's client spends next to nothing on its 13 MiB replies, so the CPU
/// the flood takes is the server's and its jails'.
fn status_of_post(addr: SocketAddr, token: &str, body: &str, deadline: Duration) -> Result<u16, String> {
    let mut s = post_run(addr, token, body, deadline)?;
    let mut first = [0u8; 12];
    s.read_exact(&mut first).map_err(|e| format!("no reply: {e}"))?;
    std::io::copy(&mut s, &mut std::io::sink()).map_err(|e| format!("reply: {e}"))?;
    std::str::from_utf8(&first[9..12])
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| "no status".into())
}

/// p-th quantile of sorted samples.
fn quantile(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// Resident memory of `pid` (and its peak) in bytes, from /proc.
fn rss_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    (kib("VmRSS:").unwrap_or(0) * 1024, kib("VmHWM:").unwrap_or(0) * 1024)
}

/// The noisy neighbour (issue #33), on loopback, bounded in count and
/// time: tenant `noisy` at once floods (70 runs of 1 MiB of control bytes
/// on each stream), holds 60 stalled event readers, 400 slow-header and
/// idle connections and 10 stalled reads of a 60 MiB artifact, while tenant
/// `steady` runs a trivial run and fetches its artifact, one after the
/// other. The steady tenant's latency is measured alone and under the
/// attack in alternating windows of the same run (so the machine's own
/// noise falls on both), and must not pass 1.5x at p99, with no error; the
/// server's resident memory (its jails are processes of their own) must
/// stay under 512 MiB; every cap the noisy tenant hit is printed from
/// /metrics, and the ones its attack must hit are checked.
///
/// The noisy tenant may have one run in flight (`max_runs`): on this
/// 2-core machine that is its share of the CPU. Each flood run costs the
/// pool (its jail's refill, the supervisor writing 2 MiB of control bytes
/// as events and as the result) and the server about 150 ms of CPU; with
/// two in flight the flood took most of a core and the steady tenant's p99
/// rose 1.6-1.9x while it lasted (the connections, stalled readers and
/// stalled artifact reads alone cost it nothing measurable: printed per
/// round).
#[test]
#[ignore]
fn noisy_neighbour_on_loopback() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (rounds, alone_secs, attack_secs) = (env("NOISY_ROUNDS", 6), env("NOISY_ALONE_SECS", 10), env("NOISY_ATTACK_SECS", 10));
    let tenants = json!({"tenants": [
        {"name": "noisy", "token": NOISY, "max_runs": 1, "max_requests": 16, "max_streams": 4, "max_artifact_reads": 2,
         "max_kept_bytes": 128 << 20, "max_timeout_secs": 30, "max_memory_mib": 256},
        {"name": "steady", "token": STEADY, "max_runs": 2, "max_timeout_secs": 30, "max_memory_mib": 256}
    ]});
    let s = Server::launch_with(
        Wrap::Plain,
        &tenants,
        &[
            "--pool-size",
            "4",
            "--pool-memory",
            POOL_MEMORY,
            "--send-timeout",
            "5",
            "--header-timeout",
            "5",
            "--idle-timeout",
            "3",
        ],
    );
    let addr = s.addr;
    let server = s.child.id();
    wait_ready(&s, 4.0);

    // The noisy tenant's 60 MiB artifact, and a run with 12 MiB of events.
    let big = json!({"code": "open('/workspace/output/big.txt', 'w').write('a' * (60 << 20))", "limits": {"timeout_secs": 30}});
    let big = bounded_request_as(addr, NOISY, &big.to_string(), Duration::from_secs(120)).unwrap();
    assert_eq!(big.status, 200, "{big:?}");
    let big = big.json();
    assert_eq!(big["result"]["artifacts"][0]["bytes"], 60 << 20, "{big}");
    let big_id = big["id"].as_str().unwrap().to_owned();
    let loud = json!({"code": "import sys\nsys.stdout.write('\\x01' * (1 << 20))\nsys.stderr.write('\\x01' * (1 << 20))\n"});
    let loud = bounded_request_as(addr, NOISY, &loud.to_string(), Duration::from_secs(120)).unwrap().json();
    let loud_id = loud["id"].as_str().unwrap().to_owned();

    // The server's memory, sampled all along.
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let most_rss = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let (sampling, most) = (Arc::clone(&sampling), Arc::clone(&most_rss));
        std::thread::spawn(move || {
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                most.fetch_max(rss_of(server).0, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    let attack = Arc::new(Attack::default());
    attack.flood_left.store(70, std::sync::atomic::Ordering::SeqCst);
    let mut threads = flood(addr, 8, Arc::clone(&attack));
    let hold = Duration::from_secs(8);
    threads.push(stalled_readers(addr, format!("/v1/runs/{loud_id}/events"), 60, hold, Arc::clone(&attack)));
    threads.push(stalled_readers(addr, format!("/v1/runs/{big_id}/artifacts/big.txt"), 10, hold, Arc::clone(&attack)));
    threads.push(slow_and_idle(addr, 200, Arc::clone(&attack)));

    // The steady tenant: two clients, each a trivial run that leaves a
    // small artifact, then the artifact, one pair after the other; a pair
    // is a sample of the window (alone, or under the attack) it lies in
    // whole. Windows alternate, so the machine's own noise (other builds)
    // falls on both alike.
    let steady =
        json!({"code": "print(6 * 7)\nopen('/workspace/output/n.txt', 'w').write('42')", "limits": {"timeout_secs": 30}});
    let steady = steady.to_string();
    let samples: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let measuring = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (samples, errors, measuring, steady) =
                (Arc::clone(&samples), Arc::clone(&errors), Arc::clone(&measuring), steady.clone());
            std::thread::spawn(move || {
                while measuring.load(std::sync::atomic::Ordering::SeqCst) {
                    let t = Instant::now();
                    let r = bounded_request_as(addr, STEADY, &steady, Duration::from_secs(60));
                    let fetched = r.as_ref().ok().filter(|r| r.status == 200).and_then(|r| {
                        let v = r.json();
                        let id = v["id"].as_str()?.to_owned();
                        (v["result"]["status"] == "ok").then_some(id)
                    });
                    let Some(id) = fetched else {
                        let r = r.map(|r| format!("{} {}", r.status, &r.body[..r.body.len().min(300)]));
                        errors.lock().unwrap().push(format!("run: {r:?}"));
                        continue;
                    };
                    let a = request(addr, "GET", &format!("/v1/runs/{id}/artifacts/n.txt"), Some(STEADY), None);
                    if a.status != 200 || a.body != "42" {
                        errors.lock().unwrap().push(format!("artifact: {} {}", a.status, &a.body[..a.body.len().min(300)]));
                        continue;
                    }
                    samples.lock().unwrap().push((t, Instant::now()));
                }
            })
        })
        .collect();
    // Warm: the pool's jails made, the clients' first runs done.
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    // (from, to, under the attack)
    let mut windows: Vec<(Instant, Instant, bool)> = Vec::new();
    for round in 0..rounds {
        let from = Instant::now();
        std::thread::sleep(Duration::from_secs(alone_secs));
        windows.push((from, Instant::now(), false));
        attack.on.store(true, std::sync::atomic::Ordering::SeqCst);
        // The attack's connections are up before the window counts.
        std::thread::sleep(Duration::from_secs(2));
        let from = Instant::now();
        std::thread::sleep(Duration::from_secs(attack_secs));
        // The last round's attack lasts until the flood is done.
        if round + 1 == rounds {
            let by = Instant::now() + Duration::from_secs(240);
            while attack.flooded.load(std::sync::atomic::Ordering::SeqCst) < 70 && Instant::now() < by {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        windows.push((from, Instant::now(), true));
        attack.on.store(false, std::sync::atomic::Ordering::SeqCst);
        // The attack's sockets are closed before the next window counts.
        std::thread::sleep(Duration::from_secs(1));
    }
    measuring.store(false, std::sync::atomic::Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    attack.over.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    sampler.join().unwrap();
    let took = started.elapsed();
    let (_, peak) = rss_of(server);
    let most = most_rss.load(std::sync::atomic::Ordering::SeqCst).max(peak);

    let samples = samples.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let within = |w: &(Instant, Instant, bool)| -> Vec<Duration> {
        let mut v: Vec<Duration> = samples.iter().filter(|(t, e)| *t >= w.0 && *e <= w.1).map(|(t, e)| *e - *t).collect();
        v.sort();
        v
    };
    let mut per_round: Vec<String> = Vec::new();
    for (i, pair) in windows.chunks(2).enumerate() {
        let (a, n) = (within(&pair[0]), pair.get(1).map(within).unwrap_or_default());
        per_round.push(format!(
            "round {i}: alone {} samples p50 {:.0} ms p99 {:.0} ms, under the attack {} samples p50 {:.0} ms p99 {:.0} ms",
            a.len(),
            quantile(&a, 0.5).as_secs_f64() * 1e3,
            quantile(&a, 0.99).as_secs_f64() * 1e3,
            n.len(),
            quantile(&n, 0.5).as_secs_f64() * 1e3,
            quantile(&n, 0.99).as_secs_f64() * 1e3,
        ));
    }
    let mut alone: Vec<Duration> = windows.iter().filter(|w| !w.2).flat_map(within).collect();
    let mut noisy: Vec<Duration> = windows.iter().filter(|w| w.2).flat_map(within).collect();
    alone.sort();
    noisy.sort();
    let (a50, a99, n50, n99) = (quantile(&alone, 0.5), quantile(&alone, 0.99), quantile(&noisy, 0.5), quantile(&noisy, 0.99));
    let ratio = n99.as_secs_f64() / a99.as_secs_f64().max(1e-6);
    let metrics = s.call("GET", "/metrics", None, None).body;
    let hits: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("jail_limit_hits_total{") && (l.contains("tenant=\"noisy\"") || l.contains("tenant=\"\"")))
        .collect();
    println!(
        "noisy neighbour: {rounds} rounds of {alone_secs} s alone and {attack_secs}+ s under the attack, two steady \
         clients, {:.0} s in all; {} flood runs done",
        took.as_secs_f64(),
        attack.flooded.load(std::sync::atomic::Ordering::SeqCst)
    );
    println!("noisy neighbour: server RSS at most {} MiB (peak VmHWM {} MiB)", most >> 20, peak >> 20);
    println!(
        "noisy neighbour: steady alone {} samples p50 {:.1} ms p99 {:.1} ms; under the attack {} samples p50 {:.1} ms p99 {:.1} ms \
         (p99 {ratio:.2}x), {} errors",
        alone.len(),
        a50.as_secs_f64() * 1e3,
        a99.as_secs_f64() * 1e3,
        noisy.len(),
        n50.as_secs_f64() * 1e3,
        n99.as_secs_f64() * 1e3,
        errors.len()
    );
    for r in &per_round {
        println!("noisy neighbour: {r}");
    }
    for h in &hits {
        println!("noisy neighbour: cap hit: {h}");
    }
    for l in metrics.lines().filter(|l| l.starts_with("jail_kept_bytes") || l.starts_with("jail_kept_runs")) {
        println!("noisy neighbour: {l}");
    }
    assert!(errors.is_empty(), "the steady tenant got {} errors: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    assert_eq!(attack.flooded.load(std::sync::atomic::Ordering::SeqCst), 70, "the flood did not finish");
    assert!(most <= 512 << 20, "the server's RSS reached {} MiB", most >> 20);
    for cap in [
        "tenant_streams",
        "tenant_artifact_reads",
        "tenant_runs",
        "kept_bytes",
        "send_timeout\",tenant=\"noisy",
    ] {
        assert!(hits.iter().any(|h| h.contains(&format!("limit=\"{cap}\""))), "the attack never hit {cap}: {hits:?}");
    }
    assert!(
        hits.iter()
            .any(|h| ["header_timeout", "idle_timeout", "max_unauthenticated"].iter().any(|c| h.contains(c))),
        "the held connections were never closed: {hits:?}"
    );
    assert!(ratio <= 1.5, "the steady tenant's p99 went from {a99:?} alone to {n99:?} under the attack ({ratio:.2}x)");
}

// ------------------------------------------------------------ other local users

/// What another local user (`uid`) finds of `needles` while a run is
/// served: every command line and environment it may read in /proc, every
/// file it may read beneath `work` (walked as far as it may list), and the
/// files at `known` (paths it could only have guessed). Run as that user
/// by a python3 of the host's; its findings, one a line.
fn seen_by(uid: (u32, u32), needles: &[&str], work: &std::path::Path, known: &[PathBuf]) -> String {
    const LOOK: &str = r#"
import json, os, sys
needles, work, known = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
def has(blob):
    return [n for n in needles if n.encode() in blob]
for pid in os.listdir("/proc"):
    # Not this look itself, whose command line carries the needles.
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    for f in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{f}", "rb") as h:
                found = has(h.read())
        except OSError:
            continue
        if found:
            print(f"/proc/{pid}/{f} names {found}")
for root, dirs, files in os.walk(work):
    for name in files:
        try:
            with open(os.path.join(root, name), "rb") as h:
                found = has(h.read(1 << 20))
        except OSError:
            continue
        if found:
            print(f"{os.path.join(root, name)} holds {found}")
for path in known:
    try:
        with open(path, "rb") as h:
            print(f"{path} is readable: {has(h.read(1 << 20))}")
    except OSError:
        pass
"#;
    // setpriv (util-linux): that uid and gid, and none of root's groups.
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            &uid.0.to_string(),
            "--regid",
            &uid.1.to_string(),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
        ])
        .arg(LOOK)
        .arg(serde_json::to_string(needles).unwrap())
        .arg(work)
        .arg(serde_json::to_string(known).unwrap())
        .current_dir("/")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Nothing of a tenant's is visible to other local users while a root
/// server runs it (issue #32): no command line or environment another
/// user may read names its code, its input or its run's folder, and
/// nothing it may list leads there. The folder is 0711 and its files 0644,
/// as every door needs of what the jail's unprivileged uid is given
/// (jail/src/accept.rs never widens a mode): open to one who had its path,
/// which is 128 random bits nobody is told. Its result names no host path.
#[test]
fn another_local_user_finds_nothing_of_a_served_run() {
    if only_as_root("only root may look as another user") {
        return;
    }
    let Some(other) = test_user() else { return };
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        for with_input in [false, true] {
            let secret = format!("secret-{backend}-{with_input}-{}", std::process::id());
            let code = format!("import time\n# {secret}\ntime.sleep(4)\nprint('done')");
            let mut body = json!({"code": code, "wait": false, "limits": {"timeout_secs": 30}});
            if with_input {
                body["files"] = json!({"in.txt": format!("the input {secret}")});
            }
            let r = s.run(ALICE, body).json();
            assert_eq!(r["backend"], backend, "{r}");
            let id = r["id"].as_str().unwrap().to_owned();
            let dir = s.tenant_entries("alice").into_iter().find(|p| p.ends_with(&id)).expect("the run's folder");
            let known = vec![
                dir.join("main.py"),
                dir.join("input/in.txt"),
                dir.join(".result.json"),
                dir.join(".events"),
            ];
            let mut seen = String::new();
            // While it runs (its processes up) and once it is done.
            eventually(Duration::from_secs(20), "the run never ran", || {
                let running = s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json()["state"] == "running";
                if running {
                    seen.push_str(&seen_by(other, &[&secret, &id], s.work.path(), &known));
                }
                running
            });
            std::thread::sleep(Duration::from_millis(1500));
            seen.push_str(&seen_by(other, &[&secret, &id], s.work.path(), &known));
            // Found only by a path it was never told: the staged files.
            let leaks: Vec<&str> = seen
                .lines()
                .filter(|l| !(l.contains("/main.py is readable") || l.contains("/input/in.txt is readable")))
                .collect();
            assert!(leaks.is_empty(), "{backend}, input {with_input}: uid {} found: {leaks:#?}", other.0);
            let mode = |p: &std::path::Path| {
                std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o777
            };
            assert_eq!(mode(&dir), 0o711, "{backend}, input {with_input}: the run's folder may be listed");
            eventually(Duration::from_secs(30), "the run did not end", || {
                s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None).json()["state"] == "done"
            });
            for kept in [".events", ".result.json", ".artifacts.json"] {
                assert_eq!(mode(&dir.join(kept)), 0o600, "{kept} is not the server's alone");
            }
            let done = s.call("GET", &format!("/v1/runs/{id}"), Some(ALICE), None);
            let at = done.body.find(&s.marker()).unwrap_or(0);
            assert!(!done.body.contains(&s.marker()), "the result names a host path: …{}…", &done.body[at.saturating_sub(200)..]);
            assert_eq!(done.json()["result"]["output_dir"], Value::Null);
        }
    }
}

// ------------------------------------------------------------ connection limits

/// Whether the server closed `s` within `within` (a read ends, or fails
/// other than by timing out); what was read meanwhile is dropped.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let until = Instant::now() + within;
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A limit's count in /metrics (0 when never hit).
fn hits(s: &Server, limit: &str, tenant: &str) -> f64 {
    s.metric(&format!("jail_limit_hits_total{{limit=\"{limit}\",tenant=\"{tenant}\"}}")).unwrap_or(0.0)
}

/// hyper's header read timeout closes a connection that trickles a header,
/// the idle timeout one that sends nothing, and a request with no valid
/// token has its connection closed after its 401; each is counted.
#[test]
fn slow_headers_silent_connections_and_tokenless_clients_are_closed() {
    let s = Server::without_pool(&["--header-timeout", "2", "--idle-timeout", "1"]);
    // A header a byte at a time: more than 2 s for the whole.
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    let started = Instant::now();
    let mut closed = false;
    // Within 20 s: short of hyper's own default of 30 s.
    while started.elapsed() < Duration::from_secs(20) {
        if slow.write_all(b"X").is_err() || closed_within(&mut slow, Duration::from_millis(300)) {
            closed = true;
            break;
        }
    }
    assert!(closed, "a header trickled for 20 s and the connection stayed open");
    eventually(Duration::from_secs(5), "the header timeout was not counted", || hits(&s, "header_timeout", "") >= 1.0);
    // Nothing at all.
    let mut silent = TcpStream::connect(s.addr).unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(20)), "a silent connection stayed open");
    eventually(Duration::from_secs(5), "the idle timeout was not counted", || hits(&s, "idle_timeout", "") >= 1.0);
    // A token the server does not know: 401, then the connection closes.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.write_all(b"GET /v1/runs/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer not-a-token-of-anyones\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 401") && raw.to_ascii_lowercase().contains("connection: close"), "{raw}");
    // A keep-alive client with a valid token is served on the same connection.
    let mut k = TcpStream::connect(s.addr).unwrap();
    k.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    for _ in 0..2 {
        k.write_all(format!("GET /v1/runs/nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\r\n").as_bytes())
            .unwrap();
        let mut head = [0u8; 12];
        k.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 404");
        let mut rest = [0u8; 4096];
        let _ = k.read(&mut rest).unwrap();
    }
}

/// Past `--max-connections` a new connection is closed at once; past
/// `--max-unauthenticated` the oldest connection without a valid token is
/// closed for the new one, which is then served; a request body that does
/// not come within `--body-timeout` gets 408.
#[test]
fn connection_caps_close_the_newest_past_the_global_one_and_the_oldest_unauthenticated_one() {
    let s = Server::without_pool(&[
        "--max-connections",
        "4",
        "--max-unauthenticated",
        "2",
        "--idle-timeout",
        "600",
        "--header-timeout",
        "600",
        "--body-timeout",
        "1",
    ]);
    // A body that never comes: 408 (and the connection closes).
    let mut c = TcpStream::connect(s.addr).unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut status = [0u8; 12];
    c.read_exact(&mut status).unwrap();
    assert_eq!(&status, b"HTTP/1.1 408", "a body that never came was not refused");
    assert!(hits(&s, "body_timeout", "alice") >= 1.0);
    assert!(closed_within(&mut c, Duration::from_secs(10)));
    // Two silent connections, then a third without a token: the first goes,
    // the newcomer is served.
    let mut held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(s.addr).unwrap()).collect();
    // Old enough to be closed for a newcomer (a fresh one never is).
    std::thread::sleep(Duration::from_millis(2500));
    let r = s.call("GET", "/healthz", None, None);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(closed_within(&mut held[0], Duration::from_secs(10)), "the oldest unauthenticated connection stayed");
    assert!(!closed_within(&mut held[1], Duration::from_millis(300)), "a newer one went");
    assert!(hits(&s, "max_unauthenticated", "") >= 1.0);
    // Keep-alive connections with a valid token stay open (they are no
    // longer unauthenticated): with the silent one, four.
    let authed: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut k = TcpStream::connect(s.addr).unwrap();
            k.write_all(format!("GET /v1/runs/nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\r\n").as_bytes())
                .unwrap();
            k.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut status = [0u8; 12];
            k.read_exact(&mut status).unwrap();
            assert_eq!(&status, b"HTTP/1.1 404");
            k
        })
        .collect();
    // The next one is closed as it is accepted (should one of those above
    // still be on its way out, the one after).
    let mut kept = Vec::new();
    let refused = (0..3).any(|_| {
        let mut c = TcpStream::connect(s.addr).unwrap();
        let closed = closed_within(&mut c, Duration::from_secs(5));
        kept.push(c);
        closed
    });
    assert!(refused, "connections past --max-connections were kept");
    // Room again for /metrics, once the server has seen those close: until
    // then a new connection is itself past the cap, closed as it comes.
    drop(authed);
    drop(kept);
    eventually(Duration::from_secs(10), "the global cap was not counted", || hits(&s, "max_connections", "") >= 1.0);
}

/// A reader of an event stream that takes nothing is disconnected after
/// `--send-timeout` (the server holds one chunk for it meanwhile), and
/// resumes with `?from=N` (or `Last-Event-ID`) where it stopped, the
/// events from N each once, in order, then the result.
/// A tenant's streams past its `max_streams` get 429.
#[test]
fn a_stalled_event_reader_is_cut_off_and_resumes_from_where_it_stopped() {
    let tenants = json!({"tenants": [
        {"name": "alice", "token": ALICE, "max_streams": 1, "max_memory_mib": 256}
    ]});
    let s = Server::launch_with(Wrap::Plain, &tenants, &["--pool-size", "0", "--send-timeout", "2"]);
    // 1 MiB of control bytes on each stream: 12 MiB of events, far past
    // what the sockets hold.
    let code = "import sys\nsys.stdout.write('\\x01' * (1 << 20))\nsys.stderr.write('\\x01' * (1 << 20))";
    let r = s.run(ALICE, json!({"code": code})).json();
    assert_eq!(r["result"]["status"], "ok", "{}", r["result"]["status"]);
    let id = r["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/runs/{id}/events");
    let (stalled, status) = stalled(s.addr, &path, ALICE).expect("the stream's head");
    assert_eq!(status, 200);
    // A second stream of the tenant's: refused while the first is open.
    let second = s.call("GET", &path, Some(ALICE), None);
    assert_eq!(second.status, 429, "{}", &second.body[..second.body.len().min(300)]);
    assert!(hits(&s, "tenant_streams", "alice") >= 1.0);
    // Its FIN waits behind the bytes it does not read: the server's count
    // and its free stream say it was cut off.
    let started = Instant::now();
    eventually(Duration::from_secs(60), "the stalled reader was never cut off", || hits(&s, "send_timeout", "alice") >= 1.0);
    eprintln!("the stalled reader was cut off after {:?}", started.elapsed());
    assert_eq!(s.call("GET", &format!("{path}?from=1000000"), Some(ALICE), None).status, 200, "its stream was not freed");
    // It resumes after what it had (its socket's bytes trickle through a
    // 4 KiB window now, so it is not read here): from the fifth event on.
    drop(stalled);
    let whole = 5u64;
    let resumed = s.call("GET", &format!("{path}?from={whole}"), Some(ALICE), None);
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let again: Vec<u64> = resumed.body.lines().filter_map(|l| l.strip_prefix("id: ")).filter_map(|n| n.parse().ok()).collect();
    assert_eq!(again.first(), Some(&whole), "resumed at {whole}: {:?}", &again[..again.len().min(5)]);
    assert!(again.windows(2).all(|w| w[1] == w[0] + 1), "each event once, in order");
    // Only the last event is decoded (12 MiB of them would take a debug build long).
    let last = resumed.body.rsplit("data: ").nth(1).unwrap_or_default();
    let last: Value = serde_json::from_str(last.lines().next().unwrap_or_default()).unwrap();
    assert_eq!(last["result"]["stdout"]["bytes"], 1 << 20, "the resumed stream ends with the result");
    // The whole stream, as `Last-Event-ID` resumes it too.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {ALICE}\r\nLast-Event-ID: {}\r\n\r\n",
            again.last().unwrap() - 1
        )
        .as_bytes(),
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let tail = body_of_raw(&String::from_utf8_lossy(&raw));
    // Each event is a `{"type": ...}` object; the end's data is `{}`.
    let events = tail.lines().filter(|l| l.starts_with("data: {\"type\"")).count();
    assert_eq!(events, 1, "after the last-but-one event, only the result: {}", &tail[..tail.len().min(300)]);
}

/// What a tenant keeps is bounded in bytes: past its `max_kept_bytes` its
/// oldest finished runs are forgotten (404, their folders removed), and
/// /metrics shows what it keeps against its limit.
#[test]
fn a_tenant_keeps_no_more_bytes_than_its_max_kept_bytes() {
    let tenants = json!({"tenants": [
        {"name": "alice", "token": ALICE, "max_kept_bytes": 16 << 20, "max_memory_mib": 256}
    ]});
    let s = Server::launch_with(Wrap::Plain, &tenants, &["--pool-size", "0"]);
    // Each run keeps ~6 MiB of events and ~6 MiB of result (1 MiB of control bytes, escaped).
    let code = "import sys\nsys.stdout.write('\\x01' * (1 << 20))";
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let r = s.run(ALICE, json!({"code": code})).json();
            assert_eq!(r["result"]["status"], "ok", "{}", r["result"]["status"]);
            r["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let kept = s.metric("jail_kept_bytes{tenant=\"alice\"}").unwrap();
    assert!(kept <= (16 << 20) as f64, "alice keeps {kept} bytes, over her 16 MiB");
    assert_eq!(s.metric("jail_kept_bytes_limit{tenant=\"alice\"}"), Some((16 << 20) as f64));
    assert_eq!(s.call("GET", &format!("/v1/runs/{}", ids[0]), Some(ALICE), None).status, 404, "the oldest was kept");
    assert_eq!(s.call("GET", &format!("/v1/runs/{}", ids[3]), Some(ALICE), None).status, 200, "the newest was forgotten");
    assert!(hits(&s, "kept_bytes", "alice") >= 1.0);
    assert!(!s.tenant_entries("alice").iter().any(|p| p.ends_with(&ids[0])), "the oldest run's folder was left");
}

/// Staging counts toward a run's wall time (the jail is given what is
/// left, and its result says so), and an input of many entries goes to
/// `jail run`, which binds it, rather than to the pool, which would copy
/// it entry by entry outside the run's time.
#[test]
fn an_input_of_many_entries_is_staged_within_the_runs_own_time() {
    let s = Server::start(&[]);
    wait_ready(&s, 1.0);
    let names: Vec<String> = (0..4000).map(|i| format!("d{i}/")).collect();
    let entries: Vec<Entry> = names.iter().map(|n| (n.as_str(), tar::EntryType::Directory, &b""[..], "")).collect();
    let tar = b64(&gzip(&tar_of(&entries)));
    let body = json!({"code": "import os\nprint(len(os.listdir('/workspace/input')))", "input_tar": tar,
                      "limits": {"timeout_secs": 5}});
    let r = s.run(ALICE, body);
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(500)]);
    let v = r.json();
    assert_eq!(v["backend"], "spawn", "{}", v["backend"]);
    assert_eq!(s.metric("jail_runs_spawned_total{reason=\"large_input\"}"), Some(1.0));
    let wall = v["result"]["limits"]["wall_time_secs"]["value"].as_f64().unwrap();
    assert!(wall < 5.0, "staging was not taken from the run's wall time: the jail was given {wall} s");
    assert_eq!((&v["result"]["status"], &v["result"]["stdout"]["text"]), (&json!("ok"), &json!("4000\n")));
}

/// The variables a tenant sets (jail/src/envs.rs) reach the code on every
/// path of the service: a run and a session on either backend, a cell's
/// own for that cell only; a name the jail keeps is 400 with `field:
/// "env"` naming it, and nothing runs.
#[test]
fn a_tenants_variables_reach_runs_sessions_and_cells_on_either_backend_and_the_jails_names_are_400() {
    let show = "import os\nprint(os.environ.get('A'), os.environ.get('S'), os.environ.get('C'))";
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        if backend == "pool" {
            wait_ready(&s, 2.0);
        }
        let r = s.run(ALICE, json!({"code": show, "env": {"A": "run"}}));
        assert_eq!(r.status, 200, "{backend}: {r:?}");
        assert_eq!(r.json()["result"]["stdout"]["text"], "run None None\n", "{backend}: {r:?}");
        assert_eq!(r.json()["backend"], backend, "{r:?}");
        let made = s.call("POST", "/v1/sessions", Some(ALICE), Some(&json!({"env": {"S": "session"}}).to_string()));
        assert_eq!(made.status, 201, "{backend}: {made:?}");
        assert_eq!(made.json()["backend"], backend, "{made:?}");
        let sid = made.json()["id"].as_str().unwrap().to_owned();
        let exec = |body: Value| s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&body.to_string()));
        let cell = exec(json!({"code": show, "env": {"C": "cell"}}));
        assert_eq!(cell.json()["result"]["stdout"]["text"], "None session cell\n", "{backend}: {cell:?}");
        let cell = exec(json!({"code": show}));
        assert_eq!(cell.json()["result"]["stdout"]["text"], "None session None\n", "{backend}: a cell's variable outlived it");
        let bad = exec(json!({"code": "print(1)", "env": {"PYTHONPATH": "/x"}}));
        assert_eq!((bad.status, bad.error().0.as_deref()), (400, Some("env")), "{backend}: {bad:?}");
        assert!(bad.error().1.contains("PYTHONPATH"), "{backend}: {bad:?}");
        for (body, field) in [
            (json!({"code": "print(1)", "env": {"LD_PRELOAD": "/x.so"}}), "env"),
            (json!({"code": "1", "env": {"A": 1}}), "env.A"),
        ] {
            let r = s.run(ALICE, body.clone());
            assert_eq!((r.status, r.error().0.as_deref()), (400, Some(field)), "{backend}: {body}: {r:?}");
        }
        let r = s.call("POST", "/v1/sessions", Some(ALICE), Some(&json!({"env": {"JAIL_PRELOAD": "os"}}).to_string()));
        assert_eq!((r.status, r.error().0.as_deref()), (400, Some("env")), "{backend}: {r:?}");
        assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
    }
}

/// Rich results come back with a run and a cell on either backend: the
/// last expression's value and a display, in `result.results`.
#[test]
fn a_served_run_and_cell_return_their_rich_results_on_either_backend() {
    let code = "display({'a': 1})\nx = 20\nx * 2 + 2";
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        if backend == "pool" {
            wait_ready(&s, 2.0);
        }
        let r = s.run(ALICE, json!({"code": code}));
        assert_eq!((r.status, &r.json()["backend"]), (200, &json!(backend)), "{r:?}");
        let results = r.json()["result"]["results"].clone();
        assert_eq!(results[0]["data"]["text/plain"], "{'a': 1}", "{backend}: {results}");
        assert_eq!((&results[1]["data"]["text/plain"], &results[1]["is_main_result"]), (&json!("42"), &json!(true)), "{backend}");
        let made = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
        let sid = made.json()["id"].as_str().unwrap().to_owned();
        let cell = s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()));
        let results = cell.json()["result"]["results"].clone();
        assert_eq!(results[1]["data"]["text/plain"], "42", "{backend}: {cell:?}");
        assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
    }
}

/// A live session's files API on either backend: a CSV put mid-session,
/// read by a cell that writes another, which comes back judged (its
/// formula cell neutralised, the headers saying so) and is listed; what
/// the file put was is delivered with the session's output at its end.
#[test]
fn a_sessions_files_are_put_read_by_its_cells_got_back_judged_and_listed_on_either_backend() {
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        let made = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
        assert_eq!((made.status, &made.json()["backend"]), (201, &json!(backend)), "{made:?}");
        let sid = made.json()["id"].as_str().unwrap().to_owned();
        let files = format!("/v1/sessions/{sid}/files");
        let csv = b"item,price\npen,2\n";
        let put = send_bytes(s.addr, "PUT", &format!("{files}/data/prices.csv"), ALICE, csv);
        assert_eq!(put.status, 200, "{backend}: {put:?}");
        assert_eq!(
            put.json(),
            json!({"path": "data/prices.csv", "bytes": csv.len(), "sha256": jail::digest::sha256_hex(csv)}),
            "{backend}"
        );
        // The path a cell uses is taken too.
        let again = send_bytes(s.addr, "PUT", &format!("{files}//workspace/output/data/prices.csv"), ALICE, csv);
        assert_eq!((again.status, &again.json()["path"]), (200, &json!("data/prices.csv")), "{backend}: {again:?}");
        let code = "import csv\nrows = list(csv.reader(open('/workspace/output/data/prices.csv')))\n\
                    rows.append(['total', '=SUM(B2:B2)'])\n\
                    csv.writer(open('/workspace/output/total.csv', 'w', newline='')).writerows(rows)\nprint(len(rows))";
        let cell = s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()));
        assert_eq!(cell.json()["result"]["stdout"]["text"], "3\n", "{backend}: the cell did not read the file put: {cell:?}");
        let got = s.call("GET", &format!("{files}/total.csv"), Some(ALICE), None);
        assert_eq!(got.status, 200, "{backend}: {got:?}");
        assert_eq!(got.body, "item,price\r\npen,2\r\ntotal,'=SUM(B2:B2)\r\n", "{backend}: not neutralised");
        assert_eq!(got.header("content-type").as_deref(), Some("application/octet-stream"));
        assert_eq!(got.header("x-jail-sha256"), Some(jail::digest::sha256_hex(got.body.as_bytes())), "{backend}: {got:?}");
        assert_eq!(got.header("x-jail-media-type").as_deref(), Some("text/csv"), "{backend}: {got:?}");
        assert_eq!(got.header("x-jail-flags").as_deref(), Some("formula_injection"), "{backend}: {got:?}");
        let plain = s.call("GET", &format!("{files}/data/prices.csv"), Some(ALICE), None);
        assert_eq!((plain.status, plain.body.as_bytes()), (200, &csv[..]), "{backend}: {plain:?}");
        assert_eq!(plain.header("x-jail-flags"), None, "{backend}: a file with no flag has no flags header");
        let listed = s.call("GET", &files, Some(ALICE), None);
        assert_eq!(listed.status, 200, "{backend}: {listed:?}");
        assert_eq!(
            listed.json(),
            json!({"path": "", "truncated": false, "entries": [
                {"name": "data", "kind": "dir", "bytes": 0},
                {"name": "total.csv", "kind": "file", "bytes": 38}]}),
            "{backend}"
        );
        let sub = s.call("GET", &format!("{files}?path=data"), Some(ALICE), None).json();
        assert_eq!(sub["entries"], json!([{"name": "prices.csv", "kind": "file", "bytes": csv.len()}]), "{backend}: {sub}");
        assert_eq!(closed_with(&s, &sid), ["data/prices.csv", "total.csv"], "{backend}");
    }
}

/// A cell that draws a chart (a real PNG, made by hand: the minimal rootfs
/// has no matplotlib) and writes a CSV with a formula.
const CHART_AND_TABLE: &str = "import struct, zlib\n\
def chunk(kind, data):\n    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))\n\
png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 2, 1, 8, 2, 0, 0, 0)) \
+ chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00\\x00\\x00\\xff')) + chunk(b'IEND', b'')\n\
open('/workspace/output/chart.png', 'wb').write(png)\n\
open('/workspace/output/table.csv', 'w').write('k,v\\n=1+1,2\\n')\n\
open('/workspace/output/note.txt', 'w').write('gone soon')";

/// A cell's result passes on, untouched, the files that cell made, changed
/// or deleted as the jail judged them, on either backend; before the
/// session ends each is read through the files route (its judged copy,
/// whose `x-jail-sha256`, or for a neutralised CSV `x-jail-original-sha256`,
/// is the sha256 the cell listed), and the ended session's artifacts route
/// serves none of them yet.
#[test]
fn a_cells_chart_and_csv_are_listed_in_its_result_and_read_through_the_files_route_before_the_session_ends() {
    for (s, backend) in [(Server::start(&[]), "pool"), (Server::without_pool(&[]), "spawn")] {
        let made = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
        assert_eq!((made.status, &made.json()["backend"]), (201, &json!(backend)), "{made:?}");
        let sid = made.json()["id"].as_str().unwrap().to_owned();
        let exec = |code: &str| {
            let r = s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()));
            assert_eq!((r.status, &r.json()["result"]["status"]), (200, &json!("ok")), "{backend}: {r:?}");
            r.json()["result"].clone()
        };
        let listed = |cell: &Value| -> Vec<(String, String)> {
            let mut l: Vec<(String, String)> = cell["artifacts"]
                .as_array()
                .unwrap_or_else(|| panic!("{backend}: no artifacts: {cell}"))
                .iter()
                .map(|a| (a["path"].as_str().unwrap().to_owned(), a["change"].as_str().unwrap().to_owned()))
                .collect();
            l.sort();
            l
        };
        let entry = |cell: &Value, path: &str| -> Value {
            cell["artifacts"].as_array().unwrap().iter().find(|a| a["path"] == path).cloned().unwrap()
        };
        let cell = exec(CHART_AND_TABLE);
        let created = |p: &str| (p.to_owned(), "created".to_owned());
        assert_eq!(listed(&cell), [created("chart.png"), created("note.txt"), created("table.csv")], "{backend}: {cell}");
        assert_eq!(cell["rejected_artifacts"], json!([]), "{backend}: {cell}");
        let chart = entry(&cell, "chart.png");
        assert_eq!(chart["media_type"], "image/png", "{backend}: {chart}");
        let table = entry(&cell, "table.csv");
        assert_eq!(table["flags"][0]["kind"], "formula_injection", "{backend}: {table}");
        let files = format!("/v1/sessions/{sid}/files");
        let got = s.call("GET", &format!("{files}/chart.png"), Some(ALICE), None);
        assert_eq!(got.status, 200, "{backend}: {got:?}");
        assert!(got.body.contains("IHDR"), "{backend}: not the chart: {got:?}");
        assert_eq!(got.header("x-jail-sha256").as_deref(), chart["sha256"].as_str(), "{backend}: {got:?}");
        assert_eq!(got.header("content-length"), Some(chart["bytes"].to_string()), "{backend}: {got:?}");
        assert_eq!(got.header("x-jail-media-type").as_deref(), Some("image/png"), "{backend}: {got:?}");
        assert_eq!(got.header("x-jail-original-sha256"), None, "{backend}: the chart was sent as written: {got:?}");
        let got = s.call("GET", &format!("{files}/table.csv"), Some(ALICE), None);
        assert_eq!((got.status, got.body.as_str()), (200, "k,v\n'=1+1,2\n"), "{backend}: not neutralised: {got:?}");
        assert_eq!(got.header("x-jail-sha256"), Some(jail::digest::sha256_hex(got.body.as_bytes())), "{backend}");
        assert_eq!(got.header("x-jail-original-sha256").as_deref(), table["sha256"].as_str(), "{backend}: {got:?}");
        let art = s.call("GET", &format!("/v1/sessions/{sid}/artifacts/chart.png"), Some(ALICE), None);
        assert_eq!(art.status, 404, "{backend}: served as a closing artifact before the session ended: {art:?}");
        // The next cell lists only what it did: a change and a deletion.
        let next =
            exec("open('/workspace/output/table.csv', 'a').write('x,3\\n')\nimport os\nos.remove('/workspace/output/note.txt')");
        assert_eq!(
            listed(&next),
            [
                ("note.txt".to_owned(), "deleted".to_owned()),
                ("table.csv".to_owned(), "modified".to_owned())
            ],
            "{backend}: {next}"
        );
        assert_eq!(entry(&next, "note.txt")["sha256"], Value::Null, "{backend}: {next}");
        let got = s.call("GET", &format!("{files}/table.csv"), Some(ALICE), None);
        assert_eq!(got.header("x-jail-original-sha256").as_deref(), entry(&next, "table.csv")["sha256"].as_str(), "{backend}");
        assert_ne!(entry(&next, "table.csv")["sha256"], table["sha256"], "{backend}: the change went unseen");
        assert_eq!(closed_with(&s, &sid), ["chart.png", "table.csv"], "{backend}");
    }
}

/// A live session's file reply is held in the token's read budget until
/// it is sent, as an artifact's is: with `max_artifact_reads` 1, a client
/// that leaves a 6 MiB file reply unread has the next read of it refused
/// `busy` (429), not another 6 MiB held; once that reply is taken, reads
/// are served again.
#[test]
fn a_session_files_reply_is_held_in_the_tokens_read_budget_until_it_is_sent() {
    let tenants = json!({"tenants": [
        {"name": "alice", "token": ALICE, "max_runs": 2, "max_sessions": 1, "max_artifact_reads": 1,
         "max_timeout_secs": 60, "max_memory_mib": 256}
    ]});
    let s = Server::launch_with(Wrap::Plain, &tenants, &["--pool-size", "0"]);
    let made = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
    assert_eq!(made.status, 201, "{made:?}");
    let sid = made.json()["id"].as_str().unwrap().to_owned();
    let code = json!({"code": "open('/workspace/output/big.txt', 'w').write('x' * (6 << 20))"}).to_string();
    let r = s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&code));
    assert_eq!(r.status, 200, "{r:?}");
    let path = format!("/v1/sessions/{sid}/files/big.txt");
    let (unread, status) = stalled(s.addr, &path, ALICE).expect("the first read's head");
    assert_eq!(status, 200);
    let second = s.call("GET", &path, Some(ALICE), None);
    let said: String = second.body.chars().take(200).collect();
    assert_eq!(second.status, 429, "a second 6 MiB reply was made while the first was held: {said}");
    assert_eq!(second.json()["error"]["code"], "busy", "{said}");
    drop(unread);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = s.call("GET", &path, Some(ALICE), None);
        if again.status == 200 {
            assert_eq!(again.body.len(), 6 << 20);
            break;
        }
        assert!(Instant::now() < deadline, "the budget was never given back: {}", again.status);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// End session `sid` (`DELETE`): the paths its closing result lists, sorted.
fn closed_with(s: &Server, sid: &str) -> Vec<String> {
    let closing = s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).json();
    let mut paths: Vec<String> = closing["result"]["artifacts"]
        .as_array()
        .unwrap_or_else(|| panic!("no artifacts in the closing result: {closing}"))
        .iter()
        .filter_map(|a| a["path"].as_str().map(String::from))
        .collect();
    paths.sort();
    paths
}

/// Each way out of the files API is refused as a 4xx JSON error, never a
/// 500: `..` (as sent, and percent-encoded, which axum decodes), a link a
/// cell made (as the file, and on the way), a body over the token's most,
/// a file the artifact rules refuse, a folder where a file is asked for,
/// another tenant's session, a session that ended by itself.
#[test]
fn the_files_api_refuses_dot_dot_links_oversize_bodies_refused_files_other_tenants_and_ended_sessions() {
    let s = Server::start(&[]);
    let made = s.call("POST", "/v1/sessions", Some(ALICE), Some("{}"));
    assert_eq!(made.status, 201, "{made:?}");
    let sid = made.json()["id"].as_str().unwrap().to_owned();
    let files = format!("/v1/sessions/{sid}/files");
    let exec =
        |code: &str| s.call("POST", &format!("/v1/sessions/{sid}/exec"), Some(ALICE), Some(&json!({"code": code}).to_string()));
    let cell = exec(
        "import os\nos.symlink('/etc/passwd', 'passwd.txt')\nos.symlink('/etc', 'etc')\nos.mkdir('folder.txt')\n\
         open('run.sh', 'w').write('echo hi')\nopen('ok.txt', 'w').write('fine')",
    );
    assert_eq!(cell.json()["result"]["status"], "ok", "{cell:?}");
    let refused = |r: &Reply, status: u16, code: &str| {
        assert_eq!(r.status, status, "{r:?}");
        assert_eq!(r.json()["error"]["code"], code, "{r:?}");
        assert!(!r.body.contains("root:x:0"), "{r:?}");
    };
    for path in [
        "../../../etc/passwd",
        "%2E%2E/%2E%2E/etc/passwd",
        "data/%2e%2e/%2e%2e/x.txt",
        "%2Fetc%2Fpasswd",
    ] {
        let got = s.call("GET", &format!("{files}/{path}"), Some(ALICE), None);
        refused(&got, 400, "bad_path");
        assert_eq!(got.json()["error"]["field"], "path", "{got:?}");
        refused(&send_bytes(s.addr, "PUT", &format!("{files}/{path}"), ALICE, b"x"), 400, "bad_path");
    }
    refused(&s.call("GET", &format!("{files}?path=%2E%2E"), Some(ALICE), None), 400, "bad_path");
    // A path whose percent-encoding is not UTF-8: the service's JSON 400.
    refused(&s.call("GET", &format!("{files}/%FF.txt"), Some(ALICE), None), 400, "bad_path");
    // A link, as the file or on the way, is never followed: not to read,
    // not to write through, not to list.
    refused(&s.call("GET", &format!("{files}/passwd.txt"), Some(ALICE), None), 400, "link");
    refused(&s.call("GET", &format!("{files}/etc/passwd"), Some(ALICE), None), 400, "link");
    refused(&send_bytes(s.addr, "PUT", &format!("{files}/etc/evil.txt"), ALICE, b"x"), 400, "link");
    refused(&s.call("GET", &format!("{files}?path=etc"), Some(ALICE), None), 400, "link");
    // A put over a link replaces the link, whole; it never writes through it.
    assert_eq!(send_bytes(s.addr, "PUT", &format!("{files}/passwd.txt"), ALICE, b"x").status, 200);
    assert_eq!(s.call("GET", &format!("{files}/passwd.txt"), Some(ALICE), None).body, "x");
    // Over the token's bytes in (alice's: 65536), refused as it is read.
    let big = vec![b'a'; 65537];
    let over = send_bytes(s.addr, "PUT", &format!("{files}/big.txt"), ALICE, &big);
    refused(&over, 413, "too_large");
    assert!(over.error().1.contains("65536 bytes"), "{over:?}");
    assert_eq!(s.call("GET", &format!("{files}/big.txt"), Some(ALICE), None).status, 404, "a part of the body was written");
    // The artifact rules: an extension the policy does not allow.
    let sh = s.call("GET", &format!("{files}/run.sh"), Some(ALICE), None);
    refused(&sh, 422, "rejected");
    assert_eq!(sh.json()["error"]["reason"], "extension_not_allowed", "{sh:?}");
    assert!(!sh.body.contains("echo hi"), "{sh:?}");
    refused(&s.call("GET", &format!("{files}/folder.txt"), Some(ALICE), None), 409, "not_a_file");
    let missing = s.call("GET", &format!("{files}/nothing.txt"), Some(ALICE), None);
    refused(&missing, 404, "not_found");
    assert_eq!(missing.json()["error"]["field"], "path", "a missing file is told from a missing session: {missing:?}");
    // Another tenant finds no session at all, and writes nothing.
    for theirs in [
        s.call("GET", &format!("{files}/ok.txt"), Some(BOB), None),
        s.call("GET", &files, Some(BOB), None),
        send_bytes(s.addr, "PUT", &format!("{files}/bob.txt"), BOB, b"from bob"),
    ] {
        refused(&theirs, 404, "not_found");
        assert_eq!(theirs.json()["error"]["field"], Value::Null, "{theirs:?}");
        assert!(!theirs.body.contains("fine"), "{theirs:?}");
    }
    assert_eq!(s.call("GET", &format!("{files}/bob.txt"), Some(ALICE), None).status, 404, "bob wrote into alice's session");
    assert_eq!(s.call("GET", &format!("{files}/ok.txt"), Some(ALICE), None).body, "fine");
    // A session that ended by itself: 410, as a cell gets.
    assert_eq!(exec("import os\nos._exit(3)").status, 200);
    for gone in [
        s.call("GET", &format!("{files}/ok.txt"), Some(ALICE), None),
        s.call("GET", &files, Some(ALICE), None),
        send_bytes(s.addr, "PUT", &format!("{files}/late.txt"), ALICE, b"late"),
    ] {
        refused(&gone, 410, "session_ended");
    }
    assert_eq!(s.call("DELETE", &format!("/v1/sessions/{sid}"), Some(ALICE), None).status, 200);
}
