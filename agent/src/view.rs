//! The compact view of one jail result that goes back to the model: status
//! and exit code, the Python error, the head and tail of the output within a
//! budget, the rich results (each one's text and the other forms it has),
//! the files the step left, and plain-words explanations of statuses
//! and denials ("network access is disabled in this sandbox"). Pure: a
//! `RunResult` and a listing in, text out.
//!
//! `artifacts`, `rejected_artifacts` and `denials` are read through their
//! JSON form, whatever fields the jail puts in them, so a richer result does
//! not break the view.

use std::collections::BTreeMap;

use jail::result::{RunResult, Status};
use serde_json::Value;

use crate::session::{display_path, Entry, EntryKind};

/// How much of a result the model sees.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub stdout_chars: usize,
    pub stderr_chars: usize,
    pub traceback_chars: usize,
    pub files: usize,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget { stdout_chars: 3000, stderr_chars: 1500, traceback_chars: 1500, files: 30 }
    }
}

pub const NETWORK_DISABLED: &str = "network access is disabled in this sandbox: there is no internet, no DNS and no other host to reach. Use only the files in /workspace/input; do not retry the download.";

/// Render the view. `before` is the output dir's files before the step
/// (path → size, mtime), `after` its listing after.
pub fn render(result: &RunResult, before: &BTreeMap<String, (u64, i128)>, after: &[Entry], budget: Budget) -> String {
    let mut out = String::new();
    let code = match (result.exit_code, &result.signal_name, result.signal) {
        (Some(c), _, _) => format!(" (exit code {c})"),
        (None, Some(name), _) => format!(" (killed by {name})"),
        (None, None, Some(s)) => format!(" (killed by signal {s})"),
        _ => String::new(),
    };
    out.push_str(&format!("status: {}{code}\n", status_name(result.status)));
    let mut usage = vec![format!("wall {:.0} ms", result.usage.wall_ms)];
    if let (Some(u), Some(s)) = (result.usage.user_cpu_ms, result.usage.system_cpu_ms) {
        usage.push(format!("cpu {:.0} ms", u + s));
    }
    if let Some(m) = result.usage.peak_memory_bytes.or(result.usage.max_rss_bytes) {
        usage.push(format!("peak memory {:.1} MiB", m as f64 / 1048576.0));
    }
    out.push_str(&format!("usage: {}\n", usage.join(", ")));
    for e in explain(result) {
        out.push_str(&format!("explanation: {e}\n"));
    }
    if let Some(hint) = output_hint(result, after) {
        out.push_str(&format!("explanation: {hint}\n"));
    }
    if let Some(err) = &result.error {
        let headline = format!("{}: {}", err.kind, err.message);
        out.push_str(&format!("error: {headline}\n"));
        // The traceback's last line is the headline again: leave it out.
        let tb = err.traceback_tail.trim_end();
        let tb = tb.strip_suffix(headline.as_str()).unwrap_or(tb).trim_end();
        if !tb.is_empty() {
            out.push_str(&format!("traceback (tail):\n{}\n", tail(tb, budget.traceback_chars)));
        }
    }
    out.push_str(&stream("stdout", &result.stdout, &result.stdout.text, budget.stdout_chars));
    out.push_str(&results(result, budget.stdout_chars));
    let stderr_rest = match &result.error {
        // The traceback is shown above; keep what the script wrote before it.
        Some(_) => result
            .stderr
            .text
            .rfind("Traceback (most recent call last):")
            .map_or("", |i| &result.stderr.text[..i]),
        None => &result.stderr.text,
    };
    if !stderr_rest.trim().is_empty() || (result.error.is_none() && result.stderr.bytes > 0) {
        out.push_str(&stream("stderr", &result.stderr, stderr_rest, budget.stderr_chars));
    }
    out.push_str(&files(result, before, after, budget.files));
    let rejected = &result.rejected_artifacts;
    if !rejected.is_empty() {
        out.push_str("refused by the jail (not handed on):\n");
        for r in rejected.iter().take(budget.files) {
            let r = &serde_json::to_value(r).unwrap_or(Value::Null);
            let path = field_str(r, &["path", "name"]).unwrap_or_else(|| "?".into());
            let reason = field_str(r, &["reason", "why", "detail"]).unwrap_or_else(|| compact(r, 160));
            out.push_str(&format!("  {}: {reason}\n", display_path(&path)));
        }
    }
    out
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::NonzeroExit => "nonzero_exit",
        Status::Signaled => "signaled",
        Status::TimeoutWall => "timeout_wall",
        Status::TimeoutCpu => "timeout_cpu",
        Status::OomKilled => "oom_killed",
        Status::OutputLimit => "output_limit",
        Status::SetupFailed => "setup_failed",
        Status::Cancelled => "cancelled",
    }
}

/// Plain-words explanations of what happened, most important first.
pub fn explain(result: &RunResult) -> Vec<String> {
    let mut out = Vec::new();
    let limit = |name: &str| result.limits.get(name).map(|l| l.value.clone());
    let secs = |v: Option<Value>| v.and_then(|v| v.as_f64()).map(|s| format!("{} s ", trim_float(s))).unwrap_or_default();
    match result.status {
        Status::Ok => {}
        Status::NonzeroExit if result.error.is_some() => {}
        Status::NonzeroExit => out.push(format!(
            "the script exited with code {}; read stderr for why",
            result.exit_code.map_or("?".into(), |c| c.to_string())
        )),
        Status::Signaled => {
            let name = result.signal_name.clone().unwrap_or_else(|| format!("signal {}", result.signal.unwrap_or(0)));
            if name == "SIGSYS" || result.signal == Some(31) {
                out.push("the script made a system call the sandbox forbids and was killed (SIGSYS); do not use low-level process, mount or kernel controls".into());
            } else {
                out.push(format!("the script was killed by {name}"));
            }
        }
        Status::TimeoutWall => out.push(format!(
            "the script ran past its {}wall-clock limit and was killed; make it faster (vectorise, sample the data, avoid per-row loops) or split the work across steps",
            secs(limit("wall_time_secs"))
        )),
        Status::TimeoutCpu => out.push(format!(
            "the script used up its {}CPU-time limit and was killed; make it do less work per step",
            secs(limit("cpu_time_secs"))
        )),
        Status::OomKilled => out.push(format!(
            "the script ran out of memory{} and was killed; process less data at once (read only the columns you need, use chunks)",
            limit("memory_bytes").and_then(|v| v.as_u64()).map(|b| format!(" (limit {} MiB)", b >> 20)).unwrap_or_default()
        )),
        Status::Cancelled => out.push("the step was cancelled before it finished (the sandbox was stopped from outside); its output is partial".into()),
        Status::OutputLimit => out.push("the script printed more than the sandbox's output cap; print short summaries and write large results to files in /workspace/output".into()),
        Status::SetupFailed => {
            let why = result.setup_error.as_ref().map(setup_cause).unwrap_or_else(|| "no reason given".into());
            out.push(format!("the sandbox could not start, so the script did not run; this is not a problem with your code: {why}"));
        }
    }
    if let Some(err) = &result.error {
        let all = format!("{}: {}\n{}", err.kind, err.message, err.traceback_tail);
        if looks_like_network(&all) {
            out.push(NETWORK_DISABLED.into());
        } else if err.kind.ends_with("ModuleNotFoundError") || err.kind.ends_with("ImportError") {
            out.push("that module is not installed in this sandbox and cannot be installed (no network, read-only system); call list_available_packages and use what is there".into());
        } else if all.contains("Read-only file system")
            || (err.kind.ends_with("PermissionError") && !all.contains("/workspace/output"))
        {
            out.push(
                "only /workspace/output and /tmp are writable; /workspace/input, /workspace/code and the system are read-only"
                    .into(),
            );
        } else if err.kind.ends_with("FileNotFoundError") {
            out.push("a file was not found: check the exact names with list_input_files and list_output_files (the user's files are in /workspace/input, earlier steps' files in /workspace/output)".into());
        } else if err.kind.ends_with("MemoryError") {
            out.push("the script ran out of memory; process less data at once".into());
        } else if err.kind == "KeyboardInterrupt" && result.status == Status::TimeoutWall {
            // A session's cell past its limit is interrupted first: the
            // timeout above says it all.
        } else {
            out.push(format!("the script raised {}; fix the cause in the code and run it again", err.kind));
        }
    } else if result.status == Status::NonzeroExit && looks_like_network(&result.stderr.text) {
        out.push(NETWORK_DISABLED.into());
    }
    let denials = serde_json::to_value(&result.denials).unwrap_or(Value::Null);
    for d in denials.as_array().into_iter().flatten() {
        let line = explain_denial(d);
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

/// Most bytes of a setup failure's cause chain the model sees.
const SETUP_CAUSE_BYTES: usize = 800;

/// A setup failure with its whole cause chain, within a budget: the
/// message says what failed, the causes say why ("the output dir holds more
/// than filesystem.output_size").
fn setup_cause(e: &jail::result::SetupError) -> String {
    let mut out = format!("{} (stage {})", crate::escape::shown(&e.message), crate::escape::shown(&e.stage));
    for c in &e.causes {
        let c = crate::escape::shown(c);
        if out.len() + c.len() + 10 > SETUP_CAUSE_BYTES {
            out.push_str("; … (more causes cut)");
            break;
        }
        out.push_str(": ");
        out.push_str(&c);
    }
    out
}

/// When the output dir is what stopped the sandbox from starting: its
/// largest files, from the agent's own listing, so the model knows what to
/// delete.
fn output_hint(result: &RunResult, after: &[Entry]) -> Option<String> {
    let e = result.setup_error.as_ref()?;
    if result.status != Status::SetupFailed || e.stage != "output" {
        return None;
    }
    let mut files: Vec<&Entry> = after.iter().filter(|e| e.kind == EntryKind::File).collect();
    files.sort_by_key(|e| std::cmp::Reverse(e.bytes));
    let total: u64 = files.iter().map(|e| e.bytes).sum();
    let largest: Vec<String> = files
        .iter()
        .take(5)
        .map(|e| format!("{} ({})", display_path(&e.rel), human_bytes(e.bytes)))
        .collect();
    Some(format!(
        "the output dir holds {} in all; its largest files: {}. Delete what is not needed with delete_output_file, then run the step again (and write less).",
        human_bytes(total),
        if largest.is_empty() { "none".into() } else { largest.join(", ") }
    ))
}

fn explain_denial(d: &Value) -> String {
    let what = field_str(d, &["what", "syscall", "name", "access"]).unwrap_or_else(|| compact(d, 120));
    let count = d.get("count").and_then(Value::as_u64).map(|c| format!(" ({c}×)")).unwrap_or_default();
    let detail = field_str(d, &["family", "path", "detail"]).map(|s| format!(": {s}")).unwrap_or_default();
    let lower = format!("{what} {detail}").to_lowercase();
    if ["socket", "connect", "inet", "network", "sendto", "bind"].iter().any(|w| lower.contains(w)) {
        format!("{NETWORK_DISABLED} (the jail refused {what}{detail}{count})")
    } else if [
        "ptrace",
        "mount",
        "unshare",
        "clone",
        "setns",
        "bpf",
        "keyctl",
        "perf_event",
        "reboot",
        "kexec",
        "init_module",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        format!("the sandbox forbids {what}{detail}{count}: process, mount and kernel controls are off limits")
    } else {
        format!("the sandbox refused {what}{detail}{count}")
    }
}

fn looks_like_network(text: &str) -> bool {
    [
        "Network is unreachable",
        "Errno 101",
        "Name or service not known",
        "Temporary failure in name resolution",
        "No address associated with hostname",
        "gaierror",
        "urlopen error",
        "Address family not supported",
        "NewConnectionError",
        "Max retries exceeded with url",
        "getaddrinfo failed",
    ]
    .iter()
    .any(|m| text.contains(m))
}

fn stream(name: &str, s: &jail::result::Stream, text: &str, budget: usize) -> String {
    if s.streamed {
        return format!("{name}: (streamed, not captured)\n");
    }
    if text.trim().is_empty() {
        return if s.bytes == 0 { format!("{name}: (empty)\n") } else { String::new() };
    }
    let cut = if s.truncated {
        format!(", the jail kept only the head and tail of {} bytes", s.bytes)
    } else {
        String::new()
    };
    format!("{name} ({} bytes{cut}):\n{}\n", s.bytes, head_tail(text.trim_end(), budget))
}

/// Rich results, compactly: each one's text within a share of `budget`,
/// and the other forms it has by name and size (an image is not text the
/// model can read; its file is the way to keep it).
fn results(result: &RunResult, budget: usize) -> String {
    const MOST: usize = 10;
    if result.results.is_empty() && result.results_dropped == 0 {
        return String::new();
    }
    let share = (budget / result.results.len().clamp(1, MOST)).max(80);
    let mut out = String::new();
    for r in result.results.iter().take(MOST) {
        let what = if r.is_main_result { "result" } else { "display" };
        let others: Vec<String> = r
            .data
            .iter()
            .filter(|(m, _)| m.as_str() != "text/plain")
            .map(|(m, v)| match v.as_str() {
                Some(s) if m.starts_with("image/") => format!("{m} {}", human_bytes(s.len() as u64 / 4 * 3)),
                _ => m.clone(),
            })
            .collect();
        let also = if others.is_empty() {
            String::new()
        } else {
            format!(" (also {})", others.join(", "))
        };
        let text = r.data.get("text/plain").and_then(Value::as_str).unwrap_or("");
        out.push_str(&format!("{what}{also}:\n{}\n", head_tail(text.trim_end(), share)));
    }
    let more = result.results.len().saturating_sub(MOST) as u64 + result.results_dropped;
    if more > 0 {
        out.push_str(&format!("[… {more} more results not shown …]\n"));
    }
    out
}

/// The head and tail of `text` within `budget` characters.
pub fn head_tail(text: &str, budget: usize) -> String {
    let n = text.chars().count();
    if n <= budget {
        return text.to_string();
    }
    let half = budget / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(n - half).collect();
    format!("{head}\n[… {} characters not shown …]\n{tail}", n - 2 * half)
}

fn tail(text: &str, budget: usize) -> String {
    let n = text.chars().count();
    if n <= budget {
        return text.to_string();
    }
    format!("[…]{}", text.chars().skip(n - budget).collect::<String>())
}

fn files(result: &RunResult, before: &BTreeMap<String, (u64, i128)>, after: &[Entry], max: usize) -> String {
    let mut out = String::new();
    if !result.artifacts.is_empty() {
        out.push_str(&format!("artifacts ({}, collected by the jail):\n", result.artifacts.len()));
        for a in result.artifacts.iter().take(max) {
            let a = &serde_json::to_value(a).unwrap_or(Value::Null);
            let path = field_str(a, &["path", "name"]).unwrap_or_else(|| "?".into());
            let mut facts = Vec::new();
            if let Some(b) = a.get("bytes").or_else(|| a.get("size")).and_then(Value::as_u64) {
                facts.push(human_bytes(b));
            }
            for k in ["media_type", "mime", "change", "state"] {
                if let Some(v) = a.get(k).and_then(Value::as_str) {
                    facts.push(v.to_string());
                }
            }
            if let Some(flags) = a.get("flags").filter(|f| f.as_array().is_some_and(|a| !a.is_empty())) {
                facts.push(format!("flags {}", compact(flags, 120)));
            }
            let summary = a
                .get("summary")
                .filter(|s| !s.is_null())
                .map(|s| format!(" — {}", compact(s, 240)))
                .unwrap_or_default();
            out.push_str(&format!("  {} ({}){summary}\n", display_path(&path), facts.join(", ")));
        }
        if result.artifacts.len() > max {
            out.push_str(&format!("  … and {} more\n", result.artifacts.len() - max));
        }
        return out;
    }
    let shown: Vec<&Entry> = after.iter().filter(|e| e.kind != EntryKind::Dir).collect();
    if shown.is_empty() {
        return "files in /workspace/output: none\n".into();
    }
    out.push_str(&format!("files in /workspace/output ({}, listed by the agent):\n", shown.len()));
    for e in shown.iter().take(max) {
        let change = match (e.kind, before.get(&e.rel)) {
            (EntryKind::Symlink, _) => "a symbolic link: it will not be read or handed on".to_string(),
            (EntryKind::Other, _) => "not a regular file: it will not be read or handed on".to_string(),
            (_, None) => format!("{}, new", human_bytes(e.bytes)),
            (_, Some(&(b, m))) if b != e.bytes || m != e.mtime_ns => {
                format!("{}, changed", human_bytes(e.bytes))
            }
            (_, Some(_)) => format!("{}, unchanged", human_bytes(e.bytes)),
        };
        out.push_str(&format!("  {} ({change})\n", display_path(&e.rel)));
    }
    if shown.len() > max {
        out.push_str(&format!("  … and {} more\n", shown.len() - max));
    }
    let gone: Vec<&String> = before.keys().filter(|k| !after.iter().any(|e| &e.rel == *k)).collect();
    if !gone.is_empty() {
        let names: Vec<String> = gone.iter().take(max).map(|k| display_path(k)).collect();
        out.push_str(&format!("  deleted by this step: {}\n", names.join(", ")));
    }
    out
}

pub fn human_bytes(b: u64) -> String {
    if b < 1024 {
        format!("{b} B")
    } else if b < 1 << 20 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", b as f64 / 1048576.0)
    }
}

fn trim_float(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

fn field_str(v: &Value, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| match v.get(*k)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    })
}

fn compact(v: &Value, n: usize) -> String {
    crate::llm::excerpt(&v.to_string(), n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jail::result::{Artifact, Change, LimitReport, PythonError, RejectReason, RejectedArtifact, SetupError, Summary};
    use serde_json::json;

    fn result(status: Status) -> RunResult {
        let mut r = RunResult::setup_failed(SetupError { stage: "s".into(), message: "m".into(), causes: vec![] });
        r.setup_error = None;
        r.status = status;
        r
    }

    #[test]
    fn rich_results_show_their_text_and_name_their_other_forms() {
        let mut r = result(Status::Ok);
        let bundle = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        r.results = vec![
            jail::result::DisplayResult {
                data: bundle(&[("text/plain", "<Figure size 640x480>"), ("image/png", &"A".repeat(4000))]),
                is_main_result: false,
                flags: vec![],
                refused: vec![],
            },
            jail::result::DisplayResult {
                data: bundle(&[("text/plain", "2")]),
                is_main_result: true,
                flags: vec![],
                refused: vec![],
            },
        ];
        r.results_dropped = 3;
        let view = render(&r, &BTreeMap::new(), &[], Budget::default());
        assert!(view.contains("display (also image/png 2.9 KiB):\n<Figure size 640x480>\n"), "{view}");
        assert!(view.contains("result:\n2\n"), "{view}");
        assert!(view.contains("[… 3 more results not shown …]"), "{view}");
        assert!(!view.contains("AAAA"), "an image's base64 reached the model: {view}");
    }

    #[test]
    fn a_wall_timeout_is_explained_with_its_limit() {
        let mut r = result(Status::TimeoutWall);
        r.limits
            .insert("wall_time_secs".into(), LimitReport { value: json!(15.0), enforced_by: "supervisor".into(), detail: None });
        let e = explain(&r);
        assert!(e[0].starts_with("the script ran past its 15 s wall-clock limit and was killed"), "{e:?}");
    }

    #[test]
    fn a_setup_failure_shows_its_cause_chain_and_the_files_in_the_way() {
        let mut r = RunResult::setup_failed(SetupError {
            stage: "output".into(),
            message: "fill the jail's output dir".into(),
            causes: std::iter::once(
                "the output dir holds more than filesystem.output_size; raise it, or pass an emptier --output".to_string(),
            )
            .chain(std::iter::repeat_n("x".repeat(5000), 6))
            .collect(),
        });
        r.status = Status::SetupFailed;
        let after = vec![
            Entry { rel: "small.csv".into(), bytes: 10, kind: EntryKind::File, mtime_ns: 0 },
            Entry { rel: "big.csv".into(), bytes: 200 << 20, kind: EntryKind::File, mtime_ns: 0 },
        ];
        let v = render(&r, &BTreeMap::new(), &after, Budget::default());
        assert!(v.contains("this is not a problem with your code: fill the jail's output dir (stage output): the output dir holds more than filesystem.output_size"), "{v}");
        assert!(v.contains("(more causes cut)") && v.len() < 3000, "{v}");
        assert!(v.contains("largest files: big.csv (200.0 MiB), small.csv (10 B)"), "{v}");
    }

    #[test]
    fn a_dns_failure_is_explained_as_no_network() {
        let mut r = result(Status::NonzeroExit);
        r.exit_code = Some(1);
        r.error = Some(PythonError {
            kind: "urllib.error.URLError".into(),
            message: "<urlopen error [Errno -2] Name or service not known>".into(),
            traceback_tail: String::new(),
        });
        assert!(explain(&r).iter().any(|e| e.starts_with("network access is disabled in this sandbox")));
    }

    #[test]
    fn denials_and_artifacts_of_any_shape_are_shown() {
        let mut r = result(Status::Ok);
        r.exit_code = Some(0);
        r.denials = serde_json::from_value(json!([{"layer": "seccomp", "what": "socket", "count": 2, "family": "AF_INET", "errno": "EPERM", "detail": "the network is off"}])).unwrap();
        r.artifacts = vec![Artifact {
            path: "a.csv".into(),
            bytes: 2048,
            sha256: Some("00".into()),
            media_type: Some("text/csv".into()),
            change: Change::Created,
            flags: vec![],
            summary: Some(Summary::Csv { rows: 3, columns: 1, header: vec!["x".into()] }),
            neutralised: None,
        }];
        r.rejected_artifacts = vec![RejectedArtifact {
            path: "evil".into(),
            reason: RejectReason::Symlink,
            detail: "a symbolic link".into(),
            disposition: Default::default(),
            moved_to: None,
        }];
        let v = render(&r, &BTreeMap::new(), &[], Budget::default());
        assert!(v.contains("network access is disabled"), "{v}");
        assert!(v.contains("refused socket: AF_INET (2×)"), "{v}");
        assert!(
            v.contains("a.csv (2.0 KiB, text/csv, created) — {\"columns\":1,\"header\":[\"x\"],\"kind\":\"csv\",\"rows\":3}"),
            "{v}"
        );
        assert!(v.contains("evil: symlink"), "{v}");
    }

    #[test]
    fn long_output_keeps_its_head_and_tail_within_budget() {
        let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let v = head_tail(&text, 200);
        assert!(v.starts_with("line 0\n") && v.trim_end().ends_with("line 999"));
        assert!(v.chars().count() < 260);
    }

    #[test]
    fn listed_files_say_whether_the_step_made_or_changed_them() {
        let r = result(Status::Ok);
        let before: BTreeMap<_, _> = [("old.csv".to_string(), (5u64, 1i128)), ("gone.txt".to_string(), (1, 1))].into();
        let after = vec![
            Entry { rel: "old.csv".into(), bytes: 9, kind: EntryKind::File, mtime_ns: 2 },
            Entry { rel: "new.png".into(), bytes: 10, kind: EntryKind::File, mtime_ns: 2 },
            Entry { rel: "l".into(), bytes: 3, kind: EntryKind::Symlink, mtime_ns: 2 },
        ];
        let v = render(&r, &before, &after, Budget::default());
        assert!(v.contains("old.csv (9 B, changed)") && v.contains("new.png (10 B, new)"), "{v}");
        assert!(v.contains("l (a symbolic link") && v.contains("deleted by this step: gone.txt"), "{v}");
    }
}
