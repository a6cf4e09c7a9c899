//! The confinement made from the plan before anything is cloned: the
//! seccomp filter compiled from the plan's model (through the cache,
//! seccomp/cache.rs), the one part of the confinement that is not a pure
//! decision. What the kernel cannot honour was refused by the plan.

use crate::plan::SeccompRef;
use crate::seccomp;

/// The filter the plan names, compiled for the plan's mode.
pub(crate) fn compile(r: &SeccompRef) -> Result<seccomp::Filter, seccomp::SeccompError> {
    seccomp::cache::compile(&r.model, r.mode)
}
