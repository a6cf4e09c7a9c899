//! Where a run failed: the [`Stage`] names in `setup_error.stage`, and the
//! one conversion from an error chain to a [`SetupError`], which keeps every
//! cause. The JSON field stays a string; this enum is the list of its values.

use std::error::Error;

use crate::result::SetupError;

/// A setup step that can fail, as `setup_error.stage` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    // Supervisor, before the clone.
    /// The policy file (cli/run.rs).
    Policy,
    /// The request's paths and the interpreter's argv (request.rs).
    Input,
    /// The host uid a root-started run leases (hostuid.rs).
    Identity,
    /// A required limit nothing on this host enforces (limits.rs).
    Limits,
    Seccomp,
    Landlock,
    /// The snapshot the step's changes are measured against (artifacts.rs).
    Artifacts,
    // Supervisor, the launch (launch.rs).
    /// A supervisor↔child channel (sync.rs).
    Pipes,
    Clone,
    IdMaps,
    Cgroup,
    /// Receiving, filling or releasing the output tmpfs.
    Output,
    /// The allowlist proxy.
    Network,
    /// The release and the hand-overs after it.
    Release,
    Wait,
    /// PID 1 ended without reporting the script's status.
    Reaper,
    // Child side (child.rs), in the order it runs them (Identity, Output,
    // Network, Landlock and Seccomp come up there too).
    Conceal,
    Stdio,
    Mounts,
    DieWithSupervisor,
    PivotRoot,
    Hostname,
    CgroupJoin,
    CgroupNamespace,
    CpuAffinity,
    BlockSignals,
    Dumpable,
    DropCapabilities,
    NoNewPrivs,
    ForkWorker,
    Signals,
    CloseFds,
    Setsid,
    Chdir,
    Rlimits,
    Exec,
}

impl Stage {
    /// The value of `setup_error.stage`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Policy => "policy",
            Stage::Input => "input",
            Stage::Identity => "identity",
            Stage::Limits => "limits",
            Stage::Seccomp => "seccomp",
            Stage::Landlock => "landlock",
            Stage::Artifacts => "artifacts",
            Stage::Pipes => "pipes",
            Stage::Clone => "clone",
            Stage::IdMaps => "id_maps",
            Stage::Cgroup => "cgroup",
            Stage::Output => "output",
            Stage::Network => "network",
            Stage::Release => "release",
            Stage::Wait => "wait",
            Stage::Reaper => "reaper",
            Stage::Conceal => "conceal",
            Stage::CgroupJoin => "cgroup_join",
            Stage::CpuAffinity => "cpu_affinity",
            Stage::BlockSignals => "block_signals",
            Stage::Dumpable => "dumpable",
            Stage::ForkWorker => "fork_worker",
            Stage::CgroupNamespace => "cgroup_namespace",
            Stage::Stdio => "stdio",
            Stage::Mounts => "mounts",
            Stage::DieWithSupervisor => "die_with_supervisor",
            Stage::PivotRoot => "pivot_root",
            Stage::Hostname => "hostname",
            Stage::Signals => "signals",
            Stage::CloseFds => "close_fds",
            Stage::Setsid => "setsid",
            Stage::Chdir => "chdir",
            Stage::Rlimits => "rlimits",
            Stage::DropCapabilities => "drop_capabilities",
            Stage::NoNewPrivs => "no_new_privs",
            Stage::Exec => "exec",
        }
    }

    /// The one way an error becomes a `setup_error`: its own words as the
    /// message, and every source below it, in order, as the causes.
    pub fn error(self, e: &dyn Error) -> SetupError {
        SetupError { stage: self.as_str().to_string(), message: e.to_string(), causes: causes_of(e) }
    }

    /// A `setup_error` from words alone, for a failure with no error value.
    pub fn message(self, message: impl Into<String>) -> SetupError {
        SetupError { stage: self.as_str().to_string(), message: message.into(), causes: vec![] }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every source below `e`, outermost first.
pub(crate) fn causes_of(e: &dyn Error) -> Vec<String> {
    let mut causes = Vec::new();
    let mut src = e.source();
    while let Some(s) = src {
        causes.push(s.to_string());
        src = s.source();
    }
    causes
}

/// `e` and its sources in one line, for a note that is not a `setup_error`
/// (`isolation.degraded`, a warning on stderr): each level once.
pub fn chain_line(e: &dyn Error) -> String {
    std::iter::once(e.to_string()).chain(causes_of(e)).collect::<Vec<_>>().join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);
    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn every_level_of_the_chain_is_kept_once() {
        let e = Outer(Middle(std::io::Error::other("inner")));
        let s = Stage::Clone.error(&e);
        assert_eq!((s.stage.as_str(), s.message.as_str()), ("clone", "outer"));
        assert_eq!(s.causes, vec!["middle".to_string(), "inner".to_string()]);
        assert_eq!(chain_line(&e), "outer: middle: inner");
    }
}
