//! Fuzz target: the CPU throttle's `/proc/<pid>/stat` parser (throttle.rs),
//! which reads what the script's processes left in the kernel's view of
//! them. Any bytes: no panic. And as a differential, the bytes as the
//! `comm` of a well-formed line (the script names its processes, spaces and
//! parentheses included): the fields after it are always read back exactly.
#![no_main]

use jail::throttle::{parse_stat, Stat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_stat(data);
    let mut line = b"4242 (".to_vec();
    line.extend_from_slice(data);
    line.extend_from_slice(b") S 7 1 1 0 -1 4194560 10 0 0 0 120 30 5 2 20 0 1 0 99 1000 10 1 1 1 0 0 0 0 0\n");
    assert_eq!(parse_stat(&line), Some(Stat { pid: 4242, state: b'S', ppid: 7, cpu_ticks: 157 }));
});
