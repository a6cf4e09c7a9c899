//! Notification answers: the supervisor's side of the refusals the filter
//! reports. It reads each parked call from the listener, answers it with
//! the errno the policy's reference evaluator gives (or, in allowlist mode,
//! lets a TCP stream socket through), and counts it by syscall and, for
//! socket(), by address family, up to a cap.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

use libseccomp::{ScmpNotifReq, ScmpNotifResp, ScmpNotifRespFlags};

use super::bpf::SeccompData;
use super::model::{self, Action, Cause, Model, NATIVE_ARCH};
use crate::result::Denial;

/// The first this many answered notifications (refusals, and with
/// `network.mode: allowlist` the TCP sockets let through) are itemised in
/// `denials`. Each answer costs supervisor CPU outside the run's cgroup, so
/// past the cap the supervisor answers at most one every [`PAST_CAP_PACE`]:
/// every call still gets its answer (the same errno, and TCP sockets still
/// go through), only slower, and the calls are counted in one number
/// (`isolation.seccomp.calls_past_cap`) instead of by syscall, which keeps
/// the tally's memory bounded whatever the script passes.
pub const MAX_ANSWERED: u64 = 10_000;

/// Past [`MAX_ANSWERED`], the least time between two answers: at most 1,000
/// a second, a few milliseconds of supervisor CPU each second.
pub(crate) const PAST_CAP_PACE: std::time::Duration = std::time::Duration::from_millis(1);

/// Whether this kernel takes `SECCOMP_USER_NOTIF_FLAG_CONTINUE` (Linux
/// 5.5), with which allowlist mode lets TCP sockets through. User
/// notification itself came in 5.0, so `host_mode` alone cannot say.
pub(crate) fn host_can_continue() -> bool {
    can_continue(&std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default())
}

/// [`host_can_continue`] from a kernel release string (`uname -r`); one it
/// cannot read counts as too old.
pub(super) fn can_continue(release: &str) -> bool {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|m| m.parse::<u32>().ok());
    let minor = parts.next().and_then(|m| m.parse::<u32>().ok());
    matches!((major, minor), (Some(major), Some(minor)) if (major, minor) >= (5, 5))
}

/// `AF_*` names by number (include/linux/socket.h).
const FAMILIES: [&str; 46] = [
    "AF_UNSPEC",
    "AF_UNIX",
    "AF_INET",
    "AF_AX25",
    "AF_IPX",
    "AF_APPLETALK",
    "AF_NETROM",
    "AF_BRIDGE",
    "AF_ATMPVC",
    "AF_X25",
    "AF_INET6",
    "AF_ROSE",
    "AF_DECnet",
    "AF_NETBEUI",
    "AF_SECURITY",
    "AF_KEY",
    "AF_NETLINK",
    "AF_PACKET",
    "AF_ASH",
    "AF_ECONET",
    "AF_ATMSVC",
    "AF_RDS",
    "AF_SNA",
    "AF_IRDA",
    "AF_PPPOX",
    "AF_WANPIPE",
    "AF_LLC",
    "AF_IB",
    "AF_MPLS",
    "AF_CAN",
    "AF_TIPC",
    "AF_BLUETOOTH",
    "AF_IUCV",
    "AF_RXRPC",
    "AF_ISDN",
    "AF_PHONET",
    "AF_IEEE802154",
    "AF_CAIF",
    "AF_ALG",
    "AF_NFC",
    "AF_VSOCK",
    "AF_KCM",
    "AF_QIPCRTR",
    "AF_SMC",
    "AF_XDP",
    "AF_MCTP",
];

/// An address family's name; the kernel reads the argument as an int.
pub(super) fn family_name(arg: u64) -> String {
    match FAMILIES.get(arg as usize) {
        Some(name) if arg >> 32 == 0 => name.to_string(),
        _ => format!("family {arg:#x}"),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Count {
    count: u64,
    errno: i32,
    cause: Cause,
}

/// Supervisor side: the refusals of one run, answered and counted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    counts: BTreeMap<(i32, Option<u64>), Count>,
    /// Notifications answered.
    pub answered: u64,
    /// Notifications the model did not refuse (should never happen; each is
    /// answered EPERM rather than let through).
    pub anomalies: u64,
    /// Whether itemising stopped at [`MAX_ANSWERED`].
    pub capped: bool,
    /// Answers the kernel no longer wanted: the caller died between our
    /// read and our answer (ENOENT). Expected when a tree is killed.
    pub answers_to_the_dead: u64,
    /// Answers the kernel refused for any other reason, and the last such
    /// error: reported, never ignored.
    pub failed_answers: u64,
    pub last_answer_error: Option<String>,
    /// Calls answered after the cap, not itemised.
    pub past_cap: u64,
    socket_nrs: Vec<i32>,
    /// With `network.mode: allowlist`: socket(2)'s number, whose TCP stream
    /// sockets are let through (`is_tcp_stream`).
    tcp_only: Option<i32>,
}

/// Whether socket(2) arguments ask for a TCP stream socket: AF_INET or
/// AF_INET6, type SOCK_STREAM (with at most SOCK_NONBLOCK and SOCK_CLOEXEC),
/// protocol 0 or IPPROTO_TCP. The kernel reads each as an int.
pub(super) fn is_tcp_stream(args: &[u64; 6]) -> bool {
    let (family, ty, protocol) = (args[0] as u32 as i32, args[1] as u32 as i32, args[2] as u32 as i32);
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    matches!(family, libc::AF_INET | libc::AF_INET6)
        && ty & !flags == libc::SOCK_STREAM
        && matches!(protocol, 0 | libc::IPPROTO_TCP)
}

/// When the supervisor should read the listener again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// As soon as it has something.
    Now,
    /// Not before this long: past the cap, or after a failed receive.
    After(std::time::Duration),
}

impl Tally {
    pub(crate) fn new() -> Tally {
        let socket_nrs = ["socket", "socketpair"].iter().filter_map(|n| model::resolve(n)).collect();
        Tally { socket_nrs, ..Tally::default() }
    }

    /// Let TCP stream sockets through (`network.mode: allowlist`).
    pub(crate) fn tcp_only(mut self) -> Tally {
        self.tcp_only = model::resolve("socket");
        self
    }

    /// The errno the model refuses `call` with.
    fn errno_for(&mut self, model: &Model, call: &SeccompData) -> (i32, Cause) {
        let verdict = model.evaluate(call);
        match verdict.action {
            Action::Errno { errno, .. } => (errno, verdict.cause),
            // The kernel only parks calls the program sends to us, which are
            // all refusals; if the model disagrees, refuse anyway.
            Action::Allow | Action::KillProcess => {
                self.anomalies += 1;
                (libc::EPERM, verdict.cause)
            }
        }
    }

    /// Record one refused call and return the errno to answer it with.
    pub(crate) fn record(&mut self, model: &Model, call: &SeccompData) -> i32 {
        let (errno, cause) = self.errno_for(model, call);
        let family = self.socket_nrs.contains(&call.nr).then_some(call.args[0]);
        let c = self.counts.entry((call.nr, family)).or_insert(Count { count: 0, errno, cause });
        c.count += 1;
        self.answered += 1;
        errno
    }

    /// Answer one pending notification on `listener`.
    pub(crate) fn answer(&mut self, model: &Model, listener: &OwnedFd) -> Next {
        let fd = listener.as_raw_fd();
        // A failure here is normally ENOENT: the caller died before we read
        // its call. The listener stays (closing it would turn every later
        // refusal into an uncounted ENOSYS and break allowlist TCP); a
        // pause keeps one that kept failing from spinning the poll loop.
        let Ok(req) = ScmpNotifReq::receive(fd) else {
            return Next::After(PAST_CAP_PACE);
        };
        let call = SeccompData {
            nr: req.data.syscall.as_raw_syscall(),
            arch: NATIVE_ARCH,
            instruction_pointer: req.data.instr_pointer,
            args: req.data.args,
        };
        let resp = if self.tcp_only == Some(call.nr) && is_tcp_stream(&call.args) {
            // The kernel runs the call as it was made. Safe to let go: all
            // three arguments are integers the caller can no longer change
            // (it is blocked in this call), with no memory to re-read. It
            // costs an answer like a refusal, so it counts toward the cap.
            self.count_answer();
            ScmpNotifResp::new_continue(req.id, ScmpNotifRespFlags::empty())
        } else if self.capped {
            let (errno, _) = self.errno_for(model, &call);
            self.count_answer();
            ScmpNotifResp::new_error(req.id, -errno, ScmpNotifRespFlags::empty())
        } else {
            let errno = self.record(model, &call);
            ScmpNotifResp::new_error(req.id, -errno, ScmpNotifRespFlags::empty())
        };
        if let Err(e) = resp.respond(fd) {
            self.answer_failed(e.errno(), e.to_string());
        }
        if self.answered >= MAX_ANSWERED {
            self.capped = true;
        }
        if self.capped {
            return Next::After(PAST_CAP_PACE);
        }
        Next::Now
    }

    /// Count an answer the kernel did not take: ENOENT means the caller died
    /// meanwhile; anything else is a fault the result reports.
    fn answer_failed(&mut self, errno: Option<libseccomp::error::SeccompErrno>, message: String) {
        if errno == Some(libseccomp::error::SeccompErrno::ENOENT) {
            self.answers_to_the_dead += 1;
        } else {
            self.failed_answers += 1;
            self.last_answer_error = Some(message);
        }
    }

    /// Count an answer that is not itemised: before the cap it still counts
    /// toward it, after it only in `past_cap`.
    fn count_answer(&mut self) {
        if self.capped {
            self.past_cap += 1;
        } else {
            self.answered += 1;
        }
    }

    /// The result's `denials`, most frequent first.
    pub(crate) fn denials(&self, model: &Model) -> Vec<Denial> {
        let mut out: Vec<Denial> = self
            .counts
            .iter()
            .map(|((nr, family), c)| Denial {
                layer: "seccomp".into(),
                what: model::syscall_name(*nr),
                count: c.count,
                family: family.map(family_name),
                errno: model::errno_name(c.errno).map(String::from),
                detail: Some(model.why(c.cause).to_string()),
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.what.cmp(&b.what)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seccomp::tests::{data, default_model};

    #[test]
    fn only_tcp_stream_sockets_count_as_tcp() {
        let (inet, inet6, unix) = (libc::AF_INET as u64, libc::AF_INET6 as u64, libc::AF_UNIX as u64);
        let stream = libc::SOCK_STREAM as u64;
        let flags = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64;
        for args in [
            [inet, stream, 0, 0, 0, 0],
            [inet6, stream | flags, 6, 0, 0, 0],
            [inet | (1 << 40), stream, 0, 0, 0, 0],
        ] {
            assert!(is_tcp_stream(&args), "{args:?}");
        }
        for args in [
            [inet, libc::SOCK_DGRAM as u64, 0, 0, 0, 0],
            [inet6, libc::SOCK_RAW as u64, 0, 0, 0, 0],
            [inet, libc::SOCK_SEQPACKET as u64, 0, 0, 0, 0],
            [inet, stream, libc::IPPROTO_SCTP as u64, 0, 0, 0],
            [inet, stream, libc::IPPROTO_MPTCP as u64, 0, 0, 0],
            [inet, stream | 0x100, 0, 0, 0, 0],
            [unix, stream, 0, 0, 0, 0],
            [libc::AF_PACKET as u64, stream, 0, 0, 0, 0],
        ] {
            assert!(!is_tcp_stream(&args), "{args:?}");
        }
    }

    #[test]
    fn the_tally_names_the_syscall_the_family_and_the_rule() {
        let m = default_model();
        let mut t = Tally::new();
        assert_eq!(t.record(&m, &data("socket", [2, 1, 0, 0, 0, 0])), libc::EPERM);
        t.record(&m, &data("socket", [2, 1, 0, 0, 0, 0]));
        t.record(&m, &data("socket", [10, 1, 0, 0, 0, 0]));
        t.record(&m, &data("ptrace", [16, 1, 0, 0, 0, 0]));
        let d = t.denials(&m);
        assert_eq!(d[0].what, "socket");
        assert_eq!(d[0].count, 2);
        assert_eq!(d[0].family.as_deref(), Some("AF_INET"));
        assert_eq!(d[0].errno.as_deref(), Some("EPERM"));
        assert!(d[0].detail.as_deref().unwrap().contains("network"), "{:?}", d[0].detail);
        assert!(d.iter().any(|x| x.what == "socket" && x.family.as_deref() == Some("AF_INET6")));
        assert!(d.iter().any(|x| x.what == "ptrace" && x.family.is_none()));
        assert_eq!(t.answered, 4);
        assert_eq!(t.anomalies, 0);
    }

    #[test]
    fn family_names_follow_the_kernel_numbering() {
        assert_eq!(family_name(1), "AF_UNIX");
        assert_eq!(family_name(2), "AF_INET");
        assert_eq!(family_name(10), "AF_INET6");
        assert_eq!(family_name(16), "AF_NETLINK");
        assert_eq!(family_name(17), "AF_PACKET");
        assert_eq!(family_name(40), "AF_VSOCK");
        assert_eq!(family_name(45), "AF_MCTP");
        assert_eq!(family_name(1 << 32 | 2), "family 0x100000002");
    }

    #[test]
    fn a_failed_answer_is_counted_and_only_a_dead_caller_is_benign() {
        use libseccomp::error::SeccompErrno;
        let mut t = Tally::new();
        t.answer_failed(Some(SeccompErrno::ENOENT), "gone".into());
        assert_eq!((t.answers_to_the_dead, t.failed_answers), (1, 0));
        t.answer_failed(Some(SeccompErrno::EINVAL), "bad answer".into());
        t.answer_failed(None, "unknown".into());
        assert_eq!((t.answers_to_the_dead, t.failed_answers), (1, 2));
        assert_eq!(t.last_answer_error.as_deref(), Some("unknown"));
    }

    #[test]
    fn notification_continue_needs_linux_5_5() {
        assert!(can_continue("6.18.0-1-amd64"));
        assert!(can_continue("5.5.0"));
        assert!(can_continue("5.10.0-28-cloud-amd64\n"));
        assert!(!can_continue("5.4.0-150-generic"));
        assert!(!can_continue("5.0.0"));
        assert!(!can_continue("4.19.0-27-amd64"));
        assert!(!can_continue(""));
        assert!(!can_continue("garbage"));
    }
}
