//! `jail template`: a pool's template's own jail and its supervisor
//! (template.rs has what a template is and how a fork is made).
//!
//! Run by `jail pool` as its child (hidden from `--help`), with the
//! pool's run options: it makes a jail for the policy whose interpreter
//! runs template.py (the preload imported, then forks on request), binds
//! a `SOCK_SEQPACKET` socket at `--socket` (0600, in a folder only the
//! caller's uid reaches), prints `ready` on stdout once the template is,
//! and hands each connection to the template over the control channel.
//! It ends, the template and every fork of it with it, when its lifeline
//! hangs up (`--lifeline-fd`, as a pooled session's), on SIGTERM, SIGINT
//! or SIGHUP, or when the template ends; a janitor removes its socket,
//! its folder and its cgroup should it be killed.
//!
//! Where no template can be made equal to a cloned jail, it says why in
//! one line on stderr and exits 125 before making anything: no
//! `libjail.so` beside the `jail` binary (this crate's cdylib, which the
//! template loads), or one the template's uid cannot read.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::PollFlags;
use nix::sys::signal::Signal;
use nix::sys::socket::{accept4, bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};

use crate::request::{RunRequest, StepKind};
use crate::step::Ending;
use crate::streams::OutputMode;
use crate::sync::Report;
use crate::watch::{Loop, PollSet, Started, Watched};

/// The template's source.
const TEMPLATE: &str = include_str!("template.py");

/// How long a template lives at most: as long as its pool, which ends it.
const LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The library a template loads: this crate's cdylib, beside the binary.
pub const LIBRARY: &str = "libjail.so";

/// What `jail template` is given besides the run options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to listen.
    pub socket: PathBuf,
    /// The read end of the owner's lifeline (as `jail session start
    /// --lifeline-fd`).
    pub lifeline: Option<RawFd>,
}

/// Why no template was made.
#[derive(Debug, thiserror::Error)]
pub enum TemplateStartError {
    #[error("no template: {0}")]
    Unavailable(String),
    #[error("the template's folder {0}: {1}")]
    Folder(PathBuf, #[source] std::io::Error),
    #[error("listen at {0}: {1}")]
    Listen(PathBuf, #[source] std::io::Error),
}

/// The cdylib beside `exe` (the `jail` binary), or why there is none.
pub fn library(exe: &Path) -> Result<PathBuf, String> {
    let lib = exe.parent().map(|d| d.join(LIBRARY)).ok_or("the jail binary has no folder")?;
    match std::fs::metadata(&lib) {
        Ok(m) if m.is_file() => Ok(lib),
        _ => Err(format!(
            "there is no {LIBRARY} beside {} (the jail crate's cdylib, which a template loads: `cargo build -p jail` makes it)",
            exe.display()
        )),
    }
}

/// Make the template for `req` (its policy's preload) and serve it; the
/// exit code.
pub fn run(mut req: RunRequest, opts: &Options) -> Result<i32, TemplateStartError> {
    let exe = std::env::current_exe().map_err(|e| TemplateStartError::Unavailable(format!("find the jail binary: {e}")))?;
    let lib = library(&exe).map_err(TemplateStartError::Unavailable)?;
    let lib = std::fs::canonicalize(&lib).map_err(|e| TemplateStartError::Unavailable(format!("{}: {e}", lib.display())))?;
    // Beside the socket: in the pool's own folder, which its janitor
    // removes whatever happens to us.
    let beside = opts.socket.parent().unwrap_or(Path::new("/")).to_path_buf();
    let dir = tempfile::Builder::new()
        .prefix("jail-template-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .tempdir_in(&beside)
        .map_err(|e| TemplateStartError::Folder(beside.clone(), e))?;
    for (name, text) in [
        ("template.py", TEMPLATE),
        (crate::mounts::DRIVER_NAME, crate::session::DRIVER),
    ] {
        let path = dir.path().join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| TemplateStartError::Folder(path, e))?;
    }
    // A copy in the template's own code folder: loaded from there, every
    // fork's /proc/self/maps names `/workspace/code/libjail.so`, not where
    // the jail binary lies on the host.
    let copy = dir.path().join(LIBRARY);
    std::fs::copy(&lib, &copy)
        .and_then(|_| std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o644)))
        .map_err(|e| TemplateStartError::Folder(copy.clone(), e))?;
    let listener = listen_at(&opts.socket).map_err(|e| TemplateStartError::Listen(opts.socket.clone(), e))?;
    let lifeline = opts.lifeline.and_then(crate::sys::take_inherited_fd);
    let janitor = {
        let (socket, folder) = (opts.socket.clone(), dir.path().to_path_buf());
        crate::janitor::fork(move |told| {
            let _ = std::fs::remove_file(&socket);
            let _ = std::fs::remove_dir_all(&folder);
            crate::janitor::remove_told_cgroups(told);
        })
        .map_err(|e| TemplateStartError::Unavailable(format!("fork the template's janitor: {e}")))?
    };
    let modules = serde_json::Value::from(req.policy.preload.clone()).to_string();
    req.step = StepKind::Template;
    req.script = dir.path().join("template.py");
    req.code = Some(dir.path().to_path_buf());
    req.args = vec![
        Path::new(crate::mounts::CODE_DIR).join(LIBRARY).display().to_string(),
        Path::new(crate::mounts::CODE_DIR).join(crate::mounts::DRIVER_NAME).display().to_string(),
        modules,
        Path::new(crate::mounts::DRIVER_DIR).join(crate::mounts::DRIVER_NAME).display().to_string(),
    ];
    req.timeout = Some(LIFETIME);
    req.mode = OutputMode::Capture;
    req.input = None;
    let mut lp = Template {
        listener,
        lifeline,
        janitor: Some(janitor),
        control: None,
        said: Vec::new(),
        ready: false,
    };
    let result = crate::supervisor::run_with(&req, &mut lp);
    let _ = std::fs::remove_file(&opts.socket);
    drop(dir);
    if lp.ready {
        return Ok(0);
    }
    // It never became ready: why, in one line.
    let said = String::from_utf8_lossy(&lp.said);
    let why = match (&result.setup_error, said.lines().find_map(|l| l.strip_prefix("error "))) {
        (Some(e), _) => format!("{}: {}", e.stage, e.message),
        (None, Some(line)) => line.to_string(),
        (None, None) => {
            let tail: String = result.stderr.text.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
            format!("the template ended before it was ready ({:?}): {tail}", result.status)
        }
    };
    Err(TemplateStartError::Unavailable(why))
}

/// A `SOCK_SEQPACKET` socket listening at `path`, 0600.
fn listen_at(path: &Path) -> std::io::Result<OwnedFd> {
    let sock = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = bind(sock.as_raw_fd(), &UnixAddr::new(path)?);
    nix::sys::stat::umask(old);
    bound?;
    listen(&sock, Backlog::new(128).unwrap_or(Backlog::MAXCONN))?;
    Ok(sock)
}

const CONTROL: u32 = 0;
const LIFELINE: u32 = 1;
const LISTENER: u32 = 2;

/// The template's loop: its word on the control channel, its lifeline,
/// and the connections it is handed.
struct Template {
    listener: OwnedFd,
    lifeline: Option<OwnedFd>,
    janitor: Option<OwnedFd>,
    control: Option<OwnedFd>,
    /// What the template said (`ready`, or `error ...`), bounded.
    said: Vec<u8>,
    ready: bool,
}

impl Template {
    fn read_control(&mut self, w: &mut Watched<'_>) {
        let Some(fd) = &self.control else { return };
        let mut buf = [0u8; 1024];
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) | Err(_) => {
                // The template is gone or broke its channel: so is it all.
                self.control = None;
                w.tree.kill();
            }
            Ok(n) => {
                if self.said.len() < 64 << 10 {
                    self.said.extend_from_slice(&buf[..n]);
                }
                if !self.ready && self.said.starts_with(b"ready\n") {
                    self.ready = true;
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(b"ready\n").and_then(|()| out.flush());
                } else if self.said.starts_with(b"error ") {
                    w.tree.kill();
                }
            }
        }
    }

    /// Hand one connection to the template; one it cannot take is closed.
    fn accept(&mut self) {
        let Ok(conn) = accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) else { return };
        let Some(conn) = crate::sys::take_inherited_fd(conn) else { return };
        if let Some(control) = &self.control {
            let _ = crate::sys::send_fd(control.as_fd(), conn.as_fd());
        }
    }
}

impl Loop for Template {
    fn started(&mut self, s: Started<'_>) {
        self.control = s.control;
        if let Some(j) = &self.janitor {
            crate::janitor::tell_cgroups(j, &s.cgroup_dirs);
        }
    }

    fn add_fds<'a>(&'a self, set: &mut PollSet<'a>) {
        if let Some(fd) = &self.control {
            set.add(fd.as_fd(), PollFlags::POLLIN, CONTROL);
        }
        if let Some(fd) = &self.lifeline {
            set.add(fd.as_fd(), PollFlags::POLLIN, LIFELINE);
        }
        if self.ready {
            set.add(self.listener.as_fd(), PollFlags::POLLIN, LISTENER);
        }
    }

    fn on_ready(&mut self, slot: u32, _flags: PollFlags, w: &mut Watched<'_>) {
        match slot {
            CONTROL => self.read_control(w),
            LISTENER => self.accept(),
            // The owner is gone: so is the template.
            _ => {
                self.lifeline = None;
                w.tree.kill();
            }
        }
    }

    fn wake(&self) -> Option<Instant> {
        None
    }

    fn tick(&mut self, _now: Instant, _w: &mut Watched<'_>) {}

    fn cancelled(&mut self, _sig: Signal, w: &mut Watched<'_>) {
        w.tree.kill();
    }

    fn at_death(&mut self, _reports: &[Report], w: &mut Watched<'_>) -> Ending {
        if w.tree.killed() {
            Ending::Cancelled(Signal::SIGTERM)
        } else {
            Ending::Exited
        }
    }
}
