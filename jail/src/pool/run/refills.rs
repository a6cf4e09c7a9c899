//! How long the pool took to make its jails (the `stats` answer's
//! `refill_ms`, pool.rs): the last, the mean of all, and the median and
//! p99 of the recent ones, which `make bench` holds to issue 36's "a
//! data-stack jail made ready in at most 10 ms median".

use std::collections::VecDeque;

use crate::client::pool as wire;

/// Refills the median and p99 are taken over, at most: the recent ones,
/// so the figures follow the pool as it is now, and the memory and the
/// sort of a `stats` answer stay bounded however long the pool lives.
const RECENT: usize = 256;

/// The refill times recorded so far, in ms.
#[derive(Debug, Default)]
pub(super) struct Refills {
    last: f64,
    sum: f64,
    n: u64,
    recent: VecDeque<f64>,
}

impl Refills {
    /// One jail made ready in `ms`.
    pub(super) fn record(&mut self, ms: f64) {
        self.last = ms;
        self.sum += ms;
        self.n += 1;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(ms);
    }

    /// The `refill_ms` object, each figure to 0.1 ms; all 0 before the
    /// first jail is made.
    pub(super) fn summary(&self) -> wire::Refill {
        let mut sorted: Vec<f64> = self.recent.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let mean = if self.n == 0 { 0.0 } else { self.sum / self.n as f64 };
        wire::Refill {
            last: round1(self.last),
            mean: round1(mean),
            median: round1(median(&sorted)),
            p99: round1(nearest_rank(&sorted, 99)),
        }
    }
}

/// The middle of `sorted` (the mean of the two middle values when their
/// number is even); 0 when empty.
fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The `p`th percentile of `sorted` by nearest rank: the smallest value
/// at least `p`% of them are at or below (so always one of them, and never
/// below the median); 0 when empty.
fn nearest_rank(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refill(last: f64, mean: f64, median: f64, p99: f64) -> wire::Refill {
        wire::Refill { last, mean, median, p99 }
    }

    #[test]
    fn before_the_first_jail_every_figure_is_zero() {
        assert_eq!(Refills::default().summary(), refill(0.0, 0.0, 0.0, 0.0));
    }

    #[test]
    fn one_refill_is_its_own_median_and_p99() {
        let mut r = Refills::default();
        r.record(812.34);
        assert_eq!(r.summary(), refill(812.3, 812.3, 812.3, 812.3));
    }

    #[test]
    fn the_median_is_the_middle_and_the_p99_the_slow_tail_by_nearest_rank() {
        let mut r = Refills::default();
        // 1..=100 ms, out of order: the p99 is the 99th smallest.
        for ms in (1..=100).rev() {
            r.record(ms as f64);
        }
        assert_eq!(r.summary(), refill(1.0, 50.5, 50.5, 99.0));
        let mut two = Refills::default();
        two.record(10.0);
        two.record(30.0);
        assert_eq!(two.summary(), refill(30.0, 20.0, 20.0, 30.0), "the p99 of two is the slower");
    }

    #[test]
    fn the_median_and_p99_forget_all_but_the_recent_refills_and_the_mean_does_not() {
        let mut r = Refills::default();
        for _ in 0..RECENT {
            r.record(1000.0);
        }
        for _ in 0..RECENT {
            r.record(10.0);
        }
        assert_eq!(r.recent.len(), RECENT, "bounded");
        assert_eq!(r.summary(), refill(10.0, 505.0, 10.0, 10.0));
    }
}
