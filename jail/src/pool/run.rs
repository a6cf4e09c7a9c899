//! The pool itself: jails made ahead as `jail session` children with the
//! preload imported, each claimed by one request and destroyed after it,
//! or handed out whole as a session (handout.rs), a replacement made in the
//! background; a request in flight can be cancelled (cancel.rs). The
//! protocol is in pool.rs.
//!
//! A pooled jail is a session started by this pool (`jail session start`,
//! run as a child process so no thread forks): the same namespaces, mounts,
//! seccomp, landlock and limits as `jail run`, for its whole life. Its
//! first cell is the trusted preload; a request then gets two cells at
//! most (its `sys.argv`, set by us, then its code), and the session is
//! stopped: the closing result's verdict (artifacts and refusals) is the
//! step's. No jail ever takes a second request; its replacement is
//! started when the step is done, so that it never competes with a step
//! for the CPUs.
//!
//! Folders: each jail is started with its own empty input folder (bound
//! read-only at /workspace/input) and a fresh output folder. A request's
//! `input` is copied into that input folder when the jail is claimed, by
//! the acceptor every door uses (accept.rs: opened when the request is
//! checked, copied from that descriptor, links copied as links and never
//! followed, modes kept, anything refused failing the request by name; the
//! jail sees the copy read-only); its output folder is the jail's, renamed
//! to the request's `output` (its parent opened then, without following a
//! link) when one is named, else named in the reply's `output_dir`.

mod cancel;
mod handout;
mod refills;
mod template;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::footprint;
use super::memory::{self, PerJail};
use crate::accept;
use crate::client::command::StartSpec;
use crate::client::lines::{self, Lines};
use crate::client::pool::{self as wire, Body, Ceilings, ErrorCode, Line, Reply, Request, Source};
use crate::client::session;
use crate::result::{RunResult, Status};

/// A script named by path is read up to the session's cell size.
const MAX_SCRIPT: u64 = session::MAX_CELL as u64;
/// A request's input is the caller's own folder: bounded by entries (a
/// walk's time), its bytes by the caller's own disk.
const INPUT_BOUNDS: accept::Bounds = accept::Bounds { bytes: u64::MAX, entries: 1_000_000 };
/// Replacement jails that fail in a row before the pool gives up.
const MAX_FAILURES: u32 = 3;
/// The most jails a pool keeps, whatever the memory holds.
pub const MAX_SIZE: usize = 64;

/// What `jail pool` was started with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Jails kept made ahead (ready or being made).
    pub size: usize,
    /// The `jail` binary, to run `jail session start` and its options.
    pub jail_exe: PathBuf,
    /// `jail session start`'s options (policy, rootfs, limits), less
    /// `--input`, `--output` and `--json`, which the pool sets.
    pub start_args: Vec<OsString>,
    pub ceilings: Ceilings,
    /// The caller's temp dir: the pool's work dir and the step outputs.
    pub temp_dir: PathBuf,
    /// When the pool runs as root and the policy binds each jail's output
    /// folder (`output_size: "unlimited"`): the host gid every root-started
    /// jail shares (`identity.root_host_gid`), given that folder. `None`
    /// otherwise: a capped output is copied back as the caller, and a pool
    /// without CAP_CHOWN (a pod's root) could not hand it over anyway.
    pub sandbox_gid: Option<u32>,
    /// Each jail's memory limit (`limits.memory` or `--memory`); `None`:
    /// unlimited, and the pool is bounded by the first jail's idle cost.
    pub memory_limit: Option<u64>,
    /// Whether each jail's output is a size-capped tmpfs (the policy's
    /// `filesystem.output_size`): only then can it be handed out as a
    /// session with the caller's output folder (session/adopt.rs).
    pub output_capped: bool,
    /// What each jail may read of the host (accept.rs): what a request's
    /// script and input are judged by.
    pub reach: accept::Reach,
    /// Whether the policy has a `preload`: then the pool's jails are
    /// forks of one template that imported it (template.rs).
    pub preload: bool,
    /// When a template is replaced by a new one.
    pub renew_template: Renew,
}

/// When the pool makes a new template: after `forks` jails forked from the
/// current one, or once it is `age` old, whichever comes first. Its forks
/// share its address-space layout (template.rs); a new template is a new
/// layout. A data-stack template takes 0.6-0.7 s of CPU to make
/// (scripts/experiments/fork_confined.py, quiet: 0.65 s; under load twice
/// that), so every 1,000 jails costs 0.65 ms a jail, and every 10 minutes
/// of an idle pool 0.65 s.
#[derive(Debug, Clone, Copy)]
pub struct Renew {
    pub forks: u64,
    pub age: std::time::Duration,
}

/// `--template-forks`' default.
pub const TEMPLATE_FORKS: u64 = 1000;
/// `--template-secs`' default.
pub const TEMPLATE_SECS: u64 = 600;

/// One made jail, not yet claimed.
struct Jail {
    handle: PathBuf,
    /// The session's id, as `jail session start` printed it.
    id: String,
    supervisor: u32,
    /// Its PID 1, as its start said: a template's fork is not the
    /// supervisor's descendant (footprint.rs).
    pid1: Option<u32>,
    /// The template it is a fork of, held while it lives: a template is
    /// ended only once no jail forked from it is left.
    _template: Option<Arc<template::Template>>,
    /// The slot folder (its `in` is bound at /workspace/input).
    slot: PathBuf,
    /// The jail's output folder (in the slot), handed to the request.
    out: PathBuf,
}

impl Jail {
    fn input(&self) -> PathBuf {
        self.slot.join("in")
    }

    /// Whether its session supervisor is still there (its socket too: the
    /// supervisor removes it as it ends).
    fn alive(&self) -> bool {
        let pid = nix::unistd::Pid::from_raw(self.supervisor as i32);
        nix::sys::signal::kill(pid, None).is_ok() && self.handle.exists()
    }

    /// Stop the session (nothing of it is wanted) and remove its folders.
    fn destroy(self) {
        let _ = session::stop(&self.handle);
        let _ = fs::remove_dir_all(&self.slot);
    }
}

#[derive(Default)]
struct State {
    ready: VecDeque<Jail>,
    making: usize,
    in_use: usize,
    /// Requests in `claim`, waiting for a jail: while draining, jails are
    /// made for them alone (`State::wanted`).
    waiting: usize,
    /// Requests in flight (checked, waiting for a jail, or running), by id.
    inflight: HashMap<String, Arc<cancel::Flight>>,
    draining: bool,
    /// Set when jails cannot be made: waiting requests get it as an error.
    broken: Option<String>,
    failures: u32,
    /// How long each jail took to be made ready (`stats`' `refill_ms`).
    refills: refills::Refills,
    idle_rss_bytes: u64,
    /// Jails handed out as sessions and not ended yet: their supervisor's
    /// pid and handle (handout.rs).
    sessions: std::collections::HashMap<u32, PathBuf>,
}

struct Pool {
    cfg: Config,
    work: PathBuf,
    /// The read end every session holds; the write end is ours alone
    /// (close-on-exec), so the sessions end when this process does.
    lifeline_read: OwnedFd,
    _lifeline_write: OwnedFd,
    /// The janitor removes `work` when this closes, however we end.
    _janitor: OwnedFd,
    /// The template every jail is forked from, when the policy has a
    /// preload and one could be made (template.rs).
    template: Mutex<Option<Arc<template::Template>>>,
    /// A new template is being made (only one at a time).
    renewing: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
    out: Mutex<io::Stdout>,
}

/// The pool could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("make the pool's work dir in {0}: {1}: set TMPDIR to a writable folder")]
    WorkDir(PathBuf, #[source] io::Error),
    #[error("fork the pool's janitor: {0}")]
    Janitor(#[source] io::Error),
    #[error("make the pool's lifeline pipe: {0}")]
    Pipe(#[source] io::Error),
    #[error("block SIGTERM for the pool's signal thread: {0}")]
    Signals(#[source] nix::Error),
    #[error("the first pooled jail failed: {0}")]
    FirstJail(String),
    /// More jails than the memory available holds (memory.rs).
    #[error(transparent)]
    Memory(#[from] memory::TooMany),
}

/// Run the pool until stdin ends or SIGTERM; returns the exit code.
pub fn run(cfg: Config) -> Result<i32, StartError> {
    // Bounded by memory before anything is made, when each jail's cost is
    // its limit; else once the first jail's idle cost is known (below).
    let available = memory::available_here();
    match (&available, cfg.memory_limit) {
        (Some(a), Some(limit)) => memory::fits(cfg.size, PerJail::Limit(limit), a)?,
        (Some(_), None) => {}
        (None, _) => eprintln!(
            "jail pool: neither /proc/meminfo nor the pool's cgroup could be read: the pool's size is not bounded by memory"
        ),
    }
    let work = tempfile::Builder::new()
        .prefix("jail-pool-")
        .tempdir_in(&cfg.temp_dir)
        .map_err(|e| StartError::WorkDir(cfg.temp_dir.clone(), e))?
        .keep();
    if is_root() {
        // The sandbox uid a root-started jail runs as must reach its input.
        let _ = fs::set_permissions(&work, fs::Permissions::from_mode(0o711));
    }
    // Forked before any thread exists, and before the lifeline, which it
    // must not hold.
    let janitor = start_janitor(&work).map_err(StartError::Janitor)?;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| StartError::Pipe(e.into()))?;
    // SIGTERM and SIGINT go to the signal thread alone; every child gets
    // an empty mask back (`spawn_session`).
    let signals = drain_signals();
    signals.thread_block().map_err(StartError::Signals)?;
    let template = match cfg.preload {
        true => template::start(&cfg, &work, &read)
            .map_err(|why| {
                eprintln!("jail pool: each jail imports the preload itself, as no template could be made: {why}");
            })
            .ok(),
        false => None,
    };
    let pool = Arc::new(Pool {
        cfg,
        work,
        lifeline_read: read,
        _lifeline_write: write,
        _janitor: janitor,
        template: Mutex::new(template.map(Arc::new)),
        renewing: std::sync::atomic::AtomicBool::new(false),
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        out: Mutex::new(io::stdout()),
    });
    // The first jail is made before any request is read: a pool that
    // cannot make one says why and exits 125 (a missing preload module, a
    // bad limit), leaving nothing.
    let first = match pool.make().or_else(|e| pool.without_template(e)) {
        Ok(jail) => jail,
        Err(e) => {
            let _ = fs::remove_dir_all(&pool.work);
            return Err(StartError::FirstJail(e));
        }
    };
    if let (Some(a), None) = (&available, pool.cfg.memory_limit) {
        // No limit: what an idle jail holds is what each one costs.
        let idle = pool.lock().idle_rss_bytes;
        if let Err(e) = memory::fits(pool.cfg.size, PerJail::Idle(idle), a) {
            first.destroy();
            let _ = fs::remove_dir_all(&pool.work);
            return Err(e.into());
        }
    }
    pool.lock().ready.push_back(first);
    for _ in 1..pool.cfg.size {
        pool.refill();
    }
    {
        let p = Arc::clone(&pool);
        std::thread::spawn(move || {
            if signals.wait().is_ok() {
                p.drain();
            }
        });
    }
    {
        let p = Arc::clone(&pool);
        std::thread::spawn(move || p.read_requests());
    }
    pool.wait_drained();
    pool.shut_down();
    Ok(0)
}

/// Fork the janitor (janitor.rs): once the pool is gone, however it went,
/// it removes the work dir, so a SIGKILLed pool leaves no folder (its
/// sessions clean up after themselves: their lifeline).
fn start_janitor(work: &Path) -> io::Result<OwnedFd> {
    crate::janitor::fork(|_| {
        // The sessions' output folders are delivered into the work dir as
        // their sessions end; give them a moment.
        std::thread::sleep(Duration::from_millis(500));
        let _ = fs::remove_dir_all(work);
    })
}

fn drain_signals() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.add(nix::sys::signal::Signal::SIGINT);
    set
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

impl State {
    /// Whether one more jail is wanted: always, until the pool drains;
    /// then only for requests taken before it that wait for one (each
    /// taken request is answered), beyond the jails ready or being made.
    fn wanted(&self) -> bool {
        !self.draining || self.waiting > self.ready.len() + self.making
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn say(&self, reply: &Reply) {
        Pool::write_line(self.out.lock().unwrap_or_else(std::sync::PoisonError::into_inner), &reply.text());
    }

    fn write_line(mut out: std::sync::MutexGuard<'_, io::Stdout>, line: &str) {
        let _ = out.write_all(line.as_bytes());
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }

    fn drain(&self) {
        self.lock().draining = true;
        self.changed.notify_all();
    }

    /// Block until no request is in flight and no jail is being made,
    /// once draining.
    fn wait_drained(&self) {
        let mut st = self.lock();
        while !(st.draining && st.inflight.is_empty() && st.making == 0) {
            st = self.changed.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn shut_down(&self) {
        let ready: Vec<Jail> = self.lock().ready.drain(..).collect();
        for jail in ready {
            jail.destroy();
        }
        // The sessions handed out end with the pool: stopped, so what
        // passed reaches their output folders, before their slots go.
        let handed: Vec<PathBuf> = self.lock().sessions.values().cloned().collect();
        for handle in handed {
            let _ = session::stop(&handle);
        }
        // Its forks are gone: the template goes.
        drop(self.template.lock().unwrap_or_else(|e| e.into_inner()).take());
        let _ = fs::remove_dir_all(&self.work);
    }

    // ---- Making jails ----

    /// The template the next jail is forked from, counted; when the current
    /// one is due (`Renew`), this maker makes a new one first while the
    /// others go on forking from the old, which ends once its last jail
    /// does. A new one that cannot be made leaves the old one current, or,
    /// when the old one has ended, none (said once).
    fn template_now(&self) -> Option<Arc<template::Template>> {
        use std::sync::atomic::Ordering;
        loop {
            let current = self.template.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
            if current.due(self.cfg.renew_template) {
                if !self.renewing.swap(true, Ordering::SeqCst) {
                    return self.renew(current);
                }
                if current.ended() {
                    // Another maker is making its successor: wait for it
                    // rather than fail a fork of nothing (failures in a
                    // row break the pool). `renew` lets `renewing` go,
                    // then takes the state's lock to say so: seen set
                    // under that lock, its word comes after this wait.
                    let st = self.lock();
                    if self.renewing.load(Ordering::SeqCst) {
                        let _ = self.changed.wait_timeout(st, Duration::from_secs(1));
                    }
                    continue;
                }
            }
            current.forked();
            return Some(current);
        }
    }

    /// [`Self::template_now`] when `current` is due and this maker holds
    /// `renewing`, which it lets go.
    fn renew(&self, current: Arc<template::Template>) -> Option<Arc<template::Template>> {
        use std::sync::atomic::Ordering;
        let chosen = match template::start(&self.cfg, &self.work, &self.lifeline_read) {
            Ok(new) => {
                let new = Arc::new(new);
                let mut slot = self.template.lock().unwrap_or_else(|e| e.into_inner());
                // Not when the pool gave up on templates meanwhile.
                if slot.is_some() {
                    *slot = Some(Arc::clone(&new));
                    Some(new)
                } else {
                    None
                }
            }
            Err(why) if current.ended() => {
                // Nothing can fork from it: the jails import the preload
                // themselves from now on.
                self.give_up_template(Some(&current), &format!("the template ended and a new one could not be made: {why}"));
                None
            }
            Err(why) => {
                eprintln!("jail pool: the template is kept past its renewal, as a new one could not be made: {why}");
                current.renewed_anyway();
                Some(current)
            }
        };
        self.renewing.store(false, Ordering::SeqCst);
        // Makers waiting for this one (`template_now`) go on.
        drop(self.lock());
        self.changed.notify_all();
        let chosen = chosen?;
        chosen.forked();
        Some(chosen)
    }

    /// The first jail, forked from the template, failed with `why`: the
    /// template goes, said once, and the jail is made as without one
    /// (`why` again when there was no template).
    fn without_template(&self, why: String) -> Result<Jail, String> {
        if !self.give_up_template(None, &format!("the template's fork failed: {why}")) {
            return Err(why);
        }
        self.make()
    }

    /// The pool makes its jails without a template from now on, for
    /// `why`, said once: whether it took one (`only` that one, when
    /// given, and not a successor made meanwhile).
    fn give_up_template(&self, only: Option<&Arc<template::Template>>, why: &str) -> bool {
        let mut slot = self.template.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() || only.is_some_and(|t| !slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, t))) {
            return false;
        }
        drop(slot.take());
        eprintln!("jail pool: each jail imports the preload itself, as {why}");
        true
    }

    /// Make one jail in the background to take a claimed one's place.
    fn refill(self: &Arc<Self>) {
        {
            let mut st = self.lock();
            if st.broken.is_some() || !st.wanted() {
                return;
            }
            st.making += 1;
        }
        let p = Arc::clone(self);
        std::thread::spawn(move || {
            let made = p.make();
            let mut st = p.lock();
            st.making -= 1;
            match made {
                // Draining, and no request waits for it.
                Ok(jail) if st.draining && st.waiting <= st.ready.len() => {
                    drop(st);
                    jail.destroy();
                    p.changed.notify_all();
                    return;
                }
                Ok(jail) => {
                    st.failures = 0;
                    st.ready.push_back(jail);
                }
                Err(e) => {
                    st.failures += 1;
                    eprintln!("jail pool: a replacement jail failed ({} in a row): {e}", st.failures);
                    if st.failures >= MAX_FAILURES {
                        st.broken = Some(format!("{MAX_FAILURES} jails in a row failed to start, the last with: {e}"));
                    } else {
                        drop(st);
                        p.changed.notify_all();
                        std::thread::sleep(Duration::from_millis(200));
                        p.refill();
                        return;
                    }
                }
            }
            drop(st);
            p.changed.notify_all();
        });
    }

    /// Make a jail: its folders and its session (the preload run by its start).
    fn make(&self) -> Result<Jail, String> {
        let started = Instant::now();
        let slot = tempfile::Builder::new()
            .prefix("slot-")
            .tempdir_in(&self.work)
            .map_err(|e| format!("make a slot folder in {}: {e}", self.work.display()))?
            .keep();
        let out = slot.join("out");
        let mode = if is_root() { 0o755 } else { 0o700 };
        let made = (|| {
            if is_root() {
                fs::set_permissions(&slot, fs::Permissions::from_mode(0o711))
                    .map_err(|e| format!("chmod {}: {e}", slot.display()))?;
            }
            fs::DirBuilder::new().mode(0o700).create(&out).map_err(|e| format!("make {}: {e}", out.display()))?;
            if let Some(gid) = self.cfg.sandbox_gid {
                // As `jail run` hands its fresh output dir to a root-started
                // sandbox: bound, it is written by the sandbox's own uid.
                std::os::unix::fs::chown(&out, None, Some(gid))
                    .and_then(|()| fs::set_permissions(&out, fs::Permissions::from_mode(0o770)))
                    .map_err(|e| format!("hand {} to the sandbox's gid {gid}: {e}", out.display()))?;
            }
            let input = slot.join("in");
            fs::DirBuilder::new()
                .mode(mode)
                .create(&input)
                .map_err(|e| format!("make {}: {e}", input.display()))?;
            let template = self.template_now();
            let socket = template.as_ref().map(|t| t.socket.clone());
            let (handle, id, supervisor, pid1) = self.spawn_session(&input, &out, socket)?;
            Ok(Jail {
                handle,
                id,
                supervisor,
                pid1,
                _template: template,
                slot: slot.clone(),
                out: out.clone(),
            })
        })();
        match made {
            Ok(jail) => {
                // Ready: its preload ran. Our own read of its memory is
                // not part of making it.
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                let rss = footprint::rss_of_jail(jail.supervisor, jail.pid1);
                let mut st = self.lock();
                st.refills.record(ms);
                st.idle_rss_bytes = rss;
                Ok(jail)
            }
            Err(e) => {
                let _ = fs::remove_dir_all(&slot);
                Err(e)
            }
        }
    }

    /// `jail session start` as a child, holding the lifeline, its preload
    /// imported.
    fn spawn_session(
        &self,
        input: &Path,
        out: &Path,
        template: Option<PathBuf>,
    ) -> Result<(PathBuf, String, u32, Option<u32>), String> {
        let spec = StartSpec {
            more: self.cfg.start_args.clone(),
            input: Some(input.to_path_buf()),
            output: Some(out.to_path_buf()),
            lifeline: Some(self.lifeline_read.as_raw_fd()),
            // The policy's trusted preload, run by the start before the
            // handle comes back (session/preload.rs), or the template's,
            // which its fork holds already.
            preload: true,
            template,
            ..StartSpec::new(&self.cfg.jail_exe)
        };
        let started = session::start(&spec).map_err(|e| e.to_string())?;
        Ok((started.handle, started.id, started.pid, started.jail_pid))
    }

    // ---- Requests ----

    fn read_requests(self: Arc<Self>) {
        let stdin = io::stdin();
        let mut reader = stdin.lock();
        let mut lines = Lines::new(wire::MAX_REQUEST_LINE);
        loop {
            match lines::read_line(&mut reader, &mut lines) {
                Ok(lines::Read::Whole) => {}
                Ok(lines::Read::TooLong) => {
                    self.say(&wire::too_long().reply());
                    continue;
                }
                Ok(lines::Read::End) | Err(_) => break,
            }
            let text = String::from_utf8_lossy(lines.line());
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            self.take_line(text);
        }
        self.drain();
    }

    fn take_line(self: &Arc<Self>, text: &str) {
        match Line::parse(text, self.cfg.ceilings) {
            Err(e) => self.say(&e.reply()),
            Ok(Line::Stats { id }) => self.say(&Reply { id, body: Body::Stats(self.stats()) }),
            Ok(Line::Run(req)) => self.start(req.id.clone(), move |p, f| p.serve(req, f)),
            Ok(Line::Session(req)) => self.start(req.id.clone(), move |p, f| p.serve_session(req, f)),
            Ok(Line::Cancel { id }) => self.cancel(&id),
        }
    }

    /// Take request `id` in: refused while draining or while another with
    /// its id is in flight; else `work` runs on a thread of its own and its
    /// reply line is written when it is done.
    fn start(self: &Arc<Self>, id: String, work: impl FnOnce(&Arc<Pool>, &cancel::Flight) -> Reply + Send + 'static) {
        let flight = cancel::flight();
        {
            let mut st = self.lock();
            let err = |code, msg: &str| wire::Error::new(code, msg).about(Some(&id)).reply();
            if st.draining {
                drop(st);
                return self.say(&err(ErrorCode::Draining, "the pool is shutting down: start a new pool"));
            }
            if st.inflight.contains_key(&id) {
                drop(st);
                return self
                    .say(&err(ErrorCode::DuplicateId, "a request with this id is in flight: give each request its own id"));
            }
            st.inflight.insert(id.clone(), Arc::clone(&flight));
        }
        let p = Arc::clone(self);
        std::thread::spawn(move || {
            let reply = work(&p, &flight);
            p.answer(&id, &reply);
            p.lock().inflight.remove(&id);
            p.changed.notify_all();
        });
    }

    fn stats(&self) -> wire::Stats {
        let supervisors: Vec<(u32, Option<u32>)> = self.lock().ready.iter().map(|j| (j.supervisor, j.pid1)).collect();
        // Read outside the lock: /proc reads of each ready jail's processes.
        let idle = footprint::mean(&supervisors.into_iter().map(|(s, p)| footprint::of_jail(s, p)).collect::<Vec<_>>());
        let st = self.lock();
        let per_jail = self.cfg.memory_limit.unwrap_or(st.idle_rss_bytes);
        let available = memory::available_here();
        let max_size = available
            .as_ref()
            .filter(|_| per_jail > 0)
            .map(|a| memory::largest(a.bytes, per_jail).min(MAX_SIZE as u64));
        wire::Stats {
            size: self.cfg.size as u64,
            ready: st.ready.len() as u64,
            making: st.making as u64,
            in_use: st.in_use as u64,
            refill_ms: st.refills.summary(),
            idle_rss_bytes: st.idle_rss_bytes,
            idle: idle.map(|f| wire::Idle {
                rss_bytes: Some(f.rss),
                pss_bytes: Some(f.pss),
                anon_bytes: Some(f.anon),
                uss_bytes: Some(f.uss),
            }),
            sessions: st.sessions.len() as u64,
            available_memory_bytes: available.map(|a| a.bytes),
            max_size,
        }
    }

    /// One request, start to reply line.
    fn serve(self: &Arc<Self>, req: Request, flight: &cancel::Flight) -> Reply {
        let fail = |e: Failed| e.about(Some(&req.id)).reply();
        // Everything about the request is checked before a jail is claimed.
        let code = match &req.source {
            Source::Code(c) => c.clone(),
            Source::Script(p) => match read_script(p, self.cfg.reach) {
                Ok(c) => c,
                Err(e) => return fail(e),
            },
        };
        // Opened now, used by descriptor after the claim (accept.rs).
        let input = match req.input.as_deref().map(|i| check_input(i, self.cfg.reach)).transpose() {
            Ok(i) => i,
            Err(e) => return fail(e),
        };
        let output = match req.output.as_deref().map(|o| check_output(o, &self.cfg.temp_dir)).transpose() {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        let jail = match self.claim(flight) {
            Ok(j) => j,
            Err(Claim::Cancelled) => return fail(not_run()),
            Err(Claim::Failed(e)) => return fail(broke(e)),
        };
        if flight.is_cancelled() {
            // It ran nothing: the next request takes it.
            self.give_back(jail);
            return fail(not_run());
        }
        let reply = self
            .run_in(&jail, &req, Accepted { input, output }, code, flight)
            .and_then(|r| serde_json::to_value(r).map_err(|e| broke(format!("the step's result: {e}"))));
        // The slot (the input's copy, anything not handed over) goes now.
        if reply.is_err() {
            // Never left running: a jail that may have run code is not reused.
            let _ = session::stop(&jail.handle);
        }
        let _ = fs::remove_dir_all(&jail.slot);
        self.lock().in_use -= 1;
        // The replacement is made once the step is done, so its start-up
        // (an interpreter importing the preload) never competes with the
        // step for the CPUs; a request that finds no jail ready makes one.
        self.refill();
        self.changed.notify_all();
        match reply {
            Ok(result) => Reply::result(&req.id, result),
            // Cancelled before its code reached the jail, or it failed then.
            Err(_) if flight.is_cancelled() => fail(not_run()),
            Err(e) => fail(e),
        }
    }

    /// A claimed jail that ran nothing, back to the front of the ready ones.
    fn give_back(&self, jail: Jail) {
        let mut st = self.lock();
        st.in_use -= 1;
        st.ready.push_front(jail);
        drop(st);
        self.changed.notify_all();
    }

    /// Take a ready jail, waiting for one (made now if none is coming),
    /// unless the request is cancelled meanwhile.
    fn claim(self: &Arc<Self>, flight: &cancel::Flight) -> Result<Jail, Claim> {
        self.lock().waiting += 1;
        let got = self.claim_waiting(flight);
        self.lock().waiting -= 1;
        got
    }

    fn claim_waiting(self: &Arc<Self>, flight: &cancel::Flight) -> Result<Jail, Claim> {
        let mut st = self.lock();
        loop {
            if flight.is_cancelled() {
                return Err(Claim::Cancelled);
            }
            if let Some(jail) = st.ready.pop_front() {
                if !jail.alive() {
                    // It ended while it waited (session.idle_timeout_secs,
                    // max_lifetime_secs): never handed out; take the next.
                    drop(st);
                    jail.destroy();
                    self.refill();
                    st = self.lock();
                    continue;
                }
                st.in_use += 1;
                return Ok(jail);
            }
            if let Some(b) = &st.broken {
                return Err(Claim::Failed(format!("{b}: see the pool's stderr, fix the cause and start a new pool")));
            }
            if st.making == 0 {
                // Nothing is coming (a refill gave up, or the pool drains
                // and this request was taken before): make one now.
                drop(st);
                self.refill();
                st = self.lock();
                continue;
            }
            st = self.changed.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn run_in(
        &self,
        jail: &Jail,
        req: &Request,
        accepted: Accepted,
        code: String,
        flight: &cancel::Flight,
    ) -> Result<RunResult, Failed> {
        if let (Some(from), Some(path)) = (&accepted.input, &req.input) {
            copy_input(from, path, &jail.input(), self.cfg.reach)?;
        }
        let argv0 = match &req.source {
            Source::Code(_) => "-c".to_string(),
            Source::Script(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        };
        let mut argv = vec![argv0];
        argv.extend(req.args.iter().cloned());
        let set_argv = format!("import sys as _jail_sys\n_jail_sys.argv = {}\ndel _jail_sys\n", json!(argv));
        // Its failure is `never_started` to a client (client/pool.rs).
        let set = session::exec(&jail.handle, session::Cell::new(set_argv, Some(self.cfg.ceilings.wall_time)))
            .map_err(|e| broke(format!("{}: {e}", wire::SET_ARGV)))?;
        if set.status != Status::Ok {
            return Err(broke(format!("{} in the jail: {}", wire::SET_ARGV, json!(set.status))));
        }
        if !flight.enter(jail.supervisor) {
            return Err(not_run());
        }
        // Stateless: the jail is destroyed after the step, so past its time
        // its grace is the wall clock's (session/grace.rs).
        let step = session::Cell::new(code, Some(req.wall_time)).with_env(req.env.clone());
        let cell = if req.events {
            // Each event on our stdout as it comes, tagged with the request.
            let mut tell = |ev: &str| {
                if let Some(line) = Reply::event(&req.id, ev) {
                    self.say(&line);
                }
            };
            session::exec_step(&jail.handle, step, Some(&mut tell))
        } else {
            session::exec_step(&jail.handle, step, None)
        };
        if let Some(supervisor) = flight.leave() {
            // A cancel reached the jail: it is ending. Replied once it is
            // gone, with what the cell said.
            cancel::wait_gone(&supervisor);
            return cell.map(cancel::cancelled_result).map_err(|e| broke(format!("run the step: {e}")));
        }
        // The step is over: the jail is stopped whatever the cell did (a
        // cell that ended the session left its closing for this stop), and
        // the closing's verdict is the step's: every artifact and every
        // refusal. Without it nothing is handed over: what reached the
        // output folder would be unaccounted for.
        let closing = session::stop(&jail.handle).map_err(|e| broke(format!("the step's closing result: {e}")));
        let mut step = cell.map_err(|e| broke(format!("run the step: {e}")))?;
        step.take_delivery(closing?);
        step.session = None;
        // The output folder leaves the slot: renamed to the request's, or to
        // a fresh one in the temp dir (the same filesystem: the work dir is
        // in it) that the reply names.
        let out = match &accepted.output {
            Some(want) => hand_over(&jail.out, want).map(|()| want.path.clone()),
            None => fresh_output(&self.cfg.temp_dir).map_err(|e| e.message).and_then(|o| {
                let place = accept::Place::name(&o).map_err(|e| e.to_string())?;
                hand_over(&jail.out, &place).map(|()| o)
            }),
        }
        .map_err(|e| broke(format!("hand over the output folder: {e}")))?;
        hand_over_quarantine(&mut step, &out).map_err(broke)?;
        // A fresh folder the step left empty goes, as `jail run`'s does
        // (supervisor.rs `finish`): no litter (issue 38).
        let kept = accepted.output.is_some() || fs::remove_dir(&out).is_err();
        step.output_dir = kept.then(|| out.display().to_string());
        if req.events {
            // Judged once the jail is stopped: after the last chunk, as
            // `jail run --events` sends them.
            for a in &step.artifacts {
                if let Some(line) = serde_json::to_value(a).ok().and_then(|a| Reply::artifact(&req.id, &a)) {
                    self.say(&line);
                }
            }
        }
        Ok(step)
    }
}

/// The error reply's message of a request cancelled before its code ran.
const NOT_RUN: &str = "the request was cancelled (op cancel) before its code reached a jail: nothing ran";

/// Why a request failed: its error reply's code and message (the
/// request's id is added as the reply is made).
type Failed = wire::Error;

/// The caller's to fix: `bad_request`.
fn refused(message: impl Into<String>) -> Failed {
    wire::Error::new(ErrorCode::BadRequest, message)
}

/// The pool's or the jail's: `internal`.
fn broke(message: impl Into<String>) -> Failed {
    wire::Error::new(ErrorCode::Internal, message)
}

/// Cancelled before its code reached a jail: `cancelled`, nothing ran.
fn not_run() -> Failed {
    wire::Error::new(ErrorCode::Cancelled, NOT_RUN)
}

/// Why a claim gave no jail.
enum Claim {
    /// The request was cancelled while it waited.
    Cancelled,
    /// No jail can be made: the reason.
    Failed(String),
}

/// A fresh, empty output folder in the temp dir, as `jail run` makes one.
fn fresh_output(temp: &Path) -> Result<PathBuf, Failed> {
    tempfile::Builder::new()
        .prefix("jail-output-")
        .tempdir_in(temp)
        .map(|d| d.keep())
        .map_err(|e| broke(format!("make an output folder in {}: {e}: set TMPDIR to a writable folder", temp.display())))
}

/// A request's paths, taken by the acceptor before a jail is claimed: the
/// input folder open (copied from this descriptor), the output's place
/// (its parent open).
struct Accepted {
    input: Option<OwnedFd>,
    output: Option<accept::Place>,
}

/// The request's `script`: a regular file the jail may read (it is the
/// jail's to read: a root pool does not hand it a file only root may
/// read), opened without following a link (accept.rs).
fn read_script(path: &Path, reach: accept::Reach) -> Result<String, Failed> {
    accept::read_text(path, reach, MAX_SCRIPT).map_err(|e| refused(format!("script {e}: {}", e.fix())))
}

/// The request's `input`: a folder, opened without following a link.
fn check_input(input: &Path, reach: accept::Reach) -> Result<OwnedFd, Failed> {
    accept::open_dir(input, reach).map_err(|e| refused(format!("input {e}: {}", e.fix())))
}

/// Copy the accepted input into the jail's input folder (accept.rs: links
/// as links, what the jail may not read and hard links refused). Anything
/// refused fails the request, naming each entry: nothing the caller gave
/// vanishes without a word. An entry refused is the caller's to fix
/// (`bad_request`, as a refused path is); a copy that broke is the pool's
/// (`internal`).
fn copy_input(from: &OwnedFd, path: &Path, to: &Path, reach: accept::Reach) -> Result<(), Failed> {
    let into = accept::open_own_dir(to).map_err(|e| broke(format!("the jail's input folder {e}")))?;
    let copied = accept::copy_tree(from, &into, reach, INPUT_BOUNDS)
        .map_err(|e| broke(format!("copy the input {}: {e}", path.display())))?;
    if copied.refused.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = copied.refused.iter().take(8).map(ToString::to_string).collect();
    let more = copied.refused.len().saturating_sub(listed.len());
    Err(refused(format!(
        "the input {} holds {} the jail may not be given ({}{}): remove them or give a folder without them",
        path.display(),
        match copied.refused.len() {
            1 => "1 entry".to_string(),
            n => format!("{n} entries"),
        },
        listed.join("; "),
        if more > 0 { format!("; and {more} more") } else { String::new() }
    )))
}

/// `output` must be absent or an empty folder, named without a link on
/// the way, on the temp dir's filesystem so the jail's output folder can
/// be renamed to it.
fn check_output(output: &Path, temp: &Path) -> Result<accept::Place, Failed> {
    let place = accept::Place::name(output).map_err(|e| match e.problem {
        accept::Problem::Missing => refused(format!("output's parent {e}: make it first")),
        _ => refused(format!("output {e}: {}", e.fix())),
    })?;
    match place.found().map_err(|e| refused(format!("output {e}")))? {
        accept::Found::Nothing | accept::Found::EmptyFolder => {}
        accept::Found::Folder => {
            return Err(refused(format!("output {} is not empty: name a new or empty folder", output.display())))
        }
        accept::Found::Other => {
            return Err(refused(format!(
                "output {} exists and is not a folder (a link is not followed): name a new or empty folder",
                output.display()
            )))
        }
    }
    let tmeta = fs::metadata(temp).map_err(|e| refused(format!("temp dir {}: {e}", temp.display())))?;
    if place.device().map_err(|e| refused(format!("output {e}")))? != tmeta.dev() {
        return Err(refused(format!(
            "output {} is not on the filesystem of the pool's temp dir {}: name a folder there, or start the pool with TMPDIR on the output's filesystem",
            output.display(),
            temp.display()
        )));
    }
    Ok(place)
}

/// Move the jail's delivered output folder to the requested place,
/// beneath its parent's descriptor.
fn hand_over(out: &Path, want: &accept::Place) -> Result<(), String> {
    if want.found().map_err(|e| e.to_string())? == accept::Found::EmptyFolder {
        want.remove_empty_dir().map_err(|e| e.to_string())?;
    }
    want.take(out).map_err(|e| format!("rename {} to {e}", out.display()))
}

/// A bound output folder's quarantine (the refused entries moved out of
/// it, delivery.rs) is beside the jail's output folder in the slot, which
/// goes: it follows the output folder, as `NAME.jail-rejected-N` beside
/// it (renamed beneath the parent's descriptor, as the output is), and
/// the result names where its entries are now.
fn hand_over_quarantine(step: &mut RunResult, out: &Path) -> Result<(), String> {
    let Some(from) = step.quarantine_dir.clone().map(PathBuf::from) else { return Ok(()) };
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
    let parent = out.parent().unwrap_or(Path::new("/"));
    let failed = |e: accept::AcceptError| format!("hand over the quarantine folder {}: {e}", from.display());
    for n in 0..100u32 {
        let place = accept::Place::name(&parent.join(format!("{name}.jail-rejected-{n}"))).map_err(failed)?;
        if place.found().map_err(failed)? != accept::Found::Nothing {
            continue;
        }
        place.take(&from).map_err(failed)?;
        step.rehome_quarantine(&place.path);
        return Ok(());
    }
    Err(format!("hand over the quarantine folder {}: no free name beside {}", from.display(), out.display()))
}

/// Whether the process of `pidfd` ended (its pidfd became readable) by
/// `until`; with no `until`, block until it has.
fn ended_by(pidfd: &OwnedFd, until: Option<Instant>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    loop {
        let timeout = match until {
            None => PollTimeout::NONE,
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                PollTimeout::try_from(left.as_millis() as u64).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => return true,
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_copy_keeps_links_as_links_and_refuses_what_it_cannot_give() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/a.csv"), "x,y\n").unwrap();
        fs::set_permissions(src.join("sub/a.csv"), fs::Permissions::from_mode(0o604)).unwrap();
        fs::write(t.path().join("secret"), "no").unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), src.join("link")).unwrap();
        fs::create_dir(&dst).unwrap();
        let from = check_input(&src, accept::Reach::here()).unwrap();
        copy_input(&from, &src, &dst, accept::Reach::here()).unwrap();
        assert_eq!(fs::read_to_string(dst.join("sub/a.csv")).unwrap(), "x,y\n");
        assert!(fs::symlink_metadata(dst.join("link")).unwrap().file_type().is_symlink());
        // Its own mode, never widened (root's copy is not made 0644).
        assert_eq!(fs::metadata(dst.join("sub/a.csv")).unwrap().permissions().mode() & 0o777, 0o604);
        // A hard link fails the request, named.
        fs::hard_link(t.path().join("secret"), src.join("hard")).unwrap();
        let again = t.path().join("again");
        fs::create_dir(&again).unwrap();
        let e = copy_input(&check_input(&src, accept::Reach::here()).unwrap(), &src, &again, accept::Reach::here()).unwrap_err();
        assert!(e.message.contains("hard: a file with 2 names"), "{e:?}");
        assert_eq!(e.code, ErrorCode::BadRequest, "the caller's to fix");
        // The input itself is taken without following a link, trailing
        // slash or not.
        std::os::unix::fs::symlink("/etc", t.path().join("etcdir")).unwrap();
        for p in ["etcdir", "etcdir/", "etcdir/."] {
            let e = check_input(&t.path().join(p), accept::Reach::here()).unwrap_err();
            assert!(e.message.contains("link"), "{p}: {e:?}");
        }
    }

    #[test]
    fn an_output_must_be_new_or_empty_and_on_the_temp_dirs_filesystem() {
        let t = tempfile::tempdir().unwrap();
        assert!(check_output(&t.path().join("new"), t.path()).is_ok());
        fs::create_dir(t.path().join("empty")).unwrap();
        assert!(check_output(&t.path().join("empty"), t.path()).is_ok());
        fs::create_dir(t.path().join("full")).unwrap();
        fs::write(t.path().join("full/x"), "").unwrap();
        assert!(check_output(&t.path().join("full"), t.path()).unwrap_err().message.contains("not empty"));
        assert!(check_output(&t.path().join("no/such/x"), t.path()).unwrap_err().message.contains("make it first"));
        if fs::metadata("/proc").unwrap().dev() != fs::metadata(t.path()).unwrap().dev() {
            assert!(check_output(Path::new("/proc/x"), t.path()).unwrap_err().message.contains("filesystem"));
        }
    }

    #[test]
    fn an_output_is_named_without_a_link_on_the_way() {
        let t = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(t.path(), t.path().join("linked")).unwrap();
        let e = check_output(&t.path().join("linked/new"), t.path()).unwrap_err();
        assert!(e.message.contains("link"), "{e:?}");
        let e = check_output(&t.path().join("linked"), t.path()).unwrap_err();
        assert!(e.message.contains("not a folder"), "{e:?}");
        assert!(!t.path().join("new").exists());
    }

    #[test]
    fn a_script_link_is_refused() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("a.py"), "print(1)").unwrap();
        std::os::unix::fs::symlink(t.path().join("a.py"), t.path().join("b.py")).unwrap();
        assert_eq!(read_script(&t.path().join("a.py"), accept::Reach::here()).unwrap(), "print(1)");
        assert!(read_script(&t.path().join("b.py"), accept::Reach::here()).unwrap_err().message.contains("link"));
    }
}
