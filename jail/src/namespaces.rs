//! Namespaces: which ones every run gets, the uid/gid maps the supervisor
//! writes for the child, and the child's switch to the sandbox identity.

use std::io;
use std::path::PathBuf;

use nix::unistd::{Gid, Pid, Uid};

/// The namespaces the child is cloned into: user, mount, pid, net, ipc, uts.
/// The cgroup namespace comes later, from the child itself, once it is in
/// the run cgroup (child::run): its root is then where the run's processes
/// are. The net namespace stays in the clone: made by PID 1 after the clone
/// instead (overlapped with the supervisor's work) it saved nothing
/// measurable (bench/README.md).
pub(crate) const CLONE_FLAGS: libc::c_int =
    libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;

/// Every namespace a run gets, as reported in the result.
pub(crate) const NAMES: [&str; 7] = ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"];

#[derive(Debug, thiserror::Error)]
pub(crate) enum NamespaceError {
    #[error("write {path}: {source}")]
    WriteIdMap { path: PathBuf, source: io::Error },
    #[error("setresgid({0})")]
    SetGid(u32, #[source] nix::Error),
    #[error("setresuid({0})")]
    SetUid(u32, #[source] nix::Error),
    #[error("prctl(PR_SET_KEEPCAPS)")]
    KeepCaps(#[source] nix::Error),
    #[error("raise effective capabilities after the uid switch")]
    RaiseCaps(#[source] caps::errors::CapsError),
}

/// One mapping line: `inside outside 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdMap {
    pub inside: u32,
    pub outside: u32,
}

/// Supervisor side: deny setgroups, then write the child's uid and gid maps.
/// `setgroups` must be denied before an unprivileged gid_map write
/// (user_namespaces(7)); we deny it for root too, so the sandbox can never
/// pick up supplementary groups. `uid_lines`, when given, is the whole uid
/// map instead of `uid`'s one line (a root template's: template/uids.rs).
pub(crate) fn write_id_maps(child: Pid, uid: IdMap, gid: IdMap, uid_lines: Option<&str>) -> Result<(), NamespaceError> {
    let base = PathBuf::from(format!("/proc/{}", child.as_raw()));
    write(base.join("setgroups"), "deny")?;
    match uid_lines {
        Some(lines) => write(base.join("uid_map"), lines)?,
        None => write(base.join("uid_map"), &format!("{} {} 1\n", uid.inside, uid.outside))?,
    }
    write(base.join("gid_map"), &format!("{} {} 1\n", gid.inside, gid.outside))?;
    Ok(())
}

fn write(path: PathBuf, text: &str) -> Result<(), NamespaceError> {
    std::fs::write(&path, text).map_err(|source| NamespaceError::WriteIdMap { path, source })
}

/// Child side: take the sandbox uid and gid while keeping the capabilities
/// the rest of the setup needs (they are dropped just before exec). For an
/// unprivileged caller this is a no-op, since its id already maps to the
/// sandbox id; for root it leaves host uid 0, which the new user namespace
/// does not map, so that files created during setup have a mapped owner.
pub(crate) fn become_sandbox_ids(uid: u32, gid: u32) -> Result<(), NamespaceError> {
    nix::sys::prctl::set_keepcaps(true).map_err(NamespaceError::KeepCaps)?;
    let g = Gid::from_raw(gid);
    nix::unistd::setresgid(g, g, g).map_err(|e| NamespaceError::SetGid(gid, e))?;
    let u = Uid::from_raw(uid);
    nix::unistd::setresuid(u, u, u).map_err(|e| NamespaceError::SetUid(uid, e))?;
    let permitted = caps::read(None, caps::CapSet::Permitted).map_err(NamespaceError::RaiseCaps)?;
    caps::set(None, caps::CapSet::Effective, &permitted).map_err(NamespaceError::RaiseCaps)?;
    Ok(())
}
