//! `jail doctor`: what this host provides to the jail, and for each missing
//! piece, how to fix it. The facts and their judgement are in `host.rs`
//! (read from a root folder, so recorded hosts are unit-tested); this file
//! runs the live probes and adds what a run would use for its limits.

mod host;
pub(crate) mod stale;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub(crate) use host::{HostFacts, Probes};

use crate::cgroup;
use crate::sys::{self, Forked};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// What to do when `ok` is false.
    pub fix: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub kernel: String,
    pub uid: u32,
    pub checks: Vec<Check>,
    pub cgroup: CgroupLayout,
}

/// The cgroup hierarchy as this process sees it, and what the jail makes
/// of it for this user.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct CgroupLayout {
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
    pub(crate) fn all_ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// `v2`, `v1`, `hybrid` or `none`, from what is mounted. Pure.
pub(crate) fn cgroup_mode(layout: &cgroup::Layout) -> &'static str {
    match (&layout.unified, layout.v1.is_empty()) {
        (Some(_), true) => "v2",
        (Some(_), false) => "hybrid",
        (None, false) => "v1",
        (None, true) => "none",
    }
}

/// `(major, minor)` of a kernel release string such as `6.18.0-1-amd64`.
pub(crate) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// What `jail doctor` is asked about beyond the host itself; the caller
/// (cli/doctor.rs) found these (locate.rs, hostenv.rs).
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The rootfs a run would use, canonical, and where it was found; or
    /// why there is none and how to build one.
    pub rootfs: Result<(PathBuf, String), String>,
    /// `--cgroup-parent` or `$JAIL_CGROUP_PARENT`.
    pub cgroup_parent: Option<PathBuf>,
    /// Which policy a run would use (the built-in default or a file), and its hash.
    pub policy: String,
    /// Each flavour (locate::DEFAULT_ORDER) and where it is found by name, if anywhere.
    pub flavours: Vec<(String, Option<PathBuf>)>,
}

/// What the jail will use for resource limits, for this user, and why.
fn limits_check(kernel: &str, parent: Option<&Path>) -> (Check, CgroupLayout) {
    let settings = cgroup::Settings { memory: Some(1), cpus: Some(1.0), pids: Some(1), cpu_time: true };
    let (_, choice) = cgroup::choose_here(parent, &settings);
    let layout = cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let mode = cgroup_mode(&layout).to_string();
    let (backend, parents) = match &choice.candidate {
        Some(c) => (c.version.enforcer().to_string(), c.parents.clone()),
        None => ("rlimit".to_string(), vec![]),
    };
    let full = choice
        .candidate
        .as_ref()
        .is_some_and(|c| ["memory", "pids", "cpu"].iter().all(|x| c.has(x)) && c.has_cpu_usage());
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
    if choice.candidate.is_none() && parent.is_none() {
        match crate::delegate::availability() {
            Ok(bus) => detail.push_str(&format!(
                " [systemd delegation: a user manager listens on {}: runs ask it for a delegated scope \
                 (StartTransientUnit, Delegate=yes) and get cgroup_v2 limits; --no-systemd-delegation turns that off]",
                bus.display()
            )),
            Err(why) => detail.push_str(&format!(" [systemd delegation: {why}]")),
        }
    }
    if choice.candidate.is_none() && kernel_version(kernel).is_some_and(|v| v < (5, 14)) {
        detail.push_str(" [before Linux 5.14 RLIMIT_NPROC counts every process of the host uid, not only the run's]");
    }
    let check = check(
        "limits",
        full,
        detail,
        "give jail a cgroup it may write: run it as root; on a cgroup v2 host with systemd, run a user manager \
         (`loginctl enable-linger $USER`) and jail asks it for a delegated scope by itself; or delegate one and pass \
         its path as --cgroup-parent or JAIL_CGROUP_PARENT. cgroup v2: `systemd-run --user --scope -p Delegate=yes $SHELL`, move that shell \
         into a leaf (mkdir /sys/fs/cgroup$CG/leaf; echo $$ > /sys/fs/cgroup$CG/leaf/cgroup.procs, CG from \
         /proc/self/cgroup) and pass $CG. cgroup v1: as root, create the same path in each of memory, pids, cpu, \
         cpuacct and freezer and chown it, its cgroup.procs and its tasks to the user",
    );
    (check, CgroupLayout { mode, layout, backend, parents, notes: choice.notes })
}

fn check(name: &str, ok: bool, detail: String, fix: &str) -> Check {
    Check { name: name.into(), ok, detail, fix: if ok { None } else { Some(fix.into()) } }
}

/// Create a user namespace in a throwaway child as the jail does: unshare
/// user and mount namespaces, map our ids, mount a tmpfs. The step that
/// failed and its errno come back over a pipe.
fn probe_user_namespace() -> Result<(), (String, i32)> {
    const STEPS: [&str; 5] = ["unshare", "setgroups", "uid_map", "gid_map", "mount"];
    let (rd, wr) = nix::unistd::pipe().map_err(|e| ("pipe".to_string(), e as i32))?;
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    match sys::fork_process() {
        Err(e) => Err(("fork".into(), e.raw_os_error().unwrap_or(0))),
        Ok(Forked::Child) => {
            drop(rd);
            let fail = |step: usize, e: i32| -> ! {
                let mut msg = [0u8; 8];
                msg[..4].copy_from_slice(&(step as u32).to_le_bytes());
                msg[4..].copy_from_slice(&(e as u32).to_le_bytes());
                let _ = nix::unistd::write(&wr, &msg);
                sys::exit_now(1)
            };
            let io = |e: std::io::Error| e.raw_os_error().unwrap_or(0);
            if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS) {
                fail(0, e as i32);
            }
            if let Err(e) = std::fs::write("/proc/self/setgroups", "deny") {
                fail(1, io(e));
            }
            if let Err(e) = std::fs::write("/proc/self/uid_map", format!("0 {uid} 1")) {
                fail(2, io(e));
            }
            if let Err(e) = std::fs::write("/proc/self/gid_map", format!("0 {gid} 1")) {
                fail(3, io(e));
            }
            use nix::mount::{mount, MsFlags};
            if let Err(e) = mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
                .and_then(|_| mount(Some("tmpfs"), "/tmp", Some("tmpfs"), MsFlags::empty(), Some("size=4k")))
            {
                fail(4, e as i32);
            }
            sys::exit_now(0)
        }
        Ok(Forked::Parent(pid)) => {
            drop(wr);
            let mut msg = [0u8; 8];
            let n = nix::unistd::read(rd.as_raw_fd(), &mut msg).unwrap_or(0);
            let waited = sys::wait4(pid);
            if n == 8 {
                let step = u32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]) as usize;
                let errno = u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]) as i32;
                return Err((STEPS.get(step).unwrap_or(&"probe").to_string(), errno));
            }
            match waited {
                Ok((status, _)) if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => Ok(()),
                Ok(_) => Err(("probe child".into(), 0)),
                Err(e) => Err(("wait".into(), e.raw_os_error().unwrap_or(0))),
            }
        }
    }
}

pub(crate) fn run(ctx: &Context) -> Report {
    let kernel = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let uid = nix::unistd::getuid().as_raw();
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("jail"));
    let root = Path::new("/");
    // The probes need our own cgroup, which the facts read again (cheap).
    let own = HostFacts::read(
        root,
        kernel.clone(),
        uid,
        exe.clone(),
        Probes { userns_failure: None, landlock: Ok(0), own_cgroup_writable: false },
    )
    .own_cgroup;
    let facts = HostFacts::read(root, kernel.clone(), uid, exe, Probes::live(own.as_deref()));
    let mut checks = host::diagnose(&facts);
    let (limits, cgroup) = limits_check(&kernel, ctx.cgroup_parent.as_deref());
    checks.push(limits);
    checks.push(check("policy", true, ctx.policy.clone(), ""));
    checks.extend(rootfs_checks(&ctx.rootfs));
    checks.push(flavours_check(&ctx.flavours));
    Report { kernel, uid, checks, cgroup }
}

/// Which flavours this user has and how to get the other: never a failure,
/// since either one runs Python (issue 38).
fn flavours_check(found: &[(String, Option<PathBuf>)]) -> Check {
    let have = |name: &str| found.iter().find(|(n, _)| n == name).and_then(|(_, p)| p.as_ref());
    let detail = match (have("data"), have("minimal")) {
        (Some(d), Some(m)) => format!(
            "data at {} (runs use it unless --rootfs-name minimal), minimal at {}",
            d.display(),
            m.display()
        ),
        (Some(d), None) => format!(
            "data at {} (runs use it); a smaller standard-library-only rootfs: `jail rootfs build minimal` (seconds)",
            d.display()
        ),
        (None, Some(m)) => format!(
            "minimal at {} (the standard library alone); numpy, pandas, matplotlib and the rest of the data stack: `jail rootfs build data` (minutes, no root needed), which runs then use",
            m.display()
        ),
        (None, None) => {
            "neither: `jail rootfs build minimal` (seconds) or `jail rootfs build data` (the data stack, minutes)".into()
        }
    };
    Check { name: "rootfs flavours".into(), ok: true, detail, fix: None }
}

/// The rootfs a run would use, and, for a minimal rootfs (a copy of the
/// host's Python), whether the host has updated that Python since.
fn rootfs_checks(found: &Result<(PathBuf, String), String>) -> Vec<Check> {
    let (root, from) = match found {
        Ok(found) => found,
        Err(why) => {
            return vec![Check {
                name: "rootfs".into(),
                ok: false,
                detail: "none found".into(),
                fix: Some(why.clone()),
            }]
        }
    };
    let ok = root.join("usr/bin/python3").exists();
    let detail = format!("{} (from {from}){}", root.display(), if ok { "" } else { " has no usr/bin/python3" });
    let mut checks = vec![check(
        "rootfs",
        ok,
        detail,
        "rebuild it with `jail rootfs build minimal` (or `data`)",
    )];
    let Ok(Some((manifest, _))) = crate::rootfs::load(root) else { return checks };
    if manifest.flavour != "minimal" || manifest.debian_packages.is_empty() {
        return checks;
    }
    let host = host_package_versions(manifest.debian_packages.keys());
    let stale = stale::stale(&manifest.debian_packages, &host);
    let detail = if stale.is_empty() {
        format!(
            "python {} matches the host's packages ({})",
            manifest.python.version,
            join_versions(&manifest.debian_packages)
        )
    } else {
        stale
            .iter()
            .map(|s| format!("{} {} in the rootfs, {} on the host", s.package, s.rootfs, s.host))
            .collect::<Vec<_>>()
            .join("; ")
    };
    checks.push(check(
        "rootfs python",
        stale.is_empty(),
        detail,
        "the host's Python was updated after the rootfs copied it: rebuild it with `jail rootfs build minimal` (or `make rootfs`)",
    ));
    checks
}

fn join_versions(pkgs: &std::collections::BTreeMap<String, String>) -> String {
    pkgs.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

/// The host's installed version of each package, from dpkg; a package
/// dpkg does not know is left out.
fn host_package_versions<'a>(names: impl Iterator<Item = &'a String>) -> std::collections::BTreeMap<String, String> {
    let names: Vec<&String> = names.filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || "+-.:".contains(c))).collect();
    let Ok(out) = std::process::Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\n", "--"])
        .args(&names)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Default::default();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (status, name, version) = (f.next()?, f.next()?, f.next()?);
            // `ii `: installed; a removed package keeps only its config.
            (status.starts_with("ii") && !version.is_empty()).then(|| (name.to_string(), version.to_string()))
        })
        .collect()
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
    fn the_flavour_line_says_what_is_there_and_how_to_get_the_other() {
        let at = |d: Option<&str>, m: Option<&str>| {
            vec![
                ("data".to_string(), d.map(PathBuf::from)),
                ("minimal".to_string(), m.map(PathBuf::from)),
            ]
        };
        let only_minimal = flavours_check(&at(None, Some("/m")));
        assert!(only_minimal.ok && only_minimal.detail.contains("`jail rootfs build data`"), "{only_minimal:?}");
        let only_data = flavours_check(&at(Some("/d"), None));
        assert!(only_data.detail.starts_with("data at /d") && only_data.detail.contains("build minimal"));
        let both = flavours_check(&at(Some("/d"), Some("/m")));
        assert!(both.detail.contains("data at /d") && both.detail.contains("minimal at /m") && !both.detail.contains("build"));
        assert!(flavours_check(&at(None, None)).detail.contains("`jail rootfs build minimal`"));
    }

    #[test]
    fn kernel_releases_parse_to_major_minor() {
        assert_eq!(kernel_version("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("x"), None);
    }
}
