//! The janitor: forked by the server before anything else (the one
//! janitor primitive, `jail::janitor`, as the session supervisor and `jail
//! pool` fork theirs), holding the read end of a pipe whose write end only
//! the server has. When the server dies, however it dies, the janitor
//! reads end-of-file, stops the sessions left in the work folder (their
//! supervisors are setsid'd, so no parent-death signal reaches them),
//! removes the folder, and undoes the server's nested cgroups (nest.rs),
//! which the server names on the pipe before it makes them: one JSON line
//! `{"nest": RECORD}`, or `{"nest": null}` once it has undone them itself.
//! It is named `serve-janitor` (`/proc/PID/comm`) and shares the server's
//! stderr, the one place it can say what it could not undo.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The janitor's process name.
pub const NAME: &std::ffi::CStr = c"serve-janitor";

/// The file in a run's folder naming its process group.
pub const PGID_FILE: &str = "jail.pgid";

/// How long the janitor keeps trying to remove the folder while runs that
/// got their SIGTERM finish cleaning up.
const REMOVE_FOR: Duration = Duration::from_secs(20);
/// How long the janitor tries to remove the server's cgroups while the
/// runs' processes finish.
const CGROUPS_FOR: Duration = Duration::from_secs(20);
/// How deep under the work folder a session socket is looked for
/// (ID/jail/sessions/ID.sock).
const MAX_DEPTH: usize = 6;

/// The server's hold on its janitor: kept for the server's whole life.
pub struct Janitor {
    pub pid: u32,
    pipe: File,
}

/// Start the janitor of `dirs`. Before any thread starts (it is forked).
pub fn start(dirs: &[&Path]) -> std::io::Result<Janitor> {
    let dirs: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    let spec = jail::janitor::Spec { name: NAME, keep_stderr: true };
    let j = jail::janitor::start(spec, |told| clean_up(&dirs, told))?;
    Ok(Janitor { pid: j.pid, pipe: File::from(j.pipe) })
}

/// Tell the janitor which nested cgroups to undo after the server's death
/// (`None`: none, the server undid them).
pub fn tell(janitor: &mut Janitor, record: Option<&crate::nest::Record>) -> std::io::Result<()> {
    use std::io::Write;
    let line = serde_json::json!({ "nest": record }).to_string();
    janitor.pipe.write_all(format!("{line}\n").as_bytes())
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

/// What the janitor does once the server is gone: `heard` is what the
/// server told it.
fn clean_up(dirs: &[PathBuf], heard: &[u8]) {
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
    if let Some(record) = told(heard) {
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
