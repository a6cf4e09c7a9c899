//! What the host receives: the artifact check's verdict on the output dir,
//! then exactly what passed it, in the host output folder.
//!
//! Supervisor side, once the whole tree is dead (a [`TreeDead`] is asked
//! for). Two shapes, after `filesystem.output_size`:
//!
//! - **Mirrored** (a size cap, the default): the verdict is taken on the
//!   jail's own output tmpfs, where the script made its files (so hard
//!   links, set-id bits, fifos and sockets are seen as they are), and only
//!   accepted files are copied to the host (`output::copy_out`: counted in
//!   bytes, sparse files kept sparse, within the deadline, each through an
//!   unnamed file). Refused entries never leave the tmpfs, which goes with
//!   the jail.
//! - **Bound** (`"unlimited"`): the script wrote the host folder itself, so
//!   the verdict is taken there, and every refused entry the script made or
//!   changed is moved out of the folder into a quarantine folder beside it
//!   (one rename each: bounded, and nothing is lost), named in the result.
//!   Where no quarantine folder can be made, refused entries are deleted,
//!   and the result says so per entry.
//!
//! Either way, a CSV/TSV with formula cells reaches the host neutralised
//! (unless `formula_cells` is `flag`), and what was there before the run
//! and left alone by the script stays as it was.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::artifacts::budget::Spend;
use crate::artifacts::{self, neutralise, ArtifactRules, Before, Collected, PastBudget, Refused, Scope, TreeDead};
use crate::fsid::{Acting, As};
use crate::output::{self, FsIds, Inventory, Partial};
use crate::result::{Disposition, OutputSync, RejectReason, RejectedArtifact};
use crate::sys;

/// Where the script's output dir is, for the delivery.
pub(crate) enum OutputDir<'a> {
    /// The jail's output tmpfs (a descriptor the child handed over), to be
    /// mirrored into the host folder within `limit` bytes.
    Mirrored {
        tmpfs: &'a OwnedFd,
        inventory: &'a Inventory,
        limit: u64,
    },
    /// The host folder itself, bound writable into the jail.
    Bound,
}

/// What was delivered.
pub(crate) struct Delivery {
    pub collected: Collected,
    pub output_sync: Option<OutputSync>,
    pub quarantine_dir: Option<PathBuf>,
    /// When the verdict was in (the copy or the quarantine followed).
    pub judged_at: Instant,
    /// The supervisor CPU the judging, neutralising and copying cost.
    pub judging_cpu: Duration,
}

/// Judge the output dir and deliver what passed into the host folder
/// `host`. The copy ends by `run_deadline` (the run's wall deadline), or
/// [`output::COPY_GRACE`] after the verdict when the script used all of
/// it, so what a script wrote before a timeout, or what took long to
/// judge, still reaches the host; `ids` are the sandbox's host ids, which
/// every write into the host folder is made as.
pub(crate) fn deliver(
    host: &Path,
    dir: OutputDir<'_>,
    before: &Before,
    rules: &ArtifactRules,
    ids: FsIds,
    run_deadline: Instant,
    dead: TreeDead,
) -> Delivery {
    // From the verdict, not from before it: a grace taken before the
    // judging was spent by the judging itself, and an accepted file then
    // met a deadline already passed (issue 32).
    let copy_deadline = |judged_at: Instant| run_deadline.max(judged_at + output::COPY_GRACE);
    // Everything the supervisor now does to what the script left is
    // charged to one budget of its own CPU (budget.rs).
    let spend = Spend::start();
    let delivery = match dir {
        OutputDir::Mirrored { tmpfs, inventory, limit } => {
            let mut collected = judge_as_sandbox(tmpfs, before, rules, ids, spend, dead);
            let judged_at = Instant::now();
            let deadline = copy_deadline(judged_at);
            let wanted: BTreeMap<PathBuf, output::Wanted> = collected
                .accepted
                .iter()
                .map(|a| {
                    (
                        PathBuf::from(&a.rel),
                        output::Wanted { ino: a.ino, ctime_ns: a.ctime_ns, size: a.size, neutralise: a.neutralise },
                    )
                })
                .collect();
            let bounds = output::Bounds { limit, deadline, spend, past: rules.past_budget };
            let copy = output::copy_out(tmpfs, host, inventory, ids, &wanted, bounds);
            settle(&mut collected, &copy.delivered);
            mark_left_alone(&mut collected, before);
            for (path, reason, detail) in &inventory.refused {
                collected.rejected.push(RejectedArtifact {
                    path: artifacts::escape_name(path.as_os_str().as_bytes()),
                    reason: *reason,
                    detail: detail.clone(),
                    disposition: Disposition::LeftAsBefore,
                    moved_to: None,
                });
            }
            Delivery {
                collected,
                output_sync: Some(copy.sync),
                quarantine_dir: None,
                judged_at,
                judging_cpu: Duration::ZERO,
            }
        }
        OutputDir::Bound => {
            let mut collected = artifacts::collect(host, before, rules, spend, dead);
            let judged_at = Instant::now();
            let deadline = copy_deadline(judged_at);
            let quarantine_dir = match sys::openat2(
                None,
                host,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
            ) {
                Ok(root) => bound(&root, host, &mut collected, before, rules, ids, Stop { deadline, spend }),
                Err(_) => None,
            };
            Delivery {
                collected,
                output_sync: None,
                quarantine_dir,
                judged_at,
                judging_cpu: Duration::ZERO,
            }
        }
    };
    Delivery { judging_cpu: spend.spent(), ..delivery }
}

/// When neutralising in place must stop: the copy's deadline, or the
/// run's judging budget.
#[derive(Clone, Copy)]
struct Stop {
    deadline: Instant,
    spend: Spend,
}

/// Judge the output tmpfs as the sandbox's host ids, without the
/// capabilities that override permissions: what the script made (even
/// 0600) is its owner's to read, so a root supervisor needs neither
/// CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH (a pod may drop both), and it
/// never reads as root what the script could not. Should the ids not
/// switch, nothing is judged readable: the collection is refused whole.
/// The input is re-digested as the caller, who digested it before.
fn judge_as_sandbox(
    tmpfs: &OwnedFd,
    before: &Before,
    rules: &ArtifactRules,
    ids: FsIds,
    spend: Spend,
    dead: TreeDead,
) -> Collected {
    let judged = Acting::begin(ids)
        .map_err(io::Error::other)
        .and_then(|mut fs| fs.on(As::Jail, || Ok(artifacts::judge_at(tmpfs, before, rules, spend, dead.into(), Scope::Whole))));
    let mut collected =
        judged.unwrap_or_else(|e| artifacts::unreadable_output(&format!("act as the sandbox to judge the output: {e}")));
    collected.input = artifacts::input_now(before, rules);
    collected
}

/// Fold what the copy did into the verdict: a file the host did not
/// receive is no artifact.
fn settle(c: &mut Collected, delivered: &BTreeMap<PathBuf, output::Delivered>) {
    let accepted: Vec<String> = c.accepted.iter().map(|a| a.rel.clone()).collect();
    for rel in accepted {
        match delivered.get(Path::new(&rel)) {
            Some(output::Delivered::Copied | output::Delivered::Unchanged) => {}
            Some(output::Delivered::Neutralised(w)) => c.record_neutralised(&rel, w),
            Some(output::Delivered::AsWritten(why)) => c.record_as_written(&rel, why),
            Some(output::Delivered::Refused(reason, why)) => c.withdraw(&rel, *reason, why.clone()),
            None => c.withdraw(&rel, RejectReason::Unreadable, "not copied to the host (see output_sync)".into()),
        }
    }
}

fn mark_left_alone(c: &mut Collected, before: &Before) {
    for r in &c.refused {
        if let (Some(i), true) = (r.listed, before.left_alone(r)) {
            c.rejected[i].disposition = Disposition::LeftAsBefore;
        }
    }
}

/// Bound output dir: neutralise what is to be, then move every refused
/// entry the script made or changed out of the folder. Returns the
/// quarantine folder, when one was made.
fn bound(
    root: &OwnedFd,
    host: &Path,
    c: &mut Collected,
    before: &Before,
    rules: &ArtifactRules,
    ids: FsIds,
    stop: Stop,
) -> Option<PathBuf> {
    let mut failed: Vec<Refused> = Vec::new();
    let todo: Vec<(String, u8, u64)> =
        c.accepted.iter().filter_map(|a| a.neutralise.map(|d| (a.rel.clone(), d, a.size))).collect();
    for (rel, delim, size) in todo {
        // The neutralised copy may grow to twice the file (neutralise.rs);
        // the file itself is within max_file_bytes.
        let limit = rules.max_file_bytes.saturating_mul(2).saturating_add(1);
        match neutralise_in_place(root, &rel, delim, size, limit, ids, stop) {
            Ok(w) => c.record_neutralised(&rel, &w),
            Err(_) if stop.spend.out() && rules.past_budget == PastBudget::Flag => {
                // Left as the script wrote it, flagged, as the policy says.
                c.record_as_written(&rel, &stop.spend.why("its formula cells were not all neutralised"));
            }
            Err(why) => {
                c.withdraw(&rel, RejectReason::FormulaCells, format!("its formula cells could not be neutralised: {why}"));
                let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
                failed.push(Refused::new(dir, name.as_bytes(), c.rejected.len() - 1));
            }
        }
    }
    let mut moves: Vec<Refused> = c.refused.iter().filter(|r| !before.left_alone(r)).cloned().collect();
    moves.extend(failed);
    for r in &c.refused {
        if let (Some(i), true) = (r.listed, before.left_alone(r)) {
            c.rejected[i].disposition = Disposition::LeftAsBefore;
        }
    }
    if moves.is_empty() {
        return None;
    }
    let quarantine = make_quarantine(host);
    let mut n = 0u64;
    for r in &moves {
        n += 1;
        let outcome = match &quarantine {
            Ok((path, qfd)) => move_out(root, r, qfd, n).map(|name| (Disposition::Quarantined, Some(path.join(name)))),
            Err(e) => remove(root, r)
                .map(|()| (Disposition::Removed, None))
                .map_err(|r| format!("{r}; and no quarantine folder: {e}")),
        };
        if let Some(i) = r.listed {
            let entry = &mut c.rejected[i];
            match outcome {
                Ok((disposition, moved_to)) => {
                    entry.disposition = disposition;
                    entry.moved_to = moved_to.map(|p| p.display().to_string());
                    if disposition == Disposition::Removed {
                        if let Err(e) = &quarantine {
                            entry
                                .detail
                                .push_str(&format!("; deleted, no quarantine folder could be made beside the output dir: {e}"));
                        }
                    }
                }
                Err(why) => {
                    entry.disposition = Disposition::LeftInPlace;
                    entry.detail.push_str(&format!("; could not be moved out of the output dir: {why}"));
                }
            }
        }
    }
    quarantine.ok().map(|(p, _)| p)
}

/// A fresh folder beside the output dir, `NAME.jail-rejected-<pid>-<n>`,
/// mode 0700, owned by whoever runs `jail`.
fn make_quarantine(host: &Path) -> io::Result<(PathBuf, OwnedFd)> {
    let parent = host.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = host.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
    let parent_fd = sys::openat2(None, parent, libc::O_RDONLY | libc::O_DIRECTORY, sys::RESOLVE_NO_SYMLINKS)?;
    for n in 0..100u32 {
        let q = format!("{name}.jail-rejected-{}-{n}", std::process::id());
        match nix::sys::stat::mkdirat(Some(parent_fd.as_raw_fd()), q.as_str(), nix::sys::stat::Mode::from_bits_truncate(0o700)) {
            Ok(()) => {
                let fd = sys::openat2(
                    Some(parent_fd.as_fd()),
                    Path::new(&q),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
                )?;
                return Ok((parent.join(q), fd));
            }
            Err(nix::errno::Errno::EEXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::other("no free quarantine name"))
}

fn open_parent(root: &OwnedFd, dir: &str) -> io::Result<OwnedFd> {
    let rel = if dir.is_empty() { "." } else { dir };
    sys::openat2(
        Some(root.as_fd()),
        Path::new(rel),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
    )
}

/// Rename one refused entry into the quarantine folder as `<n>` (its own
/// name may be anything a script chose; the result maps it back).
fn move_out(root: &OwnedFd, r: &Refused, quarantine: &OwnedFd, n: u64) -> Result<String, String> {
    let parent = open_parent(root, &r.dir).map_err(|e| format!("open its folder: {e}"))?;
    let target = format!("{n:06}");
    let name = OsStr::from_bytes(&r.name);
    let rename = || nix::fcntl::renameat(Some(parent.as_raw_fd()), name, Some(quarantine.as_raw_fd()), target.as_str());
    match rename() {
        Ok(()) => Ok(target),
        // A folder the script made read-only: its owner may open it up.
        Err(nix::errno::Errno::EACCES | nix::errno::Errno::EPERM) => {
            let st = nix::sys::stat::fstat(parent.as_raw_fd()).map_err(|e| e.to_string())?;
            let _ = nix::sys::stat::fchmod(
                parent.as_raw_fd(),
                nix::sys::stat::Mode::from_bits_truncate((st.st_mode | 0o700) & 0o7777),
            );
            rename().map(|()| target).map_err(|e| format!("rename: {e}"))
        }
        Err(e) => Err(format!("rename: {e}")),
    }
}

/// Delete one refused entry (no quarantine folder could be made): a folder
/// with everything beneath it, never following a link.
fn remove(root: &OwnedFd, r: &Refused) -> Result<(), String> {
    let parent = open_parent(root, &r.dir).map_err(|e| format!("open its folder: {e}"))?;
    remove_tree(&parent, OsStr::from_bytes(&r.name), 0).map_err(|e| format!("delete: {e}"))
}

fn remove_tree(dir: &OwnedFd, name: &OsStr, depth: usize) -> io::Result<()> {
    let st = nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Ok(nix::unistd::unlinkat(Some(dir.as_raw_fd()), name, nix::unistd::UnlinkatFlags::NoRemoveDir)?);
    }
    if depth > 512 {
        return Err(io::Error::other("a folder tree deeper than 512 levels"));
    }
    let sub = sys::openat2(
        Some(dir.as_fd()),
        Path::new(name),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
    )?;
    let _ = nix::sys::stat::fchmod(sub.as_raw_fd(), nix::sys::stat::Mode::from_bits_truncate((st.st_mode | 0o700) & 0o7777));
    loop {
        let mut d = nix::dir::Dir::from(sub.try_clone()?)?;
        let batch: Vec<Vec<u8>> = d
            .iter()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .take(1024)
            .collect();
        if batch.is_empty() {
            break;
        }
        for child in batch {
            remove_tree(&sub, OsStr::from_bytes(&child), depth + 1)?;
        }
    }
    drop(sub);
    Ok(nix::unistd::unlinkat(Some(dir.as_raw_fd()), name, nix::unistd::UnlinkatFlags::RemoveDir)?)
}

/// Bound output dir: replace an accepted CSV/TSV by its neutralised copy,
/// written beside it as the sandbox's host uid (so it is owned like the
/// script's own file) and renamed over it.
fn neutralise_in_place(
    root: &OwnedFd,
    rel: &str,
    delim: u8,
    size: u64,
    limit: u64,
    ids: FsIds,
    stop: Stop,
) -> Result<neutralise::Written, String> {
    // The bound folder is the script's: the copy is made as its host ids,
    // so it is owned like the script's own file.
    let mut fs = Acting::begin(ids).map_err(|e| e.to_string())?;
    fs.on(As::Jail, || Ok(neutralise_beneath(root, rel, delim, size, limit, stop)))
        .map_err(|e| e.to_string())?
}

fn neutralise_beneath(
    root: &OwnedFd,
    rel: &str,
    delim: u8,
    size: u64,
    limit: u64,
    stop: Stop,
) -> Result<neutralise::Written, String> {
    let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let parent = open_parent(root, dir).map_err(|e| format!("open its folder: {e}"))?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let src = sys::openat2(Some(parent.as_fd()), Path::new(name), flags, sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS)
        .map(std::fs::File::from)
        .map_err(|e| format!("open: {e}"))?;
    let st = nix::sys::stat::fstat(src.as_raw_fd()).map_err(|e| format!("fstat: {e}"))?;
    let partial = Partial::create(&parent).map_err(|e| format!("create the copy: {e}"))?;
    let written = {
        let mut out = io::BufWriter::new(partial.file());
        neutralise::neutralise(&mut &src, size, delim, &mut out, limit, stop.deadline, stop.spend)
    };
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            partial.discard(&parent);
            return Err(e.to_string());
        }
    };
    let _ = nix::sys::stat::fchmod(partial.file().as_raw_fd(), nix::sys::stat::Mode::from_bits_truncate(st.st_mode & 0o777));
    partial.publish(&parent, OsStr::new(name)).map_err(|e| format!("put the copy in place: {e}"))?;
    Ok(written)
}
