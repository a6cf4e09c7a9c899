//! Fuzz target: the one path acceptor every door uses (jail/src/accept.rs).
//! The input builds a small tree in a temp folder (folders, files of any
//! mode, symlinks with any target text, hard links, fifos) and a path over
//! it (names, `.`, `..`, a trailing slash, `/proc/self/cwd` or
//! `/proc/self/root` in front). The path is taken as a folder, a file and
//! a place; an oracle walks the same words with lstat, component by
//! component, and the acceptor must agree with it: accepted only when no
//! component is a link, refused as a link exactly when the first problem
//! on the way is one. Then the tree is copied: the copy holds only
//! folders, links (their text unchanged) and single-named regular files
//! with the source's bytes, no mode wider than the source's, nothing from
//! outside the tree, and every other entry is listed as refused.
#![no_main]

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use arbitrary::Arbitrary;
use jail::accept::{self, Bounds, Problem, Reach};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Debug, Arbitrary)]
enum Target {
    /// The tree's root, absolute.
    Root,
    /// A path outside the tree.
    Etc,
    /// Relative text (`../a`, `b/./c`, ...), from a few characters.
    Text(Vec<u8>),
    /// The absolute path of an earlier node.
    Node(u8),
}

#[derive(Debug, Arbitrary)]
enum Op {
    Dir { parent: u8, name: u8, mode: u16 },
    File { parent: u8, name: u8, mode: u16, len: u8 },
    Link { parent: u8, name: u8, target: Target },
    Hard { parent: u8, name: u8, of: u8 },
    Fifo { parent: u8, name: u8 },
}

#[derive(Debug, Arbitrary)]
enum Comp {
    Name(u8),
    Dot,
    DotDot,
}

#[derive(Debug, Arbitrary)]
enum Start {
    Root,
    ProcCwd,
    ProcRoot,
}

#[derive(Debug, Arbitrary)]
struct Input {
    ops: Vec<Op>,
    start: Start,
    path: Vec<Comp>,
    trailing_slash: bool,
}

/// What the oracle finds first on the way.
#[derive(Debug, PartialEq)]
enum Found {
    Dir,
    File,
    Other,
    Link,
    Missing,
    NotADir,
}

/// Walk `path` (absolute) with lstat, following nothing.
fn oracle(path: &Path, trailing_slash: bool) -> Found {
    let mut cur = PathBuf::from("/");
    let comps: Vec<Component> = path.components().collect();
    let mut found = Found::Dir;
    for (i, c) in comps.iter().enumerate() {
        if found != Found::Dir {
            // A file, a fifo on the way: not a folder.
            return Found::NotADir;
        }
        match c {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => {
                cur.pop();
                continue;
            }
            Component::Normal(n) => cur.push(n),
            Component::Prefix(_) => unreachable!(),
        }
        let Ok(m) = std::fs::symlink_metadata(&cur) else { return Found::Missing };
        let ft = m.file_type();
        found = if ft.is_symlink() {
            return Found::Link;
        } else if ft.is_dir() {
            Found::Dir
        } else if ft.is_file() {
            Found::File
        } else {
            Found::Other
        };
        let _ = i;
    }
    if trailing_slash && found != Found::Dir {
        return Found::NotADir;
    }
    found
}

static N: AtomicU64 = AtomicU64::new(0);

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        // Folders the input made unreadable or unwritable are opened up
        // first, so the whole tree goes.
        fn open_up(p: &Path) {
            if let Ok(m) = std::fs::symlink_metadata(p) {
                if m.is_dir() {
                    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
                    if let Ok(d) = std::fs::read_dir(p) {
                        for e in d.flatten() {
                            open_up(&e.path());
                        }
                    }
                }
            }
        }
        open_up(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> Scratch {
    let n = N.fetch_add(1, Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("jail-fuzz-accept-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir(&p).expect("make the scratch folder");
    Scratch(p)
}

fn build(root: &Path, ops: &[Op]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut dirs = vec![root.to_path_buf()];
    let mut nodes = vec![root.to_path_buf()];
    let mut files: Vec<PathBuf> = Vec::new();
    let mut later_modes = Vec::new();
    for op in ops.iter().take(24) {
        let at = |parent: &u8, name: &u8| dirs[*parent as usize % dirs.len()].join(NAMES[*name as usize % NAMES.len()]);
        match op {
            Op::Dir { parent, name, mode } => {
                let p = at(parent, name);
                if std::fs::create_dir(&p).is_ok() {
                    later_modes.push((p.clone(), u32::from(*mode) & 0o777));
                    dirs.push(p.clone());
                    nodes.push(p);
                }
            }
            Op::File { parent, name, mode, len } => {
                let p = at(parent, name);
                // Never through an existing entry (a fifo would block).
                let made = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&p)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, &vec![b'x'; *len as usize]));
                if made.is_ok() {
                    let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(u32::from(*mode) & 0o7777));
                    files.push(p.clone());
                    nodes.push(p);
                }
            }
            Op::Link { parent, name, target } => {
                let p = at(parent, name);
                let t: PathBuf = match target {
                    Target::Root => root.to_path_buf(),
                    Target::Etc => PathBuf::from("/etc"),
                    Target::Text(b) => {
                        let s: String = b.iter().take(16).map(|c| ['.', '/', 'a', 'b', 'c'][*c as usize % 5]).collect();
                        PathBuf::from(if s.is_empty() { ".".into() } else { s })
                    }
                    Target::Node(i) => nodes[*i as usize % nodes.len()].clone(),
                };
                if std::os::unix::fs::symlink(&t, &p).is_ok() {
                    nodes.push(p);
                }
            }
            Op::Hard { parent, name, of } => {
                if !files.is_empty() {
                    let p = at(parent, name);
                    if std::fs::hard_link(&files[*of as usize % files.len()], &p).is_ok() {
                        nodes.push(p);
                    }
                }
            }
            Op::Fifo { parent, name } => {
                let p = at(parent, name);
                if nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).is_ok() {
                    nodes.push(p);
                }
            }
        }
    }
    // Folder modes last, so what is inside could be made.
    for (p, mode) in later_modes.iter().rev() {
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(*mode | 0o700));
    }
    (dirs, files)
}

fn check_copy(from: &Path, to: &Path, rel: &Path) {
    for e in std::fs::read_dir(to.join(rel)).expect("list the copy").flatten() {
        let r = rel.join(e.file_name());
        let (src, dst) = (from.join(&r), to.join(&r));
        let dm = std::fs::symlink_metadata(&dst).expect("stat the copy");
        // Every folder on the way in the source is a real folder (the copy
        // made its twin only from one), so `src` names the source entry.
        let sm = std::fs::symlink_metadata(&src).unwrap_or_else(|e| panic!("{} copied from nothing: {e}", r.display()));
        let wider = dm.permissions().mode() & 0o7777 & !(sm.permissions().mode() & 0o7777);
        if dm.file_type().is_symlink() {
            assert!(sm.file_type().is_symlink(), "{}", r.display());
            assert_eq!(std::fs::read_link(&dst).unwrap(), std::fs::read_link(&src).unwrap(), "{}", r.display());
        } else if dm.is_dir() {
            assert!(sm.is_dir(), "{}", r.display());
            assert_eq!(wider, 0, "{}: a wider mode", r.display());
            check_copy(from, to, &r);
        } else {
            assert!(dm.is_file() && sm.is_file(), "{}: not a regular file", r.display());
            assert_eq!(dm.nlink(), 1, "{}", r.display());
            assert_eq!(sm.nlink(), 1, "{}: a hard link was copied", r.display());
            assert_eq!(wider, 0, "{}: a wider mode", r.display());
            assert_eq!(dm.permissions().mode() & 0o6000, 0, "{}: a set-id bit", r.display());
            assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap(), "{}", r.display());
        }
    }
}

fuzz_target!(|input: Input| {
    let tree = scratch();
    let root = tree.0.join("t");
    std::fs::create_dir(&root).unwrap();
    build(&root, &input.ops);

    let mut path = match input.start {
        Start::Root => root.clone(),
        Start::ProcCwd => PathBuf::from("/proc/self/cwd"),
        Start::ProcRoot => PathBuf::from("/proc/self/root").join(root.strip_prefix("/").unwrap()),
    };
    for c in input.path.iter().take(12) {
        match c {
            Comp::Name(n) => path.push(NAMES[*n as usize % NAMES.len()]),
            Comp::Dot => path.push("."),
            Comp::DotDot => path.push(".."),
        }
    }
    let mut text = path.into_os_string();
    if input.trailing_slash {
        text.push("/");
    }
    let path = PathBuf::from(text);
    let want = oracle(&path, input.trailing_slash);

    // As a folder.
    match accept::open_own_dir(&path) {
        Ok(_) => assert_eq!(want, Found::Dir, "{} accepted as a folder", path.display()),
        Err(e) => match e.problem {
            Problem::Link => assert_eq!(want, Found::Link, "{}: {e}", path.display()),
            Problem::Missing => assert_eq!(want, Found::Missing, "{}: {e}", path.display()),
            Problem::NotAFolder => {
                assert!(matches!(want, Found::NotADir | Found::File | Found::Other), "{}: {e} ({want:?})", path.display())
            }
            // Unreadable on the way (a folder of mode 0): not a link.
            _ => assert!(!matches!(want, Found::Link), "{}: {e} ({want:?})", path.display()),
        },
    }
    // As a file.
    match accept::open_file(&path, Reach::here()) {
        Ok(_) => assert_eq!(want, Found::File, "{} accepted as a file", path.display()),
        Err(e) if matches!(e.problem, Problem::Link) => assert_eq!(want, Found::Link, "{}: {e}", path.display()),
        Err(e) => assert_ne!(want, Found::Link, "{}: {e}", path.display()),
    }
    // As a place: its parent accepted, its name never a link followed.
    if let Ok(place) = accept::Place::name(&path) {
        let parent = place.path.parent().unwrap_or(Path::new("/"));
        assert_eq!(oracle(parent, false), Found::Dir, "{}: its parent accepted", path.display());
        if place.found().unwrap_or(accept::Found::Other) != accept::Found::Other {
            let name = place.path.file_name().unwrap_or(OsStr::new(""));
            assert!(!std::fs::symlink_metadata(parent.join(name)).map(|m| m.file_type().is_symlink()).unwrap_or(false));
        }
    }

    // The copy.
    let dest = tree.0.join("copy");
    std::fs::create_dir(&dest).unwrap();
    let (Ok(from), Ok(to)) = (accept::open_own_dir(&root), accept::open_own_dir(&dest)) else { return };
    if let Ok(copied) = accept::copy_tree(&from, &to, Reach::here(), Bounds { bytes: 1 << 20, entries: 1000 }) {
        check_copy(&root, &dest, Path::new(""));
        for r in &copied.refused {
            assert!(!dest.join(&r.path).exists(), "{} refused and copied", r.path.display());
        }
    }
});
