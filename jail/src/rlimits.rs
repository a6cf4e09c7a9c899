//! Resource limits set with setrlimit(2) in the worker before exec.

use nix::sys::resource::{setrlimit, Resource};

#[derive(Debug, thiserror::Error)]
pub enum RlimitError {
    #[error("setrlimit({resource}, {value})")]
    Set { resource: &'static str, value: u64, source: nix::Error },
}

fn set(resource: Resource, name: &'static str, value: u64) -> Result<(), RlimitError> {
    setrlimit(resource, value, value).map_err(|source| RlimitError::Set { resource: name, value, source })
}

/// Limits every run gets whatever the policy says: no core dumps (a core
/// would carry the script's memory out of the jail, ATTACKS T42).
pub fn apply_baseline() -> Result<(), RlimitError> {
    set(Resource::RLIMIT_CORE, "RLIMIT_CORE", 0)
}
