//! The run's limits seen from inside (issue 21 item 6): data code sizes its
//! work from `/proc/meminfo`, `os.cpu_count()` and free space, so each test
//! reads them the way that code does, checks they follow the run's limits,
//! and tries to undo what shows them (write, umount, remount) from inside.
//! Each fails without inside.rs: the host's memory and CPUs show, `/tmp`
//! is 64 MiB, and an impossible allocation ends in a kill, not a traceback.

use jail_tests::*;
use serde_json::Value;

fn sandbox(flags: &[&str]) -> Sandbox {
    let mut sb = Sandbox::new();
    sb.extra_args = flags.iter().map(|s| s.to_string()).collect();
    sb
}

fn host_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A libc call from inside by ctypes, returning errno (0 on success).
const LIBC: &str = r#"
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    f = getattr(libc, name)
    r = f(*args)
    return 0 if r == 0 else ctypes.get_errno()
def meminfo():
    return {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/meminfo")}
"#;

#[test]
fn proc_meminfo_shows_the_memory_limit_and_cannot_be_undone_from_inside() {
    let sb = sandbox(&["--memory", "1G"]);
    let v = sb.probe(&format!(
        "{LIBC}
before = meminfo()
try:
    open('/proc/meminfo', 'w').write('MemTotal: 99999999 kB\\n')
    wrote = 'written'
except OSError as e:
    wrote = e.errno
umount = call('umount2', b'/proc/meminfo', 2)
remount = call('mount', None, b'/proc/meminfo', None, ctypes.c_ulong(32 | 4096), None)
print(json.dumps({{'before': before, 'after': meminfo(), 'wrote': wrote, 'umount': umount, 'remount': remount,
                  'numpy_style': int([l for l in open('/proc/meminfo') if l.startswith('MemAvailable')][0].split()[1]) * 1024}}))
"
    ));
    let kb = |m: &Value, k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {m}"));
    for which in ["before", "after"] {
        let m = &v[which];
        assert_eq!(kb(m, "MemTotal"), 1 << 20, "{which}: MemTotal is not the 1G limit: {m}");
        assert_eq!(kb(m, "MemAvailable"), 1 << 20, "{which}: {m}");
        assert_eq!(kb(m, "MemFree"), 1 << 20, "{which}: {m}");
        assert_eq!(kb(m, "SwapTotal"), 0, "{which}: the run has no swap: {m}");
    }
    // numpy's test guard reads MemAvailable in kB, times 1024.
    assert_eq!(v["numpy_style"], serde_json::json!(1u64 << 30));
    assert_ne!(v["wrote"], serde_json::json!("written"), "the script rewrote its meminfo: {v}");
    // No CAP_SYS_ADMIN (and seccomp): the overmount stays.
    assert_ne!(v["umount"], serde_json::json!(0), "umount2(/proc/meminfo) succeeded: {v}");
    assert_ne!(v["remount"], serde_json::json!(0), "the read-only bind was remounted: {v}");
}

#[test]
fn without_a_memory_limit_meminfo_is_the_kernels() {
    let sb = sandbox(&["--memory", "unlimited"]);
    let v = sb.probe(&format!("{LIBC}\nprint(json.dumps(meminfo()))"));
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let host = text.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|n| n.parse::<u64>().ok());
    assert_eq!(v["MemTotal"].as_u64(), host, "{v}");
}

#[test]
fn the_cpu_count_follows_cpus_everywhere_python_reads_it() {
    if skip_unless(host_cpus() >= 2, "the host has one CPU: a 1-CPU limit would leave nothing out") {
        return;
    }
    let sb = sandbox(&["--cpus", "0.5"]);
    let v = sb.probe(&format!(
        "{LIBC}
try:
    open('/sys/devices/system/cpu/online', 'w').write('0-63')
    wrote = 'written'
except OSError as e:
    wrote = e.errno
print(json.dumps({{'cpu_count': os.cpu_count(), 'affinity': len(os.sched_getaffinity(0)),
                  'onln': os.sysconf('SC_NPROCESSORS_ONLN'), 'conf': os.sysconf('SC_NPROCESSORS_CONF'),
                  'online': open('/sys/devices/system/cpu/online').read(), 'wrote': wrote,
                  'umount': call('umount2', b'/sys', 2), 'omp': os.environ.get('OMP_NUM_THREADS')}}))
"
    ));
    for k in ["cpu_count", "affinity", "onln", "conf"] {
        assert_eq!(v[k], serde_json::json!(1), "{k} under cpus 0.5 (ceil 1): {v}");
    }
    assert_ne!(v["wrote"], serde_json::json!("written"), "{v}");
    assert_ne!(v["umount"], serde_json::json!(0), "{v}");
    assert_eq!(v["omp"], serde_json::json!("1"));
    // Two CPUs asked for, two seen (never more than the host has).
    let sb = sandbox(&["--cpus", "2"]);
    let v = sb.probe("import os, json; print(json.dumps([os.cpu_count(), len(os.sched_getaffinity(0))]))");
    assert_eq!(v, serde_json::json!([2.min(host_cpus()), 2.min(host_cpus())]));
}

#[test]
fn a_100_mib_tmp_file_fits_under_a_1g_limit() {
    let sb = sandbox(&["--memory", "1G"]);
    let (r, out) = sb.run(
        r#"
import os
with open("/tmp/big", "wb") as f:
    for _ in range(100):
        f.write(b"x" * (1 << 20))
st = os.statvfs("/tmp")
print(os.path.getsize("/tmp/big") >> 20, st.f_blocks * st.f_frsize >> 20)
"#,
    );
    assert_eq!(r.status, Status::Ok, "{}\n{}", r.stderr.text, String::from_utf8_lossy(&out.stderr));
    assert_eq!(r.stdout.text.split_whitespace().next(), Some("100"), "{}", r.stdout.text);
    assert_eq!(r.limits["tmp_size"].value, serde_json::json!(512u64 << 20), "{:?}", r.limits["tmp_size"]);
    assert!(r.limits["tmp_size"].detail.as_deref().unwrap_or("").contains("auto"), "{:?}", r.limits["tmp_size"]);
}

#[test]
fn an_allocation_that_cannot_fit_is_a_memory_error_with_a_traceback() {
    let sb = sandbox(&["--memory", "1G"]);
    // Touched at once: without an address-space ceiling the cgroup kills it.
    let (r, out) = sb.run("data = b'x' * (3 << 30)\nprint(len(data))\n");
    assert_eq!(r.status, Status::NonzeroExit, "{:?} {}\n{}", r.status, r.stderr.text, String::from_utf8_lossy(&out.stderr));
    let e = r.error.as_ref().unwrap_or_else(|| panic!("no error parsed: {}", r.stderr.text));
    assert_eq!(e.kind, "MemoryError", "{e:?}");
    assert!(e.traceback_tail.contains("b'x' * (3 << 30)"), "{e:?}");
}

#[test]
fn an_oversize_numpy_allocation_raises_memory_error() {
    let root = data_rootfs();
    if skip_unless(root.join("usr/share/jail/manifest.json").is_file(), "no data rootfs (make rootfs-data)") {
        return;
    }
    let mut sb = sandbox(&["--memory", "1G", "--timeout", "120"]);
    sb.rootfs = root;
    let (r, out) = sb.run("import numpy as np\na = np.ones(3 << 30 >> 3)\nprint(a.sum())\n");
    assert_eq!(r.status, Status::NonzeroExit, "{:?} {}\n{}", r.status, r.stderr.text, String::from_utf8_lossy(&out.stderr));
    let e = r.error.as_ref().unwrap_or_else(|| panic!("no error parsed: {}", r.stderr.text));
    assert!(e.kind.ends_with("MemoryError"), "{e:?}");
    assert!(e.message.contains("Unable to allocate 3.00 GiB"), "{e:?}");
    assert!(e.traceback_tail.contains("np.ones"), "{e:?}");
    // Allocations that fit still work, threads and all.
    let (r, out) = sb.run(
        "import numpy as np, pandas as pd, threading\n\
         a = np.ones(256 << 20 >> 3); df = pd.DataFrame({'a': a[:1000]})\n\
         ts = [threading.Thread(target=lambda: np.ones(1 << 20).sum()) for _ in range(32)]\n\
         [t.start() for t in ts]; [t.join() for t in ts]\nprint(int(a.sum()))\n",
    );
    assert_eq!(r.status, Status::Ok, "{}\n{}", r.stderr.text, String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_oom_kill_says_what_was_killed_and_at_what_usage() {
    if !expected_backend().starts_with("cgroup_") {
        covered_elsewhere("no memory cgroup here (the rlimit backend has no OOM killer of its own); the root run covers it");
        return;
    }
    let sb = sandbox(&["--memory", "128M"]);
    // Below RLIMIT_AS (640M) in steps, so the cgroup's limit is what stops it.
    let (r, _) = sb.run("chunks = []\nwhile True:\n    chunks.append(b'x' * (8 << 20))\n");
    assert_eq!(r.status, Status::OomKilled, "{:?} {}", r.status, r.stderr.text);
    let detail = r.limits["memory"].detail.clone().unwrap_or_default();
    assert!(detail.starts_with("oom_killed: the kernel's OOM killer took the script (killed by SIGKILL)"), "{detail}");
    if kernel_has_memory_peak() || expected_backend() == "cgroup_v1" {
        assert!(detail.contains("at a peak of 12"), "{detail}");
    }
}
