//! `jail doctor`: what this host provides to the jail, and how to fix what is missing.

use std::fmt::Write;
use std::process::ExitCode;

use super::{emit, env_var, rootfs_search, RootfsArgs};
use crate::hostenv;
use crate::locate;
use crate::policy::Policy;

pub(crate) fn doctor(json: bool, rootfs: &RootfsArgs) -> ExitCode {
    let policy = Policy::builtin_default();
    let ctx = crate::doctor::Context {
        rootfs: rootfs_search(rootfs, policy.as_ref().ok())
            .find()
            .map(|(source, path)| (path, source.describe().to_string()))
            .map_err(|e| e.to_string()),
        cgroup_parent: hostenv::path_var(&env_var, hostenv::CGROUP_PARENT_VAR),
        policy: match &policy {
            Ok(p) => {
                format!("the built-in default (policies/default.json compiled in), sha256 {}; --policy FILE overrides", p.hash)
            }
            Err(e) => format!("the built-in default does not load: {e}"),
        },
        flavours: locate::DEFAULT_ORDER
            .iter()
            .map(|name| {
                let by_name = RootfsArgs { rootfs: None, rootfs_name: name.to_string() };
                let mut search = rootfs_search(&by_name, None);
                search.env = None;
                (name.to_string(), search.find().ok().map(|(_, p)| p))
            })
            .collect(),
    };
    let report = crate::doctor::run(&ctx);
    let mut out = String::new();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report).unwrap_or_default()).ok();
    } else {
        writeln!(out, "kernel {} (running as uid {})", report.kernel, report.uid).ok();
        for c in &report.checks {
            writeln!(out, "{:<4} {:<16} {}", if c.ok { "ok" } else { "MISSING" }, c.name, c.detail).ok();
            if let Some(fix) = &c.fix {
                writeln!(out, "     {:<16} fix: {fix}", "").ok();
            }
        }
    }
    emit(&out, if report.all_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
