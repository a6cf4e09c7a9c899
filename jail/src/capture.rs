//! The script's stdout and stderr as the supervisor reads them: captured
//! as head and tail within a byte cap (`--json`), or streamed live through
//! a [`relay::Relay`] (relay.rs) and cut at the cap.

use std::time::Instant;

use crate::relay;
use crate::request::OutputMode;
use crate::result::Stream;

#[derive(Clone, Copy)]
pub(crate) enum Target {
    Stdout,
    Stderr,
}

/// One output stream: streamed live (through a [`relay::Relay`], cut at the
/// cap), or captured as head and tail within a byte cap.
pub(crate) struct Capture {
    cap: u64,
    mode: OutputMode,
    head: Vec<u8>,
    tail: Vec<u8>,
    total: u64,
    pub(crate) relay: Option<relay::Relay>,
    relayed: Option<relay::Relayed>,
}

impl Capture {
    pub(crate) fn new(cap: u64, mode: OutputMode, target: Target) -> Capture {
        let relay = match (mode, target) {
            (OutputMode::Capture, _) => None,
            (OutputMode::Stream, Target::Stdout) => Some(relay::to_stdout(cap)),
            (OutputMode::Stream, Target::Stderr) => Some(relay::to_stderr(cap)),
        };
        Capture { cap, mode, head: Vec::new(), tail: Vec::new(), total: 0, relay, relayed: None }
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if let Some(r) = &mut self.relay {
            r.push(chunk);
            return;
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

    /// The relay, if any, while the watch loop runs.
    pub(crate) fn relay(&mut self) -> Option<&mut relay::Relay> {
        self.relay.as_mut()
    }

    /// Whether the watch loop may read more of this stream's pipe.
    pub(crate) fn wants_input(&self) -> bool {
        self.relay.as_ref().is_none_or(relay::Relay::wants_input)
    }

    /// The script's end of the stream is closed: hand the caller what it
    /// takes by `until`.
    pub(crate) fn end(&mut self, until: Instant) {
        if let Some(r) = self.relay.take() {
            self.relayed = Some(r.finish(until));
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
