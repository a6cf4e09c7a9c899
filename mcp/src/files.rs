//! The files tools: `session_write_file`, `session_read_file` and
//! `session_list_files`, a session's files API (jail/src/session/files.rs
//! serves it, jail::client::session asks) in MCP terms. The session does
//! the work and every check that matters: each path is checked as an
//! artifact's name and opened beneath `/workspace/output` without
//! following a link, and a read file is judged by the artifact rules (a
//! CSV's formula cells neutralised) in the supervisor's own copy. This
//! module decodes a write's content, says each refusal as what happened
//! and what the model can do next, and turns a read file into content a
//! model can take: a PNG or JPEG judged with no flag as an image (the
//! rule run results use, content.rs), UTF-8 text as text, any other file
//! as its type and size. Each is capped ([`MAX_TEXT_BYTES`],
//! [`MAX_IMAGE_BYTES`], [`MAX_BASE64_BYTES`], [`MAX_ENTRIES_SHOWN`]), so a
//! reply never hands the model megabytes: the session's own cap is 8 MiB a
//! file, meant for programs, and a cell reads any part of a file.

use base64::Engine;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::schemars;
use serde::{Deserialize, Serialize};

use crate::content;
use jail::client::session::{FileAnswer, FileEntry, FileRefusal, MAX_FILE};
use jail::result::Artifact;

/// Text of a read file the reply carries; past it, the first part.
pub const MAX_TEXT_BYTES: usize = 128 << 10;
/// The largest image a read shows (its base64 is 4 MiB).
pub const MAX_IMAGE_BYTES: usize = 3 << 20;
/// The largest other file whose bytes a read gives, in base64.
pub const MAX_BASE64_BYTES: usize = 48 << 10;
/// Entries a listing shows (the session lists up to 4096).
pub const MAX_ENTRIES_SHOWN: usize = 500;

/// The folder the paths are relative to, as the code sees it.
const PLACE: &str = "/workspace/output";

/// The arguments of `session_write_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    /// The id session_start returned.
    pub session_id: String,
    /// Where to write, relative to /workspace/output (`data/in.csv`);
    /// folders on the way are made.
    pub path: String,
    /// The file's content: text, or base64 when `encoding` is `base64`.
    pub content: String,
    /// `utf-8` (the default) or `base64` (for binary content).
    #[serde(default)]
    pub encoding: Encoding,
}

/// How a write's `content` is given.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
pub enum Encoding {
    #[default]
    #[serde(rename = "utf-8")]
    Utf8,
    #[serde(rename = "base64")]
    Base64,
}

/// The arguments of `session_read_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// The id session_start returned.
    pub session_id: String,
    /// The file, relative to /workspace/output (`results/table.csv`).
    pub path: String,
}

/// The arguments of `session_list_files`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// The id session_start returned.
    pub session_id: String,
    /// The folder, relative to /workspace/output (default: that folder).
    #[serde(default)]
    pub path: String,
}

/// What `session_write_file` answers as structured content.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Written {
    /// Relative to /workspace/output.
    pub path: String,
    pub bytes: u64,
    /// Lowercase hex sha256 of what was written.
    pub sha256: String,
}

/// What `session_list_files` answers as structured content.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Listing {
    /// The folder, relative to /workspace/output (`""`: that folder).
    pub path: String,
    /// Sorted by name, at most 500.
    pub entries: Vec<FileEntry>,
    /// Whether the folder holds more entries than are listed.
    pub truncated: bool,
}

/// Which tool asked: a refusal's advice depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    Read,
    List,
}

/// A write's content as bytes, at most the session's [`MAX_FILE`].
pub fn content_bytes(req: &WriteFile) -> Result<Vec<u8>, String> {
    let bytes = match req.encoding {
        Encoding::Utf8 => {
            check_size(req.content.len())?;
            req.content.as_bytes().to_vec()
        }
        Encoding::Base64 => {
            // Line breaks a client wrapped the base64 in are not content.
            let b64: String = req.content.split_ascii_whitespace().collect();
            check_size(b64.len() / 4 * 3)?;
            base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()).map_err(|e| {
                format!(
                    "`content` is not base64 ({e}): give standard base64 with its `=` padding, \
                     or the text itself with encoding \"utf-8\""
                )
            })?
        }
    };
    check_size(bytes.len())?;
    Ok(bytes)
}

fn check_size(n: usize) -> Result<(), String> {
    if n <= MAX_FILE {
        return Ok(());
    }
    Err(format!(
        "`content` is {n} bytes, over the {} MiB one file may be: write it as several files and join them in a \
         cell (session_exec), or give it as session_start's `input`",
        MAX_FILE >> 20
    ))
}

/// The session's answer to `op` as the tool's reply: a refusal is a tool
/// error saying what happened and what to do.
pub fn reply(op: Op, answer: FileAnswer) -> CallToolResult {
    match (op, answer) {
        (_, FileAnswer::Refused { code, reason, detail }) => {
            let reason = reason.and_then(|r| serde_json::to_value(r).ok()).and_then(|v| v.as_str().map(String::from));
            error(refusal(op, code, reason.as_deref(), &detail))
        }
        (Op::Write, FileAnswer::Written { path, bytes, sha256 }) => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(format!(
                "wrote {} ({bytes} bytes): cells see it there",
                shown(&path)
            ))]);
            r.structured_content = serde_json::to_value(Written { path, bytes, sha256 }).ok();
            r
        }
        (Op::Read, FileAnswer::Read { artifact, data }) => read(artifact, data),
        (Op::List, FileAnswer::Listed { path, entries, truncated }) => listed(path, entries, truncated),
        (op, other) => error(format!("the session answered a {op:?} request with something else ({other:?}); this is a bug")),
    }
}

fn error(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// `rel` as the code names it.
fn shown(rel: &str) -> String {
    if rel.is_empty() {
        PLACE.to_string()
    } else {
        format!("{PLACE}/{rel}")
    }
}

/// A refusal in the model's terms: the session's detail (which names the
/// file and what it is), then what the model can do about it.
fn refusal(op: Op, code: FileRefusal, reason: Option<&str>, detail: &str) -> String {
    let mb = MAX_FILE >> 20;
    match (code, op) {
        (FileRefusal::BadPath, _) => format!(
            "`path` is not one these tools take ({detail}): give a path relative to {PLACE}, such as \
             `results/table.csv`, with no `..` and no control characters"
        ),
        (FileRefusal::NotFound, _) => {
            format!("{detail} in {PLACE}: see what is there with session_list_files")
        }
        (FileRefusal::Link, _) => {
            format!("{detail}, so it cannot lead out of {PLACE}: name the file or folder itself")
        }
        (FileRefusal::NotAFile, Op::List) => format!("{detail}: give a folder"),
        (FileRefusal::NotAFile, Op::Write) => format!("{detail}: give the path of a file, not of a folder"),
        (FileRefusal::NotAFile, Op::Read) => format!("{detail}: give a regular file (session_list_files shows the kinds)"),
        (FileRefusal::TooLarge, Op::Write) => format!(
            "the file is over the {mb} MiB one file may be: write it as several files and join them in a cell \
             (session_exec), or give it as session_start's `input`"
        ),
        (FileRefusal::TooLarge, _) => {
            format!(
                "the file is over the {mb} MiB these tools read: work with it in a cell (session_exec), or have a \
                 cell write the part you need to a smaller file and read that"
            )
        }
        (FileRefusal::Rejected, _) => format!(
            "the output check refused the file ({}: {detail}), so it is not handed out: a cell can still use \
             it; to read it here, have a cell copy it to a plain file (one name, an allowed extension)",
            reason.unwrap_or("rejected")
        ),
        (FileRefusal::Unavailable, _) => "this server's policy gives sessions no output folder of their own \
             (filesystem.output_size \"unlimited\"), so the files tools cannot reach it: write and read files \
             in cells with session_exec"
            .to_string(),
        (FileRefusal::Failed, Op::Write) => {
            format!("the write failed: {detail}: delete files the session no longer needs (in a cell), or write less")
        }
        (FileRefusal::Failed, _) => format!("the session could not do it: {detail}"),
    }
}

/// Whether a file of this (sniffed) type is shown as text when it is UTF-8.
fn is_text(media_type: &str) -> bool {
    media_type.starts_with("text/") || ["application/json", "application/xml", "image/svg+xml"].contains(&media_type)
}

/// A read file as content: a line saying what it is (content::describe),
/// then the image, the text, or the bytes, each within its cap.
fn read(artifact: Artifact, data: String) -> CallToolResult {
    let bytes = match base64::engine::general_purpose::STANDARD.decode(data.as_bytes()) {
        Ok(b) => b,
        Err(e) => return error(format!("the session's answer is not base64 ({e}); this is a bug")),
    };
    let head = format!("{} ({})", shown(&artifact.path), content::describe(&artifact));
    let media = artifact.media_type.as_deref().unwrap_or("");
    let blocks = if content::shown_as_image(media, &artifact.flags) {
        if bytes.len() <= MAX_IMAGE_BYTES {
            vec![ContentBlock::text(head), ContentBlock::image(data, media)]
        } else {
            vec![ContentBlock::text(format!(
                "{head}: over the {} MiB an image is shown at; have a cell save a smaller one (fewer pixels, a lower dpi) and read that",
                MAX_IMAGE_BYTES >> 20
            ))]
        }
    } else if let Some(text) = is_text(media).then(|| std::str::from_utf8(&bytes).ok()).flatten() {
        if text.len() <= MAX_TEXT_BYTES {
            vec![ContentBlock::text(head), ContentBlock::text(text)]
        } else {
            // A cut never splits a character.
            let cut = (0..=MAX_TEXT_BYTES).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            vec![
                ContentBlock::text(format!("{head}; its first {cut} bytes follow: read further in a cell (session_exec)")),
                ContentBlock::text(&text[..cut]),
            ]
        }
    } else if bytes.len() <= MAX_BASE64_BYTES {
        vec![
            ContentBlock::text(format!("{head}; its bytes in base64 follow")),
            ContentBlock::text(data),
        ]
    } else {
        vec![ContentBlock::text(format!(
            "{head}: its bytes are not shown (base64 only up to {} KiB): work with it in a cell (session_exec)",
            MAX_BASE64_BYTES >> 10
        ))]
    };
    let mut r = CallToolResult::success(blocks);
    r.structured_content = serde_json::to_value(&artifact).ok();
    r
}

/// A folder's entries, one line each, at most [`MAX_ENTRIES_SHOWN`].
fn listed(path: String, mut entries: Vec<FileEntry>, truncated: bool) -> CallToolResult {
    let more = truncated || entries.len() > MAX_ENTRIES_SHOWN;
    entries.truncate(MAX_ENTRIES_SHOWN);
    let count = match entries.len() {
        1 => "1 entry".to_string(),
        n => format!("{n} entries"),
    };
    let mut lines = vec![format!(
        "{}: {count}{}",
        shown(&path),
        if more { " shown, and more" } else { "" }
    )];
    for e in &entries {
        lines.push(match e.kind.as_str() {
            "file" => format!("  {} ({} bytes)", e.name, e.bytes),
            "dir" => format!("  {}/", e.name),
            "symlink" => format!("  {} (a symbolic link: not followed)", e.name),
            _ => format!("  {} (neither a file nor a folder)", e.name),
        });
    }
    if more {
        lines.push("more entries are not listed: list a subfolder, or look in a cell (session_exec)".into());
    }
    let listing = Listing { path, entries, truncated: more };
    let mut r = CallToolResult::success(vec![ContentBlock::text(lines.join("\n"))]);
    r.structured_content = serde_json::to_value(listing).ok();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(content: &str, encoding: Encoding) -> WriteFile {
        WriteFile { session_id: "s".into(), path: "a".into(), content: content.into(), encoding }
    }

    fn texts(r: &CallToolResult) -> Vec<String> {
        r.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect()
    }

    fn artifact(path: &str, media_type: &str, bytes: &[u8]) -> Artifact {
        Artifact {
            path: path.into(),
            bytes: bytes.len() as u64,
            sha256: Some("0".repeat(64)),
            media_type: Some(media_type.into()),
            change: jail::result::Change::Unchanged,
            flags: vec![],
            summary: None,
            neutralised: None,
        }
    }

    fn read_of(a: Artifact, bytes: &[u8]) -> CallToolResult {
        reply(Op::Read, FileAnswer::Read { artifact: a, data: base64::engine::general_purpose::STANDARD.encode(bytes) })
    }

    #[test]
    fn content_is_text_by_default_base64_when_asked_and_never_over_the_sessions_cap() {
        assert_eq!(content_bytes(&write("a,b\n", Encoding::Utf8)).unwrap(), b"a,b\n");
        assert_eq!(content_bytes(&write("AAE=\n", Encoding::Base64)).unwrap(), [0, 1]);
        assert!(content_bytes(&write("not base64!", Encoding::Base64)).unwrap_err().contains("not base64"));
        let big = "x".repeat(MAX_FILE + 1);
        assert!(content_bytes(&write(&big, Encoding::Utf8)).unwrap_err().contains("8 MiB"));
        let big = base64::engine::general_purpose::STANDARD.encode(vec![0u8; MAX_FILE + 1]);
        assert!(content_bytes(&write(&big, Encoding::Base64)).unwrap_err().contains("8 MiB"));
    }

    #[test]
    fn a_refusal_is_a_tool_error_that_says_what_to_do_in_tool_terms() {
        let r = reply(Op::Read, FileAnswer::Refused { code: FileRefusal::Link, reason: None, detail: "l.txt is a link".into() });
        assert_eq!(r.is_error, Some(true));
        let text = texts(&r).join("\n");
        assert!(text.starts_with("l.txt is a link") && text.contains("name the file"), "{text}");
        for code in [
            FileRefusal::BadPath,
            FileRefusal::NotFound,
            FileRefusal::Link,
            FileRefusal::NotAFile,
            FileRefusal::TooLarge,
            FileRefusal::Rejected,
            FileRefusal::Unavailable,
            FileRefusal::Failed,
        ] {
            for op in [Op::Write, Op::Read, Op::List] {
                let text = refusal(op, code, None, "detail");
                assert!(!text.contains("jail session") && !text.contains("--"), "{code:?} {op:?}: a CLI hint: {text}");
            }
        }
    }

    #[test]
    fn a_read_png_is_an_image_and_a_flagged_one_or_another_type_is_not() {
        let png = b"\x89PNG\r\n\x1a\nrest";
        let r = read_of(artifact("c.png", "image/png", png), png);
        assert_eq!(r.content[1].as_image().map(|i| i.mime_type.as_str()), Some("image/png"));
        assert_eq!(r.structured_content.as_ref().unwrap()["path"], "c.png");
        let mut flagged = artifact("c.png", "image/png", png);
        flagged.flags.push(jail::result::ContentFlag {
            kind: jail::result::FlagKind::Script,
            count: 1,
            detail: "a script".into(),
            locations: vec![],
        });
        let r = read_of(flagged, png);
        assert!(r.content.iter().all(|c| c.as_image().is_none()), "{r:?}");
        let svg = b"<svg onload='x'/>";
        let r = read_of(artifact("c.png", "image/svg+xml", svg), svg);
        assert!(r.content.iter().all(|c| c.as_image().is_none()), "{r:?}");
        let big = [png.as_slice(), &vec![0; MAX_IMAGE_BYTES]].concat();
        let r = read_of(artifact("big.png", "image/png", &big), &big);
        assert!(r.content.iter().all(|c| c.as_image().is_none()) && texts(&r)[0].contains("smaller"), "{r:?}");
    }

    #[test]
    fn a_read_file_is_text_or_base64_within_their_caps() {
        let r = read_of(artifact("t.csv", "text/csv", b"a,'=1\n"), b"a,'=1\n");
        assert_eq!(texts(&r)[1], "a,'=1\n");
        // A cut never splits a character: é is two bytes.
        let long = "é".repeat(MAX_TEXT_BYTES);
        let r = read_of(artifact("t.txt", "text/plain", long.as_bytes()), long.as_bytes());
        let shown = texts(&r);
        assert!(
            shown[0].contains("first") && shown[1].len() <= MAX_TEXT_BYTES && shown[1].len() > MAX_TEXT_BYTES - 2,
            "{}",
            shown[0]
        );
        let small = [0u8, 1, 2];
        let r = read_of(artifact("b.pdf", "application/pdf", &small), &small);
        assert_eq!(texts(&r)[1], "AAEC");
        let big = vec![0u8; MAX_BASE64_BYTES + 1];
        let r = read_of(artifact("b.pdf", "application/pdf", &big), &big);
        let shown = texts(&r).join("");
        assert!(shown.len() < 1000 && shown.contains("not shown"), "{shown}");
    }

    #[test]
    fn a_listing_shows_at_most_its_cap_and_says_there_is_more() {
        let entries: Vec<FileEntry> = (0..MAX_ENTRIES_SHOWN + 1)
            .map(|i| FileEntry { name: format!("f{i:04}"), kind: "file".into(), bytes: 1 })
            .collect();
        let r = reply(Op::List, FileAnswer::Listed { path: "".into(), entries, truncated: false });
        let s = r.structured_content.unwrap();
        assert_eq!(s["entries"].as_array().unwrap().len(), MAX_ENTRIES_SHOWN);
        assert_eq!(s["truncated"], true);
    }
}
