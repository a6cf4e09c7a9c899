//! The link tricks every door is tried with (issue 32; tests/doors.rs for
//! the jail's own doors, tests/fronts/tests/front_doors.rs for the MCP
//! server's and the agent's).
//!
//! The host tree the tricks use: `victim/` holds `secret.txt`, readable by
//! anyone, so a door that followed a link to it WOULD hand its marker to
//! the jail (or write beside it); `victimlink -> victim`, `etcdir ->
//! /etc`; `in/` is a real input folder holding a hard link to
//! `victim/secret.txt`, a 0600 file of the caller's, and (as root) a hard
//! link to /etc/shadow. A door either refuses a trick (an error naming
//! the link) or runs, and then the jail never sees the marker, nor
//! /etc/shadow, nor (as root) the 0600 file, and nothing is made beside
//! the victim.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::{give_to_sandbox, is_root, Sandbox};

pub const MARKER: &str = "MARKER-d00r5-4cc3pt";

/// What a door did with a request.
#[derive(Debug)]
pub enum Taken {
    /// Refused, with the message the caller got.
    Refused(String),
    /// Ran: everything the caller got back (the result, the probe's output).
    Ran(String),
}

/// The probe a door runs: every file under /workspace/input, read.
pub const PROBE: &str = r#"
import json, os
seen = {}
for root, dirs, files in os.walk('/workspace/input'):
    for n in files:
        p = os.path.join(root, n)
        try:
            with open(p, 'rb') as f:
                seen[p] = f.read(300).decode('latin-1')
        except Exception as e:
            seen[p] = type(e).__name__
print(json.dumps(seen))
"#;

/// The host tree the tricks use (see the module's doc).
pub struct Tree {
    pub sb: Sandbox,
    /// The tree's folder.
    pub t: PathBuf,
    /// The first line of the host's /etc/shadow, as root.
    pub shadow: Option<String>,
    /// Every trick a door let through: all of them are listed at the end
    /// (`done`), so one run shows each door's every hole.
    failed: std::cell::RefCell<Vec<String>>,
}

impl Default for Tree {
    fn default() -> Tree {
        Tree::new()
    }
}

impl Tree {
    /// Make the tree in a fresh sandbox.
    pub fn new() -> Tree {
        let sb = Sandbox::new();
        let t = sb.dir.path().join("tricks");
        let mk = |p: &Path, mode: u32| {
            std::fs::create_dir_all(p).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        mk(&t, 0o755);
        let victim = t.join("victim");
        mk(&victim, 0o755);
        let write = |p: &Path, text: &str, mode: u32| {
            std::fs::write(p, text).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&victim.join("secret.txt"), MARKER, 0o644);
        write(&victim.join("probe.py"), &format!("print({MARKER:?})\n"), 0o644);
        // An empty output folder the sandbox could write, behind a link.
        mk(&victim.join("out"), 0o755);
        give_to_sandbox(&victim.join("out"));
        std::os::unix::fs::symlink(&victim, t.join("victimlink")).unwrap();
        std::os::unix::fs::symlink("/etc", t.join("etcdir")).unwrap();
        let input = t.join("in");
        mk(&input, 0o755);
        write(&input.join("data.csv"), "a,b\n1,2\n", 0o644);
        write(&input.join("private600.txt"), &format!("private {MARKER}"), 0o600);
        std::fs::hard_link(victim.join("secret.txt"), input.join("hard")).unwrap();
        let shadow = if is_root() {
            // The issue's reproducer: a hard link to /etc/shadow (same
            // filesystem here; else the root half has nothing to link).
            std::fs::hard_link("/etc/shadow", input.join("shadow"))
                .ok()
                .map(|()| std::fs::read_to_string("/etc/shadow").unwrap().lines().next().unwrap_or_default().to_string())
        } else {
            None
        };
        Tree { sb, t, shadow, failed: Default::default() }
    }

    /// Record a failure unless `ok`.
    pub fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let mut w = what();
            w.truncate(600);
            self.failed.borrow_mut().push(w);
        }
    }

    /// Fail the test with every failure recorded.
    pub fn done(self) {
        let failed = self.failed.take();
        assert!(failed.is_empty(), "{} tricks got through:\n- {}", failed.len(), failed.join("\n- "));
    }

    /// The folder the links point at.
    pub fn victim(&self) -> PathBuf {
        self.t.join("victim")
    }

    /// What a door let through, checked: no marker, no shadow line, and
    /// (as root) not the 0600 file.
    pub fn assert_nothing_leaked(&self, door: &str, trick: &str, taken: &Taken) {
        let Taken::Ran(text) = taken else { return };
        let private = format!("private {MARKER}");
        let leaked = text.replace(&private, "").contains(MARKER);
        self.check(!leaked, || format!("{door}, {trick}: the jail saw what a link points at: {text}"));
        if let Some(line) = &self.shadow {
            self.check(!text.contains(line.as_str()), || format!("{door}, {trick}: the jail read /etc/shadow: {text}"));
        }
        if is_root() {
            self.check(!text.contains(&private), || {
                format!("{door}, {trick}: root's 0600 file was readable in the jail: {text}")
            });
        }
    }

    /// Nothing was made beside the victim.
    pub fn assert_victim_untouched(&self, door: &str, trick: &str) {
        let mut names: Vec<String> = std::fs::read_dir(self.victim())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        self.check(names == ["out", "probe.py", "secret.txt"], || format!("{door}, {trick}: made beside the victim: {names:?}"));
        let inside = std::fs::read_dir(self.victim().join("out")).map(Iterator::count).unwrap_or(0);
        self.check(inside == 0, || format!("{door}, {trick}: written through a link"));
        // Undone, so the next trick starts from the same tree.
        for n in names.iter().filter(|n| !["out", "probe.py", "secret.txt"].contains(&n.as_str())) {
            let p = self.victim().join(n);
            let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
        }
        if let Ok(d) = std::fs::read_dir(self.victim().join("out")) {
            for e in d.flatten() {
                let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
            }
        }
    }
}

/// The tricks on a folder the caller names (input or output).
pub fn folder_tricks(t: &Path) -> Vec<(String, PathBuf)> {
    let s = |p: &Path| p.display().to_string();
    vec![
        ("a link to a folder, with a trailing slash".into(), PathBuf::from(format!("{}/", s(&t.join("victimlink"))))),
        ("a link to /etc, with a trailing slash".into(), PathBuf::from(format!("{}/", s(&t.join("etcdir"))))),
        ("a link to a folder".into(), t.join("victimlink")),
        ("a folder through a linked parent".into(), t.join("victimlink/out")),
        ("`..` after a link".into(), t.join("victimlink/../victim")),
        ("a /proc magic link".into(), PathBuf::from("/proc/self/cwd/")),
        ("a path through a /proc magic link".into(), PathBuf::from("/proc/self/cwd/out")),
    ]
}

/// The tricks on a script the caller names.
pub fn script_tricks(t: &Path) -> Vec<(String, PathBuf)> {
    let mut v = vec![
        ("a script through a linked parent".to_string(), t.join("victimlink/probe.py")),
        ("a script through a /proc magic link".into(), PathBuf::from("/proc/self/cwd/probe.py")),
    ];
    if is_root() {
        v.push(("/etc/shadow as the script".into(), PathBuf::from("/etc/shadow")));
    }
    v
}

/// What a process printed, stdout then stderr.
pub fn text_of(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The door refused the trick, naming the link.
pub fn assert_refused_link(tree: &Tree, door: &str, trick: &str, taken: &Taken) {
    match taken {
        Taken::Refused(why) => {
            tree.check(why.contains("link"), || format!("{door}, {trick}: refused, but not for the link: {why}"))
        }
        Taken::Ran(text) => tree.check(false, || format!("{door}, {trick}: accepted: {text}")),
    }
}

/// The door refused the trick.
pub fn assert_refused(tree: &Tree, door: &str, trick: &str, taken: &Taken) {
    tree.check(matches!(taken, Taken::Refused(_)), || format!("{door}, {trick}: accepted: {taken:?}"));
}
