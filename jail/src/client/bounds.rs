//! The one set of bounds a client of `jail` holds the binary's output and
//! its time to: every reader of a result, an event stream, a session's
//! answer or a pool's reply takes its cap from here, and every wait its
//! grace. What `jail` writes is made from what a script wrote, so each read
//! is bounded by construction.

use std::time::Duration;

/// The most bytes of one document read: a result (two capped streams plus
/// JSON), one event line, a session's answer line, a pool's reply line.
pub const MAX_DOCUMENT: u64 = 64 << 20;
/// The most bytes of `jail`'s own stderr kept for an error message.
pub const MAX_STDERR: u64 = 64 << 10;
/// How long past its deadline a step may take before it is deemed hung:
/// the jail's own work after a deadline (the interrupt grace, the copy
/// grace, the judging budget), with room for a loaded host.
pub const HUNG_GRACE: Duration = Duration::from_secs(30);
/// How long a terminated `jail` has to remove its cgroup before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a new pool may take to make its first jail and answer.
pub const START_WAIT: Duration = Duration::from_secs(120);
/// How long a claim may wait for a jail (the pool makes one when none is ready).
pub const CLAIM_WAIT: Duration = Duration::from_secs(120);
