//! What PID 1 hides about the host: it is a fork of the supervisor without
//! exec, so until told otherwise the kernel shows the supervisor's own
//! command line (`/proc/1/cmdline`: the `jail` binary's path, the input,
//! output and code dirs, every argument) and environment (`/proc/1/environ`:
//! `HOME`, `USER`, `PWD`, ...) to everything in the jail, and its name
//! (`/proc/1/status`, `/proc/1/stat`) is the binary's file name.
//!
//! Child side, PID 1's first step. [`scrub_pid1`] overwrites the argument
//! and environment areas in place (the kernel reads `/proc/PID/cmdline`
//! straight from that memory, `get_mm_cmdline`) and renames the process.
//! The worker is forked after this and inherits the scrubbed memory; its
//! exec then brings the interpreter's own argv and rebuilt environment.
//!
//! bubblewrap's PID 1 keeps bwrap's command line; nsjail and crun exec the
//! payload as PID 1. We keep a reaper that never execs, so we scrub.

use std::io;
use std::os::unix::fs::FileExt;

/// PID 1's name inside the jail (`comm`, at most 15 bytes).
pub(crate) const PID1_NAME: &str = "jail-init";

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConcealError {
    #[error("read /proc/self/stat")]
    ReadStat(#[source] io::Error),
    #[error("/proc/self/stat has no argument and environment bounds")]
    ParseStat,
    #[error("overwrite the {what} area at {start:#x}..{end:#x} through /proc/self/mem")]
    Overwrite {
        what: &'static str,
        start: u64,
        end: u64,
        source: io::Error,
    },
    #[error("prctl(PR_SET_NAME, {PID1_NAME:?})")]
    Rename(#[source] nix::Error),
}

/// The argument and environment areas of our own address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Areas {
    pub arg: (u64, u64),
    pub env: (u64, u64),
}

/// Larger areas than this are not ours to trust: the kernel caps argv plus
/// envp at a quarter of the stack limit, and far below this by default.
const MAX_AREA: u64 = 64 << 20;

/// The `arg_start arg_end env_start env_end` fields (48–51) of a
/// `/proc/PID/stat` line. The second field, the name, may hold spaces and
/// parentheses: fields are counted from the last `)`.
pub(crate) fn parse_areas(stat: &str) -> Option<Areas> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name come fields 3.. ; field n is at index n - 3.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let areas = Areas { arg: (field(48)?, field(49)?), env: (field(50)?, field(51)?) };
    let sane = |(s, e): (u64, u64)| s <= e && e - s <= MAX_AREA;
    (sane(areas.arg) && sane(areas.env)).then_some(areas)
}

/// Overwrite our own argument and environment areas with zeros, put
/// [`PID1_NAME`] at the start of the argument area, and take that name.
/// Written through `/proc/self/mem`, so a bad bound is an error, never a
/// stray write.
pub(crate) fn scrub_pid1() -> Result<(), ConcealError> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(ConcealError::ReadStat)?;
    let areas = parse_areas(&stat).ok_or(ConcealError::ParseStat)?;
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")
        .map_err(|source| ConcealError::Overwrite { what: "argument", start: areas.arg.0, end: areas.arg.1, source })?;
    for (what, (start, end)) in [("environment", areas.env), ("argument", areas.arg)] {
        let mut fill = vec![0u8; (end - start) as usize];
        if what == "argument" {
            // Ends in NUL, so the kernel shows the area as it is (not as a
            // setproctitle(3) string running into the environment).
            let name = PID1_NAME.as_bytes();
            let n = name.len().min(fill.len().saturating_sub(1));
            fill[..n].copy_from_slice(&name[..n]);
        }
        mem.write_all_at(&fill, start)
            .map_err(|source| ConcealError::Overwrite { what, start, end, source })?;
    }
    nix::sys::prctl::set_name(c"jail-init").map_err(ConcealError::Rename)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_line(name: &str) -> String {
        // Fields 3..=52 of a real line, with 48-51 set to recognisable values.
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[48 - 3] = "1000".into();
        fields[49 - 3] = "1100".into();
        fields[50 - 3] = "1100".into();
        fields[51 - 3] = "1300".into();
        format!("1 ({name}) {}", fields.join(" "))
    }

    #[test]
    fn the_areas_are_fields_48_to_51() {
        assert_eq!(parse_areas(&stat_line("jail")), Some(Areas { arg: (1000, 1100), env: (1100, 1300) }));
    }

    #[test]
    fn a_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        assert_eq!(parse_areas(&stat_line("a) b (c")), Some(Areas { arg: (1000, 1100), env: (1100, 1300) }));
    }

    #[test]
    fn inverted_or_huge_bounds_are_refused() {
        assert_eq!(parse_areas(&stat_line("x").replace(" 1000 1100 1100 1300", " 1100 1000 1100 1300")), None);
        assert_eq!(parse_areas(&stat_line("x").replace(" 1100 1300", " 1100 999999999999")), None);
        assert_eq!(parse_areas("1 (x) 3 4"), None);
    }

    #[test]
    fn our_own_stat_parses() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let a = parse_areas(&stat).unwrap();
        assert!(a.arg.0 < a.arg.1 && a.env.0 <= a.env.1);
    }
}
