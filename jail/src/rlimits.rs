//! Resource limits set with setrlimit(2) in the worker, right before exec.
//!
//! The supervisor decides which (see `limits::plan`); the worker applies the
//! list. Every run gets RLIMIT_CORE 0, RLIMIT_FSIZE and RLIMIT_NOFILE; when no
//! cgroup can be had, RLIMIT_AS, RLIMIT_NPROC and RLIMIT_CPU stand in for the
//! cgroup's memory, pids and CPU-time limits, and RLIMIT_MEMLOCK is held low.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

#[derive(Debug, thiserror::Error)]
pub(crate) enum RlimitError {
    #[error("setrlimit({resource}, {soft}, {hard})")]
    Set {
        resource: &'static str,
        soft: u64,
        hard: u64,
        source: nix::Error,
    },
}

/// The rlimits the jail sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// Address space: the memory stand-in (per process, not per run).
    As,
    /// Processes and threads of the sandbox uid in the run's own user
    /// namespace; since Linux 5.14 that counts only this run's tasks.
    Nproc,
    /// CPU seconds per process: SIGXCPU at the soft limit, SIGKILL at hard.
    Cpu,
    Fsize,
    Nofile,
    Core,
    /// Locked (unreclaimable) memory, without a memory cgroup.
    Memlock,
}

impl Kind {
    fn resource(self) -> Resource {
        match self {
            Kind::As => Resource::RLIMIT_AS,
            Kind::Nproc => Resource::RLIMIT_NPROC,
            Kind::Cpu => Resource::RLIMIT_CPU,
            Kind::Fsize => Resource::RLIMIT_FSIZE,
            Kind::Nofile => Resource::RLIMIT_NOFILE,
            Kind::Core => Resource::RLIMIT_CORE,
            Kind::Memlock => Resource::RLIMIT_MEMLOCK,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::As => "RLIMIT_AS",
            Kind::Nproc => "RLIMIT_NPROC",
            Kind::Cpu => "RLIMIT_CPU",
            Kind::Fsize => "RLIMIT_FSIZE",
            Kind::Nofile => "RLIMIT_NOFILE",
            Kind::Core => "RLIMIT_CORE",
            Kind::Memlock => "RLIMIT_MEMLOCK",
        }
    }
}

/// One limit to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Rlimit {
    pub kind: Kind,
    pub soft: u64,
    pub hard: u64,
}

/// The hard limit this process holds for `kind`: nothing the worker sets can
/// go above it (raising a hard limit needs CAP_SYS_RESOURCE on the host).
pub(crate) fn current_hard(kind: Kind) -> u64 {
    getrlimit(kind.resource()).map(|(_, hard)| hard).unwrap_or(u64::MAX)
}

/// Child side: set every limit in the list, in order.
pub(crate) fn apply(list: &[Rlimit]) -> Result<(), RlimitError> {
    for r in list {
        setrlimit(r.kind.resource(), r.soft, r.hard).map_err(|source| RlimitError::Set {
            resource: r.kind.name(),
            soft: r.soft,
            hard: r.hard,
            source,
        })?;
    }
    Ok(())
}
