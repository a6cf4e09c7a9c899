//! A streaming CSV/TSV scanner: counts records and columns, keeps the first
//! record, flags cells a spreadsheet would run as a formula, and (when asked)
//! emits a sanitised copy with a `'` before each such cell.
//!
//! It reads bytes, in chunks of any size, with RFC 4180 quoting (`""` inside
//! quotes is a quote; CR, LF and CRLF end a record outside quotes), so memory
//! stays constant whatever the file. A cell is flagged when its content
//! begins with `=`, `@`, tab or carriage return, or with `+`/`-` unless the
//! whole cell is a plain number (`-3.5`, `+1e3`, `-12%`): negative numbers are
//! data, `-2+3` is a formula (OWASP "CSV Injection").

/// Cells kept from the first record, and bytes kept of each.
const HEADER_CELLS: usize = 50;
const HEADER_CELL_BYTES: usize = 100;
/// A `+`/`-` cell longer than this is not a number, whatever it holds.
const NUMBER_BYTES: usize = 64;
/// Locations listed for flagged cells.
const EXAMPLES: usize = 5;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    /// Before the first byte of a cell.
    CellStart,
    Unquoted,
    Quoted,
    /// A `"` inside a quoted cell: an escaped quote or the closing one.
    QuoteInQuoted,
    /// A CR ended the record; an LF right after belongs to it.
    AfterCr,
}

/// Whether the scanner writes a sanitised copy as it goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Emit {
    Nothing,
    SanitizedCopy,
}

pub(super) struct CsvScan {
    delim: u8,
    emit: Emit,
    out: Vec<u8>,
    st: St,
    /// Cells so far in the current record, and whether it has any byte.
    col: u64,
    row_started: bool,
    content_started: bool,
    /// A `+`/`-` cell held back (raw bytes) until it is known to be a number.
    pending: Option<Vec<u8>>,
    cell_text: Vec<u8>,
    pub rows: u64,
    pub columns: u64,
    pub header: Vec<String>,
    pub flagged: u64,
    pub examples: Vec<String>,
}

impl CsvScan {
    pub(super) fn new(delim: u8, emit: Emit) -> CsvScan {
        CsvScan {
            delim,
            emit,
            out: Vec::new(),
            st: St::CellStart,
            col: 0,
            row_started: false,
            content_started: false,
            pending: None,
            cell_text: Vec::new(),
            rows: 0,
            columns: 0,
            header: Vec::new(),
            flagged: 0,
            examples: Vec::new(),
        }
    }

    /// Scan one chunk; with `Emit::SanitizedCopy`, its transformed bytes are
    /// then in [`CsvScan::take_output`].
    ///
    /// Most bytes are inside a cell whose start is already decided: those
    /// are skipped (copied, when emitting) in runs up to the next byte that
    /// can end the cell (memchr), which is what `byte` would do with each.
    /// The first record goes byte by byte: its cells are kept as the header.
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while i < chunk.len() {
            let rest = &chunk[i..];
            let run = match self.st {
                _ if self.rows == 0 || !self.content_started || self.pending.is_some() => 0,
                St::Unquoted => run_until(
                    rest,
                    |b| b == self.delim || b == b'\n' || b == b'\r',
                    |r| memchr::memchr3(self.delim, b'\n', b'\r', r),
                ),
                St::Quoted => run_until(rest, |b| b == b'"', |r| memchr::memchr(b'"', r)),
                _ => 0,
            };
            if run > 0 {
                self.put_all(&rest[..run]);
                i += run;
                continue;
            }
            self.byte(chunk[i]);
            i += 1;
        }
    }

    /// What the sanitised copy has gained since the last call.
    pub(super) fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// End of input: close whatever cell and record are open.
    pub(super) fn finish(&mut self) {
        match self.st {
            St::QuoteInQuoted => {
                self.finish_content();
                self.put(b'"');
                self.end_cell();
                self.end_row();
            }
            St::Quoted | St::Unquoted => {
                self.end_cell();
                self.end_row();
            }
            St::CellStart => {
                if self.row_started {
                    self.end_cell();
                    self.end_row();
                }
            }
            St::AfterCr => self.end_row(),
        }
        self.st = St::CellStart;
    }

    fn put(&mut self, b: u8) {
        if self.emit == Emit::SanitizedCopy {
            self.out.push(b);
        }
    }

    fn put_all(&mut self, bytes: &[u8]) {
        if self.emit == Emit::SanitizedCopy {
            self.out.extend_from_slice(bytes);
        }
    }

    fn byte(&mut self, b: u8) {
        match self.st {
            St::CellStart => {
                if b == b'"' {
                    self.row_started = true;
                    self.st = St::Quoted;
                    self.put(b);
                } else if b == self.delim {
                    self.row_started = true;
                    self.end_cell();
                    self.put(b);
                } else if b == b'\n' {
                    if self.row_started {
                        self.end_cell();
                    }
                    self.end_row();
                    self.put(b);
                } else if b == b'\r' {
                    if self.row_started {
                        self.end_cell();
                    }
                    self.st = St::AfterCr;
                    self.put(b);
                } else {
                    self.row_started = true;
                    self.st = St::Unquoted;
                    self.content(b, &[b]);
                }
            }
            St::Unquoted => {
                if b == self.delim {
                    self.end_cell();
                    self.st = St::CellStart;
                    self.put(b);
                } else if b == b'\n' {
                    self.end_cell();
                    self.end_row();
                    self.st = St::CellStart;
                    self.put(b);
                } else if b == b'\r' {
                    self.end_cell();
                    self.st = St::AfterCr;
                    self.put(b);
                } else {
                    self.content(b, &[b]);
                }
            }
            St::Quoted => {
                if b == b'"' {
                    self.st = St::QuoteInQuoted;
                } else {
                    self.content(b, &[b]);
                }
            }
            St::QuoteInQuoted => {
                if b == b'"' {
                    self.st = St::Quoted;
                    self.content(b'"', b"\"\"");
                } else {
                    // The closing quote: the cell's content is complete. Bytes
                    // after it up to the delimiter are kept, as Python's csv does.
                    self.finish_content();
                    self.put(b'"');
                    self.st = St::Unquoted;
                    self.byte(b);
                }
            }
            St::AfterCr => {
                self.end_row();
                self.st = St::CellStart;
                if b == b'\n' {
                    self.put(b);
                } else {
                    self.byte(b);
                }
            }
        }
    }

    /// One byte of cell content: `decoded` as a reader sees it, `raw` as
    /// written in the file.
    fn content(&mut self, decoded: u8, raw: &[u8]) {
        if self.rows == 0 && self.cell_text.len() < HEADER_CELL_BYTES {
            self.cell_text.push(decoded);
        }
        if !self.content_started {
            self.content_started = true;
            match decoded {
                b'=' | b'@' | b'\t' | b'\r' => {
                    self.flag();
                    self.put(b'\'');
                    self.put_all(raw);
                }
                b'+' | b'-' => self.pending = Some(raw.to_vec()),
                _ => self.put_all(raw),
            }
            return;
        }
        if let Some(p) = &mut self.pending {
            p.extend_from_slice(raw);
            if p.len() > NUMBER_BYTES {
                // Too long to be a number: a formula, whatever follows.
                let p = std::mem::take(p);
                self.pending = None;
                self.flag();
                self.put(b'\'');
                self.put_all(&p);
            }
            return;
        }
        self.put_all(raw);
    }

    /// Decide a held-back `+`/`-` cell and write it out.
    fn finish_content(&mut self) {
        if let Some(p) = self.pending.take() {
            if !is_plain_number(&p) {
                self.flag();
                self.put(b'\'');
            }
            self.put_all(&p);
        }
    }

    fn flag(&mut self) {
        self.flagged += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(format!("row {}, column {}", self.rows + 1, self.col + 1));
        }
    }

    fn end_cell(&mut self) {
        self.finish_content();
        if self.rows == 0 && self.header.len() < HEADER_CELLS {
            let text = String::from_utf8_lossy(&self.cell_text);
            self.header.push(super::text::printable(&text, HEADER_CELL_BYTES));
        }
        self.cell_text.clear();
        self.col += 1;
        self.content_started = false;
    }

    fn end_row(&mut self) {
        if self.row_started {
            if self.rows == 0 {
                self.columns = self.col;
            }
            self.rows += 1;
        }
        self.col = 0;
        self.row_started = false;
        self.content_started = false;
    }
}

/// Bytes before the first that `ends` a run: most cells are short, so the
/// first few bytes are looked at one by one (a vector search costs more to
/// set up than such a cell holds), the rest with `search`.
fn run_until(rest: &[u8], ends: impl Fn(u8) -> bool, search: impl Fn(&[u8]) -> Option<usize>) -> usize {
    const BY_HAND: usize = 16;
    let head = &rest[..rest.len().min(BY_HAND)];
    match head.iter().position(|&b| ends(b)) {
        Some(n) => n,
        None if rest.len() <= BY_HAND => rest.len(),
        None => BY_HAND + search(&rest[BY_HAND..]).unwrap_or(rest.len() - BY_HAND),
    }
}

/// [`is_plain_number`] for cell text read from elsewhere (XLSX strings).
pub(super) fn is_number_text(text: &str) -> bool {
    text.len() <= NUMBER_BYTES && is_plain_number(text.as_bytes())
}

/// `[+-]?(digits[.digits]|.digits)([eE][+-]?digits)?%?`: a cell a spreadsheet
/// reads as a number, not a formula.
fn is_plain_number(cell: &[u8]) -> bool {
    let mut s = cell;
    if let [b'+' | b'-', rest @ ..] = s {
        s = rest;
    }
    if let [rest @ .., b'%'] = s {
        s = rest;
    }
    let digits = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_digit()).count();
    let int = digits(s);
    s = &s[int..];
    let mut frac = 0;
    if let [b'.', rest @ ..] = s {
        frac = digits(rest);
        s = &rest[frac..];
    }
    if int + frac == 0 {
        return false;
    }
    if let [b'e' | b'E', rest @ ..] = s {
        let rest = match rest {
            [b'+' | b'-', r @ ..] => r,
            r => r,
        };
        let exp = digits(rest);
        if exp == 0 {
            return false;
        }
        s = &rest[exp..];
    }
    s.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scanner driven one `byte` at a time: what `feed`'s runs must
    /// match exactly.
    fn scan_bytewise(text: &[u8], delim: u8) -> (CsvScan, Vec<u8>) {
        let mut s = CsvScan::new(delim, Emit::SanitizedCopy);
        for &b in text {
            s.byte(b);
        }
        s.finish();
        let out = s.take_output();
        (s, out)
    }

    #[test]
    fn skipping_runs_inside_cells_changes_nothing() {
        // A small xorshift over the bytes that matter to the state machine.
        let alphabet = b"ab1.,;\t\r\n\"=+-@ 9e%";
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in (0..4000).step_by(7) {
            let text: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    alphabet[(x % alphabet.len() as u64) as usize]
                })
                .collect();
            for delim in [b',', b'\t'] {
                let (want, want_out) = scan_bytewise(&text, delim);
                for chunk in [1, 3, 64, 4096] {
                    let (got, got_out) = scan(&text, delim, chunk);
                    assert_eq!(got_out, want_out, "len {len} chunk {chunk}");
                    assert_eq!(
                        (got.rows, got.columns, &got.header, got.flagged, &got.examples),
                        (want.rows, want.columns, &want.header, want.flagged, &want.examples),
                        "len {len} chunk {chunk}"
                    );
                }
            }
        }
    }

    fn scan(text: &[u8], delim: u8, chunk: usize) -> (CsvScan, Vec<u8>) {
        let mut s = CsvScan::new(delim, Emit::SanitizedCopy);
        let mut out = Vec::new();
        for c in text.chunks(chunk.max(1)) {
            s.feed(c);
            out.extend(s.take_output());
        }
        s.finish();
        out.extend(s.take_output());
        (s, out)
    }

    #[test]
    fn rows_columns_and_header_are_counted() {
        let (s, out) = scan(b"name,score\r\nada,3\r\n\r\n\"b, c\",\"4\"\n", b',', 7);
        assert_eq!((s.rows, s.columns), (3, 2));
        assert_eq!(s.header, vec!["name", "score"]);
        assert_eq!(s.flagged, 0);
        assert_eq!(out, b"name,score\r\nada,3\r\n\r\n\"b, c\",\"4\"\n");
    }

    #[test]
    fn formula_cells_are_flagged_wherever_the_chunks_split() {
        let text = b"a,b\n=HYPERLINK(\"x\"),ok\n\"@SUM(1)\",-2+3\nx,\"\tcmd\"\n+1,-4.5\n1,-\n";
        for chunk in [1, 2, 3, 5, 64] {
            let (s, out) = scan(text, b',', chunk);
            assert_eq!(s.flagged, 5, "chunk {chunk}");
            assert_eq!(s.examples[0], "row 2, column 1");
            assert_eq!(s.examples[1], "row 3, column 1");
            assert_eq!(s.examples[2], "row 3, column 2");
            assert_eq!(s.examples[3], "row 4, column 2");
            assert_eq!(s.examples[4], "row 6, column 2");
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "a,b\n'=HYPERLINK(\"x\"),ok\n\"'@SUM(1)\",'-2+3\nx,\"'\tcmd\"\n+1,-4.5\n1,'-\n"
            );
        }
    }

    #[test]
    fn tabs_separate_tsv_cells_and_start_formulas_in_csv() {
        let (s, _) = scan(b"a\tb\n=1\t2\n", b'\t', 4);
        assert_eq!((s.rows, s.columns, s.flagged), (2, 2, 1));
        let (s, _) = scan(b"a,\tb\n", b',', 4);
        assert_eq!(s.flagged, 1);
    }

    #[test]
    fn quoted_carriage_return_and_escaped_quotes_are_content() {
        let (s, out) = scan(b"\"\r=x\",\"say \"\"hi\"\"\"\n", b',', 3);
        assert_eq!(s.flagged, 1);
        assert_eq!(s.header, vec!["\\r=x", "say \"hi\""]);
        assert_eq!(out, b"\"'\r=x\",\"say \"\"hi\"\"\"\n");
    }

    #[test]
    fn a_long_signed_cell_is_not_a_number() {
        let cell = format!("-{}", "1".repeat(100));
        let (s, out) = scan(cell.as_bytes(), b',', 10);
        assert_eq!(s.flagged, 1);
        assert_eq!(out, format!("'{cell}").as_bytes());
    }

    #[test]
    fn plain_numbers_are_told_from_formulas() {
        for n in ["-1", "+2", "-3.5", "-.5", "+1e3", "-2E-4", "-12%", "5."] {
            assert!(is_plain_number(n.as_bytes()), "{n}");
        }
        for f in ["-", "+", "-2+3", "-A1", "--1", "-1e", "-.", "+cmd|' /C calc'!A0"] {
            assert!(!is_plain_number(f.as_bytes()), "{f}");
        }
    }

    #[test]
    fn a_clean_file_is_copied_byte_for_byte() {
        let text = b"x,y\r\n1,\"a\nb\"\r\nlast,row-without-newline";
        let (s, out) = scan(text, b',', 2);
        assert_eq!(s.flagged, 0);
        assert_eq!(s.rows, 3);
        assert_eq!(out, text);
    }
}
