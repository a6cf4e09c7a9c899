//! The jail's filesystem: a pure [`plan`] from the request to an ordered list
//! of [`MountOp`]s, and a thin [`apply`] that performs them in the child.
//!
//! The new root is an empty tmpfs. Into it go the rootfs's top-level folders
//! (bound read-only, nosuid, nodev), a minimal `/dev`, a fresh `/proc` with
//! sensitive files masked, size-capped `/tmp` and `/dev/shm`, and the three
//! workspace folders. Every bind source is opened with
//! `openat2(RESOLVE_NO_SYMLINKS)` before anything is mounted and bound by
//! descriptor (`open_tree` + `move_mount`), so no symlink planted in a source
//! tree can redirect a mount (runc CVE-2021-30465).
//!
//! No mount may show a host path in `/proc/self/mountinfo`: a bind's root
//! field is the source's path within its filesystem (`/home/alice/data`).
//! So read-only host folders are not bound but [`View::Rerooted`]: an
//! overlayfs whose only layers are the source and an empty folder, both
//! named by descriptor (`lowerdir=/proc/self/fd/N:...`), so its line reads
//! `/ ... overlay overlay ro,lowerdir=/proc/self/fd/7:/proc/self/fd/8`. The
//! script alone (no `--code`) is copied into a small read-only tmpfs. What
//! still shows a host path (the writable output bind of `output_size:
//! unlimited`, or a kernel without unprivileged overlayfs) is listed by
//! [`still_showing`] or reported by [`apply`] for `isolation.degraded`.

mod remount;

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::sys::{
    self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS,
};

/// Where the workspace lives inside the jail.
/// Where the generated meminfo goes (inside.rs writes it).
pub(crate) const MEMINFO: &str = "/proc/meminfo";
/// The jail's `/sys`: a read-only tmpfs holding only inside.rs's CPU lists.
pub(crate) const SYS_DIR: &str = "/sys";

pub(crate) const WORKSPACE: &str = "/workspace";
pub(crate) const INPUT_DIR: &str = "/workspace/input";
pub(crate) const CODE_DIR: &str = "/workspace/code";
pub(crate) const OUTPUT_DIR: &str = "/workspace/output";
/// Where a session's trusted cell driver is copied (session.rs), apart
/// from the code dir: `/workspace/code` holds the caller's code alone.
/// Hidden (a rootfs's dot entries are never bound: request.rs), so no
/// rootfs can be in its way.
pub(crate) const DRIVER_DIR: &str = "/.jail";
/// Where a template's own jail keeps the host's root (its old root, not
/// detached: [`pivot_root`]); only a fork's PID 1 goes there, before its
/// own pivot_root detaches it (template.rs).
pub(crate) const HOST_ROOT: &str = "/.jail-host";
/// The driver's name there: `/.jail/jail_cell_driver.py`.
pub(crate) const DRIVER_NAME: &str = "jail_cell_driver.py";

/// Top-level rootfs names that the jail provides itself and never binds.
pub(crate) const RESERVED_TOP_LEVEL: [&str; 8] = ["dev", "proc", "sys", "tmp", "run", "workspace", "boot", "lost+found"];

/// Host device nodes bound into `/dev`.
pub(crate) const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

/// `/proc` files hidden behind an empty read-only file.
pub(crate) const MASKED_PROC_FILES: [&str; 7] = [
    "kcore",
    "keys",
    "timer_list",
    "sysrq-trigger",
    "kallsyms",
    "sched_debug",
    "latency_stats",
];
/// `/proc` folders hidden behind an empty read-only tmpfs.
pub(crate) const MASKED_PROC_DIRS: [&str; 4] = ["acpi", "scsi", "asound", "firmware"];
/// `/proc` folders made read-only.
pub(crate) const READONLY_PROC_DIRS: [&str; 4] = ["sys", "bus", "irq", "fs"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    Dir,
    File,
}

/// One top-level entry of the rootfs folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootfsEntry {
    Dir(String),
    Symlink(String, PathBuf),
}

/// What `/workspace/code` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Code {
    /// Only the script (`file`, on the host), copied in as `name`: nothing
    /// else of the folder it sits in is visible.
    Script { file: PathBuf, name: PathBuf },
    /// A folder granted with `--code DIR`, read-only.
    Dir(PathBuf),
    /// A session: the caller's `--code` folder (or nothing), and the
    /// trusted cell driver (`driver`, on the host), copied read-only into
    /// [`DRIVER_DIR`], never into the code dir.
    Session { dir: Option<PathBuf>, driver: PathBuf },
}

/// Scripts larger than this must come with their folder (`--code DIR`):
/// the copy lives in memory.
pub(crate) const MAX_SCRIPT_BYTES: u64 = 16 << 20;

/// How a read-only host folder appears in the jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum View {
    /// A clone of the source's mount tree (its submounts included); its
    /// mountinfo line shows the source's path within its filesystem.
    Tree,
    /// An overlayfs with the source as its lower layer: its mountinfo line
    /// shows `/` and descriptor numbers only. Submounts of the source are
    /// not part of it. Falls back to [`View::Tree`], reported, where the
    /// kernel refuses an unprivileged overlayfs.
    Rerooted,
}

/// What the jail's filesystem is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub rootfs: PathBuf,
    pub rootfs_entries: Vec<RootfsEntry>,
    pub input: Option<PathBuf>,
    pub code: Code,
    pub output: PathBuf,
    pub tmp_size: u64,
    pub shm_size: u64,
    /// Size cap of the output dir: a tmpfs instead of a bind of `output`,
    /// filled and mirrored back by the supervisor (output.rs).
    pub output_size: Option<u64>,
    /// The text shown as `/proc/meminfo` (inside.rs); `None`: the kernel's.
    pub meminfo: Option<String>,
    /// The files of a read-only `/sys` (inside.rs); empty: no `/sys`.
    pub sys_files: Vec<(PathBuf, String)>,
}

/// One step of building the new root. Paths are absolute inside the jail.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MountOp {
    Dir {
        path: PathBuf,
        mode: u32,
    },
    Symlink {
        path: PathBuf,
        target: PathBuf,
    },
    Tmpfs {
        path: PathBuf,
        size: u64,
        mode: u32,
        attrs: u64,
    },
    Bind {
        source: PathBuf,
        path: PathBuf,
        kind: Kind,
        access: Access,
        attrs: u64,
        view: View,
    },
    /// A read-only tmpfs at `dir` holding one copy of the host file
    /// `source`, as `dir/name` (the code dir without `--code`).
    ScriptCopy {
        source: PathBuf,
        dir: PathBuf,
        name: PathBuf,
    },
    Proc {
        path: PathBuf,
    },
    /// Hide a file behind an empty read-only regular file; skipped when
    /// absent. Not `/dev/null`: a read-only mount does not stop writes to a
    /// device node.
    MaskFile {
        path: PathBuf,
    },
    /// Hide a folder behind an empty read-only tmpfs; skipped when absent.
    MaskDir {
        path: PathBuf,
    },
    /// Rebind a folder onto itself read-only; skipped when absent.
    ReadOnly {
        path: PathBuf,
    },
    /// Show `content` as the file `path` (a procfs file): a read-only bind
    /// of a file on the scratch tmpfs, which is detached afterwards.
    FileOver {
        path: PathBuf,
        content: String,
    },
    /// A small tmpfs at `dir` holding `files` (paths relative to it, their
    /// folders made), read-only once written.
    Files {
        dir: PathBuf,
        files: Vec<(PathBuf, String)>,
    },
    /// The size-capped output dir: a tmpfs with a cap on bytes and inodes,
    /// owned by the sandbox uid.
    OutputTmpfs {
        path: PathBuf,
        size: u64,
        inodes: u64,
    },
}

/// The ordered mount plan for a request. Pure: no I/O.
pub(crate) fn plan(req: &Request) -> Vec<MountOp> {
    let p = PathBuf::from;
    let mut ops = Vec::new();
    for entry in &req.rootfs_entries {
        match entry {
            RootfsEntry::Dir(name) => {
                let path = Path::new("/").join(name);
                ops.push(MountOp::Dir { path: path.clone(), mode: 0o755 });
                ops.push(MountOp::Bind {
                    source: req.rootfs.join(name),
                    path,
                    kind: Kind::Dir,
                    access: Access::ReadOnly,
                    attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    view: View::Rerooted,
                });
            }
            RootfsEntry::Symlink(name, target) => {
                ops.push(MountOp::Symlink { path: Path::new("/").join(name), target: target.clone() });
            }
        }
    }
    // /dev: a small tmpfs with only the harmless character devices.
    ops.push(MountOp::Dir { path: p("/dev"), mode: 0o755 });
    ops.push(MountOp::Tmpfs {
        path: p("/dev"),
        size: 64 << 10,
        mode: 0o755,
        attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
    });
    for dev in DEVICES {
        ops.push(MountOp::Bind {
            source: Path::new("/dev").join(dev),
            path: Path::new("/dev").join(dev),
            kind: Kind::File,
            access: Access::ReadWrite,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
            view: View::Tree,
        });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(MountOp::Symlink { path: Path::new("/dev").join(name), target: p(target) });
    }
    ops.push(MountOp::Dir { path: p("/dev/shm"), mode: 0o755 });
    ops.push(MountOp::Tmpfs {
        path: p("/dev/shm"),
        size: req.shm_size,
        mode: 0o1777,
        attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
    });
    // /proc: our own pid namespace's view, with host-wide knobs masked.
    ops.push(MountOp::Dir { path: p("/proc"), mode: 0o555 });
    ops.push(MountOp::Proc { path: p("/proc") });
    for f in MASKED_PROC_FILES {
        ops.push(MountOp::MaskFile { path: Path::new("/proc").join(f) });
    }
    for d in MASKED_PROC_DIRS {
        ops.push(MountOp::MaskDir { path: Path::new("/proc").join(d) });
    }
    for d in READONLY_PROC_DIRS {
        ops.push(MountOp::ReadOnly { path: Path::new("/proc").join(d) });
    }
    // The run's limits where programs read them (inside.rs).
    if let Some(content) = &req.meminfo {
        ops.push(MountOp::FileOver { path: p(MEMINFO), content: content.clone() });
    }
    if !req.sys_files.is_empty() {
        ops.push(MountOp::Dir { path: p(SYS_DIR), mode: 0o555 });
        ops.push(MountOp::Files { dir: p(SYS_DIR), files: req.sys_files.clone() });
    }
    ops.push(MountOp::Dir { path: p("/tmp"), mode: 0o1777 });
    ops.push(MountOp::Tmpfs {
        path: p("/tmp"),
        size: req.tmp_size,
        mode: 0o1777,
        attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
    });
    ops.push(MountOp::Dir { path: p(WORKSPACE), mode: 0o755 });
    ops.push(MountOp::Dir { path: p(INPUT_DIR), mode: 0o755 });
    if let Some(input) = &req.input {
        ops.push(MountOp::Bind {
            source: input.clone(),
            path: p(INPUT_DIR),
            kind: Kind::Dir,
            access: Access::ReadOnly,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            view: View::Rerooted,
        });
    }
    ops.push(MountOp::Dir { path: p(CODE_DIR), mode: 0o755 });
    match &req.code {
        Code::Script { file, name } => {
            ops.push(MountOp::ScriptCopy { source: file.clone(), dir: p(CODE_DIR), name: name.clone() })
        }
        Code::Dir(dir) | Code::Session { dir: Some(dir), .. } => ops.push(MountOp::Bind {
            source: dir.clone(),
            path: p(CODE_DIR),
            kind: Kind::Dir,
            access: Access::ReadOnly,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            view: View::Rerooted,
        }),
        Code::Session { dir: None, .. } => {}
    }
    if let Code::Session { driver, .. } = &req.code {
        ops.push(MountOp::Dir { path: p(DRIVER_DIR), mode: 0o755 });
        ops.push(MountOp::ScriptCopy { source: driver.clone(), dir: p(DRIVER_DIR), name: PathBuf::from(DRIVER_NAME) });
    }
    ops.push(MountOp::Dir { path: p(OUTPUT_DIR), mode: 0o755 });
    match req.output_size {
        Some(size) => ops.push(MountOp::OutputTmpfs { path: p(OUTPUT_DIR), size, inodes: crate::output::MAX_INODES }),
        None => ops.push(MountOp::Bind {
            source: req.output.clone(),
            path: p(OUTPUT_DIR),
            kind: Kind::Dir,
            access: Access::ReadWrite,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            view: View::Tree,
        }),
    }
    ops
}

/// The folders of a plan whose mountinfo line will show their host path
/// (their path within their filesystem), for `isolation.degraded`: the
/// writable output bind. Device files show their name on devtmpfs only.
pub(crate) fn still_showing(ops: &[MountOp]) -> Vec<(PathBuf, PathBuf)> {
    ops.iter()
        .filter_map(|op| match op {
            MountOp::Bind { source, path, kind: Kind::Dir, view: View::Tree, .. } => Some((path.clone(), source.clone())),
            _ => None,
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MountError {
    #[error("open mount source {path} without following symlinks")]
    OpenSource { path: PathBuf, source: io::Error },
    #[error("{path} is not a kernel memory device (char major 1)")]
    NotMemoryDevice { path: PathBuf },
    #[error("mkdir {path}")]
    Mkdir { path: PathBuf, source: io::Error },
    #[error("create {path}")]
    CreateFile { path: PathBuf, source: io::Error },
    #[error("symlink {path} -> {target}")]
    Symlink {
        path: PathBuf,
        target: PathBuf,
        source: io::Error,
    },
    #[error("mount({fstype} -> {target})")]
    Mount {
        fstype: &'static str,
        target: PathBuf,
        source: nix::Error,
    },
    #[error("open_tree({path})")]
    OpenTree { path: PathBuf, source: io::Error },
    #[error("mount_setattr({path})")]
    SetAttr { path: PathBuf, source: io::Error },
    #[error("make {path} and the mounts beneath it {attrs} without mount_setattr")]
    Remount {
        path: PathBuf,
        attrs: String,
        source: remount::RemountError,
    },
    #[error("move_mount(-> {target})")]
    MoveMount { target: PathBuf, source: io::Error },
    #[error("mount(\"/\", MS_REC | MS_PRIVATE)")]
    MakePrivate(#[source] nix::Error),
    #[error("chdir({path})")]
    Chdir { path: PathBuf, source: nix::Error },
    #[error("pivot_root(\".\", \".\")")]
    PivotRoot(#[source] nix::Error),
    #[error("umount2(old root, MNT_DETACH)")]
    DetachOldRoot(#[source] nix::Error),
    #[error("script {path} is {size} bytes, over {MAX_SCRIPT_BYTES}; pass its folder with --code DIR")]
    ScriptTooBig { path: PathBuf, size: u64 },
    #[error("copy the script {path} into {target}")]
    CopyScript {
        path: PathBuf,
        target: PathBuf,
        source: io::Error,
    },
}

/// Every source of the plan, opened before anything is mounted, in plan
/// order: a source at or above the staging dir (a script in /tmp, an input
/// dir of /) must not carry the staging tmpfs into the jail with it.
pub(crate) struct Sources {
    opened: Vec<Source>,
}

enum Source {
    /// A detached copy of the source's mount tree ([`View::Tree`]).
    Tree(OwnedFd),
    /// The source itself ([`View::Rerooted`]). Not cloned up front (closing
    /// an unused detached tree waits for an RCU grace period, milliseconds)
    /// unless it lies at or above the staging dir, where a clone taken
    /// later would carry the staging tmpfs in: `early` is then the tree
    /// the fallback binds.
    At { fd: OwnedFd, early: Option<OwnedFd> },
    /// The script, open for reading.
    File(std::fs::File),
}

/// What [`apply`] could not do as planned, in words for `isolation.degraded`.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub degraded: Vec<String>,
}

/// Child side, first: stop our mounts from propagating back to the host.
pub(crate) fn make_private() -> Result<(), MountError> {
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(MountError::MakePrivate)
}

fn open_nofollow(path: &Path, kind: Kind) -> Result<OwnedFd, MountError> {
    let flags = libc::O_PATH | if kind == Kind::Dir { libc::O_DIRECTORY } else { 0 };
    sys::openat2(None, path, flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        .map_err(|source| MountError::OpenSource { path: path.to_path_buf(), source })
}

/// Child side: open every bind source of the plan, without following
/// symlinks. Device sources must be the kernel's memory devices (char major
/// 1: null, zero, full, random, urandom); a look-alike would turn a bind into
/// a window (runc CVE-2025-31133).
pub(crate) fn open_sources(ops: &[MountOp], staging: &Path) -> Result<Sources, MountError> {
    let mut opened = Vec::new();
    for op in ops {
        match op {
            MountOp::Bind { source, kind, view, .. } => {
                let fd = open_nofollow(source, *kind)?;
                if *kind == Kind::File && source.starts_with("/dev") {
                    let st = nix::sys::stat::fstat(fd.as_raw_fd())
                        .map_err(|e| MountError::OpenSource { path: source.clone(), source: e.into() })?;
                    if st.st_mode & libc::S_IFMT != libc::S_IFCHR || libc::major(st.st_rdev) != 1 {
                        return Err(MountError::NotMemoryDevice { path: source.clone() });
                    }
                }
                if *view == View::Rerooted {
                    let early = match staging.starts_with(source) {
                        true => Some(
                            sys::open_tree_clone(fd.as_fd())
                                .map_err(|e| MountError::OpenTree { path: source.clone(), source: e })?,
                        ),
                        false => None,
                    };
                    opened.push(Source::At { fd, early });
                    continue;
                }
                let tree =
                    sys::open_tree_clone(fd.as_fd()).map_err(|e| MountError::OpenTree { path: source.clone(), source: e })?;
                opened.push(Source::Tree(tree));
            }
            MountOp::ScriptCopy { source, .. } => {
                // Opened with the caller's credentials, like every source:
                // the script need not be readable by the sandbox uid.
                let flags = libc::O_RDONLY | libc::O_NOFOLLOW;
                let fd = sys::openat2(None, source, flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
                    .map_err(|e| MountError::OpenSource { path: source.clone(), source: e })?;
                opened.push(Source::File(std::fs::File::from(fd)));
            }
            _ => {}
        }
    }
    Ok(Sources { opened })
}

/// Child side: mount an empty tmpfs at `staging` and build the plan under it.
pub(crate) fn apply(ops: &[MountOp], sources: Sources, staging: &Path) -> Result<Applied, MountError> {
    mount_tmpfs(staging, 1 << 20, 0o755, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
    let mut masks = MaskSource::create(staging)?;
    let mut opened = sources.opened.into_iter();
    let mut applied = Applied::default();
    for op in ops {
        match op {
            MountOp::Dir { path, mode } => {
                let at = under(staging, path);
                std::fs::DirBuilder::new()
                    .mode(*mode)
                    .create(&at)
                    .or_else(|e| if e.kind() == io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) })
                    .map_err(|source| MountError::Mkdir { path: at.clone(), source })?;
                // mkdir honours the umask; the mode must be exact (e.g. 1777 /tmp).
                nix::sys::stat::fchmodat(
                    None,
                    &at,
                    nix::sys::stat::Mode::from_bits_truncate(*mode),
                    nix::sys::stat::FchmodatFlags::FollowSymlink,
                )
                .map_err(|e| MountError::Mkdir { path: at.clone(), source: e.into() })?;
            }
            MountOp::Symlink { path, target } => {
                let at = under(staging, path);
                std::os::unix::fs::symlink(target, &at).map_err(|source| MountError::Symlink {
                    path: at.clone(),
                    target: target.clone(),
                    source,
                })?;
            }
            MountOp::Tmpfs { path, size, mode, attrs } => {
                let at = under(staging, path);
                mount_tmpfs(&at, *size, *mode, ms_flags(*attrs))?;
            }
            MountOp::Bind { source, path, kind, access, attrs, view } => {
                let at = under(staging, path);
                if *kind == Kind::File {
                    create_empty_file(&at)?;
                }
                let ro = if *access == Access::ReadOnly { MOUNT_ATTR_RDONLY } else { 0 };
                let tree = match (opened.next(), view) {
                    (Some(Source::Tree(tree)), View::Tree) => tree,
                    (Some(Source::At { fd, early }), View::Rerooted) => {
                        let Err(e) = mount_rerooted(&fd, &masks.empty_dir, &at, ms_flags(attrs | ro)) else { continue };
                        applied.degraded.push(format!(
                            "/proc/self/mountinfo shows where {} comes from on the host ({}, as its path within \
                             its filesystem): overlayfs refused to re-root it ({e}: {}), so it is a plain bind",
                            path.display(),
                            source.display(),
                            std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()
                        ));
                        match early {
                            Some(tree) => tree,
                            None => sys::open_tree_clone(fd.as_fd())
                                .map_err(|e| MountError::OpenTree { path: source.clone(), source: e })?,
                        }
                    }
                    _ => return Err(MountError::OpenTree { path: at, source: io::Error::other("no source opened") }),
                };
                attach(tree, &at, attrs | ro)?;
            }
            MountOp::ScriptCopy { source, dir, name } => {
                let Some(Source::File(file)) = opened.next() else {
                    return Err(MountError::OpenTree { path: source.clone(), source: io::Error::other("no script opened") });
                };
                copy_script(file, source, &under(staging, dir), name)?;
            }
            MountOp::Proc { path } => {
                let at = under(staging, path);
                nix::mount::mount(
                    Some("proc"),
                    &at,
                    Some("proc"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    None::<&str>,
                )
                .map_err(|source| MountError::Mount { fstype: "proc", target: at, source })?;
            }
            MountOp::MaskFile { path } => {
                let at = under(staging, path);
                if at.exists() {
                    bind_fd(&masks.empty, &at, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?;
                }
            }
            MountOp::MaskDir { path } => {
                let at = under(staging, path);
                if at.is_dir() {
                    mount_tmpfs(
                        &at,
                        4096,
                        0o555,
                        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    )?;
                }
            }
            MountOp::OutputTmpfs { path, size, inodes } => {
                let at = under(staging, path);
                let data = format!("size={size},nr_inodes={inodes},mode=755");
                nix::mount::mount(Some("tmpfs"), &at, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(data.as_str()))
                    .map_err(|source| MountError::Mount { fstype: "tmpfs", target: at, source })?;
            }
            MountOp::FileOver { path, content } => {
                let at = under(staging, path);
                let file = masks.write(content)?;
                bind_fd(&file, &at, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?;
            }
            MountOp::Files { dir, files } => write_files(&under(staging, dir), files)?,
            MountOp::ReadOnly { path } => {
                let at = under(staging, path);
                if at.is_dir() {
                    let fd = open_nofollow(&at, Kind::Dir)?;
                    bind_fd(&fd, &at, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?;
                }
            }
        }
    }
    masks.remove()?;
    Ok(applied)
}

/// Mount a read-only overlayfs at `at` whose layers are `source` and the
/// empty `empty`, both named by descriptor: the mount's root is the
/// overlay's own `/`, so mountinfo records neither path. Redirects and
/// metacopy are off: an xattr planted in the source cannot point a lookup
/// anywhere else.
fn mount_rerooted(source: &OwnedFd, empty: &OwnedFd, at: &Path, flags: MsFlags) -> Result<(), MountError> {
    let data = format!(
        "lowerdir=/proc/self/fd/{}:/proc/self/fd/{},redirect_dir=nofollow,metacopy=off,index=off",
        source.as_raw_fd(),
        empty.as_raw_fd()
    );
    nix::mount::mount(Some("overlay"), at, Some("overlay"), flags | MsFlags::MS_RDONLY, Some(data.as_str()))
        .map_err(|source| MountError::Mount { fstype: "overlay", target: at.to_path_buf(), source })
}

/// The code dir without `--code`: a tmpfs just big enough for one copy of
/// the script, made read-only once it is written. The copy is bounded by
/// the size the file had when it was opened.
fn copy_script(file: std::fs::File, source: &Path, dir: &Path, name: &Path) -> Result<(), MountError> {
    let copy_err = |e: io::Error| MountError::CopyScript { path: source.to_path_buf(), target: dir.join(name), source: e };
    let size = file.metadata().map_err(copy_err)?.len();
    if size > MAX_SCRIPT_BYTES {
        return Err(MountError::ScriptTooBig { path: source.to_path_buf(), size });
    }
    let room = size.div_ceil(4096) * 4096 + 4096;
    mount_tmpfs(dir, room, 0o755, MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC)?;
    let target = dir.join(name);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&target)
        .map_err(|source| MountError::CreateFile { path: target.clone(), source })?;
    let copied = io::copy(&mut io::Read::take(file, size), &mut out).map_err(copy_err)?;
    if copied != size {
        return Err(copy_err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{copied} of {size} bytes"))));
    }
    drop(out);
    remount_read_only(dir)
}

/// An empty read-only file on a scratch tmpfs, the source of every file mask.
/// The scratch mount is detached once the masks are bound, so nothing of it
/// is visible in the jail but the masks themselves.
struct MaskSource {
    dir: PathBuf,
    empty: OwnedFd,
    /// An empty folder: the second layer every re-rooted overlay needs
    /// (overlayfs wants two lower layers when it has no upper one).
    empty_dir: OwnedFd,
    /// How many files [`MaskSource::write`] made.
    written: u32,
}

impl MaskSource {
    fn create(staging: &Path) -> Result<MaskSource, MountError> {
        let dir = staging.join(".jail-masks");
        std::fs::create_dir(&dir).map_err(|source| MountError::Mkdir { path: dir.clone(), source })?;
        // Room for the generated files (inside.rs), a few KiB each.
        mount_tmpfs(&dir, 64 << 10, 0o555, MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC)?;
        let file = dir.join("empty");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&file)
            .map_err(|source| MountError::CreateFile { path: file.clone(), source })?;
        let empty = open_nofollow(&file, Kind::File)?;
        let sub = dir.join("empty.d");
        std::fs::DirBuilder::new()
            .mode(0o555)
            .create(&sub)
            .map_err(|source| MountError::Mkdir { path: sub.clone(), source })?;
        let empty_dir = open_nofollow(&sub, Kind::Dir)?;
        Ok(MaskSource { dir, empty, empty_dir, written: 0 })
    }

    /// A new read-only file holding `content`, opened for binding.
    fn write(&mut self, content: &str) -> Result<OwnedFd, MountError> {
        self.written += 1;
        let file = self.dir.join(format!("file.{}", self.written));
        write_file(&file, content, 0o444)?;
        open_nofollow(&file, Kind::File)
    }

    fn remove(self) -> Result<(), MountError> {
        drop(self.empty);
        drop(self.empty_dir);
        nix::mount::umount2(&self.dir, MntFlags::MNT_DETACH).map_err(|source| MountError::Mount {
            fstype: "tmpfs (unmount)",
            target: self.dir.clone(),
            source,
        })?;
        std::fs::remove_dir(&self.dir).map_err(|source| MountError::Mkdir { path: self.dir.clone(), source })
    }
}

/// Child side: the output tmpfs in the staging root, opened for the
/// supervisor (see `MountOp::OutputTmpfs`).
pub(crate) fn open_output(staging: &Path) -> Result<OwnedFd, MountError> {
    let at = under(staging, Path::new(OUTPUT_DIR));
    sys::openat2(None, &at, libc::O_RDONLY | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        .map_err(|source| MountError::OpenSource { path: at, source })
}

/// Child side: make `staging` the root and detach the old one entirely, so
/// no path leads back to the host (pivot_root(2), the `"."`/`"."` idiom).
/// A template's own jail alone keeps the old root beneath the new one, at
/// `keep` (template.rs: its forks leave by it, and detach it themselves).
pub(crate) fn pivot_root(staging: &Path, keep: Option<&str>) -> Result<(), MountError> {
    nix::unistd::chdir(staging).map_err(|source| MountError::Chdir { path: staging.to_path_buf(), source })?;
    match keep {
        None => {
            nix::unistd::pivot_root(".", ".").map_err(MountError::PivotRoot)?;
            nix::mount::umount2(".", MntFlags::MNT_DETACH).map_err(MountError::DetachOldRoot)?;
        }
        Some(at) => {
            let put_old = Path::new(".").join(at.trim_start_matches('/'));
            std::fs::DirBuilder::new()
                .mode(0o000)
                .create(&put_old)
                .map_err(|source| MountError::Mkdir { path: put_old.clone(), source })?;
            nix::unistd::pivot_root(".", &put_old).map_err(MountError::PivotRoot)?;
        }
    }
    nix::unistd::chdir("/").map_err(|source| MountError::Chdir { path: PathBuf::from("/"), source })?;
    // The root tmpfs itself becomes read-only: only the granted mounts below
    // it are writable.
    let root = Path::new("/");
    let attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    match sys::mount_setattr_path(root, attrs) {
        // Before 5.12: the old remount, checked (remount.rs).
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => remount::restrict_one(root, attrs)
            .map_err(|source| MountError::Remount { path: root.to_path_buf(), attrs: attr_names(attrs), source }),
        other => other.map_err(|source| MountError::SetAttr { path: root.to_path_buf(), source }),
    }
}

fn attr_names(attrs: u64) -> String {
    let names: Vec<&str> = [
        (MOUNT_ATTR_RDONLY, "ro"),
        (MOUNT_ATTR_NOSUID, "nosuid"),
        (MOUNT_ATTR_NODEV, "nodev"),
        (MOUNT_ATTR_NOEXEC, "noexec"),
    ]
    .into_iter()
    .filter(|(bit, _)| attrs & bit != 0)
    .map(|(_, n)| n)
    .collect();
    names.join(",")
}

fn under(staging: &Path, path: &Path) -> PathBuf {
    staging.join(path.strip_prefix("/").unwrap_or(path))
}

fn ms_flags(attrs: u64) -> MsFlags {
    let mut f = MsFlags::empty();
    if attrs & MOUNT_ATTR_RDONLY != 0 {
        f |= MsFlags::MS_RDONLY;
    }
    if attrs & MOUNT_ATTR_NOSUID != 0 {
        f |= MsFlags::MS_NOSUID;
    }
    if attrs & MOUNT_ATTR_NODEV != 0 {
        f |= MsFlags::MS_NODEV;
    }
    if attrs & MOUNT_ATTR_NOEXEC != 0 {
        f |= MsFlags::MS_NOEXEC;
    }
    f
}

fn mount_tmpfs(at: &Path, size: u64, mode: u32, flags: MsFlags) -> Result<(), MountError> {
    let data = format!("size={size},mode={mode:o}");
    nix::mount::mount(Some("tmpfs"), at, Some("tmpfs"), flags, Some(data.as_str())).map_err(|source| MountError::Mount {
        fstype: "tmpfs",
        target: at.to_path_buf(),
        source,
    })
}

fn write_file(at: &Path, content: &str, mode: u32) -> Result<(), MountError> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(at)
        .map_err(|source| MountError::CreateFile { path: at.to_path_buf(), source })?;
    io::Write::write_all(&mut out, content.as_bytes()).map_err(|source| MountError::CreateFile { path: at.to_path_buf(), source })
}

/// [`MountOp::Files`]: a tmpfs sized to hold the files, written, then made
/// read-only.
fn write_files(dir: &Path, files: &[(PathBuf, String)]) -> Result<(), MountError> {
    let room = files.iter().map(|(_, c)| (c.len() as u64).div_ceil(4096) * 4096 + 4096).sum::<u64>() + 16 * 4096;
    mount_tmpfs(dir, room, 0o555, MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC)?;
    for (rel, content) in files {
        let at = dir.join(rel.strip_prefix("/").unwrap_or(rel));
        if let Some(parent) = at.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o555)
                .create(parent)
                .map_err(|source| MountError::Mkdir { path: parent.to_path_buf(), source })?;
        }
        write_file(&at, content, 0o444)?;
    }
    remount_read_only(dir)
}

fn create_empty_file(at: &Path) -> Result<(), MountError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(at)
        .map(drop)
        .map_err(|source| MountError::CreateFile { path: at.to_path_buf(), source })
}

fn bind_fd(fd: &OwnedFd, at: &Path, attrs: u64) -> Result<(), MountError> {
    let tree = sys::open_tree_clone(fd.as_fd()).map_err(|source| MountError::OpenTree { path: at.to_path_buf(), source })?;
    attach(tree, at, attrs)
}

/// Set `attrs` on every mount of a detached tree and mount it at `at`.
fn attach(tree: OwnedFd, at: &Path, attrs: u64) -> Result<(), MountError> {
    if attrs != 0 {
        match sys::mount_setattr(tree.as_fd(), attrs) {
            Ok(()) => {}
            // Before 5.12 (no mount_setattr): attach first, then remount
            // each mount of the tree and check every one (remount.rs).
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                sys::move_mount(tree.as_fd(), at).map_err(|source| MountError::MoveMount { target: at.to_path_buf(), source })?;
                return remount::restrict_tree(at, attrs).map_err(|source| MountError::Remount {
                    path: at.to_path_buf(),
                    attrs: attr_names(attrs),
                    source,
                });
            }
            Err(source) => return Err(MountError::SetAttr { path: at.to_path_buf(), source }),
        }
    }
    sys::move_mount(tree.as_fd(), at).map_err(|source| MountError::MoveMount { target: at.to_path_buf(), source })
}

/// Remount a tmpfs this module filled read-only (and nosuid, nodev, noexec).
fn remount_read_only(dir: &Path) -> Result<(), MountError> {
    let ro =
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    nix::mount::mount(None::<&str>, dir, None::<&str>, ro, None::<&str>).map_err(|source| MountError::Mount {
        fstype: "tmpfs (read-only remount)",
        target: dir.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Request {
        Request {
            rootfs: PathBuf::from("/r"),
            rootfs_entries: vec![
                RootfsEntry::Dir("usr".into()),
                RootfsEntry::Symlink("lib".into(), PathBuf::from("usr/lib")),
            ],
            input: Some(PathBuf::from("/host/in")),
            code: Code::Dir(PathBuf::from("/host/code")),
            output: PathBuf::from("/host/out"),
            tmp_size: 1 << 20,
            shm_size: 1 << 19,
            output_size: None,
            meminfo: None,
            sys_files: vec![],
        }
    }

    #[test]
    fn rootfs_is_bound_read_only_and_symlinks_are_copied() {
        let ops = plan(&request());
        assert_eq!(
            ops[..3].to_vec(),
            vec![
                MountOp::Dir { path: "/usr".into(), mode: 0o755 },
                MountOp::Bind {
                    source: "/r/usr".into(),
                    path: "/usr".into(),
                    kind: Kind::Dir,
                    access: Access::ReadOnly,
                    attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    view: View::Rerooted,
                },
                MountOp::Symlink { path: "/lib".into(), target: "usr/lib".into() },
            ]
        );
    }

    #[test]
    fn only_the_output_is_a_writable_host_bind() {
        let ops = plan(&request());
        let writable: Vec<_> = ops
            .iter()
            .filter_map(|op| match op {
                MountOp::Bind { source, access: Access::ReadWrite, kind: Kind::Dir, .. } => Some(source.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(writable, vec![PathBuf::from("/host/out")]);
    }

    #[test]
    fn workspace_binds_are_exactly_input_code_output() {
        let ops = plan(&request());
        let binds: Vec<_> = ops
            .iter()
            .filter_map(|op| match op {
                MountOp::Bind { source, path, access, .. } if path.starts_with(WORKSPACE) => {
                    Some((source.clone(), path.clone(), *access))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            binds,
            vec![
                ("/host/in".into(), INPUT_DIR.into(), Access::ReadOnly),
                ("/host/code".into(), CODE_DIR.into(), Access::ReadOnly),
                ("/host/out".into(), OUTPUT_DIR.into(), Access::ReadWrite),
            ]
        );
    }

    #[test]
    fn without_a_code_dir_only_the_script_is_copied_in() {
        let mut req = request();
        req.code = Code::Script { file: "/home/u/analysis.py".into(), name: "analysis.py".into() };
        let ops = plan(&req);
        let code: Vec<_> = ops
            .iter()
            .filter(|op| match op {
                MountOp::Bind { path, .. } | MountOp::ScriptCopy { dir: path, .. } => path == Path::new(CODE_DIR),
                _ => false,
            })
            .collect();
        assert_eq!(
            code,
            vec![&MountOp::ScriptCopy {
                source: "/home/u/analysis.py".into(),
                dir: CODE_DIR.into(),
                name: "analysis.py".into()
            }]
        );
    }

    #[test]
    fn a_sessions_driver_is_copied_in_apart_and_its_code_dir_is_the_callers_or_empty() {
        let driver = MountOp::ScriptCopy {
            source: "/run/u/s.d/jail_cell_driver.py".into(),
            dir: DRIVER_DIR.into(),
            name: DRIVER_NAME.into(),
        };
        let touching = |ops: &[MountOp]| -> Vec<MountOp> {
            ops.iter()
                .filter(|op| match op {
                    MountOp::Bind { path, .. } | MountOp::ScriptCopy { dir: path, .. } => {
                        path == Path::new(CODE_DIR) || path == Path::new(DRIVER_DIR)
                    }
                    _ => false,
                })
                .cloned()
                .collect()
        };
        let mut req = request();
        req.code = Code::Session { dir: None, driver: "/run/u/s.d/jail_cell_driver.py".into() };
        assert_eq!(touching(&plan(&req)), vec![driver.clone()]);
        req.code = Code::Session { dir: Some("/host/code".into()), driver: "/run/u/s.d/jail_cell_driver.py".into() };
        let ops = touching(&plan(&req));
        assert!(matches!(&ops[0], MountOp::Bind { source, path, access: Access::ReadOnly, .. }
            if source == Path::new("/host/code") && path == Path::new(CODE_DIR)));
        assert_eq!(ops[1..], [driver]);
    }

    #[test]
    fn every_read_only_host_folder_is_rerooted_and_only_a_writable_output_still_shows() {
        let ops = plan(&request());
        for op in &ops {
            if let MountOp::Bind { kind: Kind::Dir, access: Access::ReadOnly, view, source, .. } = op {
                assert_eq!(*view, View::Rerooted, "{}", source.display());
            }
        }
        assert_eq!(still_showing(&ops), vec![(PathBuf::from(OUTPUT_DIR), PathBuf::from("/host/out"))]);
        let mut capped = request();
        capped.output_size = Some(1 << 20);
        assert_eq!(still_showing(&plan(&capped)), vec![]);
    }

    #[test]
    fn no_input_means_an_empty_input_folder() {
        let mut req = request();
        req.input = None;
        let ops = plan(&req);
        assert!(ops.contains(&MountOp::Dir { path: INPUT_DIR.into(), mode: 0o755 }));
        assert!(!ops.iter().any(|op| matches!(op, MountOp::Bind { path, .. } if path == Path::new(INPUT_DIR))));
    }

    #[test]
    fn tmp_and_shm_carry_the_policy_sizes() {
        let ops = plan(&request());
        assert!(ops.contains(&MountOp::Tmpfs {
            path: "/tmp".into(),
            size: 1 << 20,
            mode: 0o1777,
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        }));
        assert!(ops
            .iter()
            .any(|op| matches!(op, MountOp::Tmpfs { path, size, .. } if path == Path::new("/dev/shm") && *size == 1 << 19)));
    }

    #[test]
    fn a_capped_output_is_a_tmpfs_and_no_host_bind_is_writable() {
        let mut req = request();
        req.output_size = Some(8 << 20);
        let ops = plan(&req);
        assert!(ops.contains(&MountOp::OutputTmpfs {
            path: OUTPUT_DIR.into(),
            size: 8 << 20,
            inodes: crate::output::MAX_INODES
        }));
        assert!(!ops.iter().any(|op| matches!(op, MountOp::Bind { access: Access::ReadWrite, kind: Kind::Dir, .. })));
    }

    #[test]
    fn proc_is_mounted_before_it_is_masked() {
        let ops = plan(&request());
        let proc_at = ops.iter().position(|op| matches!(op, MountOp::Proc { .. })).unwrap();
        let first_mask = ops.iter().position(|op| matches!(op, MountOp::MaskFile { .. })).unwrap();
        assert!(proc_at < first_mask);
        assert!(ops.contains(&MountOp::MaskFile { path: "/proc/sysrq-trigger".into() }));
        assert!(ops.contains(&MountOp::ReadOnly { path: "/proc/sys".into() }));
    }
}
