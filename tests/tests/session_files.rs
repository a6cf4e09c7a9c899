//! A session's files (issue 37 items 3 and 4), through the CLI that every
//! local door spawns, on a session of its own and on one from `jail pool`:
//! a file put mid-session is the code's, one read back is judged as an
//! artifact, and neither goes anywhere but `/workspace/output`, whatever
//! the code left there (links to the host, hard links, fifos, a file it
//! keeps rewriting) and whatever the caller asks (`..`, oversize). Each
//! cell's result lists what that cell made, changed or deleted, judged
//! with the jail held still, even while a thread it left keeps writing.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use base64::Engine;
use jail_tests::*;
use serde_json::{json, Value};

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_default())
        .expect("base64 data")
}

/// A session of its own, or one `jail pool` made ahead and handed out.
enum Door {
    Start,
    Pool,
}

fn session(sb: &Sandbox, door: Door) -> (Session, Option<Pool>) {
    match door {
        Door::Start => (sb.start_session(), None),
        Door::Pool => {
            let mut pool = Pool::start(sb, 1, &[]);
            let session = pool.session(json!({"id": "s", "op": "session", "output": sb.output}));
            (session, Some(pool))
        }
    }
}

fn put_read_back_and_delivered(door: Door) {
    let sb = Sandbox::new();
    let (s, pool) = session(&sb, door);
    let (w, out) = s.put("data/sales.csv", b"region,total\nnorth,=1+1\nsouth,3\n");
    assert!(out.status.success(), "{w} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(w["status"], "written", "{w}");
    assert_eq!(w["bytes"], 32);
    // A path as the code names it is taken too.
    let (w, _) = s.put("/workspace/output/note.txt", b"hello");
    assert_eq!(w["path"], "note.txt", "{w}");

    let (v, _) = s.exec(concat!(
        "import csv, os\n",
        "rows = list(csv.DictReader(open('/workspace/output/data/sales.csv')))\n",
        "print(len(rows), rows[0]['total'], os.stat('/workspace/output/data/sales.csv').st_uid == os.getuid())\n",
        "open('/workspace/output/data/report.csv', 'w').write('k,v\\nx,=HYPERLINK(\"http://e.vil\")\\n')\n",
    ));
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["stdout"]["text"], "2 =1+1 True\n", "the code reads the file as put, as its own");

    let (r, _) = s.files("get", "data/report.csv");
    assert_eq!(r["status"], "read", "{r}");
    assert_eq!(b64(&r["data"]), b"k,v\nx,'=HYPERLINK(\"http://e.vil\")\n", "a formula cell reaches the caller neutralised");
    assert_eq!(r["artifact"]["neutralised"]["cells"], 1, "{r}");
    assert_eq!(r["artifact"]["media_type"], "text/csv");

    let (l, _) = s.files("ls", "data");
    let names: Vec<&str> = l["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["report.csv", "sales.csv"], "{l}");

    // The raw form: the judged bytes on stdout.
    let raw = std::process::Command::new(jail_bin())
        .args(["session", "get"])
        .arg(&s.handle)
        .arg("note.txt")
        .output()
        .unwrap();
    assert_eq!(raw.stdout, b"hello");

    let out = s.stop();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    drop(pool);
    assert_eq!(std::fs::read(sb.output.join("note.txt")).unwrap(), b"hello", "what was put is the session's output");
    assert!(sb.output.join("data/report.csv").exists());
}

#[test]
fn a_file_put_mid_session_is_the_codes_and_one_read_back_is_judged() {
    put_read_back_and_delivered(Door::Start);
}

#[test]
fn a_pooled_sessions_files_work_the_same() {
    put_read_back_and_delivered(Door::Pool);
}

/// A host folder the sandbox's ids could write and read, were a link
/// followed: what the code points its links at.
struct Bait(PathBuf);

impl Bait {
    fn new() -> Bait {
        let dir = std::env::temp_dir().join(format!("jail-files-bait-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(dir.join("secret.txt"), b"host secret").unwrap();
        std::fs::set_permissions(dir.join("secret.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
        Bait(dir)
    }
}

impl Drop for Bait {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn refused(v: &Value, code: &str) {
    assert_eq!(v["status"], "refused", "not refused: {v}");
    assert_eq!(v["code"], code, "{v}");
}

#[test]
fn the_files_api_follows_no_link_the_code_made_and_takes_no_path_outside_the_output() {
    let sb = Sandbox::new();
    let bait = Bait::new();
    let s = sb.start_session();
    let (v, _) = s.exec(&format!(
        concat!(
            "import os\n",
            "o = '/workspace/output/'\n",
            "os.symlink({dir:?}, o + 'to_host')\n",
            "os.symlink({secret:?}, o + 'leak.txt')\n",
            "os.makedirs(o + 'd')\n",
            "os.symlink({dir:?}, o + 'd/deeper')\n",
            "open(o + 'mine.txt', 'w').write('mine')\n",
            "os.link(o + 'mine.txt', o + 'twin.txt')\n",
            "os.mkfifo(o + 'pipe.txt')\n",
            "open(o + 'prog.exe', 'w').write('MZ')\n",
        ),
        dir = bait.0.display().to_string(),
        secret = bait.0.join("secret.txt").display().to_string(),
    ));
    assert_eq!(v["status"], "ok", "{v}");

    for path in ["leak.txt", "to_host/secret.txt", "d/deeper/secret.txt"] {
        let (r, out) = s.files("get", path);
        refused(&r, "link");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("host secret"), "{path}: the host file was read");
    }
    for path in ["to_host/planted.txt", "d/deeper/planted.txt", "leak.txt"] {
        let (w, _) = s.put(path, b"planted");
        if path == "leak.txt" {
            // The name is replaced, never followed: the link goes, the host file stays.
            assert_eq!(w["status"], "written", "{w}");
        } else {
            refused(&w, "link");
        }
    }
    assert_eq!(std::fs::read(bait.0.join("secret.txt")).unwrap(), b"host secret", "a host file was written through a link");
    assert!(!bait.0.join("planted.txt").exists(), "a file was planted on the host through a link");
    let (l, _) = s.files("ls", "to_host");
    refused(&l, "link");

    let (r, _) = s.files("get", "twin.txt");
    refused(&r, "rejected");
    assert_eq!(r["reason"], "hard_link", "{r}");
    let (r, _) = s.files("get", "pipe.txt");
    refused(&r, "not_a_file");
    let (r, _) = s.files("get", "prog.exe");
    refused(&r, "rejected");
    assert_eq!(r["reason"], "extension_not_allowed", "{r}");

    for path in [
        "../etc/passwd",
        "/etc/passwd",
        "d/../../x.txt",
        "",
        ".jail-partial-1-1",
        "a\u{202e}txt.exe",
        "-rf.txt",
    ] {
        let (w, _) = s.put(path, b"x");
        refused(&w, "bad_path");
        if !path.is_empty() {
            let (r, _) = s.files("get", path);
            refused(&r, "bad_path");
        }
    }
    let (l, _) = s.files("ls", "../");
    refused(&l, "bad_path");
    s.stop();
}

/// One request line on the session's socket, as a client other than ours
/// might send it; its answer's `result`.
fn raw_request(handle: &Path, request: &Value) -> Value {
    let mut stream = UnixStream::connect(handle).unwrap();
    stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let answer: Value = serde_json::from_reader(&stream).unwrap();
    answer["result"].clone()
}

#[test]
fn files_over_the_cap_are_refused_both_ways_without_being_read_whole() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    // The client's own check first, then the session's, whatever a client sends.
    let big = vec![b'a'; (8 << 20) + 1];
    let (w, _) = s.put("big.txt", &big);
    refused(&w, "too_large");
    let data = base64::engine::general_purpose::STANDARD.encode(&big);
    let r = raw_request(&s.handle, &json!({"op": "put_file", "path": "big.txt", "data": data}));
    refused(&r, "too_large");
    let r = raw_request(&s.handle, &json!({"op": "put_file", "path": "x.txt", "data": "%%% not base64"}));
    refused(&r, "bad_path");

    let (v, _) = s.exec("open('/workspace/output/huge.txt', 'wb').truncate(64 << 20)\n");
    assert_eq!(v["status"], "ok", "{v}");
    let (r, _) = s.files("get", "huge.txt");
    refused(&r, "too_large");
    let (l, _) = s.files("ls", "");
    assert_eq!(l["entries"][0]["bytes"], 64u64 << 20, "{l}");
    s.stop();
}

#[test]
fn what_a_get_returns_is_what_was_judged_while_the_code_keeps_rewriting_the_file() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    // A thread the cell leaves behind rewrites the file in place, with and
    // without a formula cell, for as long as the session lives.
    let (v, _) = s.exec(concat!(
        "import threading\n",
        "def churn():\n",
        "    n = 0\n",
        "    while True:\n",
        "        n += 1\n",
        "        with open('/workspace/output/live.csv', 'r+' if n > 1 else 'w') as f:\n",
        "            f.write('a,b\\n=cmd|calc,1\\n' if n % 2 else 'a,b\\nplain,22\\n')\n",
        "            f.truncate()\n",
        "threading.Thread(target=churn, daemon=True).start()\n",
        "import time; time.sleep(0.2)\n",
    ));
    assert_eq!(v["status"], "ok", "{v}");
    let mut neutralised = 0;
    for _ in 0..40 {
        let (r, _) = s.files("get", "live.csv");
        if r["status"] != "read" {
            continue;
        }
        let data = b64(&r["data"]);
        let text = String::from_utf8_lossy(&data).into_owned();
        assert!(!text.lines().any(|l| l.starts_with('=')), "an unneutralised formula reached the caller: {text:?}");
        assert_eq!(data.len() as u64, r["artifact"]["bytes"], "{r}");
        assert_eq!(
            jail::digest::sha256_hex(&data),
            r["artifact"]["sha256"].as_str().unwrap(),
            "returned bytes are not the judged ones"
        );
        if r["artifact"]["neutralised"].is_object() {
            neutralised += 1;
        }
    }
    assert!(neutralised > 0, "the formula version was never read: the test did not race");
    s.stop();
}

#[test]
fn a_session_whose_output_is_the_host_folder_says_so() {
    let mut sb = Sandbox::new();
    let p = policy_with(&sb, |v| v["filesystem"]["output_size"] = json!("unlimited"));
    sb.extra_args.extend(["--policy".to_string(), p.display().to_string()]);
    let s = sb.start_session();
    let (w, out) = s.put("x.txt", b"x");
    refused(&w, "unavailable");
    assert_eq!(out.status.code(), Some(1));
    s.stop();
}

// ------------------------------------------------------ each cell's files

/// (path, change) of artifacts, or (path, reason) of refusals.
type Pairs = Vec<(String, String)>;

/// What a cell's result lists: (path, change) of its artifacts, and
/// (path, reason) of its refusals.
fn listed(v: &Value) -> (Pairs, Pairs) {
    let pairs = |key: &str, second: &str| -> Pairs {
        v[key]
            .as_array()
            .unwrap_or(&Vec::new())
            .iter()
            .map(|a| (a["path"].as_str().unwrap_or("").to_string(), a[second].as_str().unwrap_or("").to_string()))
            .collect()
    };
    (pairs("artifacts", "change"), pairs("rejected_artifacts", "reason"))
}

fn pairs(list: &[(&str, &str)]) -> Pairs {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

fn each_cell_lists_its_files(door: Door) {
    let sb = Sandbox::new();
    let (s, pool) = session(&sb, door);
    let (v, _) = s.exec(concat!(
        "import os\n",
        "o = '/workspace/output/'\n",
        "open(o + 'a.csv', 'w').write('k,v\\nx,=1+1\\n')\n",
        "os.makedirs(o + 'd')\n",
        "open(o + 'd/c.txt', 'w').write('see')\n",
        "open(o + 'prog.exe', 'w').write('MZ')\n",
    ));
    assert_eq!(v["status"], "ok", "{v}");
    let (made, refused) = listed(&v);
    assert_eq!(made, pairs(&[("a.csv", "created"), ("d/c.txt", "created")]), "{v}");
    assert_eq!(refused, pairs(&[("prog.exe", "extension_not_allowed")]), "{v}");
    let csv = v["artifacts"].as_array().unwrap().iter().find(|a| a["path"] == "a.csv").unwrap().clone();
    assert!(csv["flags"].as_array().unwrap().iter().any(|f| f["kind"] == "formula_injection"), "{csv}");
    assert!(v["session"]["artifacts"].as_str().unwrap().contains("each cell lists"), "{}", v["session"]["artifacts"]);

    // What the caller puts between cells is not the next cell's doing.
    let (w, _) = s.put("put.txt", b"from the caller");
    assert_eq!(w["status"], "written", "{w}");
    let (v, _) = s.exec(concat!(
        "import os\n",
        "open('/workspace/output/a.csv', 'a').write('y,2\\n')\n",
        "os.remove('/workspace/output/d/c.txt')\n",
    ));
    let (made, refused) = listed(&v);
    assert_eq!(made, pairs(&[("a.csv", "modified"), ("d/c.txt", "deleted")]), "{v}");
    assert!(refused.is_empty(), "a refusal the cell did not make is listed again: {v}");
    // The verdict is on the file as the cell left it; a read gives it neutralised.
    let listed_sha = v["artifacts"][0]["sha256"].as_str().unwrap().to_string();
    let (r, _) = s.files("get", "a.csv");
    assert_eq!(r["artifact"]["neutralised"]["original_sha256"], listed_sha.as_str(), "{r}");

    let (v, _) = s.exec("x = 1\n");
    assert_eq!(listed(&v), (vec![], vec![]), "a cell that wrote nothing lists nothing: {v}");

    let out = s.stop();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    drop(pool);
    assert_eq!(std::fs::read(sb.output.join("a.csv")).unwrap(), b"k,v\nx,'=1+1\ny,2\n");
    assert!(!sb.output.join("d/c.txt").exists());
}

#[test]
fn each_cell_lists_the_files_it_made_changed_or_deleted() {
    each_cell_lists_its_files(Door::Start);
}

#[test]
fn a_pooled_sessions_cells_list_their_files_the_same() {
    each_cell_lists_its_files(Door::Pool);
}

#[test]
fn a_cells_files_are_judged_with_the_jail_held_still_while_a_thread_rewrites_them() {
    judged_held_still(Door::Start);
}

#[test]
fn a_pooled_sessions_cells_are_judged_held_still_the_same() {
    judged_held_still(Door::Pool);
}

fn judged_held_still(door: Door) {
    let sb = Sandbox::new();
    let (s, pool) = session(&sb, door);
    // A thread the first cell leaves behind truncates and rewrites a large
    // file as fast as it can, for as long as the session lives: judged
    // while it runs, a file would change between its listing and its read,
    // or under the read.
    const SIZE: usize = 400_000;
    let (v, _) = s.exec(&format!(
        concat!(
            "import threading, time\n",
            "n = 0\n",
            "def churn():\n",
            "    global n\n",
            "    while True:\n",
            "        n += 1\n",
            "        with open('/workspace/output/busy.txt', 'w') as f:\n",
            "            f.write(str(n % 10) * {size})\n",
            "threading.Thread(target=churn, daemon=True).start()\n",
            "time.sleep(0.05)\n",
        ),
        size = SIZE
    ));
    assert_eq!(v["status"], "ok", "{v}");
    let valid: Vec<String> = (0..10)
        .map(|d| jail::digest::sha256_hex(d.to_string().repeat(SIZE).as_bytes()))
        .chain([jail::digest::sha256_hex(b"")])
        .collect();
    let mut seen = 0;
    for i in 0..30 {
        let (v, _) = s.exec("import time; time.sleep(0.01)\n");
        assert_eq!(v["status"], "ok", "{v}");
        let (made, refused) = listed(&v);
        assert!(refused.is_empty(), "cell {i}: judged while it moved: {v}");
        for a in v["artifacts"].as_array().unwrap() {
            assert_eq!(a["path"], "busy.txt", "{v}");
            assert_eq!(a["change"], "modified", "{v}");
            let sha = a["sha256"].as_str().unwrap();
            assert!(valid.iter().any(|h| h == sha), "cell {i}: a sha256 of no state the file was in: {a}");
            assert!(a["bytes"] == SIZE || a["bytes"] == 0, "{a}");
            seen += 1;
        }
        let _ = made;
    }
    assert!(seen > 0, "the file never changed within a cell: the test did not race");
    // The hold let go: the thread still runs.
    let (v, _) = s.exec("a = n; time.sleep(0.1); print(n > a)\n");
    assert_eq!(v["stdout"]["text"], "True\n", "the jail was left held: {v}");
    s.stop();
    drop(pool);
}
