//! `/metrics`: Prometheus text, formatted by hand from a few counters.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::pool::{Health, Snapshot};

/// Upper bounds of the run latency histogram, in seconds.
const BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Default)]
struct Counts {
    runs: BTreeMap<String, u64>,
    backends: BTreeMap<&'static str, u64>,
    spawned: BTreeMap<&'static str, u64>,
    rejections: BTreeMap<&'static str, u64>,
    /// (limit, tenant or "") → times it was hit.
    limits: BTreeMap<(&'static str, String), u64>,
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

    /// A run ended (with a result or not) on `backend`: `pool` or `spawn`.
    pub fn ran_on(&self, backend: &'static str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.backends.entry(backend).or_default() += 1;
        }
    }

    /// A run went to `jail run` rather than the pool, for `why` (route.rs).
    pub fn spawned(&self, why: &'static str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.spawned.entry(why).or_default() += 1;
        }
    }

    /// A request was refused: `busy`, `draining`, `unauthorized`, `bad_request`, ...
    pub fn rejected(&self, code: &'static str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.rejections.entry(code).or_default() += 1;
        }
    }

    /// A limit closed a connection or refused a request: `limit` names it
    /// (`max_connections`, `max_unauthenticated`, `header_timeout`,
    /// `idle_timeout`, `send_timeout`, `body_timeout`, `tenant_requests`,
    /// `tenant_streams`, `tenant_artifact_reads`, `anonymous_requests`,
    /// `tenant_runs`, `node_runs`, `kept_bytes` (a kept run forgotten),
    /// `accept_failed`), `tenant` the tenant's name when the
    /// request had a valid token.
    pub fn limit_hit(&self, limit: &'static str, tenant: &str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.limits.entry((limit, tenant.to_owned())).or_default() += 1;
        }
    }

    /// The connections, what each tenant keeps, the limits hit and the
    /// server's own resident memory.
    pub fn render_bounds(&self, s: &mut String, bounds: &Bounds) {
        let _ = writeln!(s, "# HELP jail_connections_open HTTP connections open now.");
        let _ = writeln!(s, "# TYPE jail_connections_open gauge\njail_connections_open {}", bounds.open);
        let _ = writeln!(s, "# HELP jail_connections_unauthenticated Open connections with no request with a valid token yet.");
        let _ = writeln!(
            s,
            "# TYPE jail_connections_unauthenticated gauge\njail_connections_unauthenticated {}",
            bounds.unauthenticated
        );
        let _ = writeln!(
            s,
            "# HELP jail_connections_max The open connections allowed (--max-connections, as the open-files limit leaves it)."
        );
        let _ = writeln!(s, "# TYPE jail_connections_max gauge\njail_connections_max {}", bounds.max_connections);
        let _ = writeln!(s, "# HELP jail_kept_runs Finished and running runs a tenant keeps now.");
        let _ = writeln!(s, "# TYPE jail_kept_runs gauge");
        for (tenant, runs, _) in &bounds.kept {
            let _ = writeln!(s, "jail_kept_runs{{tenant=\"{tenant}\"}} {runs}");
        }
        let _ = writeln!(
            s,
            "# HELP jail_kept_bytes Bytes a tenant's kept runs take: events, results and artifacts on disk, and what the server holds of each."
        );
        let _ = writeln!(s, "# TYPE jail_kept_bytes gauge");
        for (tenant, _, bytes) in &bounds.kept {
            let _ = writeln!(s, "jail_kept_bytes{{tenant=\"{tenant}\"}} {bytes}");
        }
        let _ =
            writeln!(s, "# HELP jail_kept_bytes_limit A tenant's max_kept_bytes: its kept runs are shed, oldest first, past it.");
        let _ = writeln!(s, "# TYPE jail_kept_bytes_limit gauge");
        for (tenant, limit) in &bounds.kept_limits {
            let _ = writeln!(s, "jail_kept_bytes_limit{{tenant=\"{tenant}\"}} {limit}");
        }
        let _ = writeln!(s, "# HELP jail_limit_hits_total Connections closed and requests refused by a limit, by limit and tenant (empty before a valid token).");
        let _ = writeln!(s, "# TYPE jail_limit_hits_total counter");
        if let Ok(c) = self.counts.lock() {
            for ((limit, tenant), n) in &c.limits {
                let _ = writeln!(s, "jail_limit_hits_total{{limit=\"{limit}\",tenant=\"{tenant}\"}} {n}");
            }
        }
        let _ = writeln!(
            s,
            "# HELP process_resident_memory_bytes The server's own resident memory (its jails are processes of their own)."
        );
        let _ = writeln!(s, "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}", resident_bytes());
    }

    pub fn render(&self, in_flight: usize, sessions: usize, draining: bool, pool: Option<&Snapshot>) -> String {
        let Ok(c) = self.counts.lock() else { return String::new() };
        let mut s = String::new();
        if let Some(p) = pool {
            render_pool(&mut s, p);
        }
        let _ = writeln!(s, "# HELP jail_runs_by_backend_total Runs ended, by where they ran: pool or spawn (jail run).");
        let _ = writeln!(s, "# TYPE jail_runs_by_backend_total counter");
        for backend in ["pool", "spawn"] {
            let _ = writeln!(s, "jail_runs_by_backend_total{{backend=\"{backend}\"}} {}", c.backends.get(backend).unwrap_or(&0));
        }
        let _ = writeln!(s, "# HELP jail_runs_spawned_total Runs sent to jail run rather than the pool, by why.");
        let _ = writeln!(s, "# TYPE jail_runs_spawned_total counter");
        for (why, n) in &c.spawned {
            let _ = writeln!(s, "jail_runs_spawned_total{{reason=\"{why}\"}} {n}");
        }
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

/// What `render_bounds` shows besides the counters.
pub struct Bounds {
    pub open: usize,
    pub unauthenticated: usize,
    pub max_connections: usize,
    /// (tenant, runs kept, bytes kept)
    pub kept: Vec<(String, usize, u64)>,
    /// (tenant, max_kept_bytes)
    pub kept_limits: Vec<(String, u64)>,
}

/// This process's resident memory, from /proc/self/status (0 when unread).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok());
    kib.unwrap_or(0) * 1024
}

/// The pool's gauges: its health, and its own `stats` when it answered.
fn render_pool(s: &mut String, p: &Snapshot) {
    let up = u8::from(p.health == Health::Up);
    let _ = writeln!(s, "# HELP jail_pool_up 1 while the warm pool serves; 0 while it restarts or after it was given up.");
    let _ = writeln!(s, "# TYPE jail_pool_up gauge\njail_pool_up {up}");
    let _ = writeln!(s, "# HELP jail_pool_restarts_total Times the warm pool ended and was started again.");
    let _ = writeln!(s, "# TYPE jail_pool_restarts_total counter\njail_pool_restarts_total {}", p.restarts);
    let _ = writeln!(s, "# HELP jail_pool_live_events 1 when the pool streams a run's events as it runs.");
    let _ = writeln!(s, "# TYPE jail_pool_live_events gauge\njail_pool_live_events {}", u8::from(p.events));
    let _ = writeln!(s, "# HELP jail_pool_size Jails the pool keeps made ahead.");
    let _ = writeln!(s, "# TYPE jail_pool_size gauge\njail_pool_size {}", p.size);
    let Some(st) = &p.stats else { return };
    for (name, value, help) in [
        ("jail_pool_ready", st.ready, "Jails made and waiting for a run."),
        ("jail_pool_making", st.making, "Jails being made."),
        ("jail_pool_in_use", st.in_use, "Jails running a run."),
        (
            "jail_pool_idle_rss_bytes",
            st.idle_rss_bytes,
            "Resident memory of the last jail made, idle, summed over its processes.",
        ),
    ] {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} gauge\n{name} {value}");
    }
    let _ = writeln!(s, "# HELP jail_pool_refill_seconds Time to make a jail (start to preload done): the last, and the mean.");
    let _ = writeln!(s, "# TYPE jail_pool_refill_seconds gauge");
    let _ = writeln!(s, "jail_pool_refill_seconds{{stat=\"last\"}} {}", st.refill_ms.last / 1000.0);
    let _ = writeln!(s, "jail_pool_refill_seconds{{stat=\"mean\"}} {}", st.refill_ms.mean / 1000.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_lands_in_its_buckets_and_its_status() {
        let m = Metrics::default();
        m.run("ok", Duration::from_millis(300), 2);
        m.ran_on("pool");
        let text = m.render(1, 0, false, None);
        assert!(text.contains("jail_runs_total{status=\"ok\"} 1"), "{text}");
        assert!(text.contains("jail_run_seconds_bucket{le=\"0.25\"} 0"), "{text}");
        assert!(text.contains("jail_run_seconds_bucket{le=\"0.5\"} 1"), "{text}");
        assert!(text.contains("jail_denials_total 2"), "{text}");
        assert!(text.contains("jail_runs_by_backend_total{backend=\"pool\"} 1"), "{text}");
        assert!(text.contains("jail_runs_by_backend_total{backend=\"spawn\"} 0"), "{text}");
        assert!(!text.contains("jail_pool_up"), "no pool, no pool gauges: {text}");
    }

    #[test]
    fn limits_hit_are_counted_by_limit_and_tenant() {
        let m = Metrics::default();
        m.limit_hit("tenant_streams", "a");
        m.limit_hit("tenant_streams", "a");
        m.limit_hit("header_timeout", "");
        let bounds = Bounds {
            open: 3,
            unauthenticated: 1,
            max_connections: 10,
            kept: vec![("a".into(), 2, 4096)],
            kept_limits: vec![("a".into(), 1 << 20)],
        };
        let mut text = String::new();
        m.render_bounds(&mut text, &bounds);
        for needle in [
            "jail_limit_hits_total{limit=\"tenant_streams\",tenant=\"a\"} 2",
            "jail_limit_hits_total{limit=\"header_timeout\",tenant=\"\"} 1",
            "jail_connections_open 3",
            "jail_kept_bytes{tenant=\"a\"} 4096",
            "jail_kept_bytes_limit{tenant=\"a\"} 1048576",
            "process_resident_memory_bytes ",
        ] {
            assert!(text.contains(needle), "lacks {needle}: {text}");
        }
        assert!(!text.contains("process_resident_memory_bytes 0\n"), "{text}");
    }

    #[test]
    fn the_pools_stats_become_gauges() {
        let stats = serde_json::from_value(serde_json::json!({"size": 4, "ready": 3, "making": 1, "in_use": 0,
                                       "refill_ms": {"last": 44.5, "mean": 50.0}, "idle_rss_bytes": 1000}))
        .unwrap();
        let snap = Snapshot { health: Health::Up, restarts: 2, events: false, size: 4, stats: Some(stats) };
        let text = Metrics::default().render(0, 0, false, Some(&snap));
        for needle in [
            "jail_pool_up 1",
            "jail_pool_restarts_total 2",
            "jail_pool_size 4",
            "jail_pool_ready 3",
            "jail_pool_refill_seconds{stat=\"last\"} 0.0445",
            "jail_pool_refill_seconds{stat=\"mean\"} 0.05",
        ] {
            assert!(text.contains(needle), "lacks {needle}: {text}");
        }
        let down = Snapshot { health: Health::Restarting("x".into()), stats: None, ..snap };
        assert!(Metrics::default().render(0, 0, false, Some(&down)).contains("jail_pool_up 0"));
    }
}
