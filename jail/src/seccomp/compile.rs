//! Compile: the policy's [`Model`] into a classic BPF program with
//! libseccomp, run by the supervisor before the clone so a bad policy fails
//! before any fork; and the differential check of that program against the
//! model (the fuzzer's and the tests' oracle).

use std::io::{Read, Seek};

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext};

use super::bpf::{self, Insn, SeccompData};
use super::model::{self, Action, Model, Op, Report, Verdict};
use super::SeccompError;

/// How refusals marked `report` are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// They go to the supervisor (SECCOMP_RET_USER_NOTIF), which answers with
    /// the policy's errno and counts them.
    Notify,
    /// The kernel answers every refusal itself; nothing is counted. Used
    /// where the kernel has no user notification (before Linux 5.0).
    ErrnoOnly,
}

/// The best mode this kernel offers.
pub(crate) fn host_mode() -> Mode {
    let avail = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    if avail.split_whitespace().any(|a| a == "user_notif") {
        Mode::Notify
    } else {
        Mode::ErrnoOnly
    }
}

/// The raw filter return value an action compiles to.
pub(super) fn ret_value(action: Action, mode: Mode) -> u32 {
    match (action, mode) {
        (Action::Allow, _) => 0x7fff_0000,
        (Action::KillProcess, _) => 0x8000_0000,
        (Action::Errno { report: Report::Counted, .. }, Mode::Notify) => 0x7fc0_0000,
        (Action::Errno { errno, .. }, _) => 0x0005_0000 | (errno as u32 & 0xffff),
    }
}

fn scmp_action(action: Action, mode: Mode) -> ScmpAction {
    match (action, mode) {
        (Action::Allow, _) => ScmpAction::Allow,
        (Action::KillProcess, _) => ScmpAction::KillProcess,
        (Action::Errno { report: Report::Counted, .. }, Mode::Notify) => ScmpAction::Notify,
        (Action::Errno { errno, .. }, _) => ScmpAction::Errno(errno),
    }
}

/// A rule's conditions as libseccomp comparisons: one conjunction per cube
/// of each `not_in` (there is no such operator in libseccomp), the product
/// when a rule has several.
pub(super) fn conjunctions(when: &[model::Condition]) -> Vec<Vec<ScmpArgCompare>> {
    let mut out: Vec<Vec<ScmpArgCompare>> = vec![Vec::new()];
    for c in when {
        let arg = c.arg as u32;
        let choices: Vec<ScmpArgCompare> = match &c.op {
            Op::Eq(v) => vec![ScmpArgCompare::new(arg, ScmpCompareOp::Equal, *v)],
            Op::Ne(v) => vec![ScmpArgCompare::new(arg, ScmpCompareOp::NotEqual, *v)],
            Op::Lt(v) => vec![ScmpArgCompare::new(arg, ScmpCompareOp::Less, *v)],
            Op::Le(v) => vec![ScmpArgCompare::new(arg, ScmpCompareOp::LessOrEqual, *v)],
            Op::Gt(v) => vec![ScmpArgCompare::new(arg, ScmpCompareOp::Greater, *v)],
            Op::Ge(v) => vec![ScmpArgCompare::new(arg, ScmpCompareOp::GreaterEqual, *v)],
            Op::MaskedEq { mask, value } => vec![ScmpArgCompare::new(arg, ScmpCompareOp::MaskedEqual(*mask), *value)],
            Op::NotIn { mask, values } => model::not_in_cubes(*mask, values)
                .into_iter()
                .map(|(m, v)| ScmpArgCompare::new(arg, ScmpCompareOp::MaskedEqual(m), v))
                .collect(),
        };
        out = out
            .iter()
            .flat_map(|prefix| {
                choices.iter().map(move |cmp| {
                    let mut next = prefix.clone();
                    next.push(*cmp);
                    next
                })
            })
            .collect();
    }
    out
}

/// A compiled filter, ready to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub program: Vec<Insn>,
    pub mode: Mode,
    /// sha256 of the program as loaded, reported in the result.
    pub sha256: String,
}

/// Compile a model with libseccomp: the default action, the bad-arch
/// action (kill the process), and every rule whose action differs from the
/// default, exported as BPF and checked the way the kernel would check it.
pub fn compile(model: &Model, mode: Mode) -> Result<Filter, SeccompError> {
    let default = ret_value(model.default, mode);
    let mut ctx = ScmpFilterContext::new(scmp_action(model.default, mode)).map_err(SeccompError::Init)?;
    ctx.set_act_badarch(ScmpAction::KillProcess).map_err(|e| SeccompError::Attribute("badarch", e))?;
    // We set no_new_privs ourselves and load the exported program ourselves.
    ctx.set_ctl_nnp(false).map_err(|e| SeccompError::Attribute("nnp", e))?;
    // A binary search over syscall numbers instead of a linear chain: a
    // few hundred allowed calls cost ~10 comparisons each, not ~200.
    ctx.set_ctl_optimize(2).map_err(|e| SeccompError::Attribute("optimize", e))?;
    for (i, rule) in model.rules.iter().enumerate() {
        // libseccomp refuses rules that repeat the default action; they
        // change nothing anyway.
        if ret_value(rule.action, mode) == default {
            continue;
        }
        let action = scmp_action(rule.action, mode);
        for cmps in conjunctions(&rule.when) {
            for s in &rule.syscalls {
                ctx.add_rule_conditional(action, s.nr, &cmps).map_err(|source| SeccompError::AddRule {
                    syscall: s.name.clone(),
                    rule: i,
                    source,
                })?;
            }
        }
    }
    let fd = nix::sys::memfd::memfd_create(c"jail-seccomp", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
        .map_err(|e| SeccompError::ReadBack(e.into()))?;
    ctx.export_bpf(&fd).map_err(SeccompError::Export)?;
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    file.rewind().and_then(|_| file.read_to_end(&mut bytes)).map_err(SeccompError::ReadBack)?;
    let program = bpf::decode(&bytes).map_err(SeccompError::Program)?;
    bpf::check(&program).map_err(SeccompError::Program)?;
    Ok(Filter { program, mode, sha256: crate::digest::sha256_hex(&bytes) })
}

/// Where the compiled program and the model disagree on one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub call: SeccompData,
    pub model: Verdict,
    pub expected: u32,
    pub program: Result<u32, bpf::BpfError>,
}

/// The differential check the fuzzer runs: the program's decision for
/// `call` equals what the reference evaluator says the policy means.
pub fn check_call(model: &Model, filter: &Filter, call: &SeccompData) -> Result<(), Box<Mismatch>> {
    let verdict = model.evaluate(call);
    let expected = ret_value(verdict.action, filter.mode);
    let got = bpf::run(&filter.program, call);
    if got.as_ref().ok() == Some(&expected) {
        return Ok(());
    }
    Err(Box::new(Mismatch { call: *call, model: verdict, expected, program: got }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use crate::seccomp::model::NATIVE_ARCH;
    use crate::seccomp::tests::{data, default_model};

    #[test]
    fn the_default_policy_compiles_to_a_program_the_kernel_would_take() {
        let m = default_model();
        for mode in [Mode::Notify, Mode::ErrnoOnly] {
            let f = compile(&m, mode).unwrap();
            assert!(f.program.len() > 10 && f.program.len() <= bpf::MAX_INSNS, "{}", f.program.len());
            assert_eq!(f.sha256.len(), 64);
        }
    }

    #[test]
    fn the_compiled_default_policy_agrees_with_the_model_on_every_named_syscall() {
        let m = default_model();
        let probes: Vec<u64> = vec![
            0,
            1,
            2,
            10,
            16,
            17,
            40,
            0x5412,
            0x541c,
            0x5413,
            0x1_0000_5412,
            0xffff_ffff,
            0x2_0000,
            0x1000_0000,
            0x1001_1200,
            u64::MAX,
        ];
        for mode in [Mode::Notify, Mode::ErrnoOnly] {
            let f = compile(&m, mode).unwrap();
            let nrs: Vec<i32> = m.named_syscalls().chain(0..460).chain([-1, 0x4000_0027, 1 << 30 | 1]).collect();
            for nr in nrs {
                for &a in &probes {
                    for slot in 0..3 {
                        let mut args = [0u64; 6];
                        args[slot] = a;
                        let call = SeccompData { nr, arch: NATIVE_ARCH, instruction_pointer: 0, args };
                        check_call(&m, &f, &call)
                            .unwrap_or_else(|e| panic!("{mode:?}: {e:#x?}\n{}", bpf::disassemble(&f.program)));
                    }
                }
            }
            for arch in [0x4000_0003u32, 0xc000_00b7, 0] {
                check_call(&m, &f, &SeccompData { nr: 39, arch, ..Default::default() }).unwrap();
            }
        }
    }

    #[test]
    fn refusals_marked_report_go_to_the_supervisor_and_silent_ones_do_not() {
        let m = default_model();
        let f = compile(&m, Mode::Notify).unwrap();
        let ret = |name: &str, args| bpf::Ret::from_raw(bpf::run(&f.program, &data(name, args)).unwrap());
        assert_eq!(ret("socket", [2, 1, 0, 0, 0, 0]), bpf::Ret::UserNotif);
        assert_eq!(ret("socket", [1, 1, 0, 0, 0, 0]), bpf::Ret::Allow);
        assert_eq!(ret("ptrace", [0; 6]), bpf::Ret::UserNotif);
        assert_eq!(ret("clone3", [0; 6]), bpf::Ret::Errno(libc::ENOSYS as u16));
        let f = compile(&m, Mode::ErrnoOnly).unwrap();
        let ret = |name: &str, args| bpf::Ret::from_raw(bpf::run(&f.program, &data(name, args)).unwrap());
        assert_eq!(ret("socket", [2, 1, 0, 0, 0, 0]), bpf::Ret::Errno(libc::EPERM as u16));
    }

    #[test]
    fn calls_refused_for_uncounted_memory_get_enosys_and_the_rest_of_the_policy_stays() {
        let m = default_model();
        assert_eq!(m.evaluate_named("memfd_create", [0; 6]).unwrap().action, Action::Allow);
        let r = m.with_refused(&crate::limits::UNCOUNTED_MEMORY_CALLS, "why");
        let enosys = Action::Errno { errno: libc::ENOSYS, report: Report::Counted };
        for name in crate::limits::UNCOUNTED_MEMORY_CALLS {
            let v = r.evaluate_named(name, [0; 6]).unwrap();
            assert_eq!(v.action, enosys, "{name}");
            assert_eq!(r.why(v.cause), "why");
        }
        // Their neighbours in the same rules are still allowed.
        for name in ["shmat", "shmctl", "mkdirat", "semop", "msgsnd"] {
            assert_eq!(r.evaluate_named(name, [0; 6]).unwrap().action, Action::Allow, "{name}");
        }
        let f = compile(&r, Mode::Notify).unwrap();
        for nr in r.named_syscalls().collect::<Vec<_>>() {
            check_call(&r, &f, &SeccompData { nr, arch: NATIVE_ARCH, instruction_pointer: 0, args: [0; 6] }).unwrap();
        }
        // A syscall the policy kills in some form stays killed.
        let killing = Policy::from_json(
            r#"{"version":1,"seccomp":{"default":{"action":{"errno":"ENOSYS"},"why":"w"},"rules":[
                {"syscalls":["sendmsg","execve"],"action":"allow","why":"w"},
                {"syscalls":["memfd_create"],"action":"kill_process","why":"w"}]}}"#,
            std::path::Path::new("/"),
        )
        .unwrap();
        let r = killing.seccomp.with_refused(&["memfd_create"], "why");
        assert_eq!(r.evaluate_named("memfd_create", [0; 6]).unwrap().action, Action::KillProcess);
    }
}
