//! A cell's live events (`jail session exec --events`, and a pool step
//! asked with `"events": true`): the cell's stdout and stderr as the
//! `jail run --events` chunk events (events.rs), written on the client's
//! socket while the cell runs, then the cell's answer.
//!
//! Session supervisor side, inside the cells loop (cells.rs), under the
//! rule `jail run --events` keeps: a client that reads slowly, or not at
//! all, never holds up the loop, the cell's deadline or the next client.
//! Every write is `send(MSG_DONTWAIT)` (relay.rs); while the relay's
//! buffer is full the cell's pipes are not read, so the cell waits, not
//! the supervisor — until its deadline, past which the pipes are read
//! again (the interrupted cell must be able to write its traceback).
//!
//! When the cell is done its stream becomes a [`Tail`], flushed by the
//! loop as the client takes it: the chunk events the client has not taken
//! yet are given until the cell's deadline (as `jail run --events` gives
//! them until the run's), then the line in progress is completed, the rest
//! counted in one `dropped` event, and the answer follows; a client that
//! has not taken that within [`ANSWER_WAIT`] loses it.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::events::{self, Events};

/// How long the answer may wait for its client once the chunk events are
/// settled: as long as a plain answer's write may block (handle.rs).
pub(crate) const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// The live events of a cell about to start, on its client's socket.
pub(crate) fn open(client: &UnixStream, stdout_cap: u64, stderr_cap: u64) -> Rc<RefCell<Events>> {
    Rc::new(RefCell::new(events::to_fd(client.as_fd(), stdout_cap, stderr_cap)))
}

/// A finished cell's events on their way to its client.
pub(crate) struct Tail {
    events: Rc<RefCell<Events>>,
    /// The cell's deadline: the chunk events wait this long for the client.
    until: Instant,
    /// The answer line, until it is queued behind the chunks.
    answer: Option<Vec<u8>>,
    /// Once the answer is queued: when the client has had long enough.
    give_up: Option<Instant>,
    /// The socket the relay writes (through a descriptor of its own, the
    /// same open file description): polled for POLLOUT.
    client: UnixStream,
}

impl Tail {
    pub(crate) fn new(events: Rc<RefCell<Events>>, client: UnixStream, until: Instant, answer: Vec<u8>) -> Tail {
        Tail { events, until, answer: Some(answer), give_up: None, client }
    }

    /// The descriptor to poll for POLLOUT while bytes wait for the client.
    pub(crate) fn pending_out(&self) -> Option<BorrowedFd<'_>> {
        self.events.borrow().pending().then(|| self.client.as_fd())
    }

    /// The client's socket is writable: write what it takes.
    pub(crate) fn flush(&mut self) {
        self.events.borrow_mut().flush();
    }

    /// When [`Tail::step`] must look again.
    pub(crate) fn wake(&self) -> Instant {
        self.give_up.unwrap_or(self.until)
    }

    /// Move on at `now`: the answer goes in the queue once the chunks are
    /// taken or their time is up. False once the tail is done with (all
    /// written, the client gone, or out of time).
    pub(crate) fn step(&mut self, now: Instant) -> bool {
        self.flush();
        let pending = self.events.borrow().pending();
        if let Some(answer) = self.answer.as_ref().filter(|_| !pending || now >= self.until) {
            self.events.borrow_mut().close(answer);
            self.answer = None;
            self.give_up = Some(now.max(self.until) + ANSWER_WAIT);
        }
        match self.give_up {
            None => true,
            Some(t) => self.events.borrow().pending() && now < t,
        }
    }

    /// The session is ending: give the client until `by` at most, waiting.
    pub(crate) fn finish(mut self, by: Instant) {
        if let Some(answer) = self.answer.take() {
            self.events.borrow_mut().drain(self.until.min(by));
            self.events.borrow_mut().close(&answer);
        }
        self.events.borrow_mut().drain(by);
    }
}
