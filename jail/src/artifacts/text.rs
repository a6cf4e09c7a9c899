//! Text the judging shows in the result: a file's name (`escape_name`) and
//! what a summariser quotes from a file (`printable`: a CSV header, a JSON
//! key, a sheet's title), escaped so that nothing the script wrote can
//! forge a line, hide a character or reorder the text around it. A leaf the
//! walk (artifacts.rs) and every summariser use.

use std::fmt::Write as _;

/// Characters never let through in a name and escaped wherever shown:
/// controls, and the invisible or bidi-reordering ones that make a name look
/// like another (CVE-2021-42574, "Trojan Source").
pub(super) fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\\' => out.push_str("\\\\"),
        c if needs_escape(c) && (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// Raw name bytes as printable text: invalid UTF-8 as `\xNN`, controls and
/// bidi characters escaped, backslashes doubled.
pub fn escape_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_escaped(&mut out, c);
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// Text for the result: escaped like a name, and cut to `max_chars`.
pub(super) fn printable(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_names_are_printable_and_keep_every_byte_visible() {
        assert_eq!(escape_name(b"a\x1b[31mb"), "a\\x1b[31mb");
        assert_eq!(escape_name(b"\xff.txt"), "\\xff.txt");
        assert_eq!(escape_name("x\u{202e}y\\".as_bytes()), "x\\u{202e}y\\\\");
        assert_eq!(escape_name("caf\u{e9}\n".as_bytes()), "caf\u{e9}\\n");
        assert_eq!(printable("abcdef", 3), "abc…");
    }
}
