//! Seccomp: the syscall allowlist, from the policy model to a loaded filter,
//! and the supervisor's side of the refusals it reports.
//!
//! The supervisor compiles the policy's [`Model`] with libseccomp into a
//! classic BPF program before the clone (a bad policy fails before any fork);
//! the worker loads that exact program last, just before execve. Refusals the
//! policy wants reported return `SECCOMP_RET_USER_NOTIF`: the kernel parks
//! the call and hands it to the supervisor through a listener descriptor,
//! which the worker passes over a socketpair; the supervisor answers with the
//! errno the policy's reference evaluator gives and counts the call by
//! syscall (and, for socket(), by address family). Allowed calls never leave
//! the kernel, so they cost nothing extra. See policies/README.md for the
//! measured cost of a reported refusal.
//!
//! One module per job: `model` (the policy's rules and their reference
//! evaluator), `invariants` (what every policy must keep), `allowlist` (the
//! default rules adapted to `network.mode: allowlist`), `compile` (model →
//! BPF, in the supervisor), `load` (the child's last step), `notify` (the
//! supervisor's answers), with `bpf` (decode, check, run a program) and
//! `cache` (compiled defaults kept across runs).

mod allowlist;
pub mod bpf;
pub(crate) mod cache;
mod compile;
mod invariants;
mod load;
pub mod model;
mod notify;

use std::io;

pub(crate) use allowlist::adapt_for_allowlist;
pub use compile::{check_call, compile, Mode};
pub(crate) use compile::{host_mode, Filter};
pub(crate) use invariants::{check_floor, check_jail_needs, check_network_allowlist, check_network_none};
pub(crate) use model::Action;
pub use model::{Model, Report, SeccompFile};
pub use notify::MAX_ANSWERED;
pub(crate) use notify::{host_can_continue, Next, Tally, PAST_CAP_PACE};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("create the libseccomp filter")]
    Init(#[source] libseccomp::error::SeccompError),
    #[error("set filter attribute {0}")]
    Attribute(&'static str, #[source] libseccomp::error::SeccompError),
    #[error("add the rule for `{syscall}` (seccomp.rules[{rule}]) to the filter")]
    AddRule {
        syscall: String,
        rule: usize,
        source: libseccomp::error::SeccompError,
    },
    #[error("export the BPF program")]
    Export(#[source] libseccomp::error::SeccompError),
    #[error("read back the exported BPF program")]
    ReadBack(#[source] io::Error),
    #[error("libseccomp exported a program the kernel would refuse")]
    Program(#[source] bpf::BpfError),
    #[error("seccomp(SECCOMP_SET_MODE_FILTER)")]
    Load(#[source] io::Error),
    #[error("send the notification listener to the supervisor")]
    SendListener(#[source] io::Error),
}

#[cfg(test)]
mod tests {
    use super::bpf::SeccompData;
    use super::model::{self, Action, Model, NATIVE_ARCH};
    use crate::policy::Policy;

    pub(super) fn default_model() -> Model {
        Policy::builtin_default().unwrap().seccomp
    }

    pub(super) fn data(name: &str, args: [u64; 6]) -> SeccompData {
        SeccompData {
            nr: model::resolve(name).unwrap(),
            arch: NATIVE_ARCH,
            instruction_pointer: 0,
            args,
        }
    }

    fn traced(file: &str) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn every_traced_syscall_is_allowed_by_the_default_policy() {
        let m = default_model();
        // The traces of policies/trace, and the data rootfs's own.
        for file in [
            "policies/trace/traced.txt",
            "policies/trace/traced-datascience.txt",
            "python-rootfs/data-syscalls.txt",
        ] {
            let names = traced(file);
            assert!(names.len() > 40, "{file} lists {} syscalls", names.len());
            for name in names {
                // clone3 is traced because glibc tries it first; it is
                // refused on purpose and glibc falls back to clone.
                if name == "clone3" {
                    continue;
                }
                let v = m.evaluate_named(&name, [1, 1, 0, 0, 0, 0]).unwrap_or_else(|| panic!("{file}: unknown {name}"));
                assert_eq!(v.action, Action::Allow, "{file}: `{name}` is traced but not allowed");
            }
        }
    }
}
