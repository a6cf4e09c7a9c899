//! Escape probes for the jail core (issue 2): each test tries, from inside
//! the jail, to break one protection, and fails if the attempt succeeds.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

use jail_tests::*;

/// The probes below run four times, with the same assertions: as `jail
/// run`, as the second cell of a session, as a step of a warm pool (issue
/// 18), and as a step of a pool whose jails are forks of its template
/// (issue 36): a cell, a pooled step or a fork can do nothing a run cannot.
macro_rules! both_ways {
    ($($name:ident),* $(,)?) => {
        mod as_run {
            use jail_tests::Runner;
            $( #[test] fn $name() { super::$name(Runner::Run) } )*
        }
        mod as_session_cell {
            use jail_tests::Runner;
            $( #[test] fn $name() { super::$name(Runner::SessionCell) } )*
        }
        mod as_pool_step {
            use jail_tests::Runner;
            $( #[test] fn $name() { super::$name(Runner::PoolStep) } )*
        }
        mod as_forked_step {
            use jail_tests::Runner;
            $( #[test] fn $name() { super::$name(Runner::ForkedStep) } )*
        }
    };
}

both_ways! {
    secret_in_an_ungranted_host_folder_cannot_be_read,
    rootfs_input_and_root_are_read_only_and_output_is_writable,
    host_processes_are_invisible,
    tcp_listener_on_host_loopback_is_unreachable,
    host_process_cannot_be_signalled,
    no_capability_and_no_new_privs,
    sandbox_uid_is_never_host_root,
    background_processes_do_not_outlive_the_script,
    infinite_loop_ends_at_the_wall_clock_timeout,
    nonzero_exit_is_reported,
    python_exception_is_reported,
    daemon_threads_at_interpreter_shutdown_do_not_abort_the_script,
    signal_death_is_reported,
    stdout_is_capped_keeping_head_and_tail,
    the_jail_has_its_own_hostname_devices_and_proc,
    every_namespace_of_the_script_is_its_own,
}

fn secret_in_an_ungranted_host_folder_cannot_be_read(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let secret_dir = tempfile::Builder::new().prefix("jail-secret-").tempdir().unwrap();
    std::fs::set_permissions(secret_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, "canary-secret-42").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let host_path = secret.display().to_string();
    let v = sb.probe(&format!(
        r#"
import json, os
paths = [{host_path:?}, "/oldroot" + {host_path:?}, "/proc/1/root" + {host_path:?},
         "/proc/self/root" + {host_path:?}, "/root/.bashrc", "/root", "/etc/shadow", "/home"]
got = {{}}
for p in paths:
    try:
        if os.path.isdir(p):
            got[p] = "listed: " + ",".join(os.listdir(p))
        else:
            got[p] = "read: " + open(p).read()
    except Exception as e:
        got[p] = "refused: " + type(e).__name__
print(json.dumps(got))
"#
    ));
    for (path, outcome) in v.as_object().unwrap() {
        let o = outcome.as_str().unwrap();
        assert!(o.starts_with("refused"), "{path} was reachable: {o}");
        assert!(!o.contains("canary-secret-42"));
    }
}

#[test]
fn secret_in_the_callers_environment_is_not_visible() {
    let sb = Sandbox::new();
    let canary = format!("sk-canary-{}", std::process::id());
    let mut cmd = sb.command(
        r#"
import json, os
seen = [k for k, v in os.environ.items() if "sk-canary" in v]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for f in ("environ", "cmdline"):
            try:
                if b"sk-canary" in open(f"/proc/{pid}/{f}", "rb").read():
                    seen.append(f"/proc/{pid}/{f}")
            except OSError:
                pass
print(json.dumps({"seen": seen, "keys": sorted(os.environ)}))
"#,
    );
    cmd.env("OPENAI_API_KEY", &canary).env("AWS_SECRET_ACCESS_KEY", &canary);
    let out = cmd.output().unwrap();
    let r = parse(&out);
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    assert!(!r.stdout.text.contains(&canary), "{}", r.stdout.text);
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["seen"], serde_json::json!([]));
    assert!(!v["keys"].as_array().unwrap().iter().any(|k| k == "OPENAI_API_KEY"));
}

fn rootfs_input_and_root_are_read_only_and_output_is_writable(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    sb.input_file("data.csv", b"a,b\n1,2\n");
    let v = sb.probe(
        r#"
import errno, json, os
def attempt(fn):
    try:
        fn()
        return "written"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
res = {
  "usr": attempt(lambda: open("/usr/lib/evil.py", "w").write("x")),
  "stdlib": attempt(lambda: open(os.__file__, "a").write("x")),
  "etc": attempt(lambda: open("/etc/passwd", "a").write("x")),
  "root": attempt(lambda: open("/evil", "w").write("x")),
  "input_new": attempt(lambda: open("/workspace/input/new.txt", "w").write("x")),
  "input_existing": attempt(lambda: open("/workspace/input/data.csv", "a").write("x")),
  "input_delete": attempt(lambda: os.unlink("/workspace/input/data.csv")),
  "code": attempt(lambda: open("/workspace/code/evil.py", "w").write("x")),
  "output": attempt(lambda: open("/workspace/output/ok.txt", "w").write("x")),
  "tmp": attempt(lambda: open("/tmp/ok.txt", "w").write("x")),
  "root_ro": bool(os.statvfs("/").f_flag & os.ST_RDONLY),
  "usr_flags": os.statvfs("/usr").f_flag & (os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV),
}
print(json.dumps(res))
"#,
    );
    // Creating or deleting must hit the read-only mount itself.
    for key in ["usr", "root", "input_new", "input_delete", "code"] {
        assert_eq!(v[key], "EROFS", "{key}: {v}");
    }
    // Existing files may be refused by their mode bits first; either way no write.
    for key in ["stdlib", "etc", "input_existing"] {
        assert!(v[key] == "EROFS" || v[key] == "EACCES", "{key}: {v}");
    }
    assert_eq!(v["output"], "written");
    assert_eq!(v["tmp"], "written");
    assert_eq!(v["root_ro"], true);
    assert_eq!(v["usr_flags"].as_u64().unwrap(), libc::ST_RDONLY | libc::ST_NOSUID | libc::ST_NODEV);
    assert_eq!(std::fs::read(sb.input.join("data.csv")).unwrap(), b"a,b\n1,2\n");
    assert_eq!(std::fs::read_to_string(sb.output.join("ok.txt")).unwrap(), "x");
}

/// Every mount in the jail, from its own mountinfo: mount point and options.
const MOUNT_FLAGS: &str = r#"
import json
print(json.dumps({l.split()[4]: l.split()[5] for l in open("/proc/self/mountinfo")}))
"#;

#[test]
fn every_mount_is_nosuid_and_all_but_the_writable_ones_are_read_only_submounts_included() {
    // As root the input folder gets a writable, suid-capable tmpfs mounted
    // inside it (in a private mount namespace of the test's own): the jail's
    // read-only bind of the input must make that submount read-only, nosuid
    // and nodev too (recursively: mount_setattr(AT_RECURSIVE), or on kernels
    // before 5.12 the remount of every mount, mounts/remount.rs). As an
    // ordinary user there is no submount; the rest is checked the same way.
    let sb = Sandbox::new();
    sb.input_file("data.csv", b"a\n");
    let (r, out) = if is_root() {
        std::fs::create_dir(sb.input.join("sub")).unwrap();
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            r#"mount -t tmpfs -o rw,suid,dev sub "$0/sub" && exec "$@""#,
        ]);
        cmd.arg(&sb.input);
        let jail = sb.command(MOUNT_FLAGS);
        cmd.arg(jail.get_program()).args(jail.get_args());
        let out = cmd.output().unwrap();
        (parse(&out), out)
    } else {
        sb.run(MOUNT_FLAGS)
    };
    assert_eq!(r.status, Status::Ok, "{:?} {}", r.setup_error, String::from_utf8_lossy(&out.stderr));
    let mounts: serde_json::Map<String, serde_json::Value> = serde_json::from_str(r.stdout.text.trim()).unwrap();
    let writable = ["/tmp", "/dev/shm", "/workspace/output", "/dev", "/proc"];
    let devices = ["/dev", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];
    for (at, opts) in &mounts {
        let opts: Vec<&str> = opts.as_str().unwrap().split(',').collect();
        let is_dev = devices.contains(&at.as_str());
        let rw = writable.contains(&at.as_str()) || is_dev;
        assert!(opts.contains(&"nosuid"), "{at} is not nosuid: {opts:?}");
        assert!(is_dev || opts.contains(&"nodev"), "{at} is not nodev: {opts:?}");
        assert!(rw || opts.contains(&"ro"), "{at} is not read-only: {opts:?}");
    }
    if is_root() {
        let sub = mounts
            .get("/workspace/input/sub")
            .unwrap_or_else(|| panic!("no input submount in the jail: {mounts:?}"));
        assert!(sub.as_str().unwrap().split(',').any(|o| o == "ro"), "input submount writable: {sub}");
    }
    for at in ["/", "/usr", "/workspace/input", "/workspace/code"] {
        assert!(mounts.contains_key(at), "no mount at {at}: {mounts:?}");
    }
}

fn host_processes_are_invisible(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let v = sb.probe(
        r#"
import json, os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps({"pids": pids, "me": os.getpid()}))
"#,
    );
    // PID 1 is the jail's reaper, 2 the script; nothing from the host.
    assert_eq!(v["pids"], serde_json::json!([1, 2]), "{v}");
    assert_eq!(v["me"], 2);
}

fn tcp_listener_on_host_loopback_is_unreachable(runner: Runner) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let sb = Sandbox::with_runner(runner);
    let v = sb.probe(&format!(
        r#"
import json, socket
# The interfaces of the jail's net namespace; /proc/net/dev rather than
# if_nameindex(), whose netlink socket seccomp refuses.
res = {{"ifaces": [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]}}
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    res["connect"] = "connected"
except OSError as e:
    res["connect"] = type(e).__name__
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    res["internet"] = "connected"
except OSError as e:
    res["internet"] = type(e).__name__
print(json.dumps(res))
"#
    ));
    assert_ne!(v["connect"], "connected", "{v}");
    assert_ne!(v["internet"], "connected", "{v}");
    assert_eq!(v["ifaces"], serde_json::json!(["lo"]));
    assert!(listener.accept().is_err(), "the host listener saw a connection");
}

fn host_process_cannot_be_signalled(runner: Runner) {
    // A host process owned by the very uid the sandbox runs as: without the
    // pid namespace the script could kill it.
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("30");
    if is_root() {
        use std::os::unix::process::CommandExt;
        cmd.uid(sandbox_host_uid()).gid(sandbox_host_uid());
    }
    let mut victim = cmd.spawn().unwrap();
    let pid = victim.id();
    let sb = Sandbox::with_runner(runner);
    let v = sb.probe(&format!(
        r#"
import json, os, signal
res = {{}}
for name, sig in (("probe", 0), ("kill", signal.SIGKILL)):
    try:
        os.kill({pid}, sig)
        res[name] = "delivered"
    except OSError as e:
        res[name] = type(e).__name__
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
print(json.dumps(res))
"#
    ));
    let alive = victim.try_wait().unwrap().is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(v["kill"], "ProcessLookupError", "{v}");
    assert!(alive, "the host process was killed from inside the jail");
}

fn no_capability_and_no_new_privs(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let v = sb.probe(
        r#"
import json
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print(json.dumps({k: st[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")}))
"#,
    );
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(v[k], "0000000000000000", "{k}: {v}");
    }
    assert_eq!(v["NoNewPrivs"], "1");
}

fn sandbox_uid_is_never_host_root(runner: Runner) {
    let mut sb = Sandbox::with_runner(runner);
    // The output folder bound into the jail (`output_size: "unlimited"`), so
    // the file below is the script's own write on the host, not the copy
    // the supervisor makes as the caller in the capped mode.
    let mut policy: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("policies/default.json")).unwrap()).unwrap();
    policy.as_object_mut().unwrap().remove("rootfs");
    policy["filesystem"]["output_size"] = "unlimited".into();
    policy["limits"]["file_size"] = "unlimited".into();
    let path = sb.dir.path().join("policy.json");
    std::fs::write(&path, policy.to_string()).unwrap();
    sb.extra_args.extend(["--policy".to_string(), path.display().to_string()]);
    let (r, out) = sb.run(
        r#"
import json, os
open("/workspace/output/owned.txt", "w").write("x")
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
                  "uid_map": open("/proc/self/uid_map").read().split(),
                  "gid_map": open("/proc/self/gid_map").read().split(),
                  "setgroups": open("/proc/self/setgroups").read().strip()}))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["uid"], 1000);
    assert_eq!(v["euid"], 1000);
    assert_eq!(v["gid"], 1000);
    let map: Vec<u32> = v["uid_map"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().parse().unwrap()).collect();
    let host_uid = if runner == Runner::ForkedStep && !is_root() {
        // A fork's user namespace is nested in its template's: its map's
        // outside is the template's sandbox uid, which the template's own
        // namespace maps to the host uid (on the file it wrote, below). As
        // root, the template's namespace maps the lease range each uid as
        // itself, and the fork's map names its own leased uid
        // (template/uids.rs), as a cloned jail's does.
        assert_eq!(map, vec![1000, 1000, 1], "{v}");
        r.isolation.host_uid
    } else {
        assert_eq!(map, vec![1000, r.isolation.host_uid, 1], "{v}");
        map[1]
    };
    if is_root() {
        // One of the range root runs take theirs from (hostuid.rs).
        let range = jail::policy::Policy::builtin_default().unwrap().identity.root_host_uids;
        assert!((range.first..=range.last()).contains(&host_uid), "{v}");
    } else {
        assert_eq!(host_uid, sandbox_host_uid());
    }
    assert_ne!(host_uid, 0);
    assert_eq!(v["setgroups"], "deny");
    let owner = std::fs::metadata(sb.output.join("owned.txt")).unwrap().uid();
    assert_eq!(owner, r.isolation.host_uid);
    assert_ne!(owner, 0);
}

/// Two runs at once never share a host uid when root starts them: each
/// takes its own from `identity.root_host_uids` (hostuid.rs), so per-user
/// kernel accounting is not shared between them, nor with `nobody`. An
/// ordinary user's runs are that user.
#[test]
fn concurrent_runs_started_by_root_get_different_host_uids() {
    let (a, b) = (Sandbox::new(), Sandbox::new());
    let marker = format!("jail-uid-marker-{}", std::process::id());
    let source = r#"
import json, os, sys, time
# The first run stays up long enough for the second to run beside it (the
# test checks from the host that it still runs when the second has ended).
if sys.argv[1] == "wait":
    time.sleep(4)
print(json.dumps(open("/proc/self/uid_map").read().split()))
"#;
    let with_args = |sb: &Sandbox, mode: &str| {
        let mut cmd = sb.command(source);
        cmd.arg(mode).arg(&marker);
        cmd
    };
    let first = with_args(&a, "wait").stdout(std::process::Stdio::piped()).spawn().unwrap();
    // Its script is running: the first run holds its uid.
    let deadline = Instant::now() + Duration::from_secs(20);
    let running = || {
        host_processes_with(&marker).into_iter().any(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("/workspace/code/main.py")
        })
    };
    while !running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(running(), "the first run's script never started");
    let second = parse(&with_args(&b, "go").output().unwrap());
    assert!(running(), "the first run ended before the second did: they did not overlap");
    let first = parse(&first.wait_with_output().unwrap());
    for r in [&first, &second] {
        assert_eq!(r.status, Status::Ok, "{r:?}");
        let map: Vec<String> = serde_json::from_str(r.stdout.text.trim()).unwrap();
        assert_eq!(
            map,
            vec!["1000".to_string(), r.isolation.host_uid.to_string(), "1".into()],
            "the reported uid is the mapped one"
        );
    }
    let (u1, u2) = (first.isolation.host_uid, second.isolation.host_uid);
    if is_root() {
        assert_ne!(u1, u2, "two live runs share host uid {u1}");
        let range = jail::policy::Policy::builtin_default().unwrap().identity.root_host_uids;
        for u in [u1, u2] {
            assert!((range.first..=range.last()).contains(&u) && u != 65534, "{u}");
        }
        assert_eq!(first.isolation.host_gid, second.isolation.host_gid, "the group is shared");
    } else {
        assert_eq!((u1, u2), (sandbox_host_uid(), sandbox_host_uid()));
    }
}

fn background_processes_do_not_outlive_the_script(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let marker = format!("jail-bg-marker-{}", std::process::id());
    let started = Instant::now();
    let (r, _) = sb.run(&format!(
        r#"
import os, subprocess, sys
# A plain child holding stdout open, and a double-forked daemon.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    os._exit(0)
print("parent done")
"#
    ));
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    // The step's own time, from its release to its end: the orphans sleep
    // 60 s, so a jail that waited for them takes that long. What the
    // caller waited besides (a pool's first jail, in the TCG guests of the
    // VM matrix under load) is not the jail waiting for its orphans.
    assert!(r.usage.wall_ms < 10_000.0, "the jail waited for its orphans: {} ms", r.usage.wall_ms);
    assert!(started.elapsed() < Duration::from_secs(50), "the jail waited for its orphans");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(host_processes_with(&marker), Vec::<u32>::new(), "a background process survived");
}

fn infinite_loop_ends_at_the_wall_clock_timeout(runner: Runner) {
    let mut sb = Sandbox::with_runner(runner);
    // 3 s: long enough for Python to start and print even in the TCG guest
    // of the VM matrix, where processes start 40-80 times slower.
    sb.extra_args = vec!["--timeout".into(), "3".into()];
    let started = Instant::now();
    let (r, out) = sb.run("print('spinning', flush=True)\nwhile True:\n    pass\n");
    let took = started.elapsed();
    assert_eq!(r.status, Status::TimeoutWall);
    assert_eq!(out.status.code(), Some(124));
    assert!(took >= Duration::from_millis(2950), "took {took:?}");
    // The step's own time (the caller's also counts a pool's first jail):
    // the deadline held it to 3 s and the kill took little past it.
    let wall = r.usage.wall_ms;
    assert!((2950.0..10_000.0).contains(&wall), "the step ran {wall} ms");
    // Output written before the kill is kept.
    assert_eq!(r.stdout.text, "spinning\n");
}

fn nonzero_exit_is_reported(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let (r, out) = sb.run("import sys\nsys.exit(3)\n");
    assert_eq!(r.status, Status::NonzeroExit);
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(r.error, None);
}

fn python_exception_is_reported(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let (r, out) = sb.run("def f():\n    return 1 / 0\nf()\n");
    assert_eq!(r.status, Status::NonzeroExit);
    assert_eq!(r.exit_code, Some(1));
    assert_eq!(out.status.code(), Some(1));
    let e = r.error.expect("error parsed");
    assert_eq!(e.kind, "ZeroDivisionError");
    assert_eq!(e.message, "division by zero");
    let file = match runner {
        Runner::Run => "/workspace/code/main.py",
        // The pool's first cell sets sys.argv; the step is the second.
        Runner::SessionCell | Runner::PoolStep | Runner::ForkedStep => "<cell 2>",
    };
    assert!(e.traceback_tail.contains(file), "{}", e.traceback_tail);
}

fn daemon_threads_at_interpreter_shutdown_do_not_abort_the_script(runner: Runner) {
    // At shutdown CPython ends daemon threads with pthread_exit, for which
    // glibc dlopens libgcc_s (no ldd lists it): a rootfs without it aborts
    // every such script ("libgcc_s.so.1 must be installed for pthread_exit
    // to work", SIGABRT), which hung test_threading in the jail.
    let mut sb = Sandbox::with_runner(runner);
    // 32 threads: on the rlimit path (no cgroup) each reserves an 8 MiB
    // stack and up to a 64 MiB malloc arena of address space, which the
    // default 512M RLIMIT_AS does not hold; give it room like data_stack.rs.
    sb.extra_args = vec!["--memory".into(), "4G".into()];
    // Whether a daemon thread is still running at shutdown is a race: 20
    // interpreters in a row make at least one hit it.
    let (r, _) = sb.run(
        r#"
import subprocess, sys
child = """
import threading, time
def spin():
    while True:
        time.sleep(0)
for _ in range(8):
    threading.Thread(target=spin, daemon=True).start()
time.sleep(0.05)
"""
bad = []
for _ in range(20):
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    if p.returncode != 0:
        bad.append(f"{p.returncode}: {p.stderr.strip()[-200:]}")
print(len(bad), bad[:1])
"#,
    );
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    assert!(r.stdout.text.starts_with("0 "), "daemon threads at shutdown aborted: {}", r.stdout.text);
}

fn signal_death_is_reported(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let (r, out) = sb.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n");
    assert_eq!(r.status, Status::Signaled);
    assert_eq!(r.signal, Some(9));
    assert_eq!(r.signal_name.as_deref(), Some("SIGKILL"));
    assert_eq!(out.status.code(), Some(137));
    let (r, _) = sb.run("import ctypes\nctypes.string_at(0)\n");
    assert_eq!(r.status, Status::Signaled);
    assert_eq!(r.signal, Some(11));
}

fn stdout_is_capped_keeping_head_and_tail(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let (r, _) = sb.run("import sys\nsys.stdout.write('HEAD' + 'x' * (3 << 20) + 'TAIL')\n");
    // Truncated, not killed: the script's own exit code stays.
    assert_eq!(r.status, Status::OutputLimit);
    assert_eq!(r.exit_code, Some(0));
    assert!(r.stdout.truncated);
    assert_eq!(r.stdout.bytes, (3 << 20) + 8);
    assert!(r.stdout.text.starts_with("HEAD"));
    assert!(r.stdout.text.ends_with("TAIL"));
    assert!(r.stdout.text.len() < (1 << 20) + 200, "kept {} bytes", r.stdout.text.len());
}

fn the_jail_has_its_own_hostname_devices_and_proc(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let v = sb.probe(
        r#"
import errno, json, os, socket, stat
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
s = os.stat("/dev/null")
print(json.dumps({
  "hostname": socket.gethostname(),
  "null": [stat.S_ISCHR(s.st_mode), os.major(s.st_rdev), os.minor(s.st_rdev)],
  "dev": sorted(os.listdir("/dev")),
  "masked": {f: [open(f"/proc/{f}", "rb").read(64).decode(), attempt(lambda: open(f"/proc/{f}", "w").write("h"))]
             for f in ("kcore", "keys", "timer_list", "sysrq-trigger", "kallsyms", "sched_debug")
             if os.path.exists(f"/proc/{f}")},
  "proc_sys_write": attempt(lambda: open("/proc/sys/kernel/hostname", "w").write("x")),
  "tty": attempt(lambda: open("/dev/tty")),
  "sys": os.path.exists("/sys/fs/cgroup"),
  "fds": sorted(os.listdir("/proc/self/fd")),
  "cwd": os.getcwd(),
  "dotdot": os.stat("/..").st_ino == os.stat("/").st_ino,
  "core": __import__("resource").getrlimit(__import__("resource").RLIMIT_CORE),
}))
"#,
    );
    assert_eq!(v["hostname"], "jail");
    assert_eq!(v["null"], serde_json::json!([true, 1, 3]));
    assert_eq!(
        v["dev"],
        serde_json::json!(["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"])
    );
    // Whatever of the sensitive files this kernel has reads empty and refuses writes.
    let host_has = ["kcore", "keys", "timer_list", "sysrq-trigger", "kallsyms", "sched_debug"]
        .iter()
        .filter(|f| std::path::Path::new("/proc").join(f).exists())
        .count();
    let masked = v["masked"].as_object().unwrap();
    assert_eq!(masked.len(), host_has, "{v}");
    assert!(host_has > 0, "this kernel exposes none of the masked files; the test proves nothing");
    for (f, got) in masked {
        assert_eq!(got[0], "", "/proc/{f} is readable: {v}");
        assert_ne!(got[1], "ok", "/proc/{f} is writable: {v}");
    }
    assert_eq!(v["proc_sys_write"], "EROFS", "{v}");
    assert_eq!(v["tty"], "ENOENT");
    assert_eq!(v["sys"], false);
    // 0, 1, 2, the control socket the script runner or the cell driver
    // holds (moved off fd 0, close-on-exec: its rich results go there) and
    // the listdir's own descriptor: nothing inherited, whatever the runner.
    let _ = runner;
    assert_eq!(v["fds"], serde_json::json!(["0", "1", "2", "3", "4"]), "{v}");
    assert_eq!(v["cwd"], "/workspace/output");
    assert_eq!(v["dotdot"], true);
    assert_eq!(v["core"], serde_json::json!([0, 0]));
}

fn every_namespace_of_the_script_is_its_own(runner: Runner) {
    // Some namespaces are made by PID 1 after the clone (cgroup, net): a
    // step missed there would leave the script in one of the host's.
    const NAMES: [&str; 7] = ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"];
    let sb = Sandbox::with_runner(runner);
    let v =
        sb.probe(&format!("import json, os\nprint(json.dumps({{n: os.readlink('/proc/self/ns/' + n) for n in {NAMES:?}}}))\n"));
    for n in NAMES {
        let host = std::fs::read_link(format!("/proc/self/ns/{n}")).unwrap().display().to_string();
        let inside = v[n].as_str().unwrap_or_else(|| panic!("no {n} in {v}"));
        assert!(inside.starts_with(&format!("{n}:[")), "{n}: {inside}");
        assert_ne!(inside, host, "the script is in the host's {n} namespace");
    }
}

#[test]
fn human_mode_streams_the_script_output() {
    let sb = Sandbox::new();
    let script = sb.script("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(4)\n");
    let out = Command::new(jail_bin())
        .arg("run")
        .arg("--rootfs")
        .arg(rootfs())
        .arg("--output")
        .arg(&sb.output)
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to stdout\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("to stderr"));
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn script_arguments_reach_the_script() {
    let sb = Sandbox::new();
    let mut cmd = sb.command("import json, sys\nprint(json.dumps(sys.argv[1:]))\n");
    cmd.args(["--flag", "two words"]);
    let r = parse(&cmd.output().unwrap());
    assert_eq!(r.stdout.text.trim(), r#"["--flag", "two words"]"#);
}

#[test]
fn a_fresh_output_dir_is_created_and_reported_when_none_is_given() {
    let sb = Sandbox::new();
    let script = sb.script("open('made.txt', 'w').write('hi')\n");
    let out = Command::new(jail_bin())
        .arg("run")
        .arg("--json")
        .arg("--rootfs")
        .arg(rootfs())
        .arg(&script)
        .output()
        .unwrap();
    let r = parse(&out);
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    let dir = std::path::PathBuf::from(r.output_dir.expect("output_dir"));
    let mut text = String::new();
    std::fs::File::open(dir.join("made.txt")).unwrap().read_to_string(&mut text).unwrap();
    assert_eq!(text, "hi");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_code_dir_at_the_staging_point_does_not_carry_the_jails_root_in() {
    // The child builds the jail's root on a tmpfs over /tmp. A script that
    // sits in /tmp itself makes /tmp the code dir; its bind must be the
    // host's /tmp as it was, not a copy of the half-built root (with the
    // mask scratch mount still on it, which failed the run).
    let sb = Sandbox::new();
    let script = std::path::Path::new("/tmp").join(format!("jail-staging-probe-{}.py", std::process::id()));
    std::fs::write(
        &script,
        r#"
import json, os
mounts = [l.split()[4] for l in open("/proc/self/mountinfo")]
print(json.dumps({"code": sorted(os.listdir("/workspace/code")),
                  "under_code": [m for m in mounts if m.startswith("/workspace/code/")]}))
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(jail_bin())
        .args(["run", "--json", "--rootfs"])
        .arg(&sb.rootfs)
        .arg("--output")
        .arg(&sb.output)
        .arg(&script)
        .output()
        .unwrap();
    // And /tmp granted as the code dir: the re-rooted view of the host's
    // /tmp, opened before the staging tmpfs covers it.
    let granted = Command::new(jail_bin())
        .args(["run", "--json", "--rootfs"])
        .arg(&sb.rootfs)
        .arg("--output")
        .arg(&sb.output)
        .args(["--code", "/tmp"])
        .arg(&script)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&script);
    for out in [&out, &granted] {
        check_staging_probe(out, &script);
    }
}

fn check_staging_probe(out: &std::process::Output, script: &std::path::Path) {
    let r = parse(out);
    assert_eq!(r.status, Status::Ok, "{:?}\n{}", r.setup_error, String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    let name = script.file_name().unwrap().to_str().unwrap();
    let code: Vec<&str> = v["code"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    assert!(code.contains(&name), "{v}");
    for jail_only in [".jail-masks", "workspace", "usr", "proc"] {
        assert!(!code.contains(&jail_only), "the jail's own root showed through the code dir: {v}");
    }
    let under: Vec<&str> = v["under_code"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    assert!(!under.iter().any(|m| m.contains("/workspace/code/workspace") || m.contains(".jail-masks")), "{v}");
}
