//! `jail pool`: jails made ahead, each used for one request, then destroyed
//! (issue 18 item 2).
//!
//! # Protocol (JSON lines over the pool's stdin and stdout)
//!
//! The caller runs `jail pool [run options] --size N` as its own child and
//! writes one JSON object per line on its stdin; the pool writes one JSON
//! object per line on its stdout. Nothing else is written to stdout (logs go
//! to stderr). Requests may be pipelined; every reply carries the request's
//! `id`, and replies come in the order requests finish, not the order they
//! were sent.
//!
//! A request (unknown fields are an error):
//!
//! ```json
//! {"id": "r1", "code": "print(1)", "input": "/abs/in", "output": "/abs/out",
//!  "args": ["a"], "limits": {"wall_time_secs": 5, "cpu_time_secs": 2}}
//! ```
//!
//! - `id`: 1 to 128 printable characters, chosen by the caller.
//! - exactly one of `code` (the script's text) or `script` (an absolute
//!   path of a host file, opened without following links, read by the pool
//!   and sent to the jail as `jail run FILE` would copy it).
//! - `input` (optional): an absolute host folder, attached read-only,
//!   nosuid, nodev, noexec at `/workspace/input` of the claimed jail; the
//!   path is resolved one component at a time without following a link.
//! - `output` (optional): an absolute host folder that receives what the
//!   step left in `/workspace/output` (the jail's own capped tmpfs), as
//!   `jail run --output` delivers it.
//! - `args` (optional): the script's `sys.argv[1:]`.
//! - `limits` (optional): `wall_time_secs` and `cpu_time_secs`, each above
//!   0 and at most the policy's. Memory, pids and CPUs are the pool's (set
//!   when the jail was made) and cannot be overridden per request.
//!
//! The reply is either `{"id": "r1", "result": RunResult}` — the same
//! object `jail run --json` prints, valid against
//! schema/result.schema.json — or `{"id": "r1", "error": {"code": "...",
//! "message": "one line naming the problem and the fix"}}` (the `id` is
//! `null` when the line had none or could not be read). Error codes:
//! `malformed` (not a JSON object), `unknown_field`, `bad_request` (a field
//! with a bad value), `limit_above_policy`, `duplicate_id` (an id still in
//! flight), `draining` (stdin ended or SIGTERM), `internal`.
//!
//! `{"op": "stats"}` (an `id` is optional) answers
//! `{"id": ..., "stats": {"size": N, "ready": R, "in_use": U,
//! "refill_ms": {"last": L, "mean": M}, "idle_rss_bytes": B}}`.
//!
//! End of stdin: no new request is taken, the ones in flight finish and are
//! answered, the ready jails are destroyed, and the pool exits 0 leaving no
//! process, cgroup, mount or temp dir. SIGTERM does the same. SIGKILL of the
//! pool kills every jail too: each pooled jail's PID 1 has the pool as its
//! parent-death signal target, and its cgroup is killed by whoever next
//! cleans the pool's parent cgroup.
//!
//! # How a claimed jail gets its folders (settled by
//! scripts/experiments/attach_mount.py on 6.18, as root and as an ordinary
//! user)
//!
//! [`attach`] forks a helper that joins the jail's user namespace,
//! unshares a mount namespace of its own (owned by that user namespace, so
//! the clone below is allowed to an ordinary user), resolves the host folder
//! with openat2 `RESOLVE_NO_SYMLINKS`, clones it with
//! `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`, sets it read-only, nosuid,
//! nodev, noexec recursively with `mount_setattr`, joins the jail's mount
//! namespace and `move_mount`s the clone onto the mount point. It takes
//! 1–4 ms. A landlock rule made ahead on the (then empty) mount point does
//! NOT cover the tree attached there later — landlock's walk skips a hidden
//! mount point — so a pooled jail's read rule is on the mount point's
//! parent, `/workspace`.

pub mod attach;
pub mod protocol;
