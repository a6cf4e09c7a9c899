//! A result document as MCP content: text for the status, the streams and
//! the Python error, the rich results (the last expression's value, each
//! `display()` and figure: text, and image content for a PNG or JPEG the
//! supervisor judged and flagged nothing in), and image content for PNG
//! artifacts that passed the artifact check, so a client shows the chart. The PNGs are files a script
//! wrote: each is opened beneath the output dir without following any link,
//! read to a fixed cap, and sent only when its size and sha256 are those the
//! supervisor recorded and it starts with the PNG signature. The files
//! tools (files.rs) show a file they read by the same rule
//! ([`shown_as_image`]) and describe it as an artifact's line here
//! ([`describe`]).

use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use base64::Engine;
use rmcp::model::ContentBlock;
use sha2::{Digest, Sha256};

use jail::result::{Artifact, Change, ContentFlag, RunResult, Status, Summary};
use jail::sys;

/// Images one result may carry, and the size of each.
pub const MAX_IMAGES: usize = 8;
pub const MAX_IMAGE_BYTES: u64 = 8 << 20;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

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
}

/// Every content block of one run, in the order a reader wants them.
pub fn blocks(result: &RunResult) -> Vec<ContentBlock> {
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
        let image = IMAGE_TYPES
            .into_iter()
            .find_map(|mime| r.data.get(mime).and_then(|v| v.as_str()).map(|b64| (mime, b64)));
        match image {
            // Judged already (artifacts/bundle.rs): an image of its type.
            Some((mime, b64)) if shown_as_image(mime, &r.flags) && images < MAX_IMAGES => {
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
    for a in shown_images(result).take(MAX_IMAGES.saturating_sub(images)) {
        match result.output_dir.as_deref().map(|d| read_png(Path::new(d), a)) {
            Some(Ok(png)) => out.push(ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(png), "image/png")),
            Some(Err(e)) => notes.push(format!("image {} not attached: {e}", a.path)),
            None => notes.push(format!("image {} not attached: the result names no output dir", a.path)),
        }
    }
    if !notes.is_empty() {
        out.push(ContentBlock::text(notes.join("\n")));
    }
    out
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
        lines.push(format!("artifacts (host folder {dir}):"));
        for a in &r.artifacts {
            let change = serde_json::to_value(a.change).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
            lines.push(format!("  {} ({change}, {})", a.path, describe(a)));
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

    #[test]
    fn a_setup_failure_is_one_line_naming_its_stage() {
        let r = RunResult::setup_failed(SetupError { stage: "rootfs".into(), message: "no rootfs".into(), causes: vec![] });
        let s = summary(&r);
        assert!(s.starts_with("status setup_failed") && s.contains("(rootfs): no rootfs"), "{s}");
    }
}
