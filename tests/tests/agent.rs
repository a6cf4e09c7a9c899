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
use jail_tests::mock_llm::{call, text_turn, tool_turn, MockLlm, Turn};
use jail_tests::{agent_bin, data_rootfs, is_root, jail_bin, repo, rootfs, skip_unless};
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
        runner: Runner { jail: jail_bin(), policy: None, rootfs: Some(rootfs.clone()), timeout: None, wall_limit: Duration::from_secs(15) },
        rootfs: Some(rootfs),
        skills_dir: None,
        caps: Caps::default(),
        budget: Budget::default(),
        owner: run::owner_for(None).expect("owner"),
        progress: Progress::Quiet,
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
            m.iter().filter(|m| m["role"] == "tool").map(|m| m["content"].as_str().unwrap_or_default().to_string()).collect()
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
    let records = trace::read(&root.join("trace.jsonl")).expect("trace.jsonl");
    let saved: Summary = serde_json::from_str(&std::fs::read_to_string(root.join("summary.json")).expect("summary.json"))
        .expect("summary.json parses");
    let text = std::fs::read_to_string(root.join("summary.txt")).expect("summary.txt");
    let Some(Event::RunEnd { stop, wall_ms }) = records.last().map(|r| r.event.clone()) else {
        panic!("the trace does not end with run_end: {records:?}")
    };
    assert_same_summary(&Summary::from_records(&records, wall_ms, &stop), &saved);

    let model_calls: Vec<_> = records.iter().filter(|r| matches!(r.event, Event::ModelCall { .. })).collect();
    let replies = mock.served_replies();
    assert_eq!(model_calls.len(), replies, "model calls traced vs replies served");
    let (tin, tout) = mock.served_tokens();
    assert_eq!((saved.total.tokens_in, saved.total.tokens_out), (tin, tout), "tokens in the summary vs served");
    assert_eq!(saved.total.model_calls as usize, replies);

    let sum = |f: &dyn Fn(&agent::trace::AgentRow) -> f64| saved.by_agent.iter().map(f).sum::<f64>();
    assert_eq!(saved.by_agent.iter().map(|a| a.tokens_in).sum::<u64>(), saved.total.tokens_in);
    assert_eq!(saved.by_agent.iter().map(|a| a.tokens_out).sum::<u64>(), saved.total.tokens_out);
    assert!((sum(&|a| a.model_ms) - saved.total.model_ms).abs() < 1e-6);
    assert!((sum(&|a| a.tool_ms) - saved.total.tool_ms).abs() < 1e-6);
    assert!((saved.by_tool.iter().map(|t| t.tool_ms).sum::<f64>() - saved.total.tool_ms).abs() < 1e-6);
    assert_eq!(saved.by_tool.iter().map(|t| t.calls).sum::<u64>(), saved.total.tool_calls);
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
            && (r.model_calls, r.tokens_in, r.tokens_out, r.tool_calls) == (s.model_calls, s.tokens_in, s.tokens_out, s.tool_calls)
            && close(r.model_ms, s.model_ms)
            && close(r.tool_ms, s.tool_ms)
    };
    let same = a.by_agent.len() == b.by_agent.len()
        && a.by_agent.iter().zip(&b.by_agent).all(|(r, s)| rows(r, s))
        && rows(&a.total, &b.total)
        && a.by_tool.len() == b.by_tool.len()
        && a.by_tool.iter().zip(&b.by_tool).all(|(r, s)| {
            (&r.tool, r.calls, r.errors) == (&s.tool, s.calls, s.errors) && close(r.tool_ms, s.tool_ms) && close(r.jail_wall_ms, s.jail_wall_ms)
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
    z.by_name(name).unwrap_or_else(|e| panic!("{name} missing from the deck: {e}")).read_to_string(&mut s).expect("read");
    s
}

/// The full path: a two-item plan; item 1 writes code, hits a Python error,
/// fixes it and succeeds; item 2 builds a deck; then the final answer.
fn full_run(rootfs: PathBuf, deck_script: &str, step_timeout: Option<f64>) -> (Fixture, MockLlm, Outcome) {
    let f = fixture();
    let turns = vec![
        tool_turn(&[("create_todo_list", plan(&[("class-summary", &["/workspace/output/summary.csv"]), ("deck", &["/workspace/output/deck.pptx"])]))], (900, 120)),
        tool_turn(&[call("start_next_todo", json!({}))], (1000, 10)),
        tool_turn(&[call("read_skill", json!({"name": "eda"})), write("summary.py", SUMMARY_BUG), run_file("summary.py")], (700, 200)),
        tool_turn(&[write("summary.py", SUMMARY_FIXED), run_file("summary.py")], (1500, 260)),
        tool_turn(&[call("complete_todo", json!({"report": "summary.csv: survival by class"}))], (1900, 30)),
        tool_turn(&[call("start_next_todo", json!({}))], (1200, 10)),
        tool_turn(&[write("deck.py", deck_script), run_file("deck.py")], (800, 900)),
        tool_turn(&[call("complete_todo", json!({"report": "deck.pptx: one slide per class"}))], (1800, 25)),
        text_turn("Survival differed by class; see summary.csv and deck.pptx.", (1400, 40)),
    ];
    let mock = MockLlm::start(turns);
    let mut cfg = config(&f, &mock, rootfs);
    if let Some(t) = step_timeout {
        cfg.runner.timeout = Some(t);
        cfg.runner.wall_limit = Duration::from_secs_f64(t);
    }
    let outcome = run::run(&cfg).unwrap_or_else(|e| panic!("run failed: {e}"));
    (f, mock, outcome)
}

#[test]
fn a_two_item_plan_goes_from_an_error_through_a_fix_to_a_deck_and_a_final_answer() {
    let (f, mock, outcome) = full_run(rootfs(), DECK_STDLIB, None);
    let req = mock.requests();
    assert_eq!(req.len(), 9, "every scripted turn is used once");

    assert_eq!(outcome.stop, Stop::Finished);
    assert_eq!(outcome.answer, "Survival differed by class; see summary.csv and deck.pptx.");
    assert!(outcome.todo.items.iter().all(|i| i.state == State::Done), "{:?}", outcome.todo.items);

    // The request carries the model, the tools and the key.
    assert_eq!(req[0]["model"], "scripted");
    let tools: Vec<&str> = req[0]["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(tools.contains(&"create_todo_list") && !tools.contains(&"run_python_file"), "{tools:?}");
    assert!(req[0]["messages"][1]["content"].as_str().unwrap().contains("titanic.csv"), "the input files are listed for planning");

    // A sub-agent starts clean: its own system prompt and the item's brief only.
    let sub = req[2]["messages"].as_array().unwrap();
    assert_eq!(sub.len(), 2, "{sub:?}");
    assert!(sub[0]["content"].as_str().unwrap().starts_with("You are a sub-agent"));
    assert!(sub[1]["content"].as_str().unwrap().contains("Your item: class-summary"));
    let sub_tools: Vec<&str> = req[2]["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
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
    // The jail's own artifact record: type sniffed, change against the snapshot.
    assert!(fixed.contains("summary.csv (") && fixed.contains("text/csv, created)"), "{fixed}");

    // The orchestrator gets the report back as start_next_todo's result.
    let report = last_tool(&req[5]);
    assert!(report.contains("item 1 `class-summary` is done") && report.contains("summary.csv: survival by class"), "{report}");
    let second = req[6]["messages"].as_array().unwrap();
    assert_eq!(second.len(), 2, "the second sub-agent starts clean too");
    assert!(second[1]["content"].as_str().unwrap().contains("class-summary [Done]: summary.csv: survival by class"));

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
    assert!(last_tool(&req[7]).contains("deck.pptx ("), "the deck is listed to the model");

    // Delivered: the answer and the files, exported.
    assert_eq!(std::fs::read_to_string(session.root.join("answer.md")).unwrap().trim(), outcome.answer);
    let mut exported = outcome.exported.clone();
    exported.sort();
    assert_eq!(exported, ["deck.pptx", "summary.csv"]);
    assert!(f.export.join("deck.pptx").is_file());

    let (records, summary) = check_accounting(&session.root, &mock);
    let runs: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::ToolCall { tool, jail: Some(j), ok, .. } if tool == "run_python_file" => Some((j.status.clone(), *ok, j.wall_ms)),
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
    if skip_unless(data.join("usr/bin/python3").exists(), &format!("no data rootfs at {} (build it: make rootfs-data)", data.display())) {
        return;
    }
    for (name, script) in [("python-pptx", DECK_PPTX), ("zipfile", DECK_STDLIB)] {
        // The data stack imports in a few seconds; leave room on a loaded machine.
        let (_f, mock, outcome) = full_run(data.clone(), script, Some(120.0));
        assert_eq!(outcome.stop, Stop::Finished);
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
        tool_turn(&[call("list_available_packages", json!({})), write("fetch.py", NETWORK), run_file("fetch.py")], (120, 60)),
        tool_turn(&[call("block_todo", json!({"reason": "the sandbox has no network"}))], (300, 10)),
        text_turn("The data could not be downloaded: the sandbox has no network.", (200, 15)),
    ];
    let mock = MockLlm::start(turns);
    let outcome = run::run(&config(&f, &mock, rootfs())).unwrap_or_else(|e| panic!("{e}"));
    let req = mock.requests();
    let packages = &tool_messages(&req[3])[0];
    assert!(packages.contains("source: ") && packages.contains("standard library: python3."), "{packages}");
    assert!(packages.contains("third-party packages: none"), "the minimal rootfs has only the standard library: {packages}");
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
    assert!(records.iter().any(|r| matches!(&r.event, Event::AgentEnd { steps: 2, outcome, .. } if outcome.contains("step cap"))));
}

#[test]
fn malformed_and_unknown_tool_calls_get_tool_errors_not_a_crash() {
    let f = fixture();
    let turns = vec![
        tool_turn(&[("create_todo_list", "{\"items\": [ {\"name\": ".into()), call("delete_everything", json!({}))], (100, 20)),
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
    let mock = MockLlm::start(vec![text_turn("Sure! Here is my analysis.", (10, 5)), text_turn("As I said.", (12, 3))]);
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
        .args(["run", "--quiet", "--task", "anything", "--retries", "1", "--retry-base-ms", "1"])
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
        .args(["run", "--quiet", "--task", "EDA please", "--run-steps", "1", "--retry-base-ms", "1"])
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
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o070), (uid, jail_tests::sandbox_host_gid(), if is_root() { 0o070 } else { 0 }));
    assert_eq!(std::fs::metadata(a.input.join("titanic.csv")).unwrap().mode() & 0o777, 0o644);
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
    let mut policy: Value = serde_json::from_str(&std::fs::read_to_string(repo().join("policies/default.json")).unwrap()).unwrap();
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
