//! A child's spec on its way to the template: the supervisor's
//! [`ChildSpec`] as one JSON message and its descriptors, in a fixed
//! order, beside it (`SCM_RIGHTS`). Only a supervisor writes it, to a
//! socket only its uid reaches, and only this crate's own code in the
//! template reads it: the template runs no untrusted code.
//!
//! The descriptors: `release`, `report`, `status`, `stdout`, `stderr`,
//! then `output`, `notify`, `proxy`, `cgroup` and `stdin`, each only when
//! `has` says the spec holds it. The seccomp program travels as the
//! bytes the seccomp cache stores (bpf.rs, `encode`), in base64.

use std::ffi::CString;
#[cfg(test)]
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::child::{ChildSpec, Confine, Exec};
use crate::mounts::MountOp;
use crate::rlimits::Rlimit;
use crate::seccomp::{bpf, Filter, Mode};
use crate::{landlock, mounts};

/// The largest message a template takes (template.py reads at most this).
pub(crate) const MAX_MESSAGE: usize = 1 << 20;

#[derive(Serialize, Deserialize)]
pub(crate) struct Wire {
    mounts: Vec<MountOp>,
    staging: PathBuf,
    uid: u32,
    gid: u32,
    hostname: String,
    /// What the interpreter would have been exec'd with: the fork's
    /// interpreter takes its argv and environment from here (template.py).
    pub(crate) exec: WireExec,
    rlimits: Vec<Rlimit>,
    landlock: landlock::Plan,
    landlock_rules: Vec<landlock::PathRule>,
    seccomp: String,
    seccomp_mode: Mode,
    seccomp_sha256: String,
    tcp_connect: Vec<u16>,
    cpus: Option<Vec<usize>>,
    /// Whether `output`, `notify`, `proxy`, `cgroup` and `stdin` follow the
    /// five descriptors every spec has, in that order.
    has: [bool; 5],
    uid_mapped_by_supervisor: bool,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct WireExec {
    path: String,
    pub(crate) argv: Vec<String>,
    pub(crate) envp: Vec<String>,
    cwd: PathBuf,
    umask: u32,
}

/// The message and the descriptors for `spec`, which a fork cannot take
/// without a seccomp filter (the template itself runs without one).
pub(crate) fn encode(spec: ChildSpec) -> Result<(Vec<u8>, Vec<OwnedFd>), String> {
    let ChildSpec {
        release,
        report,
        status,
        stdout,
        stderr,
        mounts,
        staging,
        uid,
        gid,
        hostname,
        exec,
        rlimits,
        output,
        confine,
        proxy,
        cgroup,
        cpus,
        stdin,
        keep_host_root,
        uid_mapped_by_supervisor,
    } = spec;
    if keep_host_root {
        return Err("a template's own jail is never a fork".into());
    }
    let Confine { landlock, landlock_rules, seccomp, notify, tcp_connect } = confine;
    let filter = seccomp.ok_or("a fork is always given a seccomp filter")?;
    let text = |c: &CString, what: &str| {
        c.to_str()
            .map(str::to_string)
            .map_err(|_| format!("the template takes UTF-8 only, and the {what} is not"))
    };
    let exec = WireExec {
        path: text(&exec.path, "interpreter's path")?,
        argv: exec.argv.iter().map(|a| text(a, "interpreter's arguments")).collect::<Result<_, _>>()?,
        envp: exec.envp.iter().map(|e| text(e, "environment")).collect::<Result<_, _>>()?,
        cwd: exec.cwd,
        umask: exec.umask,
    };
    let optional = [output, notify, proxy, cgroup, stdin];
    let has = optional.each_ref().map(Option::is_some);
    let program = bpf::encode(&filter.program);
    let wire = Wire {
        mounts,
        staging,
        uid,
        gid,
        hostname,
        exec,
        rlimits,
        landlock,
        landlock_rules,
        seccomp: base64::engine::general_purpose::STANDARD.encode(program),
        seccomp_mode: filter.mode,
        seccomp_sha256: filter.sha256,
        tcp_connect,
        cpus,
        has,
        uid_mapped_by_supervisor,
    };
    let bytes = serde_json::to_vec(&wire).map_err(|e| format!("encode the child's spec: {e}"))?;
    if bytes.len() > MAX_MESSAGE {
        return Err(format!("the child's spec is {} bytes, more than the template takes ({MAX_MESSAGE})", bytes.len()));
    }
    let mut fds = vec![release, report, status, stdout, stderr];
    fds.extend(optional.into_iter().flatten());
    Ok((bytes, fds))
}

/// The spec back from what [`encode`] made (the descriptors must be
/// exactly the ones it names), and the interpreter's argv and environment
/// as JSON (`{"argv": [...], "envp": [...]}`), which the fork's
/// interpreter takes up where an exec would have set them.
pub(crate) fn decode(msg: &[u8], fds: Vec<OwnedFd>) -> Result<(ChildSpec, Vec<u8>), String> {
    let wire: Wire = serde_json::from_slice(msg).map_err(|e| format!("decode the child's spec: {e}"))?;
    let exec_json = serde_json::to_vec(&serde_json::json!({"argv": wire.exec.argv, "envp": wire.exec.envp}))
        .map_err(|e| format!("encode the interpreter's argv: {e}"))?;
    let want = 5 + wire.has.iter().filter(|h| **h).count();
    if fds.len() != want {
        return Err(format!("the spec names {want} descriptors and {} came", fds.len()));
    }
    let mut fds = fds.into_iter();
    let mut next = |present: bool| if present { fds.next() } else { None };
    let (release, report, status, stdout, stderr) = match (next(true), next(true), next(true), next(true), next(true)) {
        (Some(a), Some(b), Some(c), Some(d), Some(e)) => (a, b, c, d, e),
        _ => return Err("fewer descriptors than the spec names".into()),
    };
    let [output, notify, proxy, cgroup, stdin] = wire.has.map(next);
    let cstr = |s: String| CString::new(s).map_err(|_| "a NUL byte in the interpreter's argv or environment".to_string());
    let exec = Exec {
        path: cstr(wire.exec.path)?,
        argv: wire.exec.argv.into_iter().map(cstr).collect::<Result<_, _>>()?,
        envp: wire.exec.envp.into_iter().map(cstr).collect::<Result<_, _>>()?,
        cwd: wire.exec.cwd,
        umask: wire.exec.umask,
    };
    let program = base64::engine::general_purpose::STANDARD
        .decode(wire.seccomp)
        .map_err(|e| format!("decode the seccomp program: {e}"))?;
    // Checked as a cached program is (seccomp/cache.rs): the kernel would
    // refuse no less.
    let program = bpf::decode(&program).map_err(|e| format!("decode the seccomp program: {e}"))?;
    bpf::check(&program).map_err(|e| format!("the seccomp program: {e}"))?;
    let filter = Filter { program, mode: wire.seccomp_mode, sha256: wire.seccomp_sha256 };
    if !wire.mounts.iter().any(|op| matches!(op, mounts::MountOp::Proc { .. })) {
        return Err("the spec's mount plan has no /proc: not a jail's".into());
    }
    Ok((
        ChildSpec {
            release,
            report,
            status,
            stdout,
            stderr,
            mounts: wire.mounts,
            staging: wire.staging,
            uid: wire.uid,
            gid: wire.gid,
            hostname: wire.hostname,
            exec,
            rlimits: wire.rlimits,
            output,
            confine: Confine {
                landlock: wire.landlock,
                landlock_rules: wire.landlock_rules,
                seccomp: Some(filter),
                notify,
                tcp_connect: wire.tcp_connect,
            },
            proxy,
            cgroup,
            cpus: wire.cpus,
            stdin,
            keep_host_root: false,
            uid_mapped_by_supervisor: wire.uid_mapped_by_supervisor,
        },
        exec_json,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn spec(with_proc: bool) -> ChildSpec {
        let fd = || crate::sync::Pipe::new().unwrap().read;
        let policy = Policy::builtin_default().unwrap();
        let filter = crate::seccomp::compile(&policy.seccomp, Mode::ErrnoOnly).unwrap();
        let mut mounts = vec![MountOp::Dir { path: "/workspace".into(), mode: 0o755 }];
        if with_proc {
            mounts.push(MountOp::Proc { path: "/proc".into() });
        }
        ChildSpec {
            release: fd(),
            report: fd(),
            status: fd(),
            stdout: fd(),
            stderr: fd(),
            mounts,
            staging: "/tmp".into(),
            uid: 1000,
            gid: 1000,
            hostname: "sandbox".into(),
            exec: Exec {
                path: CString::new("/usr/bin/python3").unwrap(),
                argv: vec![
                    CString::new("/usr/bin/python3").unwrap(),
                    CString::new("/.jail/d.py").unwrap(),
                ],
                envp: vec![CString::new("LANG=C.UTF-8").unwrap()],
                cwd: "/workspace/output".into(),
                umask: 0o022,
            },
            rlimits: vec![],
            output: None,
            confine: Confine {
                landlock: landlock::plan(0, &policy.landlock).unwrap(),
                landlock_rules: vec![],
                seccomp: Some(filter),
                notify: None,
                tcp_connect: vec![],
            },
            proxy: None,
            cgroup: Some(fd()),
            cpus: None,
            stdin: Some(fd()),
            keep_host_root: false,
            uid_mapped_by_supervisor: true,
        }
    }

    #[test]
    fn a_spec_comes_back_whole_with_its_descriptors_in_order() {
        let original = spec(true);
        let program = original.confine.seccomp.as_ref().unwrap().program.clone();
        let (msg, fds) = encode(original).unwrap();
        assert_eq!(fds.len(), 7, "five, the cgroup's and stdin");
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let (back, exec) = decode(&msg, fds).unwrap();
        let exec: serde_json::Value = serde_json::from_slice(&exec).unwrap();
        assert_eq!(exec["envp"], serde_json::json!(["LANG=C.UTF-8"]));
        assert_eq!(back.confine.seccomp.unwrap().program, program);
        assert_eq!(back.exec.argv[1].to_str().unwrap(), "/.jail/d.py");
        assert_eq!(back.release.as_raw_fd(), raw[0]);
        assert_eq!(back.cgroup.map(|f| f.as_raw_fd()), Some(raw[5]));
        assert_eq!(back.stdin.map(|f| f.as_raw_fd()), Some(raw[6]));
        assert!(back.output.is_none() && back.confine.notify.is_none());
    }

    #[test]
    fn what_is_not_a_forks_spec_is_refused() {
        let (msg, mut fds) = encode(spec(true)).unwrap();
        fds.pop();
        assert!(decode(&msg, fds).err().unwrap().contains("descriptors"));
        let (msg, fds) = encode(spec(false)).unwrap();
        assert!(decode(&msg, fds).err().unwrap().contains("/proc"));
        let mut template = spec(true);
        template.keep_host_root = true;
        assert!(encode(template).is_err());
        let mut bare = spec(true);
        bare.confine.seccomp = None;
        assert!(encode(bare).is_err());
        let (msg, fds) = encode(spec(true)).unwrap();
        let text = String::from_utf8(msg).unwrap();
        let cut = text.replace("\"seccomp\":\"", "\"seccomp\":\"AAAA");
        assert!(decode(cut.as_bytes(), fds).err().unwrap().contains("seccomp"));
    }
}
