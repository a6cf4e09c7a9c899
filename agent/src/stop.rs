//! Stopping when told: SIGINT, SIGTERM and SIGHUP are taken on a thread of
//! their own ([`guard_signals`], called before any other thread starts, so
//! every thread inherits the blocked mask; children get a clear mask from
//! `Command`). The first one asks the run to stop:
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

use nix::sys::signal::{SigSet, Signal};

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

/// Take SIGINT, SIGTERM and SIGHUP on a thread of their own (see the
/// module's doc). Call before any other thread starts.
pub fn guard_signals() -> std::io::Result<()> {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block().map_err(std::io::Error::from)?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let sig = set.wait().unwrap_or(Signal::SIGINT);
        request(sig);
        eprintln!(
            "jail-agent: {sig}: stopping: the running step is interrupted, no model call is made, and the state, the summary and the answer so far are saved (a second signal ends at once)"
        );
        // Each on a thread of its own, so none can hold up another, nor
        // this thread's wait for a second signal: no session may start
        // from now on and a step in flight stops now; past the grace, a
        // cell still running is killed with its session; past HARD_STOP,
        // the process ends whatever is still under way.
        std::thread::spawn(crate::cells::interrupt_running);
        std::thread::spawn(|| {
            std::thread::sleep(GRACE);
            crate::cells::kill_running();
        });
        std::thread::spawn(move || {
            std::thread::sleep(HARD_STOP);
            eprintln!("jail-agent: the run did not stop within {} s of {sig}: ending it now", HARD_STOP.as_secs());
            // The sessions' stops may take as long as their judging: not
            // waited for past the pool's own bounded end.
            std::thread::spawn(crate::cells::stop_all);
            crate::pool::end_on_signal();
            std::process::exit(i32::from(exit_status(sig)));
        });
        let again = set.wait().unwrap_or(sig);
        eprintln!("jail-agent: {again} again: ending at once");
        std::process::exit(i32::from(exit_status(again)));
    })?;
    Ok(())
}
