//! Jails forked from a trusted template (issue 36).
//!
//! A template is a jail of its own (its namespaces, cgroup, host uid,
//! rlimits, no capabilities, no network) whose interpreter imports a
//! policy's trusted `preload`, draws the warm-up figure, then waits for
//! requests (pool/template.py). No untrusted code ever runs in it and no
//! request's data reaches it: a request is a spec this crate wrote (what
//! a cloned jail's child is given) and the descriptors of the channels
//! to its supervisor. For each, the template clones itself into fresh
//! namespaces, and the copy is made a full jail by the code a cloned
//! jail's child runs (child.rs, `run_forked`; template/fork.rs) before
//! any untrusted byte exists in it. The session's supervisor then runs it
//! as it runs a jail it cloned (launch.rs): released, watched, its cells
//! served, judged; the fork is destroyed at the end and nothing of it
//! returns to the template.
//!
//! # What a fork has that a cloned jail has, and what differs
//!
//! - Namespaces: its own user, mount, pid, net, ipc, uts and cgroup
//!   namespaces. Its user namespace is nested in the template's. As root,
//!   the template's namespace maps the whole lease range, and each fork's
//!   supervisor leases a host uid for its fork alone and maps the fork's
//!   sandbox uid to it (uids.rs), as it would for a cloned jail; its gid
//!   is the one every root-started jail shares. As an ordinary user, a
//!   fork maps itself to the template's ids: the caller's own, as for any
//!   jail. Where a root template's namespace cannot map the range (the
//!   policy's sandbox uid lies in it), forks run as the template's host
//!   uid and the result's `isolation.degraded` says so.
//! - Filesystem: the same mount plan, every source opened by path
//!   without following a link, as the template's uid (a root pool makes
//!   its jails' folders reachable by it, as it does for any jail's leased
//!   uid); the old root detached. Not mounted: the session's cell driver
//!   (`/.jail`), which the fork already holds in memory.
//! - Privileges, landlock, seccomp, rlimits: child.rs's, unchanged. The
//!   template itself has neither landlock nor seccomp: its forks must
//!   mount and make namespaces before they confine themselves, and both
//!   layers are inherited. It runs only the trusted preload.
//! - Resources: the session's own cgroup with the request's limits; the
//!   supervisor moves the fork into it before releasing it.
//! - Memory: a fork shares the template's pages copy-on-write; what it
//!   writes is its own (a page copied on its first write, charged to its
//!   cgroup). It shares its address-space layout too (ASLR is per
//!   template, not per fork), its hash seed and every value the preload
//!   computed: a step learns nothing from another step (each fork is a
//!   copy of the template, never of a sibling), but can learn where the
//!   template's libraries and heap sit, and so where they sit in every
//!   other fork of the same template: an exploit of a memory bug in the
//!   interpreter or a library, useless alone inside a jail, needs no leak
//!   to aim at a sibling. What re-randomises it is a new template: a pool
//!   makes one after `--template-forks` jails (1,000) or `--template-secs`
//!   (600 s), whichever comes first. The old one ends once its last jail
//!   does. A data-stack template costs 0.6-0.7 s of CPU to make (measured
//!   by scripts/experiments/fork_confined.py), so the default costs 0.65
//!   ms a jail under steady load, or 0.65 s every 10 minutes when idle.
//! - What the template's memory held: a request names host paths (the
//!   rootfs, the pool's folders for that jail). The template zeroes the
//!   request's buffer before it clones, and a fork zeroes its own plan's
//!   host paths before its step runs; what the allocator kept of decoding
//!   them (its freed blocks) is not zeroed, so a step that reads its own
//!   memory may find pieces of those paths, its template's earlier
//!   requests' among them. No step's data is there: no step ever runs in
//!   the template.
//!
//! # The template's own jail (pool/template.rs)
//!
//! `jail template` makes it (hidden from `--help`: `jail pool` runs it):
//! a jail whose root keeps the host's beneath it (`mounts::HOST_ROOT`),
//! with no landlock or seccomp, running template.py, its cells the
//! requests its supervisor passes on: the supervisor listens on a unix
//! socket (mode 0600, in a folder only its uid reaches) and hands each
//! connection to the template over the control channel.
//!
//! # A request ([`fork`])
//!
//! One connection, one request: the spec (wire.rs) and its descriptors
//! in one `SOCK_SEQPACKET` message. The answer is either one message from
//! the fork itself, to which the kernel attaches the fork's credentials
//! (our end has `SO_PASSCRED`: its pid and host ids, as seen from our
//! namespaces), or one from the template saying why no fork was made.

pub(crate) mod fork;
pub(crate) mod uids;
mod wire;

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    connect, recvmsg, sendmsg, setsockopt, sockopt, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};
use nix::unistd::Pid;

use crate::child::ChildSpec;

pub(crate) use wire::MAX_MESSAGE;

/// How long a fork may take to say who it is.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// A fork, PID 1 of its namespaces, waiting at its release barrier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forked {
    /// Its pid in ours.
    pub(crate) pid: Pid,
    /// The host ids it runs as (the template's).
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TemplateError {
    #[error("reach the template at {0}")]
    Connect(PathBuf, #[source] io::Error),
    #[error("send the request to the template")]
    Send(#[source] io::Error),
    #[error("the template made no fork: {0}")]
    Refused(String),
    #[error("the template's fork did not say who it is within {}s", HELLO_WITHIN.as_secs())]
    NoHello,
}

/// Ask the template listening at `socket` for a fork made into the jail
/// `spec` describes. Our copies of the child's ends are closed once the
/// template has them.
pub(crate) fn fork(socket: &Path, spec: ChildSpec) -> Result<Forked, TemplateError> {
    let (msg, fds) = wire::encode(spec).map_err(TemplateError::Refused)?;
    let connected = (|| -> io::Result<OwnedFd> {
        let sock = nix::sys::socket::socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
        setsockopt(&sock, sockopt::PassCred, &true)?;
        connect(sock.as_raw_fd(), &UnixAddr::new(socket)?)?;
        Ok(sock)
    })()
    .map_err(|e| TemplateError::Connect(socket.to_path_buf(), e))?;
    let raw: Vec<i32> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    sendmsg::<UnixAddr>(
        connected.as_raw_fd(),
        &[io::IoSlice::new(&msg)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| TemplateError::Send(e.into()))?;
    drop(fds);
    hello(&connected)
}

/// The fork's word (its credentials) or the template's refusal.
fn hello(sock: &OwnedFd) -> Result<Forked, TemplateError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let until = Instant::now() + HELLO_WITHIN;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::from(left.as_millis().min(u128::from(u16::MAX)) as u16);
        match poll(&mut fds, timeout) {
            Ok(0) if left.is_zero() => return Err(TemplateError::NoHello),
            Ok(0) => continue,
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(TemplateError::Send(e.into())),
        }
    }
    let mut buf = [0u8; 4096];
    let mut space = nix::cmsg_space!(libc::ucred);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<UnixAddr>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| TemplateError::Send(e.into()))?;
    let mut creds = None;
    for c in msg.cmsgs().map_err(|e| TemplateError::Send(e.into()))? {
        if let ControlMessageOwned::ScmCredentials(c) = c {
            creds = Some(c);
        }
    }
    let n = msg.bytes;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    match creds {
        // Only the fork sends "forked"; the template's refusals are text.
        Some(c) if text == "forked" => Ok(Forked { pid: Pid::from_raw(c.pid()), uid: c.uid(), gid: c.gid() }),
        _ if n == 0 => Err(TemplateError::Refused("the template closed the connection".into())),
        _ => Err(TemplateError::Refused(text)),
    }
}

/// What a fork's result says of it: the host ids it runs as, and, where
/// a lease would have given it a host uid of its own and its template's
/// namespace could not map one (uids.rs), that it shares its template's.
pub(crate) fn note(result: &mut crate::result::RunResult, (uid, gid): (u32, u32), shared: bool) {
    result.isolation.forked_from_template = true;
    result.isolation.host_uid = uid;
    result.isolation.host_gid = gid;
    if shared {
        result.isolation.degraded.push(format!(
            "this jail is a fork of a template: it runs as its template's host uid {uid}, as the template's other forks do, \
             not as a uid leased for it alone (the policy's identity.uid lies in its identity.root_host_uids)"
        ));
    }
}
