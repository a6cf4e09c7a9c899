//! An accepted artifact's bytes, for `GET /v1/runs/{id}/artifacts/{path}`
//! and `GET /v1/sessions/{id}/artifacts/{path}`: only a path the result
//! lists as accepted, in the result's output folder when that folder is
//! beneath the run's or session's own, read without following any link
//! (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), a regular file of at
//! most `MAX_ARTIFACT_BYTES`.
//!
//! Bounded by construction:
//! - A reply is streamed from the file a chunk at a time (files.rs), as
//!   the client takes it: whatever the artifact's size and however slow
//!   the client, a reply holds one chunk and hyper's bounded buffer, and a
//!   client that takes nothing is cut by the send timeout (conn.rs).
//! - What is served is what the result lists: a file whose size differs
//!   from the listed `bytes` is refused with 409 `changed` before a byte
//!   is sent; its sha256 is computed as it is sent, and the last chunk is
//!   held back until it matches, so a file rewritten after the result was
//!   made is cut short of its `Content-Length` (the client sees a broken
//!   reply), never delivered as if it were the checked file.
//! - The read budget is each tenant's own (its `max_artifact_reads`
//!   replies in flight): one tenant's stalled reads never delay another's.
//!   A request past its tenant's share gets 429 `busy` at once (with
//!   `Retry-After`), rather than holding a request of its own waiting.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::ApiError;
use crate::config::Tenant;
use crate::state::Shared;

/// Bytes of one artifact served at most.
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;

/// Bytes of a run's artifact listing read at most (the policy's
/// `max_files` entries, each a path, a size, a sha256 and a media type).
const MAX_LISTING_BYTES: u64 = 64 << 20;

/// An artifact found, opened and checked against its listing, not read yet.
pub struct Found {
    file: std::fs::File,
    bytes: u64,
    sha256: String,
    media: String,
}

/// The reply to an artifact request of `tenant`: `find` (the lookup and
/// [`listed`]) runs on tokio's blocking threads, and the reply is streamed
/// once the tenant's budget has room for it.
pub async fn respond<F>(state: &Shared, tenant: &Tenant, find: F) -> Response
where
    F: FnOnce() -> Result<Found, ApiError> + Send + 'static,
{
    let reply = match read_permit(state, tenant) {
        Ok(permit) => serve(find, permit).await,
        Err(e) => Err(e),
    };
    reply.unwrap_or_else(IntoResponse::into_response)
}

/// A place in `tenant`'s read budget (`max_artifact_reads`), held while a
/// reply of a file's bytes is made and sent: an artifact's, or a live
/// session file's (sessions.rs), each up to megabytes. `busy` when the
/// budget is full.
pub fn read_permit(state: &Shared, tenant: &Tenant) -> Result<OwnedSemaphorePermit, ApiError> {
    let Some(gates) = state.gates.get(&tenant.name) else {
        return Err(ApiError::failed("no read budget for this token"));
    };
    take(&gates.artifacts).inspect_err(|_| state.metrics.limit_hit("tenant_artifact_reads", &tenant.name))
}

/// A place in `budget`, or `busy`.
fn take(budget: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, ApiError> {
    Arc::clone(budget)
        .try_acquire_owned()
        .map_err(|_| ApiError::busy("this token's file replies in flight hold its read budget: retry shortly"))
}

/// `bytes` as a reply body that holds `permit` until it is sent.
pub fn held_body(bytes: Vec<u8>, permit: OwnedSemaphorePermit) -> Body {
    // The permit stays in the stream's state past its one chunk, and goes
    // with the stream once it has ended or is dropped.
    let start = (Some(Bytes::from(bytes)), permit);
    Body::from_stream(futures_util::stream::unfold(start, |(bytes, permit)| async move {
        let chunk = bytes?;
        Some((Ok::<_, std::io::Error>(chunk), (None, permit)))
    }))
}

async fn serve<F>(find: F, permit: OwnedSemaphorePermit) -> Result<Response, ApiError>
where
    F: FnOnce() -> Result<Found, ApiError> + Send + 'static,
{
    let found = tokio::task::spawn_blocking(find)
        .await
        .map_err(|e| ApiError::failed(format!("read artifact: {e}")))??;
    let (media, length) = (found.media.clone(), found.bytes);
    let body = Body::from_stream(checked(found, permit));
    Ok(([(header::CONTENT_TYPE, media), (header::CONTENT_LENGTH, length.to_string())], body).into_response())
}

/// The file's bytes a chunk at a time, hashed as they go; the last chunk
/// is held back until the whole matches the listed size and sha256, and
/// an error ends the reply short of its length otherwise. The permit is
/// held until the reply is sent or dropped.
fn checked(
    found: Found,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    struct At {
        found: Found,
        offset: u64,
        hasher: jail::digest::Hasher,
        held: Option<Bytes>,
        _permit: tokio::sync::OwnedSemaphorePermit,
    }
    let start = At {
        found,
        offset: 0,
        hasher: jail::digest::Hasher::new(),
        held: None,
        _permit: permit,
    };
    futures_util::stream::unfold(Some(start), |at| async move {
        let mut at = at?;
        if at.offset >= at.found.bytes {
            // All read: one byte more would mean it grew.
            let mut probe = [0u8; 1];
            let grew = std::os::unix::fs::FileExt::read_at(&at.found.file, &mut probe, at.offset).map_or(true, |n| n > 0);
            let held = at.held.take();
            let sha = std::mem::replace(&mut at.hasher, jail::digest::Hasher::new()).finish_hex();
            return match (grew || sha != at.found.sha256, held) {
                (false, Some(last)) => Some((Ok(last), None)),
                (false, None) => None,
                (true, _) => Some((Err(std::io::Error::other("the artifact changed after its result was made")), None)),
            };
        }
        let file = match at.found.file.try_clone() {
            Ok(f) => f,
            Err(e) => return Some((Err(e), None)),
        };
        match crate::files::read_at(file, at.offset, at.found.bytes).await {
            Ok((_, chunk)) if chunk.is_empty() => {
                Some((Err(std::io::Error::other("the artifact shrank after its result was made")), None))
            }
            Ok((_, chunk)) => {
                at.offset += chunk.len() as u64;
                at.hasher.update(&chunk);
                match at.held.replace(chunk) {
                    Some(before) => Some((Ok(before), Some(at))),
                    // The first chunk: nothing to send until the next.
                    None => Some((Ok(Bytes::new()), Some(at))),
                }
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// A run's artifact listing (`{"output_dir", "artifacts"}`, runs.rs
/// `keep_result`), read from its folder, bounded.
pub fn read_listing(dir: &Path) -> Result<serde_json::Value, ApiError> {
    use std::io::Read;
    let lost = |e: std::io::Error| {
        eprintln!("jail serve: an artifact listing in {}: {e}", dir.display());
        ApiError::failed("the run's artifact listing could not be read back on the service")
    };
    let file = crate::files::open_in(dir, crate::state::LISTING_FILE).map_err(lost)?;
    let mut text = Vec::new();
    file.take(MAX_LISTING_BYTES).read_to_end(&mut text).map_err(lost)?;
    serde_json::from_slice(&text).map_err(|e| lost(std::io::Error::other(e)))
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
    Ok(Found { file, bytes, sha256, media })
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
    let rel = rel.to_str().ok_or_else(|| ApiError::not_found("artifact at this path"))?;
    crate::files::open_in(dir, rel).map_err(|_| ApiError::not_found("readable artifact at this path"))
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
        (e.status, e.code)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    }

    /// The whole body of a reply, or the error that cut it.
    fn body_of(rt: &tokio::runtime::Runtime, r: Response) -> Result<Vec<u8>, String> {
        rt.block_on(axum::body::to_bytes(r.into_body(), usize::MAX))
            .map(|b| b.to_vec())
            .map_err(|e| e.to_string())
    }

    fn find(result: &serde_json::Value, dir: &Path, path: &str) -> impl FnOnce() -> Result<Found, ApiError> + Send + 'static {
        let (r, d, p) = (result.clone(), dir.to_owned(), path.to_owned());
        move || listed(&r, &d, &p)
    }

    #[test]
    fn the_listed_bytes_are_streamed_and_a_file_rewritten_after_the_result_is_cut_short() {
        let rt = runtime();
        let budget = Arc::new(Semaphore::new(4));
        let dir = tempfile::tempdir().unwrap();
        // Larger than a chunk, so the last chunk is held back for the check.
        let content = vec![b'c'; 3 * crate::files::CHUNK + 5];
        std::fs::write(dir.path().join("a.txt"), &content).unwrap();
        let result = result_listing(dir.path(), "a.txt", &content);
        let r = rt.block_on(serve(find(&result, dir.path(), "a.txt"), take(&budget).unwrap())).unwrap();
        assert_eq!(r.headers()[header::CONTENT_LENGTH], content.len().to_string());
        assert_eq!(body_of(&rt, r).unwrap(), content);
        // Same size, other bytes: the sha256 tells, and the reply never ends whole.
        let mut other = content.clone();
        other[10] = b'X';
        std::fs::write(dir.path().join("a.txt"), &other).unwrap();
        let r = rt.block_on(serve(find(&result, dir.path(), "a.txt"), take(&budget).unwrap())).unwrap();
        assert!(body_of(&rt, r).is_err(), "a changed file is cut short");
        // Another size: refused before a byte is sent.
        std::fs::write(dir.path().join("a.txt"), b"a longer text").unwrap();
        assert_eq!(code(listed(&result, dir.path(), "a.txt").err().unwrap()), (StatusCode::CONFLICT, "changed"));
        // Grown between the open and the read: cut short too.
        std::fs::write(dir.path().join("a.txt"), &content).unwrap();
        let r = rt.block_on(serve(find(&result, dir.path(), "a.txt"), take(&budget).unwrap())).unwrap();
        std::fs::write(dir.path().join("a.txt"), [content.as_slice(), b"more"].concat()).unwrap();
        assert!(body_of(&rt, r).is_err(), "a grown file is cut short");
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
    fn a_reply_holds_its_tenants_share_until_its_body_is_sent_or_dropped() {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let content = vec![b'a'; 1 << 20];
        std::fs::write(dir.path().join("big.bin"), &content).unwrap();
        let result = result_listing(dir.path(), "big.bin", &content);
        // A tenant's budget of one reply; another tenant's of its own.
        let (mine, theirs) = (Arc::new(Semaphore::new(1)), Arc::new(Semaphore::new(1)));
        let first = rt.block_on(serve(find(&result, dir.path(), "big.bin"), take(&mine).unwrap())).unwrap();
        assert_eq!(mine.available_permits(), 0, "the unsent body holds the share");
        assert_eq!(code(take(&mine).err().unwrap()), (StatusCode::TOO_MANY_REQUESTS, "busy"));
        let other = rt.block_on(serve(find(&result, dir.path(), "big.bin"), take(&theirs).unwrap())).unwrap();
        assert_eq!(body_of(&rt, other).unwrap().len(), content.len(), "another tenant is not held up");
        assert_eq!(body_of(&rt, first).unwrap().len(), content.len());
        assert_eq!(mine.available_permits(), 1, "sent: the share is back");
        let dropped = rt.block_on(serve(find(&result, dir.path(), "big.bin"), take(&mine).unwrap())).unwrap();
        drop(dropped);
        assert_eq!(mine.available_permits(), 1, "dropped unsent: the share is back");
    }

    #[test]
    fn a_held_body_gives_its_place_back_once_sent_or_dropped() {
        let rt = runtime();
        let budget = Arc::new(Semaphore::new(1));
        let sent = Response::new(held_body(b"judged bytes".to_vec(), take(&budget).unwrap()));
        assert!(take(&budget).is_err(), "the unsent body holds the place");
        assert_eq!(body_of(&rt, sent).unwrap(), b"judged bytes");
        assert_eq!(budget.available_permits(), 1, "sent: the place is back");
        drop(held_body(vec![0; 16], take(&budget).unwrap()));
        assert_eq!(budget.available_permits(), 1, "dropped unsent: the place is back");
    }
}
