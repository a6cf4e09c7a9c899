//! `jail`: run untrusted Python in fresh Linux namespaces on a read-only
//! root filesystem, and report what happened as one JSON document.
//!
//! The pipeline, in the order DESIGN.md §6 gives it: `policy` validates the
//! request, `supervisor` compiles the `seccomp` filter, plans `landlock`,
//! prepares and clones, `child` builds the jail (`mounts`, `namespaces`,
//! `privileges`, `rlimits`, then `landlock` and `seccomp` last) and execs,
//! and `result` is the contract both sides and the agent share; `cgroup` and
//! `limits` enforce resources; `conceal` scrubs what PID 1 inherited from the
//! supervisor; `hostuid` leases a run started by root its own host uid, `fsid` is
//! who the output copy acts as on each side;
//! `rootfs` reads the rootfs's manifest and
//! identity; `artifacts` judges the output dir once the tree is dead. `sys`
//! holds every `unsafe`.

pub mod artifacts;
pub mod cgroup;
pub mod delivery;
pub mod child;
pub mod conceal;
pub mod digest;
pub mod doctor;
pub mod fsid;
pub mod hostuid;
pub mod limits;
pub mod landlock;
pub mod mounts;
pub mod namespaces;
pub mod network;
pub mod output;
pub mod policy;
pub mod privileges;
pub mod proxy;
pub mod relay;
pub mod result;
pub mod rlimits;
pub mod rootfs;
pub mod seccomp;
pub mod supervisor;
pub mod sync;
pub mod sys;
