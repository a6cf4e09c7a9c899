//! Policy invariants: what every policy's seccomp section must keep,
//! whatever it says: the calls the jail itself makes after loading, the
//! refusals no policy may lift, and the socket families each network mode
//! allows. `Policy::load` runs these; each names the offending field.

use super::model::{self, Action, Cause, Model, Report, Verdict};
use super::notify::family_name;
use crate::field::FieldError;

/// The calls the jail itself makes after the filter is loaded, which every
/// policy must allow unconditionally: sending the listener, and the exec.
pub(super) const JAIL_NEEDS: [&str; 2] = ["sendmsg", "execve"];

/// Policy check: `JAIL_NEEDS` are allowed without conditions.
pub(crate) fn check_jail_needs(model: &Model) -> Result<(), FieldError> {
    for name in JAIL_NEEDS {
        let ok = model::resolve(name)
            .is_some_and(|nr| model.rules_for(nr).any(|(_, r)| r.action == Action::Allow && r.when.is_empty()));
        if !ok {
            return Err(FieldError {
                field: "seccomp.rules".into(),
                message: format!(
                    "`{name}` must be allowed without conditions: the jail itself calls it after loading the filter"
                ),
            });
        }
    }
    Ok(())
}

/// Syscalls no policy may allow in any form: each is kernel attack surface
/// or a way around another layer, and none is needed by Python.
pub(super) const ALWAYS_REFUSED: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "clone3",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "iopl",
    "ioperm",
];

const CLONE_NEW_FLAGS: [u64; 7] = [
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];

/// Policy check: the refusals every run keeps whatever a policy says.
pub(crate) fn check_floor(model: &Model) -> Result<(), FieldError> {
    let refuse = |i: usize, what: &str| FieldError {
        field: format!("seccomp.rules[{i}]"),
        message: format!("allows {what}, which this jail always refuses (policies/README.md, \"Always refused\")"),
    };
    for name in ALWAYS_REFUSED {
        let Some(nr) = model::resolve(name) else { continue };
        if let Some((i, _)) = model.rules_for(nr).find(|(_, r)| r.action == Action::Allow) {
            return Err(refuse(i, &format!("`{name}`")));
        }
    }
    let mut probes: Vec<(&str, [u64; 6], String)> = Vec::new();
    for flag in CLONE_NEW_FLAGS {
        for extra in [
            0,
            libc::SIGCHLD as u64,
            0x0001_0f00, /* CLONE_VM|FS|FILES|SIGHAND|THREAD */
        ] {
            probes.push(("clone", [flag | extra, 0, 0, 0, 0, 0], format!("clone with namespace flag {flag:#x}")));
        }
    }
    for cmd in [0x5412u64, 0x541c] {
        for high in [0, 1u64 << 32, 0xffff_ffff_0000_0000] {
            probes.push(("ioctl", [0, cmd | high, 0, 0, 0, 0], format!("ioctl {cmd:#x} (TIOCSTI/TIOCLINUX)")));
        }
    }
    for persona in [
        0x0040000u64, /* ADDR_NO_RANDOMIZE */
        0x0400000,    /* READ_IMPLIES_EXEC */
        0x0008,       /* PER_LINUX32 */
    ] {
        probes.push(("personality", [persona, 0, 0, 0, 0, 0], format!("personality({persona:#x})")));
    }
    for (name, args, what) in probes {
        if let Some(v) = model.evaluate_named(name, args) {
            if let (Action::Allow, Cause::Rule(i)) = (v.action, v.cause) {
                return Err(refuse(i, &what));
            }
        }
    }
    Ok(())
}

/// Policy check for `network.mode: none`: socket() is refused for every
/// address family but AF_UNIX.
pub(crate) fn check_network_none(model: &Model) -> Result<(), FieldError> {
    check_socket_families(model, &[libc::AF_UNIX], "none: only AF_UNIX sockets may be created")
}

/// socket() must be refused for every address family not in `allowed`
/// (probed over every family number, and with high bits set, since the
/// kernel reads the argument as an int), whatever the socket type: a rule
/// that allows by type alone (`arg 1 eq SOCK_DGRAM`) allows every family.
fn check_socket_families(model: &Model, allowed: &[libc::c_int], why: &str) -> Result<(), FieldError> {
    let allowed: Vec<u64> = allowed.iter().map(|&f| f as u64).collect();
    let families = (0..=64u64).filter(|f| !allowed.contains(f)).chain([1u64 << 32 | 2, u64::MAX]);
    let types = [
        libc::SOCK_STREAM,
        libc::SOCK_DGRAM,
        libc::SOCK_RAW,
        libc::SOCK_SEQPACKET,
        libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
    ];
    for fam in families {
        for ty in types {
            if let Some(Verdict { action: Action::Allow, cause }) = model.evaluate_named("socket", [fam, ty as u64, 0, 0, 0, 0]) {
                let field = match cause {
                    Cause::Rule(i) => format!("seccomp.rules[{i}]"),
                    _ => "seccomp".into(),
                };
                return Err(FieldError {
                    field,
                    message: format!("allows socket() for {}, but network.mode is {why}", family_name(fam)),
                });
            }
        }
    }
    Ok(())
}

/// A policy with `network.mode: allowlist`: the filter allows AF_UNIX
/// sockets and no other family; AF_INET and AF_INET6 sockets must be
/// counted refusals (`report: true`), which is what sends them to the
/// supervisor to let the TCP stream ones through (`Tally::answer`). A rule
/// that allowed them outright would let UDP and raw sockets through too.
pub(crate) fn check_network_allowlist(model: &Model) -> Result<(), FieldError> {
    check_socket_families(
        model,
        &[libc::AF_UNIX],
        "allowlist: the filter may allow only AF_UNIX sockets; AF_INET and AF_INET6 must be refused with a counted errno \
         (\"report\": true) so the supervisor lets TCP stream sockets through and nothing else",
    )?;
    for fam in [libc::AF_INET, libc::AF_INET6] {
        let verdict = model.evaluate_named("socket", [fam as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0]);
        if !matches!(verdict, Some(Verdict { action: Action::Errno { report: Report::Counted, .. }, .. })) {
            return Err(FieldError {
                field: "seccomp".into(),
                message: format!(
                    "does not send socket({}, SOCK_STREAM) to the supervisor (a plain or silent refusal, or a kill), so the script could not reach the proxy; \
                     with network.mode allowlist make that refusal a counted errno (\"report\": true) or drop the seccomp \
                     section to get the default one",
                    family_name(fam as u64)
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::policy::Policy;

    #[test]
    fn policies_that_allow_what_the_jail_always_refuses_are_rejected() {
        let with_rule = |rule: &str| {
            let mut v: serde_json::Value = serde_json::from_str(crate::policy::DEFAULT_POLICY_JSON).unwrap();
            let rules = v["seccomp"]["rules"].as_array_mut().unwrap();
            rules.retain(|r| {
                let names = r["syscalls"].as_array().unwrap();
                !names
                    .iter()
                    .any(|n| ["ptrace", "socket", "ioctl", "clone", "personality"].contains(&n.as_str().unwrap()))
            });
            rules.push(serde_json::from_str(rule).unwrap());
            rules.push(serde_json::from_str(r#"{"syscalls": ["ioctl"], "action": "allow", "why": "w", "when": [{"arg": 1, "op": "not_in", "mask": "LOW_32_BITS", "values": ["TIOCSTI", "TIOCLINUX"]}]}"#).unwrap());
            Policy::from_json(&v.to_string(), std::path::Path::new("/")).map(|_| ()).map_err(|e| e.to_string())
        };
        assert!(with_rule(r#"{"syscalls": ["getpid"], "action": "allow", "why": "w"}"#).is_ok());
        let e =
            with_rule(r#"{"syscalls": ["ptrace"], "action": "allow", "when": [{"arg": 0, "op": "eq", "value": 5}], "why": "w"}"#)
                .unwrap_err();
        assert!(e.contains("`ptrace`") && e.contains("always refuses"), "{e}");
        let e = with_rule(r#"{"syscalls": ["clone"], "action": "allow", "why": "w"}"#).unwrap_err();
        assert!(e.contains("namespace flag"), "{e}");
        let e = with_rule(r#"{"syscalls": ["personality"], "action": "allow", "why": "w"}"#).unwrap_err();
        assert!(e.contains("personality"), "{e}");
        let e = with_rule(r#"{"syscalls": ["socket"], "action": "allow", "why": "w"}"#).unwrap_err();
        assert!(e.contains("AF_UNSPEC") || e.contains("AF_INET"), "{e}");
        assert!(e.contains("network.mode is none"), "{e}");
    }

    #[test]
    fn a_policy_must_leave_the_jail_its_own_calls() {
        let mut v: serde_json::Value = serde_json::from_str(crate::policy::DEFAULT_POLICY_JSON).unwrap();
        for r in v["seccomp"]["rules"].as_array_mut().unwrap() {
            if let Some(names) = r["syscalls"].as_array_mut() {
                names.retain(|n| n != "sendmsg");
            }
        }
        let e = Policy::from_json(&v.to_string(), std::path::Path::new("/")).unwrap_err().to_string();
        assert!(e.contains("`sendmsg`"), "{e}");
    }
}
