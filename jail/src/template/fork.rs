//! The template's side of a fork, and the fork's first steps.
//!
//! [`entry`] runs in the template's interpreter: template.py loads this
//! crate's cdylib (`libjail.so`) with `ctypes.PyDLL` and calls
//! `jail_template_fork` (sys.rs) for each request, with the interpreter's
//! lock held. It decodes the spec (wire.rs), clones the template into the
//! namespaces a cloned jail gets (`namespaces::CLONE_FLAGS`), with
//! CPython's own fork hooks around the clone as `os.fork` calls them (its
//! locks, its thread state, `os.register_at_fork` handlers such as the
//! `random` module's reseeding), and hands the new PID 1 to child.rs
//! (`run_forked`). The clone refuses a template that has a second thread
//! (sys.rs, `clone_process`), as it refuses a threaded supervisor.
//!
//! The fork's first steps (child/forked.rs) are the ones a cloned child
//! does not need: its supervisor is not its parent, is not in its parent
//! user namespace and cannot see its pid, so the fork writes its own gid
//! map and, unless its supervisor maps it to a uid of its own (as root:
//! uids.rs), its uid map (one line each, its own ids in the template's
//! namespace: allowed to an unprivileged process), says who it is on the
//! connection (the kernel attaches its credentials, translated into the
//! supervisor's pid and user namespaces: its pid, and its host ids), and,
//! once released, leaves the template's root for the host's, which the
//! template keeps beneath its own (`mounts::HOST_ROOT`) for this alone. From
//! there on it is where a cloned child starts, in a mount namespace of its
//! own, and everything else is child.rs's: the same mount plan (every
//! source opened by path without following a link, as the template's
//! uid), pivot_root and the old root detached, hostname, cgroup and its
//! namespace, capabilities dropped, no_new_privs, rlimits, landlock and
//! seccomp.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::wire;
use crate::sys::{self, Forked};

/// One request, the first `len` bytes of `buf`: in the template the
/// fork's pid in the template's pid namespace; in the fork's worker,
/// confined, 0; -1 when no fork was made (the reason sent on `conn`).
/// With it, how many bytes of `buf` are the fork's interpreter's argv and
/// environment (in its worker alone; 0 otherwise). The request itself,
/// which names host paths (its mount sources, the rootfs), is zeroed in
/// `buf` before the clone, so no fork's memory holds it there.
pub(crate) fn entry(buf: &mut [u8], len: usize, fds: Vec<OwnedFd>, conn: BorrowedFd<'_>) -> (i32, usize) {
    let decoded = wire::decode(&buf[..len], fds);
    buf[..len].fill(0);
    let (spec, exec) = match decoded {
        Ok(decoded) => decoded,
        Err(why) => return (refuse(conn, &why), 0),
    };
    // Our ids in the template's user namespace, which the fork's own
    // namespace maps its sandbox ids to: unmapped in the fork until then.
    let outside = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    // Without them the fork would keep the template's random state and
    // locks as they were: refused, not degraded.
    let Some(hooks) = sys::python_fork_hooks() else {
        let why = "the template's process has no CPython fork hooks (PyOS_BeforeFork): not a CPython interpreter";
        return (refuse(conn, why), 0);
    };
    (hooks.before)();
    match sys::clone_process(crate::namespaces::CLONE_FLAGS) {
        Err(e) => {
            (hooks.after_parent)();
            drop(spec);
            (refuse(conn, &format!("the template could not clone: {e}")), 0)
        }
        Ok(Forked::Parent(pid)) => {
            (hooks.after_parent)();
            // Our copies of the child's ends go now: the supervisor must
            // see the ends close when the fork's do.
            drop(spec);
            (pid.as_raw(), 0)
        }
        Ok(Forked::Child) => {
            (hooks.after_child)();
            let Some(hello) = sys::take_inherited_fd(conn.as_raw_fd()) else {
                sys::exit_now(crate::result::EXIT_SETUP_FAILED);
            };
            crate::child::run_forked(spec, hello, outside);
            let n = exec.len().min(buf.len());
            buf[..n].copy_from_slice(&exec[..n]);
            (0, n)
        }
    }
}

/// Say why no fork was made, on the request's connection.
fn refuse(conn: BorrowedFd<'_>, why: &str) -> i32 {
    let _ = nix::sys::socket::send(conn.as_raw_fd(), why.as_bytes(), nix::sys::socket::MsgFlags::MSG_NOSIGNAL);
    -1
}
