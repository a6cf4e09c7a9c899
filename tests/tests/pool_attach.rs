//! `jail pool`'s claim step (jail/src/pool/attach.rs): a host folder is
//! attached read-only to a jail that is already made, from outside it.
//!
//! A stand-in jail (its own user and mount namespace, a tmpfs with an empty
//! `input` mount point, as a pooled jail has) waits; the host attaches a
//! folder at its mount point; the stand-in then reads it and must fail to
//! write it. A path with a link on it is refused. Runs as root and as an
//! ordinary user (no harness: the fork needs a single-threaded process).

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use jail::pool::attach::{attach_read_only, AttachError};
use jail::sys::{self, Forked};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};

fn main() {
    let host = tempfile::tempdir().unwrap();
    fs::write(host.path().join("data.txt"), "hello").unwrap();
    fs::create_dir(host.path().join("sub")).unwrap();
    fs::write(host.path().join("sub/deep.txt"), "deep").unwrap();
    std::os::unix::fs::symlink(host.path(), host.path().join("loop")).unwrap();
    let base = tempfile::tempdir().unwrap();
    for p in [host.path(), base.path()] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
    let (go_r, go_w) = nix::unistd::pipe().unwrap();
    let (res_r, res_w) = nix::unistd::pipe().unwrap();
    let pid = match sys::fork_process().unwrap() {
        Forked::Child => stand_in(base.path(), ready_w, go_r, res_w),
        Forked::Parent(pid) => pid,
    };
    drop((ready_w, go_r, res_w));
    assert_eq!(fs::File::from(ready_r).read(&mut [0u8; 1]).unwrap(), 1, "the stand-in jail did not get ready");
    let jail = sys::pidfd_open(pid).unwrap();
    let mount_point = base.path().join("input");

    // A link on the host path is refused, not followed.
    let via_link = host.path().join("loop");
    match attach_read_only(jail.as_fd(), &via_link, &mount_point) {
        Err(AttachError::Failed { detail, .. }) => assert!(detail.contains("no link"), "{detail}"),
        other => panic!("attach through a link: {other:?}"),
    }
    let t0 = std::time::Instant::now();
    attach_read_only(jail.as_fd(), host.path(), &mount_point).unwrap();
    eprintln!("attach took {:?}", t0.elapsed());
    // The host's own view is untouched: the mount lives in the jail only.
    assert!(!fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&mount_point.display().to_string()));

    fs::File::from(go_w).write_all(b"g").unwrap();
    let mut report = String::new();
    fs::File::from(res_r).read_to_string(&mut report).unwrap();
    let status = waitpid(pid, None).unwrap();
    assert_eq!(status, WaitStatus::Exited(pid, 0), "the stand-in jail: {report}");
    assert!(!host.path().join("new").exists(), "the write reached the host");
    println!("pool_attach: ok ({report})");
}

/// The stand-in jail: never returns.
fn stand_in(base: &Path, ready: OwnedFd, go: OwnedFd, result: OwnedFd) -> ! {
    let mut out = fs::File::from(result);
    let code = match stand_in_checks(base, ready, go) {
        Ok(text) => {
            let _ = out.write_all(text.as_bytes());
            0
        }
        Err(text) => {
            let _ = out.write_all(text.as_bytes());
            1
        }
    };
    sys::exit_now(code)
}

fn stand_in_checks(base: &Path, ready: OwnedFd, go: OwnedFd) -> Result<String, String> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare: {e}"))?;
    let w = |p: &str, s: String| fs::write(p, s).map_err(|e| format!("{p}: {e}"));
    w("/proc/self/setgroups", "deny".into())?;
    w("/proc/self/uid_map", format!("0 {uid} 1"))?;
    w("/proc/self/gid_map", format!("0 {gid} 1"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| format!("private: {e}"))?;
    mount(Some("tmpfs"), base, Some("tmpfs"), MsFlags::empty(), None::<&str>).map_err(|e| format!("tmpfs: {e}"))?;
    let input = base.join("input");
    fs::create_dir(&input).map_err(|e| format!("mkdir input: {e}"))?;
    fs::File::from(ready).write_all(b"r").map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    fs::File::from(go).read_exact(&mut byte).map_err(|e| format!("wait for the attach: {e}"))?;

    let read = fs::read_to_string(input.join("data.txt")).map_err(|e| format!("read data.txt: {e}"))?;
    let deep = fs::read_to_string(input.join("sub/deep.txt")).map_err(|e| format!("read sub/deep.txt: {e}"))?;
    if (read.as_str(), deep.as_str()) != ("hello", "deep") {
        return Err(format!("read {read:?} and {deep:?}"));
    }
    let erofs = |what: &str, r: std::io::Result<()>| match r {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => Ok(()),
        other => Err(format!("{what}: {other:?}, want EROFS")),
    };
    erofs("create a file", fs::write(input.join("new"), "x"))?;
    erofs("write data.txt", fs::write(input.join("data.txt"), "x"))?;
    erofs("write in a sub-folder", fs::write(input.join("sub/new"), "x"))?;
    erofs("mkdir", fs::create_dir(input.join("d")))?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&input.display().to_string()))
        .ok_or("no mount at the mount point")?;
    let opts = line.split(' ').nth(5).unwrap_or("");
    for flag in ["ro", "nosuid", "nodev", "noexec"] {
        if !opts.split(',').any(|o| o == flag) {
            return Err(format!("the attached mount lacks {flag}: {opts}"));
        }
    }
    Ok(format!("read ok, writes EROFS, mount {opts}"))
}
