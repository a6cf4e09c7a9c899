//! The data-science rootfs (issue 6) under the default policy: the analysis
//! and office stack does real work in the jail (pandas, matplotlib, openpyxl,
//! python-pptx, python-docx, seaborn, scikit-learn, numpy under thread
//! limits), what it writes opens again, matplotlib never rebuilds its font
//! cache at run time, and the rootfs names its packages and its identity.
//!
//! The rootfs is JAIL_DATA_ROOTFS (default python-rootfs/out/data, built by
//! `make rootfs-data`); without it these tests skip, and under
//! JAIL_MUST_WORK=1 (CI) they fail.

use std::collections::BTreeMap;
use std::path::Path;

use jail::digest::sha256_hex;
use jail::rootfs::Report;
use jail_tests::*;
use serde_json::{json, Value};

/// The lock the data rootfs must have been built from.
const LOCK: &str = include_str!("../../python-rootfs/data.lock");
const MANIFEST: &str = "usr/share/jail/manifest.json";

/// A sandbox on the data rootfs, or `None` (after a skip) when it is not built.
fn data_sandbox() -> Option<Sandbox> {
    let root = data_rootfs();
    let built = root.join(MANIFEST).is_file();
    if skip_unless(built, &format!("no data rootfs at {} (build it: make rootfs-data)", root.display())) {
        return None;
    }
    let mut sb = Sandbox::new();
    sb.rootfs = root;
    // The stack imports in a few seconds; leave room on a loaded machine.
    sb.extra_args = vec!["--timeout".into(), "120".into()];
    if expected_backend() == "rlimit" {
        // Without a cgroup the memory limit is RLIMIT_AS, which counts
        // address space, not memory: OpenBLAS and glibc reserve far more of
        // it per thread than they touch, and 512M of it is not enough for the
        // stack (thread creation then fails). These tests are about the
        // stack working, not about the memory limit (limits.rs tests that).
        sb.extra_args.extend(["--memory".into(), "4G".into()]);
    }
    Some(sb)
}

/// Run `src`, require success and a silent stderr (a warning about an
/// unwritable cache dir, a rebuilt font cache or a missing module fails the
/// test), and return its stdout as JSON.
fn run_clean(sb: &Sandbox, src: &str) -> Value {
    let (r, out) = sb.run(src);
    assert_eq!(r.status, Status::Ok, "{}\n{}", r.stderr.text, String::from_utf8_lossy(&out.stderr));
    assert_eq!(r.stderr.text, "", "the script wrote to stderr");
    serde_json::from_str(r.stdout.text.trim()).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", r.stdout.text))
}

/// Copy a file the jail wrote into another sandbox's input folder.
fn hand_over(from: &Sandbox, name: &str, to: &Sandbox) -> Vec<u8> {
    let bytes = std::fs::read(from.output.join(name)).unwrap_or_else(|e| panic!("{name} was not written: {e}"));
    to.input_file(name, &bytes);
    bytes
}

/// The (width, height) of a PNG, checking its signature and IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 33, "too short for a PNG");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "the first chunk is not IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

/// A zip (OOXML) file that holds every named member.
fn assert_zip_with(bytes: &[u8], members: &[&str]) {
    assert_eq!(&bytes[..4], b"PK\x03\x04", "not a zip file");
    for m in members {
        assert!(bytes.windows(m.len()).any(|w| w == m.as_bytes()), "the zip has no {m}");
    }
}

/// The lock's pins, name to version.
fn lock_pins() -> BTreeMap<String, String> {
    LOCK.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let pin = l.split_whitespace().next().unwrap();
            let (name, version) = pin.split_once("==").unwrap();
            (name.to_string(), version.to_string())
        })
        .collect()
}

/// A copy of the default policy with extra environment variables set.
fn policy_with_env(sb: &Sandbox, vars: &[(&str, &str)]) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo().join("policies/default.json")).unwrap();
    let mut policy: Value = serde_json::from_str(&text).unwrap();
    for (k, v) in vars {
        policy["environment"]["set"][*k] = json!(v);
    }
    let path = sb.dir.path().join("policy.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&policy).unwrap()).unwrap();
    path
}

// ------------------------------------------------------------- the workloads

const CSV: &str = "region,units\nnorth,3\nsouth,5\nnorth,4\neast,1\n";

#[test]
fn openpyxl_writes_an_xlsx_that_pandas_reads_back_with_a_csv_and_groups() {
    let Some(writer) = data_sandbox() else { return };
    let v = run_clean(
        &writer,
        r#"
import json, openpyxl
wb = openpyxl.Workbook()
ws = wb.active
ws.title = "prices"
ws.append(["region", "price"])
for row in [("north", 2.5), ("south", 1.0), ("east", 10.0)]:
    ws.append(row)
wb.save("/workspace/output/prices.xlsx")
print(json.dumps({"sheets": openpyxl.load_workbook("/workspace/output/prices.xlsx").sheetnames}))
"#,
    );
    assert_eq!(v["sheets"], json!(["prices"]));

    let Some(reader) = data_sandbox() else { return };
    let xlsx = hand_over(&writer, "prices.xlsx", &reader);
    assert_zip_with(&xlsx, &["[Content_Types].xml", "xl/workbook.xml", "xl/worksheets/sheet1.xml"]);
    reader.input_file("units.csv", CSV.as_bytes());
    let v = run_clean(
        &reader,
        r#"
import json, pandas as pd
units = pd.read_csv("/workspace/input/units.csv")
prices = pd.read_excel("/workspace/input/prices.xlsx", sheet_name="prices")
by_region = units.groupby("region", as_index=False)["units"].sum().merge(prices, on="region")
by_region["revenue"] = by_region["units"] * by_region["price"]
print(json.dumps({r.region: [int(r.units), float(r.revenue)] for r in by_region.itertuples()}))
"#,
    );
    assert_eq!(v, json!({"east": [1, 10.0], "north": [7, 17.5], "south": [5, 5.0]}));
}

/// Draw the chart, capturing matplotlib's own log of where its font list
/// came from. `BYPASS` (set by the control test) removes the rootfs's
/// sitecustomize hook first, so the check below is shown to catch a rebuild.
const CHART: &str = r#"
import io, json, logging, sys, time
BYPASS = False
removed = 0
if BYPASS:
    import os
    before = len(sys.meta_path)
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") != "_PrepareOnImport"]
    removed = before - len(sys.meta_path)
    os.environ["MPLCONFIGDIR"] = "/tmp/fresh-mpl"
log = io.StringIO()
handler = logging.StreamHandler(log)
logger = logging.getLogger("matplotlib")
logger.addHandler(handler)
logger.setLevel(logging.DEBUG)
logger.propagate = False
t = time.perf_counter()
import matplotlib
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
ax.bar(["north", "south", "east"], [7, 5, 1], color="tab:blue")
ax.set_title("Units by region")
ax.set_ylabel("units")
fig.savefig("/workspace/output/chart.png")
secs = time.perf_counter() - t
text = log.getvalue()
print(json.dumps({
    "removed_hooks": removed,
    "cached": "Using fontManager instance from" in text,
    "rebuilt": "generated new fontManager" in text,
    "backend": matplotlib.get_backend(),
    "cachedir": matplotlib.get_cachedir(),
    "secs": secs,
}))
"#;

#[test]
fn matplotlib_writes_a_png_from_the_prebuilt_font_cache() {
    let Some(sb) = data_sandbox() else { return };
    let v = run_clean(&sb, CHART);
    assert_eq!(v["rebuilt"], json!(false), "matplotlib rebuilt its font cache: {v}");
    assert_eq!(v["cached"], json!(true), "matplotlib did not load the prebuilt font list: {v}");
    // The policy's Agg, as the inline backend: Agg's canvas, figures shown
    // as rich results (jail/src/display.py).
    assert_eq!(v["backend"], json!("module://_jail_inline"), "{v}");
    assert_eq!(v["cachedir"], json!("/tmp/matplotlib"));
    eprintln!("import matplotlib + one chart, prebuilt font list: {:.3} s", v["secs"].as_f64().unwrap());
    let png = std::fs::read(sb.output.join("chart.png")).unwrap();
    assert_eq!(png_size(&png), (600, 400));
}

#[test]
fn font_cache_rebuild_is_detected_when_the_prebuilt_list_is_bypassed() {
    let Some(sb) = data_sandbox() else { return };
    let (r, _) = sb.run(&CHART.replace("BYPASS = False", "BYPASS = True"));
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    let v: Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    assert_eq!(v["removed_hooks"], json!(1), "the rootfs's sitecustomize hook was not installed");
    assert_eq!(v["rebuilt"], json!(true), "without the prebuilt list matplotlib must rebuild: {v}");
    assert_eq!(v["cached"], json!(false));
    eprintln!("import matplotlib + one chart, font list rebuilt: {:.3} s", v["secs"].as_f64().unwrap());
}

#[test]
fn pptx_deck_with_a_title_bullets_and_a_png_opens_again() {
    let Some(plot) = data_sandbox() else { return };
    run_clean(&plot, CHART);
    let Some(deck) = data_sandbox() else { return };
    let png = hand_over(&plot, "chart.png", &deck);
    run_clean(
        &deck,
        r#"
import json
from pptx import Presentation
from pptx.util import Inches
prs = Presentation()
title = prs.slides.add_slide(prs.slide_layouts[0])
title.shapes.title.text = "Quarterly units"
title.placeholders[1].text = "Made in a jail"
bullets = prs.slides.add_slide(prs.slide_layouts[1])
bullets.shapes.title.text = "Findings"
body = bullets.placeholders[1].text_frame
body.text = "North leads with 7 units"
for line in ["South follows with 5", "East trails with 1"]:
    body.add_paragraph().text = line
chart = prs.slides.add_slide(prs.slide_layouts[5])
chart.shapes.title.text = "Units by region"
chart.shapes.add_picture("/workspace/input/chart.png", Inches(1), Inches(1.5), width=Inches(8))
prs.save("/workspace/output/deck.pptx")
print(json.dumps({"slides": len(prs.slides)}))
"#,
    );

    let Some(check) = data_sandbox() else { return };
    let pptx = hand_over(&deck, "deck.pptx", &check);
    assert_zip_with(&pptx, &["ppt/slides/slide1.xml", "ppt/slides/slide3.xml", "ppt/media/image1.png"]);
    check.input_file("chart.png", &png);
    let v = run_clean(
        &check,
        r#"
import hashlib, json
from pptx import Presentation
from PIL import Image
prs = Presentation("/workspace/input/deck.pptx")
slides = []
for slide in prs.slides:
    texts = [p.text for s in slide.shapes if s.has_text_frame for p in s.text_frame.paragraphs if p.text]
    pictures = [hashlib.sha256(s.image.blob).hexdigest() for s in slide.shapes if s.shape_type == 13]
    slides.append({"texts": texts, "pictures": pictures})
img = Image.open("/workspace/input/chart.png")
img.load()
rgb = img.convert("RGB")
colours = rgb.getcolors(maxcolors=1 << 20)
blue = sum(n for n, (r, g, b) in colours if b > 150 and r < 100)
print(json.dumps({"slides": slides, "size": list(img.size), "mode": img.mode, "blue_pixels": blue,
                  "colours": len(colours),
                  "png_sha256": hashlib.sha256(open("/workspace/input/chart.png", "rb").read()).hexdigest()}))
"#,
    );
    let slides = v["slides"].as_array().unwrap();
    assert_eq!(slides.len(), 3);
    assert_eq!(slides[0]["texts"], json!(["Quarterly units", "Made in a jail"]));
    assert_eq!(
        slides[1]["texts"],
        json!([
            "Findings",
            "North leads with 7 units",
            "South follows with 5",
            "East trails with 1"
        ])
    );
    assert_eq!(slides[2]["texts"], json!(["Units by region"]));
    // The picture in the deck is byte for byte the PNG matplotlib wrote.
    assert_eq!(slides[2]["pictures"], json!([sha256_hex(&png)]));
    assert_eq!(v["png_sha256"], json!(sha256_hex(&png)));
    // Decoded: the size the figure asked for, with the bars really drawn.
    assert_eq!(v["size"], json!([600, 400]));
    assert!(v["blue_pixels"].as_u64().unwrap() > 10_000, "the bars are missing: {v}");
    assert!(v["colours"].as_u64().unwrap() > 10, "a blank image: {v}");
}

#[test]
fn scikit_learn_fits_small_models() {
    let Some(sb) = data_sandbox() else { return };
    let v = run_clean(
        &sb,
        r#"
import json
import numpy as np
from sklearn.cluster import KMeans
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
X, y = load_iris(return_X_y=True)
Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
clf = LogisticRegression(max_iter=1000).fit(Xtr, ytr)
rng = np.random.default_rng(0)
blobs = np.vstack([rng.normal(0, 0.3, (50, 2)), rng.normal(5, 0.3, (50, 2))])
km = KMeans(n_clusters=2, n_init=3, random_state=0).fit(blobs)
print(json.dumps({"accuracy": clf.score(Xte, yte), "sizes": sorted(np.bincount(km.labels_).tolist())}))
"#,
    );
    assert!(v["accuracy"].as_f64().unwrap() > 0.9, "{v}");
    assert_eq!(v["sizes"], json!([50, 50]));
}

const NUMPY_THREADS: &str = r#"
import json, numpy as np, threadpoolctl
threads = int(open("/proc/self/status").read().split("Threads:")[1].split()[0])
rng = np.random.default_rng(1)
a = rng.random((300, 300)) + 300 * np.eye(300)
ok = bool(np.allclose(a @ np.linalg.inv(a), np.eye(300), atol=1e-8))
pools = {p["internal_api"]: p["num_threads"] for p in threadpoolctl.threadpool_info()}
print(json.dumps({"threads_after_import": threads, "inverse_ok": ok, "pools": pools}))
"#;

#[test]
fn numpy_works_and_obeys_the_thread_settings() {
    for n in ["1", "2"] {
        let Some(mut sb) = data_sandbox() else { return };
        let vars = [("OMP_NUM_THREADS", n), ("OPENBLAS_NUM_THREADS", n), ("MKL_NUM_THREADS", n)];
        let policy = policy_with_env(&sb, &vars);
        sb.extra_args.extend(["--policy".to_string(), policy.display().to_string()]);
        // The run is pinned to ceil(cpus) CPUs (inside.rs), and OpenBLAS
        // never starts more threads than its affinity has CPUs.
        sb.extra_args.extend(["--cpus".to_string(), n.to_string()]);
        let v = run_clean(&sb, NUMPY_THREADS);
        assert_eq!(v["inverse_ok"], json!(true), "numpy computed a wrong inverse: {v}");
        assert_eq!(v["pools"]["openblas"], json!(n.parse::<u64>().unwrap()), "{v}");
        if n == "1" {
            // OpenBLAS started no worker threads: the setting reached it.
            assert_eq!(v["threads_after_import"], json!(1), "{v}");
        }
    }
}

#[test]
fn docx_seaborn_and_tabulate_do_their_jobs() {
    let Some(sb) = data_sandbox() else { return };
    sb.input_file("units.csv", CSV.as_bytes());
    let v = run_clean(
        &sb,
        r#"
import json
import pandas as pd, seaborn as sns
from docx import Document
from docx.shared import Inches
from tabulate import tabulate
df = pd.read_csv("/workspace/input/units.csv")
ax = sns.barplot(data=df, x="region", y="units", estimator="sum", errorbar=None)
ax.figure.savefig("/workspace/output/seaborn.png", dpi=50)
doc = Document()
doc.add_heading("Units report", level=1)
doc.add_paragraph("Units by region, from units.csv.")
table = doc.add_table(rows=1, cols=2)
table.rows[0].cells[0].text, table.rows[0].cells[1].text = "region", "units"
for region, units in df.groupby("region")["units"].sum().items():
    cells = table.add_row().cells
    cells[0].text, cells[1].text = region, str(units)
doc.add_picture("/workspace/output/seaborn.png", width=Inches(4))
doc.save("/workspace/output/report.docx")
back = Document("/workspace/output/report.docx")
print(json.dumps({
    "paragraphs": [p.text for p in back.paragraphs if p.text],
    "rows": [[c.text for c in r.cells] for r in back.tables[0].rows],
    "pictures": len(back.inline_shapes),
    "table": tabulate(df.groupby("region")["units"].sum().reset_index(), headers="keys", tablefmt="github", showindex=False),
}))
"#,
    );
    assert_eq!(v["paragraphs"], json!(["Units report", "Units by region, from units.csv."]));
    assert_eq!(v["rows"], json!([["region", "units"], ["east", "1"], ["north", "7"], ["south", "5"]]));
    assert_eq!(v["pictures"], json!(1));
    assert!(v["table"].as_str().unwrap().contains("| north    |       7 |"), "{v}");
    assert_zip_with(&std::fs::read(sb.output.join("report.docx")).unwrap(), &["word/document.xml", "word/media/image1.png"]);
    png_size(&std::fs::read(sb.output.join("seaborn.png")).unwrap());
}

// ------------------------------------------------- manifest and identity

#[test]
fn jail_packages_lists_exactly_the_locked_stack() {
    let Some(_) = data_sandbox() else { return };
    let out = std::process::Command::new(jail_bin())
        .args(["packages", "--json", "--rootfs"])
        .arg(data_rootfs())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Report = serde_json::from_slice(&out.stdout).unwrap();
    let m = &report.manifest;
    assert_eq!(m.flavour, "data");
    assert!(m.python.version.starts_with("3.11."), "{:?}", m.python);
    assert!(m.python.debian_package.is_some(), "the interpreter is Debian's");
    assert_eq!(
        m.lock_sha256.as_deref(),
        Some(sha256_hex(LOCK.as_bytes()).as_str()),
        "the rootfs was built from another lock: rebuild it (make rootfs-data)"
    );
    let installed: BTreeMap<String, String> = m.packages.iter().map(|p| (p.name.clone(), p.version.clone())).collect();
    assert_eq!(installed, lock_pins());
    let imports = |name: &str| m.packages.iter().find(|p| p.name == name).map(|p| p.imports.clone()).unwrap_or_default();
    for (dist, module) in [
        ("numpy", "numpy"),
        ("pandas", "pandas"),
        ("matplotlib", "matplotlib"),
        ("seaborn", "seaborn"),
        ("scipy", "scipy"),
        ("scikit-learn", "sklearn"),
        ("openpyxl", "openpyxl"),
        ("python-pptx", "pptx"),
        ("python-docx", "docx"),
        ("pillow", "PIL"),
        ("tabulate", "tabulate"),
    ] {
        assert!(imports(dist).contains(&module.to_string()), "{dist} does not list `import {module}`");
    }
    let bytes = std::fs::read(data_rootfs().join(MANIFEST)).unwrap();
    assert_eq!(report.rootfs_id, sha256_hex(&bytes));

    let text = std::process::Command::new(jail_bin())
        .arg("packages")
        .arg("--rootfs")
        .arg(data_rootfs())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("scikit-learn") && text.contains("sklearn"), "{text}");
}

#[test]
fn every_package_in_the_manifest_is_installed_and_imports_in_the_jail() {
    let Some(sb) = data_sandbox() else { return };
    let v = run_clean(
        &sb,
        r#"
import importlib, json, re, sys
from importlib import metadata
manifest = json.load(open("/usr/share/jail/manifest.json"))
found = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
failed = []
for p in manifest["packages"]:
    for module in p["imports"]:
        try:
            importlib.import_module(module)
        except Exception as e:
            failed.append(f"{module}: {e!r}")
print(json.dumps({
    "listed": {p["name"]: p["version"] for p in manifest["packages"]},
    "found": found,
    "python": manifest["python"]["version"],
    "running": "%d.%d.%d" % sys.version_info[:3],
    "failed": failed,
}))
"#,
    );
    assert_eq!(v["listed"], v["found"], "the manifest does not match what is installed");
    assert_eq!(v["python"], v["running"]);
    assert_eq!(v["failed"], json!([]));
}

/// `isolation.rootfs_id` of a trivial run, and what it must be.
fn reported_and_expected_id(rootfs: &Path) -> (Option<String>, Option<String>) {
    let mut sb = Sandbox::new();
    sb.rootfs = rootfs.to_path_buf();
    let (r, _) = sb.run("print('hi')");
    assert_eq!(r.status, Status::Ok, "{}", r.stderr.text);
    let expected = std::fs::read(rootfs.join(MANIFEST)).ok().map(|b| sha256_hex(&b));
    (r.isolation.rootfs_id, expected)
}

#[test]
fn every_result_names_the_rootfs_by_the_sha256_of_its_manifest() {
    let Some(_) = data_sandbox() else { return };
    let (reported, expected) = reported_and_expected_id(&data_rootfs());
    assert!(reported.is_some());
    assert_eq!(reported, expected);
}

#[test]
fn minimal_rootfs_has_a_manifest_of_the_standard_library_only() {
    let root = rootfs();
    if skip_unless(
        root.join(MANIFEST).is_file(),
        &format!("the minimal rootfs {} predates manifests: rebuild it (make rootfs)", root.display()),
    ) {
        return;
    }
    let (reported, expected) = reported_and_expected_id(&root);
    assert_eq!(reported, expected);
    let out = std::process::Command::new(jail_bin())
        .args(["packages", "--json", "--rootfs"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Report = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.manifest.flavour, "minimal");
    assert_eq!(report.manifest.packages, vec![]);
    assert_eq!(report.manifest.lock_sha256, None);
}

#[test]
fn jail_packages_on_a_rootfs_without_a_manifest_says_how_to_fix_it() {
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(jail_bin())
        .args(["packages", "--rootfs"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no manifest") && err.contains("jail rootfs build minimal"), "{err}");
    assert!(out.stdout.is_empty());
}

/// Figures as rich results, Jupyter's inline way, in a script and in a
/// session's cell alike: `plt.show()` shows the open figures, a figure
/// left open unsaved is shown at the end, one saved to a file is not sent
/// again (its file is the artifact), and a DataFrame shows as HTML. Each
/// PNG is a real one of the figure's size, judged by the jail.
const FIGURES: &str = r#"
import matplotlib.pyplot as plt, pandas as pd
display(pd.DataFrame({"region": ["north", "south"], "units": [7, 5]}))
plt.figure(figsize=(4, 3), dpi=50); plt.plot([1, 2]); plt.show()
saved, ax = plt.subplots(figsize=(2, 2), dpi=50); ax.plot([3, 1]); saved.savefig("/workspace/output/saved.png")
plt.figure(figsize=(3, 2), dpi=50); plt.bar(["a", "b"], [1, 2])
print("drawn")
"#;

#[test]
fn figures_and_frames_are_rich_results_in_a_script_and_a_cell_alike() {
    let Some(sb) = data_sandbox() else { return };
    let check = |r: &jail::result::RunResult, how: &str| {
        assert_eq!(r.status, Status::Ok, "{how}: {}", r.stderr.text);
        assert_eq!(r.stdout.text, "drawn\n", "{how}");
        let kinds: Vec<Vec<&str>> = r.results.iter().map(|x| x.data.keys().map(String::as_str).collect()).collect();
        assert_eq!(
            kinds,
            [
                vec!["text/html", "text/plain"],
                vec!["image/png", "text/plain"],
                vec!["image/png", "text/plain"]
            ],
            "{how}"
        );
        assert!(r.results[0].data["text/html"].as_str().unwrap().contains("north"), "{how}");
        use base64::Engine;
        let sizes: Vec<(u32, u32)> = r.results[1..]
            .iter()
            .map(|x| base64::engine::general_purpose::STANDARD.decode(x.data["image/png"].as_str().unwrap()).unwrap())
            .map(|png| png_size(&png))
            .collect();
        // bbox_inches="tight" trims the margins: at most the figure's size.
        assert!(sizes[0].0 <= 200 && sizes[0].1 <= 150 && sizes[0].0 > 100, "{how}: {sizes:?}");
        assert!(sizes[1].0 <= 150 && sizes[1].1 <= 100 && sizes[1].0 > 60, "{how}: {sizes:?}");
    };
    let (r, _) = sb.run(FIGURES);
    check(&r, "jail run");
    let s = sb.start_session();
    let (v, _) = s.exec(FIGURES);
    s.stop();
    check(&serde_json::from_value(v).unwrap(), "a session's cell");
}
