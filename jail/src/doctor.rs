//! `jail doctor`: what this host provides to the jail, and for each missing
//! piece, how to fix it.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::sys::{self, Forked};

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// What to do when `ok` is false.
    pub fix: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kernel: String,
    pub uid: u32,
    pub checks: Vec<Check>,
    pub cgroup: CgroupLayout,
}

/// The cgroup hierarchy as this process sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CgroupLayout {
    /// `v2`, `v1`, `hybrid` or `none`.
    pub mode: String,
    /// The unified (v2) mount point, if any.
    pub unified_mount: Option<PathBuf>,
    /// Controllers enabled on the unified hierarchy at its root.
    pub unified_controllers: Vec<String>,
    /// v1 controllers with their mount points.
    pub v1_controllers: Vec<(String, PathBuf)>,
}

impl Report {
    pub fn all_ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// Parse /proc/self/mountinfo text into the cgroup layout. Pure.
pub fn cgroup_layout(mountinfo: &str) -> CgroupLayout {
    let mut unified_mount = None;
    let mut v1 = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mount_point = left.split_whitespace().nth(4).map(PathBuf::from);
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or("");
        let _source = r.next();
        let options = r.next().unwrap_or("");
        match (fstype, mount_point) {
            ("cgroup2", Some(mp)) => unified_mount = Some(mp),
            ("cgroup", Some(mp)) => {
                for opt in options.split(',') {
                    if ["memory", "cpu", "pids", "cpuacct", "freezer", "cpuset", "io", "blkio"].contains(&opt) {
                        v1.push((opt.to_string(), mp.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    let unified_controllers = unified_mount
        .as_ref()
        .and_then(|m| std::fs::read_to_string(m.join("cgroup.controllers")).ok())
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let mode = match (&unified_mount, v1.is_empty()) {
        (Some(_), true) => "v2",
        (Some(_), false) => "hybrid",
        (None, false) => "v1",
        (None, true) => "none",
    };
    CgroupLayout { mode: mode.into(), unified_mount, unified_controllers, v1_controllers: v1 }
}

fn check(name: &str, ok: bool, detail: String, fix: &str) -> Check {
    Check { name: name.into(), ok, detail, fix: if ok { None } else { Some(fix.into()) } }
}

/// Try to create a user namespace in a throwaway child.
fn user_namespaces_work() -> Result<(), String> {
    match sys::fork_process() {
        Err(e) => Err(format!("fork: {e}")),
        Ok(Forked::Child) => {
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            sys::exit_now(if ok { 0 } else { 1 })
        }
        Ok(Forked::Parent(pid)) => match sys::wait4(pid) {
            Ok((status, _)) if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => Ok(()),
            Ok(_) => Err("unshare(CLONE_NEWUSER) was refused".into()),
            Err(e) => Err(format!("wait: {e}")),
        },
    }
}

pub fn run(rootfs: Option<&Path>) -> Report {
    let mut checks = Vec::new();
    let userns = user_namespaces_work();
    checks.push(check(
        "user_namespaces",
        userns.is_ok(),
        userns.clone().err().unwrap_or_else(|| "unprivileged user namespaces can be created".into()),
        "allow them: sysctl -w kernel.unprivileged_userns_clone=1 (Debian), user.max_user_namespaces=15000, \
         or on Ubuntu 24.04 kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for jail",
    ));
    let abi = sys::landlock_abi();
    checks.push(check(
        "landlock",
        abi.is_ok(),
        match &abi {
            Ok(v) => format!("ABI {v}"),
            Err(e) => format!("not available: {e}"),
        },
        "boot a kernel with CONFIG_SECURITY_LANDLOCK=y and landlock in lsm= (e.g. lsm=landlock,lockdown,yama,apparmor,bpf)",
    ));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let seccomp = status.lines().any(|l| l.starts_with("Seccomp:"));
    let actions = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    checks.push(check(
        "seccomp",
        seccomp,
        if seccomp { format!("filters available; actions: {}", actions.trim()) } else { "not available".into() },
        "boot a kernel with CONFIG_SECCOMP_FILTER=y",
    ));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cgroup = cgroup_layout(&mountinfo);
    checks.push(check(
        "cgroups",
        cgroup.mode != "none",
        format!(
            "mode {}; unified at {} with [{}]; v1: [{}]",
            cgroup.mode,
            cgroup.unified_mount.as_ref().map_or("-".into(), |p| p.display().to_string()),
            cgroup.unified_controllers.join(" "),
            cgroup.v1_controllers.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>().join(" ")
        ),
        "mount cgroup2 at /sys/fs/cgroup; the per-run limits arrive with issue 3",
    ));
    if let Some(root) = rootfs {
        let ok = root.join("usr/bin/python3").exists();
        checks.push(check(
            "rootfs",
            ok,
            format!("{}{}", root.display(), if ok { "" } else { " has no usr/bin/python3" }),
            "build it with `make rootfs`",
        ));
    }
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    Report { kernel, uid: nix::unistd::getuid().as_raw(), checks, cgroup }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hybrid_host_is_recognised() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n";
        let l = cgroup_layout(mi);
        assert_eq!(l.mode, "hybrid");
        assert_eq!(l.v1_controllers, vec![("memory".to_string(), PathBuf::from("/sys/fs/cgroup/memory"))]);
    }

    #[test]
    fn a_pure_v2_host_is_recognised() {
        let mi = "31 25 0:27 / /sys/fs/cgroup rw,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup_layout(mi).mode, "v2");
        assert_eq!(cgroup_layout("").mode, "none");
    }
}
