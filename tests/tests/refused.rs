//! Nothing the jail refuses vanishes without a word (issue 32, item 6):
//! whichever door a step came through, the document its caller gets with
//! the verdict names every refused entry and why, exactly as `jail run`
//! does — a pool step, a session's closing (stopped, or ended by itself:
//! a cell that killed its interpreter, an idle timeout), a pooled session.
//! A bound output folder's quarantine reaches the pool's caller too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jail::result::{Disposition, RejectReason};
use jail_tests::*;
use serde_json::{json, Value};

/// What every step leaves: one file the policy accepts, and three entries
/// it refuses (an extension off the allowlist, a link out of the jail, a
/// fifo).
const LEAVE: &str = "import os\n\
open('ok.txt', 'w').write('fine')\n\
open('payload.bin', 'w').write('x')\n\
os.symlink('/etc/passwd', 'passwd.txt')\n\
os.mkfifo('pipe.csv')\n";

/// A cell that ends its session itself, after leaving the same.
const AND_DIE: &str = "os._exit(3)\n";

/// The ways a step's verdict reaches its caller.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Door {
    /// `jail run --json`.
    Run,
    /// `jail session exec`, then `jail session stop`: the closing.
    SessionStopped,
    /// A cell that kills the interpreter, then `jail session stop`: the
    /// closing the session left when it ended.
    SessionDiedInCell,
    /// A cell, then the session's idle timeout, then `jail session stop`.
    SessionIdle,
    /// One `jail pool` request.
    PoolStep,
    /// One `jail pool` request whose code kills the interpreter.
    PoolStepDiedInCell,
    /// `{"op": "session"}` from a pool, a cell, `jail session stop`.
    PoolSession,
}

/// The default policy with a 1 s idle timeout, and `edit` applied.
fn policy(sb: &Sandbox, edit: impl FnOnce(&mut Value)) -> PathBuf {
    policy_with(sb, |v| {
        v["session"]["idle_timeout_secs"] = json!(1.0);
        edit(v);
    })
}

fn closing_of(s: &Session) -> Value {
    let out = s.stop();
    assert!(out.status.success(), "jail session stop: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the closing result is JSON")
}

fn pool_request(sb: &Sandbox, request: Value) -> Value {
    let extra: Vec<&str> = sb.extra_args.iter().map(String::as_str).collect();
    let mut pool = Pool::start(sb, 1, &extra);
    let reply = pool.call(request);
    assert!(pool.finish().success());
    reply
}

/// The document `door` gives its caller with the verdict on what `LEAVE`
/// left, validated against the schema.
fn through(sb: &Sandbox, door: Door) -> RunResult {
    let doc: Value = match door {
        Door::Run => {
            let out = sb.command(LEAVE).output().expect("spawn jail run");
            serde_json::from_slice(&out.stdout).expect("jail run printed a result")
        }
        Door::SessionStopped | Door::SessionDiedInCell | Door::SessionIdle => {
            let s = sb.start_session();
            let code = if door == Door::SessionDiedInCell {
                format!("{LEAVE}{AND_DIE}")
            } else {
                LEAVE.to_string()
            };
            let (cell, _) = s.exec(&code);
            assert!(cell.is_object(), "{door:?}: the cell printed no result");
            if door == Door::SessionIdle {
                let until = Instant::now() + Duration::from_secs(30);
                while s.alive() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                assert!(!s.alive(), "the idle session never ended");
            }
            closing_of(&s)
        }
        Door::PoolStep | Door::PoolStepDiedInCell => {
            let code = if door == Door::PoolStepDiedInCell {
                format!("{LEAVE}{AND_DIE}")
            } else {
                LEAVE.to_string()
            };
            let reply = pool_request(sb, json!({"id": "r", "code": code, "output": sb.output}));
            assert!(reply["error"].is_null(), "{door:?}: {reply}");
            reply["result"].clone()
        }
        Door::PoolSession => {
            let extra: Vec<&str> = sb.extra_args.iter().map(String::as_str).collect();
            let mut pool = Pool::start(sb, 1, &extra);
            let s = pool.session(json!({"id": "s", "op": "session", "output": sb.output}));
            let (cell, _) = s.exec(LEAVE);
            assert!(cell.is_object(), "{door:?}: the cell printed no result");
            let closing = closing_of(&s);
            assert!(pool.finish().success());
            closing
        }
    };
    validate_result(&doc).unwrap_or_else(|e| panic!("{door:?}: the result breaks the schema: {e}\n{doc:#}"));
    serde_json::from_value(doc).expect("the result deserializes")
}

fn refusals(r: &RunResult) -> BTreeMap<String, RejectReason> {
    r.rejected_artifacts.iter().map(|x| (x.path.clone(), x.reason)).collect()
}

fn assert_every_refusal_named(sb: &Sandbox, door: Door, r: &RunResult) {
    let doc = document(r);
    let accepted: Vec<&str> = r.artifacts.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(accepted, ["ok.txt"], "{door:?}: what was accepted\n{doc}");
    let want = BTreeMap::from([
        ("passwd.txt".to_string(), RejectReason::Symlink),
        ("payload.bin".to_string(), RejectReason::ExtensionNotAllowed),
        ("pipe.csv".to_string(), RejectReason::Fifo),
    ]);
    assert_eq!(refusals(r), want, "{door:?}: every refused entry, named with its reason\n{doc}");
    let out = r.output_dir.as_deref().map(PathBuf::from).unwrap_or_else(|| sb.output.clone());
    assert_eq!(host_entries(&out), ["ok.txt"], "{door:?}: the host folder holds what was accepted, no more\n{doc}");
}

fn host_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn check(door: Door) {
    let mut sb = Sandbox::new();
    let p = policy(&sb, |_| {});
    sb.extra_args.extend(["--policy".to_string(), p.display().to_string()]);
    let r = through(&sb, door);
    assert_every_refusal_named(&sb, door, &r);
}

#[test]
fn jail_run_names_every_refused_entry() {
    check(Door::Run);
}

#[test]
fn a_stopped_sessions_closing_names_every_refused_entry() {
    check(Door::SessionStopped);
}

#[test]
fn a_session_whose_cell_killed_it_leaves_stop_a_closing_naming_every_refused_entry() {
    check(Door::SessionDiedInCell);
}

#[test]
fn an_idle_sessions_closing_names_every_refused_entry() {
    check(Door::SessionIdle);
}

#[test]
fn a_pool_step_names_every_refused_entry() {
    check(Door::PoolStep);
}

#[test]
fn a_pool_step_that_kills_its_interpreter_names_every_refused_entry() {
    check(Door::PoolStepDiedInCell);
}

#[test]
fn a_pooled_sessions_closing_names_every_refused_entry() {
    check(Door::PoolSession);
}

/// A bound output folder (`output_size: "unlimited"`): the script wrote
/// the host folder itself, so its refused entries are moved into a
/// quarantine folder beside it. A pool's jail has its folder in a slot the
/// pool removes: the quarantine follows the output to the caller, and
/// every `moved_to` names where its entry is now.
#[test]
fn a_pool_steps_quarantine_reaches_its_caller_with_every_entry_where_the_result_says() {
    for door in [Door::Run, Door::PoolStep] {
        let mut sb = Sandbox::new();
        let p = policy(&sb, |v| v["filesystem"]["output_size"] = json!("unlimited"));
        sb.extra_args.extend(["--policy".to_string(), p.display().to_string()]);
        let r = through(&sb, door);
        let doc = document(&r);
        assert_eq!(refusals(&r).into_keys().collect::<Vec<_>>(), ["passwd.txt", "payload.bin", "pipe.csv"], "{door:?}\n{doc}");
        let q = PathBuf::from(r.quarantine_dir.as_deref().unwrap_or_else(|| panic!("{door:?}: no quarantine\n{doc}")));
        assert!(q.is_dir(), "{door:?}: the quarantine folder {} is not there\n{doc}", q.display());
        for x in &r.rejected_artifacts {
            assert_eq!(x.disposition, Disposition::Quarantined, "{door:?}\n{doc}");
            let at = PathBuf::from(x.moved_to.as_deref().unwrap());
            assert!(at.starts_with(&q), "{door:?}: {} is outside the quarantine\n{doc}", at.display());
            assert!(std::fs::symlink_metadata(&at).is_ok(), "{door:?}: {} is gone\n{doc}", at.display());
        }
        let out = PathBuf::from(r.output_dir.as_deref().unwrap());
        assert_eq!(host_entries(&out), ["ok.txt"], "{door:?}\n{doc}");
    }
}
