//! An installed `jail` works anywhere (issue 19 item 1): installed into a
//! temp prefix with scripts/install.sh (what `make install` runs), the
//! prefix moved to another folder, and run from `/` with an empty
//! environment (no JAIL_ROOTFS, no JAIL_REPO, no build tree): it builds its
//! own rootfs from the recipes compiled into it, finds it by name, uses the
//! compiled-in default policy, and takes scripts as `-c CODE` and on stdin.
//! Plus the bad inputs of those paths. Runs as root and as an ordinary user
//! (root's rootfs goes to --dest in the temp home: the default for root,
//! /var/lib/jail/rootfs, is the host's and no test writes it).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use jail_tests::{is_root, jail_bin, RunResult, Status};

/// The moved install and the home its rootfs was built into.
struct Installed {
    _keep: tempfile::TempDir,
    jail: PathBuf,
    home: PathBuf,
    rootfs: PathBuf,
}

/// A folder every uid may traverse (the sandbox of a root run reads the
/// rootfs as an unprivileged host uid).
fn open_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn installed() -> &'static Installed {
    static ONCE: OnceLock<Installed> = OnceLock::new();
    ONCE.get_or_init(|| {
        let keep = tempfile::tempdir().unwrap();
        let top = keep.path().to_path_buf();
        open_dir(&top);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install.sh");
        let first = top.join("prefix");
        let out = Command::new("bash").arg(&script).arg(jail_bin()).arg(&first).output().unwrap();
        assert!(out.status.success(), "install.sh: {}", String::from_utf8_lossy(&out.stderr));
        // Moved away from where it was installed, and nothing beside it.
        let moved = top.join("moved");
        std::fs::rename(&first, &moved).unwrap();
        let jail = moved.join("bin/jail");
        assert!(jail.is_file() && !jail.starts_with(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()));
        let home = top.join("home");
        open_dir(&home);
        for d in [".local", ".local/share", ".local/share/jail", ".local/share/jail/rootfs"] {
            open_dir(&home.join(d));
        }
        let rootfs = home.join(".local/share/jail/rootfs/minimal");
        let mut build = bare(&jail, &home);
        build.args(["rootfs", "build", "minimal"]);
        if is_root() {
            // Root's default is /var/lib/jail/rootfs: the host's, not a test's.
            build.arg("--dest").arg(&rootfs);
        }
        let out = build.output().unwrap();
        assert!(
            out.status.success(),
            "jail rootfs build minimal: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(rootfs.join("usr/bin/python3").exists(), "the build did not install into {}", rootfs.display());
        Installed { _keep: keep, jail, home, rootfs: std::fs::canonicalize(rootfs).unwrap() }
    })
}

/// `env -i` with only PATH and HOME (and the temp dir the tests were
/// given), run from `/`: nothing points at the build tree.
fn bare(jail: &Path, home: &Path) -> Command {
    let mut cmd = Command::new(jail);
    cmd.env_clear().env("PATH", "/usr/bin:/bin").env("HOME", home).current_dir("/");
    if let Some(tmp) = std::env::var_os("TMPDIR") {
        cmd.env("TMPDIR", tmp);
    }
    cmd
}

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let i = installed();
    let mut cmd = bare(&i.jail, &i.home);
    cmd.arg("run").args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn result(out: &Output) -> RunResult {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\nstderr: {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}

/// Exit 125, one line on stderr naming every needle.
fn refused(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
}

#[test]
fn an_installed_and_moved_binary_runs_code_with_its_built_in_policy_and_its_own_rootfs() {
    let i = installed();
    let out = run(&["--json", "-c", "import sys; print('hello from', sys.version_info[:2])"], None);
    let r = result(&out);
    assert_eq!(r.status, Status::Ok, "{:?}", r.setup_error);
    assert!(r.stdout.text.contains("hello from (3,"), "{}", r.stdout.text);
    assert_eq!(r.isolation.policy_source, "built-in");
    assert_eq!(Path::new(&r.isolation.rootfs), i.rootfs, "found by name in the user's data folder");
}

#[test]
fn a_script_on_stdin_runs_and_its_temp_file_is_gone_after() {
    let tmp = tempfile::tempdir().unwrap();
    open_dir(tmp.path());
    let i = installed();
    let mut cmd = bare(&i.jail, &i.home);
    cmd.env("TMPDIR", tmp.path())
        .args(["run", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"import sys\nprint('from stdin', sys.argv[0])\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let r = result(&out);
    assert_eq!(r.status, Status::Ok, "{:?}", r.setup_error);
    assert!(r.stdout.text.contains("from stdin /workspace/code/main.py"), "{}", r.stdout.text);
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("jail-script-"))
        .collect();
    assert!(left.is_empty(), "the script's temp folder was left behind: {left:?}");
}

#[test]
fn an_empty_c_is_refused_and_nothing_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let i = installed();
    let out = bare(&i.jail, &i.home).env("TMPDIR", tmp.path()).args(["run", "--json", "-c", ""]).output().unwrap();
    refused(&out, &["-c", "empty"]);
    let r = result(&out);
    assert_eq!(r.status, Status::SetupFailed);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "nothing left behind");
}

#[test]
fn c_and_a_script_file_together_are_refused() {
    let out = run(&["-c", "print(1)", "other.py"], None);
    refused(&out, &["both -c and the script other.py"]);
}

#[test]
fn c_with_a_code_dir_is_refused() {
    let out = run(&["--code", "/", "-c", "print(1)"], None);
    refused(&out, &["--code"]);
}

#[test]
fn without_any_rootfs_the_error_names_the_command_that_builds_it() {
    let i = installed();
    let empty_home = tempfile::tempdir().unwrap();
    let out = bare(&i.jail, empty_home.path()).args(["run", "-c", "print(1)"]).output().unwrap();
    if Path::new("/var/lib/jail/rootfs/minimal").exists() {
        // This host has a system rootfs, which an installed binary finds.
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    refused(&out, &["no rootfs `minimal` found", "jail rootfs build minimal"]);
    let named = bare(&i.jail, empty_home.path())
        .args(["run", "--rootfs-name", "../x", "-c", "print(1)"])
        .output()
        .unwrap();
    refused(&named, &["is not a name"]);
}

#[test]
fn rootfs_list_and_doctor_show_the_installed_rootfs_by_its_canonical_path() {
    let i = installed();
    let list = bare(&i.jail, &i.home).args(["rootfs", "list"]).output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success() && text.contains(&i.rootfs.display().to_string()), "{text}");
    assert!(text.contains("minimal, python 3."), "{text}");
    let doctor = bare(&i.jail, &i.home).args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let find = |name: &str| checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} check: {v}"));
    let rootfs = find("rootfs");
    assert_eq!(rootfs["ok"], true, "{rootfs}");
    assert!(rootfs["detail"].as_str().unwrap().starts_with(&i.rootfs.display().to_string()), "{rootfs}");
    assert!(find("policy")["detail"].as_str().unwrap().contains("built-in"));
    let all = serde_json::to_string(&v).unwrap();
    assert!(!all.contains("/../") && !all.contains("/./"), "a path in doctor's report is not canonical: {all}");
    assert_eq!(find("rootfs python")["ok"], true, "the rootfs was just built from the host's Python");
}

#[test]
fn doctor_flags_a_minimal_rootfs_whose_python_is_older_than_the_hosts() {
    let i = installed();
    let manifest = std::fs::read_to_string(i.rootfs.join("usr/share/jail/manifest.json")).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    let pkgs = m["debian_packages"].as_object_mut().unwrap();
    if pkgs.is_empty() {
        jail_tests::skip("the host's python3 is not from a Debian package (no dpkg): nothing to compare");
        return;
    }
    // The same rootfs, as if built before the host's last Python update.
    for v in pkgs.values_mut() {
        *v = serde_json::Value::String("0~before-the-update".into());
    }
    let old = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(old.path().join("usr/bin")).unwrap();
    std::fs::create_dir_all(old.path().join("usr/share/jail")).unwrap();
    std::fs::write(old.path().join("usr/bin/python3"), "").unwrap();
    std::fs::write(old.path().join("usr/share/jail/manifest.json"), m.to_string()).unwrap();
    let out = bare(&i.jail, &i.home).args(["doctor", "--json", "--rootfs"]).arg(old.path()).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "rootfs python").cloned();
    let check = check.unwrap_or_else(|| panic!("no rootfs python check: {v}"));
    assert_eq!(check["ok"], false, "{check}");
    assert!(check["detail"].as_str().unwrap().contains("0~before-the-update in the rootfs"), "{check}");
    assert!(check["fix"].as_str().unwrap().contains("jail rootfs build minimal"), "{check}");
    assert_ne!(out.status.code(), Some(0));
}

// ------------------------------------------------ the environment, read at the edge
// main.rs reads these once into the request (jail/src/hostenv.rs); the
// library reads none. Each fails if the value stopped reaching the run.

fn policy_with_pass(dir: &Path, pass: &[&str]) -> PathBuf {
    let text = std::fs::read_to_string(jail_tests::repo().join("policies/default.json")).unwrap();
    let mut p: serde_json::Value = serde_json::from_str(&text).unwrap();
    p["environment"]["pass"] = serde_json::json!(pass);
    let path = dir.join("pass.json");
    std::fs::write(&path, p.to_string()).unwrap();
    path
}

#[test]
fn only_the_policys_pass_through_variables_reach_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_with_pass(dir.path(), &["JAIL_TEST_PASSED"]);
    let out = Command::new(jail_bin())
        .env("JAIL_TEST_PASSED", "yes")
        .env("JAIL_TEST_NOT_LISTED", "leak")
        .args(["run", "--json", "--policy"])
        .arg(&policy)
        .arg("--rootfs")
        .arg(jail_tests::rootfs())
        .args([
            "-c",
            "import os; print(os.environ.get('JAIL_TEST_PASSED'), os.environ.get('JAIL_TEST_NOT_LISTED'))",
        ])
        .output()
        .unwrap();
    let r = result(&out);
    assert_eq!(r.status, Status::Ok, "{:?}", r.setup_error);
    assert_eq!(r.stdout.text.trim(), "yes None");
    assert_eq!(Path::new(&r.isolation.policy_source), std::fs::canonicalize(&policy).unwrap());
}

#[test]
fn the_seccomp_cache_goes_where_jail_cache_dir_says() {
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(jail_bin())
        .env("JAIL_CACHE_DIR", cache.path())
        .args(["run", "--json", "--rootfs"])
        .arg(jail_tests::rootfs())
        .args(["-c", "print(1)"])
        .output()
        .unwrap();
    assert_eq!(result(&out).status, Status::Ok);
    let entries: Vec<_> = std::fs::read_dir(cache.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        entries.iter().any(|n| n.to_string_lossy().starts_with("seccomp-")),
        "no compiled program in {}: {entries:?}",
        cache.path().display()
    );
}
