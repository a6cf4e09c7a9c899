//! Each cell's files with that cell's result: what the cell made, changed
//! or deleted in `/workspace/output`, judged by the rules the end of a run
//! judges by (artifacts.rs), so that a client sees a cell's chart as the
//! cell ends instead of when the session does.
//!
//! Session supervisor side, in the output tmpfs the files API works in
//! (files.rs, `Place`). As a cell starts, the folder's names and metadata
//! are noted (no content is read). As it ends, the folder is looked at
//! again the same way; when nothing changed, that is all. Otherwise the
//! jail's processes are held still (still.rs: the run cgroup's freezer,
//! else SIGSTOP), so that no thread a cell left behind can change a file
//! while it is judged, and what changed since the cell began is judged,
//! acting as the sandbox's host ids (fsid.rs) as the end's judging does.
//! A tree that cannot be held within [`HOLD_WITHIN`] is not judged: the
//! result says so, as a refusal of the folder (`not_judged`). The judging
//! costs the supervisor at most [`CELL_JUDGING`] of CPU a cell.
//!
//! Nothing is delivered from here: a client reads a cell's file through
//! the files API (a judged copy), and everything is judged and delivered
//! once more when the session ends, with its tree dead. A session whose
//! output is the host folder itself has no tmpfs, and its cells list
//! nothing: the code writes that folder directly.

use std::time::Duration;

use super::files::Place;
use crate::artifacts::{self, budget::Spend, Before, Scope};
use crate::fsid::{Acting, As};
use crate::result::{Artifact, Disposition, RejectReason, RejectedArtifact};
use crate::watch::Tree;

/// How long the jail's processes may take to be held still.
pub(crate) const HOLD_WITHIN: Duration = Duration::from_secs(1);

/// The supervisor CPU one cell's judging may cost (budget.rs): a quarter
/// of a run's, since a session has many cells and the end judges all
/// again. What is past it is handled by `artifacts.past_budget`, as at
/// the end of a run.
pub(crate) const CELL_JUDGING: Duration = Duration::from_millis(250);

/// The output folder as a cell starts; `None` without a tmpfs. When it
/// could not be noted, why: the cell then lists no change but one
/// `not_judged` refusal, rather than everything as created.
pub(super) fn noted(place: Option<Place<'_>>) -> Option<Noted> {
    let p = place?;
    Some(as_sandbox(&p, || Before::output_at(p.tmpfs, p.rules)))
}

/// The output folder as a cell started, or why it could not be noted.
pub(super) type Noted = Result<Before, String>;

/// What changed since `before`, judged; both empty when nothing did.
pub(super) fn judged(place: Option<Place<'_>>, before: &Noted, tree: &Tree<'_>) -> (Vec<Artifact>, Vec<RejectedArtifact>) {
    let Some(p) = place else { return (Vec::new(), Vec::new()) };
    let before = match before {
        Ok(before) => before,
        Err(why) => return not_judged(why.clone()),
    };
    // This first look is at a tree that may still move: it only says
    // whether to hold it. What is judged is listed again below, held.
    match as_sandbox(&p, || before.unchanged_at(p.tmpfs, p.rules)) {
        Ok(true) => return (Vec::new(), Vec::new()),
        Ok(false) => {}
        Err(e) => return not_judged(e),
    }
    // Held before acting as the sandbox: freezing writes the run cgroup,
    // which only the supervisor's own ids may.
    let hold = match tree.hold(HOLD_WITHIN) {
        Ok(hold) => hold,
        Err(e) => return not_judged(e),
    };
    let (still, spend) = (hold.still(), Spend::with_limit(CELL_JUDGING));
    match as_sandbox(&p, || artifacts::judge_at(p.tmpfs, before, p.rules, spend, still, Scope::Changes)) {
        Ok(c) => (c.artifacts, c.rejected),
        Err(e) => not_judged(e),
    }
}

/// `op` acting as the sandbox's host ids.
fn as_sandbox<T>(p: &Place<'_>, op: impl FnOnce() -> T) -> Result<T, String> {
    let mut fs = Acting::begin(p.ids).map_err(|e| format!("acting as the sandbox to judge the output: {e}"))?;
    fs.on(As::Jail, || Ok(op())).map_err(|e| format!("acting as the sandbox to judge the output: {e}"))
}

fn not_judged(why: String) -> (Vec<Artifact>, Vec<RejectedArtifact>) {
    let refusal = RejectedArtifact {
        path: ".".into(),
        reason: RejectReason::NotJudged,
        detail: format!("this cell's files were not judged ({why}); they are judged when the session ends"),
        disposition: Disposition::NotDelivered,
        moved_to: None,
    };
    (Vec::new(), vec![refusal])
}
