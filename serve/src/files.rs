//! What the server keeps of a run on disk rather than in memory, and how
//! it is read back: a file of the run's folder opened without following a
//! link, read a bounded chunk at a time on tokio's blocking threads, so a
//! reply holds at most [`CHUNK`] of it (plus hyper's bounded buffer,
//! conn.rs) however large the file and however slow the client.
//!
//! Also what a tenant sees of a result: no path of the host's (issue #33).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use axum::body::Bytes;
use serde_json::Value;

/// Bytes read from a file per step of a reply.
pub const CHUNK: usize = 64 << 10;

/// `dir/name`, a regular file, opened for reading without following a
/// link anywhere in `dir` or in `name`.
pub fn open_in(dir: &Path, name: &str) -> std::io::Result<std::fs::File> {
    use jail::sys::{RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};
    use std::os::fd::AsFd;
    let root = jail::sys::openat2(None, dir, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, RESOLVE_NO_SYMLINKS)?;
    let fd = jail::sys::openat2(
        Some(root.as_fd()),
        Path::new(name),
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Up to `CHUNK` bytes of `file` at `offset`, at most `upto - offset`,
/// read on a blocking thread; the file comes back with them.
pub async fn read_at(file: std::fs::File, offset: u64, upto: u64) -> std::io::Result<(std::fs::File, Bytes)> {
    let want = upto.saturating_sub(offset).min(CHUNK as u64) as usize;
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(got);
        Ok((file, Bytes::from(buf)))
    })
    .await
    .map_err(|e| std::io::Error::other(format!("read task: {e}")))?
}

/// The whole of `file` (`len` bytes), a chunk at a time, then `tail`.
pub fn stream(
    file: std::fs::File,
    len: u64,
    tail: &'static [u8],
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    futures_util::stream::unfold(Some((file, 0u64)), move |at| async move {
        let (file, offset) = at?;
        if offset >= len {
            return (!tail.is_empty()).then(|| (Ok(Bytes::from_static(tail)), None));
        }
        match read_at(file, offset, len).await {
            Ok((_, b)) if b.is_empty() => Some((Err(std::io::Error::other("the file is shorter than it was")), None)),
            Ok((file, b)) => {
                let next = offset + b.len() as u64;
                Some((Ok(b), Some((file, next))))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// A file of the server's made anew at `path`: 0600, never through a link
/// (`O_CREAT | O_EXCL`, `O_NOFOLLOW`).
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Write `value` as one line of compact JSON to `dir/name` (made anew,
/// 0600, no link followed); its length.
pub fn write_json(dir: &Path, name: &str, value: &Value) -> std::io::Result<u64> {
    use std::io::Write;
    let file = create_private(&dir.join(name))?;
    let mut w = std::io::BufWriter::with_capacity(CHUNK, file);
    serde_json::to_writer(&mut w, value)?;
    w.flush()?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    Ok(file.metadata()?.len())
}

/// How host paths are shown to a tenant: each prefix, longest first,
/// becomes the name the tenant knows it by.
#[derive(Debug, Clone)]
pub struct View {
    names: Vec<(PathBuf, &'static str)>,
}

impl View {
    /// A run's: its staged script and input as the jail showed them, its
    /// output as `/workspace/output`, anything else of the service's as
    /// `<service>`.
    pub fn of_run(dir: &Path, service: &[&Path]) -> View {
        let mut names = vec![
            (dir.join("main.py"), "/workspace/code/main.py"),
            (dir.join("input"), "/workspace/input"),
            (dir.join("output"), "/workspace/output"),
            (dir.to_path_buf(), "<run>"),
        ];
        names.extend(service.iter().map(|p| (p.to_path_buf(), "<service>")));
        View { names }
    }

    /// A session's: its input and output, and its cells' scripts.
    pub fn of_session(dir: &Path, service: &[&Path]) -> View {
        let mut names = vec![
            (dir.join("input"), "/workspace/input"),
            (dir.join("output"), "/workspace/output"),
            (dir.to_path_buf(), "<session>"),
        ];
        names.extend(service.iter().map(|p| (p.to_path_buf(), "<service>")));
        View { names }
    }

    /// `text` with every host path named as the tenant knows it.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (host, shown) in &self.names {
            let host = host.to_string_lossy();
            if !host.is_empty() && out.contains(host.as_ref()) {
                out = out.replace(host.as_ref(), shown);
            }
        }
        out
    }

    /// A result document as the tenant sees it: `output_dir` and
    /// `quarantine_dir` (folders of the host's) are null, and every other
    /// string but the script's own stdout and stderr names paths as the
    /// tenant knows them.
    pub fn result(&self, result: &mut Value) {
        let Value::Object(top) = result else { return };
        for (key, v) in top.iter_mut() {
            self.field(key, v);
        }
    }

    /// One top-level field of a result as the tenant sees it (see `result`).
    pub fn field(&self, key: &str, v: &mut Value) {
        match key {
            "output_dir" | "quarantine_dir" => *v = Value::Null,
            "stdout" | "stderr" => {}
            _ => self.walk(v),
        }
    }

    /// Whether a top-level field is passed on as the jail wrote it.
    pub fn untouched(key: &str) -> bool {
        key == "stdout" || key == "stderr"
    }

    fn walk(&self, v: &mut Value) {
        match v {
            Value::String(s) if self.names.iter().any(|(h, _)| s.contains(h.to_string_lossy().as_ref())) => {
                *s = self.text(s);
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.walk(x)),
            Value::Object(o) => o.values_mut().for_each(|x| self.walk(x)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use serde_json::json;

    #[test]
    fn a_result_names_no_host_path() {
        let dir = Path::new("/srv/work/jail-serve-x/alice/0123");
        let view = View::of_run(dir, &[Path::new("/srv/work/jail-serve-x")]);
        let mut r = json!({
            "output_dir": "/srv/work/jail-serve-x/alice/0123/output",
            "quarantine_dir": "/srv/work/jail-serve-x/alice/0123/q",
            "stdout": {"text": "/srv/work/jail-serve-x/alice/0123/input is the script's own"},
            "setup_error": {"message": "open /srv/work/jail-serve-x/alice/0123/input/a.csv: denied",
                            "causes": ["stat /srv/work/jail-serve-x/alice/0123/main.py", "/srv/work/jail-serve-x/p/x"]},
        });
        view.result(&mut r);
        assert_eq!(r["output_dir"], Value::Null);
        assert_eq!(r["quarantine_dir"], Value::Null);
        assert_eq!(r["setup_error"]["message"], "open /workspace/input/a.csv: denied");
        assert_eq!(r["setup_error"]["causes"], json!(["stat /workspace/code/main.py", "<service>/p/x"]));
        assert_eq!(r["stdout"]["text"], "/srv/work/jail-serve-x/alice/0123/input is the script's own");
        assert!(!r["setup_error"].to_string().contains("alice"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_file_is_streamed_in_chunks_then_its_tail() {
        let dir = tempfile::tempdir().unwrap();
        let v = json!({"text": "x".repeat(3 * CHUNK)});
        let len = write_json(dir.path(), "r.json", &v).unwrap();
        let file = open_in(dir.path(), "r.json").unwrap();
        let chunks: Vec<Bytes> = stream(file, len, b"}").map(|c| c.unwrap()).collect().await;
        assert!(chunks.iter().all(|c| c.len() <= CHUNK), "no chunk over CHUNK");
        assert_eq!(chunks.last().unwrap().as_ref(), b"}");
        let all: Vec<u8> = chunks.concat();
        assert_eq!(&all[..all.len() - 1], serde_json::to_vec(&v).unwrap().as_slice());
        std::os::unix::fs::symlink("r.json", dir.path().join("l.json")).unwrap();
        assert!(open_in(dir.path(), "l.json").is_err(), "a link is never followed");
        assert!(write_json(dir.path(), "l.json", &v).is_err(), "nor written through");
    }
}
