//! The status of a step that started, decided from its facts: one pure set
//! of rules for a run (verdict.rs) and for a session's cell
//! (session/cell.rs), in the order `Status` documents. A leaf: it needs
//! nothing of either, so the session's cells can use it without joining
//! the run's imports.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::result::Status;

/// Why the supervisor cut a step short: how a run's watch ended
/// (watch.rs, `Ending`), a session cell's overrun (session/cell.rs). Its reasons win over everything the
/// script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    Wall,
    Cpu,
    Cancelled,
}

/// What the status of a step that started is decided from: a run, or one
/// cell of a session (session/cell.rs maps the driver's word and the
/// interpreter's death to an exit code or a signal).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Facts {
    pub(crate) cut: Option<Cut>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) signal: Option<i32>,
    pub(crate) oom_kills: u64,
    pub(crate) truncated: bool,
    /// RLIMIT_CPU's soft limit, when it stands in for the CPU-time limit.
    pub(crate) cpu_rlimit: Option<Duration>,
    /// CPU time as RLIMIT_CPU counted it.
    pub(crate) cpu_used: Duration,
}

/// The status of a run or a cell, in the order `Status` documents; `None`
/// when PID 1 vanished without a word and nothing explains it. Pure; the
/// one set of rules for both.
pub(crate) fn status_of(f: &Facts) -> Option<Status> {
    match f.cut {
        Some(Cut::Wall) => return Some(Status::TimeoutWall),
        Some(Cut::Cpu) => return Some(Status::TimeoutCpu),
        Some(Cut::Cancelled) => return Some(Status::Cancelled),
        None => {}
    }
    let by_signal = |s: Signal| f.signal == Some(s as i32);
    // RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL at the hard one.
    if let Some(limit) = f.cpu_rlimit {
        if by_signal(Signal::SIGXCPU) || (by_signal(Signal::SIGKILL) && f.cpu_used >= limit) {
            return Some(Status::TimeoutCpu);
        }
    }
    if f.oom_kills > 0 && f.exit_code != Some(0) {
        return Some(Status::OomKilled);
    }
    let own = match (f.exit_code, f.signal) {
        (Some(0), _) => Status::Ok,
        (Some(_), _) => Status::NonzeroExit,
        (None, Some(_)) => Status::Signaled,
        (None, None) => return None,
    };
    if f.truncated {
        return Some(Status::OutputLimit);
    }
    Some(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            cut: None,
            exit_code: Some(0),
            signal: None,
            oom_kills: 0,
            truncated: false,
            cpu_rlimit: None,
            cpu_used: Duration::ZERO,
        }
    }

    #[test]
    fn timeouts_win_over_everything_the_script_did() {
        let f = Facts { cut: Some(Cut::Wall), oom_kills: 1, truncated: true, ..facts() };
        assert_eq!(status_of(&f), Some(Status::TimeoutWall));
        let f = Facts { cut: Some(Cut::Cancelled), oom_kills: 1, signal: Some(9), ..facts() };
        assert_eq!(status_of(&f), Some(Status::Cancelled));
        let f = Facts { cut: Some(Cut::Cpu), exit_code: None, signal: Some(9), ..facts() };
        assert_eq!(status_of(&f), Some(Status::TimeoutCpu));
    }

    #[test]
    fn rlimit_cpu_signals_mean_timeout_cpu() {
        let xcpu = Facts {
            exit_code: None,
            signal: Some(libc::SIGXCPU),
            cpu_rlimit: Some(Duration::from_secs(1)),
            ..facts()
        };
        assert_eq!(status_of(&xcpu), Some(Status::TimeoutCpu));
        let kill = Facts { signal: Some(9), cpu_used: Duration::from_millis(1500), ..xcpu };
        assert_eq!(status_of(&kill), Some(Status::TimeoutCpu));
        // A SIGKILL well short of the limit is something else.
        let early = Facts { cpu_used: Duration::from_millis(100), ..kill };
        assert_eq!(status_of(&early), Some(Status::Signaled));
        // Without RLIMIT_CPU in force, SIGXCPU is just a signal.
        let plain = Facts { cpu_rlimit: None, ..xcpu };
        assert_eq!(status_of(&plain), Some(Status::Signaled));
    }

    #[test]
    fn an_oom_kill_is_oom_killed_unless_the_script_still_exited_0() {
        let killed = Facts { exit_code: None, signal: Some(9), oom_kills: 1, ..facts() };
        assert_eq!(status_of(&killed), Some(Status::OomKilled));
        let child_killed = Facts { exit_code: Some(1), oom_kills: 1, ..facts() };
        assert_eq!(status_of(&child_killed), Some(Status::OomKilled));
        let survived = Facts { oom_kills: 1, ..facts() };
        assert_eq!(status_of(&survived), Some(Status::Ok));
        // PID 1 itself OOM-killed: explained, not a setup failure.
        let pid1 = Facts { exit_code: None, signal: None, oom_kills: 1, ..facts() };
        assert_eq!(status_of(&pid1), Some(Status::OomKilled));
    }

    #[test]
    fn a_truncated_stream_is_output_limit_over_the_exit() {
        assert_eq!(status_of(&Facts { truncated: true, ..facts() }), Some(Status::OutputLimit));
        assert_eq!(status_of(&Facts { truncated: true, exit_code: Some(2), ..facts() }), Some(Status::OutputLimit));
        assert_eq!(status_of(&Facts { exit_code: Some(2), ..facts() }), Some(Status::NonzeroExit));
        assert_eq!(status_of(&Facts { exit_code: None, signal: None, ..facts() }), None);
    }
}
