//! A rich result's MIME bundle (the last expression's value, a
//! `display()`, a figure), judged before it is listed: the code in the
//! jail made it, so it is the code's own word, read with the same
//! suspicion as a file it left. Each representation is checked against
//! what its MIME type promises by the artifact inspector itself (a PNG is
//! a PNG by its signature and header, HTML and SVG are scanned for active
//! content and flagged), bounded in bytes, and dropped with the reason
//! when it does not pass. One [`Judge`] per step holds the step's caps:
//! [`MAX_RESULTS`] results and [`MAX_STEP_BYTES`] kept in all.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

use super::budget::Deadline;
use super::inspect::inspect;
use super::rules::PastBudget;
use super::text::escape_name;
use crate::result::{ContentFlag, DisplayResult, FlagKind, RefusedRepresentation};

/// Rich results one step may list; past it they are counted as dropped.
pub const MAX_RESULTS: usize = 32;
/// Bytes of one representation (decoded, for an image).
pub const MAX_REPRESENTATION_BYTES: usize = 2 << 20;
/// Bytes of every representation one step's results keep together.
pub const MAX_STEP_BYTES: usize = 8 << 20;
/// Scanning time of one representation.
const SCAN_TIME: Duration = Duration::from_millis(250);
/// Representations one result may offer (Jupyter's formatters give eight).
const MAX_REPRESENTATIONS: usize = 16;
/// Longest MIME type kept in a refusal.
const MAX_MIME: usize = 100;

/// How a MIME type's representation is carried and judged.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Text shown as it is.
    Text,
    /// Markup a browser runs: scanned, and flagged for active content.
    Markup(&'static str),
    /// An image, base64 in the bundle: decoded, and its content must be
    /// what the type says.
    Image(&'static str),
    /// A JSON value.
    Json,
}

fn kind_of(mime: &str) -> Option<Kind> {
    Some(match mime {
        "text/plain" | "text/markdown" | "text/latex" => Kind::Text,
        "text/html" => Kind::Markup("html"),
        "image/svg+xml" => Kind::Markup("svg"),
        "image/png" => Kind::Image("png"),
        "image/jpeg" => Kind::Image("jpg"),
        "application/json" => Kind::Json,
        _ => return None,
    })
}

/// One step's judge of rich results.
#[derive(Debug, Default)]
pub struct Judge {
    kept: usize,
    bytes: usize,
    dropped: u64,
}

impl Judge {
    /// The result a bundle makes, or `None` when it is dropped whole (past
    /// the step's caps, or nothing in it was a bundle).
    pub fn take(&mut self, data: &serde_json::Map<String, Value>, main: bool) -> Option<DisplayResult> {
        if self.kept >= MAX_RESULTS || data.len() > MAX_REPRESENTATIONS {
            self.dropped += 1;
            return None;
        }
        let mut out = DisplayResult {
            data: BTreeMap::new(),
            is_main_result: main,
            flags: Vec::new(),
            refused: Vec::new(),
        };
        for (mime, value) in data {
            match self.judge(mime, value) {
                Ok((kept, bytes, flags)) => {
                    self.bytes += bytes;
                    out.data.insert(mime.clone(), kept);
                    out.flags.extend(flags);
                }
                Err(detail) => out.refused.push(RefusedRepresentation { mime: shown(mime), detail }),
            }
        }
        self.kept += 1;
        Some(out)
    }

    /// Results dropped whole so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// One representation: what is kept, its bytes, and its flags; or why not.
    fn judge(&self, mime: &str, value: &Value) -> Result<(Value, usize, Vec<ContentFlag>), String> {
        let kind = kind_of(mime)
            .ok_or_else(|| "not a type the jail passes on (text, HTML, Markdown, LaTeX, SVG, PNG, JPEG, JSON)".to_string())?;
        let room = MAX_STEP_BYTES.saturating_sub(self.bytes).min(MAX_REPRESENTATION_BYTES);
        let too_large = |n: usize| {
            format!(
                "{n} bytes: one representation may be {} MiB, a step's {} MiB in all (save it as a file instead)",
                MAX_REPRESENTATION_BYTES >> 20,
                MAX_STEP_BYTES >> 20
            )
        };
        if kind == Kind::Json {
            let n = serde_json::to_vec(value).map_or(usize::MAX, |v| v.len());
            return if n > room { Err(too_large(n)) } else { Ok((value.clone(), n, Vec::new())) };
        }
        let Value::String(text) = value else { return Err("not a string".into()) };
        let bytes = match kind {
            Kind::Image(_) => {
                // A base64 text larger than the room's encoding is never decoded.
                if text.len() / 4 * 3 > room + 3 {
                    return Err(too_large(text.len() / 4 * 3));
                }
                base64::engine::general_purpose::STANDARD
                    .decode(text.as_bytes())
                    .map_err(|e| format!("not base64 ({e})"))?
            }
            _ => text.as_bytes().to_vec(),
        };
        if bytes.len() > room {
            return Err(too_large(bytes.len()));
        }
        let flags = match kind {
            Kind::Text | Kind::Json => Vec::new(),
            Kind::Markup(ext) | Kind::Image(ext) => {
                let deadline = Deadline::at(Instant::now() + SCAN_TIME);
                let seen = inspect(&mut Cursor::new(&bytes), bytes.len() as u64, ext, deadline, PastBudget::Flag)
                    .map_err(|_| "could not be read".to_string())?;
                // An image, and SVG, must be what its type says; HTML is
                // any text a browser reads, so only what it would run counts.
                let typed = kind != Kind::Markup("html");
                if typed && seen.media_type != mime {
                    return Err(format!("says {mime} but its content is {}", seen.media_type));
                }
                if matches!(kind, Kind::Image(_)) && seen.summary.is_none() {
                    return Err(format!("a {mime} without a readable header"));
                }
                seen.flags.into_iter().filter(|f| f.kind != FlagKind::MediaTypeMismatch).collect()
            }
        };
        Ok((value.clone(), bytes.len(), flags))
    }
}

/// A MIME type as a refusal names it: escaped and cut.
fn shown(mime: &str) -> String {
    let cut: String = mime.chars().take(MAX_MIME).collect();
    escape_name(cut.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut p = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        p.extend(w.to_be_bytes());
        p.extend(h.to_be_bytes());
        p.extend([8, 2, 0, 0, 0, 0, 0, 0, 0]);
        p
    }

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    fn bundle(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn what_a_type_promises_is_checked_and_active_markup_is_flagged() {
        let mut j = Judge::default();
        let r = j
            .take(
                &bundle(json!({
                    "text/plain": "<Figure>",
                    "image/png": b64(&png(640, 480)),
                    "text/html": "<b>hi</b><script>fetch('x')</script>",
                    "application/json": {"a": [1, 2]},
                })),
                true,
            )
            .unwrap();
        assert!(r.is_main_result && r.refused.is_empty(), "{r:?}");
        assert_eq!(r.data.len(), 4);
        let kinds: Vec<FlagKind> = r.flags.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, [FlagKind::Script], "HTML is any text; only active content is flagged: {r:?}");
        let r = j.take(&bundle(json!({"image/svg+xml": "plain words", "text/html": "plain words"})), false).unwrap();
        assert_eq!(r.data.keys().collect::<Vec<_>>(), ["text/html"], "{r:?}");
        assert!(r.refused[0].detail.contains("its content is"), "{r:?}");
        let r = j
            .take(
                &bundle(json!({
                    "image/png": b64(b"<svg onload='x'/>"),
                    "image/jpeg": "not base64!",
                    "application/x-evil": "x",
                    "text/plain": 3,
                })),
                false,
            )
            .unwrap();
        assert!(r.data.is_empty(), "{r:?}");
        let why: BTreeMap<_, _> = r.refused.iter().map(|x| (x.mime.as_str(), x.detail.as_str())).collect();
        assert!(why["image/png"].contains("its content is"), "{why:?}");
        assert!(why["image/jpeg"].contains("base64"), "{why:?}");
        assert!(why["application/x-evil"].contains("not a type"), "{why:?}");
        assert!(why["text/plain"].contains("not a string"), "{why:?}");
    }

    #[test]
    fn a_steps_results_are_bounded_in_count_and_bytes() {
        let mut j = Judge::default();
        let big = "x".repeat(MAX_REPRESENTATION_BYTES);
        for _ in 0..(MAX_STEP_BYTES / MAX_REPRESENTATION_BYTES) {
            let r = j.take(&bundle(json!({ "text/plain": big })), false).unwrap();
            assert!(r.refused.is_empty());
        }
        // The step's bytes are spent: the next representation is refused.
        let r = j.take(&bundle(json!({ "text/plain": "one more" })), false).unwrap();
        assert!(r.data.is_empty() && r.refused[0].detail.contains("MiB"), "{r:?}");
        let over = "x".repeat(MAX_REPRESENTATION_BYTES + 1);
        let r = Judge::default().take(&bundle(json!({ "text/html": over })), false).unwrap();
        assert!(r.data.is_empty(), "{:?}", r.refused);
        let mut j = Judge::default();
        for _ in 0..MAX_RESULTS {
            assert!(j.take(&bundle(json!({"text/plain": "r"})), false).is_some());
        }
        assert!(j.take(&bundle(json!({"text/plain": "r"})), false).is_none());
        assert_eq!(j.dropped(), 1);
        let many: serde_json::Map<String, Value> =
            (0..=MAX_REPRESENTATIONS).map(|i| (format!("text/x{i}"), json!("v"))).collect();
        assert!(Judge::default().take(&many, false).is_none());
        // A refusal names the type escaped and cut, never raw.
        let r = Judge::default().take(&bundle(json!({"text/\u{202e}evil": "x"})), false).unwrap();
        assert!(!r.refused[0].mime.contains('\u{202e}'), "{r:?}");
    }
}
