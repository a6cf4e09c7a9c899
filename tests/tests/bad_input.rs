//! Bad input: every mistake a user can make gets one clear line naming the
//! problem and the fix, exit 125, and leaves nothing behind.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use jail_tests::*;

fn jail(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(jail_bin()).args(args).output().expect("spawn jail")
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// Exit 125, one line on stderr containing every `needle`.
fn assert_refused(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
}

fn litter() -> (usize, usize) {
    let outputs = std::fs::read_dir(std::env::temp_dir())
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("jail-output-")).count())
        .unwrap_or(0);
    (outputs, host_mounts_with("jail-").len())
}

#[test]
fn a_missing_script_is_refused_with_the_path() {
    let before = litter();
    let out = jail(&[os("run"), os("--rootfs"), rootfs().as_os_str(), os("/nonexistent/script.py")]);
    assert_refused(&out, &["/nonexistent/script.py", "check the path"]);
    assert_eq!(litter(), before, "a failed run left an output dir or a mount");
}

#[test]
fn a_folder_given_as_script_is_refused() {
    let sb = Sandbox::new();
    let out = jail(&[os("run"), os("--rootfs"), rootfs().as_os_str(), sb.code.as_os_str()]);
    assert_refused(&out, &["not a regular file"]);
}

#[test]
fn an_unreadable_script_is_refused() {
    // Root reads every file; the check that matters for root is the
    // sandbox uid's access to the code dir, tested below.
    if only_as_ordinary_user("root reads every file") {
        return;
    }
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = jail(&[os("run"), os("--rootfs"), rootfs().as_os_str(), script.as_os_str()]);
    assert_refused(&out, &["cannot be read"]);
}

#[test]
fn input_that_is_missing_a_file_or_a_symlink_is_refused() {
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let file = sb.input_file("f.txt", b"x");
    let link = sb.dir.path().join("link");
    std::os::unix::fs::symlink(&sb.input, &link).unwrap();
    let missing = sb.dir.path().join("missing");
    for (dir, needle) in [(&missing, "create it"), (&file, "not a folder"), (&link, "symbolic link")] {
        let out = jail(&[
            os("run"),
            os("--rootfs"),
            rootfs().as_os_str(),
            os("--input"),
            dir.as_os_str(),
            script.as_os_str(),
        ]);
        assert_refused(&out, &["input dir", needle, "--input"]);
    }
}

#[test]
fn output_that_is_missing_or_a_symlink_is_refused() {
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let link = sb.dir.path().join("outlink");
    std::os::unix::fs::symlink(&sb.output, &link).unwrap();
    let missing = sb.dir.path().join("missing");
    for dir in [&missing, &link] {
        let out = jail(&[
            os("run"),
            os("--rootfs"),
            rootfs().as_os_str(),
            os("--output"),
            dir.as_os_str(),
            script.as_os_str(),
        ]);
        assert_refused(&out, &["output dir", "--output"]);
    }
}

#[test]
fn an_output_dir_the_sandbox_cannot_write_is_refused_with_the_fix() {
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let locked = sb.dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    if is_root() {
        // Size-capped, the copy writes it as root without capabilities, by
        // its mode bits, which say no.
        let out = jail(&[
            os("run"),
            os("--rootfs"),
            rootfs().as_os_str(),
            os("--output"),
            locked.as_os_str(),
            script.as_os_str(),
        ]);
        assert_refused(&out, &["not writable by root through its mode bits", "chown root", "u+rwx"]);
        // Bound into the jail, the script writes it as its unprivileged host
        // uid of identity.root_host_uids: the fix hands it to their group.
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut policy: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(repo().join("policies/default.json")).unwrap()).unwrap();
        policy.as_object_mut().unwrap().remove("rootfs");
        policy["filesystem"]["output_size"] = "unlimited".into();
        let path = sb.dir.path().join("policy.json");
        std::fs::write(&path, policy.to_string()).unwrap();
        let out = jail(&[
            os("run"),
            os("--rootfs"),
            rootfs().as_os_str(),
            os("--policy"),
            path.as_os_str(),
            os("--output"),
            locked.as_os_str(),
            script.as_os_str(),
        ]);
        assert_refused(&out, &["not writable by the sandbox", "chgrp", "g+rwx"]);
    } else {
        let out = jail(&[
            os("run"),
            os("--rootfs"),
            rootfs().as_os_str(),
            os("--output"),
            locked.as_os_str(),
            script.as_os_str(),
        ]);
        assert_refused(&out, &["not writable"]);
    }
}

#[test]
fn a_missing_rootfs_names_the_command_that_builds_it() {
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let out = jail(&[os("run"), os("--rootfs"), os("/nonexistent/rootfs"), script.as_os_str()]);
    assert_refused(&out, &["/nonexistent/rootfs", "jail rootfs build minimal"]);
}

#[test]
fn a_malformed_policy_names_the_field() {
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let policy = sb.dir.path().join("bad.json");
    std::fs::write(&policy, r#"{"version": 1, "limits": {"wall_time_secs": "soon"}}"#).unwrap();
    let out = jail(&[
        os("run"),
        os("--policy"),
        policy.as_os_str(),
        os("--rootfs"),
        rootfs().as_os_str(),
        script.as_os_str(),
    ]);
    assert_refused(&out, &["limits.wall_time_secs", "jail check"]);
    let check = jail(&[os("check"), policy.as_os_str()]);
    assert_eq!(check.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&check.stderr).contains("limits.wall_time_secs"));
    std::fs::write(&policy, r#"{"version": 1, "surprise": true}"#).unwrap();
    let check = jail(&[os("check"), policy.as_os_str()]);
    assert!(String::from_utf8_lossy(&check.stderr).contains("unknown field `surprise`"));
}

#[test]
fn an_unknown_option_exits_125() {
    let out = jail(&[os("run"), os("--no-such-option"), os("x.py")]);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-option"));
}

#[test]
fn an_out_of_range_timeout_is_refused() {
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let out = jail(&[
        os("run"),
        os("--timeout"),
        os("0"),
        os("--rootfs"),
        rootfs().as_os_str(),
        script.as_os_str(),
    ]);
    assert_refused(&out, &["--timeout"]);
}

#[test]
fn a_bad_output_dir_is_reported_at_the_output_stage_not_input() {
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let missing = sb.dir.path().join("missing");
    let out = jail(&[
        os("run"),
        os("--json"),
        os("--rootfs"),
        rootfs().as_os_str(),
        os("--output"),
        missing.as_os_str(),
        script.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(125));
    let e = parse(&out).setup_error.unwrap();
    assert_eq!(e.stage, "output", "{e:?}");
    assert!(e.message.contains("--output"), "{e:?}");
}

#[test]
fn json_mode_reports_bad_input_as_a_setup_error() {
    let out = jail(&[
        os("run"),
        os("--json"),
        os("--rootfs"),
        rootfs().as_os_str(),
        os("/nonexistent/s.py"),
    ]);
    assert_eq!(out.status.code(), Some(125));
    let r = parse(&out);
    assert_eq!(r.status, Status::SetupFailed);
    let e = r.setup_error.unwrap();
    assert_eq!(e.stage, "input");
    assert!(e.message.contains("/nonexistent/s.py"));
}

#[test]
fn a_child_side_failure_lands_in_setup_error_with_its_stage() {
    // A rootfs whose "interpreter" cannot be executed: everything up to exec
    // succeeds, and exec's failure must come back from inside the jail.
    let dir = tempfile::Builder::new().prefix("jail-fake-rootfs-").tempdir().unwrap();
    let bin = dir.path().join("usr/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("python3"), "not a program").unwrap();
    for p in [dir.path().to_path_buf(), dir.path().join("usr"), bin.clone()] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(bin.join("python3"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let sb = Sandbox::new();
    let script = sb.script("print(1)\n");
    let out = Command::new(jail_bin())
        .args(["run", "--json", "--rootfs"])
        .arg(dir.path())
        .arg("--output")
        .arg(&sb.output)
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let r = parse(&out);
    assert_eq!(r.status, Status::SetupFailed);
    let e = r.setup_error.unwrap();
    assert_eq!(e.stage, "exec", "{e:?}");
    assert!(e.message.contains("execve"), "{e:?}");
    assert!(e.causes.iter().any(|c| c.contains("EACCES") || c.contains("denied")), "{e:?}");
}

#[test]
fn many_runs_leave_no_process_mount_cgroup_or_temp_dir_behind() {
    let before = litter();
    let sb = Sandbox::new();
    for _ in 0..20 {
        // The run cgroup is removed after the result is printed, before
        // `jail` exits: gone by the time the caller has the exit status.
        let (r, _, pid) = run_tracked(&mut sb.command("import os\nos.fork() or os._exit(0)\nprint('x')\n"));
        assert_eq!(r.status, Status::Ok);
        assert_eq!(cgroups_left_by(pid), Vec::<std::path::PathBuf>::new(), "run {pid} left its cgroup");
    }
    assert_eq!(litter(), before);
    assert_eq!(host_processes_with(&sb.code.display().to_string()), Vec::<u32>::new());
}
