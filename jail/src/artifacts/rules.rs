//! The validated `artifacts` section of a policy: the bounds and rules the
//! supervisor judges the output dir by. `policy` builds it; the judgement
//! (`artifacts`, `delivery`) reads it, and so never imports `policy`.

/// The rules the supervisor applies to the output dir after a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRules {
    /// A regular file larger than this is refused, unread.
    pub max_file_bytes: u64,
    /// Accepted files are hashed and inspected up to this many bytes in all.
    pub max_total_bytes: u64,
    /// Accepted files, at most.
    pub max_files: u64,
    /// Entries of every kind the walk looks at before it stops.
    pub max_entries: u64,
    /// Entries one folder may hold; a wider folder is refused whole.
    pub max_dir_entries: u64,
    /// Path components of an artifact, at most (`a/b.txt` is 2).
    pub max_depth: u32,
    /// Bytes in one name.
    pub max_name_bytes: u32,
    pub allowed_extensions: Extensions,
    pub formula_cells: FormulaCells,
    /// Input dirs up to this total size are digested by content, larger ones
    /// by metadata.
    pub input_hash_max_bytes: u64,
    /// A file the judging budget (budget.rs, `JUDGING_CPU`) left unjudged.
    pub past_budget: PastBudget,
}

/// What becomes of a file the run's judging budget did not cover in full
/// (its hash, its scans, or its formula cells' neutralising).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PastBudget {
    /// Refused (`not_judged`, or `formula_cells` for a neutralising cut
    /// short): nothing more is read once the budget is spent.
    Refuse,
    /// Delivered as the script wrote it, flagged `incomplete_scan`: its
    /// scans stop, its formula cells are not neutralised, and its sha256
    /// is still read to the end (bounded by `max_total_bytes`).
    Flag,
}

/// Which file extensions may leave the output dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extensions {
    /// `["*"]`: any.
    Any,
    /// Lowercase extensions without the dot; `""` admits names without one.
    Only(std::collections::BTreeSet<String>),
}

impl Extensions {
    /// Whether a file whose (lowercased) extension is `ext` may leave.
    pub fn allows(&self, ext: &str) -> bool {
        match self {
            Extensions::Any => true,
            Extensions::Only(set) => set.contains(ext),
        }
    }
}

/// What to do with spreadsheet cells that would start a formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormulaCells {
    /// Flag the file (`formula_injection`) and deliver it as the script
    /// wrote it.
    Flag,
    /// Flag it, and deliver a flagged CSV/TSV with a `'` before each such
    /// cell; refuse a flagged XLSX (`formula_cells`), which is not rewritten.
    Neutralise,
}
