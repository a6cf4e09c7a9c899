//! `jail`: run untrusted Python in fresh Linux namespaces on a read-only
//! root filesystem, and report what happened as one JSON document.
//!
//! The map, in the order one run uses the modules (DESIGN.md §6):
//! - `hostenv`, `locate`, `inline`: what the caller's environment gives a run (read once by the CLI, cli.rs),
//!   which rootfs it uses, and a script given as `-c CODE` or on stdin.
//! - `envs`: THE one check of the variables a caller sets for a run, a session or a cell (every door's `env`).
//! - `policy`: the policy file, validated (with `digest` for its hash; `field` is the leaf error the facility validators return;
//!   `seconds` is the one check of a time limit, shared with the flags, the pool, the service and the MCP server).
//! - `supervisor`: one run's steps, in order; each step is one of the rooms below.
//! - `host`: the machine read once: caller, leased host uid (`hostuid`), kernel features, rlimits, the run cgroup.
//! - `cgroup`, `limits`, `rlimits`: the run cgroup, and what enforces each limit.
//! - `throttle`: the CPU quota without a cpu cgroup: the watch loop duty-cycles the tree (SIGSTOP/SIGCONT).
//! - `accept`: THE one way every door (run, session, pool, MCP, agent) takes a caller's path: no link followed, the
//!   jail's reach, modes never widened, hard links never copied.
//! - `request`: every path the user gave, checked through `accept`; the rootfs listed and identified (`rootfs`).
//! - `plan`: pure `plan(request, checked paths, host) -> RunPlan`: id maps, mounts, landlock rules, seccomp model, exec, limits, network, output, channels.
//! - `layers`: the seccomp filter the plan names, compiled (through its cache).
//! - `seccomp`, `landlock`: the filter and the ruleset, compiled from the policy.
//! - `artifacts`: the snapshot the step's changes are measured against, and their judgement.
//! - `launch`: THE SEAM: `Jail::make(plan, filter, held)` makes a jail waiting at its release barrier,
//!   `Jail::run(step, loop)` runs one step in it (release, hand-overs, watch, reap, verdict); a `Child` guard kills and
//!   reaps. It knows no session: a session is one such step whose watch drives the session's cells as its `Loop`
//!   (session/cells.rs); a warm pool is sessions started ahead (pool.rs): see launch.rs's doc.
//! - `step`: one step's inputs (`Step`, `Clock`) and what the launch saw of it (`Seen`).
//! - `sync`: every supervisor↔child channel, in one table, and the reports sent over them.
//! - `namespaces`: the clone flags and the id maps.
//! - `child`: the jail side's steps (`mounts`, `conceal`, `privileges`, `network`, then `landlock` and `seccomp` last) and exec.
//! - `output`, `fsid`: the output tmpfs filled and copied, and who the copy acts as.
//! - `proxy`: the allowlist's HTTP CONNECT proxy, run by the supervisor.
//! - `watch`: the poll loop over the pipes, the pidfd, the seccomp listener and the relays, driving a `Loop` (what a
//!   step's clocks mean) over a `Tree` (what it may interrupt or kill); `script`: one script's deadlines as that loop,
//!   `session::cells` a session's cells as the other.
//! - `cancel`: SIGTERM/SIGINT/SIGHUP to `jail run`, turned into a cancelled run (polled by `watch`).
//! - `display`: a step's rich results (Jupyter's display data) read off the control channel and judged
//!   (`artifacts::bundle`), for a session's cells and one script alike.
//! - `capture`, `relay`, `events`: the script's stdout and stderr, captured, streamed, or sent as `--events` NDJSON;
//!   `streams` is the leaf they share with the request (`OutputMode`, `Target`).
//! - `verdict`: facts → status (`verdict::status`, the one set of rules for runs and session cells), and the one place
//!   the result is assembled.
//! - `stage`: the `Stage` names of `setup_error.stage`, and the one error-chain → `SetupError` conversion.
//! - `delivery`: what passed the judgement, delivered to the host folder.
//! - `result`: the JSON contract both sides and the agent share; `schema`: its JSON Schema and the version rule.
//! - `client`: THE client of `jail` every front end uses (`client::bounds`: the one set of read caps and grace
//!   periods; `client::command`: every `jail run`, `jail session start` and `jail pool` command line;
//!   `client::pool`: the pool's wire, both ways, which the pool itself writes through; `client::pool_child`: a
//!   `jail pool` child spoken to on threads; `client::session`: a session's socket protocol, typed once, which
//!   session/handle.rs serves, and its one client).
//! - `cli`: the `jail` command line, one file per subcommand (`jail mcp` and `jail serve` exec their binaries beside
//!   this one: `cli/beside.rs`); main.rs only calls `cli::main`.
//! - `session`: `jail session`, one jail serving many cells to a driver over a control channel.
//! - `janitor`: the one janitor, forked by the session supervisor, `jail pool` and the service, that cleans up after
//!   their death.
//! - `doctor`: what this host provides, for `jail doctor`.
//! - `install`: the embedded rootfs recipes, for `jail rootfs build|list`.
//! - `sys`: every `unsafe`, but for `ffi`: the one function another process calls into (a template's fork entry,
//!   template/fork.rs), whose raw arguments it converts.
//!
//! A `pub` module or item is one another crate uses: main.rs, the front
//! ends (agent, serve, mcp), the tests (tests/, tests/fronts/) or the fuzz
//! targets; everything else is `pub(crate)`.

// Every `unsafe` block lives in `sys` (and `ffi`'s one exported function),
// each with its `// SAFETY:` line (clippy::undocumented_unsafe_blocks):
// anywhere else it does not compile.
#![deny(unsafe_code)]

pub mod accept;
pub mod artifacts;
pub(crate) mod cancel;
mod capture;
pub mod cgroup;
mod child;
pub mod cli;
pub mod client;
mod conceal;
pub mod delegate;
mod delivery;
pub mod digest;
pub mod display;
pub(crate) mod doctor;
pub mod envs;
pub mod events;
#[allow(unsafe_code)]
mod ffi;
pub(crate) mod field;
mod fsid;
mod host;
pub mod hostenv;
pub mod hostuid;
pub(crate) mod inline;
pub(crate) mod inside;
pub(crate) mod install;
pub mod janitor;
pub mod landlock;
mod launch;
mod layers;
mod limits;
pub mod locate;
mod mounts;
mod namespaces;
mod network;
mod output;
mod plan;
pub mod policy;
pub mod pool;
mod privileges;
mod proxy;
pub(crate) mod relay;
mod request;
pub mod result;
mod rlimits;
pub mod rootfs;
pub mod schema;
mod script;
pub mod seccomp;
pub mod seconds;
pub mod session;
pub mod stage;
mod step;
pub mod still;
mod streams;
pub(crate) mod supervisor;
mod sync;
#[allow(unsafe_code)]
pub mod sys;
pub mod template;
pub mod throttle;
mod verdict;
mod watch;
