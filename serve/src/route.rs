//! Which backend takes a run: a pure decision. The pool's jails are made
//! ahead with their memory, CPUs and pids fixed, and its protocol can only
//! lower a request's wall time; a run whose limits the pool's jails cannot
//! honour exactly, whose caller follows it live while the pool cannot
//! stream its events, or whose input the pool would copy outside its wall
//! time for too long, goes to a `jail run` of its own.

use std::time::Duration;

/// What a run asks for.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub memory_mib: u64,
    pub timeout: Duration,
    /// The caller follows the run's events (`"wait": false`).
    pub followed: bool,
    /// Entries (files and folders) of its input.
    pub input_entries: usize,
}

/// Input entries a pooled run may have at most. The pool copies a run's
/// input into its jail entry by entry, outside the run's wall time (4,096
/// empty folders took 14 s there); `jail run` binds the folder instead,
/// and what staging took is taken from the run's own time (runs.rs).
pub const POOL_INPUT_ENTRIES: usize = 256;

/// What the pool's jails are, while it is up.
#[derive(Debug, Clone, Copy)]
pub struct PoolShape {
    pub memory_mib: u64,
    /// The longest wall time a request may ask for (the pool's `--timeout`).
    pub timeout: Duration,
    /// It writes `{"id", "event"}` lines while a step runs.
    pub events: bool,
}

#[derive(Debug, Clone, Copy)]
pub enum PoolState {
    /// Served without a pool (`--pool-size 0`).
    None,
    /// Configured, but restarting or given up on.
    Down,
    Up(PoolShape),
}

/// Why a run went to `jail run` rather than the pool (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    NoPool,
    PoolDown,
    Memory,
    Timeout,
    LiveEvents,
    LargeInput,
}

impl Why {
    pub fn label(self) -> &'static str {
        match self {
            Why::NoPool => "no_pool",
            Why::PoolDown => "pool_down",
            Why::Memory => "memory",
            Why::Timeout => "timeout",
            Why::LiveEvents => "live_events",
            Why::LargeInput => "large_input",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Pool,
    Spawn(Why),
}

pub fn choose(run: &Shape, pool: PoolState) -> Choice {
    let shape = match pool {
        PoolState::None => return Choice::Spawn(Why::NoPool),
        PoolState::Down => return Choice::Spawn(Why::PoolDown),
        PoolState::Up(s) => s,
    };
    // Memory is fixed when a pooled jail is made: more would break the
    // run's limit, less would break the tenant's promise of what it asked.
    if run.memory_mib != shape.memory_mib {
        return Choice::Spawn(Why::Memory);
    }
    // A request can only lower the pool's wall time.
    if run.timeout > shape.timeout {
        return Choice::Spawn(Why::Timeout);
    }
    if run.followed && !shape.events {
        return Choice::Spawn(Why::LiveEvents);
    }
    if run.input_entries > POOL_INPUT_ENTRIES {
        return Choice::Spawn(Why::LargeInput);
    }
    Choice::Pool
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: PoolShape = PoolShape { memory_mib: 256, timeout: Duration::from_secs(60), events: false };

    fn run(memory_mib: u64, secs: u64, followed: bool) -> Shape {
        Shape { memory_mib, timeout: Duration::from_secs(secs), followed, input_entries: 0 }
    }

    #[test]
    fn a_large_input_is_spawned_where_the_jail_binds_it() {
        let big = Shape { input_entries: POOL_INPUT_ENTRIES + 1, ..run(256, 10, false) };
        assert_eq!(choose(&big, PoolState::Up(POOL)), Choice::Spawn(Why::LargeInput));
        let fits = Shape { input_entries: POOL_INPUT_ENTRIES, ..run(256, 10, false) };
        assert_eq!(choose(&fits, PoolState::Up(POOL)), Choice::Pool);
    }

    #[test]
    fn a_run_within_the_pools_jails_goes_to_the_pool() {
        assert_eq!(choose(&run(256, 60, false), PoolState::Up(POOL)), Choice::Pool);
        assert_eq!(choose(&run(256, 1, false), PoolState::Up(POOL)), Choice::Pool, "the wall time is lowered per request");
    }

    #[test]
    fn other_memory_either_way_is_spawned() {
        assert_eq!(choose(&run(512, 10, false), PoolState::Up(POOL)), Choice::Spawn(Why::Memory));
        assert_eq!(choose(&run(64, 10, false), PoolState::Up(POOL)), Choice::Spawn(Why::Memory));
    }

    #[test]
    fn a_wall_time_above_the_pools_is_spawned() {
        assert_eq!(choose(&run(256, 61, false), PoolState::Up(POOL)), Choice::Spawn(Why::Timeout));
    }

    #[test]
    fn a_followed_run_is_spawned_unless_the_pool_streams_events() {
        assert_eq!(choose(&run(256, 10, true), PoolState::Up(POOL)), Choice::Spawn(Why::LiveEvents));
        let live = PoolShape { events: true, ..POOL };
        assert_eq!(choose(&run(256, 10, true), PoolState::Up(live)), Choice::Pool);
    }

    #[test]
    fn without_a_pool_or_while_it_is_down_everything_is_spawned() {
        assert_eq!(choose(&run(256, 10, false), PoolState::None), Choice::Spawn(Why::NoPool));
        assert_eq!(choose(&run(256, 10, false), PoolState::Down), Choice::Spawn(Why::PoolDown));
    }
}
