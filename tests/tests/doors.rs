//! Every door takes a caller's path the one way (jail/src/accept.rs): the
//! same link tricks (jail_tests::tricks), driven through each door of the
//! jail — `jail run`, `jail session start`, a pool's `run` and `session`
//! requests — as root and as an ordinary user (issue 32). The MCP
//! server's staging and the agent's input copy and export are tried with
//! the same tricks in tests/fronts/tests/front_doors.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

use jail_tests::tricks::*;
use jail_tests::*;
use serde_json::{json, Value};

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
    let s = Session::started(&out);
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
            // The caller's to fix: bad_request, as a refused path is, never
            // the pool's own failure (a 500 behind a service).
            Taken::Refused(why) => tree
                .check(why.contains("hard: a file with 2 names") && why.contains(r#""code":"bad_request""#), || {
                    format!("pool {op}: {why}")
                }),
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
        (Taken::Refused(why), true) => {
            tree.check(why.contains("private600.txt") && why.contains(r#""code":"bad_request""#), || why.clone())
        }
        (Taken::Ran(text), false) => tree.check(text.contains("a,b"), || text.clone()),
        (other, _) => tree.check(false, || format!("pool run, an input with a 0600 file: {other:?}")),
    }
    drop(pool.stdin.take());
    assert!(pool.child.wait().expect("wait for the pool").success());
    tree.done();
}
