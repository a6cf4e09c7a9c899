//! The supervisor↔child channels, every one made by [`Channels::new`].
//!
//! | channel   | kind             | direction            | carries |
//! |-----------|------------------|----------------------|---------|
//! | `release` | pipe             | supervisor → child   | one byte once the id maps are written (and the cgroup joined); end-of-file instead means the supervisor gave up, and the child exits |
//! | `report`  | pipe             | child → supervisor   | newline-delimited [`Report`] messages; end-of-file with no `Failed` means the interpreter was exec'd (nsjail's trick: the last copy of the write end closes on exec) |
//! | `status`  | pipe             | PID 1 → supervisor   | the script's wait status once it is reaped |
//! | `stdout`  | pipe             | script → supervisor  | the script's stdout (capture.rs) |
//! | `stderr`  | pipe             | script → supervisor  | the script's stderr (capture.rs) |
//! | `output`  | seqpacket pair   | both ways            | with `output_size`: PID 1 sends the output tmpfs's fd, the supervisor fills it and answers one byte (output.rs) |
//! | `notify`  | seqpacket pair   | worker → supervisor  | in notify mode: the seccomp user-notification listener (seccomp/notify.rs) |
//! | `proxy`   | seqpacket pair   | PID 1 → supervisor   | with `network.mode: allowlist`: the proxy's listening socket (network.rs) |
//! | `control` | stream pair      | both ways            | `jail session` only: the cell driver's stdin; JSON lines `exec` → `ready`/`done` (session.rs) |
//! | `cgroup`  | seqpacket pair   | supervisor → PID 1   | on cgroup v1: the run cgroup's `tasks` files, sent once it is made with its limits (after the clone, while PID 1 builds its mounts); end-of-file instead means it could not be made, and PID 1 exits (cgroup.rs) |
//!
//! All are close-on-exec.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};

use crate::result::SetupError;

/// A pipe's two ends.
pub(crate) struct Pipe {
    pub read: OwnedFd,
    pub write: OwnedFd,
}

impl Pipe {
    pub(crate) fn new() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        Ok(Pipe { read, write })
    }
}

/// Which optional channels a run needs (from its plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Wanted {
    pub output: bool,
    pub notify: bool,
    pub proxy: bool,
    /// A session's control channel to the cell driver.
    pub control: bool,
    /// The v1 run cgroup's `tasks` files, made after the clone.
    pub cgroup: bool,
}

/// A channel that could not be made, by name (see the table above).
#[derive(Debug, thiserror::Error)]
#[error("create the {which} channel")]
pub(crate) struct ChannelError {
    pub which: &'static str,
    #[source]
    pub source: io::Error,
}

/// Both ends of a socketpair: `ours` stays with the supervisor, `theirs`
/// goes to the child.
pub(crate) struct Pair {
    pub ours: OwnedFd,
    pub theirs: OwnedFd,
}

/// Every channel of one run.
pub(crate) struct Channels {
    pub release: Pipe,
    pub report: Pipe,
    pub status: Pipe,
    pub stdout: Pipe,
    pub stderr: Pipe,
    pub output: Option<Pair>,
    pub notify: Option<Pair>,
    pub proxy: Option<Pair>,
    pub control: Option<Pair>,
    pub cgroup: Option<Pair>,
}

impl Channels {
    pub(crate) fn new(wanted: Wanted) -> Result<Channels, ChannelError> {
        let pipe = |which| Pipe::new().map_err(|source| ChannelError { which, source });
        let pair = |which, want: bool| -> Result<Option<Pair>, ChannelError> {
            if !want {
                return Ok(None);
            }
            let (ours, theirs) = crate::sys::seqpacket_pair().map_err(|source| ChannelError { which, source })?;
            Ok(Some(Pair { ours, theirs }))
        };
        Ok(Channels {
            release: pipe("release")?,
            report: pipe("report")?,
            status: pipe("status")?,
            stdout: pipe("stdout")?,
            stderr: pipe("stderr")?,
            output: pair("output", wanted.output)?,
            notify: pair("notify", wanted.notify)?,
            proxy: pair("proxy", wanted.proxy)?,
            cgroup: pair("cgroup", wanted.cgroup)?,
            control: match wanted.control {
                false => None,
                true => {
                    let (ours, theirs) = crate::sys::stream_pair().map_err(|source| ChannelError { which: "control", source })?;
                    Some(Pair { ours, theirs })
                }
            },
        })
    }
}

/// A message from the child side.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Report {
    /// Setup stages in the order they finished, each with the CLOCK_MONOTONIC
    /// time (nanoseconds) it finished at; sent once, right before exec.
    Stages(Vec<(String, u64)>),
    /// Setup failed; the child exits 125 right after sending this.
    Failed(SetupError),
    /// What setup could not do as planned and did another way, in words
    /// for `isolation.degraded`; sent by PID 1 before the worker exists.
    Degraded(Vec<String>),
    /// The script exited with this code (sent on `status`).
    Exited { code: i32 },
    /// The script was killed by this signal (sent on `status`).
    Signaled { signal: i32 },
}

/// CLOCK_MONOTONIC in nanoseconds; comparable across our namespaces because
/// we never create a time namespace.
pub(crate) fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC);
    ts.map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64).unwrap_or(0)
}

/// Milliseconds since `t`, for `timings`.
pub(crate) fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Send one message. Errors are ignored by callers on the child side: if the
/// supervisor is gone there is nobody to tell.
pub(crate) fn send(fd: &OwnedFd, report: &Report) -> io::Result<()> {
    let mut line = serde_json::to_vec(report).map_err(io::Error::other)?;
    line.push(b'\n');
    // One write of a small message to a pipe is atomic (PIPE_BUF), so messages
    // from PID 1 and the worker never interleave.
    let mut f = std::fs::File::from(fd.try_clone()?);
    f.write_all(&line)
}

/// Parse every complete message in a buffer read from a pipe.
pub(crate) fn parse_reports(buf: &[u8]) -> Vec<Report> {
    buf.split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect()
}

/// Block until the supervisor releases us; false means it went away.
pub(crate) fn wait_for_release(fd: OwnedFd) -> bool {
    let mut byte = [0u8; 1];
    matches!(std::fs::File::from(fd).read(&mut byte), Ok(1))
}

/// Whether nobody reads the other end of this pipe any more: poll(2)
/// reports POLLERR on a write end without readers.
pub(crate) fn reader_gone(fd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
    poll(&mut fds, PollTimeout::ZERO).is_ok() && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLERR))
}

/// Let the child go.
pub(crate) fn release(fd: OwnedFd) -> io::Result<()> {
    std::fs::File::from(fd).write_all(&[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_whose_reader_closed_says_so() {
        let p = Pipe::new().unwrap();
        assert!(!reader_gone(&p.write));
        drop(p.read);
        assert!(reader_gone(&p.write));
    }

    #[test]
    fn the_cgroup_channel_carries_every_tasks_file_in_one_message_and_eof_means_none() {
        let chans = Channels::new(Wanted { cgroup: true, ..Wanted::default() }).unwrap();
        let Pair { ours, theirs } = chans.cgroup.unwrap();
        // Five hierarchies' files, as on a hybrid host.
        let files: Vec<std::fs::File> = (0..5).map(|_| tempfile::tempfile().unwrap()).collect();
        let fds: Vec<_> = files.iter().map(std::os::fd::AsFd::as_fd).collect();
        crate::sys::send_fds(std::os::fd::AsFd::as_fd(&ours), &fds).unwrap();
        let got = crate::sys::recv_fds(std::os::fd::AsFd::as_fd(&theirs)).unwrap();
        assert_eq!(got.len(), 5);
        for (fd, mut f) in got.into_iter().zip(files) {
            // The same open file: a write through one shows through the other.
            nix::unistd::write(&fd, b"0").unwrap();
            let mut text = String::new();
            std::io::Seek::rewind(&mut f).unwrap();
            f.read_to_string(&mut text).unwrap();
            assert_eq!(text, "0");
        }
        drop(ours);
        assert!(crate::sys::recv_fds(std::os::fd::AsFd::as_fd(&theirs)).unwrap().is_empty());
    }

    #[test]
    fn messages_cross_a_pipe_and_end_at_eof() {
        let p = Pipe::new().unwrap();
        send(&p.write, &Report::Stages(vec![("mounts".into(), 5)])).unwrap();
        send(&p.write, &Report::Exited { code: 3 }).unwrap();
        drop(p.write);
        let mut buf = Vec::new();
        std::fs::File::from(p.read).read_to_end(&mut buf).unwrap();
        let got = parse_reports(&buf);
        assert_eq!(got, vec![Report::Stages(vec![("mounts".into(), 5)]), Report::Exited { code: 3 }]);
    }
}
