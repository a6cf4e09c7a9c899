//! The acceptor over link tricks: each test names the trick and what it
//! must not reach.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};

use super::*;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A tree: `real/` (a.csv, sub/b.csv), `secret` beside it, and links.
fn tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let real = t.path().join("real");
    fs::create_dir_all(real.join("sub")).unwrap();
    fs::write(real.join("a.csv"), "x\n").unwrap();
    fs::write(real.join("sub/b.csv"), "y\n").unwrap();
    fs::write(t.path().join("secret"), "no").unwrap();
    symlink(&real, t.path().join("link")).unwrap();
    symlink("/etc", t.path().join("etc")).unwrap();
    t
}

fn link_refused<T: std::fmt::Debug>(r: Result<T, AcceptError>, what: &str) {
    match r {
        Err(e) => assert!(e.is_link(), "{what}: {e}"),
        Ok(v) => panic!("{what} was accepted: {v:?}"),
    }
}

#[test]
fn a_link_with_a_trailing_slash_is_refused() {
    let t = tree();
    for p in [
        t.path().join("etc/"),
        t.path().join("link/"),
        t.path().join("etc/."),
        t.path().join("link"),
    ] {
        let shown = format!("{}{}", p.display(), if p.ends_with("etc") || p.ends_with("link") { "/" } else { "" });
        link_refused(open_dir(Path::new(&shown), Reach::here()), &shown);
    }
    assert!(open_dir(&t.path().join("real/"), Reach::here()).is_ok());
}

#[test]
fn a_link_among_the_parents_is_refused_for_folders_files_and_places() {
    let t = tree();
    link_refused(open_dir(&t.path().join("link/sub"), Reach::here()), "link/sub");
    link_refused(open_file(&t.path().join("link/a.csv"), Reach::here()), "link/a.csv");
    link_refused(open_file(&t.path().join("etc/passwd"), Reach::here()), "etc/passwd");
    link_refused(Place::name(&t.path().join("etc/newdir")), "etc/newdir");
    link_refused(Place::name(&t.path().join("link/newdir")), "link/newdir");
    assert!(!t.path().join("real/newdir").exists());
}

#[test]
fn dot_dot_is_the_real_parent_and_a_link_before_it_is_refused() {
    let t = tree();
    let fd = open_dir(&t.path().join("real/sub/.."), Reach::here()).unwrap();
    assert!(names(&fd).unwrap().contains(&OsString::from("a.csv")));
    // `link/..` would be the link's folder's parent by the words, /etc's by
    // the link: neither, it is refused.
    link_refused(open_dir(&t.path().join("link/.."), Reach::here()), "link/..");
    link_refused(open_file(&t.path().join("etc/../etc/passwd"), Reach::here()), "etc/../etc/passwd");
}

#[test]
fn magic_links_under_proc_are_refused() {
    let t = tree();
    let keep = fs::File::open(t.path().join("real/a.csv")).unwrap();
    let fd_path = format!("/proc/self/fd/{}", keep.as_raw_fd());
    link_refused(open_file(Path::new(&fd_path), Reach::here()), &fd_path);
    let cwd = std::env::current_dir().unwrap();
    for p in [
        "/proc/self/cwd",
        "/proc/self/root/etc",
        "/proc/self/cwd/Cargo.toml",
        "/proc/thread-self/root",
    ] {
        link_refused(open_dir(Path::new(p), Reach::here()), p);
        link_refused(open_file(Path::new(p), Reach::here()), p);
    }
    let me = format!("/proc/{}/root/etc/passwd", std::process::id());
    link_refused(open_file(Path::new(&me), Reach::here()), &me);
    assert_eq!(std::env::current_dir().unwrap(), cwd);
}

#[test]
fn a_parent_swapped_for_a_link_after_the_check_changes_nothing() {
    let t = tree();
    // A folder: opened, then its path swapped for a link to /etc; the copy
    // reads what was opened.
    let real = t.path().join("real");
    let from = open_dir(&real, Reach::here()).unwrap();
    fs::rename(&real, t.path().join("moved")).unwrap();
    symlink("/etc", &real).unwrap();
    let to_dir = tempfile::tempdir().unwrap();
    let to = open_own_dir(to_dir.path()).unwrap();
    let c = copy_tree(&from, &to, Reach::here(), Bounds { bytes: 1 << 20, entries: 100 }).unwrap();
    assert_eq!(c.files, 2, "{c:?}");
    assert!(to_dir.path().join("a.csv").exists() && !to_dir.path().join("passwd").exists());
    // An output place: named, then its parent swapped for a link to a
    // folder elsewhere; the folder is made in the parent that was opened.
    let parent = t.path().join("out-parent");
    fs::create_dir(&parent).unwrap();
    let place = Place::name(&parent.join("new")).unwrap();
    let elsewhere = t.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    fs::rename(&parent, t.path().join("out-moved")).unwrap();
    symlink(&elsewhere, &parent).unwrap();
    place.make_dir(0o700).unwrap();
    assert!(t.path().join("out-moved/new").is_dir());
    assert!(!elsewhere.join("new").exists());
    // And a path opened again after the swap is refused.
    link_refused(open_dir(&real, Reach::here()), "real, now a link");
}

#[test]
fn a_place_is_a_plain_name_and_never_a_link() {
    let t = tree();
    for p in ["/", "/tmp/..", ""] {
        assert!(matches!(Place::name(Path::new(p)).map(drop).unwrap_err().problem, Problem::NotPlain | Problem::Io(_)), "{p}");
    }
    assert_eq!(Place::name(&t.path().join("new")).unwrap().found().unwrap(), Found::Nothing);
    assert_eq!(Place::name(&t.path().join("real")).unwrap().found().unwrap(), Found::Folder);
    assert_eq!(Place::name(&t.path().join("link")).unwrap().found().unwrap(), Found::Other);
    assert_eq!(Place::name(&t.path().join("etc/")).unwrap().found().unwrap(), Found::Other, "a trailing slash names the link");
    assert_eq!(Place::name(&t.path().join("secret")).unwrap().found().unwrap(), Found::Other);
    fs::create_dir(t.path().join("empty")).unwrap();
    let empty = Place::name(&t.path().join("empty")).unwrap();
    assert_eq!(empty.found().unwrap(), Found::EmptyFolder);
    empty.remove_empty_dir().unwrap();
    assert_eq!(empty.found().unwrap(), Found::Nothing);
}

#[test]
fn a_copy_keeps_links_as_links_refuses_hard_links_and_special_files_and_never_widens() {
    let t = tree();
    let real = t.path().join("real");
    symlink("/etc/passwd", real.join("abs-link")).unwrap();
    symlink("../secret", real.join("sub/up-link")).unwrap();
    fs::hard_link(t.path().join("secret"), real.join("hard")).unwrap();
    nix::unistd::mkfifo(&real.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
    fs::write(real.join("private"), "p").unwrap();
    fs::set_permissions(real.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(real.join("setid"), "s").unwrap();
    fs::set_permissions(real.join("setid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(real.join("sub"), fs::Permissions::from_mode(0o751)).unwrap();
    let to_dir = tempfile::tempdir().unwrap();
    let c = copy_tree(
        &open_dir(&real, Reach::Caller).unwrap(),
        &open_own_dir(to_dir.path()).unwrap(),
        Reach::Caller,
        Bounds { bytes: 1 << 20, entries: 100 },
    )
    .unwrap();
    let to = to_dir.path();
    let mode = |p: &str| fs::symlink_metadata(to.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(fs::read_link(to.join("abs-link")).unwrap(), Path::new("/etc/passwd"));
    assert_eq!(fs::read_link(to.join("sub/up-link")).unwrap(), Path::new("../secret"));
    assert!(!to.join("hard").exists() && !to.join("fifo").exists());
    assert_eq!((mode("private"), mode("setid"), mode("sub")), (0o600, 0o755, 0o751));
    let reasons: Vec<(String, RejectReason)> = c.refused.iter().map(|r| (r.path.display().to_string(), r.reason)).collect();
    assert_eq!(reasons, vec![("fifo".into(), RejectReason::Fifo), ("hard".into(), RejectReason::HardLink)]);
    assert_eq!(c.files, 4, "{c:?}");
}

#[test]
fn as_root_a_copy_holds_only_what_the_jails_uid_may_read() {
    if !is_root() {
        return;
    }
    let t = tree();
    let real = t.path().join("real");
    fs::set_permissions(real.join("a.csv"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(real.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(real.join("open.csv"), "o").unwrap();
    fs::set_permissions(real.join("open.csv"), fs::Permissions::from_mode(0o644)).unwrap();
    let to_dir = tempfile::tempdir().unwrap();
    let c = copy_tree(
        &open_own_dir(&real).unwrap(),
        &open_own_dir(to_dir.path()).unwrap(),
        Reach::here(),
        Bounds { bytes: 1 << 20, entries: 100 },
    )
    .unwrap();
    let refused: Vec<String> = c.refused.iter().map(|r| format!("{} {:?}", r.path.display(), r.reason)).collect();
    assert_eq!(refused, vec!["a.csv Unreadable", "sub Unreadable"]);
    assert_eq!(fs::read_to_string(to_dir.path().join("open.csv")).unwrap(), "o");
    assert!(!to_dir.path().join("a.csv").exists() && !to_dir.path().join("sub").exists());
    // A named file: /etc/shadow is root's and its group's alone.
    let e = open_file(Path::new("/etc/shadow"), Reach::here()).unwrap_err();
    assert!(matches!(e.problem, Problem::Unreadable(_)), "{e}");
}

#[test]
fn an_ordinary_caller_is_judged_by_the_kernel() {
    if is_root() {
        return;
    }
    let t = tree();
    fs::set_permissions(t.path().join("secret"), fs::Permissions::from_mode(0o200)).unwrap();
    let e = open_file(&t.path().join("secret"), Reach::Caller).unwrap_err();
    assert!(matches!(e.problem, Problem::Unreadable(_)), "{e}");
    let e = open_file(Path::new("/etc/shadow"), Reach::Caller).unwrap_err();
    assert!(matches!(e.problem, Problem::Unreadable(_)), "{e}");
}

#[test]
fn the_sandbox_reach_is_the_kernels_class_rule_by_mode_bits() {
    let st = |mode: u32, uid: u32, gid: u32| {
        let mut s: FileStat = fstat(&open_own_dir(Path::new("/")).unwrap()).unwrap();
        s.st_mode = libc::S_IFREG | mode;
        s.st_uid = uid;
        s.st_gid = gid;
        s
    };
    let r = |uid, gid| Reach::Sandbox { uid, gid };
    // The owner class decides for the owner, even when others may read.
    assert!(!mode_allows(&st(0o044, 7, 8), Some(7), None, Want::Read, false));
    assert!(mode_allows(&st(0o400, 7, 8), Some(7), None, Want::Read, false));
    assert!(mode_allows(&st(0o040, 7, 8), None, Some(8), Want::Read, false));
    assert!(!mode_allows(&st(0o640, 0, 42), None, None, Want::Read, false), "/etc/shadow");
    assert!(mode_allows(&st(0o644, 0, 0), None, None, Want::Read, false));
    assert!(!mode_allows(&st(0o754, 0, 0), None, None, Want::Read, true), "a folder needs x too");
    assert!(mode_allows(&st(0o773, 0, 0), None, None, Want::Write, true));
    assert_eq!(r(None, None), Reach::Sandbox { uid: None, gid: None });
}

#[test]
fn a_copy_stops_at_its_bounds() {
    let t = tree();
    let to_dir = tempfile::tempdir().unwrap();
    let from = open_dir(&t.path().join("real"), Reach::here()).unwrap();
    let to = open_own_dir(to_dir.path()).unwrap();
    assert!(matches!(copy_tree(&from, &to, Reach::here(), Bounds { bytes: 1, entries: 100 }), Err(CopyError::TooLarge(1))));
    let to_dir = tempfile::tempdir().unwrap();
    let to = open_own_dir(to_dir.path()).unwrap();
    assert!(matches!(copy_tree(&from, &to, Reach::here(), Bounds { bytes: 100, entries: 2 }), Err(CopyError::TooMany(2))));
}

#[test]
fn as_root_a_file_the_jails_group_reads_is_copied_with_that_group() {
    if !is_root() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let gid = 1_879_048_192;
    let t = tree();
    let real = t.path().join("real");
    std::os::unix::fs::chown(real.join("a.csv"), None, Some(gid)).unwrap();
    fs::set_permissions(real.join("a.csv"), fs::Permissions::from_mode(0o640)).unwrap();
    let reach = Reach::Sandbox { uid: None, gid: Some(gid) };
    let to_dir = tempfile::tempdir().unwrap();
    let c = copy_tree(
        &open_dir(&real, reach).unwrap(),
        &open_own_dir(to_dir.path()).unwrap(),
        reach,
        Bounds { bytes: 1 << 20, entries: 100 },
    )
    .unwrap();
    assert!(c.refused.is_empty(), "{:?}", c.refused);
    let m = fs::metadata(to_dir.path().join("a.csv")).unwrap();
    assert_eq!((m.gid(), m.mode() & 0o777), (gid, 0o640));
    // Without the group, the "other" bits alone decide: refused.
    let to_dir = tempfile::tempdir().unwrap();
    let others = Reach::Sandbox { uid: None, gid: None };
    let c = copy_tree(
        &open_dir(&real, others).unwrap(),
        &open_own_dir(to_dir.path()).unwrap(),
        others,
        Bounds { bytes: 1 << 20, entries: 100 },
    )
    .unwrap();
    assert_eq!(c.refused.len(), 1, "{:?}", c.refused);
}
