//! `jail mcp` end to end, with the official MCP Python SDK as the client
//! (tests/mcp/client.py, venv by tests/mcp/setup.sh): README.md's "From an
//! MCP client" config block is started exactly as written, with `jail` on
//! PATH and the layout it names (python-rootfs/out/data, examples/data) in
//! the working folder. The client lists the tools, charts a CSV with
//! matplotlib in the data rootfs and checks the PNG it gets back, then sends
//! requests that must be refused with nothing run: this test checks that no
//! run left an output folder for them. In a session it gets a cell's chart
//! back with that cell, before the session is stopped, and writes, reads
//! and lists files with the files tools.

use std::path::{Path, PathBuf};
use std::process::Command;

use jail_tests::*;
use serde_json::Value;

/// The SDK's python: JAIL_MCP_PYTHON, else where tests/mcp/setup.sh puts it.
fn mcp_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("JAIL_MCP_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let mut candidates = vec![PathBuf::from("/var/cache/jail-mcp/venv/bin/python")];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/jail-mcp/venv/bin/python"));
    }
    candidates
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import mcp.client.stdio"]).output().is_ok_and(|o| o.status.success()))
}

/// The JSON block README.md marks as the MCP client config.
fn readme_config() -> Value {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("read README.md");
    let after = readme.split("<!-- mcp-config").nth(1).expect("README.md has no `<!-- mcp-config` block");
    let body = after
        .split("```json\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a ```json block after the marker");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("README.md's MCP config is not JSON ({e}):\n{body}"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        assert!(entry.file_type().unwrap().is_file(), "examples/data holds files only: {:?}", entry.path());
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn symlink(target: &Path, link: &Path) {
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, link).unwrap();
}

#[test]
fn an_mcp_client_runs_the_readme_config_gets_a_chart_and_is_refused_outside_paths() {
    let Some(python) = mcp_python() else {
        skip("no python with the MCP SDK: run tests/mcp/setup.sh (make test-deps does)");
        return;
    };
    let data = data_rootfs();
    if skip_unless(
        data.join("usr/bin/python3").exists(),
        &format!("no data rootfs at {} (build it: make rootfs-data)", data.display()),
    ) {
        return;
    }
    let config = readme_config();
    let server = &config["mcpServers"]["jail"];
    assert_eq!(server["command"], "jail", "the README's server command is `jail` on PATH");

    // The working folder the README's relative paths are read in, and a PATH
    // whose `jail` is the binary under test.
    let cwd = tempfile::Builder::new().prefix("jail-mcp-test-").tempdir().unwrap();
    symlink(&data, &cwd.path().join("python-rootfs/out/data"));
    // The input folder is a copy, not a link: no door follows a link in a
    // caller's path (accept.rs), and the README's path is relative.
    copy_dir(&repo().join("examples/data"), &cwd.path().join("examples/data"));
    symlink(&jail_bin(), &cwd.path().join("bin/jail"));
    let tmp = cwd.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    give_to_sandbox(&tmp);
    let config_path = cwd.path().join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();

    let path = format!("{}:{}", cwd.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(&python)
        .arg(repo().join("tests/mcp/client.py"))
        .arg(&config_path)
        .arg("jail")
        .arg("data/sales.csv")
        .current_dir(cwd.path())
        .env("PATH", path)
        .env("TMPDIR", &tmp)
        .output()
        .expect("run the MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "the client printed no report ({e}); status {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let checks = report["checks"].as_object().unwrap();
    let failed: Vec<&String> = checks.iter().filter(|(_, v)| **v != Value::Bool(true)).map(|(k, _)| k).collect();
    assert!(
        failed.is_empty() && out.status.success(),
        "checks failed: {failed:?}\n{report:#}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        report["tools"],
        serde_json::json!([
            "run_python",
            "session_exec",
            "session_list_files",
            "session_read_file",
            "session_start",
            "session_stop",
            "session_write_file"
        ])
    );
    assert_eq!(report["image"]["mime"], "image/png");
    assert!(report["refusals"]["outside_path"]["text"].as_str().unwrap().contains("outside the folders"), "{report:#}");
    assert!(report["refusals"]["dotdot_path"]["text"].as_str().unwrap().contains("outside the folders"), "{report:#}");
    assert!(report["refusals"]["timeout_above_limit"]["text"].as_str().unwrap().contains("at most"), "{report:#}");

    // The session the client left open ended with the server: no process
    // started under this test's TMPDIR is left.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !processes_with_tmpdir(&tmp).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(processes_with_tmpdir(&tmp), Vec::<u32>::new(), "a session outlived the MCP server");

    // The chart ran once by run_python, once in a session; the third
    // session (left open) drew nothing, so its output folder went as any
    // folder a step left empty does; the refused calls ran nothing (no
    // output folder), and each step's own folder (code, staged input) is gone.
    let mut left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left.len(), 2, "one run and one session drew, one output folder each: {left:?}");
    assert!(left.iter().all(|l| l.starts_with("jail-output-")), "{left:?}");
    let charts = left.iter().filter(|l| tmp.join(l).join("chart.png").is_file()).count();
    assert_eq!(charts, 2, "{left:?}");
}

/// Processes whose environment has TMPDIR=`tmp` (only our own are readable
/// as an ordinary user, which are the ones this test starts).
fn processes_with_tmpdir(tmp: &Path) -> Vec<u32> {
    let want = format!("TMPDIR={}", tmp.display()).into_bytes();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(env) = std::fs::read(e.path().join("environ")) {
            if env.split(|&b| b == 0).any(|v| v == want.as_slice()) {
                found.push(pid);
            }
        }
    }
    found
}
