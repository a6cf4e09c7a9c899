//! Shared by the parser fuzz targets: a counting global allocator, and
//! [`within_budget`], which runs one parse and fails the input when its
//! peak heap passes the parser's `memory_budget` or its time passes the
//! per-file scan budget (with a second of slack for a loaded host);
//! [`within`] does the same against budgets the target names (`jail
//! serve`'s tar planner).
//!
//! The allocator counts every Rust allocation of the process; libFuzzer's
//! own (C) allocations do not go through it. A target is single-threaded,
//! so the peak between start and end is the parse's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use jail::artifacts::fuzzing::{memory_budget, Parser, FILE_SCAN_TIME};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds GlobalAlloc's contract; the counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout is passed on as given.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for alloc.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: ptr was allocated by System with this layout (alloc above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: ptr and layout come from alloc above; new_size is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Run `parse`: what it returned, its peak heap above what was in use
/// before it, and its time.
fn measured<T>(parse: impl FnOnce() -> T) -> (T, usize, Duration) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let started = Instant::now();
    let out = parse();
    let took = started.elapsed();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base), took)
}

/// Run `parse` and fail when its peak heap passes `memory` bytes or its
/// time passes `time`.
pub fn within<T>(memory: usize, time: Duration, parse: impl FnOnce() -> T) -> T {
    let (out, peak, took) = measured(parse);
    assert!(peak <= memory, "the parse peaked at {peak} bytes of heap, over its {memory}-byte budget");
    assert!(took <= time, "the parse took {took:?}, over {time:?}");
    out
}

/// Run `parse` and check it against `parser`'s budgets for `input` bytes.
pub fn within_budget<T>(parser: Parser, input: usize, parse: impl FnOnce() -> T) -> T {
    let (out, peak, took) = measured(parse);
    let budget = memory_budget(parser, input);
    assert!(
        peak <= budget,
        "{parser:?}: the parse of {input} bytes peaked at {peak} bytes of heap, over its {budget}-byte budget"
    );
    let limit = FILE_SCAN_TIME + Duration::from_secs(1);
    assert!(took <= limit, "{parser:?}: the parse of {input} bytes took {took:?}, over {limit:?}");
    out
}
