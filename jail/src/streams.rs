//! The two words every part of a run's output handling shares, in a leaf
//! of their own so that the request, the capture and the events need not
//! import each other: how the script's stdout and stderr reach the caller
//! ([`OutputMode`], the request's choice) and which of the two a chunk
//! came from ([`Target`]).

/// How the script's stdout and stderr reach the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Captured with byte caps into the result (`--json`).
    Capture,
    /// Copied live to our own stdout and stderr.
    Stream,
    /// Captured as with `Capture`, and sent live as NDJSON events on our
    /// stdout (`--events`, events.rs).
    Events,
}

/// One of the script's two output streams.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    Stdout,
    Stderr,
}
