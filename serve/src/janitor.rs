//! The janitor: a child the server starts before anything else, holding
//! the read end of a pipe whose write end only the server has. When the
//! server dies, however it dies, the janitor reads end-of-file, stops the
//! sessions left in the work folder (their supervisors are setsid'd, so no
//! parent-death signal reaches them), and removes the folder.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// How long the janitor keeps trying to remove the folder while runs that
/// got their SIGTERM finish cleaning up.
const REMOVE_FOR: Duration = Duration::from_secs(20);
/// How deep under the work folder a session socket is looked for
/// (tenant/sessions/ID/jail/sessions/ID.sock).
const MAX_DEPTH: usize = 6;

/// Start the janitor of `dir`; the server keeps the returned child (and
/// its stdin) for its whole life.
pub fn start(dir: &Path) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    std::process::Command::new(exe)
        .arg("--janitor")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        // Its own group: a terminal's Ctrl-C that stops the server must
        // not stop the cleanup.
        .process_group(0)
        .spawn()
}

pub fn main(dir: &Path) -> ExitCode {
    use std::io::Read;
    let mut sink = [0u8; 64];
    // Returns on end-of-file (the server is gone) or an error.
    while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
    let jail = std::env::current_exe().map(|e| e.with_file_name("jail")).unwrap_or_else(|_| "jail".into());
    for sock in sockets(dir, 0) {
        stop_session(&jail, &sock);
    }
    let until = Instant::now() + REMOVE_FOR;
    while dir.exists() && Instant::now() < until {
        if std::fs::remove_dir_all(dir).is_err() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    ExitCode::SUCCESS
}

/// Session sockets under `dir`, links not followed.
fn sockets(dir: &Path, depth: usize) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_socket() {
            found.push(e.path());
        } else if kind.is_dir() && depth < MAX_DEPTH {
            found.extend(sockets(&e.path(), depth + 1));
        }
    }
    found
}

/// `jail session stop SOCK`, with the runtime folder the session was started with.
fn stop_session(jail: &Path, sock: &Path) {
    // SOCK is RUNTIME/jail/sessions/ID.sock.
    let Some(runtime) = sock.ancestors().nth(3) else { return };
    let _ = std::process::Command::new(jail)
        .args(["session", "stop"])
        .arg(sock)
        .env("XDG_RUNTIME_DIR", runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
