//! One `jail pool` as a child, spoken to on threads: spawned from a
//! `PoolSpec` (command.rs), its replies read by the one bounded line
//! reader (`lines`) and typed (`pool::Reply`) on a thread of their own,
//! its stderr kept as a short tail for the message that says why it
//! ended, and ended by closing its stdin (it drains) with a kill past the
//! caller's grace. The agent drives its run's pool with it; the service,
//! async, builds the same command (`pool_command`) and reads the same
//! types on its runtime.
//!
//! Nothing here waits without a bound: every wait for a reply takes a
//! `wait` and a `stop` the caller answers (a signal arrived), and a reply
//! line over `bounds::MAX_DOCUMENT` is dropped, never held.

use std::collections::VecDeque;
use std::io::{BufRead, Read, Write};
use std::process::{Child, ChildStdin, ExitStatus};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::bounds::MAX_DOCUMENT;
use super::command::{pool_command, PoolSpec};
use super::lines;
use super::pool::{Line, Reply};

/// Lines of the pool's stderr kept for a failure message.
const TAIL_LINES: usize = 20;
/// Bytes of one line of the pool's stderr read (the rest of it too, in
/// pieces of this size).
const MAX_STDERR_LINE: u64 = 4 << 10;
/// How often a wait looks at `stop`.
const STOP_LOOK: Duration = Duration::from_millis(50);

/// Why no reply came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// The pool's stdout ended (or its stdin did): it exited.
    Ended,
    /// Nothing within the wait.
    Silent,
    /// The caller's `stop` said so.
    Stopped,
}

/// A `jail pool` that is this process's child.
pub struct PoolChild {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Each reply with when it came.
    replies: mpsc::Receiver<(Instant, Reply)>,
    tail: Arc<Mutex<VecDeque<String>>>,
    spawned: Instant,
}

/// Start `spec`. `on_stderr` hears each line the pool writes to its stderr
/// (decoded, its end trimmed) and gives back the text to keep for
/// [`PoolChild::exit_words`] (escaped as the caller shows text), or `None`
/// to keep nothing of it.
pub fn spawn(spec: &PoolSpec, on_stderr: impl FnMut(&str) -> Option<String> + Send + 'static) -> std::io::Result<PoolChild> {
    let spawned = Instant::now();
    let mut child = pool_command(spec).spawn()?;
    let (tx, replies) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || read_replies(out, &tx));
    }
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    if let Some(err) = child.stderr.take() {
        let tail = Arc::clone(&tail);
        std::thread::spawn(move || read_stderr(err, &tail, on_stderr));
    }
    let stdin = child.stdin.take();
    Ok(PoolChild { child, stdin, replies, tail, spawned })
}

impl PoolChild {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// When it was spawned.
    pub fn spawned(&self) -> Instant {
        self.spawned
    }

    /// Send one line and wait for the reply carrying `id`.
    pub fn ask(&mut self, line: &Line, id: &str, wait: Duration, stop: &dyn Fn() -> bool) -> Result<Reply, Gone> {
        self.send(line)?;
        self.wait_for(id, wait, stop).map(|(_, r)| r)
    }

    /// Send one line.
    pub fn send(&mut self, line: &Line) -> Result<(), Gone> {
        let Some(w) = self.stdin.as_mut() else { return Err(Gone::Ended) };
        let mut text = line.text();
        text.push('\n');
        w.write_all(text.as_bytes()).and_then(|()| w.flush()).map_err(|_| Gone::Ended)
    }

    /// The reply carrying `id` and when it came, waiting at most `wait`,
    /// and no longer once `stop` says so. A reply carrying another id (one
    /// to a question given up on) is dropped.
    pub fn wait_for(&mut self, id: &str, wait: Duration, stop: &dyn Fn() -> bool) -> Result<(Instant, Reply), Gone> {
        let until = Instant::now() + wait;
        loop {
            if stop() {
                return Err(Gone::Stopped);
            }
            let left = until.saturating_duration_since(Instant::now());
            match self.replies.recv_timeout(left.min(STOP_LOOK)) {
                Ok((at, r)) if r.id.as_deref() == Some(id) => return Ok((at, r)),
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) if left.is_zero() => return Err(Gone::Silent),
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(Gone::Ended),
            }
        }
    }

    /// How the pool ended, with its last stderr line: `jail pool` writes
    /// the reason it could not start there, in one line. Waits up to 2 s
    /// for it to exit (its stdout closed: it is exiting).
    pub fn exit_words(&mut self) -> String {
        let until = Instant::now() + Duration::from_secs(2);
        let mut status = None;
        while status.is_none() && Instant::now() < until {
            status = self.child.try_wait().ok().flatten();
            if status.is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Its stderr reader may still hold the last line.
        std::thread::sleep(Duration::from_millis(50));
        let last = self.tail.lock().unwrap_or_else(|e| e.into_inner()).back().cloned().unwrap_or_default();
        let status = status.map_or_else(|| "still running".to_string(), |s| s.to_string());
        if last.is_empty() {
            format!("jail pool ended ({status})")
        } else {
            format!("{last} ({status})")
        }
    }

    /// Close its stdin: it drains (its ready jails destroyed, the sessions
    /// it handed out stopped) and exits. The caller that closes without
    /// [`PoolChild::end`] reaps it another way.
    pub fn close(&mut self) {
        drop(self.stdin.take());
    }

    /// Close its stdin and wait for it; kill it past `grace`. Its jails
    /// end with their lifeline all the same.
    pub fn end(mut self, grace: Duration) -> Option<ExitStatus> {
        self.close();
        let until = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Err(_) => return None,
                Ok(None) if Instant::now() >= until => {
                    let _ = self.child.kill();
                    return self.child.wait().ok();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// The pool's stdout, one reply a line (bounded: a longer line is
/// dropped, and so is a line that is no reply), onto the channel.
fn read_replies(out: impl Read, tx: &mpsc::Sender<(Instant, Reply)>) {
    let mut r = std::io::BufReader::new(out);
    let mut lines = lines::Lines::new(MAX_DOCUMENT as usize);
    loop {
        match lines::read_line(&mut r, &mut lines) {
            Ok(lines::Read::Whole) => {}
            Ok(lines::Read::TooLong) => continue,
            Ok(lines::Read::End) | Err(_) => return,
        }
        if let Ok(reply) = Reply::parse(lines.line()) {
            if tx.send((Instant::now(), reply)).is_err() {
                return;
            }
        }
    }
}

/// The pool's stderr, a bounded line at a time, to `on`; the last few
/// lines it keeps are kept.
fn read_stderr(err: impl Read, tail: &Mutex<VecDeque<String>>, mut on: impl FnMut(&str) -> Option<String>) {
    let mut r = std::io::BufReader::new(err);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.by_ref().take(MAX_STDERR_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let Some(kept) = on(text.trim_end()) else { continue };
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() >= TAIL_LINES {
            t.pop_front();
        }
        t.push_back(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::pool::Body;
    use crate::client::run::tests::fake;

    fn never() -> bool {
        false
    }

    #[test]
    fn a_reply_is_found_by_its_id_and_others_and_oversize_lines_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        // Reads one request, then answers: a line over the bound (whose
        // tail would read as the reply), a line that is no reply, a reply
        // to another id, the one asked for.
        let body = format!(
            r#"read line; head -c {} /dev/zero | tr '\0' ' '; printf '%s\n' '{{"id":"ready","stats":{{"ready":9}}}}' 'not json' '{{"id":"other","stats":{{"ready":0}}}}' '{{"id":"ready","stats":{{"ready":1}}}}'; cat >/dev/null"#,
            MAX_DOCUMENT
        );
        let mut pool = spawn(&PoolSpec::new(fake(dir.path(), &body), 1), |l| Some(l.to_string())).unwrap();
        let got = pool
            .ask(&Line::Stats { id: Some("ready".into()) }, "ready", Duration::from_secs(30), &never)
            .unwrap();
        assert!(matches!(&got.body, Body::Stats(s) if s.ready == 1), "{got:?}");
        assert!(pool.end(Duration::from_secs(10)).is_some_and(|s| s.success()));
    }

    #[test]
    fn a_pool_that_ends_says_its_last_stderr_line_and_its_exit() {
        let dir = tempfile::tempdir().unwrap();
        let body = "echo 'jail pool: making\x01 a jail' >&2; echo 'jail pool: no such module' >&2; exit 125";
        let mut pool = spawn(&PoolSpec::new(fake(dir.path(), body), 1), |l| Some(l.replace('\x01', "?"))).unwrap();
        let got = pool.wait_for("ready", Duration::from_secs(30), &never);
        assert_eq!(got.err(), Some(Gone::Ended));
        assert_eq!(pool.exit_words(), "jail pool: no such module (exit status: 125)");
    }

    #[test]
    fn a_silent_pool_is_silent_within_the_wait_stopped_when_told_and_killed_past_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        // Ignores its stdin closing: only the kill ends it.
        let mut pool = spawn(&PoolSpec::new(fake(dir.path(), "trap '' TERM; exec sleep 600"), 1), |_| None).unwrap();
        let got = pool.wait_for("ready", Duration::from_millis(100), &never);
        assert_eq!(got.err(), Some(Gone::Silent));
        let got = pool.wait_for("ready", Duration::from_secs(60), &|| true);
        assert_eq!(got.err(), Some(Gone::Stopped));
        let began = Instant::now();
        let status = pool.end(Duration::from_millis(200));
        assert!(began.elapsed() < Duration::from_secs(10));
        assert_eq!(status.map(|s| std::os::unix::process::ExitStatusExt::signal(&s)), Some(Some(9)));
    }
}
