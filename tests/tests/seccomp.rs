//! Seccomp probes (issue 4): every call the default policy refuses is tried
//! from inside the jail with ctypes, and each test fails if the call works or
//! if the refusal did not come from the filter (the result's `denials` must
//! name it: the kernel's own permission checks would refuse many of these
//! calls too, without a denial). The working set of the standard library
//! runs with no denial at all, and every shipped policy compiles.
//!
//! Syscall numbers are x86_64's.
#![cfg(target_arch = "x86_64")]

use std::path::{Path, PathBuf};

use jail::policy::Policy;
use jail::seccomp::{self, bpf::SeccompData, model::NATIVE_ARCH, Mode};
use jail_tests::*;
use serde_json::{json, Value};

/// How a probe runs: in the script itself, in a forked child (for calls
/// that would change the script's own state if they worked), or as a clone
/// whose new child must leave at once if it was created.
#[derive(Clone, Copy)]
enum Kind {
    Plain,
    Fork,
    Clone,
}

struct Probe {
    label: &'static str,
    /// The syscall name the result's denials must show.
    syscall: &'static str,
    /// A Python expression calling `sc(nr, ...)`.
    call: String,
    errno: i32,
    kind: Kind,
}

fn probe(label: &'static str, syscall: &'static str, call: impl Into<String>, errno: i32, kind: Kind) -> Probe {
    Probe { label, syscall, call: call.into(), errno, kind }
}

fn eperm(label: &'static str, syscall: &'static str, call: impl Into<String>) -> Probe {
    probe(label, syscall, call, libc::EPERM, Kind::Plain)
}

const RUNNER: &str = r#"
def run(expr, kind):
    if kind == "plain":
        return list(eval(expr))
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        r, e = eval(expr)
        if kind == "clone" and r == 0:
            os._exit(0)  # the clone worked and this is its child
        os.write(wr, json.dumps([r, e]).encode())
        os._exit(0)
    os.close(wr)
    out = b""
    while True:
        chunk = os.read(rd, 4096)
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return json.loads(out) if out else ["no answer", 0]
"#;

/// Run the probes in one jail and check each was refused by the filter.
fn assert_refused(probes: &[Probe]) -> RunResult {
    let sb = Sandbox::new();
    let list: Vec<Value> = probes
        .iter()
        .map(|p| {
            let kind = match p.kind {
                Kind::Plain => "plain",
                Kind::Fork => "fork",
                Kind::Clone => "clone",
            };
            json!([p.label, p.call, kind])
        })
        .collect();
    let src = format!(
        "{PY_SYSCALL}{RUNNER}\nPROBES = {}\nprint(json.dumps({{label: run(expr, kind) for label, expr, kind in PROBES}}))\n",
        Value::Array(list)
    );
    let (r, out) = sb.run(&src);
    assert_eq!(r.status, Status::Ok, "{}\n{}", r.stderr.text, String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    for p in probes {
        let v = &got[p.label];
        assert_eq!(v[0], -1, "{}: {} was not refused: {v}", p.label, p.call);
        assert_eq!(v[1], p.errno, "{}: wrong errno: {v}", p.label);
    }
    for p in probes.iter().filter(|p| p.errno != libc::ENOSYS || p.syscall != "clone3") {
        let want = probes.iter().filter(|q| q.syscall == p.syscall).count() as u64;
        let seen: u64 = r.denials.iter().filter(|d| d.what == p.syscall).map(|d| d.count).sum();
        assert!(seen >= want, "{}: the filter did not report `{}` ({seen} of {want}): {:?}", p.label, p.syscall, r.denials);
    }
    r
}

#[test]
fn ptrace_and_reading_other_processes_memory_are_refused() {
    assert_refused(&[
        // TRACEME would make PID 1 our tracer; it works without the filter.
        probe("ptrace_traceme", "ptrace", "sc(101, 0, 0, 0, 0)", libc::EPERM, Kind::Fork),
        eperm("ptrace_attach_pid1", "ptrace", "sc(101, 16, 1, 0, 0)"),
        // Zero iovecs at our own pid: returns 0 without the filter.
        eperm("process_vm_readv", "process_vm_readv", "sc(310, os.getpid(), 0, 0, 0, 0, 0)"),
        eperm("process_vm_writev", "process_vm_writev", "sc(311, os.getpid(), 0, 0, 0, 0, 0)"),
        eperm("pidfd_getfd", "pidfd_getfd", "sc(438, 3, 0, 0)"),
        // KCMP_FILE of our own fd 0 with itself: returns 0 without the filter.
        eperm("kcmp", "kcmp", "sc(312, os.getpid(), os.getpid(), 0, 0, 0)"),
    ]);
}

#[test]
fn mounting_in_any_form_is_refused() {
    assert_refused(&[
        eperm("mount", "mount", "sc(165, b'none', b'/tmp', b'tmpfs', 0, 0)"),
        eperm("remount_root", "mount", "sc(165, 0, b'/', 0, 0x20 | 0x1000, 0)"),
        eperm("umount2", "umount2", "sc(166, b'/tmp', 2)"),
        eperm("pivot_root", "pivot_root", "sc(155, b'/tmp', b'/tmp')"),
        eperm("chroot", "chroot", "sc(161, b'/tmp')"),
        eperm("open_tree", "open_tree", "sc(428, -100, b'/tmp', 1)"),
        eperm("move_mount", "move_mount", "sc(429, -1, b'', -100, b'/tmp', 4)"),
        eperm("fsopen", "fsopen", "sc(430, b'tmpfs', 0)"),
        eperm("fsconfig", "fsconfig", "sc(431, 3, 6, 0, 0, 0)"),
        eperm("fsmount", "fsmount", "sc(432, 3, 0, 0)"),
        eperm("fspick", "fspick", "sc(433, -100, b'/tmp', 0)"),
        eperm("mount_setattr", "mount_setattr", "sc(442, -100, b'/tmp', 0, 0, 0)"),
    ]);
}

#[test]
fn new_namespaces_are_refused_through_unshare_setns_and_clone() {
    let mut probes = vec![
        // A nested user namespace works without the filter.
        probe("unshare_user", "unshare", "sc(272, 0x10000000)", libc::EPERM, Kind::Fork),
        probe("unshare_net", "unshare", "sc(272, 0x40000000)", libc::EPERM, Kind::Fork),
        probe("unshare_files", "unshare", "sc(272, 0x400)", libc::EPERM, Kind::Fork),
        eperm("setns", "setns", "sc(272 + 36, os.open('/proc/self/ns/user', os.O_RDONLY), 0)"),
    ];
    let flags = [
        ("clone_newns", 0x0002_0000u64),
        ("clone_newcgroup", 0x0200_0000),
        ("clone_newuts", 0x0400_0000),
        ("clone_newipc", 0x0800_0000),
        ("clone_newuser", 0x1000_0000),
        ("clone_newpid", 0x2000_0000),
        ("clone_newnet", 0x4000_0000),
    ];
    for (label, flag) in flags {
        // flags | SIGCHLD with no stack: fork(2) semantics plus the flag.
        probes.push(probe(label, "clone", format!("sc(56, {}, 0, 0, 0, 0)", flag | 17), libc::EPERM, Kind::Clone));
    }
    probes.push(probe(
        "clone_newuser_high_bits",
        "clone",
        format!("sc(56, {}, 0, 0, 0, 0)", 0x1000_0011u64 | 1 << 40),
        libc::EPERM,
        Kind::Clone,
    ));
    assert_refused(&probes);
}

#[test]
fn clone3_answers_enosys_unreported_so_libc_falls_back_to_clone() {
    // struct clone_args (88 bytes) asking for a new user namespace and
    // SIGCHLD: without the filter this creates a process.
    let call = "sc(435, ctypes.create_string_buffer(bytes(ctypes.c_uint64(0x10000000)) + bytes(24) + bytes(ctypes.c_uint64(17)) + bytes(48)), 88)";
    let r = assert_refused(&[probe("clone3", "clone3", call, libc::ENOSYS, Kind::Clone)]);
    assert!(!r.denials.iter().any(|d| d.what == "clone3"), "clone3 is expected and must not be reported: {:?}", r.denials);
    // ... and the fallback works: threads and processes still start.
    let sb = Sandbox::new();
    let v = sb.probe(
        "import json, subprocess, sys, threading\nt = threading.Thread(target=lambda: None); t.start(); t.join()\n\
         r = subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True)\n\
         print(json.dumps({'child': r.stdout.strip()}))\n",
    );
    assert_eq!(v["child"], "7");
}

#[test]
fn keyrings_are_refused() {
    assert_refused(&[
        eperm("add_key", "add_key", "sc(248, b'user', b'jail-k', b'v', 1, -2)"),
        eperm("keyctl", "keyctl", "sc(250, 0, -3, 1)"),
        eperm("request_key", "request_key", "sc(249, b'user', b'jail-k', 0, -2)"),
    ]);
}

#[test]
fn bpf_perf_userfaultfd_and_io_uring_are_refused() {
    assert_refused(&[
        eperm("bpf", "bpf", "sc(321, 0, 0, 0)"),
        eperm("perf_event_open", "perf_event_open", "sc(298, ctypes.create_string_buffer(128), 0, -1, -1, 0)"),
        // UFFD_USER_MODE_ONLY is open to unprivileged callers without the filter.
        eperm("userfaultfd", "userfaultfd", "sc(323, 1)"),
        eperm("io_uring_setup", "io_uring_setup", "sc(425, 8, ctypes.create_string_buffer(120))"),
        eperm("io_uring_enter", "io_uring_enter", "sc(426, 3, 0, 0, 0, 0, 0)"),
        eperm("io_uring_register", "io_uring_register", "sc(427, 3, 0, 0, 0)"),
    ]);
}

#[test]
fn host_administration_calls_are_refused() {
    assert_refused(&[
        eperm("kexec_load", "kexec_load", "sc(246, 0, 0, 0, 0)"),
        eperm("kexec_file_load", "kexec_file_load", "sc(320, -1, -1, 0, b'', 0)"),
        eperm("init_module", "init_module", "sc(175, 0, 0, b'')"),
        eperm("finit_module", "finit_module", "sc(313, 0, b'', 0)"),
        eperm("delete_module", "delete_module", "sc(176, b'jail_nope', 0)"),
        eperm("acct", "acct", "sc(163, 0)"),
        eperm("swapon", "swapon", "sc(167, b'/tmp/swap', 0)"),
        eperm("swapoff", "swapoff", "sc(168, b'/tmp/swap')"),
        // Wrong magic numbers: harmless even if the filter let it through.
        eperm("reboot", "reboot", "sc(169, 0, 0, 0, 0)"),
        // SYSLOG_ACTION_SIZE_BUFFER.
        eperm("syslog", "syslog", "sc(103, 10, 0, 0)"),
        eperm("iopl", "iopl", "sc(172, 3)"),
        eperm("ioperm", "ioperm", "sc(173, 0x80, 1, 1)"),
    ]);
}

#[test]
fn privileged_calls_an_unprivileged_process_is_refused_get_eperm_not_enosys() {
    // What every unprivileged process gets outside: EPERM, so PermissionError
    // handlers work (ENOSYS would say "this kernel lacks it").
    assert_refused(&[
        eperm("setuid_0", "setuid", "sc(105, 0)"),
        eperm("setgid_0", "setgid", "sc(106, 0)"),
        // seteuid(0) is setresuid(-1, 0, -1) in glibc.
        eperm("setreuid_euid_0", "setreuid", "sc(113, -1, 0)"),
        eperm("setregid_egid_0", "setregid", "sc(114, -1, 0)"),
        eperm("setresuid_euid_0", "setresuid", "sc(117, -1, 0, -1)"),
        eperm("setresgid_egid_0", "setresgid", "sc(119, -1, 0, -1)"),
        // Another unprivileged id: the kernel would say EINVAL (not mapped).
        eperm("setreuid_euid_nobody", "setreuid", "sc(113, 65534, 65534)"),
        eperm("chown_to_root", "chown", "sc(92, b'/tmp', 0, -1)"),
        eperm("fchownat_to_nobody", "fchownat", "sc(260, -100, b'/tmp', 65534, -1, 0)"),
        eperm("setgroups", "setgroups", "sc(116, 0, 0)"),
        eperm("clock_settime", "clock_settime", "sc(227, 0, 0)"),
        eperm("settimeofday", "settimeofday", "sc(164, 0, 0)"),
        eperm("sched_setscheduler", "sched_setscheduler", "sc(144, 0, 1, 0)"),
        eperm("sched_setparam", "sched_setparam", "sc(142, 0, 0)"),
        eperm("sched_setattr", "sched_setattr", "sc(314, 0, 0, 0)"),
        eperm("sethostname", "sethostname", "sc(170, b'x', 1)"),
        eperm("setdomainname", "setdomainname", "sc(171, b'x', 1)"),
    ]);
}

#[test]
fn dropping_privileges_to_the_ids_one_has_succeeds_and_becoming_root_is_a_permission_error() {
    let sb = Sandbox::new();
    let (r, _) = sb.run(
        r#"
import os, time
u, g = os.getuid(), os.getgid()
os.setgid(g); os.setuid(u)
os.setregid(-1, -1); os.setreuid(-1, -1)
os.setresgid(g, g, g); os.setresuid(u, u, u)
os.setegid(g); os.seteuid(u)
open("/tmp/mine", "w").close()
os.chown("/tmp/mine", u, g); os.chown("/tmp/mine", -1, -1)
refused = []
for name, call in [
    ("setuid", lambda: os.setuid(0)),
    ("seteuid", lambda: os.seteuid(0)),
    ("setreuid", lambda: os.setreuid(0, 0)),
    ("setgid", lambda: os.setgid(0)),
    ("setgroups", lambda: os.setgroups([])),
    ("setreuid_nobody", lambda: os.setreuid(65534, 65534)),
    ("chown_root", lambda: os.chown("/tmp/mine", 0, -1)),
    ("clock_settime", lambda: time.clock_settime(time.CLOCK_REALTIME, time.time())),
    ("sched_setscheduler", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))),
]:
    try:
        call()
        refused.append(name + ": worked")
    except PermissionError:
        refused.append(name + ": PermissionError")
    except OSError as e:
        refused.append(f"{name}: {e!r}")
print(" ".join(str(x) for x in (os.getuid(), os.geteuid(), os.getgid())))
print("\n".join(refused))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    let lines: Vec<&str> = r.stdout.text.lines().collect();
    assert_eq!(lines[0], "1000 1000 1000", "{}", r.stdout.text);
    for line in &lines[1..] {
        assert!(line.ends_with(": PermissionError"), "{line}\n{}", r.stdout.text);
    }
    assert_eq!(lines.len(), 10, "{}", r.stdout.text);
}

#[test]
fn personality_changes_are_refused_and_queries_work() {
    let r = assert_refused(&[
        // ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC work without the filter.
        probe("addr_no_randomize", "personality", "sc(135, 0x0040000)", libc::ENOSYS, Kind::Plain),
        probe("read_implies_exec", "personality", "sc(135, 0x0400000)", libc::ENOSYS, Kind::Plain),
        probe("per_linux32", "personality", "sc(135, 0x0008)", libc::ENOSYS, Kind::Plain),
    ]);
    assert!(r.denials.iter().any(|d| d.what == "personality" && d.errno.as_deref() == Some("ENOSYS")));
    let sb = Sandbox::new();
    let v = sb.probe(&format!("{PY_SYSCALL}\nprint(json.dumps([sc(135, 0xffffffff), sc(135, 0)]))\n"));
    assert_eq!(v, json!([[0, 0], [0, 0]]), "personality query and PER_LINUX must work");
}

#[test]
fn tiocsti_and_tioclinux_are_refused_even_with_high_bits_set() {
    assert_refused(&[
        eperm("tiocsti", "ioctl", "sc(16, 0, 0x5412, b'x')"),
        eperm("tiocsti_high_bit", "ioctl", "sc(16, 0, 0x5412 | (1 << 32), b'x')"),
        eperm("tiocsti_all_high_bits", "ioctl", "sc(16, 1, 0x5412 | (0xffffffff << 32), b'x')"),
        eperm("tioclinux", "ioctl", "sc(16, 0, 0x541c, ctypes.create_string_buffer(b'\\x02' * 8))"),
        eperm("tioclinux_high_bit", "ioctl", "sc(16, 2, 0x541c | (1 << 33), ctypes.create_string_buffer(8))"),
    ]);
    // Other ioctls are untouched: TCGETS on a pipe is ENOTTY from the
    // kernel, not a refusal.
    let sb = Sandbox::new();
    let (r, _) = sb.run(&format!("{PY_SYSCALL}\nprint(json.dumps(sc(16, 1, 0x5401, ctypes.create_string_buffer(64))))\n"));
    assert_eq!(r.stdout.text.trim(), format!("[-1, {}]", libc::ENOTTY));
    assert!(r.denials.is_empty(), "{:?}", r.denials);
}

#[test]
fn sockets_of_every_family_but_unix_are_refused_and_named_by_family() {
    let sb = Sandbox::new();
    let (r, out) = sb.run(
        r#"
import json, socket
families = {"AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17, "AF_VSOCK": 40,
            "AF_BLUETOOTH": 31, "AF_ALG": 38, "AF_XDP": 44, "AF_UNSPEC": 0}
got = {}
for name, fam in families.items():
    for typ in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
        try:
            socket.socket(fam, typ).close()
            got[f"{name}/{typ}"] = "created"
        except OSError as e:
            got[f"{name}/{typ}"] = e.errno
for _ in range(3):
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    except OSError as e:
        got["connect"] = e.errno
a, b = socket.socketpair()
a.send(b"ok")
got["unix"] = b.recv(2).decode()
print(json.dumps(got))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{}\n{}", r.stderr.text, String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    for (k, got) in v.as_object().unwrap() {
        if k == "unix" {
            assert_eq!(got, "ok");
        } else {
            assert_eq!(got, libc::EPERM, "{k}: {v}");
        }
    }
    let count = |fam: &str| {
        r.denials
            .iter()
            .filter(|d| d.what == "socket" && d.family.as_deref() == Some(fam))
            .map(|d| d.count)
            .sum::<u64>()
    };
    // Three types per family, and three connection attempts for AF_INET.
    assert_eq!(count("AF_INET"), 6, "{:?}", r.denials);
    for fam in [
        "AF_INET6",
        "AF_NETLINK",
        "AF_PACKET",
        "AF_VSOCK",
        "AF_BLUETOOTH",
        "AF_ALG",
        "AF_XDP",
        "AF_UNSPEC",
    ] {
        assert_eq!(count(fam), 3, "{fam}: {:?}", r.denials);
    }
    let inet = r.denials.iter().find(|d| d.family.as_deref() == Some("AF_INET")).unwrap();
    assert_eq!(inet.errno.as_deref(), Some("EPERM"));
    assert_eq!(inet.layer, "seccomp");
    assert!(inet.detail.as_deref().unwrap().contains("network is off"), "{inet:?}");
}

#[test]
fn foreign_architecture_syscalls_kill_the_process() {
    let sb = Sandbox::new();
    let v = sb.probe(&format!(
        r#"{PY_SYSCALL}
import mmap, signal
def in_child(fn):
    pid = os.fork()
    if pid == 0:
        fn()
        os._exit(0)
    st = os.waitpid(pid, 0)[1]
    return ["signal", os.WTERMSIG(st)] if os.WIFSIGNALED(st) else ["exit", os.WEXITSTATUS(st)]
def x32_getpid():
    sc(0x40000000 + 39)
def i386_getpid():
    # mov eax, 20 (getpid in the i386 table); int 0x80; ret
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3]))
    ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()
print(json.dumps({{"x32": in_child(x32_getpid), "i386": in_child(i386_getpid)}}))
"#
    ));
    assert_eq!(v["x32"], json!(["signal", libc::SIGSYS]), "{v}");
    assert_eq!(v["i386"], json!(["signal", libc::SIGSYS]), "{v}");
}

#[test]
fn a_syscall_outside_the_allowlist_fails_with_enosys_and_is_reported() {
    let sb = Sandbox::new();
    let (r, _) = sb.run(&format!(
        "{PY_SYSCALL}\nprint(json.dumps([sc(999), sc(999), sc(317, 0, 0, 0)]))\n\
         st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)\n\
         print(st['Seccomp'].strip(), st['Seccomp_filters'].strip())\n"
    ));
    let mut lines = r.stdout.text.lines();
    // 999 does not exist; 317 is seccomp(2), which no policy needs.
    assert_eq!(lines.next().unwrap(), format!("[[-1, {e}], [-1, {e}], [-1, {e}]]", e = libc::ENOSYS));
    assert_eq!(lines.next().unwrap(), "2 1", "one seccomp filter, in filter mode");
    let unknown = r.denials.iter().find(|d| d.what == "syscall 999").expect("999 reported");
    assert_eq!(unknown.count, 2);
    assert_eq!(unknown.errno.as_deref(), Some("ENOSYS"));
    assert!(unknown.detail.as_deref().unwrap().contains("allowlist"));
    assert!(r.denials.iter().any(|d| d.what == "seccomp" && d.count == 1), "{:?}", r.denials);
    assert_eq!(r.isolation.seccomp.status, jail::result::LayerStatus::Enforced);
    assert_eq!(r.isolation.seccomp.default_action, "errno ENOSYS");
    assert!(r.isolation.seccomp.denials_counted);
    assert_eq!(r.isolation.seccomp.filter_sha256.len(), 64);
}

#[test]
fn a_script_looping_on_a_refused_call_is_itemised_up_to_the_cap_and_still_refused_past_it() {
    let sb = Sandbox::new();
    let n = seccomp::MAX_ANSWERED + 50;
    let (r, _) = sb.run(&format!(
        "{PY_SYSCALL}\nerrs = [sc(999)[1] for _ in range({n})]\nprint(json.dumps([errs.count(38), len(errs)]))\n"
    ));
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    // Every call failed with the policy's errno before and after the cap;
    // the itemised count stopped at the cap and the rest were counted in
    // one number, which the result says.
    assert_eq!(r.stdout.text.trim(), format!("[{n}, {n}]"));
    let d = r.denials.iter().find(|d| d.what == "syscall 999").unwrap();
    assert_eq!(d.count, seccomp::MAX_ANSWERED);
    assert!(r.isolation.seccomp.denials_truncated, "{:?}", r.isolation.seccomp);
    assert_eq!(r.isolation.seccomp.calls_past_cap, 50, "{:?}", r.isolation.seccomp);
}

#[test]
fn the_standard_library_working_set_runs_with_no_denial() {
    let sb = Sandbox::new();
    let source = std::fs::read_to_string(repo().join("policies/trace/stdlib.py")).unwrap();
    let mut sb = sb;
    sb.extra_args = vec!["--timeout".into(), "120".into()];
    if expected_backend() == "rlimit" {
        // RLIMIT_AS (the memory limit without a cgroup) counts address
        // space: lzma's preset 9 alone reserves more than 512M of it.
        sb.extra_args.extend(["--memory".into(), "4G".into()]);
    }
    let mut cmd = sb.command(&source);
    let out = cmd.output().unwrap();
    let r = parse(&out);
    let sections: Value = serde_json::from_str(r.stdout.text.trim()).unwrap_or(Value::Null);
    assert_eq!(r.status, Status::Ok, "{sections}\n{}", r.stderr.text);
    for name in [
        "json_csv_text",
        "sqlite",
        "threads",
        "processes",
        "subprocesses",
        "files",
        "archives",
        "signals",
        "clocks_and_randomness",
        "native_code",
        "event_loops",
    ] {
        assert_eq!(sections[name], "ok", "{name}: {sections}");
    }
    assert!(r.denials.is_empty(), "the working set hit the filter: {:?}", r.denials);
}

fn policy_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("policies"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_shipped_policy_loads_compiles_and_agrees_with_its_model() {
    let files = policy_files();
    assert!(files.iter().any(|p| p.ends_with("default.json")), "{files:?}");
    for path in files {
        let p = Policy::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for mode in [Mode::Notify, Mode::ErrnoOnly] {
            let f = seccomp::compile(&p.seccomp, mode).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for nr in p.seccomp.named_syscalls().chain(0..470) {
                for args in [
                    [0u64; 6],
                    [1, 2, 3, 4, 5, 6],
                    [u64::MAX; 6],
                    [0x5412, 0x5412, 0x1000_0011, 0, 0, 0],
                ] {
                    let call = SeccompData { nr, arch: NATIVE_ARCH, instruction_pointer: 0, args };
                    if let Err(m) = seccomp::check_call(&p.seccomp, &f, &call) {
                        panic!("{}: the compiled filter disagrees with the policy: {m:?}", path.display());
                    }
                }
            }
        }
        let out = std::process::Command::new(jail_bin()).arg("check").arg(&path).output().unwrap();
        assert!(out.status.success(), "jail check {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn jail_check_names_unknown_syscalls_and_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, text: &str| {
        let path: &Path = &dir.path().join(name);
        std::fs::write(path, text).unwrap();
        let out = std::process::Command::new(jail_bin()).arg("check").arg(path).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = check(
        "unknown.json",
        r#"{"version": 1, "seccomp": {"default": {"action": {"errno": "ENOSYS"}, "why": "w"},
            "rules": [{"syscalls": ["read", "frobnicate"], "action": "allow", "why": "w"},
                      {"syscalls": ["sendmsg", "execve", "twiddle"], "action": "allow", "why": "w"}]}}"#,
    );
    assert_eq!(code, Some(125));
    assert!(
        err.contains("seccomp.rules[0].syscalls[1]") && err.contains("`frobnicate`") && err.contains("`twiddle`"),
        "{err}"
    );
    let (code, err) = check(
        "field.json",
        r#"{"version": 1, "seccomp": {"default": {"action": {"errno": "ENOSYS"}, "why": "w"}, "rulez": []}}"#,
    );
    assert_eq!(code, Some(125));
    assert!(err.contains("seccomp") && err.contains("unknown field `rulez`"), "{err}");
    let (code, err) = check(
        "op.json",
        r#"{"version": 1, "seccomp": {"default": {"action": {"errno": "ENOSYS"}, "why": "w"},
            "rules": [{"syscalls": ["read"], "action": "allow", "why": "w", "when": [{"arg": 0, "op": "like", "value": 1}]}]}}"#,
    );
    assert_eq!(code, Some(125));
    assert!(err.contains("seccomp.rules[0].when[0].op"), "{err}");
    let (code, out) = check("ok.json", &std::fs::read_to_string(repo().join("policies/default.json")).unwrap());
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn a_bad_policy_fails_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.json");
    // Allows socket() for every family while the network is off.
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(repo().join("policies/default.json")).unwrap()).unwrap();
    for r in v["seccomp"]["rules"].as_array_mut().unwrap() {
        if r["syscalls"] == json!(["socket"]) {
            r.as_object_mut().unwrap().remove("when");
            r["action"] = json!("allow");
        }
    }
    std::fs::write(&policy, v.to_string()).unwrap();
    let mut sb = Sandbox::new();
    sb.extra_args = vec!["--policy".into(), policy.display().to_string()];
    let (r, out) = sb.run("open('/workspace/output/ran', 'w').write('x')\n");
    assert_eq!(r.status, Status::SetupFailed);
    assert_eq!(out.status.code(), Some(125));
    let e = r.setup_error.unwrap();
    assert_eq!(e.stage, "policy");
    assert!(e.message.contains("seccomp.rules["), "{e:?}");
    assert!(!sb.output.join("ran").exists(), "the script ran");
}

#[test]
fn a_sleep_stopped_and_continued_resumes_through_restart_syscall() {
    // SIGSTOP + SIGCONT during a sleep makes the kernel resume it with
    // restart_syscall(2); refused, the sleep fails (and a futex wait aborts
    // glibc: "The futex facility returned an unexpected error code").
    let sb = Sandbox::new();
    let (r, _) = sb.run(
        r#"
import ctypes, os, signal, sys, time
class timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    # A relative sleep: the kernel resumes it with restart_syscall (an
    # absolute one, like time.sleep's, is simply re-issued).
    ts = timespec(0, 600_000_000)
    os._exit(0 if libc.nanosleep(ctypes.byref(ts), None) == 0 else 3)
time.sleep(0.2)
os.kill(pid, signal.SIGSTOP)
time.sleep(0.1)
os.kill(pid, signal.SIGCONT)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"#,
    );
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    assert_eq!(r.stdout.text.trim(), "0", "the resumed sleep failed: {:?}", r.denials);
    assert!(!r.denials.iter().any(|d| d.what == "restart_syscall"), "{:?}", r.denials);
}
