//! `jail run --events`: the run as NDJSON on stdout, one event per line,
//! while the step runs: the script's stdout and stderr in chunks as the
//! supervisor reads them, then each accepted artifact, then the result.
//!
//! Supervisor side. The chunks are written from inside the watch loop
//! through one [`relay::Relay`] (relay.rs) shared by both streams, so a
//! reader that is slow or stopped never holds up the loop or the deadline:
//! what the reader has not taken waits in the relay's bounded buffer, and
//! while that is full the script's pipes are not read. Whole lines are
//! queued, so the stream stays NDJSON however the reader takes it. Once
//! the tree is dead and the result built, [`Writer::finish`] ends the stream
//! with blocking writes, as `--json` writes its document: the artifact
//! events and the result event.
//!
//! Events, each a JSON object with a `type`:
//! - `{"type":"stdout","data":TEXT}` (and `stderr`): bytes the script wrote,
//!   in order. Text that is not UTF-8 comes as `data` with U+FFFD for the bad
//!   bytes plus `base64`, the exact bytes. A UTF-8 character split between
//!   two reads is held back and sent whole.
//! - `{"type":"truncated","stream":"stdout","limit_bytes":N}`: the stream
//!   passed its cap (`limits.stdout_bytes`/`stderr_bytes`); no more of it
//!   comes as events (the result's `stdout` has head and tail, as `--json`).
//! - `{"type":"dropped","events":N}`: the reader had not taken N chunk
//!   events by the run's deadline; they were dropped (the result has the text).
//! - `{"type":"artifact","artifact":{...}}`: one entry of the result's
//!   `artifacts`, in the same order. Artifacts are judged once the whole
//!   tree is dead (artifacts.rs), so these come after the last chunk.
//! - `{"type":"result","result":{...}}`: the result document `--json` prints.
//!   Always the last line.
//!
//! A session cell sends the same chunk events on its client's socket
//! (`jail session exec --events`, `jail pool` with `"events": true`):
//! `to_fd` writes them there, and session/live.rs ends that stream with
//! `Events::close`, which queues the end instead of blocking on it.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::Write;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::relay::{self, Relay};
use crate::result::RunResult;
use crate::streams::Target;

/// One event line: the type the jail writes here and every client reads
/// (client/events.rs), defined once. Written borrowed, read owned
/// (`Event<'static>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event<'a> {
    Stdout {
        data: Cow<'a, str>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base64: Option<String>,
    },
    Stderr {
        data: Cow<'a, str>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base64: Option<String>,
    },
    Truncated {
        stream: Cow<'a, str>,
        limit_bytes: u64,
    },
    Dropped {
        events: u64,
    },
    Artifact {
        artifact: Box<Cow<'a, crate::result::Artifact>>,
    },
    /// Read by a client through `client::events::result_of` (the schema
    /// version first), not as this variant.
    Result {
        result: Box<Cow<'a, RunResult>>,
    },
}

/// How the result event, and only it, begins: the tag is written first
/// (serde writes an internally tagged enum's tag before its fields).
pub(crate) const RESULT_PREFIX: &[u8] = br#"{"type":"result","#;

/// One stream's place in the event stream.
#[derive(Default)]
struct Cut {
    /// `limits.stdout_bytes` or `limits.stderr_bytes`.
    cap: u64,
    /// Bytes of the script's output taken (sent, held or cut).
    seen: u64,
    /// The start of a UTF-8 character the next read completes.
    carry: Vec<u8>,
    truncated: bool,
    ended: bool,
}

/// The chunk events of one run, on their way to the caller's stdout.
pub(crate) struct Events {
    relay: Relay,
    streams: [Cut; 2],
}

thread_local! {
    /// The run's events, from [`open`] to [`Writer::finish`]: the captures
    /// (capture.rs) find it here, so the request need not carry it.
    static CURRENT: RefCell<Option<Rc<RefCell<Events>>>> = const { RefCell::new(None) };
}

/// The handle `jail run --events` holds for the whole run.
pub struct Writer(Rc<RefCell<Events>>);

/// Start the event stream on our stdout; the run's captures write to it.
pub fn open() -> Writer {
    // The relay's own cap is not used: each stream is cut at its policy cap
    // below, and what is queued is JSON, never more than a few times that.
    let events = Rc::new(RefCell::new(Events { relay: relay::to_stdout(u64::MAX), streams: Default::default() }));
    CURRENT.with(|c| *c.borrow_mut() = Some(Rc::clone(&events)));
    Writer(events)
}

/// The open event stream, if `jail run --events` opened one.
pub(crate) fn current() -> Option<Rc<RefCell<Events>>> {
    CURRENT.with(|c| c.borrow().clone())
}

fn index(t: Target) -> usize {
    match t {
        Target::Stdout => 0,
        Target::Stderr => 1,
    }
}

impl Events {
    pub(crate) fn set_cap(&mut self, t: Target, cap: u64) {
        self.streams[index(t)].cap = cap;
    }

    /// A chunk the script wrote to `t`: queued as events up to the cap.
    pub(crate) fn push(&mut self, t: Target, chunk: &[u8]) {
        let s = &mut self.streams[index(t)];
        if s.truncated {
            return;
        }
        let room = s.cap.saturating_sub(s.seen);
        s.seen += chunk.len() as u64;
        let keep = &chunk[..room.min(chunk.len() as u64) as usize];
        let mut bytes = std::mem::take(&mut s.carry);
        bytes.extend_from_slice(keep);
        let over = s.seen > s.cap;
        let hold = if over { 0 } else { incomplete_tail(&bytes) };
        s.carry = bytes.split_off(bytes.len() - hold);
        if over {
            s.truncated = true;
        }
        let cap = s.cap;
        self.chunk(t, &bytes);
        if over {
            self.line(&Event::Truncated { stream: Cow::Borrowed(name(t)), limit_bytes: cap });
        }
        self.relay.flush();
    }

    /// The script closed `t`: send what was held back.
    pub(crate) fn end(&mut self, t: Target) {
        let s = &mut self.streams[index(t)];
        if s.ended {
            return;
        }
        s.ended = true;
        let carry = std::mem::take(&mut s.carry);
        self.chunk(t, &carry);
        self.relay.flush();
    }

    /// Give the reader until `until` to take what is queued (never longer:
    /// the run's deadline bounds it, as streaming mode's relays).
    pub(crate) fn drain(&mut self, until: Instant) {
        self.relay.drain(until);
    }

    pub(crate) fn wants_input(&self) -> bool {
        self.relay.wants_input()
    }

    pub(crate) fn pending(&self) -> bool {
        self.relay.pending()
    }

    pub(crate) fn flush(&mut self) {
        self.relay.flush();
    }

    /// A duplicate of the descriptor the relay writes, for the watch loop's
    /// POLLOUT (the same open file description, so the same readiness).
    pub(crate) fn poll_fd(&self) -> Option<OwnedFd> {
        self.relay.fd().and_then(|fd: BorrowedFd<'_>| fd.try_clone_to_owned().ok())
    }

    /// No chunk comes any more: what the reader has not taken yet is cut to
    /// the line it is in the middle of (completed, or when it stopped
    /// between lines one more whole event), the rest counted in one
    /// `dropped` event, and `last` (whole lines) follows. The bytes still
    /// to write, taken out of the relay.
    fn tail(&mut self, last: &[u8]) -> Vec<u8> {
        self.end(Target::Stdout);
        self.end(Target::Stderr);
        self.relay.flush();
        let left = self.relay.take_queued();
        let mut out = Vec::new();
        let rest = match memchr::memchr(b'\n', &left) {
            Some(end) => {
                out.extend_from_slice(&left[..=end]);
                &left[end + 1..]
            }
            None => &left[..],
        };
        let dropped = memchr::memchr_iter(b'\n', rest).count() as u64;
        if dropped > 0 {
            out.extend(line_of(&Event::Dropped { events: dropped }));
        }
        out.extend_from_slice(last);
        out
    }

    /// End the stream without waiting for the reader: [`Events::tail`]'s
    /// bytes go back in the queue, written as the reader takes them
    /// (a session cell's live stream, session/live.rs).
    pub(crate) fn close(&mut self, last: &[u8]) {
        let out = self.tail(last);
        self.relay.push(&out);
    }

    fn chunk(&mut self, t: Target, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let (data, base64) = match std::str::from_utf8(bytes) {
            Ok(text) => (std::borrow::Cow::Borrowed(text), None),
            Err(_) => (String::from_utf8_lossy(bytes), Some(base64::engine::general_purpose::STANDARD.encode(bytes))),
        };
        let event = match t {
            Target::Stdout => Event::Stdout { data, base64 },
            Target::Stderr => Event::Stderr { data, base64 },
        };
        self.line(&event);
    }

    fn line(&mut self, event: &Event<'_>) {
        self.relay.push(&line_of(event));
    }
}

/// One event as a line of NDJSON.
fn line_of(event: &Event<'_>) -> Vec<u8> {
    let mut text = serde_json::to_vec(event).unwrap_or_default();
    text.push(b'\n');
    text
}

fn name(t: Target) -> &'static str {
    match t {
        Target::Stdout => "stdout",
        Target::Stderr => "stderr",
    }
}

/// How many bytes at the end of `bytes` begin a UTF-8 character that is not
/// complete yet (0 to 3). Bytes that can never be UTF-8 are not held.
fn incomplete_tail(bytes: &[u8]) -> usize {
    let start = bytes.len().saturating_sub(3);
    for i in (start..bytes.len()).rev() {
        let b = bytes[i];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        let have = bytes.len() - i;
        return if have < need && std::str::from_utf8(&bytes[i..]).err().is_some_and(|e| e.error_len().is_none()) {
            have
        } else {
            0
        };
    }
    0
}

impl Writer {
    /// End the stream: the events the reader never took are counted, the
    /// artifacts and the result are written. Blocking, as `--json`'s
    /// document is: the run is over, only this process waits for the reader.
    pub fn finish(self, result: &RunResult) {
        CURRENT.with(|c| *c.borrow_mut() = None);
        let mut last = Vec::new();
        for a in &result.artifacts {
            last.extend(line_of(&Event::Artifact { artifact: Box::new(Cow::Borrowed(a)) }));
        }
        last.extend(line_of(&Event::Result { result: Box::new(Cow::Borrowed(result)) }));
        let out = self.0.borrow_mut().tail(&last);
        drop(self);
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(&out);
        let _ = stdout.flush();
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("events::Writer")
    }
}

/// Events written to `fd` rather than our stdout: a session client's
/// socket (`jail session exec --events`, session/live.rs), each stream cut
/// at its cap. Written without blocking (relay.rs: `MSG_DONTWAIT` on a
/// socket), as on our stdout.
pub(crate) fn to_fd(fd: BorrowedFd<'_>, stdout_cap: u64, stderr_cap: u64) -> Events {
    let mut ev = Events { relay: Relay::new(fd, u64::MAX, "stdout_bytes"), streams: Default::default() };
    ev.set_cap(Target::Stdout, stdout_cap);
    ev.set_cap(Target::Stderr, stderr_cap);
    ev
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

    fn lines(events: Events, read: OwnedFd) -> Vec<serde_json::Value> {
        let mut ev = events;
        ev.end(Target::Stdout);
        ev.end(Target::Stderr);
        ev.drain(Instant::now() + std::time::Duration::from_secs(1));
        drop(ev);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut got).unwrap();
        got.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn chunks_come_in_order_and_stop_at_the_cap_with_one_marker() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut ev = to_fd(write.as_fd(), 0, 0);
        ev.set_cap(Target::Stdout, 8);
        ev.set_cap(Target::Stderr, 100);
        ev.push(Target::Stdout, b"hello ");
        ev.push(Target::Stderr, b"oops\n");
        ev.push(Target::Stdout, b"world, and more");
        ev.push(Target::Stdout, b"never");
        drop(write);
        let got = lines(ev, read);
        let want: Vec<serde_json::Value> = vec![
            serde_json::json!({"type":"stdout","data":"hello "}),
            serde_json::json!({"type":"stderr","data":"oops\n"}),
            serde_json::json!({"type":"stdout","data":"wo"}),
            serde_json::json!({"type":"truncated","stream":"stdout","limit_bytes":8}),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_character_split_between_reads_is_sent_whole() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut ev = to_fd(write.as_fd(), 0, 0);
        ev.set_cap(Target::Stdout, 100);
        let snow = "☃".as_bytes();
        ev.push(Target::Stdout, &[b'a', snow[0]]);
        ev.push(Target::Stdout, &snow[1..]);
        drop(write);
        let got = lines(ev, read);
        assert_eq!(
            got,
            vec![
                serde_json::json!({"type":"stdout","data":"a"}),
                serde_json::json!({"type":"stdout","data":"☃"})
            ]
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_come_with_their_exact_base64() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut ev = to_fd(write.as_fd(), 0, 0);
        ev.set_cap(Target::Stdout, 100);
        ev.push(Target::Stdout, b"a\xffb");
        // A lone lead byte at the very end is held, then sent as it is.
        ev.push(Target::Stdout, b"\xe2");
        drop(write);
        let got = lines(ev, read);
        assert_eq!(
            got,
            vec![
                serde_json::json!({"type":"stdout","data":"a\u{fffd}b","base64":"Yf9i"}),
                serde_json::json!({"type":"stdout","data":"\u{fffd}","base64":"4g=="}),
            ]
        );
    }

    #[test]
    fn closing_completes_the_line_in_progress_counts_the_rest_and_ends_with_the_last_lines() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut ev = to_fd(write.as_fd(), 1 << 20, 1 << 20);
        // More than the pipe holds: the relay keeps the rest queued.
        for i in 0..64 {
            ev.push(Target::Stdout, format!("{i:04}{}", "x".repeat(4096)).as_bytes());
        }
        assert!(ev.pending());
        // The reader takes part of what the pipe holds, then stops mid-line.
        let mut first = vec![0u8; 100];
        nix::unistd::read(read.as_raw_fd(), &mut first).unwrap();
        ev.close(b"{\"type\":\"result\"}\n");
        // It reads again: what the close queued reaches it whole.
        let reader = std::thread::spawn(move || {
            let mut rest = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(read), &mut rest).unwrap();
            rest
        });
        ev.drain(Instant::now() + std::time::Duration::from_secs(10));
        assert!(!ev.pending());
        drop(ev);
        drop(write);
        let mut all = first;
        all.extend(reader.join().unwrap());
        let text = String::from_utf8(all).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let last = lines.len() - 1;
        assert_eq!(lines[last], serde_json::json!({"type": "result"}));
        assert_eq!(lines[last - 1]["type"], "dropped", "{}", lines[last - 1]);
        // Every line the reader got is whole (parsed above), and each of the
        // 64 chunk events either reached it or is counted.
        let chunks = lines[..last - 1].iter().filter(|l| l["type"] == "stdout").count() as u64;
        assert_eq!(chunks + lines[last - 1]["events"].as_u64().unwrap(), 64);
        assert!(lines[..last - 1].iter().all(|l| l["type"] == "stdout"));
    }

    #[test]
    fn incomplete_tail_holds_only_a_started_character() {
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"☃".as_bytes()[..2]), 2);
        assert_eq!(incomplete_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_tail("😀".as_bytes()), 0);
        assert_eq!(incomplete_tail(b"\xff"), 0);
        assert_eq!(incomplete_tail(b"\x80\x80"), 0);
    }
}
