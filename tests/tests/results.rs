//! Rich results (jail/src/display.rs, artifacts/bundle.rs) through each
//! door of the jail — `jail run` (the script runner), a session's cell
//! and a pool's run (the cell driver) — and what the code cannot make of
//! them: a forged or lying bundle is judged as every other, the caps hold
//! however much the code writes, and a flood on the channel never stalls
//! the step. The service and the MCP server: tests/fronts.

use jail::result::{FlagKind, Status};
use jail_tests::*;

/// tests/shows.py's objects shown (a real PNG and HTML with a script;
/// a PNG that is an SVG), a dict, what the code prints, then the last
/// expression.
const SHOWS: &str = concat!(
    include_str!("../shows.py"),
    r#"
display(Chart())
display(Liar())
display({"a": 1})
print("printed")
6 * 7
"#
);

fn shows_through(runner: Runner) {
    let sb = Sandbox::with_runner(runner);
    let (r, out) = sb.run(SHOWS);
    assert_eq!(r.status, Status::Ok, "{runner:?}: {}\n{}", document(&r), String::from_utf8_lossy(&out.stderr));
    assert_eq!(r.stdout.text, "printed\n", "{runner:?}");
    let texts: Vec<&str> = r.results.iter().map(|x| x.data["text/plain"].as_str().unwrap()).collect();
    assert_eq!(texts, ["Chart()", "Liar()", "{'a': 1}", "42"], "{runner:?}: {}", document(&r));
    let main: Vec<bool> = r.results.iter().map(|x| x.is_main_result).collect();
    assert_eq!(main, [false, false, false, true], "{runner:?}");
    let chart = &r.results[0];
    assert!(chart.data.contains_key("image/png") && chart.data.contains_key("text/html"), "{runner:?}: {chart:?}");
    assert!(chart.flags.iter().any(|f| f.kind == FlagKind::Script), "the HTML's script is flagged: {chart:?}");
    let liar = &r.results[1];
    assert!(!liar.data.contains_key("image/png"), "a PNG that is an SVG reached the result: {liar:?}");
    assert!(liar.refused.iter().any(|x| x.mime == "image/png" && x.detail.contains("image/svg+xml")), "{liar:?}");
}

#[test]
fn jail_run_shows_the_last_expression_displays_and_judges_each_bundle() {
    shows_through(Runner::Run);
}

#[test]
fn a_sessions_cell_shows_them_the_same_way() {
    shows_through(Runner::SessionCell);
}

#[test]
fn a_pools_run_shows_them_the_same_way() {
    shows_through(Runner::PoolStep);
}

#[test]
fn a_pools_forked_run_shows_them_the_same_way() {
    shows_through(Runner::ForkedStep);
}

/// The code writes on the control channel itself: forged bundles (a PNG
/// that is text), more results than the cap, lines over the bound, and a
/// flood of garbage. Every forged bundle is judged, the caps hold, the
/// step ends as the script does, and what it printed arrives whole.
const FLOOD: &str = r#"
import json, os, stat
fds = [fd for fd in range(3, 64) if os.path.exists(f"/proc/self/fd/{fd}") and stat.S_ISSOCK(os.fstat(fd).st_mode)]
assert fds, "no control socket"
fd = fds[0]
def line(m):
    data = (json.dumps(m, separators=(",", ":")) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]
line({"op": "display", "id": 0, "nonce": "", "main": True, "data": {"image/png": "aGVsbG8=", "text/plain": "forged"}})
for i in range(200):
    line({"op": "display", "id": 0, "nonce": "", "main": False, "data": {"text/plain": "x" * 100000}})
os.write(fd, b'{"op":"display","data":{"text/plain":"' + b"y" * (5 << 20) + b'"}}\n')
for _ in range(64):
    os.write(fd, b"garbage " * 8192 + b"\n")
print("done")
"#;

#[test]
fn the_code_forging_and_flooding_results_gets_its_bundles_judged_and_the_caps_held() {
    for runner in [Runner::Run, Runner::SessionCell] {
        let sb = Sandbox::with_runner(runner);
        let started = std::time::Instant::now();
        let (r, _) = sb.run(FLOOD);
        assert_eq!(r.status, Status::Ok, "{runner:?}: {}", document(&r));
        assert_eq!(r.stdout.text, "done\n", "{runner:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "{runner:?}: {:?}", started.elapsed());
        if runner == Runner::SessionCell {
            // A cell's lines count only with its `exec`'s nonce, which
            // these do not carry: none is believed.
            assert!(r.results.is_empty() && r.results_dropped == 0, "{runner:?}: {:?}", r.results.len());
            continue;
        }
        let forged = &r.results[0];
        assert_eq!(forged.data.get("text/plain").and_then(|v| v.as_str()), Some("forged"), "{runner:?}");
        assert!(!forged.data.contains_key("image/png"), "a PNG that is text was listed: {forged:?}");
        assert_eq!(r.results.len(), jail::artifacts::bundle::MAX_RESULTS, "{runner:?}");
        assert!(r.results_dropped >= 200 - 31, "{runner:?}: dropped {}", r.results_dropped);
        let kept: usize = r.results.iter().flat_map(|x| x.data.values()).map(|v| v.as_str().map_or(0, str::len)).sum();
        assert!(kept <= jail::artifacts::bundle::MAX_STEP_BYTES, "{runner:?}: {kept} bytes kept");
    }
}

/// The runner keeps a script what `python SCRIPT` gives it: its argv,
/// `__file__`, `__name__`, its folder first on sys.path, a traceback that
/// starts in it, exit 1 on an uncaught exception, and no result from a
/// script that ends with a statement.
#[test]
fn the_script_runner_keeps_what_python_gives_a_script() {
    let sb = Sandbox::new();
    let mut cmd = sb
        .command("import json, sys\nprint(json.dumps([sys.argv, __file__, __name__, sys.path[0]]))\nraise ValueError('boom')\n");
    cmd.args(["a", "b"]);
    let out = cmd.output().unwrap();
    let r = parse(&out);
    assert_eq!(r.status, Status::NonzeroExit, "{}", document(&r));
    assert_eq!(r.exit_code, Some(1));
    let seen: serde_json::Value = serde_json::from_str(r.stdout.text.trim()).unwrap();
    let script = "/workspace/code/main.py";
    assert_eq!(seen, serde_json::json!([[script, "a", "b"], script, "__main__", "/workspace/code"]));
    assert_eq!(
        r.stderr.text,
        format!("Traceback (most recent call last):\n  File \"{script}\", line 3, in <module>\n    raise ValueError('boom')\nValueError: boom\n")
    );
    assert!(r.results.is_empty(), "{:?}", r.results);
}
