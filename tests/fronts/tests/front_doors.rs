//! The link tricks of issue 32 (jail_tests::tricks) driven through the
//! doors only a front end has: the MCP server's staging and its files
//! tools, and the agent's input copy and export; the jail's own doors are
//! tests/doors.rs.

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

/// One `tools/call`'s result; a JSON-RPC error fails the test.
fn tool(mcp: &mut Mcp, name: &str, args: Value) -> Value {
    let reply = mcp.call("tools/call", json!({"name": name, "arguments": args})).expect("a reply");
    assert!(reply["error"].is_null(), "{name}: {reply}");
    reply["result"].clone()
}

/// A result's text blocks, joined.
fn texts(r: &Value) -> String {
    let blocks = r["content"].as_array().unwrap_or_else(|| panic!("no content: {r}"));
    blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n")
}

fn images(r: &Value) -> Vec<&Value> {
    r["content"]
        .as_array()
        .map(|b| b.iter().filter(|b| b["type"] == "image").collect())
        .unwrap_or_default()
}

fn is_error(r: &Value) -> bool {
    r["isError"] == json!(true)
}

fn start_session(mcp: &mut Mcp) -> String {
    let started = tool(mcp, "session_start", json!({}));
    started["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned()
}

/// The files tools (issue 37 item 4) on a live session: a CSV written by
/// the caller is what a cell reads, byte for byte; read back, its formula
/// cell comes neutralised; a PNG a cell wrote comes back as image
/// content; base64 content is decoded; a listing shows both.
#[test]
fn the_mcp_files_tools_hand_a_cell_the_written_csv_and_read_it_back_neutralised_and_a_png_as_an_image() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let sb = Sandbox::new();
    let mut mcp = Mcp::spawn(&sb.rootfs, sb.dir.path(), &sb.input).expect("jail mcp starts");
    let sid = start_session(&mut mcp);
    let csv = "name,total\nbob,=1+2\n";
    let w = tool(&mut mcp, "session_write_file", json!({"session_id": sid, "path": "data/in.csv", "content": csv}));
    assert!(!is_error(&w), "{w}");
    let want = json!({"path": "data/in.csv", "bytes": csv.len(), "sha256": jail::digest::sha256_hex(csv.as_bytes())});
    assert_eq!(w["structuredContent"], want, "{w}");
    let w = tool(
        &mut mcp,
        "session_write_file",
        json!({"session_id": sid, "path": "/workspace/output/note.txt", "content": b64.encode("héllo\n"), "encoding": "base64"}),
    );
    assert_eq!(w["structuredContent"]["path"], "note.txt", "a path as the code names it is taken: {w}");

    let code = concat!(
        "print(repr(open('/workspace/output/data/in.csv').read()))\n",
        "print(open('/workspace/output/note.txt', 'rb').read() == 'héllo\\n'.encode())\n",
        include_str!("../../shows.py"),
        "open('/workspace/output/chart.png', 'wb').write(PNG)\n",
        "import base64\nprint(base64.b64encode(PNG).decode())\n",
    );
    let cell = tool(&mut mcp, "session_exec", json!({"session_id": sid, "code": code}));
    let stdout = cell["structuredContent"]["stdout"]["text"].as_str().unwrap_or_else(|| panic!("{cell}")).to_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..2], ["'name,total\\nbob,=1+2\\n'", "True"], "the cell sees what was written: {cell}");
    let png = lines[2];

    let r = tool(&mut mcp, "session_read_file", json!({"session_id": sid, "path": "data/in.csv"}));
    assert!(!is_error(&r), "{r}");
    let text = texts(&r);
    assert!(text.contains("bob,'=1+2") && !text.contains("bob,=1+2"), "the formula cell is neutralised: {text}");
    assert_eq!(r["structuredContent"]["media_type"], "text/csv", "{r}");
    assert_eq!(r["structuredContent"]["neutralised"]["cells"], 1, "{r}");
    let r = tool(&mut mcp, "session_read_file", json!({"session_id": sid, "path": "note.txt"}));
    assert!(texts(&r).ends_with("\nhéllo\n"), "{r}");

    let r = tool(&mut mcp, "session_read_file", json!({"session_id": sid, "path": "chart.png"}));
    let shown = images(&r);
    assert_eq!(shown.len(), 1, "{r}");
    assert_eq!(shown[0]["mimeType"], "image/png");
    assert_eq!(shown[0]["data"], png, "the image is the PNG the cell wrote");
    assert_eq!(r["structuredContent"]["summary"], json!({"kind": "image", "width": 3, "height": 2}), "{r}");

    let r = tool(&mut mcp, "session_list_files", json!({"session_id": sid}));
    let entries = &r["structuredContent"]["entries"];
    let names: Vec<(&str, &str)> = entries
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("chart.png", "file"), ("data", "dir"), ("note.txt", "file")], "{r}");
    let r = tool(&mut mcp, "session_list_files", json!({"session_id": sid, "path": "data"}));
    assert_eq!(r["structuredContent"]["entries"], json!([{"name": "in.csv", "kind": "file", "bytes": csv.len()}]), "{r}");
    assert!(texts(&r).contains(&format!("in.csv ({} bytes)", csv.len())), "{r}");
    tool(&mut mcp, "session_stop", json!({"session_id": sid}));
}

/// The files tools against a hostile session: `..` and absolute paths,
/// links a cell made (to a host file, to a folder the write would land
/// in), a hard link, content over the 8 MiB a file may be, a file over
/// it, and files whose whole content would hand the model megabytes (a
/// long text, a binary, 600 names). Each refusal is a tool error saying
/// what to do in tool terms, and no reply carries more than its cap.
#[test]
fn the_mcp_files_tools_refuse_dotdot_links_and_oversize_content_and_never_hand_the_model_megabytes() {
    use base64::Engine;
    let sb = Sandbox::new();
    let mut mcp = Mcp::spawn(&sb.rootfs, sb.dir.path(), &sb.input).expect("jail mcp starts");
    let sid = start_session(&mut mcp);
    let setup = "import os
os.chdir('/workspace/output')
os.symlink('/etc/passwd', 'link.txt')
os.symlink('/tmp', 'tmplink')
os.symlink('/etc', 'etclink')
open('h.txt', 'w').write('h')
os.link('h.txt', 'h2.txt')
open('long.txt', 'w').write('a line of text\\n' * 100000)
open('blob.parquet', 'wb').write(os.urandom(1 << 20))
open('huge.txt', 'w').write('x' * (9 << 20))
open('forged.png', 'w').write(\"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>\")
os.mkdir('many')
for i in range(600):
    open(f'many/{i:03}.txt', 'w').write('')
print('ready')
";
    let cell = tool(&mut mcp, "session_exec", json!({"session_id": sid, "code": setup}));
    assert!(texts(&cell).contains("ready"), "{cell}");
    let mut largest = 0;
    let mut call = |mcp: &mut Mcp, name: &str, args: Value| {
        let r = tool(mcp, name, args);
        largest = largest.max(r.to_string().len());
        r
    };
    let refused = |r: &Value, what: &str, why: &str| {
        let text = texts(r);
        assert!(is_error(r), "{what}: not refused: {r}");
        assert!(text.contains(why), "{what}: refused, but not for `{why}`: {text}");
        assert!(!text.contains("root:") && !text.contains("jail session"), "{what}: {text}");
    };
    let read = |path: &str| json!({"session_id": sid, "path": path});
    let write = |path: &str, content: &str| json!({"session_id": sid, "path": path, "content": content});

    for path in ["../escape.txt", "/etc/passwd", "a/../../x.txt"] {
        refused(&call(&mut mcp, "session_write_file", write(path, "x")), path, "relative to /workspace/output");
        refused(&call(&mut mcp, "session_read_file", read(path)), path, "relative to /workspace/output");
    }
    refused(&call(&mut mcp, "session_read_file", read("../../etc/passwd")), "`..` to a host file", "`..`");
    refused(&call(&mut mcp, "session_read_file", read("link.txt")), "a link to /etc/passwd", "link");
    refused(&call(&mut mcp, "session_read_file", read("etclink/passwd")), "through a linked folder", "link");
    refused(&call(&mut mcp, "session_list_files", read("etclink")), "a linked folder listed", "link");
    refused(
        &call(&mut mcp, "session_write_file", write("tmplink/new.txt", "x")),
        "a write through a linked folder",
        "link",
    );
    refused(&call(&mut mcp, "session_read_file", read("h.txt")), "a hard link", "hard_link");
    refused(&call(&mut mcp, "session_read_file", read("huge.txt")), "a 9 MiB file", "8 MiB");
    refused(&call(&mut mcp, "session_read_file", read("gone.txt")), "a missing file", "session_list_files");
    let over = "x".repeat((8 << 20) + 1);
    refused(&call(&mut mcp, "session_write_file", write("over.txt", &over)), "9 MiB of text", "8 MiB");
    let over = base64::engine::general_purpose::STANDARD.encode(vec![0u8; (8 << 20) + 1]);
    let args = json!({"session_id": sid, "path": "over.txt", "content": over, "encoding": "base64"});
    refused(&call(&mut mcp, "session_write_file", args), "9 MiB of base64", "8 MiB");
    refused(
        &call(&mut mcp, "session_read_file", json!({"session_id": "nope", "path": "h.txt"})),
        "a bad id",
        "no open session",
    );

    // The long text comes cut at its cap, the binary as its type and size.
    let r = call(&mut mcp, "session_read_file", read("long.txt"));
    assert!(
        !is_error(&r) && texts(&r).contains("its first 131072 bytes follow"),
        "{}",
        texts(&r).chars().take(300).collect::<String>()
    );
    let r = call(&mut mcp, "session_read_file", read("blob.parquet"));
    assert!(!is_error(&r) && texts(&r).contains("not shown") && texts(&r).len() < 1000, "{r}");
    // A PNG by name only: what the check sniffed decides, never as an image.
    let r = call(&mut mcp, "session_read_file", read("forged.png"));
    assert!(images(&r).is_empty() && texts(&r).contains("image/svg+xml"), "{r}");
    let r = call(&mut mcp, "session_list_files", read("many"));
    assert_eq!(r["structuredContent"]["entries"].as_array().map(Vec::len), Some(500), "{r}");
    assert_eq!(r["structuredContent"]["truncated"], true, "{r}");
    assert!(largest < 200 << 10, "a reply of {largest} bytes");

    // Nothing was written where a refused path or link pointed.
    let check = "import os\nprint(sorted(n for n in ('/tmp/new.txt', '/workspace/escape.txt', '/workspace/output/over.txt') if os.path.exists(n)))";
    let cell = tool(&mut mcp, "session_exec", json!({"session_id": sid, "code": check}));
    assert_eq!(cell["structuredContent"]["stdout"]["text"], "[]\n", "{cell}");
    tool(&mut mcp, "session_stop", json!({"session_id": sid}));
    refused(&tool(&mut mcp, "session_list_files", json!({"session_id": sid})), "a stopped session", "no open session");
}

/// A cell's files come back with that cell (issue 37 item 3), from the
/// session: its PNG as image content before session_stop, read through
/// the session's files API, not from the host folder, which is given
/// the cell's files only when the session ends and here holds an older
/// chart.png of the same name. The text says where the files are, each
/// one's change, and the refusals; a cell that wrote nothing says nothing
/// of files; the closing result shows the delivered chart as before.
#[test]
fn a_session_cells_png_comes_back_from_the_session_before_session_stop_and_never_the_host_folders_older_one() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let sb = Sandbox::new();
    let mut mcp = Mcp::spawn(&sb.rootfs, sb.dir.path(), &sb.input).expect("jail mcp starts");
    let sid = start_session(&mut mcp);
    let quiet = tool(&mut mcp, "session_exec", json!({"session_id": sid, "code": "x = 1\nprint('quiet')"}));
    let text = texts(&quiet);
    assert!(text.contains("quiet") && !text.contains("files") && !text.contains("artifacts"), "{quiet}");
    assert!(images(&quiet).is_empty(), "{quiet}");
    let host = quiet["structuredContent"]["output_dir"].as_str().unwrap_or_else(|| panic!("{quiet}")).to_owned();
    // An older chart of the same name, already in the host folder.
    let old = [b"\x89PNG\r\n\x1a\n".as_slice(), b"an older chart"].concat();
    std::fs::write(Path::new(&host).join("chart.png"), &old).unwrap();

    let code = concat!(
        include_str!("../../shows.py"),
        "open('/workspace/output/chart.png', 'wb').write(PNG)\n",
        "open('/workspace/output/prog.exe', 'wb').write(b'MZ')\n",
        "import base64\nprint(base64.b64encode(PNG).decode())\n",
    );
    let drawn = tool(&mut mcp, "session_exec", json!({"session_id": sid, "code": code}));
    let png = drawn["structuredContent"]["stdout"]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{drawn}"))
        .trim()
        .to_owned();
    let shown = images(&drawn);
    assert_eq!(shown.len(), 1, "the cell's chart, as it ends: {drawn}");
    assert_eq!(shown[0]["mimeType"], "image/png");
    assert_eq!(shown[0]["data"], png, "the chart the cell wrote, not the host folder's older one");
    assert_ne!(shown[0]["data"], b64.encode(&old));
    let text = texts(&drawn);
    assert!(
        text.contains("still in the session") && text.contains("session_read_file") && text.contains("session_stop"),
        "{text}"
    );
    assert!(text.contains("chart.png (created, image/png") && text.contains("refused output prog.exe"), "{text}");
    assert!(!text.contains("not attached"), "{text}");
    assert_eq!(std::fs::read(Path::new(&host).join("chart.png")).unwrap(), old, "delivered before the session ended");

    // Moved: the old name deleted, the new one shown.
    let moved = "import os\nos.rename('/workspace/output/chart.png', '/workspace/output/moved.png')\n";
    let cell = tool(&mut mcp, "session_exec", json!({"session_id": sid, "code": moved}));
    let text = texts(&cell);
    assert!(text.contains("  chart.png (deleted)") && text.contains("moved.png (created"), "{text}");
    let shown = images(&cell);
    assert_eq!(shown.len(), 1, "{cell}");
    assert_eq!(shown[0]["data"], png, "{cell}");

    // The closing result: delivered to the host folder, shown from there.
    let stopped = tool(&mut mcp, "session_stop", json!({"session_id": sid}));
    assert!(texts(&stopped).contains(&format!("artifacts (host folder {host})")), "{stopped}");
    let shown = images(&stopped);
    assert_eq!(shown.len(), 1, "{stopped}");
    assert_eq!(shown[0]["data"], png, "{stopped}");
}
