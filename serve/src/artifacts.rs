//! An accepted artifact's bytes, for `GET /v1/runs/{id}/artifacts/{path}`
//! and `GET /v1/sessions/{id}/artifacts/{path}`: only a path the result
//! lists as accepted, in the result's output folder when that folder is
//! beneath the run's or session's own, read without following any link
//! (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), a regular file of at
//! most `MAX_ARTIFACT_BYTES`, bounded in what is read.
//!
//! Two more bounds:
//! - What is served is what the result lists: a file whose size or
//!   sha256 differs from the listed `bytes` and `sha256` (something wrote
//!   the folder after the result was made) is refused with 409
//!   `changed`, never sent as if it were the checked file.
//! - The bytes held for artifact replies, across every request at once,
//!   are bounded by [`BUDGET_BYTES`]: each reply takes its size (rounded
//!   up to a MiB) from one semaphore before it reads, and gives it back
//!   when its body has been sent or dropped. A request that cannot have
//!   its share within [`BUDGET_WAIT`] gets 429 `busy`.

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use jail::sys::{RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::ApiError;

/// Bytes of one artifact served at most.
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;

/// Bytes held for artifact replies at once, across all requests.
pub const BUDGET_BYTES: u64 = 512 << 20;

/// The budget's unit: one permit is a MiB.
const UNIT: u64 = 1 << 20;

/// How long a request waits for its share of the budget.
const BUDGET_WAIT: Duration = Duration::from_secs(10);

static BUDGET: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new((BUDGET_BYTES / UNIT) as usize)));

/// An artifact found, opened and checked against its listing, not read yet.
pub struct Found {
    path: String,
    file: std::fs::File,
    bytes: u64,
    sha256: String,
    media: String,
}

/// The reply to an artifact request: `find` (the lookup and [`listed`])
/// and the read run on tokio's blocking threads, not on the worker serving
/// other requests, the read only once the budget has room for it.
pub async fn respond<F>(find: F) -> Response
where
    F: FnOnce() -> Result<Found, ApiError> + Send + 'static,
{
    match serve(find, &BUDGET, BUDGET_WAIT).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn serve<F>(find: F, budget: &Arc<Semaphore>, wait: Duration) -> Result<Response, ApiError>
where
    F: FnOnce() -> Result<Found, ApiError> + Send + 'static,
{
    let found = blocking(find).await?;
    let units = found.bytes.div_ceil(UNIT).max(1) as u32;
    let permit = tokio::time::timeout(wait, Arc::clone(budget).acquire_many_owned(units))
        .await
        .map_err(|_| ApiError::busy("artifact replies hold the service's read budget now: retry shortly"))?
        .map_err(|e| ApiError::failed(format!("artifact budget: {e}")))?;
    let media = found.media.clone();
    let bytes = blocking(move || read_checked(found)).await?;
    let body = Body::from(bytes::Bytes::from_owner(Held { bytes, _permit: permit }));
    Ok(([(header::CONTENT_TYPE, media)], body).into_response())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::failed(format!("read artifact: {e}")))?
}

/// A reply's bytes and its share of the budget, given back when dropped.
struct Held {
    bytes: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The artifact `path` that `result` lists, opened from its `output_dir`,
/// which must be beneath `within`.
pub fn listed(result: &serde_json::Value, within: &Path, path: &str) -> Result<Found, ApiError> {
    let listed = result
        .get("artifacts")
        .and_then(|a| a.as_array())
        .and_then(|a| a.iter().find(|x| x.get("path").and_then(|p| p.as_str()) == Some(path)).cloned());
    let listed = listed.ok_or_else(|| ApiError::not_found("accepted artifact at this path"))?;
    let rel = Path::new(path);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(ApiError::not_found("artifact at this path"));
    }
    // A deleted file is listed with no sha256: there is nothing to serve.
    let sha256 = listed.get("sha256").and_then(|s| s.as_str()).map(str::to_owned);
    let sha256 = sha256.ok_or_else(|| ApiError::not_found("artifact with content (it was deleted) at this path"))?;
    let bytes = listed.get("bytes").and_then(|b| b.as_u64()).unwrap_or(u64::MAX);
    let out = result
        .get("output_dir")
        .and_then(|d| d.as_str())
        .map(PathBuf::from)
        .filter(|d| d.starts_with(within))
        .ok_or_else(|| ApiError::not_found("output folder for this id"))?;
    let file = open_beneath(&out, rel)?;
    let meta = file.metadata().map_err(|e| ApiError::failed(format!("fstat: {e}")))?;
    if !meta.is_file() || meta.len() > MAX_ARTIFACT_BYTES {
        return Err(ApiError::not_found("regular artifact of a servable size at this path"));
    }
    if meta.len() != bytes {
        return Err(changed(path));
    }
    let media = listed.get("media_type").and_then(|m| m.as_str()).unwrap_or("application/octet-stream").to_owned();
    Ok(Found { path: path.to_owned(), file, bytes, sha256, media })
}

fn changed(path: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "changed",
        format!(
            "{path} is no longer what the result lists (its size or sha256 differs): it was written after the result was made"
        ),
    )
}

fn open_beneath(dir: &Path, rel: &Path) -> Result<std::fs::File, ApiError> {
    use std::os::fd::AsFd;
    let root = jail::sys::openat2(None, dir, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, RESOLVE_NO_SYMLINKS)
        .map_err(|e| ApiError::failed(format!("open {}: {e}", dir.display())))?;
    let fd = jail::sys::openat2(
        Some(root.as_fd()),
        rel,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|_| ApiError::not_found("readable artifact at this path"))?;
    Ok(std::fs::File::from(fd))
}

/// Read at most the listed size plus one byte, and refuse anything but
/// the listed size and sha256.
fn read_checked(found: Found) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(found.bytes as usize);
    found
        .file
        .take(found.bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ApiError::failed(format!("read artifact: {e}")))?;
    if bytes.len() as u64 != found.bytes || jail::digest::sha256_hex(&bytes) != found.sha256 {
        return Err(changed(&found.path));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result_listing(dir: &Path, path: &str, content: &[u8]) -> serde_json::Value {
        json!({
            "output_dir": dir,
            "artifacts": [{"path": path, "bytes": content.len(), "sha256": jail::digest::sha256_hex(content), "media_type": "text/plain"}],
        })
    }

    fn code(e: ApiError) -> (StatusCode, &'static str) {
        let r = e.into_response();
        let status = r.status();
        let body = runtime().block_on(axum::body::to_bytes(r.into_body(), 1 << 16)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let c = match v["error"]["code"].as_str().unwrap() {
            "changed" => "changed",
            "not_found" => "not_found",
            "busy" => "busy",
            other => panic!("unexpected code {other}"),
        };
        (status, c)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    }

    #[test]
    fn the_listed_bytes_are_served_and_a_file_rewritten_after_the_result_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), b"checked").unwrap();
        let result = result_listing(dir.path(), "a.txt", b"checked");
        let found = listed(&result, dir.path(), "a.txt").unwrap();
        assert_eq!(read_checked(found).unwrap(), b"checked");
        // Same size, other bytes: the sha256 tells.
        std::fs::write(dir.path().join("a.txt"), b"CHECKED").unwrap();
        let found = listed(&result, dir.path(), "a.txt").unwrap();
        assert_eq!(code(read_checked(found).unwrap_err()), (StatusCode::CONFLICT, "changed"));
        // Another size: refused before a byte is read.
        std::fs::write(dir.path().join("a.txt"), b"a longer text").unwrap();
        assert_eq!(code(listed(&result, dir.path(), "a.txt").err().unwrap()), (StatusCode::CONFLICT, "changed"));
        // Grown between the open and the read: still refused, and read no
        // further than the listed size and one byte.
        std::fs::write(dir.path().join("a.txt"), b"checked").unwrap();
        let found = listed(&result, dir.path(), "a.txt").unwrap();
        std::fs::write(dir.path().join("a.txt"), vec![b'x'; 1 << 20]).unwrap();
        assert_eq!(code(read_checked(found).unwrap_err()), (StatusCode::CONFLICT, "changed"));
    }

    #[test]
    fn a_deleted_artifact_or_a_link_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let deleted = json!({"output_dir": dir.path(), "artifacts": [{"path": "gone.txt", "bytes": 3, "sha256": null}]});
        std::fs::write(dir.path().join("gone.txt"), b"new").unwrap();
        assert_eq!(code(listed(&deleted, dir.path(), "gone.txt").err().unwrap()), (StatusCode::NOT_FOUND, "not_found"));
        std::fs::write(dir.path().join("real.txt"), b"checked").unwrap();
        std::os::unix::fs::symlink("real.txt", dir.path().join("l.txt")).unwrap();
        let result = result_listing(dir.path(), "l.txt", b"checked");
        assert_eq!(code(listed(&result, dir.path(), "l.txt").err().unwrap()), (StatusCode::NOT_FOUND, "not_found"));
    }

    #[test]
    fn replies_hold_their_share_of_the_budget_until_their_body_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let content = vec![b'a'; (3 * UNIT) as usize - 5];
        std::fs::write(dir.path().join("big.bin"), &content).unwrap();
        let result = result_listing(dir.path(), "big.bin", &content);
        // A budget of 4 MiB: one 3 MiB reply fits, a second must wait.
        let budget = std::sync::Arc::new(Semaphore::new(4));
        let rt = runtime();
        let find = |r: &serde_json::Value| {
            let (r, d) = (r.clone(), dir.path().to_owned());
            move || listed(&r, &d, "big.bin")
        };
        let first = rt.block_on(serve(find(&result), &budget, Duration::from_millis(50))).unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(budget.available_permits(), 1, "the body holds its 3 MiB");
        let second = rt.block_on(serve(find(&result), &budget, Duration::from_millis(50)));
        assert_eq!(code(second.err().unwrap()), (StatusCode::TOO_MANY_REQUESTS, "busy"));
        let body = rt.block_on(axum::body::to_bytes(first.into_body(), usize::MAX)).unwrap();
        assert_eq!(body.len(), content.len());
        drop(body);
        assert_eq!(budget.available_permits(), 4, "sent and dropped: the share is back");
        let third = rt.block_on(serve(find(&result), &budget, Duration::from_millis(50))).unwrap();
        assert_eq!(third.status(), StatusCode::OK);
    }
}
