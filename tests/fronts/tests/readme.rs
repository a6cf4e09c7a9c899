//! Every shell block of README.md runs as written (issue 38 item 7): the
//! blocks are taken from the file, in order, into one bash script (`set -euo
//! pipefail`), and run from the repository root the way a newcomer who
//! followed the README runs them: after `make release` (the "Two commands"
//! block, which CI's .ci/run runs first, is marked and left to it), with a
//! fresh HOME (so `make install PREFIX=$HOME/.local` and the rootfs builds
//! go there) and `~/.local/bin` on PATH, as the Install block says. The
//! Python blocks are run by python/tests (test_readme_and_examples.py), the
//! MCP client configuration by tests/fronts/tests/mcp.rs.
//!
//! Two things differ from a person's terminal, neither in what a block
//! does: the service's port 8080 becomes a free one (other tests and
//! services share this machine), and as root the blocks run in a private
//! mount namespace with an empty tmpfs on /var/lib/jail, so root's `jail
//! rootfs build` (which installs there) leaves the host as it was. TMPDIR is
//! a folder of the test's, removed after: what the runs make (their output
//! folders) goes with it.
//!
//! Root only: `make install` builds in the checkout, which is root's; the
//! ordinary-user half of a rootfs build runs in tests/install.rs and the
//! userland test (python/userland.sh).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jail_tests::{is_root, only_as_root, repo};

/// The marker a block is preceded by when this test does not run it (the
/// line before the fence), with the reason after it.
const NOT_RUN: &str = "<!-- readme-sh: not run by tests/fronts/tests/readme.rs";

/// The whole script's limit: a data rootfs build from root's cache, a pool
/// of four data jails and a few runs, on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(20 * 60);

/// README.md's ```sh blocks, with the line each starts at, less those
/// marked NOT_RUN.
fn shell_blocks(readme: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() == "```sh" {
            let start = i + 1;
            let skipped = i > 0 && lines[i - 1].starts_with(NOT_RUN);
            let mut body = String::new();
            i += 1;
            while i < lines.len() && lines[i].trim_end() != "```" {
                body.push_str(lines[i]);
                body.push('\n');
                i += 1;
            }
            if !skipped {
                blocks.push((start, body));
            }
        }
        i += 1;
    }
    blocks
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_readmes_marked_blocks_are_the_ones_left_out() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let all = readme.lines().filter(|l| l.trim_end() == "```sh").count();
    let run = shell_blocks(&readme);
    assert_eq!(all - run.len(), readme.matches(NOT_RUN).count(), "every marker precedes a block");
    assert!(run.len() >= 4, "the Using it, Install, Sessions and service blocks: {run:?}");
    for needle in ["make install", "jail rootfs build data", "jail session start", "jail serve"] {
        assert!(run.iter().any(|(_, b)| b.contains(needle)), "no block runs {needle}");
    }
}

#[test]
fn every_shell_block_of_the_readme_runs_as_written() {
    if only_as_root("the README's blocks run `make install` in the checkout, which is root's") {
        return;
    }
    let repo = std::fs::canonicalize(repo()).unwrap();
    assert!(
        repo.join("target/release/jail").is_file() && repo.join("Makefile").is_file(),
        "the README's blocks start from a built checkout (`make release`): no {}",
        repo.join("target/release/jail").display()
    );
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let port = free_port().to_string();
    let mut script = String::from("set -euo pipefail\nexport PATH=\"$HOME/.local/bin:$PATH\"\n");
    for (line, body) in shell_blocks(&readme) {
        script.push_str(&format!("echo '== README.md line {line}' >&2\n"));
        script.push_str(
            &body
                .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
                .replace("localhost:8080", &format!("localhost:{port}")),
        );
    }

    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let tmp = work.path().join("tmp");
    for d in [&home, &tmp] {
        std::fs::create_dir(d).unwrap();
    }
    let script_path = work.path().join("readme.sh");
    std::fs::write(&script_path, &script).unwrap();

    // Root's `jail rootfs build` installs into /var/lib/jail/rootfs: an
    // empty tmpfs there, in a mount namespace of the script's own.
    let made_var_lib_jail = !Path::new("/var/lib/jail").exists();
    if made_var_lib_jail {
        std::fs::create_dir_all("/var/lib/jail").unwrap();
    }
    let real_home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "bash", "-c"])
        .arg("mount -t tmpfs -o mode=0755 tmpfs /var/lib/jail && exec bash \"$0\"")
        .arg(&script_path)
        .current_dir(&repo)
        .env("HOME", &home)
        .env("TMPDIR", &tmp)
        // The toolchain stays where it is installed (rustup finds it by these).
        .env("RUSTUP_HOME", std::env::var_os("RUSTUP_HOME").unwrap_or_else(|| real_home.join(".rustup").into()))
        .env("CARGO_HOME", std::env::var_os("CARGO_HOME").unwrap_or_else(|| real_home.join(".cargo").into()))
        // cargo-zigbuild keeps its linker wrappers there: the same paths, no relink.
        .env("XDG_CACHE_HOME", std::env::var_os("XDG_CACHE_HOME").unwrap_or_else(|| real_home.join(".cache").into()))
        .env_remove("JAIL_ROOTFS")
        .env_remove("XDG_DATA_HOME")
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A process group of its own, so a script past its limit is ended
    // whole (make, cargo, jail serve), not just its shell.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let outs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (stdout, stderr) = (outs.join().unwrap(), errs.join().unwrap());
    if made_var_lib_jail {
        let _ = std::fs::remove_dir("/var/lib/jail");
    }
    let said = format!("--- stdout\n{stdout}\n--- stderr\n{}", tail(&stderr, 8000));
    // What each block said, for `--nocapture`.
    eprintln!("{said}");
    assert!(status.is_some(), "the README's blocks did not end within {LIMIT:?}\n{said}");
    assert!(status.unwrap().success(), "a README block failed ({:?})\n{said}", status);

    // What the blocks say they print.
    assert!(stdout.lines().any(|l| l == "1") && stdout.lines().any(|l| l == "2"), "jail run -c / stdin\n{said}");
    assert!(stderr.contains("jail: 1 file in "), "the fresh output folder is named at the end\n{said}");
    assert!(stdout.contains("revenue.json") || stderr.contains("revenue.json") || stdout.contains("north"), "{said}");
    assert!(
        stdout.contains("\"stdout\":{\"text\":\"42\\n\"") || stdout.contains("42\\n"),
        "the service's first run\n{said}"
    );
    assert!(stdout.contains("units") && stdout.contains("price"), "pandas read the tar's CSV in the service\n{said}");
    // The pandas version line of the Install block (data is the default).
    assert!(stdout.lines().any(|l| l.split('.').count() == 3 && l.starts_with(|c: char| c.is_ascii_digit())), "{said}");
    let installed = home.join(".local/bin");
    for b in ["jail", "jail-mcp", "jail-serve"] {
        assert!(installed.join(b).is_file(), "make install put no {b} into {}", installed.display());
    }
    assert!(is_root());
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
