//! One file judged by the rules a step's output is judged by, when the
//! file is a copy the supervisor already holds (a session's files API,
//! session/files.rs): its name, its size, its extension, its content
//! (inspect.rs), and a CSV/TSV's formula cells neutralised, as at the end
//! of a run. The copy is the supervisor's own, so nothing can change it
//! while it is judged: what passes is exactly what is returned.
//!
//! Also the one check of a caller's path inside the output folder: each
//! component a name an artifact may have (`check_name`), no deeper than
//! `max_depth`.

use std::io::Cursor;
use std::time::{Duration, Instant};

use super::budget::{Deadline, Spend};
use super::neutralise::{self, NeutraliseError};
use super::rules::{ArtifactRules, FormulaCells};
use super::{check_name, extension, inspect, name_size_refusal};
use crate::result::{Artifact, Change, FlagKind, Neutralised, RejectReason};

/// How long one file's scan and neutralising may take: the run's judging
/// budget (budget.rs, `JUDGING_CPU`).
const SCAN_TIME: Duration = super::budget::JUDGING_CPU;

/// A caller's path inside the output folder, as its `/`-separated
/// components, or why it is refused. Empty (the folder itself) only when
/// `folder_ok`.
pub(crate) fn check_rel<'a>(
    rel: &'a str,
    rules: &ArtifactRules,
    folder_ok: bool,
) -> Result<Vec<&'a str>, (RejectReason, String)> {
    let bad = |why: String| Err((RejectReason::BadName, why));
    if rel.is_empty() {
        return if folder_ok {
            Ok(Vec::new())
        } else {
            bad("an empty path: name a file".into())
        };
    }
    if rel.starts_with('/') || rel.ends_with('/') {
        return bad(format!("{rel:?} must be relative, with no `/` at either end"));
    }
    let parts: Vec<&str> = rel.split('/').collect();
    if parts.len() > rules.max_depth as usize {
        return Err((
            RejectReason::TooDeep,
            format!("{} components, over artifacts.max_depth ({})", parts.len(), rules.max_depth),
        ));
    }
    for part in &parts {
        if part.is_empty() || *part == "." {
            return bad(format!("{rel:?} has an empty or `.` component"));
        }
        check_name(part.as_bytes(), rules.max_name_bytes)?;
    }
    Ok(parts)
}

/// Judge `bytes`, the content of the file `rel` as copied: the artifact
/// as it would reach the host, and the bytes that would (a CSV/TSV with
/// formula cells neutralised); or why it would be refused.
pub(crate) fn judge_copy(
    rel: &str,
    bytes: Vec<u8>,
    rules: &ArtifactRules,
) -> Result<(Artifact, Vec<u8>), (RejectReason, String)> {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let ext = extension(name);
    let size = bytes.len() as u64;
    if let Some(refusal) = name_size_refusal(name, size, rules) {
        return Err(refusal);
    }
    let until = Instant::now() + SCAN_TIME;
    let seen =
        inspect::inspect(&mut Cursor::new(&bytes), size, &ext, Deadline::at(until), rules.past_budget).map_err(|e| match e {
            inspect::Unjudged::Read(e) => (RejectReason::Unreadable, format!("read: {e}")),
            inspect::Unjudged::OverBudget { read } => {
                (RejectReason::NotJudged, format!("judged {read} of its {size} bytes within {}s", SCAN_TIME.as_secs_f64()))
            }
        })?;
    let mut artifact = Artifact {
        path: rel.to_string(),
        bytes: seen.bytes,
        sha256: Some(seen.sha256),
        media_type: Some(seen.media_type),
        change: Change::Unchanged,
        flags: seen.flags,
        summary: seen.summary,
        neutralised: None,
    };
    let formula = artifact.flags.iter().any(|f| f.kind == FlagKind::FormulaInjection);
    if !formula || rules.formula_cells != FormulaCells::Neutralise {
        return Ok((artifact, bytes));
    }
    let Some(delim) = seen.csv_delimiter else {
        return Err((
            RejectReason::FormulaCells,
            "a spreadsheet with formula cells, which the jail does not rewrite; \
             set artifacts.formula_cells to \"flag\" to receive it as it is"
                .into(),
        ));
    };
    // Neutralising can grow a file by one `'` a cell.
    let limit = rules.max_file_bytes.max(size).saturating_mul(2);
    let mut out = Vec::with_capacity(bytes.len() + 1024);
    let spend = Spend::with_limit(SCAN_TIME);
    match neutralise::neutralise(&mut Cursor::new(&bytes), size, delim, &mut out, limit, until, spend) {
        Ok(w) => {
            artifact.neutralised = Some(Neutralised {
                cells: w.cells,
                original_bytes: artifact.bytes,
                original_sha256: artifact.sha256.clone().unwrap_or_default(),
            });
            artifact.bytes = w.bytes;
            artifact.sha256 = Some(w.sha256);
            Ok((artifact, out))
        }
        Err(NeutraliseError::TooBig { limit }) => {
            Err((RejectReason::FormulaCells, format!("neutralising its formula cells would pass {limit} bytes")))
        }
        Err(e) => Err((RejectReason::FormulaCells, format!("its formula cells could not be neutralised: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> ArtifactRules {
        crate::policy::Policy::builtin_default().unwrap().artifacts
    }

    #[test]
    fn a_callers_path_is_taken_only_as_plain_names_beneath_the_folder() {
        let r = rules();
        assert_eq!(check_rel("a/b.csv", &r, false).unwrap(), vec!["a", "b.csv"]);
        assert_eq!(check_rel("", &r, true).unwrap(), Vec::<&str>::new());
        for bad in [
            "",
            "/etc/passwd",
            "../x.txt",
            "a/../b.txt",
            "a//b.txt",
            "./a.txt",
            "a/",
            "-rf.txt",
            "a\u{202e}.txt",
        ] {
            assert!(check_rel(bad, &r, false).is_err(), "{bad:?} was taken");
        }
        let deep = vec!["d"; r.max_depth as usize + 1].join("/");
        assert!(check_rel(&deep, &r, false).is_err());
    }

    #[test]
    fn a_copy_is_judged_as_an_output_file_would_be() {
        let r = rules();
        let (a, bytes) = judge_copy("t.csv", b"a,b\n=1+1,2\n".to_vec(), &r).unwrap();
        assert_eq!(a.neutralised.as_ref().map(|n| n.cells), Some(1));
        assert_eq!(bytes, b"a,b\n'=1+1,2\n");
        let (refused, _) = judge_copy("x.exe", b"MZ".to_vec(), &r).unwrap_err();
        assert_eq!(refused, RejectReason::ExtensionNotAllowed);
        let small = ArtifactRules { max_file_bytes: 10, ..r.clone() };
        assert_eq!(judge_copy("big.txt", vec![b'a'; 11], &small).unwrap_err().0, RejectReason::TooLarge);
        let (png, _) = judge_copy("fake.png", b"not a png at all".to_vec(), &r).unwrap();
        assert!(png.flags.iter().any(|f| f.kind == FlagKind::MediaTypeMismatch), "{png:?}");
    }
}
