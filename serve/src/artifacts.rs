//! An accepted artifact's bytes, for `GET /v1/runs/{id}/artifacts/{path}`
//! and `GET /v1/sessions/{id}/artifacts/{path}`: only a path the result
//! lists as accepted, in the result's output folder when that folder is
//! beneath the run's or session's own, read without following any link
//! (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), a regular file of at
//! most `MAX_ARTIFACT_BYTES`, bounded in what is read.

use std::path::{Component, Path, PathBuf};

use axum::http::header;
use axum::response::{IntoResponse, Response};
use jail::sys::{RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};

use crate::api::ApiError;

/// Bytes of one artifact served at most.
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;

/// The reply to an artifact request: `read` (the lookup and [`listed`]:
/// blocking file I/O of up to `MAX_ARTIFACT_BYTES`) runs on tokio's
/// blocking threads, not on the worker serving other requests.
pub async fn respond<F>(read: F) -> Response
where
    F: FnOnce() -> Result<(Vec<u8>, String), ApiError> + Send + 'static,
{
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok((bytes, media))) => ([(header::CONTENT_TYPE, media)], bytes).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::failed(format!("read artifact: {e}")).into_response(),
    }
}

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
