//! A session taking its caller's output folder after it was made: what
//! lets `jail pool` hand one of its ready jails out as a session (`"op":
//! "session"`), made ahead with an output folder of the pool's own, and
//! still give the caller what `jail session start --output DIR` gives:
//! `/workspace/output` filled from DIR, and at the end what passed
//! delivered back to DIR, judged against DIR as it was copied in.
//!
//! Session supervisor side. One control request (`{"op": "adopt_output",
//! "dir": DIR}` on the session's socket, which only its owner's uid can
//! use), taken at most once, and refused once a cell other than the
//! trusted preload has run: the output tmpfs is filled with nothing inside
//! running but the driver, waiting between cells, as at the start
//! (output.rs, `copy_in`: "runs before the script starts"). The preload is
//! one cell when the session's start ran it (`StartOptions::preload`,
//! preload.rs: a pool asks for it) and its policy has a `preload`;
//! otherwise no cell may have run.
//!
//! Only a size-capped output folder can be taken (the default): the jail
//! holds it as a tmpfs the supervisor fills and mirrors. A policy with
//! `output_size: "unlimited"` binds the host folder when the jail is made,
//! and that bind cannot be moved.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::artifacts::{ArtifactRules, Before};
use crate::output::{self, FsIds, Inventory};
use crate::step::Delivery;

/// What the session needs to take another output folder, and whether it
/// has taken one.
pub(crate) struct Adoption {
    /// The jail's output tmpfs and the sandbox's host ids, once the launch
    /// filled it (`None` with a bound output folder).
    tmpfs: Option<(OwnedFd, FsIds)>,
    rules: ArtifactRules,
    /// The session's input folder, digested again at the adoption (a pool
    /// copies its caller's input in just before).
    input: Option<PathBuf>,
    /// Cells that may have run before: the preload the start ran.
    trusted_cells: u64,
    taken: Option<Taken>,
    /// Set once the request was taken (or refused for good).
    used: bool,
}

/// The output folder taken, as the delivery at the end needs it.
struct Taken {
    dir: PathBuf,
    inventory: Inventory,
    before: Before,
}

impl Adoption {
    pub(crate) fn new(rules: ArtifactRules, input: Option<PathBuf>, trusted_cells: u64) -> Adoption {
        Adoption { tmpfs: None, rules, input, trusted_cells, taken: None, used: false }
    }

    /// The launch filled the output tmpfs: keep a descriptor of it.
    pub(crate) fn hold(&mut self, tmpfs: Option<&OwnedFd>, ids: FsIds) {
        self.tmpfs = tmpfs.and_then(|fd| fd.try_clone().ok()).map(|fd| (fd, ids));
    }

    /// The output tmpfs, its owner's ids and the session's artifact rules
    /// (the files API's place, files.rs); `None` with a bound output folder.
    pub(crate) fn place(&self) -> Option<super::files::Place<'_>> {
        self.tmpfs.as_ref().map(|(tmpfs, ids)| super::files::Place { tmpfs, ids: *ids, rules: &self.rules })
    }

    /// Take `dir` as the output folder: fill the jail's output from it and
    /// judge the session's changes against it from now on. `cells_run` is
    /// how many cells the session has run. An error is one line for the
    /// client.
    pub(crate) fn take(&mut self, dir: &Path, cells_run: u64) -> Result<(), String> {
        if self.used {
            return Err("this session already took its output folder: it takes one, once".into());
        }
        if cells_run > self.trusted_cells {
            return Err(format!(
                "{cells_run} cells have run in this session: an output folder is taken only before any untrusted cell; \
                 start a new session with --output"
            ));
        }
        if !dir.is_absolute() {
            return Err(format!("{} is relative: give an absolute folder", dir.display()));
        }
        let Some((tmpfs, ids)) = &self.tmpfs else {
            return Err(
                "this session's output folder is bound into the jail (filesystem.output_size \"unlimited\"): it cannot take \
                 another; use a capped output_size"
                    .into(),
            );
        };
        self.used = true;
        let inventory = output::copy_in(dir, tmpfs, *ids).map_err(|e| crate::stage::chain_line(&e))?;
        // The state the session's changes are judged against: the folder
        // as copied in, and the input as it is now.
        let mut before = Before::take(dir, self.input.as_deref(), &self.rules).map_err(|e| crate::stage::chain_line(&e))?;
        before.retake_output_at(tmpfs, &self.rules);
        self.taken = Some(Taken { dir: dir.to_path_buf(), inventory, before });
        Ok(())
    }

    /// The session is over and its tree dead: when it took an output
    /// folder, where the step is judged and delivered (verdict.rs);
    /// `None`: as planned.
    pub(crate) fn delivery(&mut self) -> Option<Delivery> {
        let t = self.taken.take()?;
        Some(Delivery {
            output_dir: Some(t.dir.display().to_string()),
            host_dir: t.dir,
            before: t.before,
            inventory: Some(t.inventory),
        })
    }
}
