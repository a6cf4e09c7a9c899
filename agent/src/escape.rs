//! Untrusted text made safe to show: the model's strings (tool names, todo
//! names, paths, the final answer) and the names a step left in its output
//! reach a terminal, `summary.txt`, the answer's preview and the model's own
//! next request. Control characters, and the invisible and bidi-reordering
//! ones that make text look like other text (CVE-2021-42574, "Trojan
//! Source"), are shown visibly (`\x1b`, `\u{202e}`); and anything echoed is
//! cut to a few hundred bytes, so a 5 MB path is not sent back in full.

use std::fmt::Write as _;

/// How many bytes of a model string are echoed back by default.
pub const ECHO_BYTES: usize = 200;

/// Whether multi-line text keeps its line breaks and tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// One line: `\n` and `\t` are escaped too.
    One,
    /// Keep `\n` and `\t` (the answer, a report); everything else escaped.
    Keep,
}

/// Characters never shown raw: the jail's one list (controls, and the
/// invisible or bidi-reordering ones), the same that artifact names are
/// judged by.
pub use jail::artifacts::needs_escape;

/// `text` with every such character escaped visibly.
pub fn escape(text: &str, lines: Lines) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push(&mut out, c, lines);
    }
    out
}

fn push(out: &mut String, c: char, lines: Lines) {
    match c {
        '\n' | '\t' if lines == Lines::Keep => out.push(c),
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if needs_escape(c) && (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// At most `max` bytes of `text` (cut at a character boundary), with a note
/// of how long it was when it was cut. Not escaped.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut: {} bytes in all]", &text[..end], text.len())
}

/// A model string as it may be echoed on one line: cut, then escaped.
pub fn shown(text: &str) -> String {
    escape(&cut(text, ECHO_BYTES), Lines::One)
}

/// A model string cut to `max` bytes and escaped on one line.
pub fn shown_max(text: &str, max: usize) -> String {
    escape(&cut(text, max), Lines::One)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_bidi_and_invisible_characters_are_shown_visibly() {
        assert_eq!(escape("a\u{1b}[2Jb", Lines::One), "a\\x1b[2Jb");
        assert_eq!(escape("x\u{202e}y\u{200b}z\u{2066}", Lines::One), "x\\u{202e}y\\u{200b}z\\u{2066}");
        assert_eq!(escape("l1\nl2\r\tx", Lines::One), "l1\\nl2\\r\\tx");
        assert_eq!(escape("l1\nl2\r\tx\u{7}", Lines::Keep), "l1\nl2\\r\tx\\x07");
        assert_eq!(escape("café ünïcode ✓", Lines::One), "café ünïcode ✓");
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary_with_their_length() {
        let long = "é".repeat(5_000_000);
        let s = shown(&long);
        assert!(s.len() < ECHO_BYTES + 64, "{}", s.len());
        assert!(s.ends_with("… [cut: 10000000 bytes in all]"), "{s}");
        assert_eq!(cut("short", 10), "short");
    }
}
