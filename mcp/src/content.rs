//! A result document as MCP content: text for the status, the streams and
//! the Python error, the rich results (the last expression's value, each
//! `display()` and figure: text, and image content for a PNG or JPEG the
//! supervisor judged and flagged nothing in), and image content for the
//! image files that passed the artifact check, so a client shows the chart.
//!
//! Where those files are decides how they are read. A run's, and a
//! session's closing result, name files delivered to the host folder
//! (`output_dir`): each PNG is opened beneath it without following any
//! link, read to a fixed cap, and sent only when its size and sha256 are
//! those the supervisor recorded and it starts with the PNG signature. A
//! session cell's files are still in the session (the host folder gets
//! them when it ends, and may hold an older file of the same name), so
//! each PNG or JPEG it lists is read through the session's files API, the
//! judged copy session_read_file reads ([`cell_images`] chooses them,
//! the server reads them), and sent only when its bytes are those the
//! cell listed; never from the host folder. The files tools (files.rs)
//! show a file they read by the same rule ([`shown_as_image`]) and
//! describe it as an artifact's line here ([`describe`]).

use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use base64::Engine;
use rmcp::model::ContentBlock;
use sha2::{Digest, Sha256};

use jail::client::session::FileAnswer;
use jail::result::{Artifact, Change, ContentFlag, DisplayResult, RunResult, SessionInfo, Status, Summary};
use jail::sys;

/// Images one result may carry, and the size of each.
pub const MAX_IMAGES: usize = 8;
pub const MAX_IMAGE_BYTES: u64 = 8 << 20;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
const JPEG_SIGNATURE: &[u8] = b"\xff\xd8\xff";

/// The types a client is shown as image content.
pub const IMAGE_TYPES: [&str; 2] = ["image/png", "image/jpeg"];

/// Whether content the supervisor judged (its media type sniffed from the
/// bytes, never the name) goes to the client as an image: a PNG or JPEG
/// in which the check flagged nothing.
pub fn shown_as_image(media_type: &str, flags: &[ContentFlag]) -> bool {
    IMAGE_TYPES.contains(&media_type) && flags.is_empty()
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("open {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not the file the jail accepted ({why})")]
    NotAsAccepted { path: PathBuf, why: &'static str },
    #[error("the session did not give it: {detail}")]
    Session { detail: String },
}

/// What the session's files API answered for each image of a cell that
/// [`cell_images`] chose, by path (an unknown session, an ended one: why
/// there is no answer).
pub type SessionReads = [(String, Result<FileAnswer, String>)];

/// The session cell a result is of; `None` for a run's result and for a
/// session's closing one (cell 0), whose files are in the host folder.
pub fn cell_of(result: &RunResult) -> Option<&SessionInfo> {
    result.session.as_ref().filter(|s| s.cell > 0)
}

/// Every content block of one run, in the order a reader wants them; a
/// cell's images are those in `reads` (empty for any other result).
pub fn blocks(result: &RunResult, reads: &SessionReads) -> Vec<ContentBlock> {
    let mut out = vec![ContentBlock::text(summary(result))];
    for (name, s) in [("stdout", &result.stdout), ("stderr", &result.stderr)] {
        if !s.text.is_empty() {
            let cut = if s.truncated {
                format!(" (truncated: {} bytes written in all)", s.bytes)
            } else {
                String::new()
            };
            out.push(ContentBlock::text(format!("{name}{cut}:\n{}", s.text)));
        }
    }
    if let Some(e) = &result.error {
        out.push(ContentBlock::text(format!("Python error {}: {}\n{}", e.kind, e.message, e.traceback_tail)));
    }
    let mut images = 0;
    for r in &result.results {
        match inline_image(r) {
            Some((mime, b64)) if images < MAX_IMAGES => {
                images += 1;
                out.push(ContentBlock::image(b64.to_string(), mime));
            }
            _ => {
                let what = if r.is_main_result { "result" } else { "display" };
                let text = r.data.get("text/plain").and_then(|v| v.as_str()).unwrap_or("");
                let others: Vec<&str> = r.data.keys().map(String::as_str).filter(|m| *m != "text/plain").collect();
                let also = if others.is_empty() {
                    String::new()
                } else {
                    format!(" (also {})", others.join(", "))
                };
                out.push(ContentBlock::text(format!("{what}{also}:\n{text}")));
            }
        }
    }
    let mut notes = Vec::new();
    if cell_of(result).is_some() {
        // Not delivered yet: the session's judged copy, never the host folder's.
        for a in cell_images(result) {
            let answer = reads.iter().find(|(path, _)| *path == a.path).map(|(_, answer)| answer);
            match answer.map(|answer| session_image(a, answer)) {
                Some(Ok((b64, mime))) => out.push(ContentBlock::image(b64, mime)),
                Some(Err(e)) => notes.push(format!("image {} not attached: {e}; read it with session_read_file", a.path)),
                None => notes.push(format!("image {} not attached: read it with session_read_file", a.path)),
            }
        }
    } else {
        for a in shown_images(result).take(MAX_IMAGES.saturating_sub(images)) {
            match result.output_dir.as_deref().map(|d| read_png(Path::new(d), a)) {
                Some(Ok(png)) => {
                    out.push(ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(png), "image/png"))
                }
                Some(Err(e)) => notes.push(format!("image {} not attached: {e}", a.path)),
                None => notes.push(format!("image {} not attached: the result names no output dir", a.path)),
            }
        }
    }
    if !notes.is_empty() {
        out.push(ContentBlock::text(notes.join("\n")));
    }
    out
}

/// A rich result's image, when it is shown as one: judged already
/// (artifacts/bundle.rs), an image of its type with no flag.
fn inline_image(r: &DisplayResult) -> Option<(&'static str, &str)> {
    IMAGE_TYPES
        .into_iter()
        .find_map(|mime| r.data.get(mime).and_then(|v| v.as_str()).map(|b64| (mime, b64)))
        .filter(|(mime, _)| shown_as_image(mime, &r.flags))
}

/// The PNGs a client is shown: accepted, present after the run, with no
/// content flag, at most [`MAX_IMAGES`] of them.
fn shown_images(result: &RunResult) -> impl Iterator<Item = &Artifact> {
    result
        .artifacts
        .iter()
        .filter(|a| a.change != Change::Deleted && a.media_type.as_deref() == Some("image/png") && a.flags.is_empty())
        .take(MAX_IMAGES)
}

/// The images of a cell's files a client is shown, as session_read_file
/// shows a file ([`shown_as_image`]): present as the cell ended, at most
/// what [`MAX_IMAGES`] leaves after the cell's rich results. None for any
/// other result. The server reads each through the session.
pub fn cell_images(result: &RunResult) -> Vec<&Artifact> {
    if cell_of(result).is_none() {
        return Vec::new();
    }
    let inline = result.results.iter().filter_map(inline_image).take(MAX_IMAGES).count();
    result
        .artifacts
        .iter()
        .filter(|a| a.change != Change::Deleted && shown_as_image(a.media_type.as_deref().unwrap_or(""), &a.flags))
        .take(MAX_IMAGES.saturating_sub(inline))
        .collect()
}

/// A cell's image as the session's files API gave it (`answer`): its
/// base64 and type, when the bytes are those the cell listed (`a`: its
/// size and sha256) and the check still judges them an image it shows.
fn session_image(a: &Artifact, answer: &Result<FileAnswer, String>) -> Result<(String, &'static str), ImageError> {
    let path = PathBuf::from(&a.path);
    let not_as_accepted = |why| ImageError::NotAsAccepted { path: path.clone(), why };
    let (now, data) = match answer {
        Ok(FileAnswer::Read { artifact, data }) => (artifact, data),
        Ok(FileAnswer::Refused { detail, .. }) => return Err(ImageError::Session { detail: detail.clone() }),
        Ok(other) => return Err(ImageError::Session { detail: format!("it answered {other:?}; this is a bug") }),
        Err(e) => return Err(ImageError::Session { detail: e.clone() }),
    };
    let mime = IMAGE_TYPES
        .into_iter()
        .find(|m| a.media_type.as_deref() == Some(*m))
        .ok_or_else(|| not_as_accepted("not an image"))?;
    if a.bytes > MAX_IMAGE_BYTES {
        return Err(not_as_accepted("larger than the 8 MiB an image may be"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.as_bytes())
        .map_err(|_| not_as_accepted("the session's answer is not base64"))?;
    // Written again since the cell ended (by a later cell, or a thread
    // this one left running): not the file the cell's result lists.
    if bytes.len() as u64 != a.bytes || a.sha256.as_deref() != Some(jail::digest::sha256_hex(&bytes).as_str()) {
        return Err(not_as_accepted("it changed since the cell ended"));
    }
    if now.media_type.as_deref() != Some(mime) || !shown_as_image(mime, &now.flags) {
        return Err(not_as_accepted("the check no longer shows it as an image"));
    }
    let signature = if mime == "image/png" { PNG_SIGNATURE } else { JPEG_SIGNATURE };
    if !bytes.starts_with(signature) {
        return Err(not_as_accepted("no image signature"));
    }
    Ok((data.clone(), mime))
}

/// How the run ended, what it used and what it left, in a few lines.
pub fn summary(r: &RunResult) -> String {
    let status = serde_json::to_value(r.status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    let mut lines = Vec::new();
    if let (Status::SetupFailed, Some(e)) = (r.status, &r.setup_error) {
        let causes = e.causes.iter().map(|c| format!(": {c}")).collect::<String>();
        lines.push(format!("status setup_failed: the jail did not run the code ({}): {}{causes}", e.stage, e.message));
        return lines.join("\n");
    }
    let how = match (r.exit_code, &r.signal_name) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by {sig}"),
        (None, None) => "no exit code".into(),
    };
    let cpu = match (r.usage.user_cpu_ms, r.usage.system_cpu_ms) {
        (Some(u), Some(s)) => format!(", {:.2} s CPU", (u + s) / 1000.0),
        _ => String::new(),
    };
    let mem = r.usage.peak_memory_bytes.map(|b| format!(", peak memory {} MiB", b >> 20)).unwrap_or_default();
    lines.push(format!("status {status}: {how}, {:.2} s wall{cpu}{mem}", r.usage.wall_ms / 1000.0));
    if !r.artifacts.is_empty() {
        let dir = r.output_dir.as_deref().unwrap_or("?");
        lines.push(match cell_of(r) {
            None => format!("artifacts (host folder {dir}):"),
            Some(s) if s.ended => format!(
                "files this cell made, changed or deleted in /workspace/output (the session ended: what passed the \
                 check was delivered to the host folder {dir}):"
            ),
            Some(_) => format!(
                "files this cell made, changed or deleted in /workspace/output, still in the session (read one with \
                 session_read_file; session_stop delivers them to the host folder {dir}):"
            ),
        });
        for a in &r.artifacts {
            let change = serde_json::to_value(a.change).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
            lines.push(match (cell_of(r), a.change) {
                // Gone from the session: nothing to describe.
                (Some(_), Change::Deleted) => format!("  {} ({change})", a.path),
                _ => format!("  {} ({change}, {})", a.path, describe(a)),
            });
        }
    }
    for x in &r.rejected_artifacts {
        lines.push(format!("refused output {}: {}", x.path, x.detail));
    }
    for d in &r.isolation.degraded {
        lines.push(format!("isolation degraded: {d}"));
    }
    lines.join("\n")
}

/// What the check found a file to be, in one phrase: its media type,
/// size, dimensions, flags, and the formula cells neutralised.
pub fn describe(a: &Artifact) -> String {
    let kind = a.media_type.as_deref().unwrap_or("-");
    let size = match &a.summary {
        Some(Summary::Image { width, height }) => format!(", {width}x{height}"),
        Some(Summary::Csv { rows, columns, .. }) => format!(", {rows} rows x {columns} columns"),
        _ => String::new(),
    };
    let flags = if a.flags.is_empty() {
        String::new()
    } else {
        format!(", flagged: {}", a.flags.iter().map(|f| f.detail.as_str()).collect::<Vec<_>>().join("; "))
    };
    let neutralised = match &a.neutralised {
        Some(n) => format!(", {} formula cells neutralised (each now starts with ')", n.cells),
        None => String::new(),
    };
    format!("{kind}, {} bytes{size}{flags}{neutralised}", a.bytes)
}

/// The bytes of one accepted PNG, read without following links and checked
/// against what the supervisor recorded.
pub fn read_png(output_dir: &Path, a: &Artifact) -> Result<Vec<u8>, ImageError> {
    let path = output_dir.join(&a.path);
    let not_as_accepted = |why| ImageError::NotAsAccepted { path: path.clone(), why };
    let dir = sys::openat2(None, output_dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
        .map_err(|source| ImageError::Open { path: output_dir.to_path_buf(), source })?;
    let resolve = sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = sys::openat2(Some(dir.as_fd()), Path::new(&a.path), flags, resolve)
        .map_err(|source| ImageError::Open { path: path.clone(), source })?;
    let mut file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|source| ImageError::Read { path: path.clone(), source })?;
    if !meta.is_file() {
        return Err(not_as_accepted("not a regular file"));
    }
    if meta.len() != a.bytes {
        return Err(not_as_accepted("its size changed"));
    }
    if meta.len() > MAX_IMAGE_BYTES {
        return Err(not_as_accepted("larger than the 8 MiB an image may be"));
    }
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_IMAGE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ImageError::Read { path: path.clone(), source })?;
    let sha = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect::<String>();
    if a.sha256.as_deref() != Some(sha.as_str()) {
        return Err(not_as_accepted("its sha256 changed"));
    }
    if !bytes.starts_with(PNG_SIGNATURE) {
        return Err(not_as_accepted("no PNG signature"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jail::result::SetupError;

    fn artifact(path: &str, bytes: &[u8]) -> Artifact {
        let sha = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect::<String>();
        Artifact {
            path: path.into(),
            bytes: bytes.len() as u64,
            sha256: Some(sha),
            media_type: Some("image/png".into()),
            change: Change::Created,
            flags: vec![],
            summary: None,
            neutralised: None,
        }
    }

    #[test]
    fn an_accepted_png_is_read_back_and_a_changed_or_linked_one_is_not() {
        let t = tempfile::tempdir().unwrap();
        let png = [PNG_SIGNATURE, b"rest"].concat();
        std::fs::write(t.path().join("c.png"), &png).unwrap();
        assert_eq!(read_png(t.path(), &artifact("c.png", &png)).unwrap(), png);
        // Same size, other bytes: the sha256 no longer matches.
        let other = [PNG_SIGNATURE, b"REST"].concat();
        assert!(matches!(read_png(t.path(), &artifact("c.png", &other)), Err(ImageError::NotAsAccepted { .. })));
        std::os::unix::fs::symlink(t.path().join("c.png"), t.path().join("l.png")).unwrap();
        assert!(matches!(read_png(t.path(), &artifact("l.png", &png)), Err(ImageError::Open { .. })));
        assert!(matches!(read_png(t.path(), &artifact("../c.png", &png)), Err(ImageError::Open { .. })));
        std::fs::write(t.path().join("n.png"), b"not a png").unwrap();
        assert!(matches!(read_png(t.path(), &artifact("n.png", b"not a png")), Err(ImageError::NotAsAccepted { .. })));
    }

    /// A cell's result (or, at `cell` 0, a session's closing one) whose
    /// host folder is `dir`, listing `artifacts`.
    fn of_cell(cell: u64, dir: &Path, artifacts: Vec<Artifact>) -> RunResult {
        let mut r = RunResult::setup_failed(SetupError { stage: "-".into(), message: "-".into(), causes: vec![] });
        r.status = Status::Ok;
        r.exit_code = Some(0);
        r.setup_error = None;
        r.output_dir = Some(dir.display().to_string());
        r.artifacts = artifacts;
        r.session = Some(SessionInfo {
            id: "s".into(),
            cell,
            ended: false,
            why: None,
            detail: None,
            artifacts: "-".into(),
        });
        r
    }

    fn read(a: &Artifact, bytes: &[u8]) -> (String, Result<FileAnswer, String>) {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        (a.path.clone(), Ok(FileAnswer::Read { artifact: a.clone(), data }))
    }

    fn images(blocks: &[ContentBlock]) -> Vec<Vec<u8>> {
        let b64 = base64::engine::general_purpose::STANDARD;
        blocks.iter().filter_map(|b| b.as_image()).map(|i| b64.decode(&i.data).unwrap()).collect()
    }

    fn text(blocks: &[ContentBlock]) -> String {
        blocks.iter().filter_map(|b| b.as_text()).map(|t| t.text.as_str()).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn a_cells_image_comes_from_the_session_never_from_the_host_folder_which_may_hold_an_older_one() {
        let t = tempfile::tempdir().unwrap();
        let old = [PNG_SIGNATURE, b"old chart"].concat();
        let new = [PNG_SIGNATURE, b"new chart"].concat();
        std::fs::write(t.path().join("chart.png"), &old).unwrap();
        let cell = of_cell(2, t.path(), vec![artifact("chart.png", &new)]);
        assert_eq!(cell_images(&cell).len(), 1);
        let shown = blocks(&cell, &[read(&artifact("chart.png", &new), &new)]);
        assert_eq!(images(&shown), vec![new.clone()]);
        // Not read from the session: not shown, whatever the host folder holds.
        std::fs::write(t.path().join("chart.png"), &new).unwrap();
        let shown = blocks(&cell, &[]);
        assert!(images(&shown).is_empty() && text(&shown).contains("read it with session_read_file"), "{shown:?}");
        // The session's copy changed since the cell ended: a note, no image.
        let later = [PNG_SIGNATURE, b"LATER chart"].concat();
        let shown = blocks(&cell, &[read(&artifact("chart.png", &later), &later)]);
        assert!(images(&shown).is_empty() && text(&shown).contains("changed since the cell ended"), "{shown:?}");
        // Refused, or the session gone: the reason, no image.
        let refused = FileAnswer::Refused {
            code: jail::client::session::FileRefusal::NotFound,
            reason: None,
            detail: "gone".into(),
        };
        let shown = blocks(&cell, &[("chart.png".into(), Ok(refused))]);
        assert!(images(&shown).is_empty() && text(&shown).contains("did not give it: gone"), "{shown:?}");
        let shown = blocks(&cell, &[("chart.png".into(), Err("no open session".into()))]);
        assert!(images(&shown).is_empty() && text(&shown).contains("no open session"), "{shown:?}");
        // A session's closing result names delivered files: the host folder's.
        let closing = of_cell(0, t.path(), vec![artifact("chart.png", &new)]);
        assert!(cell_images(&closing).is_empty());
        assert_eq!(images(&blocks(&closing, &[])), [new]);
    }

    #[test]
    fn a_cells_jpeg_is_shown_and_a_flagged_or_rejudged_image_is_not() {
        let t = tempfile::tempdir().unwrap();
        let jpeg = b"\xff\xd8\xff\xe0 a jpeg".to_vec();
        let mut a = artifact("p.jpg", &jpeg);
        a.media_type = Some("image/jpeg".into());
        let cell = of_cell(1, t.path(), vec![a.clone()]);
        let shown = blocks(&cell, &[read(&a, &jpeg)]);
        assert_eq!(shown.iter().filter_map(|b| b.as_image()).map(|i| i.mime_type.as_str()).collect::<Vec<_>>(), ["image/jpeg"]);
        // Judged again by the read, now flagged: not shown.
        let mut now = a.clone();
        now.flags.push(ContentFlag {
            kind: jail::result::FlagKind::Script,
            count: 1,
            detail: "x".into(),
            locations: vec![],
        });
        let answer = FileAnswer::Read {
            artifact: now.clone(),
            data: base64::engine::general_purpose::STANDARD.encode(&jpeg),
        };
        assert!(images(&blocks(&cell, &[("p.jpg".into(), Ok(answer))])).is_empty());
        // Flagged as the cell ended: not even asked for.
        assert!(cell_images(&of_cell(1, t.path(), vec![now])).is_empty());
    }

    #[test]
    fn a_cells_files_are_said_to_be_in_the_session_with_their_change_and_a_cell_that_wrote_nothing_says_nothing() {
        let t = tempfile::tempdir().unwrap();
        let mut gone = artifact("d/c.txt", b"");
        gone.change = Change::Deleted;
        gone.sha256 = None;
        gone.media_type = None;
        let mut cell = of_cell(3, t.path(), vec![artifact("chart.png", b"png"), gone]);
        cell.rejected_artifacts.push(jail::result::RejectedArtifact {
            path: "prog.exe".into(),
            reason: jail::result::RejectReason::ExtensionNotAllowed,
            detail: "the extension .exe is not allowed".into(),
            disposition: jail::result::Disposition::NotDelivered,
            moved_to: None,
        });
        let s = summary(&cell);
        assert!(s.contains("still in the session") && s.contains("session_read_file") && s.contains("session_stop"), "{s}");
        assert!(!s.contains("artifacts (host folder"), "{s}");
        assert!(s.contains("  chart.png (created, image/png, 3 bytes)") && s.contains("  d/c.txt (deleted)\n"), "{s}");
        assert!(s.contains("refused output prog.exe: the extension .exe is not allowed"), "{s}");
        let s = summary(&of_cell(4, t.path(), vec![]));
        assert!(!s.contains("files") && !s.contains("artifacts") && !s.contains('\n'), "{s}");
        let s = summary(&of_cell(0, t.path(), vec![artifact("chart.png", b"png")]));
        assert!(s.contains("artifacts (host folder"), "the closing result: {s}");
    }

    #[test]
    fn a_setup_failure_is_one_line_naming_its_stage() {
        let r = RunResult::setup_failed(SetupError { stage: "rootfs".into(), message: "no rootfs".into(), causes: vec![] });
        let s = summary(&r);
        assert!(s.starts_with("status setup_failed") && s.contains("(rootfs): no rootfs"), "{s}");
    }
}
