//! A streaming scanner for active content in HTML and SVG: `<script>`,
//! `<iframe>`, `<object>` and `<embed>` elements, `on*=` event handler
//! attributes, and attribute values that are `javascript:`/`vbscript:` URLs
//! (browsers drop tabs and newlines inside a URL scheme, and so do we).
//!
//! It tracks tags, attributes and quoting byte by byte, so a `>` inside a
//! quoted value does not end a tag and nothing is missed where a chunk ends.
//! It is a tripwire for the user, not a sanitiser: entity-encoded schemes
//! and the like are out of its reach.

const NAME_BYTES: usize = 32;
const URL_PREFIX: usize = 16;
const EXAMPLES: usize = 5;
const ACTIVE_ELEMENTS: &[&str] = &["script", "iframe", "object", "embed"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Text,
    TagName,
    AttrSpace,
    AttrName,
    AfterName,
    BeforeValue,
    Value(u8),
    UnquotedValue,
}

pub(super) struct MarkupScan {
    st: St,
    closing: bool,
    name: Vec<u8>,
    value: Vec<u8>,
    line: u64,
    pub hits: u64,
    pub examples: Vec<String>,
}

impl MarkupScan {
    pub(super) fn new() -> MarkupScan {
        MarkupScan {
            st: St::Text,
            closing: false,
            name: Vec::new(),
            value: Vec::new(),
            line: 1,
            hits: 0,
            examples: Vec::new(),
        }
    }

    pub(super) fn feed(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if b == b'\n' {
                self.line += 1;
            }
            self.byte(b.to_ascii_lowercase());
        }
    }

    fn hit(&mut self, what: String) {
        self.hits += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(format!("line {}: {what}", self.line));
        }
    }

    fn byte(&mut self, b: u8) {
        let space = b.is_ascii_whitespace();
        match self.st {
            St::Text => {
                if b == b'<' {
                    self.st = St::TagName;
                    self.name.clear();
                    self.closing = false;
                }
            }
            St::TagName => {
                if b == b'/' && self.name.is_empty() {
                    self.closing = true;
                } else if b.is_ascii_alphanumeric() || matches!(b, b'-' | b':' | b'_' | b'!') {
                    if self.name.len() < NAME_BYTES {
                        self.name.push(b);
                    }
                } else if space || b == b'/' || b == b'>' {
                    self.check_tag();
                    self.st = if b == b'>' { St::Text } else { St::AttrSpace };
                } else {
                    // `a < b` in text: not a tag.
                    self.st = St::Text;
                }
            }
            St::AttrSpace => {
                if b == b'>' {
                    self.st = St::Text;
                } else if !(space || b == b'/') {
                    self.name.clear();
                    self.name.push(b);
                    self.st = St::AttrName;
                }
            }
            St::AttrName => {
                if b == b'=' {
                    self.check_attr();
                    self.st = St::BeforeValue;
                } else if space {
                    self.st = St::AfterName;
                } else if b == b'>' {
                    self.check_attr();
                    self.st = St::Text;
                } else if b == b'/' {
                    self.check_attr();
                    self.st = St::AttrSpace;
                } else if self.name.len() < NAME_BYTES {
                    self.name.push(b);
                }
            }
            St::AfterName => {
                if b == b'=' {
                    self.check_attr();
                    self.st = St::BeforeValue;
                } else if b == b'>' {
                    self.check_attr();
                    self.st = St::Text;
                } else if !space {
                    self.check_attr();
                    self.name.clear();
                    self.name.push(b);
                    self.st = St::AttrName;
                }
            }
            St::BeforeValue => {
                self.value.clear();
                if b == b'"' || b == b'\'' {
                    self.st = St::Value(b);
                } else if b == b'>' {
                    self.st = St::Text;
                } else if !space {
                    self.value_byte(b);
                    self.st = St::UnquotedValue;
                }
            }
            St::Value(q) => {
                if b == q {
                    self.check_url();
                    self.st = St::AttrSpace;
                } else {
                    self.value_byte(b);
                }
            }
            St::UnquotedValue => {
                if space || b == b'>' {
                    self.check_url();
                    self.st = if b == b'>' { St::Text } else { St::AttrSpace };
                } else {
                    self.value_byte(b);
                }
            }
        }
    }

    fn value_byte(&mut self, b: u8) {
        // URL parsers strip leading spaces and C0 controls, and drop tabs and
        // newlines anywhere (WHATWG URL); do the same before matching.
        if matches!(b, b'\t' | b'\n' | b'\r') || (self.value.is_empty() && b <= b' ') {
            return;
        }
        if self.value.len() < URL_PREFIX {
            self.value.push(b);
        }
    }

    fn check_tag(&mut self) {
        if self.closing {
            return;
        }
        let name = self.name.rsplit(|&c| c == b':').next().unwrap_or(&[]);
        if let Some(el) = ACTIVE_ELEMENTS.iter().find(|e| e.as_bytes() == name) {
            self.hit(format!("<{el}>"));
        }
    }

    fn check_attr(&mut self) {
        let n = &self.name;
        if n.len() > 2 && n.starts_with(b"on") && n[2..].iter().all(u8::is_ascii_lowercase) {
            let name = String::from_utf8_lossy(n).into_owned();
            self.hit(format!("{name}= handler"));
        }
    }

    fn check_url(&mut self) {
        for scheme in ["javascript:", "vbscript:"] {
            if self.value.starts_with(scheme.as_bytes()) {
                self.hit(format!("{scheme} URL"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str, chunk: usize) -> MarkupScan {
        let mut s = MarkupScan::new();
        for c in text.as_bytes().chunks(chunk) {
            s.feed(c);
        }
        s
    }

    #[test]
    fn scripts_handlers_and_script_urls_are_found_across_chunks() {
        let html = "<html>\n<body onload=\"x()\">\n<a title='>' href=\" JaVa\tScRiPt:alert(1)\">x</a>\n<SCRIPT>1</SCRIPT>\n<svg:script/><img src=x onerror=y>";
        for chunk in [1, 3, 7, 1000] {
            let s = scan(html, chunk);
            assert_eq!(s.hits, 5, "chunk {chunk}: {:?}", s.examples);
            assert_eq!(s.examples[0], "line 2: onload= handler");
            assert_eq!(s.examples[1], "line 3: javascript: URL");
            assert_eq!(s.examples[2], "line 4: <script>");
        }
    }

    #[test]
    fn plain_markup_and_text_that_mentions_scripts_is_clean() {
        let s =
            scan("<p class=\"online\">turn on = off; a < b; see javascript: the book</p><a href=\"https://x/javascript:\">", 4);
        assert_eq!(s.hits, 0, "{:?}", s.examples);
        let s = scan("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\"><rect onclick_x=\"1\"/></svg>", 5);
        assert_eq!(s.hits, 0, "{:?}", s.examples);
    }
}
