//! What a person watching the run sees on stderr. On a terminal: one status
//! line, redrawn every second, while the agent waits for the model (elapsed
//! seconds, tokens so far) or a step runs (elapsed seconds), with the step's
//! output printed above it as it comes. When stderr is not a terminal (a
//! log, CI): plain lines, each with an RFC 3339 timestamp, and no redraws.
//! Everything shown is escaped (see `escape`): the model's words never
//! reach the terminal raw.
//!
//! A step's output arrives through [`StepWatch`]: the script's stdout and
//! stderr line by line from the jail's live event stream (`jail run
//! --events`, or `jail session exec --events` for a session's cell), and
//! the lines the `jail` process itself writes on its stderr.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::escape::shown_max;

/// The most of one progress line's text: whatever a model or a step said,
/// no line of the terminal is longer (a 100,000-byte tool name is not).
const MAX_LINE_BYTES: usize = 2000;

/// What happens while a step runs, as the runner sees it.
pub trait StepWatch {
    /// One line the `jail` process itself wrote on its stderr.
    fn line(&mut self, text: &str);
    /// One line of the script's own output, as it runs; `stream` is
    /// `stdout` or `stderr`.
    fn output(&mut self, stream: &str, text: &str) {
        self.line(&format!("{stream}: {text}"));
    }
    /// Called about once a second while the step runs.
    fn tick(&mut self, elapsed: Duration);
}

/// A watch that ignores everything.
pub struct Unwatched;

impl StepWatch for Unwatched {
    fn line(&mut self, _: &str) {}
    fn tick(&mut self, _: Duration) {}
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Quiet,
    /// Status line redrawn in place.
    Terminal,
    /// Timestamped lines.
    Lines,
}

/// The run's progress display.
#[derive(Clone)]
pub struct Display {
    mode: Mode,
    /// The status line's text, when one is shown (terminal mode).
    status: Arc<Mutex<Option<String>>>,
}

impl Display {
    /// Quiet, or chosen by whether stderr is a terminal.
    pub fn new(quiet: bool) -> Display {
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Mode::Terminal
        } else {
            Mode::Lines
        };
        Display::with_mode(mode)
    }

    pub fn with_mode(mode: Mode) -> Display {
        Display { mode, status: Arc::new(Mutex::new(None)) }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// One event line (`[agent] text`), escaped and cut.
    pub fn say(&self, agent: &str, text: &str) {
        let line = format!("[{}] {}", shown_max(agent, 100), shown_max(text, MAX_LINE_BYTES));
        self.print(&line);
    }

    /// A warning line (`jail-agent: ...`, escaped and cut), printed even
    /// when quiet: something the run does differently from what was asked.
    pub fn warn(&self, text: &str) {
        let line = format!("jail-agent: {}", shown_max(text, MAX_LINE_BYTES));
        match self.mode {
            Mode::Quiet => eprintln!("{line}"),
            Mode::Lines | Mode::Terminal => self.print(&line),
        }
    }

    /// Print a line above the status line (terminal) or with a timestamp.
    fn print(&self, line: &str) {
        let mut err = std::io::stderr().lock();
        let _ = match self.mode {
            Mode::Quiet => Ok(()),
            Mode::Lines => writeln!(err, "{} {line}", crate::trace::rfc3339(crate::trace::unix_ns())),
            Mode::Terminal => {
                let status = self.status.lock().ok().and_then(|s| s.clone());
                match status {
                    Some(s) => write!(err, "\r\x1b[2K{line}\n{s}"),
                    None => writeln!(err, "{line}"),
                }
            }
        };
        let _ = err.flush();
    }

    fn set_status(&self, text: Option<String>) {
        if self.mode != Mode::Terminal {
            return;
        }
        if let Ok(mut s) = self.status.lock() {
            *s = text.clone();
        }
        let mut err = std::io::stderr().lock();
        let _ = match text {
            Some(t) => write!(err, "\r\x1b[2K{t}"),
            None => write!(err, "\r\x1b[2K"),
        };
        let _ = err.flush();
    }

    /// Show that `agent` waits for the model until the guard drops: a status
    /// line redrawn every second on a terminal, one line otherwise.
    pub fn waiting_for_model(&self, agent: &str, tokens_so_far: u64) -> Waiting {
        let agent = shown_max(agent, 100);
        if self.mode == Mode::Lines {
            self.print(&format!("[{agent}] waiting for the model ({tokens_so_far} tokens so far)"));
        }
        let stop = Arc::new(Mutex::new(false));
        let handle = (self.mode == Mode::Terminal).then(|| {
            let (display, stop) = (self.clone(), stop.clone());
            let started = Instant::now();
            std::thread::spawn(move || loop {
                let secs = started.elapsed().as_secs();
                display.set_status(Some(format!("[{agent}] waiting for the model: {secs} s, {tokens_so_far} tokens so far")));
                for _ in 0..10 {
                    std::thread::sleep(Duration::from_millis(100));
                    if stop.lock().map_or(true, |s| *s) {
                        display.set_status(None);
                        return;
                    }
                }
            })
        });
        Waiting { stop, handle }
    }

    /// A watch for one step of `agent` running `script`.
    pub fn step(&self, agent: &str, script: &str) -> StepLine {
        let label = format!("[{}] {}", shown_max(agent, 100), shown_max(script, 200));
        if self.mode == Mode::Lines {
            self.print(&format!("{label}: running"));
        }
        StepLine { display: self.clone(), label }
    }
}

/// The status line of a model call; cleared when dropped.
pub struct Waiting {
    stop: Arc<Mutex<bool>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Ok(mut s) = self.stop.lock() {
            *s = true;
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The status line and live output of one step.
pub struct StepLine {
    display: Display,
    label: String,
}

impl StepWatch for StepLine {
    fn line(&mut self, text: &str) {
        self.display.print(&format!("{} | {}", self.label, shown_max(text, MAX_LINE_BYTES)));
    }

    fn output(&mut self, stream: &str, text: &str) {
        self.display.print(&format!("{} {stream}| {}", self.label, shown_max(text, MAX_LINE_BYTES)));
    }

    fn tick(&mut self, elapsed: Duration) {
        self.display.set_status(Some(format!("{}: running, {} s", self.label, elapsed.as_secs())));
    }
}

impl Drop for StepLine {
    fn drop(&mut self) {
        self.display.set_status(None);
    }
}
