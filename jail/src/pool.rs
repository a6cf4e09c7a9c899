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
//!  "args": ["a"], "limits": {"wall_time_secs": 5}}
//! ```
//!
//! - `id`: 1 to 128 printable characters, chosen by the caller.
//! - exactly one of `code` (the script's text) or `script` (an absolute
//!   path of a host file the jail's uid may read, read by the pool and
//!   sent to the jail as `jail run FILE` would copy it).
//! - `input` (optional): an absolute host folder, copied into the
//!   claimed jail's own input folder (bound read-only at
//!   `/workspace/input` when the jail was made): links are copied as
//!   links, resolved by the jail inside its own root; each entry keeps its
//!   mode; a hard link, a fifo, a device or an entry the jail's uid could
//!   not read fails the request (`bad_request`, each named).
//! - `output` (optional): an absolute path, absent or an empty folder, on
//!   the filesystem of the pool's temp dir (TMPDIR): the jail's output
//!   folder (delivered from its capped `/workspace/output` as `jail run
//!   --output` delivers it) is renamed to it, beneath its parent's
//!   descriptor. Without it, the reply's `output_dir` names a fresh
//!   `jail-output-*` folder in the temp dir.
//!
//! Every path is taken as every door takes a caller's path (accept.rs): no
//! link followed anywhere in it (a trailing slash, a linked parent,
//! `/proc/self/cwd` refused), opened once and used by descriptor.
//! - `args` (optional): the script's `sys.argv[1:]` (`sys.argv[0]` is
//!   `-c` for `code`, the file name for `script`).
//! - `limits` (optional): `wall_time_secs`, at least 0.001 and at most the pool's
//!   (`--timeout` or the policy's). CPU time, memory, pids and CPUs are the
//!   pool's (set when the jail was made) and cannot be changed per request.
//! - `events` (optional, `true` or `false`): the step's output live, below.
//!
//! The reply is either `{"id": "r1", "result": RunResult}` — the same
//! object `jail run --json` prints, valid against
//! schema/result.schema.json — or `{"id": "r1", "error": {"code": "...",
//! "message": "one line naming the problem and the fix"}}` (the `id` is
//! `null` when the line had none or could not be read). Error codes:
//! `malformed` (not a JSON object), `unknown_field`, `bad_request` (a field
//! with a bad value), `limit_above_policy`, `duplicate_id` (an id still in
//! flight), `draining` (stdin ended or SIGTERM), `internal`, `cancelled`
//! (below), and `unknown_id` (the answer to a cancel, below).
//!
//! # Cancelling a request (run/cancel.rs)
//!
//! `{"op": "cancel", "id": "r1"}` (no other field) stops request `r1` now,
//! which still gets exactly one reply. Its code running in a claimed jail:
//! the jail's session is cancelled (its supervisor gets SIGTERM), the
//! cell's whole tree is killed at once, and once the jail is gone (no
//! process, no cgroup) the reply is its result with `status: "cancelled"`,
//! `supervisor.cancelled_by: "pool_caller"`, no artifacts and `output_dir`
//! null (a step that finished just before the cancel keeps its own status,
//! with no artifacts either). Not yet in a jail (checked, or waiting for
//! one): the reply is the error `cancelled`, and nothing ran. The cancel
//! line itself gets no answer then. A cancel of an id not in flight (never
//! sent, or already answered) is answered `{"id": ID, "error": {"code":
//! "unknown_id", ...}}`, always after that id's own reply: a caller that
//! matches replies by id drops it. A session request (`op: session`) is
//! in flight until its session is handed over.
//!
//! With `"events": true` the pool writes, while the step runs and before
//! its reply, `{"id": "r1", "event": EVENT}` lines, EVENT one object exactly
//! as `jail run --events` prints it (events.rs): `stdout` and `stderr`
//! chunks in order, `truncated` once a stream passes its cap, `dropped`
//! when the pool did not take chunks by the step's deadline, and, once the
//! jail is stopped and its output judged, one `{"type": "artifact",
//! "artifact": {...}}` per accepted artifact. The step runs as a live
//! session cell (session/live.rs): a pool whose own reader is slow holds up
//! neither the step's deadline nor the jail's supervisor. Without `events`
//! only the reply is written.
//!
//! # Sessions from the pool (run/handout.rs)
//!
//! A session is a pooled jail that takes more than one cell from the same
//! owner. `{"id": "s1", "op": "session", "input": "/abs/in", "output":
//! "/abs/out"}` (both folders optional, no other field) claims a ready jail
//! (its preload already imported), copies `input` into its read-only
//! `/workspace/input` as a step's is, and hands it over: `{"id": "s1",
//! "session": {"handle": H, "id": I, "pid": P, "output_dir": D}}`. The
//! caller then uses `jail session exec H` and `jail session stop H` exactly
//! as for a session it started itself (the handle is usable only by the
//! pool's uid, which is the caller's). `output` behaves as `jail session
//! start --output`: it may hold files, `/workspace/output` is filled from
//! it, and what passed is delivered back to it when the session ends; it
//! is made (0700) when absent, and without it `output_dir` names a fresh
//! `jail-output-*` folder in the temp dir; a pool whose policy binds each
//! jail's output folder (`output_size: "unlimited"`) refuses the request
//! (`bad_request`). The pool makes a replacement at
//! once and removes the jail's folders when the session's supervisor is
//! gone. The session still ends with the pool, its lifeline: a pool that
//! drains stops it (what passed reaches `output`), and a pool killed with
//! SIGKILL ends it all the same. `{"op": "stats"}` counts the sessions
//! handed out and not ended in `sessions`. Its `session.idle_timeout_secs`
//! and `max_lifetime_secs` count from the hand-over (a ready jail waiting
//! in the pool is held to both from when it was made). A ready jail that
//! ended while it waited (either limit) is never handed out: the claim
//! takes the next.
//!
//! `{"op": "stats"}` (an `id` is optional) answers
//! `{"id": ..., "stats": {"size": N, "ready": R, "making": K, "in_use": U,
//! "refill_ms": {"last": L, "mean": M, "median": D, "p99": P},
//! "idle_rss_bytes": B, "sessions": Z, "idle": {"rss_bytes": R,
//! "pss_bytes": P, "anon_bytes": A, "uss_bytes": U},
//! "available_memory_bytes": A, "max_size": S}}`: `making` counts jails
//! being made, `refill_ms` how long making a jail took, from its start to
//! its preload done (the last one, the mean of all, and the median and p99,
//! by nearest rank, of the last 256; each 0 before the first jail is made:
//! run/refills.rs), `idle_rss_bytes` is what the last jail made holds once its
//! preload ran (shared pages counted in each of its processes), `idle` the
//! mean over the ready jails now of their resident, proportional (a page
//! shared by n processes counted 1/n: N ready jails' `pss_bytes` sum to
//! what they cost together), anonymous and unique memory (`uss_bytes`:
//! `Private_Clean` + `Private_Dirty`, the pages no other process maps,
//! what one more jail costs; a process whose `smaps_rollup` is refused
//! counts its resident memory in `pss_bytes` and `uss_bytes`, an upper
//! bound), `null` when no jail is ready (footprint.rs),
//! `available_memory_bytes` the memory available to the pool now and
//! `max_size` the largest `--size` that fits in it (at most 64; both `null`
//! when unknown).
//!
//! # Size bounded by memory (memory.rs)
//!
//! `--size N` is refused (one line naming the largest size that fits and
//! the fixes, exit 125, nothing left) when N times what a jail costs
//! exceeds the memory available to the pool: the lower of `MemAvailable`
//! and the memory limit of the pool's own cgroup. A jail costs its memory
//! limit (`limits.memory`, `--memory`), checked before any jail is made; a
//! jail with no memory limit costs the idle memory measured on the first
//! jail made, checked once that one is up.
//!
//! End of stdin: no new request is taken, the ones in flight finish and are
//! answered (one still waiting for a jail gets a jail made for it: no
//! other jail is made while draining), the ready jails are destroyed, and the pool exits 0 leaving no
//! process, cgroup, mount or temp dir. SIGTERM and SIGINT do the same.
//! SIGKILL of the pool ends every jail too: each pooled jail is a session
//! holding the read end of a pipe whose only write end is the pool's (its
//! lifeline, `jail session start --lifeline-fd`), and a session whose
//! lifeline hangs up ends and cleans up as `jail session stop` would.
//!
//! # How it is built (run.rs)
//!
//! A pooled jail is a `jail session` the pool starts as a child process:
//! the same namespaces, mounts, seccomp, landlock and limits as `jail run`.
//! Its first cell is the policy's trusted `preload` (imports, and one
//! figure drawn and saved when `matplotlib.pyplot` is listed), run by its
//! start (`jail session start --preload`, session/preload.rs) before any
//! untrusted code exists in it. A request gets one cell for its
//! `sys.argv` and one for its code; then the session is stopped, and its
//! closing result's verdict (its artifacts and every refused entry,
//! `RunResult::take_delivery`) goes in the reply. With a bound output
//! folder (`output_size: "unlimited"`), the quarantine of refused entries
//! follows the output folder, as `NAME.jail-rejected-N` beside it. No jail takes a second
//! request; a replacement is made in the background when one is claimed.
//!
//! # Forked from a template (run/template.rs, template.rs)
//!
//! A pool whose policy has a `preload` starts one template before its
//! first jail (`jail template`, pool/template.rs: a jail of its own whose
//! interpreter imported the preload), and each jail it makes is a fork of
//! it: `jail session start --template SOCKET`, whose jail the template
//! clones into fresh namespaces and the code every jail's child runs makes
//! a full jail (template.rs says what a fork shares and what is its own).
//! Its preload is the template's, so the session's first cell is the
//! caller's. A template that cannot be made (no `libjail.so` beside the
//! binary, a preload it cannot import), or whose first fork fails, is said
//! once on stderr, and the jails are made as above; a pool without a
//! preload has no template. A new template replaces it after
//! `--template-forks` jails (1,000) or `--template-secs` (600 s): a new
//! address-space layout (template.rs); the old one ends with its last jail. The
//! template ends with the pool (its lifeline, as a session's) and takes
//! every fork of it with it.
//!
//! # Attaching instead of copying (attach.rs, not used yet)
//!
//! Settled by scripts/experiments/attach_mount.py on 6.18, as root and as
//! an ordinary user: [`attach`] forks a helper that joins the jail's user namespace,
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
pub mod footprint;
pub mod memory;
pub mod run;
pub mod template;
