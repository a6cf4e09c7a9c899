//! The janitor: a child the server starts before anything else, holding
//! the read end of a pipe whose write end only the server has. When the
//! server dies, however it dies, the janitor reads end-of-file, stops the
//! sessions left in the work folder (their supervisors are setsid'd, so no
//! parent-death signal reaches them), and removes the folder.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The first argument that makes this binary the janitor.
pub const FLAG: &str = "--janitor";

/// The file in a run's folder naming its process group.
pub const PGID_FILE: &str = "jail.pgid";

/// How long the janitor keeps trying to remove the folder while runs that
/// got their SIGTERM finish cleaning up.
const REMOVE_FOR: Duration = Duration::from_secs(20);
/// How deep under the work folder a session socket is looked for
/// (ID/jail/sessions/ID.sock).
const MAX_DEPTH: usize = 6;

/// Start the janitor of `dir`; the server keeps the returned child (and
/// its stdin) for its whole life.
pub fn start(dirs: &[&Path]) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(FLAG).args(dirs);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        // Its own group: a terminal's Ctrl-C that stops the server must
        // not stop the cleanup.
        .process_group(0)
        .spawn()
}

pub fn main(dirs: &[PathBuf]) -> ExitCode {
    use std::io::Read;
    let mut sink = [0u8; 64];
    // Returns on end-of-file (the server is gone) or an error.
    while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
    let jail = std::env::current_exe().map(|e| e.with_file_name("jail")).unwrap_or_else(|_| "jail".into());
    for dir in dirs {
        let (socks, groups) = leftovers(dir, 0);
        for pgid in groups {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGTERM);
        }
        for sock in socks {
            stop_session(&jail, &sock);
        }
    }
    let until = Instant::now() + REMOVE_FOR;
    while dirs.iter().any(|d| d.exists()) && Instant::now() < until {
        for dir in dirs.iter().filter(|d| d.exists()) {
            if std::fs::remove_dir_all(dir).is_err() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    ExitCode::SUCCESS
}

/// Session sockets and runs' process groups under `dir`, links not followed.
fn leftovers(dir: &Path, depth: usize) -> (Vec<PathBuf>, Vec<i32>) {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let (mut socks, mut groups) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(dir) else { return (socks, groups) };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_socket() {
            socks.push(e.path());
        } else if kind.is_file() && e.file_name() == PGID_FILE {
            let mut text = String::new();
            let read = std::fs::File::open(e.path()).and_then(|f| f.take(32).read_to_string(&mut text));
            if let Some(pgid) = read.ok().and_then(|_| text.trim().parse::<i32>().ok()).filter(|p| *p > 1) {
                groups.push(pgid);
            }
        } else if kind.is_dir() && depth < MAX_DEPTH {
            let (s, g) = leftovers(&e.path(), depth + 1);
            socks.extend(s);
            groups.extend(g);
        }
    }
    (socks, groups)
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
