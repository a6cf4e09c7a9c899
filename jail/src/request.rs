//! The request, checked: every path the user gave resolved and its
//! permissions checked for the uid the sandbox will run as, the rootfs
//! listed and identified, and the interpreter's argv and environment built
//! from the policy. Nothing here starts a process.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::child::Exec;
use crate::mounts::{self, RootfsEntry};
use crate::policy::{Network, Policy};
use crate::proxy;

/// How the script's stdout and stderr reach the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Captured with byte caps into the result (`--json`).
    Capture,
    /// Copied live to our own stdout and stderr.
    Stream,
}

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
    /// `jail session`: serve cells to a driver instead of running one
    /// script to its end (session.rs); `None` for `jail run`.
    pub session: Option<std::rc::Rc<crate::session::Serve>>,
}

/// A request that failed before anything was started: what is wrong and how
/// to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{problem}: {fix}")]
pub struct InputError {
    pub problem: String,
    pub fix: String,
}

pub(crate) fn input_error(problem: impl Into<String>, fix: impl Into<String>) -> InputError {
    InputError { problem: problem.into(), fix: fix.into() }
}

/// Who the sandbox is on the host, and what that means for permissions.
pub(crate) struct Identity {
    pub(crate) caller_uid: u32,
    pub(crate) host_uid: u32,
    pub(crate) host_gid: u32,
}

/// Everything prepared before the clone.
pub(crate) struct Prepared {
    pub(crate) mount_request: mounts::Request,
    pub(crate) exec: Exec,
    pub(crate) output_dir: PathBuf,
    pub(crate) rootfs: PathBuf,
    pub(crate) rootfs_id: Option<String>,
    pub(crate) wall_time: Duration,
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

    let (code, script_rel) = resolve_script(&req.script, req.code.as_deref())?;
    if let mounts::Code::Dir(dir) = &code {
        check_readable(dir, "code dir", who)?;
    }
    let input = match &req.input {
        Some(dir) => {
            let d = existing_dir(dir, "input dir", "--input")?;
            check_readable(&d, "input dir", who)?;
            Some(d)
        }
        None => None,
    };
    let output_dir = match &req.output {
        Some(dir) => {
            let d = existing_dir(dir, "output dir", "--output")?;
            check_writable(&d, who, policy.filesystem.output_size)?;
            d
        }
        None => fresh_output_dir(who, policy.filesystem.output_size)?,
    };

    let wall_time = req.timeout.unwrap_or(policy.limits.wall_time);
    let script_in_jail = Path::new(mounts::CODE_DIR).join(&script_rel);
    let umask = crate::hostuid::sandbox_umask(who.caller_uid == 0, policy.filesystem.output_size.is_none());
    let exec = build_exec(policy, &script_in_jail, &req.args, req.mode, umask)?;
    let resolver = match &policy.network {
        Network::None => None,
        Network::Allowlist(_) => Some(proxy::Resolver::from_env().map_err(|e| {
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
        },
        exec,
        output_dir,
        rootfs,
        rootfs_id,
        wall_time,
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

fn resolve_rootfs(req: &RunRequest) -> Result<PathBuf, InputError> {
    let from_env = std::env::var_os("JAIL_ROOTFS").filter(|v| !v.is_empty()).map(PathBuf::from);
    let Some(rootfs) = req.rootfs.clone().or(from_env).or_else(|| req.policy.rootfs.clone()) else {
        return Err(input_error("no rootfs given", "pass --rootfs DIR, set JAIL_ROOTFS, or set `rootfs` in the policy"));
    };
    match std::fs::canonicalize(&rootfs) {
        Ok(p) if p.is_dir() => Ok(p),
        _ => Err(input_error(
            format!("rootfs {} not found", rootfs.display()),
            "build it with `make rootfs` (or pass --rootfs DIR)",
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
/// and the script's path relative to it.
fn resolve_script(script: &Path, code: Option<&Path>) -> Result<(mounts::Code, PathBuf), InputError> {
    let code_dir = match code {
        Some(dir) => Some(existing_dir(dir, "code dir", "--code")?),
        None => None,
    };
    let candidate = match (&code_dir, script.is_relative() && !script.exists()) {
        (Some(dir), true) => dir.join(script),
        _ => script.to_path_buf(),
    };
    let meta = std::fs::metadata(&candidate).map_err(|e| {
        input_error(format!("script {} cannot be read: {e}", script.display()), "check the path; it must be a Python file")
    })?;
    if !meta.is_file() {
        return Err(input_error(format!("script {} is not a regular file", script.display()), "pass the path of a Python file"));
    }
    std::fs::File::open(&candidate)
        .map_err(|e| input_error(format!("script {} cannot be read: {e}", script.display()), "make it readable (chmod a+r)"))?;
    let full = std::fs::canonicalize(&candidate)
        .map_err(|e| input_error(format!("script {}: {e}", script.display()), "check the path"))?;
    let Some(code_dir) = code_dir else {
        // Only the script is granted: its folder may hold anything (~/.ssh
        // beside ~/analysis.py), and none of that is the script's business.
        if meta.len() > mounts::MAX_SCRIPT_BYTES {
            return Err(input_error(
                format!("script {} is {} bytes, over {} MiB", script.display(), meta.len(), mounts::MAX_SCRIPT_BYTES >> 20),
                "pass its folder with --code DIR",
            ));
        }
        let name = PathBuf::from(full.file_name().unwrap_or(full.as_os_str()));
        return Ok((mounts::Code::Script { file: full, name: name.clone() }, name));
    };
    let rel = full.strip_prefix(&code_dir).map_err(|_| {
        input_error(
            format!("script {} is not inside the code dir {}", full.display(), code_dir.display()),
            "put the script inside --code DIR, or leave --code out",
        )
    })?;
    Ok((mounts::Code::Dir(code_dir), rel.to_path_buf()))
}

/// An existing directory that is not a symlink, canonicalized.
fn existing_dir(dir: &Path, what: &str, flag: &str) -> Result<PathBuf, InputError> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| {
        input_error(
            format!("{what} {} cannot be used: {e}", dir.display()),
            format!("create it, or pass an existing folder to {flag}"),
        )
    })?;
    if meta.file_type().is_symlink() {
        return Err(input_error(
            format!("{what} {} is a symlink", dir.display()),
            format!("pass the real folder to {flag}, not a link to it"),
        ));
    }
    if !meta.is_dir() {
        return Err(input_error(format!("{what} {} is not a directory", dir.display()), format!("pass a folder to {flag}")));
    }
    std::fs::canonicalize(dir).map_err(|e| input_error(format!("{what} {}: {e}", dir.display()), "check the path"))
}

#[derive(Clone, Copy)]
enum Want {
    Read,
    Write,
}

/// Whether `host_uid`/`host_gid` may read (r-x) or write (-wx) a folder, from
/// its mode bits alone: the sandbox has no capabilities and no supplementary
/// groups it could use instead.
fn mode_allows(meta: &std::fs::Metadata, uid: u32, gid: u32, want: Want) -> bool {
    let mode = meta.permissions().mode();
    let bits = match want {
        Want::Read => 0o5,
        Want::Write => 0o3,
    };
    let shift = if meta.uid() == uid {
        6
    } else if meta.gid() == gid {
        3
    } else {
        0
    };
    (mode >> shift) & bits == bits
}

fn check_readable(dir: &Path, what: &str, who: &Identity) -> Result<(), InputError> {
    if who.caller_uid != 0 {
        if nix::unistd::access(dir, nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::X_OK).is_err() {
            return Err(input_error(format!("{what} {} is not readable", dir.display()), "make it readable (chmod u+rx)"));
        }
        return Ok(());
    }
    let meta = std::fs::metadata(dir).map_err(|e| input_error(format!("{what} {}: {e}", dir.display()), "check the path"))?;
    if !mode_allows(&meta, who.host_uid, who.host_gid, Want::Read) {
        return Err(input_error(
            format!(
                "{what} {} is not readable by the sandbox (host uid {}, used when jail runs as root)",
                dir.display(),
                who.host_uid
            ),
            format!("chmod o+rx {}, or run jail as an ordinary user", dir.display()),
        ));
    }
    Ok(())
}

/// `output_size`: `None` when the folder is bound into the jail (the script
/// writes it as its host uid), else the copy writes it as the caller.
fn check_writable(dir: &Path, who: &Identity, output_size: Option<u64>) -> Result<(), InputError> {
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
    if who.caller_uid != 0 {
        if nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK).is_err() {
            return Err(input_error(format!("output dir {} is not writable", dir.display()), "make it writable (chmod u+rwx)"));
        }
        return Ok(());
    }
    let meta = std::fs::metadata(dir).map_err(|e| input_error(format!("output dir {}: {e}", dir.display()), "check the path"))?;
    if !mode_allows(&meta, who.host_uid, who.host_gid, Want::Write) {
        return Err(input_error(
            format!(
                "output dir {} is not writable by the sandbox (host uid {}, used when jail runs as root)",
                dir.display(),
                who.host_uid
            ),
            // The uid differs between concurrent runs; the gid is shared.
            format!("chgrp {} {d} && chmod g+rwx {d}, or run jail as an ordinary user", who.host_gid, d = dir.display()),
        ));
    }
    Ok(())
}

/// A new, empty output dir under the temp dir: the caller's, or, bound into
/// the jail (`output_size` `None`), the sandbox's.
fn fresh_output_dir(who: &Identity, output_size: Option<u64>) -> Result<PathBuf, InputError> {
    let dir = tempfile::Builder::new()
        .prefix("jail-output-")
        .tempdir()
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

/// Variables that size the thread pools of OpenMP, OpenBLAS, MKL, numexpr
/// and Accelerate.
pub const THREAD_POOL_VARS: [&str; 5] = [
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
];

/// The interpreter's argv and its environment, rebuilt from the policy.
fn build_exec(policy: &Policy, script: &Path, args: &[String], mode: OutputMode, umask: u32) -> Result<Exec, InputError> {
    let cstr =
        |s: &[u8], what: &str| CString::new(s).map_err(|_| input_error(format!("{what} contains a NUL byte"), "remove it"));
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
    ] {
        env.insert(k.into(), v.into());
    }
    for (k, v) in &policy.environment.set {
        env.insert(k.clone(), v.clone());
    }
    for k in &policy.environment.pass {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.clone(), v);
        }
    }
    // Thread pools follow the CPU limit: a BLAS or OpenMP pool sized to the
    // host's cores under a one-core quota only thrashes. A value the policy
    // sets itself wins.
    if let Some(cpus) = policy.limits.cpus {
        let n = (cpus.ceil() as u64).max(1).to_string();
        for var in THREAD_POOL_VARS {
            env.entry(var.to_string()).or_insert_with(|| n.clone());
        }
    }
    if let Network::Allowlist(_) = policy.network {
        // After the policy's own values: the proxy is the only way out, and
        // a policy cannot point the script anywhere else.
        env.extend(crate::network::proxy_env());
    }
    if mode == OutputMode::Stream {
        // Streaming is only live if Python does not hold output in its buffers.
        env.insert("PYTHONUNBUFFERED".into(), "1".into());
    }
    let envp = env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}").as_bytes(), "an environment value"))
        .collect::<Result<Vec<_>, _>>()?;
    let path = cstr(policy.python.as_os_str().as_bytes(), "the python path")?;
    let mut argv = vec![path.clone(), cstr(script.as_os_str().as_bytes(), "the script path")?];
    for a in args {
        argv.push(cstr(a.as_bytes(), "an argument")?);
    }
    Ok(Exec { path, argv, envp, cwd: PathBuf::from(mounts::OUTPUT_DIR), umask })
}
