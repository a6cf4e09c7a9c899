//! An accepted artifact's bytes, for `GET /v1/runs/{id}/artifacts/{path}`
//! and `GET /v1/sessions/{id}/artifacts/{path}`: only a path the result
//! lists as accepted, in the result's output folder when that folder is
//! beneath the run's or session's own, read without following any link
//! (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), a regular file of at
//! most `MAX_ARTIFACT_BYTES`, bounded in what is read.

use std::path::{Component, Path, PathBuf};

use crate::api::ApiError;

/// Bytes of one artifact served at most.
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;

/// The bytes and media type of the artifact `path` that `result` lists,
/// from its `output_dir`, which must be beneath `within`.
pub fn listed(result: &serde_json::Value, within: &Path, path: &str) -> Result<(Vec<u8>, String), ApiError> {
    let listed = result
        .get("artifacts")
        .and_then(|a| a.as_array())
        .and_then(|a| a.iter().find(|x| x.get("path").and_then(|p| p.as_str()) == Some(path)).cloned());
    let listed = listed.ok_or_else(|| ApiError::not_found("accepted artifact at this path"))?;
    let rel = Path::new(path);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(ApiError::not_found("artifact at this path"));
    }
    let out = result
        .get("output_dir")
        .and_then(|d| d.as_str())
        .map(PathBuf::from)
        .filter(|d| d.starts_with(within))
        .ok_or_else(|| ApiError::not_found("output folder for this id"))?;
    let bytes = read_beneath(&out, rel)?;
    let media = listed.get("media_type").and_then(|m| m.as_str()).unwrap_or("application/octet-stream").to_owned();
    Ok((bytes, media))
}

fn read_beneath(dir: &Path, rel: &Path) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    const RESOLVE_BENEATH: u64 = 0x08;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    let root = jail::sys::openat2(None, dir, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, RESOLVE_NO_SYMLINKS)
        .map_err(|e| ApiError::failed(format!("open {}: {e}", dir.display())))?;
    use std::os::fd::AsFd;
    let fd = jail::sys::openat2(
        Some(root.as_fd()),
        rel,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|_| ApiError::not_found("readable artifact at this path"))?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| ApiError::failed(format!("fstat: {e}")))?;
    if !meta.is_file() || meta.len() > MAX_ARTIFACT_BYTES {
        return Err(ApiError::not_found("regular artifact of a servable size at this path"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ARTIFACT_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| ApiError::failed(format!("read artifact: {e}")))?;
    Ok(bytes)
}
