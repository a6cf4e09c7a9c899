//! The agent that drives `jail` one step at a time.
//!
//! Not built yet: the plan-execute + ReAct agent is issue 8. This crate holds
//! no behaviour on purpose, so nothing can mistake it for a working agent; it
//! exists so the workspace layout is fixed and the agent can depend on the
//! single result type the `jail` crate defines.

/// The result contract the agent will deserialize, re-exported from `jail`.
pub use jail::result::RunResult;
