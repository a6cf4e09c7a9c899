//! When a cell that got its KeyboardInterrupt has had its grace: the
//! session's `interrupt_grace_secs` counts the wall clock, but only once the
//! interpreter has run on a CPU for part of it. On a loaded host (or one
//! where the throttle holds the tree stopped) the wall clock runs while
//! the interpreter gets nothing; a cell that would have handled its
//! KeyboardInterrupt in a few milliseconds must not lose its session, with
//! its variables, to a clock it never ran on. Pure: the caller reads the
//! clocks (session/cells.rs: the tree's CPU time, `watch::Tree::run_ns`).
//!
//! - A cell that handles it needs a few ms of CPU: it is done long before
//!   the run floor, however loaded the host.
//! - A cell that ignores it and spins accrues CPU: killed at the grace, as
//!   on a quiet host.
//! - A cell that ignores it and sleeps, or a tree that never gets a CPU,
//!   is killed at the ceiling: ten times the grace, never past the most a
//!   policy may give (`MOST`), so every client's wait still holds.
//! - A stateless step (a pool's run, whose jail is destroyed after it) has
//!   nothing to lose to a kill: the wall clock alone, so it ends within
//!   its time plus the grace.
//! - Where the tree's CPU time cannot be read, the wall clock alone, as
//!   before.

use std::time::Duration;

/// The run floor is at most this much CPU after the interrupt.
pub(crate) const MOST_RUN: Duration = Duration::from_millis(200);
/// The ceiling is this many graces.
pub(crate) const CEILING: u32 = 10;
/// How often a cell past its grace but short of its run floor is looked at.
pub(crate) const LOOK: Duration = Duration::from_millis(100);

/// The longest a cell waits after its interrupt: ten graces, at most
/// `most` (the longest grace a policy may give), never less than the grace.
pub(crate) fn ceiling(grace: Duration, most: Duration) -> Duration {
    (grace * CEILING).min(most).max(grace)
}

/// Whether the grace is over `wall` after the interrupt, the tree having
/// run `run` of CPU since (`None`: unknown).
pub(crate) fn over(wall: Duration, run: Option<Duration>, grace: Duration, most: Duration, stateless: bool) -> bool {
    if wall < grace {
        return false;
    }
    if stateless || wall >= ceiling(grace, most) {
        return true;
    }
    !matches!(run, Some(r) if r < grace.min(MOST_RUN))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOST: Duration = Duration::from_secs(60);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_cell_is_killed_before_its_grace_on_the_wall_clock() {
        assert!(!over(ms(1999), Some(ms(5000)), ms(2000), MOST, false));
        assert!(!over(ms(1999), None, ms(2000), MOST, true));
    }

    #[test]
    fn a_starved_cell_is_not_killed_before_its_interpreter_ran() {
        assert!(!over(ms(2000), Some(ms(0)), ms(2000), MOST, false));
        assert!(!over(ms(19_999), Some(ms(199)), ms(2000), MOST, false));
    }

    #[test]
    fn a_spinning_cell_that_ignores_it_is_killed_at_the_grace() {
        assert!(over(ms(2000), Some(ms(200)), ms(2000), MOST, false));
        // A short grace: the floor is the grace itself.
        assert!(over(ms(100), Some(ms(100)), ms(100), MOST, false));
        assert!(!over(ms(100), Some(ms(99)), ms(100), MOST, false));
    }

    #[test]
    fn the_ceiling_ends_a_sleeping_cell_that_ignores_it_and_never_passes_the_most() {
        assert!(over(ms(20_000), Some(ms(0)), ms(2000), MOST, false));
        assert_eq!(ceiling(ms(2000), MOST), ms(20_000));
        assert_eq!(ceiling(ms(30_000), MOST), MOST);
        assert_eq!(ceiling(ms(60_000), MOST), MOST);
        assert!(over(MOST, Some(ms(0)), ms(30_000), MOST, false));
    }

    #[test]
    fn stateless_steps_and_unknown_cpu_use_the_wall() {
        assert!(over(ms(2000), Some(ms(0)), ms(2000), MOST, true));
        assert!(over(ms(2000), None, ms(2000), MOST, false));
    }
}
