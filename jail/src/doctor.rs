//! `jail doctor`: what this host provides to the jail, and for each missing
//! piece, how to fix it.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cgroup;
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

/// The cgroup hierarchy as this process sees it, and what the jail makes
/// of it for this user.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CgroupLayout {
    /// `v2`, `v1`, `hybrid` or `none`.
    pub mode: String,
    pub layout: cgroup::Layout,
    /// `cgroup_v2`, `cgroup_v1` or `rlimit`: what a run would use.
    pub backend: String,
    /// Where run cgroups would be created.
    pub parents: Vec<cgroup::Parent>,
    /// Why the other backends were not chosen.
    pub notes: Vec<String>,
}

impl Report {
    pub fn all_ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// `v2`, `v1`, `hybrid` or `none`, from what is mounted. Pure.
pub fn cgroup_mode(layout: &cgroup::Layout) -> &'static str {
    match (&layout.unified, layout.v1.is_empty()) {
        (Some(_), true) => "v2",
        (Some(_), false) => "hybrid",
        (None, false) => "v1",
        (None, true) => "none",
    }
}

/// `(major, minor)` of a kernel release string such as `6.18.0-1-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// What the jail will use for resource limits, for this user, and why.
fn limits_check(kernel: &str) -> (Check, CgroupLayout) {
    let parent = std::env::var("JAIL_CGROUP_PARENT").ok().filter(|v| !v.is_empty()).map(PathBuf::from);
    let settings = cgroup::Settings { memory: Some(1), cpus: Some(1.0), pids: Some(1), cpu_time: true };
    let (_, choice) = cgroup::choose_here(parent.as_deref(), &settings);
    let layout = cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let mode = cgroup_mode(&layout).to_string();
    let (backend, parents) = match &choice.candidate {
        Some(c) => (c.version.enforcer().to_string(), c.parents.clone()),
        None => ("rlimit".to_string(), vec![]),
    };
    let full = choice.candidate.as_ref().is_some_and(|c| ["memory", "pids", "cpu"].iter().all(|x| c.has(x)) && c.has_cpu_usage());
    let mut detail = match &choice.candidate {
        Some(c) => format!(
            "{backend} (cgroup mode {mode}): {}",
            c.parents
                .iter()
                .map(|p| format!("{} in {}", p.controllers.join(","), p.dir.display()))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        None => format!(
            "rlimit (cgroup mode {mode}): memory as per-process RLIMIT_AS, pids as RLIMIT_NPROC, CPU time as RLIMIT_CPU; \
             the CPU quota is not enforced"
        ),
    };
    if !choice.notes.is_empty() {
        detail.push_str(&format!(" [{}]", choice.notes.join("; ")));
    }
    if choice.candidate.is_none() && kernel_version(kernel).is_some_and(|v| v < (5, 14)) {
        detail.push_str(" [before Linux 5.14 RLIMIT_NPROC counts every process of the host uid, not only the run's]");
    }
    let check = check(
        "limits",
        full,
        detail,
        "give jail a cgroup it may write: run it as root; or delegate one and pass its path as --cgroup-parent \
         or JAIL_CGROUP_PARENT. cgroup v2: `systemd-run --user --scope -p Delegate=yes $SHELL`, move that shell \
         into a leaf (mkdir /sys/fs/cgroup$CG/leaf; echo $$ > /sys/fs/cgroup$CG/leaf/cgroup.procs, CG from \
         /proc/self/cgroup) and pass $CG. cgroup v1: as root, create the same path in each of memory, pids, cpu, \
         cpuacct and freezer and chown it, its cgroup.procs and its tasks to the user",
    );
    (check, CgroupLayout { mode, layout, backend, parents, notes: choice.notes })
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
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let (limits, cgroup) = limits_check(&kernel);
    checks.push(limits);
    if let Some(root) = rootfs {
        let ok = root.join("usr/bin/python3").exists();
        checks.push(check(
            "rootfs",
            ok,
            format!("{}{}", root.display(), if ok { "" } else { " has no usr/bin/python3" }),
            "build it with `make rootfs`",
        ));
    }
    Report { kernel, uid: nix::unistd::getuid().as_raw(), checks, cgroup }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hybrid_host_is_recognised() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup_mode(&cgroup::parse_mountinfo(mi)), "hybrid");
    }

    #[test]
    fn a_pure_v2_host_is_recognised() {
        let mi = "31 25 0:27 / /sys/fs/cgroup rw,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup_mode(&cgroup::parse_mountinfo(mi)), "v2");
        assert_eq!(cgroup_mode(&cgroup::parse_mountinfo("")), "none");
    }

    #[test]
    fn kernel_releases_parse_to_major_minor() {
        assert_eq!(kernel_version("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("x"), None);
    }
}
