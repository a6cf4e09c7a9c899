//! `jail run --events` (issue 19 item 3): NDJSON on stdout while the step
//! runs — the script's stdout and stderr in order, the stream caps, each
//! artifact, and a last `result` event equal to what `--json` prints; a
//! reader that stops reading holds up neither the deadline nor the run.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jail_tests::*;
use serde_json::Value;

/// `jail run --events` for `source`, with the sandbox's folders.
fn events_cmd(sb: &Sandbox, flags: &[&str], source: &str) -> Command {
    let script = sb.script(source);
    let mut cmd = Command::new(jail_bin());
    cmd.arg("run").arg("--events").arg("--rootfs").arg(&sb.rootfs);
    cmd.arg("--input").arg(&sb.input).arg("--output").arg(&sb.output);
    cmd.args(flags).arg(script).stdin(Stdio::null());
    cmd
}

/// Every line of `stdout`, parsed: each must be one JSON object with a type.
fn parse_lines(stdout: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(stdout).expect("the event stream is UTF-8");
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not an event ({e}): {l:?}"));
            assert!(v["type"].is_string(), "an event without a type: {l}");
            // The result event carries the document --json prints: the schema holds it.
            if v["type"] == "result" {
                validate_result(&v["result"]).unwrap_or_else(|e| panic!("the result event breaks the schema: {e}"));
            }
            v
        })
        .collect()
}

/// The data of every `kind` chunk event, decoded to bytes (base64 wins
/// where the text had to be replaced).
fn stream_bytes(events: &[Value], kind: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e["type"] == kind) {
        match e["base64"].as_str() {
            Some(b) => out.extend(decode_base64(b)),
            None => out.extend(e["data"].as_str().expect("data").as_bytes()),
        }
    }
    out
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    } as u32;
    let mut out = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let n = quad.iter().filter(|&&c| c != b'=').count();
        let mut acc = 0u32;
        for (i, &c) in quad.iter().enumerate() {
            acc |= if c == b'=' { 0 } else { val(c) } << (18 - 6 * i);
        }
        out.extend(&acc.to_be_bytes()[1..n]);
    }
    out
}

/// What differs between two runs of the same step by nature: times, the
/// fresh output folder's name, the supervisor's own memory, the host uid a
/// root run leased.
fn comparable(mut v: Value) -> Value {
    for key in ["usage", "timings", "supervisor", "output_dir", "output_sync"] {
        v.as_object_mut().unwrap().remove(key);
    }
    for key in ["host_uid", "host_gid"] {
        v["isolation"].as_object_mut().unwrap().remove(key);
    }
    v
}

const ORDERED: &str = r#"
import sys, time
for i in range(5):
    print(f"out {i}", flush=True)
    sys.stderr.write(f"err {i}\n"); sys.stderr.flush()
    time.sleep(0.02)
sys.stdout.buffer.write(b"caf\xc3\xa9 \xff end\n")
open("/workspace/output/table.csv", "w").write("a,b\n1,2\n")
open("/workspace/output/note.txt", "w").write("hello\n")
raise KeyError("missing")
"#;

#[test]
fn events_come_in_order_and_end_with_the_json_result() {
    let sb = Sandbox::new();
    let out = events_cmd(&sb, &[], ORDERED).output().unwrap();
    let events = parse_lines(&out.stdout);
    let last = events.last().expect("no events");
    assert_eq!(last["type"], "result", "the result is the last event");
    assert_eq!(events.iter().filter(|e| e["type"] == "result").count(), 1);
    let result = &last["result"];
    // The exit status is the script's, as with --json.
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));

    // The interleaving the script wrote, flush by flush.
    // (Unbuffered, Python writes a print's text and its newline apart:
    // neighbouring chunks of one stream are joined.)
    let mut chunks: Vec<(String, String)> = Vec::new();
    for e in events.iter().filter(|e| e["type"] == "stdout" || e["type"] == "stderr") {
        let (kind, data) = (e["type"].as_str().unwrap(), e["data"].as_str().unwrap());
        match chunks.last_mut() {
            Some((k, d)) if k == kind => d.push_str(data),
            _ => chunks.push((kind.to_string(), data.to_string())),
        }
    }
    let first: Vec<(String, String)> = chunks.iter().take(10).cloned().collect();
    let want: Vec<(String, String)> = (0..5)
        .flat_map(|i| {
            [
                ("stdout".to_string(), format!("out {i}\n")),
                ("stderr".to_string(), format!("err {i}\n")),
            ]
        })
        .collect();
    assert_eq!(first, want);
    // Bytes that are not UTF-8 come exactly, in base64.
    let stdout = stream_bytes(&events, "stdout");
    assert!(stdout.ends_with(b"caf\xc3\xa9 \xff end\n"), "{:?}", String::from_utf8_lossy(&stdout));
    assert!(events.iter().any(|e| e["type"] == "stdout" && e["base64"].is_string()));
    // What the events carried is what the result captured.
    assert_eq!(String::from_utf8_lossy(&stdout), result["stdout"]["text"].as_str().unwrap());
    assert_eq!(String::from_utf8_lossy(&stream_bytes(&events, "stderr")), result["stderr"]["text"].as_str().unwrap());
    assert_eq!(result["error"]["type"], "KeyError");

    // One artifact event per accepted artifact, the same objects, after the
    // last chunk and before the result.
    let artifacts: Vec<&Value> = events.iter().filter(|e| e["type"] == "artifact").map(|e| &e["artifact"]).collect();
    let listed: Vec<&Value> = result["artifacts"].as_array().unwrap().iter().collect();
    assert_eq!(artifacts, listed);
    assert_eq!(artifacts.len(), 2, "{artifacts:?}");
    let first_artifact = events.iter().position(|e| e["type"] == "artifact").unwrap();
    let last_chunk = events.iter().rposition(|e| e["type"] == "stdout" || e["type"] == "stderr").unwrap();
    assert!(last_chunk < first_artifact);

    // The same step with --json prints the same document.
    let sb2 = Sandbox::new();
    let (_, json_out) = sb2.run(ORDERED);
    let json: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(comparable(result.clone()), comparable(json));
}

#[test]
fn each_stream_is_cut_at_its_cap_with_one_marker() {
    let sb = Sandbox::new();
    // 3 MiB on stdout, past limits.stdout_bytes (1 MiB in the default
    // policy); a little on stderr, which is not cut.
    let out = events_cmd(
        &sb,
        &[],
        "import sys\nfor _ in range(48):\n    sys.stdout.buffer.write(b'y' * 65536)\nsys.stdout.buffer.write(b'END')\nsys.stderr.write('small\\n')\n",
    )
    .output()
    .unwrap();
    let events = parse_lines(&out.stdout);
    let stdout = stream_bytes(&events, "stdout");
    assert_eq!(stdout.len(), 1 << 20, "the events carry exactly the cap");
    assert!(stdout.iter().all(|&b| b == b'y'));
    let marks: Vec<&Value> = events.iter().filter(|e| e["type"] == "truncated").collect();
    assert_eq!(marks, vec![&serde_json::json!({"type":"truncated","stream":"stdout","limit_bytes":1048576})]);
    let after_mark = events.iter().position(|e| e["type"] == "truncated").unwrap();
    assert!(!events[after_mark..].iter().any(|e| e["type"] == "stdout"), "stdout after its marker");
    assert_eq!(stream_bytes(&events, "stderr"), b"small\n");
    let result = &events.last().unwrap()["result"];
    assert_eq!(result["status"], "output_limit");
    assert_eq!(result["stdout"]["truncated"], true);
    assert_eq!(result["stdout"]["bytes"], 3 * (1 << 20) + 3);
}

#[test]
fn a_flood_read_live_arrives_whole_and_in_order() {
    let sb = Sandbox::new();
    // 200 000 numbered lines (~1.3 MB over both streams, each under its cap),
    // read as they come once the reader starts.
    let mut child = events_cmd(&sb, &[], "import sys\nfor i in range(100000):\n    print(i)\n    print(-i, file=sys.stderr)\n")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A slow start: the pipe and the relay's buffer fill, the script waits,
    // and the run goes on once the reader takes what is queued.
    std::thread::sleep(Duration::from_secs(1));
    let reader = BufReader::new(child.stdout.take().unwrap());
    let mut events = Vec::new();
    let mut first_at = None;
    let start = Instant::now();
    for line in reader.lines() {
        let line = line.unwrap();
        first_at.get_or_insert_with(|| start.elapsed());
        events.push(serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let want_out: String = (0..100000).map(|i| format!("{i}\n")).collect();
    let want_err: String = (0..100000).map(|i| format!("{}\n", -i)).collect();
    assert_eq!(String::from_utf8(stream_bytes(&events, "stdout")).unwrap(), want_out);
    assert_eq!(String::from_utf8(stream_bytes(&events, "stderr")).unwrap(), want_err);
    assert!(!events.iter().any(|e| e["type"] == "dropped" || e["type"] == "truncated"));
    assert_eq!(events.last().unwrap()["result"]["status"], "ok");
    assert!(events.len() > 3, "the output came in chunks, not at the end");
}

#[test]
fn a_reader_that_stops_does_not_hold_the_deadline() {
    let sb = Sandbox::new();
    // Far more events than a pipe and the relay's buffer hold, then a sleep
    // past the deadline; nobody reads until 4 s have gone.
    let mut child = events_cmd(
        &sb,
        &["--timeout", "2"],
        "import sys, time\nfor _ in range(64):\n    sys.stdout.buffer.write(b'o' * 8192)\n    sys.stderr.buffer.write(b'e' * 8192)\ntime.sleep(60)\n",
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let mut got = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(124));
    let events = parse_lines(&got);
    let result = &events.last().unwrap()["result"];
    assert_eq!(result["status"], "timeout_wall");
    let overrun = result["supervisor"]["deadline_overrun_ms"].as_f64().unwrap();
    assert!(overrun < 1000.0, "the kill came {overrun} ms after the deadline");
    // What the reader never took by the deadline is dropped and counted; the
    // result still has the text. While the relay's buffer was full the
    // script's pipes were not read: the script waited, not the supervisor.
    let dropped = events.iter().find(|e| e["type"] == "dropped").expect("a dropped event");
    assert!(dropped["events"].as_u64().unwrap() > 0);
    let bytes = result["stdout"]["bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes < 64 * 8192, "{bytes}");
    assert_eq!(result["stdout"]["text"].as_str().unwrap().len() as u64, bytes);
    assert!(stream_bytes(&events, "stdout").len() < bytes as usize);
}

#[test]
fn a_setup_failure_is_one_result_event_and_exit_125() {
    let sb = Sandbox::new();
    let out = events_cmd(&sb, &["--timeout", "0"], "print('never')\n").output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let events = parse_lines(&out.stdout);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["result"]["status"], "setup_failed");
    assert_eq!(events[0]["result"]["setup_error"]["stage"], "input");
}

#[test]
fn output_comes_while_the_script_runs_without_it_flushing() {
    let sb = Sandbox::new();
    // No flush: only an unbuffered interpreter (PYTHONUNBUFFERED, set for
    // --events) writes this before the sleep ends.
    let mut child = events_cmd(&sb, &[], "import time\nprint('early')\ntime.sleep(2)\nprint('late')\n")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let start = Instant::now();
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    let first_at = start.elapsed();
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let ended = start.elapsed();
    child.wait().unwrap();
    // "early" and its newline are two writes, read as one chunk or two.
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["type"], "stdout");
    assert!(first["data"].as_str().unwrap().starts_with("early"), "{first}");
    assert!(ended - first_at > Duration::from_millis(1500), "the first event came {first_at:?} in, the end {ended:?}");
}
