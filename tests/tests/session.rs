//! `jail session` (issue 18 item 1), from outside and from inside: state
//! that persists across cells and nowhere else, per-cell limits, the ends
//! of a session and what they leave behind (nothing), handles only their
//! owner can use, and a cell that lies to the supervisor.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use jail_tests::*;

fn session_times(sb: &mut Sandbox, grace: f64, idle: f64, lifetime: f64) {
    let p = policy_with(sb, |v| {
        v["session"] = serde_json::json!({
            "interrupt_grace_secs": grace, "idle_timeout_secs": idle, "max_lifetime_secs": lifetime
        });
    });
    sb.extra_args.extend(["--policy".to_string(), p.display().to_string()]);
}

/// Wall seconds of a CPU hog cell.
const HOG: f64 = 3.0;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The session is gone and has left nothing: no supervisor, no process
/// with `marker`, no run cgroup, no mount, no socket, no driver folder.
fn assert_session_gone(sb: &Sandbox, s: &Session, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let leftovers = || -> Vec<String> {
        let mut left = Vec::new();
        if s.alive() {
            left.push(format!("supervisor {}", s.pid));
        }
        left.extend(host_processes_with(marker).iter().map(|p| format!("process {p}")));
        left.extend(cgroups_left_by(s.pid).iter().map(|p| format!("cgroup {}", p.display())));
        left.extend(host_mounts_with(&sb.dir.path().display().to_string()));
        if let Ok(entries) = std::fs::read_dir(sb.session_dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // The one-line tombstone is what a later exec reads.
                if !name.ends_with(".ended") {
                    left.push(format!("session file {name}"));
                }
            }
        }
        left
    };
    while !leftovers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(leftovers(), Vec::<String>::new(), "the session left something behind");
}

/// `exec` on a session that ended: exit 125, one line that says why.
fn assert_ended(s: &Session, why: &str) {
    let (v, out) = s.exec("print('too late')\n");
    assert_eq!(out.status.code(), Some(125), "{v}\n{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains("ended (") && err.contains(why) && err.contains("jail session start"), "{err}");
}

#[test]
fn state_persists_across_the_cells_of_one_session() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let (v, _) =
        s.exec("import json\nx = 41\nopen('/tmp/note', 'w').write('kept')\ndef twice(n):\n    return 2 * n\nprint('one')\n");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["stdout"]["text"], "one\n");
    assert_eq!(v["session"]["cell"], 1);
    let (v, out) = s.exec("print(json.dumps([x + 1, open('/tmp/note').read(), twice(21)]))\n");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(v["stdout"]["text"], "[42, \"kept\", 42]\n", "each cell's stdout is its own");
    assert_eq!(v["session"]["cell"], 2);
    assert_eq!(v["session"]["ended"], false);
    // The same contract as `jail run --json`: the isolation is reported.
    assert_eq!(v["isolation"]["no_new_privs"], true);
    assert_eq!(v["isolation"]["seccomp"]["status"], "enforced", "{}", v["isolation"]);
    let out = s.stop();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let closing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(closing["session"]["why"], "stopped");
    assert_session_gone(&sb, &s, &s.id);
    assert_ended(&s, "stopped");
}

#[test]
fn an_exception_is_reported_like_a_run_and_the_session_goes_on() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let (v, out) = s.exec("y = 5\ndef f():\n    return 1 / 0\nf()\n");
    assert_eq!(v["status"], "nonzero_exit", "{v}");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(v["error"]["type"], "ZeroDivisionError");
    assert!(v["error"]["traceback_tail"].as_str().unwrap().contains("<cell 1>"), "{v}");
    assert!(v["stderr"]["text"].as_str().unwrap().contains("ZeroDivisionError"));
    let (v, out) = s.exec("import sys\nprint(y)\nsys.exit(3)\n");
    assert_eq!((v["status"].as_str(), out.status.code()), (Some("nonzero_exit"), Some(3)), "{v}");
    assert_eq!(v["stdout"]["text"], "5\n");
    assert_eq!(v["stderr"]["text"], "", "the first cell's traceback stays in the first cell");
    let (v, _) = s.exec("print(y * 2)\n");
    assert_eq!(v["stdout"]["text"], "10\n", "SystemExit does not end the session: {v}");
    s.stop();
}

#[test]
fn a_second_session_sees_nothing_of_the_first() {
    let sb = Sandbox::new();
    let marker = format!("first-session-{}", std::process::id());
    let a = sb.start_session();
    let (v, _) = a.exec(&format!(
        "import subprocess\nsecret = 'canary-{marker}'\nopen('/tmp/canary', 'w').write(secret)\n\
         child = subprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\nprint(secret)\n"
    ));
    assert_eq!(v["status"], "ok", "{v}");
    let b_box = Sandbox::new();
    let b = b_box.start_session();
    let (v, _) = b.exec(
        "import json, os\nprint(json.dumps({'vars': sorted(k for k in globals() if not k.startswith('__')), \
         'tmp': os.listdir('/tmp'), 'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), \
         'cmdlines': [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in os.listdir('/proc') if p.isdigit()]}))\n",
    );
    assert_eq!(v["status"], "ok", "{v}");
    let text = v["stdout"]["text"].as_str().unwrap();
    assert!(!text.contains(&marker), "the second session saw the first's state: {text}");
    let seen: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(seen["vars"], serde_json::json!(["json", "os"]), "{seen}");
    assert_eq!(seen["tmp"], serde_json::json!([]), "{seen}");
    // PID 1 (the reaper), the driver, nothing else.
    assert_eq!(seen["pids"].as_array().unwrap().len(), 2, "{seen}");
    a.stop();
    b.stop();
    assert_session_gone(&sb, &a, &marker);
    assert_session_gone(&b_box, &b, &b.id);
}

/// A session started by a caller that ignores SIGINT (a shell starts a
/// background job `jail serve &` or `jail pool &` so, and the ignoring is
/// inherited through fork and exec) still interrupts a cell past its time:
/// the jail's script starts with every signal at its default, so Python
/// has its KeyboardInterrupt handler. Without that the cell was killed at
/// the end of the grace and the session with it.
#[test]
fn a_session_started_with_sigint_ignored_still_interrupts_a_cell_past_its_time() {
    use std::os::unix::process::CommandExt;
    let mut sb = Sandbox::new();
    sb.extra_args.extend(["--timeout".into(), "1".into()]);
    let mut start = sb.session_command();
    // SAFETY: between fork and exec this only calls signal(2), which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        start.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
            Ok(())
        });
    }
    let s = Session::started(&start.output().expect("spawn jail session start"));
    s.exec("n = 7\n");
    let (v, _) = s.exec("import time\nwhile True:\n    time.sleep(0.1)\n");
    assert_eq!(
        (&v["status"], &v["error"]["type"]),
        (&serde_json::json!("timeout_wall"), &serde_json::json!("KeyboardInterrupt")),
        "{v}"
    );
    assert_eq!(v["session"]["ended"], false, "{v}");
    let (v, _) = s.exec("print(n)\n");
    assert_eq!(v["stdout"]["text"], "7\n", "{v}");
    s.stop();
}

/// The host pids of every process beneath `pid` (its threads' children,
/// breadth first).
fn descendants(pid: u32) -> Vec<u32> {
    let (mut found, mut next) = (vec![pid], 0);
    while next < found.len() {
        let p = found[next];
        next += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            found.extend(list.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    found.remove(0);
    found
}

/// A cell past its time whose interpreter gets no CPU for longer than
/// the grace (SIGSTOPped here, as a loaded host or the throttle would
/// starve it) is not killed for it: the grace counts once the interpreter
/// has run (session/grace.rs). Once it runs again it takes its
/// KeyboardInterrupt and the session lives, its variables with it.
/// Without that rule the wall clock ended the grace while the interpreter
/// was stopped, and the cell was killed with its session (`cell_killed`).
#[test]
fn a_starved_interpreter_keeps_its_grace_and_the_session_lives() {
    use nix::sys::signal::{kill, Signal};
    let mut sb = Sandbox::new();
    sb.extra_args.extend(["--timeout".into(), "1".into()]);
    let s = sb.start_session();
    s.exec("n = 7\n");
    let pid = s.pid;
    let (handle, id) = (s.handle.clone(), s.id.clone());
    let cell = std::thread::spawn(move || {
        let s = Session { handle, pid, id };
        s.exec("print('sleeping', flush=True)\nimport time\nwhile True:\n    time.sleep(0.1)\n").0
    });
    // The driver: the interpreter beneath the jail's PID 1, in the loop.
    let mut driver = None;
    let until = Instant::now() + Duration::from_secs(10);
    while driver.is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        driver = descendants(s.pid)
            .into_iter()
            .rev()
            .find(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("python")));
    }
    let driver = nix::unistd::Pid::from_raw(driver.expect("the session's interpreter") as i32);
    std::thread::sleep(Duration::from_millis(300));
    kill(driver, Signal::SIGSTOP).expect("stop the interpreter");
    // Past its time (1 s) and past the grace (2 s) by far, on the wall
    // clock; far inside the ceiling (ten graces).
    std::thread::sleep(Duration::from_secs(5));
    // (Gone, when the grace was the wall clock's: the assertion says why.)
    let _ = kill(driver, Signal::SIGCONT);
    let v = cell.join().expect("the cell's thread");
    assert_eq!(
        (&v["status"], &v["error"]["type"], &v["session"]["ended"]),
        (&serde_json::json!("timeout_wall"), &serde_json::json!("KeyboardInterrupt"), &serde_json::json!(false)),
        "{v}"
    );
    let (v, _) = s.exec("print(n)\n");
    assert_eq!(v["stdout"]["text"], "7\n", "{v}");
    s.stop();
}

#[test]
fn a_cell_past_its_time_gets_keyboard_interrupt_and_the_session_lives_on() {
    let mut sb = Sandbox::new();
    sb.extra_args.extend(["--timeout".into(), "1".into()]);
    let s = sb.start_session();
    s.exec("n = 7\n");
    let started = Instant::now();
    let (v, out) = s.exec("print('spinning', flush=True)\nwhile True:\n    pass\n");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_eq!(v["status"], "timeout_wall", "{v}");
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(v["error"]["type"], "KeyboardInterrupt", "{v}");
    assert_eq!(v["stdout"]["text"], "spinning\n");
    assert_eq!(v["session"]["ended"], false);
    let (v, _) = s.exec("print(n)\n");
    assert_eq!(v["stdout"]["text"], "7\n", "{v}");
    s.stop();
}

#[test]
fn a_cell_past_its_cpu_time_in_a_cgroup_gets_keyboard_interrupt_and_the_session_lives_on() {
    // Where the run cgroup counts CPU, a cell's CPU time is its own: the
    // cgroup's count since the cell began (session/cells.rs, `check_cpu`).
    // Past it the cell gets KeyboardInterrupt, as at its wall time, and
    // ends `timeout_cpu`; the session goes on. Without such a cgroup
    // RLIMIT_CPU stands in (the test below).
    let mut sb = Sandbox::new();
    // A wall limit far above the CPU limit, as in the test below.
    sb.extra_args.extend(["--cpu-time", "1", "--timeout", "60"].map(String::from));
    let s = sb.start_session();
    s.exec("n = 7\n");
    let (v, out) = s.exec("while True:\n    pass\n");
    if v["limits"]["cpu_time_secs"]["enforced_by"] != "supervisor" {
        s.stop();
        covered_elsewhere("no cgroup counts this session's CPU, so RLIMIT_CPU stands in; the root half has one");
        return;
    }
    assert_eq!(
        (&v["status"], &v["error"]["type"]),
        (&serde_json::json!("timeout_cpu"), &serde_json::json!("KeyboardInterrupt")),
        "{v}"
    );
    assert_eq!(out.status.code(), Some(124), "{v}");
    assert_eq!(v["session"]["ended"], false, "{v}");
    let (v, _) = s.exec("print(n)\n");
    assert_eq!(v["stdout"]["text"], "7\n", "{v}");
    s.stop();
}

#[test]
fn a_cell_past_rlimit_cpu_is_timeout_cpu_as_a_run_is() {
    // Where no cgroup counts CPU, RLIMIT_CPU stands in for the CPU-time
    // limit and its SIGXCPU kills the interpreter mid-cell: the cell is
    // `timeout_cpu`, as the same loop under `jail run` is (limits.rs,
    // `cpu_time_limit_below_the_wall_time_ends_as_timeout_cpu`), not
    // `signaled`. Root has a run cgroup on the CI host, the ordinary user
    // none without delegation.
    if only_as_ordinary_user("RLIMIT_CPU stands in for the CPU-time limit only without a cgroup") {
        return;
    }
    let mut sb = Sandbox::new();
    // A wall limit far above the CPU limit: which limit ends the cell is
    // the point, not how fast a loaded host gives it a second of CPU.
    sb.extra_args
        .extend(["--cpu-time", "1", "--timeout", "60", "--no-systemd-delegation"].map(String::from));
    let s = sb.start_session();
    let (v, out) = s.exec("while True:\n    pass\n");
    if v["limits"]["cpu_time_secs"]["enforced_by"] != "rlimit" {
        covered_elsewhere(
            "this user has a cgroup that counts CPU, so RLIMIT_CPU never stands in; the CI host's ordinary-user half has none",
        );
        return;
    }
    assert_eq!(v["status"], "timeout_cpu", "{v}");
    assert_eq!(v["signal_name"], "SIGXCPU", "{v}");
    assert_eq!(out.status.code(), Some(124), "{v}");
    // RLIMIT_CPU counts the interpreter over the whole session: it is gone.
    assert_eq!(v["session"]["why"], "interpreter_died", "{v}");
    assert_session_gone(&sb, &s, &s.id);

    // A cell that ignores SIGXCPU dies of the SIGKILL a second later, at
    // the hard limit: `timeout_cpu` too, from the CPU PID 1 reaped.
    let s = sb.start_session();
    let (v, _) = s.exec("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n");
    assert_eq!(v["status"], "timeout_cpu", "{v}");
    assert_eq!(v["signal_name"], "SIGKILL", "{v}");
    assert_session_gone(&sb, &s, &s.id);
}

#[test]
fn a_cell_of_hogs_that_resume_each_other_is_held_to_the_sessions_cpus() {
    // The session's quota is kept by the run cgroup where there is one,
    // else by the supervisor's throttle in the session's serve loop: each
    // stop must hold the whole tree of a cell whose processes SIGCONT each
    // other, and the cell's result says what the throttle did to it.
    let mut sb = Sandbox::new();
    sb.extra_args.extend(["--cpus".into(), "0.2".into(), "--timeout".into(), "20".into()]);
    let s = sb.start_session();
    // The cell measures itself: without a cgroup a cell's result has no
    // CPU counters, and the hog waits for every child it made.
    let cell = format!(
        "import json, os, time\nt0, w0 = os.times(), time.monotonic()\n{}\nt = os.times()\n\
         print(json.dumps([sum(t[:4]) - sum(t0[:4]), time.monotonic() - w0]))\n",
        sigcont_hog(HOG),
    );
    let (v, _) = s.exec(&cell);
    assert_eq!(v["status"], "ok", "{v}");
    let [cpu, wall]: [f64; 2] = serde_json::from_str(v["stdout"]["text"].as_str().unwrap()).unwrap();
    let share = cpu / wall;
    let seen = format!("used {share:.3} of a core ({cpu:.3} s CPU in {wall:.3} s); throttled {}", v["usage"]["throttled"]);
    eprintln!("{seen}");
    let r: RunResult = serde_json::from_value(v.clone()).expect("a cell's result is a run's");
    assert_held_to_quota(&r, 0.2, share, wall * 1000.0, &seen);
    if let Some(t) = &r.usage.throttled {
        // Each cell's report is its own, not the session's running total.
        let (v2, _) = s.exec("print('after')\n");
        assert_eq!(v2["status"], "ok", "{v2}");
        let later = v2["usage"]["throttled"]["stops"].as_u64().expect("throttled in every cell");
        assert!(later < t.stops, "{}", v2["usage"]);
    }
    assert_eq!(v["session"]["ended"], false);
    s.stop();
    assert_session_gone(&sb, &s, &s.id);
}

#[test]
fn a_cell_that_ignores_its_interrupt_is_killed_after_the_grace_and_the_session_ends() {
    let mut sb = Sandbox::new();
    session_times(&mut sb, 1.0, 60.0, 120.0);
    sb.extra_args.extend(["--timeout".into(), "1".into()]);
    let s = sb.start_session();
    let started = Instant::now();
    let (v, out) = s.exec("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(5), "{took:?}");
    assert_eq!(v["status"], "timeout_wall", "{v}");
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(v["signal_name"], "SIGKILL", "{v}");
    assert_eq!(v["session"]["ended"], true);
    assert_eq!(v["session"]["why"], "cell_killed");
    assert_session_gone(&sb, &s, &s.id);
    assert_ended(&s, "interrupt_grace_secs");
}

#[test]
fn the_idle_timeout_ends_the_session() {
    let mut sb = Sandbox::new();
    session_times(&mut sb, 1.0, 1.0, 60.0);
    let s = sb.start_session();
    let (v, _) = s.exec("x = 1\n");
    assert_eq!(v["status"], "ok", "{v}");
    std::thread::sleep(Duration::from_millis(2500));
    assert_session_gone(&sb, &s, &s.id);
    assert_ended(&s, "idle_timeout_secs");
}

#[test]
fn the_maximum_lifetime_ends_the_session_even_mid_cell() {
    let mut sb = Sandbox::new();
    session_times(&mut sb, 1.0, 2.0, 2.0);
    sb.extra_args.extend(["--timeout".into(), "30".into()]);
    let s = sb.start_session();
    let started = Instant::now();
    let (v, _) = s.exec("import time\ntime.sleep(20)\n");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(v["status"], "timeout_wall", "{v}");
    assert_eq!(v["session"]["why"], "max_lifetime", "{v}");
    assert_session_gone(&sb, &s, &s.id);
    assert_ended(&s, "max_lifetime_secs");
}

#[test]
fn a_dead_interpreter_ends_the_session_with_a_clear_status() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let (v, out) = s.exec("import os\nprint('bye', flush=True)\nos._exit(7)\n");
    assert_eq!(v["status"], "nonzero_exit", "{v}");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(v["stdout"]["text"], "bye\n");
    assert_eq!(v["session"]["why"], "interpreter_died", "{v}");
    assert_session_gone(&sb, &s, &s.id);
    assert_ended(&s, "exited with code 7");

    let sb = Sandbox::new();
    let s = sb.start_session();
    let (v, out) = s.exec("import ctypes\nctypes.string_at(0)\n");
    assert_eq!(v["status"], "signaled", "{v}");
    assert_eq!(v["signal_name"], "SIGSEGV", "{v}");
    assert_eq!(out.status.code(), Some(128 + 11));
    assert_session_gone(&sb, &s, &s.id);
    assert_ended(&s, "SIGSEGV");
}

#[test]
fn sigterm_to_the_session_supervisor_cancels_the_cell_in_flight_and_ends_the_session() {
    let sb = Sandbox::new();
    let marker = format!("cancelled-{}", std::process::id());
    let s = sb.start_session();
    let cell = format!(
        "import subprocess, time\nsubprocess.Popen(['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\ntime.sleep(60)\n"
    );
    let pid = s.pid;
    let killer = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(10);
        while host_processes_with(&marker).is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let at = Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
        at
    });
    let (v, out) = s.exec(&cell);
    let took = killer.join().unwrap().elapsed();
    assert!(took < Duration::from_secs(2), "the cancelled cell answered {took:?} after the signal");
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(v["supervisor"]["cancelled_by"], "SIGTERM", "{v}");
    assert_eq!(v["session"]["why"], "cancelled", "{v}");
    assert_eq!(out.status.code(), Some(143), "exits as a cancelled run does");
    assert_session_gone(&sb, &s, &format!("cancelled-{}", std::process::id()));
    assert_ended(&s, "SIGTERM");
}

#[test]
fn sigkill_of_the_session_supervisor_leaves_nothing_behind() {
    let sb = Sandbox::new();
    let marker = format!("orphan-{}", std::process::id());
    let s = sb.start_session();
    let (v, _) = s.exec(&format!(
        "import os, subprocess, time\n\
         subprocess.Popen(['python3', '-c', 'import time; open(\"/tmp/started\", \"w\").close(); time.sleep(60)', '{marker}'])\n\
         while not os.path.exists('/tmp/started'):\n    time.sleep(0.01)\n\
         open('/tmp/big', 'wb').write(b'x' * (1 << 20))\n"
    ));
    assert_eq!(v["status"], "ok", "{v}");
    // The cell waited until the probe's own code ran, so its command line
    // (with the marker) is the exec'd one.
    assert_eq!(host_processes_with(&marker).len(), 1, "the probe's process should be running");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.pid as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    assert_session_gone(&sb, &s, &marker);
    assert_ended(&s, "killed");
}

#[test]
fn exec_on_an_unknown_handle_is_one_line_and_exit_125() {
    for handle in ["/nonexistent/session.sock", "/tmp", "/dev/null"] {
        let s = Session { handle: PathBuf::from(handle), pid: 0, id: String::new() };
        let (_, out) = s.exec("print(1)\n");
        assert_eq!(out.status.code(), Some(125), "{handle}");
        let err = stderr_of(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("no session at") && err.contains("jail session start"), "{err}");
        assert!(out.stdout.is_empty());
    }
    let out = Command::new(jail_bin()).args(["session", "stop", "/nonexistent/x.sock"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
}

#[test]
fn the_handle_is_private_to_its_owner() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
    assert!(meta(&s.handle).file_type().is_socket());
    assert_eq!(meta(&s.handle).permissions().mode() & 0o777, 0o600);
    assert_eq!(meta(s.handle.parent().unwrap()).permissions().mode() & 0o777, 0o700);
    assert_eq!(s.handle.parent().unwrap(), sb.session_dir());
    s.stop();
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    if only_as_root("switches to the test user to connect") {
        return;
    }
    let Some((uid, _)) = test_user() else {
        return skip("no test user (JAIL_TEST_USER, default jailtest) to connect as");
    };
    let sb = Sandbox::new();
    let s = sb.start_session();
    // Open what the file modes close, so only SO_PEERCRED stands between
    // the other user and the session.
    for p in [sb.runtime_dir(), sb.runtime_dir().join("jail"), sb.session_dir()] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&s.handle, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups"])
        .arg(jail_bin())
        .args(["session", "exec"])
        .arg(&s.handle)
        .arg("/dev/null")
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("is not this session's owner"), "{err}");
    let (v, _) = s.exec("print('still mine')\n");
    assert_eq!(v["stdout"]["text"], "still mine\n", "{v}");
    s.stop();
}

/// The cell finds the driver's control socket and writes what it likes.
const FORGE: &str = r#"
import json, os, socket, stat, time
def is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False
fds = [int(f) for f in os.listdir('/proc/self/fd') if is_socket(int(f))]
lie = lambda **m: (json.dumps(m) + '\n').encode()
print('forging on', len(fds), flush=True)
for fd in fds:
    for cell in (1, 2, 3, 99):
        os.write(fd, lie(op='done', id=cell, outcome='ok', exit_code=0,
                         error={'type': 'Forged' * 100, 'message': 'm' * 100000, 'traceback': 't'}))
    os.write(fd, lie(op='ready'))
    os.write(fd, b'{"op":"done","id":2,' + b'"pad":"' + b'p' * (1 << 20) + b'"}\n')
    os.write(fd, b'garbage\n' + lie(op='exec', id=5, code='print(1)'))
time.sleep(0.3)
print('late')
"#;

#[test]
fn a_cell_that_forges_done_lines_corrupts_only_its_own_result() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let (v, _) = s.exec(FORGE);
    // No forged `done` is believed, not even for this cell: none carries
    // the nonce of the cell's `exec`, so the cell runs to its real end.
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["error"], serde_json::Value::Null, "{v}");
    assert_eq!(v["session"]["cell"], 1);
    let out = v["stdout"]["text"].as_str().unwrap_or("");
    assert!(out.starts_with("forging on 1"), "the driver's socket: {v}");
    assert!(out.ends_with("late\n"), "a forged done ended the cell early: {v}");
    // The next cell ends only with its own `done`: lines for it written
    // before it began (however late they arrive: the 1 MiB line blocks its
    // writer on the full socket), over-long or malformed lines are never
    // believed.
    let (v, _) = s.exec("import time\ntime.sleep(0.6)\nprint('two')\n");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["session"]["cell"], 2);
    assert!(v["stdout"]["text"].as_str().unwrap().ends_with("two\n"), "cell 2 was ended early: {v}");
    assert_eq!(v["error"], serde_json::Value::Null);
    let (v, _) = s.exec("print('three')\n");
    assert_eq!(v["stdout"]["text"], "three\n", "{v}");
    s.stop();
    assert_session_gone(&sb, &s, &s.id);
}

#[test]
fn a_session_that_cannot_start_says_why_in_one_line() {
    let mut sb = Sandbox::new();
    sb.rootfs = PathBuf::from("/nonexistent-rootfs");
    let out = sb.session_command().output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("nonexistent-rootfs"), "{err}");
    assert!(out.stdout.is_empty());
    // Nothing of the session that never was: no socket, no driver folder.
    let left: Vec<_> = std::fs::read_dir(sb.session_dir())
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|n| n.to_string_lossy().ends_with(".ended")), "{left:?}");
}

#[test]
fn jail_check_validates_the_session_section() {
    let sb = Sandbox::new();
    let p = policy_with(&sb, |v| v["session"] = serde_json::json!({"idle_timeout_secs": 0}));
    let out = Command::new(jail_bin()).arg("check").arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr_of(&out).contains("session.idle_timeout_secs"), "{}", stderr_of(&out));
    let p = policy_with(&sb, |v| v["session"] = serde_json::json!({"interrupt_grace": 1}));
    let out = Command::new(jail_bin()).arg("check").arg(&p).output().unwrap();
    assert!(stderr_of(&out).contains("unknown field `interrupt_grace`"), "{}", stderr_of(&out));
}

/// The driver ends a stopped session without the interpreter's long
/// teardown (driver.py, `quick_exit`), but nothing a cell wrote is lost
/// on the way: a file left open, one held in a reference cycle (which a
/// garbage collection would close before its text was flushed), what an
/// atexit handler writes, and what a non-daemon thread writes after the
/// stop (the exit waits for it, as Python's own does).
#[test]
fn what_a_cell_left_unflushed_reaches_the_output_when_the_session_stops() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let (v, _) = s.exec(
        "import atexit, threading, time\n\
         left_open = open('/workspace/output/open.txt', 'w')\nleft_open.write('open')\n\
         class Node: pass\nn = Node()\nn.me = n\nn.f = open('/workspace/output/cycle.txt', 'w')\nn.f.write('cycle')\ndel n\n\
         atexit.register(lambda: open('/workspace/output/atexit.txt', 'w').write('atexit'))\n\
         def late():\n    time.sleep(0.3)\n    with open('/workspace/output/thread.txt', 'w') as f:\n        f.write('thread')\n\
         threading.Thread(target=late).start()\n",
    );
    assert_eq!(v["status"], "ok", "{v}");
    let out = s.stop();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let closing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["open", "cycle", "atexit", "thread"] {
        let got = std::fs::read_to_string(sb.output.join(format!("{name}.txt"))).unwrap_or_default();
        assert_eq!(got, name, "{name}.txt lost its text at the session's end: {}", closing["artifacts"]);
    }
    assert_session_gone(&sb, &s, &s.id);
}
/// `jail session exec --events HANDLE -` with `code` on stdin, its stdout
/// piped and not yet read.
fn exec_events(s: &Session, code: &str) -> std::process::Child {
    use std::io::Write;
    let mut child = Command::new(jail_bin())
        .args(["session", "exec", "--events"])
        .arg(&s.handle)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn jail session exec --events");
    child.stdin.take().unwrap().write_all(code.as_bytes()).unwrap();
    child
}

/// Every line of an event stream, each one JSON object with a type; the
/// last is the result, whose document the schema holds.
fn event_lines(text: &str) -> Vec<serde_json::Value> {
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not an event ({e}): {l:?}"));
            assert!(v["type"].is_string(), "an event without a type: {l}");
            v
        })
        .collect();
    let last = lines.last().expect("no line at all");
    assert_eq!(last["type"], "result", "the stream does not end with the result: {last}");
    validate_result(&last["result"]).unwrap_or_else(|e| panic!("the result event breaks the schema: {e}"));
    lines
}

fn chunks_of(events: &[serde_json::Value], kind: &str) -> String {
    events.iter().filter(|e| e["type"] == kind).map(|e| e["data"].as_str().unwrap()).collect()
}

#[test]
fn a_live_cell_sends_its_output_as_it_comes_then_its_result() {
    use std::io::{BufRead, Read};
    let sb = Sandbox::new();
    let s = sb.start_session();
    s.exec("n = 7\n");
    // No flush: only a live cell's unbuffered streams send "early" before
    // the sleep ends.
    let mut child =
        exec_events(&s, "import sys, time\nprint('early', n)\nsys.stderr.write('warn')\ntime.sleep(2)\nprint('late')\n");
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    let start = Instant::now();
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    let first_at = start.elapsed();
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let ended = start.elapsed();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let first_event: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first_event["type"], "stdout", "{first}");
    // Unbuffered, print() writes "early", " 7" and "\n" one by one: the
    // first event may hold only the first of them.
    assert!(first_event["data"].as_str().unwrap().starts_with("early"), "{first}");
    assert!(ended - first_at > Duration::from_millis(1500), "the first event came {first_at:?} in, the end {ended:?}");
    let events = event_lines(&(first + &rest));
    assert_eq!(chunks_of(&events, "stdout"), "early 7\nlate\n");
    assert_eq!(chunks_of(&events, "stderr"), "warn");
    let result = &events.last().unwrap()["result"];
    assert_eq!(result["status"], "ok", "{result}");
    assert_eq!(result["stdout"]["text"], "early 7\nlate\n", "the result has the text, as `--json`");
    // The next cell, without --events, is buffered and plain again.
    let (v, _) = s.exec("import sys\nprint(sys.stdout.write_through, n)\n");
    assert_eq!(v["stdout"]["text"], "False 7\n", "{v}");
    s.stop();
    assert_session_gone(&sb, &s, &s.id);
}

#[test]
fn a_live_cells_events_keep_their_order_and_a_flood_is_capped_with_truncated() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    // 100 000 numbered lines on each stream (~1.2 MB in all, each under its
    // 1 MiB cap): every byte arrives, in order, in many chunks.
    let out = exec_events(&s, "import sys\nfor i in range(100000):\n    print(i)\n    print(-i, file=sys.stderr)\n")
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let events = event_lines(&String::from_utf8(out.stdout).unwrap());
    let want_out: String = (0..100000).map(|i| format!("{i}\n")).collect();
    let want_err: String = (0..100000).map(|i| format!("{}\n", -i)).collect();
    assert_eq!(chunks_of(&events, "stdout"), want_out);
    assert_eq!(chunks_of(&events, "stderr"), want_err);
    assert!(events.len() > 3, "the output came in chunks, not at the end");
    assert!(!events.iter().any(|e| e["type"] == "truncated" || e["type"] == "dropped"), "nothing is cut");
    // Past the cap: one marker, then nothing more of that stream.
    let out = exec_events(&s, "import sys\nsys.stdout.write('x' * (3 << 20))\nprint('after', file=sys.stderr)\n")
        .wait_with_output()
        .unwrap();
    let events = event_lines(&String::from_utf8(out.stdout).unwrap());
    let cut: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "truncated").collect();
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0]["stream"], "stdout");
    assert_eq!(cut[0]["limit_bytes"], 1 << 20);
    let at = events.iter().position(|e| e["type"] == "truncated").unwrap();
    assert!(!events[at..].iter().any(|e| e["type"] == "stdout"), "stdout went on past its marker");
    assert_eq!(chunks_of(&events, "stdout").len(), 1 << 20);
    assert_eq!(chunks_of(&events, "stderr"), "after\n");
    let result = &events.last().unwrap()["result"];
    assert_eq!(result["status"], "output_limit", "{result}");
    assert_eq!(result["stdout"]["truncated"], true);
    s.stop();
}

#[test]
fn a_live_client_that_stops_reading_holds_up_neither_the_cells_deadline_nor_the_session() {
    use std::io::Read;
    let mut sb = Sandbox::new();
    sb.extra_args.extend(["--timeout".into(), "2".into()]);
    let s = sb.start_session();
    // Far more than the socket, the relay's buffer and the pipes hold (64
    // MiB a stream, which the cell could write in well under its 2 s were
    // its pipes read), then a sleep past the deadline; nobody reads this
    // client for 5 s. Past its deadline the cell's pipes are read again
    // (it must be able to write its traceback) until its KeyboardInterrupt
    // lands, so a little more than what was held gets through, never all.
    let started = Instant::now();
    let mut stalled = exec_events(
        &s,
        "import sys, time\nfor _ in range(8192):\n    sys.stdout.buffer.write(b'o' * 8192)\n    sys.stderr.buffer.write(b'e' * 8192)\ntime.sleep(60)\n",
    );
    // Meanwhile the session serves another client once the cell is past
    // its deadline: its supervisor is not waiting for the stalled one.
    let deadline = started + Duration::from_secs(15);
    let (v, _) = loop {
        let (v, out) = s.exec("print('next')\n");
        if out.status.success() || Instant::now() > deadline {
            break (v, out);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let served_at = started.elapsed();
    assert_eq!(v["stdout"]["text"], "next\n", "{v}");
    assert!(served_at < Duration::from_secs(5), "the next client waited {served_at:?} for a reader that does not read");
    std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
    let mut got = Vec::new();
    stalled.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    let status = stalled.wait().unwrap();
    assert_eq!(status.code(), Some(124));
    let events = event_lines(&String::from_utf8(got).unwrap());
    let result = &events.last().unwrap()["result"];
    assert_eq!(result["status"], "timeout_wall", "{result}");
    assert!(result["usage"]["wall_ms"].as_f64().unwrap() < 3500.0, "{}", result["usage"]);
    // What the reader never took by the deadline is dropped and counted; the
    // result has the text. While the buffer was full the cell's pipes were
    // not read: the cell waited, not the supervisor.
    let dropped = events.iter().find(|e| e["type"] == "dropped").expect("a dropped event");
    assert!(dropped["events"].as_u64().unwrap() > 0, "{dropped}");
    let bytes = result["stdout"]["bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes < 8192 * 8192, "{bytes}");
    assert!((chunks_of(&events, "stdout").len() as u64) < bytes);
    s.stop();
    assert_session_gone(&sb, &s, &s.id);
}

/// Send one raw request line to a session's socket; its answer.
fn raw_request(s: &Session, line: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut sock = std::os::unix::net::UnixStream::connect(&s.handle).unwrap();
    sock.write_all(line.as_bytes()).unwrap();
    sock.write_all(b"\n").unwrap();
    sock.shutdown(std::net::Shutdown::Write).unwrap();
    let mut text = String::new();
    sock.read_to_string(&mut text).unwrap();
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

/// Start a session with `more` flags, holding the read end of a lifeline
/// pipe as `jail pool` does; the write end is returned, to be kept open.
fn start_with_lifeline(sb: &Sandbox, more: &[&str]) -> (Session, std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let (read, write) = nix::unistd::pipe().unwrap();
    let mut cmd = sb.session_command();
    cmd.args(["--lifeline-fd", "3"]).args(more);
    jail::sys::pass_fd_on_exec(&mut cmd, read.as_raw_fd(), 3);
    let out = cmd.output().unwrap();
    drop(read);
    (Session::started(&out), write)
}

#[test]
fn only_a_preload_the_start_ran_is_trusted_before_an_output_folder_is_taken() {
    // A session that holds a lifeline (as a pool's does) and whose policy
    // lists a preload, but whose start was not asked to run it: its first
    // cell is the caller's, untrusted, so no output folder is taken after it
    // (the trust was once inferred from the lifeline and the policy alone).
    let mut sb = Sandbox::new();
    let policy = policy_with(&sb, |v| v["preload"] = serde_json::json!(["json"]));
    sb.extra_args = vec!["--policy".into(), policy.display().to_string()];
    let theirs = sb.dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    give_to_sandbox(&theirs);
    let adopt = serde_json::json!({"op": "adopt_output", "dir": theirs}).to_string();
    let (untrusted, _lifeline) = start_with_lifeline(&sb, &[]);
    untrusted.exec("open('/workspace/output/planted.txt', 'w').write('x')\n");
    let refused = raw_request(&untrusted, &adopt);
    assert!(refused["error"].as_str().is_some_and(|e| e.contains("cells have run")), "{refused}");
    untrusted.stop();
    assert!(!theirs.join("planted.txt").exists(), "a refused folder got the session's output");
    // Asked to (`--preload`), the start runs it: the modules are there
    // before the first caller's cell, which is the session's second, and the
    // folder is still taken before it.
    let (preloaded, _lifeline) = start_with_lifeline(&sb, &["--preload"]);
    let taken = raw_request(&preloaded, &adopt);
    assert_eq!(taken["result"]["output_dir"], theirs.display().to_string(), "{taken}");
    let (v, _) = preloaded.exec("import sys\nprint('json' in sys.modules, [k for k in globals() if 'preload' in k])\n");
    assert_eq!(v["stdout"]["text"], "True []\n", "{v}");
    assert_eq!(v["session"]["cell"], 2, "the preload was the first cell: {v}");
    preloaded.stop();
    // A preload that cannot be imported: the start fails with the reason
    // and leaves no session behind.
    let bad = policy_with(&sb, |v| v["preload"] = serde_json::json!(["no_such_module_here"]));
    sb.extra_args = vec!["--policy".into(), bad.display().to_string()];
    let out = sb.session_command().arg("--preload").output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{said}");
    assert!(said.contains("preload failed") && said.contains("no_such_module_here"), "{said}");
    let left = || {
        let names = std::fs::read_dir(sb.session_dir()).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>());
        let mut left: Vec<String> = names.unwrap_or_default().iter().map(|n| n.to_string_lossy().into_owned()).collect();
        left.retain(|n| !n.ends_with(".ended"));
        left.extend(host_mounts_with(&sb.dir.path().display().to_string()));
        left
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !left().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(left(), Vec::<String>::new(), "the failed start left something behind");
}

#[test]
fn an_output_folder_is_taken_once_and_never_after_an_untrusted_cell_has_run() {
    // What `jail pool` asks of the session it hands out (adopt.rs), tried
    // on sessions of the test's own.
    let sb = Sandbox::new();
    let theirs = sb.dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("there.txt"), "there").unwrap();
    give_to_sandbox(&theirs);
    let adopt = serde_json::json!({"op": "adopt_output", "dir": theirs}).to_string();
    // After a cell: refused, and the cell may have planted anything.
    let used = sb.start_session();
    used.exec("open('/workspace/output/planted.txt', 'w').write('x')\n");
    let refused = raw_request(&used, &adopt);
    assert!(refused["result"].is_null(), "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("cells have run"), "{refused}");
    used.stop();
    assert!(!theirs.join("planted.txt").exists(), "a refused folder got the session's output");
    // Before any cell: taken once, filled in, delivered to at the end.
    let fresh = sb.start_session();
    let taken = raw_request(&fresh, &adopt);
    assert_eq!(taken["result"]["output_dir"], theirs.display().to_string(), "{taken}");
    let again = raw_request(&fresh, &adopt);
    assert!(again["error"].as_str().unwrap().contains("once"), "{again}");
    let (v, _) =
        fresh.exec("print(open('/workspace/output/there.txt').read())\nopen('/workspace/output/made.txt', 'w').write('made')\n");
    assert_eq!(v["stdout"]["text"], "there\n", "{v}");
    let out = fresh.stop();
    let end: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(end["output_dir"], theirs.display().to_string(), "{end}");
    assert_eq!(std::fs::read_to_string(theirs.join("made.txt")).unwrap(), "made");
    assert_eq!(std::fs::read_to_string(theirs.join("there.txt")).unwrap(), "there");
    assert!(!sb.output.join("made.txt").exists(), "the session's first output folder got it too");
    assert_session_gone(&sb, &fresh, &fresh.id);
}

/// `--code DIR` grants a session the caller's folder, as it does a run:
/// `/workspace/code` holds exactly that folder (never the cell driver,
/// which lives apart), and cells import from it as a script run from it
/// would. Without `--code`, `/workspace/code` is empty.
#[test]
fn a_session_takes_code_dir_and_its_code_dir_never_shows_the_driver() {
    let mut sb = Sandbox::new();
    let helper = sb.code.join("helper.py");
    std::fs::write(&helper, "ANSWER = 42\n").unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bare = sb.start_session();
    let (v, _) = bare.exec("import os\nprint(sorted(os.listdir('/workspace/code')))\n");
    assert_eq!(v["stdout"]["text"], "[]\n", "{v}");
    bare.stop();
    sb.extra_args.extend(["--code".to_string(), sb.code.display().to_string()]);
    let s = Session::started(&sb.session_command().output().unwrap());
    let (v, _) = s.exec("import os, helper\nprint(sorted(os.listdir('/workspace/code')), helper.ANSWER)\n");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["stdout"]["text"], "['helper.py'] 42\n", "{v}");
    s.stop();
    assert_session_gone(&sb, &s, &s.id);
}

/// Every ended session leaves a tombstone (why it ended, its closing for
/// a later `stop`); however many ended before, the folder keeps a bounded
/// number of them: each start forgets all but the newest, and any older
/// than a day.
#[test]
fn tombstones_are_bounded_whatever_the_history() {
    let sb = Sandbox::new();
    // The folder as a long history leaves it: 300 recent tombstones and
    // 20 from two days ago.
    let first = sb.start_session();
    first.stop();
    let dir = sb.session_dir();
    let two_days_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 86_400);
    for i in 0..320 {
        let p = dir.join(format!("{i:016x}.ended"));
        std::fs::write(&p, r#"{"why": "stopped by `jail session stop`"}"#).unwrap();
        if i < 20 {
            std::fs::File::options().write(true).open(&p).unwrap().set_modified(two_days_ago).unwrap();
        }
    }
    let tombstones = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".ended"))
            .count()
    };
    let s = sb.start_session();
    // The sweep ran at the start; the session's own comes at its end.
    assert!(tombstones() <= jail::session::MAX_TOMBSTONES, "{} tombstones", tombstones());
    assert!(!dir.join(format!("{:016x}.ended", 0)).exists(), "a tombstone two days old was kept");
    s.stop();
    assert!(tombstones() <= jail::session::MAX_TOMBSTONES + 1, "{} tombstones", tombstones());
    // The newest, this session's, is there for a later `stop`.
    let again = s.stop();
    assert!(again.status.success(), "{}", stderr_of(&again));
}

fn session_cmd(s: &Session, op: &str) -> std::process::Output {
    Command::new(jail_bin()).args(["session", op]).arg(&s.handle).output().expect("spawn jail session")
}

/// `exec` of `code` on a thread; `then` runs once the cell has printed its
/// first line (`ready`) on the host-visible marker file it writes.
fn while_a_cell_runs(s: &Session, code: &str, then: impl FnOnce()) -> (serde_json::Value, std::time::Duration) {
    let (handle, pid, id) = (s.handle.clone(), s.pid, s.id.clone());
    let code = code.to_string();
    let cell = std::thread::spawn(move || {
        let started = Instant::now();
        let (v, _) = Session { handle, pid, id }.exec(&code);
        (v, started)
    });
    // The cell is under way once its interpreter is busy: give it a moment.
    std::thread::sleep(Duration::from_millis(800));
    let at = Instant::now();
    then();
    let (v, _) = cell.join().unwrap();
    (v, at.elapsed())
}

#[test]
fn an_interrupt_request_stops_the_running_cell_with_keyboard_interrupt_and_the_session_lives_on() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let (v, took) = while_a_cell_runs(&s, "x = 1\nimport time\ntime.sleep(60)\n", || {
        let out = session_cmd(&s, "interrupt");
        assert!(out.status.success(), "{}", stderr_of(&out));
        let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(said["interrupted"], 1, "it names the cell it interrupted: {said}");
    });
    assert!(took < Duration::from_secs(2), "the interrupted cell answered {took:?} after the request");
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(v["error"]["type"], "KeyboardInterrupt", "{v}");
    assert_eq!(v["session"]["ended"], false, "{v}");
    // The interpreter and its state are still there; between cells an
    // interrupt has nothing to do.
    let (v, _) = s.exec("print(x)\n");
    assert_eq!(v["stdout"]["text"], "1\n", "{v}");
    let idle: serde_json::Value = serde_json::from_slice(&session_cmd(&s, "interrupt").stdout).unwrap();
    assert_eq!(idle["interrupted"], serde_json::Value::Null);
    assert!(s.stop().status.success());
    assert_session_gone(&sb, &s, &s.id);
}

#[test]
fn a_stop_while_a_cell_runs_kills_it_and_answers_with_the_closing_result() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let mut closing = serde_json::Value::Null;
    let code = "open('/workspace/output/kept.txt', 'w').write('k')\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)\n";
    let (v, took) = while_a_cell_runs(&s, code, || {
        let out = session_cmd(&s, "stop");
        assert!(out.status.success(), "{}", stderr_of(&out));
        closing = serde_json::from_slice(&out.stdout).unwrap();
    });
    assert!(took < Duration::from_secs(3), "the stop took {took:?}");
    assert_eq!(v["status"], "timeout_wall", "the cell was cut short: {v}");
    assert_eq!(closing["session"]["why"], "stopped", "{closing}");
    let kept: Vec<&str> = closing["artifacts"].as_array().unwrap().iter().filter_map(|a| a["path"].as_str()).collect();
    assert_eq!(kept, ["kept.txt"], "the closing result judged what the cell left: {closing}");
    assert_eq!(std::fs::read_to_string(sb.output.join("kept.txt")).unwrap(), "k");
    assert_session_gone(&sb, &s, &s.id);
}

#[test]
fn an_exec_sent_while_a_cell_runs_waits_its_turn() {
    let sb = Sandbox::new();
    let s = sb.start_session();
    let mut second = serde_json::Value::Null;
    let (first, _) = while_a_cell_runs(&s, "import time\ntime.sleep(2)\nprint('first')\n", || {
        let (v, _) = s.exec("print('second')\n");
        second = v;
    });
    assert_eq!(first["stdout"]["text"], "first\n", "{first}");
    assert_eq!(second["stdout"]["text"], "second\n", "{second}");
    assert_eq!(second["session"]["cell"], 2, "{second}");
    assert!(s.stop().status.success());
}
