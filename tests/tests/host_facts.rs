//! No host facts inside, and only what is granted (issue 15, findings 5, 6
//! and 8): nothing a script can read under /proc names a host path of the
//! run, the caller's user name or the `jail` binary's location; the code
//! dir holds only the script unless `--code DIR` grants a folder; a root
//! caller's folders under a 0700 parent work.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use jail_tests::*;

/// Reads everything it can under /proc/1, /proc/self, /proc/thread-self and
/// /proc's own files, plus every link it may read, and reports which of the
/// needles (given hex-encoded, so the script's own argv does not hold them)
/// each one contains.
const SCAN: &str = r#"
import json, os, sys
needles = [bytes.fromhex(h) for h in sys.argv[1:]]
SKIP = {"mem", "pagemap", "clear_refs", "kmsg", "kcore", "sysrq-trigger", "kpagecount", "kpageflags",
        "kpagecgroup", "task", "map_files", "fd", "fdinfo", "ns", "net", "attr", "sys"}
hits, read, refused = {}, 0, 0
def check(path, data):
    for i, n in enumerate(needles):
        if n in data:
            hits.setdefault(path, []).append(i)
def scan(path, depth):
    global read, refused
    try:
        if os.path.islink(path):
            check(path, os.readlink(path).encode())
            read += 1
        elif os.path.isdir(path):
            if depth < 2:
                for name in os.listdir(path):
                    if name not in SKIP and not name.isdigit():
                        scan(os.path.join(path, name), depth + 1)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                check(path, os.read(fd, 1 << 20))
                read += 1
            finally:
                os.close(fd)
    except OSError:
        refused += 1
for top in ("/proc/1", "/proc/self", "/proc/thread-self"):
    check(top, os.readlink(top).encode()) if os.path.islink(top) else None
    top = os.path.realpath(top)
    scan(top, 0)
    for sub in ("fd", "task"):
        try:
            for name in os.listdir(f"{top}/{sub}"):
                scan(f"{top}/{sub}/{name}", 1)
        except OSError:
            refused += 1
for name in os.listdir("/proc"):
    p = "/proc/" + name
    if name not in SKIP and not name.isdigit() and not os.path.isdir(p):
        scan(p, 1)
print(json.dumps({"hits": hits, "read": read, "refused": refused}))
"#;

/// The host facts of one run, each with a name for the failure message.
fn needles(sb: &Sandbox, code: &Path) -> Vec<(String, String)> {
    let mut n = vec![
        ("input dir".to_string(), sb.input.display().to_string()),
        ("output dir".to_string(), sb.output.display().to_string()),
        ("code dir".to_string(), code.display().to_string()),
        ("the runs' temp dir".to_string(), sb.dir.path().display().to_string()),
        ("jail binary".to_string(), jail_bin().display().to_string()),
        ("jail binary, resolved".to_string(), std::fs::canonicalize(jail_bin()).unwrap().display().to_string()),
        // What else lies beside it (libjail.so, which a pool's template loads).
        (
            "jail binary's folder".to_string(),
            format!("{}/", std::fs::canonicalize(jail_bin()).unwrap().parent().unwrap().display()),
        ),
        ("rootfs".to_string(), sb.rootfs.display().to_string()),
        ("rootfs, resolved".to_string(), std::fs::canonicalize(&sb.rootfs).unwrap().display().to_string()),
    ];
    // "root" is a word /proc uses for other things (root=/dev/vda in the
    // kernel's command line); an ordinary user's name is not.
    // A spare uid with no account (make test's ordinary-user half on a
    // machine without a test account) has no name to leak.
    if !is_root() {
        if let Ok(Some(me)) = nix::unistd::User::from_uid(nix::unistd::getuid()) {
            n.push(("caller's user name".to_string(), me.name));
        }
    }
    n
}

fn scan_for_host_facts(sb: &Sandbox, code_dir: Option<&Path>) {
    let script = sb.script(SCAN);
    let code = code_dir.map(Path::to_path_buf).unwrap_or_else(|| sb.code.clone());
    let needles = needles(sb, &code);
    let args: Vec<String> = needles.iter().map(|(_, n)| n.bytes().map(|b| format!("{b:02x}")).collect()).collect();
    let (r, stderr) = if sb.runner == Runner::ForkedStep {
        // A pool's fork of its template (issue 36): the same scan as its
        // step, the needles as its argv.
        let extra = sb.with_preload();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let mut pool = Pool::start(sb, 1, &extra);
        let reply = pool.call(serde_json::json!({
            "id": "scan", "code": SCAN, "args": args, "input": sb.input, "output": sb.output,
        }));
        assert!(pool.finish().success());
        assert_eq!(reply["result"]["isolation"]["forked_from_template"], true, "{reply}");
        (serde_json::from_value::<RunResult>(reply["result"].clone()).unwrap(), String::new())
    } else {
        let mut cmd = Command::new(jail_bin());
        cmd.args(["run", "--json", "--rootfs"]).arg(&sb.rootfs);
        cmd.arg("--input").arg(&sb.input).arg("--output").arg(&sb.output);
        // The scan reads every file it can; in a TCG guest (the VM matrix) that
        // took past the default 15 s wall limit as the ordinary user.
        cmd.args(["--timeout", "120"]);
        if let Some(dir) = code_dir {
            cmd.arg("--code").arg(dir);
        }
        cmd.arg(&script).args(&args);
        let out = cmd.output().unwrap();
        (parse(&out), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(r.status, Status::Ok, "{}\n{stderr}", r.stderr.text);
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    // The scan must have read what it looks at, or it proves nothing.
    assert!(v["read"].as_u64().unwrap() > 50, "the scan read almost nothing: {v}");
    let hits = v["hits"].as_object().unwrap();
    let named: Vec<String> = hits
        .iter()
        .map(|(path, idx)| {
            let which: Vec<&str> =
                idx.as_array().unwrap().iter().map(|i| needles[i.as_u64().unwrap() as usize].0.as_str()).collect();
            format!("{path}: {}", which.join(", "))
        })
        .collect();
    // Before Linux 5.11 overlayfs cannot be mounted in a user namespace, so
    // the read-only folders fall back to binds whose mountinfo lines show
    // their host paths: allowed only where the result says so. Nothing else
    // may name a host fact, on any kernel.
    let said = r.isolation.degraded.iter().any(|d| d.contains("mountinfo"));
    let (in_mountinfo, elsewhere): (Vec<&String>, Vec<&String>) =
        named.iter().partition(|l| l.split(':').next().is_some_and(|p| p.ends_with("/mountinfo")));
    assert!(elsewhere.is_empty(), "host facts readable inside the jail:\n{}", named.join("\n"));
    if userns_overlayfs() {
        assert!(in_mountinfo.is_empty(), "host facts readable inside the jail:\n{}", named.join("\n"));
        assert!(!said, "{:?}", r.isolation.degraded);
    } else {
        assert!(
            in_mountinfo.is_empty() || said,
            "mountinfo names host paths and the result does not say so: {:?}",
            r.isolation.degraded
        );
    }
    // Nor in what the jail itself says to the script (none of its own
    // messages reach the script's streams).
    for (what, n) in &needles {
        assert!(!r.stderr.text.contains(n.as_str()), "the script's stderr names the {what}: {}", r.stderr.text);
    }
}

/// Whether this kernel mounts overlayfs in a user namespace (Linux 5.11).
fn userns_overlayfs() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (5, 11)
}

#[test]
fn nothing_under_proc_names_a_host_path_the_caller_or_the_jail_binary() {
    let sb = Sandbox::new();
    sb.input_file("data.csv", b"a,b\n1,2\n");
    scan_for_host_facts(&sb, None);
}

#[test]
fn a_jail_forked_from_a_pools_template_shows_no_host_path_either() {
    let sb = Sandbox::with_runner(Runner::ForkedStep);
    sb.input_file("data.csv", b"a,b\n1,2\n");
    scan_for_host_facts(&sb, None);
}

#[test]
fn a_granted_code_dir_shows_no_host_path_either() {
    let sb = Sandbox::new();
    scan_for_host_facts(&sb, Some(&sb.code.clone()));
}

#[test]
fn pid1_shows_neither_the_supervisors_command_line_nor_its_name() {
    let sb = Sandbox::new();
    let v = sb.probe(
        r#"
import json
cmdline = open("/proc/1/cmdline", "rb").read()
name = [l for l in open("/proc/1/status") if l.startswith("Name:")][0].split()[1]
print(json.dumps({"argv": [a.decode("latin-1") for a in cmdline.split(b"\0") if a], "name": name}))
"#,
    );
    assert_eq!(v["argv"], serde_json::json!(["jail-init"]), "{v}");
    assert_eq!(v["name"], "jail-init", "{v}");
}

#[test]
fn a_secret_beside_the_script_cannot_be_read() {
    // `jail run ~/analysis.py` must not hand over ~/.ssh and ~/.env.
    let sb = Sandbox::new();
    for (name, text) in [
        (".env", "OPENAI_API_KEY=sk-canary-beside"),
        ("id_ed25519", "canary-key-beside"),
    ] {
        let p = sb.code.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let v = sb.probe(
        r#"
import json, os
got = {"listing": sorted(os.listdir("/workspace/code"))}
for name in (".env", "id_ed25519"):
    try:
        got[name] = open("/workspace/code/" + name).read()
    except OSError as e:
        got[name] = "refused: " + type(e).__name__
got["self"] = open(__file__).read()[:20]
print(json.dumps(got))
"#,
    );
    assert_eq!(v["listing"], serde_json::json!(["main.py"]), "{v}");
    assert!(v[".env"].as_str().unwrap().starts_with("refused"), "{v}");
    assert!(v["id_ed25519"].as_str().unwrap().starts_with("refused"), "{v}");
    assert!(v["self"].as_str().unwrap().contains("import json"), "{v}");
}

#[test]
fn the_script_alone_is_read_only() {
    let sb = Sandbox::new();
    let v = sb.probe(
        r#"
import json
out = {}
for what, f in (("append", lambda: open(__file__, "a").write("x")),
                ("create", lambda: open("/workspace/code/new.py", "w").write("x"))):
    try:
        f(); out[what] = "allowed"
    except OSError as e:
        out[what] = "refused"
print(json.dumps(out))
"#,
    );
    assert_eq!(v, serde_json::json!({"append": "refused", "create": "refused"}));
}

#[test]
fn a_code_dir_granted_with_code_is_readable() {
    let mut sb = Sandbox::new();
    let helper = sb.code.join("helper.py");
    std::fs::write(&helper, "VALUE = 'from-helper'\n").unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir(sb.code.join("data")).unwrap();
    std::fs::set_permissions(sb.code.join("data"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(sb.code.join("data/x.txt"), "nested").unwrap();
    std::fs::set_permissions(sb.code.join("data/x.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    sb.extra_args = vec!["--code".into(), sb.code.display().to_string()];
    let v = sb.probe(
        r#"
import json, os, sys
sys.path.insert(0, "/workspace/code")
import helper
print(json.dumps({"helper": helper.VALUE, "nested": open("/workspace/code/data/x.txt").read(),
                  "listing": sorted(os.listdir("/workspace/code"))}))
"#,
    );
    assert_eq!(
        v,
        serde_json::json!({"helper": "from-helper", "nested": "nested", "listing": ["data", "helper.py", "main.py"]})
    );
}

/// Folders under a parent only the caller may enter: `mktemp -d` as root.
struct Private {
    parent: tempfile::TempDir,
}

impl Private {
    fn new() -> Private {
        let parent = tempfile::Builder::new().prefix("jail-private-").tempdir().unwrap();
        std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        Private { parent }
    }

    /// A folder under the 0700 parent that the sandbox may use itself.
    fn dir(&self, name: &str, mode: u32) -> PathBuf {
        let p = self.parent.path().join(name);
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }
}

#[test]
fn folders_under_a_parent_only_the_caller_can_enter_work() {
    let private = Private::new();
    let input = private.dir("in", 0o755);
    let output = private.dir("out", 0o777);
    let code = private.dir("code", 0o755);
    std::fs::write(input.join("data.txt"), "input-under-0700").unwrap();
    std::fs::set_permissions(input.join("data.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let script = code.join("main.py");
    std::fs::write(
        &script,
        "print(open('/workspace/input/data.txt').read()); open('/workspace/output/made.txt', 'w').write('made')\n",
    )
    .unwrap();
    // The jail reads the script (given alone or through the bound code
    // dir): it must be readable by the jail's uid; its parent need not be.
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    for code_arg in [None, Some(&code)] {
        let _ = std::fs::remove_file(output.join("made.txt"));
        let mut cmd = Command::new(jail_bin());
        cmd.args(["run", "--json", "--rootfs"]).arg(rootfs());
        cmd.arg("--input").arg(&input).arg("--output").arg(&output);
        if let Some(dir) = code_arg {
            cmd.arg("--code").arg(dir);
        }
        let out = cmd.arg(&script).output().unwrap();
        let r = parse(&out);
        assert_eq!(
            r.status,
            Status::Ok,
            "--code {code_arg:?}: {:?}\n{}\n{}",
            r.setup_error,
            r.stderr.text,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(r.stdout.text.trim(), "input-under-0700");
        assert_eq!(std::fs::read_to_string(output.join("made.txt")).unwrap(), "made");
    }
}

#[test]
fn a_folder_that_cannot_be_rerooted_is_reported_not_leaked_silently() {
    // The host's /sys/fs has mounts beneath it (cgroup, ...), which
    // overlayfs will not take as a layer from inside a user namespace: the
    // input is a plain bind, and the result must say that its mountinfo
    // line names where it comes from.
    let sb = Sandbox::new();
    let script = sb.script(
        r#"
import json
roots = {l.split()[4]: l.split()[3] for l in open("/proc/self/mountinfo")}
print(json.dumps({"root": roots.get("/workspace/input")}))
"#,
    );
    let out = Command::new(jail_bin())
        .args(["run", "--json", "--rootfs"])
        .arg(&sb.rootfs)
        .args(["--input", "/sys/fs", "--output"])
        .arg(&sb.output)
        .arg(&script)
        .output()
        .unwrap();
    let r = parse(&out);
    assert_eq!(r.status, Status::Ok, "{:?}\n{}", r.setup_error, String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    let shows = v["root"].as_str().is_some_and(|root| root != "/");
    let reported = r.isolation.degraded.iter().any(|d| d.contains("mountinfo") && d.contains("/workspace/input"));
    assert!(!shows || reported, "mountinfo root {v} is not reported: {:?}", r.isolation.degraded);
    if !shows {
        eprintln!("note: overlayfs re-rooted /sys/fs on this host; the fallback was not exercised");
    }
}
