//! Jails forked from a pool's template (issue 36): what a fork must not
//! reach or keep, tried from inside. The escape probes run as forked
//! steps too (escape.rs, `as_forked_step`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use jail_tests::*;
use serde_json::{json, Value};

/// A pool of `size` whose jails are forks of its template (the sandbox's
/// policy with a preload).
fn forked_pool(sb: &Sandbox, size: usize) -> Pool {
    let args = sb.with_preload();
    let extra: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut pool = Pool::start(sb, size, &extra);
    pool.wait_ready(size as u64);
    pool
}

fn step(pool: &mut Pool, id: &str, code: &str) -> Value {
    let r = pool.call(json!({"id": id, "code": code}));
    let result = r["result"].clone();
    assert_eq!(result["status"], "ok", "{id}: {r}");
    assert_eq!(result["isolation"]["forked_from_template"], true, "{id} did not run in a fork: {r}");
    result
}

fn printed(result: &Value) -> Value {
    serde_json::from_str(result["stdout"]["text"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {result}"))
}

#[test]
fn nothing_one_forked_step_leaves_reaches_the_next() {
    let sb = Sandbox::new();
    let mut pool = forked_pool(&sb, 1);
    // Planted everywhere a step can write that a later step could read, if
    // it shared the fork, its template's memory or its files.
    let plant = concat!(
        "import json, os, sys, builtins, random\n",
        "json.PLANTED = 'module'\n",
        "builtins.PLANTED = 'builtins'\n",
        "os.environ['PLANTED'] = 'env'\n",
        "open('/tmp/planted', 'w').write('tmp')\n",
        "open('/dev/shm/planted', 'w').write('shm')\n",
        "sys.modules['planted_module'] = type(sys)('planted_module')\n",
        "print(json.dumps({'random': random.random(), 'pid': os.getpid()}))\n",
    );
    let look = concat!(
        "import json, os, sys, builtins, random\n",
        "print(json.dumps({\n",
        "  'module': getattr(json, 'PLANTED', None), 'builtins': getattr(builtins, 'PLANTED', None),\n",
        "  'env': os.environ.get('PLANTED'), 'tmp': os.path.exists('/tmp/planted'),\n",
        "  'shm': os.path.exists('/dev/shm/planted'), 'planted_module': 'planted_module' in sys.modules,\n",
        "  'random': random.random(), 'pid': os.getpid()}))\n",
    );
    let first = printed(&step(&mut pool, "plant", plant));
    let mut randoms = BTreeSet::new();
    randoms.insert(first["random"].to_string());
    for i in 0..3 {
        let seen = printed(&step(&mut pool, &format!("look{i}"), look));
        for key in ["module", "builtins", "env"] {
            assert!(seen[key].is_null(), "step {i} saw the first step's {key}: {seen}");
        }
        for key in ["tmp", "shm", "planted_module"] {
            assert_eq!(seen[key], false, "step {i} saw the first step's {key}: {seen}");
        }
        // Each fork reseeds (CPython's at-fork hooks): no two steps draw
        // the same numbers from their template's state.
        assert!(randoms.insert(seen["random"].to_string()), "step {i} drew a number another step drew: {seen}");
    }
    assert!(pool.finish().success());
}

#[test]
fn a_fork_sees_nothing_of_its_template_or_the_host() {
    let sb = Sandbox::new();
    let secret = sb.dir.path().join("secret.txt");
    std::fs::write(&secret, b"host secret").unwrap();
    let mut pool = forked_pool(&sb, 1);
    let code = format!(
        concat!(
            "import json, os\n",
            "procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n",
            "mounts = open('/proc/self/mountinfo').read()\n",
            "def can(f):\n",
            "    try:\n",
            "        f(); return True\n",
            "    except OSError:\n",
            "        return False\n",
            "print(json.dumps({{\n",
            "  'procs': procs, 'ppid': os.getppid(),\n",
            "  'host_root': os.path.exists('/.jail-host'),\n",
            "  'template_code': os.path.exists('/workspace/code/template.py'),\n",
            "  'secret': can(lambda: open({secret:?}).read()),\n",
            "  'mounts_name_jail_host': 'jail-host' in mounts,\n",
            "  'status': [l for l in open('/proc/self/status').read().splitlines()\n",
            "             if l.split(':')[0] in ('Uid', 'CapEff', 'NoNewPrivs', 'Seccomp')],\n",
            "  'uid_map': open('/proc/self/uid_map').read().split(),\n",
            "  'cgroup': open('/proc/self/cgroup').read().strip(),\n",
            "}}))\n",
        ),
        secret = secret.display().to_string(),
    );
    let r = step(&mut pool, "look", &code);
    let seen = printed(&r);
    // Its own pid namespace: PID 1 (its reaper) and itself, nothing else:
    // not the template, not a sibling, not the host.
    assert_eq!(seen["procs"], json!([1, 2]), "{seen}");
    assert_eq!(seen["ppid"], 1, "{seen}");
    assert_eq!(seen["host_root"], false, "the template's view of the host is reachable: {seen}");
    assert_eq!(seen["template_code"], false, "the template's code is visible: {seen}");
    assert_eq!(seen["secret"], false, "a host file outside the grants was read: {seen}");
    assert_eq!(seen["mounts_name_jail_host"], false, "mountinfo names the template's view of the host: {seen}");
    // Host paths in mountinfo and the rest of /proc: host_facts.rs scans
    // for them in a forked step too (not in the VM matrix's guests, whose
    // 9p payload shows them: tests/vm/tests.txt).
    let status: Vec<String> = seen["status"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert!(status.contains(&"Uid: 1000 1000 1000 1000".to_string()), "{status:?}");
    assert!(status.contains(&"CapEff: 0000000000000000".to_string()), "{status:?}");
    assert!(status.contains(&"NoNewPrivs: 1".to_string()), "{status:?}");
    assert!(status.contains(&"Seccomp: 2".to_string()), "{status:?}");
    // Its own cgroup namespace, rooted at its own cgroup.
    assert!(seen["cgroup"].as_str().unwrap().lines().all(|l| l.ends_with(":/")), "{seen}");
    // Never host root, on the host.
    assert_ne!(r["isolation"]["host_uid"], 0, "{r}");
    // Its uid map: its sandbox uid to one uid of its parent's namespace.
    // As root that one is the host uid leased for it alone, the same
    // number in its template's namespace (template/uids.rs); as an
    // ordinary user, the caller's uid.
    let host_uid = r["isolation"]["host_uid"].as_u64().unwrap().to_string();
    let expected = if is_root() { host_uid.clone() } else { "1000".to_string() };
    assert_eq!(seen["uid_map"], json!(["1000", expected, "1"]), "{seen}");
    assert!(!shares_its_templates_uid(&r), "{r}");
    assert!(pool.finish().success());
}

/// Every process descending from `root` now (its children's children
/// included), `root` left out.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) {
            parent.insert(pid, ppid);
        }
    }
    let mut found = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for (child, _) in parent.iter().filter(|(_, pp)| **pp == p) {
            found.push(*child);
            todo.push(*child);
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

fn wait_gone(pids: &[u32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "{what}: processes left {left:?}");
}

#[test]
fn killing_the_template_ends_its_forks_a_new_one_follows_and_killing_the_pool_leaves_nothing() {
    let sb = Sandbox::new();
    // Three, so that several makers find the template gone at once.
    let mut pool = forked_pool(&sb, 3);
    // A fork handed out as a session, a cell of it running.
    let session = pool.session(json!({"id": "s", "op": "session"}));
    let (v, _) = session.exec("x = 1\n");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["isolation"]["forked_from_template"], true, "{v}");
    let pool_pid = pool.child.id();
    let everything = descendants(pool_pid);
    let template = everything
        .iter()
        .copied()
        .find(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("\0template\0")))
        .expect("the pool's `jail template`");
    // A fork's PID 1 is its template's child, not its supervisor's: when
    // its supervisor is killed, the fork must see it (the status pipe)
    // and end, as a cloned jail ends by its parent-death signal.
    let other = pool.session(json!({"id": "s2", "op": "session"}));
    let (v, _) = other.exec("y = 2\n");
    assert_eq!(v["status"], "ok", "{v}");
    // Both handed out; the pool's replacements made before counting.
    pool.wait_ready(3);
    let living = || descendants(template).into_iter().filter(|p| alive(*p)).count();
    let before = living();
    // A cell that reads nothing while it runs: only its PID 1 can end it.
    let handle = other.handle.clone();
    let busy = std::thread::spawn(move || {
        let cell = jail::client::session::Cell::new("import time\ntime.sleep(300)\n", None);
        let _ = jail::client::session::exec(&handle, cell);
    });
    std::thread::sleep(Duration::from_millis(500));
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(other.pid as i32), nix::sys::signal::Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(15);
    // Its PID 1 and its worker.
    while living() + 2 > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(living() + 2 <= before, "the fork of a killed supervisor lives on: {before} processes, then {}", living());
    let _ = busy.join();
    let forks_and_template = descendants(template);
    assert!(forks_and_template.len() >= 3, "the template's jail and its forks: {forks_and_template:?}");
    // SIGKILL the template's supervisor: its jail dies with it, and every
    // fork of it with the jail.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(template as i32), nix::sys::signal::Signal::SIGKILL);
    wait_gone(&forks_and_template, "the template was killed");
    // The session's jail is gone: its next cell says so, and nothing hangs.
    let (v, _) = session.exec("x\n");
    assert_ne!(v["status"], "ok", "a cell ran in a fork whose template was killed: {v}");
    // The pool goes on: a new template takes the killed one's place at
    // once, not at its renewal. A jail made before (forked from the killed
    // one) may still be handed out and fail; a few tries at most.
    let mut tries = Vec::new();
    loop {
        let r = pool.call(json!({"id": format!("after{}", tries.len()), "code": "print(1)"}));
        let forked = r["result"]["status"] == "ok" && r["result"]["isolation"]["forked_from_template"] == true;
        tries.push(r);
        if forked {
            break;
        }
        assert!(tries.len() < 6, "no fork of a new template after the old one was killed: {tries:?}");
    }
    let templates: Vec<u32> = descendants(pool_pid)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("\0template\0"))
        })
        .collect();
    assert!(
        !templates.is_empty() && !templates.contains(&template),
        "a new template: {templates:?}, the killed one {template}"
    );
    // SIGKILL the pool: nothing of it stays.
    let all = descendants(pool_pid);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pool_pid as i32), nix::sys::signal::Signal::SIGKILL);
    let _ = pool.child.wait();
    wait_gone(&all, "the pool was killed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while (!host_processes_with(&sb.dir.path().display().to_string()).is_empty()
        || !host_mounts_with(&sb.dir.path().display().to_string()).is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(host_processes_with(&sb.dir.path().display().to_string()), Vec::<u32>::new());
    assert_eq!(host_mounts_with(&sb.dir.path().display().to_string()), Vec::<String>::new());
    // The pool's own folder goes (its janitor); the output folders it
    // made for its steps and sessions are the caller's.
    let pool_folders = || -> Vec<String> {
        std::fs::read_dir(sb.pool_tmp())
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with("jail-pool-"))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pool_folders().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(pool_folders(), Vec::<String>::new(), "the pool's folder is left");
}

#[test]
fn a_policy_without_a_preload_makes_its_jails_as_before() {
    let sb = Sandbox::new();
    let mut pool = Pool::start(&sb, 1, &[]);
    let r = pool.call(json!({"id": "p", "code": "print(1)"}));
    assert_eq!(r["result"]["isolation"]["forked_from_template"], false, "{r}");
    assert!(pool.finish().success());
}

#[test]
fn a_new_template_and_so_a_new_address_space_layout_comes_after_the_forks_asked() {
    let sb = Sandbox::new();
    let mut args = sb.with_preload();
    args.extend(["--template-forks".to_string(), "2".to_string()]);
    let extra: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut pool = Pool::start(&sb, 1, &extra);
    // Where the template's heap put a module object: the same in every
    // fork of one template, another in the next template's.
    let mut layouts = Vec::new();
    for i in 0..6 {
        let r = step(&mut pool, &format!("l{i}"), "import json, sys\nprint(json.dumps(hex(id(sys.modules['json']))))\n");
        layouts.push(printed(&r).as_str().unwrap().to_string());
    }
    let distinct: BTreeSet<&String> = layouts.iter().collect();
    assert!(distinct.len() >= 2, "every fork had one layout: {layouts:?}");
    // No layout serves more than the two forks a template is allowed.
    for l in &distinct {
        assert!(layouts.iter().filter(|x| x == l).count() <= 2, "{layouts:?}");
    }
    assert!(pool.finish().success());
}

/// The template is killed and its successor cannot be made (its socket's
/// name is taken): the pool gives up on templates, and its jails import
/// the preload themselves from then on, rather than fail or wait.
#[test]
fn a_template_that_ends_and_cannot_be_remade_leaves_jails_that_import_the_preload_themselves() {
    let sb = Sandbox::new();
    let mut pool = forked_pool(&sb, 1);
    step(&mut pool, "first", "print(1)\n");
    let pool_pid = pool.child.id();
    let is_template =
        |p: &u32| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("\0template\0"));
    let template = descendants(pool_pid).into_iter().find(is_template).expect("the pool's `jail template`");
    let work: Vec<_> = std::fs::read_dir(sb.pool_tmp())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("jail-pool-")))
        .collect();
    assert_eq!(work.len(), 1, "the pool's folder: {work:?}");
    // The next template's socket (template-N.sock, counted from 0): a
    // folder there, so it cannot listen.
    std::fs::create_dir(work[0].join("template-1.sock")).unwrap();
    let forks = descendants(template);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(template as i32), nix::sys::signal::Signal::SIGKILL);
    wait_gone(&forks, "the template was killed");
    // A jail forked before the kill may be handed out and fail; then each
    // one imports the preload itself.
    let mut tries = Vec::new();
    loop {
        let r = pool.call(json!({"id": format!("after{}", tries.len()), "code": "import sys\nprint('json' in sys.modules)"}));
        let own = r["result"]["status"] == "ok" && r["result"]["isolation"]["forked_from_template"] == false;
        if own {
            assert_eq!(r["result"]["stdout"]["text"], "True\n", "the preload was not imported: {r}");
            break;
        }
        tries.push(r);
        assert!(tries.len() < 4, "no jail of its own after the template could not be remade: {tries:?}");
    }
    for i in 0..3 {
        let r = pool.call(json!({"id": format!("then{i}"), "code": "print(2)"}));
        assert_eq!(
            (&r["result"]["status"], &r["result"]["isolation"]["forked_from_template"]),
            (&json!("ok"), &json!(false)),
            "{r}"
        );
    }
    assert!(!descendants(pool_pid).iter().any(is_template), "a template was made after all");
    assert!(pool.finish().success());
}

/// Whether a fork's result says it shares its template's host uid.
fn shares_its_templates_uid(result: &Value) -> bool {
    let degraded = result["isolation"]["degraded"].as_array().unwrap();
    degraded.iter().any(|d| d.as_str().unwrap().contains("fork of a template"))
}

/// The host uid of each process in `pids` (its `Uid:` line's real uid).
fn host_uids(pids: &[u32]) -> BTreeSet<u32> {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .collect()
}

/// Every fork of a root-started template runs as a host uid leased for it
/// alone, as a cloned jail does, not as its template's: per-uid kernel
/// accounting is then each tenant's own. Seen from the host, in /proc. An
/// ordinary user's forks, like all its jails, run as that user.
#[test]
fn each_fork_runs_as_a_host_uid_of_its_own() {
    let sb = Sandbox::new();
    let mut pool = forked_pool(&sb, 2);
    let sessions: Vec<_> = (0..2).map(|i| pool.session(json!({"id": format!("s{i}"), "op": "session"}))).collect();
    let mut reported = BTreeSet::new();
    for s in &sessions {
        let (v, _) = s.exec("x = 1\n");
        assert_eq!((&v["status"], &v["isolation"]["forked_from_template"]), (&json!("ok"), &json!(true)), "{v}");
        assert!(!shares_its_templates_uid(&v), "{v}");
        reported.insert(v["isolation"]["host_uid"].as_u64().unwrap() as u32);
    }
    pool.wait_ready(2);
    let template = descendants(pool.child.id())
        .into_iter()
        .find(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("\0template\0")))
        .expect("the pool's `jail template`");
    // The template's jail and its forks: two handed out, two ready.
    let seen: BTreeSet<u32> = host_uids(&descendants(template)).into_iter().filter(|u| *u != 0).collect();
    if is_root() {
        assert_eq!(reported.len(), 2, "two sessions, one host uid: {reported:?}");
        assert!(reported.is_subset(&seen), "the uids the results report {reported:?} are not the ones running: {seen:?}");
        // The template's own, and one for each of the four forks.
        assert!(seen.len() >= 5, "forks share host uids: {seen:?}");
    } else {
        let me = nix::unistd::getuid().as_raw();
        assert_eq!((reported, seen), ([me].into(), [me].into()));
    }
    drop(sessions);
    assert!(pool.finish().success());
}
