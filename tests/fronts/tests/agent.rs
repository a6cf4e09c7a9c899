//! End-to-end tests of `jail-agent`: a scripted OpenAI-compatible server on
//! 127.0.0.1 plays the model's turns over real HTTP; the agent, the real
//! `jail` binary and the real rootfs do everything else. Each test checks
//! what the model was told (the request bodies the server received), what
//! the steps left on disk, and that the trace and summary add up.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agent::agent::{self as run, Caps, Config, Outcome, Progress, Stop};
use agent::llm::LlmConfig;
use agent::runner::Runner;
use agent::todo::State;
use agent::trace::{self, Event, Summary};
use agent::view::Budget;
use jail_tests::{agent_bin, cgroups_left_by, data_rootfs, host_mounts_with, is_root, jail_bin, repo, rootfs, skip, skip_unless};
use jail_tests_fronts::mock_llm::{call, text_turn, tool_turn, MockLlm, Turn};
use serde_json::{json, Value};

const SUMMARY_BUG: &str = include_str!("../agent-scripts/summary_bug.py");
const SUMMARY_FIXED: &str = include_str!("../agent-scripts/summary_fixed.py");
const DECK_STDLIB: &str = include_str!("../agent-scripts/deck_stdlib.py");
const DECK_PPTX: &str = include_str!("../agent-scripts/deck_pptx.py");
const OPEN_PPTX: &str = include_str!("../agent-scripts/open_pptx.py");
const NETWORK: &str = include_str!("../agent-scripts/network.py");
const SLEEP: &str = include_str!("../agent-scripts/sleep.py");

/// Host folders for one agent run: the input (the Titanic extract), a parent
/// for session dirs, and a place to export to.
struct Fixture {
    dir: tempfile::TempDir,
    input: PathBuf,
    sessions: PathBuf,
    export: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::Builder::new().prefix("jail-agent-test-").tempdir().expect("tempdir");
    // Root runs map the sandbox to an unprivileged uid that must pass through.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let input = dir.path().join("input");
    let sessions = dir.path().join("sessions");
    std::fs::create_dir(&input).expect("mkdir");
    std::fs::create_dir(&sessions).expect("mkdir");
    std::fs::copy(repo().join("examples/titanic.csv"), input.join("titanic.csv")).expect("copy titanic.csv");
    let export = dir.path().join("export");
    Fixture { dir, input, sessions, export }
}

fn config(f: &Fixture, mock: &MockLlm, rootfs: PathBuf) -> Config {
    Config {
        task: "Analyse the Titanic passengers and prepare a short presentation of the main findings.".into(),
        input: f.input.clone(),
        output: Some(f.export.clone()),
        session_parent: Some(f.sessions.clone()),
        llm: LlmConfig {
            base_url: mock.base_url.clone(),
            model: "scripted".into(),
            api_key: Some("test-key".into()),
            timeout: Duration::from_secs(20),
            max_retries: 2,
            retry_base: Duration::from_millis(1),
            temperature: None,
            max_reply_tokens: None,
        },
        runner: Runner {
            jail: jail_bin(),
            policy: None,
            rootfs: Some(rootfs.clone()),
            timeout: None,
            wall_limit: Duration::from_secs(15),
            stateless: false,
            pool_size: 1,
        },
        rootfs: Some(rootfs),
        skills_dir: None,
        caps: Caps::default(),
        budget: Budget::default(),
        owner: run::owner_for(None).expect("owner"),
        progress: Progress::Quiet,
        trace_content: agent::trace::Content::Recorded,
    }
}

fn plan(items: &[(&str, &[&str])]) -> String {
    let items: Vec<Value> = items
        .iter()
        .map(|(name, outputs)| {
            json!({"name": name, "goal": format!("do {name}"), "skills": ["python-scripts"],
                   "inputs": ["/workspace/input/titanic.csv"], "outputs": outputs,
                   "success_criteria": format!("{name} is done")})
        })
        .collect();
    json!({ "items": items }).to_string()
}

fn write(path: &str, content: &str) -> (&'static str, String) {
    call("write_python_file", json!({"path": path, "content": content}))
}

fn run_file(path: &str) -> (&'static str, String) {
    call("run_python_file", json!({"path": path}))
}

/// The tool messages of one request, in order.
fn tool_messages(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The last tool message of one request.
fn last_tool(request: &Value) -> String {
    tool_messages(request).pop().unwrap_or_default()
}

/// Passengers and survivors by class, counted here from the CSV itself.
fn survival_by_class(csv: &str) -> BTreeMap<String, (u32, u32)> {
    let mut by = BTreeMap::new();
    for line in csv.lines().skip(1) {
        let mut fields = Vec::new();
        let (mut cur, mut quoted) = (String::new(), false);
        for c in line.chars() {
            match c {
                '"' => quoted = !quoted,
                ',' if !quoted => fields.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        fields.push(cur);
        let e = by.entry(fields[2].clone()).or_insert((0, 0));
        e.0 += 1;
        e.1 += fields[1].parse::<u32>().expect("Survived is 0 or 1");
    }
    by
}

/// The trace and the summary agree with each other and with what the
/// server served: every model call traced once, token sums equal, times
/// that add up and never exceed the run's wall time.
fn check_accounting(root: &Path, mock: &MockLlm) -> (Vec<trace::Record>, Summary) {
    check_served(root, mock.served_replies(), mock.served_tokens())
}

/// `check_accounting` against what several servers served in all.
fn check_served(root: &Path, replies: usize, (tin, tout): (u64, u64)) -> (Vec<trace::Record>, Summary) {
    let records = trace::read(&root.join("trace.jsonl")).expect("trace.jsonl");
    let saved: Summary = serde_json::from_str(&std::fs::read_to_string(root.join("summary.json")).expect("summary.json"))
        .expect("summary.json parses");
    let text = std::fs::read_to_string(root.join("summary.txt")).expect("summary.txt");
    let Some(Event::RunEnd { stop, wall_ms, .. }) = records.last().map(|r| r.event.clone()) else {
        panic!("the trace does not end with run_end: {records:?}")
    };
    assert_same_summary(&Summary::from_records(&records, wall_ms, &stop), &saved);

    let model_calls: Vec<_> = records.iter().filter(|r| matches!(r.event, Event::ModelCall { .. })).collect();
    assert_eq!(model_calls.len(), replies, "model calls traced vs replies served");
    assert_eq!((saved.total.tokens_in, saved.total.tokens_out), (tin, tout), "tokens in the summary vs served");
    assert_eq!(saved.total.model_calls as usize, replies);

    let sum = |f: &dyn Fn(&agent::trace::AgentRow) -> f64| saved.by_agent.iter().map(f).sum::<f64>();
    assert_eq!(saved.by_agent.iter().map(|a| a.tokens_in).sum::<u64>(), saved.total.tokens_in);
    assert_eq!(saved.by_agent.iter().map(|a| a.tokens_out).sum::<u64>(), saved.total.tokens_out);
    assert!((sum(&|a| a.model_ms) - saved.total.model_ms).abs() < 1e-6);
    assert!((sum(&|a| a.tool_ms) - saved.total.tool_ms).abs() < 1e-6);
    assert!((saved.by_tool.iter().map(|t| t.tool_ms).sum::<f64>() - saved.total.tool_ms).abs() < 1e-6);
    assert_eq!(saved.by_tool.iter().map(|t| t.calls).sum::<u64>(), saved.total.tool_calls);
    // Every reply's completion tokens are attributed: to its tool calls, or to text.
    assert_eq!(
        saved.by_tool.iter().map(|t| t.tokens_out).sum::<u64>() + saved.text_tokens_out,
        saved.total.tokens_out,
        "tokens per tool add up to the tokens out"
    );
    // Records carry the run id, span ids and absolute times.
    let run_id = &records[0].run_id;
    for r in &records {
        assert_eq!(&r.run_id, run_id);
        assert_eq!((r.run_id.len(), r.span_id.len()), (32, 16), "{r:?}");
        assert!(r.time.len() == 24 && r.time.ends_with('Z') && r.start_unix_ns <= r.end_unix_ns, "{r:?}");
    }
    assert!(
        saved.total.model_ms + saved.total.tool_ms <= saved.run_wall_ms + 1e-6,
        "model {} + tool {} ms exceed the run's {} ms",
        saved.total.model_ms,
        saved.total.tool_ms,
        saved.run_wall_ms
    );
    let mut last = (0, 0.0);
    for r in &records {
        assert!(r.seq > last.0 && r.t_ms >= last.1, "trace out of order at {r:?}");
        last = (r.seq, r.t_ms);
    }
    for a in &saved.by_agent {
        assert!(text.contains(&a.agent), "summary.txt lacks {}", a.agent);
    }
    (records, saved)
}

/// Equal up to float noise from the JSON round trip (serde_json parses long
/// decimals to within an ulp, not always exactly).
fn assert_same_summary(a: &Summary, b: &Summary) {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(1.0);
    let rows = |r: &agent::trace::AgentRow, s: &agent::trace::AgentRow| {
        r.agent == s.agent
            && (r.model_calls, r.tokens_in, r.tokens_out, r.tool_calls)
                == (s.model_calls, s.tokens_in, s.tokens_out, s.tool_calls)
            && close(r.model_ms, s.model_ms)
            && close(r.tool_ms, s.tool_ms)
    };
    let same = a.by_agent.len() == b.by_agent.len()
        && a.by_agent.iter().zip(&b.by_agent).all(|(r, s)| rows(r, s))
        && rows(&a.total, &b.total)
        && a.by_tool.len() == b.by_tool.len()
        && a.by_tool.iter().zip(&b.by_tool).all(|(r, s)| {
            (&r.tool, r.calls, r.errors) == (&s.tool, s.calls, s.errors)
                && close(r.tool_ms, s.tool_ms)
                && close(r.jail_wall_ms, s.jail_wall_ms)
        })
        && close(a.jail_wall_ms, b.jail_wall_ms)
        && close(a.run_wall_ms, b.run_wall_ms)
        && (a.tokens_estimated, &a.stop) == (b.tokens_estimated, &b.stop);
    assert!(same, "summary.json is not the trace's sum:\n{a:?}\n{b:?}");
}

fn zip_text(path: &Path, name: &str) -> String {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut z = zip::ZipArchive::new(f).expect("the deck is a zip archive");
    let mut s = String::new();
    z.by_name(name)
        .unwrap_or_else(|e| panic!("{name} missing from the deck: {e}"))
        .read_to_string(&mut s)
        .expect("read");
    s
}

/// The scripted conversation of the full path: a two-item plan; item 1
/// hits a Python error, fixes it and succeeds; item 2 runs `deck_script`;
/// then the final answer.
fn two_item_turns(deck_script: &str) -> Vec<Turn> {
    vec![
        tool_turn(
            &[(
                "create_todo_list",
                plan(&[
                    ("class-summary", &["/workspace/output/summary.csv"]),
                    ("deck", &["/workspace/output/deck.pptx"]),
                ]),
            )],
            (900, 120),
        ),
        tool_turn(&[call("start_next_todo", json!({}))], (1000, 10)),
        tool_turn(
            &[
                call("read_skill", json!({"name": "eda"})),
                write("summary.py", SUMMARY_BUG),
                run_file("summary.py"),
            ],
            (700, 200),
        ),
        tool_turn(&[write("summary.py", SUMMARY_FIXED), run_file("summary.py")], (1500, 260)),
        tool_turn(&[call("complete_todo", json!({"report": "summary.csv: survival by class"}))], (1900, 30)),
        tool_turn(&[call("start_next_todo", json!({}))], (1200, 10)),
        tool_turn(&[write("deck.py", deck_script), run_file("deck.py")], (800, 900)),
        tool_turn(&[call("complete_todo", json!({"report": "deck.pptx: one slide per class"}))], (1800, 25)),
        text_turn("Survival differed by class; see summary.csv and deck.pptx.", (1400, 40)),
    ]
}

/// The full path: a two-item plan; item 1 writes code, hits a Python error,
/// fixes it and succeeds; item 2 builds a deck; then the final answer.
fn full_run(rootfs: PathBuf, deck_script: &str, step_timeout: Option<f64>, stateless: bool) -> (Fixture, MockLlm, Outcome) {
    let f = fixture();
    let turns = two_item_turns(deck_script);
    let mock = MockLlm::start(turns);
    let mut cfg = config(&f, &mock, rootfs);
    cfg.runner.stateless = stateless;
    if let Some(t) = step_timeout {
        cfg.runner.timeout = Some(t);
        cfg.runner.wall_limit = Duration::from_secs_f64(t);
    }
    let outcome = run::run(&cfg)
        .unwrap_or_else(|e| panic!("run failed: {e}\nthe model saw, request by request:\n{}", requests_seen(&mock)));
    (f, mock, outcome)
}

/// Each request the mock received with the last tool message in it, for a
/// failure message: a run that asked the model once more than scripted
/// shows here which step it was answering.
fn requests_seen(mock: &MockLlm) -> String {
    mock.requests()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let n = r["messages"].as_array().map_or(0, Vec::len);
            format!("  [{i}] {n} messages; last tool message: {}", last_tool(r))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_two_item_plan_goes_from_an_error_through_a_fix_to_a_deck_and_a_final_answer() {
    // One session per item (the default), then one jail per step.
    for stateless in [false, true] {
        two_item_plan(stateless);
    }
}

fn two_item_plan(stateless: bool) {
    let (f, mock, outcome) = full_run(rootfs(), DECK_STDLIB, None, stateless);
    let req = mock.requests();
    assert_eq!(req.len(), 9, "every scripted turn is used once");

    assert_eq!(outcome.stop, Stop::Finished);
    assert_eq!(outcome.answer, "Survival differed by class; see summary.csv and deck.pptx.");
    assert!(outcome.todo.items.iter().all(|i| i.state == State::Done), "{:?}", outcome.todo.items);

    // The request carries the model, the tools and the key.
    assert_eq!(req[0]["model"], "scripted");
    let tools: Vec<&str> = req[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(tools.contains(&"create_todo_list") && !tools.contains(&"run_python_file"), "{tools:?}");
    assert!(
        req[0]["messages"][1]["content"].as_str().unwrap().contains("titanic.csv"),
        "the input files are listed for planning"
    );

    // A sub-agent starts clean: its own system prompt and the item's brief only.
    let sub = req[2]["messages"].as_array().unwrap();
    assert_eq!(sub.len(), 2, "{sub:?}");
    assert!(sub[0]["content"].as_str().unwrap().starts_with("You are a sub-agent"));
    assert!(sub[1]["content"].as_str().unwrap().contains("Your item: class-summary"));
    let sub_tools: Vec<&str> = req[2]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(sub_tools.contains(&"run_python_file") && !sub_tools.contains(&"start_next_todo"));

    // The Python error reaches the model, then the fix's success and its file.
    let tm = tool_messages(&req[3]);
    assert!(tm[0].starts_with("# skill: eda"), "{}", tm[0]);
    let failed = &tm[2];
    assert!(failed.contains("status: nonzero_exit (exit code 1)"), "{failed}");
    assert!(failed.contains("error: NameError: name 'rowz' is not defined"), "{failed}");
    assert!(failed.contains("summary.py\", line 5"), "the traceback tail is there: {failed}");
    let fixed = last_tool(&req[4]);
    assert!(fixed.starts_with("status: ok (exit code 0)"), "{fixed}");
    assert!(fixed.contains("rows 100 survived"), "{fixed}");
    if stateless {
        // The jail's own artifact record: type sniffed, change against the snapshot.
        assert!(fixed.contains("summary.csv (") && fixed.contains("text/csv, created)"), "{fixed}");
    } else {
        // A session's files are judged when it ends: the step says so.
        assert!(fixed.contains("reach the host when the sub-task ends"), "{fixed}");
    }

    // The orchestrator gets the report back as start_next_todo's result.
    let report = last_tool(&req[5]);
    assert!(
        report.contains("item 1 `class-summary` is done") && report.contains("summary.csv: survival by class"),
        "{report}"
    );
    let second = req[6]["messages"].as_array().unwrap();
    assert_eq!(second.len(), 2, "the second sub-agent starts clean too");
    assert!(second[1]["content"]
        .as_str()
        .unwrap()
        .contains("class-summary [Done]: summary.csv: survival by class"));

    // What the steps computed is what the data says.
    let session = &outcome.session;
    let summary = std::fs::read_to_string(session.output.join("summary.csv")).expect("summary.csv");
    let expected = survival_by_class(&std::fs::read_to_string(f.input.join("titanic.csv")).unwrap());
    assert_eq!(summary.lines().next(), Some("Pclass,passengers,survived,rate"));
    for (class, (n, s)) in &expected {
        assert!(summary.lines().any(|l| l.starts_with(&format!("{class},{n},{s},"))), "{class}: {n}/{s} not in\n{summary}");
    }

    // The deck opens: a zip with a presentation, one slide per class plus a title.
    let deck = session.output.join("deck.pptx");
    let pres = zip_text(&deck, "ppt/presentation.xml");
    assert_eq!(pres.matches("<p:sldId ").count(), expected.len() + 1, "{pres}");
    assert!(zip_text(&deck, "[Content_Types].xml").contains("presentationml.presentation.main+xml"));
    let (c1, (n1, s1)) = expected.iter().next().unwrap();
    assert!(zip_text(&deck, "ppt/slides/slide2.xml").contains(&format!("Class {c1}: {s1} of {n1} survived")));
    if stateless {
        assert!(last_tool(&req[7]).contains("deck.pptx ("), "the deck is listed to the model");
    }

    // Delivered: the answer and the files, exported.
    assert_eq!(std::fs::read_to_string(session.root.join("answer.md")).unwrap().trim(), outcome.answer);
    let mut exported = outcome.exported.copied.clone();
    exported.sort();
    assert_eq!(exported, ["deck.pptx", "summary.csv"]);
    assert!(outcome.exported.skipped.is_empty(), "{:?}", outcome.exported.skipped);
    assert!(f.export.join("deck.pptx").is_file());

    let (records, summary) = check_accounting(&session.root, &mock);
    let runs: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::ToolCall { tool, jail: Some(j), ok, .. } if tool == "run_python_file" => {
                Some((j.status.clone(), *ok, j.wall_ms))
            }
            _ => None,
        })
        .collect();
    let statuses: Vec<&str> = runs.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(statuses, ["nonzero_exit", "ok", "ok"]);
    assert!(runs.iter().all(|r| r.2 > 0.0), "every step reports the jail's wall time");
    let agents: Vec<&str> = summary.by_agent.iter().map(|a| a.agent.as_str()).collect();
    assert_eq!(agents, ["orchestrator", "subagent-1", "subagent-2"]);
    let run_tool = summary.by_tool.iter().find(|t| t.tool == "run_python_file").unwrap();
    assert_eq!((run_tool.calls, run_tool.errors), (3, 1));
    assert!(records.iter().any(|r| r.agent == "subagent-1" && r.todo.as_deref() == Some("class-summary")));
}

#[test]
fn with_the_data_rootfs_a_python_pptx_deck_opens_in_python_pptx() {
    let data = data_rootfs();
    if skip_unless(
        data.join("usr/bin/python3").exists(),
        &format!("no data rootfs at {} (build it: make rootfs-data)", data.display()),
    ) {
        return;
    }
    for (name, script) in [("python-pptx", DECK_PPTX), ("zipfile", DECK_STDLIB)] {
        // The data stack imports in a few seconds; leave room on a loaded machine.
        let (_f, mock, outcome) = full_run(data.clone(), script, Some(120.0), false);
        assert_eq!(outcome.stop, Stop::Finished, "{name}:\n{}", requests_seen(&mock));
        assert!(last_tool(&mock.requests()[7]).starts_with("status: ok"), "{name}: {}", last_tool(&mock.requests()[7]));
        let mut sb = jail_tests::Sandbox::new();
        sb.rootfs = data.clone();
        sb.extra_args = vec!["--timeout".into(), "120".into()];
        std::fs::copy(outcome.session.output.join("deck.pptx"), sb.input.join("deck.pptx")).unwrap();
        std::fs::set_permissions(sb.input.join("deck.pptx"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut cmd = sb.command(OPEN_PPTX);
        cmd.args(["--", "/workspace/input/deck.pptx"]);
        let r = jail_tests::parse(&cmd.output().unwrap());
        assert_eq!(r.status, jail_tests::Status::Ok, "{name} deck: {}", r.stderr.text);
        let titles: Vec<String> = serde_json::from_str(r.stdout.text.trim()).unwrap();
        assert_eq!(titles.len(), 4, "{name}: {titles:?}");
        assert_eq!(titles[0], "Titanic: survival by class");
        assert!(titles[1].starts_with("Class 1: "), "{name}: {titles:?}");
    }
}

#[test]
fn a_network_call_blocked_by_the_policy_reaches_the_model_in_plain_words() {
    let f = fixture();
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("download", &[])]))], (100, 20)),
        tool_turn(&[call("start_next_todo", json!({}))], (110, 5)),
        tool_turn(
            &[
                call("list_available_packages", json!({})),
                write("fetch.py", NETWORK),
                run_file("fetch.py"),
            ],
            (120, 60),
        ),
        tool_turn(&[call("block_todo", json!({"reason": "the sandbox has no network"}))], (300, 10)),
        text_turn("The data could not be downloaded: the sandbox has no network.", (200, 15)),
    ];
    let mock = MockLlm::start(turns);
    let outcome = run::run(&config(&f, &mock, rootfs())).unwrap_or_else(|e| panic!("{e}"));
    let req = mock.requests();
    let packages = &tool_messages(&req[3])[0];
    assert!(packages.contains("source: ") && packages.contains("standard library: python3."), "{packages}");
    assert!(
        packages.contains("third-party packages: none"),
        "the minimal rootfs has only the standard library: {packages}"
    );
    let seen = last_tool(&req[3]);
    assert!(seen.contains("status: nonzero_exit"), "{seen}");
    assert!(seen.contains("explanation: network access is disabled in this sandbox"), "{seen}");
    assert!(seen.contains("urlopen error"), "the raw error is kept too: {seen}");
    assert_eq!(outcome.todo.items[0].state, State::Blocked);
    assert_eq!(outcome.todo.items[0].report.as_deref(), Some("the sandbox has no network"));
    assert!(last_tool(&req[4]).contains("item 1 `download` is blocked"));
    check_accounting(&outcome.session.root, &mock);
}

#[test]
fn a_step_past_its_wall_clock_limit_is_killed_and_explained() {
    let f = fixture();
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("slow", &[])]))], (100, 20)),
        tool_turn(&[call("start_next_todo", json!({}))], (110, 5)),
        tool_turn(&[write("slow.py", SLEEP), run_file("slow.py")], (120, 60)),
        tool_turn(&[call("block_todo", json!({"reason": "too slow"}))], (300, 10)),
        text_turn("The step was too slow.", (200, 15)),
    ];
    let mock = MockLlm::start(turns);
    let mut cfg = config(&f, &mock, rootfs());
    cfg.runner.timeout = Some(1.0);
    cfg.runner.wall_limit = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let outcome = run::run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    assert!(started.elapsed() < Duration::from_secs(20), "the run waited for the sleeping script");
    let seen = last_tool(&mock.requests()[3]);
    assert!(seen.starts_with("status: timeout_wall"), "{seen}");
    assert!(seen.contains("explanation: the script ran past its 1 s wall-clock limit and was killed"), "{seen}");
    assert!(seen.contains("starting a long job"), "output before the kill is kept: {seen}");
    let (records, _) = check_accounting(&outcome.session.root, &mock);
    let wall = records
        .iter()
        .find_map(|r| match &r.event {
            Event::ToolCall { jail: Some(j), .. } => Some((j.status.clone(), j.wall_ms)),
            _ => None,
        })
        .unwrap();
    assert_eq!(wall.0, "timeout_wall");
    assert!(wall.1 >= 1000.0 && wall.1 < 5000.0, "killed at its deadline: {} ms", wall.1);
}

#[test]
fn a_sub_agent_at_its_step_cap_is_stopped_and_its_item_blocked() {
    let f = fixture();
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("endless", &[]), ("next", &[])]))], (100, 20)),
        tool_turn(&[call("start_next_todo", json!({}))], (110, 5)),
        tool_turn(&[call("list_input_files", json!({}))], (120, 6)),
        tool_turn(&[call("list_input_files", json!({}))], (130, 6)),
        // The cap is 2: the orchestrator is next, and blocks the second item.
        tool_turn(&[call("block_todo", json!({"item": "next", "reason": "the first failed"}))], (140, 7)),
        text_turn("Nothing could be done.", (150, 8)),
    ];
    let mock = MockLlm::start(turns);
    let mut cfg = config(&f, &mock, rootfs());
    cfg.caps.subagent_steps = 2;
    let outcome = run::run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let req = mock.requests();
    assert_eq!(req.len(), 6);
    assert!(req[4]["messages"][0]["content"].as_str().unwrap().starts_with("You are the orchestrator"));
    let report = last_tool(&req[4]);
    assert!(report.contains("item 1 `endless` is blocked"), "{report}");
    assert!(report.contains("step cap (2 model calls)"), "{report}");
    assert_eq!(outcome.stop, Stop::Finished);
    assert_eq!(outcome.todo.items[1].state, State::Blocked);
    let (records, _) = check_accounting(&outcome.session.root, &mock);
    assert!(records
        .iter()
        .any(|r| matches!(&r.event, Event::AgentEnd { steps: 2, outcome, .. } if outcome.contains("step cap"))));
}

#[test]
fn malformed_and_unknown_tool_calls_get_tool_errors_not_a_crash() {
    let f = fixture();
    let turns = vec![
        tool_turn(
            &[
                ("create_todo_list", "{\"items\": [ {\"name\": ".into()),
                call("delete_everything", json!({})),
            ],
            (100, 20),
        ),
        tool_turn(&[("create_todo_list", plan(&[("one", &[])]))], (110, 20)),
        tool_turn(&[call("start_next_todo", json!({}))], (120, 5)),
        tool_turn(
            &[
                call("write_python_file", json!({"path": "a.py"})),
                call("run_python_file", json!({"path": "../../etc/a.py"})),
                call("read_file_content", json!({"path": "/etc/passwd"})),
                call("start_next_todo", json!({})),
            ],
            (130, 40),
        ),
        tool_turn(&[call("block_todo", json!({"reason": "gave up"}))], (140, 10)),
        text_turn("Done with errors.", (150, 10)),
    ];
    let mock = MockLlm::start(turns);
    let outcome = run::run(&config(&f, &mock, rootfs())).unwrap_or_else(|e| panic!("{e}"));
    let req = mock.requests();
    let first = tool_messages(&req[1]);
    assert!(first[0].starts_with("error: the arguments of create_todo_list are not valid JSON"), "{}", first[0]);
    assert!(first[1].starts_with("error: there is no tool named `delete_everything`"), "{}", first[1]);
    let sub = tool_messages(&req[4]);
    assert!(sub[0].contains("missing field `content`"), "{}", sub[0]);
    assert!(sub[1].contains("only plain relative paths"), "{}", sub[1]);
    assert!(sub[2].contains("outside the sandbox's folders"), "{}", sub[2]);
    assert!(sub[3].contains("no tool named `start_next_todo`"), "a sub-agent cannot delegate: {}", sub[3]);
    assert_eq!(outcome.stop, Stop::Finished);
    let (_, summary) = check_accounting(&outcome.session.root, &mock);
    let errors: u64 = summary.by_tool.iter().map(|t| t.errors).sum();
    assert_eq!(errors, 6, "{:?}", summary.by_tool);
}

#[test]
fn a_model_that_never_calls_tools_gets_a_clear_error() {
    let f = fixture();
    let mock = MockLlm::start(vec![
        text_turn("Sure! Here is my analysis.", (10, 5)),
        text_turn("As I said.", (12, 3)),
    ]);
    let err = run::run(&config(&f, &mock, rootfs())).expect_err("a run without tool calls fails");
    let msg = err.to_string();
    assert!(msg.contains("without calling a tool") && msg.contains("tool calling"), "{msg}");
    let root = err.session.expect("the failed run names its session");
    let records = trace::read(&root.join("trace.jsonl")).unwrap();
    assert!(matches!(&records.last().unwrap().event, Event::RunEnd { stop, .. } if stop.starts_with("error:")));
    check_accounting(&root, &mock);
}

#[test]
fn an_unreachable_endpoint_is_a_clear_one_line_error_from_the_cli() {
    let f = fixture();
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = Command::new(agent_bin())
        .args([
            "run",
            "--quiet",
            "--task",
            "anything",
            "--retries",
            "1",
            "--retry-base-ms",
            "1",
        ])
        .arg("--input")
        .arg(&f.input)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .env("LLM_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
        .env("LLM_MODEL", "m")
        .env_remove("LLM_API_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the model endpoint http://127.0.0.1:{port}/v1/chat/completions"))
            && stderr.contains("check LLM_BASE_URL"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no answer is printed: {}", String::from_utf8_lossy(&out.stdout));

    let no_url = Command::new(agent_bin())
        .args(["run", "--task", "x", "--input"])
        .arg(&f.input)
        .env_remove("LLM_BASE_URL")
        .output()
        .unwrap();
    assert_eq!(no_url.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_url.stderr).contains("set LLM_BASE_URL"));
}

#[test]
fn the_cli_retries_a_rate_limited_endpoint_and_stops_cleanly_at_the_run_cap() {
    let f = fixture();
    let mock = MockLlm::start(vec![
        Turn::Status(429, "{\"error\":{\"message\":\"slow down\"}}".into()),
        Turn::Status(503, "{\"error\":{\"message\":\"overloaded\"}}".into()),
        tool_turn(&[("create_todo_list", plan(&[("a", &[]), ("b", &[])]))], (321, 45)),
    ]);
    let out = Command::new(agent_bin())
        .args([
            "run",
            "--quiet",
            "--task",
            "EDA please",
            "--run-steps",
            "1",
            "--retry-base-ms",
            "1",
        ])
        .arg("--input")
        .arg(&f.input)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .arg("--rootfs")
        .arg(rootfs())
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "exit 3 at a cap\n{stdout}\n{stderr}");
    assert!(stdout.starts_with("The run stopped before it finished: run step cap reached (1 model calls)"), "{stdout}");
    assert!(stdout.contains("1. a [not done]") && stdout.contains("tokens and time by agent"), "{stdout}");
    assert!(stdout.contains("stopped: run step cap reached"), "{stdout}");
    let root = stderr
        .lines()
        .find_map(|l| l.strip_prefix("jail-agent: session ").and_then(|r| r.split(" (").next()))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no session line: {stderr}"));
    let (records, summary) = check_accounting(&root, &mock);
    assert_eq!((summary.total.tokens_in, summary.total.tokens_out), (321, 45));
    assert!(records.iter().any(|r| matches!(r.event, Event::ModelCall { attempts: 3, .. })), "429 and 503 were retried");
    assert_eq!(mock.requests().len(), 3);
    assert!(std::fs::read_to_string(root.join("summary.txt")).unwrap().contains("orchestrator"));
}

#[test]
fn sessions_are_fresh_and_a_root_run_shares_the_output_with_the_sandbox_group() {
    let f = fixture();
    let owner = run::owner_for(None).unwrap();
    let a = agent::session::Session::create(Some(&f.sessions), &f.input, owner).unwrap();
    let b = agent::session::Session::create(Some(&f.sessions), &f.input, owner).unwrap();
    assert_ne!(a.root, b.root);
    assert!(b.list(agent::session::Area::Output).is_empty());
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&a.output).unwrap();
    let uid = if is_root() { 0 } else { jail_tests::sandbox_host_uid() };
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o070),
        (uid, jail_tests::sandbox_host_gid(), if is_root() { 0o070 } else { 0 })
    );
    // The 0644 source keeps its own mode (jail::accept: never widened).
    let input_mode = std::fs::metadata(a.input.join("titanic.csv")).unwrap().mode() & 0o777;
    assert_eq!(input_mode, 0o644);
    if is_root() {
        // A parent the sandbox uid cannot pass through is refused up front.
        let closed = f.dir.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = agent::session::Session::create(Some(&closed), &f.input, owner).unwrap_err().to_string();
        let uid = jail_tests::sandbox_host_uid();
        assert!(e.contains(&format!("is not searchable by the sandbox uid {uid}")) && e.contains("chmod o+x"), "{e}");
    }
}

#[test]
fn the_model_key_never_reaches_a_step_even_when_the_policy_passes_it() {
    let f = fixture();
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("policies/default.json")).unwrap()).unwrap();
    policy["environment"]["pass"] = json!(["LLM_API_KEY", "SERVICE_TOKEN", "VISIBLE_SETTING"]);
    policy.as_object_mut().unwrap().remove("rootfs");
    let policy_file = f.dir.path().join("pass.json");
    std::fs::write(&policy_file, policy.to_string()).unwrap();
    let probe = "import os\nprint({k: os.environ.get(k) for k in ['LLM_API_KEY', 'SERVICE_TOKEN', 'VISIBLE_SETTING']})\n";
    let mock = MockLlm::start(vec![
        tool_turn(&[("create_todo_list", plan(&[("env", &[])]))], (10, 2)),
        tool_turn(&[call("start_next_todo", json!({}))], (10, 2)),
        tool_turn(&[write("env.py", probe), run_file("env.py")], (10, 2)),
        tool_turn(&[call("complete_todo", json!({"report": "checked"}))], (10, 2)),
        text_turn("ok", (10, 2)),
    ]);
    let out = Command::new(agent_bin())
        .args(["run", "--quiet", "--task", "show the environment"])
        .arg("--input")
        .arg(&f.input)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .arg("--rootfs")
        .arg(rootfs())
        .arg("--policy")
        .arg(&policy_file)
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env("LLM_API_KEY", "sk-must-not-leak")
        .env("SERVICE_TOKEN", "tok-must-not-leak")
        .env("VISIBLE_SETTING", "passed-through")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let req = mock.requests();
    assert!(!req[0]["messages"].to_string().contains("sk-must-not-leak"));
    let seen = last_tool(&req[3]);
    // The policy's pass list works (a variable gets through), the secrets do not.
    assert!(seen.contains("'VISIBLE_SETTING': 'passed-through'"), "{seen}");
    assert!(seen.contains("'LLM_API_KEY': None") && seen.contains("'SERVICE_TOKEN': None"), "{seen}");
    assert!(!seen.contains("must-not-leak"), "{seen}");
}

// ------------------------------------------------------------ a hostile model
//
// The model is untrusted too. Each test below plays a model that tries one
// of the findings of issue 16 and checks the host, not the agent's words:
// the files exported, the modes on disk, the bytes on the terminal.

/// A step that leaves what the jail must refuse: names that only look
/// harmless once escaped, a shell payload, a link to a host file, and two
/// sparse 200 MB files that fill the capped output dir when copied back in
/// (so the next step cannot start). Also reads the 0600 input file.
const HOSTILE_OUTPUTS: &str = r#"import os
out = "/workspace/output"
try:
    print("secret:", " ".join(open("/workspace/input/secret.csv").read().split()))
except FileNotFoundError:
    print("secret: not copied")
open(f"{out}/ok.txt", "w").write("the one good file\n")
for name in ["line\nbreak.txt", "esc\x1b[31m.txt", "bidi\u202etxt.md", "payload.sh", "-rf.txt"]:
    open(f"{out}/{name}", "w").write("refused\n")
os.symlink("/etc/passwd", f"{out}/leak.txt")
for n in ("big1.csv", "big2.csv"):
    with open(f"{out}/{n}", "wb") as f:
        f.truncate(200 << 20)
print("left", len(os.listdir(out)), "entries")
"#;

const HELLO: &str = "print('hello')\n";

/// The session dir a CLI run printed on stderr.
fn session_from(stderr: &str) -> PathBuf {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("jail-agent: session ").and_then(|r| r.split(" (").next()))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no session line: {stderr}"))
}

/// `jail-agent run` on the fixture against the mock, progress on stderr.
fn cli(f: &Fixture, mock: &MockLlm, extra: &[&str]) -> std::process::Output {
    Command::new(agent_bin())
        .args(["run", "--task", "analyse the passengers", "--retry-base-ms", "1"])
        .args(extra)
        .arg("--input")
        .arg(&f.input)
        .arg("--output")
        .arg(&f.export)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .arg("--rootfs")
        .arg(rootfs())
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .expect("run jail-agent")
}

/// Bytes that would act on a terminal: ESC and the other C0/C1 controls but
/// newline and tab, and the bidi and invisible characters.
fn terminal_hazards(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n' && c != '\t')
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
        })
        .collect()
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).mode() & 0o7777
}

#[test]
fn a_hostile_model_gets_only_accepted_files_exported_and_cannot_reach_the_terminal_or_flood_the_context() {
    let f = fixture();
    std::fs::write(f.input.join("secret.csv"), "pin\n4242\n").unwrap();
    std::fs::set_permissions(f.input.join("secret.csv"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let clear = "\u{1b}[2J\u{1b}[H";
    let huge = "A".repeat(5 << 20);
    let mut flood: Vec<(&str, String)> = vec![write("w.py", HOSTILE_OUTPUTS), run_file("w.py")];
    flood.extend(std::iter::repeat_n(call("list_input_files", json!({})), 10));
    let turns = vec![
        // 5, 6: a screen-clearing tool name, a 5 MB path, a plan item named with escapes.
        tool_turn(
            &[
                ("create_todo_list", plan(&[(&format!("{clear}all checks passed"), &[])])),
                call(&format!("{clear}all checks passed"), json!({})),
                call("read_file_content", json!({"path": huge})),
            ],
            (100, 20),
        ),
        tool_turn(&[("create_todo_list", plan(&[("exfil", &["/workspace/output/ok.txt"])]))], (110, 20)),
        tool_turn(&[call("start_next_todo", json!({}))], (120, 5)),
        // 4: twelve calls in one reply; 1: refused files in the output.
        tool_turn(&flood, (130, 400)),
        // 1, 8: the next step cannot start; the agent must keep the refusals.
        tool_turn(&[write("hello.py", HELLO), run_file("hello.py")], (140, 30)),
        tool_turn(
            &[call(
                "complete_todo",
                json!({"report": format!("{clear}all checks passed\u{202e}")}),
            )],
            (150, 10),
        ),
        text_turn(&format!("{clear}All checks passed.\u{202e}txt.exe\r{}", "B".repeat(1 << 20)), (160, 40)),
    ];
    let mock = MockLlm::start(turns);
    let out = cli(&f, &mock, &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let root = session_from(&stderr);
    let req = mock.requests();

    // 1: only what the jail accepted leaves, matched on the exact name.
    let mut exported: Vec<String> = walk_names(&f.export);
    exported.sort();
    assert_eq!(exported, ["ok.txt"], "exported: {exported:?}\n{stderr}");
    assert_eq!(std::fs::read_to_string(f.export.join("ok.txt")).unwrap(), "the one good file\n");
    // ... and the refused entries never left the jail: the session's output has none of them.
    assert!(!root.join("output/payload.sh").exists() && !root.join("output/big1.csv").exists());

    // 8: the refused files never reached the output dir (the jail fails
    // closed), so the next step is not kept from starting by them; how a
    // setup failure is explained to the model is view.rs's unit test
    // `a_setup_failure_shows_its_cause_chain_and_the_files_in_the_way`.
    let next = last_tool(&req[5]);
    assert!(next.starts_with("status: ok"), "{next}");

    // 4: eight calls run, the other four are refused and say why.
    let replies = tool_messages(&req[4]);
    assert_eq!(replies.len(), 12);
    // A 0600 input is the caller's to give when the jail runs as the caller;
    // root's is not copied, as a bind would not let the jail's uid read it
    // (jail::accept), and the run says so.
    let secret = if is_root() { "secret: not copied" } else { "secret: pin 4242" };
    assert!(replies[1].contains(secret), "a 0600 input: {}", replies[1]);
    if is_root() {
        assert!(stderr.contains("input/secret.csv (") && stderr.contains("not copied"), "{stderr}");
    }
    for r in &replies[8..] {
        assert!(r.starts_with("error: not run: this reply asked for 12 tool calls and at most 8 are run per reply"), "{r}");
    }
    assert!(!replies[7].starts_with("error"), "{}", replies[7]);

    // 6: the 5 MB path is not echoed; no request grows past what the script sent.
    let first = tool_messages(&req[1]);
    assert!(first[2].len() < 1000, "{} bytes echoed", first[2].len());
    for (i, r) in req.iter().enumerate().skip(1) {
        let own: usize = r["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .map(|m| m.to_string().len())
            .sum();
        let rest = r.to_string().len() - own;
        assert!(rest < 200_000, "request {i} carries {rest} bytes besides the model's own turns");
    }

    // 5: nothing the model chose reaches the terminal or summary.txt raw.
    let summary = std::fs::read_to_string(root.join("summary.txt")).unwrap();
    for (what, text) in [("stdout", &*stdout), ("stderr", &*stderr), ("summary.txt", &summary)] {
        assert_eq!(terminal_hazards(text), Vec::<char>::new(), "{what} carries raw control/bidi characters:\n{text}");
    }
    assert!(stdout.contains("\\x1b[2J\\x1b[HAll checks passed.\\u{202e}txt.exe\\r"), "{stdout}");
    assert!(stdout.len() < 64 << 10, "the answer preview is cut: {} bytes", stdout.len());
    let answer = std::fs::read_to_string(root.join("answer.md")).unwrap();
    assert!(answer.starts_with(clear) && answer.len() > 1 << 20, "answer.md keeps the whole answer");
    assert!(stderr.contains("\\x1b[2J\\x1b[Hall checks passed → error"), "{stderr}");

    // Progress, with stderr not a terminal: plain timestamped lines, a line
    // for the running step (whose jail, here, has nothing to say on stderr).
    let stamped = |l: &str| l.len() > 25 && l.as_bytes()[4] == b'-' && l.as_bytes()[10] == b'T' && l[..25].ends_with("Z ");
    assert!(stderr.lines().any(|l| stamped(l) && l.contains("[orchestrator] waiting for the model (")), "{stderr}");
    assert!(stderr.lines().any(|l| stamped(l) && l.contains("[subagent-1] hello.py: running")), "{stderr}");
    assert!(!stderr.contains('\r'), "no redraws off a terminal");

    // 3: the session is private: its dir, the copied input, the records.
    // As root the sandbox's own group (every uid of its range, no user) may
    // read and search; nobody else gets anything.
    let (private_root, private_dir, secret) = if is_root() { (0o710, 0o750, 0o640) } else { (0o700, 0o700, 0o600) };
    assert_eq!(mode(&root), private_root);
    for d in ["input", "code"] {
        assert_eq!(mode(&root.join(d)), private_dir, "{d}");
    }
    assert_eq!(mode(&root.join("output")) & 0o007, 0, "output is nobody else's");
    if is_root() {
        assert!(!root.join("input/secret.csv").exists(), "root's 0600 input is not copied");
    } else {
        assert_eq!(mode(&root.join("input/secret.csv")), 0o600, "a 0600 input keeps its mode");
    }
    assert_eq!(mode(&root.join("input/titanic.csv")) & 0o022, 0, "no input is group- or world-writable");
    assert_eq!(mode(&root.join("code/w.py")), secret);
    for file in ["trace.jsonl", "summary.txt", "summary.json", "answer.md"] {
        assert_eq!(mode(&root.join(file)), 0o600, "{file}");
    }
    if is_root() {
        // Another local user can neither list the session nor read a file in it.
        for p in [root.clone(), root.join("input/titanic.csv"), root.join("trace.jsonl")] {
            let r = Command::new("runuser").args(["-u", "jailtest", "--", "cat"]).arg(&p).output().unwrap();
            assert!(!r.status.success(), "jailtest read {}", p.display());
            let r = Command::new("runuser").args(["-u", "jailtest", "--", "ls"]).arg(&root).output().unwrap();
            assert!(!r.status.success(), "jailtest listed {}", root.display());
        }
    }
}

/// Every name beneath `dir`, relative, files and links alike.
fn walk_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                stack.push(r);
            } else {
                out.push(r.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// One item that leaves `ok.txt`, then the answer.
fn one_file_turns() -> Vec<Turn> {
    vec![
        tool_turn(&[("create_todo_list", plan(&[("one", &["/workspace/output/ok.txt"])]))], (10, 2)),
        tool_turn(&[call("start_next_todo", json!({}))], (10, 2)),
        tool_turn(
            &[
                write("ok.py", "open('/workspace/output/ok.txt', 'w').write('new')\n"),
                run_file("ok.py"),
            ],
            (10, 2),
        ),
        tool_turn(&[call("complete_todo", json!({"report": "wrote ok.txt"}))], (10, 2)),
        text_turn("done", (10, 2)),
    ]
}

#[test]
fn an_export_never_writes_through_a_link_already_in_the_destination() {
    let f = fixture();
    let victim = f.dir.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::create_dir(&f.export).unwrap();
    std::os::unix::fs::symlink(&victim, f.export.join("ok.txt")).unwrap();
    let mock = MockLlm::start(one_file_turns());
    let out = cli(&f, &mock, &["--quiet"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "the export failed: {stderr}");
    assert!(
        stderr.contains(&format!("{} in the destination is a symbolic link", f.export.join("ok.txt").display())),
        "the error names the link: {stderr}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n", "the file outside was not touched");
    assert!(std::fs::symlink_metadata(f.export.join("ok.txt")).unwrap().file_type().is_symlink());
}

#[test]
fn the_run_deadline_stops_a_run_and_bounds_the_step_running_at_it() {
    let f = fixture();
    let mock = MockLlm::start(vec![
        tool_turn(&[("create_todo_list", plan(&[("slow", &[])]))], (10, 2)),
        tool_turn(&[call("start_next_todo", json!({}))], (10, 2)),
        tool_turn(&[write("slow.py", SLEEP), run_file("slow.py"), run_file("slow.py")], (10, 2)),
    ]);
    let started = std::time::Instant::now();
    let out = cli(&f, &mock, &["--quiet", "--deadline", "4s"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(12), "the deadline did not bound the run: {:?}", started.elapsed());
    assert_eq!(out.status.code(), Some(3), "exit 3 at the deadline\n{stdout}\n{stderr}");
    assert!(stdout.starts_with("The run stopped before it finished: run deadline reached (4 s)"), "{stdout}");
    let root = session_from(&stderr);
    let records = trace::read(&root.join("trace.jsonl")).unwrap();
    let runs: Vec<(bool, Option<String>)> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::ToolCall { tool, ok, error, jail, .. } if tool == "run_python_file" => {
                Some((*ok, jail.as_ref().map(|j| j.status.clone()).or(error.clone())))
            }
            _ => None,
        })
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0].1.as_deref(), Some("timeout_wall"), "the step is cut at the deadline: {runs:?}");
    assert!(runs[1].1.as_deref().unwrap_or("").contains("deadline"), "the second is not run: {runs:?}");
}

// ------------------------------------------------------------ resilience

/// A plan of two items, each leaving one file.
fn two_files_plan() -> Turn {
    tool_turn(
        &[(
            "create_todo_list",
            plan(&[
                ("first", &["/workspace/output/a.txt"]),
                ("second", &["/workspace/output/b.txt"]),
            ]),
        )],
        (100, 30),
    )
}

fn writes(name: &str) -> String {
    format!("open('/workspace/output/{name}', 'w').write('{name}')\nprint('wrote {name}')\n")
}

/// The turns after the first item's step: finish it, do the second, answer.
fn rest_of_two_files() -> Vec<Turn> {
    vec![
        tool_turn(&[call("complete_todo", json!({"report": "a.txt written"}))], (300, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (400, 5)),
        tool_turn(&[write("b.py", &writes("b.txt")), run_file("b.py")], (500, 60)),
        tool_turn(&[call("complete_todo", json!({"report": "b.txt written"}))], (600, 10)),
        text_turn("Both files are written.", (700, 20)),
    ]
}

fn resume_cli(root: &Path, mock: &MockLlm) -> std::process::Output {
    Command::new(agent_bin())
        .args(["resume", "--quiet", "--retry-base-ms", "1"])
        .arg(root)
        .env("LLM_BASE_URL", &mock.base_url)
        .env_remove("LLM_MODEL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .expect("run jail-agent resume")
}

/// The todo list saved in a session's state.
fn saved_todo(root: &Path) -> Vec<(String, String)> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(root.join("state.json")).unwrap()).unwrap();
    v["todo"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap().into(), i["state"].as_str().unwrap().into()))
        .collect()
}

/// An HTTP date `secs` seconds from now (IMF-fixdate).
fn http_date_in(secs: u64) -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + secs;
    let (days, rem) = ((t / 86_400) as i64, t % 86_400);
    let (y, m, d) = agent::trace::civil_from_days(days);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][m as usize - 1];
    format!("{wd}, {d:02} {mon} {y} {:02}:{:02}:{:02} GMT", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[test]
fn garbage_replies_are_retried_and_a_run_whose_retries_ran_out_resumes_where_it_stopped() {
    let f = fixture();
    let html = Turn::Raw {
        status: 200,
        content_type: "text/html",
        body: "<html><body>502 Bad Gateway</body></html>".into(),
    };
    let empty = Turn::Raw {
        status: 200,
        content_type: "application/json",
        body: r#"{"id":"x","choices":[]}"#.into(),
    };
    let garbage = Turn::Raw { status: 200, content_type: "application/json", body: "".into() };
    let first = MockLlm::start(vec![
        html.clone(),
        empty.clone(),
        Turn::RetryAfter(http_date_in(2)),
        two_files_plan(),
        tool_turn(&[call("start_next_todo", json!({}))], (110, 5)),
        tool_turn(&[write("a.py", &writes("a.txt")), run_file("a.py")], (200, 60)),
        // The endpoint breaks for good: the run stops, its state saved.
        garbage.clone(),
        html,
        empty,
        garbage,
    ]);
    let out = cli(&f, &first, &["--quiet", "--retries", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not a chat completion") && stderr.contains("gave up after 4 attempts"), "{stderr}");
    let root = PathBuf::from(
        stderr
            .lines()
            .find_map(|l| l.strip_prefix("jail-agent: the trace and summary are in "))
            .unwrap_or_else(|| panic!("{stderr}")),
    );
    assert!(stderr.contains(&format!("continue it with `jail-agent resume {}`", root.display())), "{stderr}");
    let times = first.request_times();
    assert!(
        times[3] - times[2] >= Duration::from_millis(900),
        "the HTTP-date Retry-After was waited for: {:?}",
        times[3] - times[2]
    );
    let records = trace::read(&root.join("trace.jsonl")).unwrap();
    assert!(
        matches!(records[0].event, Event::ModelCall { attempts: 4, .. }),
        "html, empty and 503 were retried: {:?}",
        records[0]
    );
    assert_eq!(saved_todo(&root), [("first".into(), "in_progress".into()), ("second".into(), "pending".into())]);

    let second = MockLlm::start(rest_of_two_files());
    let out = resume_cli(&root, &second);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("Both files are written."), "{stdout}");
    // The sub-agent goes on with its own conversation, the step's result in it.
    let req = second.requests();
    let msgs = req[0]["messages"].as_array().unwrap();
    assert!(msgs[0]["content"].as_str().unwrap().starts_with("You are a sub-agent"), "{:?}", msgs[0]);
    assert!(last_tool(&req[0]).contains("wrote a.txt"), "{}", last_tool(&req[0]));
    assert_eq!(req[0]["model"], "scripted", "the model is the run's");
    assert_eq!(saved_todo(&root), [("first".into(), "done".into()), ("second".into(), "done".into())]);
    let mut exported = walk_names(&f.export);
    exported.sort();
    assert_eq!(exported, ["a.txt", "b.txt"]);
    let (tin1, tout1) = first.served_tokens();
    let (tin2, tout2) = second.served_tokens();
    check_served(&root, first.served_replies() + second.served_replies(), (tin1 + tin2, tout1 + tout2));
    let again = resume_cli(&root, &second);
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already finished"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[test]
fn a_killed_run_resumes_and_finishes_with_the_same_todo_list() {
    let f = fixture();
    let first = MockLlm::start(vec![
        two_files_plan(),
        tool_turn(&[call("start_next_todo", json!({}))], (110, 5)),
        tool_turn(&[write("a.py", &writes("a.txt")), run_file("a.py")], (200, 60)),
        Turn::Hang,
    ]);
    let mut child = Command::new(agent_bin())
        .args(["run", "--quiet", "--task", "write two files"])
        .arg("--input")
        .arg(&f.input)
        .arg("--output")
        .arg(&f.export)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .arg("--rootfs")
        .arg(rootfs())
        .env("LLM_BASE_URL", &first.base_url)
        .env("LLM_MODEL", "scripted")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while first.requests().len() < 4 {
        assert!(started.elapsed() < Duration::from_secs(30), "the agent never reached its fourth model call");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Killed while it waits for the model, mid sub-agent.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let roots: Vec<PathBuf> = std::fs::read_dir(&f.sessions).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(roots.len(), 1);
    let root = &roots[0];
    let planned = saved_todo(root);
    assert_eq!(planned, [("first".into(), "in_progress".into()), ("second".into(), "pending".into())]);

    let second = MockLlm::start(rest_of_two_files());
    let out = resume_cli(root, &second);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let done = saved_todo(root);
    let names = |v: &[(String, String)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&done), names(&planned), "the same todo list");
    assert!(done.iter().all(|(_, s)| s == "done"), "{done:?}");
    let req = second.requests();
    assert!(last_tool(&req[0]).contains("wrote a.txt"), "the sub-agent's messages were kept: {}", last_tool(&req[0]));
    assert_eq!(std::fs::read_to_string(f.export.join("b.txt")).unwrap(), "b.txt");
    let (tin1, tout1) = first.served_tokens();
    let (tin2, tout2) = second.served_tokens();
    check_served(root, first.served_replies() + second.served_replies(), (tin1 + tin2, tout1 + tout2));
}

// ------------------------------------------------------------ progress

#[test]
fn on_a_terminal_a_status_line_shows_the_wait_for_the_model_and_the_running_step() {
    let f = fixture();
    let slow_step = "import time\ntime.sleep(2.5)\nprint('slept')\n";
    let mock = MockLlm::start(vec![
        Turn::Slow(Duration::from_millis(2500), Box::new(tool_turn(&[("create_todo_list", plan(&[("wait", &[])]))], (1234, 20)))),
        tool_turn(&[call("start_next_todo", json!({}))], (110, 5)),
        tool_turn(&[write("nap.py", slow_step), run_file("nap.py")], (120, 30)),
        tool_turn(&[call("complete_todo", json!({"report": "slept"}))], (130, 10)),
        text_turn("Slept well.", (140, 10)),
    ]);
    let word = |p: &Path| format!("'{}'", p.display());
    let cmd = format!(
        "{} run --task wait --input {} --session-dir {} --jail {} --rootfs {}",
        word(&agent_bin()),
        word(&f.input),
        word(&f.sessions),
        word(&jail_bin()),
        word(&rootfs())
    );
    // script(1) gives the agent a pseudo-terminal and copies what it shows.
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script(1)");
    let screen = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(screen.contains("\r\u{1b}[2K[orchestrator] waiting for the model: 2 s, 0 tokens so far"), "{screen:?}");
    assert!(
        screen.contains("\r\u{1b}[2K[subagent-1] waiting for the model: 0 s, 1369 tokens so far"),
        "tokens so far grow: {screen:?}"
    );
    assert!(screen.contains("\r\u{1b}[2K[subagent-1] nap.py: running, 2 s"), "{screen:?}");
    assert!(screen.contains("Slept well."), "{screen:?}");
}

// ------------------------------------------------------------ OpenTelemetry

/// A minimal OTLP/HTTP receiver: decodes each ExportTraceServiceRequest with
/// the opentelemetry-proto package and writes one JSON line per span. Prints
/// its port; stops after two minutes.
const OTLP_RECEIVER: &str = r#"
import gzip, json, sys, threading, http.server
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
out = open(sys.argv[1], "a")
def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        req = ts.ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            res = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.write(json.dumps({
                        "path": self.path, "content_type": self.headers.get("Content-Type"),
                        "resource": res, "scope": ss.scope.name, "name": s.name, "kind": s.kind,
                        "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                        "start": s.start_time_unix_nano, "end": s.end_time_unix_nano, "status": s.status.code,
                        "attributes": {a.key: value(a.value) for a in s.attributes}}) + "\n")
        out.flush()
        reply = ts.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
threading.Timer(120, srv.shutdown).start()
srv.serve_forever()
"#;

/// The receiver's python: JAIL_OTEL_PYTHON, else where agent/otel-test-setup.sh puts it.
fn otel_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("JAIL_OTEL_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let mut candidates = vec![PathBuf::from("/var/cache/jail-agent/otel-venv/bin/python")];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/jail-agent/otel-venv/bin/python"));
    }
    candidates.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import opentelemetry.proto.collector.trace.v1.trace_service_pb2"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// A running receiver, killed when dropped.
struct Receiver {
    child: std::process::Child,
    spans: PathBuf,
    port: u16,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_receiver(python: &Path, dir: &Path) -> Receiver {
    use std::io::BufRead;
    let spans = dir.join("spans.jsonl");
    let mut child = Command::new(python)
        .args(["-c", OTLP_RECEIVER])
        .arg(&spans)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the OTLP receiver");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().parse().unwrap_or_else(|_| panic!("the receiver printed no port: {line:?}"));
    Receiver { child, spans, port }
}

#[test]
fn spans_reach_a_real_otlp_receiver_as_a_genai_tree_whose_tokens_add_up() {
    let Some(python) = otel_python() else {
        skip("no python with opentelemetry-proto: run agent/otel-test-setup.sh (make test does)");
        return;
    };
    let f = fixture();
    let rx = start_receiver(&python, f.dir.path());
    let turns = two_item_turns(DECK_STDLIB);
    let mock = MockLlm::start(turns);
    let out = Command::new(agent_bin())
        .args([
            "run",
            "--quiet",
            "--task",
            "Analyse the Titanic passengers and prepare a short presentation.",
        ])
        .arg("--input")
        .arg(&f.input)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .arg("--rootfs")
        .arg(rootfs())
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{}", rx.port))
        .env("OTEL_SERVICE_NAME", "jail-agent-test")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("OTLP export"), "{stderr}");
    let root = session_from(&stderr);
    let spans: Vec<Value> = std::fs::read_to_string(&rx.spans)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let records = trace::read(&root.join("trace.jsonl")).unwrap();
    assert_eq!(spans.len(), records.len(), "one span per trace record");
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let a = |v: &Value, k: &str| v["attributes"][k].clone();
    // Sent as OTLP/HTTP protobuf to /v1/traces, with our service name.
    assert!(spans
        .iter()
        .all(|v| s(v, "path") == "/v1/traces" && s(v, "content_type") == "application/x-protobuf"));
    assert_eq!(spans[0]["resource"]["service.name"], "jail-agent-test");
    // One trace, the run's; the ids are the JSONL's.
    assert!(spans.iter().all(|v| s(v, "trace_id") == records[0].run_id));
    let mut ids: Vec<String> = spans.iter().map(|v| s(v, "span_id")).collect();
    let mut rec_ids: Vec<String> = records.iter().map(|r| r.span_id.clone()).collect();
    ids.sort();
    rec_ids.sort();
    assert_eq!(ids, rec_ids);

    let by_id: BTreeMap<String, &Value> = spans.iter().map(|v| (s(v, "span_id"), v)).collect();
    let parent_name = |v: &Value| by_id.get(&s(v, "parent")).map(|p| s(p, "name"));
    let roots: Vec<&Value> = spans.iter().filter(|v| s(v, "parent").is_empty()).collect();
    assert_eq!(roots.len(), 1);
    assert_eq!(s(roots[0], "name"), "invoke_agent orchestrator");
    for v in &spans {
        let op = a(v, "gen_ai.operation.name");
        let name = s(v, "name");
        match op.as_str().unwrap_or_default() {
            // The run's warm pool and each sub-task's session stop: not
            // GenAI operations, so no operation name, but spans of the run.
            "" if name == "jail_session_stop" => {
                assert!(parent_name(v).unwrap().starts_with("invoke_agent subagent-"), "{v}");
                assert!(a(v, "jail.session.accepted").as_i64().is_some() && a(v, "jail.rejected_artifacts").is_array(), "{v}");
            }
            "" => {
                assert_eq!(name, "jail_pool", "{v}");
                assert_eq!(parent_name(v).as_deref(), Some("invoke_agent orchestrator"), "{v}");
                assert!(a(v, "jail.pool.state").is_string(), "{v}");
            }
            "chat" => {
                assert_eq!(name, "chat scripted");
                assert_eq!(v["kind"], 3, "chat is a CLIENT span");
                assert_eq!(a(v, "gen_ai.request.model"), "scripted");
                assert!(parent_name(v).unwrap().starts_with("invoke_agent "), "{v}");
            }
            "execute_tool" => {
                assert_eq!(name, format!("execute_tool {}", a(v, "gen_ai.tool.name").as_str().unwrap()));
                assert!(a(v, "gen_ai.tool.call.id").as_str().unwrap().starts_with("call_"), "{v}");
                assert!(parent_name(v).unwrap().starts_with("invoke_agent "), "{v}");
            }
            "invoke_agent" if name.starts_with("invoke_agent subagent-") => {
                assert_eq!(
                    parent_name(v).as_deref(),
                    Some("execute_tool start_next_todo"),
                    "a sub-agent hangs below the call that started it"
                );
            }
            "invoke_agent" => assert_eq!(name, "invoke_agent orchestrator"),
            other => panic!("unexpected operation {other}"),
        }
        assert!(v["start"].as_u64().unwrap() <= v["end"].as_u64().unwrap());
    }
    // One session stop per sub-task, each its own span.
    let stops = spans.iter().filter(|v| s(v, "name") == "jail_session_stop").count();
    assert_eq!(stops, 2, "a jail_session_stop span per sub-task");
    // Tokens: the chat spans add up to what the server served.
    let chats: Vec<&Value> = spans.iter().filter(|v| a(v, "gen_ai.operation.name") == "chat").collect();
    // The pool started with the run: its span begins before the first chat.
    let pool = spans.iter().find(|v| s(v, "name") == "jail_pool").unwrap();
    let first_chat = chats.iter().map(|v| v["start"].as_u64().unwrap()).min().unwrap();
    assert!(pool["start"].as_u64().unwrap() <= first_chat, "the pool's span starts with the run: {pool}");
    assert_eq!(chats.len(), mock.served_replies());
    let sum = |k: &str| chats.iter().map(|v| a(v, k).as_i64().unwrap() as u64).sum::<u64>();
    assert_eq!((sum("gen_ai.usage.input_tokens"), sum("gen_ai.usage.output_tokens")), mock.served_tokens());
    // ... and the per-tool shares plus the text reply add up to the tokens out.
    let shares: u64 = spans.iter().filter_map(|v| a(v, "jail_agent.tool.tokens_out").as_i64()).map(|n| n as u64).sum();
    assert_eq!(shares + 40, mock.served_tokens().1, "tool shares + the final text reply's 40");
    // The jail's facts are on the run_python_file spans.
    let runs: Vec<&Value> = spans.iter().filter(|v| a(v, "gen_ai.tool.name") == "run_python_file").collect();
    let statuses: Vec<String> = runs.iter().map(|v| a(v, "jail.status").as_str().unwrap().to_string()).collect();
    assert_eq!(statuses, ["nonzero_exit", "ok", "ok"]);
    assert!(runs
        .iter()
        .all(|v| a(v, "jail.usage.wall_ms").as_f64().is_some() && a(v, "jail.denials").is_array()));
    assert_eq!(runs[0]["status"], 2, "a failed step is an error span");
    // Prompts and completions are there (no --no-trace-content).
    assert!(a(chats[0], "gen_ai.input.messages").as_str().unwrap().contains("You are the orchestrator"));
    assert!(a(chats[0], "gen_ai.output.messages").as_str().unwrap().contains("create_todo_list"));

    // The tree, for the eye: `cargo test ... -- --nocapture`.
    fn show(id: &str, depth: usize, spans: &[Value], out: &mut String) {
        for v in spans.iter().filter(|v| v["parent"].as_str() == Some(id)) {
            let at = &v["attributes"];
            let mut facts = Vec::new();
            for k in [
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "jail_agent.agent.input_tokens",
                "jail_agent.agent.output_tokens",
                "gen_ai.tool.call.id",
                "jail_agent.tool.tokens_out",
                "jail.status",
                "jail.artifacts",
                "jail.claim_ms",
                "jail.session.accepted",
            ] {
                if !at[k].is_null() {
                    facts.push(format!("{k}={}", at[k]));
                }
            }
            out.push_str(&format!("{}{} [{}]\n", "  ".repeat(depth), v["name"].as_str().unwrap(), facts.join(" ")));
            show(v["span_id"].as_str().unwrap(), depth + 1, spans, out);
        }
    }
    let mut tree = String::new();
    show("", 0, &spans, &mut tree);
    eprintln!("{tree}");
}

#[test]
fn with_no_trace_content_the_trace_keeps_no_prompt_completion_or_tool_text() {
    let secret = "pin-4242-in-the-task";
    let trace_of = |extra: &[&str]| {
        let f = fixture();
        let mock = MockLlm::start(one_file_turns());
        let out = Command::new(agent_bin())
            .args(["run", "--quiet", "--task", secret])
            .args(extra)
            .arg("--input")
            .arg(&f.input)
            .arg("--session-dir")
            .arg(&f.sessions)
            .arg("--jail")
            .arg(jail_bin())
            .arg("--rootfs")
            .arg(rootfs())
            .env("LLM_BASE_URL", &mock.base_url)
            .env("LLM_MODEL", "scripted")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        std::fs::read_to_string(session_from(&stderr).join("trace.jsonl")).unwrap()
    };
    let text = trace_of(&["--no-trace-content"]);
    assert!(!text.contains(secret) && !text.contains("input_messages") && !text.contains("\"arguments\""), "{text}");
    assert!(text.contains("\"tokens_out\""), "the accounting stays");
    // With content (the default), the same run keeps the prompt and the tool text.
    let text = trace_of(&[]);
    assert!(text.contains(secret) && text.contains("input_messages") && text.contains("\"arguments\""), "{text}");
}

// ------------------------------------------------------------ sessions

/// A one-item plan whose sub-agent runs `steps` (name, script) in order,
/// then completes the item; `n.txt` is its declared output.
fn session_turns(steps: &[(&str, &str)]) -> Vec<Turn> {
    let mut turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("count", &["/workspace/output/n.txt"])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
    ];
    for (name, script) in steps {
        turns.push(tool_turn(&[write(name, script), run_file(name)], (100, 20)));
    }
    turns.push(tool_turn(&[call("complete_todo", json!({"report": "counted"}))], (100, 5)));
    turns.push(text_turn("101 rows.", (100, 5)));
    turns
}

const LOAD: &str = "rows = open('/workspace/input/titanic.csv').read().splitlines()\nprint('loaded', len(rows))\n";
const USE: &str = "print('rows', len(rows))\nopen('/workspace/output/n.txt', 'w').write(str(len(rows)))\n";

/// Processes whose command line or environment names `root` (a session
/// supervisor of this run is `jail session start … --input ROOT/input`, or
/// `ROOT/pool/jail-pool-…/slot-…/in` from the run's pool, whose TMPDIR is
/// `ROOT/pool`), after giving a stopped session up to 5 s to be gone.
fn processes_naming(root: &Path) -> Vec<String> {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let found = naming_now(root);
        if found.is_empty() || std::time::Instant::now() >= until {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn naming_now(root: &Path) -> Vec<String> {
    processes_marked(&root.to_string_lossy())
        .into_iter()
        .map(|(pid, cmd)| format!("{pid}: {cmd}"))
        .collect()
}

#[test]
fn a_variable_from_step_one_is_there_in_step_two_with_sessions_and_not_with_stateless() {
    for stateless in [false, true] {
        let f = fixture();
        let mock = MockLlm::start(session_turns(&[("load.py", LOAD), ("use.py", USE)]));
        let mut cfg = config(&f, &mock, rootfs());
        cfg.runner.stateless = stateless;
        let out = run::run(&cfg);
        let req = mock.requests();
        let seen = requests_seen(&mock);
        // The request after `use.py` ran carries its result.
        let step2 = tool_messages(&req[4]).pop().unwrap_or_default();
        let tools = &req[2]["tools"];
        let description = tools
            .as_array()
            .and_then(|t| t.iter().find(|t| t["function"]["name"] == "run_python_file"))
            .map(|t| t["function"]["description"].to_string())
            .unwrap_or_default();
        if stateless {
            assert!(step2.contains("NameError"), "stateless: step 2 must not see step 1's rows:\n{step2}\n{seen}");
            assert!(description.contains("fresh sandbox"), "{description}");
            assert!(!f.export.join("n.txt").exists());
            drop(out);
        } else {
            let out = out.unwrap_or_else(|e| panic!("run failed: {e}\n{seen}"));
            assert!(step2.contains("status: ok") && step2.contains("rows 101"), "session: step 2 reuses rows:\n{step2}\n{seen}");
            assert!(step2.contains("variables stay defined"), "{step2}");
            assert!(description.contains("State persists within the sub-task"), "{description}");
            assert!(out.todo.items.iter().all(|i| i.state == State::Done), "{:?}", out.todo.items);
            assert_eq!(
                std::fs::read_to_string(f.export.join("n.txt")).unwrap(),
                "101",
                "delivered at the sub-task's end and exported"
            );
            assert!(processes_naming(&out.session.root).is_empty(), "{:?}", processes_naming(&out.session.root));
        }
    }
}

#[test]
fn a_killed_interpreter_mid_sub_task_is_reported_and_the_next_step_starts_afresh() {
    let f = fixture();
    let die = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n";
    let mock = MockLlm::start(session_turns(&[
        ("load.py", LOAD),
        ("die.py", die),
        ("use.py", USE),
        ("reload.py", LOAD),
        ("use2.py", USE),
    ]));
    let cfg = config(&f, &mock, rootfs());
    let out = run::run(&cfg).unwrap_or_else(|e| panic!("run failed: {e}\n{}", requests_seen(&mock)));
    let req = mock.requests();
    let died = tool_messages(&req[4]).pop().unwrap_or_default();
    assert!(died.contains("session ENDED") && died.contains("load the data again"), "{died}");
    let after = tool_messages(&req[5]).pop().unwrap_or_default();
    assert!(after.contains("NameError") && after.contains("fresh session started"), "{after}");
    let recovered = tool_messages(&req[7]).pop().unwrap_or_default();
    assert!(recovered.contains("status: ok") && recovered.contains("rows 101"), "{recovered}");
    assert_eq!(std::fs::read_to_string(f.export.join("n.txt")).unwrap(), "101");
    assert!(processes_naming(&out.session.root).is_empty(), "{:?}", processes_naming(&out.session.root));
}

/// The CLI on `turns` until it exits (or is sent `signal` once the step
/// running in the session is under way); returns the exit status and the
/// run's session dir (the fixture is returned to be dropped after the checks).
fn cli_session_run(turns: Vec<Turn>, signal: Option<nix::sys::signal::Signal>) -> (Option<i32>, PathBuf, String, Fixture) {
    let f = fixture();
    let mock = MockLlm::start(turns);
    let child = Command::new(agent_bin())
        .args(["run", "--task", "count", "--retry-base-ms", "1", "--retries", "1"])
        .arg("--input")
        .arg(&f.input)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .arg("--rootfs")
        .arg(rootfs())
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn jail-agent");
    if let Some(sig) = signal {
        let started = std::time::Instant::now();
        // The fourth request comes after the first step ran in the session.
        while mock.requests().len() < 4 {
            assert!(started.elapsed() < Duration::from_secs(60), "the agent never ran its first step");
            std::thread::sleep(Duration::from_millis(50));
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
    }
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let roots: Vec<PathBuf> = std::fs::read_dir(&f.sessions).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(roots.len(), 1, "{stderr}");
    (out.status.code(), roots[0].clone(), stderr, f)
}

#[test]
fn no_session_process_outlives_the_agent_on_a_normal_exit_an_error_or_sigint() {
    // Normal exit.
    let (code, root, stderr, _f) = cli_session_run(session_turns(&[("load.py", LOAD), ("use.py", USE)]), None);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(processes_naming(&root).is_empty(), "normal exit: {:?}", processes_naming(&root));
    // An error mid sub-task: the endpoint fails for good after one step.
    let mut turns = session_turns(&[("load.py", LOAD)]);
    turns.truncate(3);
    turns.extend((0..4).map(|_| Turn::Status(500, "down".into())));
    let (code, root, stderr, _f) = cli_session_run(turns, None);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("session ended"), "the sub-task's session was stopped: {stderr}");
    assert!(processes_naming(&root).is_empty(), "error: {:?}", processes_naming(&root));
    // SIGINT while the model is thinking, a session live.
    let mut turns = session_turns(&[("load.py", LOAD)]);
    turns.truncate(3);
    turns.push(Turn::Hang);
    let (code, root, stderr, _f) = cli_session_run(turns, Some(nix::sys::signal::Signal::SIGINT));
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("SIGINT: stopping"), "{stderr}");
    assert!(processes_naming(&root).is_empty(), "SIGINT: {:?}", processes_naming(&root));
}

// ------------------------------------------------------------ warm pool

/// A two-item plan: item 1 loads the rows in one step and writes n.txt
/// from them in the next (state within a sub-task); item 2 checks that
/// none of item 1's names is defined and reads n.txt back from the output
/// folder (the output carries, the state does not).
fn two_sessions_turns() -> Vec<Turn> {
    let fresh = "print('rows defined:', 'rows' in globals())\nprint('n.txt holds', open('/workspace/output/n.txt').read())\nopen('/workspace/output/m.txt', 'w').write('second')\n";
    vec![
        tool_turn(
            &[(
                "create_todo_list",
                plan(&[
                    ("count", &["/workspace/output/n.txt"]),
                    ("again", &["/workspace/output/m.txt"]),
                ]),
            )],
            (100, 10),
        ),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[write("load.py", LOAD), run_file("load.py")], (100, 20)),
        tool_turn(&[write("use.py", USE), run_file("use.py")], (100, 20)),
        tool_turn(&[call("complete_todo", json!({"report": "counted"}))], (100, 5)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[write("again.py", fresh), run_file("again.py")], (100, 20)),
        tool_turn(&[call("complete_todo", json!({"report": "read it back"}))], (100, 5)),
        text_turn("101 rows.", (100, 5)),
    ]
}

/// What a CLI run under a pool left running or saw: the agent's exit
/// status, its session dir, its stderr, and every process seen while it
/// ran whose command line or environment names the fixture (the pool, its
/// janitor, its jails' session supervisors, `jail session` clients).
struct PoolRun {
    code: Option<i32>,
    root: PathBuf,
    stderr: String,
    seen: Vec<(u32, String)>,
    f: Fixture,
}

/// `/proc/PID/cmdline` and `environ`, NULs as spaces (environ only where
/// this uid may read it: the agent's own processes).
fn cmdline_and_environ(pid: u32) -> Option<(String, String)> {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let text = |b: &[u8]| String::from_utf8_lossy(b).replace('\0', " ");
    Some((text(&cmd), text(&env)))
}

/// Processes (not zombies) whose command line or environment holds `marker`.
fn processes_marked(marker: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Some((cmd, env)) = cmdline_and_environ(pid) else { continue };
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ");
        if !zombie && (cmd.contains(marker) || env.contains(marker)) {
            found.push((pid, cmd));
        }
    }
    found
}

/// The CLI on `turns` with `extra` flags, its TMPDIR and XDG_RUNTIME_DIR in
/// the fixture, until it exits — or is sent `signal` once its first step
/// ran in a session (the fourth model request).
fn cli_pool_run(turns: Vec<Turn>, extra: &[&str], signal: Option<nix::sys::signal::Signal>) -> PoolRun {
    let f = fixture();
    let (tmp, run_dir) = (f.dir.path().join("tmp"), f.dir.path().join("run"));
    std::fs::create_dir(&tmp).unwrap();
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mock = MockLlm::start(turns);
    let child = Command::new(agent_bin())
        .args(["run", "--task", "count", "--retry-base-ms", "1", "--retries", "1"])
        .args(extra)
        .arg("--input")
        .arg(&f.input)
        .arg("--output")
        .arg(&f.export)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .arg("--rootfs")
        .arg(rootfs())
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env("TMPDIR", &tmp)
        .env("XDG_RUNTIME_DIR", &run_dir)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn jail-agent");
    // Everything the run starts carries the fixture's path: sample it all
    // while the agent lives.
    let marker = f.dir.path().display().to_string();
    let agent_pid = child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (marker, done) = (marker.clone(), done.clone());
        std::thread::spawn(move || {
            let mut seen: BTreeMap<u32, String> = BTreeMap::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for (pid, cmd) in processes_marked(&marker) {
                    if pid != agent_pid {
                        seen.entry(pid).or_insert(cmd);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen.into_iter().collect::<Vec<_>>()
        })
    };
    if let Some(sig) = signal {
        let started = std::time::Instant::now();
        while mock.requests().len() < 4 {
            assert!(started.elapsed() < Duration::from_secs(90), "the agent never ran its first step");
            std::thread::sleep(Duration::from_millis(50));
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent_pid as i32), sig).unwrap();
    }
    let out = child.wait_with_output().expect("wait");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = sampler.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let roots: Vec<PathBuf> = std::fs::read_dir(&f.sessions).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(roots.len(), 1, "{stderr}");
    PoolRun { code: out.status.code(), root: roots[0].clone(), stderr, seen, f }
}

/// Nothing of the run is left, after up to 10 s: no process it started
/// (the pool, its janitor, a session supervisor, a jail), none naming the
/// fixture, no cgroup a session supervisor made, no mount, no session
/// socket or driver folder, no pool folder.
fn assert_run_left_nothing(r: &PoolRun, when: &str) {
    let marker = r.f.dir.path().display().to_string();
    let leftovers = || -> Vec<String> {
        let mut left: Vec<String> = processes_marked(&marker).iter().map(|(p, c)| format!("process {p}: {c}")).collect();
        for (pid, cmd) in &r.seen {
            let alive = Path::new(&format!("/proc/{pid}")).exists()
                && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ");
            if alive && cmdline_and_environ(*pid).is_some_and(|(c, _)| &c == cmd) {
                left.push(format!("process {pid} seen during the run: {cmd}"));
            }
            left.extend(cgroups_left_by(*pid).iter().map(|c| format!("cgroup {}", c.display())));
        }
        left.extend(host_mounts_with(&marker));
        let sessions = r.f.dir.path().join("run/jail/sessions");
        for e in std::fs::read_dir(&sessions).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".ended") {
                left.push(format!("session file {name}"));
            }
        }
        for dir in [r.root.join("pool"), r.f.dir.path().join("tmp")] {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                left.push(format!("in {}: {}", dir.display(), e.file_name().to_string_lossy()));
            }
        }
        left
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !leftovers().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(leftovers(), Vec::<String>::new(), "{when}: the run left something behind\n{}", r.stderr);
}

/// The pool processes among those seen: `jail pool ...` and its janitor
/// (a fork of it, with its command line).
fn pool_processes(r: &PoolRun) -> Vec<&(u32, String)> {
    r.seen.iter().filter(|(_, c)| c.split(' ').nth(1) == Some("pool")).collect()
}

/// The `run_python_file` records' jail facts, in order.
fn step_facts(root: &Path) -> Vec<agent::trace::JailFacts> {
    trace::read(&root.join("trace.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.event {
            Event::ToolCall { tool, jail: Some(j), .. } if tool == "run_python_file" => Some(*j),
            _ => None,
        })
        .collect()
}

/// The trace's `pool` record: (size, state, note, claims, stats).
fn pool_record(root: &Path) -> (usize, String, Option<String>, u64, Option<jail::client::pool::Stats>) {
    let records = trace::read(&root.join("trace.jsonl")).unwrap();
    let pools: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::Pool { size, state, note, claims, stats, .. } => {
                Some((*size, state.clone(), note.clone(), *claims, stats.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(pools.len(), 1, "one pool record per run: {records:?}");
    assert!(matches!(records.last().map(|r| &r.event), Some(Event::RunEnd { .. })), "the pool record comes before run_end");
    pools[0].clone()
}

#[test]
fn a_two_sub_task_run_claims_both_sessions_from_the_pool_and_leaves_nothing() {
    let r = cli_pool_run(two_sessions_turns(), &[], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let facts = step_facts(&r.root);
    let from: Vec<&str> = facts.iter().map(|j| j.jail_from.as_str()).collect();
    assert_eq!(from, ["pool", "pool", "pool"], "every step's jail came from the pool: {facts:?}");
    let claimed: Vec<bool> = facts.iter().map(|j| j.claim_ms.is_some()).collect();
    assert_eq!(claimed, [true, false, true], "a claim for each sub-task's first step: {facts:?}");
    assert!(facts.iter().all(|j| j.status == "ok" && j.not_pooled.is_none()), "{facts:?}");
    let ids: Vec<&str> = facts.iter().map(|j| j.session.as_deref().unwrap_or("")).collect();
    assert!(ids[0] == ids[1] && ids[1] != ids[2] && !ids[2].is_empty(), "one session per sub-task: {ids:?}");
    let (size, state, note, claims, stats) = pool_record(&r.root);
    assert_eq!((size, state.as_str(), note, claims), (1, "up", None, 2));
    let stats = stats.expect("the pool's stats at its close");
    assert!(stats.refill_ms.mean > 0.0, "{stats:?}");
    // What the last jail made holds is always there; `idle` (the ready
    // jails now) is none while a replacement is made, and its PSS and
    // anonymous memory null where an ordinary user's pool may not read
    // its jails' smaps_rollup.
    assert!(stats.idle_rss_bytes > 0, "{stats:?}");
    let summary = std::fs::read_to_string(r.root.join("summary.txt")).unwrap();
    assert!(summary.contains("jails: 2 sessions claimed from the warm pool ("), "{summary}");
    assert!(summary.contains("0 sessions started by the agent, 0 fresh jails"), "{summary}");
    assert!(summary.contains("warm pool: size 1, up; first jail made in "), "{summary}");
    assert!(summary.contains("ms last; an idle jail holds ") && summary.contains(" MiB RSS"), "{summary}");
    let saved: Summary = serde_json::from_str(&std::fs::read_to_string(r.root.join("summary.json")).unwrap()).unwrap();
    assert_eq!((saved.jails.pooled_sessions, saved.jails.started_sessions), (2, 0));

    // What the model saw: state within the sub-task, the output across.
    let results: Vec<String> = trace::read(&r.root.join("trace.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.event {
            Event::ToolCall { tool, result, .. } if tool == "run_python_file" => result,
            _ => None,
        })
        .collect();
    assert!(results[1].contains("rows 101"), "step 2 of item 1 reused the rows: {}", results[1]);
    assert!(results[2].contains("rows defined: False"), "item 2 starts clean: {}", results[2]);
    assert!(results[2].contains("n.txt holds 101"), "item 1's output reached item 2: {}", results[2]);
    assert_eq!(std::fs::read_to_string(r.f.export.join("m.txt")).unwrap(), "second");
    assert_eq!(std::fs::read_to_string(r.f.export.join("n.txt")).unwrap(), "101");

    // The pool ran while the agent did, and its jails as sessions beneath it.
    assert!(!pool_processes(&r).is_empty(), "the run's jail pool: {:?}", r.seen);
    assert!(
        r.seen
            .iter()
            .any(|(_, c)| c.contains("session start") && c.contains(&r.root.join("pool").display().to_string())),
        "the pooled jails live in the run's pool folder: {:?}",
        r.seen
    );
    assert_run_left_nothing(&r, "normal exit");
}

/// Item 1's first step ran in its session; then the model thinks forever.
fn one_step_then_hang() -> Vec<Turn> {
    let mut turns = session_turns(&[("load.py", LOAD)]);
    turns.truncate(3);
    turns.push(Turn::Hang);
    turns
}

#[test]
fn the_pool_and_its_jails_end_with_the_agent_on_sigint_and_on_sigkill() {
    use nix::sys::signal::Signal;
    for sig in [Signal::SIGINT, Signal::SIGKILL] {
        let r = cli_pool_run(one_step_then_hang(), &[], Some(sig));
        // Not vacuous: the pool and a pooled session were there to be ended.
        assert!(!pool_processes(&r).is_empty(), "{sig}: no pool was seen: {:?}", r.seen);
        assert!(r.seen.iter().any(|(_, c)| c.contains("session start")), "{sig}: no pooled jail was seen: {:?}", r.seen);
        match sig {
            Signal::SIGINT => {
                assert_eq!(r.code, Some(130), "{}", r.stderr);
                assert!(r.stderr.contains("SIGINT: stopping"), "{}", r.stderr);
            }
            _ => assert_eq!(r.code, None, "killed by the signal: {}", r.stderr),
        }
        let facts = step_facts(&r.root);
        assert_eq!(facts.first().map(|j| j.jail_from.as_str()), Some("pool"), "{sig}: {facts:?}");
        assert_run_left_nothing(&r, &format!("{sig}"));
    }
}

#[test]
fn with_pool_size_0_each_session_is_started_by_the_agent_and_the_summary_says_so() {
    let r = cli_pool_run(two_sessions_turns(), &["--pool-size", "0"], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(pool_processes(&r).is_empty(), "no pool: {:?}", r.seen);
    let facts = step_facts(&r.root);
    let from: Vec<&str> = facts.iter().map(|j| j.jail_from.as_str()).collect();
    assert_eq!(from, ["session_start"; 3], "{facts:?}");
    let started: Vec<bool> = facts.iter().map(|j| j.claim_ms.is_some()).collect();
    assert_eq!(started, [true, false, true], "the start's time on each session's first step: {facts:?}");
    assert!(facts.iter().all(|j| j.not_pooled.is_none()), "the pool is off, nothing was passed over: {facts:?}");
    let (size, state, note, claims, stats) = pool_record(&r.root);
    assert_eq!((size, state.as_str(), note.as_deref(), claims, stats), (0, "off", Some("--pool-size 0"), 0, None));
    let summary = std::fs::read_to_string(r.root.join("summary.txt")).unwrap();
    assert!(
        summary.contains("jails: 0 sessions claimed from the warm pool, 2 sessions started by the agent ("),
        "{summary}"
    );
    assert!(summary.contains("warm pool: size 0, off (--pool-size 0)"), "{summary}");
    // The same run as from the pool: state within an item, output across.
    assert_eq!(std::fs::read_to_string(r.f.export.join("m.txt")).unwrap(), "second");
    let out = Command::new(agent_bin())
        .args(["run", "--task", "x", "--pool-size", "65", "--input"])
        .arg(&r.f.input)
        .env("LLM_BASE_URL", "http://127.0.0.1:9/v1")
        .env("LLM_MODEL", "m")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--pool-size 65 is out of range: give 0 (no pool) to 64"), "{stderr}");
    assert_run_left_nothing(&r, "--pool-size 0");
}

#[test]
fn a_pool_that_cannot_start_is_one_line_and_every_session_is_started_by_the_agent() {
    // The minimal rootfs has turtle.py but no tkinter, which it imports:
    // the module is there (the agent's check before the first model call
    // passes), its import fails, and `jail pool` refuses to start. (A
    // module the rootfs lacks altogether stops the run before it starts:
    // a_wrong_rootfs_or_policy_is_found_before_any_model_call...)
    let policy = tempfile::Builder::new().prefix("jail-agent-policy-").tempdir().unwrap();
    std::fs::set_permissions(policy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = policy.path().join("turtle-preload.json");
    std::fs::write(&file, r#"{"version": 1, "name": "turtle-preload", "preload": ["turtle"]}"#).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = cli_pool_run(two_sessions_turns(), &["--policy", &file.display().to_string()], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let said: Vec<&str> = r.stderr.lines().filter(|l| l.contains("warm pool could not start")).collect();
    assert_eq!(said.len(), 1, "said once, in one line: {}", r.stderr);
    assert!(
        said[0].contains("tkinter") && said[0].contains("started by the agent itself instead, with the same isolation"),
        "{}",
        said[0]
    );
    let facts = step_facts(&r.root);
    let from: Vec<&str> = facts.iter().map(|j| j.jail_from.as_str()).collect();
    assert_eq!(from, ["session_start"; 3], "{facts:?}");
    for j in [&facts[0], &facts[2]] {
        assert!(j.not_pooled.as_deref().unwrap_or("").contains("could not start"), "each session says why: {j:?}");
    }
    let (_, state, note, claims, _) = pool_record(&r.root);
    assert_eq!((state.as_str(), claims), ("failed", 0));
    assert!(note.as_deref().unwrap_or("").contains("tkinter"), "{note:?}");
    let summary = std::fs::read_to_string(r.root.join("summary.txt")).unwrap();
    assert!(
        summary.contains("2 sessions started by the agent") && summary.contains("warm pool: size 1, failed ("),
        "{summary}"
    );
    assert!(summary.contains("started, not pooled: the warm pool could not start"), "{summary}");
    assert_eq!(std::fs::read_to_string(r.f.export.join("m.txt")).unwrap(), "second");
    assert_run_left_nothing(&r, "a pool that could not start");
}

#[test]
fn the_data_policy_is_the_default_with_the_data_stack_preloaded() {
    let data = jail::policy::Policy::load(&repo().join("policies/data.json")).expect("policies/data.json loads");
    let default = jail::policy::Policy::builtin_default().unwrap();
    assert_eq!(data.preload, ["numpy", "pandas", "matplotlib.pyplot"]);
    // Everything else is the default's: the same seccomp allowlist, limits,
    // environment, artifacts and identity.
    let same = jail::policy::Policy {
        name: default.name.clone(),
        preload: Vec::new(),
        hash: default.hash.clone(),
        source: default.source.clone(),
        ..data
    };
    assert_eq!(same, default, "policies/data.json drifted from policies/default.json");
}

#[test]
fn on_the_data_rootfs_a_pooled_session_starts_with_the_data_stack_imported() {
    let data = data_rootfs();
    if skip_unless(
        data.join("usr/bin/python3").exists(),
        &format!("no data rootfs at {} (build it: make rootfs-data)", data.display()),
    ) {
        return;
    }
    let f = fixture();
    let before = "import sys\nprint('preloaded:', [m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules])\nimport pandas as pd\ndf = pd.read_csv('/workspace/input/titanic.csv')\n";
    let after = "print('rows', len(df))\nopen('/workspace/output/n.txt', 'w').write(str(len(df)))\n";
    let mock = MockLlm::start(session_turns(&[("load.py", before), ("use.py", after)]));
    let mut cfg = config(&f, &mock, data.clone());
    cfg.runner.policy = Some(repo().join("policies/data.json"));
    // The data stack imports in a few seconds; leave room on a loaded machine.
    cfg.runner.timeout = Some(120.0);
    cfg.runner.wall_limit = Duration::from_secs(120);
    let out = run::run(&cfg).unwrap_or_else(|e| panic!("run failed: {e}\n{}", requests_seen(&mock)));
    let req = mock.requests();
    let first = last_tool(&req[3]);
    assert!(
        first.contains("preloaded: ['numpy', 'pandas', 'matplotlib.pyplot']"),
        "claimed with the preload done: {first}"
    );
    let second = last_tool(&req[4]);
    assert!(second.contains("rows 100"), "the DataFrame persisted: {second}");
    let facts = step_facts(&out.session.root);
    assert_eq!(facts.iter().map(|j| j.jail_from.as_str()).collect::<Vec<_>>(), ["pool", "pool"], "{facts:?}");
    assert_eq!(std::fs::read_to_string(f.export.join("n.txt")).unwrap(), "100");
    assert!(processes_naming(&out.session.root).is_empty(), "{:?}", processes_naming(&out.session.root));
}

// ------------------------------------------------------------ issue 34
//
// Stopping when told, telling the model and the user everything, starting
// on the right rootfs. Each test drives the CLI (JAIL_AGENT_BIN and
// JAIL_BIN may name other builds, e.g. the last release's, to see a test
// fail there) and checks the host: exit status, timing of the exit against
// the signal, the requests the model got, the files the run left.

/// A CLI run watched as it goes: every stderr line with when it came, the
/// processes it started sampled as for `cli_pool_run`.
struct Watched {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, String)>>>,
    reader: std::thread::JoinHandle<()>,
    sampler: std::thread::JoinHandle<Vec<(u32, String)>>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    mock: MockLlm,
    f: Fixture,
}

/// What a watched run ended with.
struct Ended {
    code: Option<i32>,
    exited: std::time::Instant,
    stdout: String,
    lines: Vec<(std::time::Instant, String)>,
    mock: MockLlm,
    run: PoolRun,
}

impl Ended {
    fn stderr(&self) -> &str {
        &self.run.stderr
    }
}

/// `jail-agent run` on the fixture against `turns` (TMPDIR and
/// XDG_RUNTIME_DIR in the fixture, --output to its export folder, the
/// rootfs under test unless `extra` names one), progress on stderr.
fn watch_cli(turns: Vec<Turn>, extra: &[String]) -> Watched {
    let f = fixture();
    let (tmp, run_dir) = (f.dir.path().join("tmp"), f.dir.path().join("run"));
    std::fs::create_dir(&tmp).unwrap();
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mock = MockLlm::start(turns);
    let mut cmd = Command::new(agent_bin());
    cmd.args([
        "run",
        "--task",
        "analyse the passengers",
        "--retry-base-ms",
        "1",
        "--retries",
        "1",
    ])
    .args(extra)
    .arg("--input")
    .arg(&f.input)
    .arg("--output")
    .arg(&f.export)
    .arg("--session-dir")
    .arg(&f.sessions)
    .arg("--jail")
    .arg(jail_bin());
    if !extra.iter().any(|a| a.starts_with("--rootfs")) {
        cmd.arg("--rootfs").arg(rootfs());
    }
    let mut child = cmd
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env("TMPDIR", &tmp)
        .env("XDG_RUNTIME_DIR", &run_dir)
        // The run names its rootfs (--rootfs, or --rootfs-name in `extra`).
        .env_remove("JAIL_ROOTFS")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn jail-agent");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = {
        let (lines, err) = (lines.clone(), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push((std::time::Instant::now(), l));
            }
        })
    };
    let marker = f.dir.path().display().to_string();
    let agent_pid = child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut seen: BTreeMap<u32, String> = BTreeMap::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for (pid, cmd) in processes_marked(&marker) {
                    if pid != agent_pid {
                        seen.entry(pid).or_insert(cmd);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen.into_iter().collect::<Vec<_>>()
        })
    };
    Watched { child, lines, reader, sampler, done, mock, f }
}

impl Watched {
    /// When a stderr line holding `needle` came, waiting up to `within`.
    fn wait_line(&self, needle: &str, within: Duration) -> Option<std::time::Instant> {
        let until = std::time::Instant::now() + within;
        loop {
            if let Some((at, _)) = self.lines.lock().unwrap().iter().find(|(_, l)| l.contains(needle)) {
                return Some(*at);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait until the model has been asked `n` times.
    fn wait_requests(&self, n: usize, within: Duration) {
        let until = std::time::Instant::now() + within;
        while self.mock.requests().len() < n {
            assert!(
                std::time::Instant::now() < until,
                "the agent never asked the model {n} times: {:?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> std::time::Instant {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
        std::time::Instant::now()
    }

    fn end(mut self) -> Ended {
        use std::io::Read as _;
        let mut stdout = String::new();
        let mut out = self.child.stdout.take().unwrap();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let exited = std::time::Instant::now();
        out.read_to_string(&mut stdout).unwrap();
        self.reader.join().unwrap();
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        let seen = self.sampler.join().unwrap();
        let lines = std::mem::take(&mut *self.lines.lock().unwrap());
        let stderr = lines.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join("\n");
        let roots: Vec<PathBuf> = std::fs::read_dir(&self.f.sessions).unwrap().map(|e| e.unwrap().path()).collect();
        let root = roots.first().cloned().unwrap_or_default();
        Ended {
            code: status.code(),
            exited,
            stdout,
            lines,
            mock: self.mock,
            run: PoolRun { code: status.code(), root, stderr, seen, f: self.f },
        }
    }
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// summary.json as data (read as JSON, not as this build's type).
fn summary_json(root: &Path) -> Value {
    let text =
        std::fs::read_to_string(root.join("summary.json")).unwrap_or_else(|e| panic!("summary.json in {}: {e}", root.display()));
    serde_json::from_str(&text).unwrap()
}

/// A one-item plan whose sub-agent writes and runs `script` once; later
/// turns (never to be asked for, when the run is stopped during the
/// step) complete it.
fn one_step_turns(script: &str) -> Vec<Turn> {
    vec![
        tool_turn(&[("create_todo_list", plan(&[("count", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[write("step.py", script), run_file("step.py")], (100, 20)),
        tool_turn(&[call("complete_todo", json!({"report": "done"}))], (100, 5)),
        text_turn("done.", (100, 5)),
    ]
}

const SLEEPER: &str = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n";
const FORK_BOMB: &str = "import os, time\nprint('forking', flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.001)\n";
const DEAF: &str =
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('deaf', flush=True)\ntime.sleep(60)\n";

/// A run stopped by `sig` once its step runs `script`: what it left.
fn stopped_during_a_step(script: &str, sig: nix::sys::signal::Signal, twice: bool) -> (Ended, std::time::Instant) {
    stopped_during_a_step_with(script, sig, twice, &[])
}

fn stopped_during_a_step_with(
    script: &str,
    sig: nix::sys::signal::Signal,
    twice: bool,
    extra: &[&str],
) -> (Ended, std::time::Instant) {
    let mut a = args(&["--step-timeout", "60"]);
    a.extend(args(extra));
    let w = watch_cli(one_step_turns(script), &a);
    w.wait_requests(3, Duration::from_secs(90));
    // The step prints as it starts; its line shows live (or, on a build
    // without live output, the step is well under way 15 s on).
    let _ = w.wait_line("step.py stdout|", Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(300));
    let at = w.signal(sig);
    if twice {
        std::thread::sleep(Duration::from_millis(100));
        w.signal(sig);
    }
    (w.end(), at)
}

#[test]
fn a_signal_during_a_step_stops_the_run_within_2_s_with_no_model_call_after_it_and_everything_saved() {
    use nix::sys::signal::Signal;
    for (script, sig, what, extra) in [
        (SLEEPER, Signal::SIGINT, "a sleeping step", &[][..]),
        (FORK_BOMB, Signal::SIGTERM, "a fork bomb", &[][..]),
        (SLEEPER, Signal::SIGINT, "a sleeping --stateless step", &["--stateless"][..]),
    ] {
        let (e, at) = stopped_during_a_step_with(script, sig, false, extra);
        let took = e.exited.duration_since(at);
        eprintln!("{what}: {sig} to exit in {} ms", took.as_millis());
        assert_eq!(e.code, Some(128 + sig as i32), "{what}: exit 128 + the signal\n{}", e.stderr());
        assert!(took <= Duration::from_secs(2), "{what}: {sig} took {took:?} to stop the run\n{}", e.stderr());
        let asked = e.mock.request_times();
        assert_eq!(asked.len(), 3, "{what}: no model call after the signal\n{}", e.stderr());
        assert!(asked.iter().all(|t| *t < at), "{what}: a request came after the signal");
        let root = &e.run.root;
        for f in ["summary.txt", "summary.json", "answer.md", "state.json", "trace.jsonl"] {
            assert!(root.join(f).is_file(), "{what}: no {f} after {sig}\n{}", e.stderr());
        }
        let answer = std::fs::read_to_string(root.join("answer.md")).unwrap();
        assert!(answer.starts_with(&format!("The run stopped before it finished: stopped by {sig}")), "{what}: {answer}");
        assert!(answer.contains("1. count [not done]"), "{what}: the answer so far lists the plan: {answer}");
        assert_eq!(summary_json(root)["stop"], format!("stopped by {sig}"), "{what}");
        let state: Value = serde_json::from_str(&std::fs::read_to_string(root.join("state.json")).unwrap()).unwrap();
        assert_eq!(state["finished"], false, "{what}: a stopped run can be resumed");
        assert!(e.stdout.contains("by item"), "{what}: the summary is printed:\n{}", e.stdout);
        assert!(e.stderr().contains(&format!("jail-agent resume {}", root.display())), "{what}: {}", e.stderr());
        // The step was interrupted (or killed after the grace), not waited for.
        let facts = step_facts(root);
        assert_eq!(facts.len(), 1, "{what}: {facts:?}");
        assert!(facts[0].status == "cancelled" || facts[0].status == "timeout_wall", "{what}: {facts:?}");
        assert!(facts[0].wall_ms < 10_000.0, "{what}: the step ran {} ms", facts[0].wall_ms);
        assert_run_left_nothing(&e.run, what);
        if what == "a sleeping step" {
            // The stopped run goes on with `resume` from where it stopped:
            // the sub-agent hears its step was cancelled, and finishes.
            let mock = MockLlm::start(vec![
                tool_turn(&[call("complete_todo", json!({"report": "done after all"}))], (100, 5)),
                text_turn("done.", (100, 5)),
            ]);
            let out = resume_cli(root, &mock);
            assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
            let first = mock.requests()[0].to_string();
            assert!(first.contains("status: cancelled"), "the resumed sub-agent sees its cancelled step: {first}");
            assert_eq!(summary_json(root)["stop"], "finished");
        }
    }
    // A cell deaf to its interrupt is killed after the grace; a second
    // signal ends the agent at once, and still nothing is left.
    let (e, at) = stopped_during_a_step(DEAF, Signal::SIGINT, false);
    assert_eq!(e.code, Some(130), "{}", e.stderr());
    assert!(
        e.exited.duration_since(at) <= Duration::from_secs(2),
        "deaf cell: {:?}\n{}",
        e.exited.duration_since(at),
        e.stderr()
    );
    assert_run_left_nothing(&e.run, "a cell deaf to SIGINT");
    let (e, at) = stopped_during_a_step(DEAF, Signal::SIGINT, true);
    assert_eq!(e.code, Some(130), "{}", e.stderr());
    assert!(
        e.exited.duration_since(at) <= Duration::from_millis(1000),
        "twice: {:?}\n{}",
        e.exited.duration_since(at),
        e.stderr()
    );
    assert!(e.stderr().contains("again: ending at once"), "{}", e.stderr());
    assert_eq!(e.mock.requests().len(), 3);
    assert_run_left_nothing(&e.run, "a second SIGINT");
}

#[test]
fn a_run_whose_items_were_all_blocked_exits_4_and_summary_json_says_each_items_outcome_and_why() {
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("charts", &[]), ("deck", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[call("block_todo", json!({"reason": "matplotlib is missing"}))], (100, 5)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[call("block_todo", json!({"reason": "python-pptx is missing"}))], (100, 5)),
        text_turn("Nothing could be done.", (100, 5)),
    ];
    let e = watch_cli(turns, &[]).end();
    assert_eq!(e.code, Some(4), "every item blocked: not a success\n{}\n{}", e.stdout, e.stderr());
    let s = summary_json(&e.run.root);
    let items = s["items"].as_array().unwrap_or_else(|| panic!("summary.json has no items: {s}"));
    let got: Vec<(&str, &str, &str)> = items
        .iter()
        .map(|i| (i["name"].as_str().unwrap_or(""), i["outcome"].as_str().unwrap_or(""), i["reason"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        got,
        [
            ("charts", "blocked", "matplotlib is missing"),
            ("deck", "blocked", "python-pptx is missing")
        ]
    );
    assert_eq!(items[0]["agents"], json!(["subagent-1"]));
    assert!(e.stdout.contains("by item") && e.stdout.contains("1 blocked: matplotlib is missing"), "{}", e.stdout);
    assert!(e.stderr().contains("not every item was completed"), "{}", e.stderr());
}

#[test]
fn a_wrong_rootfs_or_policy_is_found_before_any_model_call_in_one_line_naming_the_fix() {
    let policy = tempfile::Builder::new().prefix("jail-agent-policy-").tempdir().unwrap();
    std::fs::set_permissions(policy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let numpy = policy.path().join("numpy.json");
    std::fs::write(&numpy, r#"{"version": 1, "name": "numpy-preload", "preload": ["numpy"]}"#).unwrap();
    std::fs::set_permissions(&numpy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let gone = policy.path().join("no-such-rootfs");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--rootfs".into(), gone.display().to_string()], "jail rootfs build"),
        (args(&["--rootfs-name", "no-such-flavour"]), "jail rootfs build minimal --dest"),
        (
            vec![
                "--policy".into(),
                numpy.display().to_string(),
                "--rootfs".into(),
                rootfs().display().to_string(),
            ],
            "--rootfs-name data",
        ),
    ];
    for (extra, fix) in cases {
        let e = watch_cli(one_step_turns(HELLO), &extra).end();
        assert_eq!(e.code, Some(1), "{extra:?}\n{}", e.stderr());
        assert_eq!(e.mock.requests().len(), 0, "{extra:?}: found before any model call\n{}", e.stderr());
        let errors: Vec<&str> = e.stderr().lines().filter(|l| l.starts_with("jail-agent: ") && !l.contains("session")).collect();
        assert_eq!(errors.len(), 1, "{extra:?}: one line\n{}", e.stderr());
        assert!(errors[0].contains(fix), "{extra:?}: names the fix `{fix}`: {}", errors[0]);
        assert!(errors[0].len() < 1000, "{}", errors[0]);
    }
}

#[test]
fn without_a_rootfs_a_policy_with_a_preload_runs_on_the_data_rootfs() {
    let data = data_rootfs();
    if skip_unless(data.join("usr/bin/python3").exists(), &format!("no data rootfs at {} (make rootfs-data)", data.display())) {
        return;
    }
    // The data rootfs where the lookup finds it by name: the user's data
    // folder (the `jail` under test may not run from its build tree).
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let named = home.path().join("data/jail/rootfs");
    std::fs::create_dir_all(&named).unwrap();
    std::os::unix::fs::symlink(&data, named.join("data")).unwrap();
    let show = "import pandas\nprint('pandas', pandas.__version__)\n";
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("count", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(
            &[
                call("list_available_packages", json!({})),
                write("step.py", show),
                run_file("step.py"),
            ],
            (100, 20),
        ),
        tool_turn(&[call("complete_todo", json!({"report": "done"}))], (100, 5)),
        text_turn("done.", (100, 5)),
    ];
    let mut w_args = args(&["--step-timeout", "120", "--policy"]);
    w_args.push(repo().join("policies/data.json").display().to_string());
    let f = fixture();
    let mock = MockLlm::start(turns);
    let out = Command::new(agent_bin())
        .args(["run", "--task", "t", "--retry-base-ms", "1"])
        .args(&w_args)
        .arg("--input")
        .arg(&f.input)
        .arg("--session-dir")
        .arg(&f.sessions)
        .arg("--jail")
        .arg(jail_bin())
        .env("LLM_BASE_URL", &mock.base_url)
        .env("LLM_MODEL", "scripted")
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env_remove("JAIL_ROOTFS")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let req = mock.requests();
    let seen = tool_messages(&req[3]).join("\n");
    assert!(seen.contains("pandas") && seen.contains("status: ok"), "the data rootfs was picked: {seen}");
}

/// A policy that preloads `json` (on any rootfs): the pool then runs its
/// preload as the session's first cell, as the data policy does.
fn json_preload_policy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("jail-agent-policy-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("json-preload.json");
    std::fs::write(&file, r#"{"version": 1, "name": "json-preload", "preload": ["json"]}"#).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, file)
}

#[test]
fn the_pool_starts_with_the_run_and_a_step_that_waits_for_its_jail_says_so_in_its_span_and_claim_ms() {
    // The data stack takes a second or more to preload: the first step,
    // asked for at once by the scripted model, waits for the pool's first
    // jail, and that wait must be its claim's.
    let data = data_rootfs();
    if skip_unless(data.join("usr/bin/python3").exists(), &format!("no data rootfs at {} (make rootfs-data)", data.display())) {
        return;
    }
    let mut extra = args(&["--step-timeout", "120", "--policy"]);
    extra.push(repo().join("policies/data.json").display().to_string());
    extra.push("--rootfs".into());
    extra.push(data.display().to_string());
    let e = watch_cli(one_step_turns(HELLO), &extra).end();
    assert_eq!(e.code, Some(0), "{}", e.stderr());
    let records = trace::read(&e.run.root.join("trace.jsonl")).unwrap();
    let first_chat = records.iter().find(|r| matches!(r.event, Event::ModelCall { .. })).unwrap();
    let pool = records.iter().find(|r| matches!(r.event, Event::Pool { .. })).unwrap();
    let Event::Pool { start_ms: Some(start_ms), .. } = pool.event else {
        panic!("the pool never answered: {pool:?}")
    };
    assert!(
        pool.start_unix_ns <= first_chat.start_unix_ns,
        "the pool started with the run, before the first model call ({} > {})",
        pool.start_unix_ns,
        first_chat.start_unix_ns
    );
    let ready_ns = pool.start_unix_ns + (start_ms * 1e6) as u64;
    let step = records
        .iter()
        .find(|r| matches!(&r.event, Event::ToolCall { tool, .. } if tool == "run_python_file"))
        .unwrap();
    let Event::ToolCall { jail: Some(j), .. } = &step.event else { panic!("{step:?}") };
    let claim_ms = j.claim_ms.expect("the first step of a session says its claim");
    eprintln!("pool ready {start_ms:.0} ms after its start; the step's claim took {claim_ms:.0} ms");
    // The step began before the pool's first jail was made ...
    assert!(step.start_unix_ns < ready_ns, "the step did not wait for the pool: make its preload slower");
    // ... and its claim, all it waited for its jail, ends after that
    // (the claim starts a few ms into the step's span: 300 ms of slack)
    // and lies within the span.
    let claim_end_ns = step.start_unix_ns + (claim_ms * 1e6) as u64;
    assert!(
        claim_end_ns + 300_000_000 >= ready_ns,
        "claim_ms {claim_ms:.0} leaves out {:.0} ms of the wait for the pool's first jail",
        (ready_ns - claim_end_ns) as f64 / 1e6
    );
    assert!(
        claim_ms * 1e6 <= (step.end_unix_ns - step.start_unix_ns) as f64,
        "claim_ms {claim_ms} is outside its step's span"
    );
}

#[test]
fn the_models_first_step_is_step_1_and_its_traceback_shows_its_own_file_and_lines_only() {
    let (_p, policy) = json_preload_policy();
    let bad = "def ratio(a, b):\n    return a / b\n\nprint(ratio(1, 0))\n";
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("count", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[write("step1.py", bad), run_file("step1.py")], (100, 20)),
        tool_turn(&[write("step2.py", "x = (\n"), run_file("step2.py")], (100, 20)),
        tool_turn(&[call("complete_todo", json!({"report": "done"}))], (100, 5)),
        text_turn("done.", (100, 5)),
    ];
    let e = watch_cli(turns, &args(&["--policy", &policy.display().to_string()])).end();
    assert_eq!(e.code, Some(0), "{}", e.stderr());
    let req = e.mock.requests();
    let first = last_tool(&req[3]);
    assert!(first.contains("session: step 1 of this sub-task's session"), "the model's first step is step 1:\n{first}");
    assert!(first.contains("ZeroDivisionError"), "{first}");
    assert!(
        first.contains("File \"/workspace/code/step1.py\", line 4, in <module>")
            && first.contains("File \"/workspace/code/step1.py\", line 2, in ratio"),
        "its own file and lines:\n{first}"
    );
    assert!(
        !first.contains("<cell") && !first.contains("exec(compile") && !first.contains("_jail"),
        "no plumbing:\n{first}"
    );
    let second = last_tool(&req[4]);
    assert!(second.contains("session: step 2 of this sub-task's session"), "{second}");
    assert!(second.contains("SyntaxError") && second.contains("/workspace/code/step2.py"), "{second}");
    assert!(!second.contains("<cell") && !second.contains("exec(compile"), "no plumbing:\n{second}");
}

#[test]
fn a_100_mb_reply_is_refused_once_for_what_it_is_not_as_an_unreachable_endpoint() {
    // watch_cli allows one retry: a build that retries asks twice.
    let e = watch_cli(vec![Turn::Huge(100 << 20), Turn::Huge(100 << 20)], &[]).end();
    assert_eq!(e.code, Some(1), "{}", e.stderr());
    assert_eq!(e.mock.requests().len(), 1, "refused once, not retried\n{}", e.stderr());
    let err = e.stderr().lines().find(|l| l.contains("MiB")).unwrap_or_else(|| panic!("{}", e.stderr()));
    assert!(err.contains("more than 32 MiB") && err.contains("--max-reply-tokens"), "{err}");
    assert!(!e.stderr().contains("cannot reach") && !e.stderr().contains("check LLM_BASE_URL"), "{}", e.stderr());
}

#[test]
fn caps_hold_per_reply_before_any_of_its_calls_run_with_the_overshoot_said_and_the_orchestrator_has_its_own() {
    // A sub-agent's reply that alone takes it past its token cap: none of
    // its calls runs, the item is blocked saying by how much.
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("count", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[write("step.py", HELLO), run_file("step.py")], (5_000, 200)),
        text_turn("The item could not be done.", (100, 5)),
    ];
    let e = watch_cli(turns, &args(&["--subagent-tokens", "1000"])).end();
    assert_eq!(e.code, Some(4), "{}", e.stderr());
    let records = trace::read(&e.run.root.join("trace.jsonl")).unwrap();
    let steps: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::ToolCall { tool, ok, error, .. } if r.agent == "subagent-1" => {
                Some((tool.clone(), *ok, error.clone().unwrap_or_default()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(steps.iter().all(|(_, ok, err)| !ok && err.contains("not run") && err.contains("5200 tokens")), "{steps:?}");
    assert!(step_facts(&e.run.root).is_empty(), "no step ran");
    let reason = summary_json(&e.run.root)["items"][0]["reason"].as_str().unwrap_or("").to_string();
    assert!(reason.contains("took it to 5200 tokens, 4200 over its token cap of 1000"), "{reason}");

    // The run's cap, overshot by the orchestrator's reply: its calls do not run.
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("count", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (7_000, 500)),
    ];
    let e = watch_cli(turns, &args(&["--run-tokens", "3000"])).end();
    assert_eq!(e.code, Some(3), "{}", e.stderr());
    assert!(
        e.stdout.starts_with(
            "The run stopped before it finished: run token cap reached (3000 tokens; the last reply took it to 7610, 4610 over)"
        ),
        "{}",
        e.stdout
    );
    let subagents = trace::read(&e.run.root.join("trace.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.agent.starts_with("subagent"))
        .count();
    assert_eq!(subagents, 0, "the sub-agent never started");

    // The orchestrator's own step cap.
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("a", &[]), ("b", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[call("block_todo", json!({"reason": "no"}))], (100, 5)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
    ];
    let e = watch_cli(turns, &args(&["--orchestrator-steps", "2"])).end();
    assert_eq!(e.code, Some(3), "{}", e.stderr());
    assert!(
        e.stdout
            .starts_with("The run stopped before it finished: orchestrator step cap reached (2 model calls)"),
        "{}",
        e.stdout
    );
    assert_eq!(e.mock.requests().len(), 3, "two orchestrator calls and the sub-agent's one");
}

#[test]
fn messages_say_what_happened_and_cut_what_the_model_wrote() {
    // A model that called tools, then stopped: not "needs tool calling".
    let turns = vec![
        tool_turn(
            &[
                call("list_input_files", json!({})),
                call("read_skill", json!({"name": "eda"})),
            ],
            (100, 10),
        ),
        text_turn("\u{1b}[2JI am done.", (100, 5)),
        text_turn("Really done.", (100, 5)),
    ];
    let e = watch_cli(turns, &[]).end();
    assert_eq!(e.code, Some(1), "{}", e.stderr());
    let err = e.stderr().lines().last().unwrap_or_default();
    assert!(err.contains("the model stopped calling tools: after 2 tool calls"), "{err}");
    assert!(!err.contains("needs a model"), "the model did call tools: {err}");

    // A 100,000-byte tool name is cut wherever it is echoed.
    let long = "x".repeat(100_000);
    let turns = vec![
        tool_turn(&[(long.as_str(), "{}".to_string())], (100, 10)),
        tool_turn(&[("create_todo_list", plan(&[("a", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&[call("block_todo", json!({"reason": "no"}))], (100, 5)),
        text_turn("done.", (100, 5)),
    ];
    let e = watch_cli(turns, &[]).end();
    assert_eq!(e.code, Some(4), "{}", e.stderr());
    let longest = e.lines.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
    assert!(longest < 3000, "a stderr line of {longest} bytes");
    assert!(e.stdout.lines().all(|l| l.len() < 3000), "stdout holds a long line");
    let told = last_tool(&e.mock.requests()[1]);
    assert!(told.len() < 2000, "the model is told its tool name cut: {} bytes", told.len());
}

#[test]
fn a_failed_export_keeps_the_session_prints_the_answer_and_summary_and_jail_agent_export_does_it_again() {
    let mut turns = session_turns(&[("w.py", "open('/workspace/output/n.txt', 'w').write('101')\n")]);
    turns.truncate(turns.len() - 1);
    turns.push(text_turn("n.txt holds the count.", (100, 5)));
    let w = watch_cli(turns, &[]);
    // A link where the file is to go: the export refuses to write through it.
    std::fs::create_dir_all(&w.f.export).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", w.f.export.join("n.txt")).unwrap();
    let e = w.end();
    assert_eq!(e.code, Some(5), "{}", e.stderr());
    assert!(e.stdout.starts_with("n.txt holds the count."), "the answer is printed:\n{}", e.stdout);
    assert!(e.stdout.contains("tokens and time by agent"), "and the summary:\n{}", e.stdout);
    let root = e.run.root.clone();
    assert!(
        e.stderr().contains("the export to") && e.stderr().contains(&format!("jail-agent export {}", root.display())),
        "{}",
        e.stderr()
    );
    assert_eq!(std::fs::read_to_string(root.join("output/n.txt")).unwrap(), "101", "the session keeps the files");
    std::fs::remove_file(e.run.f.export.join("n.txt")).unwrap();
    let again = Command::new(agent_bin()).arg("export").arg(&root).output().unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(std::fs::read_to_string(e.run.f.export.join("n.txt")).unwrap(), "101");
    let resume = Command::new(agent_bin())
        .arg("resume")
        .arg(&root)
        .env("LLM_BASE_URL", "http://127.0.0.1:9/v1")
        .env("LLM_MODEL", "m")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&resume.stderr).contains("jail-agent export"),
        "{}",
        String::from_utf8_lossy(&resume.stderr)
    );
}

#[test]
fn a_session_cells_output_is_live_and_a_retried_model_request_shows() {
    let script = "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second', flush=True)\n";
    let mut turns = one_step_turns(script);
    turns.insert(2, Turn::Status(503, "{\"error\":{\"message\":\"overloaded\"}}".into()));
    let e = watch_cli(turns, &[]).end();
    assert_eq!(e.code, Some(0), "{}", e.stderr());
    let at = |needle: &str| e.lines.iter().find(|(_, l)| l.contains(needle)).map(|(t, _)| *t);
    let first = at("step.py stdout| first").unwrap_or_else(|| panic!("{}", e.stderr()));
    let second = at("step.py stdout| second").unwrap_or_else(|| panic!("{}", e.stderr()));
    assert!(
        second.duration_since(first) >= Duration::from_millis(2000),
        "the first line came as it was printed, not with the step's end"
    );
    assert!(
        e.stderr().contains("[subagent-1] model: attempt 1 of 2 failed (the model endpoint") && e.stderr().contains("HTTP 503"),
        "the retry shows:\n{}",
        e.stderr()
    );
    let s = summary_json(&e.run.root);
    assert_eq!(s["retries"], 1, "{s}");
}

#[test]
fn files_the_jail_refuses_when_a_session_ends_reach_the_model_the_orchestrator_and_the_summary() {
    let leave =
        "open('/workspace/output/n.txt', 'w').write('101')\nopen('/workspace/output/blob.bin', 'wb').write(b'\\0' * 10)\n";
    let e = watch_cli(session_turns(&[("w.py", leave)]), &[]).end();
    assert_eq!(e.code, Some(0), "{}", e.stderr());
    let req = e.mock.requests();
    // The sub-agent's complete_todo result (its last word: it is in the
    // trace), and the orchestrator's report.
    let records = trace::read(&e.run.root.join("trace.jsonl")).unwrap();
    let done = records
        .iter()
        .find_map(|r| match &r.event {
            Event::ToolCall { tool, result, .. } if tool == "complete_todo" => result.clone(),
            _ => None,
        })
        .unwrap_or_default();
    assert!(done.contains("blob.bin") && done.contains("refused"), "the sub-agent is told:\n{done}");
    let report = last_tool(&req[4]);
    assert!(report.contains("blob.bin") && report.contains("refused"), "the orchestrator hears of it:\n{report}");
    let text = std::fs::read_to_string(e.run.root.join("summary.txt")).unwrap();
    assert!(text.contains("refused by the jail (1, not handed on):") && text.contains("blob.bin"), "{text}");
    let s = summary_json(&e.run.root);
    assert!(s["refused"].to_string().contains("blob.bin"), "{s}");
    assert!(!e.run.f.export.join("blob.bin").exists());
    let stops: Vec<_> = records.iter().filter(|r| matches!(r.event, Event::SessionStop { .. })).collect();
    assert_eq!(stops.len(), 1, "the session's stop is a span of its own: {records:?}");
    assert_eq!(stops[0].agent, "subagent-1");
}

#[test]
fn a_reply_of_150_calls_costs_one_save_and_150_appends_and_a_bounded_trace() {
    let big = format!("{{\"path\": \"{}\"}}", "p".repeat(100 << 10));
    let flood: Vec<(&str, String)> = (0..150).map(|_| ("list_input_files", big.clone())).collect();
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("count", &[])]))], (100, 10)),
        tool_turn(&[call("start_next_todo", json!({}))], (100, 5)),
        tool_turn(&flood, (100, 20)),
        tool_turn(&[call("block_todo", json!({"reason": "flooded"}))], (100, 5)),
        text_turn("done.", (100, 5)),
    ];
    let e = watch_cli(turns, &[]).end();
    assert_eq!(e.code, Some(4), "{}", e.stderr());
    let trace_bytes = std::fs::metadata(e.run.root.join("trace.jsonl")).unwrap().len();
    assert!(trace_bytes < 2 << 20, "a 15 MB reply left {trace_bytes} bytes of trace");
    let state: Value = serde_json::from_str(&std::fs::read_to_string(e.run.root.join("state.json")).unwrap()).unwrap();
    let saves = state["saves"].as_u64().unwrap_or(u64::MAX);
    eprintln!("150 calls of 100 KB in one reply: {trace_bytes} bytes of trace, state.json written {saves} times");
    assert!(saves < 20, "state.json was written {saves} times for 5 replies");
}

const TITANIC_LOAD: &str = include_str!("../agent-scripts/titanic_load.py");
const TITANIC_SUMMARY: &str = include_str!("../agent-scripts/titanic_summary.py");
const TITANIC_CHARTS: &str = include_str!("../agent-scripts/titanic_charts.py");
const TITANIC_DECK: &str = include_str!("../agent-scripts/titanic_deck.py");

/// The case study's task, scripted: a three-item EDA of the Titanic list on
/// the data stack (a summary table through a KeyError and its fix, charts,
/// a deck), with prompts that grow as a real model's do.
fn titanic_turns() -> Vec<Turn> {
    let items = json!({"items": [
        {"name": "survival-summary", "goal": "survival by class and sex as a table", "skills": ["python-scripts", "eda"],
         "inputs": ["/workspace/input/titanic.csv"], "outputs": ["/workspace/output/summary.csv"], "success_criteria": "summary.csv has one row per class and sex"},
        {"name": "charts", "goal": "charts of survival and ages", "skills": ["charts"],
         "inputs": ["/workspace/input/titanic.csv"], "outputs": ["/workspace/output/survival_by_class_sex.png", "/workspace/output/age_histogram.png"], "success_criteria": "two PNG charts"},
        {"name": "deck", "goal": "a slide deck of the findings", "skills": ["presentation"],
         "inputs": ["/workspace/output/summary.csv"], "outputs": ["/workspace/output/presentation.pptx"], "success_criteria": "presentation.pptx opens"}
    ]});
    vec![
        tool_turn(&[("create_todo_list", items.to_string())], (2_400, 380)),
        tool_turn(&[call("start_next_todo", json!({}))], (2_900, 20)),
        tool_turn(
            &[
                call("read_skill", json!({"name": "eda"})),
                call("read_file_content", json!({"path": "/workspace/input/titanic.csv", "limit": 20})),
            ],
            (3_100, 90),
        ),
        tool_turn(&[write("load.py", TITANIC_LOAD), run_file("load.py")], (5_900, 260)),
        tool_turn(&[write("summary.py", TITANIC_SUMMARY), run_file("summary.py")], (7_400, 330)),
        tool_turn(
            &[call(
                "complete_todo",
                json!({"report": "summary.csv: survival by class and sex; 38% survived overall"}),
            )],
            (8_300, 80),
        ),
        tool_turn(&[call("start_next_todo", json!({}))], (3_600, 20)),
        tool_turn(
            &[
                call("read_skill", json!({"name": "charts"})),
                write("charts.py", TITANIC_CHARTS),
                run_file("charts.py"),
            ],
            (3_000, 420),
        ),
        tool_turn(&[call("complete_todo", json!({"report": "two charts"}))], (4_800, 70)),
        tool_turn(&[call("start_next_todo", json!({}))], (4_100, 20)),
        tool_turn(
            &[
                call("read_skill", json!({"name": "presentation"})),
                write("deck.py", TITANIC_DECK),
                run_file("deck.py"),
            ],
            (3_200, 560),
        ),
        tool_turn(&[call("complete_todo", json!({"report": "presentation.pptx: 4 slides"}))], (5_200, 60)),
        text_turn(
            "Women and first-class passengers survived far more often; see summary.csv, the two charts and presentation.pptx.",
            (4_700, 260),
        ),
    ]
}

#[test]
fn a_titanic_eda_on_the_data_stack_ends_with_a_summary_by_item_that_adds_up() {
    let data = data_rootfs();
    if skip_unless(data.join("usr/bin/python3").exists(), &format!("no data rootfs at {} (make rootfs-data)", data.display())) {
        return;
    }
    let mut extra = args(&["--step-timeout", "120", "--policy"]);
    extra.push(repo().join("policies/data.json").display().to_string());
    extra.push("--rootfs".into());
    extra.push(data.display().to_string());
    let e = watch_cli(titanic_turns(), &extra).end();
    assert_eq!(e.code, Some(0), "{}\n{}", e.stdout, e.stderr());
    let (_, s) = check_served(&e.run.root, e.mock.served_replies(), e.mock.served_tokens());
    let items: Vec<(&str, &str)> = s.items.iter().map(|i| (i.name.as_str(), i.outcome.as_str())).collect();
    assert_eq!(items, [("survival-summary", "done"), ("charts", "done"), ("deck", "done")]);
    let agents: Vec<Vec<String>> = s.items.iter().map(|i| i.agents.clone()).collect();
    assert_eq!(
        agents,
        [
            vec!["subagent-1".to_string()],
            vec!["subagent-2".into()],
            vec!["subagent-3".into()]
        ]
    );
    // By item (with the orchestrator's own line), the tokens are all the run's.
    let by_item: u64 = s.items.iter().chain([&s.orchestrator]).map(|i| i.tokens_in + i.tokens_out).sum();
    assert_eq!(by_item, s.total.tokens_in + s.total.tokens_out);
    assert!(s.items.iter().all(|i| i.wall_ms > 0.0 && i.wall_share > 0.0 && i.wall_share < 1.0), "{:?}", s.items);
    let read = s.by_tool.iter().find(|t| t.tool == "read_file_content").unwrap();
    assert!(read.tokens_in > 0, "the CSV read early is paid in every later prompt: {:?}", s.by_tool);
    for f in [
        "summary.csv",
        "survival_by_class_sex.png",
        "age_histogram.png",
        "presentation.pptx",
    ] {
        assert!(e.run.f.export.join(f).is_file(), "{f} was not delivered\n{}", e.stderr());
    }
    // The table, for the eye: `cargo test ... -- --nocapture`.
    eprintln!("{}", e.stdout);
}
