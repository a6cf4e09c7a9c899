//! Fuzz target: a session's files API (jail/src/session/files.rs) as a
//! caller drives it, over a tree the code left. The input builds a small
//! tree in a scratch `out` folder standing for the jail's output tmpfs
//! (folders, files, symlinks to a `bait` folder beside it or to places in
//! the tree, hard links, fifos), then sends put/get/list requests with
//! paths made of names (`a` and `b.txt` start as links to the bait), `.`,
//! `..`, empty components and the
//! `/workspace/output` prefix. An lstat oracle walks the same words:
//! - nothing outside `out` is ever read back or changed (the bait file's
//!   bytes never come back; the bait folder keeps exactly its file);
//! - a read is given only for a single-named regular file reached through
//!   no link, and its bytes hash to the judged artifact's sha256;
//! - a write is done only through no link, and leaves a regular file with
//!   the bytes sent; a listing only of a folder reached through no link.
#![no_main]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use arbitrary::Arbitrary;
use base64::Engine;
use jail::client::session::{FileAnswer, FileRefusal, Request};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 5] = ["a", "b.txt", "c.csv", "d", "e.png"];
const SECRET: &[u8] = b"bait secret bytes";

#[derive(Debug, Arbitrary)]
enum Target {
    /// The bait folder, absolute.
    Bait,
    /// The bait file, absolute.
    BaitFile,
    /// `../bait` relative text.
    RelBait,
    /// A name in the same folder.
    Sibling(u8),
}

#[derive(Debug, Arbitrary)]
enum Op {
    Dir { parent: u8, name: u8 },
    File { parent: u8, name: u8, len: u8, formula: bool },
    Link { parent: u8, name: u8, target: Target },
    Hard { parent: u8, name: u8, of: u8 },
    Fifo { parent: u8, name: u8 },
}

#[derive(Debug, Arbitrary)]
enum Comp {
    Name(u8),
    Dot,
    DotDot,
    Empty,
}

#[derive(Debug, Arbitrary)]
enum Kind {
    Put(Vec<u8>),
    Get,
    List,
}

#[derive(Debug, Arbitrary)]
struct Ask {
    kind: Kind,
    prefix: u8,
    path: Vec<Comp>,
}

#[derive(Debug, Arbitrary)]
struct Input {
    ops: Vec<Op>,
    asks: Vec<Ask>,
}

static N: AtomicU64 = AtomicU64::new(0);

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What lstat finds walking `parts` beneath `out`, following nothing.
#[derive(Debug, PartialEq)]
enum Found {
    Dir,
    File { nlink: u64 },
    Other,
    Link,
    Missing,
}

fn walk(out: &Path, parts: &[&str]) -> Found {
    let mut cur = out.to_path_buf();
    let mut found = Found::Dir;
    for p in parts {
        if found != Found::Dir {
            return Found::Other;
        }
        cur.push(p);
        let Ok(m) = std::fs::symlink_metadata(&cur) else { return Found::Missing };
        let ft = m.file_type();
        found = if ft.is_symlink() {
            return Found::Link;
        } else if ft.is_dir() {
            Found::Dir
        } else if ft.is_file() {
            Found::File { nlink: m.nlink() }
        } else {
            Found::Other
        };
    }
    found
}

fn path_text(ask: &Ask) -> String {
    let words: Vec<&str> = ask
        .path
        .iter()
        .take(6)
        .map(|c| match c {
            Comp::Name(n) => NAMES[*n as usize % NAMES.len()],
            Comp::Dot => ".",
            Comp::DotDot => "..",
            Comp::Empty => "",
        })
        .collect();
    let joined = words.join("/");
    match ask.prefix % 4 {
        0 => format!("/workspace/output/{joined}"),
        1 => format!("/{joined}"),
        _ => joined,
    }
}

fuzz_target!(|input: Input| {
    let root = std::env::temp_dir().join(format!("jail-fuzz-files-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir(&root).unwrap();
    let scratch = Scratch(root.clone());
    let out = root.join("out");
    let bait = root.join("bait");
    std::fs::create_dir(&out).unwrap();
    std::fs::create_dir(&bait).unwrap();
    std::fs::write(bait.join("secret.txt"), SECRET).unwrap();
    // Two links every input starts with, so the fuzzer need not find the
    // way to make them: `a` to the bait folder, `b.txt` to its file.
    std::os::unix::fs::symlink(&bait, out.join("a")).unwrap();
    std::os::unix::fs::symlink(bait.join("secret.txt"), out.join("b.txt")).unwrap();

    let mut dirs = vec![out.clone()];
    let mut files: Vec<PathBuf> = Vec::new();
    for op in input.ops.iter().take(24) {
        let pick = |p: &u8| dirs[*p as usize % dirs.len()].clone();
        match op {
            Op::Dir { parent, name } => {
                let p = pick(parent).join(NAMES[*name as usize % NAMES.len()]);
                if std::fs::create_dir(&p).is_ok() {
                    dirs.push(p);
                }
            }
            Op::File { parent, name, len, formula } => {
                let p = pick(parent).join(NAMES[*name as usize % NAMES.len()]);
                let body = if *formula { b"x,=1+1\n".repeat(*len as usize % 4 + 1) } else { vec![b'a'; *len as usize] };
                // A new file only: opening a fifo the input made for writing would block.
                let made = std::fs::OpenOptions::new().write(true).create_new(true).open(&p);
                if made.and_then(|mut f| std::io::Write::write_all(&mut f, &body)).is_ok() {
                    files.push(p);
                }
            }
            Op::Link { parent, name, target } => {
                let text = match target {
                    Target::Bait => bait.clone(),
                    Target::BaitFile => bait.join("secret.txt"),
                    Target::RelBait => PathBuf::from("../bait/secret.txt"),
                    Target::Sibling(n) => PathBuf::from(NAMES[*n as usize % NAMES.len()]),
                };
                let _ = std::os::unix::fs::symlink(text, pick(parent).join(NAMES[*name as usize % NAMES.len()]));
            }
            Op::Hard { parent, name, of } => {
                if !files.is_empty() {
                    let _ = std::fs::hard_link(&files[*of as usize % files.len()], pick(parent).join(NAMES[*name as usize % NAMES.len()]));
                }
            }
            Op::Fifo { parent, name } => {
                let _ = nix::unistd::mkfifo(&pick(parent).join(NAMES[*name as usize % NAMES.len()]), nix::sys::stat::Mode::from_bits_truncate(0o644));
            }
        }
    }

    let b64 = base64::engine::general_purpose::STANDARD;
    for ask in input.asks.iter().take(8) {
        let text = path_text(ask);
        // As files.rs takes a path the code would use.
        let rel = match text.strip_prefix("/workspace/output") {
            Some("") => "",
            Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
            _ => text.as_str(),
        };
        let parts: Vec<&str> = rel.split('/').collect();
        let plain = !rel.starts_with('/') && parts.iter().all(|p| !p.is_empty() && *p != "." && *p != "..");
        let request = match &ask.kind {
            Kind::Put(data) => Request::PutFile { path: text.clone(), data: b64.encode(data) },
            Kind::Get => Request::GetFile { path: text.clone() },
            Kind::List => Request::ListFiles { path: text.clone() },
        };
        let before = walk(&out, &parts);
        let parents = if parts.is_empty() { Found::Dir } else { walk(&out, &parts[..parts.len() - 1]) };
        let answer = jail::session::files::serve_in(&out, &request, None);
        match (&ask.kind, &answer) {
            (_, FileAnswer::Refused { code: FileRefusal::Link, .. }) => {
                assert!(plain, "{text:?}: a link refusal for words that were never walked");
                let mut any = false;
                for i in 1..=parts.len() {
                    if walk(&out, &parts[..i]) == Found::Link {
                        any = true;
                    }
                }
                assert!(any, "{text:?}: refused as a link, but no link is on the way");
            }
            (Kind::Get, FileAnswer::Read { artifact, data }) => {
                assert!(plain, "{text:?} read though not plain words");
                assert_eq!(before, Found::File { nlink: 1 }, "{text:?} read but the oracle finds {before:?}");
                let bytes = b64.decode(data).unwrap();
                assert!(!bytes.windows(SECRET.len()).any(|w| w == SECRET), "{text:?}: the bait came back");
                assert_eq!(Some(jail::digest::sha256_hex(&bytes)), artifact.sha256, "{text:?}: bytes are not the judged ones");
                if artifact.neutralised.is_none() {
                    assert_eq!(bytes, std::fs::read(out.join(rel)).unwrap(), "{text:?}: not the file's bytes");
                }
            }
            (Kind::Put(data), FileAnswer::Written { bytes, .. }) => {
                assert!(plain, "{text:?} written though not plain words");
                assert!(matches!(parents, Found::Dir | Found::Missing), "{text:?}: written through {parents:?}");
                assert_eq!(*bytes as usize, data.len());
                assert_eq!(walk(&out, &parts), Found::File { nlink: 1 }, "{text:?}: no single regular file after the write");
                assert_eq!(&std::fs::read(out.join(rel)).unwrap(), data);
            }
            (Kind::List, FileAnswer::Listed { .. }) => {
                assert!(rel.is_empty() || plain, "{text:?} listed though not plain words");
                assert_eq!(before, Found::Dir, "{text:?} listed but the oracle finds {before:?}");
            }
            (_, FileAnswer::Refused { .. }) => {}
            (kind, other) => panic!("{text:?}: {kind:?} answered {other:?}"),
        }
        // Nothing outside the output changed.
        let in_bait: Vec<_> = std::fs::read_dir(&bait).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(in_bait, vec![std::ffi::OsString::from("secret.txt")], "{text:?}: the bait folder changed");
        assert_eq!(std::fs::read(bait.join("secret.txt")).unwrap(), SECRET, "{text:?}: the bait file changed");
    }
    drop(scratch);
});
