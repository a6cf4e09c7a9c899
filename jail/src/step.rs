//! One step in a jail, as values: its inputs ([`Step`]: the snapshot, the
//! result so far, the [`Clock`]) and what the launch saw of it
//! ([`Seen`], with how the watch loop [`Ending`]), which
//! `verdict::assemble` turns into the result, and
//! where that result's output is judged and delivered ([`Delivery`]: as
//! planned, or the folder a session adopted). Here so that launch.rs,
//! watch.rs, verdict.rs and session/adopt.rs use them without importing
//! each other.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Instant;

use nix::sys::signal::Signal;

use crate::artifacts::{self, TreeDead};
use crate::capture::Capture;
use crate::output::{self, Inventory};
use crate::plan::RunPlan;
use crate::policy::Policy;
use crate::result::RunResult;
use crate::seccomp;
use crate::sync::{self, ms_since, Report};

/// How the watch loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// PID 1 exited by itself.
    Exited,
    /// The wall-clock deadline passed and the tree was killed.
    WallTimeout,
    /// The run cgroup's CPU usage reached the limit and the tree was killed.
    CpuTimeout,
    /// `jail` got this signal (cancel.rs) and the tree was killed.
    Cancelled(Signal),
}

/// What the watch loop saw.
pub(crate) struct Seen {
    pub(crate) reports: Vec<Report>,
    pub(crate) tally: seccomp::Tally,
    pub(crate) stdout: Capture,
    pub(crate) stderr: Capture,
    pub(crate) ending: Ending,
    pub(crate) deadline: Instant,
    pub(crate) exec_at: Option<Instant>,
    pub(crate) released_at: Instant,
    pub(crate) ended_at: Instant,
    /// PID 1's usage and wait status, as its parent reaps it: `None` for a
    /// template's fork, which its template reaps.
    pub(crate) rusage: Option<libc::rusage>,
    pub(crate) pid1_status: Option<libc::c_int>,
    /// The jail's output tmpfs and what was copied into it, to be judged and
    /// mirrored (delivery.rs); `None` with a bound output dir.
    pub(crate) output: Option<(OwnedFd, output::Inventory)>,
    pub(crate) ids: output::FsIds,
    pub(crate) tree_dead: TreeDead,
    pub(crate) network: Option<crate::result::NetworkReport>,
    /// What the CPU throttle did, when it enforced the quota.
    pub(crate) throttled: Option<crate::result::Throttled>,
}

/// The run's clock: when it started (both clocks: the child's stage marks
/// are CLOCK_MONOTONIC nanoseconds) and each stage's time since then.
pub(crate) struct Clock {
    pub(crate) started: Instant,
    pub(crate) started_ns: u64,
    pub(crate) stages: BTreeMap<String, f64>,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        Clock {
            started: Instant::now(),
            started_ns: sync::monotonic_ns(),
            stages: BTreeMap::new(),
        }
    }

    /// `name` finished now.
    pub(crate) fn mark(&mut self, name: &str) {
        self.stages.insert(name.to_string(), ms_since(self.started));
    }
}

/// One step run in a jail: what its changes are measured against, the
/// result so far (the isolation report, from the plan), and its clock.
pub(crate) struct Step<'a> {
    /// The artifact rules the snapshot is retaken and the delivery judged by.
    pub(crate) policy: &'a Policy,
    pub(crate) before: artifacts::Before,
    pub(crate) result: RunResult,
    pub(crate) clock: Clock,
}

/// Where a step's output is judged and delivered, and against what: the
/// plan's folder as the launch filled it ([`Delivery::planned`]), or the
/// one a session took after it was made (session/adopt.rs). The plan
/// itself never changes after `Jail::make`.
pub(crate) struct Delivery {
    /// The host folder what passes is delivered to.
    pub(crate) host_dir: PathBuf,
    /// The state the step's changes are judged against.
    pub(crate) before: artifacts::Before,
    /// What was copied into the jail's output tmpfs; `None` when nothing
    /// was (a bound output folder, or a child that never took it).
    pub(crate) inventory: Option<Inventory>,
    /// The result's `output_dir`.
    pub(crate) output_dir: Option<String>,
}

impl Delivery {
    /// As planned: the plan's folder, judged against the snapshot taken
    /// before the release, with what the launch copied in.
    pub(crate) fn planned(
        plan: &RunPlan,
        before: artifacts::Before,
        inventory: Option<Inventory>,
        result: &RunResult,
    ) -> Delivery {
        Delivery {
            host_dir: plan.output.host_dir.clone(),
            before,
            inventory,
            output_dir: result.output_dir.clone(),
        }
    }
}
