//! The seccomp policy model: the `seccomp` section of a policy as written
//! ([`SeccompFile`]), its validated form ([`Model`]), and the reference
//! evaluator ([`Model::evaluate`]) that says what the policy means for one
//! syscall.
//!
//! The meaning is deliberately simple, so that a person can read a policy
//! and so that libseccomp compiles it exactly:
//! - a rule matches a call when the call is one of its `syscalls` and every
//!   condition in `when` holds (each compares one argument, at most one
//!   condition per argument);
//! - every rule that matches a call gives it the same action, which
//!   validation guarantees: two rules for one syscall with different actions
//!   must both have conditions, and the conditions must provably exclude each
//!   other (libseccomp silently drops conditional rules under an
//!   unconditional one, and orders overlapping ones by its own priorities);
//! - a call no rule matches gets the default action, which is always an
//!   errno: a script learns it was refused, it is never silently killed;
//! - a call from another architecture (i386, and x32 on x86_64, where every
//!   number from the x32 bit up but -1 counts as foreign) kills the process,
//!   since a second syscall table would bypass every rule.
//!
//! The evaluator is the specification the compiled BPF program is fuzzed
//! against (fuzz/), and the supervisor uses it to answer user notifications,
//! so the errno a script sees is the policy's by construction.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::bpf::SeccompData;
use crate::field::FieldError;

/// `AUDIT_ARCH_*` of the architecture this jail is built for: the only one
/// whose syscalls a filter lets through.
#[cfg(target_arch = "x86_64")]
pub const NATIVE_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
pub const NATIVE_ARCH: u32 = 0xc000_00b7;
/// The bit that selects the x32 syscall table on x86_64 (`__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
#[cfg(target_arch = "aarch64")]
pub(crate) const X32_SYSCALL_BIT: u32 = 0;
/// The architecture's name, as error messages give it.
#[cfg(target_arch = "x86_64")]
pub(crate) const NATIVE_ARCH_NAME: &str = "x86_64";
#[cfg(target_arch = "aarch64")]
pub(crate) const NATIVE_ARCH_NAME: &str = "aarch64";

/// Most values one `not_in` condition may list: each value multiplies the
/// BPF code libseccomp generates for the rule.
pub(crate) const MAX_NOT_IN_VALUES: usize = 8;
/// Most libseccomp rules one policy rule may expand to (each `not_in` is a
/// union of masked comparisons, and several multiply).
pub(crate) const MAX_EXPANSION: usize = 256;

/// Names a condition's number may use instead of digits, so a policy reads
/// `"AF_UNIX"` rather than `1`. `|` combines them: `"CLONE_NEWNS|CLONE_NEWPID"`.
pub(crate) const CONSTANTS: &[(&str, u64)] = &[
    ("AF_UNIX", 1),
    ("AF_INET", 2),
    ("AF_INET6", 10),
    ("AF_NETLINK", 16),
    ("AF_PACKET", 17),
    ("AF_VSOCK", 40),
    ("TIOCSTI", 0x5412),
    ("TIOCLINUX", 0x541c),
    ("CLONE_NEWTIME", 0x80),
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
    ("PER_LINUX", 0),
    ("PERSONALITY_QUERY", 0xffff_ffff),
    ("LOW_32_BITS", 0xffff_ffff),
];

/// Errno names an `errno` action may use.
pub const ERRNOS: &[(&str, i32)] = &[
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("ESRCH", libc::ESRCH),
    ("EINTR", libc::EINTR),
    ("EIO", libc::EIO),
    ("ENXIO", libc::ENXIO),
    ("E2BIG", libc::E2BIG),
    ("ENOEXEC", libc::ENOEXEC),
    ("EBADF", libc::EBADF),
    ("ECHILD", libc::ECHILD),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EACCES", libc::EACCES),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("EEXIST", libc::EEXIST),
    ("EXDEV", libc::EXDEV),
    ("ENODEV", libc::ENODEV),
    ("ENOTDIR", libc::ENOTDIR),
    ("EISDIR", libc::EISDIR),
    ("EINVAL", libc::EINVAL),
    ("ENFILE", libc::ENFILE),
    ("EMFILE", libc::EMFILE),
    ("ENOTTY", libc::ENOTTY),
    ("EFBIG", libc::EFBIG),
    ("ENOSPC", libc::ENOSPC),
    ("ESPIPE", libc::ESPIPE),
    ("EROFS", libc::EROFS),
    ("EMLINK", libc::EMLINK),
    ("EPIPE", libc::EPIPE),
    ("ERANGE", libc::ERANGE),
    ("ENOSYS", libc::ENOSYS),
    ("ENOTSOCK", libc::ENOTSOCK),
    ("EPROTONOSUPPORT", libc::EPROTONOSUPPORT),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
    ("EAFNOSUPPORT", libc::EAFNOSUPPORT),
    ("EADDRNOTAVAIL", libc::EADDRNOTAVAIL),
    ("ENETUNREACH", libc::ENETUNREACH),
    ("ECONNREFUSED", libc::ECONNREFUSED),
];

/// The name of an errno number, when it is one [`ERRNOS`] lists.
pub(crate) fn errno_name(errno: i32) -> Option<&'static str> {
    ERRNOS.iter().find(|(_, n)| *n == errno).map(|(name, _)| *name)
}

// ---------------------------------------------------------------- wire types

/// The `seccomp` section of a policy file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SeccompFile {
    /// What a syscall no rule matches gets.
    pub default: DefaultFile,
    #[serde(default)]
    pub rules: Vec<RuleFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DefaultFile {
    pub action: ActionFile,
    pub why: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// Syscall names, as libseccomp knows them for this architecture.
    pub syscalls: Vec<String>,
    pub action: ActionFile,
    /// Conditions on the arguments; all must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<ConditionFile>,
    /// Why the rule exists, in one sentence; shown with a denial it causes.
    pub why: String,
}

/// `"allow"`, `"kill_process"`, or `{"errno": "EPERM"}` with an optional
/// `"report": false` for a refusal that is expected and not worth reporting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "serde_json::Value")]
pub enum ActionFile {
    Allow,
    KillProcess,
    Errno { errno: String, report: Option<bool> },
}

impl TryFrom<serde_json::Value> for ActionFile {
    type Error = String;

    fn try_from(v: serde_json::Value) -> Result<Self, Self::Error> {
        const EXPECTED: &str = r#"expected "allow", "kill_process" or {"errno": "EPERM"} (optionally with "report": false)"#;
        match v {
            serde_json::Value::String(s) if s == "allow" => Ok(ActionFile::Allow),
            serde_json::Value::String(s) if s == "kill_process" => Ok(ActionFile::KillProcess),
            serde_json::Value::Object(map) => {
                let mut errno = None;
                let mut report = None;
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("errno", serde_json::Value::String(s)) => errno = Some(s),
                        ("report", serde_json::Value::Bool(b)) => report = Some(b),
                        ("errno", _) => return Err("`errno` must be a name such as \"EPERM\"".into()),
                        ("report", _) => return Err("`report` must be true or false".into()),
                        (other, _) => return Err(format!("unknown field `{other}`: {EXPECTED}")),
                    }
                }
                match errno {
                    Some(errno) => Ok(ActionFile::Errno { errno, report }),
                    None => Err(format!("missing `errno`: {EXPECTED}")),
                }
            }
            other => Err(format!("`{other}` is not an action: {EXPECTED}")),
        }
    }
}

impl From<ActionFile> for serde_json::Value {
    fn from(a: ActionFile) -> Self {
        match a {
            ActionFile::Allow => "allow".into(),
            ActionFile::KillProcess => "kill_process".into(),
            ActionFile::Errno { errno, report } => {
                let mut m = serde_json::Map::new();
                m.insert("errno".into(), errno.into());
                if let Some(r) = report {
                    m.insert("report".into(), r.into());
                }
                serde_json::Value::Object(m)
            }
        }
    }
}

/// One argument comparison.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConditionFile {
    /// Argument index, 0 to 5.
    pub arg: u8,
    /// `eq`, `ne`, `lt`, `le`, `gt`, `ge` (unsigned 64-bit), `masked_eq`
    /// (`arg & mask == value`) or `not_in` (`arg & mask` is none of `values`).
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Number>>,
}

/// A number: JSON digits, or a string with decimal or `0x` hex digits, a
/// name from [`CONSTANTS`], or names joined by `|`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Number {
    Int(u64),
    Text(String),
}

impl Number {
    pub fn value(&self) -> Result<u64, String> {
        match self {
            Number::Int(n) => Ok(*n),
            Number::Text(t) => {
                let mut acc = 0u64;
                for part in t.split('|') {
                    acc |= parse_number_part(part.trim())?;
                }
                Ok(acc)
            }
        }
    }
}

fn parse_number_part(p: &str) -> Result<u64, String> {
    if let Some(hex) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).map_err(|_| format!("`{p}` is not a hex number"));
    }
    if p.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        return p.parse().map_err(|_| format!("`{p}` is not a number"));
    }
    CONSTANTS.iter().find(|(n, _)| *n == p).map(|(_, v)| *v).ok_or_else(|| {
        format!("`{p}` is not a number or a known name (write digits, 0x hex, or one of the names in policies/README.md)")
    })
}

// -------------------------------------------------------------- domain types

/// Whether a refusal is reported in the result's `denials`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Report {
    /// Counted and named in the result (seccomp user notification).
    Counted,
    /// Expected refusals, such as clone3 that libc retries as clone.
    Silent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    Errno { errno: i32, report: Report },
    KillProcess,
}

impl Action {
    fn describe(&self) -> String {
        match self {
            Action::Allow => "allow".into(),
            Action::KillProcess => "kill_process".into(),
            Action::Errno { errno, .. } => format!("errno {}", errno_name(*errno).unwrap_or("?")),
        }
    }
}

/// One argument comparison, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Eq(u64),
    Ne(u64),
    Lt(u64),
    Le(u64),
    Gt(u64),
    Ge(u64),
    MaskedEq {
        mask: u64,
        value: u64,
    },
    /// `arg & mask` is none of `values` (each already within `mask`).
    NotIn {
        mask: u64,
        values: Vec<u64>,
    },
}

impl Op {
    pub fn matches(&self, x: u64) -> bool {
        match self {
            Op::Eq(v) => x == *v,
            Op::Ne(v) => x != *v,
            Op::Lt(v) => x < *v,
            Op::Le(v) => x <= *v,
            Op::Gt(v) => x > *v,
            Op::Ge(v) => x >= *v,
            Op::MaskedEq { mask, value } => x & mask == *value,
            Op::NotIn { mask, values } => !values.contains(&(x & mask)),
        }
    }

    /// The one value this op accepts, when it accepts exactly one.
    fn singleton(&self) -> Option<u64> {
        match self {
            Op::Eq(v) => Some(*v),
            Op::Le(0) | Op::Lt(1) => Some(0),
            Op::Ge(u64::MAX) => Some(u64::MAX),
            Op::Gt(v) if *v == u64::MAX - 1 => Some(u64::MAX),
            Op::MaskedEq { mask: u64::MAX, value } => Some(*value),
            _ => None,
        }
    }

    /// The inclusive range a comparison op accepts.
    fn interval(&self) -> Option<(u64, u64)> {
        match self {
            Op::Eq(v) => Some((*v, *v)),
            Op::Lt(v) => v.checked_sub(1).map(|hi| (0, hi)),
            Op::Le(v) => Some((0, *v)),
            Op::Gt(v) => v.checked_add(1).map(|lo| (lo, u64::MAX)),
            Op::Ge(v) => Some((*v, u64::MAX)),
            _ => None,
        }
    }

    /// Whether this op accepts no value at all.
    fn is_empty(&self) -> bool {
        match self {
            Op::Lt(0) | Op::Gt(u64::MAX) => true,
            Op::NotIn { mask, values } => {
                let bits = mask.count_ones();
                bits < 64 && values.len() as u128 >= 1u128 << bits
            }
            _ => false,
        }
    }
}

/// Whether no value satisfies both ops. Conservative: `false` means "could
/// not prove it", which validation treats as overlapping.
pub(crate) fn exclusive(a: &Op, b: &Op) -> bool {
    if let Some(p) = a.singleton() {
        return !b.matches(p);
    }
    if let Some(p) = b.singleton() {
        return !a.matches(p);
    }
    if let (Some((alo, ahi)), Some((blo, bhi))) = (a.interval(), b.interval()) {
        return ahi < blo || bhi < alo;
    }
    match (a, b) {
        (Op::MaskedEq { mask: m1, value: v1 }, Op::MaskedEq { mask: m2, value: v2 }) => (v1 ^ v2) & m1 & m2 != 0,
        (Op::MaskedEq { mask, value }, Op::NotIn { mask: m2, values })
        | (Op::NotIn { mask: m2, values }, Op::MaskedEq { mask, value }) => {
            // When the masked_eq fixes every bit not_in looks at, the two
            // exclude each other exactly when that fixed value is listed.
            m2 & !mask == 0 && values.contains(&(value & m2))
        }
        _ => false,
    }
}

/// A condition on one argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub arg: usize,
    pub op: Op,
}

/// A syscall as the policy names it and as the kernel numbers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Syscall {
    pub name: String,
    pub nr: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub syscalls: Vec<Syscall>,
    pub action: Action,
    pub when: Vec<Condition>,
    pub why: String,
}

impl Rule {
    pub(crate) fn matches_args(&self, args: &[u64; 6]) -> bool {
        self.when.iter().all(|c| c.op.matches(args[c.arg]))
    }
}

/// Why the evaluator decided what it decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The rule at this index in `Model::rules` matched.
    Rule(usize),
    /// No rule matched.
    Default,
    /// The call came from another architecture's syscall table.
    ForeignArch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub action: Action,
    pub cause: Cause,
}

/// A validated seccomp policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub default: Action,
    pub default_why: String,
    pub rules: Vec<Rule>,
    /// Rule indices by syscall number, in policy order.
    by_nr: BTreeMap<i32, Vec<usize>>,
}

/// Resolve a syscall name for this architecture, as libseccomp does.
pub fn resolve(name: &str) -> Option<i32> {
    let nr = libseccomp::ScmpSyscall::from_name(name).ok()?.as_raw_syscall();
    // Negative numbers are libseccomp's stand-ins for calls this
    // architecture does not have (socketcall on x86_64, for instance).
    (nr >= 0).then_some(nr)
}

/// The name of a syscall number on this architecture.
pub(crate) fn syscall_name(nr: i32) -> String {
    libseccomp::ScmpSyscall::from_raw_syscall(nr).get_name().unwrap_or_else(|_| format!("syscall {nr}"))
}

fn field(path: String, message: impl Into<String>) -> FieldError {
    FieldError::new(path, message)
}

fn action(file: &ActionFile, path: &str) -> Result<Action, FieldError> {
    Ok(match file {
        ActionFile::Allow => Action::Allow,
        ActionFile::KillProcess => Action::KillProcess,
        ActionFile::Errno { errno, report } => {
            let n = ERRNOS.iter().find(|(name, _)| name == errno).map(|(_, n)| *n).ok_or_else(|| {
                field(
                    format!("{path}.errno"),
                    format!("`{errno}` is not an errno this jail knows (use EPERM, ENOSYS, EACCES, EAFNOSUPPORT, ...)"),
                )
            })?;
            let report = if report.unwrap_or(true) { Report::Counted } else { Report::Silent };
            Action::Errno { errno: n, report }
        }
    })
}

fn number(n: &Option<Number>, path: String, what: &str, op: &str) -> Result<u64, FieldError> {
    match n {
        None => Err(field(path, format!("`{op}` needs a `{what}`"))),
        Some(n) => n.value().map_err(|m| field(path, m)),
    }
}

fn condition(c: &ConditionFile, path: &str) -> Result<Condition, FieldError> {
    if c.arg > 5 {
        return Err(field(format!("{path}.arg"), format!("is {}, syscalls have arguments 0 to 5", c.arg)));
    }
    let unused = |present: bool, name: &str| -> Result<(), FieldError> {
        if present {
            Err(field(format!("{path}.{name}"), format!("is not used by `{}`; remove it", c.op)))
        } else {
            Ok(())
        }
    };
    let value = || number(&c.value, format!("{path}.value"), "value", &c.op);
    let op = match c.op.as_str() {
        "eq" | "ne" | "lt" | "le" | "gt" | "ge" => {
            unused(c.mask.is_some(), "mask")?;
            unused(c.values.is_some(), "values")?;
            let v = value()?;
            match c.op.as_str() {
                "eq" => Op::Eq(v),
                "ne" => Op::Ne(v),
                "lt" => Op::Lt(v),
                "le" => Op::Le(v),
                "gt" => Op::Gt(v),
                _ => Op::Ge(v),
            }
        }
        "masked_eq" => {
            unused(c.values.is_some(), "values")?;
            let mask = number(&c.mask, format!("{path}.mask"), "mask", &c.op)?;
            let v = value()?;
            if mask == 0 {
                return Err(field(format!("{path}.mask"), "is 0, which compares nothing"));
            }
            if v & !mask != 0 {
                return Err(field(
                    format!("{path}.value"),
                    format!("{v:#x} has bits outside the mask {mask:#x}, so it could never match"),
                ));
            }
            Op::MaskedEq { mask, value: v }
        }
        "not_in" => {
            unused(c.value.is_some(), "value")?;
            let mask = match &c.mask {
                None => u64::MAX,
                Some(_) => number(&c.mask, format!("{path}.mask"), "mask", &c.op)?,
            };
            if mask == 0 {
                return Err(field(format!("{path}.mask"), "is 0, which compares nothing"));
            }
            let list = c
                .values
                .as_ref()
                .ok_or_else(|| field(format!("{path}.values"), "`not_in` needs a list of `values`"))?;
            if list.is_empty() || list.len() > MAX_NOT_IN_VALUES {
                return Err(field(format!("{path}.values"), format!("must list 1 to {MAX_NOT_IN_VALUES} values")));
            }
            let mut values = Vec::new();
            for (i, n) in list.iter().enumerate() {
                let v = n.value().map_err(|m| field(format!("{path}.values[{i}]"), m))?;
                if v & !mask != 0 {
                    return Err(field(format!("{path}.values[{i}]"), format!("{v:#x} has bits outside the mask {mask:#x}")));
                }
                if !values.contains(&v) {
                    values.push(v);
                }
            }
            Op::NotIn { mask, values }
        }
        other => {
            return Err(field(
                format!("{path}.op"),
                format!("`{other}` is not an operator (use eq, ne, lt, le, gt, ge, masked_eq or not_in)"),
            ))
        }
    };
    if op.is_empty() {
        return Err(field(path.to_string(), "can never hold, so the rule would never match"));
    }
    Ok(Condition { arg: c.arg as usize, op })
}

impl Model {
    /// Validate the `seccomp` section; `prefix` is its path in the policy
    /// (`seccomp`), so every error names the exact field.
    pub fn from_file(file: &SeccompFile, prefix: &str) -> Result<Model, FieldError> {
        let default = action(&file.default.action, &format!("{prefix}.default.action"))?;
        if !matches!(default, Action::Errno { .. }) {
            return Err(field(
                format!("{prefix}.default.action"),
                "must be an errno (such as {\"errno\": \"ENOSYS\"}): an allowed default is no allowlist, and a killed \
                 script never learns what it hit",
            ));
        }
        if file.default.why.trim().is_empty() {
            return Err(field(format!("{prefix}.default.why"), "must say why, in one sentence"));
        }
        // Every unknown name at once, so `jail check` lists them all.
        let unknown: Vec<(String, &str)> = file
            .rules
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                r.syscalls
                    .iter()
                    .enumerate()
                    .map(move |(j, n)| (format!("{prefix}.rules[{i}].syscalls[{j}]"), n.as_str()))
            })
            .filter(|(_, n)| resolve(n).is_none())
            .collect();
        if let Some((path, name)) = unknown.first() {
            let also: Vec<String> = unknown[1..].iter().map(|(p, n)| format!("`{n}` at {p}")).collect();
            let mut message = format!("`{name}` is not a syscall libseccomp knows on {NATIVE_ARCH_NAME}");
            if !also.is_empty() {
                message.push_str(&format!("; also unknown: {}", also.join(", ")));
            }
            return Err(field(path.clone(), message));
        }
        let mut rules = Vec::with_capacity(file.rules.len());
        let mut by_nr: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, r) in file.rules.iter().enumerate() {
            let path = format!("{prefix}.rules[{i}]");
            if r.why.trim().is_empty() {
                return Err(field(format!("{path}.why"), "every rule must say why it exists"));
            }
            if r.syscalls.is_empty() {
                return Err(field(format!("{path}.syscalls"), "lists no syscall"));
            }
            let mut syscalls: Vec<Syscall> = Vec::with_capacity(r.syscalls.len());
            for (j, name) in r.syscalls.iter().enumerate() {
                let nr = resolve(name).ok_or_else(|| {
                    field(
                        format!("{path}.syscalls[{j}]"),
                        format!("`{name}` is not a syscall libseccomp knows on {NATIVE_ARCH_NAME}"),
                    )
                })?;
                if syscalls.iter().any(|s| s.nr == nr) {
                    return Err(field(format!("{path}.syscalls[{j}]"), format!("`{name}` is listed twice")));
                }
                syscalls.push(Syscall { name: name.clone(), nr });
            }
            let act = action(&r.action, &format!("{path}.action"))?;
            let mut when: Vec<Condition> = Vec::with_capacity(r.when.len());
            for (j, c) in r.when.iter().enumerate() {
                let cond = condition(c, &format!("{path}.when[{j}]"))?;
                if when.iter().any(|w| w.arg == cond.arg) {
                    return Err(field(
                        format!("{path}.when[{j}].arg"),
                        format!(
                            "argument {} is already compared in this rule; libseccomp compares each argument once per rule",
                            cond.arg
                        ),
                    ));
                }
                when.push(cond);
            }
            let expansion = when.iter().try_fold(1usize, |acc, c| match &c.op {
                Op::NotIn { mask, values } => acc.checked_mul(not_in_cubes(*mask, values).len().max(1)),
                _ => Some(acc),
            });
            if !matches!(expansion, Some(n) if n <= MAX_EXPANSION) {
                return Err(field(
                    format!("{path}.when"),
                    format!("expands to more than {MAX_EXPANSION} libseccomp rules; use fewer not_in conditions or values"),
                ));
            }
            for s in &syscalls {
                by_nr.entry(s.nr).or_default().push(i);
            }
            rules.push(Rule { syscalls, action: act, when, why: r.why.clone() });
        }
        let model = Model { default, default_why: file.default.why.clone(), rules, by_nr };
        model.check_unambiguous(prefix)?;
        model.check_one_argument(prefix)?;
        Ok(model)
    }

    /// A syscall whose conditions become more than one libseccomp rule must
    /// compare a single argument in all of them, for equality only (eq, ne,
    /// masked_eq, not_in). fuzz/seccomp_differential found libseccomp 2.5.4
    /// wrong beyond that: it loops forever merging rules that compare
    /// different arguments (`a3 & m == v` with a 64-bit `m`, beside
    /// `a0 < x`), and it merges 64-bit range comparisons wrongly (`a3 > x`
    /// or `a3 >= y`, both allowed, refuses `a3 == x`). A lone rule may
    /// compare anything.
    fn check_one_argument(&self, prefix: &str) -> Result<(), FieldError> {
        for (nr, idx) in &self.by_nr {
            let conditional: Vec<usize> = idx.iter().copied().filter(|&i| !self.rules[i].when.is_empty()).collect();
            let expanded: usize = conditional
                .iter()
                .map(|&i| {
                    self.rules[i].when.iter().fold(1usize, |acc, c| match &c.op {
                        Op::NotIn { mask, values } => acc.saturating_mul(not_in_cubes(*mask, values).len()),
                        _ => acc,
                    })
                })
                .sum();
            if expanded <= 1 {
                continue;
            }
            let mut first: Option<(usize, usize)> = None;
            for &i in &conditional {
                for c in &self.rules[i].when {
                    if matches!(c.op, Op::Lt(_) | Op::Le(_) | Op::Gt(_) | Op::Ge(_)) {
                        return Err(field(
                            format!("{prefix}.rules[{i}].when"),
                            format!(
                                "`{}` has more than one rule, so its conditions may only test equality (eq, ne, \
                                 masked_eq, not_in): libseccomp 2.5 merges range comparisons (lt, le, gt, ge) of \
                                 several rules wrongly",
                                syscall_name(*nr)
                            ),
                        ));
                    }
                    match first {
                        None => first = Some((i, c.arg)),
                        Some((j, arg)) if arg != c.arg => {
                            return Err(field(
                                format!("{prefix}.rules[{i}].when"),
                                format!(
                                    "`{}` has conditions on argument {arg} (rules[{j}]) and argument {} here; with more \
                                     than one rule (or a not_in) for a syscall, every condition must compare the same \
                                     single argument, because libseccomp 2.5 can hang merging rules on different ones",
                                    syscall_name(*nr),
                                    c.arg
                                ),
                            ))
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// Every pair of rules giving one syscall different actions must both be
    /// conditional and provably exclusive.
    fn check_unambiguous(&self, prefix: &str) -> Result<(), FieldError> {
        for (nr, idx) in &self.by_nr {
            for (n, &i) in idx.iter().enumerate() {
                for &j in &idx[n + 1..] {
                    let (a, b) = (&self.rules[i], &self.rules[j]);
                    if a.action == b.action {
                        continue;
                    }
                    let name = syscall_name(*nr);
                    let (ai, bi) = (a.action.describe(), b.action.describe());
                    if a.when.is_empty() || b.when.is_empty() {
                        let (uncond, other) = if a.when.is_empty() { (i, j) } else { (j, i) };
                        return Err(field(
                            format!("{prefix}.rules[{other}]"),
                            format!(
                                "`{name}` also has an unconditional rule (rules[{uncond}]) with another action; libseccomp \
                                 would drop this one silently. Give rules[{uncond}] conditions that exclude this rule's \
                                 (not_in is made for that)"
                            ),
                        ));
                    }
                    let proven = a.when.iter().any(|ca| b.when.iter().any(|cb| ca.arg == cb.arg && exclusive(&ca.op, &cb.op)));
                    if !proven {
                        return Err(field(
                            format!("{prefix}.rules[{j}]"),
                            format!(
                                "`{name}` gets {bi} here and {ai} in rules[{i}], and the jail cannot prove the two rules' \
                                 conditions exclusive; compare one argument to values that cannot both hold"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// This policy with every form of the syscalls `names` refused: each
    /// loses its place in the policy's rules and gets one unconditional rule,
    /// ENOSYS and counted, or a kill where the policy already killed some
    /// form of it (never weaker than the policy). Names this architecture
    /// lacks are skipped.
    pub(crate) fn with_refused(&self, names: &[&str], why: &str) -> Model {
        let nrs: Vec<(String, i32)> = names.iter().filter_map(|n| resolve(n).map(|nr| (n.to_string(), nr))).collect();
        let killed = |nr: i32| self.rules_for(nr).any(|(_, r)| r.action == Action::KillProcess);
        let mut rules: Vec<Rule> = self
            .rules
            .iter()
            .filter_map(|r| {
                let syscalls: Vec<Syscall> =
                    r.syscalls.iter().filter(|s| !nrs.iter().any(|(_, nr)| *nr == s.nr)).cloned().collect();
                (!syscalls.is_empty()).then(|| Rule { syscalls, ..r.clone() })
            })
            .collect();
        for (name, nr) in &nrs {
            let action = if killed(*nr) {
                Action::KillProcess
            } else {
                Action::Errno { errno: libc::ENOSYS, report: Report::Counted }
            };
            rules.push(Rule {
                syscalls: vec![Syscall { name: name.clone(), nr: *nr }],
                action,
                when: vec![],
                why: why.to_string(),
            });
        }
        let mut by_nr: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, r) in rules.iter().enumerate() {
            for s in &r.syscalls {
                by_nr.entry(s.nr).or_default().push(i);
            }
        }
        Model { default: self.default, default_why: self.default_why.clone(), rules, by_nr }
    }

    /// The reference evaluator: what this policy does with one syscall.
    pub fn evaluate(&self, call: &SeccompData) -> Verdict {
        // On x86_64 every number from the x32 bit up is refused as foreign
        // (the x32 table, or no table at all), except -1, the number a
        // tracer uses to skip a call, which gets the default like any
        // unknown number. libseccomp generates exactly this check.
        let foreign_nr = X32_SYSCALL_BIT != 0 && call.nr as u32 >= X32_SYSCALL_BIT && call.nr != -1;
        if call.arch != NATIVE_ARCH || foreign_nr {
            return Verdict { action: Action::KillProcess, cause: Cause::ForeignArch };
        }
        if let Some(idx) = self.by_nr.get(&call.nr) {
            for &i in idx {
                if self.rules[i].matches_args(&call.args) {
                    return Verdict { action: self.rules[i].action, cause: Cause::Rule(i) };
                }
            }
        }
        Verdict { action: self.default, cause: Cause::Default }
    }

    /// What the policy does with syscall `name` and these arguments.
    pub(crate) fn evaluate_named(&self, name: &str, args: [u64; 6]) -> Option<Verdict> {
        let nr = resolve(name)?;
        Some(self.evaluate(&SeccompData { nr, arch: NATIVE_ARCH, instruction_pointer: 0, args }))
    }

    /// Syscall numbers some rule names, in ascending order.
    pub fn named_syscalls(&self) -> impl Iterator<Item = i32> + '_ {
        self.by_nr.keys().copied()
    }

    /// The rules that name syscall `nr`, in policy order.
    pub(crate) fn rules_for(&self, nr: i32) -> impl Iterator<Item = (usize, &Rule)> + '_ {
        self.by_nr.get(&nr).into_iter().flatten().map(|&i| (i, &self.rules[i]))
    }

    /// The `why` of what decided a verdict.
    pub fn why(&self, cause: Cause) -> &str {
        match cause {
            Cause::Rule(i) => &self.rules[i].why,
            Cause::Default => &self.default_why,
            Cause::ForeignArch => "calls through another architecture's syscall table are refused",
        }
    }
}

/// `arg & mask ∉ values` as a union of disjoint `arg & m == v` cubes, for
/// libseccomp, which has no such operator. Walks the mask's bits from the
/// top: at each bit, the branch no listed value takes is a cube; the branch
/// some values take is split further. At most `values × bits` cubes.
pub(crate) fn not_in_cubes(mask: u64, values: &[u64]) -> Vec<(u64, u64)> {
    let bits: Vec<u64> = (0..64).rev().map(|b| 1u64 << b).filter(|b| mask & b != 0).collect();
    let mut set: Vec<u64> = values.iter().map(|v| v & mask).collect();
    set.sort_unstable();
    set.dedup();
    let mut out = Vec::new();
    split(&bits, 0, 0, set, &mut out);
    out
}

fn split(bits: &[u64], m: u64, v: u64, set: Vec<u64>, out: &mut Vec<(u64, u64)>) {
    if set.is_empty() {
        out.push((m, v));
        return;
    }
    let Some((&b, rest)) = bits.split_first() else {
        // Every bit is fixed and the value is listed: nothing to cover.
        return;
    };
    let (ones, zeros): (Vec<u64>, Vec<u64>) = set.into_iter().partition(|x| x & b != 0);
    split(rest, m | b, v, zeros, out);
    split(rest, m | b, v | b, ones, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(json: &str) -> Result<Model, FieldError> {
        let file: SeccompFile = serde_json::from_str(json).unwrap();
        Model::from_file(&file, "seccomp")
    }

    const DEFAULT: &str = r#""default": {"action": {"errno": "ENOSYS"}, "why": "not allowed"}"#;

    fn call(m: &Model, name: &str, args: [u64; 6]) -> Action {
        m.evaluate_named(name, args).unwrap().action
    }

    #[test]
    fn rules_decide_by_name_and_arguments_and_the_rest_gets_the_default() {
        let m = model(&format!(
            r#"{{{DEFAULT}, "rules": [
                {{"syscalls": ["read", "write"], "action": "allow", "why": "io"}},
                {{"syscalls": ["socket"], "action": "allow", "when": [{{"arg": 0, "op": "eq", "value": "AF_UNIX"}}], "why": "unix"}},
                {{"syscalls": ["socket"], "action": {{"errno": "EPERM"}}, "when": [{{"arg": 0, "op": "ne", "value": 1}}], "why": "no net"}},
                {{"syscalls": ["clone3"], "action": {{"errno": "ENOSYS", "report": false}}, "why": "fallback"}}
            ]}}"#
        ))
        .unwrap();
        let enosys = Action::Errno { errno: libc::ENOSYS, report: Report::Counted };
        assert_eq!(call(&m, "read", [0; 6]), Action::Allow);
        assert_eq!(call(&m, "socket", [1, 0, 0, 0, 0, 0]), Action::Allow);
        assert_eq!(call(&m, "socket", [2, 0, 0, 0, 0, 0]), Action::Errno { errno: libc::EPERM, report: Report::Counted });
        assert_eq!(call(&m, "clone3", [0; 6]), Action::Errno { errno: libc::ENOSYS, report: Report::Silent });
        assert_eq!(call(&m, "ptrace", [0; 6]), enosys);
        let v = m.evaluate_named("socket", [10, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(m.why(v.cause), "no net");
    }

    #[test]
    fn foreign_architectures_and_x32_are_killed() {
        let m =
            model(&format!(r#"{{{DEFAULT}, "rules": [{{"syscalls": ["getpid"], "action": "allow", "why": "x"}}]}}"#)).unwrap();
        let nr = resolve("getpid").unwrap();
        let v = m.evaluate(&SeccompData { nr, arch: 0x4000_0003, ..Default::default() });
        assert_eq!(v.action, Action::KillProcess);
        if X32_SYSCALL_BIT != 0 {
            let v = m.evaluate(&SeccompData { nr: nr | X32_SYSCALL_BIT as i32, arch: NATIVE_ARCH, ..Default::default() });
            assert_eq!(v, Verdict { action: Action::KillProcess, cause: Cause::ForeignArch });
        }
    }

    #[test]
    fn an_unknown_syscall_is_named_with_its_field() {
        let err = model(&format!(
            r#"{{{DEFAULT}, "rules": [{{"syscalls": ["read", "frobnicate"], "action": "allow", "why": "x"}},
                                    {{"syscalls": ["twiddle"], "action": "allow", "why": "x"}}]}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("seccomp.rules[0].syscalls[1]") && err.contains("`frobnicate`"), "{err}");
        assert!(err.contains("`twiddle` at seccomp.rules[1].syscalls[0]"), "{err}");
        let err = model(&format!(r#"{{{DEFAULT}, "rules": [{{"syscalls": ["socketcall"], "action": "allow", "why": "x"}}]}}"#));
        if cfg!(target_arch = "x86_64") {
            assert!(err.unwrap_err().to_string().contains("socketcall"));
        }
    }

    #[test]
    fn a_default_that_allows_or_kills_is_refused() {
        for a in [r#""allow""#, r#""kill_process""#] {
            let err = model(&format!(r#"{{"default": {{"action": {a}, "why": "w"}}}}"#)).unwrap_err().to_string();
            assert!(err.contains("seccomp.default.action"), "{err}");
        }
    }

    #[test]
    fn bad_actions_operators_and_numbers_name_their_field() {
        let cases = [
            (r#"{"syscalls": ["read"], "action": "deny", "why": "w"}"#, "seccomp.rules[0].action"),
            (r#"{"syscalls": ["read"], "action": {"errno": "EWHAT"}, "why": "w"}"#, "seccomp.rules[0].action.errno"),
            (r#"{"syscalls": ["read"], "action": "allow", "why": ""}"#, "seccomp.rules[0].why"),
            (r#"{"syscalls": [], "action": "allow", "why": "w"}"#, "seccomp.rules[0].syscalls"),
            (
                r#"{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 6, "op": "eq", "value": 1}]}"#,
                "seccomp.rules[0].when[0].arg",
            ),
            (
                r#"{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 0, "op": "approx", "value": 1}]}"#,
                "seccomp.rules[0].when[0].op",
            ),
            (
                r#"{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 0, "op": "eq", "value": "AF_NOPE"}]}"#,
                "seccomp.rules[0].when[0].value",
            ),
            (
                r#"{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 0, "op": "eq"}]}"#,
                "seccomp.rules[0].when[0].value",
            ),
            (
                r#"{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 0, "op": "masked_eq", "mask": 1, "value": 2}]}"#,
                "seccomp.rules[0].when[0].value",
            ),
            (
                r#"{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 0, "op": "lt", "value": 0}]}"#,
                "seccomp.rules[0].when[0]",
            ),
            (
                r#"{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 0, "op": "eq", "value": 1}, {"arg": 0, "op": "ne", "value": 2}]}"#,
                "seccomp.rules[0].when[1].arg",
            ),
            (r#"{"syscalls": ["read", "read"], "action": "allow", "why": "w"}"#, "seccomp.rules[0].syscalls[1]"),
        ];
        for (rule, want) in cases {
            let json = format!(r#"{{{DEFAULT}, "rules": [{rule}]}}"#);
            let de = &mut serde_json::Deserializer::from_str(&json);
            let err = match serde_path_to_error::deserialize::<_, SeccompFile>(de) {
                Err(e) => format!("policy field `seccomp.{}`: {}", e.path(), e.inner()),
                Ok(f) => Model::from_file(&f, "seccomp").unwrap_err().to_string(),
            };
            assert!(err.starts_with(&format!("policy field `{want}`")), "{rule}: {err}");
        }
    }

    #[test]
    fn an_unconditional_rule_beside_a_conditional_one_with_another_action_is_refused() {
        let err = model(&format!(
            r#"{{{DEFAULT}, "rules": [
                {{"syscalls": ["ioctl"], "action": "allow", "why": "w"}},
                {{"syscalls": ["ioctl"], "action": {{"errno": "EPERM"}}, "when": [{{"arg": 1, "op": "masked_eq", "mask": "LOW_32_BITS", "value": "TIOCSTI"}}], "why": "w"}}
            ]}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("seccomp.rules[1]") && err.contains("unconditional"), "{err}");
    }

    #[test]
    fn overlapping_conditions_with_different_actions_are_refused_and_exclusive_ones_pass() {
        let rules = |c1: &str, c2: &str| {
            model(&format!(
                r#"{{{DEFAULT}, "rules": [
                    {{"syscalls": ["ioctl"], "action": "allow", "when": [{c1}], "why": "w"}},
                    {{"syscalls": ["ioctl"], "action": {{"errno": "EPERM"}}, "when": [{c2}], "why": "w"}}
                ]}}"#
            ))
        };
        let tiocsti = r#"{"arg": 1, "op": "masked_eq", "mask": "LOW_32_BITS", "value": "TIOCSTI"}"#;
        let not_tiocsti = r#"{"arg": 1, "op": "not_in", "mask": "LOW_32_BITS", "values": ["TIOCSTI", "TIOCLINUX"]}"#;
        assert!(rules(not_tiocsti, tiocsti).is_ok());
        assert!(rules(r#"{"arg": 1, "op": "eq", "value": 10}"#, r#"{"arg": 1, "op": "eq", "value": 11}"#).is_ok());
        assert!(rules(
            r#"{"arg": 1, "op": "masked_eq", "mask": 3, "value": 1}"#,
            r#"{"arg": 1, "op": "masked_eq", "mask": 6, "value": 4}"#
        )
        .is_err());
        assert!(rules(r#"{"arg": 1, "op": "ne", "value": 3}"#, r#"{"arg": 1, "op": "ne", "value": 4}"#).is_err());
        // Different arguments prove nothing.
        assert!(rules(r#"{"arg": 0, "op": "eq", "value": 3}"#, r#"{"arg": 1, "op": "eq", "value": 4}"#).is_err());
    }

    #[test]
    fn several_rules_for_one_syscall_must_compare_one_argument() {
        let two = |c1: &str, c2: &str| {
            model(&format!(
                r#"{{{DEFAULT}, "rules": [
                    {{"syscalls": ["mmap"], "action": "allow", "when": [{c1}], "why": "w"}},
                    {{"syscalls": ["mmap"], "action": "allow", "when": [{c2}], "why": "w"}}
                ]}}"#
            ))
        };
        assert!(two(r#"{"arg": 0, "op": "eq", "value": 1}"#, r#"{"arg": 0, "op": "masked_eq", "mask": 9, "value": 8}"#).is_ok());
        let err = two(r#"{"arg": 0, "op": "eq", "value": 1}"#, r#"{"arg": 0, "op": "lt", "value": 9}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("seccomp.rules[1].when") && err.contains("range"), "{err}");
        let err =
            two(r#"{"arg": 3, "op": "masked_eq", "mask": 4294967296, "value": 0}"#, r#"{"arg": 0, "op": "eq", "value": 9}"#)
                .unwrap_err()
                .to_string();
        assert!(err.contains("seccomp.rules[1].when") && err.contains("same"), "{err}");
        // One rule may compare several arguments, unless a not_in makes it several rules.
        let one = |when: &str| {
            model(&format!(
                r#"{{{DEFAULT}, "rules": [{{"syscalls": ["mmap"], "action": "allow", "when": {when}, "why": "w"}}]}}"#
            ))
        };
        assert!(one(r#"[{"arg": 0, "op": "eq", "value": 1}, {"arg": 2, "op": "lt", "value": 9}]"#).is_ok());
        assert!(one(r#"[{"arg": 3, "op": "not_in", "mask": 12, "values": [4]}, {"arg": 0, "op": "lt", "value": 9}]"#).is_err());
    }

    #[test]
    fn exclusive_is_never_wrong_about_a_pair_it_claims() {
        let ops = [
            Op::Eq(5),
            Op::Ne(5),
            Op::Lt(5),
            Op::Le(5),
            Op::Gt(5),
            Op::Ge(6),
            Op::MaskedEq { mask: 0xf, value: 5 },
            Op::MaskedEq { mask: 0x3, value: 2 },
            Op::NotIn { mask: 0xf, values: vec![5, 6] },
            Op::NotIn { mask: 0x7, values: vec![5] },
            Op::Le(0),
            Op::Ge(u64::MAX),
        ];
        let samples: Vec<u64> = (0..64).chain([u64::MAX, u64::MAX - 1, 1 << 32 | 5, 0x15]).collect();
        for a in &ops {
            for b in &ops {
                if exclusive(a, b) {
                    for x in &samples {
                        assert!(!(a.matches(*x) && b.matches(*x)), "{a:?} and {b:?} both take {x}");
                    }
                }
            }
        }
    }

    #[test]
    fn not_in_cubes_cover_exactly_the_complement() {
        for (mask, values) in [
            (0xffu64, vec![0x12u64, 0x1c]),
            (0xf0, vec![0x10, 0x20, 0xf0]),
            (0x5, vec![0, 1, 4]),
            (0x1, vec![1]),
        ] {
            let cubes = not_in_cubes(mask, &values);
            for x in 0..0x200u64 {
                let hits = cubes.iter().filter(|(m, v)| x & m == *v).count();
                let want = usize::from(!values.contains(&(x & mask)));
                assert_eq!(hits, want, "mask {mask:#x} values {values:x?} x {x:#x}: {cubes:x?}");
            }
        }
        assert!(not_in_cubes(0xffff_ffff, &[0x5412, 0x541c]).len() <= 64);
    }

    #[test]
    fn numbers_take_digits_hex_names_and_unions() {
        assert_eq!(Number::Int(7).value().unwrap(), 7);
        assert_eq!(Number::Text("0x5412".into()).value().unwrap(), 0x5412);
        assert_eq!(Number::Text("21522".into()).value().unwrap(), 0x5412);
        assert_eq!(Number::Text("TIOCSTI".into()).value().unwrap(), 0x5412);
        assert_eq!(Number::Text("CLONE_NEWNS | CLONE_NEWUSER".into()).value().unwrap(), 0x1002_0000);
        assert!(Number::Text("0xzz".into()).value().is_err());
        assert!(Number::Text("".into()).value().is_err());
    }

    #[test]
    fn actions_round_trip_through_json() {
        for text in [
            r#""allow""#,
            r#""kill_process""#,
            r#"{"errno":"EPERM"}"#,
            r#"{"errno":"ENOSYS","report":false}"#,
        ] {
            let a: ActionFile = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&a).unwrap(), text);
        }
        assert!(serde_json::from_str::<ActionFile>(r#"{"errno":"EPERM","x":1}"#).is_err());
        assert!(serde_json::from_str::<ActionFile>("3").is_err());
    }
}
