//! A script given as text (`jail run -c CODE`) or on stdin (`jail run -`):
//! written to a file in a private temp folder (0700, the file 0644) that is
//! removed when the value is dropped, after the run. The folder keeps
//! everyone else out; the file is readable by the jail's uid because a
//! script is handed to the jail only when the jail could read it
//! (accept.rs), root's runs included.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::mounts::MAX_SCRIPT_BYTES;

/// The script's name inside the jail (`/workspace/code/main.py`), as in a
/// traceback.
pub(crate) const SCRIPT_NAME: &str = "main.py";

#[derive(Debug, thiserror::Error)]
pub(crate) enum InlineError {
    #[error("-c was given an empty script: pass the code to run, e.g. jail run -c 'print(1)'")]
    Empty,
    #[error("the script is over {} MiB: write it to a file and pass its folder with --code DIR", MAX_SCRIPT_BYTES >> 20)]
    TooLarge,
    #[error("cannot read the script from stdin: {0}")]
    ReadStdin(std::io::Error),
    #[error("cannot write the script to a temp file in {dir}: {source} (set TMPDIR to a writable folder)")]
    Write { dir: PathBuf, source: std::io::Error },
}

/// The script's file, alive as long as this value.
#[derive(Debug)]
pub(crate) struct InlineScript {
    dir: tempfile::TempDir,
}

impl InlineScript {
    /// `-c CODE`: an empty string is an error, nothing is run.
    pub(crate) fn from_code(code: &str, temp: &Path) -> Result<InlineScript, InlineError> {
        if code.is_empty() {
            return Err(InlineError::Empty);
        }
        if code.len() as u64 > MAX_SCRIPT_BYTES {
            return Err(InlineError::TooLarge);
        }
        InlineScript::write(code.as_bytes(), temp)
    }

    /// `-`: the script is all of `input`, at most [`MAX_SCRIPT_BYTES`]
    /// (read one byte past the cap to tell). An empty stdin is an empty
    /// script, as for `python3 -`.
    pub(crate) fn from_reader(input: impl Read, temp: &Path) -> Result<InlineScript, InlineError> {
        let mut text = Vec::new();
        input.take(MAX_SCRIPT_BYTES + 1).read_to_end(&mut text).map_err(InlineError::ReadStdin)?;
        if text.len() as u64 > MAX_SCRIPT_BYTES {
            return Err(InlineError::TooLarge);
        }
        InlineScript::write(&text, temp)
    }

    fn write(text: &[u8], temp: &Path) -> Result<InlineScript, InlineError> {
        let fail = |source| InlineError::Write { dir: temp.to_path_buf(), source };
        // Removed, with its file, on drop; ours alone while it exists.
        let dir = tempfile::Builder::new()
            .prefix("jail-script-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(temp)
            .map_err(fail)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.path().join(SCRIPT_NAME))
            .map_err(fail)?;
        file.write_all(text).map_err(fail)?;
        Ok(InlineScript { dir })
    }

    /// The file to pass as the run's script.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join(SCRIPT_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_c_is_refused() {
        let t = tempfile::tempdir().unwrap();
        assert!(matches!(InlineScript::from_code("", t.path()), Err(InlineError::Empty)));
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0, "nothing left behind");
    }

    #[test]
    fn the_script_is_private_and_removed_when_dropped() {
        let t = tempfile::tempdir().unwrap();
        let s = InlineScript::from_code("print(1)\n", t.path()).unwrap();
        let path = s.path();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "print(1)\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777 & !0o022, 0o644 & !0o022);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        drop(s);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }

    #[test]
    fn stdin_past_the_script_cap_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let big = std::io::repeat(b'#').take(MAX_SCRIPT_BYTES + 1);
        assert!(matches!(InlineScript::from_reader(big, t.path()), Err(InlineError::TooLarge)));
        let ok = InlineScript::from_reader(&b"print(2)\n"[..], t.path()).unwrap();
        assert_eq!(std::fs::read(ok.path()).unwrap(), b"print(2)\n");
    }
}
