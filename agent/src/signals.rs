//! The signal thread: SIGINT, SIGTERM and SIGHUP taken on a thread of
//! their own, and what the first of them does at once to what is live
//! (live.rs) and to the pool (pool.rs), past the grace and past the hard
//! stop. What a stop means for the run is stop.rs's.

use nix::sys::signal::{SigSet, Signal};

use crate::stop::{exit_status, request, GRACE, HARD_STOP};

/// Take SIGINT, SIGTERM and SIGHUP on a thread of their own (see the
/// doc of stop.rs). Call before any other thread starts.
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
        std::thread::spawn(crate::live::interrupt_running);
        std::thread::spawn(|| {
            std::thread::sleep(GRACE);
            crate::live::kill_running();
        });
        std::thread::spawn(move || {
            std::thread::sleep(HARD_STOP);
            eprintln!("jail-agent: the run did not stop within {} s of {sig}: ending it now", HARD_STOP.as_secs());
            // The sessions' stops may take as long as their judging: not
            // waited for past the pool's own bounded end.
            std::thread::spawn(crate::live::stop_all);
            crate::pool::end_on_signal();
            std::process::exit(i32::from(exit_status(sig)));
        });
        let again = set.wait().unwrap_or(sig);
        eprintln!("jail-agent: {again} again: ending at once");
        std::process::exit(i32::from(exit_status(again)));
    })?;
    Ok(())
}
