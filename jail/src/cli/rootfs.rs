//! `jail rootfs build|list`: the Python root filesystems runs use.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::{emit, rootfs_search, temp_dir, RootfsArgs};
use crate::locate;
use crate::result::EXIT_SETUP_FAILED;

#[derive(Subcommand)]
pub(crate) enum RootfsCommand {
    /// Build a rootfs from the recipes built into this binary and install it
    /// (as root into /var/lib/jail/rootfs/NAME, else ~/.local/share/jail/rootfs/NAME).
    Build {
        /// `minimal` (the host's Python, seconds) or `data` (numpy, pandas,
        /// matplotlib and the rest of the data stack, minutes: as root on
        /// Debian's Python (debootstrap), else on the host's Python from
        /// locked, hash-checked wheels, no root).
        flavour: String,
        /// Install into this folder instead (it is replaced).
        #[arg(long, value_name = "DIR")]
        dest: Option<PathBuf>,
    },
    /// List the installed rootfs folders, in lookup order.
    List {
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) fn rootfs_build(flavour: &str, dest: Option<PathBuf>) -> ExitCode {
    let search = rootfs_search(&RootfsArgs { rootfs: None, rootfs_name: flavour.to_string() }, None);
    let dest = match dest {
        Some(d) => Ok(d),
        None => crate::install::default_dest(&search, flavour, nix::unistd::geteuid().is_root()),
    };
    match dest.and_then(|d| crate::install::build(flavour, &d, &temp_dir()).map(|()| d)) {
        Ok(d) => {
            println!("installed the {flavour} rootfs at {}", d.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("jail: {e}");
            ExitCode::from(EXIT_SETUP_FAILED as u8)
        }
    }
}

pub(crate) fn rootfs_list(json: bool) -> ExitCode {
    let search = rootfs_search(&RootfsArgs { rootfs: None, rootfs_name: locate::DEFAULT_NAME.into() }, None);
    let listed = crate::install::list(&search);
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&listed).unwrap_or_default()), ExitCode::SUCCESS);
    }
    let mut out = String::new();
    if let Some(env) = &search.env {
        writeln!(out, "$JAIL_ROOTFS is set: runs use {} unless --rootfs names another", env.display()).ok();
    }
    if listed.is_empty() {
        out.push_str("no rootfs installed: build one with `jail rootfs build minimal`\n");
    }
    for l in &listed {
        let what = match (&l.flavour, &l.python) {
            (Some(f), Some(p)) => format!("{f}, python {p}"),
            _ => "no manifest".into(),
        };
        let shadow = if l.default_for_name { "" } else { " (shadowed by the one above)" };
        writeln!(out, "{:<10} {:<10} {} ({what}){shadow}", l.name, l.location, l.path.display()).ok();
    }
    emit(&out, ExitCode::SUCCESS)
}
