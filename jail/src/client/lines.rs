//! THE bounded line reader: every reader of what `jail` prints (a run's
//! `--events`, a session's answers, a pool's replies) and of what a pool
//! is sent uses it, sync or async. It is sans IO: the caller feeds it
//! what its reader has buffered (sync [`read_line`], an async reader's
//! `fill_buf`, or whole reads through [`Lines::feed_all`]) and it holds at
//! most `max` bytes of one line in memory however long the line is: a
//! longer one is told as [`Read::TooLong`], its first `max` bytes kept,
//! the rest read and dropped. Lines are split at `\n`, which never occurs
//! inside a UTF-8 character, so a character split between two reads comes
//! whole.

use std::io::{self, BufRead};

/// A line buffer kept between lines at most: a long line's buffer is not
/// kept for the short ones after it.
const SMALL_LINE: usize = 256 << 10;

/// How a bounded read of one line ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The stream ended before any byte of a new line.
    End,
    /// A line (its newline dropped) is read.
    Whole,
    /// The line was over the bound: its first `max` bytes are kept, the
    /// rest was read and dropped.
    TooLong,
}

/// A line reader that keeps at most `max` bytes of a line in memory
/// however long it is, sans IO: the caller feeds it what its reader has
/// buffered (sync [`read_line`], or an async reader's `fill_buf`) and
/// consumes what it took.
#[derive(Debug)]
pub struct Lines {
    max: usize,
    line: Vec<u8>,
    over: bool,
    any: bool,
    /// The line in `line` has ended: the next feed starts a new one.
    ended: bool,
}

impl Lines {
    pub fn new(max: usize) -> Lines {
        Lines::with_buffer(Vec::new(), max)
    }

    /// The same, reusing `buf`'s memory.
    pub fn with_buffer(mut buf: Vec<u8>, max: usize) -> Lines {
        buf.clear();
        Lines { max, line: buf, over: false, any: false, ended: false }
    }

    fn restart(&mut self) {
        if self.ended {
            self.line.clear();
            self.over = false;
            self.any = false;
            self.ended = false;
        }
    }

    /// Take what `avail` holds of the current line: the bytes taken, and
    /// how the line ended when its newline was among them.
    pub fn feed(&mut self, avail: &[u8]) -> (usize, Option<Read>) {
        self.restart();
        if avail.is_empty() {
            return (0, None);
        }
        self.any = true;
        let (chunk, used, done) = match memchr::memchr(b'\n', avail) {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        let room = self.max.saturating_sub(self.line.len());
        if chunk.len() > room {
            self.over = true;
        }
        self.line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if !done {
            return (used, None);
        }
        self.ended = true;
        (used, Some(if self.over { Read::TooLong } else { Read::Whole }))
    }

    /// The stream ended: its last line (without a newline), or `End`.
    pub fn finish(&mut self) -> Read {
        self.restart();
        self.ended = true;
        match (self.any, self.over) {
            (false, _) => Read::End,
            (true, true) => Read::TooLong,
            (true, false) => Read::Whole,
        }
    }

    /// Whether the line in progress is already over `max` (a caller that
    /// wants no more of it stops reading here).
    pub fn over(&self) -> bool {
        self.over && !self.ended
    }

    /// The line read (its first `max` bytes when it was too long).
    pub fn line(&self) -> &[u8] {
        &self.line
    }

    /// The same, taken: the reader keeps no memory of it.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.line)
    }

    /// Its buffer back, for [`Lines::with_buffer`].
    pub fn into_buffer(self) -> Vec<u8> {
        self.line
    }
}

/// Read one line from `r` into `lines`, bounded.
pub fn read_line(r: &mut impl BufRead, lines: &mut Lines) -> io::Result<Read> {
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(lines.finish());
        }
        let (used, done) = lines.feed(avail);
        r.consume(used);
        if let Some(read) = done {
            return Ok(read);
        }
    }
}

/// One line as [`Lines::feed_all`] hands it.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A line, its newline dropped, of at most `max` bytes.
    Whole(&'a [u8]),
    /// A line over `max` bytes: read and dropped.
    TooLong,
}

impl Lines {
    /// Take all of `bytes`; `each` is called for every line they end.
    pub fn feed_all(&mut self, mut bytes: &[u8], mut each: impl FnMut(Line<'_>)) {
        while !bytes.is_empty() {
            let (used, done) = self.feed(bytes);
            bytes = &bytes[used..];
            if let Some(read) = done {
                self.hand(read, &mut each);
            }
        }
    }

    /// The stream ended: a last line without its newline is a line too.
    pub fn finish_all(mut self, mut each: impl FnMut(Line<'_>)) {
        let read = self.finish();
        self.hand(read, &mut each);
    }

    fn hand(&mut self, read: Read, each: &mut impl FnMut(Line<'_>)) {
        match read {
            Read::End => return,
            Read::Whole => each(Line::Whole(&self.line)),
            Read::TooLong => each(Line::TooLong),
        }
        if self.line.capacity() > SMALL_LINE {
            self.line = Vec::new();
        }
    }
}

/// Feed everything `r` gives to `lines` until its end (or a read error,
/// taken as the end).
pub fn read_to_end(mut r: impl io::Read, mut lines: Lines, mut each: impl FnMut(Line<'_>)) {
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => lines.feed_all(&chunk[..n], &mut each),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    lines.finish_all(each);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The lines `reads` make, fed one read at a time (`None`: too long).
    pub(crate) fn lines_of(max: usize, reads: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        let mut got = Vec::new();
        let mut each = |l: Line<'_>| {
            got.push(match l {
                Line::Whole(b) => Some(b.to_vec()),
                Line::TooLong => None,
            })
        };
        let mut lines = Lines::new(max);
        for r in reads {
            lines.feed_all(r, &mut each);
        }
        lines.finish_all(&mut each);
        got
    }

    #[test]
    fn a_line_over_the_cap_is_counted_and_the_next_is_read_whole() {
        let long = vec![b'x'; 100];
        let mut stream = b"short\n".to_vec();
        stream.extend(&long);
        stream.extend(b"\nafter\n");
        // Whole in one read, and a byte at a time: the same lines.
        assert_eq!(lines_of(10, &[&stream]), vec![Some(b"short".to_vec()), None, Some(b"after".to_vec())]);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(lines_of(10, &bytes), vec![Some(b"short".to_vec()), None, Some(b"after".to_vec())]);
    }

    #[test]
    fn a_line_of_the_cap_is_kept_and_one_byte_more_is_cut() {
        assert_eq!(lines_of(5, &[b"12345\n"]), vec![Some(b"12345".to_vec())]);
        assert_eq!(lines_of(5, &[b"123", b"45\n"]), vec![Some(b"12345".to_vec())]);
        assert_eq!(lines_of(5, &[b"123456\n"]), vec![None]);
        assert_eq!(lines_of(5, &[b"123", b"456\n"]), vec![None]);
        // Of the cut line, the reader holds its first `max` bytes alone.
        let mut lines = Lines::new(5);
        lines.feed_all(b"123456789", |_| {});
        assert!(lines.over && lines.line() == b"12345");
    }

    #[test]
    fn a_last_line_without_its_newline_is_a_line() {
        assert_eq!(lines_of(10, &[b"one\ntwo"]), vec![Some(b"one".to_vec()), Some(b"two".to_vec())]);
        assert_eq!(lines_of(2, &[b"one\ntwo"]), vec![None, None]);
        assert_eq!(lines_of(10, &[b"one\n"]), vec![Some(b"one".to_vec())]);
        assert_eq!(lines_of(10, &[b""]), Vec::<Option<Vec<u8>>>::new());
    }

    #[test]
    fn read_to_end_reads_a_stream_through_the_same_reader() {
        let mut got = Vec::new();
        read_to_end(&b"a\nbb\nccc"[..], Lines::new(2), |l| got.push(matches!(l, Line::Whole(_))));
        assert_eq!(got, vec![true, true, false]);
    }

    #[test]
    fn a_line_over_the_bound_is_cut_and_the_next_one_read_whole() {
        let data = [vec![b'x'; 100], b"\nnext\nlast".to_vec()].concat();
        let mut r = io::BufReader::with_capacity(8, &data[..]);
        let mut lines = Lines::new(10);
        assert_eq!(read_line(&mut r, &mut lines).unwrap(), Read::TooLong);
        assert_eq!(lines.line(), vec![b'x'; 10]);
        assert_eq!(read_line(&mut r, &mut lines).unwrap(), Read::Whole);
        assert_eq!(lines.line(), b"next");
        assert_eq!(read_line(&mut r, &mut lines).unwrap(), Read::Whole);
        assert_eq!(lines.line(), b"last");
        assert_eq!(read_line(&mut r, &mut lines).unwrap(), Read::End);
        assert_eq!(lines.line(), b"");
    }

    #[test]
    fn a_line_fed_a_byte_at_a_time_is_the_same_line() {
        let mut lines = Lines::new(64);
        let mut got = Vec::new();
        for b in b"{\"id\":\"\xc3\xa9\"}\n\nx" {
            if let (1, Some(read)) = lines.feed(std::slice::from_ref(b)) {
                got.push((read, lines.line().to_vec()));
            }
        }
        assert_eq!(lines.finish(), Read::Whole);
        assert_eq!(lines.take(), b"x");
        assert_eq!(got, [(Read::Whole, "{\"id\":\"é\"}".as_bytes().to_vec()), (Read::Whole, vec![])]);
    }
}
