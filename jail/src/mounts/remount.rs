//! The apply side's fallback for kernels without `mount_setattr` (before
//! 5.12; Debian 11's 5.10): the same per-mount flags, set with the old
//! `mount(MS_BIND | MS_REMOUNT)` on every mount of a tree after it is
//! attached, then checked from `/proc/self/mountinfo`.
//!
//! `mount_setattr(AT_RECURSIVE)` changes a detached tree atomically, before
//! it is visible anywhere. The old interface works one mount at a time and
//! only on an attached mount, by path: so the tree is attached first (in the
//! child's private mount namespace, before anything untrusted runs), each of
//! its mounts is remounted, and the result is read back. A mount that does
//! not end up with every requested flag — one hidden under another mount at
//! the same path, which no path reaches — fails the setup: the fallback
//! gives the same guarantee or none.
//!
//! Remounting in a user namespace must keep the flags the more privileged
//! namespace locked (nosuid, nodev, noexec, read-only, the atime mode;
//! mount(2) EPERM otherwise), so each mount's current flags are carried over
//! and only added to.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::sys::{MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// mountinfo of the child's own namespace: a few hundred lines at most; a
/// bigger one is refused rather than read without bound.
const MAX_MOUNTINFO: u64 = 4 << 20;

/// One line of `/proc/self/mountinfo` (proc(5)), the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MountInfo {
    pub id: u64,
    pub parent: u64,
    pub mount_point: PathBuf,
    /// The per-mount options (field 6): `ro`/`rw`, `nosuid`, `nodev`,
    /// `noexec`, the atime mode.
    pub options: Vec<String>,
}

/// Parse mountinfo; `None` for a line that does not have the fields.
pub(super) fn parse_mountinfo(text: &str) -> Option<Vec<MountInfo>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let mut f = line.split(' ');
            let id = f.next()?.parse().ok()?;
            let parent = f.next()?.parse().ok()?;
            let _dev = f.next()?;
            let _root = f.next()?;
            let mount_point = PathBuf::from(unescape(f.next()?));
            let options = f.next()?.split(',').map(str::to_owned).collect();
            Some(MountInfo { id, parent, mount_point, options })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    std::ffi::OsString::from_vec(out).to_string_lossy().into_owned()
}

/// The mount attached last at `at` (the one no other mount at `at` sits
/// on) and every mount beneath it, parents before children.
pub(super) fn subtree(mounts: &[MountInfo], at: &Path) -> Vec<MountInfo> {
    let here: Vec<&MountInfo> = mounts.iter().filter(|m| m.mount_point == at).collect();
    let Some(top) = here.iter().find(|m| !here.iter().any(|o| o.parent == m.id)) else {
        return Vec::new();
    };
    let mut out = vec![(*top).clone()];
    let mut i = 0;
    while i < out.len() {
        let id = out[i].id;
        out.extend(mounts.iter().filter(|m| m.parent == id && m.id != id).cloned());
        i += 1;
    }
    out
}

/// The flags for `mount(MS_BIND | MS_REMOUNT)` that add `attrs` to a mount
/// whose options are `options`, keeping what it has (locked flags included).
pub(super) fn remount_flags(options: &[String], attrs: u64) -> MsFlags {
    let has = |o: &str| options.iter().any(|x| x == o);
    let mut f = MsFlags::MS_BIND | MsFlags::MS_REMOUNT;
    if has("ro") || attrs & MOUNT_ATTR_RDONLY != 0 {
        f |= MsFlags::MS_RDONLY;
    }
    if has("nosuid") || attrs & MOUNT_ATTR_NOSUID != 0 {
        f |= MsFlags::MS_NOSUID;
    }
    if has("nodev") || attrs & MOUNT_ATTR_NODEV != 0 {
        f |= MsFlags::MS_NODEV;
    }
    if has("noexec") || attrs & MOUNT_ATTR_NOEXEC != 0 {
        f |= MsFlags::MS_NOEXEC;
    }
    // The atime mode must stay exactly as it is (it may be locked).
    if has("noatime") {
        f |= MsFlags::MS_NOATIME;
    } else if has("relatime") {
        f |= MsFlags::MS_RELATIME;
    } else {
        f |= MsFlags::MS_STRICTATIME;
    }
    if has("nodiratime") {
        f |= MsFlags::MS_NODIRATIME;
    }
    f
}

/// The requested flags a mount lacks, as mountinfo spells them.
pub(super) fn missing(options: &[String], attrs: u64) -> Vec<&'static str> {
    let has = |o: &str| options.iter().any(|x| x == o);
    [
        (MOUNT_ATTR_RDONLY, "ro"),
        (MOUNT_ATTR_NOSUID, "nosuid"),
        (MOUNT_ATTR_NODEV, "nodev"),
        (MOUNT_ATTR_NOEXEC, "noexec"),
    ]
    .into_iter()
    .filter(|(bit, name)| attrs & bit != 0 && !has(name))
    .map(|(_, name)| name)
    .collect()
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RemountError {
    #[error("read /proc/self/mountinfo")]
    ReadMountinfo(#[source] io::Error),
    #[error("/proc/self/mountinfo is malformed or over {MAX_MOUNTINFO} bytes")]
    BadMountinfo,
    #[error("no mount at {0} in /proc/self/mountinfo")]
    NotMounted(PathBuf),
    #[error("mount(MS_BIND | MS_REMOUNT, {flags:?} -> {target})")]
    Remount {
        target: PathBuf,
        flags: MsFlags,
        source: nix::Error,
    },
    #[error(
        "mount {id} at {target} still lacks {missing} after remounting (hidden under another mount?): refusing to run with less"
    )]
    StillLacks { id: u64, target: PathBuf, missing: String },
}

fn read_mountinfo() -> Result<Vec<MountInfo>, RemountError> {
    let file = std::fs::File::open("/proc/self/mountinfo").map_err(RemountError::ReadMountinfo)?;
    let mut text = String::new();
    file.take(MAX_MOUNTINFO + 1).read_to_string(&mut text).map_err(RemountError::ReadMountinfo)?;
    if text.len() as u64 > MAX_MOUNTINFO {
        return Err(RemountError::BadMountinfo);
    }
    parse_mountinfo(&text).ok_or(RemountError::BadMountinfo)
}

/// Give the mount at `at` and every mount beneath it the flags `attrs`, then
/// check from mountinfo that each has them (fail closed).
pub(super) fn restrict_tree(at: &Path, attrs: u64) -> Result<(), RemountError> {
    let tree = subtree(&read_mountinfo()?, at);
    if tree.is_empty() {
        return Err(RemountError::NotMounted(at.to_path_buf()));
    }
    for m in &tree {
        let flags = remount_flags(&m.options, attrs);
        nix::mount::mount(None::<&str>, &m.mount_point, None::<&str>, flags, None::<&str>)
            .map_err(|source| RemountError::Remount { target: m.mount_point.clone(), flags, source })?;
    }
    let now = read_mountinfo()?;
    for m in &tree {
        let options = now.iter().find(|n| n.id == m.id).map(|n| n.options.as_slice()).unwrap_or(&[]);
        let lacks = missing(options, attrs);
        if !lacks.is_empty() {
            return Err(RemountError::StillLacks { id: m.id, target: m.mount_point.clone(), missing: lacks.join(",") });
        }
    }
    Ok(())
}

/// Only the one mount at `at` (the non-recursive `mount_setattr_path`).
pub(super) fn restrict_one(at: &Path, attrs: u64) -> Result<(), RemountError> {
    let tree = subtree(&read_mountinfo()?, at);
    let Some(top) = tree.first() else {
        return Err(RemountError::NotMounted(at.to_path_buf()));
    };
    let flags = remount_flags(&top.options, attrs);
    nix::mount::mount(None::<&str>, at, None::<&str>, flags, None::<&str>).map_err(|source| RemountError::Remount {
        target: at.to_path_buf(),
        flags,
        source,
    })?;
    let now = read_mountinfo()?;
    let options = now.iter().find(|n| n.id == top.id).map(|n| n.options.as_slice()).unwrap_or(&[]);
    let lacks = missing(options, attrs);
    if lacks.is_empty() {
        Ok(())
    } else {
        Err(RemountError::StillLacks { id: top.id, target: at.to_path_buf(), missing: lacks.join(",") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:40 / /tmp/st rw,nosuid,nodev shared:2 - tmpfs tmpfs rw,size=1024k
31 30 8:1 /srv/in /tmp/st/workspace/input rw,nosuid,nodev,noexec,noatime - ext4 /dev/sda1 rw
32 31 8:2 / /tmp/st/workspace/input/sub\\040dir rw,relatime - ext4 /dev/sda2 rw
33 30 0:41 / /tmp/st/usr ro,nosuid,nodev,relatime - ext4 /dev/sda1 rw
34 31 0:42 / /tmp/st/workspace/input rw,relatime - tmpfs tmpfs rw
";

    fn opts(s: &str) -> Vec<String> {
        s.split(',').map(str::to_owned).collect()
    }

    #[test]
    fn mountinfo_lines_are_parsed_with_escapes_undone() {
        let m = parse_mountinfo(INFO).unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(
            m[3],
            MountInfo {
                id: 32,
                parent: 31,
                mount_point: PathBuf::from("/tmp/st/workspace/input/sub dir"),
                options: opts("rw,relatime")
            }
        );
        assert!(parse_mountinfo("22 1 0:21 /").is_none());
    }

    #[test]
    fn the_subtree_starts_at_the_topmost_mount_and_takes_every_descendant() {
        let m = parse_mountinfo(INFO).unwrap();
        // 34 is stacked on 31 at the same path: it is what the path reaches.
        let ids: Vec<u64> = subtree(&m, Path::new("/tmp/st/workspace/input")).iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![34]);
        let ids: Vec<u64> = subtree(&m, Path::new("/tmp/st")).iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![30, 31, 33, 32, 34]);
        assert!(subtree(&m, Path::new("/nowhere")).is_empty());
    }

    #[test]
    fn remount_flags_add_the_request_and_keep_what_may_be_locked() {
        let f = remount_flags(&opts("rw,noexec,noatime"), MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        assert_eq!(
            f,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_NOATIME
        );
        // No atime option shown: strictatime, kept as it is.
        let f = remount_flags(&opts("ro"), MOUNT_ATTR_NOSUID);
        assert_eq!(f, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME);
        // A writable bind stays writable.
        assert!(!remount_flags(&opts("rw,relatime"), MOUNT_ATTR_NOSUID).contains(MsFlags::MS_RDONLY));
    }

    #[test]
    fn a_mount_lacking_a_requested_flag_is_named() {
        let all = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        assert_eq!(missing(&opts("rw,nosuid,relatime"), all), vec!["ro", "nodev"]);
        assert!(missing(&opts("ro,nosuid,nodev,relatime"), all).is_empty());
    }
}
