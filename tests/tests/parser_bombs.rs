//! Parser bombs (issue 15, finding 3): a script in the jail leaves one bomb
//! per summariser class in its output dir (tests/bombs.py), and the
//! supervisor, summarising them from outside, must stay within a stated
//! memory budget over its own baseline and finish the artifact stage within
//! a stated time, flagging `incomplete_scan` where it stopped short.
//!
//! The memory budget of each class is `budget::memory_budget` of its parser
//! for the largest prefix kept (4 MiB), plus the prefix itself and 4 MiB for
//! the allocator and the stage's own buffers. The time budget is what the
//! summarisers may spend (2 s a file, 10 s in all) plus the sha256 of every
//! byte at 50 MB/s, plus 3 s. Before the fix, the zip64 decoy cost 493 MiB
//! and 6 to 18 s, the JSON arrays 364 MiB.
//!
//! Runs are one at a time (a lock), so that one bomb's hashing does not
//! slow another's clock on a two-core host.

use std::sync::{Mutex, OnceLock};

use jail::artifacts::budget::{memory_budget, Parser, FILE_SCAN_TIME, STAGE_SCAN_TIME};
use jail::result::{Artifact, FlagKind, RunResult, Summary};
use jail_tests::*;

const BOMBS: &str = include_str!("../bombs.py");
const KEEP: usize = 4 << 20;
const SLACK: u64 = 4 << 20;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Run `source` with the default policy, its `artifacts` section changed by
/// `rules`.
fn run(source: &str, rules: serde_json::Value) -> RunResult {
    let mut sb = Sandbox::new();
    let text = std::fs::read_to_string(repo().join("policies/default.json")).unwrap();
    let mut policy: serde_json::Value = serde_json::from_str(&text).unwrap();
    policy.as_object_mut().unwrap().remove("rootfs");
    for (k, v) in rules.as_object().unwrap() {
        policy["artifacts"][k] = v.clone();
    }
    let path = sb.dir.path().join("policy.json");
    std::fs::write(&path, serde_json::to_string(&policy).unwrap()).unwrap();
    sb.extra_args.extend(["--policy".to_string(), path.display().to_string()]);
    let (r, out) = sb.run(source);
    assert_eq!(r.status, Status::Ok, "{}\n{}", r.stderr.text, String::from_utf8_lossy(&out.stderr));
    r
}

/// The supervisor's peak RSS for a run that leaves nothing behind.
fn baseline() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    *BASE.get_or_init(|| run("print('nothing')\n", serde_json::json!({})).supervisor.max_rss_bytes)
}

/// Run bomb `name` and check the supervisor's cost against `parser`'s budget.
fn explode(name: &str, parser: Parser) -> RunResult {
    explode_with(name, parser, serde_json::json!({}))
}

/// [`explode`] with the `artifacts` rules changed. Past the run's judging
/// budget (1 s of supervisor CPU, which an unoptimised build reaches on
/// these) a bomb is delivered flagged (`past_budget: "flag"`) rather than
/// refused, so what its scanners made of it shows; the refusal is
/// tests/artifacts.rs's.
fn explode_with(name: &str, parser: Parser, mut rules: serde_json::Value) -> RunResult {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let base = baseline();
    rules["past_budget"] = "flag".into();
    let r = run(&format!("{BOMBS}\nmake({name:?})\n"), rules);
    assert!(!r.artifacts.is_empty(), "{name}: no artifacts; rejected {:?}", r.rejected_artifacts);
    let over = r.supervisor.max_rss_bytes.saturating_sub(base);
    let budget = memory_budget(parser, KEEP) as u64 + KEEP as u64 + SLACK;
    let stage = r.timings.stages["artifacts"] - r.timings.stages["artifacts_start"];
    let bytes: u64 = r.artifacts.iter().map(|a| a.bytes).sum();
    let scans = (FILE_SCAN_TIME * r.artifacts.len() as u32).min(STAGE_SCAN_TIME).as_millis() as f64;
    let limit = scans + bytes as f64 / 50e6 * 1e3 + 3000.0;
    eprintln!(
        "{name}: supervisor {:.1} MiB over a {:.1} MiB baseline (budget {:.1} MiB); artifact stage {stage:.0} ms (limit {limit:.0} ms)",
        over as f64 / 1048576.0,
        base as f64 / 1048576.0,
        budget as f64 / 1048576.0
    );
    assert!(over <= budget, "{name}: the supervisor peaked {over} bytes over its baseline, past the {budget}-byte budget");
    assert!(stage <= limit, "{name}: the artifact stage took {stage} ms, past {limit} ms");
    r
}

fn artifact<'a>(r: &'a RunResult, path: &str) -> &'a Artifact {
    r.artifacts
        .iter()
        .find(|a| a.path == path)
        .unwrap_or_else(|| panic!("no artifact {path}: {:?}", r.artifacts))
}

fn incomplete(a: &Artifact) -> Option<&str> {
    a.flags.iter().find(|f| f.kind == FlagKind::IncompleteScan).map(|f| f.detail.as_str())
}

#[test]
fn a_zip64_office_file_with_a_decoy_end_record_is_refused_from_its_tail() {
    let r = explode("zip64_decoy", Parser::Office);
    let bomb = artifact(&r, "bomb.xlsx");
    let why = incomplete(bomb).unwrap_or_else(|| panic!("not flagged: {:?}", bomb.flags));
    assert!(why.contains("decoys"), "{why}");
    assert_eq!(bomb.summary, None);
}

#[test]
fn office_parts_that_inflate_or_list_without_end_are_read_to_the_caps() {
    // XLSX files with formula cells are refused by default (they are not
    // rewritten); flagged instead, their summaries show in `artifacts`.
    let flag = serde_json::json!({"formula_cells": "flag"});
    let r = explode_with("zip_inflate", Parser::Office, flag.clone());
    assert!(incomplete(artifact(&r, "inflate.xlsx")).is_some());
    let r = explode_with("zip_many_small", Parser::Office, flag);
    let many = artifact(&r, "many.xlsx");
    assert!(incomplete(many).is_some(), "{:?}", many.flags);
    let Some(Summary::Xlsx { sheets, partial: true }) = &many.summary else {
        panic!("{:?}", many.summary)
    };
    assert_eq!(sheets.len(), 64);
}

#[test]
fn nested_xml_and_entity_bombs_stay_inert() {
    let r = explode("nested_xml", Parser::Image);
    let why = incomplete(artifact(&r, "nested.svg")).unwrap_or_default();
    assert!(why.contains("deeper than 256"), "{why}");
    let r = explode("billion_laughs", Parser::Image);
    assert_eq!(artifact(&r, "laughs.svg").summary, Some(Summary::Svg { width: None, height: Some(10.0) }));
    let book = artifact(&r, "laughs.xlsx");
    assert!(matches!(book.summary, Some(Summary::Xlsx { .. })), "{:?}", book.summary);
}

#[test]
fn huge_image_dimensions_are_reported_not_decoded() {
    let r = explode("huge_images", Parser::Image);
    let big = (1u32 << 31) - 1;
    assert_eq!(artifact(&r, "huge.png").summary, Some(Summary::Image { width: big, height: big }));
    assert_eq!(artifact(&r, "huge.gif").summary, Some(Summary::Image { width: 65535, height: 65535 }));
    // Its frame header is past the 4 MiB prefix: no size, no decoding.
    assert_eq!(artifact(&r, "huge.jpg").summary, None);
}

#[test]
fn a_99_mib_one_line_csv_is_scanned_in_constant_memory() {
    let r = explode("one_line_csv", Parser::Csv);
    let csv = artifact(&r, "line.csv");
    // Either the scan finished (the first cell is a formula) or it says
    // which budget stopped it (its time, or the run's CPU).
    let formula = csv.flags.iter().any(|f| f.kind == FlagKind::FormulaInjection);
    let stopped = incomplete(csv).is_some_and(|w| w.contains("time budget") || w.contains("judging budget"));
    assert!(formula || stopped, "{:?}", csv.flags);
    if let Some(Summary::Csv { header, .. }) = &csv.summary {
        assert!(header.len() <= 50);
    }
}

#[test]
fn json_arrays_objects_and_nesting_are_summarised_without_a_value_tree() {
    let r = explode("json_array", Parser::Json);
    let length = |p: &str| match &artifact(&r, p).summary {
        Some(Summary::Json { length, .. }) => *length,
        other => panic!("{p}: {other:?}"),
    };
    for (path, n) in [
        ("array.json", 2 * 1048576 - 1),
        ("array-objects.json", (4 * 1048576 - 2) / 8),
        ("array-deep.json", 1),
    ] {
        // A count, or a time budget said to have stopped it.
        let a = artifact(&r, path);
        assert!(length(path) == Some(n) || incomplete(a).is_some(), "{path}: {:?} {:?}", a.summary, a.flags);
    }
    let Some(Summary::Json { keys, .. }) = &artifact(&r, "array-keys.json").summary else { panic!() };
    assert!(keys.len() <= 50);
}

#[test]
fn a_99_mib_html_line_and_text_file_are_scanned_in_constant_memory() {
    let r = explode("text_and_markup", Parser::Markup);
    let html = artifact(&r, "tags.html");
    assert!(html.flags.iter().any(|f| f.kind == FlagKind::Script), "{:?}", html.flags);
    let Some(Summary::Text { lines, .. }) = &artifact(&r, "tags.txt").summary else { panic!() };
    assert!(*lines <= 1);
}
