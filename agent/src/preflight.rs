//! Before the first model call: one tiny step, in a jail made exactly as
//! the run's steps are (`jail run --json` with the run's `--policy`,
//! `--rootfs` and folders), proves that the rootfs is there, that its
//! Python runs under the policy, and that every module the policy preloads
//! is in it. A wrong rootfs or policy is then one line naming the fix, and
//! costs no model call (issue 34: 22 model calls were spent on a rootfs
//! that did not exist).

use std::time::Duration;

use jail::client::command::{Mode, Script};
use jail::client::run::{self, RunError};
use jail::result::Status;

use crate::runner::Runner;
use crate::session::Session;

/// The check itself: the interpreter's version, and which preload modules
/// (their top-level package) the rootfs lacks. `find_spec` imports nothing
/// but the parents of a dotted name, so the check costs no import time.
const CHECK: &str = "import importlib.util, json, sys\nwant = json.loads(WANT)\nmissing = [m for m in want if importlib.util.find_spec(m.split('.')[0]) is None]\nprint(json.dumps({'python': sys.version.split()[0], 'missing': missing}))\n";

/// The longest the check may take.
const CHECK_WAIT: Duration = Duration::from_secs(60);

/// Run the check; the error is one line that says what to do.
pub fn check(runner: &Runner, session: &Session) -> Result<(), String> {
    let policy = match &runner.policy {
        Some(p) => jail::policy::Policy::load(p),
        None => jail::policy::Policy::builtin_default(),
    }
    .map_err(|e| format!("policy: {e} (check it with `jail check FILE`)"))?;
    let policy_name = runner
        .policy
        .as_ref()
        .map_or_else(|| "the built-in default policy".to_string(), |p| format!("policy {}", p.display()));
    let rootfs_name = runner
        .rootfs
        .as_ref()
        .map_or_else(|| "the rootfs `jail` finds by default".to_string(), |r| format!("rootfs {}", r.display()));
    let wait = runner.wall_limit.min(CHECK_WAIT);
    // The list as a JSON string inside a Python string literal: both are
    // JSON's own escapes, so no name can break out of it.
    let want = serde_json::to_string(&serde_json::json!(policy.preload).to_string()).unwrap_or_else(|_| "'[]'".into());
    let mut spec = runner.spec(Mode::Json, Script::Inline(CHECK.replace("WANT", &want)), wait);
    spec.flags.limits.timeout = Some(wait);
    spec.input = Some(session.input.clone());
    spec.output = Some(session.output.clone());
    let result = run::spawn(&spec).and_then(|r| r.wait(|_| {})).map_err(|e| match e {
        RunError::NoResult { stderr, .. } => {
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim_start_matches("jail: ");
            format!(
                "the steps' jail cannot start ({policy_name}, {rootfs_name}): {}",
                crate::llm::excerpt(if last.is_empty() { "no result" } else { last }, 400)
            )
        }
        e => runner.error_of(e).to_string(),
    })?;
    if result.status == Status::SetupFailed {
        let why = result.setup_error.as_ref().map_or_else(String::new, |e| {
            let mut w = format!("{} ({})", e.message, e.stage);
            for c in e.causes.iter().take(3) {
                w.push_str(": ");
                w.push_str(c);
            }
            w
        });
        return Err(format!(
            "the steps' jail cannot start with {rootfs_name} and {policy_name}: {}; give another rootfs (--rootfs DIR, --rootfs-name NAME) or fix the policy (jail check FILE)",
            crate::llm::excerpt(&why, 500)
        ));
    }
    if result.status != Status::Ok {
        let said = result
            .error
            .as_ref()
            .map_or_else(|| result.stderr.text.clone(), |e| format!("{}: {}", e.kind, e.message));
        return Err(format!(
            "Python does not run in the steps' jail on {rootfs_name} ({}: {}): give a rootfs with python3 (--rootfs-name minimal or data)",
            serde_json::to_value(result.status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            crate::llm::excerpt(&said, 300)
        ));
    }
    let said: serde_json::Value = serde_json::from_str(result.stdout.text.trim()).unwrap_or_default();
    let missing: Vec<&str> = said["missing"]
        .as_array()
        .map(|m| m.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    if !missing.is_empty() {
        return Err(format!(
            "{rootfs_name} lacks {}, which {policy_name} preloads: use the data rootfs (--rootfs-name data; build it with `jail rootfs build data`), or a policy that does not preload them",
            missing.join(", ")
        ));
    }
    Ok(())
}
