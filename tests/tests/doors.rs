//! Every door takes a caller's path the one way (jail/src/accept.rs): the
//! same link tricks, driven through each door a caller has — `jail run`,
//! `jail session start`, a pool's `run` and `session` requests, the MCP
//! server's staging, the agent's input copy and export — as root and as an
//! ordinary user (issue 32).
//!
//! The host tree the tricks use: `victim/` holds `secret.txt`, readable by
//! anyone, so a door that followed a link to it WOULD hand its marker to
//! the jail (or write beside it); `victimlink -> victim`, `etcdir ->
//! /etc`; `in/` is a real input folder holding a hard link to
//! `victim/secret.txt`, a 0600 file of the caller's, and (as root) a hard
//! link to /etc/shadow. A door either refuses a trick (an error naming
//! the link) or runs, and then the jail never sees the marker, nor
//! /etc/shadow, nor (as root) the 0600 file, and nothing is made beside
//! the victim.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use jail_tests::*;
use serde_json::{json, Value};

const MARKER: &str = "MARKER-d00r5-4cc3pt";

/// What a door did with a request.
#[derive(Debug)]
enum Taken {
    /// Refused, with the message the caller got.
    Refused(String),
    /// Ran: everything the caller got back (the result, the probe's output).
    Ran(String),
}

/// The probe a door runs: every file under /workspace/input, read.
const PROBE: &str = r#"
import json, os
seen = {}
for root, dirs, files in os.walk('/workspace/input'):
    for n in files:
        p = os.path.join(root, n)
        try:
            with open(p, 'rb') as f:
                seen[p] = f.read(300).decode('latin-1')
        except Exception as e:
            seen[p] = type(e).__name__
print(json.dumps(seen))
"#;

struct Tree {
    sb: Sandbox,
    t: PathBuf,
    /// The first line of the host's /etc/shadow, as root.
    shadow: Option<String>,
    /// Every trick a door let through: all of them are listed at the end
    /// (`done`), so one run shows each door's every hole.
    failed: std::cell::RefCell<Vec<String>>,
}

impl Tree {
    fn new() -> Tree {
        let sb = Sandbox::new();
        let t = sb.dir.path().join("tricks");
        let mk = |p: &Path, mode: u32| {
            std::fs::create_dir_all(p).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        mk(&t, 0o755);
        let victim = t.join("victim");
        mk(&victim, 0o755);
        let write = |p: &Path, text: &str, mode: u32| {
            std::fs::write(p, text).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&victim.join("secret.txt"), MARKER, 0o644);
        write(&victim.join("probe.py"), &format!("print({MARKER:?})\n"), 0o644);
        // An empty output folder the sandbox could write, behind a link.
        mk(&victim.join("out"), 0o755);
        give_to_sandbox(&victim.join("out"));
        std::os::unix::fs::symlink(&victim, t.join("victimlink")).unwrap();
        std::os::unix::fs::symlink("/etc", t.join("etcdir")).unwrap();
        let input = t.join("in");
        mk(&input, 0o755);
        write(&input.join("data.csv"), "a,b\n1,2\n", 0o644);
        write(&input.join("private600.txt"), &format!("private {MARKER}"), 0o600);
        std::fs::hard_link(victim.join("secret.txt"), input.join("hard")).unwrap();
        let shadow = if is_root() {
            // The issue's reproducer: a hard link to /etc/shadow (same
            // filesystem here; else the root half has nothing to link).
            std::fs::hard_link("/etc/shadow", input.join("shadow"))
                .ok()
                .map(|()| std::fs::read_to_string("/etc/shadow").unwrap().lines().next().unwrap_or_default().to_string())
        } else {
            None
        };
        Tree { sb, t, shadow, failed: Default::default() }
    }

    /// Record a failure unless `ok`.
    fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let mut w = what();
            w.truncate(600);
            self.failed.borrow_mut().push(w);
        }
    }

    /// Fail the test with every failure recorded.
    fn done(self) {
        let failed = self.failed.take();
        assert!(failed.is_empty(), "{} tricks got through:\n- {}", failed.len(), failed.join("\n- "));
    }

    fn victim(&self) -> PathBuf {
        self.t.join("victim")
    }

    /// What a door let through, checked: no marker, no shadow line, and
    /// (as root) not the 0600 file.
    fn assert_nothing_leaked(&self, door: &str, trick: &str, taken: &Taken) {
        let Taken::Ran(text) = taken else { return };
        let private = format!("private {MARKER}");
        let leaked = text.replace(&private, "").contains(MARKER);
        self.check(!leaked, || format!("{door}, {trick}: the jail saw what a link points at: {text}"));
        if let Some(line) = &self.shadow {
            self.check(!text.contains(line.as_str()), || format!("{door}, {trick}: the jail read /etc/shadow: {text}"));
        }
        if is_root() {
            self.check(!text.contains(&private), || {
                format!("{door}, {trick}: root's 0600 file was readable in the jail: {text}")
            });
        }
    }

    /// Nothing was made beside the victim.
    fn assert_victim_untouched(&self, door: &str, trick: &str) {
        let mut names: Vec<String> = std::fs::read_dir(self.victim())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        self.check(names == ["out", "probe.py", "secret.txt"], || format!("{door}, {trick}: made beside the victim: {names:?}"));
        let inside = std::fs::read_dir(self.victim().join("out")).map(Iterator::count).unwrap_or(0);
        self.check(inside == 0, || format!("{door}, {trick}: written through a link"));
        // Undone, so the next trick starts from the same tree.
        for n in names.iter().filter(|n| !["out", "probe.py", "secret.txt"].contains(&n.as_str())) {
            let p = self.victim().join(n);
            let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
        }
        if let Ok(d) = std::fs::read_dir(self.victim().join("out")) {
            for e in d.flatten() {
                let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
            }
        }
    }
}

/// The tricks on a folder the caller names (input or output).
fn folder_tricks(t: &Path) -> Vec<(String, PathBuf)> {
    let s = |p: &Path| p.display().to_string();
    vec![
        ("a link to a folder, with a trailing slash".into(), PathBuf::from(format!("{}/", s(&t.join("victimlink"))))),
        ("a link to /etc, with a trailing slash".into(), PathBuf::from(format!("{}/", s(&t.join("etcdir"))))),
        ("a link to a folder".into(), t.join("victimlink")),
        ("a folder through a linked parent".into(), t.join("victimlink/out")),
        ("`..` after a link".into(), t.join("victimlink/../victim")),
        ("a /proc magic link".into(), PathBuf::from("/proc/self/cwd/")),
        ("a path through a /proc magic link".into(), PathBuf::from("/proc/self/cwd/out")),
    ]
}

/// The tricks on a script the caller names.
fn script_tricks(t: &Path) -> Vec<(String, PathBuf)> {
    let mut v = vec![
        ("a script through a linked parent".to_string(), t.join("victimlink/probe.py")),
        ("a script through a /proc magic link".into(), PathBuf::from("/proc/self/cwd/probe.py")),
    ];
    if is_root() {
        v.push(("/etc/shadow as the script".into(), PathBuf::from("/etc/shadow")));
    }
    v
}

fn text_of(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `jail run --json` (status 125 with no result: refused).
fn jail_run(tree: &Tree, args: &[&std::ffi::OsStr], script: &Path) -> Taken {
    let out = Command::new(jail_bin())
        .arg("run")
        .arg("--json")
        .arg("--rootfs")
        .arg(&tree.sb.rootfs)
        .args(args)
        .arg(script)
        .current_dir(tree.victim())
        .output()
        .expect("spawn jail run");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    match (out.status.code(), doc["status"].as_str()) {
        // Refused before anything ran: the result says where and why.
        (Some(125), Some("setup_failed") | None) => Taken::Refused(format!("{} {}", doc["setup_error"], text_of(&out))),
        _ => Taken::Ran(text_of(&out)),
    }
}

/// `jail session start` with these folders, the probe as its one cell.
fn session_start(tree: &Tree, input: Option<&Path>, output: Option<&Path>) -> Taken {
    let mut cmd = Command::new(jail_bin());
    cmd.args(["session", "start", "--json", "--rootfs"]).arg(&tree.sb.rootfs);
    if let Some(i) = input {
        cmd.arg("--input").arg(i);
    }
    cmd.arg("--output").arg(output.unwrap_or(&tree.sb.output));
    cmd.env("XDG_RUNTIME_DIR", tree.sb.runtime_dir()).current_dir(tree.victim());
    let out = cmd.output().expect("spawn jail session start");
    if !out.status.success() {
        return Taken::Refused(text_of(&out));
    }
    let v: Value = serde_json::from_slice(&out.stdout).expect("session start --json output");
    let s = Session {
        handle: PathBuf::from(v["handle"].as_str().expect("handle")),
        pid: v["pid"].as_u64().expect("pid") as u32,
        id: v["id"].as_str().expect("id").to_string(),
    };
    let (cell, _) = s.exec(PROBE);
    let stop = s.stop();
    Taken::Ran(format!("{cell}{}", text_of(&stop)))
}

/// A pool request: `op` "run" with `code`, or "session", and `fields`.
fn request(op: &str, code: &str, mut fields: Value) -> Value {
    match op {
        "run" => fields["code"] = json!(code),
        _ => fields["op"] = json!("session"),
    }
    fields
}

/// One request to a running pool.
fn pool_request(pool: &mut Pool, n: &mut u32, mut req: Value) -> Taken {
    *n += 1;
    req["id"] = json!(format!("r{n}"));
    let reply = pool.call(req);
    if !reply["error"].is_null() {
        return Taken::Refused(reply["error"].to_string());
    }
    if let Some(handle) = reply["session"]["handle"].as_str() {
        let s = Session { handle: PathBuf::from(handle), pid: 0, id: String::new() };
        let (cell, _) = s.exec(PROBE);
        let stop = s.stop();
        return Taken::Ran(format!("{cell}{}", text_of(&stop)));
    }
    Taken::Ran(reply.to_string())
}

fn assert_refused_link(tree: &Tree, door: &str, trick: &str, taken: &Taken) {
    match taken {
        Taken::Refused(why) => {
            tree.check(why.contains("link"), || format!("{door}, {trick}: refused, but not for the link: {why}"))
        }
        Taken::Ran(text) => tree.check(false, || format!("{door}, {trick}: accepted: {text}")),
    }
}

fn assert_refused(tree: &Tree, door: &str, trick: &str, taken: &Taken) {
    tree.check(matches!(taken, Taken::Refused(_)), || format!("{door}, {trick}: accepted: {taken:?}"));
}

#[test]
fn jail_run_and_session_start_refuse_every_link_trick() {
    let tree = Tree::new();
    let probe = tree.sb.script(PROBE);
    for (trick, path) in folder_tricks(&tree.t) {
        let door = "jail run --input";
        let taken = jail_run(&tree, &["--input".as_ref(), path.as_os_str()], &probe);
        tree.assert_nothing_leaked(door, &trick, &taken);
        assert_refused_link(&tree, door, &trick, &taken);
        let door = "jail run --output";
        let taken = jail_run(&tree, &["--output".as_ref(), path.as_os_str()], &probe);
        assert_refused_link(&tree, door, &trick, &taken);
        tree.assert_victim_untouched(door, &trick);
        let door = "jail session start --input";
        let taken = session_start(&tree, Some(&path), None);
        tree.assert_nothing_leaked(door, &trick, &taken);
        assert_refused_link(&tree, door, &trick, &taken);
        let door = "jail session start --output";
        let taken = session_start(&tree, None, Some(&path));
        assert_refused_link(&tree, door, &trick, &taken);
        tree.assert_victim_untouched(door, &trick);
    }
    for (trick, path) in script_tricks(&tree.t) {
        let taken = jail_run(&tree, &[], &path);
        tree.assert_nothing_leaked("jail run SCRIPT", &trick, &taken);
        assert_refused(&tree, "jail run SCRIPT", &trick, &taken);
    }
    // The real input folder is bound: the kernel shows the hard links with
    // their own modes, so the jail reads neither /etc/shadow nor, as root,
    // a 0600 file of root's.
    let input = tree.t.join("in");
    let taken = jail_run(&tree, &["--input".as_ref(), input.as_os_str()], &probe);
    tree.check(matches!(taken, Taken::Ran(_)), || format!("jail run --input, the real folder: {taken:?}"));
    if let Taken::Ran(text) = &taken {
        if let Some(line) = &tree.shadow {
            tree.check(!text.contains(line.as_str()), || format!("jail run read /etc/shadow through a hard link: {text}"));
        }
        if is_root() {
            let private = text.contains(&format!("private {MARKER}"));
            tree.check(!private, || format!("jail run: root's 0600 file was readable in the jail: {text}"));
        }
    }
    tree.done();
}

#[test]
fn a_pools_run_and_session_requests_refuse_every_link_trick() {
    let tree = Tree::new();
    let mut pool = Pool::start(&tree.sb, 1, &[]);
    let mut n = 0;
    for (trick, path) in folder_tricks(&tree.t) {
        for op in ["run", "session"] {
            let door = format!("pool {op} input");
            let taken = pool_request(&mut pool, &mut n, request(op, PROBE, json!({"input": path})));
            tree.assert_nothing_leaked(&door, &trick, &taken);
            assert_refused_link(&tree, &door, &trick, &taken);
            let door = format!("pool {op} output");
            for output in [path.join("new"), path.clone()] {
                let write = "open('o.txt', 'w').write('x')";
                let taken = pool_request(&mut pool, &mut n, request(op, write, json!({"output": output})));
                tree.assert_victim_untouched(&door, &trick);
                assert_refused(&tree, &door, &trick, &taken);
            }
        }
    }
    for (trick, path) in script_tricks(&tree.t) {
        let taken = pool_request(&mut pool, &mut n, json!({"script": path}));
        tree.assert_nothing_leaked("pool run script", &trick, &taken);
        assert_refused(&tree, "pool run script", &trick, &taken);
    }
    // The real input folder is copied: its hard links are refused, named,
    // and nothing of it reaches the jail.
    for op in ["run", "session"] {
        let taken = pool_request(&mut pool, &mut n, request(op, PROBE, json!({"input": tree.t.join("in")})));
        tree.assert_nothing_leaked(&format!("pool {op}"), "an input holding hard links", &taken);
        match &taken {
            Taken::Refused(why) => tree.check(why.contains("hard: a file with 2 names"), || format!("pool {op}: {why}")),
            Taken::Ran(text) => tree.check(false, || format!("pool {op}: an input holding hard links was copied: {text}")),
        }
    }
    // Without them, a root pool's copy keeps each file's own mode: root's
    // 0600 file is refused (the jail's uid could not read it through a
    // bind), an ordinary caller's own one is copied as 0600.
    for name in ["hard", "shadow"] {
        let _ = std::fs::remove_file(tree.t.join("in").join(name));
    }
    let taken = pool_request(&mut pool, &mut n, json!({"input": tree.t.join("in"), "code": PROBE}));
    tree.assert_nothing_leaked("pool run", "an input with a 0600 file", &taken);
    match (&taken, is_root()) {
        (Taken::Refused(why), true) => tree.check(why.contains("private600.txt"), || why.clone()),
        (Taken::Ran(text), false) => tree.check(text.contains("a,b"), || text.clone()),
        (other, _) => tree.check(false, || format!("pool run, an input with a 0600 file: {other:?}")),
    }
    drop(pool.stdin.take());
    assert!(pool.child.wait().expect("wait for the pool").success());
    tree.done();
}

/// `jail mcp` over stdio, spoken to as an MCP client would.
struct Mcp {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Mcp {
    fn start(tree: &Tree, input_dir: &Path) -> Result<Mcp, String> {
        let mut child = Command::new(jail_bin())
            .arg("mcp")
            .arg("--rootfs")
            .arg(&tree.sb.rootfs)
            .arg("--input-dir")
            .arg(input_dir)
            .current_dir(tree.victim())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn jail mcp");
        let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut mcp = Mcp { child, out, next: 0 };
        let init = json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "doors", "version": "0"}});
        match mcp.call("initialize", init) {
            Some(_) => {}
            None => {
                let status = mcp.child.wait().expect("wait for jail mcp");
                let mut err = String::new();
                use std::io::Read;
                mcp.child.stderr.take().expect("stderr").read_to_string(&mut err).unwrap();
                return Err(format!("{status}: {err}"));
            }
        }
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        Ok(mcp)
    }

    /// Write one message; a server that exited has its reply missing.
    fn send(&mut self, v: &Value) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        let _ = writeln!(stdin, "{v}").and_then(|()| stdin.flush());
    }

    fn call(&mut self, method: &str, params: Value) -> Option<Value> {
        use std::io::BufRead;
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            if self.out.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let v: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("jail mcp wrote a line that is not JSON ({e}): {line}"));
            if v["id"] == json!(id) {
                return Some(v);
            }
        }
    }

    fn run_python(&mut self, input: &[String]) -> Taken {
        let reply = self
            .call("tools/call", json!({"name": "run_python", "arguments": {"code": PROBE, "input": input}}))
            .expect("a reply");
        if reply["result"]["isError"] == json!(true) || !reply["error"].is_null() {
            Taken::Refused(reply.to_string())
        } else {
            Taken::Ran(reply.to_string())
        }
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn the_mcp_servers_staging_refuses_every_link_trick_and_hands_on_nothing_the_jail_could_not_read() {
    let tree = Tree::new();
    let input = tree.t.join("in");
    std::os::unix::fs::symlink("../victim/secret.txt", input.join("filelink")).unwrap();
    std::os::unix::fs::symlink("../victim", input.join("dirlink")).unwrap();
    // An --input-dir named through a link: the server does not start.
    for (trick, dir) in folder_tricks(&tree.t).into_iter().take(3) {
        match Mcp::start(&tree, &dir) {
            Err(e) => tree.check(e.contains("link"), || format!("mcp --input-dir {trick}: {e}")),
            Ok(_) => tree.check(false, || format!("jail mcp started with --input-dir {trick}")),
        }
    }
    let mut mcp = Mcp::start(&tree, &input).expect("jail mcp");
    let abs = |rel: &str| input.join(rel).display().to_string();
    for (trick, entry, why) in [
        ("a link to a file, by name", "in/filelink".to_string(), "link"),
        ("a file through a linked folder", "in/dirlink/secret.txt".into(), "link"),
        ("a linked folder with a trailing slash", "in/dirlink/".into(), "link"),
        ("a link to a file, absolute", abs("filelink"), "link"),
        ("`..` out of the folder", abs("../victim/secret.txt"), "outside"),
        ("a hard link", "in/hard".into(), "hard link"),
    ] {
        let taken = mcp.run_python(&[entry]);
        tree.assert_nothing_leaked("mcp", trick, &taken);
        match &taken {
            Taken::Refused(text) => {
                tree.check(text.contains(why), || format!("mcp, {trick}: refused, but not for `{why}`: {text}"))
            }
            Taken::Ran(text) => tree.check(false, || format!("mcp, {trick}: accepted: {text}")),
        }
    }
    // Issue 32 item 3: a 0600 file named alone. As root the jail's uid
    // could not read it through a bind, so it is refused; an ordinary
    // caller's own file is the caller's to give.
    let taken = mcp.run_python(&["in/private600.txt".into()]);
    tree.assert_nothing_leaked("mcp", "a 0600 file", &taken);
    match (&taken, is_root()) {
        (Taken::Refused(text), true) => tree.check(text.contains("may not read"), || text.clone()),
        (Taken::Ran(text), false) => tree.check(text.contains("private"), || text.clone()),
        (other, _) => tree.check(false, || format!("mcp, a 0600 file: {other:?}")),
    }
    if tree.shadow.is_some() {
        let taken = mcp.run_python(&["in/shadow".into()]);
        tree.assert_nothing_leaked("mcp", "a hard link to /etc/shadow", &taken);
        assert_refused(&tree, "mcp", "a hard link to /etc/shadow", &taken);
    }
    // The folder as a whole is bound (`jail run --input`): the kernel's view.
    let taken = mcp.run_python(&["in".into()]);
    tree.check(matches!(taken, Taken::Ran(_)), || format!("mcp, the folder: {taken:?}"));
    if let (Taken::Ran(text), Some(line)) = (&taken, &tree.shadow) {
        tree.check(!text.contains(line.as_str()), || text.clone());
    }
    drop(mcp);
    tree.done();
}

#[test]
fn the_agents_input_copy_and_export_refuse_every_link_trick_and_copy_no_hard_link() {
    use agent::session::Session as AgentSession;
    let tree = Tree::new();
    let owner = agent::agent::owner_for(None).expect("owner");
    let parent = tree.sb.dir.path().join("agent-sessions");
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (trick, path) in folder_tricks(&tree.t) {
        match AgentSession::create(Some(&parent), &path, owner) {
            Err(e) => tree.check(e.to_string().contains("link"), || format!("agent --input, {trick}: not for the link: {e}")),
            Ok(s) => tree.check(false, || format!("agent --input, {trick}: accepted into {}", s.root.display())),
        }
    }
    // Issue 32 item 5: the hard links are not copied, and say so; as root
    // the 0600 file is not copied either.
    let s = AgentSession::create(Some(&parent), &tree.t.join("in"), owner).expect("agent session");
    let mut copied: Vec<String> = std::fs::read_dir(&s.input)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    copied.sort();
    let want: &[&str] = if is_root() { &["data.csv"] } else { &["data.csv", "private600.txt"] };
    tree.check(copied == want, || format!("agent input copy holds {copied:?}, skipped: {:?}", s.skipped_input));
    let skipped = s.skipped_input.join("\n");
    tree.check(skipped.contains("/hard ("), || format!("agent input copy: the hard link is not named: {skipped}"));
    for f in std::fs::read_dir(&s.input).unwrap().flatten() {
        let text = std::fs::read_to_string(f.path()).unwrap_or_default();
        tree.assert_nothing_leaked("agent input copy", &f.file_name().to_string_lossy(), &Taken::Ran(text));
    }
    // The export's destination, named through a link: refused, nothing
    // written beside the victim.
    let accepted = agent::export::Accepted::default();
    for (trick, path) in folder_tricks(&tree.t) {
        for dest in [path.clone(), path.join("new")] {
            let r = agent::export::export(&s.output, &accepted, &dest);
            tree.check(r.is_err(), || format!("agent export to {trick} ({}): {r:?}", dest.display()));
            tree.assert_victim_untouched("agent export", &trick);
        }
    }
    tree.done();
}
