//! Streaming mode's writer: forwards the script's stdout or stderr to the
//! caller without ever blocking the supervisor's watch loop, and cuts the
//! stream at its policy cap (`limits.stdout_bytes`, `limits.stderr_bytes`).
//!
//! Supervisor side, inside the watch loop. The loop is single-threaded and
//! also keeps the wall deadline and answers seccomp notifications, so a
//! caller that reads slowly, or not at all, must never hold it up: every
//! write to the caller is non-blocking, what the caller has not taken yet
//! waits in a bounded buffer ([`BUFFER_BYTES`]), and while that buffer is
//! full the loop stops reading the script's pipe (so the script, not the
//! supervisor, waits for the reader). The watch loop polls [`Relay::fd`]
//! for `POLLOUT` while [`Relay::pending`] is true.
//!
//! Non-blocking without touching the caller's file description: `O_NONBLOCK`
//! set on fd 1 would also change the caller's shell or terminal, and would
//! stay set if `jail` were killed. So a pipe or a terminal is opened afresh
//! through `/proc/self/fd/N` with `O_NONBLOCK` (a new open file description
//! of the same pipe or device), a socket is written with `MSG_DONTWAIT`, and
//! a regular file (which never blocks for a reader) is written as it is.
//! Only when a pipe or terminal cannot be reopened is `O_NONBLOCK` set on the
//! shared description, and put back as it was when the relay ends.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Instant;

use nix::fcntl::{FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Bytes held for a caller that has not read them yet, per stream. Past it
/// the script's pipe is not read until the caller catches up.
pub(crate) const BUFFER_BYTES: usize = 256 << 10;

/// How the caller's descriptor is written without blocking.
enum Sink {
    /// A regular file: written as it is (a disk, not a reader, sets its pace).
    Plain(OwnedFd),
    /// A pipe or terminal reopened with `O_NONBLOCK`.
    Reopened(OwnedFd),
    /// A socket: `send(MSG_DONTWAIT)`.
    Socket(OwnedFd),
    /// The caller's own description with `O_NONBLOCK` set; `flags` is what
    /// it had before, put back on drop.
    Shared { fd: OwnedFd, flags: OFlag },
    /// Nothing to write to (the caller closed the descriptor before we ran).
    Closed,
}

impl Sink {
    /// `fd` is a duplicate of the caller's descriptor (same description).
    fn open(fd: OwnedFd) -> Sink {
        let kind = nix::sys::stat::fstat(fd.as_raw_fd()).map(|st| st.st_mode & libc::S_IFMT).unwrap_or(0);
        match kind {
            libc::S_IFREG => Sink::Plain(fd),
            libc::S_IFSOCK => Sink::Socket(fd),
            _ => {
                let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
                let reopened =
                    std::fs::OpenOptions::new().append(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(&path);
                match reopened {
                    Ok(file) => Sink::Reopened(file.into()),
                    Err(_) => match nix::fcntl::fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL) {
                        Ok(bits) => {
                            let before = OFlag::from_bits_truncate(bits);
                            let _ = nix::fcntl::fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(before | OFlag::O_NONBLOCK));
                            Sink::Shared { fd, flags: before }
                        }
                        // Not even readable flags: write as it is.
                        Err(_) => Sink::Plain(fd),
                    },
                }
            }
        }
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Sink::Plain(fd) | Sink::Socket(fd) | Sink::Reopened(fd) | Sink::Shared { fd, .. } => Some(fd.as_fd()),
            Sink::Closed => None,
        }
    }

    fn write(&self, bytes: &[u8]) -> nix::Result<usize> {
        match self {
            Sink::Socket(fd) => nix::sys::socket::send(
                fd.as_raw_fd(),
                bytes,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            ),
            Sink::Plain(fd) | Sink::Reopened(fd) | Sink::Shared { fd, .. } => nix::unistd::write(fd, bytes),
            Sink::Closed => Err(nix::errno::Errno::EBADF),
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Sink::Shared { fd, flags } = self {
            let _ = nix::fcntl::fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(*flags));
        }
    }
}

/// What a relay did, for the result's `stdout`/`stderr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Relayed {
    /// Bytes the script wrote to the stream.
    pub bytes: u64,
    /// Whether the stream passed its cap (the rest was dropped).
    pub truncated: bool,
    /// Bytes within the cap the caller never took (it stopped reading, or
    /// closed its end).
    pub undelivered: u64,
}

/// One stream on its way to the caller.
pub(crate) struct Relay {
    sink: Sink,
    /// `limits.stdout_bytes` or `limits.stderr_bytes`, and the field's name
    /// for the marker line.
    cap: u64,
    field: &'static str,
    buf: VecDeque<u8>,
    total: u64,
    cut: bool,
    /// The caller's end is closed (EPIPE) or broken: nothing more is written.
    gone: bool,
    undelivered: u64,
    /// Whether the last byte queued ended a line (for the marker).
    at_line_start: bool,
}

impl Relay {
    /// A relay to the caller's `fd` (its stdout or stderr).
    pub(crate) fn new(fd: BorrowedFd<'_>, cap: u64, field: &'static str) -> Relay {
        let sink = fd.try_clone_to_owned().map(Sink::open).unwrap_or(Sink::Closed);
        Relay {
            gone: matches!(sink, Sink::Closed),
            sink,
            cap,
            field,
            buf: VecDeque::new(),
            total: 0,
            cut: false,
            undelivered: 0,
            at_line_start: true,
        }
    }

    /// Take a chunk the script wrote: queue what is within the cap, drop the
    /// rest behind one marker line, and write what the caller takes now.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.total);
        self.total += chunk.len() as u64;
        let keep = &chunk[..(room.min(chunk.len() as u64) as usize)];
        self.queue(keep);
        if self.total > self.cap && !self.cut {
            self.cut = true;
            let newline = if self.at_line_start { "" } else { "\n" };
            let marker = format!(
                "{newline}[jail: the script's output passed limits.{} ({} bytes); the rest is dropped]\n",
                self.field, self.cap
            );
            self.queue(marker.as_bytes());
        }
        self.flush();
    }

    fn queue(&mut self, bytes: &[u8]) {
        if let Some(&last) = bytes.last() {
            self.at_line_start = last == b'\n';
        }
        if self.gone {
            self.undelivered += bytes.len() as u64;
        } else {
            self.buf.extend(bytes);
        }
    }

    /// Whether the watch loop may read more of the script's pipe: not while
    /// the caller has a full buffer to take.
    pub(crate) fn wants_input(&self) -> bool {
        self.buf.len() < BUFFER_BYTES
    }

    /// Whether bytes wait for the caller (poll [`Relay::fd`] for POLLOUT).
    pub(crate) fn pending(&self) -> bool {
        !self.gone && !self.buf.is_empty()
    }

    /// The descriptor to poll for POLLOUT, while [`Relay::pending`].
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.sink.fd()
    }

    /// Write what the caller takes without blocking.
    pub(crate) fn flush(&mut self) {
        while self.pending() {
            let (front, _) = self.buf.as_slices();
            match self.sink.write(front) {
                Ok(0) => break,
                Ok(n) => {
                    self.buf.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => {
                    // EPIPE and the like: the caller is gone for good.
                    self.gone = true;
                    self.undelivered += self.buf.len() as u64;
                    self.buf.clear();
                }
            }
        }
    }

    /// The stream ended: give the caller until `until` to take what is
    /// queued, then drop the rest (counted in `undelivered`).
    pub(crate) fn finish(mut self, until: Instant) -> Relayed {
        self.drain(until);
        self.undelivered += self.buf.len() as u64;
        Relayed {
            bytes: self.total,
            truncated: self.total > self.cap,
            undelivered: self.undelivered,
        }
    }

    /// What is still queued, taken out of the relay (events.rs completes
    /// the line the reader was in the middle of).
    pub(crate) fn take_queued(&mut self) -> Vec<u8> {
        self.buf.drain(..).collect()
    }

    /// Write what the caller takes until `until`, waiting for it to read.
    pub(crate) fn drain(&mut self, until: Instant) {
        self.flush();
        while self.pending() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as u64 + 1).unwrap_or(PollTimeout::MAX);
            let Some(fd) = self.sink.fd() else { break };
            let ready = {
                let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
                poll(&mut fds, timeout).map(|n| (n, fds[0].revents().unwrap_or(PollFlags::empty())))
            };
            match ready {
                Ok((0, _)) => break,
                Ok((_, r)) if r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL) => {
                    self.gone = true;
                }
                Ok(_) => self.flush(),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
    }
}

/// A relay to the process's own stdout.
pub(crate) fn to_stdout(cap: u64) -> Relay {
    Relay::new(io::stdout().as_fd(), cap, "stdout_bytes")
}

/// A relay to the process's own stderr.
pub(crate) fn to_stderr(cap: u64) -> Relay {
    Relay::new(io::stderr().as_fd(), cap, "stderr_bytes")
}

/// How long a last message to the caller's stderr may wait for it.
const TELL_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// Write `text` to the process's stderr without blocking for more than a
/// moment: a caller that stopped reading loses it rather than hanging us.
pub(crate) fn tell_stderr(text: &str) {
    if text.is_empty() {
        return;
    }
    let mut r = Relay::new(io::stderr().as_fd(), text.len() as u64, "stderr_bytes");
    r.push(text.as_bytes());
    r.finish(Instant::now() + TELL_GRACE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_that_never_reads_costs_the_writer_no_wait() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut r = Relay::new(write.as_fd(), 4 << 20, "stdout_bytes");
        let start = Instant::now();
        for _ in 0..32 {
            r.push(&[b'x'; 64 << 10]);
        }
        assert!(!r.wants_input(), "a full buffer must stop the reads");
        let end = r.finish(Instant::now());
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(end.bytes, 2 << 20);
        assert!(!end.truncated);
        // The pipe took its own buffer's worth; the rest never went out.
        assert!(end.undelivered > 0 && end.undelivered < 2 << 20, "{end:?}");
        drop(read);
    }

    #[test]
    fn past_the_cap_one_marker_line_and_nothing_more() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut r = Relay::new(write.as_fd(), 10, "stdout_bytes");
        r.push(b"0123456789abc");
        r.push(b"more");
        let end = r.finish(Instant::now() + std::time::Duration::from_secs(1));
        drop(write);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut got).unwrap();
        assert_eq!(got, "0123456789\n[jail: the script's output passed limits.stdout_bytes (10 bytes); the rest is dropped]\n");
        assert_eq!(end, Relayed { bytes: 17, truncated: true, undelivered: 0 });
    }

    #[test]
    fn a_closed_reader_ends_the_relay_and_counts_what_it_lost() {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let mut r = Relay::new(write.as_fd(), 100, "stderr_bytes");
        r.push(b"lost");
        assert!(!r.pending());
        assert_eq!(r.finish(Instant::now()).undelivered, 4);
    }
}
