//! `jail-agent`: a plan-execute + ReAct agent that runs each sub-task's code
//! in a jail session of its own, claimed from a warm pool (or, `--stateless`,
//! every step in a fresh jail).
//!
//! The pipeline of one run (`agent::run`): `session` makes the run's folders,
//! the orchestrator in `agent` (given a `config`) plans a `todo` list through the model (`llm`),
//! and hands each item to a sub-agent whose `tools` write scripts and run
//! each as a cell of the sub-task's session (`cells`, claimed from the
//! run's `jail pool` child, `pool`) or in a fresh jail, through the `jail`
//! binary (`runner`; what is `live` is registered for the signal path), seeing a
//! compact `view` of the result; `skills` and `packages` tell the model what
//! it can do; `trace` records every call and sums it up. `preflight` checks
//! the steps' rootfs and policy before the first model call; `signals`
//! takes the signals that stop a run, and `stop` says what stopping means.

pub mod agent;
pub mod cells;
pub mod checkpoint;
pub mod config;
pub mod escape;
pub mod export;
pub mod live;
pub mod llm;
pub mod otel;
pub mod packages;
pub mod pool;
pub mod preflight;
pub mod progress;
pub mod runner;
pub mod session;
pub mod signals;
pub mod skills;
pub mod stop;
pub mod todo;
pub mod tools;
pub mod trace;
pub mod view;

/// The result contract the agent deserializes, re-exported from `jail`.
pub use jail::result::RunResult;
