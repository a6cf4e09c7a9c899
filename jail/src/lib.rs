//! `jail`: run untrusted Python in fresh Linux namespaces on a read-only
//! root filesystem, and report what happened as one JSON document.
//!
//! The map, in the order one run uses the modules (DESIGN.md §6):
//! - `policy`: the policy file, validated (with `digest` for its hash).
//! - `supervisor`: one run's steps, in order; each step is one of the rooms below.
//! - `hostuid`: leases a run started by root its own host uid.
//! - `cgroup`, `limits`, `rlimits`: the run cgroup, and what enforces each limit.
//! - `layers`: the run cgroup and limit plan, the seccomp filter and the landlock plan, made before the clone.
//! - `seccomp`, `landlock`: the filter and the ruleset, compiled from the policy.
//! - `request`: every path the user gave, checked; the interpreter's argv and environment.
//! - `rootfs`: the rootfs's manifest and identity.
//! - `artifacts`: the snapshot the step's changes are measured against, and their judgement.
//! - `launch`: channels, clone, id maps, cgroup entry, release, hand-overs; a guard kills and reaps.
//! - `sync`: every supervisor↔child channel, in one table, and the reports sent over them.
//! - `namespaces`: the clone flags and the id maps.
//! - `child`: the jail side's steps (`mounts`, `conceal`, `privileges`, `network`, then `landlock` and `seccomp` last) and exec.
//! - `output`, `fsid`: the output tmpfs filled and copied, and who the copy acts as.
//! - `proxy`: the allowlist's HTTP CONNECT proxy, run by the supervisor.
//! - `watch`: the poll loop over the pipes, the pidfd, the seccomp listener and the relays; deadlines.
//! - `capture`, `relay`: the script's stdout and stderr, captured or streamed.
//! - `verdict`: facts → status, and the one place the result is assembled.
//! - `delivery`: what passed the judgement, delivered to the host folder.
//! - `result`: the JSON contract both sides and the agent share.
//! - `session`: `jail session`, one jail serving many cells to a driver over a control channel.
//! - `doctor`: what this host provides, for `jail doctor`.
//! - `sys`: every `unsafe`.

pub mod artifacts;
mod capture;
pub mod cgroup;
pub mod child;
pub mod conceal;
pub mod delivery;
pub mod digest;
pub mod doctor;
pub mod fsid;
pub mod hostuid;
pub mod landlock;
mod launch;
mod layers;
pub mod limits;
pub mod mounts;
pub mod namespaces;
pub mod network;
pub mod output;
pub mod policy;
pub mod privileges;
pub mod proxy;
pub mod relay;
mod request;
pub mod result;
pub mod rlimits;
pub mod rootfs;
pub mod seccomp;
pub mod session;
pub mod supervisor;
pub mod sync;
pub mod sys;
mod verdict;
mod watch;
