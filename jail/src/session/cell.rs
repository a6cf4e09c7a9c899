//! One cell's facts → its part of the result: the driver's reply read
//! with suspicion, the cell's status decided (by verdict/status.rs's rules, the
//! same as a run's), its denials told apart from the session's. Pure: the
//! cells loop (cells.rs) gathers the facts.
//!
//! The driver runs in the same process as the cell's code, so a cell can
//! write to the control socket itself. A reply is therefore the cell's own
//! word and is trusted for nothing but "this cell says it finished, with
//! this outcome and this exception": bounded in size, checked in shape,
//! its strings cut. Streams, usage, denials and artifacts are what the
//! supervisor saw, never what the reply says.

use std::time::Duration;

use serde::Deserialize;

use crate::result::{Denial, PythonError, Status};
use crate::verdict::status::{self, Cut};

/// The longest `ready` or `done` line believed (a `display` line is
/// display.rs's, within its own bound).
pub(crate) const MAX_REPLY: usize = 256 << 10;
const MAX_TYPE: usize = 256;
const MAX_NONCE: usize = 64;
const MAX_MESSAGE: usize = 8 << 10;
const MAX_TRACEBACK: usize = 32 << 10;

/// How the driver says a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Said {
    /// The cell ran to its end.
    Ok,
    /// It raised an exception (`error`).
    Error,
    /// It raised SystemExit (`exit_code`); the session goes on.
    Exit,
    /// It stopped on KeyboardInterrupt (ours, past its time, or its own).
    Interrupted,
}

/// A reply line from the driver, as far as it is believed.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The interpreter is up and waits for its first cell.
    Ready,
    /// A cell ended.
    Done {
        id: u64,
        /// The nonce of the `exec` it answers (cells.rs).
        nonce: String,
        outcome: Said,
        exit_code: Option<i32>,
        error: Option<PythonError>,
    },
    /// Anything else: not valid JSON, an unknown op, a wrong shape.
    Garbage,
}

#[derive(Deserialize)]
struct Wire {
    op: String,
    #[serde(default)]
    id: Option<u64>,
    #[serde(default)]
    nonce: Option<String>,
    #[serde(default)]
    outcome: Option<Said>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type")]
    kind: String,
    message: String,
    traceback: String,
}

/// Read one reply line (without its newline).
pub fn parse_reply(line: &[u8]) -> Reply {
    if line.len() > MAX_REPLY {
        return Reply::Garbage;
    }
    let Ok(wire) = serde_json::from_slice::<Wire>(line) else { return Reply::Garbage };
    match (wire.op.as_str(), wire.id, wire.outcome) {
        ("ready", _, _) => Reply::Ready,
        ("done", Some(id), Some(outcome)) => Reply::Done {
            id,
            nonce: cut(&wire.nonce.unwrap_or_default(), MAX_NONCE),
            outcome,
            // A code outside a process's range is not one a process could
            // exit with: 1, as Python itself maps an odd SystemExit.
            exit_code: wire.exit_code.map(|c| if (0..=255).contains(&c) { c as i32 } else { 1 }),
            error: wire.error.map(|e| PythonError {
                kind: cut(&e.kind, MAX_TYPE),
                message: cut(&e.message, MAX_MESSAGE),
                traceback_tail: cut_head(&e.traceback, MAX_TRACEBACK),
            }),
        },
        _ => Reply::Garbage,
    }
}

/// The first `max` bytes of `s`, on a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The last `max` bytes of `s` (a traceback's tail is what matters).
fn cut_head(s: &str, max: usize) -> String {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// Why the supervisor interrupted a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overrun {
    Wall,
    Cpu,
    /// The session was cancelled (SIGTERM to its supervisor) mid-cell.
    Cancelled,
}

/// How the interpreter died, from PID 1's status report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    Exited(i32),
    Signaled(i32),
    /// Killed by the supervisor (grace passed, or the session's lifetime).
    Killed,
}

/// The facts of one cell, as the cells loop (cells.rs) saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// The driver's `done` outcome and exit code, if one came.
    pub done: Option<(Said, Option<i32>)>,
    /// Whether the supervisor interrupted the cell, and why.
    pub overrun: Option<Overrun>,
    /// The interpreter died during the cell.
    pub death: Option<Death>,
    /// The kernel's OOM killer struck during the cell.
    pub oom: bool,
    /// stdout or stderr went over its cap.
    pub output_cut: bool,
    /// RLIMIT_CPU's soft limit, when it stands in for the CPU-time limit
    /// (no cpu cgroup): it counts the interpreter's CPU over the whole
    /// session, and its SIGXCPU ends the session in the cell that passed it.
    pub cpu_rlimit: Option<Duration>,
    /// The interpreter's CPU time as RLIMIT_CPU counted it, read once it
    /// died (zero while it lives: only a death can be RLIMIT_CPU's).
    pub cpu_used: Duration,
}

/// A cell's status, exit code and signal. The driver's word, or else the
/// interpreter's death, becomes the exit code or the signal a script's
/// would be, the overrun the supervisor's cut; then verdict/status.rs's
/// `status_of` decides, the one set of rules for runs and cells (timeouts
/// first, RLIMIT_CPU's signals, the OOM killer, the output caps). A cell
/// nothing explains failed to set up.
pub(crate) fn status_of(f: &Facts) -> (Status, Option<i32>, Option<i32>) {
    let (code, signal) = match (f.done, f.death) {
        (Some((Said::Ok, _)), _) => (Some(0), None),
        (Some((Said::Exit, code)), _) => (Some(code.unwrap_or(0)), None),
        // An uncaught exception: what `python script.py` exits with.
        (Some((Said::Error | Said::Interrupted, _)), _) => (Some(1), None),
        (None, Some(Death::Exited(code))) => (Some(code), None),
        (None, Some(Death::Signaled(sig))) => (None, Some(sig)),
        (None, Some(Death::Killed)) => (None, Some(libc::SIGKILL)),
        (None, None) => (None, None),
    };
    let facts = status::Facts {
        cut: f.overrun.map(|o| match o {
            Overrun::Wall => Cut::Wall,
            Overrun::Cpu => Cut::Cpu,
            Overrun::Cancelled => Cut::Cancelled,
        }),
        exit_code: code,
        signal,
        oom_kills: u64::from(f.oom),
        truncated: f.output_cut,
        cpu_rlimit: f.cpu_rlimit,
        cpu_used: f.cpu_used,
    };
    (status::status_of(&facts).unwrap_or(Status::SetupFailed), code, signal)
}

/// The refusals of one cell: the session's tally now, less what it was
/// when the cell began.
pub(crate) fn denials_since(before: &[Denial], now: &[Denial]) -> Vec<Denial> {
    let key = |d: &Denial| (d.what.clone(), d.family.clone(), d.errno.clone());
    now.iter()
        .filter_map(|d| {
            let earlier = before.iter().find(|b| key(b) == key(d)).map_or(0, |b| b.count);
            (d.count > earlier).then(|| Denial { count: d.count - earlier, ..d.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            done: None,
            overrun: None,
            death: None,
            oom: false,
            output_cut: false,
            cpu_rlimit: None,
            cpu_used: Duration::ZERO,
        }
    }

    #[test]
    fn a_done_line_is_read_with_its_error_cut_to_size() {
        let long = "x".repeat(MAX_MESSAGE * 2);
        let line = format!(
            r#"{{"op":"done","id":3,"nonce":"n3","outcome":"error","exit_code":null,"error":{{"type":"ValueError","message":"{long}","traceback":"tb"}}}}"#
        );
        let Reply::Done { id, nonce, outcome, error: Some(e), .. } = parse_reply(line.as_bytes()) else {
            panic!("not done")
        };
        assert_eq!((id, nonce.as_str(), outcome), (3, "n3", Said::Error));
        assert_eq!(e.kind, "ValueError");
        assert_eq!(e.message.len(), MAX_MESSAGE);
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_garbage() {
        for line in [
            &br#"{"op":"done","outcome":"ok"}"#[..],
            br#"{"op":"done","id":-1,"outcome":"ok"}"#,
            br#"{"op":"done","id":1,"outcome":"escaped"}"#,
            br#"{"op":"shell"}"#,
            b"not json",
            br#"{"op":"done","id":1,"outcome":"ok","error":{"type":1}}"#,
        ] {
            assert_eq!(parse_reply(line), Reply::Garbage, "{}", String::from_utf8_lossy(line));
        }
        let huge = format!(r#"{{"op":"ready","pad":"{}"}}"#, "y".repeat(MAX_REPLY));
        assert_eq!(parse_reply(huge.as_bytes()), Reply::Garbage);
    }

    #[test]
    fn an_exit_code_no_process_could_have_becomes_one() {
        let Reply::Done { exit_code, .. } = parse_reply(br#"{"op":"done","id":1,"outcome":"exit","exit_code":99999}"#) else {
            panic!()
        };
        assert_eq!(exit_code, Some(1));
    }

    #[test]
    fn an_overrun_wins_over_what_the_cell_said() {
        let f = Facts { done: Some((Said::Ok, None)), overrun: Some(Overrun::Wall), ..facts() };
        assert_eq!(status_of(&f).0, Status::TimeoutWall);
        let f = Facts { death: Some(Death::Killed), overrun: Some(Overrun::Cpu), ..facts() };
        assert_eq!(status_of(&f), (Status::TimeoutCpu, None, Some(libc::SIGKILL)));
    }

    #[test]
    fn a_cancel_wins_over_a_timeout_as_a_runs_does() {
        let f = Facts {
            death: Some(Death::Killed),
            overrun: Some(Overrun::Cancelled),
            oom: true,
            ..facts()
        };
        assert_eq!(status_of(&f), (Status::Cancelled, None, Some(libc::SIGKILL)));
    }

    #[test]
    fn an_exception_is_a_nonzero_exit_like_a_script() {
        let f = Facts { done: Some((Said::Error, None)), ..facts() };
        assert_eq!(status_of(&f), (Status::NonzeroExit, Some(1), None));
        let f = Facts { done: Some((Said::Exit, Some(0))), ..facts() };
        assert_eq!(status_of(&f), (Status::Ok, Some(0), None));
    }

    #[test]
    fn a_dead_interpreter_says_how_it_died() {
        let f = Facts { death: Some(Death::Signaled(11)), ..facts() };
        assert_eq!(status_of(&f), (Status::Signaled, None, Some(11)));
        let f = Facts { death: Some(Death::Signaled(9)), oom: true, ..facts() };
        assert_eq!(status_of(&f).0, Status::OomKilled);
        let f = Facts { death: Some(Death::Exited(3)), ..facts() };
        assert_eq!(status_of(&f), (Status::NonzeroExit, Some(3), None));
    }

    #[test]
    fn a_cells_denials_are_the_growth_of_the_tally() {
        let d = |what: &str, count| Denial {
            layer: "seccomp".into(),
            what: what.into(),
            count,
            family: None,
            errno: Some("EPERM".into()),
            detail: None,
        };
        let got = denials_since(&[d("ptrace", 2), d("mount", 1)], &[d("ptrace", 5), d("mount", 1), d("bpf", 1)]);
        assert_eq!(got, vec![d("ptrace", 3), d("bpf", 1)]);
    }

    #[test]
    fn a_cell_killed_by_sigxcpu_under_rlimit_cpu_is_timeout_cpu() {
        // No cpu cgroup: RLIMIT_CPU stands in, and its SIGXCPU kills the
        // interpreter mid-cell, as it would a run's script.
        let xcpu = Facts {
            death: Some(Death::Signaled(libc::SIGXCPU)),
            cpu_rlimit: Some(Duration::from_secs(1)),
            cpu_used: Duration::from_millis(1010),
            ..facts()
        };
        assert_eq!(status_of(&xcpu), (Status::TimeoutCpu, None, Some(libc::SIGXCPU)));
        // Its SIGKILL a second later, at the hard limit, too.
        let kill = Facts {
            death: Some(Death::Signaled(libc::SIGKILL)),
            cpu_used: Duration::from_millis(2010),
            ..xcpu
        };
        assert_eq!(status_of(&kill).0, Status::TimeoutCpu);
        // A SIGKILL well short of the limit is something else.
        let early = Facts { cpu_used: Duration::from_millis(100), ..kill };
        assert_eq!(status_of(&early).0, Status::Signaled);
        // Without RLIMIT_CPU in force, SIGXCPU is just a signal.
        assert_eq!(status_of(&Facts { cpu_rlimit: None, ..xcpu }).0, Status::Signaled);
    }

    #[test]
    fn pid1_gone_with_an_oom_kill_is_oom_killed_for_a_cell_too() {
        // No word from the driver and no exit or signal reported: a run
        // with an OOM kill is `oom_killed` (verdict.rs), and so is a cell.
        let f = Facts { oom: true, ..facts() };
        assert_eq!(status_of(&f), (Status::OomKilled, None, None));
        // Nothing to explain it: the cell failed to set up, as before.
        assert_eq!(status_of(&facts()).0, Status::SetupFailed);
    }
}
