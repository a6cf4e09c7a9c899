//! The request, checked: every path the user gave resolved and its
//! permissions checked for the uid the sandbox will run as, and the rootfs
//! listed and identified. What the run becomes is decided from this by
//! `plan::plan`. Nothing here starts a process.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::accept;
use crate::mounts::{self, RootfsEntry};
use crate::policy::{Network, Policy};
use crate::proxy;
use crate::streams::OutputMode;

/// One `jail run`.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub policy: Policy,
    pub script: PathBuf,
    pub args: Vec<String>,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub code: Option<PathBuf>,
    pub rootfs: Option<PathBuf>,
    pub timeout: Option<Duration>,
    pub mode: OutputMode,
    /// What the caller's environment gives the run, read once by the caller
    /// (hostenv.rs): the library reads no environment variable.
    pub host: crate::hostenv::HostEnv,
    /// Variables the caller sets for the run (envs.rs), over the policy's.
    pub env: crate::envs::Envs,
    /// What the step is: one script to its end, or a session's cells
    /// served to the trusted driver (session.rs).
    pub step: StepKind,
    /// Make the jail as a fork of the template listening at this socket
    /// (template.rs) instead of cloning it: a session from a pool.
    pub template: Option<PathBuf>,
}

/// What one step in a jail is, as plain data: the plan opens the control
/// channel for [`StepKind::Cells`], and the supervisor's loop (watch.rs)
/// says what its clocks mean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StepKind {
    /// `jail run`: one script until it ends or a limit is reached.
    #[default]
    Script,
    /// `jail session`: cells sent to the cell driver over the control
    /// channel (session/cells.rs).
    Cells,
    /// `jail template`: a template's interpreter, which its forks leave
    /// (pool/template.rs): the host's root kept beneath its own, no
    /// landlock, no seccomp, and nothing untrusted ever run in it.
    Template,
}

/// A request that failed before anything was started: what is wrong and how
/// to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{problem}: {fix}")]
pub(crate) struct InputError {
    pub problem: String,
    pub fix: String,
    /// `Input`, or `Output` for a problem with the output dir (`--output`,
    /// or the one made for the run).
    pub stage: crate::stage::Stage,
}

pub(crate) fn input_error(problem: impl Into<String>, fix: impl Into<String>) -> InputError {
    InputError { problem: problem.into(), fix: fix.into(), stage: crate::stage::Stage::Input }
}

impl InputError {
    fn of_output(self) -> InputError {
        InputError { stage: crate::stage::Stage::Output, ..self }
    }
}

/// Who the sandbox is on the host, and what that means for permissions.
pub struct Identity {
    pub(crate) caller_uid: u32,
    pub(crate) host_uid: u32,
    pub(crate) host_gid: u32,
}

impl Identity {
    pub(crate) fn of(host: &crate::host::Host) -> Identity {
        Identity { caller_uid: host.caller_uid, host_uid: host.host_uid, host_gid: host.host_gid }
    }
}

/// The request checked against the filesystem: what `plan::plan` reads
/// besides the policy and the host.
pub(crate) struct Prepared {
    pub(crate) mount_request: mounts::Request,
    /// The script's path inside the jail.
    pub(crate) script: PathBuf,
    pub(crate) output_dir: PathBuf,
    pub(crate) rootfs: PathBuf,
    pub(crate) rootfs_id: Option<String>,
    /// With `network.mode: allowlist`: how the proxy resolves names.
    pub(crate) resolver: Option<proxy::Resolver>,
}

/// Check every path the user gave and resolve what the child will need.
pub(crate) fn prepare(req: &RunRequest, who: &Identity) -> Result<Prepared, InputError> {
    let policy = &req.policy;
    let rootfs = resolve_rootfs(req)?;
    let python_host = rootfs.join(policy.python.strip_prefix("/").unwrap_or(&policy.python));
    if !python_host.exists() {
        return Err(input_error(
            format!("the rootfs {} has no interpreter at {}", rootfs.display(), policy.python.display()),
            "rebuild it with `make rootfs`, or set `python` in the policy",
        ));
    }
    let rootfs_entries = list_rootfs(&rootfs)?;
    let rootfs_id = rootfs_identity(&rootfs)?;

    let (code, script) = match req.step {
        StepKind::Cells => session_code(req, who)?,
        StepKind::Script | StepKind::Template => {
            let (code, script_rel) = resolve_script(&req.script, req.code.as_deref(), who)?;
            (code, Path::new(mounts::CODE_DIR).join(&script_rel))
        }
    };
    let input = match &req.input {
        Some(dir) => {
            let (d, fd) = existing_dir(dir, "input dir", "--input")?;
            check_readable(&d, &fd, "input dir", who)?;
            Some(d)
        }
        None => None,
    };
    let output_dir = match &req.output {
        Some(dir) => {
            let (d, fd) = existing_dir(dir, "output dir", "--output").map_err(InputError::of_output)?;
            check_writable(&d, &fd, who, policy.filesystem.output_size).map_err(InputError::of_output)?;
            d
        }
        None => {
            fresh_output_dir(req.host.temp_dir.as_deref(), who, policy.filesystem.output_size).map_err(InputError::of_output)?
        }
    };

    let resolver = match &policy.network {
        Network::None => None,
        Network::Allowlist(_) => Some(proxy::Resolver::from_override(req.host.resolve_override.as_deref()).map_err(|e| {
            input_error(e.to_string(), format!("write {}=name=address,... or unset it", proxy::TEST_RESOLVE_VAR))
        })?),
    };
    Ok(Prepared {
        mount_request: mounts::Request {
            rootfs: rootfs.clone(),
            rootfs_entries,
            input,
            code,
            output: output_dir.clone(),
            tmp_size: policy.filesystem.tmp_size,
            shm_size: policy.filesystem.shm_size,
            output_size: policy.filesystem.output_size,
            // Set by the plan from the host's facts (inside.rs).
            meminfo: None,
            sys_files: Vec::new(),
        },
        script,
        output_dir,
        rootfs,
        rootfs_id,
        resolver,
    })
}

/// The sha256 of the rootfs's manifest, for `isolation.rootfs_id`; `None`
/// for a rootfs without one.
fn rootfs_identity(rootfs: &Path) -> Result<Option<String>, InputError> {
    match crate::rootfs::read_manifest_bytes(rootfs) {
        Ok(bytes) => Ok(bytes.as_deref().map(crate::rootfs::identity)),
        Err(e) => {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
            Err(input_error(format!("{e}{cause}"), "rebuild the rootfs (`make rootfs` or `make rootfs-data`)"))
        }
    }
}

/// `--rootfs` as the caller resolved it (cli.rs looks it up: locate.rs),
/// else the policy's.
fn resolve_rootfs(req: &RunRequest) -> Result<PathBuf, InputError> {
    let Some(rootfs) = req.rootfs.clone().or_else(|| req.policy.rootfs.clone()) else {
        return Err(input_error(
            "no rootfs given",
            "pass --rootfs DIR, set JAIL_ROOTFS, or build one with `jail rootfs build minimal`",
        ));
    };
    match std::fs::canonicalize(&rootfs) {
        Ok(p) if p.is_dir() => Ok(p),
        _ => Err(input_error(
            format!("rootfs {} not found", rootfs.display()),
            "build it with `jail rootfs build minimal` (or pass --rootfs DIR)",
        )),
    }
}

fn list_rootfs(rootfs: &Path) -> Result<Vec<RootfsEntry>, InputError> {
    let read = std::fs::read_dir(rootfs).map_err(|e| {
        input_error(
            format!("cannot list rootfs {}: {e}", rootfs.display()),
            "check its permissions or rebuild it with `make rootfs`",
        )
    })?;
    let mut entries = Vec::new();
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if mounts::RESERVED_TOP_LEVEL.contains(&name.as_str()) || name.starts_with('.') {
            continue;
        }
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_symlink() {
            if let Ok(target) = std::fs::read_link(entry.path()) {
                entries.push(RootfsEntry::Symlink(name, target));
            }
        } else if ft.is_dir() {
            entries.push(RootfsEntry::Dir(name));
        }
    }
    entries.sort_by(|a, b| entry_name(a).cmp(entry_name(b)));
    Ok(entries)
}

fn entry_name(e: &RootfsEntry) -> &str {
    match e {
        RootfsEntry::Dir(n) | RootfsEntry::Symlink(n, _) => n,
    }
}

/// What `/workspace/code` holds (the script alone, or the `--code` folder)
/// and the script's path relative to it. The script is opened as the
/// caller, following no link (accept.rs), and must be readable by the
/// jail: its text is the jail's to read (modes are never widened, so a
/// root caller cannot hand the jail a file only root may read).
fn resolve_script(script: &Path, code: Option<&Path>, who: &Identity) -> Result<(mounts::Code, PathBuf), InputError> {
    let code_dir = match code {
        Some(dir) => {
            let (d, fd) = existing_dir(dir, "code dir", "--code")?;
            check_readable(&d, &fd, "code dir", who)?;
            Some((d, fd))
        }
        None => None,
    };
    let unreadable = |e: accept::AcceptError| {
        let fix = match e.problem {
            accept::Problem::Link => "give the script's real path: no component may be a link",
            accept::Problem::NotAFile => "pass the path of a Python file",
            accept::Problem::Unreadable(_) if who.caller_uid == 0 => {
                "make it readable by the jail's unprivileged uid (chmod o+r), or run jail as an ordinary user"
            }
            accept::Problem::Unreadable(_) => "make it readable (chmod u+r)",
            _ => "check the path; it must be a Python file",
        };
        let what = match e.problem {
            accept::Problem::NotAFile => "is not a regular file".to_string(),
            _ => format!("cannot be read: {}", e.problem),
        };
        input_error(format!("script {} {what}", script.display()), fix)
    };
    let reach = reach_of(who);
    let Some((code_dir, code_fd)) = code_dir else {
        // Only the script is granted: its folder may hold anything (~/.ssh
        // beside ~/analysis.py), and none of that is the script's business.
        let file = accept::open_file(script, reach).map_err(unreadable)?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len > mounts::MAX_SCRIPT_BYTES {
            return Err(input_error(
                format!("script {} is {len} bytes, over {} MiB", script.display(), mounts::MAX_SCRIPT_BYTES >> 20),
                "pass its folder with --code DIR",
            ));
        }
        let full = accept::absolute(script).map_err(unreadable)?;
        let name = PathBuf::from(full.file_name().unwrap_or(full.as_os_str()));
        return Ok((mounts::Code::Script { file: full, name: name.clone() }, name));
    };
    // Relative to the current folder when it is there, else to the code
    // dir; either way it must lie beneath the code dir, by the words and
    // then by the kernel (opened beneath the code dir's descriptor).
    let candidate = match script.is_relative() && std::fs::symlink_metadata(script).is_err() {
        true => code_dir.join(script),
        false => accept::absolute(script).map_err(unreadable)?,
    };
    let rel = candidate.strip_prefix(&code_dir).map_err(|_| {
        input_error(
            format!("script {} is not inside the code dir {}", candidate.display(), code_dir.display()),
            "put the script inside --code DIR, or leave --code out",
        )
    })?;
    accept::open_file_beneath(&code_fd, &code_dir, rel, reach).map_err(|e| match e.problem {
        accept::Problem::Outside => input_error(
            format!("script {} is not inside the code dir {}", candidate.display(), code_dir.display()),
            "put the script inside --code DIR, or leave --code out",
        ),
        _ => unreadable(e),
    })?;
    Ok((mounts::Code::Dir(code_dir), rel.to_path_buf()))
}

/// A session's code dir and script: the caller's `--code` folder, taken
/// as a run's is, or nothing; the script is the trusted cell driver
/// session.rs wrote (`req.script`), copied in apart from the code dir, so
/// `/workspace/code` never shows it and `--code` needs no script of its own.
fn session_code(req: &RunRequest, who: &Identity) -> Result<(mounts::Code, PathBuf), InputError> {
    let dir = match &req.code {
        Some(dir) => {
            let (d, fd) = existing_dir(dir, "code dir", "--code")?;
            check_readable(&d, &fd, "code dir", who)?;
            Some(d)
        }
        None => None,
    };
    let script = Path::new(mounts::DRIVER_DIR).join(mounts::DRIVER_NAME);
    Ok((mounts::Code::Session { dir, driver: req.script.clone() }, script))
}

/// An existing directory, opened without following any link (accept.rs):
/// its absolute path (as the caller wrote it: the child opens it again the
/// same way) and the descriptor the checks use.
fn existing_dir(dir: &Path, what: &str, flag: &str) -> Result<(PathBuf, OwnedFd), InputError> {
    let refused = |e: accept::AcceptError| {
        let fix = match e.problem {
            accept::Problem::Missing => format!("create it, or pass an existing folder to {flag}"),
            accept::Problem::Link => format!("pass the real folder to {flag}, not a link to it or through one"),
            accept::Problem::NotAFolder => format!("pass a folder to {flag}"),
            _ => format!("check the path given to {flag}"),
        };
        input_error(format!("{what} {e}"), fix)
    };
    let fd = accept::open_own_dir(dir).map_err(refused)?;
    let abs = accept::absolute(dir).map_err(refused)?;
    Ok((abs, fd))
}

/// What the jail may reach of the host: the caller's own access, or, for
/// a root caller, the sandbox's host uid and gid by mode bits.
fn reach_of(who: &Identity) -> accept::Reach {
    match who.caller_uid {
        0 => accept::Reach::Sandbox { uid: Some(who.host_uid), gid: Some(who.host_gid) },
        _ => accept::Reach::Caller,
    }
}

fn check_readable(dir: &Path, fd: &OwnedFd, what: &str, who: &Identity) -> Result<(), InputError> {
    match accept::check(dir, fd, reach_of(who), accept::Want::Read) {
        Ok(_) => Ok(()),
        Err(e) if who.caller_uid == 0 => Err(input_error(
            format!(
                "{what} {} is not readable by the sandbox (host uid {}, used when jail runs as root): {}",
                dir.display(),
                who.host_uid,
                e.problem
            ),
            format!("chmod o+rx {}, or run jail as an ordinary user", dir.display()),
        )),
        Err(e) => Err(input_error(
            format!("{what} {} is not readable: {}", dir.display(), e.problem),
            "make it readable (chmod u+rx)",
        )),
    }
}

/// `output_size`: `None` when the folder is bound into the jail (the script
/// writes it as its host uid), else the copy writes it as the caller.
fn check_writable(dir: &Path, fd: &OwnedFd, who: &Identity, output_size: Option<u64>) -> Result<(), InputError> {
    if who.caller_uid == 0 && output_size.is_some() {
        // Mirrored: the copy works on the folder as root without
        // capabilities, by its mode bits (fsid.rs).
        return match crate::fsid::host_may_write(dir) {
            Ok(true) => Ok(()),
            Ok(false) => Err(input_error(
                format!(
                    "output dir {} is not writable by root through its mode bits (jail copies to it as root without capabilities)",
                    dir.display()
                ),
                format!("chown root {d} && chmod u+rwx {d}, or run jail as the folder's owner", d = dir.display()),
            )),
            Err(e) => Err(input_error(format!("output dir {}: {e}", dir.display()), "check the path")),
        };
    }
    match accept::check(dir, fd, reach_of(who), accept::Want::Write) {
        Ok(_) => Ok(()),
        Err(e) if who.caller_uid != 0 => Err(input_error(
            format!("output dir {} is not writable: {}", dir.display(), e.problem),
            "make it writable (chmod u+rwx)",
        )),
        Err(e) => Err(input_error(
            format!(
                "output dir {} is not writable by the sandbox (host uid {}, used when jail runs as root): {}",
                dir.display(),
                who.host_uid,
                e.problem
            ),
            // The uid differs between concurrent runs; the gid is shared.
            format!("chgrp {} {d} && chmod g+rwx {d}, or run jail as an ordinary user", who.host_gid, d = dir.display()),
        )),
    }
}

/// A new, empty output dir under the temp dir: the caller's, or, bound into
/// the jail (`output_size` `None`), the sandbox's.
fn fresh_output_dir(temp: Option<&Path>, who: &Identity, output_size: Option<u64>) -> Result<PathBuf, InputError> {
    let dir = tempfile::Builder::new()
        .prefix("jail-output-")
        .tempdir_in(temp.unwrap_or(Path::new("/tmp")))
        .map_err(|e| input_error(format!("cannot create an output dir: {e}"), "pass --output DIR, or check TMPDIR"))?
        .keep();
    if who.caller_uid == 0 && output_size.is_none() {
        std::os::unix::fs::chown(&dir, Some(who.host_uid), Some(who.host_gid)).map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            input_error(format!("cannot hand {} to the sandbox uid: {e}", dir.display()), "pass --output DIR")
        })?;
    }
    Ok(dir)
}
