//! The script's stdout and stderr as the supervisor reads them: captured
//! as head and tail within a byte cap (`--json`), or streamed live through
//! a [`relay::Relay`] (relay.rs) and cut at the cap; with `--events`, both
//! captured and sent live as events (events.rs).

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use crate::events::{self, Events};
use crate::relay;
use crate::result::Stream;
use crate::streams::{OutputMode, Target};

/// One output stream: streamed live (through a [`relay::Relay`], cut at the
/// cap), or captured as head and tail within a byte cap.
pub(crate) struct Capture {
    cap: u64,
    mode: OutputMode,
    head: Vec<u8>,
    tail: Vec<u8>,
    total: u64,
    relay: Option<relay::Relay>,
    relayed: Option<relay::Relayed>,
    /// With `--events`: the run's event stream, shared by both streams.
    events: Option<Rc<RefCell<Events>>>,
    /// The events' descriptor to poll for POLLOUT (the stdout capture only,
    /// so it is polled once).
    events_fd: Option<OwnedFd>,
    target: Target,
}

impl Capture {
    pub(crate) fn new(cap: u64, mode: OutputMode, target: Target) -> Capture {
        let relay = match (mode, target) {
            (OutputMode::Capture | OutputMode::Events, _) => None,
            (OutputMode::Stream, Target::Stdout) => Some(relay::to_stdout(cap)),
            (OutputMode::Stream, Target::Stderr) => Some(relay::to_stderr(cap)),
        };
        let events = if mode == OutputMode::Events { events::current() } else { None };
        if let Some(ev) = &events {
            ev.borrow_mut().set_cap(target, cap);
        }
        let events_fd = match target {
            Target::Stdout => events.as_ref().and_then(|ev| ev.borrow().poll_fd()),
            Target::Stderr => None,
        };
        Capture {
            cap,
            mode,
            head: Vec::new(),
            tail: Vec::new(),
            total: 0,
            relay,
            relayed: None,
            events,
            events_fd,
            target,
        }
    }

    /// Send this stream live as `events` from now on (a session cell run
    /// with `--events`, session/live.rs): what it captured already (output
    /// that reached the pipe between cells) goes first.
    pub(crate) fn stream_to(&mut self, events: Rc<RefCell<Events>>) {
        {
            let mut ev = events.borrow_mut();
            ev.set_cap(self.target, self.cap);
            ev.push(self.target, &self.head);
            ev.push(self.target, &self.tail);
        }
        if matches!(self.target, Target::Stdout) {
            self.events_fd = events.borrow().poll_fd();
        }
        self.events = Some(events);
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if let Some(r) = &mut self.relay {
            r.push(chunk);
            return;
        }
        if let Some(ev) = &self.events {
            ev.borrow_mut().push(self.target, chunk);
        }
        let half = (self.cap / 2) as usize;
        let head_room = half.saturating_sub(self.head.len());
        let (to_head, rest) = chunk.split_at(head_room.min(chunk.len()));
        self.head.extend_from_slice(to_head);
        if rest.is_empty() {
            return;
        }
        let tail_cap = self.cap as usize - half;
        self.tail.extend_from_slice(rest);
        if self.tail.len() > tail_cap * 2 {
            let cut = self.tail.len() - tail_cap;
            self.tail.drain(..cut);
        }
    }

    /// Whether the watch loop may read more of this stream's pipe.
    pub(crate) fn wants_input(&self) -> bool {
        self.relay.as_ref().is_none_or(relay::Relay::wants_input)
            && self.events.as_ref().is_none_or(|ev| ev.borrow().wants_input())
    }

    /// The caller's descriptor to poll for POLLOUT, while bytes wait for it.
    pub(crate) fn pending_out(&self) -> Option<BorrowedFd<'_>> {
        if let Some(r) = self.relay.as_ref().filter(|r| r.pending()) {
            return r.fd();
        }
        self.events.as_ref().filter(|ev| ev.borrow().pending())?;
        self.events_fd.as_ref().map(|fd| fd.as_fd())
    }

    /// The caller's descriptor is writable: write what it takes.
    pub(crate) fn flush_out(&mut self) {
        if let Some(r) = self.relay.as_mut() {
            r.flush();
        }
        if let Some(ev) = &self.events {
            ev.borrow_mut().flush();
        }
    }

    /// The script's end of the stream is closed: hand the caller what it
    /// takes by `until`.
    pub(crate) fn end(&mut self, until: Instant) {
        if let Some(r) = self.relay.take() {
            self.relayed = Some(r.finish(until));
        }
        if let Some(ev) = &self.events {
            let mut ev = ev.borrow_mut();
            ev.end(self.target);
            ev.drain(until);
        }
    }

    pub(crate) fn into_stream(mut self) -> Stream {
        if self.mode == OutputMode::Stream {
            let r = self.relayed.unwrap_or_default();
            return Stream {
                text: String::new(),
                bytes: self.total,
                truncated: r.truncated,
                streamed: true,
                undelivered_bytes: r.undelivered,
            };
        }
        let tail_cap = self.cap as usize - (self.cap / 2) as usize;
        if self.tail.len() > tail_cap {
            let cut = self.tail.len() - tail_cap;
            self.tail.drain(..cut);
        }
        let kept = (self.head.len() + self.tail.len()) as u64;
        let truncated = kept < self.total;
        let text = if truncated {
            format!(
                "{}\n[... {} bytes cut by the jail ...]\n{}",
                String::from_utf8_lossy(&self.head),
                self.total - kept,
                String::from_utf8_lossy(&self.tail)
            )
        } else {
            let mut all = self.head;
            all.extend_from_slice(&self.tail);
            String::from_utf8_lossy(&all).into_owned()
        };
        Stream { text, bytes: self.total, truncated, streamed: false, undelivered_bytes: 0 }
    }
}
