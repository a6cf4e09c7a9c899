//! Whole-value tests: each request below, on each host below, plans to the
//! exact run written in `testdata/<name>.plan` (its `{:#?}` rendering).
//! After a deliberate change, `JAIL_BLESS=1 cargo test -p jail --lib plan`
//! rewrites them; review the diff like code.

use std::path::{Path, PathBuf};

use super::*;
use crate::cgroup::{Candidate, Parent, Version};
use crate::mounts::{Code, RootfsEntry};
use crate::rlimits::Kind;

fn policy(name: &str) -> Policy {
    match name {
        "default" => Policy::builtin_default().unwrap(),
        file => Policy::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies").join(file)).unwrap(),
    }
}

fn request(policy: Policy) -> RunRequest {
    RunRequest {
        template: None,
        policy,
        script: PathBuf::from("analysis.py"),
        args: vec!["--rows".into(), "10".into()],
        input: None,
        output: None,
        code: None,
        rootfs: None,
        timeout: None,
        mode: OutputMode::Capture,
        host: Default::default(),
        env: Default::default(),
        step: crate::request::StepKind::Script,
    }
}

/// What `request::prepare` would have found, written by hand.
fn prepared(req: &RunRequest, resolver: Option<Resolver>) -> Prepared {
    let fs = &req.policy.filesystem;
    Prepared {
        mount_request: mounts::Request {
            rootfs: PathBuf::from("/srv/rootfs"),
            rootfs_entries: vec![
                RootfsEntry::Dir("usr".into()),
                RootfsEntry::Symlink("lib".into(), PathBuf::from("usr/lib")),
            ],
            input: Some(PathBuf::from("/home/u/in")),
            code: Code::Script { file: PathBuf::from("/home/u/analysis.py"), name: PathBuf::from("analysis.py") },
            output: PathBuf::from("/tmp/jail-output-1"),
            tmp_size: fs.tmp_size,
            shm_size: fs.shm_size,
            output_size: fs.output_size,
            meminfo: None,
            sys_files: vec![],
        },
        script: PathBuf::from("/workspace/code/analysis.py"),
        output_dir: PathBuf::from("/tmp/jail-output-1"),
        rootfs: PathBuf::from("/srv/rootfs"),
        rootfs_id: Some("ab12".into()),
        resolver,
    }
}

/// Root on a v1 host whose root cgroups it may write: the CI machine.
fn root_v1() -> Host {
    let parent = |ctl: &str| Parent {
        dir: PathBuf::from(format!("/sys/fs/cgroup/{ctl}/jail")),
        controllers: vec![ctl.into()],
    };
    Host {
        caller_uid: 0,
        caller_gid: 0,
        host_uid: 1_879_048_192,
        host_gid: 1_879_048_192,
        seccomp_mode: seccomp::Mode::Notify,
        notify_continue: true,
        landlock_abi: 7,
        rlimit_hard: vec![(Kind::Nofile, 1_048_576)],
        cgroup: Some(Candidate {
            version: Version::V1,
            parents: vec![parent("memory"), parent("cpu"), parent("pids")],
        }),
        cgroup_why_not: "cgroup v2: no controllers delegated".into(),
        systemd_scope: None,
        env: BTreeMap::new(),
        // Two CPUs; the default policy's `cpus: 1` pins to one of them.
        inside: crate::inside::HostFacts {
            meminfo: "MemTotal:       24683664 kB\nMemFree:         6007244 kB\nMemAvailable:   23386120 kB\n\
                      SwapTotal:             0 kB\nHugepagesize:       2048 kB\n"
                .into(),
            cpus: vec![0, 1],
            seed: 0,
        },
    }
}

/// An ordinary user where no cgroup is writable: rlimits only.
fn user_rlimits_only() -> Host {
    Host {
        caller_uid: 1000,
        caller_gid: 1000,
        host_uid: 1000,
        host_gid: 1000,
        rlimit_hard: vec![(Kind::Nofile, 4096), (Kind::Nproc, 63_000)],
        cgroup: None,
        cgroup_why_not: "cgroup v2: /sys/fs/cgroup/user.slice is not writable; cgroup v1: not mounted".into(),
        ..root_v1()
    }
}

/// An ordinary user given a delegated v2 parent (systemd-run --user -p Delegate=yes).
fn user_v2_delegated() -> Host {
    Host {
        cgroup: Some(Candidate {
            version: Version::V2,
            parents: vec![Parent {
                dir: PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/jail.scope"),
                controllers: vec!["cpu".into(), "memory".into(), "pids".into()],
            }],
        }),
        cgroup_why_not: String::new(),
        ..user_rlimits_only()
    }
}

/// The plan, or the refusal, rendered whole and compared with its file.
fn check(name: &str, req: &RunRequest, prepared: &Prepared, host: &Host) {
    let got = match plan(req, prepared, host) {
        Ok(p) => format!("{p:#?}\n"),
        Err(r) => format!("refused: {}\n{r:#?}\n", r.error),
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plan/testdata").join(format!("{name}.plan"));
    if std::env::var_os("JAIL_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if got != want {
        let new = path.with_extension("plan.new");
        std::fs::write(&new, &got).unwrap();
        panic!("{name}: the plan differs from {}; see {} (JAIL_BLESS=1 accepts it)", path.display(), new.display());
    }
}

#[test]
fn the_default_policy_as_root_on_a_v1_host() {
    let req = request(policy("default"));
    check("default", &req, &prepared(&req, None), &root_v1());
}

#[test]
fn an_allowlist_plans_the_proxy_its_port_and_its_channel() {
    let req = request(policy("allowlist-example.json"));
    let plan = plan(&req, &prepared(&req, Some(Resolver::default())), &root_v1()).unwrap();
    assert!(plan.channels.proxy && plan.channels.notify);
    check("allowlist", &req, &prepared(&req, Some(Resolver::default())), &root_v1());
}

#[test]
fn an_unlimited_output_is_a_bind_with_the_shared_group_umask() {
    let mut policy = policy("default");
    policy.filesystem.output_size = None;
    let req = request(policy);
    let plan = plan(&req, &prepared(&req, None), &root_v1()).unwrap();
    assert!(!plan.channels.output);
    assert_eq!(plan.exec.umask, 0o007);
    check("output-unlimited", &req, &prepared(&req, None), &root_v1());
}

#[test]
fn an_ordinary_user_on_an_rlimit_only_host() {
    let mut req = request(policy("default"));
    req.mode = OutputMode::Stream;
    check("user-rlimits-only", &req, &prepared(&req, None), &user_rlimits_only());
}

#[test]
fn an_ordinary_user_with_a_delegated_v2_parent() {
    let req = request(policy("default"));
    check("user-v2-delegated", &req, &prepared(&req, None), &user_v2_delegated());
}

#[test]
fn an_allowlist_without_seccomp_notification_fails_instead_of_allowing_udp() {
    let req = request(policy("allowlist-example.json"));
    let p = prepared(&req, Some(Resolver::default()));
    let old = Host { seccomp_mode: seccomp::Mode::ErrnoOnly, ..root_v1() };
    let e = plan(&req, &p, &old).unwrap_err().error;
    assert_eq!(e.stage(), Stage::Seccomp);
    assert!(e.to_string().contains("network.mode none"), "{e}");
    let default = request(policy("default"));
    assert!(plan(&default, &prepared(&default, None), &old).is_ok());
}

#[test]
fn an_allowlist_on_a_kernel_without_notification_continue_fails_with_the_version() {
    let req = request(policy("allowlist-example.json"));
    let p = prepared(&req, Some(Resolver::default()));
    let old = Host { notify_continue: false, ..root_v1() };
    let e = plan(&req, &p, &old).unwrap_err().error;
    assert_eq!(e.stage(), Stage::Seccomp);
    assert!(e.to_string().contains("Linux 5.5"), "{e}");
    // Network off needs no CONTINUE.
    let default = request(policy("default"));
    assert!(plan(&default, &prepared(&default, None), &old).is_ok());
}

#[test]
fn a_required_limit_nothing_enforces_is_refused_with_the_limits_reported() {
    let mut policy = policy("default");
    policy.limits.enforcement.memory = crate::policy::Enforcement::Required;
    let req = request(policy);
    let r = plan(&req, &prepared(&req, None), &user_rlimits_only()).unwrap_err();
    assert_eq!(r.error.stage(), Stage::Limits);
    assert!(!r.limits.is_empty());
    assert!(plan(&req, &prepared(&req, None), &user_v2_delegated()).is_ok());
}

#[test]
fn a_pass_through_variable_comes_from_the_host_facts_only() {
    let mut policy = policy("default");
    policy.environment.pass = vec!["TZ".into()];
    let req = request(policy);
    let host = Host { env: [("TZ".to_string(), "UTC".to_string())].into(), ..root_v1() };
    let plan = plan(&req, &prepared(&req, None), &host).unwrap();
    assert!(plan.exec.envp.iter().any(|e| e.to_bytes() == b"TZ=UTC"));
    let plan = super::plan(&req, &prepared(&req, None), &root_v1()).unwrap();
    assert!(!plan.exec.envp.iter().any(|e| e.to_bytes().starts_with(b"TZ=")));
}
