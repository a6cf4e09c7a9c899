//! `jail packages`: the Python packages a rootfs provides, from its manifest.

use std::fmt::Write;
use std::process::ExitCode;

use super::{emit, rootfs_search, RootfsArgs};
use crate::policy::Policy;
use crate::result::EXIT_SETUP_FAILED;

pub(crate) fn packages(args: &RootfsArgs, json: bool) -> ExitCode {
    let fail = |problem: String, fix: &str| {
        eprintln!("jail: {problem}: {fix}");
        ExitCode::from(EXIT_SETUP_FAILED as u8)
    };
    let rootfs = match rootfs_search(args, Policy::builtin_default().ok().as_ref()).find() {
        Ok((_, rootfs)) => rootfs,
        Err(e) => {
            eprintln!("jail: {e}");
            return ExitCode::from(EXIT_SETUP_FAILED as u8);
        }
    };
    let (manifest, rootfs_id) = match crate::rootfs::load(&rootfs) {
        Ok(Some(found)) => found,
        Ok(None) => {
            return fail(
                format!("rootfs {} has no manifest ({})", rootfs.display(), crate::rootfs::MANIFEST_PATH),
                "rebuild it with `jail rootfs build minimal` (or `data`)",
            )
        }
        Err(e) => {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
            return fail(format!("{e}{cause}"), "rebuild it with `jail rootfs build minimal` (or `data`)");
        }
    };
    if json {
        let report = crate::rootfs::Report { rootfs: rootfs.display().to_string(), rootfs_id, manifest };
        return emit(&format!("{}\n", serde_json::to_string_pretty(&report).unwrap_or_default()), ExitCode::SUCCESS);
    }
    let py = &manifest.python;
    let mut out = format!("rootfs {} (flavour {}, id {rootfs_id})\n", rootfs.display(), manifest.flavour);
    match &py.debian_package {
        Some(deb) => writeln!(out, "python {} ({}, Debian package {deb})", py.version, py.implementation),
        None => writeln!(out, "python {} ({})", py.version, py.implementation),
    }
    .ok();
    if manifest.packages.is_empty() {
        out.push_str("no packages beyond the standard library\n");
    } else {
        writeln!(out, "{} packages (name, version, import as):", manifest.packages.len()).ok();
        for p in &manifest.packages {
            writeln!(out, "  {:<20} {:<12} {}", p.name, p.version, p.imports.join(", ")).ok();
        }
    }
    emit(&out, ExitCode::SUCCESS)
}
