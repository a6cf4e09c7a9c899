//! Compiled seccomp programs kept between runs.
//!
//! libseccomp takes about 2 ms to build the default policy's program: a
//! tenth of a trivial run, paid again by every `jail run` for the same
//! bytes. The program is a function of the model, the mode, the libseccomp
//! build and its API level on this kernel, and this binary, so it is kept
//! in the user's cache dir under a digest of all of them, and any change to
//! one (a rebuilt `jail`, an upgraded libseccomp, another policy) is a miss.
//!
//! Trust: an entry is used only when the folder and the file belong to our
//! effective uid and nobody else may write them, the file is not a symlink,
//! its stored digest matches its bytes, and the program passes the same
//! check as a fresh one (`bpf::check`, the kernel's rules). Whoever can
//! write there as us can already replace our policies and the `jail`
//! binary, so the cache adds no way in. Every failure to read or write it
//! only means compiling afresh.
//!
//! Where: `$JAIL_CACHE_DIR` (empty turns the cache off), else
//! `$XDG_CACHE_HOME/jail`, else `$HOME/.cache/jail`; the caller reads those
//! (`hostenv::cache_dir`) and passes the folder in.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::bpf;
use super::{Filter, Mode, Model, SeccompError};

/// First bytes of an entry: format and version.
const MAGIC: &[u8; 8] = b"JAILBPF1";
/// An entry's size cap: the header and the kernel's longest program.
const MAX_ENTRY: u64 = (MAGIC.len() + 32 + bpf::MAX_INSNS * 8) as u64;

/// `compile`, through the cache when there is one.
pub(crate) fn compile(model: &Model, mode: Mode, dir: Option<&Path>) -> Result<Filter, SeccompError> {
    match dir.and_then(prepare_dir) {
        Some(dir) => compile_in(&dir, model, mode),
        None => super::compile(model, mode),
    }
}

/// `compile` through the cache in `dir`.
pub(crate) fn compile_in(dir: &Path, model: &Model, mode: Mode) -> Result<Filter, SeccompError> {
    let path = dir.join(format!("seccomp-{}.bpf", key(model, mode)));
    let usable = own_private(dir, true);
    if usable {
        if let Some(program) = load(&path) {
            let sha256 = crate::digest::sha256_hex(&bpf::encode(&program));
            return Ok(Filter { program, mode, sha256 });
        }
    }
    let filter = super::compile(model, mode)?;
    if usable {
        store(dir, &path, &filter);
    }
    Ok(filter)
}

/// The cache folder (`hostenv::cache_dir` chose it), created (0700) if
/// missing; `None` when it is not absolute.
fn prepare_dir(dir: &Path) -> Option<PathBuf> {
    let dir = dir.to_path_buf();
    if !dir.is_absolute() {
        return None;
    }
    if std::fs::symlink_metadata(&dir).is_err() {
        let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir);
    }
    Some(dir)
}

/// Everything the program depends on, digested.
fn key(model: &Model, mode: Mode) -> String {
    let exe = std::fs::metadata("/proc/self/exe")
        .map(|m| format!("{}:{}:{}:{}.{}", m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
        .unwrap_or_default();
    let lib = libseccomp::ScmpVersion::current()
        .map(|v| format!("{}.{}.{}", v.major, v.minor, v.micro))
        .unwrap_or_default();
    let api = libseccomp::get_api();
    let text = format!("jail seccomp cache 1\nexe {exe}\nlibseccomp {lib} api {api}\nmode {mode:?}\n{model:?}");
    crate::digest::sha256_hex(text.as_bytes())
}

/// Whether `path` is ours alone: owned by our effective uid, writable by
/// nobody else, and (for `dir`) a real directory, not a link to one.
fn own_private(path: &Path, dir: bool) -> bool {
    let Ok(m) = std::fs::symlink_metadata(path) else { return false };
    let kind_ok = if dir { m.file_type().is_dir() } else { m.file_type().is_file() };
    kind_ok && m.uid() == nix::unistd::geteuid().as_raw() && m.permissions().mode() & 0o022 == 0
}

/// A stored program, if the entry is sound.
fn load(path: &Path) -> Option<Vec<bpf::Insn>> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let m = file.metadata().ok()?;
    if !m.is_file() || m.uid() != nix::unistd::geteuid().as_raw() || m.permissions().mode() & 0o022 != 0 || m.len() > MAX_ENTRY {
        return None;
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    file.take(MAX_ENTRY).read_to_end(&mut bytes).ok()?;
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    if rest.len() < 32 {
        return None;
    }
    let (digest, program) = rest.split_at(32);
    if crate::digest::sha256_bytes(program) != digest {
        return None;
    }
    let program = bpf::decode(program).ok()?;
    bpf::check(&program).ok()?;
    Some(program)
}

/// Write an entry: to a private temp file first, renamed into place, so a
/// reader never sees half of one.
fn store(dir: &Path, path: &Path, filter: &Filter) {
    let program = bpf::encode(&filter.program);
    let mut bytes = Vec::with_capacity(MAGIC.len() + 32 + program.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&crate::digest::sha256_bytes(&program));
    bytes.extend_from_slice(&program);
    let Ok(mut tmp) = tempfile::Builder::new()
        .prefix(".seccomp-")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
    else {
        return;
    };
    if tmp.write_all(&bytes).is_ok() && tmp.persist(path).is_ok() {
        prune(dir, path);
    }
}

/// Most entries kept: every rebuild of `jail` and every policy is one.
const KEEP: usize = 32;

/// On a miss only: drop the least recently written entries beyond `KEEP`.
fn prune(dir: &Path, keep: &Path) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = read
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("seccomp-") && n.ends_with(".bpf")))
        .filter(|e| e.path() != keep)
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    // `keep` (just written) is one of the KEEP.
    if found.len() < KEEP {
        return;
    }
    found.sort();
    for (_, p) in &found[..=found.len() - KEEP] {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_model() -> Model {
        crate::policy::Policy::builtin_default().expect("default policy").seccomp
    }

    fn private_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_cached_program_is_the_program_libseccomp_compiles() {
        let d = private_dir();
        let m = default_model();
        let fresh = super::super::compile(&m, Mode::Notify).unwrap();
        let first = compile_in(d.path(), &m, Mode::Notify).unwrap();
        let stored = entries(d.path());
        assert_eq!(stored.len(), 1, "{stored:?}");
        assert!(load(&stored[0]).is_some(), "the entry written is not readable back");
        let second = compile_in(d.path(), &m, Mode::Notify).unwrap();
        assert_eq!(first, fresh);
        assert_eq!(second, fresh);
        // And the entry is what a hit returns: a sound entry holding another
        // program (one `ret ALLOW`) comes back as it is.
        let allow = vec![bpf::Insn { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 }];
        let program = bpf::encode(&allow);
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&crate::digest::sha256_bytes(&program));
        bytes.extend_from_slice(&program);
        std::fs::write(&stored[0], bytes).unwrap();
        assert_eq!(compile_in(d.path(), &m, Mode::Notify).unwrap().program, allow);
    }

    #[test]
    fn another_mode_or_policy_is_another_entry() {
        let d = private_dir();
        let m = default_model();
        compile_in(d.path(), &m, Mode::Notify).unwrap();
        compile_in(d.path(), &m, Mode::ErrnoOnly).unwrap();
        let mut other = m.clone();
        other.default_why.push('!');
        compile_in(d.path(), &other, Mode::Notify).unwrap();
        assert_eq!(entries(d.path()).len(), 3);
        assert_ne!(key(&m, Mode::Notify), key(&m, Mode::ErrnoOnly));
    }

    #[test]
    fn a_damaged_entry_is_not_used_and_is_replaced() {
        let d = private_dir();
        let m = default_model();
        let fresh = super::super::compile(&m, Mode::Notify).unwrap();
        compile_in(d.path(), &m, Mode::Notify).unwrap();
        let entry = entries(d.path()).remove(0);
        let mut bytes = std::fs::read(&entry).unwrap();
        // An instruction changed after the digest was taken: say, a refusal
        // turned into an allow.
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&entry, &bytes).unwrap();
        assert!(load(&entry).is_none());
        assert_eq!(compile_in(d.path(), &m, Mode::Notify).unwrap(), fresh);
        assert!(load(&entry).is_some(), "the damaged entry was not rewritten");
    }

    #[test]
    fn an_entry_or_folder_others_may_write_is_not_used() {
        let d = private_dir();
        let m = default_model();
        compile_in(d.path(), &m, Mode::Notify).unwrap();
        let entry = entries(d.path()).remove(0);
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert!(load(&entry).is_none());
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&entry).is_some());
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!own_private(d.path(), true));
        // Compiling still works; it just does not go through the folder.
        std::fs::remove_file(&entry).unwrap();
        compile_in(d.path(), &m, Mode::Notify).unwrap();
        assert!(entries(d.path()).is_empty());
    }

    #[test]
    fn old_entries_are_pruned_beyond_the_cap() {
        let d = private_dir();
        for i in 0..KEEP + 5 {
            std::fs::write(d.path().join(format!("seccomp-old{i:02}.bpf")), b"x").unwrap();
        }
        std::fs::write(d.path().join("unrelated"), b"x").unwrap();
        compile_in(d.path(), &default_model(), Mode::Notify).unwrap();
        let names: Vec<String> =
            entries(d.path()).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names.iter().filter(|n| n.starts_with("seccomp-")).count(), KEEP, "{names:?}");
        assert!(names.contains(&"unrelated".to_string()));
        assert!(names.iter().any(|n| n.starts_with("seccomp-") && n.len() > 70), "the new entry was pruned: {names:?}");
    }

    #[test]
    fn a_symlinked_entry_or_folder_is_not_followed() {
        let d = private_dir();
        let m = default_model();
        compile_in(d.path(), &m, Mode::Notify).unwrap();
        let entry = entries(d.path()).remove(0);
        let moved = d.path().join("elsewhere");
        std::fs::rename(&entry, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &entry).unwrap();
        assert!(load(&entry).is_none());
        let link = d.path().join("linked-dir");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        assert!(!own_private(&link, true));
    }
}
