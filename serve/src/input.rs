//! A run's input folder, from the request's `files` (name → UTF-8 text)
//! and `input_tar` (base64 of a tar archive, optionally gzip-compressed).
//! Both are attacker-made: the archive is read by the `tar` and `flate2`
//! crates into a [`Plan`] held in memory — only regular files and folders,
//! every name checked, bounded by construction in entries, unpacked bytes,
//! depth and time — and only a plan that passed is written, beneath a fresh
//! folder, by [`write`], which creates every entry anew (`O_EXCL`) and
//! resolves every parent with openat2 `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`, so no link is ever followed.
//!
//! Pure plan, thin apply: [`plan`] touches no file (fuzz/fuzz_targets/
//! serve_tar.rs runs it over any bytes); a refusal leaves nothing behind.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use base64::Engine;

/// Entries an archive may hold at most, folders (named or implied) included.
pub const MAX_ENTRIES: usize = 4096;
/// Folders a path may go down at most.
pub const MAX_DEPTH: usize = 32;
/// Bytes of one name component, and of a whole path, at most.
pub const MAX_COMPONENT: usize = 255;
pub const MAX_PATH: usize = 1024;
/// How long reading an archive, then writing its files, may take each.
pub const MAX_TIME: Duration = Duration::from_secs(10);

/// What one request may unpack.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Bytes of all files together (the tenant's `bytes in`).
    pub bytes: u64,
    pub entries: usize,
    pub depth: usize,
    pub time: Duration,
}

impl Bounds {
    pub fn with_bytes(bytes: u64) -> Bounds {
        Bounds { bytes, entries: MAX_ENTRIES, depth: MAX_DEPTH, time: MAX_TIME }
    }

    /// Bytes of the unpacked tar stream read at most: the files, plus a
    /// header, its padding and a long name's blocks per entry.
    fn stream(&self) -> u64 {
        self.bytes
            .saturating_add((self.entries as u64).saturating_mul(3 * 512 + MAX_PATH as u64))
            .saturating_add(1 << 20)
    }
}

/// One entry to make, its path relative to the input folder, `/`-separated,
/// every component checked; parents always come before their children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Dir(String),
    File(String, Vec<u8>),
}

/// The input folder to make: checked, not yet written.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub items: Vec<Item>,
    /// Each path planned and whether it is a folder.
    kinds: HashMap<String, bool>,
    bytes: u64,
}

impl Plan {
    /// A plan of one top-level file (a run's `main.py`).
    pub fn one_file(name: &str, bytes: Vec<u8>) -> Plan {
        Plan {
            bytes: bytes.len() as u64,
            kinds: HashMap::from([(name.to_owned(), false)]),
            items: vec![Item::File(name.to_owned(), bytes)],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes of all files planned.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Why an input could not be planned: each a 400 naming `input_tar` (the
/// entry at fault in the message) and the fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("`input_tar` is not base64 ({0}): send the archive's bytes base64-encoded (the standard alphabet)")]
    Base64(String),
    #[error("`input_tar` is {0}-compressed: send a plain tar or a gzip-compressed one (tar -czf)")]
    Compression(&'static str),
    #[error("`input_tar` is not a readable tar archive ({0}): send one made by tar(1) or Python's tarfile")]
    Archive(String),
    #[error("`input_tar` unpacks to more than {0} bytes (this token's bytes in): send fewer or smaller files")]
    TooLarge(u64),
    #[error("`input_tar` holds more than {0} entries (folders included): send fewer files")]
    TooManyEntries(usize),
    #[error("`input_tar` took more than {0:?} to read: send a smaller archive")]
    TooSlow(Duration),
    #[error("`input_tar` entry {name:?} is {what}: only regular files and folders are taken; {fix}")]
    Kind {
        name: String,
        what: &'static str,
        fix: &'static str,
    },
    #[error("`input_tar` entry {name:?} {why}: {fix}")]
    Name {
        name: String,
        why: &'static str,
        fix: &'static str,
    },
    #[error("`input_tar` entry {0:?} is also in `files`: send each input file once")]
    Collision(String),
    #[error("`input_tar` entry {0:?} appears twice, or as both a file and a folder: send each path once")]
    Duplicate(String),
}

/// Why a planned input could not be written (the server's fault, a 500).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("write the input entry {path:?}: {source}")]
    Io { path: String, source: io::Error },
    #[error("writing the input took longer than the run's wall time: send fewer entries, or ask for more time")]
    TooSlow,
}

/// Plan the input folder: `files` at its top, then the archive's entries.
/// `files`' names are checked by the caller (one component each).
pub fn plan(files: &BTreeMap<String, String>, input_tar: Option<&str>, bounds: &Bounds) -> Result<Plan, PlanError> {
    let mut plan = Plan::default();
    for (name, text) in files {
        plan.bytes += text.len() as u64;
        plan.kinds.insert(name.clone(), false);
        plan.items.push(Item::File(name.clone(), text.as_bytes().to_vec()));
    }
    if let Some(b64) = input_tar {
        let raw = decode_base64(b64)?;
        plan_tar(&mut plan, &raw, files, bounds)?;
    }
    Ok(plan)
}

/// Plan an archive's bytes alone (no `files`, no base64): what the fuzz
/// target (fuzz/fuzz_targets/serve_tar.rs) runs.
pub fn plan_archive(raw: &[u8], bounds: &Bounds) -> Result<Plan, PlanError> {
    let mut plan = Plan::default();
    plan_tar(&mut plan, raw, &BTreeMap::new(), bounds)?;
    Ok(plan)
}

fn decode_base64(text: &str) -> Result<Vec<u8>, PlanError> {
    use base64::engine::{general_purpose::GeneralPurpose, DecodePaddingMode, GeneralPurposeConfig};
    // Padded or not: clients differ, the bytes do not.
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(text.trim()).map_err(|e| PlanError::Base64(e.to_string()))
}

/// Why the capped stream stopped, shared with the reader the tar crate owns.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    No,
    Bytes,
    Time,
}

/// The unpacked stream, cut off (with an error, never a clean end) past
/// its byte budget or its deadline.
struct Capped<R> {
    inner: R,
    left: u64,
    deadline: Instant,
    stop: Rc<Cell<Stop>>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if Instant::now() > self.deadline {
            self.stop.set(Stop::Time);
            return Err(io::Error::other("deadline passed"));
        }
        if self.left == 0 {
            // One byte more tells a stream that ends exactly here from one that goes on.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => {
                    self.stop.set(Stop::Bytes);
                    Err(io::Error::other("over the byte budget"))
                }
            };
        }
        let most = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..most])?;
        self.left -= n as u64;
        Ok(n)
    }
}

fn plan_tar(plan: &mut Plan, raw: &[u8], files: &BTreeMap<String, String>, bounds: &Bounds) -> Result<(), PlanError> {
    let deadline = Instant::now() + bounds.time;
    let stop = Rc::new(Cell::new(Stop::No));
    let unpacked: Box<dyn Read + '_> = match compression(raw) {
        Some("gzip") => Box::new(flate2::read::MultiGzDecoder::new(raw)),
        Some(other) => return Err(PlanError::Compression(other)),
        None => Box::new(raw),
    };
    let capped = Capped { inner: unpacked, left: bounds.stream(), deadline, stop: Rc::clone(&stop) };
    let stopped = |e: io::Error| match stop.get() {
        Stop::Bytes => PlanError::TooLarge(bounds.bytes),
        Stop::Time => PlanError::TooSlow(bounds.time),
        Stop::No => PlanError::Archive(e.to_string()),
    };
    let mut archive = tar::Archive::new(capped);
    for entry in archive.entries().map_err(stopped)? {
        let mut entry = entry.map_err(stopped)?;
        if Instant::now() > deadline {
            return Err(PlanError::TooSlow(bounds.time));
        }
        let kind = entry.header().entry_type();
        // A pax global header (`git archive` writes one) describes the
        // archive, not a file.
        if kind.is_pax_global_extensions() {
            continue;
        }
        let shown = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let is_dir = match kind {
            // Old (v7) archives mark a folder by a trailing `/` alone.
            tar::EntryType::Regular => entry.path_bytes().ends_with(b"/") && entry.size() == 0,
            tar::EntryType::Directory => true,
            other => return Err(refused_kind(shown, other)),
        };
        let path = checked_path(&entry.path_bytes(), is_dir, bounds)?;
        let Some(path) = path else { continue };
        let top = path.split('/').next().unwrap_or_default();
        if files.contains_key(top) {
            return Err(PlanError::Collision(shown));
        }
        plan.add_parents(&path, &shown, bounds)?;
        if is_dir {
            match plan.kinds.get(&path) {
                Some(true) => continue,
                Some(false) => return Err(PlanError::Duplicate(shown)),
                None => plan.push(Item::Dir(path), bounds)?,
            }
            continue;
        }
        if plan.kinds.contains_key(&path) {
            return Err(PlanError::Duplicate(shown));
        }
        let size = entry.size();
        if size > bounds.bytes.saturating_sub(plan.bytes) {
            return Err(PlanError::TooLarge(bounds.bytes));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size.min(1 << 20)).unwrap_or(0));
        (&mut entry).take(size).read_to_end(&mut bytes).map_err(stopped)?;
        if bytes.len() as u64 != size {
            return Err(PlanError::Archive(format!("entry {shown:?} is cut short")));
        }
        plan.bytes += size;
        plan.push(Item::File(path, bytes), bounds)?;
    }
    Ok(())
}

impl Plan {
    fn push(&mut self, item: Item, bounds: &Bounds) -> Result<(), PlanError> {
        if self.items.len() >= bounds.entries {
            return Err(PlanError::TooManyEntries(bounds.entries));
        }
        let (path, is_dir) = match &item {
            Item::Dir(p) => (p.clone(), true),
            Item::File(p, _) => (p.clone(), false),
        };
        self.kinds.insert(path, is_dir);
        self.items.push(item);
        Ok(())
    }

    /// The folders above `path`, made when no entry named them (tars often
    /// name only files); a file standing where a folder must be is refused.
    fn add_parents(&mut self, path: &str, shown: &str, bounds: &Bounds) -> Result<(), PlanError> {
        for (i, _) in path.match_indices('/') {
            let parent = &path[..i];
            match self.kinds.get(parent) {
                Some(true) => {}
                Some(false) => return Err(PlanError::Duplicate(shown.to_owned())),
                None => self.push(Item::Dir(parent.to_owned()), bounds)?,
            }
        }
        Ok(())
    }
}

/// `gzip`, another compression we do not take, or none.
fn compression(raw: &[u8]) -> Option<&'static str> {
    const MAGIC: [(&[u8], &str); 4] = [
        (&[0x1f, 0x8b], "gzip"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0], "xz"),
        (b"BZh", "bzip2"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
    ];
    MAGIC.iter().find(|(m, _)| raw.starts_with(m)).map(|(_, name)| *name)
}

fn refused_kind(name: String, kind: tar::EntryType) -> PlanError {
    let (what, fix) = match kind {
        tar::EntryType::Symlink => {
            ("a symbolic link", "archive the file it points to instead (tar --dereference, tarfile's dereference=True)")
        }
        tar::EntryType::Link => ("a hard link", "archive each file's own copy (tar --hard-dereference)"),
        tar::EntryType::Char | tar::EntryType::Block => ("a device", "leave it out of the archive"),
        tar::EntryType::Fifo => ("a FIFO", "leave it out of the archive"),
        tar::EntryType::GNUSparse => ("a sparse file", "archive it without --sparse"),
        _ => ("of a type other than file or folder", "leave it out of the archive"),
    };
    PlanError::Kind { name, what, fix }
}

/// The entry's path, `/`-joined with `.` and empty components dropped;
/// `None` for the archive's own top (`./`). Refused: not UTF-8, control
/// characters, absolute, `..`, too deep or too long.
fn checked_path(raw: &[u8], is_dir: bool, bounds: &Bounds) -> Result<Option<String>, PlanError> {
    let shown = || String::from_utf8_lossy(raw).into_owned();
    let rename = "rename it, or leave it out of the archive";
    let relative = "archive relative names (tar -C DIR -cf - .)";
    let bad = |why, fix| PlanError::Name { name: shown(), why, fix };
    let text = std::str::from_utf8(raw).map_err(|_| bad("is not UTF-8", rename))?;
    if text.chars().any(char::is_control) {
        return Err(bad("has a control character in its name", rename));
    }
    if text.starts_with('/') {
        return Err(bad("is an absolute name", relative));
    }
    if text.len() > MAX_PATH {
        return Err(bad("is a path over 1024 bytes", "shorten it"));
    }
    let mut parts = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(bad("has a `..` component", relative)),
            p if p.len() > MAX_COMPONENT => return Err(bad("has a name over 255 bytes", "shorten it")),
            p => parts.push(p),
        }
    }
    if parts.len() > bounds.depth {
        return Err(bad("is too many folders deep (at most 32)", "flatten the tree"));
    }
    if parts.is_empty() {
        return if is_dir { Ok(None) } else { Err(bad("has an empty name", "name the file")) };
    }
    Ok(Some(parts.join("/")))
}

const BENEATH: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// Write `plan` beneath `root`, a folder the caller just made: every entry
/// created anew (`O_EXCL`, `mkdirat`), every parent resolved beneath
/// `root` with no link followed, each mode set on the open descriptor
/// (so the umask cannot narrow what the jail's uid must read).
///
/// Done by `deadline` (the run's own wall time, which staging counts
/// toward), or refused: it took too long.
pub fn write(plan: &Plan, root: &Path, dir_mode: u32, file_mode: u32, deadline: Instant) -> Result<(), WriteError> {
    // Named as the tenant sent it, never by the host's path.
    let io_err = |path: &str| {
        let path = path.to_owned();
        move |source| WriteError::Io { path, source }
    };
    let top = jail::sys::openat2(None, root, libc::O_PATH | libc::O_DIRECTORY, libc::RESOLVE_NO_SYMLINKS).map_err(io_err(""))?;
    for item in &plan.items {
        if Instant::now() > deadline {
            return Err(WriteError::TooSlow);
        }
        let (path, is_dir) = match item {
            Item::Dir(p) => (p.as_str(), true),
            Item::File(p, _) => (p.as_str(), false),
        };
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        let parent_fd: OwnedFd;
        let dir = if parent.is_empty() {
            top.as_fd()
        } else {
            parent_fd = jail::sys::openat2(Some(top.as_fd()), Path::new(parent), libc::O_PATH | libc::O_DIRECTORY, BENEATH)
                .map_err(io_err(parent))?;
            parent_fd.as_fd()
        };
        let made = if is_dir {
            nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), name, nix::sys::stat::Mode::from_bits_truncate(0o700))
                .map_err(io::Error::from)
                .map_err(io_err(path))?;
            jail::sys::openat2(Some(dir), Path::new(name), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, BENEATH)
                .map_err(io_err(path))?
        } else {
            jail::sys::openat2_mode(
                Some(dir),
                Path::new(name),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                0o600,
                BENEATH,
            )
            .map_err(io_err(path))?
        };
        let mut file = std::fs::File::from(made);
        if let Item::File(_, bytes) = item {
            file.write_all(bytes).map_err(io_err(path))?;
        }
        let mode = if is_dir { dir_mode } else { file_mode };
        file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io_err(path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds { bytes: 1 << 20, entries: MAX_ENTRIES, depth: MAX_DEPTH, time: MAX_TIME };

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// A tar whose entries are (name, type, data, link target), headers
    /// written raw so that names tar::Builder refuses can be made.
    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if !link.is_empty() {
                h.set_link_name(link).unwrap();
            }
            h.set_cksum();
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    fn plan_of(tar: &[u8]) -> Result<Plan, PlanError> {
        plan(&BTreeMap::new(), Some(&b64(tar)), &B)
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};

    #[test]
    fn files_and_folders_are_planned_parents_first_with_dot_and_implied_folders() {
        let t = tar_of(&[
            ("./", Directory, b"", ""),
            ("./data/a.csv", Regular, b"x,y\n", ""),
            ("data/sub/", Directory, b"", ""),
        ]);
        let want = vec![
            Item::Dir("data".into()),
            Item::File("data/a.csv".into(), b"x,y\n".to_vec()),
            Item::Dir("data/sub".into()),
        ];
        assert_eq!(plan_of(&t).unwrap().items, want);
        assert_eq!(plan(&BTreeMap::new(), Some(&b64(&gzip(&t))), &B).unwrap().items, want, "gzip is read too");
    }

    #[test]
    fn links_devices_and_fifos_are_refused_by_name() {
        for (kind, link, says) in [
            (Symlink, "/etc/passwd", "a symbolic link"),
            (Link, "other", "a hard link"),
            (Char, "", "a device"),
            (Block, "", "a device"),
            (Fifo, "", "a FIFO"),
        ] {
            let e = plan_of(&tar_of(&[("ok.txt", Regular, b"1", ""), ("bad", kind, b"", link)])).unwrap_err();
            assert!(matches!(&e, PlanError::Kind { name, what, .. } if name == "bad" && *what == says), "{kind:?}: {e}");
        }
    }

    #[test]
    fn absolute_names_dotdot_control_characters_and_depth_are_refused() {
        for (name, says) in [
            ("/etc/x", "absolute"),
            ("a/../../x", "`..`"),
            ("../x", "`..`"),
            ("a\u{1b}[2Jb", "control character"),
            (&"d/".repeat(33), "deep"),
        ] {
            let e = plan_of(&tar_of(&[(name, Regular, b"1", "")])).unwrap_err();
            assert!(e.to_string().contains(says), "{name:?}: {e}");
            assert!(e.to_string().contains(&format!("{:?}", name)), "the entry is named: {e}");
        }
    }

    #[test]
    fn a_name_in_files_twice_or_a_file_under_a_file_is_refused() {
        let files = BTreeMap::from([("in.txt".to_string(), "x".to_string())]);
        let t = tar_of(&[("in.txt", Regular, b"1", "")]);
        assert_eq!(plan(&files, Some(&b64(&t)), &B).unwrap_err(), PlanError::Collision("in.txt".into()));
        let t = tar_of(&[("in.txt/deeper", Regular, b"1", "")]);
        assert_eq!(plan(&files, Some(&b64(&t)), &B).unwrap_err(), PlanError::Collision("in.txt/deeper".into()));
        let t = tar_of(&[("a", Regular, b"1", ""), ("a", Regular, b"2", "")]);
        assert_eq!(plan_of(&t).unwrap_err(), PlanError::Duplicate("a".into()));
        let t = tar_of(&[("a", Regular, b"1", ""), ("a/b", Regular, b"2", "")]);
        assert_eq!(plan_of(&t).unwrap_err(), PlanError::Duplicate("a/b".into()));
        let t = tar_of(&[("a/b", Regular, b"1", ""), ("a", Regular, b"2", "")]);
        assert_eq!(plan_of(&t).unwrap_err(), PlanError::Duplicate("a".into()));
    }

    #[test]
    fn bytes_entries_and_a_gzip_bomb_are_bounded() {
        let small = Bounds { bytes: 1000, entries: 3, ..B };
        let t = tar_of(&[("a", Regular, &[b'x'; 600], ""), ("b", Regular, &[b'y'; 600], "")]);
        assert_eq!(plan(&BTreeMap::new(), Some(&b64(&t)), &small).unwrap_err(), PlanError::TooLarge(1000));
        let t = tar_of(&[("a/b/c/d", Regular, b"", "")]);
        assert_eq!(plan(&BTreeMap::new(), Some(&b64(&t)), &small).unwrap_err(), PlanError::TooManyEntries(3));
        // 64 MiB of zeros, a few KiB gzipped: as a file (its size is
        // refused from its header) and as a folder's data, which only the
        // capped stream stops.
        for kind in [Regular, Directory] {
            let mut big = tar::Header::new_gnu();
            big.set_path("big/").unwrap();
            big.set_entry_type(kind);
            big.set_size(64 << 20);
            big.set_cksum();
            let mut raw = big.as_bytes().to_vec();
            raw.resize(raw.len() + (64 << 20), 0);
            let gz = gzip(&raw);
            assert!(gz.len() < 200 << 10, "{}", gz.len());
            let e = plan(&BTreeMap::new(), Some(&b64(&gz)), &Bounds { bytes: 1 << 20, ..B }).unwrap_err();
            assert_eq!(e, PlanError::TooLarge(1 << 20), "{kind:?}");
        }
    }

    #[test]
    fn not_base64_not_tar_and_other_compressions_are_refused() {
        assert!(matches!(plan(&BTreeMap::new(), Some("%%%"), &B).unwrap_err(), PlanError::Base64(_)));
        assert!(matches!(plan_of(b"hello").unwrap_err(), PlanError::Archive(_)));
        assert_eq!(plan_of(b"BZh91AY&SY").unwrap_err(), PlanError::Compression("bzip2"));
        let mut t = tar_of(&[("a", Regular, b"1", "")]);
        t[148] ^= 1;
        assert!(plan_of(&t).unwrap_err().to_string().contains("checksum"));
        assert!(plan_of(&[]).unwrap().is_empty(), "an empty archive is an empty input");
    }

    #[test]
    fn the_plan_is_written_with_its_modes_and_never_through_a_link() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("in");
        std::fs::create_dir(&root).unwrap();
        let files = BTreeMap::from([("top.txt".to_string(), "hi".to_string())]);
        let tar = tar_of(&[("d/e/f.bin", Regular, b"\x00\x01", "")]);
        let p = plan(&files, Some(&b64(&tar)), &B).unwrap();
        write(&p, &root, 0o755, 0o644, Instant::now() + MAX_TIME).unwrap();
        assert_eq!(std::fs::read(root.join("d/e/f.bin")).unwrap(), b"\x00\x01");
        assert_eq!(std::fs::read_to_string(root.join("top.txt")).unwrap(), "hi");
        assert_eq!(std::fs::metadata(root.join("d/e")).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(std::fs::metadata(root.join("top.txt")).unwrap().permissions().mode() & 0o777, 0o644);
        // Something planted where a folder will be made is never followed.
        let root2 = t.path().join("in2");
        std::fs::create_dir(&root2).unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(t.path().join("elsewhere"), root2.join("d")).unwrap();
        let p = plan(&BTreeMap::new(), Some(&b64(&tar_of(&[("d/x", Regular, b"1", "")]))), &B).unwrap();
        assert!(write(&p, &root2, 0o755, 0o644, Instant::now() + MAX_TIME).is_err());
        assert_eq!(std::fs::read_dir(t.path().join("elsewhere")).unwrap().count(), 0);
    }
}
