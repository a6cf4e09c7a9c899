//! Text the judging shows in the result: a file's name (`escape_name`) and
//! what a summariser quotes from a file (`printable`: a CSV header, a JSON
//! key, a sheet's title), escaped so that nothing the script wrote can
//! forge a line, hide a character or reorder the text around it. A leaf the
//! walk (artifacts.rs) and every summariser use.

use std::fmt::Write as _;

/// Characters never let through in a name and escaped wherever shown, here
/// and by the agent (what the model wrote, what a step left): controls, and
/// the invisible or bidi-reordering ones that make text look like other
/// text (CVE-2021-42574, "Trojan Source"): the soft hyphen, the Arabic
/// letter mark, the Mongolian vowel separator, zero-width and direction
/// marks, line and paragraph separators, embeddings and overrides, word
/// joiners and invisible operators, isolates and deprecated format
/// controls, the byte-order mark, interlinear annotations, and tags.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}')
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

    #[test]
    fn invisible_characters_that_pass_for_others_are_escaped_too() {
        // A soft hyphen, a word joiner and a tag character: each makes a
        // name look like another and once passed here (the agent escaped
        // them, the judging did not).
        for (c, shown) in [('\u{ad}', "\\u{ad}"), ('\u{2060}', "\\u{2060}"), ('\u{e0041}', "\\u{e0041}")] {
            assert!(needs_escape(c), "{shown}");
            assert_eq!(escape_name(format!("a{c}b").as_bytes()), format!("a{shown}b"));
        }
        assert!(!needs_escape('\u{e9}') && !needs_escape('\u{4e2d}'));
    }
}
