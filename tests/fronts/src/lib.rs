//! The front ends' end-to-end tests (`jail-agent`, `jail serve`, `jail
//! mcp`, the README's blocks and the doors only a front end has), apart
//! from the jail's own (the `jail-tests` crate, tests/): testing the jail
//! builds the jail and its harness, not the agent, the service or the MCP
//! server. These tests use that same harness (`jail_tests`); what only
//! they need is here.

pub mod mock_llm;
