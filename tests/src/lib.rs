//! Harness for the end-to-end tests: the real `jail` binary, the real rootfs
//! and real policies, driven as a user would drive them.
//!
//! Paths come from the environment when set, so the same test binaries run
//! as root and, copied to a world-readable folder, as an ordinary user:
//! `JAIL_BIN` (the binary), `JAIL_ROOTFS` (the rootfs), `JAIL_DATA_ROOTFS`
//! (the data-science rootfs, for tests/data_stack.rs), `JAIL_REPO` (a copy
//! of the repository's `policies/` and `examples/`), `JAIL_TEST_USER` (the
//! ordinary user root delegates a cgroup to: a name, or a bare numeric uid;
//! default `jailtest`). `JAIL_MUST_WORK=1` turns every "host lacks this
//! feature" skip into a failure (bubblewrap's `BWRAP_MUST_WORK`); CI sets
//! it. `JAIL_SKIP_LOG` names a file every skip is appended to, so `make
//! test` can list them all at its end (`tests/skips.sh`). The link tricks
//! every door is tried with are `tricks`.

pub mod tricks;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use jail::result::{RunResult, Status};

/// The repository (or the copy of its data the tests were given).
pub fn repo() -> PathBuf {
    std::env::var_os("JAIL_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// The `jail` binary under test.
pub fn jail_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("JAIL_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    for profile in ["debug", "release"] {
        let p = target.join(profile).join("jail");
        if p.exists() {
            return p;
        }
    }
    panic!("no jail binary: run `cargo build` first or set JAIL_BIN");
}

/// The `jail-agent` binary under test: `JAIL_AGENT_BIN`, else beside the
/// jail binary (where `cargo build` puts both).
pub fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("JAIL_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let p = jail_bin().with_file_name("jail-agent");
    assert!(p.exists(), "no jail-agent binary at {}: run `cargo build` first or set JAIL_AGENT_BIN", p.display());
    p
}

/// The rootfs under test.
pub fn rootfs() -> PathBuf {
    std::env::var_os("JAIL_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("python-rootfs/out/minimal"))
}

/// The data-science rootfs (`make rootfs-data`), for the data-stack tests:
/// `JAIL_DATA_ROOTFS`, default `python-rootfs/out/data` in the repository.
pub fn data_rootfs() -> PathBuf {
    std::env::var_os("JAIL_DATA_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("python-rootfs/out/data"))
}

/// The running kernel's (major, minor) version (`uname -r`).
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("read /proc/sys/kernel/osrelease");
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether cgroup v2 has memory.peak here (Linux 5.19).
pub fn kernel_has_memory_peak() -> bool {
    kernel_version() >= (5, 19)
}

pub fn is_root() -> bool {
    nix::unistd::getuid().is_root()
}

/// Skip a test for a missing host feature, or fail it under JAIL_MUST_WORK.
/// Returns true when the caller should return early:
/// `if skip_unless(feature_present, "why") { return; }`.
#[must_use = "return from the test when it skips"]
pub fn skip_unless(available: bool, why: &str) -> bool {
    if available {
        return false;
    }
    skip(why);
    true
}

/// Skip a test because this host lacks something it needs (the caller
/// returns right after); under JAIL_MUST_WORK=1 this is a failure instead.
pub fn skip(why: &str) {
    record(Skip::Host, why);
    if must_work() {
        panic!("JAIL_MUST_WORK=1 but this host cannot run the test: {why}");
    }
    eprintln!("SKIP: {why}");
}

/// Skip a test whose case another run covers: the other half of `make test`
/// (root, or the ordinary user) or another host of the VM matrix. Listed
/// with the other skips, never a failure: that other run is where it fails.
pub fn covered_elsewhere(why: &str) {
    record(Skip::Elsewhere, why);
    eprintln!("SKIP (covered elsewhere): {why}");
}

/// True (after recording the skip) when the caller is not root and the
/// test needs root; `make test` runs it in its root half.
#[must_use = "return from the test when it skips"]
pub fn only_as_root(why: &str) -> bool {
    if is_root() {
        return false;
    }
    covered_elsewhere(&format!("needs root ({why}); the root half of `make test` runs it"));
    true
}

/// True (after recording the skip) when the caller is root and the test is
/// about an ordinary user; `make test` runs it in its ordinary-user half.
#[must_use = "return from the test when it skips"]
pub fn only_as_ordinary_user(why: &str) -> bool {
    if !is_root() {
        return false;
    }
    covered_elsewhere(&format!("needs an ordinary user ({why}); the ordinary-user half of `make test` runs it"));
    true
}

fn must_work() -> bool {
    std::env::var_os("JAIL_MUST_WORK").is_some_and(|v| v == "1")
}

#[derive(Clone, Copy)]
enum Skip {
    /// The host lacks what the test needs: a failure under JAIL_MUST_WORK.
    Host,
    /// Another run covers the case.
    Elsewhere,
}

/// Append one skip to `JAIL_SKIP_LOG` (when set), a line of tab-separated
/// fields: kind (`host` or `elsewhere`), who ran it, the test, the reason.
/// `tests/skips.sh` lists them at the end of `make test`. Each line is one
/// `O_APPEND` write, so parallel tests do not interleave.
fn record(kind: Skip, why: &str) {
    let Some(log) = std::env::var_os("JAIL_SKIP_LOG").filter(|v| !v.is_empty()) else { return };
    let kind = match kind {
        Skip::Host => "host",
        Skip::Elsewhere => "elsewhere",
    };
    let uid = nix::unistd::getuid();
    let who = match nix::unistd::User::from_uid(uid).ok().flatten() {
        Some(u) if uid.is_root() => u.name,
        Some(u) => format!("{} (uid {uid})", u.name),
        None => format!("uid {uid} (no account)"),
    };
    // The binary is `<file>-<hash>`; the thread is named after the test.
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map(|n| n.rsplit_once('-').map_or(n.clone(), |(stem, _)| stem.to_string()))
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let line = format!("{kind}\t{}\t{binary}::{}\t{}\n", clean(&who), clean(test), clean(why));
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    // An unrecorded skip would be a skip nobody sees.
    if let Err(e) = written {
        panic!("cannot record a skip in JAIL_SKIP_LOG={}: {e}", Path::new(&log).display());
    }
}

/// The ordinary user a root test hands something to (a delegated cgroup),
/// as `(uid, gid)`: `JAIL_TEST_USER`, a name or a numeric uid (a spare uid
/// with no account is fine: `make test` passes one when there is no
/// `jailtest`), default `jailtest`. `None`, after a skip, when the name has
/// no account.
pub fn test_user() -> Option<(u32, u32)> {
    let name = std::env::var("JAIL_TEST_USER").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "jailtest".into());
    let (uid, gid) = if let Ok(uid) = name.parse::<u32>() {
        let gid = nix::unistd::User::from_uid(uid.into()).ok().flatten().map_or(uid, |u| u.gid.as_raw());
        (uid, gid)
    } else if let Some(u) = nix::unistd::User::from_name(&name).ok().flatten() {
        (u.uid.as_raw(), u.gid.as_raw())
    } else {
        skip(&format!("no user `{name}` (create it: useradd -m {name}; or set JAIL_TEST_USER to a spare uid)"));
        return None;
    };
    assert_ne!(uid, 0, "JAIL_TEST_USER={name} is root; it must name an ordinary user");
    Some((uid, gid))
}

/// The host uid the sandbox runs as for this caller (hostuid.rs): the
/// caller's own, or for root the first of the default policy's
/// `identity.root_host_uids`, which a run gets when no other run holds it.
/// Concurrent root runs (tests run in parallel) get the next ones: compare
/// a run's own `isolation.host_uid` where the exact uid matters.
pub fn sandbox_host_uid() -> u32 {
    if is_root() {
        jail::hostuid::DEFAULT_FIRST
    } else {
        nix::unistd::getuid().as_raw()
    }
}

/// The host gid every run by this caller gets: the caller's own, or for
/// root the default policy's `identity.root_host_gid`, shared by all.
pub fn sandbox_host_gid() -> u32 {
    if is_root() {
        jail::hostuid::DEFAULT_GID
    } else {
        nix::unistd::getgid().as_raw()
    }
}

/// As root, share `path` with the sandbox: the group every root run
/// shares, writable by the group (a concurrent run gets another uid of the
/// range), while root stays its owner, since a size-capped output dir is
/// copied to and from as root by its mode bits (fsid.rs).
pub fn give_to_sandbox(path: &Path) {
    if !is_root() {
        return;
    }
    std::os::unix::fs::chown(path, None, Some(sandbox_host_gid())).expect("chown");
    let mode = std::fs::symlink_metadata(path).expect("stat").permissions().mode();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o070)).expect("chmod");
}

/// A fresh set of host folders for one run: code, input, output.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub code: PathBuf,
    pub input: PathBuf,
    pub output: PathBuf,
    /// The rootfs runs use: `rootfs()` unless a test sets another.
    pub rootfs: PathBuf,
    pub extra_args: Vec<String>,
    /// How `run` and `probe` run a script: `jail run`, or as a cell of a
    /// session (the escape probes run both ways: tests/escape.rs).
    pub runner: Runner,
}

/// How a [`Sandbox`] runs a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// `jail run --json SCRIPT`.
    Run,
    /// `jail session start`, one warm-up cell, the script as the second
    /// cell, `jail session stop`.
    SessionCell,
    /// One request to a `jail pool --size 1` (the script as its `code`,
    /// the sandbox's input and output folders), then the pool closed. The
    /// pool has no exit status per request: the one `jail session exec`
    /// prints for the same result (`RunResult::jail_exit_code`) stands in.
    PoolStep,
    /// As [`Runner::PoolStep`], the policy given a preload (`json`, or
    /// its own): the pool's jail is a fork of its template (template.rs),
    /// and the result must say so.
    ForkedStep,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        let dir = tempfile::Builder::new().prefix("jail-test-").tempdir().expect("tempdir");
        let mk = |name: &str| {
            let p = dir.path().join(name);
            std::fs::create_dir(&p).expect("mkdir");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            p
        };
        let (code, input, output) = (mk("code"), mk("input"), mk("output"));
        // Root runs map the sandbox to an unprivileged uid: share the output
        // with its group (a bound output dir is written by it).
        give_to_sandbox(&output);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Sandbox {
            dir,
            code,
            input,
            output,
            rootfs: rootfs(),
            extra_args: Vec::new(),
            runner: Runner::Run,
        }
    }

    /// A sandbox whose `run` and `probe` run the script as a session cell.
    pub fn with_runner(runner: Runner) -> Sandbox {
        Sandbox { runner, ..Sandbox::new() }
    }

    /// This sandbox's own `XDG_RUNTIME_DIR`, so its sessions' sockets are
    /// its own to look at.
    pub fn runtime_dir(&self) -> PathBuf {
        let p = self.dir.path().join("run");
        if !p.exists() {
            std::fs::create_dir(&p).expect("mkdir run");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        }
        p
    }

    /// Where this sandbox's session sockets live.
    pub fn session_dir(&self) -> PathBuf {
        self.runtime_dir().join("jail/sessions")
    }

    /// A `jail session start --json` command with the sandbox's folders.
    pub fn session_command(&self) -> Command {
        let mut cmd = Command::new(jail_bin());
        cmd.arg("session").arg("start").arg("--json");
        cmd.arg("--rootfs").arg(&self.rootfs);
        cmd.arg("--input").arg(&self.input).arg("--output").arg(&self.output);
        cmd.args(&self.extra_args);
        cmd.env("XDG_RUNTIME_DIR", self.runtime_dir());
        cmd
    }

    /// Start a session; panics with jail's stderr if it does not start.
    pub fn start_session(&self) -> Session {
        Session::started(&self.session_command().output().expect("spawn jail session start"))
    }

    /// Write a file into the input folder.
    pub fn input_file(&self, name: &str, content: &[u8]) -> PathBuf {
        let p = self.input.join(name);
        std::fs::write(&p, content).expect("write input");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        p
    }

    /// Write the script and return its host path.
    pub fn script(&self, source: &str) -> PathBuf {
        let p = self.code.join("main.py");
        std::fs::write(&p, source).expect("write script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        p
    }

    /// A `jail run --json` command for `source`, with the sandbox's folders.
    pub fn command(&self, source: &str) -> Command {
        let script = self.script(source);
        let mut cmd = Command::new(jail_bin());
        cmd.arg("run").arg("--json");
        cmd.arg("--rootfs").arg(&self.rootfs);
        cmd.arg("--input").arg(&self.input).arg("--output").arg(&self.output);
        cmd.args(&self.extra_args);
        cmd.arg(script);
        cmd
    }

    /// Run `source` in the jail (the sandbox's runner says how) and parse
    /// the result.
    pub fn run(&self, source: &str) -> (RunResult, Output) {
        let out = match self.runner {
            Runner::Run => self.command(source).output().expect("spawn jail"),
            Runner::SessionCell => {
                let session = self.start_session();
                // The probe is not the first code the interpreter runs.
                let (warm, _) = session.exec("warm_up = sum(range(10))\n");
                assert_eq!(warm["status"], "ok", "warm-up cell: {warm}");
                let (_, out) = session.exec(source);
                session.stop();
                out
            }
            Runner::PoolStep => self.pool_step(source, &self.extra_args),
            Runner::ForkedStep => {
                let out = self.pool_step(source, &self.with_preload());
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the pool's result");
                assert_eq!(v["isolation"]["forked_from_template"], true, "the step did not run in a fork of a template");
                out
            }
        };
        (parse(&out), out)
    }

    /// This sandbox's options with its policy (or the default one) given
    /// a preload when it has none: a pool of it forks its jails from a
    /// template.
    pub fn with_preload(&self) -> Vec<String> {
        let mut args = self.extra_args.clone();
        let at = args.iter().position(|a| a == "--policy");
        let text = match at.and_then(|i| args.get(i + 1)) {
            Some(path) => std::fs::read_to_string(path).expect("the sandbox's policy"),
            None => std::fs::read_to_string(repo().join("policies/default.json")).expect("default policy"),
        };
        let mut v: serde_json::Value = serde_json::from_str(&text).expect("a policy is JSON");
        if let Some(o) = v.as_object_mut() {
            o.remove("rootfs");
            if o.get("preload").and_then(|p| p.as_array()).is_none_or(|p| p.is_empty()) {
                o.insert("preload".into(), serde_json::json!(["json"]));
            }
        }
        let p = self.dir.path().join("policy-preloaded.json");
        std::fs::write(&p, serde_json::to_string_pretty(&v).expect("serialize")).expect("write the policy");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod the policy");
        match at {
            Some(i) => args[i + 1] = p.display().to_string(),
            None => args.extend(["--policy".to_string(), p.display().to_string()]),
        }
        args
    }

    /// `source` as the one request of a pool made with this sandbox's
    /// options; its result as `jail run --json` would print it.
    fn pool_step(&self, source: &str, args: &[String]) -> Output {
        let extra: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut pool = Pool::start(self, 1, &extra);
        let reply = pool.call(serde_json::json!({
            "id": "probe", "code": source, "input": self.input, "output": self.output,
        }));
        let status = pool.finish();
        assert!(status.success(), "the pool exited with {status:?}");
        assert!(reply["error"].is_null(), "the pool refused the probe: {reply}");
        let result = &reply["result"];
        let code = serde_json::from_value::<RunResult>(result.clone()).map_or(125, |r| r.jail_exit_code());
        use std::os::unix::process::ExitStatusExt;
        Output {
            status: std::process::ExitStatus::from_raw((code & 0xff) << 8),
            stdout: serde_json::to_vec(result).expect("serialize the result"),
            stderr: Vec::new(),
        }
    }

    /// The TMPDIR of the pools this sandbox starts: inside it, so the
    /// pool's folders carry the sandbox's path and its outputs can be
    /// renamed into the sandbox's folders.
    pub fn pool_tmp(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }

    /// Run `source` and return its parsed stdout as JSON, asserting it ran ok.
    pub fn probe(&self, source: &str) -> serde_json::Value {
        let (r, out) = self.run(source);
        assert_eq!(r.status, Status::Ok, "probe failed: {}\n{}", r.stderr.text, String::from_utf8_lossy(&out.stderr));
        serde_json::from_str(r.stdout.text.trim()).unwrap_or_else(|e| panic!("probe output is not JSON ({e}): {}", r.stdout.text))
    }
}

/// A running `jail pool` (tests/pool.rs, and [`Runner::PoolStep`]): its
/// TMPDIR and XDG_RUNTIME_DIR inside the sandbox, so everything it makes
/// carries the sandbox's path. Replies are read by a thread as they come.
pub struct Pool {
    pub child: std::process::Child,
    pub stdin: Option<std::process::ChildStdin>,
    replies: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl Pool {
    /// `jail pool --size SIZE --rootfs R EXTRA...`.
    pub fn start(sb: &Sandbox, size: usize, extra: &[&str]) -> Pool {
        use std::io::BufRead;
        let tmp = sb.pool_tmp();
        std::fs::create_dir_all(&tmp).expect("mkdir the pool's tmp");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut spec = jail::client::command::PoolSpec {
            more: extra.iter().map(Into::into).collect(),
            temp_dir: Some(tmp),
            runtime_dir: Some(sb.runtime_dir()),
            ..jail::client::command::PoolSpec::new(jail_bin(), size)
        };
        spec.flags.rootfs = Some(sb.rootfs.clone());
        // Its replies read here as the bytes it wrote, untyped: the pool's
        // tests assert on the wire itself.
        let mut cmd = jail::client::command::pool_command(&spec);
        let mut child = cmd.stderr(std::process::Stdio::inherit()).spawn().expect("spawn jail pool");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: serde_json::Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("a reply that is not JSON ({e}): {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Pool { child, stdin, replies }
    }

    /// Write one request line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).expect("write a request");
        stdin.write_all(b"\n").expect("write a request");
        stdin.flush().expect("write a request");
    }

    /// The next line the pool wrote.
    pub fn reply(&self) -> serde_json::Value {
        self.replies.recv_timeout(std::time::Duration::from_secs(60)).expect("a reply within 60 s")
    }

    /// The next line the pool wrote, if one comes within `wait`.
    pub fn reply_within(&self, wait: std::time::Duration) -> Option<serde_json::Value> {
        self.replies.recv_timeout(wait).ok()
    }

    /// Send a request and wait for its reply (no other in flight).
    pub fn call(&mut self, request: serde_json::Value) -> serde_json::Value {
        self.send(&request.to_string());
        let r = self.reply();
        assert_eq!(r["id"], request["id"], "{r}");
        r
    }

    /// Wait until `stats` says `n` jails are ready.
    pub fn wait_ready(&mut self, n: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            self.send(r#"{"op":"stats"}"#);
            let s = self.reply();
            if s["stats"]["ready"].as_u64() == Some(n) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "never {n} ready: {s}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Close stdin and wait for the pool to exit.
    /// The session a `{"op": "session"}` request claims (`request` holds
    /// the op); panics with the reply when none came.
    pub fn session(&mut self, request: serde_json::Value) -> Session {
        let reply = self.call(request);
        let s = &reply["session"];
        assert!(s.is_object(), "no session in the reply: {reply}");
        Session {
            handle: PathBuf::from(s["handle"].as_str().expect("handle")),
            pid: s["pid"].as_u64().expect("pid") as u32,
            id: s["id"].as_str().expect("id").to_string(),
        }
    }

    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait for the pool")
    }
}

/// A running session (tests/session.rs).
pub struct Session {
    pub handle: PathBuf,
    /// The session supervisor's pid.
    pub pid: u32,
    pub id: String,
}

impl Session {
    /// The session a `jail session start --json` printed; panics with its
    /// stderr when it did not start.
    pub fn started(out: &Output) -> Session {
        assert!(out.status.success(), "jail session start failed: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("session start --json output");
        Session {
            handle: PathBuf::from(v["handle"].as_str().expect("handle")),
            pid: v["pid"].as_u64().expect("pid") as u32,
            id: v["id"].as_str().expect("id").to_string(),
        }
    }

    /// `jail session exec HANDLE -` with `code` on stdin: the result as JSON
    /// (`null` when none was printed) and the process's output.
    pub fn exec(&self, code: &str) -> (serde_json::Value, Output) {
        let mut child = Command::new(jail_bin())
            .arg("session")
            .arg("exec")
            .arg(&self.handle)
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn jail session exec");
        child.stdin.take().expect("stdin").write_all(code.as_bytes()).expect("write the cell");
        let out = child.wait_with_output().expect("wait for jail session exec");
        let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        (v, out)
    }

    /// `jail session put --json HANDLE PATH -` with `data` on stdin: the
    /// answer as JSON (`null` when none was printed) and the output.
    pub fn put(&self, path: &str, data: &[u8]) -> (serde_json::Value, Output) {
        let mut child = Command::new(jail_bin())
            .args(["session", "put", "--json", "--"])
            .arg(&self.handle)
            .arg(path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn jail session put");
        child.stdin.take().expect("stdin").write_all(data).expect("write the content");
        let out = child.wait_with_output().expect("wait for jail session put");
        (serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null), out)
    }

    /// `jail session get --json HANDLE PATH` (`ls` with `list`): the answer
    /// as JSON and the output.
    pub fn files(&self, op: &str, path: &str) -> (serde_json::Value, Output) {
        let out = Command::new(jail_bin())
            .args(["session", op, "--json", "--"])
            .arg(&self.handle)
            .arg(path)
            .output()
            .expect("spawn jail session get|ls");
        (serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null), out)
    }

    /// `jail session stop HANDLE`.
    pub fn stop(&self) -> Output {
        Command::new(jail_bin())
            .arg("session")
            .arg("stop")
            .arg(&self.handle)
            .output()
            .expect("spawn jail session stop")
    }

    /// Whether the session supervisor process still exists.
    pub fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default().contains(") Z ")
    }
}

/// Parse `jail --json` output, with the process's stderr in any panic.
/// Every result is first validated against the committed schema
/// (schema/result.schema.json), so each e2e test checks the contract
/// clients are given on every result it gets.
pub fn parse(out: &Output) -> RunResult {
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "jail printed no result ({e}); status {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    if let Err(problems) = validate_result(&doc) {
        panic!("the result does not match {}:\n{problems}\nresult: {doc:#}", jail::schema::SCHEMA_PATH);
    }
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("the result does not deserialize ({e})"))
}

/// A copy of the default policy (less its `rootfs`) with `edit` applied,
/// written beside the sandbox as `policy.json`, readable by the jail.
pub fn policy_with(sb: &Sandbox, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("policies/default.json")).expect("default policy");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("the default policy is JSON");
    if let Some(m) = v.as_object_mut() {
        m.remove("rootfs");
    }
    edit(&mut v);
    let p = sb.dir.path().join("policy.json");
    std::fs::write(&p, serde_json::to_string_pretty(&v).expect("serialize")).expect("write the policy");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod the policy");
    p
}

/// The whole result document, for a failing assertion's message: what
/// the jail said of every artifact, refusal, stage and limit, so a failure
/// seen once (under load, say) can be read rather than guessed at.
pub fn document(r: &RunResult) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("(the result does not serialize: {e})"))
}

/// The committed result schema, made strict for the tests: every object
/// that lists its properties gets `additionalProperties: false`, so a field
/// the binary prints but the schema lacks fails here (clients get the open
/// schema, where unknown fields are ignored; see jail/src/schema.rs).
pub fn strict_result_schema() -> serde_json::Value {
    fn close(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                    map.insert("additionalProperties".into(), serde_json::Value::Bool(false));
                }
                map.values_mut().for_each(close);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(close),
            _ => {}
        }
    }
    let path = repo().join(jail::schema::SCHEMA_PATH);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut schema: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    close(&mut schema);
    schema
}

/// Validate one result document against [`strict_result_schema`]; the
/// error lists every problem with its JSON pointer.
pub fn validate_result(doc: &serde_json::Value) -> Result<(), String> {
    static VALIDATOR: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    let validator = VALIDATOR.get_or_init(|| {
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&strict_result_schema())
            .unwrap_or_else(|e| panic!("{} is not a valid JSON Schema: {e}", jail::schema::SCHEMA_PATH))
    });
    let problems: Vec<String> = validator.iter_errors(doc).map(|e| format!("  at {}: {e}", e.instance_path())).collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The Python preamble escape probes share: ctypes access to raw syscalls.
pub const PY_SYSCALL: &str = r#"
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return r, ctypes.get_errno()
"#;

/// A CPU hog for `secs` of wall time in which every process resumes every
/// other (PID 1 included) as fast as it can, and forks new hogs on the way:
/// each stop of the supervisor's throttle must still hold them all. It
/// waits for every child, so `os.times()` at its end counts them all.
pub fn sigcont_hog(secs: f64) -> String {
    format!(
        r#"
import os, signal, time
end = time.monotonic() + {secs}
def wake_all():
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                os.kill(int(name), signal.SIGCONT)
            except OSError:
                pass
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() < end:
            wake_all()
        os._exit(0)
    kids.append(pid)
while time.monotonic() < end:
    pid = os.fork()
    if pid == 0:
        wake_all()
        os._exit(0)
    os.waitpid(pid, 0)
for k in kids:
    os.waitpid(k, 0)
"#
    )
}

/// A CPU hog that ran under `--cpus cores` (a run, or a session's cell)
/// and used `share` of a core over `wall_ms` is held to its quota: by the
/// run cgroup where there is one, else by the supervisor's throttle
/// (throttle.rs) within its stated precision. At 0.2 or below the throttle
/// must have stopped the tree (`usage.throttled`): at 0.5 a hog on a
/// 2-core host shared with a load of ~9 can get under half a core with no
/// throttle at all (measured: 0.39 for four busy processes), so only the
/// lower quota tells the throttle from the load. `seen` says what was
/// measured, for the failure message.
pub fn assert_held_to_quota(r: &RunResult, cores: f64, share: f64, wall_ms: f64, seen: &str) {
    let backend = expected_backend();
    if backend.starts_with("cgroup_") {
        assert_eq!(r.limits["cpus"].enforced_by, backend);
        assert_eq!(r.usage.throttled, None, "the cgroup enforces, not the supervisor");
        // The quota caps it; a busy shared host may give less.
        assert!((0.3 * cores..=1.24 * cores).contains(&share), "{seen}");
    } else {
        assert_eq!(r.limits["cpus"].enforced_by, "supervisor", "{:?}", r.limits["cpus"]);
        let detail = r.limits["cpus"].detail.as_deref().unwrap_or("");
        assert!(detail.contains("SIGSTOP") && detail.contains("50 ms"), "{detail}");
        assert!(!r.isolation.degraded.iter().any(|d| d.contains("cpus")), "{:?}", r.isolation.degraded);
        let t = r.usage.throttled.clone().expect("usage.throttled");
        assert_eq!(t.unsettled, 0, "every stop held the whole tree: {t:?}; {seen}");
        if cores <= 0.2 {
            // What the throttle did, so this fails without it under any load.
            assert!(t.stops >= 3 && t.stopped_ms > 300.0, "{t:?}; {seen}");
        }
        // The stated precision: cores x wall, plus one 50 ms period on
        // each of two busy cores, plus 10 ms ticks, over ~3 s.
        let bound = cores + (2.0 * 50.0 + 30.0) / wall_ms;
        assert!((0.3 * cores..=bound).contains(&share), "{seen}, bound {bound:.3}");
    }
}

/// Processes on the host whose command line contains `marker`.
pub fn host_processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return found };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

/// Mount points visible to this (host-side) process that contain `needle`.
pub fn host_mounts_with(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

/// Run a `jail` command to its end, returning its output and its pid (to
/// find what it may have left behind: `jail-<pid>-<n>` cgroups).
pub fn run_tracked(cmd: &mut Command) -> (RunResult, Output, u32) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn jail");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for jail");
    (parse(&out), out, pid)
}

/// The backend a run by this user on this host must report for its cgroup
/// limits: `JAIL_EXPECT_BACKEND` when set (CI sets it per user), else root
/// gets v2 where the unified hierarchy has the memory controller, v1 where
/// memory is on a v1 hierarchy; an ordinary user gets v2 with a delegated
/// parent (`JAIL_CGROUP_PARENT`) or a systemd user bus on a v2 host (the
/// jail asks for a scope), else rlimits.
pub fn expected_backend() -> String {
    if let Some(b) = std::env::var("JAIL_EXPECT_BACKEND").ok().filter(|b| !b.is_empty()) {
        return b;
    }
    let layout = jail::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let v2_memory = layout
        .unified
        .as_ref()
        .and_then(|(m, _)| std::fs::read_to_string(m.join("cgroup.controllers")).ok())
        .is_some_and(|c| c.split_whitespace().any(|w| w == "memory"));
    let v1_memory = layout.v1.iter().any(|h| h.controllers.iter().any(|c| c == "memory"));
    let delegated = std::env::var_os("JAIL_CGROUP_PARENT").is_some_and(|v| !v.is_empty())
        // With a user manager on a v2 host the jail asks systemd for a
        // delegated scope (jail/src/delegate.rs).
        || (v2_memory && jail::delegate::bus_path(nix::unistd::getuid().as_raw()).exists());
    match (is_root() || delegated, v2_memory, v1_memory) {
        (true, true, _) => "cgroup_v2".into(),
        (true, false, true) => "cgroup_v1".into(),
        _ => "rlimit".into(),
    }
}

/// Every cgroup directory beneath this process's own cgroups (or
/// `JAIL_CGROUP_PARENT`) whose name says the jail process `pid` made it.
pub fn cgroups_left_by(pid: u32) -> Vec<PathBuf> {
    let layout = jail::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let me = jail::cgroup::parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
    let parent = std::env::var_os("JAIL_CGROUP_PARENT").filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut dirs = Vec::new();
    if let (Some((mount, root)), Some(own)) = (&layout.unified, &me.unified) {
        let path = parent.clone().unwrap_or_else(|| own.clone());
        if let Ok(rel) = path.strip_prefix(root) {
            dirs.push(mount.join(rel));
        }
    }
    for h in &layout.v1 {
        let Some(own) = h.controllers.iter().find_map(|c| me.v1.get(c)) else { continue };
        let path = parent.clone().unwrap_or_else(|| own.clone());
        if let Ok(rel) = path.strip_prefix(&h.root) {
            dirs.push(h.mount.join(rel));
        }
    }
    let prefix = format!("jail-{pid}-");
    let mut found = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(e.path());
            }
        }
    }
    found
}

/// Nothing of a finished run may remain: no cgroup its jail made, no
/// process carrying `marker`, no mount beneath the sandbox's folders.
pub fn assert_nothing_left(jail_pid: u32, marker: &str, sb: &Sandbox) {
    assert_eq!(cgroups_left_by(jail_pid), Vec::<PathBuf>::new(), "a run cgroup was left behind");
    // The kernel finishes tearing a pid namespace down a moment after its
    // PID 1 is reaped; give stragglers that moment, no more.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while !host_processes_with(marker).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(host_processes_with(marker), Vec::<u32>::new(), "a process of the run survived it");
    assert_eq!(host_mounts_with(&sb.dir.path().display().to_string()), Vec::<String>::new(), "a mount was left behind");
}

/// Busy loops on the host (plain `/usr/bin/python3 -c 'while 1: pass'`, at
/// the test's own priority), for a test that must hold under load: killed
/// by their pids when dropped, never by name.
pub struct Hogs(Vec<std::process::Child>);

impl Hogs {
    pub fn start(n: usize) -> Hogs {
        let hogs = (0..n)
            .map(|_| {
                Command::new("/usr/bin/python3")
                    .args(["-c", "while 1: pass"])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("spawn a busy loop")
            })
            .collect();
        Hogs(hogs)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for h in &mut self.0 {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}
