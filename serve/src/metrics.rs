//! `/metrics`: Prometheus text, formatted by hand from a few counters.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the run latency histogram, in seconds.
const BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Default)]
struct Counts {
    runs: BTreeMap<String, u64>,
    rejections: BTreeMap<&'static str, u64>,
    denials: u64,
    buckets: [u64; BUCKETS.len()],
    latency_count: u64,
    latency_sum: f64,
}

#[derive(Default)]
pub struct Metrics {
    counts: Mutex<Counts>,
}

impl Metrics {
    /// A run ended with `status` (the result's, or `error`) after `took`.
    pub fn run(&self, status: &str, took: Duration, denials: u64) {
        let Ok(mut c) = self.counts.lock() else { return };
        *c.runs.entry(status.into()).or_default() += 1;
        c.denials += denials;
        let secs = took.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                c.buckets[i] += 1;
            }
        }
        c.latency_count += 1;
        c.latency_sum += secs;
    }

    /// A request was refused: `busy`, `draining`, `unauthorized`, `bad_request`, ...
    pub fn rejected(&self, code: &'static str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.rejections.entry(code).or_default() += 1;
        }
    }

    pub fn render(&self, in_flight: usize, sessions: usize, draining: bool) -> String {
        let Ok(c) = self.counts.lock() else { return String::new() };
        let mut s = String::new();
        let _ = writeln!(s, "# HELP jail_runs_in_flight Runs running now (the HPA's metric).");
        let _ = writeln!(s, "# TYPE jail_runs_in_flight gauge\njail_runs_in_flight {in_flight}");
        let _ = writeln!(s, "# HELP jail_sessions_open Sessions open now.");
        let _ = writeln!(s, "# TYPE jail_sessions_open gauge\njail_sessions_open {sessions}");
        let _ = writeln!(s, "# HELP jail_draining 1 while the server drains after SIGTERM.");
        let _ = writeln!(s, "# TYPE jail_draining gauge\njail_draining {}", u8::from(draining));
        let _ = writeln!(s, "# HELP jail_runs_total Runs ended, by the result's status.");
        let _ = writeln!(s, "# TYPE jail_runs_total counter");
        for (status, n) in &c.runs {
            let _ = writeln!(s, "jail_runs_total{{status=\"{status}\"}} {n}");
        }
        let _ = writeln!(s, "# HELP jail_denials_total Denials the runs' results reported.");
        let _ = writeln!(s, "# TYPE jail_denials_total counter\njail_denials_total {}", c.denials);
        let _ = writeln!(s, "# HELP jail_rejections_total Requests refused, by reason.");
        let _ = writeln!(s, "# TYPE jail_rejections_total counter");
        for (code, n) in &c.rejections {
            let _ = writeln!(s, "jail_rejections_total{{reason=\"{code}\"}} {n}");
        }
        let _ = writeln!(s, "# HELP jail_run_seconds Run latency, request to result.");
        let _ = writeln!(s, "# TYPE jail_run_seconds histogram");
        for (bound, n) in BUCKETS.iter().zip(c.buckets) {
            let _ = writeln!(s, "jail_run_seconds_bucket{{le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(s, "jail_run_seconds_bucket{{le=\"+Inf\"}} {}", c.latency_count);
        let _ = writeln!(s, "jail_run_seconds_sum {}\njail_run_seconds_count {}", c.latency_sum, c.latency_count);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_lands_in_its_buckets_and_its_status() {
        let m = Metrics::default();
        m.run("ok", Duration::from_millis(300), 2);
        let text = m.render(1, 0, false);
        assert!(text.contains("jail_runs_total{status=\"ok\"} 1"), "{text}");
        assert!(text.contains("jail_run_seconds_bucket{le=\"0.25\"} 0"), "{text}");
        assert!(text.contains("jail_run_seconds_bucket{le=\"0.5\"} 1"), "{text}");
        assert!(text.contains("jail_denials_total 2"), "{text}");
    }
}
