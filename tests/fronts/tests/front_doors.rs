//! The link tricks of issue 32 (jail_tests::tricks) driven through the
//! doors only a front end has: the MCP server's staging, and the agent's
//! input copy and export; the jail's own doors are tests/doors.rs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use jail_tests::tricks::*;
use jail_tests::*;
use serde_json::{json, Value};

/// `jail mcp` over stdio, spoken to as an MCP client would.
struct Mcp {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Mcp {
    fn start(tree: &Tree, input_dir: &Path) -> Result<Mcp, String> {
        Mcp::spawn(&tree.sb.rootfs, &tree.victim(), input_dir)
    }

    fn spawn(rootfs: &Path, cwd: &Path, input_dir: &Path) -> Result<Mcp, String> {
        let mut child = Command::new(jail_bin())
            .arg("mcp")
            .arg("--rootfs")
            .arg(rootfs)
            .arg("--input-dir")
            .arg(input_dir)
            .current_dir(cwd)
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

/// The variables a caller sets (jail/src/envs.rs) through the MCP
/// server's tools: `run_python`, `session_start` (every cell) and
/// `session_exec` (that cell only); a name the jail keeps is a tool error
/// naming it, and nothing runs. The service's doors: tests/serve.rs.
#[test]
fn the_mcp_tools_give_the_code_its_variables_and_refuse_the_jails_names() {
    let sb = Sandbox::new();
    let mut mcp = Mcp::spawn(&sb.rootfs, sb.dir.path(), &sb.input).expect("jail mcp starts");
    let show = "import os\nprint(os.environ.get('A'), os.environ.get('S'), os.environ.get('C'))";
    let mut tool = |name: &str, args: Value| {
        let reply = mcp.call("tools/call", json!({"name": name, "arguments": args})).expect("a reply");
        assert!(reply["error"].is_null(), "{name}: {reply}");
        reply["result"].clone()
    };
    let stdout = |r: &Value| r["structuredContent"]["stdout"]["text"].as_str().unwrap_or_else(|| panic!("{r}")).trim().to_owned();
    let r = tool("run_python", json!({"code": show, "env": {"A": "run"}}));
    assert_eq!(stdout(&r), "run None None", "{r}");
    let started = tool("session_start", json!({"env": {"S": "session"}}));
    let sid = started["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned();
    let r = tool("session_exec", json!({"session_id": sid, "code": show, "env": {"C": "cell"}}));
    assert_eq!(stdout(&r), "None session cell", "{r}");
    let r = tool("session_exec", json!({"session_id": sid, "code": show}));
    assert_eq!(stdout(&r), "None session None", "a cell's variable outlived it: {r}");
    for (name, args) in [
        ("run_python", json!({"code": "open('/workspace/output/ran', 'w')", "env": {"LD_PRELOAD": "/x.so"}})),
        ("session_start", json!({"env": {"JAIL_PRELOAD": "os"}})),
        (
            "session_exec",
            json!({"session_id": sid, "code": "open('/workspace/output/ran', 'w')", "env": {"PYTHONPATH": "/x"}}),
        ),
    ] {
        let r = tool(name, args);
        assert_eq!(r["isError"], json!(true), "{name}: {r}");
        let text = r["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("`env`") && text.contains("may not be set"), "{name}: {r}");
    }
    tool("session_stop", json!({"session_id": sid}));
}

/// A PNG the code displays comes back from the MCP tools as image
/// content, judged by the jail first; a forged one (an SVG calling itself
/// a PNG) never does, and the last expression's value comes as text.
#[test]
fn the_mcp_tools_return_a_displayed_png_as_image_content_and_a_forged_one_as_nothing() {
    let sb = Sandbox::new();
    let mut mcp = Mcp::spawn(&sb.rootfs, sb.dir.path(), &sb.input).expect("jail mcp starts");
    let code = concat!(include_str!("../../shows.py"), "display(Picture())\ndisplay(Liar())\n6 * 7\n");
    let mut tool = |name: &str, args: Value| {
        let reply = mcp.call("tools/call", json!({"name": name, "arguments": args})).expect("a reply");
        assert!(reply["error"].is_null(), "{name}: {reply}");
        reply["result"].clone()
    };
    let started = tool("session_start", json!({}));
    let sid = started["structuredContent"]["session_id"].as_str().unwrap().to_owned();
    for (name, args) in [
        ("run_python", json!({"code": code})),
        ("session_exec", json!({"session_id": sid, "code": code})),
    ] {
        let r = tool(name, args);
        let blocks = r["content"].as_array().unwrap();
        let images: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "image").collect();
        assert_eq!(images.len(), 1, "{name}: {r}");
        assert_eq!(images[0]["mimeType"], "image/png", "{name}");
        let texts: Vec<&str> = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
        assert!(texts.iter().any(|t| t.starts_with("result:\n42")), "{name}: {texts:?}");
        assert!(texts.iter().any(|t| t.starts_with("display:\n")), "{name}: the forged PNG's text is shown: {texts:?}");
    }
    tool("session_stop", json!({"session_id": sid}));
}
