//! Holding a live jail's process tree still, so that the supervisor can
//! judge the output folder between a session's cells (session/cells.rs)
//! with no process of the jail changing it meanwhile: the live
//! counterpart of the proof a dead tree gives (artifacts.rs, `TreeDead`).
//!
//! Two ways, the first the host offers:
//! - **The run cgroup's freezer** (cgroup.rs, `RunCgroup::freeze`): the
//!   kernel freezes every task and says when all are frozen. No task can
//!   leave it, whatever the script does.
//! - **Without one** (an ordinary user on a host that delegates no
//!   cgroup): SIGSTOP to every process of the tree but PID 1 (our reaper,
//!   child.rs, which forwards only termination signals), found from PID 1
//!   down as the throttle finds them (throttle.rs, `scan`), pass after
//!   pass until two passes agree: every task of every process stopped
//!   (`T`, `t`) or dead, the same tasks, and not one of them scheduled in
//!   between (its context-switch counts unchanged). A task that was
//!   stopped at both looks and never ran between them stayed stopped, so
//!   at the moment between the passes every task was stopped at once; a
//!   stopped task cannot fork or signal, and only a task that runs can
//!   resume another. A script that stops and resumes its own processes in
//!   turn (one always running) never gives two such passes: the hold then
//!   fails at its time, and says so. The processes this stopped get
//!   SIGCONT at the release; one the script had stopped itself, or the CPU
//!   throttle had, is left as it was.
//!
//! A hold that cannot be had within its time is an error: the caller
//! judges nothing rather than a tree that moves.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::artifacts::TreeStill;
use crate::cgroup::RunCgroup;
use crate::throttle;

/// The tree held still until this is dropped.
pub(crate) struct Hold<'a> {
    how: How<'a>,
}

enum How<'a> {
    Frozen(&'a RunCgroup),
    /// The processes this hold sent SIGSTOP.
    Stopped(Vec<i32>),
}

impl Hold<'_> {
    /// The proof the judge asks for, good while the hold lasts.
    pub(crate) fn still(&self) -> TreeStill<'_> {
        TreeStill::held(PhantomData)
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        match &self.how {
            How::Frozen(cg) => cg.thaw(),
            How::Stopped(pids) => resume(pids),
        }
    }
}

/// Hold the tree under `root` (the jail's PID 1) still, within `within`:
/// by its run cgroup's freezer when it has one, else by SIGSTOP. An error
/// says why it could not be held; nothing is left stopped or frozen then.
pub(crate) fn hold(root: Pid, cgroup: Option<&RunCgroup>, within: Duration) -> Result<Hold<'_>, String> {
    if let Some(cg) = cgroup {
        match cg.freeze(within) {
            Ok(true) => return Ok(Hold { how: How::Frozen(cg) }),
            Ok(false) => {}
            Err(e) => return Err(format!("the run cgroup's freezer: {e}")),
        }
    }
    stop_all(root, within).map(|pids| Hold { how: How::Stopped(pids) })
}

/// One task as a pass saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    tid: i32,
    held: bool,
    switches: u64,
}

fn stop_all(root: Pid, within: Duration) -> Result<Vec<i32>, String> {
    let deadline = Instant::now() + within;
    let mut sent: Vec<i32> = Vec::new();
    let mut last: Option<Vec<Seen>> = None;
    let (mut pause, mut passes) = (Duration::from_micros(20), 0);
    loop {
        let (seen, whole) = look(root, &mut sent);
        let all_held = whole && seen.iter().all(|s| s.held);
        if all_held && last.as_ref() == Some(&seen) {
            return Ok(sent);
        }
        last = all_held.then_some(seen);
        if Instant::now() >= deadline {
            resume(&sent);
            return Err(format!(
                "its processes could not all be stopped at once within {} ms (SIGSTOP; no cgroup freezer here)",
                within.as_millis()
            ));
        }
        pause = crate::cgroup::next_pause(pause, &mut passes);
    }
}

/// Every task of the tree but PID 1's, in order; SIGSTOP sent to each
/// process with a task not held. Whether the look was whole (within
/// [`throttle::MAX_PROCESSES`] tasks, every one read).
fn look(root: Pid, sent: &mut Vec<i32>) -> (Vec<Seen>, bool) {
    let mut seen = Vec::new();
    let mut whole = true;
    let procs = throttle::scan(root);
    if procs.len() >= throttle::MAX_PROCESSES {
        whole = false;
    }
    for p in procs.iter().filter(|p| p.pid != root.as_raw()) {
        let before = seen.len();
        match std::fs::read_dir(format!("/proc/{}/task", p.pid)) {
            Ok(tasks) => {
                let mut tids: Vec<i32> =
                    tasks.flatten().filter_map(|t| t.file_name().to_str().and_then(|t| t.parse().ok())).collect();
                tids.sort_unstable();
                for tid in tids {
                    if seen.len() >= throttle::MAX_PROCESSES {
                        whole = false;
                        break;
                    }
                    let status = throttle::read_bounded(&format!("/proc/{}/task/{tid}/status", p.pid));
                    match status.as_deref().and_then(parse_task_status) {
                        Some(TaskStatus { state, switches }) => {
                            seen.push(Seen { tid, held: matches!(state, b'T' | b't' | b'Z' | b'X' | b'x'), switches })
                        }
                        // Gone between the listing and the read: the next
                        // pass sees the tree without it.
                        None => whole = false,
                    }
                }
            }
            Err(_) => whole = false,
        }
        if seen[before..].iter().any(|s| !s.held) && kill(p.pid, Signal::SIGSTOP) && !sent.contains(&p.pid) {
            sent.push(p.pid);
        }
    }
    (seen, whole)
}

fn kill(pid: i32, sig: Signal) -> bool {
    nix::sys::signal::kill(Pid::from_raw(pid), sig).is_ok()
}

fn resume(pids: &[i32]) {
    for &pid in pids {
        kill(pid, Signal::SIGCONT);
    }
}

/// What a task's `/proc/<pid>/task/<tid>/status` says that a hold needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStatus {
    /// The state letter (`State:`).
    pub state: u8,
    /// `voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches`: grows
    /// each time the task leaves a CPU.
    pub switches: u64,
}

/// Parse a task's `status`. The `Name:` line is the script's choice (the
/// kernel escapes a newline in it), so only whole lines with a known key
/// at their start are read; `None` unless all three keys are there.
/// Never panics (fuzz/fuzz_targets/proc_stat.rs).
pub fn parse_task_status(bytes: &[u8]) -> Option<TaskStatus> {
    let (mut state, mut voluntary, mut involuntary) = (None, None, None);
    for line in bytes.split(|&b| b == b'\n') {
        if let Some(v) = line.strip_prefix(b"State:") {
            state = v.trim_ascii().first().copied();
        } else if let Some(v) = line.strip_prefix(b"voluntary_ctxt_switches:") {
            voluntary = std::str::from_utf8(v.trim_ascii()).ok().and_then(|n| n.parse::<u64>().ok());
        } else if let Some(v) = line.strip_prefix(b"nonvoluntary_ctxt_switches:") {
            involuntary = std::str::from_utf8(v.trim_ascii()).ok().and_then(|n| n.parse::<u64>().ok());
        }
    }
    Some(TaskStatus { state: state?, switches: voluntary?.saturating_add(involuntary?) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_read_by_its_keys_only() {
        let text = b"Name:\tState:\\tR\nUmask:\t0022\nState:\tT (stopped)\nTgid:\t5\n\
                     voluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(parse_task_status(text), Some(TaskStatus { state: b'T', switches: 15 }));
        assert_eq!(parse_task_status(b"State:\tS (sleeping)\nvoluntary_ctxt_switches:\t1\n"), None);
        assert_eq!(parse_task_status(b""), None);
    }

    #[test]
    fn a_child_of_ours_is_stopped_at_once_and_resumed() {
        // A busy child: the hold stops it, its switch count stays put while
        // held, and the release lets it run again.
        // A shell standing for PID 1, with a busy child.
        let mut root = std::process::Command::new("/bin/sh")
            .args(["-c", "sh -c 'while :; do :; done' & wait"])
            .spawn()
            .unwrap();
        let me = Pid::from_raw(root.id() as i32);
        let deadline = Instant::now() + Duration::from_secs(5);
        let pid = loop {
            let mut kids = Vec::new();
            throttle::children_of(me.as_raw(), &mut kids);
            if let Some(&k) = kids.first() {
                break k;
            }
            assert!(Instant::now() < deadline, "the busy child never started");
            std::thread::sleep(Duration::from_millis(1));
        };
        let state = || {
            let b = throttle::read_bounded(&format!("/proc/{pid}/stat")).unwrap();
            throttle::parse_stat(&b).unwrap().state
        };
        {
            let held = hold(me, None, Duration::from_secs(5)).unwrap();
            assert!(matches!(&held.how, How::Stopped(p) if p == &[pid]));
            assert_eq!(state(), b'T');
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(state(), b'T');
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while state() == b'T' && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_ne!(state(), b'T', "the child was left stopped");
        kill(pid, Signal::SIGKILL);
        let _ = root.wait();
    }
}
