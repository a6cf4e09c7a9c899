//! Streaming mode (issue 15): without `--json` the script's output goes
//! to the caller live, and the same caps hold as when it is captured; a
//! caller that stops reading holds up neither the deadline nor `jail`.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jail_tests::*;

/// `jail run` in streaming mode (no `--json`) for `source`.
fn streaming(sb: &Sandbox, flags: &[&str], source: &str) -> Command {
    let script = sb.script(source);
    let mut cmd = Command::new(jail_bin());
    cmd.arg("run").arg("--rootfs").arg(&sb.rootfs).arg("--output").arg(&sb.output);
    cmd.args(flags).arg(script);
    cmd
}

/// Wait for `child` at most `limit`; kill it past that. Returns how long it
/// ran and its exit code (None when it had to be killed).
fn wait_at_most(child: &mut Child, limit: Duration) -> (Duration, Option<i32>) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (start.elapsed(), status.code());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (start.elapsed(), None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

const MARKER: &str = "[jail: the script's output passed limits.stdout_bytes";

#[test]
fn two_hundred_fifty_six_mebibytes_streamed_are_cut_at_the_cap() {
    let sb = Sandbox::new();
    let out = streaming(
        &sb,
        &[],
        r#"
import sys
chunk = b"y" * (1 << 20)
for _ in range(256):
    sys.stdout.buffer.write(chunk)
sys.stdout.buffer.write(b"END")
"#,
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stdout = out.stdout;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let cap = 1 << 20; // limits.stdout_bytes in the default policy
    assert!(stdout.len() < cap + 200, "the caller got {} bytes", stdout.len());
    assert!(stdout[..cap].iter().all(|&b| b == b'y'), "the first {cap} bytes are the script's");
    let tail = String::from_utf8_lossy(&stdout[cap..]);
    assert!(tail.starts_with(&format!("\n{MARKER} (1048576 bytes); the rest is dropped]\n")), "{tail:?}");
    assert_eq!(tail.matches(MARKER).count(), 1, "{tail:?}");
    assert!(!tail.contains("END"));
    assert!(stderr.contains("(status output_limit)"), "{stderr}");
    // The script's own exit status, as with a captured run.
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn a_caller_that_stops_reading_does_not_hold_the_deadline() {
    let sb = Sandbox::new();
    // Half a mebibyte on each stream (under the caps, far over a pipe's
    // buffer), then a sleep past the deadline. Nobody reads either pipe
    // until jail has ended.
    let mut child = streaming(
        &sb,
        &["--timeout", "2"],
        r#"
import os, sys, time
for _ in range(64):
    sys.stdout.buffer.write(b"o" * 8192)
    sys.stderr.buffer.write(b"e" * 8192)
time.sleep(60)
"#,
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (took, code) = wait_at_most(&mut child, Duration::from_secs(20));
    assert_eq!(code, Some(124), "jail did not end by itself at its deadline (ran {took:?})");
    // Python's start is inside the 2 s; the rest is the kill and the end.
    assert!(took < Duration::from_millis(3000), "jail ended {took:?} after it started, for a 2 s limit");
    let mut got = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    assert!(!got.is_empty() && got.iter().all(|&b| b == b'o'), "{} bytes", got.len());
}

#[test]
fn a_caller_that_closed_its_end_does_not_stop_the_run() {
    let sb = Sandbox::new();
    let mut child =
        streaming(&sb, &[], "import sys\nfor _ in range(1000):\n    print('x' * 1000)\nopen('done.txt', 'w').write('ok')\n")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    drop(child.stdout.take());
    let (_, code) = wait_at_most(&mut child, Duration::from_secs(20));
    assert_eq!(code, Some(0));
    assert_eq!(std::fs::read_to_string(sb.output.join("done.txt")).unwrap(), "ok");
}
