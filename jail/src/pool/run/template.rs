//! The pool's template (template.rs): with a policy whose `preload` is not
//! empty, the pool starts one `jail template` before its first jail, and
//! every jail it makes is a fork of it (`jail session start --template`)
//! instead of a jail of its own importing the preload again. A pool whose
//! template cannot be made says why once, on stderr, and makes its jails
//! as before.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::{Config, Renew};
use crate::client::command::{template_command, TemplateSpec};

/// How long the template may take to import the preload.
const READY_WAIT: Duration = Duration::from_secs(120);

/// A running template: where it listens, and what it has done.
pub(super) struct Template {
    child: Mutex<Child>,
    pub(super) socket: PathBuf,
    forks: AtomicU64,
    /// When it was made, or last kept past its renewal.
    born: Mutex<Instant>,
}

impl Template {
    /// One more jail forked from it.
    pub(super) fn forked(&self) {
        self.forks.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether a new template should replace it: it is due, or it ended
    /// (killed, or out of memory), when no fork of it can be made.
    pub(super) fn due(&self, renew: Renew) -> bool {
        self.forks.load(Ordering::SeqCst) >= renew.forks
            || self.born.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= renew.age
            || self.ended()
    }

    /// Whether the template has ended.
    pub(super) fn ended(&self) -> bool {
        !matches!(self.child.lock().unwrap_or_else(|e| e.into_inner()).try_wait(), Ok(None))
    }

    /// A new one could not be made: this one counts again from now.
    pub(super) fn renewed_anyway(&self) {
        self.forks.store(0, Ordering::SeqCst);
        *self.born.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
}

/// Start a template for `cfg` in `work`, holding `lifeline`; why not.
pub(super) fn start(cfg: &Config, work: &Path, lifeline: &OwnedFd) -> Result<Template, String> {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let socket = work.join(format!("template-{}.sock", MADE.fetch_add(1, Ordering::SeqCst)));
    let spec = TemplateSpec {
        jail: cfg.jail_exe.clone(),
        more: cfg.start_args.clone(),
        socket: socket.clone(),
        lifeline: Some(lifeline.as_raw_fd()),
    };
    let mut child = template_command(&spec).spawn().map_err(|e| format!("run {}: {e}", cfg.jail_exe.display()))?;
    let why = match wait_ready(&mut child) {
        Ok(()) => {
            return Ok(Template {
                child: Mutex::new(child),
                socket,
                forks: AtomicU64::new(0),
                born: Mutex::new(Instant::now()),
            });
        }
        Err(why) => why,
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let mut err = String::new();
    if let Some(e) = child.stderr.take() {
        let _ = e.take(64 << 10).read_to_string(&mut err);
    }
    let line = err.lines().last().unwrap_or("").trim_start_matches("jail: ").trim().to_string();
    Err(if line.is_empty() { why } else { line })
}

/// Read the template's stdout until its `ready` line.
fn wait_ready(child: &mut Child) -> Result<(), String> {
    let Some(out) = child.stdout.as_mut() else { return Err("no stdout".into()) };
    let until = Instant::now() + READY_WAIT;
    let mut said = Vec::new();
    while !said.starts_with(b"ready\n") {
        if said.len() > 4096 || !readable(out, until) {
            return Err("the template was not ready in time".into());
        }
        let mut buf = [0u8; 256];
        match out.read(&mut buf) {
            Ok(0) | Err(_) => return Err("the template ended".into()),
            Ok(n) => said.extend_from_slice(&buf[..n]),
        }
    }
    Ok(())
}

fn readable(out: &ChildStdout, until: Instant) -> bool {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as u64).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) if left.is_zero() => return false,
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => return true,
            Err(_) => return false,
        }
    }
}

impl Drop for Template {
    /// The template and every fork of it end: SIGTERM (it kills its tree
    /// and removes its cgroup), then the wait.
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Ok(None) = child.try_wait() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let _ = child.wait();
    }
}
