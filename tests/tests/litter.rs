//! No litter (issue 38 item 5): `jail run` without `--output` makes a
//! fresh `jail-output-*` folder in TMPDIR for the step, and a step that
//! leaves no artifact leaves no folder (the result's `output_dir` is null);
//! one that leaves files keeps it and, in human mode, says where it is; a
//! folder the caller gave is never removed, even empty; a pool request
//! without `output` is held to the same. Each test gives jail a TMPDIR of
//! its own and looks at what is in it afterwards.

use std::path::{Path, PathBuf};
use std::process::Command;

use jail_tests::{jail_bin, parse, rootfs, Pool, Sandbox, Status};

/// A TMPDIR every uid may traverse (a root run's sandbox writes beneath it
/// when its output is bound).
fn temp_dir(sb: &Sandbox) -> PathBuf {
    let t = sb.pool_tmp();
    std::fs::create_dir_all(&t).unwrap();
    std::fs::set_permissions(&t, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    t
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `jail run [--json] -c CODE` with no `--output`, TMPDIR `tmp`.
fn run_c(tmp: &Path, json: bool, code: &str) -> std::process::Output {
    let mut cmd = Command::new(jail_bin());
    cmd.arg("run").arg("--rootfs").arg(rootfs()).env("TMPDIR", tmp);
    if json {
        cmd.arg("--json");
    }
    cmd.arg("-c").arg(code).output().unwrap()
}

#[test]
fn a_run_that_leaves_no_file_leaves_no_folder() {
    let sb = Sandbox::new();
    let tmp = temp_dir(&sb);
    for _ in 0..3 {
        let out = run_c(&tmp, true, "print(1)");
        let r = parse(&out);
        assert_eq!(r.status, Status::Ok, "{:?}", r.setup_error);
        assert_eq!(r.output_dir, None, "an empty fresh folder is not reported");
        // Human mode too, and a failed step the same.
        let human = run_c(&tmp, false, "raise SystemExit(3)");
        assert_eq!(human.status.code(), Some(3));
        assert!(!String::from_utf8_lossy(&human.stderr).contains("jail-output-"), "nothing to name");
    }
    assert_eq!(entries(&tmp), Vec::<String>::new(), "six runs, nothing left in TMPDIR");
}

#[test]
fn a_run_with_files_keeps_its_folder_and_says_where_in_human_mode() {
    let sb = Sandbox::new();
    let tmp = temp_dir(&sb);
    let out = run_c(&tmp, false, "open('a.txt', 'w').write('a'); open('b.txt', 'w').write('b'); print('done')");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    let left = entries(&tmp);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with("jail-output-"), "{left:?}");
    let dir = tmp.join(&left[0]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("jail: 2 files in {}", dir.display())), "human mode names the folder: {stderr}");
    assert_eq!(entries(&dir), ["a.txt", "b.txt"]);
    // --json says where in the result, as before.
    let r = parse(&run_c(&tmp, true, "open('c.txt', 'w').write('c')"));
    let named = PathBuf::from(r.output_dir.expect("output_dir"));
    assert!(named.join("c.txt").is_file());
}

#[test]
fn the_callers_own_output_folder_is_kept_even_empty() {
    let sb = Sandbox::new();
    let tmp = temp_dir(&sb);
    let out = Command::new(jail_bin())
        .args(["run", "--json", "--rootfs"])
        .arg(rootfs())
        .arg("--output")
        .arg(&sb.output)
        .env("TMPDIR", &tmp)
        .arg(sb.script("print('nothing written')"))
        .output()
        .unwrap();
    let r = parse(&out);
    assert_eq!(r.status, Status::Ok);
    assert!(sb.output.is_dir(), "the caller's folder was removed");
    assert_eq!(r.output_dir.as_deref().map(PathBuf::from), Some(std::fs::canonicalize(&sb.output).unwrap()));
}

#[test]
fn a_pool_request_without_output_that_leaves_nothing_leaves_no_folder() {
    let sb = Sandbox::new();
    let tmp = temp_dir(&sb);
    let before = entries(&tmp);
    let mut pool = Pool::start(&sb, 1, &[]);
    let empty = pool.call(serde_json::json!({"id": "e", "code": "print(1)"}));
    assert_eq!(empty["result"]["status"], "ok", "{empty}");
    assert!(empty["result"]["output_dir"].is_null(), "{empty}");
    let made = pool.call(serde_json::json!({"id": "m", "code": "open('x.txt', 'w').write('x')"}));
    let dir = PathBuf::from(made["result"]["output_dir"].as_str().expect("output_dir"));
    assert!(dir.join("x.txt").is_file(), "{made}");
    assert!(pool.finish().success());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(entries(&tmp), before, "the pool left nothing else in its TMPDIR");
}
