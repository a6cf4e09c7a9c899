//! Artifacts: what a step left in its output dir, judged by the supervisor
//! from outside the jail once the whole process tree is dead.
//!
//! Pipeline position: [`Before::take`] runs in the supervisor before the
//! child is cloned (so before it is released), and with a size-capped output
//! dir [`Before::retake_output_at`] snapshots the jail's tmpfs once it is
//! filled; [`collect`] (the host folder) or [`collect_at`] (the tmpfs) runs
//! after the supervisor's wait4 of PID 1 returned, which it proves by taking
//! a [`TreeDead`]; delivery.rs then hands the host what passed. Nothing inside the jail can move a file between our listing
//! and our open, and every open is still made beneath the output dir's
//! descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` and `O_NOFOLLOW`, then checked with `fstat`
//! against what the listing saw.
//!
//! The walk is breadth-first and bounded by the policy's caps (entries in
//! all, entries per folder, depth, name length), so its time and memory do
//! not depend on what the script made: a folder with a million files is
//! refused after reading `max_dir_entries + 1` names, a sparse terabyte file
//! is refused by its size without a read, a 4096-deep chain stops at
//! `max_depth`. Entries are typed with `fstatat(AT_SYMLINK_NOFOLLOW)` before
//! anything is opened, so a fifo is never opened and a device never touched.
//! Accepted files are then read once each (`inspect`) for their sha256, media
//! type, flags and summary, each summariser within the fixed memory and time
//! budgets of `budget` (past them the file is flagged `incomplete_scan`).

pub mod budget;
pub mod bundle;
mod csv;
pub mod fuzzing;
mod image;
mod inspect;
mod json;
mod markup;
pub(crate) mod neutralise;
mod ooxml;
mod rules;
pub(crate) mod single;
mod text;
mod zipdir;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{self, Read};
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::sys::stat::FileStat;

use crate::digest::Hasher;
use crate::result::{Artifact, Change, Disposition, FlagKind, InputReport, Neutralised, RejectReason, RejectedArtifact};
use crate::sys;

pub use rules::FormulaCells;
pub(crate) use rules::{ArtifactRules, Extensions, PastBudget};
use text::printable;
pub use text::{escape_name, needs_escape};

/// Every open below the output dir: never a symlink, never out of the tree.
const RESOLVE: u64 = sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS;
/// Refusals listed in the result; the rest are counted in one last entry.
pub(crate) const MAX_REJECTED_LISTED: usize = 100;
/// The input digest's own bounds (the input is the caller's, but it is
/// digested twice per run).
const INPUT_MAX_ENTRIES: u64 = 100_000;
const INPUT_MAX_DEPTH: u32 = 64;
const CHUNK: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactsError {
    #[error("open output dir {}", .path.display())]
    OpenOutput { path: PathBuf, source: io::Error },
    #[error("digest input dir {}", .path.display())]
    DigestInput { path: PathBuf, source: io::Error },
}

impl ArtifactsError {
    /// The underlying cause, for the result's cause chain.
    pub fn cause(&self) -> String {
        match self {
            ArtifactsError::OpenOutput { source, .. } | ArtifactsError::DigestInput { source, .. } => source.to_string(),
        }
    }
}

/// Proof that the jail's process tree is dead.
///
/// The supervisor makes one right after its wait4 of PID 1 returned. PID 1 of
/// a pid namespace becomes reapable only after every other process of the
/// namespace has been killed and reaped (`zap_pid_ns_processes` in
/// kernel/pid_namespace.c waits for them), so once we hold this, nothing in
/// the jail can change the output dir again.
#[derive(Debug, Clone, Copy)]
pub struct TreeDead(());

impl TreeDead {
    /// Only to be called once wait4 of the jail's PID 1 has returned.
    pub(crate) fn after_reaping_pid1() -> TreeDead {
        TreeDead(())
    }
}

impl From<TreeDead> for TreeStill<'static> {
    fn from(_: TreeDead) -> TreeStill<'static> {
        TreeStill(PhantomData)
    }
}

/// Proof that nothing in the jail can change the output dir for `'a`: its
/// tree dead ([`TreeDead`]), or held still (still.rs, `Hold`) while the
/// hold `'a` lasts.
#[derive(Debug, Clone, Copy)]
pub struct TreeStill<'a>(PhantomData<&'a ()>);

impl<'a> TreeStill<'a> {
    /// Only for still.rs, from a hold it has.
    pub(crate) fn held(lasts: PhantomData<&'a ()>) -> TreeStill<'a> {
        TreeStill(lasts)
    }
}

// ------------------------------------------------------------------ names

/// A name the artifact may have, or why not.
fn check_name(name: &[u8], max_bytes: u32) -> Result<&str, (RejectReason, String)> {
    if name.len() > max_bytes as usize {
        return Err((RejectReason::NameTooLong, format!("the name is {} bytes, the limit is {max_bytes}", name.len())));
    }
    let bad = |why: &str| Err((RejectReason::BadName, why.to_string()));
    let Ok(text) = std::str::from_utf8(name) else {
        return bad("the name is not valid UTF-8");
    };
    if text.chars().any(needs_escape) {
        return bad("the name has a control, invisible or bidi character");
    }
    if text.contains("..") {
        return bad("the name contains `..`");
    }
    if text.contains('\\') {
        return bad("the name contains a backslash");
    }
    if text.starts_with('-') {
        return bad("the name starts with `-` (it would read as an option)");
    }
    Ok(text)
}

/// The lowercased extension of a file name (`""` when it has none; a
/// leading dot does not start one).
fn extension(name: &str) -> String {
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => ext.to_ascii_lowercase(),
        _ => String::new(),
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn shown_dir(dir: &str) -> String {
    if dir.is_empty() {
        ".".into()
    } else {
        dir.to_string()
    }
}

// ------------------------------------------------------------------- walk

/// What the listing saw of one entry; compared with `fstat` on open and with
/// the snapshot taken before the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    dev: u64,
    ino: u64,
    mode: u32,
    nlink: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Meta {
    fn of(st: &FileStat) -> Meta {
        Meta {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
            nlink: st.st_nlink,
            size: st.st_size.max(0) as u64,
            mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        }
    }

    fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// Same inode, unchanged content and metadata.
    fn same_file(&self, other: &Meta) -> bool {
        (self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns)
            == (other.dev, other.ino, other.size, other.mtime_ns, other.ctime_ns)
    }
}

struct FileEntry {
    rel: String,
    meta: Meta,
}

/// An entry the verdict keeps off the host, as the walk met it: its folder
/// (a path of accepted names) and its raw name. `None` for a refusal that
/// names no one entry (the walk's own stop, an unreadable output dir).
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    pub dir: String,
    pub name: Vec<u8>,
    meta: Option<Meta>,
    /// Its index in the listed refusals, when it is listed.
    pub listed: Option<usize>,
}

impl Refused {
    /// An entry refused after the walk (its refusal is `rejected[listed]`).
    pub(crate) fn new(dir: &str, name: &[u8], listed: usize) -> Refused {
        Refused { dir: dir.to_string(), name: name.to_vec(), meta: None, listed: Some(listed) }
    }

    /// Its raw path relative to the output dir.
    pub(crate) fn raw_rel(&self) -> Vec<u8> {
        raw_join(&self.dir, &self.name)
    }
}

fn raw_join(dir: &str, name: &[u8]) -> Vec<u8> {
    let mut p = dir.as_bytes().to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Refusals, listed up to [`MAX_REJECTED_LISTED`] and counted beyond; every
/// refused entry is remembered (bounded by the walk's `max_entries`), listed
/// or not, so that none of them reaches the host.
#[derive(Default)]
struct Rejections {
    listed: Vec<RejectedArtifact>,
    omitted: u64,
    entries: Vec<Refused>,
}

/// Where a refusal is: an entry (folder, raw name, what fstatat said), or
/// nowhere in particular.
type At<'a> = Option<(&'a str, &'a [u8], Option<Meta>)>;

impl Rejections {
    fn add(&mut self, path: String, at: At<'_>, reason: RejectReason, detail: impl Into<String>) {
        let listed = if self.listed.len() < MAX_REJECTED_LISTED {
            self.listed.push(RejectedArtifact {
                path,
                reason,
                detail: detail.into(),
                disposition: Disposition::NotDelivered,
                moved_to: None,
            });
            Some(self.listed.len() - 1)
        } else {
            self.omitted += 1;
            None
        };
        if let Some((dir, name, meta)) = at {
            self.entries.push(Refused { dir: dir.to_string(), name: name.to_vec(), meta, listed });
        }
    }

    /// A refusal of a file the listing accepted as a regular file.
    fn add_file(&mut self, f: &FileEntry, reason: RejectReason, detail: impl Into<String>) {
        let (dir, name) = f.rel.rsplit_once('/').unwrap_or(("", f.rel.as_str()));
        self.add(f.rel.clone(), Some((dir, name.as_bytes(), Some(f.meta))), reason, detail);
    }

    fn into_list(mut self) -> (Vec<RejectedArtifact>, Vec<Refused>) {
        if self.omitted > 0 {
            self.listed.push(RejectedArtifact {
                path: ".".into(),
                reason: RejectReason::TooManyRejected,
                detail: format!("{} more refused entries are not listed", self.omitted),
                disposition: Disposition::NotDelivered,
                moved_to: None,
            });
        }
        (self.listed, self.entries)
    }
}

#[derive(Default)]
struct Listing {
    files: Vec<FileEntry>,
    rejected: Rejections,
    /// Every valid path the walk saw, of any type (for `deleted`).
    seen: HashSet<String>,
    /// Folders listed in full.
    walked: HashSet<String>,
    /// What fstatat said of every entry the walk typed, by raw path (for
    /// "there before and left alone").
    metas: HashMap<Vec<u8>, Meta>,
}

fn open_root(dir: &Path) -> io::Result<OwnedFd> {
    sys::openat2(
        None,
        dir,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
    )
}

fn open_dir_beneath(root: &OwnedFd, rel: &str) -> io::Result<OwnedFd> {
    let rel = if rel.is_empty() { "." } else { rel };
    sys::openat2(Some(root.as_fd()), Path::new(rel), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, RESOLVE)
}

/// Up to `limit` names of a folder (without `.` and `..`), sorted.
fn read_names(dir: &OwnedFd, limit: u64) -> io::Result<Vec<Vec<u8>>> {
    let mut d = nix::dir::Dir::from(dir.try_clone()?)?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(name.to_vec());
        if names.len() as u64 >= limit {
            break;
        }
    }
    names.sort();
    Ok(names)
}

fn type_refusal(kind: u32) -> (RejectReason, &'static str) {
    match kind {
        libc::S_IFLNK => (RejectReason::Symlink, "a symbolic link (never followed)"),
        libc::S_IFIFO => (RejectReason::Fifo, "a named pipe (never opened)"),
        libc::S_IFSOCK => (RejectReason::Socket, "a socket"),
        libc::S_IFCHR | libc::S_IFBLK => (RejectReason::Device, "a device node"),
        _ => (RejectReason::Device, "not a regular file or folder"),
    }
}

fn shown(dir: &str, name: &[u8]) -> String {
    if dir.is_empty() {
        escape_name(name)
    } else {
        format!("{dir}/{}", escape_name(name))
    }
}

/// List the tree beneath `root`: regular files with their metadata, and
/// refusals for everything the structure rules exclude.
fn walk(root: &OwnedFd, rules: &ArtifactRules) -> Listing {
    let mut l = Listing::default();
    let root_dev = match nix::sys::stat::fstat(root.as_raw_fd()) {
        Ok(st) => st.st_dev,
        Err(e) => {
            l.rejected.add(".".into(), None, RejectReason::Unreadable, format!("fstat: {e}"));
            return l;
        }
    };
    let mut queue: VecDeque<(String, u32)> = VecDeque::from([(String::new(), 0)]);
    let mut entries = 0u64;
    'walk: while let Some((dir, depth)) = queue.pop_front() {
        let listed = open_dir_beneath(root, &dir).and_then(|fd| Ok((read_names(&fd, rules.max_dir_entries + 1)?, fd)));
        let (parent, name) = dir.rsplit_once('/').unwrap_or(("", dir.as_str()));
        let dir_at: At<'_> = if dir.is_empty() {
            None
        } else {
            Some((parent, name.as_bytes(), l.metas.get(dir.as_bytes()).copied()))
        };
        let (names, dir_fd) = match listed {
            Ok(x) => x,
            Err(e) => {
                l.rejected
                    .add(shown_dir(&dir), dir_at, RejectReason::Unreadable, format!("cannot list the folder: {e}"));
                continue;
            }
        };
        if names.len() as u64 > rules.max_dir_entries {
            l.rejected.add(
                shown_dir(&dir),
                dir_at,
                RejectReason::TooWide,
                format!("the folder has more than {} entries; none of them is taken", rules.max_dir_entries),
            );
            continue;
        }
        l.walked.insert(dir.clone());
        for (i, name) in names.iter().enumerate() {
            entries += 1;
            if entries > rules.max_entries {
                l.rejected.add(
                    shown_dir(&dir),
                    None,
                    RejectReason::TooManyEntries,
                    format!("the walk stopped here after {} entries", rules.max_entries),
                );
                l.walked.remove(&dir);
                // What the walk never reached is never accepted, so it is
                // refused: the rest of this folder, and every folder queued.
                let not_judged = "the walk stopped before it (artifacts.max_entries); never looked at";
                for rest in &names[i..] {
                    let meta =
                        nix::sys::stat::fstatat(Some(dir_fd.as_raw_fd()), rest.as_slice(), AtFlags::AT_SYMLINK_NOFOLLOW).ok();
                    l.rejected.add(
                        shown(&dir, rest),
                        Some((&dir, rest, meta.as_ref().map(Meta::of))),
                        RejectReason::NotJudged,
                        not_judged,
                    );
                }
                for (queued, _) in queue.drain(..) {
                    let (parent, name) = queued.rsplit_once('/').unwrap_or(("", queued.as_str()));
                    let meta = l.metas.get(queued.as_bytes()).copied();
                    l.rejected
                        .add(queued.clone(), Some((parent, name.as_bytes(), meta)), RejectReason::NotJudged, not_judged);
                }
                break 'walk;
            }
            let meta = nix::sys::stat::fstatat(Some(dir_fd.as_raw_fd()), name.as_slice(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map(|st| Meta::of(&st));
            if let Ok(m) = &meta {
                l.metas.insert(raw_join(&dir, name), *m);
            }
            let at: At<'_> = Some((&dir, name, meta.as_ref().ok().copied()));
            let text = match check_name(name, rules.max_name_bytes) {
                Ok(t) => t,
                Err((reason, why)) => {
                    l.rejected.add(shown(&dir, name), at, reason, why);
                    continue;
                }
            };
            let rel = join(&dir, text);
            l.seen.insert(rel.clone());
            let st = match meta {
                Ok(st) => st,
                Err(e) => {
                    l.rejected.add(rel, at, RejectReason::Unreadable, format!("fstatat: {e}"));
                    continue;
                }
            };
            match st.kind() {
                libc::S_IFDIR | libc::S_IFREG if st.dev != root_dev => {
                    l.rejected.add(rel, at, RejectReason::MountPoint, "on another filesystem than the output dir");
                }
                libc::S_IFDIR => {
                    // Its entries would be at depth + 2.
                    if depth + 2 > rules.max_depth {
                        l.rejected.add(
                            rel,
                            at,
                            RejectReason::TooDeep,
                            format!("entries in this folder would be deeper than {} levels; not entered", rules.max_depth),
                        );
                    } else {
                        queue.push_back((rel, depth + 1));
                    }
                }
                libc::S_IFREG => l.files.push(FileEntry { rel, meta: st }),
                other => {
                    let (reason, what) = type_refusal(other);
                    l.rejected.add(rel, at, reason, what);
                }
            }
        }
    }
    l
}

/// A file of the listing that passes the per-file rules, or why not.
fn file_refusal(f: &FileEntry, rules: &ArtifactRules) -> Option<(RejectReason, String)> {
    let name = f.rel.rsplit('/').next().unwrap_or(&f.rel);
    link_refusal(f.meta.nlink, f.meta.mode).or_else(|| name_size_refusal(name, f.meta.size, rules))
}

/// Why a file of `nlink` names and `mode` is refused, if it is: the rules
/// on its inode (also the files API's, session/files.rs).
pub(crate) fn link_refusal(nlink: u64, mode: u32) -> Option<(RejectReason, String)> {
    if nlink > 1 {
        return Some((RejectReason::HardLink, format!("the file has {nlink} names (hard links)")));
    }
    if mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        return Some((RejectReason::SetId, "the file has the set-user-ID or set-group-ID bit".into()));
    }
    None
}

/// Why a file called `name` of `size` bytes is refused, if it is: the
/// rules on its name and size (also a copy's, single.rs).
pub(crate) fn name_size_refusal(name: &str, size: u64, rules: &ArtifactRules) -> Option<(RejectReason, String)> {
    let ext = extension(name);
    if !rules.allowed_extensions.allows(&ext) {
        let shown = if ext.is_empty() {
            "a name without an extension".to_string()
        } else {
            format!(".{}", printable(&ext, 16))
        };
        return Some((RejectReason::ExtensionNotAllowed, format!("{shown} is not in artifacts.allowed_extensions")));
    }
    if size > rules.max_file_bytes {
        return Some((RejectReason::TooLarge, format!("{size} bytes, over artifacts.max_file_bytes ({})", rules.max_file_bytes)));
    }
    None
}

/// Open a listed regular file beneath `root` and check it is still the one
/// listed.
fn open_listed(root: &OwnedFd, f: &FileEntry) -> Result<File, (RejectReason, String)> {
    // O_NONBLOCK: were it swapped for a fifo after all, the open would not hang.
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = sys::openat2(Some(root.as_fd()), Path::new(&f.rel), flags, RESOLVE)
        .map_err(|e| (RejectReason::Unreadable, format!("open: {e}")))?;
    let now = nix::sys::stat::fstat(fd.as_raw_fd())
        .map(|st| Meta::of(&st))
        .map_err(|e| (RejectReason::Unreadable, format!("fstat: {e}")))?;
    if now.kind() != libc::S_IFREG || !now.same_file(&f.meta) || now.nlink != f.meta.nlink {
        return Err((RejectReason::Changed, "the file changed between listing and opening".into()));
    }
    Ok(File::from(fd))
}

// --------------------------------------------------------------- snapshot

/// The output dir's entries before the run, and the input's digest.
pub struct Before {
    output: BTreeMap<String, Meta>,
    /// Every entry of any kind, by raw path: what "there before and left
    /// alone" is judged against.
    entries: HashMap<Vec<u8>, Meta>,
    input: Option<(PathBuf, TreeDigest)>,
}

impl Before {
    /// Snapshot the output dir (names and metadata only: an empty dir costs
    /// one open and one getdents) and digest the input dir.
    pub fn take(output: &Path, input: Option<&Path>, rules: &ArtifactRules) -> Result<Before, ArtifactsError> {
        let root = open_root(output).map_err(|source| ArtifactsError::OpenOutput { path: output.into(), source })?;
        let mut before = Before { output: BTreeMap::new(), entries: HashMap::new(), input: None };
        before.retake_output_at(&root, rules);
        before.input = match input {
            Some(dir) => Some((
                dir.to_path_buf(),
                digest_tree(dir, rules.input_hash_max_bytes)
                    .map_err(|source| ArtifactsError::DigestInput { path: dir.into(), source })?,
            )),
            None => None,
        };
        Ok(before)
    }

    /// Snapshot the output dir again, from a descriptor: the jail's output
    /// tmpfs once the host folder was copied into it, before the script
    /// runs, so that changes are judged where the script made them.
    pub(crate) fn retake_output_at(&mut self, root: &OwnedFd, rules: &ArtifactRules) {
        let listing = walk(root, rules);
        self.output = listing.files.into_iter().map(|f| (f.rel, f.meta)).collect();
        self.entries = listing.metas;
    }

    /// The output dir beneath `root` as it is now (a session's cell
    /// starts from it, session/cell_files.rs): names and metadata only.
    pub(crate) fn output_at(root: &OwnedFd, rules: &ArtifactRules) -> Before {
        let mut before = Before::empty();
        before.retake_output_at(root, rules);
        before
    }

    /// An empty output dir, no input.
    pub(crate) fn empty() -> Before {
        Before { output: BTreeMap::new(), entries: HashMap::new(), input: None }
    }

    /// Whether the output dir beneath `root` is still as this snapshot saw
    /// it: the same entries, each the same by its metadata. No content is
    /// read.
    pub(crate) fn unchanged_at(&self, root: &OwnedFd, rules: &ArtifactRules) -> bool {
        let now = walk(root, rules).metas;
        now.len() == self.entries.len()
            && now.iter().all(|(k, m)| self.entries.get(k).is_some_and(|b| b.kind() == m.kind() && b.same_file(m)))
    }

    fn change_of(&self, rel: &str, now: &Meta) -> Change {
        match self.output.get(rel) {
            None => Change::Created,
            Some(before) if before.same_file(now) => Change::Unchanged,
            Some(_) => Change::Modified,
        }
    }

    /// Whether a refused entry was there before the run, untouched since.
    pub(crate) fn left_alone(&self, r: &Refused) -> bool {
        match (self.entries.get(&r.raw_rel()), r.meta) {
            (Some(before), Some(now)) => before.kind() == now.kind() && before.same_file(&now),
            _ => false,
        }
    }
}

// ---------------------------------------------------------------- collect

/// One accepted file the host is to receive.
#[derive(Debug, Clone)]
pub(crate) struct Accepted {
    pub rel: String,
    pub ino: u64,
    pub ctime_ns: i128,
    pub size: u64,
    /// Its CSV/TSV delimiter, when its formula cells are to be neutralised.
    pub neutralise: Option<u8>,
}

/// The artifact fields of the result, and what the host is to receive.
pub struct Collected {
    pub artifacts: Vec<Artifact>,
    pub rejected: Vec<RejectedArtifact>,
    pub input: Option<InputReport>,
    /// Every accepted file that is not `deleted`.
    pub(crate) accepted: Vec<Accepted>,
    /// Every refused entry, listed or not.
    pub(crate) refused: Vec<Refused>,
}

impl Collected {
    /// The host did not receive an accepted file after all (the copy ran out
    /// of room or time): it leaves `artifacts` for `rejected_artifacts`.
    pub(crate) fn withdraw(&mut self, rel: &str, reason: RejectReason, detail: String) {
        self.artifacts.retain(|a| a.path != rel);
        self.accepted.retain(|a| a.rel != rel);
        self.rejected.push(RejectedArtifact {
            path: rel.to_string(),
            reason,
            detail,
            disposition: Disposition::NotDelivered,
            moved_to: None,
        });
    }

    /// The host received `rel` as the script wrote it, though its formula
    /// cells were to be neutralised (`past_budget: "flag"`): flagged.
    pub(crate) fn record_as_written(&mut self, rel: &str, why: &str) {
        if let Some(a) = self.artifacts.iter_mut().find(|a| a.path == rel) {
            a.flags.push(budget::incomplete(why.to_string()));
        }
    }

    /// The host received a neutralised copy of `rel`.
    pub(crate) fn record_neutralised(&mut self, rel: &str, w: &neutralise::Written) {
        if let Some(a) = self.artifacts.iter_mut().find(|a| a.path == rel) {
            a.neutralised = Some(Neutralised {
                cells: w.cells,
                original_bytes: a.bytes,
                original_sha256: a.sha256.clone().unwrap_or_default(),
            });
            a.bytes = w.bytes;
            a.sha256 = Some(w.sha256.clone());
        }
    }
}

/// Judge the output dir and re-digest the input, now that the tree is dead,
/// within the run's judging budget `spend`.
pub fn collect(output: &Path, before: &Before, rules: &ArtifactRules, spend: budget::Spend, dead: TreeDead) -> Collected {
    match open_root(output) {
        Ok(root) => collect_at(&root, before, rules, spend, dead),
        Err(e) => Collected {
            input: input_now(before, rules),
            ..unreadable_output(&format!("cannot open the output dir: {e}"))
        },
    }
}

/// The verdict when the output dir cannot be read at all: nothing is
/// accepted, and the one refusal says why (no input report).
pub(crate) fn unreadable_output(why: &str) -> Collected {
    let rejected = vec![RejectedArtifact {
        path: ".".into(),
        reason: RejectReason::Unreadable,
        detail: why.to_string(),
        disposition: Disposition::NotDelivered,
        moved_to: None,
    }];
    Collected { artifacts: vec![], rejected, input: None, accepted: vec![], refused: vec![] }
}

/// [`collect`] beneath a descriptor of the output dir (the host folder, or
/// the jail's output tmpfs).
pub(crate) fn collect_at(
    root: &OwnedFd,
    before: &Before,
    rules: &ArtifactRules,
    spend: budget::Spend,
    dead: TreeDead,
) -> Collected {
    let mut collected = judge_at(root, before, rules, spend, dead.into(), Scope::Whole);
    collected.input = input_now(before, rules);
    collected
}

/// The input's report: re-digested now, against its digest from before
/// the run (what the script could not change, by the caller's rights).
pub(crate) fn input_now(before: &Before, rules: &ArtifactRules) -> Option<InputReport> {
    before.input.as_ref().map(|(dir, was)| input_report(dir, was, rules))
}

/// What [`judge_at`] judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The whole output dir, for delivery: the end of a run or a session.
    Whole,
    /// Only what changed since `before` (a session's cell: the files it
    /// made, changed or deleted, session/cell_files.rs): a file the same as
    /// before is not read, a refused entry there before and left alone is
    /// not listed, and nothing is to be delivered (`accepted` and `refused`
    /// are empty).
    Changes,
}

/// The output half of [`collect_at`]: its verdict, with no input report.
/// Every read of a file's content is charged to `spend`; past it, with
/// `past_budget: "refuse"`, what was not judged in full is refused.
pub(crate) fn judge_at(
    root: &OwnedFd,
    before: &Before,
    rules: &ArtifactRules,
    spend: budget::Spend,
    _still: TreeStill<'_>,
    scope: Scope,
) -> Collected {
    let mut c = judge(root, before, rules, spend, scope == Scope::Changes);
    if scope == Scope::Changes {
        let alone: HashSet<usize> = c.refused.iter().filter(|r| before.left_alone(r)).filter_map(|r| r.listed).collect();
        let rejected = std::mem::take(&mut c.rejected);
        c.rejected = rejected.into_iter().enumerate().filter(|(i, _)| !alone.contains(i)).map(|(_, r)| r).collect();
        c.accepted.clear();
        c.refused.clear();
    }
    c
}

fn judge(root: &OwnedFd, before: &Before, rules: &ArtifactRules, spend: budget::Spend, changes_only: bool) -> Collected {
    let input = None;
    let listing = walk(root, rules);
    // The summarisers' time budget for this whole collection starts now.
    let clock = budget::Clock::start(spend);
    let mut rejected = listing.rejected;
    let mut artifacts = Vec::new();
    let mut accepted_files = Vec::new();
    let (mut accepted, mut total) = (0u64, 0u64);
    for f in &listing.files {
        if changes_only && before.change_of(&f.rel, &f.meta) == Change::Unchanged {
            continue;
        }
        if let Some((reason, why)) = file_refusal(f, rules) {
            rejected.add_file(f, reason, why);
            continue;
        }
        if accepted >= rules.max_files {
            rejected.add_file(f, RejectReason::TooManyFiles, format!("over artifacts.max_files ({})", rules.max_files));
            continue;
        }
        if total + f.meta.size > rules.max_total_bytes {
            rejected.add_file(
                f,
                RejectReason::TotalTooLarge,
                format!("accepting it would pass artifacts.max_total_bytes ({})", rules.max_total_bytes),
            );
            continue;
        }
        if rules.past_budget == PastBudget::Refuse && spend.out() {
            rejected.add_file(f, RejectReason::NotJudged, spend.why("never read"));
            continue;
        }
        match accept(root, f, before, &clock, rules.past_budget) {
            Ok((artifact, delim)) => {
                let formula = artifact.flags.iter().any(|fl| fl.kind == FlagKind::FormulaInjection);
                let changed = artifact.change != Change::Unchanged;
                let neutralise = match (rules.formula_cells, formula && changed, delim) {
                    (FormulaCells::Neutralise, true, Some(d)) => Some(d),
                    (FormulaCells::Neutralise, true, None) => {
                        // XLSX: not rewritten, so not delivered (neutralise.rs).
                        rejected.add_file(
                            f,
                            RejectReason::FormulaCells,
                            "a spreadsheet with formula cells, which the jail does not rewrite; \
                             set artifacts.formula_cells to \"flag\" to receive it as it is",
                        );
                        continue;
                    }
                    _ => None,
                };
                accepted += 1;
                total += artifact.bytes;
                accepted_files.push(Accepted {
                    rel: f.rel.clone(),
                    ino: f.meta.ino,
                    ctime_ns: f.meta.ctime_ns,
                    size: f.meta.size,
                    neutralise,
                });
                artifacts.push(artifact);
            }
            Err((reason, why)) => rejected.add_file(f, reason, why),
        }
    }
    // Deleted: there before, not seen now, in a folder that was listed whole.
    for (rel, meta) in &before.output {
        let parent = rel.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        if !listing.seen.contains(rel) && listing.walked.contains(parent) {
            artifacts.push(Artifact {
                path: rel.clone(),
                bytes: meta.size,
                sha256: None,
                media_type: None,
                change: Change::Deleted,
                flags: vec![],
                summary: None,
                neutralised: None,
            });
        }
    }
    let (rejected, refused) = rejected.into_list();
    artifacts.sort_by(|a, b| a.path.cmp(&b.path));
    Collected { artifacts, rejected, input, accepted: accepted_files, refused }
}

/// Open, read and describe one file that passed the rules.
fn accept(
    root: &OwnedFd,
    f: &FileEntry,
    before: &Before,
    clock: &budget::Clock,
    past: PastBudget,
) -> Result<(Artifact, Option<u8>), (RejectReason, String)> {
    let mut file = open_listed(root, f)?;
    let ext = extension(f.rel.rsplit('/').next().unwrap_or(&f.rel));
    let seen = inspect::inspect(&mut file, f.meta.size, &ext, clock.file(), past).map_err(|e| match e {
        inspect::Unjudged::Read(e) => (RejectReason::Unreadable, format!("read: {e}")),
        inspect::Unjudged::OverBudget { read } => {
            (RejectReason::NotJudged, clock.spend().why(&format!("judged {read} of its {} bytes", f.meta.size)))
        }
    })?;
    let artifact = Artifact {
        path: f.rel.clone(),
        bytes: seen.bytes,
        sha256: Some(seen.sha256),
        media_type: Some(seen.media_type),
        change: before.change_of(&f.rel, &f.meta),
        flags: seen.flags,
        summary: seen.summary,
        neutralised: None,
    };
    Ok((artifact, seen.csv_delimiter))
}

// ------------------------------------------------------------------ input

/// A digest of a whole folder tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TreeDigest {
    pub sha256: String,
    pub files: u64,
    pub bytes: u64,
    pub content_hashed: bool,
    pub complete: bool,
}

fn input_report(dir: &Path, was: &TreeDigest, rules: &ArtifactRules) -> InputReport {
    let now = digest_tree(dir, rules.input_hash_max_bytes).ok();
    let after = now.as_ref().map(|d| d.sha256.clone()).unwrap_or_default();
    InputReport {
        unchanged: now.as_ref().is_some_and(|d| d.sha256 == was.sha256),
        sha256_before: was.sha256.clone(),
        sha256_after: after,
        files: was.files,
        bytes: was.bytes,
        content_hashed: was.content_hashed,
        complete: was.complete,
    }
}

struct Record {
    rel: Vec<u8>,
    meta: Option<Meta>,
    link: Vec<u8>,
    /// The errno that kept this entry (or folder) from being read; it is
    /// part of the digest, so a change to it shows too.
    error: Option<i32>,
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Digest a tree without following links: every entry's path, type and mode,
/// and each regular file's content — or, when the files add up to more than
/// `content_budget` bytes, their size, mtime, ctime and inode instead (ctime
/// cannot be set back by anyone, so a change is still seen).
pub(crate) fn digest_tree(dir: &Path, content_budget: u64) -> io::Result<TreeDigest> {
    let root = open_root(dir)?;
    let mut records = Vec::new();
    let mut complete = true;
    let mut queue: VecDeque<(Vec<u8>, u32)> = VecDeque::from([(Vec::new(), 0)]);
    'walk: while let Some((rel, depth)) = queue.pop_front() {
        let path = if rel.is_empty() { Path::new(".") } else { bytes_path(&rel) };
        let listed = sys::openat2(Some(root.as_fd()), path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, RESOLVE)
            .and_then(|fd| Ok((read_names(&fd, INPUT_MAX_ENTRIES + 1)?, fd)));
        let (names, fd) = match listed {
            Ok(x) => x,
            Err(e) if rel.is_empty() => return Err(e),
            Err(e) => {
                records.push(Record {
                    rel: [rel.as_slice(), b"/"].concat(),
                    meta: None,
                    link: vec![],
                    error: Some(errno_of(&e)),
                });
                continue;
            }
        };
        for name in names {
            if records.len() as u64 >= INPUT_MAX_ENTRIES {
                complete = false;
                break 'walk;
            }
            let mut child = rel.clone();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(&name);
            let st = match nix::sys::stat::fstatat(Some(fd.as_raw_fd()), name.as_slice(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => Meta::of(&st),
                Err(e) => {
                    records.push(Record { rel: child, meta: None, link: vec![], error: Some(e as i32) });
                    continue;
                }
            };
            let (link, error) = if st.kind() == libc::S_IFLNK {
                match nix::fcntl::readlinkat(Some(fd.as_raw_fd()), name.as_slice()) {
                    Ok(target) => (target.into_encoded_bytes(), None),
                    Err(e) => (vec![], Some(e as i32)),
                }
            } else {
                (Vec::new(), None)
            };
            if st.kind() == libc::S_IFDIR {
                if depth + 1 < INPUT_MAX_DEPTH {
                    queue.push_back((child.clone(), depth + 1));
                } else {
                    complete = false;
                }
            }
            records.push(Record { rel: child, meta: Some(st), link, error });
        }
    }
    records.sort_by(|a, b| a.rel.cmp(&b.rel));
    let sizes = records.iter().filter_map(|r| r.meta).filter(|m| m.kind() == libc::S_IFREG);
    let (count, bytes) = sizes.fold((0u64, 0u64), |(n, b), m| (n + 1, b + m.size));
    let content_hashed = bytes <= content_budget;
    let mut h = Hasher::new();
    h.update(if content_hashed {
        b"jail-tree-v1 content\n"
    } else {
        b"jail-tree-v1 metadata\n"
    });
    for r in &records {
        h.update(&(r.rel.len() as u64).to_le_bytes());
        h.update(&r.rel);
        if let Some(errno) = r.error {
            h.update(format!("error {errno}").as_bytes());
        }
        let Some(meta) = r.meta else { continue };
        h.update(&meta.mode.to_le_bytes());
        match meta.kind() {
            libc::S_IFREG if content_hashed => {
                let digest = file_digest(&root, &r.rel, meta.size);
                h.update(digest.as_bytes());
            }
            libc::S_IFREG => {
                for n in [meta.size as i128, meta.mtime_ns, meta.ctime_ns, meta.ino as i128] {
                    h.update(&n.to_le_bytes());
                }
            }
            libc::S_IFLNK => {
                h.update(&(r.link.len() as u64).to_le_bytes());
                h.update(&r.link);
            }
            _ => {}
        }
    }
    Ok(TreeDigest { sha256: h.finish_hex(), files: count, bytes, content_hashed, complete })
}

/// sha256 of one file beneath `root`, or a marker naming why it could not be
/// read (so an unreadable file still counts, and a change to it shows).
fn file_digest(root: &OwnedFd, rel: &[u8], size: u64) -> String {
    let path = bytes_path(rel);
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let file = match sys::openat2(Some(root.as_fd()), path, flags, RESOLVE) {
        Ok(fd) => File::from(fd),
        Err(e) => return format!("unreadable:{}", e.raw_os_error().unwrap_or(0)),
    };
    let mut h = Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut reader = file.take(size);
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return format!("unreadable:{}", e.raw_os_error().unwrap_or(0)),
        }
    }
    h.finish_hex()
}

/// Raw path bytes as a `Path`.
fn bytes_path(bytes: &[u8]) -> &Path {
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::os::unix::fs::PermissionsExt;

    fn rules() -> ArtifactRules {
        Policy::builtin_default().unwrap().artifacts
    }

    fn reasons(c: &Collected) -> BTreeMap<String, RejectReason> {
        c.rejected.iter().map(|r| (r.path.clone(), r.reason)).collect()
    }

    #[test]
    fn names_that_could_mislead_a_reader_or_a_shell_are_refused() {
        let max = 20;
        assert_eq!(check_name(b"report.csv", max).unwrap(), "report.csv");
        assert_eq!(check_name(b".hidden", max).unwrap(), ".hidden");
        for bad in [
            &b"..x"[..],
            b"a..b",
            b"-rf",
            b"a\\b",
            b"a\x1bb",
            b"a\nb",
            b"\xff\xfe",
            "a\u{202e}b".as_bytes(),
            "zero\u{200b}w".as_bytes(),
        ] {
            assert_eq!(check_name(bad, max).unwrap_err().0, RejectReason::BadName, "{bad:?}");
        }
        assert_eq!(check_name(&[b'a'; 21], max).unwrap_err().0, RejectReason::NameTooLong);
    }

    #[test]
    fn extensions_follow_the_last_dot() {
        assert_eq!(extension("a.tar.GZ"), "gz");
        assert_eq!(extension(".bashrc"), "");
        assert_eq!(extension("noext"), "");
    }

    #[test]
    fn links_and_special_files_are_refused_without_being_opened() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("ok.txt"), "fine\n").unwrap();
        std::fs::write(p.join("a.txt"), "x").unwrap();
        std::fs::hard_link(p.join("a.txt"), p.join("b.txt")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", p.join("l.txt")).unwrap();
        std::os::unix::fs::symlink("/etc", p.join("ldir")).unwrap();
        nix::unistd::mkfifo(&p.join("f.txt"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(p.join("s.txt")).unwrap();
        std::fs::write(p.join("suid.txt"), "x").unwrap();
        std::fs::set_permissions(p.join("suid.txt"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        let root = nix::unistd::getuid().is_root();
        if root {
            let dev = nix::sys::stat::makedev(1, 3);
            nix::sys::stat::mknod(
                &p.join("null.txt"),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                dev,
            )
            .unwrap();
        }
        let before = Before::take(p, None, &rules()).unwrap();
        // A fifo opened for reading would block this test forever.
        let c = collect(p, &before, &rules(), budget::Spend::start(), TreeDead::after_reaping_pid1());
        let r = reasons(&c);
        assert_eq!(r["a.txt"], RejectReason::HardLink);
        assert_eq!(r["b.txt"], RejectReason::HardLink);
        assert_eq!(r["l.txt"], RejectReason::Symlink);
        assert_eq!(r["ldir"], RejectReason::Symlink);
        assert_eq!(r["f.txt"], RejectReason::Fifo);
        assert_eq!(r["s.txt"], RejectReason::Socket);
        assert_eq!(r["suid.txt"], RejectReason::SetId);
        if root {
            assert_eq!(r["null.txt"], RejectReason::Device);
        }
        let paths: Vec<&str> = c.artifacts.iter().map(|a| a.path.as_str()).collect();
        assert_eq!(paths, ["ok.txt"]);
        assert_eq!(c.artifacts[0].change, Change::Unchanged);
        assert_eq!(c.artifacts[0].sha256.as_deref(), Some(crate::digest::sha256_hex(b"fine\n").as_str()));
    }

    #[test]
    fn wide_deep_and_crowded_trees_are_cut_at_the_caps() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let mut r = rules();
        r.max_dir_entries = 50;
        r.max_depth = 3;
        r.max_entries = 80;
        std::fs::create_dir(p.join("wide")).unwrap();
        for i in 0..51 {
            std::fs::write(p.join(format!("wide/{i}.txt")), "").unwrap();
        }
        std::fs::create_dir_all(p.join("a/b/c/d")).unwrap();
        std::fs::write(p.join("a/b/ok.txt"), "").unwrap();
        std::fs::write(p.join("a/b/c/deep.txt"), "").unwrap();
        let c = collect(p, &Before::take(p, None, &r).unwrap(), &r, budget::Spend::start(), TreeDead::after_reaping_pid1());
        let reasons = reasons(&c);
        assert_eq!(reasons["wide"], RejectReason::TooWide);
        assert_eq!(reasons["a/b/c"], RejectReason::TooDeep);
        assert!(c.artifacts.iter().any(|a| a.path == "a/b/ok.txt"));
        assert!(!c.artifacts.iter().any(|a| a.path.starts_with("wide/")));

        std::fs::remove_dir_all(p.join("wide")).unwrap();
        for d in 0..3 {
            std::fs::create_dir(p.join(format!("m{d}"))).unwrap();
            for i in 0..40 {
                std::fs::write(p.join(format!("m{d}/{i}.txt")), "").unwrap();
            }
        }
        let c = collect(p, &Before::take(p, None, &r).unwrap(), &r, budget::Spend::start(), TreeDead::after_reaping_pid1());
        assert!(c.rejected.iter().any(|x| x.reason == RejectReason::TooManyEntries), "{:?}", c.rejected);
        assert!(c.artifacts.len() < 80);
    }

    #[test]
    fn refusals_past_the_listing_cap_are_counted_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..(MAX_REJECTED_LISTED + 7) {
            std::fs::write(dir.path().join(format!("-{i}.txt")), "").unwrap();
        }
        let c = collect(
            dir.path(),
            &Before::take(dir.path(), None, &rules()).unwrap(),
            &rules(),
            budget::Spend::start(),
            TreeDead::after_reaping_pid1(),
        );
        assert_eq!(c.rejected.len(), MAX_REJECTED_LISTED + 1);
        let last = c.rejected.last().unwrap();
        assert_eq!(last.reason, RejectReason::TooManyRejected);
        assert_eq!(last.detail, "7 more refused entries are not listed");
    }

    #[test]
    fn a_changes_verdict_lists_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for n in ["keep.txt", "edit.txt", "gone.txt", "old.exe"] {
            std::fs::write(p.join(n), "v1\n").unwrap();
        }
        let root = open_root(p).unwrap();
        let before = Before::output_at(&root, &rules());
        assert!(before.unchanged_at(&root, &rules()));
        std::fs::write(p.join("edit.txt"), "v22\n").unwrap();
        std::fs::remove_file(p.join("gone.txt")).unwrap();
        std::fs::write(p.join("new.exe"), "MZ").unwrap();
        assert!(!before.unchanged_at(&root, &rules()));
        let still = TreeStill::from(TreeDead::after_reaping_pid1());
        let c = judge_at(&root, &before, &rules(), budget::Spend::start(), still, Scope::Changes);
        let listed: Vec<(&str, Change)> = c.artifacts.iter().map(|a| (a.path.as_str(), a.change)).collect();
        assert_eq!(listed, [("edit.txt", Change::Modified), ("gone.txt", Change::Deleted)]);
        let refused: Vec<&str> = c.rejected.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(refused, ["new.exe"], "old.exe was there before, left alone");
        assert!(c.accepted.is_empty() && c.refused.is_empty(), "a cell's verdict delivers nothing");
    }

    #[test]
    fn changes_against_the_snapshot_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for n in ["keep.txt", "edit.txt", "gone.txt"] {
            std::fs::write(p.join(n), "v1\n").unwrap();
        }
        let before = Before::take(p, None, &rules()).unwrap();
        let edit = p.join("edit.txt");
        let mtime = std::fs::metadata(&edit).unwrap().modified().unwrap();
        std::fs::write(&edit, "v2\n").unwrap();
        // Same size and the old mtime put back: ctime still moves.
        std::fs::File::options().write(true).open(&edit).unwrap().set_modified(mtime).unwrap();
        std::fs::remove_file(p.join("gone.txt")).unwrap();
        std::fs::write(p.join("new.txt"), "n\n").unwrap();
        let c = collect(p, &before, &rules(), budget::Spend::start(), TreeDead::after_reaping_pid1());
        let changes: BTreeMap<&str, Change> = c.artifacts.iter().map(|a| (a.path.as_str(), a.change)).collect();
        assert_eq!(changes["keep.txt"], Change::Unchanged);
        assert_eq!(changes["edit.txt"], Change::Modified);
        assert_eq!(changes["gone.txt"], Change::Deleted);
        assert_eq!(changes["new.txt"], Change::Created);
        let gone = c.artifacts.iter().find(|a| a.path == "gone.txt").unwrap();
        assert_eq!((gone.bytes, gone.sha256.as_deref()), (3, None));
    }

    #[test]
    fn formula_files_are_planned_for_neutralising_or_refused_and_flag_mode_plans_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("x.csv"), "a\n=1\n").unwrap();
        std::fs::write(p.join("clean.csv"), "a\n1\n").unwrap();
        let empty = Before { output: BTreeMap::new(), entries: HashMap::new(), input: None };
        let c = collect(p, &empty, &rules(), budget::Spend::start(), TreeDead::after_reaping_pid1());
        let plan: Vec<(&str, Option<u8>)> = c.accepted.iter().map(|a| (a.rel.as_str(), a.neutralise)).collect();
        assert_eq!(plan, [("clean.csv", None), ("x.csv", Some(b','))]);
        // Left alone since the snapshot: delivered as it was, not rewritten.
        let before = Before::take(p, None, &rules()).unwrap();
        let c = collect(p, &before, &rules(), budget::Spend::start(), TreeDead::after_reaping_pid1());
        assert!(c.accepted.iter().all(|a| a.neutralise.is_none()));
        let mut flag = rules();
        flag.formula_cells = FormulaCells::Flag;
        let c = collect(p, &empty, &flag, budget::Spend::start(), TreeDead::after_reaping_pid1());
        assert!(c.accepted.iter().all(|a| a.neutralise.is_none()));
        assert_eq!(c.artifacts.len(), 2);
    }

    #[test]
    fn refused_entries_are_remembered_past_the_listing_cap_and_told_from_what_was_there_before() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::os::unix::fs::symlink("/etc/passwd", p.join("old.txt")).unwrap();
        let before = Before::take(p, None, &rules()).unwrap();
        for i in 0..(MAX_REJECTED_LISTED + 5) {
            std::os::unix::fs::symlink("/etc/passwd", p.join(format!("l{i:03}.txt"))).unwrap();
        }
        let c = collect(p, &before, &rules(), budget::Spend::start(), TreeDead::after_reaping_pid1());
        assert_eq!(c.refused.len(), MAX_REJECTED_LISTED + 6);
        let alone: Vec<Vec<u8>> = c.refused.iter().filter(|r| before.left_alone(r)).map(Refused::raw_rel).collect();
        assert_eq!(alone, [b"old.txt".to_vec()]);
    }

    #[test]
    fn what_the_walk_never_reached_is_refused_not_judged() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let mut r = rules();
        r.max_entries = 5;
        for d in ["a", "b"] {
            std::fs::create_dir(p.join(d)).unwrap();
            for i in 0..4 {
                std::fs::write(p.join(format!("{d}/{i}.txt")), "x").unwrap();
            }
        }
        let empty = Before { output: BTreeMap::new(), entries: HashMap::new(), input: None };
        let c = collect(p, &empty, &r, budget::Spend::start(), TreeDead::after_reaping_pid1());
        let not_judged: Vec<Vec<u8>> = c.refused.iter().map(Refused::raw_rel).collect();
        // a, b and a/0..2 were looked at (5 entries); a/3 and all of b were not.
        assert_eq!(not_judged, [b"a/3.txt".to_vec(), b"b".to_vec()]);
        let accepted: Vec<&str> = c.accepted.iter().map(|a| a.rel.as_str()).collect();
        assert_eq!(accepted, ["a/0.txt", "a/1.txt", "a/2.txt"]);
    }

    #[test]
    fn an_unreadable_input_subfolder_is_digested_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("locked");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("f.txt"), "x").unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o000)).unwrap();
        let locked = digest_tree(dir.path(), 1 << 20);
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = digest_tree(dir.path(), 1 << 20).unwrap();
        let locked = locked.unwrap();
        if !nix::unistd::getuid().is_root() {
            assert_ne!(locked.sha256, open.sha256);
        }
    }

    #[test]
    fn input_digest_follows_content_and_falls_back_to_metadata_over_budget() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::fs::write(p.join("sub/data.csv"), "a,b\n1,2\n").unwrap();
        std::os::unix::fs::symlink("data.csv", p.join("sub/link")).unwrap();
        let first = digest_tree(p, 1 << 20).unwrap();
        assert!(first.content_hashed && first.complete);
        assert_eq!((first.files, first.bytes), (1, 8));
        // Rewriting the same bytes is no change to a content digest...
        std::fs::write(p.join("sub/data.csv"), "a,b\n1,2\n").unwrap();
        assert_eq!(digest_tree(p, 1 << 20).unwrap().sha256, first.sha256);
        // ...one changed byte is.
        std::fs::write(p.join("sub/data.csv"), "a,b\n1,3\n").unwrap();
        let changed = digest_tree(p, 1 << 20).unwrap();
        assert_ne!(changed.sha256, first.sha256);
        // So is a link pointed elsewhere.
        std::fs::remove_file(p.join("sub/link")).unwrap();
        std::os::unix::fs::symlink("other.csv", p.join("sub/link")).unwrap();
        assert_ne!(digest_tree(p, 1 << 20).unwrap().sha256, changed.sha256);
        // Over the budget only metadata is hashed, and a rewrite still shows.
        let meta = digest_tree(p, 4).unwrap();
        assert!(!meta.content_hashed);
        std::fs::write(p.join("sub/data.csv"), "a,b\n1,3\n").unwrap();
        assert_ne!(digest_tree(p, 4).unwrap().sha256, meta.sha256);
    }
}
