//! Fuzz target: the CPU throttle's `/proc/<pid>/stat` parser (throttle.rs)
//! and the hold's `/proc/<pid>/task/<tid>/status` parser (still.rs), which
//! read what the script's processes left in the kernel's view of them. Any
//! bytes: no panic. And as a differential, the bytes as the name of a
//! well-formed file (the script names its processes, spaces, parentheses
//! and key-like text included; in `status` the kernel escapes a newline):
//! the fields after it are always read back exactly.
#![no_main]

use jail::still::{parse_task_status, TaskStatus};
use jail::throttle::{parse_stat, Stat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_stat(data);
    let mut line = b"4242 (".to_vec();
    line.extend_from_slice(data);
    line.extend_from_slice(b") S 7 1 1 0 -1 4194560 10 0 0 0 120 30 5 2 20 0 1 0 99 1000 10 1 1 1 0 0 0 0 0\n");
    assert_eq!(parse_stat(&line), Some(Stat { pid: 4242, state: b'S', ppid: 7, cpu_ticks: 157 }));
    let _ = parse_task_status(data);
    let name: Vec<u8> = data.iter().map(|&b| if b == b'\n' { b' ' } else { b }).collect();
    let mut status = b"Name:\t".to_vec();
    status.extend_from_slice(&name);
    status.extend_from_slice(b"\nUmask:\t0022\nState:\tT (stopped)\nTgid:\t9\nvoluntary_ctxt_switches:\t40\nnonvoluntary_ctxt_switches:\t2\n");
    assert_eq!(parse_task_status(&status), Some(TaskStatus { state: b'T', switches: 42 }));
});
