//! A time limit in seconds, checked one way wherever it is given: the
//! policy's `wall_time_secs`, `cpu_time_secs` and `session.*_secs`, the
//! `--timeout` flags, a pool request's `limits`, and the service's and the
//! MCP server's timeouts.

use std::time::Duration;

/// The shortest time limit anything takes: 1 ms, the unit the result's
/// times are in. A shorter positive number (1e-15) would become a zero
/// `Duration`, a limit already past before the script starts.
pub(crate) const LEAST: f64 = 0.001;

/// The longest time limit a policy, a flag or a request takes: a day.
pub const MOST: f64 = 86_400.0;

/// `v` seconds as a time limit, or `None` when it is not a finite number
/// from [`LEAST`] to `most`.
pub fn limit(v: f64, most: f64) -> Option<Duration> {
    (LEAST..=most).contains(&v).then(|| Duration::from_secs_f64(v))
}

/// What [`limit`] takes, for an error message: "at least 0.001 and at most
/// {most}".
pub fn range(most: f64) -> String {
    format!("at least {LEAST} and at most {most}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_limit_is_at_least_a_millisecond_and_never_zero() {
        assert_eq!(limit(0.001, 10.0), Some(Duration::from_millis(1)));
        assert_eq!(limit(2.5, 10.0), Some(Duration::from_millis(2500)));
        assert_eq!(limit(10.0, 10.0), Some(Duration::from_secs(10)));
        for v in [
            1e-15,
            0.0009,
            0.0,
            -1.0,
            10.001,
            1e300,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            assert_eq!(limit(v, 10.0), None, "{v}");
        }
        assert_eq!(range(60.0), "at least 0.001 and at most 60");
    }
}
