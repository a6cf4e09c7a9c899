//! A session's handle: a unix socket in a 0700 folder of the caller's,
//! usable only by the caller (the socket is 0600 and the server checks
//! SO_PEERCRED), and the server's half of the one-line protocol spoken
//! over it: one request line, one answer line (before it, with an exec's
//! `events`, the cell's event lines: each has a `type`, the answer has
//! none). The protocol's types and its client are client/session.rs.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::client::session::{Answer, Request};
pub(crate) use crate::client::session::{Tombstone, MAX_CELL};

#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    #[error("create the session folder {0}")]
    CreateDir(PathBuf, #[source] io::Error),
    #[error(
        "the session folder {0} is not a private folder of uid {1} (a symlink, another owner, or open to others): \
         remove it, or set XDG_RUNTIME_DIR to a folder of your own"
    )]
    NotPrivate(PathBuf, u32),
    #[error("bind the session socket {0}")]
    Bind(PathBuf, #[source] io::Error),
    #[error("read random bytes for the session id")]
    Random(#[source] io::Error),
}

/// Where a caller's sessions live: `$XDG_RUNTIME_DIR/jail/sessions` when
/// the caller has one (cli/session.rs reads the variable), else
/// `/tmp/jail-$UID/sessions`; every folder made 0700 and the last two
/// checked to be the caller's own, real folders.
pub fn session_dir(runtime_dir: Option<&Path>, uid: u32) -> Result<PathBuf, HandleError> {
    let base = match runtime_dir.filter(|d| d.is_absolute() && d.is_dir()) {
        Some(d) => d.join("jail"),
        None => PathBuf::from(format!("/tmp/jail-{uid}")),
    };
    let dir = base.join("sessions");
    for d in [&base, &dir] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(HandleError::CreateDir(d.clone(), e)),
        }
        // In a shared /tmp anyone may have made it first: it must be ours,
        // a real folder and closed to others, or we would hand them our
        // sockets.
        let meta = std::fs::symlink_metadata(d).map_err(|e| HandleError::CreateDir(d.clone(), e))?;
        if !meta.file_type().is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
            return Err(HandleError::NotPrivate(d.clone(), uid));
        }
    }
    Ok(dir)
}

/// 16 hex digits from the kernel's random source.
pub fn new_id() -> Result<String, HandleError> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(HandleError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The socket of session `id` in `dir`, and the file its end is noted in.
pub fn paths(dir: &Path, id: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{id}.sock")), dir.join(format!("{id}.ended")))
}

/// Bind the session's socket, 0600, non-blocking (the serve loop polls it).
pub fn bind(path: &Path) -> Result<UnixListener, HandleError> {
    let listener = UnixListener::bind(path).map_err(|e| HandleError::Bind(path.to_path_buf(), e))?;
    // The folder is 0700 already; the socket's own mode is the second wall.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| listener.set_nonblocking(true))
        .map_err(|e| HandleError::Bind(path.to_path_buf(), e))?;
    Ok(listener)
}

/// The uid of the process at the other end (SO_PEERCRED).
pub(crate) fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok(cred.uid())
}

/// Read one request line from a client, bounded in bytes and time.
pub(crate) fn read_request(stream: &UnixStream) -> Result<Request, String> {
    read_request_within(stream, Duration::from_secs(10))
}

/// [`read_request`] waiting at most `wait` for each read (the serve loop
/// reads a request while a cell runs within a short one: it must not hold
/// the cell's pipes and clocks for long).
pub(crate) fn read_request_within(stream: &UnixStream, wait: Duration) -> Result<Request, String> {
    let _ = stream.set_read_timeout(Some(wait));
    let mut line = Vec::new();
    let mut reader = BufReader::new(stream.take(MAX_CELL as u64 * 2 + 1024));
    reader.read_until(b'\n', &mut line).map_err(|e| format!("read the request: {e}"))?;
    if !line.ends_with(b"\n") {
        return Err(format!("the request is not one line of at most {} bytes", MAX_CELL * 2 + 1024));
    }
    let req: Request = serde_json::from_slice(&line).map_err(|e| format!("the request is not valid: {e}"))?;
    match &req {
        Request::Exec { code, .. } if code.len() > MAX_CELL => Err(format!("the cell is {} bytes, over {MAX_CELL}", code.len())),
        _ => Ok(req),
    }
}

/// Send one answer line; a client that went away loses it.
pub fn answer(mut stream: &UnixStream, answer: &Answer) {
    let mut line = serde_json::to_vec(answer).unwrap_or_default();
    line.push(b'\n');
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let _ = stream.write_all(&line);
}

/// Refuse a client: the answer, then its request read and dropped (a
/// unix socket closed with unread bytes resets the connection, and the
/// client would lose the answer), bounded in bytes and time.
pub fn refuse(stream: &UnixStream, error: String) {
    answer(stream, &Answer { result: None, error: Some(error) });
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = io::copy(&mut stream.take(MAX_CELL as u64 * 2 + 1024), &mut io::sink());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_folder_someone_else_made_is_refused() {
        let tmp = std::env::temp_dir().join(format!("jail-handle-test-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("jail")).unwrap();
        std::fs::set_permissions(tmp.join("jail"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let me = nix::unistd::getuid().as_raw();
        let err = session_dir(Some(&tmp), me).unwrap_err();
        assert!(matches!(err, HandleError::NotPrivate(..)), "{err}");
        std::fs::set_permissions(tmp.join("jail"), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(session_dir(Some(&tmp), me).unwrap(), tmp.join("jail/sessions"));
        let err = session_dir(Some(&tmp), me + 1).unwrap_err();
        assert!(matches!(err, HandleError::NotPrivate(..)), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
