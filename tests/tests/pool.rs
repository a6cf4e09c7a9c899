//! `jail pool` (issue 18 item 2), from outside and from inside: a pooled
//! jail takes one request and is never used again, the preload runs before
//! any request's code, a request's folders reach it read-only (input) and
//! back (output) without a link followed, bad lines get protocol errors
//! and the pool keeps serving, and SIGKILL or SIGTERM of the pool leaves
//! nothing behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jail_tests::*;
use serde_json::{json, Value};

fn result(reply: &Value) -> &Value {
    assert!(reply["error"].is_null(), "an error reply: {reply}");
    let r = &reply["result"];
    validate_result(r).unwrap_or_else(|e| panic!("the reply's result breaks the schema: {e}\n{r}"));
    r
}

fn stdout_json(r: &Value) -> Value {
    let text = r["stdout"]["text"].as_str().unwrap_or("");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {r}"))
}

/// No process, mount, session file or pool folder of this sandbox is left.
fn assert_pool_gone(sb: &Sandbox, pool_tmp: &Path) {
    let marker = sb.dir.path().display().to_string();
    let leftovers = || -> Vec<String> {
        let mut left: Vec<String> = host_processes_with(&marker).iter().map(|p| format!("process {p}")).collect();
        left.extend(host_mounts_with(&marker));
        for e in std::fs::read_dir(pool_tmp).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("jail-pool-") {
                left.push(format!("pool folder {name}"));
            }
        }
        for e in std::fs::read_dir(sb.session_dir()).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".ended") {
                left.push(format!("session file {name}"));
            }
        }
        left
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !leftovers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(leftovers(), Vec::<String>::new(), "the pool left something behind");
}

/// A `stats` answer's refill times and ready jails' memory: every figure
/// there and a number, the refill's median at most its p99, a ready
/// jail's unique memory at most its proportional (a page of its own counts
/// whole in both). Asked with a jail ready, so at least one was made.
fn assert_stats_figures(reply: &Value) {
    let s = &reply["stats"];
    let refill = &s["refill_ms"];
    let ms = |k: &str| refill[k].as_f64().unwrap_or_else(|| panic!("refill_ms.{k} is not a number: {reply}"));
    let (last, mean, median, p99) = (ms("last"), ms("mean"), ms("median"), ms("p99"));
    assert!(last > 0.0 && mean > 0.0 && median > 0.0, "{reply}");
    assert!(median <= p99, "the refill's median above its p99: {reply}");
    let idle = &s["idle"];
    let bytes = |k: &str| idle[k].as_u64().unwrap_or_else(|| panic!("idle.{k} is not a number: {reply}"));
    assert!(bytes("uss_bytes") > 0 && bytes("uss_bytes") <= bytes("pss_bytes"), "{reply}");
    assert!(bytes("pss_bytes") <= bytes("rss_bytes"), "{reply}");
}

#[test]
fn a_pooled_jail_takes_one_request_and_the_next_sees_nothing_of_it() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    let marker = format!("pool-canary-{}", std::process::id());
    let first = pool.call(json!({"id": "a", "code": format!(
        "import json, os, subprocess\nsecret = '{marker}'\nopen('/tmp/canary', 'w').write(secret)\n\
         subprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\n\
         print(json.dumps({{'boot': open('/proc/sys/kernel/random/boot_id').read(), 'ns': os.readlink('/proc/self/ns/pid'),\
         'mnt': os.readlink('/proc/self/ns/mnt')}}))\n"
    )}));
    let a = result(&first);
    assert_eq!(a["status"], "ok", "{a}");
    stdout_json(a);
    let second = pool.call(json!({"id": "b", "code":
        "import json, os\nprint(json.dumps({'vars': sorted(k for k in globals() if not k.startswith('__') and k not in ('json', 'os')), \
         'tmp': os.listdir('/tmp'), 'ns': os.readlink('/proc/self/ns/pid'), 'mnt': os.readlink('/proc/self/ns/mnt'), \
         'cmdlines': [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in os.listdir('/proc') if p.isdigit()]}))\n"
    }));
    let b = result(&second);
    assert_eq!(b["status"], "ok", "{b}");
    let seen_b = stdout_json(b);
    assert_eq!(seen_b["vars"], json!([]), "a request's globals reached the next: {seen_b}");
    assert_eq!(seen_b["tmp"], json!([]), "a request's /tmp reached the next: {seen_b}");
    assert!(!seen_b["cmdlines"].to_string().contains(&marker), "a request's process reached the next: {seen_b}");
    // Not the same jail: the first one's /tmp, globals and process are not
    // there (above), and its process is gone from the host (below). Its
    // namespace ids prove nothing: they are inode numbers, and the kernel
    // reuses the first jail's, destroyed by then, for the second.
    assert!(host_processes_with(&marker).is_empty(), "the first request's process outlived its jail");
    // The first jail and the two that replaced the used ones: three refills.
    pool.wait_ready(1);
    assert_stats_figures(&pool.call(json!({"op": "stats", "id": "s"})));
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn a_requests_input_is_read_only_inside_and_no_link_in_it_is_followed() {
    let sb = Sandbox::new();
    sb.input_file("data.csv", b"x,y\n1,2\n");
    // A host file outside the input, and a link to it inside.
    let outside = sb.dir.path().join("host-secret");
    std::fs::write(&outside, "host-secret-text").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&outside, sb.input.join("link")).unwrap();
    let mut pool = Pool::start(&sb, 1, &[]);
    let out = sb.dir.path().join("tmp/step-out");
    let reply = pool.call(json!({"id": "r", "input": sb.input, "output": out, "args": ["one"], "code":
        "import json, os, sys\nres = {'argv': sys.argv, 'data': open('/workspace/input/data.csv').read()}\n\
         try:\n    open('/workspace/input/data.csv', 'a').write('z')\n    res['write'] = 'allowed'\n\
         except OSError as e:\n    res['write'] = e.errno\n\
         try:\n    res['link'] = open('/workspace/input/link').read()\nexcept OSError as e:\n    res['link'] = e.errno\n\
         open('/workspace/output/report.txt', 'w').write('done')\nprint(json.dumps(res))\n"
    }));
    let r = result(&reply);
    assert_eq!(r["status"], "ok", "{r}");
    let seen = stdout_json(r);
    assert_eq!(seen["argv"], json!(["-c", "one"]));
    assert_eq!(seen["data"], "x,y\n1,2\n");
    assert_ne!(seen["write"], "allowed", "the input was writable: {seen}");
    assert_ne!(seen["link"], "host-secret-text", "a link in the input reached a host file: {seen}");
    assert_eq!(std::fs::read_to_string(sb.input.join("data.csv")).unwrap(), "x,y\n1,2\n");
    assert_eq!(r["output_dir"], out.display().to_string());
    assert_eq!(std::fs::read_to_string(out.join("report.txt")).unwrap(), "done");
    let paths: Vec<&str> = r["artifacts"].as_array().unwrap().iter().filter_map(|a| a["path"].as_str()).collect();
    assert_eq!(paths, ["report.txt"], "{r}");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn the_preload_runs_before_the_request_and_leaves_no_name() {
    let sb = Sandbox::new();
    let policy = policy_with_preload(&sb, json!(["json", "csv", "xml.dom.minidom"]));
    let mut pool = Pool::start(&sb, 1, &["--policy", policy.to_str().unwrap()]);
    let reply = pool.call(json!({"id": "p", "code":
        "import json, sys\nprint(json.dumps({'loaded': all(m in sys.modules for m in ['csv', 'xml.dom.minidom']), \
         'vars': sorted(k for k in globals() if not k.startswith('__') and k not in ('json', 'sys'))}))\n"}));
    let seen = stdout_json(result(&reply));
    assert_eq!(seen, json!({"loaded": true, "vars": []}));
    assert!(pool.finish().success());
}

#[test]
fn a_preload_the_rootfs_cannot_import_is_one_line_and_exit_125_with_nothing_left() {
    let sb = Sandbox::new();
    let policy = policy_with_preload(&sb, json!(["no_such_module_here"]));
    let pool = Pool::start(&sb, 2, &["--policy", policy.to_str().unwrap()]);
    let out = pool.child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert_pool_gone(&sb, &sb.pool_tmp());
}

fn policy_with_preload(sb: &Sandbox, preload: Value) -> PathBuf {
    policy_with(sb, |v| v["preload"] = preload)
}

#[test]
fn bad_lines_get_protocol_errors_and_the_pool_keeps_serving() {
    let sb = Sandbox::new();
    let full = sb.dir.path().join("tmp/full");
    let mut pool = Pool::start(&sb, 1, &["--timeout", "20"]);
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(full.join("x"), "").unwrap();
    for (line, code) in [
        ("not json".to_string(), "malformed"),
        (r#"{"id":"u","code":"1","shell":true}"#.to_string(), "unknown_field"),
        (r#"{"id":"l","code":"1","limits":{"wall_time_secs":21}}"#.to_string(), "limit_above_policy"),
        (r#"{"id":"c","code":"1","limits":{"cpu_time_secs":1}}"#.to_string(), "unknown_field"),
        (json!({"id": "o", "code": "1", "output": full}).to_string(), "bad_request"),
        (r#"{"id":"i","code":"1","input":"/no/such/dir"}"#.to_string(), "bad_request"),
        (r#"{"id":"s","script":"/no/such.py"}"#.to_string(), "bad_request"),
    ] {
        pool.send(&line);
        let r = pool.reply();
        assert_eq!(r["error"]["code"], code, "{line}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(!msg.is_empty() && !msg.contains('\n'), "{line}: {r}");
    }
    // A line over the protocol's 4 MiB: refused, and the next line is read.
    pool.send(&format!(r#"{{"id":"big","code":"{}"}}"#, "x".repeat(5 << 20)));
    let big = pool.reply();
    assert_eq!(big["error"]["code"], "malformed", "{big}");
    // A duplicate id while the first is in flight.
    pool.send(r#"{"id":"d","code":"import time; time.sleep(1.5); print('first')"}"#);
    std::thread::sleep(Duration::from_millis(300));
    pool.send(r#"{"id":"d","code":"print('second')"}"#);
    let dup = pool.reply();
    assert_eq!(dup["error"]["code"], "duplicate_id", "{dup}");
    let first = pool.reply();
    assert_eq!(result(&first)["stdout"]["text"], "first\n");
    // A request's own wall limit, lower than the pool's.
    let slow = pool.call(json!({"id": "w", "code": "import time; time.sleep(10)", "limits": {"wall_time_secs": 0.5}}));
    assert_eq!(result(&slow)["status"], "timeout_wall", "{slow}");
    let ok = pool.call(json!({"id": "k", "code": "print(6 * 7)"}));
    assert_eq!(result(&ok)["stdout"]["text"], "42\n");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

/// A pool's run past its time ends within its time plus the grace: the
/// jail is destroyed after the step, so nothing is kept by waiting, and
/// its grace is the wall clock's (a session cell's counts once its
/// interpreter ran: up to ten graces for one that sleeps while ignoring
/// its KeyboardInterrupt, session/grace.rs). Without the step's mark it
/// took the ten graces: 1 + 20 s here.
#[test]
fn a_pool_run_that_ignores_its_interrupt_ends_within_its_time_and_the_grace() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    pool.wait_ready(1);
    let deaf = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.1)\n";
    let began = Instant::now();
    let r = pool.call(json!({"id": "deaf", "code": deaf, "limits": {"wall_time_secs": 1}}));
    let took = began.elapsed();
    assert_eq!(result(&r)["status"], "timeout_wall", "{r}");
    // 1 s, the default grace of 2 s, and room for a loaded host's closing;
    // far under the 21 s of a session cell's ceiling.
    assert!(took < Duration::from_secs(13), "the run took {took:?}: {r}");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn sigkill_of_the_pool_leaves_no_process_mount_or_folder() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 2, &[]);
    pool.wait_ready(2);
    // A request in flight too.
    pool.send(r#"{"id":"x","code":"import time; time.sleep(30)"}"#);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!host_processes_with(&sb.dir.path().display().to_string()).is_empty(), "no pooled jail to kill");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pool.child.id() as i32), nix::sys::signal::Signal::SIGKILL);
    let _ = pool.child.wait();
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_then_leaves_nothing() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    // Requests are read once the first jail is made: under load that can
    // take longer than the pause below, and the SIGTERM would come first.
    pool.wait_ready(1);
    pool.send(r#"{"id":"t","code":"import time; time.sleep(1); print('finished')"}"#);
    std::thread::sleep(Duration::from_millis(300));
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pool.child.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let r = pool.reply();
    assert_eq!(result(&r)["stdout"]["text"], "finished\n", "{r}");
    let status = pool.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_pool_gone(&sb, &sb.pool_tmp());
}

/// Gone, or a zombie its new parent has yet to reap.
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// The next line that is not a live event (a step asked with `events`
/// streams its chunks before its reply).
fn answer(pool: &Pool) -> Value {
    loop {
        let line = pool.reply();
        if line["event"].is_null() {
            return line;
        }
    }
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

#[test]
fn a_cancelled_step_ends_at_once_as_cancelled_its_jail_gone_and_the_pool_keeps_serving() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    let _guard = KillOnPanic(pool.child.id());
    pool.wait_ready(1);
    let marker = format!("pool-cancel-canary-{}", std::process::id());
    let code = format!(
        "import subprocess, time\nsubprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\n\
         print('started', flush=True)\ntime.sleep(60)\n"
    );
    pool.send(&json!({"id": "long", "events": true, "code": code}).to_string());
    let first = pool.reply();
    // Live and unbuffered: the newline may come as a chunk of its own.
    assert_eq!(first["id"], "long", "{first}");
    assert!(first["event"]["data"].as_str().is_some_and(|d| d.starts_with("started")), "{first}");
    let until = Instant::now() + Duration::from_secs(10);
    while host_processes_with(&marker).is_empty() {
        assert!(Instant::now() < until, "the step's own process never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The claimed jail: its session supervisor (and janitor) and what runs in it.
    let jail = host_processes_with(&sb.dir.path().display().to_string());
    let supervisors: Vec<u32> = jail.iter().copied().filter(|p| cmdline(*p).contains("session start")).collect();
    assert!(!supervisors.is_empty(), "no session supervisor among {jail:?}");
    let asked = Instant::now();
    pool.send(r#"{"op":"cancel","id":"long"}"#);
    let reply = answer(&pool);
    let took = asked.elapsed();
    assert_eq!(reply["id"], "long", "the cancel has no line of its own: {reply}");
    let r = result(&reply);
    assert_eq!(r["status"], "cancelled", "{r}");
    assert_eq!(r["supervisor"]["cancelled_by"], "pool_caller", "{r}");
    assert_eq!((&r["artifacts"], &r["output_dir"]), (&json!([]), &Value::Null), "{r}");
    eprintln!("cancelled step answered {took:?} after the cancel");
    assert!(took < Duration::from_secs(1), "the cancelled step took {took:?} to end");
    // Gone when the reply came: the jail's processes, the step's own, its cgroups.
    assert!(host_processes_with(&marker).is_empty(), "the step's process outlived the cancel");
    let left: Vec<u32> = jail.iter().copied().filter(|p| !is_gone(*p)).collect();
    assert_eq!(
        left,
        Vec::<u32>::new(),
        "a process of the cancelled jail is left: {:?}",
        left.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
    );
    for s in &supervisors {
        assert_eq!(cgroups_left_by(*s), Vec::<PathBuf>::new(), "the cancelled jail left a cgroup");
    }
    // A finished or unknown id: an error line naming it, and nothing else.
    for id in ["long", "never-sent"] {
        pool.send(&json!({"op": "cancel", "id": id}).to_string());
        let e = answer(&pool);
        assert_eq!((&e["id"], &e["error"]["code"]), (&json!(id), &json!("unknown_id")), "{e}");
    }
    pool.send(r#"{"op":"cancel","id":"x","code":"1"}"#);
    assert_eq!(answer(&pool)["error"]["code"], "bad_request");
    // The pool keeps serving, on a fresh jail.
    let next = pool.call(json!({"id": "next", "code": "print('next')"}));
    assert_eq!(result(&next)["stdout"]["text"], "next\n", "{next}");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn a_request_cancelled_while_it_waits_for_a_jail_gets_one_error_and_runs_nothing() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    let _guard = KillOnPanic(pool.child.id());
    pool.wait_ready(1);
    let out = sb.dir.path().join("tmp/waited-out");
    pool.send(r#"{"id":"busy","events":true,"code":"import time; print('busy', flush=True); time.sleep(60)"}"#);
    let first = pool.reply();
    assert!(first["event"]["data"].as_str().is_some_and(|d| d.starts_with("busy")), "the only jail is taken: {first}");
    // The cancel right behind it: the request is still waiting for the
    // jail being made for it.
    let waits = json!({"id": "waits", "output": out, "code": "open('/workspace/output/ran', 'w').write('x')"});
    pool.send(&format!("{waits}\n{}", r#"{"op":"cancel","id":"waits"}"#));
    let e = answer(&pool);
    assert_eq!((&e["id"], &e["error"]["code"]), (&json!("waits"), &json!("cancelled")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("nothing ran"), "{e}");
    assert!(!out.exists(), "the cancelled request's output was made: it ran");
    pool.send(r#"{"op":"cancel","id":"busy"}"#);
    let r = answer(&pool);
    assert_eq!((&r["id"], &result(&r)["status"]), (&json!("busy"), &json!("cancelled")), "{r}");
    // Each got exactly one reply: the next line is the next request's.
    let next = pool.call(json!({"id": "next", "code": "print(1)"}));
    assert_eq!(result(&next)["status"], "ok");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

/// SIGKILL for a process when the test fails.
struct KillOnPanic(u32);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0 as i32), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Two requests for one jail and the drain right behind them (the end of
/// stdin, or SIGTERM): the second waits for a jail the drain must still
/// make. Both are answered, then the pool exits 0 leaving nothing.
#[test]
fn requests_taken_before_the_drain_are_all_answered_then_the_pool_exits_leaving_nothing() {
    for how in ["end of stdin", "SIGTERM"] {
        let sb = Sandbox::new();
        let mut pool = Pool::start(&sb, 1, &[]);
        // A pool that hangs must not outlive a failed test.
        let _guard = KillOnPanic(pool.child.id());
        pool.wait_ready(1);
        let (a, b) = (json!({"id": "a", "code": "print('a')"}), json!({"id": "b", "code": "print('b')"}));
        pool.send(&format!("{a}\n{b}"));
        if how == "SIGTERM" {
            // Both lines read before the signal: the pool reads them at once.
            std::thread::sleep(Duration::from_millis(100));
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pool.child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        } else {
            drop(pool.stdin.take());
        }
        let mut said = std::collections::BTreeMap::new();
        for _ in 0..2 {
            let r = pool
                .reply_within(Duration::from_secs(30))
                .unwrap_or_else(|| panic!("{how}: a request was never answered: {said:?}"));
            said.insert(r["id"].as_str().unwrap_or("?").to_string(), result(&r)["stdout"]["text"].clone());
        }
        assert_eq!(said, [("a".to_string(), json!("a\n")), ("b".to_string(), json!("b\n"))].into(), "{how}");
        let until = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = pool.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < until, "{how}: the pool never exited");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{how}: {status:?}");
        assert_pool_gone(&sb, &sb.pool_tmp());
    }
}

#[test]
fn a_step_asked_with_events_streams_its_output_before_the_reply_in_order_and_capped() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    pool.wait_ready(1);
    // No flush before the sleep: the step's streams are live.
    let code = "import sys, time\nprint('early')\ntime.sleep(1.5)\nfor i in range(50000):\n    print(i)\n\
                sys.stderr.write('e' * (2 << 20))\nopen('/workspace/output/r.txt', 'w').write('done')\n";
    pool.send(&json!({"id": "e", "events": true, "code": code}).to_string());
    let first = pool.reply();
    let first_at = Instant::now();
    let mut lines = vec![first];
    while lines.last().unwrap()["result"].is_null() && lines.last().unwrap()["error"].is_null() {
        lines.push(pool.reply());
    }
    let replied_at = Instant::now();
    assert!(lines.iter().all(|l| l["id"] == "e"), "a line of another request");
    let reply = lines.pop().unwrap();
    let r = result(&reply);
    let events: Vec<&Value> = lines.iter().map(|l| &l["event"]).collect();
    assert_eq!(events[0]["type"], "stdout", "{}", events[0]);
    assert!(events[0]["data"].as_str().unwrap().starts_with("early"), "{}", events[0]);
    assert!(replied_at - first_at > Duration::from_secs(1), "the first event came with the reply, not before it");
    let text =
        |kind: &str| -> String { events.iter().filter(|e| e["type"] == kind).map(|e| e["data"].as_str().unwrap()).collect() };
    let want: String = std::iter::once("early\n".to_string()).chain((0..50000).map(|i| format!("{i}\n"))).collect();
    assert_eq!(text("stdout"), want, "stdout out of order or incomplete");
    let cut: Vec<&&Value> = events.iter().filter(|e| e["type"] == "truncated").collect();
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!((cut[0]["stream"].as_str(), cut[0]["limit_bytes"].as_u64()), (Some("stderr"), Some(1 << 20)));
    assert_eq!(text("stderr").len(), 1 << 20);
    // The artifacts, judged once the jail is stopped, after the last chunk.
    let first_artifact = events.iter().position(|e| e["type"] == "artifact").expect("an artifact event");
    assert!(events[first_artifact..].iter().all(|e| e["type"] == "artifact"), "a chunk after an artifact");
    let paths: Vec<&str> = events[first_artifact..].iter().filter_map(|e| e["artifact"]["path"].as_str()).collect();
    assert_eq!(paths, ["r.txt"]);
    assert_eq!(r["artifacts"][0]["path"], "r.txt");
    assert_eq!(r["status"], "output_limit", "{r}");
    // Without "events", only the reply.
    let plain = pool.call(json!({"id": "p", "code": "print('quiet')"}));
    assert_eq!(result(&plain)["stdout"]["text"], "quiet\n");
    assert!(plain["event"].is_null());
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn a_pool_asked_for_more_jails_than_memory_holds_is_refused_in_one_line_and_leaves_nothing() {
    let sb = Sandbox::new();
    // 64 jails of 4 TiB each: no machine this runs on has 256 TiB.
    let mut pool = Pool::start(&sb, 64, &["--memory", "4T"]);
    // No request: a pool that did start would end at the end of its stdin.
    drop(pool.stdin.take());
    let out = pool.child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert_pool_gone(&sb, &sb.pool_tmp());
    assert_eq!(std::fs::read_dir(sb.pool_tmp()).unwrap().count(), 0, "the pool left something in its TMPDIR");
}

/// The memory cgroup hierarchy's folder of this process, on a host with
/// the memory controller on cgroup v1 (a hybrid host) or v2: where a child
/// cgroup with a memory limit can be made, and the limit file's name.
fn own_memory_cgroup() -> Option<(PathBuf, &'static str)> {
    let layout = jail::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let me = jail::cgroup::parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap());
    if let Some(h) = layout.v1.iter().find(|h| h.controllers.iter().any(|c| c == "memory")) {
        let rel = me.v1.get("memory")?.strip_prefix(&h.root).ok()?.to_path_buf();
        return Some((h.mount.join(rel), "memory.limit_in_bytes"));
    }
    let (mount, root) = layout.unified?;
    let dir = mount.join(me.unified?.strip_prefix(&root).ok()?);
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    enabled.split_whitespace().any(|c| c == "memory").then_some((dir, "memory.max"))
}

#[test]
fn the_memory_limit_of_the_pools_own_cgroup_bounds_its_size() {
    if only_as_root("makes a memory cgroup for the pool") {
        return;
    }
    let Some((own, limit_file)) = own_memory_cgroup() else {
        return skip("no memory cgroup this test can make a child in (cgroup v1 memory, or v2 with memory delegated)");
    };
    let sb = Sandbox::new();
    let cg = own.join(format!("jail-pool-memtest-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    std::fs::write(cg.join(limit_file), (1u64 << 30).to_string()).unwrap();
    // The pool runs in that cgroup: 1 GiB holds 4 jails of 256 MiB.
    let in_cgroup = |size: &str| {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&cg)
            .arg(jail_bin())
            .args(["pool", "--size", size, "--memory", "256M", "--rootfs"])
            .arg(&sb.rootfs)
            .env("TMPDIR", sb.pool_tmp())
            .env("XDG_RUNTIME_DIR", sb.runtime_dir());
        cmd
    };
    std::fs::create_dir_all(sb.pool_tmp()).unwrap();
    let refused = in_cgroup("8").stdin(std::process::Stdio::null()).output().unwrap();
    let stats = in_cgroup("2")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"{\"op\":\"stats\"}\n")?;
            child.wait_with_output()
        })
        .unwrap();
    assert_pool_gone(&sb, &sb.pool_tmp());
    // The pool's janitor, in that cgroup too, outlives the pool by a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let removed = loop {
        match std::fs::remove_dir(&cg) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            done => break done,
        }
    };
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(125), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(
        err.contains("--size 8 needs 8 x 256 MiB (memory limit) = 2 GiB, more than the 1 GiB available")
            && err.contains(limit_file)
            && err.contains("the largest size that fits is 4: give --size 4 or less, or a lower --memory"),
        "{err}"
    );
    let reply: Value = serde_json::from_slice(&stats.stdout).unwrap_or_else(|e| panic!("{e}: {stats:?}"));
    assert_eq!(reply["stats"]["available_memory_bytes"], 1u64 << 30, "{reply}");
    assert_eq!(reply["stats"]["max_size"], 4, "{reply}");
    // Asked at once: the first jail, made before any request is read, is
    // ready.
    assert_stats_figures(&reply);
    removed.unwrap_or_else(|e| panic!("the test cgroup {} is not empty after the pool: {e}", cg.display()));
}

fn closing(s: &Session) -> Value {
    let out = s.stop();
    assert!(out.status.success(), "jail session stop: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    validate_result(&v).unwrap_or_else(|e| panic!("the closing result breaks the schema: {e}"));
    v
}

/// The session has ended and left nothing: no supervisor, no process with
/// `marker`, no cgroup.
fn assert_session_ended(s: &Session, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (s.alive() || !host_processes_with(marker).is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!s.alive(), "the session supervisor {} is still there", s.pid);
    assert_eq!(host_processes_with(marker), Vec::<u32>::new(), "a process of the session survived it");
    assert_eq!(cgroups_left_by(s.pid), Vec::<PathBuf>::new(), "the session's cgroup was left behind");
}

#[test]
fn a_pool_session_keeps_its_state_across_cells_and_starts_with_the_preload_imported() {
    let sb = Sandbox::new();
    sb.input_file("data.csv", b"x,y\n1,2\n");
    let policy = policy_with_preload(&sb, json!(["csv", "xml.dom.minidom"]));
    let mut pool = Pool::start(&sb, 1, &["--policy", policy.to_str().unwrap()]);
    let s = pool.session(json!({"id": "s1", "op": "session", "input": sb.input}));
    let (v, _) = s.exec(
        "import json, sys\nrows = open('/workspace/input/data.csv').read().splitlines()\n\
         print(json.dumps({'loaded': [m in sys.modules for m in ('csv', 'xml.dom.minidom')], \
         'vars': sorted(k for k in globals() if not k.startswith('__'))}))\n",
    );
    assert_eq!(v["status"], "ok", "{v}");
    let seen: Value = serde_json::from_str(v["stdout"]["text"].as_str().unwrap().trim()).unwrap();
    // Imported before the caller's first cell, and leaving no name behind.
    assert_eq!(seen, json!({"loaded": [true, true], "vars": ["json", "rows", "sys"]}));
    let (v, _) = s.exec("rows.append('3,4')\nn = len(rows)\n");
    assert_eq!(v["status"], "ok", "{v}");
    let (v, out) = s.exec("print(n, rows[-1])\n");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(v["stdout"]["text"], "3 3,4\n", "the globals did not persist: {v}");
    // A fork of the pool's template (issue 36) holds the preload from its
    // template: its session's first cell is the caller's.
    let preload_cells = if v["isolation"]["forked_from_template"] == true { 0 } else { 1 };
    assert_eq!(v["session"]["cell"].as_u64(), Some(3 + preload_cells), "the preload, then the caller's three cells: {v}");
    let end = closing(&s);
    assert_eq!(end["session"]["why"], "stopped", "{end}");
    assert_eq!(end["input"]["unchanged"], true, "{end}");
    assert_session_ended(&s, &s.id);
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn a_pool_sessions_output_folder_keeps_its_files_and_gets_what_passed() {
    let sb = Sandbox::new();
    let out = sb.dir.path().join("kept-output");
    std::fs::create_dir_all(out.join("sub")).unwrap();
    std::fs::write(out.join("keep.txt"), "old").unwrap();
    std::fs::write(out.join("sub/deep.txt"), "deep").unwrap();
    give_to_sandbox(&out);
    let mut pool = Pool::start(&sb, 1, &[]);
    let s = pool.session(json!({"id": "s", "op": "session", "output": out}));
    let (v, _) = s.exec(
        "import os, json\nprint(json.dumps(sorted(os.path.relpath(os.path.join(d, f), '/workspace/output') \
         for d, _, fs in os.walk('/workspace/output') for f in fs)))\nprint(open('/workspace/output/keep.txt').read())\n\
         open('/workspace/output/new.txt', 'w').write('new')\nos.symlink('/etc/passwd', '/workspace/output/link')\n",
    );
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["stdout"]["text"], "[\"keep.txt\", \"sub/deep.txt\"]\nold\n", "the folder's files are not in the jail: {v}");
    assert_eq!(v["output_dir"], out.display().to_string(), "{v}");
    let (v, _) = s.exec("os.remove('/workspace/output/sub/deep.txt')\n");
    assert_eq!(v["status"], "ok", "{v}");
    let end = closing(&s);
    assert_eq!(end["output_dir"], out.display().to_string(), "{end}");
    let changes: Vec<(String, String)> = end["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["path"].as_str().unwrap().to_string(), a["change"].as_str().unwrap().to_string()))
        .collect();
    assert!(changes.contains(&("keep.txt".into(), "unchanged".into())), "{changes:?}");
    assert!(changes.contains(&("new.txt".into(), "created".into())), "{changes:?}");
    assert!(end["rejected_artifacts"].to_string().contains("link"), "{end}");
    // The host folder: what it held, what passed, what was deleted gone,
    // and the refused link nowhere.
    assert_eq!(std::fs::read_to_string(out.join("keep.txt")).unwrap(), "old");
    assert_eq!(std::fs::read_to_string(out.join("new.txt")).unwrap(), "new");
    assert!(!out.join("sub/deep.txt").exists(), "a file the session deleted is still on the host");
    assert!(std::fs::symlink_metadata(out.join("link")).is_err(), "a refused link reached the host");
    assert_session_ended(&s, &s.id);
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn a_second_pool_session_sees_nothing_of_the_first() {
    let sb = Sandbox::new();
    let marker = format!("pool-session-canary-{}", std::process::id());
    let mut pool = Pool::start(&sb, 1, &[]);
    let first_out = sb.dir.path().join("first-out");
    let a = pool.session(json!({"id": "a", "op": "session", "output": first_out}));
    let (v, _) = a.exec(&format!(
        "import subprocess\nsecret = '{marker}'\nopen('/tmp/canary', 'w').write(secret)\n\
         open('/workspace/output/first.txt', 'w').write(secret)\n\
         child = subprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\n"
    ));
    assert_eq!(v["status"], "ok", "{v}");
    let b = pool.session(json!({"id": "b", "op": "session"}));
    assert_ne!(a.pid, b.pid);
    let (v, _) = b.exec(
        "import json, os\nprint(json.dumps({'vars': sorted(k for k in globals() if not k.startswith('__')), \
         'tmp': os.listdir('/tmp'), 'out': os.listdir('/workspace/output'), \
         'cmdlines': [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in os.listdir('/proc') if p.isdigit()]}))\n",
    );
    assert_eq!(v["status"], "ok", "{v}");
    let text = v["stdout"]["text"].as_str().unwrap();
    assert!(!text.contains(&marker), "the second session saw the first's state: {text}");
    let seen: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(seen["vars"], json!(["json", "os"]), "{seen}");
    assert_eq!(seen["tmp"], json!([]), "{seen}");
    assert_eq!(seen["out"], json!([]), "{seen}");
    closing(&a);
    closing(&b);
    assert_session_ended(&a, &marker);
    assert_session_ended(&b, &b.id);
    assert_eq!(std::fs::read_to_string(first_out.join("first.txt")).unwrap(), marker);
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn sigkill_of_the_pool_ends_its_handed_out_sessions_and_leaves_nothing() {
    let sb = Sandbox::new();
    let marker = format!("pool-session-kill-{}", std::process::id());
    let out = sb.dir.path().join("killed-out");
    let mut pool = Pool::start(&sb, 1, &[]);
    let s = pool.session(json!({"id": "s", "op": "session", "output": out}));
    let (v, _) = s.exec(&format!(
        "import subprocess, time\nopen('/workspace/output/made.txt', 'w').write('kept')\n\
         child = subprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\n\
         while not any('{marker}' in open(f'/proc/{{p}}/cmdline').read() for p in __import__('os').listdir('/proc') if p.isdigit() and p != '1'):\n    time.sleep(0.01)\n"
    ));
    assert_eq!(v["status"], "ok", "{v}");
    assert!(!host_processes_with(&marker).is_empty(), "the session's process is not there to be ended");
    pool.wait_ready(1);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pool.child.id() as i32), nix::sys::signal::Signal::SIGKILL);
    let _ = pool.child.wait();
    assert_session_ended(&s, &marker);
    assert_pool_gone(&sb, &sb.pool_tmp());
    // It ended as a stop ends it: what passed reached its output folder.
    assert_eq!(std::fs::read_to_string(out.join("made.txt")).unwrap(), "kept");
    let (_, after) = s.exec("print(1)\n");
    assert_eq!(after.status.code(), Some(125), "the session still answers after its pool was killed");
}

#[test]
fn a_pool_that_drains_stops_its_sessions_and_their_output_is_delivered() {
    let sb = Sandbox::new();
    let out = sb.dir.path().join("drained-out");
    let mut pool = Pool::start(&sb, 1, &[]);
    let s = pool.session(json!({"id": "s", "op": "session", "output": out}));
    let (v, _) = s.exec("open('/workspace/output/made.txt', 'w').write('made')\n");
    assert_eq!(v["status"], "ok", "{v}");
    assert!(pool.finish().success());
    assert_session_ended(&s, &s.id);
    assert_pool_gone(&sb, &sb.pool_tmp());
    assert_eq!(std::fs::read_to_string(out.join("made.txt")).unwrap(), "made");
}

#[test]
fn a_jail_that_ended_while_it_waited_is_never_handed_out_and_a_session_idles_and_lives_from_its_hand_over() {
    let sb = Sandbox::new();
    let text = std::fs::read_to_string(repo().join("policies/default.json")).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("rootfs");
    v["session"] = json!({"interrupt_grace_secs": 1, "idle_timeout_secs": 4, "max_lifetime_secs": 5});
    let policy = sb.dir.path().join("policy.json");
    std::fs::write(&policy, v.to_string()).unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut pool = Pool::start(&sb, 1, &["--policy", policy.to_str().unwrap()]);
    pool.wait_ready(1);
    // A session handed out 3 s into its jail's idle time: its 4 s idle
    // and 5 s lifetime count from the hand-over, not from when the jail
    // was made (5.5 s before the cell).
    std::thread::sleep(Duration::from_secs(3));
    let s = pool.session(json!({"id": "s", "op": "session"}));
    std::thread::sleep(Duration::from_millis(2500));
    let (v, _) = s.exec("print('still here')\n");
    assert_eq!(v["stdout"]["text"], "still here\n", "{v}");
    assert_eq!(v["session"]["ended"], false, "{v}");
    closing(&s);
    // The replacement waits past its idle timeout and ends: the next
    // request gets a live jail, not the dead one.
    pool.wait_ready(1);
    std::thread::sleep(Duration::from_secs(5));
    let r = pool.call(json!({"id": "r", "code": "print('served')"}));
    assert_eq!(result(&r)["stdout"]["text"], "served\n", "{r}");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

#[test]
fn a_session_from_a_pool_whose_policy_binds_the_output_folder_is_refused_and_the_pool_serves_on() {
    let sb = Sandbox::new();
    let text = std::fs::read_to_string(repo().join("policies/default.json")).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("rootfs");
    v["filesystem"]["output_size"] = "unlimited".into();
    v["limits"]["file_size"] = "unlimited".into();
    let policy = sb.dir.path().join("policy.json");
    std::fs::write(&policy, v.to_string()).unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut pool = Pool::start(&sb, 1, &["--policy", policy.to_str().unwrap()]);
    let r = pool.call(json!({"id": "s", "op": "session"}));
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("output_size"), "{r}");
    let ok = pool.call(json!({"id": "k", "code": "print(6 * 7)"}));
    assert_eq!(result(&ok)["stdout"]["text"], "42\n");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

/// The sessions' sockets in the pool's session folder.
fn pool_sockets(sb: &Sandbox) -> Vec<PathBuf> {
    let mut socks: Vec<PathBuf> = std::fs::read_dir(sb.session_dir())
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "sock")).collect())
        .unwrap_or_default();
    socks.sort();
    socks
}

/// A pooled jail is never handed a second step: the test takes the handle
/// of the one jail that served a step and sends it another cell itself,
/// which fails (that session is over), and the pool's next step runs in a
/// jail of its own.
#[test]
fn a_jail_that_served_a_step_cannot_be_given_another() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    pool.wait_ready(1);
    let before = pool_sockets(&sb);
    assert_eq!(before.len(), 1, "one jail made ahead: {before:?}");
    let used = Session { handle: before[0].clone(), pid: 0, id: String::new() };
    let r = pool.call(json!({"id": "a", "code": "kept = 'first step'\nprint('one')\n"}));
    assert_eq!(result(&r)["status"], "ok", "{r}");
    let (v, out) = used.exec("print(kept)\n");
    assert_eq!(out.status.code(), Some(125), "a used jail took a second cell: {v}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ended"), "{}", String::from_utf8_lossy(&out.stderr));
    let r = pool.call(json!({"id": "b", "code": "print('kept' in globals())\n"}));
    assert_eq!(result(&r)["stdout"]["text"], "False\n", "{r}");
    assert!(!pool_sockets(&sb).contains(&before[0]), "the used jail's handle is still served");
    assert!(pool.finish().success());
    assert_pool_gone(&sb, &sb.pool_tmp());
}

/// A pool started by a root that holds no CAP_CHOWN and no read or write
/// override (a pod's root, deploy/k8s: only SETUID and SETGID) still makes
/// its jails and delivers a step's output: a capped output folder is
/// copied back as the caller and judged as the sandbox, never chowned.
#[test]
fn a_root_pool_without_chown_or_override_capabilities_serves_a_step_and_delivers_its_output() {
    if only_as_root("dropping root's chown and override capabilities") {
        return;
    }
    let sb = Sandbox::new();
    let tmp = sb.pool_tmp();
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new("setpriv")
        .arg("--bounding-set=-chown,-dac_override,-dac_read_search,-fowner")
        .arg(jail_bin())
        .args(["pool", "--size", "1", "--rootfs"])
        .arg(&sb.rootfs)
        .env("TMPDIR", &tmp)
        .env("XDG_RUNTIME_DIR", sb.runtime_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            let line = json!({"id": "a", "code": "open('/workspace/output/made.txt', 'w').write('here')\n"});
            stdin.write_all(format!("{line}\n").as_bytes())?;
            drop(stdin);
            child.wait_with_output()
        })
        .expect("run setpriv jail pool");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reply: Value = serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    let r = result(&reply);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["artifacts"][0]["path"], "made.txt", "{r}");
    let dir = PathBuf::from(r["output_dir"].as_str().unwrap());
    assert_eq!(std::fs::read_to_string(dir.join("made.txt")).unwrap(), "here");
    assert_pool_gone(&sb, &tmp);
}
