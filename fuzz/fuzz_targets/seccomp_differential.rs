//! Fuzz target (b), differential: for a random seccomp policy and random
//! syscalls, the decision of the policy model's reference evaluator
//! (`jail::seccomp::Model::evaluate`) equals the decision of the BPF program
//! libseccomp compiled from it, run in the jail's userspace cBPF interpreter
//! (`jail::seccomp::bpf`). Both compile modes are checked. Policies the
//! validator rejects are skipped; a policy it accepts that libseccomp then
//! refuses to compile is a finding too.
#![no_main]

use arbitrary::Arbitrary;
use jail::seccomp::bpf::SeccompData;
use jail::seccomp::model::{self, ActionFile, ConditionFile, DefaultFile, Number, RuleFile, SeccompFile, NATIVE_ARCH};
use jail::seccomp::{self, Mode, SeccompError};
use libfuzzer_sys::fuzz_target;

/// Few names, so that rules collide on the same syscall and the
/// validator's exclusivity checks and libseccomp's rule merging are hit.
const POOL: [&str; 10] = [
    "read",
    "ioctl",
    "socket",
    "clone",
    "personality",
    "mmap",
    "futex",
    "kill",
    "prctl",
    "getpid",
];
const OPS: [&str; 8] = ["eq", "ne", "lt", "le", "gt", "ge", "masked_eq", "not_in"];
const ERRNOS: [&str; 4] = ["EPERM", "ENOSYS", "EACCES", "EAFNOSUPPORT"];

#[derive(Arbitrary, Debug)]
enum ArbAction {
    Allow,
    Kill,
    Errno(u8, bool),
}

#[derive(Arbitrary, Debug)]
struct ArbCond {
    arg: u8,
    op: u8,
    value: u64,
    mask: u64,
    values: Vec<u64>,
}

#[derive(Arbitrary, Debug)]
struct ArbRule {
    syscalls: Vec<u8>,
    action: ArbAction,
    when: Vec<ArbCond>,
}

#[derive(Arbitrary, Debug)]
enum ArbArg {
    Raw(u64),
    /// A constant from some rule's conditions, nudged: the boundaries are
    /// where a compiler gets comparisons wrong.
    Near {
        rule: u8,
        cond: u8,
        nudge: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct ArbCall {
    syscall: u8,
    raw_nr: Option<i32>,
    arch: u8,
    args: [ArbArg; 6],
}

#[derive(Arbitrary, Debug)]
struct Input {
    default_errno: u8,
    default_report: bool,
    rules: Vec<ArbRule>,
    calls: Vec<ArbCall>,
}

fn num(v: u64) -> Option<Number> {
    Some(Number::Int(v))
}

fn policy(input: &Input) -> SeccompFile {
    let action = |a: &ArbAction| match a {
        ArbAction::Allow => ActionFile::Allow,
        ArbAction::Kill => ActionFile::KillProcess,
        ArbAction::Errno(e, report) => {
            ActionFile::Errno { errno: ERRNOS[*e as usize % ERRNOS.len()].to_string(), report: Some(*report) }
        }
    };
    let rules = input
        .rules
        .iter()
        .take(12)
        .map(|r| RuleFile {
            syscalls: r.syscalls.iter().take(3).map(|s| POOL[*s as usize % POOL.len()].to_string()).collect(),
            action: action(&r.action),
            when: r
                .when
                .iter()
                .take(3)
                .map(|c| {
                    let op = OPS[c.op as usize % OPS.len()];
                    let (value, mask, values) = match op {
                        "masked_eq" => (num(c.value & c.mask), num(c.mask), None),
                        "not_in" => (None, num(c.mask), Some(c.values.iter().take(4).map(|v| Number::Int(v & c.mask)).collect())),
                        _ => (num(c.value), None, None),
                    };
                    ConditionFile { arg: c.arg % 6, op: op.to_string(), value, mask, values }
                })
                .collect(),
            why: "fuzz".into(),
        })
        .collect();
    SeccompFile {
        default: DefaultFile {
            action: ActionFile::Errno {
                errno: ERRNOS[input.default_errno as usize % ERRNOS.len()].to_string(),
                report: Some(input.default_report),
            },
            why: "fuzz".into(),
        },
        rules,
    }
}

fn near(input: &Input, rule: u8, cond: u8, nudge: u8) -> u64 {
    let rules: Vec<&ArbRule> = input.rules.iter().take(12).collect();
    let Some(r) = rules.get(rule as usize % rules.len().max(1)) else { return nudge as u64 };
    let Some(c) = r.when.get(cond as usize % r.when.len().max(1)) else { return nudge as u64 };
    let base = match nudge % 4 {
        0 => c.value,
        1 => c.value & c.mask,
        2 => c.values.first().copied().unwrap_or(c.value) & c.mask,
        _ => c.mask,
    };
    match (nudge / 4) % 6 {
        0 => base,
        1 => base.wrapping_add(1),
        2 => base.wrapping_sub(1),
        3 => base ^ (1 << 32),
        4 => base | 0xffff_ffff_0000_0000,
        _ => base ^ 1,
    }
}

fuzz_target!(|input: Input| {
    let file = policy(&input);
    let Ok(m) = model::Model::from_file(&file, "seccomp") else { return };
    for mode in [Mode::Notify, Mode::ErrnoOnly] {
        let filter = match seccomp::compile(&m, mode) {
            Ok(f) => f,
            // Too many instructions for the kernel is a limit, not a bug.
            Err(SeccompError::Program(seccomp::bpf::BpfError::Size(_))) => return,
            Err(e) => panic!("an accepted policy did not compile: {e}: {:?}\n{file:#?}", std::error::Error::source(&e)),
        };
        for call in input.calls.iter().take(32) {
            let nr = call.raw_nr.unwrap_or_else(|| model::resolve(POOL[call.syscall as usize % POOL.len()]).unwrap_or(0));
            let arch = match call.arch % 8 {
                0 => 0x4000_0003, // i386
                1 => 0xc000_00b7, // aarch64
                2 => call.arch as u32 * 0x0101_0101,
                _ => NATIVE_ARCH,
            };
            let mut args = [0u64; 6];
            for (slot, a) in args.iter_mut().zip(&call.args) {
                *slot = match a {
                    ArbArg::Raw(v) => *v,
                    ArbArg::Near { rule, cond, nudge } => near(&input, *rule, *cond, *nudge),
                };
            }
            let data = SeccompData { nr, arch, instruction_pointer: 0, args };
            if let Err(mismatch) = seccomp::check_call(&m, &filter, &data) {
                panic!(
                    "{mode:?}: the compiled filter disagrees with the model: {mismatch:#x?}\n{file:#?}\n{}",
                    seccomp::bpf::disassemble(&filter.program)
                );
            }
        }
    }
});
