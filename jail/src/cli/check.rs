//! `jail check`: validate a policy file and compile its seccomp filter.

use std::process::ExitCode;

use crate::policy::Policy;
use crate::result::EXIT_SETUP_FAILED;
use crate::stage::chain_line;

pub(crate) fn check(path: &std::path::Path, bpf: bool) -> ExitCode {
    let fail = |e: &dyn std::error::Error| {
        eprintln!("{}: {}", path.display(), chain_line(e));
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    let p = match Policy::load(path) {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    let mode = crate::seccomp::host_mode();
    let filter = match crate::seccomp::compile(&p.seccomp, mode) {
        Ok(f) => f,
        Err(e) => return fail(&e),
    };
    println!(
        "{}: ok (policy `{}`, sha256 {}; seccomp: {} rules, {} BPF instructions, filter sha256 {}; landlock: {})",
        path.display(),
        p.name,
        p.hash,
        p.seccomp.rules.len(),
        filter.program.len(),
        filter.sha256,
        p.landlock.enforcement.as_str(),
    );
    if bpf {
        print!("{}", crate::seccomp::bpf::disassemble(&filter.program));
    }
    ExitCode::SUCCESS
}
