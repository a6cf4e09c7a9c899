//! Stopping when told: SIGINT, SIGTERM and SIGHUP are taken on a thread of
//! their own (signals.rs, `guard_signals`, called before any other thread
//! starts, so every thread inherits the blocked mask; children get a clear
//! mask from `Command`). The first one asks the run to stop ([`request`];
//! what it starts next, everything else asks [`requested`] before it
//! starts):
//!
//! - nothing new starts: no model call (one in flight is abandoned, and
//!   its retries with it), no step, no session, no pool;
//! - a step in flight is interrupted at once — a session's cell gets
//!   KeyboardInterrupt (`jail session interrupt`), a `jail run` step is
//!   cancelled — and a cell still running [`GRACE`] later is killed with
//!   its session (`jail session stop`, which the session serves while a
//!   cell runs);
//! - the main thread, back from whatever it waited for, ends the run as
//!   a cap does: the live session stopped (its files judged and delivered),
//!   the pool closed, the trace's end, `summary.txt`/`summary.json`, the
//!   answer so far (`answer.md`) and `state.json` written, and the process
//!   exits 128 + the signal; `jail-agent resume SESSION` goes on from there.
//!
//! A second signal ends the process at once (its pool dies with it, and
//! the pool's jails with their lifeline). Should the main thread not be
//! done within [`HARD_STOP`] (something this module did not foresee), the
//! signal thread stops what it can reach itself and exits.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

/// How long a cell has to stop after its KeyboardInterrupt before its
/// session is stopped, which kills it: the whole stop is to take at most
/// 2 s, and the session's own grace (`session.interrupt_grace_secs`, at
/// least 2 s) is longer than that.
pub const GRACE: Duration = Duration::from_secs(1);

/// The last resort: past this after the first signal, the process exits
/// whatever the main thread is doing.
pub const HARD_STOP: Duration = Duration::from_secs(5);

/// The first signal received, 0 until one is.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signal the run was told to stop by, once one came.
pub fn requested() -> Option<Signal> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}

/// Ask the run to stop as `sig` would (what the signal thread does; tests
/// of the stop path call it too). False when a stop was asked before.
pub fn request(sig: Signal) -> bool {
    SIGNAL.compare_exchange(0, sig as i32, Ordering::SeqCst, Ordering::SeqCst).is_ok()
}

/// The exit status of a run stopped by `sig`: 128 + its number, as a shell
/// reports a process the signal killed.
pub fn exit_status(sig: Signal) -> u8 {
    (128 + sig as i32).clamp(0, 255) as u8
}
