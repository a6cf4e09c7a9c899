//! The janitor: a child the server starts before anything else, holding
//! the read end of a pipe whose write end only the server has. When the
//! server dies, however it dies, the janitor reads end-of-file, stops the
//! sessions left in the work folder (their supervisors are setsid'd, so no
//! parent-death signal reaches them), removes the folder, and undoes the
//! server's nested cgroups (nest.rs), which the server names on the pipe
//! before it makes them: one JSON line `{"nest": RECORD}`, or `{"nest":
//! null}` once it has undone them itself.

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
/// How long the janitor tries to remove the server's cgroups while the
/// runs' processes finish.
const CGROUPS_FOR: Duration = Duration::from_secs(20);
/// Bytes of the pipe kept: the server writes a few short lines.
const MAX_TOLD_BYTES: usize = 64 << 10;
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

/// Tell the janitor which nested cgroups to undo after the server's death
/// (`None`: none, the server undid them).
pub fn tell(janitor: &mut Child, record: Option<&crate::nest::Record>) -> std::io::Result<()> {
    use std::io::Write;
    let stdin = janitor.stdin.as_mut().ok_or_else(|| std::io::Error::other("the janitor's pipe is closed"))?;
    let line = serde_json::json!({ "nest": record }).to_string();
    stdin.write_all(format!("{line}\n").as_bytes())
}

/// The last record the server told, from what it wrote on the pipe. Pure.
fn told(bytes: &[u8]) -> Option<crate::nest::Record> {
    #[derive(serde::Deserialize)]
    struct Line {
        nest: Option<crate::nest::Record>,
    }
    let text = String::from_utf8_lossy(bytes);
    let last = text.lines().filter_map(|l| serde_json::from_str::<Line>(l).ok()).next_back()?;
    last.nest
}

pub fn main(dirs: &[PathBuf]) -> ExitCode {
    use std::io::Read;
    let mut sink = [0u8; 4096];
    let mut heard = Vec::new();
    // Returns on end-of-file (the server is gone) or an error.
    while let Ok(n @ 1..) = std::io::stdin().read(&mut sink) {
        if heard.len() + n <= MAX_TOLD_BYTES {
            heard.extend_from_slice(&sink[..n]);
        }
    }
    for dir in dirs {
        let (socks, groups) = leftovers(dir, 0);
        for pgid in groups {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGTERM);
        }
        for sock in socks {
            // Its closing is nobody's now: the session ends, its jail and
            // folders go (jail::client, bounded in time).
            let _ = jail::client::session::stop_value(&sock);
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
    // After the runs: their cgroups lie beneath the server's `runs`.
    if let Some(record) = told(&heard) {
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        if let Err(e) = crate::nest::tear_down(&record, me, Instant::now() + CGROUPS_FOR) {
            // The server's stderr, which the janitor shares: the one place
            // this can be said.
            eprintln!(
                "jail serve janitor: left the server's cgroups in {}: {}",
                record.dir.display(),
                jail::stage::chain_line(&e)
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_the_server_wrote_is_what_the_janitor_undoes() {
        let record = r#"{"nest":{"dir":"/sys/fs/cgroup/pod","enabled":["memory","pids","cpu"]}}"#;
        let got = told(format!("{record}\n").as_bytes()).unwrap();
        assert_eq!(got.dir, PathBuf::from("/sys/fs/cgroup/pod"));
        assert_eq!(got.enabled, vec!["memory", "pids", "cpu"]);
        assert_eq!(told(format!("{record}\n{{\"nest\":null}}\n").as_bytes()), None, "undone by the server");
        assert_eq!(told(b""), None);
        // A line cut short by the server's death is not a record.
        assert_eq!(told(&record.as_bytes()[..20]), None);
    }
}
