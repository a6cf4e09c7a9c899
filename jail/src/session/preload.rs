//! The trusted preload: the policy's `preload` modules imported as a
//! session's first cell, run by `start` before it returns, so before any
//! caller knows the handle and before any untrusted code exists in the
//! jail. It is asked for (`StartOptions::preload`, `jail session start
//! --preload`; `jail pool` asks for it), never inferred: only a session
//! whose start ran it counts that one cell as trusted when it takes an
//! output folder afterwards (adopt.rs).

use std::path::Path;
use std::time::Duration;

use crate::client::session;
use crate::result::Status;

/// Run the preload of `modules` in the session at `handle`, within the
/// session's own wall-clock limit; the reason when it did not end `ok`.
pub(crate) fn run(handle: &Path, modules: &[String], wall: Duration) -> Result<(), String> {
    let r =
        session::exec(handle, session::Cell::new(cell(modules), Some(wall))).map_err(|e| format!("the policy's preload: {e}"))?;
    if r.status == Status::Ok {
        return Ok(());
    }
    let why = r.error.map_or(r.stderr.text, |e| e.message);
    Err(format!(
        "the policy's preload failed in the jail ({}: {}): fix `preload` or use a rootfs that has these modules",
        serde_json::to_value(r.status).unwrap_or_default(),
        why.trim()
    ))
}

/// The preload cell: each module imported, and a figure drawn and saved
/// once when pyplot is there (font cache and backend set-up), leaving no
/// name behind in the cells' namespace. Last, everything it made is
/// frozen out of the garbage collector's reach: the session's exit
/// collects only what the later cells made (driver.py, `quick_exit`).
pub(crate) fn cell(modules: &[String]) -> String {
    let warm = if modules.iter().any(|m| m == "matplotlib.pyplot") {
        "    import io, matplotlib.pyplot as plt\n    fig = plt.figure()\n    fig.gca().plot([0, 1])\n    fig.savefig(io.BytesIO(), format=\"png\")\n    plt.close(fig)\n"
    } else {
        ""
    };
    format!(
        "def _jail_preload():\n    import importlib\n    for name in {}:\n        importlib.import_module(name)\n{warm}    import gc\n    gc.freeze()\n_jail_preload()\ndel _jail_preload\n",
        serde_json::Value::from(modules)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preload_cell_leaves_no_name_and_warms_pyplot_only_when_asked() {
        let c = cell(&["numpy".into()]);
        assert!(c.contains(r#"["numpy"]"#) && c.ends_with("del _jail_preload\n") && !c.contains("savefig"));
        assert!(cell(&["matplotlib.pyplot".into()]).contains("savefig"));
    }
}
