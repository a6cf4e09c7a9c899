//! Cancelling a run (issue 19): SIGTERM, SIGINT or SIGHUP sent to `jail run`
//! (an MCP client cancelling its call, a service stopping a step, Ctrl-C)
//! kill the jail's tree and leave nothing behind — no process, no run
//! cgroup, no temp dir — and the result says `cancelled`. Without the
//! handling, `jail` dies of the signal: no result, the cgroup and the
//! folders stay.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jail_tests::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A script that forks a grandchild, and both sleep far past any test.
const SLEEPERS: &str = "import os, sys, time\nif os.fork() == 0:\n    time.sleep(600)\n    sys.exit(0)\ntime.sleep(600)\n";

/// Wait for `jail`'s output, at most `within`; kill it and fail past that.
fn wait_output(mut child: Child, within: Duration) -> (Option<i32>, Vec<u8>) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = Vec::new();
            child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
            return (status.code(), out);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("jail did not exit within {within:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Until `marker` is on `count` host processes' command lines (the script
/// and its fork are running), at most 10 s.
fn wait_for_processes(marker: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while host_processes_with(marker).len() < count {
        assert!(Instant::now() < deadline, "the script did not start: {:?}", host_processes_with(marker));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sigterm_to_jail_run_kills_the_tree_removes_its_cgroup_and_reports_cancelled() {
    let sb = Sandbox::new();
    let marker = format!("jail-cancel-marker-{}", std::process::id());
    let mut cmd = sb.command(SLEEPERS);
    cmd.arg(&marker);
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    // The jail's marker is on its own command line too: the script and its fork make 3.
    wait_for_processes(&marker, 3);
    let has_cgroup = !cgroups_left_by(pid).is_empty();
    assert_eq!(has_cgroup, expected_backend().starts_with("cgroup"), "cgroups of jail {pid}: {:?}", cgroups_left_by(pid));
    let sent = Instant::now();
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
    let (code, out) = wait_output(child, Duration::from_secs(10));
    let took = sent.elapsed();
    let doc: serde_json::Value = serde_json::from_slice(&out).expect("a result document on stdout");
    validate_result(&doc).unwrap();
    let r: RunResult = serde_json::from_value(doc).unwrap();
    assert_eq!(r.status, Status::Cancelled, "{r:?}");
    assert_eq!(r.supervisor.cancelled_by.as_deref(), Some("SIGTERM"));
    assert_eq!(code, Some(143), "exit 128 + SIGTERM");
    // The tree, the cgroup, the mounts: gone (the jail process has exited,
    // so only the script and its fork could carry the marker).
    assert_nothing_left(pid, &marker, &sb);
    eprintln!("cancelled in {} ms (cgroup: {has_cgroup})", took.as_millis());
}

#[test]
fn a_sigint_to_an_inline_run_removes_its_script_copy_and_fresh_output_dir() {
    let sb = Sandbox::new();
    let tmp = sb.dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(jail_bin());
    cmd.arg("run").arg("--json").arg("--rootfs").arg(&sb.rootfs).arg("-c").arg(SLEEPERS);
    cmd.env("TMPDIR", &tmp);
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    // The script copy and the output dir exist while it runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_dir(&tmp).unwrap().count() < 2 {
        assert!(Instant::now() < deadline, "jail made no script copy and output dir in TMPDIR");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let it reach the script (a signal during setup is handled the same way).
    std::thread::sleep(Duration::from_millis(1500));
    kill(Pid::from_raw(pid as i32), Signal::SIGINT).unwrap();
    let (code, out) = wait_output(child, Duration::from_secs(10));
    let r: RunResult = serde_json::from_slice(&out).expect("a result document on stdout");
    assert_eq!(r.status, Status::Cancelled, "{r:?}");
    assert_eq!(r.supervisor.cancelled_by.as_deref(), Some("SIGINT"));
    assert_eq!(code, Some(130), "exit 128 + SIGINT");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(left, Vec::<std::path::PathBuf>::new(), "temp dirs left behind");
    assert_eq!(r.output_dir, None, "the removed output dir is not reported");
    assert_eq!(cgroups_left_by(pid), Vec::<std::path::PathBuf>::new(), "a run cgroup was left behind");
}
