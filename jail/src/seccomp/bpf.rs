//! A userspace interpreter for classic BPF as seccomp runs it, and a
//! disassembler for reading what libseccomp generated.
//!
//! This is the independent half of the differential check (fuzz/ and the
//! unit tests in `seccomp`): libseccomp compiles our policy model to a BPF
//! program, this module runs that program on a `seccomp_data`, and the result
//! must equal what the reference evaluator in `model` says. It accepts the
//! instruction set the kernel's `seccomp_check_filter` accepts
//! (kernel/seccomp.c) and refuses everything else, so a program that runs
//! here is one the kernel would load.

use std::fmt;

/// Most instructions the kernel accepts in one filter (`BPF_MAXINSNS`).
pub(crate) const MAX_INSNS: usize = 4096;
/// Scratch memory words (`BPF_MEMWORDS`).
const MEM_WORDS: usize = 16;
/// `sizeof(struct seccomp_data)`.
pub(crate) const DATA_LEN: u32 = 64;

// Instruction classes and fields (include/uapi/linux/bpf_common.h).
const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_ST: u16 = 0x02;
const BPF_STX: u16 = 0x03;
const BPF_ALU: u16 = 0x04;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_MISC: u16 = 0x07;
const BPF_W: u16 = 0x00;
const BPF_IMM: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_MEM: u16 = 0x60;
const BPF_LEN: u16 = 0x80;
const BPF_K: u16 = 0x00;
const BPF_X: u16 = 0x08;
const BPF_A: u16 = 0x10;
const BPF_ADD: u16 = 0x00;
const BPF_SUB: u16 = 0x10;
const BPF_MUL: u16 = 0x20;
const BPF_DIV: u16 = 0x30;
const BPF_OR: u16 = 0x40;
const BPF_AND: u16 = 0x50;
const BPF_LSH: u16 = 0x60;
const BPF_RSH: u16 = 0x70;
const BPF_NEG: u16 = 0x80;
const BPF_MOD: u16 = 0x90;
const BPF_XOR: u16 = 0xa0;
const BPF_JA: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;
const BPF_JGT: u16 = 0x20;
const BPF_JGE: u16 = 0x30;
const BPF_JSET: u16 = 0x40;
const BPF_TAX: u16 = 0x00;
const BPF_TXA: u16 = 0x80;

/// One `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// `struct seccomp_data`: what a filter sees of one syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeccompData {
    pub nr: i32,
    pub arch: u32,
    pub instruction_pointer: u64,
    pub args: [u64; 6],
}

impl SeccompData {
    /// The 32-bit word at byte offset `off`, as the kernel's
    /// `populate_seccomp_data` lays the structure out (native endian).
    fn word(&self, off: u32) -> u32 {
        let mut bytes = [0u8; DATA_LEN as usize];
        bytes[0..4].copy_from_slice(&self.nr.to_ne_bytes());
        bytes[4..8].copy_from_slice(&self.arch.to_ne_bytes());
        bytes[8..16].copy_from_slice(&self.instruction_pointer.to_ne_bytes());
        for (i, a) in self.args.iter().enumerate() {
            bytes[16 + i * 8..24 + i * 8].copy_from_slice(&a.to_ne_bytes());
        }
        let o = off as usize;
        u32::from_ne_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BpfError {
    #[error("program length {0} is not a whole number of 8-byte instructions")]
    Length(usize),
    #[error("program has {0} instructions; the kernel takes 1 to 4096")]
    Size(usize),
    #[error("instruction {at}: opcode {code:#06x} is not allowed in a seccomp filter")]
    Opcode { at: usize, code: u16 },
    #[error("instruction {at}: load from offset {off} is outside seccomp_data or misaligned")]
    Load { at: usize, off: u32 },
    #[error("instruction {at}: scratch slot {slot} does not exist")]
    Slot { at: usize, slot: u32 },
    #[error("instruction {at}: reads scratch slot {slot} before any store")]
    Uninitialized { at: usize, slot: u32 },
    #[error("instruction {at}: jump lands outside the program")]
    Jump { at: usize },
    #[error("instruction {at}: division or modulo by a zero constant")]
    DivZero { at: usize },
    #[error("the last instruction is not a return")]
    NoReturn,
}

/// Split an exported program (`seccomp_export_bpf`) into instructions.
pub fn decode(bytes: &[u8]) -> Result<Vec<Insn>, BpfError> {
    if !bytes.len().is_multiple_of(8) {
        return Err(BpfError::Length(bytes.len()));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| Insn {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

/// The inverse of [`decode`].
pub fn encode(prog: &[Insn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prog.len() * 8);
    for i in prog {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.push(i.jt);
        out.push(i.jf);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

/// Check a program the way `seccomp_check_filter` and `bpf_check_classic`
/// would: size, allowed opcodes, aligned in-bounds loads, forward jumps that
/// stay inside the program, and a return at the end.
pub fn check(prog: &[Insn]) -> Result<(), BpfError> {
    if prog.is_empty() || prog.len() > MAX_INSNS {
        return Err(BpfError::Size(prog.len()));
    }
    for (at, i) in prog.iter().enumerate() {
        let class = i.code & 0x07;
        match i.code {
            c if c == BPF_LD | BPF_W | BPF_ABS => {
                if i.k % 4 != 0 || i.k >= DATA_LEN {
                    return Err(BpfError::Load { at, off: i.k });
                }
            }
            c if c == BPF_LD | BPF_W | BPF_LEN
                || c == BPF_LDX | BPF_W | BPF_LEN
                || c == BPF_LD | BPF_IMM
                || c == BPF_LDX | BPF_IMM
                || c == BPF_MISC | BPF_TAX
                || c == BPF_MISC | BPF_TXA
                || c == BPF_RET | BPF_K
                || c == BPF_RET | BPF_A => {}
            c if c == BPF_LD | BPF_MEM || c == BPF_LDX | BPF_MEM || c == BPF_ST || c == BPF_STX => {
                if i.k as usize >= MEM_WORDS {
                    return Err(BpfError::Slot { at, slot: i.k });
                }
            }
            c if class == BPF_ALU => {
                let op = c & 0xf0;
                let src = c & 0x08;
                let known = matches!(
                    op,
                    BPF_ADD | BPF_SUB | BPF_MUL | BPF_DIV | BPF_OR | BPF_AND | BPF_LSH | BPF_RSH | BPF_NEG | BPF_MOD | BPF_XOR
                );
                if !known || c & 0x07 != BPF_ALU || (op == BPF_NEG && src != 0) {
                    return Err(BpfError::Opcode { at, code: c });
                }
                if src == BPF_K && (op == BPF_DIV || op == BPF_MOD) && i.k == 0 {
                    return Err(BpfError::DivZero { at });
                }
            }
            c if class == BPF_JMP => {
                let op = c & 0xf0;
                if !matches!(op, BPF_JA | BPF_JEQ | BPF_JGT | BPF_JGE | BPF_JSET) || c & !0xf8 != BPF_JMP {
                    return Err(BpfError::Opcode { at, code: c });
                }
                let next = at + 1;
                let ok = if op == BPF_JA {
                    c == BPF_JMP | BPF_JA && next.checked_add(i.k as usize).is_some_and(|t| t < prog.len())
                } else {
                    next + (i.jt as usize) < prog.len() && next + (i.jf as usize) < prog.len()
                };
                if !ok {
                    return Err(BpfError::Jump { at });
                }
            }
            c => return Err(BpfError::Opcode { at, code: c }),
        }
    }
    let last = prog[prog.len() - 1].code;
    if last != BPF_RET | BPF_K && last != BPF_RET | BPF_A {
        return Err(BpfError::NoReturn);
    }
    Ok(())
}

/// Run a checked program on one syscall and return the filter's raw return
/// value (`SECCOMP_RET_*` action in the high 16 bits, data in the low 16).
pub fn run(prog: &[Insn], data: &SeccompData) -> Result<u32, BpfError> {
    check(prog)?;
    let (mut a, mut x) = (0u32, 0u32);
    let mut mem = [None::<u32>; MEM_WORDS];
    let mut pc = 0usize;
    // Jumps only go forward, so this ends in at most prog.len() steps.
    loop {
        let i = prog[pc];
        let at = pc;
        pc += 1;
        let class = i.code & 0x07;
        match class {
            BPF_LD | BPF_LDX => {
                let value = match i.code & 0xe0 {
                    BPF_ABS => data.word(i.k),
                    BPF_LEN => DATA_LEN,
                    BPF_IMM => i.k,
                    BPF_MEM => mem[i.k as usize].ok_or(BpfError::Uninitialized { at, slot: i.k })?,
                    _ => return Err(BpfError::Opcode { at, code: i.code }),
                };
                if class == BPF_LD {
                    a = value;
                } else {
                    x = value;
                }
            }
            BPF_ST => mem[i.k as usize] = Some(a),
            BPF_STX => mem[i.k as usize] = Some(x),
            BPF_ALU => {
                let operand = if i.code & BPF_X != 0 { x } else { i.k };
                a = match i.code & 0xf0 {
                    BPF_ADD => a.wrapping_add(operand),
                    BPF_SUB => a.wrapping_sub(operand),
                    BPF_MUL => a.wrapping_mul(operand),
                    // Classic BPF ends the program with 0 on a zero divisor
                    // held in X (net/core/filter.c); 0 is SECCOMP_RET_KILL_THREAD.
                    BPF_DIV if operand == 0 => return Ok(0),
                    BPF_DIV => a / operand,
                    BPF_MOD if operand == 0 => return Ok(0),
                    BPF_MOD => a % operand,
                    BPF_OR => a | operand,
                    BPF_AND => a & operand,
                    BPF_LSH => a.checked_shl(operand).unwrap_or(0),
                    BPF_RSH => a.checked_shr(operand).unwrap_or(0),
                    BPF_NEG => a.wrapping_neg(),
                    BPF_XOR => a ^ operand,
                    _ => return Err(BpfError::Opcode { at, code: i.code }),
                };
            }
            BPF_JMP => {
                let op = i.code & 0xf0;
                if op == BPF_JA {
                    pc += i.k as usize;
                    continue;
                }
                let operand = if i.code & BPF_X != 0 { x } else { i.k };
                let taken = match op {
                    BPF_JEQ => a == operand,
                    BPF_JGT => a > operand,
                    BPF_JGE => a >= operand,
                    BPF_JSET => a & operand != 0,
                    _ => return Err(BpfError::Opcode { at, code: i.code }),
                };
                pc += if taken { i.jt as usize } else { i.jf as usize };
            }
            BPF_RET => return Ok(if i.code & 0x18 == BPF_A { a } else { i.k }),
            BPF_MISC => {
                if i.code & 0xf8 == BPF_TXA {
                    a = x;
                } else {
                    x = a;
                }
            }
            _ => return Err(BpfError::Opcode { at, code: i.code }),
        }
    }
}

/// What a filter's return value means (`SECCOMP_RET_*`, seccomp(2)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ret {
    KillProcess,
    KillThread,
    Trap(u16),
    Errno(u16),
    UserNotif,
    Trace(u16),
    Log,
    Allow,
    /// An action value the kernel does not define; it treats it as
    /// SECCOMP_RET_KILL_PROCESS.
    Unknown(u32),
}

impl Ret {
    pub fn from_raw(v: u32) -> Ret {
        let data = (v & 0xffff) as u16;
        match v & 0xffff_0000 {
            0x8000_0000 => Ret::KillProcess,
            0x0000_0000 => Ret::KillThread,
            0x0003_0000 => Ret::Trap(data),
            0x0005_0000 => Ret::Errno(data),
            0x7fc0_0000 => Ret::UserNotif,
            0x7ff0_0000 => Ret::Trace(data),
            0x7ffc_0000 => Ret::Log,
            0x7fff_0000 => Ret::Allow,
            _ => Ret::Unknown(v),
        }
    }
}

impl fmt::Display for Insn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.code;
        let src = if c & BPF_X != 0 { "x".to_string() } else { format!("{:#x}", self.k) };
        match c & 0x07 {
            BPF_LD | BPF_LDX => {
                let reg = if c & 0x07 == BPF_LD { "" } else { "x" };
                match c & 0xe0 {
                    BPF_ABS => write!(f, "ld{reg} data[{}]", self.k),
                    BPF_LEN => write!(f, "ld{reg} len"),
                    BPF_IMM => write!(f, "ld{reg} #{:#x}", self.k),
                    BPF_MEM => write!(f, "ld{reg} M[{}]", self.k),
                    _ => write!(f, "?? {c:#06x}"),
                }
            }
            BPF_ST => write!(f, "st M[{}]", self.k),
            BPF_STX => write!(f, "stx M[{}]", self.k),
            BPF_ALU => {
                let op = match c & 0xf0 {
                    BPF_ADD => "add",
                    BPF_SUB => "sub",
                    BPF_MUL => "mul",
                    BPF_DIV => "div",
                    BPF_OR => "or",
                    BPF_AND => "and",
                    BPF_LSH => "lsh",
                    BPF_RSH => "rsh",
                    BPF_NEG => return write!(f, "neg"),
                    BPF_MOD => "mod",
                    BPF_XOR => "xor",
                    _ => "??",
                };
                write!(f, "{op} {src}")
            }
            BPF_JMP => {
                let op = match c & 0xf0 {
                    BPF_JA => return write!(f, "ja +{}", self.k),
                    BPF_JEQ => "jeq",
                    BPF_JGT => "jgt",
                    BPF_JGE => "jge",
                    BPF_JSET => "jset",
                    _ => "j??",
                };
                write!(f, "{op} {src} +{} +{}", self.jt, self.jf)
            }
            BPF_RET => {
                if c & 0x18 == BPF_A {
                    write!(f, "ret a")
                } else {
                    write!(f, "ret {:?}", Ret::from_raw(self.k))
                }
            }
            _ => write!(f, "{}", if c & 0xf8 == BPF_TXA { "txa" } else { "tax" }),
        }
    }
}

/// One instruction per line, numbered, for `jail check --bpf` and failures.
pub fn disassemble(prog: &[Insn]) -> String {
    prog.iter().enumerate().map(|(n, i)| format!("{n:4}: {i}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn { code, jt, jf, k }
    }

    /// "allow getpid (39) on x86_64, errno 1 for the rest, kill other arches".
    fn sample() -> Vec<Insn> {
        vec![
            ins(BPF_LD | BPF_W | BPF_ABS, 0, 0, 4),
            ins(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 0xc000_003e),
            ins(BPF_RET | BPF_K, 0, 0, 0x8000_0000),
            ins(BPF_LD | BPF_W | BPF_ABS, 0, 0, 0),
            ins(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 39),
            ins(BPF_RET | BPF_K, 0, 0, 0x7fff_0000),
            ins(BPF_RET | BPF_K, 0, 0, 0x0005_0001),
        ]
    }

    #[test]
    fn a_small_filter_decides_by_arch_and_number() {
        let p = sample();
        let call = |nr, arch| run(&p, &SeccompData { nr, arch, ..Default::default() }).unwrap();
        assert_eq!(Ret::from_raw(call(39, 0xc000_003e)), Ret::Allow);
        assert_eq!(Ret::from_raw(call(40, 0xc000_003e)), Ret::Errno(1));
        assert_eq!(Ret::from_raw(call(39, 0x4000_0003)), Ret::KillProcess);
    }

    #[test]
    fn arguments_are_read_as_two_native_endian_words() {
        let d = SeccompData { args: [0, 0x1111_2222_3333_4444, 0, 0, 0, 0], ..Default::default() };
        let lo = if cfg!(target_endian = "little") { 24 } else { 28 };
        let p = vec![ins(BPF_LD | BPF_W | BPF_ABS, 0, 0, lo), ins(BPF_RET | BPF_A, 0, 0, 0)];
        assert_eq!(run(&p, &d).unwrap(), 0x3333_4444);
        let p = vec![ins(BPF_LD | BPF_W | BPF_ABS, 0, 0, 52 - lo), ins(BPF_RET | BPF_A, 0, 0, 0)];
        assert_eq!(run(&p, &d).unwrap(), 0x1111_2222);
    }

    #[test]
    fn encode_and_decode_are_inverse() {
        let p = sample();
        assert_eq!(decode(&encode(&p)).unwrap(), p);
        assert_eq!(decode(&[0; 7]), Err(BpfError::Length(7)));
    }

    #[test]
    fn programs_the_kernel_would_refuse_are_refused() {
        let ret = ins(BPF_RET | BPF_K, 0, 0, 0);
        assert_eq!(check(&[]), Err(BpfError::Size(0)));
        assert_eq!(check(&[ins(BPF_LD | BPF_W | BPF_ABS, 0, 0, 64), ret]), Err(BpfError::Load { at: 0, off: 64 }));
        assert_eq!(check(&[ins(BPF_LD | BPF_W | BPF_ABS, 0, 0, 2), ret]), Err(BpfError::Load { at: 0, off: 2 }));
        assert_eq!(check(&[ins(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 0), ret]), Err(BpfError::Jump { at: 0 }));
        assert_eq!(check(&[ins(BPF_JMP | BPF_JA, 0, 0, u32::MAX), ret]), Err(BpfError::Jump { at: 0 }));
        assert_eq!(check(&[ins(BPF_ALU | BPF_DIV | BPF_K, 0, 0, 0), ret]), Err(BpfError::DivZero { at: 0 }));
        assert_eq!(check(&[ins(BPF_LD | BPF_IMM, 0, 0, 0)]), Err(BpfError::NoReturn));
        // BPF_LD|BPF_B|BPF_ABS (byte loads) are not allowed in seccomp.
        assert_eq!(check(&[ins(0x30, 0, 0, 0), ret]), Err(BpfError::Opcode { at: 0, code: 0x30 }));
        assert_eq!(check(&[ins(BPF_ST, 0, 0, 16), ret]), Err(BpfError::Slot { at: 0, slot: 16 }));
    }

    #[test]
    fn alu_scratch_and_index_registers_work() {
        let p = vec![
            ins(BPF_LD | BPF_IMM, 0, 0, 6),
            ins(BPF_ALU | BPF_MUL | BPF_K, 0, 0, 7),
            ins(BPF_ST, 0, 0, 3),
            ins(BPF_LDX | BPF_IMM, 0, 0, 2),
            ins(BPF_LD | BPF_MEM, 0, 0, 3),
            ins(BPF_ALU | BPF_DIV | BPF_X, 0, 0, 0),
            ins(BPF_JMP | BPF_JSET | BPF_K, 0, 1, 0x1),
            ins(BPF_RET | BPF_K, 0, 0, 1),
            ins(BPF_RET | BPF_A, 0, 0, 0),
        ];
        // 6 * 7 / 2 = 21 is odd, so the jset branch returns 1.
        assert_eq!(run(&p, &SeccompData::default()).unwrap(), 1);
        let mut q = p.clone();
        q[1].k = 8; // 48 / 2 = 24, even
        assert_eq!(run(&q, &SeccompData::default()).unwrap(), 24);
        let bad = vec![ins(BPF_LD | BPF_MEM, 0, 0, 0), ins(BPF_RET | BPF_A, 0, 0, 0)];
        assert_eq!(run(&bad, &SeccompData::default()), Err(BpfError::Uninitialized { at: 0, slot: 0 }));
    }

    #[test]
    fn disassembly_names_every_instruction() {
        let text = disassemble(&sample());
        assert!(text.contains("ld data[4]"), "{text}");
        assert!(text.contains("ret Allow"), "{text}");
        assert_eq!(text.lines().count(), 7);
    }
}
