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

use jail_tests::{is_root, jail_bin, RunResult, Status};

/// The moved install, and a home for it; removed when dropped.
struct Installed {
    _keep: tempfile::TempDir,
    jail: PathBuf,
    home: PathBuf,
}

/// A folder every uid may traverse (the sandbox of a root run reads the
/// rootfs as an unprivileged host uid).
fn open_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// scripts/install.sh (what `make install` runs) into a temp prefix, which
/// is then moved: nothing of the build tree is beside the binary.
fn install() -> Installed {
    let keep = tempfile::tempdir().unwrap();
    let top = keep.path().to_path_buf();
    open_dir(&top);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install.sh");
    let first = top.join("prefix");
    let out = Command::new("bash").arg(&script).arg(jail_bin()).arg(&first).output().unwrap();
    assert!(out.status.success(), "install.sh: {}", String::from_utf8_lossy(&out.stderr));
    let moved = top.join("moved");
    std::fs::rename(&first, &moved).unwrap();
    let jail = moved.join("bin/jail");
    assert!(jail.is_file());
    assert!(moved.join("share/jail/policies/default.json").is_file());
    let home = top.join("home");
    open_dir(&home);
    Installed { _keep: keep, jail, home }
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

fn run(i: &Installed, args: &[&str], stdin: Option<&str>) -> Output {
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
fn an_installed_and_moved_binary_builds_its_rootfs_and_runs_code_from_anywhere() {
    let i = install();
    // The rootfs, from the recipes compiled into the binary.
    let rootfs = i.home.join(".local/share/jail/rootfs/minimal");
    for d in [".local", ".local/share", ".local/share/jail", ".local/share/jail/rootfs"] {
        open_dir(&i.home.join(d));
    }
    let mut build = bare(&i.jail, &i.home);
    build.args(["rootfs", "build", "minimal"]);
    if is_root() {
        // Root's default is /var/lib/jail/rootfs: the host's, not a test's.
        build.arg("--dest").arg(&rootfs);
    }
    let out = build.output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "jail rootfs build minimal: {said}");
    assert!(rootfs.join("usr/bin/python3").exists(), "the build did not install into {}: {said}", rootfs.display());
    let rootfs = std::fs::canonicalize(rootfs).unwrap();

    // A run finds it by name, with the built-in policy, from `/`, env -i.
    let out = run(&i, &["--json", "-c", "import sys; print('hello from', sys.version_info[:2])"], None);
    let r = result(&out);
    assert_eq!(r.status, Status::Ok, "{:?}", r.setup_error);
    assert!(r.stdout.text.contains("hello from (3,"), "{}", r.stdout.text);
    assert_eq!(r.isolation.policy_source, "built-in");
    assert_eq!(Path::new(&r.isolation.rootfs), rootfs, "found by name in the user's data folder");

    // `rootfs list` and `doctor` show it by its canonical path.
    let list = bare(&i.jail, &i.home).args(["rootfs", "list"]).output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success() && text.contains(&rootfs.display().to_string()), "{text}");
    assert!(text.contains("minimal, python 3."), "{text}");
    let doctor = bare(&i.jail, &i.home).args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let find = |name: &str| checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} check: {v}"));
    let found = find("rootfs");
    assert_eq!(found["ok"], true, "{found}");
    assert!(found["detail"].as_str().unwrap().starts_with(&rootfs.display().to_string()), "{found}");
    assert!(find("policy")["detail"].as_str().unwrap().contains("built-in"));
    // Which flavours this user has, and how to get the other.
    let flavours = find("rootfs flavours")["detail"].as_str().unwrap().to_string();
    assert!(flavours.contains(&format!("minimal at {}", rootfs.display())), "{flavours}");
    if !Path::new("/var/lib/jail/rootfs/data").exists() {
        assert!(flavours.contains("`jail rootfs build data`"), "{flavours}");
    }
    let all = serde_json::to_string(&v).unwrap();
    assert!(!all.contains("/../") && !all.contains("/./"), "a path in doctor's report is not canonical: {all}");
    let fresh = checks.iter().find(|c| c["name"] == "rootfs python");
    assert!(fresh.is_none_or(|c| c["ok"] == true), "the rootfs was just built from the host's Python: {fresh:?}");

    // Issue 38: a rootfs named `data` beside it is what runs get by
    // default (here a second minimal build under that name, standing in
    // for the data stack), `--rootfs-name minimal` still the minimal one.
    let data = i.home.join(".local/share/jail/rootfs/data");
    let out = bare(&i.jail, &i.home).args(["rootfs", "build", "minimal", "--dest"]).arg(&data).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = std::fs::canonicalize(data).unwrap();
    let by_default = result(&run(&i, &["--json", "-c", "print(1)"], None));
    assert_eq!(Path::new(&by_default.isolation.rootfs), data, "data is the default where it is built");
    let named = result(&run(&i, &["--json", "--rootfs-name", "minimal", "-c", "print(1)"], None));
    assert_eq!(Path::new(&named.isolation.rootfs), rootfs, "--rootfs-name names one");
}

#[test]
fn a_script_on_stdin_runs_and_its_temp_file_is_gone_after() {
    let tmp = tempfile::tempdir().unwrap();
    open_dir(tmp.path());
    let i = install();
    let mut cmd = bare(&i.jail, &i.home);
    cmd.env("TMPDIR", tmp.path()).args(["run", "--json", "--rootfs"]).arg(jail_tests::rootfs()).arg("-");
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
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
    let i = install();
    let out = bare(&i.jail, &i.home).env("TMPDIR", tmp.path()).args(["run", "--json", "-c", ""]).output().unwrap();
    refused(&out, &["-c", "empty"]);
    let r = result(&out);
    assert_eq!(r.status, Status::SetupFailed);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "nothing left behind");
}

#[test]
fn c_and_a_script_file_together_are_refused() {
    let i = install();
    refused(&run(&i, &["-c", "print(1)", "other.py"], None), &["both -c and the script other.py"]);
}

#[test]
fn c_with_a_code_dir_is_refused() {
    let i = install();
    refused(&run(&i, &["--code", "/", "-c", "print(1)"], None), &["--code"]);
}

#[test]
fn without_any_rootfs_the_error_names_the_command_that_builds_it() {
    let i = install();
    let out = run(&i, &["-c", "print(1)"], None);
    if ["minimal", "data"].iter().any(|n| Path::new("/var/lib/jail/rootfs").join(n).exists()) {
        // This host has a system rootfs, which an installed binary finds.
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    // By default: data, else minimal; neither is one line naming both builds.
    refused(
        &out,
        &[
            "no rootfs found",
            "`data`, then `minimal`",
            "jail rootfs build minimal",
            "jail rootfs build data",
        ],
    );
    // A name given is looked up alone, and its build named.
    refused(
        &run(&i, &["--rootfs-name", "data", "-c", "print(1)"], None),
        &["no rootfs `data` found", "jail rootfs build data"],
    );
    refused(&run(&i, &["--rootfs-name", "../x", "-c", "print(1)"], None), &["is not a name"]);
}

#[test]
fn doctor_flags_a_minimal_rootfs_whose_python_is_older_than_the_hosts() {
    let manifest = std::fs::read_to_string(jail_tests::rootfs().join("usr/share/jail/manifest.json")).unwrap();
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
    let out = Command::new(jail_bin()).args(["doctor", "--json", "--rootfs"]).arg(old.path()).output().unwrap();
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

/// A command that only prints ends as it would have when its reader goes
/// away first (`jail packages | head -3` under `set -o pipefail`): the same
/// status, nothing on stderr, never a panic about a broken pipe (which
/// aborted `jail packages` in the wheel's Debian 11 and 13 checks).
#[test]
fn a_printing_command_whose_reader_has_gone_ends_quietly_with_its_own_status() {
    let rootfs = jail_tests::rootfs();
    let rootfs = rootfs.to_str().unwrap();
    for args in [
        vec!["packages", "--rootfs", rootfs],
        vec!["packages", "--json", "--rootfs", rootfs],
        vec!["rootfs", "list"],
        vec!["schema"],
        vec!["doctor", "--rootfs", rootfs],
    ] {
        let read = Command::new(jail_bin()).args(&args).output().unwrap();
        // The reader closes its end before the command writes a byte.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let gone = Command::new(jail_bin()).args(&args).stdout(writer).stderr(Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&gone.stderr);
        assert_eq!(gone.status.code(), read.status.code(), "jail {args:?} into a closed pipe: {:?}\n{stderr}", gone.status);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "jail {args:?}: {stderr}");
    }
}
