//! A delegated cgroup from systemd, for an ordinary user who has no
//! writable cgroup: the jail asks the user's systemd manager, over the user
//! bus, for a transient scope with `Delegate=yes` holding the supervisor
//! (`org.freedesktop.systemd1.Manager.StartTransientUnit`, then the job's
//! `JobRemoved` signal), moves itself into a leaf of that scope and creates
//! the run cgroups beside it. This is what rootless podman and crun do, and
//! what `systemd-run --user --scope -p Delegate=yes` did by hand before.
//!
//! Supervisor side only. The scope is asked for once per process and holds
//! the supervisor until it exits; systemd removes an empty transient scope
//! with its cgroups (`CollectMode=inactive-or-failed` also when it failed),
//! so nothing outlives the jail. When the bus is not there, or systemd says
//! no, the run falls back exactly as without delegation (rlimits, or refused
//! per `limits.enforcement`) and the reason is in the result.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use zbus::zvariant::{OwnedObjectPath, Value};

use crate::cgroup::{self, Choice, Settings};
use crate::limits;
use crate::sys::{self, Forked};

const DESTINATION: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const INTERFACE: &str = "org.freedesktop.systemd1.Manager";

/// How long systemd may take to answer and to start the scope.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The leaf of the scope the supervisor moves itself into, so that the
/// scope itself has no processes and can enable controllers for the run
/// cgroups (cgroup v2's no-internal-processes rule).
pub(crate) const SUPERVISOR_LEAF: &str = "supervisor";

#[derive(Debug, thiserror::Error)]
pub(crate) enum DelegateError {
    #[error(
        "no systemd user bus at {path} (no user manager runs for uid {uid}: `loginctl enable-linger` starts one, \
         `systemctl --user status` checks it)"
    )]
    NoBus { path: PathBuf, uid: u32 },
    #[error("cannot connect to the user bus at {path}")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("D-Bus {what}")]
    Bus { what: &'static str, source: Box<zbus::Error> },
    #[error("systemd refused to start {unit}")]
    Start { unit: String, source: Box<zbus::Error> },
    #[error("systemd's job starting {unit} ended \"{result}\", not \"done\"")]
    Job { unit: String, result: String },
    #[error("systemd did not finish starting {unit} within {} s", TIMEOUT.as_secs())]
    Timeout { unit: String },
    #[error("after {unit} started this process is in cgroup {found}, not in the scope")]
    NotMoved { unit: String, found: String },
    #[error("the helper that asks systemd could not start")]
    Helper { source: std::io::Error },
    #[error("{message}")]
    Asked { message: String },
    #[error("moving the supervisor into {path}")]
    Leaf { path: PathBuf, source: std::io::Error },
}

/// The scope systemd gave this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The unit name, `jail-run-<pid>-<n>.scope`.
    pub unit: String,
    /// The scope's cgroup (as in /proc/self/cgroup), the run cgroups' parent.
    pub cgroup: PathBuf,
}

/// The scope, once got: every later run of this process reuses it.
static SCOPE: Mutex<Option<Scope>> = Mutex::new(None);

/// The unit name for this process's scope. Pure.
pub(crate) fn unit_name(pid: u32, nonce: u32) -> String {
    format!("jail-run-{pid}-{nonce}.scope")
}

/// The properties of the transient scope: the supervisor in it, its
/// cgroup delegated, and collected whether it ends well or not. Pure.
pub fn properties(pid: u32) -> Vec<(&'static str, Value<'static>)> {
    vec![
        ("Description", Value::from(format!("jail supervisor {pid} and its runs"))),
        ("PIDs", Value::from(vec![pid])),
        ("Delegate", Value::from(true)),
        ("CollectMode", Value::from("inactive-or-failed")),
    ]
}

/// The body of `StartTransientUnit(name, mode, properties, aux)`,
/// signature `ssa(sv)a(sa(sv))`. Mode "fail": never replace another job.
type StartBody = (String, &'static str, Vec<(&'static str, Value<'static>)>, Vec<(String, Vec<(String, Value<'static>)>)>);

pub(crate) fn start_body(unit: &str, pid: u32) -> StartBody {
    (unit.to_string(), "fail", properties(pid), Vec::new())
}

/// The user bus of `uid`, where systemd's user manager puts it. The library
/// reads no environment variable: `$XDG_RUNTIME_DIR` is `/run/user/<uid>`
/// wherever pam_systemd set it up.
pub fn bus_path(uid: u32) -> PathBuf {
    PathBuf::from(format!("/run/user/{uid}/bus"))
}

/// Whether cgroup v2 offers any of the run's controllers at its root: on a
/// hybrid host they are bound to v1 and a v2 scope would not help.
fn v2_has_controllers() -> bool {
    let layout = cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let Some((mount, _)) = layout.unified else { return false };
    let text = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
    text.split_whitespace().any(|c| cgroup::V2_CONTROLLERS.contains(&c))
}

/// Whether a run here could ask for a scope, without asking (for doctor):
/// the bus it would use, or why it would not try.
pub(crate) fn availability() -> Result<PathBuf, String> {
    let uid = nix::unistd::getuid().as_raw();
    let path = bus_path(uid);
    if !v2_has_controllers() {
        return Err("cgroup v2 offers no memory, pids or cpu controller on this host".into());
    }
    if !path.exists() {
        return Err(DelegateError::NoBus { path, uid }.to_string());
    }
    Ok(path)
}

/// Ask systemd for a delegated scope holding this process and move into
/// its leaf. Blocking, bounded by [`TIMEOUT`].
///
/// The D-Bus exchange runs in a forked helper: zbus starts threads, and the
/// supervisor must stay single-threaded until it clones the run's child.
/// The helper asks for the scope with the supervisor's pid in it, waits for
/// the job, reports one line through a pipe and exits.
pub(crate) fn obtain() -> Result<Scope, DelegateError> {
    let uid = nix::unistd::getuid().as_raw();
    let path = bus_path(uid);
    if !path.exists() {
        return Err(DelegateError::NoBus { path, uid });
    }
    let supervisor = std::process::id();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let unit = unit_name(supervisor, nonce);
    let helper = |source: std::io::Error| DelegateError::Helper { source };
    let (rx, tx) = nix::unistd::pipe().map_err(|e| helper(e.into()))?;
    match sys::fork_process().map_err(helper)? {
        Forked::Child => {
            drop(rx);
            let line = match ask(&path, &unit, supervisor) {
                Ok(()) => "ok".to_string(),
                Err(e) => {
                    let cause = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
                    format!("{e}{cause}")
                }
            };
            let _ = nix::unistd::write(&tx, line.as_bytes());
            sys::exit_now(0)
        }
        Forked::Parent(pid) => {
            drop(tx);
            let answer = read_answer(&rx, TIMEOUT + Duration::from_secs(2));
            // The helper is done or is stopped now; either way it is reaped.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
            match answer {
                Some(a) if a == "ok" => enter_leaf(&unit),
                Some(a) if !a.is_empty() => Err(DelegateError::Asked { message: a }),
                _ => Err(DelegateError::Timeout { unit }),
            }
        }
    }
}

/// The helper's one line, at most 4 KiB, within `limit`.
fn read_answer(rx: &OwnedFd, limit: Duration) -> Option<String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = std::time::Instant::now() + limit;
    let mut buf = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        let mut fds = [PollFd::new(rx.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
            Ok(_) => {}
        }
        let mut chunk = [0u8; 1024];
        match nix::unistd::read(rx.as_raw_fd(), &mut chunk) {
            Ok(0) => return Some(String::from_utf8_lossy(&buf).into_owned()),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                buf.truncate(4096);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// The helper's side: StartTransientUnit for a scope holding `pid`, then
/// the job's JobRemoved.
fn ask(path: &Path, unit: &str, pid: u32) -> Result<(), DelegateError> {
    // A socket nobody listens on fails here, plainly.
    UnixStream::connect(path).map_err(|source| DelegateError::Connect { path: path.to_path_buf(), source })?;
    let bus = |what| move |source| DelegateError::Bus { what, source: Box::new(source) };
    let conn = zbus::blocking::connection::Builder::address(format!("unix:path={}", path.display()).as_str())
        .map_err(bus("user bus address"))?
        .method_timeout(TIMEOUT)
        .build()
        .map_err(bus("connection to the user bus"))?;
    let proxy = zbus::blocking::Proxy::new(&conn, DESTINATION, PATH, INTERFACE).map_err(bus("proxy for systemd"))?;
    // Subscribe before asking, so the job's end cannot be missed.
    let signals = proxy.receive_signal("JobRemoved").map_err(bus("match for JobRemoved"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for msg in signals {
            let Ok((_, job, unit, result)) = msg.body().deserialize::<(u32, OwnedObjectPath, String, String)>() else {
                continue;
            };
            if tx.send((job, unit, result)).is_err() {
                return;
            }
        }
    });
    let started: Result<OwnedObjectPath, _> = proxy.call("StartTransientUnit", &start_body(unit, pid));
    match started {
        Err(source) => Err(DelegateError::Start { unit: unit.to_string(), source: Box::new(source) }),
        Ok(job) => wait_for(&rx, &job, unit),
    }
}

fn wait_for(
    rx: &mpsc::Receiver<(OwnedObjectPath, String, String)>,
    job: &OwnedObjectPath,
    unit: &str,
) -> Result<(), DelegateError> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((j, _, result)) if j == *job => {
                return if result == "done" {
                    Ok(())
                } else {
                    Err(DelegateError::Job { unit: unit.to_string(), result })
                };
            }
            Ok(_) => continue,
            Err(_) => return Err(DelegateError::Timeout { unit: unit.to_string() }),
        }
    }
}

/// Check that systemd moved us into the scope, then move into its leaf.
fn enter_leaf(unit: &str) -> Result<Scope, DelegateError> {
    let me = cgroup::parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
    let layout = cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let found = me.unified.unwrap_or_default();
    let (Some((mount, root)), true) = (layout.unified, found.file_name().is_some_and(|n| n == unit)) else {
        return Err(DelegateError::NotMoved { unit: unit.to_string(), found: found.display().to_string() });
    };
    let rel = found.strip_prefix(&root).unwrap_or(&found);
    let leaf = mount.join(rel.strip_prefix("/").unwrap_or(rel)).join(SUPERVISOR_LEAF);
    let moved = std::fs::create_dir(&leaf)
        .or_else(|e| if e.kind() == std::io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) })
        .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()));
    moved.map_err(|source| DelegateError::Leaf { path: leaf, source })?;
    Ok(Scope { unit: unit.to_string(), cgroup: found })
}

/// When the host gave no cgroup and delegation is on, get (or reuse) a
/// systemd scope and choose again beneath it. The reason it was not tried,
/// or failed, joins the choice's notes: the fallback is never silent.
pub(crate) fn fill_in(choice: Choice, enabled: bool, explicit_parent: bool, wanted: &Settings) -> (Choice, Option<Scope>) {
    if choice.candidate.is_some() || explicit_parent {
        return (choice, None);
    }
    let mut choice = choice;
    if !enabled {
        choice
            .notes
            .push("systemd delegation is off (limits.systemd_delegation \"off\" or --no-systemd-delegation)".into());
        return (choice, None);
    }
    let mut held = SCOPE.lock().unwrap_or_else(|e| e.into_inner());
    let scope = match held.clone() {
        Some(s) => s,
        None if !v2_has_controllers() => {
            choice
                .notes
                .push("systemd delegation: cgroup v2 offers no memory, pids or cpu controller on this host".into());
            return (choice, None);
        }
        None => match obtain() {
            Ok(s) => {
                *held = Some(s.clone());
                s
            }
            Err(e) => {
                let cause = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
                choice.notes.push(format!("systemd delegation: {e}{cause}"));
                return (choice, None);
            }
        },
    };
    let (_, again) = cgroup::choose_here(Some(&scope.cgroup), wanted);
    match again.candidate {
        Some(_) => (again, Some(scope)),
        None => {
            choice.notes.push(format!("systemd scope {}: {}", scope.unit, again.notes.join("; ")));
            (choice, None)
        }
    }
}

/// Say in every limit the run cgroup enforces that the cgroup lies in a
/// scope systemd delegated.
pub(crate) fn annotate(plan: &mut limits::Plan, scope: &Scope) {
    for r in plan.reports.values_mut().filter(|r| r.enforced_by.starts_with("cgroup_")) {
        let words = format!(
            "beneath systemd scope {} ({}), delegated by the user manager (StartTransientUnit, Delegate=yes)",
            scope.unit,
            scope.cgroup.display()
        );
        r.detail = Some(match r.detail.take() {
            Some(d) => format!("{d}; {words}"),
            None => words,
        });
    }
}

/// The scope this process holds, if any (for doctor and tests).
pub fn current() -> Option<Scope> {
    SCOPE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Whether `path` names a jail scope's cgroup (what `unit_name` makes).
#[cfg(test)]
fn is_scope_cgroup(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("jail-run-") && n.ends_with(".scope"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_message_asks_for_a_delegated_scope_holding_the_supervisor() {
        let unit = unit_name(4242, 7);
        assert_eq!(unit, "jail-run-4242-7.scope");
        assert!(is_scope_cgroup(Path::new("/user.slice/user-1000.slice/user@1000.service/app.slice/jail-run-4242-7.scope")));
        let msg = zbus::Message::method_call(PATH, "StartTransientUnit")
            .unwrap()
            .destination(DESTINATION)
            .unwrap()
            .interface(INTERFACE)
            .unwrap()
            .build(&start_body(&unit, 4242))
            .unwrap();
        let body = msg.body();
        // zvariant shows the body (the arguments, ssa(sv)a(sa(sv))) as one struct.
        assert_eq!(msg.header().signature().to_string(), "(ssa(sv)a(sa(sv)))");
        type Props = Vec<(String, zbus::zvariant::OwnedValue)>;
        let (name, mode, props, aux): (String, String, Props, Vec<(String, Props)>) = body.deserialize().unwrap();
        assert_eq!((name.as_str(), mode.as_str()), ("jail-run-4242-7.scope", "fail"));
        assert!(aux.is_empty());
        let get = |k: &str| props.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(Vec::<u32>::try_from(get("PIDs")).unwrap(), vec![4242]);
        assert!(bool::try_from(get("Delegate")).unwrap());
        assert_eq!(String::try_from(get("CollectMode")).unwrap(), "inactive-or-failed");
        assert_eq!(msg.header().member().unwrap().as_str(), "StartTransientUnit");
    }

    #[test]
    fn off_or_an_explicit_parent_or_a_cgroup_already_there_asks_nothing() {
        let none = Choice { candidate: None, notes: vec!["cgroup v2: x".into()] };
        let (c, s) = fill_in(none.clone(), false, false, &Settings::default());
        assert!(s.is_none());
        assert!(c.notes.iter().any(|n| n.contains("systemd delegation is off")), "{:?}", c.notes);
        let (c, s) = fill_in(none.clone(), true, true, &Settings::default());
        assert!(s.is_none());
        assert_eq!(c, none, "an explicit --cgroup-parent is not second-guessed");
    }

    #[test]
    fn the_bus_is_where_the_user_manager_puts_it() {
        assert_eq!(bus_path(1000), PathBuf::from("/run/user/1000/bus"));
    }

    #[test]
    fn limits_the_scope_enforces_say_so() {
        let policy = crate::policy::Policy::builtin_default().unwrap();
        let cand = cgroup::Candidate {
            version: cgroup::Version::V2,
            parents: vec![cgroup::Parent { dir: "/x".into(), controllers: vec!["memory".into(), "pids".into()] }],
        };
        let mut plan = limits::plan(&policy, Duration::from_secs(5), Some(&cand), "", &|_| u64::MAX);
        let scope = Scope { unit: "jail-run-1-2.scope".into(), cgroup: "/a/jail-run-1-2.scope".into() };
        annotate(&mut plan, &scope);
        let mem = &plan.reports["memory"];
        assert_eq!(mem.enforced_by, "cgroup_v2");
        assert!(mem.detail.as_deref().unwrap().contains("systemd scope jail-run-1-2.scope"), "{mem:?}");
        for r in plan.reports.values().filter(|r| !r.enforced_by.starts_with("cgroup_")) {
            assert!(!r.detail.as_deref().unwrap_or("").contains("systemd scope"), "{r:?}");
        }
    }
}
