//! The result contract: one JSON document per run, printed by `jail run --json`
//! and deserialized by the agent. This is the only definition of it.
//!
//! Fields that a later stage of the project fills are present with honest
//! empty or null values, never invented numbers: `null` means "not measured".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change to this document.
pub const SCHEMA_VERSION: u32 = 1;

/// Exit status of `jail` when the script ran past its wall-clock limit.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status of `jail` when the jail itself failed to set up.
pub const EXIT_SETUP_FAILED: i32 = 125;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub schema_version: u32,
    pub status: Status,
    /// The script's exit code, when it exited normally.
    pub exit_code: Option<i32>,
    /// The signal number that ended the script, when one did.
    pub signal: Option<i32>,
    /// The signal's name (`SIGKILL`), when one ended the script.
    pub signal_name: Option<String>,
    pub stdout: Stream,
    pub stderr: Stream,
    /// The Python exception, when stderr ends with one.
    pub error: Option<PythonError>,
    pub usage: Usage,
    /// Every limit, its value and what enforced it.
    pub limits: BTreeMap<String, LimitReport>,
    pub isolation: Isolation,
    /// Syscalls the jail refused, by name (and address family), most
    /// frequent first. Empty when `isolation.seccomp.denials_counted` is
    /// false.
    pub denials: Vec<Denial>,
    /// Files the step left in the output dir, as collected by the supervisor.
    pub artifacts: Vec<serde_json::Value>,
    /// Entries of the output dir that were refused, with the reason.
    pub rejected_artifacts: Vec<serde_json::Value>,
    /// Host path of the output dir (created by the jail when none was given).
    pub output_dir: Option<String>,
    pub timings: Timings,
    pub setup_error: Option<SetupError>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    NonzeroExit,
    Signaled,
    TimeoutWall,
    TimeoutCpu,
    OomKilled,
    OutputLimit,
    SetupFailed,
}

/// One captured output stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Stream {
    /// The text kept: all of it, or the head and tail around a marker when it
    /// was over the cap. Invalid UTF-8 is replaced. Empty in streaming mode.
    pub text: String,
    /// Bytes the script wrote to the stream in total.
    pub bytes: u64,
    /// Whether `text` is missing part of the stream.
    pub truncated: bool,
    /// Whether the stream was streamed to the caller instead of captured.
    pub streamed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PythonError {
    /// Exception type, e.g. `ZeroDivisionError`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// The last lines of the traceback.
    pub traceback_tail: String,
}

/// What the run used. `null` means this host or build did not measure it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub wall_ms: f64,
    pub user_cpu_ms: Option<f64>,
    pub system_cpu_ms: Option<f64>,
    /// Peak memory of the whole run (cgroup accounting).
    pub peak_memory_bytes: Option<u64>,
    /// Largest resident set of any single process in the run (getrusage).
    pub max_rss_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
    pub oom_kills: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LimitReport {
    pub value: serde_json::Value,
    /// What enforced it: `supervisor`, `tmpfs`, `cgroup_v2`, `cgroup_v1`,
    /// `rlimit`, or `none`.
    pub enforced_by: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Isolation {
    pub policy: String,
    pub policy_hash: String,
    pub rootfs: String,
    pub namespaces: Vec<String>,
    /// uid and gid inside the jail.
    pub uid: u32,
    pub gid: u32,
    /// Host uid and gid the sandbox identity is mapped to.
    pub host_uid: u32,
    pub host_gid: u32,
    pub capabilities: Vec<String>,
    pub no_new_privs: bool,
    pub landlock: LandlockReport,
    pub seccomp: SeccompReport,
    /// Layers that are not fully enforced on this run, in plain words.
    pub degraded: Vec<String>,
}

/// How much of a layer this run got.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LayerStatus {
    /// Every rule of the layer is in force.
    Enforced,
    /// Some rules are in force; `missing` says which are not.
    Partial,
    /// None is (or the run failed before the layer was set up).
    #[default]
    NotEnforced,
}

/// `isolation.landlock`: the filesystem, TCP and IPC rules.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LandlockReport {
    pub status: LayerStatus,
    /// The policy's `landlock.mode`: `required` or `best_effort`.
    pub mode: String,
    /// The Landlock ABI the rules were built for and enforced at (0: none).
    pub abi: u32,
    /// The ABI this kernel offers (0: no Landlock).
    pub kernel_abi: u32,
    /// What this kernel's ABI leaves out of the rules, in plain words.
    pub missing: Vec<String>,
    pub detail: Option<String>,
}

/// `isolation.seccomp`: the syscall allowlist.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SeccompReport {
    pub status: LayerStatus,
    /// What a syscall outside the allowlist gets, e.g. `errno ENOSYS`.
    pub default_action: String,
    /// Rules in the policy's `seccomp.rules`.
    pub rules: usize,
    /// BPF instructions in the loaded program.
    pub instructions: usize,
    /// sha256 of the loaded BPF program.
    pub filter_sha256: String,
    /// Whether refusals are counted into `denials` (seccomp user
    /// notification); false on kernels without it.
    pub denials_counted: bool,
    pub detail: Option<String>,
}

/// The state of one optional layer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Layer {
    /// `enforced`, `partial`, `not_enforced`.
    pub status: String,
    pub detail: Option<String>,
}

/// One kind of refused call, counted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Denial {
    /// The layer that refused it: `seccomp`.
    pub layer: String,
    /// The syscall's name, e.g. `socket`, `ptrace`.
    pub what: String,
    /// How many times it was refused.
    pub count: u64,
    /// For socket() and socketpair(): the address family asked for
    /// (`AF_INET`).
    pub family: Option<String>,
    /// The error the call returned (`EPERM`, `ENOSYS`).
    pub errno: Option<String>,
    /// Why the policy refuses it: the `why` of the rule (or the default).
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Timings {
    /// Wall time from the start of `jail run` to the result.
    pub total_ms: f64,
    /// From start to the child's exec of the interpreter.
    pub setup_ms: Option<f64>,
    /// Each setup stage in milliseconds, in the order it ran.
    pub stages: BTreeMap<String, f64>,
}

/// Where and why the jail itself failed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SetupError {
    pub stage: String,
    pub message: String,
    pub causes: Vec<String>,
}

impl RunResult {
    /// The exit status `jail` itself should return for this result.
    pub fn jail_exit_code(&self) -> i32 {
        match self.status {
            Status::SetupFailed => EXIT_SETUP_FAILED,
            Status::TimeoutWall | Status::TimeoutCpu => EXIT_TIMEOUT,
            _ => match (self.exit_code, self.signal) {
                (Some(code), _) => code,
                (None, Some(sig)) => 128 + sig,
                (None, None) => EXIT_SETUP_FAILED,
            },
        }
    }

    /// A result for a run that never started.
    pub fn setup_failed(error: SetupError) -> RunResult {
        RunResult {
            schema_version: SCHEMA_VERSION,
            status: Status::SetupFailed,
            exit_code: None,
            signal: None,
            signal_name: None,
            stdout: Stream::default(),
            stderr: Stream::default(),
            error: None,
            usage: Usage::default(),
            limits: BTreeMap::new(),
            isolation: Isolation::default(),
            denials: Vec::new(),
            artifacts: Vec::new(),
            rejected_artifacts: Vec::new(),
            output_dir: None,
            timings: Timings::default(),
            setup_error: Some(error),
        }
    }
}

/// Find the Python exception at the end of a stderr text.
pub fn parse_python_error(stderr: &str) -> Option<PythonError> {
    let lines: Vec<&str> = stderr.lines().collect();
    let last = lines.iter().rposition(|l| !l.trim().is_empty())?;
    let line = lines[last];
    let (kind, message) = match line.split_once(": ") {
        Some((k, m)) => (k, m),
        None => (line.trim_end_matches(':'), ""),
    };
    let looks_like_type = !kind.is_empty()
        && !kind.starts_with(' ')
        && kind.split('.').all(|part| {
            let mut c = part.chars();
            matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
                && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
        });
    let has_traceback = lines[..last].iter().any(|l| {
        l.starts_with("Traceback (most recent call last):") || l.trim_start().starts_with("File \"")
    });
    if !looks_like_type || !has_traceback {
        return None;
    }
    let start = lines[..last]
        .iter()
        .rposition(|l| l.starts_with("Traceback (most recent call last):"))
        .unwrap_or(0)
        .max((last + 1).saturating_sub(20));
    Some(PythonError {
        kind: kind.to_string(),
        message: message.to_string(),
        traceback_tail: lines[start..=last].join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exception_at_the_end_of_stderr_is_parsed() {
        let err = "noise\nTraceback (most recent call last):\n  File \"/workspace/code/s.py\", line 1, in <module>\n    1/0\nZeroDivisionError: division by zero\n";
        let e = parse_python_error(err).unwrap();
        assert_eq!(e.kind, "ZeroDivisionError");
        assert_eq!(e.message, "division by zero");
        assert!(e.traceback_tail.starts_with("Traceback"));
    }

    #[test]
    fn dotted_exception_types_and_syntax_errors_are_parsed() {
        let err = "  File \"/workspace/code/s.py\", line 1\n    x = (\n        ^\nSyntaxError: '(' was never closed\n";
        assert_eq!(parse_python_error(err).unwrap().kind, "SyntaxError");
        let err = "Traceback (most recent call last):\n  File \"x\", line 2\nurllib.error.URLError: <urlopen error>\n";
        assert_eq!(parse_python_error(err).unwrap().kind, "urllib.error.URLError");
    }

    #[test]
    fn plain_stderr_is_not_an_exception() {
        assert_eq!(parse_python_error("warning: something happened\n"), None);
        assert_eq!(parse_python_error(""), None);
    }

    #[test]
    fn exit_code_follows_the_status() {
        let mut r = RunResult::setup_failed(SetupError { stage: "s".into(), message: "m".into(), causes: vec![] });
        assert_eq!(r.jail_exit_code(), 125);
        r.status = Status::TimeoutWall;
        assert_eq!(r.jail_exit_code(), 124);
        r.status = Status::Signaled;
        r.signal = Some(9);
        assert_eq!(r.jail_exit_code(), 137);
        r.status = Status::NonzeroExit;
        r.exit_code = Some(3);
        assert_eq!(r.jail_exit_code(), 3);
    }

    #[test]
    fn result_round_trips_through_json() {
        let r = RunResult::setup_failed(SetupError { stage: "mounts".into(), message: "m".into(), causes: vec!["c".into()] });
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"status\":\"setup_failed\""));
        let back: RunResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }
}
