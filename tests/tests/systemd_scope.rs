//! Automatic delegation (issue 21 item 3): an ordinary user with no writable
//! cgroup but a systemd user manager gets a delegated scope from systemd
//! over the user bus, and the run's limits are enforced by a cgroup beneath
//! it; the scope is gone once the jail exits; `--no-systemd-delegation`
//! gives the rlimit fallback, saying why.
//!
//! Where a user manager runs (the VM guests, with lingering on) the guest
//! sets JAIL_EXPECT_SYSTEMD_SCOPE=1 and the scope is required. Elsewhere
//! (this CI host: no user bus for the test user) the same run must fall back
//! and name the missing bus in what it degraded: never a silent downgrade.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use jail_tests::*;

const HOG: &str = "chunks = []\nwhile True:\n    chunks.append(b'x' * (1 << 20))\n    print(len(chunks), flush=True)\n";

fn expect_scope() -> bool {
    std::env::var("JAIL_EXPECT_SYSTEMD_SCOPE").is_ok_and(|v| v == "1")
}

fn has_explicit_parent() -> bool {
    std::env::var_os("JAIL_CGROUP_PARENT").is_some_and(|v| !v.is_empty())
}

fn run(sb: &Sandbox, flags: &[&str], source: &str) -> (RunResult, std::process::Output, u32) {
    let cmd = sb.command(source);
    let mut args: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_os_string()).collect();
    let script = args.pop().unwrap();
    let mut full = Command::new(jail_bin());
    // JAIL_CGROUP_PARENT is an explicit parent: delegation is never asked for then.
    full.args(&args).args(flags).arg(script).env_remove("JAIL_CGROUP_PARENT");
    run_tracked(&mut full)
}

/// The scope's name and cgroup path as the memory limit's detail gives them.
fn scope_in(detail: &str) -> Option<(String, PathBuf)> {
    let at = detail.find("systemd scope ")? + "systemd scope ".len();
    let rest = &detail[at..];
    let (unit, rest) = rest.split_once(' ')?;
    let path = rest.strip_prefix('(')?.split_once(')')?.0;
    Some((unit.to_string(), PathBuf::from(path)))
}

fn cgroup_dir(path: &Path) -> PathBuf {
    let layout = jail::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let (mount, root) = layout.unified.expect("a cgroup2 mount");
    mount.join(path.strip_prefix(&root).unwrap().strip_prefix("/").unwrap_or(path))
}

#[test]
fn an_ordinary_user_without_a_writable_cgroup_gets_a_systemd_scope_whose_cgroup_kills_a_memory_hog() {
    if only_as_ordinary_user("root has a cgroup of its own and never asks systemd") {
        return;
    }
    if has_explicit_parent() && !expect_scope() {
        covered_elsewhere("JAIL_CGROUP_PARENT gives this user a delegated cgroup; the VM guests run this test without one");
        return;
    }
    let sb = Sandbox::new();
    let (r, out, pid) = run(&sb, &["--memory", "64M", "--pids", "16"], HOG);
    let mem = &r.limits["memory"];
    let detail = mem.detail.clone().unwrap_or_default();
    if expect_scope() {
        assert_eq!(mem.enforced_by, "cgroup_v2", "{:?}\n{}", r.limits, String::from_utf8_lossy(&out.stderr));
        let (unit, path) = scope_in(&detail).unwrap_or_else(|| panic!("the memory limit names no systemd scope: {detail}"));
        assert!(unit.starts_with(&format!("jail-run-{pid}-")) && unit.ends_with(".scope"), "{unit}");
        assert_eq!(r.limits["pids"].enforced_by, "cgroup_v2", "{:?}", r.limits);
        assert!(r.limits["pids"].detail.as_deref().unwrap_or("").contains(&unit), "{:?}", r.limits);
        // The kernel's OOM killer at the cgroup's limit, not an rlimit's MemoryError.
        assert_eq!(r.status, Status::OomKilled, "{r:?}");
        assert!(r.usage.oom_kills.unwrap_or(0) >= 1, "{:?}", r.usage);
        let reached: u64 = r.stdout.text.lines().last().and_then(|l| l.parse().ok()).unwrap_or(0);
        assert!(reached < 64, "the script held {reached} MiB under a 64 MiB limit");
        // The scope ends with the jail: systemd collects it and its cgroups.
        let dir = cgroup_dir(&path);
        let deadline = Instant::now() + Duration::from_secs(10);
        while dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!dir.exists(), "the scope's cgroup {} outlived the jail", dir.display());
        let parent = dir.parent().unwrap();
        // systemd may have collected the emptied slice too.
        let left: Vec<_> = std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("jail-run-{pid}-")))
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "left in {}: {left:?}", parent.display());
    } else {
        // No user manager here: the fallback, with the reason it fell back.
        assert_eq!(mem.enforced_by, "rlimit", "{:?}", r.limits);
        let why = r.isolation.degraded.iter().find(|d| d.starts_with("limit memory: ")).cloned().unwrap_or_default();
        assert!(
            why.contains("systemd delegation: "),
            "the fallback does not say why systemd gave no scope: {:?}",
            r.isolation.degraded
        );
        assert_eq!(r.status, Status::NonzeroExit, "{r:?}");
        assert_eq!(r.error.as_ref().map(|e| e.kind.as_str()), Some("MemoryError"), "{}", r.stderr.text);
    }
}

#[test]
fn turning_delegation_off_gives_the_rlimit_fallback_and_says_so() {
    if only_as_ordinary_user("root has a cgroup of its own and never asks systemd") {
        return;
    }
    let sb = Sandbox::new();
    let (r, out, _) = run(&sb, &["--memory", "64M", "--no-systemd-delegation"], HOG);
    assert_eq!(r.limits["memory"].enforced_by, "rlimit", "{:?}\n{}", r.limits, String::from_utf8_lossy(&out.stderr));
    let why = r.isolation.degraded.iter().find(|d| d.starts_with("limit memory: ")).cloned().unwrap_or_default();
    assert!(why.contains("systemd delegation is off"), "{:?}", r.isolation.degraded);
    assert_eq!(r.error.as_ref().map(|e| e.kind.as_str()), Some("MemoryError"), "{}", r.stderr.text);
    // The same through the policy: limits.systemd_delegation "off".
    let policy = sb.dir.path().join("off.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("policies/default.json")).unwrap()).unwrap();
    doc["limits"]["systemd_delegation"] = serde_json::json!("off");
    std::fs::write(&policy, doc.to_string()).unwrap();
    let p = policy.to_str().unwrap();
    let (r, out, _) = run(&sb, &["--policy", p, "--memory", "64M"], HOG);
    assert_eq!(r.limits["memory"].enforced_by, "rlimit", "{:?}\n{}", r.limits, String::from_utf8_lossy(&out.stderr));
    let why = r.isolation.degraded.iter().find(|d| d.starts_with("limit memory: ")).cloned().unwrap_or_default();
    assert!(why.contains("systemd delegation is off"), "{:?}", r.isolation.degraded);
}
