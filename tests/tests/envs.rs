//! The variables a caller sets (jail/src/envs.rs), through each door of the
//! jail: `jail run` (`--env`, and `--env-fd` as the shared client writes
//! it), `jail session start` and `exec`, a pool's `run` and `session`
//! requests. Each door gives the code exactly what was set, a cell's own
//! go back when it ends, and every door refuses the names the jail keeps
//! (`JAIL_*`, `PYTHON*`, `LD_*`, the proxy variables) before anything runs.
//! The service and the MCP server are tried in tests/fronts.

use std::io::Write;
use std::process::{Command, Stdio};

use jail::client::command::{Mode, RunSpec, Script};
use jail::envs::Envs;
use jail_tests::*;
use serde_json::{json, Value};

/// Prints the variables it is asked about (`null` when unset), and whether
/// the one only `jail` itself had came through.
const SHOW: &str = r#"
import json, os
print(json.dumps({k: os.environ.get(k) for k in ["A", "SECRET", "S", "C", "HOST_ONLY"]}))
"#;

fn shown(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not the probe's JSON ({e}): {text:?}"))
}

fn want(pairs: &[(&str, &str)]) -> Value {
    let mut v = json!({"A": null, "SECRET": null, "S": null, "C": null, "HOST_ONLY": null});
    for (k, val) in pairs {
        v[*k] = json!(val);
    }
    v
}

#[test]
fn jail_run_gives_the_code_what_env_and_env_fd_set_and_nothing_of_its_own_environment() {
    let sb = Sandbox::new();
    // --env on the command line.
    let mut cmd = sb.command(SHOW);
    cmd.args(["--env", "A=1"]).env("HOST_ONLY", "leak");
    let out = cmd.output().unwrap();
    let r = parse(&out);
    assert_eq!(shown(&r.stdout.text), want(&[("A", "1")]), "{}", document(&r));
    // The shared client: the values on a pipe (--env-fd 0), none on the
    // command line.
    let script = sb.script(SHOW);
    let mut spec = RunSpec::new(jail_bin(), Mode::Json, Script::File(script), std::time::Duration::from_secs(30));
    spec.flags.rootfs = Some(sb.rootfs.clone());
    spec.envs = Envs::from_pairs(["SECRET=s3cr3t", "A=2"]).unwrap();
    spec.env.push(("HOST_ONLY".into(), "leak".into()));
    let argv = jail::client::command::argv(&spec);
    assert!(!argv.iter().any(|a| a.to_string_lossy().contains("s3cr3t")), "{argv:?}");
    let r = jail::client::run::spawn(&spec).unwrap().wait(|_| {}).unwrap();
    assert_eq!(shown(&r.stdout.text), want(&[("A", "2"), ("SECRET", "s3cr3t")]), "{}", document(&r));
}

#[test]
fn a_sessions_variables_hold_for_every_cell_and_a_cells_own_go_back_when_it_ends() {
    let sb = Sandbox::new();
    let mut start = sb.session_command();
    start.args(["--env-fd", "0"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = start.spawn().unwrap();
    child.stdin.take().unwrap().write_all(br#"{"S":"session"}"#).unwrap();
    let s = Session::started(&child.wait_with_output().unwrap());
    let cell = |env: &[&str]| {
        let mut c = Command::new(jail_bin());
        c.args(["session", "exec"]);
        for e in env {
            c.args(["--env", e]);
        }
        let file = sb.script(SHOW);
        let out = c.arg(&s.handle).arg(file).output().unwrap();
        shown(&parse(&out).stdout.text)
    };
    assert_eq!(cell(&["C=cell", "S=over"]), want(&[("S", "over"), ("C", "cell")]));
    assert_eq!(cell(&[]), want(&[("S", "session")]), "a cell's variables outlived it");
    // Refused before the cell runs; the session lives on.
    let mut c = Command::new(jail_bin());
    let out = c
        .args(["session", "exec", "--env", "PYTHONPATH=/tmp"])
        .arg(&s.handle)
        .arg(sb.script(SHOW))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PYTHONPATH"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(cell(&[]), want(&[("S", "session")]));
    s.stop();
}

#[test]
fn a_pools_run_and_session_give_their_variables_and_its_next_jail_has_none() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    let r = pool.call(json!({"id": "r1", "code": SHOW, "env": {"A": "run", "SECRET": "x"}}));
    assert_eq!(shown(r["result"]["stdout"]["text"].as_str().unwrap()), want(&[("A", "run"), ("SECRET", "x")]), "{r}");
    let r = pool.call(json!({"id": "r2", "code": SHOW}));
    assert_eq!(shown(r["result"]["stdout"]["text"].as_str().unwrap()), want(&[]), "{r}");
    let out = sb.dir.path().join("session-out");
    let h = pool.call(json!({"id": "s1", "op": "session", "output": out, "env": {"S": "pooled"}}));
    let handle = h["session"]["handle"].as_str().unwrap_or_else(|| panic!("no session: {h}")).to_owned();
    let s = Session {
        handle: handle.into(),
        pid: h["session"]["pid"].as_u64().unwrap() as u32,
        id: String::new(),
    };
    let (first, _) = s.exec(SHOW);
    assert_eq!(shown(first["stdout"]["text"].as_str().unwrap()), want(&[("S", "pooled")]), "{first}");
    s.stop();
    assert!(pool.finish().success());
}

/// Every door refuses a name the jail keeps, or one that is no name, with
/// the door's own error, before anything runs.
#[test]
fn every_door_refuses_the_names_the_jail_keeps_before_anything_runs() {
    let sb = Sandbox::new();
    let ran = sb.output.join("ran");
    let code = format!("open({:?}, 'w').write('x')", "/workspace/output/ran");
    for bad in [
        "LD_PRELOAD=/tmp/x.so",
        "JAIL_PRELOAD=os",
        "PYTHONSTARTUP=/x",
        "HTTPS_PROXY=http://evil",
        "1A=x",
        "A-B=x",
    ] {
        let name = bad.split('=').next().unwrap();
        let out = sb.command(&code).args(["--env", bad]).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "run {bad}: {said}");
        assert!(said.contains(name), "run {bad}: {said}");
        let out = sb.session_command().args(["--env", bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(125), "session start {bad}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!ran.exists(), "{bad} ran");
    }
    let mut pool = Pool::start(&sb, 1, &[]);
    for (i, env) in [
        json!({"LD_PRELOAD": "/x.so"}),
        json!({"JAIL_PRELOAD": "os"}),
        json!({"no name": "x"}),
    ]
    .iter()
    .enumerate()
    {
        for op in ["run", "session"] {
            let mut req = json!({"id": format!("{op}{i}"), "env": env});
            if op == "run" {
                req["code"] = json!(code);
            } else {
                req["op"] = json!("session");
            }
            let r = pool.call(req);
            assert_eq!(r["error"]["code"], "bad_request", "{op} {env}: {r}");
            assert!(r["error"]["message"].as_str().unwrap().contains("env"), "{op} {env}: {r}");
        }
    }
    assert!(pool.finish().success());
    assert!(!ran.exists(), "a refused request ran");
}
