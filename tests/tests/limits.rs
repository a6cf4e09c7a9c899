//! Resource limits (issue 3): each test runs something that tries to exhaust
//! the host from inside the jail, asserts what stopped it and what the
//! result says about it, and that nothing of the run is left afterwards.
//!
//! As root on the CI host the run cgroup is v1; as an ordinary user with no
//! delegated cgroup, rlimits stand in. Every test asserts the backend it
//! expects (`expected_backend`) and what really happens under it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use jail_tests::*;

/// A run of `source` with these jail flags and a unique marker as the
/// script's argument, checked for leftovers once it is over.
fn run_with(sb: &Sandbox, flags: &[&str], source: &str) -> RunResult {
    let marker = format!("jail-limits-marker-{}-{}", std::process::id(), unique());
    let cmd: Command = sb.command(source);
    // `command` ends with the script; flags go before it, the marker after.
    let mut args: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_os_string()).collect();
    let script = args.pop().expect("script argument");
    let mut full = Command::new(jail_bin());
    full.args(&args).args(flags).arg(script).arg(&marker);
    let (r, out, pid) = run_tracked(&mut full);
    assert_nothing_left(pid, &marker, sb);
    if r.status == Status::SetupFailed {
        eprintln!("setup failed: {:?}\n{}", r.setup_error, String::from_utf8_lossy(&out.stderr));
    }
    r
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Write a policy into the sandbox's folder and return its path.
fn policy(sb: &Sandbox, filesystem: &str, limits: &str) -> String {
    let path = sb.dir.path().join(format!("policy-{}.json", unique()));
    let text = format!(r#"{{"version": 1, "name": "limits-test", "filesystem": {filesystem}, "limits": {limits}}}"#);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    path.display().to_string()
}

fn cpu_ms(r: &RunResult) -> f64 {
    r.usage.user_cpu_ms.unwrap() + r.usage.system_cpu_ms.unwrap()
}

fn is_cgroup(backend: &str) -> bool {
    backend.starts_with("cgroup_")
}

#[test]
fn memory_bomb_is_stopped_at_the_memory_limit() {
    let sb = Sandbox::new();
    let backend = expected_backend();
    let r = run_with(
        &sb,
        &["--memory", "64M"],
        r#"
import sys
chunks = []
while True:
    chunks.append(b"x" * (1 << 20))
    print(len(chunks), flush=True)
"#,
    );
    assert_eq!(
        r.limits["memory"].enforced_by,
        if is_cgroup(&backend) { backend.as_str() } else { "rlimit" },
        "{:?}",
        r.limits
    );
    assert_eq!(r.limits["memory"].value, serde_json::json!(64 << 20));
    let reached: u64 = r.stdout.text.lines().last().and_then(|l| l.parse().ok()).unwrap_or(0);
    assert!(reached < 64, "the script held {reached} MiB under a 64 MiB limit");
    if is_cgroup(&backend) {
        // The kernel's OOM killer, inside the run cgroup only.
        assert_eq!(r.status, Status::OomKilled, "{r:?}");
        assert!(r.usage.oom_kills.unwrap() >= 1);
        if backend == "cgroup_v2" && !kernel_has_memory_peak() {
            // Before 5.19 v2 has no memory.peak: no figure rather than a guess.
            assert_eq!(r.usage.peak_memory_bytes, None);
        } else {
            let peak = r.usage.peak_memory_bytes.unwrap();
            assert!(peak <= 64 << 20 && peak > 32 << 20, "peak {peak}");
        }
    } else {
        // RLIMIT_AS: the allocation fails and Python says so.
        assert_eq!(r.status, Status::NonzeroExit, "{r:?}");
        assert_eq!(r.error.as_ref().map(|e| e.kind.as_str()), Some("MemoryError"), "{}", r.stderr.text);
        assert_eq!(r.usage.oom_kills, None);
        assert_eq!(r.usage.peak_memory_bytes, None, "no cgroup, so no run-wide peak: never invented");
    }
}

#[test]
fn fork_bomb_is_held_at_the_pids_limit_and_nothing_survives() {
    let sb = Sandbox::new();
    let backend = expected_backend();
    let r = run_with(
        &sb,
        &["--pids", "16"],
        r#"
import os, sys, time
forked = 0
while forked < 1000:
    try:
        pid = os.fork()
    except BlockingIOError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print(forked, flush=True)
"#,
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.limits["pids"].enforced_by, if is_cgroup(&backend) { backend.as_str() } else { "rlimit" });
    // PID 1 and the script count: 16 - 2 children at most, and the limit,
    // not something else, is what stopped the loop.
    let forked: u64 = r.stdout.text.trim().parse().unwrap();
    assert_eq!(forked, 14, "{}", r.stdout.text);
    if is_cgroup(&backend) {
        if let Some(peak) = r.usage.pids_peak {
            assert_eq!(peak, 16);
        }
    } else {
        assert_eq!(r.usage.pids_peak, None);
    }
    // run_with has checked that none of the 14 sleepers outlived the run.
}

/// A CPU hog of `source` for about 3 s of wall time, run under
/// `--cpus 0.5` and `--cpus 0.2`, held to its quota each time
/// ([`assert_held_to_quota`]). Returns the 0.5 run.
fn hog_at_its_quota(source: &str) -> RunResult {
    let sb = Sandbox::new();
    let mut first = None;
    for (cores, flag) in [(0.5, "0.5"), (0.2, "0.2")] {
        let r = run_with(&sb, &["--cpus", flag, "--timeout", "20"], source);
        assert_eq!(r.status, Status::Ok, "{r:?}");
        let share = cpu_ms(&r) / r.usage.wall_ms;
        let seen = format!("--cpus {flag}: used {share:.3} of a core ({} ms CPU in {} ms)", cpu_ms(&r), r.usage.wall_ms);
        eprintln!("{seen}; throttled {:?}", r.usage.throttled);
        assert_held_to_quota(&r, cores, share, r.usage.wall_ms, &seen);
        first.get_or_insert(r);
    }
    first.expect("two runs")
}

const HOG_WALL: f64 = 3.0;

#[test]
fn cpu_hog_under_half_a_core_gets_about_half_a_core() {
    let r = hog_at_its_quota(&format!(
        r#"
import time
end = time.monotonic() + {HOG_WALL}
while time.monotonic() < end:
    pass
for i in range(2000):
    print("line", i)
"#
    ));
    // The stops break neither the wall time nor the output.
    let want: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(r.stdout.text, want);
    assert!(!r.stdout.truncated);
    assert!((2900.0..8000.0).contains(&r.usage.wall_ms), "{}", r.usage.wall_ms);
}

#[test]
fn a_forking_cpu_hog_is_held_to_the_quota_as_a_whole() {
    hog_at_its_quota(&format!(
        r#"
import os, time
end = time.monotonic() + {HOG_WALL}
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() < end:
            pass
        os._exit(0)
    kids.append(pid)
while time.monotonic() < end:
    pass
for k in kids:
    os.waitpid(k, 0)
"#
    ));
}

#[test]
fn a_hog_that_sends_sigcont_to_every_pid_it_sees_is_still_held() {
    hog_at_its_quota(&sigcont_hog(HOG_WALL));
}

#[test]
fn cpu_time_limit_below_the_wall_time_ends_as_timeout_cpu() {
    let sb = Sandbox::new();
    let backend = expected_backend();
    let started = Instant::now();
    // A wall limit far above the CPU limit: on a loaded host a second of
    // CPU can take several seconds of wall time, and the test is about which
    // limit ends the run, not how fast the host is.
    let r = run_with(&sb, &["--cpu-time", "1", "--timeout", "60"], "while True:\n    pass\n");
    let took = started.elapsed();
    assert_eq!(r.status, Status::TimeoutCpu, "{r:?}");
    if is_cgroup(&backend) {
        assert_eq!(r.limits["cpu_time_secs"].enforced_by, "supervisor");
        // The cgroup's own count, checked every 100 ms: at the limit, and
        // well before the next whole second.
        assert!(cpu_ms(&r) >= 950.0, "stopped after only {} ms of CPU", cpu_ms(&r));
        assert!(cpu_ms(&r) < 1400.0, "overran to {} ms", cpu_ms(&r));
    } else {
        assert_eq!(r.limits["cpu_time_secs"].enforced_by, "rlimit");
        assert_eq!(r.signal_name.as_deref(), Some("SIGXCPU"));
        // The kernel fires RLIMIT_CPU on its tick-sampled count, which on a
        // busy host runs ahead of the precise runtime getrusage reports.
        assert!(cpu_ms(&r) >= 600.0, "stopped after only {} ms of CPU", cpu_ms(&r));
    }
    assert!(took < Duration::from_secs(60), "took {took:?}: the wall limit, not the CPU limit, ended it");
}

#[test]
fn filling_tmp_hits_enospc_inside_and_the_host_disk_is_untouched() {
    let sb = Sandbox::new();
    // Sizes that fit in the memory limit together, so that no backend
    // shrinks them (see without_a_cgroup_each_memory_route_...).
    let p = policy(&sb, r#"{"tmp_size": "32M", "output_size": "64M"}"#, r#"{"memory": "256M"}"#);
    let r = run_with(
        &sb,
        &["--policy", &p],
        r#"
import errno, json, os
written = 0
try:
    with open("/tmp/fill", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
except OSError as e:
    st = os.statvfs("/tmp")
    print(json.dumps({"errno": errno.errorcode[e.errno], "written": written, "fs_bytes": st.f_blocks * st.f_frsize}))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["errno"], "ENOSPC");
    let written = v["written"].as_u64().unwrap();
    assert!((30 << 20..=32 << 20).contains(&written), "wrote {written}");
    assert_eq!(r.limits["tmp_size"].enforced_by, "tmpfs");
    // The bytes went to a filesystem of exactly tmp_size, the jail's own,
    // not to the host's disk. (Not the host's free space, which any other
    // work on the machine moves: a loaded run saw 38 MB go meanwhile.)
    assert_eq!(v["fs_bytes"], 32u64 << 20, "{v}");
}

#[test]
fn a_file_over_the_file_size_limit_fails_with_efbig() {
    let sb = Sandbox::new();
    let p = policy(&sb, "{}", r#"{"file_size": "1M"}"#);
    let r = run_with(
        &sb,
        &["--policy", &p],
        r#"
import errno, json
try:
    with open("/tmp/big", "wb") as f:
        f.write(b"x" * (2 << 20))
    print(json.dumps({"errno": None}))
except OSError as e:
    import os
    print(json.dumps({"errno": errno.errorcode[e.errno], "size": os.path.getsize("/tmp/big")}))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["errno"], "EFBIG", "{v}");
    assert_eq!(v["size"], 1 << 20);
    assert_eq!(r.limits["file_size"].enforced_by, "rlimit");
}

#[test]
fn a_hundred_megabytes_on_stdout_is_capped_flagged_and_the_supervisor_stays_small() {
    let sb = Sandbox::new();
    let r = run_with(
        &sb,
        &[],
        r#"
import sys
chunk = b"y" * (1 << 20)
for _ in range(100):
    sys.stdout.buffer.write(chunk)
sys.stdout.buffer.write(b"END")
"#,
    );
    assert_eq!(r.status, Status::OutputLimit, "{:?}", r.setup_error);
    assert_eq!(r.exit_code, Some(0), "truncated, not killed");
    assert_eq!(r.stdout.bytes, (100 << 20) + 3);
    assert!(r.stdout.truncated);
    assert!(r.stdout.text.ends_with("END"));
    assert!(r.stdout.text.len() < (1 << 20) + 200, "kept {} bytes", r.stdout.text.len());
    // Against a trivial run of the same binary, measured now: what the
    // supervisor costs at rest follows the size of its binary (the pages of
    // its text and relocations), not this test; 100 MiB of output held in
    // memory would show as 100 MiB over it.
    let base = run_with(&sb, &[], "print('nothing')\n").supervisor.max_rss_bytes;
    let rss = r.supervisor.max_rss_bytes;
    assert!(rss < base + (4 << 20), "the supervisor grew to {rss} bytes, {base} for a trivial run");
}

#[test]
fn a_required_limit_the_host_cannot_enforce_fails_before_the_script_starts() {
    let sb = Sandbox::new();
    // No cgroup can be made beneath a parent that does not exist, so a total
    // for the run's memory (which only a cgroup can count) is impossible for
    // every user.
    let p = policy(&sb, "{}", r#"{"memory": "256M", "enforcement": {"memory": "required"}}"#);
    let marker = sb.output.join("ran");
    let source = format!("open({:?}, 'w').write('x')\n", Path::new("/workspace/output/ran"));
    let r = run_with(&sb, &["--policy", &p, "--cgroup-parent", "/no-such-cgroup-for-jail"], &source);
    assert_eq!(r.status, Status::SetupFailed);
    let e = r.setup_error.unwrap();
    assert_eq!(e.stage, "limits");
    assert!(e.message.contains("memory: only RLIMIT_AS"), "{}", e.message);
    assert!(e.message.contains("best_effort"), "the message names the fix: {}", e.message);
    assert!(!marker.exists(), "the script ran");
    // Best effort, the same run goes ahead and says what it lacks.
    let p = policy(&sb, "{}", r#"{"memory": "256M", "enforcement": {"memory": "best_effort"}}"#);
    let r = run_with(&sb, &["--policy", &p, "--cgroup-parent", "/no-such-cgroup-for-jail"], &source);
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.limits["memory"].enforced_by, "rlimit");
    assert!(r.isolation.degraded.iter().any(|d| d.contains("memory")), "{:?}", r.isolation.degraded);
    // A required CPU quota goes ahead: the supervisor enforces it.
    let p = policy(&sb, "{}", r#"{"cpus": 0.5, "enforcement": {"cpus": "required"}}"#);
    let r = run_with(&sb, &["--policy", &p, "--cgroup-parent", "/no-such-cgroup-for-jail"], &source);
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.limits["cpus"].enforced_by, "supervisor");
}

#[test]
fn a_bad_limit_flag_is_refused_naming_the_flag() {
    let sb = Sandbox::new();
    for (flag, value) in [("--memory", "12Q"), ("--cpus", "0"), ("--pids", "1.5"), ("--cpu-time", "0")] {
        let r = run_with(&sb, &[flag, value], "print('ran')\n");
        assert_eq!(r.status, Status::SetupFailed, "{flag} {value}");
        let e = r.setup_error.unwrap();
        assert!(e.message.starts_with(flag), "{flag} {value}: {}", e.message);
        assert_eq!(r.stdout.text, "");
    }
}

#[test]
fn thread_pools_are_sized_to_the_cpu_limit() {
    let sb = Sandbox::new();
    let r = run_with(
        &sb,
        &["--cpus", "1.5"],
        "import json, os\nprint(json.dumps({k: v for k, v in os.environ.items() if k.endswith('_THREADS')}))\n",
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    for var in [
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    ] {
        assert_eq!(v[var], "2", "{var}: {v}");
    }
}

#[test]
fn usage_reports_what_the_run_really_used() {
    let sb = Sandbox::new();
    let backend = expected_backend();
    let r = run_with(&sb, &[], "x = bytearray(40 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n");
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let u = &r.usage;
    assert!(u.wall_ms > 0.0 && u.user_cpu_ms.is_some() && u.system_cpu_ms.is_some());
    assert!(u.max_rss_bytes.unwrap() >= 40 << 20);
    if is_cgroup(&backend) {
        if backend == "cgroup_v2" && !kernel_has_memory_peak() {
            assert_eq!(u.peak_memory_bytes, None, "no memory.peak before 5.19");
        } else {
            let peak = u.peak_memory_bytes.unwrap();
            assert!(peak >= 40 << 20, "peak {peak}");
        }
        assert_eq!(u.oom_kills, Some(0));
        for name in ["memory", "pids", "cpus"] {
            assert_eq!(r.limits[name].enforced_by, backend, "{name}");
        }
    } else {
        assert_eq!(u.peak_memory_bytes, None);
        assert_eq!(u.oom_kills, None);
        assert_eq!(u.pids_peak, None);
    }
}

#[test]
fn the_script_sees_its_own_cgroup_as_the_root() {
    let sb = Sandbox::new();
    let r = run_with(&sb, &[], "print(open('/proc/self/cgroup').read())\n");
    assert_eq!(r.status, Status::Ok, "{r:?}");
    // Rooted at the run's leaf: no host cgroup path, not even our own.
    for line in r.stdout.text.lines().filter(|l| !l.is_empty()) {
        assert!(line.ends_with(":/"), "{line}");
    }
}

#[test]
fn a_cgroup_left_by_a_killed_jail_is_swept_by_the_next_run() {
    let backend = expected_backend();
    if !is_cgroup(&backend) {
        // Nothing to leave behind: rlimits have no cgroup (asserted by the
        // other tests' leftover checks).
        covered_elsewhere(&format!(
            "the {backend} backend makes no cgroup to leave behind; root's run, with a cgroup, checks the sweep"
        ));
        return;
    }
    let sb = Sandbox::new();
    let mut cmd = sb.command("import time\nprint('up', flush=True)\ntime.sleep(60)\n");
    let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    while cgroups_left_by(pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!cgroups_left_by(pid).is_empty(), "the jail made no cgroup");
    // Give the script time to start, then kill the jail itself: its tree
    // dies with it (PR_SET_PDEATHSIG), its cgroup stays.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let left = cgroups_left_by(pid);
    assert!(!left.is_empty(), "expected a leftover cgroup to sweep");
    let r = run_with(&sb, &[], "print('next')\n");
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut still = cgroups_left_by(pid);
    while !still.is_empty() && Instant::now() < deadline {
        // The dying tree may still be in the cgroup the first time round.
        std::thread::sleep(Duration::from_millis(50));
        let _ = run_with(&sb, &[], "pass\n");
        still = cgroups_left_by(pid);
    }
    assert_eq!(still, Vec::<std::path::PathBuf>::new(), "the leftover cgroup was not swept");
}

#[test]
fn a_root_made_v1_run_cgroup_holds_the_script_itself_and_only_root_may_write_its_limits() {
    if only_as_root("a root-made run cgroup") {
        return;
    }
    let backend = expected_backend();
    if backend != "cgroup_v1" {
        covered_elsewhere(&format!("the run cgroup here is {backend}; the hybrid host's root run checks v1's"));
        return;
    }
    let sb = Sandbox::new();
    let child = sb
        .command("import time\ntime.sleep(60)\n")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait until the script (a python3 process) is in the run cgroup.
    let script_in = |dir: &Path| {
        std::fs::read_to_string(dir.join("tasks"))
            .unwrap_or_default()
            .split_whitespace()
            .any(|t| std::fs::read_to_string(format!("/proc/{t}/comm")).is_ok_and(|c| c.trim() == "python3"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut dirs = cgroups_left_by(pid);
    while !(dirs.len() == 5 && dirs.iter().all(|d| script_in(d))) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        dirs = cgroups_left_by(pid);
    }
    let seen: Vec<(std::path::PathBuf, bool, bool)> =
        dirs.iter().map(|d| (d.clone(), script_in(d), d.join("tree").exists())).collect();
    // SIGTERM: the run is cancelled, its tree killed and its cgroup removed.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let r = parse(&out);
    assert_eq!(r.status, Status::Cancelled, "{r:?}");
    assert_ne!(r.isolation.host_uid, 0, "a root-started sandbox runs as a leased uid");
    assert_eq!(seen.len(), 5, "one run cgroup per v1 hierarchy: {seen:?}");
    for (dir, script, leaf) in &seen {
        // No leaf: the script is in the cgroup that carries its limits.
        assert!(*script && !*leaf, "{}: script in it {script}, leaf {leaf}", dir.display());
    }
    // Which is safe because the limit files are root's and no one else may
    // write them; the sandbox's uid is never 0.
    for (dir, _, _) in &seen {
        for f in ["memory.limit_in_bytes", "pids.max", "cpu.cfs_quota_us", "tasks"] {
            let Ok(m) = std::fs::metadata(dir.join(f)) else { continue };
            use std::os::unix::fs::MetadataExt;
            assert_eq!((m.uid(), m.mode() & 0o022), (0, 0), "{}/{f}", dir.display());
        }
    }
    assert_eq!(cgroups_left_by(pid), Vec::<std::path::PathBuf>::new(), "the run cgroup was left behind");
}

#[test]
fn a_v1_run_cgroup_that_cannot_be_made_fails_the_run_before_the_script_starts() {
    if only_as_root("a cgroup parent in the v1 hierarchies") {
        return;
    }
    let layout = jail::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let hierarchies: Vec<&jail::cgroup::Hierarchy> = jail::cgroup::V1_CONTROLLERS
        .iter()
        .filter_map(|c| layout.v1.iter().find(|h| h.controllers.iter().any(|hc| hc == c)))
        .collect();
    if hierarchies.len() != jail::cgroup::V1_CONTROLLERS.len() || hierarchies.iter().any(|h| h.root != Path::new("/")) {
        covered_elsewhere("no full set of v1 hierarchies here; the hybrid host's root run checks v1's failure");
        return;
    }
    // A parent in every hierarchy whose CPU quota (0.1 core) is below the
    // run's (1 core): v1 refuses a child quota above its parent's (EINVAL),
    // so the run cgroup, made after the clone, cannot get its limits.
    let name = format!("jail-test-parent-{}-{}", std::process::id(), unique());
    let parents: Vec<std::path::PathBuf> = hierarchies.iter().map(|h| h.mount.join(&name)).collect();
    for p in &parents {
        let _ = std::fs::create_dir(p);
    }
    let cpu = hierarchies.iter().position(|h| h.controllers.iter().any(|c| c == "cpu")).unwrap();
    std::fs::write(parents[cpu].join("cpu.cfs_period_us"), "100000").unwrap();
    std::fs::write(parents[cpu].join("cpu.cfs_quota_us"), "10000").unwrap();
    let sb = Sandbox::new();
    let r = run_with(
        &sb,
        &["--cgroup-parent", &format!("/{name}"), "--cpus", "1"],
        "open('/workspace/output/ran', 'w').write('x')\n",
    );
    let left: Vec<String> = parents
        .iter()
        .flat_map(|p| std::fs::read_dir(p).unwrap().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().display().to_string())
        .collect();
    for p in &parents {
        let _ = std::fs::remove_dir(p);
    }
    assert_eq!(r.status, Status::SetupFailed, "{r:?}");
    let e = r.setup_error.unwrap();
    assert_eq!(e.stage, "cgroup", "{e:?}");
    assert!(e.message.contains("make the run cgroup"), "{e:?}");
    assert!(e.causes.iter().any(|c| c.contains("cpu.cfs_quota_us")), "{e:?}");
    assert!(!sb.output.join("ran").exists(), "the script ran");
    assert_eq!(left, Vec::<String>::new(), "the run cgroup was left in the parent");
}

#[test]
fn filling_the_output_dir_hits_enospc_inside_and_the_host_disk_is_untouched() {
    let sb = Sandbox::new();
    let p = policy(&sb, r#"{"output_size": "16M"}"#, r#"{"memory": "256M"}"#);
    let r = run_with(
        &sb,
        &["--policy", &p],
        r#"
import errno, json, os
written = 0
try:
    with open("/workspace/output/fill", "wb") as f:
        while written < (64 << 20):
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
    result = {"errno": None}
except OSError as e:
    result = {"errno": errno.errorcode[e.errno]}
result["written"] = written
st = os.statvfs("/workspace/output")
result["fs_bytes"] = st.f_blocks * st.f_frsize
os.unlink("/workspace/output/fill")
open("/workspace/output/done.txt", "w").write("ok")
print(json.dumps(result))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["errno"], "ENOSPC", "{v}");
    let written = v["written"].as_u64().unwrap();
    assert!((14 << 20..=16 << 20).contains(&written), "wrote {written}");
    assert_eq!(r.limits["output_size"].enforced_by, "tmpfs");
    // What the script left is on the host; what it deleted never got there.
    assert_eq!(std::fs::read_to_string(sb.output.join("done.txt")).unwrap(), "ok");
    assert!(!sb.output.join("fill").exists());
    // Filled on a filesystem of exactly output_size, not the host's disk.
    assert_eq!(v["fs_bytes"], 16u64 << 20, "{v}");
}

#[test]
fn the_output_dir_caps_its_number_of_files_too() {
    let sb = Sandbox::new();
    let r = run_with(
        &sb,
        &[],
        r#"
import errno, json, os
n = 0
try:
    while n < 20000:
        open(f"/workspace/output/f{n}", "w").close()
        n += 1
    err = None
except OSError as e:
    err = errno.errorcode[e.errno]
for i in range(n):
    os.unlink(f"/workspace/output/f{i}")
print(json.dumps({"errno": err, "created": n}))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["errno"], "ENOSPC", "{v}");
    assert!(v["created"].as_u64().unwrap() < 16_384, "{v}");
}

#[test]
fn the_capped_output_dir_shows_the_host_folder_and_mirrors_changes_back() {
    let sb = Sandbox::new();
    let chown = |p: &Path| give_to_sandbox(p);
    for (name, content) in [("keep.txt", "keep"), ("edit.txt", "old"), ("gone.txt", "gone")] {
        let p = sb.output.join(name);
        std::fs::write(&p, content).unwrap();
        chown(&p);
    }
    let keep_mtime = std::fs::symlink_metadata(sb.output.join("keep.txt")).unwrap().modified().unwrap();
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "host-secret").unwrap();
    let r = run_with(
        &sb,
        &[],
        &format!(
            r#"
import json, os
o = "/workspace/output"
seen = sorted(os.listdir(o))
text = open(o + "/keep.txt").read()
open(o + "/edit.txt", "w").write("new")
os.unlink(o + "/gone.txt")
os.makedirs(o + "/charts/2024")
open(o + "/charts/2024/a.png", "wb").write(b"\x89PNG")
os.symlink({secret:?}, o + "/charts/leak")
print(json.dumps({{"seen": seen, "keep": text}}))
"#,
            secret = secret.path()
        ),
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["seen"], serde_json::json!(["edit.txt", "gone.txt", "keep.txt"]));
    assert_eq!(v["keep"], "keep");
    let o = &sb.output;
    assert_eq!(std::fs::read_to_string(o.join("edit.txt")).unwrap(), "new");
    assert!(!o.join("gone.txt").exists());
    assert_eq!(std::fs::read(o.join("charts/2024/a.png")).unwrap(), b"\x89PNG");
    // A symlink never leaves the jail (refused by the artifact check).
    assert!(std::fs::symlink_metadata(o.join("charts/leak")).is_err());
    assert!(r.rejected_artifacts.iter().any(|x| x.path == "charts/leak"), "{:?}", r.rejected_artifacts);
    // Untouched files are not rewritten.
    assert_eq!(std::fs::symlink_metadata(o.join("keep.txt")).unwrap().modified().unwrap(), keep_mtime);
    let s = r.output_sync.expect("output_sync");
    assert_eq!((s.copied_in, s.unchanged, s.deleted), (3, 1, 1), "{s:?}");
    assert!(s.errors.is_empty(), "{s:?}");
}

#[test]
fn files_written_before_a_timeout_still_reach_the_host() {
    let sb = Sandbox::new();
    let r = run_with(
        &sb,
        // Long enough for Python to start and write even in a TCG guest,
        // where a process starts 40-80 times slower than here.
        &["--timeout", "3"],
        "open('/workspace/output/partial.csv', 'w').write('a,b\\n')\nwhile True:\n    pass\n",
    );
    assert_eq!(r.status, Status::TimeoutWall);
    assert_eq!(std::fs::read_to_string(sb.output.join("partial.csv")).unwrap(), "a,b\n");
}

/// Root delegates a cgroup subtree to an ordinary user the way systemd does
/// (a folder per hierarchy, chowned to the user) and the user's runs get a
/// real cgroup instead of rlimits.
#[test]
fn a_delegated_cgroup_gives_an_ordinary_user_cgroup_limits() {
    // The ordinary user's side runs from here, as that user.
    if only_as_root("only root can delegate a cgroup") {
        return;
    }
    let Some((uid, gid)) = test_user() else { return };
    let layout = jail::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let me = jail::cgroup::parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap());
    let Some(memory) = layout.v1.iter().find(|h| h.controllers.iter().any(|c| c == "memory")) else {
        covered_elsewhere("no cgroup v1 memory hierarchy: v2 delegation is tested in the VM matrix's pure-v2 guests (issue 7)");
        return;
    };
    let own = me.v1["memory"].clone();
    // One cgroup path for every hierarchy: beneath our own memory cgroup,
    // and beneath our own (root) cgroup in the others.
    let path = own.join(format!("jail-delegated-{}", std::process::id()));
    let mut made = Vec::new();
    let mut created: Vec<std::path::PathBuf> = Vec::new();
    for h in &layout.v1 {
        if !h.controllers.iter().any(|c| jail::cgroup::V1_CONTROLLERS.contains(&c.as_str())) {
            continue;
        }
        let Some(mine) = h.controllers.iter().find_map(|c| me.v1.get(c)) else { continue };
        if !path.starts_with(mine) {
            continue;
        }
        let dir = h.mount.join(path.strip_prefix(&h.root).unwrap());
        // Every folder we create is ours to remove, ancestors included.
        let mut missing: Vec<std::path::PathBuf> = dir.ancestors().take_while(|a| !a.exists()).map(|a| a.to_path_buf()).collect();
        missing.reverse();
        for m in &missing {
            std::fs::create_dir(m).unwrap();
        }
        created.extend(missing);
        // Delegation: the folder and its process files belong to the user.
        for p in [dir.clone(), dir.join("cgroup.procs"), dir.join("tasks")] {
            std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        }
        made.push(dir);
    }
    assert!(made.iter().any(|d| d.starts_with(&memory.mount)));
    let sb = Sandbox::new();
    std::os::unix::fs::chown(&sb.output, Some(uid), Some(gid)).unwrap();
    let cmd = sb.command("chunks = []\nwhile True:\n    chunks.append(b'x' * (1 << 20))\n");
    let mut args: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_os_string()).collect();
    let script = args.pop().unwrap();
    let mut full = Command::new(jail_bin());
    full.args(&args).args(["--memory", "32M", "--pids", "8"]).arg(script);
    full.env("JAIL_CGROUP_PARENT", &path).current_dir("/");
    std::os::unix::process::CommandExt::uid(&mut full, uid);
    std::os::unix::process::CommandExt::gid(&mut full, gid);
    let (r, out, pid) = run_tracked(&mut full);
    // Nothing left inside the delegated folders, then remove them.
    let leftovers: Vec<_> = made
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(d)
                .unwrap()
                .flatten()
                .filter(|e| e.file_type().unwrap().is_dir())
                .map(|e| e.path())
        })
        .collect();
    for d in created.iter().rev() {
        std::fs::remove_dir(d).unwrap();
    }
    assert_eq!(leftovers, Vec::<std::path::PathBuf>::new(), "jail {pid} left a cgroup");
    assert_eq!(r.isolation.host_uid, uid, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(r.limits["memory"].enforced_by, "cgroup_v1", "{:?}", r.limits);
    assert_eq!(r.limits["pids"].enforced_by, "cgroup_v1");
    assert_eq!(r.status, Status::OomKilled, "{r:?}");
}

/// Each way to hold memory that RLIMIT_AS does not see, tried for 256 MiB
/// under a 64 MiB limit. Returns the script's report and the result.
fn hold_memory(sb: &Sandbox, flags: &[&str], route: &str) -> (serde_json::Value, RunResult) {
    let source = format!(
        r#"
import ctypes, errno, json, os, socket
route, target = {route:?}, 256 << 20
held, err, keep = 0, None, []
try:
    if route == "memfd":
        while held < target:
            fd = os.memfd_create("hold")
            os.write(fd, b"x" * (16 << 20))
            keep.append(fd)
            held += 16 << 20
    elif route == "sysv_shm":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        while held < target:
            # Detached and never removed: the segment outlives every mapping.
            i = libc.shmget(0, 16 << 20, 0o1600)
            if i < 0:
                raise OSError(ctypes.get_errno(), "shmget")
            a = libc.shmat(i, None, 0)
            ctypes.memset(a, 1, 16 << 20)
            libc.shmdt(ctypes.c_void_p(a))
            held += 16 << 20
    elif route == "unix_sockets":
        while held < target:
            a, b = socket.socketpair()
            a.setblocking(False)
            keep += [a, b]
            while True:
                try:
                    held += a.send(b"x" * 65536)
                except BlockingIOError:
                    break
    elif route == "tmpfs":
        for d in ["/tmp", "/dev/shm", "/workspace/output"]:
            try:
                with open(d + "/hold", "wb") as f:
                    while held < target:
                        f.write(b"x" * (1 << 20))
                        f.flush()
                        held += 1 << 20
            except OSError as e:
                err = errno.errorcode[e.errno]
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({{"held": held, "errno": err}}), flush=True)
"#
    );
    let mut all = vec!["--memory", "64M"];
    all.extend_from_slice(flags);
    let r = run_with(sb, &all, &source);
    let v = serde_json::from_str(r.stdout.text.trim()).unwrap_or(serde_json::Value::Null);
    (v, r)
}

/// As an ordinary user without a cgroup (and as root with none to be had),
/// RLIMIT_AS is all there is: each route around it is refused, bounded
/// within the memory limit, or named in `isolation.degraded`.
#[test]
fn without_a_cgroup_each_memory_route_is_refused_bounded_or_named() {
    let sb = Sandbox::new();
    // No cgroup can be made beneath a parent that does not exist.
    let no_cgroup = ["--cgroup-parent", "/no-such-cgroup-for-jail"];
    for route in ["memfd", "sysv_shm"] {
        let (v, r) = hold_memory(&sb, &no_cgroup, route);
        assert_eq!(r.status, Status::Ok, "{route}: {r:?}");
        assert_eq!(r.limits["memory"].enforced_by, "rlimit");
        assert_eq!((v["held"].as_u64(), v["errno"].as_str()), (Some(0), Some("ENOSYS")), "{route}: {v}");
        let call = if route == "memfd" { "memfd_create" } else { "shmget" };
        let d = r.denials.iter().find(|d| d.what == call).unwrap_or_else(|| panic!("{route}: {:?}", r.denials));
        assert!(d.detail.as_deref().unwrap_or("").contains("no cgroup counts"), "{d:?}");
    }
    let (v, r) = hold_memory(&sb, &no_cgroup, "tmpfs");
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(v["errno"], "ENOSPC", "{v}");
    let held = v["held"].as_u64().unwrap();
    assert!(held <= 64 << 20, "/tmp, /dev/shm and the output dir held {held} bytes under a 64 MiB limit");
    let sizes: u64 = ["tmp_size", "shm_size", "output_size"].iter().map(|k| r.limits[*k].value.as_u64().unwrap()).sum();
    assert!(sizes <= 64 << 20, "{:?}", r.limits);
    // What nothing here can bound is said, in words.
    let (_, r) = hold_memory(&sb, &no_cgroup, "unix_sockets");
    let words = r
        .isolation
        .degraded
        .iter()
        .find(|d| d.starts_with("limit memory:"))
        .unwrap_or_else(|| panic!("{:?}", r.isolation.degraded));
    for part in [
        "no total for the run",
        "address space",
        "unix sockets",
        "memfd_create",
        "System V",
    ] {
        assert!(words.contains(part), "{part}: {words}");
    }
}

/// With a memory cgroup the same routes are counted in the run's total:
/// the tree is killed at the limit.
#[test]
fn under_a_memory_cgroup_memfds_and_sysv_shm_are_counted_and_killed() {
    let backend = expected_backend();
    if !is_cgroup(&backend) {
        eprintln!(
            "not applicable to the {backend} backend: covered by without_a_cgroup_each_memory_route_is_refused_bounded_or_named"
        );
        return;
    }
    let sb = Sandbox::new();
    for route in ["memfd", "sysv_shm"] {
        let (_, r) = hold_memory(&sb, &[], route);
        assert_eq!(r.status, Status::OomKilled, "{route}: {r:?}");
        assert_eq!(r.limits["memory"].enforced_by, backend);
        assert!(!r.isolation.degraded.iter().any(|d| d.starts_with("limit memory")), "{:?}", r.isolation.degraded);
    }
}

#[test]
fn a_required_memory_limit_without_a_cgroup_fails_closed_naming_the_fix() {
    let sb = Sandbox::new();
    let p = policy(&sb, "{}", r#"{"memory": "64M", "enforcement": {"memory": "required"}}"#);
    let marker = sb.output.join("ran");
    let r = run_with(
        &sb,
        &["--policy", &p, "--cgroup-parent", "/no-such-cgroup-for-jail"],
        "open('/workspace/output/ran', 'w').write('x')\n",
    );
    assert_eq!(r.status, Status::SetupFailed, "{r:?}");
    let e = r.setup_error.unwrap();
    assert_eq!(e.stage, "limits");
    for part in [
        "memory: only RLIMIT_AS",
        "not the run's total",
        "--cgroup-parent",
        "best_effort",
    ] {
        assert!(e.message.contains(part), "{part}: {}", e.message);
    }
    assert!(!marker.exists(), "the script ran");
}
