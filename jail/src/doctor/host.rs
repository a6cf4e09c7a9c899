//! The host facts `jail doctor` judges, and the judgement: [`HostFacts::read`]
//! takes them from a root folder (`/` on a real host, a recorded fixture in
//! the tests) plus the results of a few live probes, and [`diagnose`] turns
//! them into findings, each missing piece with its exact fix. Pure but for
//! `read` and [`Probes::live`].
//!
//! The causes it tells apart, in the order a failure is explained:
//! user namespaces refused by AppArmor (Ubuntu 23.10+:
//! `kernel.apparmor_restrict_unprivileged_userns=1`), by Debian's
//! `kernel.unprivileged_userns_clone=0`, by `user.max_user_namespaces=0`, or
//! by a container's seccomp profile (Docker's default refuses `unshare`);
//! landlock absent from the kernel or from the active LSM list; no seccomp;
//! cgroup v1 only; cgroup v2 with no delegated cgroup for an ordinary user.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Check;
use crate::cgroup;

/// What the live probes found; recorded as `probes.json` in a fixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Probes {
    /// `None`: a user namespace could be created, mapped and mounted in.
    /// Else the step that failed (`unshare`, `uid_map`, `mount`) and errno.
    pub userns_failure: Option<(String, i32)>,
    /// `landlock_create_ruleset(VERSION)`: the ABI, or the errno.
    pub landlock: Result<i32, i32>,
    /// Whether this process may create cgroups in its own cgroup (v2).
    pub own_cgroup_writable: bool,
}

/// Everything `diagnose` looks at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostFacts {
    pub kernel: String,
    pub uid: u32,
    /// The jail binary (named in the AppArmor profile of the fix).
    pub exe: PathBuf,
    pub apparmor_restrict_userns: Option<u64>,
    pub unprivileged_userns_clone: Option<u64>,
    pub max_user_namespaces: Option<u64>,
    /// `/sys/kernel/security/lsm`: the active LSMs (None: securityfs not mounted).
    pub lsm: Option<Vec<String>>,
    /// `Seccomp:` of /proc/self/status (None: the kernel has no seccomp);
    /// 2 means this process already runs under a filter.
    pub seccomp_mode: Option<u32>,
    pub seccomp_actions: Vec<String>,
    /// Why this looks like a container (`/.dockerenv`, ...), if it does.
    pub container: Option<String>,
    pub cgroups: cgroup::Layout,
    /// This process's cgroup v2 path (`0::` in /proc/self/cgroup).
    pub own_cgroup: Option<String>,
    pub probes: Probes,
}

fn read_text(root: &Path, rel: &str) -> Option<String> {
    // Host facts are small text files; a bound keeps a strange one harmless.
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(root.join(rel)).ok()?.take(1 << 20).read_to_string(&mut s).ok()?;
    Some(s)
}

fn read_number(root: &Path, rel: &str) -> Option<u64> {
    read_text(root, rel)?.trim().parse().ok()
}

impl HostFacts {
    /// The facts under `root` (`/` for this host), with `probes` taken live
    /// or from a recording.
    pub(crate) fn read(root: &Path, kernel: String, uid: u32, exe: PathBuf, probes: Probes) -> HostFacts {
        let status = read_text(root, "proc/self/status").unwrap_or_default();
        let seccomp_mode = status.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok());
        let container = [".dockerenv", "run/.containerenv"]
            .into_iter()
            .find(|m| root.join(m).exists())
            .map(|m| format!("/{m} exists"))
            .or_else(|| {
                let init = read_text(root, "proc/1/cgroup").unwrap_or_default();
                ["docker", "containerd", "kubepods", "libpod", "lxc"]
                    .into_iter()
                    .find(|k| init.contains(k))
                    .map(|k| format!("PID 1's cgroup names {k}"))
            });
        let own_cgroup =
            read_text(root, "proc/self/cgroup").and_then(|t| t.lines().find_map(|l| l.strip_prefix("0::").map(str::to_owned)));
        HostFacts {
            kernel,
            uid,
            exe,
            apparmor_restrict_userns: read_number(root, "proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
            unprivileged_userns_clone: read_number(root, "proc/sys/kernel/unprivileged_userns_clone"),
            max_user_namespaces: read_number(root, "proc/sys/user/max_user_namespaces"),
            lsm: read_text(root, "sys/kernel/security/lsm")
                .map(|t| t.trim().split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect()),
            seccomp_mode,
            seccomp_actions: read_text(root, "proc/sys/kernel/seccomp/actions_avail")
                .map(|t| t.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            container,
            cgroups: cgroup::parse_mountinfo(&read_text(root, "proc/self/mountinfo").unwrap_or_default()),
            own_cgroup,
            probes,
        }
    }
}

impl Probes {
    /// Probe this host: a user namespace in a throwaway child (created,
    /// mapped, a tmpfs mounted in a new mount namespace: AppArmor's
    /// restriction lets the first two through and refuses the mount), the
    /// landlock ABI, and whether our own cgroup takes new cgroups.
    pub(crate) fn live(own_cgroup: Option<&str>) -> Probes {
        let userns_failure = super::probe_user_namespace().err();
        let landlock = crate::sys::landlock_abi().map_err(|e| e.raw_os_error().unwrap_or(0));
        let own_cgroup_writable = own_cgroup.is_some_and(|cg| {
            let dir = Path::new("/sys/fs/cgroup").join(cg.trim_start_matches('/'));
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok()
        });
        Probes { userns_failure, landlock, own_cgroup_writable }
    }
}

fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::EINVAL => "EINVAL",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EUSERS => "EUSERS",
        _ => return format!("errno {e}"),
    };
    name.into()
}

fn finding(name: &str, ok: bool, detail: String, fix: Option<String>) -> Check {
    Check { name: name.into(), ok, detail, fix: if ok { None } else { fix } }
}

fn sysctl_fix(key: &str, value: &str) -> String {
    format!("sudo sysctl -w {key}={value}; to keep it after a reboot: echo {key}={value} | sudo tee /etc/sysctl.d/60-jail.conf")
}

/// The user-namespace finding: jail needs one for every run, root or not.
fn user_namespaces(f: &HostFacts) -> Check {
    let Some((step, errno)) = &f.probes.userns_failure else {
        return finding("user_namespaces", true, "a user namespace can be created, mapped and mounted in".into(), None);
    };
    let how = format!("{step} failed with {}", errno_name(*errno));
    let (detail, fix) = if f.apparmor_restrict_userns == Some(1) {
        (
            format!(
                "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1, \
                 Ubuntu 23.10 and later): {how}"
            ),
            format!(
                "allow user namespaces for jail alone with an AppArmor profile: write /etc/apparmor.d/jail containing \
                 `abi <abi/4.0>, include <tunables/global> profile jail {} flags=(unconfined) {{ userns, }}` and load it \
                 with `sudo apparmor_parser -r /etc/apparmor.d/jail`; or lift the restriction for everyone: {}",
                f.exe.display(),
                sysctl_fix("kernel.apparmor_restrict_unprivileged_userns", "0")
            ),
        )
    } else if f.unprivileged_userns_clone == Some(0) && f.uid != 0 {
        (
            format!("unprivileged user namespaces are switched off (kernel.unprivileged_userns_clone=0): {how}"),
            format!("{}; or run jail as root", sysctl_fix("kernel.unprivileged_userns_clone", "1")),
        )
    } else if f.max_user_namespaces == Some(0) {
        (
            format!("no user namespaces may be created (user.max_user_namespaces=0): {how}"),
            sysctl_fix("user.max_user_namespaces", "15000"),
        )
    } else if let (Some(why), Some(2), libc::EPERM) = (&f.container, f.seccomp_mode, *errno) {
        (
            format!(
                "this is a container ({why}) whose seccomp profile refuses namespaces (Docker's default refuses \
                 unshare and clone with namespace flags): {how}"
            ),
            "start the container with `--security-opt seccomp=unconfined` (or a profile that allows unshare, setns, \
             mount, umount2, pivot_root and clone with CLONE_NEW* flags) and, where AppArmor confines it, \
             `--security-opt apparmor=unconfined`; or run jail on the host"
                .into(),
        )
    } else {
        (
            format!("user namespaces are refused: {how}"),
            format!(
                "check kernel.unprivileged_userns_clone, user.max_user_namespaces and the LSMs ({}); the kernel \
                 needs CONFIG_USER_NS=y",
                f.lsm.as_ref().map(|l| l.join(",")).unwrap_or_else(|| "securityfs not mounted".into())
            ),
        )
    };
    finding("user_namespaces", false, detail, Some(fix))
}

fn landlock(f: &HostFacts) -> Check {
    let errno = match f.probes.landlock {
        Ok(abi) => return finding("landlock", true, format!("ABI {abi}"), None),
        Err(e) => e,
    };
    let version = super::kernel_version(&f.kernel).unwrap_or((0, 0));
    let active = f.lsm.as_ref().map(|l| l.join(","));
    let not_listed = f.lsm.as_ref().is_some_and(|l| !l.iter().any(|m| m == "landlock"));
    let (detail, fix) = if errno == libc::EOPNOTSUPP || (not_listed && version >= (5, 13) && errno != libc::ENOSYS) {
        let list = active.clone().unwrap_or_else(|| "lockdown,capability,yama,apparmor".into());
        (
            format!(
                "landlock is built into this kernel but not active: it is not in the LSM list ({}) [{}]",
                active.unwrap_or_else(|| "securityfs not mounted".into()),
                errno_name(errno)
            ),
            format!(
                "add it to the kernel command line: lsm=landlock,{list} (GRUB_CMDLINE_LINUX in /etc/default/grub, then \
                 `sudo update-grub` and reboot); runs are landlock-degraded until then (`best_effort`) and a policy \
                 with `\"mode\": \"required\"` fails closed"
            ),
        )
    } else if version < (5, 13) {
        (
            format!("Linux {}.{} predates landlock (5.13) [{}]", version.0, version.1, errno_name(errno)),
            "boot Linux 5.13 or later (Debian 11: the bullseye-backports kernel; Debian 12's 6.1 has ABI 2); runs \
             are landlock-degraded until then (`best_effort`) and a policy with `\"mode\": \"required\"` fails closed"
                .into(),
        )
    } else {
        (
            format!("this kernel was built without landlock [{}]", errno_name(errno)),
            "boot a kernel built with CONFIG_SECURITY_LANDLOCK=y and landlock in lsm= (Debian's and Ubuntu's are)".into(),
        )
    };
    finding("landlock", false, detail, Some(fix))
}

fn seccomp(f: &HostFacts) -> Check {
    let Some(mode) = f.seccomp_mode else {
        return finding(
            "seccomp",
            false,
            "no seccomp: /proc/self/status has no Seccomp field".into(),
            Some("boot a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y".into()),
        );
    };
    let mut detail = format!("filters available; actions: {}", f.seccomp_actions.join(" "));
    if mode == 2 {
        detail.push_str(" [this process already runs under a seccomp filter (a container?): the jail's stacks on it]");
    }
    if !f.seccomp_actions.iter().any(|a| a == "user_notif") {
        detail.push_str(" [no user_notif: denials are not counted]");
    }
    finding("seccomp", true, detail, None)
}

/// Which cgroups this user can limit runs with, and why not.
fn cgroups(f: &HostFacts) -> Check {
    let mode = super::cgroup_mode(&f.cgroups);
    let root = f.uid == 0;
    let (ok, detail, fix) = match mode {
        "none" => (
            false,
            "no cgroup hierarchy is mounted: memory, CPU and pids limits fall back to rlimits".to_string(),
            "mount the unified hierarchy: sudo mount -t cgroup2 none /sys/fs/cgroup".to_string(),
        ),
        "v1" | "hybrid" if !root => (
            false,
            format!(
                "cgroup {}: memory, cpu and pids are on cgroup v1, where an ordinary user gets no cgroup of its own \
                 (limits fall back to rlimits)",
                if mode == "v1" { "v1 only" } else { "hybrid (v1 controllers)" }
            ),
            "boot with the unified hierarchy (systemd.unified_cgroup_hierarchy=1 on the kernel command line) and \
             delegate a cgroup; or, as root, create the same path in each of memory, pids, cpu, cpuacct and freezer, \
             chown it with its cgroup.procs and tasks to the user, and pass it as --cgroup-parent"
                .into(),
        ),
        "v1" | "hybrid" => (true, format!("cgroup {mode}: root uses the v1 controllers"), String::new()),
        _ if root => (true, format!("cgroup {mode}: root creates run cgroups itself"), String::new()),
        "v2" if f.probes.own_cgroup_writable => (
            true,
            format!("cgroup v2, and this user's cgroup {} is delegated", f.own_cgroup.as_deref().unwrap_or("?")),
            String::new(),
        ),
        _ => (
            false,
            format!(
                "cgroup {mode} with no delegation: this user may not create cgroups in its cgroup {}",
                f.own_cgroup.as_deref().unwrap_or("(unknown)")
            ),
            "on cgroup v2 with a systemd user manager (`loginctl enable-linger $USER` starts one without a login \
             session) jail asks it for a delegated scope by itself (limits.systemd_delegation \"auto\"); by hand: \
             `systemd-run --user --scope -p Delegate=yes $SHELL`, move that shell into a leaf \
             (mkdir /sys/fs/cgroup$CG/leaf; echo $$ > /sys/fs/cgroup$CG/leaf/cgroup.procs, CG from /proc/self/cgroup) \
             and pass $CG as --cgroup-parent or JAIL_CGROUP_PARENT"
                .into(),
        ),
    };
    finding("cgroups", ok, detail, Some(fix))
}

/// Every finding, in the order `jail doctor` prints them. Pure.
pub(crate) fn diagnose(f: &HostFacts) -> Vec<Check> {
    vec![user_namespaces(f), landlock(f), seccomp(f), cgroups(f)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host kind recorded under jail/tests/fixtures/doctor/KIND: its /proc
    /// and /sys files and `host.json` (kernel, uid and the live probes).
    fn fixture(kind: &str) -> HostFacts {
        #[derive(Deserialize)]
        struct Host {
            kernel: String,
            uid: u32,
            probes: Probes,
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor").join(kind);
        let host: Host = serde_json::from_str(&std::fs::read_to_string(root.join("host.json")).unwrap()).unwrap();
        HostFacts::read(&root, host.kernel, host.uid, PathBuf::from("/usr/local/bin/jail"), host.probes)
    }

    fn get<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap()
    }

    fn missing(kind: &str, name: &str, detail: &str, fix: &str) {
        let checks = diagnose(&fixture(kind));
        let c = get(&checks, name);
        assert!(!c.ok, "{kind}: {c:?}");
        assert!(c.detail.contains(detail), "{kind}: {}", c.detail);
        assert!(c.fix.as_deref().unwrap().contains(fix), "{kind}: {:?}", c.fix);
    }

    #[test]
    fn this_debian_12_hybrid_host_as_root_has_everything() {
        let checks = diagnose(&fixture("debian12-hybrid-root"));
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
        assert_eq!(get(&checks, "landlock").detail, "ABI 7");
    }

    #[test]
    fn ubuntu_apparmor_userns_restriction_is_named_with_the_profile_and_the_sysctl() {
        missing(
            "ubuntu2404-apparmor-userns",
            "user_namespaces",
            "kernel.apparmor_restrict_unprivileged_userns=1",
            "profile jail /usr/local/bin/jail flags=(unconfined) { userns, }",
        );
        missing("ubuntu2404-apparmor-userns", "user_namespaces", "mount failed with EPERM", "apparmor_parser -r");
        missing(
            "ubuntu2404-apparmor-userns",
            "user_namespaces",
            "Ubuntu 23.10",
            "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        );
    }

    #[test]
    fn debian_unprivileged_userns_clone_off_is_named() {
        missing(
            "debian-userns-clone-off",
            "user_namespaces",
            "kernel.unprivileged_userns_clone=0",
            "sudo sysctl -w kernel.unprivileged_userns_clone=1",
        );
    }

    #[test]
    fn max_user_namespaces_zero_is_named() {
        missing("max-user-namespaces-0", "user_namespaces", "user.max_user_namespaces=0", "user.max_user_namespaces=15000");
        missing("max-user-namespaces-0", "user_namespaces", "unshare failed with ENOSPC", "/etc/sysctl.d/60-jail.conf");
    }

    #[test]
    fn a_docker_container_with_the_default_seccomp_profile_is_named() {
        missing(
            "docker-default-seccomp",
            "user_namespaces",
            "container (/.dockerenv exists)",
            "--security-opt seccomp=unconfined",
        );
        let checks = diagnose(&fixture("docker-default-seccomp"));
        assert!(get(&checks, "seccomp").detail.contains("already runs under a seccomp filter"));
    }

    #[test]
    fn landlock_missing_from_the_active_lsm_list_gets_the_lsm_line() {
        missing(
            "landlock-not-in-lsm",
            "landlock",
            "not in the LSM list (lockdown,capability,yama,apparmor)",
            "lsm=landlock,lockdown,capability,yama,apparmor",
        );
    }

    #[test]
    fn debian_11_on_5_10_has_no_landlock_and_a_pure_v2_user_without_delegation() {
        missing("debian11-5.10-user", "landlock", "Linux 5.10 predates landlock", "\"mode\": \"required\"` fails closed");
        missing("debian11-5.10-user", "cgroups", "cgroup v2 with no delegation", "systemd-run --user --scope -p Delegate=yes");
        missing("debian11-5.10-user", "cgroups", "/user.slice/user-1000.slice/session-1.scope", "loginctl enable-linger");
        let checks = diagnose(&fixture("debian11-5.10-user"));
        assert!(get(&checks, "user_namespaces").ok && get(&checks, "seccomp").ok);
    }

    #[test]
    fn a_kernel_without_seccomp_is_named() {
        missing("no-seccomp", "seccomp", "no Seccomp field", "CONFIG_SECCOMP_FILTER=y");
    }

    #[test]
    fn cgroup_v1_only_for_an_ordinary_user_is_named() {
        missing("cgroup-v1-only-user", "cgroups", "cgroup v1 only", "systemd.unified_cgroup_hierarchy=1");
    }

    #[test]
    fn a_delegated_v2_cgroup_is_recognised() {
        let checks = diagnose(&fixture("debian12-v2-delegated-user"));
        let c = get(&checks, "cgroups");
        assert!(c.ok, "{c:?}");
        assert!(c.detail.contains("delegated"), "{c:?}");
        assert_eq!(get(&checks, "landlock").detail, "ABI 2");
    }
}
