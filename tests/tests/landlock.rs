//! Landlock probes (issue 4): the script tries what only Landlock stops
//! (the mounts alone allow each of these), the result reports the ABI and
//! status, and a policy that requires more Landlock than the kernel has fails
//! before the script starts. TCP and abstract-socket rules, which seccomp
//! already shadows inside the jail (no AF_INET socket can be made there),
//! are tested on the jail's own `landlock::restrict` in a separate process.

use std::process::Command;

use jail::landlock::{self, Access, Enforcement, PathRule, Settings};
use jail::result::LayerStatus;
use jail_tests::*;
use serde_json::Value;

fn kernel_abi() -> u32 {
    landlock::kernel_abi()
}

/// Skip (or fail under JAIL_MUST_WORK) when the kernel has less than `abi`.
fn needs_abi(abi: u32) -> bool {
    skip_unless(kernel_abi() >= abi, &format!("this kernel offers Landlock ABI {}, the test needs {abi}", kernel_abi()))
}

const ATTEMPT: &str = r#"
import errno, json, os, subprocess
res = {}
def attempt(name, fn):
    try:
        fn()
        res[name] = "ok"
    except OSError as e:
        res[name] = errno.errorcode.get(e.errno, str(e.errno))
"#;

#[test]
fn files_cannot_be_created_in_dev_and_proc_cannot_be_written() {
    if needs_abi(1) {
        return;
    }
    let sb = Sandbox::new();
    // /dev is a tmpfs owned by the sandbox and /proc/self is the script's
    // own: without Landlock every one of these works.
    let v = sb.probe(&format!(
        "{ATTEMPT}
attempt('dev_file', lambda: open('/dev/planted', 'w').write('x'))
attempt('dev_dir', lambda: os.mkdir('/dev/planted.d'))
attempt('dev_fifo', lambda: os.mkfifo('/dev/planted.fifo'))
attempt('proc_oom', lambda: open('/proc/self/oom_score_adj', 'w').write('500'))
attempt('proc_comm', lambda: open('/proc/self/comm', 'w').write('x'))
attempt('dev_null', lambda: open('/dev/null', 'w').write('fine'))
attempt('dev_urandom', lambda: open('/dev/urandom', 'rb').read(8))
attempt('list_root', lambda: os.listdir('/'))
attempt('list_dev', lambda: os.listdir('/dev'))
print(json.dumps(res))
"
    ));
    for key in ["dev_file", "dev_dir", "dev_fifo", "proc_oom", "proc_comm"] {
        assert_eq!(v[key], "EACCES", "{key}: {v}");
    }
    for key in ["dev_null", "dev_urandom", "list_root", "list_dev"] {
        assert_eq!(v[key], "ok", "{key}: {v}");
    }
}

#[test]
fn programs_written_to_writable_folders_cannot_be_executed() {
    if needs_abi(1) {
        return;
    }
    let sb = Sandbox::new();
    let v = sb.probe(&format!(
        "{ATTEMPT}
def exec_from(folder):
    path = os.path.join(folder, 'tool.py')
    open(path, 'w').write('#!/usr/bin/python3\\nprint(1)\\n')
    os.chmod(path, 0o755)
    subprocess.run([path], check=True, capture_output=True)
for name, folder in (('tmp', '/tmp'), ('output', '/workspace/output'), ('shm', '/dev/shm')):
    attempt(name, lambda: exec_from(folder))
attempt('rootfs', lambda: subprocess.run(['/usr/bin/python3', '-c', 'pass'], check=True))
print(json.dumps(res))
"
    ));
    // /dev/shm is also a noexec mount; /tmp and the output dir are only
    // kept from executing by Landlock.
    assert_eq!(v["tmp"], "EACCES", "{v}");
    assert_eq!(v["output"], "EACCES", "{v}");
    assert_ne!(v["shm"], "ok", "{v}");
    assert_eq!(v["rootfs"], "ok", "{v}");
}

#[test]
fn the_jails_pid1_cannot_be_signalled() {
    if needs_abi(6) {
        return;
    }
    let sb = Sandbox::new();
    // Same uid as PID 1, which forwards SIGTERM: without signal scoping the
    // script could signal it.
    let v = sb.probe(&format!(
        "{ATTEMPT}
import signal
attempt('probe_pid1', lambda: os.kill(1, 0))
attempt('term_pid1', lambda: os.kill(1, signal.SIGTERM))
attempt('own_child', lambda: (lambda p: (os.kill(p.pid, signal.SIGKILL), p.wait()))(subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(30)'])))
print(json.dumps(res))
"
    ));
    assert_eq!(v["probe_pid1"], "EPERM", "{v}");
    assert_eq!(v["term_pid1"], "EPERM", "{v}");
    assert_eq!(v["own_child"], "ok", "signals inside the domain must work: {v}");
}

#[test]
fn the_result_reports_the_abi_and_status() {
    let sb = Sandbox::new();
    let (r, _) = sb.run("pass\n");
    assert_eq!(r.status, Status::Ok);
    let l = &r.isolation.landlock;
    assert_eq!(l.kernel_abi, kernel_abi());
    assert_eq!(l.abi, kernel_abi().min(landlock::TARGET_ABI));
    assert_eq!(l.mode, "best_effort");
    let want = match l.abi {
        0 => LayerStatus::NotEnforced,
        a if a >= landlock::TARGET_ABI => LayerStatus::Enforced,
        _ => LayerStatus::Partial,
    };
    assert_eq!(l.status, want);
    assert_eq!(l.missing.is_empty(), want == LayerStatus::Enforced);
    assert_eq!(
        r.isolation.degraded.iter().any(|d| d.starts_with("landlock")),
        want != LayerStatus::Enforced,
        "{:?}",
        r.isolation.degraded
    );
}

fn policy_with_landlock(section: &str) -> tempfile::NamedTempFile {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(repo().join("policies/default.json")).unwrap()).unwrap();
    v["landlock"] = serde_json::from_str(section).unwrap();
    v["rootfs"] = Value::String(rootfs().display().to_string());
    let f = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    std::fs::write(f.path(), v.to_string()).unwrap();
    f
}

#[test]
fn required_landlock_above_the_kernels_abi_fails_before_the_script_starts() {
    let policy = policy_with_landlock(r#"{"mode": "required", "min_abi": 99}"#);
    let mut sb = Sandbox::new();
    sb.extra_args = vec!["--policy".into(), policy.path().display().to_string()];
    let (r, out) = sb.run("open('/workspace/output/ran', 'w').write('x')\n");
    assert_eq!(r.status, Status::SetupFailed);
    assert_eq!(out.status.code(), Some(125));
    let e = r.setup_error.expect("setup_error");
    assert_eq!(e.stage, "landlock");
    assert!(e.message.contains("requires at least 99"), "{e:?}");
    assert!(!sb.output.join("ran").exists(), "the script ran");
    assert!(r.timings.stages.keys().all(|k| !k.starts_with("child_")), "a child was started: {:?}", r.timings.stages);
}

#[test]
fn required_landlock_the_kernel_has_is_enforced() {
    if needs_abi(landlock::TARGET_ABI) {
        return;
    }
    let policy = policy_with_landlock(r#"{"mode": "required"}"#);
    let mut sb = Sandbox::new();
    sb.extra_args = vec!["--policy".into(), policy.path().display().to_string()];
    let v = sb.probe(&format!("{ATTEMPT}\nattempt('dev', lambda: open('/dev/planted', 'w'))\nprint(json.dumps(res))\n"));
    assert_eq!(v["dev"], "EACCES");
    let (r, _) = sb.run("pass\n");
    assert_eq!(r.isolation.landlock.mode, "required");
    assert_eq!(r.isolation.landlock.status, LayerStatus::Enforced);
}

/// Not a test on its own: the process `restrict_applies_tcp_and_ipc_scoping`
/// starts to restrict itself with the jail's own code and report what it
/// can still do. Ignored so that it only runs when asked for by name.
#[test]
#[ignore]
fn landlock_helper_process() {
    use std::os::unix::net::UnixListener;
    let name = format!("jail-landlock-probe-{}", std::process::id());
    let listener = <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
        .and_then(|addr| UnixListener::bind_addr(&addr))
        .unwrap();
    // Outside the domain about to be made; it leaves when its stdin closes
    // (we will not be allowed to signal it).
    let mut outside = Command::new("/bin/cat").stdin(std::process::Stdio::piped()).spawn().unwrap();
    let plan = landlock::plan(kernel_abi(), &Settings { enforcement: Enforcement::BestEffort, min_abi: 6 }).unwrap();
    landlock::restrict(&plan, &[PathRule { path: "/".into(), access: Access::ReadExec }], &[]).unwrap();
    let err = |r: std::io::Result<()>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("{:?}", e.raw_os_error()),
    };
    let bind = err(std::net::TcpListener::bind("127.0.0.1:0").map(drop));
    let connect = err(std::net::TcpStream::connect("127.0.0.1:9").map(drop));
    let abstract_connect =
        err(<std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
            .and_then(|addr| std::os::unix::net::UnixStream::connect_addr(&addr))
            .map(drop));
    let signal = err(nix::sys::signal::kill(nix::unistd::Pid::from_raw(outside.id() as i32), None).map_err(Into::into));
    let write = err(std::fs::write(std::env::temp_dir().join(format!("{name}.txt")), "x"));
    println!(
        "LANDLOCK_PROBE {}",
        serde_json::json!({"bind": bind, "connect": connect, "abstract": abstract_connect, "signal": signal, "write": write})
    );
    drop(listener);
    drop(outside.stdin.take());
    let _ = outside.wait();
}

#[test]
fn restrict_applies_tcp_and_ipc_scoping() {
    if needs_abi(6) {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "landlock_helper_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("LANDLOCK_PROBE ").map(|(_, json)| json))
        .unwrap_or_else(|| panic!("the helper printed no report: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let v: Value = serde_json::from_str(line).unwrap();
    let eacces = format!("Some({})", libc::EACCES);
    let eperm = format!("Some({})", libc::EPERM);
    assert_eq!(v["bind"], eacces.as_str(), "{v}");
    assert_eq!(v["connect"], eacces.as_str(), "{v}");
    assert_eq!(v["abstract"], eperm.as_str(), "{v}");
    assert_eq!(v["signal"], eperm.as_str(), "{v}");
    // Only read and execute were granted.
    assert_eq!(v["write"], eacces.as_str(), "{v}");
}
