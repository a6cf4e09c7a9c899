//! The result contract: one JSON document per run, printed by `jail run --json`
//! and deserialized by the agent. This is the only definition of it.
//!
//! Fields that a later stage of the project fills are present with honest
//! empty or null values, never invented numbers: `null` means "not measured".

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change to this document.
pub const SCHEMA_VERSION: u32 = 2;

/// Exit status of `jail` when the script ran past its wall-clock limit.
pub(crate) const EXIT_TIMEOUT: i32 = 124;
/// Exit status of `jail` when the jail itself failed to set up.
pub const EXIT_SETUP_FAILED: i32 = 125;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct RunResult {
    pub schema_version: u32,
    pub status: Status,
    /// The script's exit code, when it exited normally.
    pub exit_code: Option<i32>,
    /// The signal number that ended the script, when one did.
    pub signal: Option<i32>,
    /// The signal's name (`SIGKILL`), when one ended the script.
    pub signal_name: Option<String>,
    pub stdout: Stream,
    pub stderr: Stream,
    /// The Python exception, when stderr ends with one.
    pub error: Option<PythonError>,
    pub usage: Usage,
    /// Every limit, its value and what enforced it.
    pub limits: BTreeMap<String, LimitReport>,
    pub isolation: Isolation,
    /// Syscalls the jail refused, by name (and address family), most
    /// frequent first. Empty when `isolation.seccomp.denials_counted` is
    /// false.
    pub denials: Vec<Denial>,
    /// Files of the output dir, as the supervisor found them after the whole
    /// process tree was dead: every accepted file (created, modified or left
    /// unchanged by this step) and every file the step deleted, sorted by path.
    /// Only these may be handed on; see [`Artifact`]. A session cell's
    /// result lists only what that cell created, modified or deleted in
    /// the session's output, judged with the jail held still; those files
    /// are still in the session (read one with its files API) until it
    /// ends and delivers them.
    pub artifacts: Vec<Artifact>,
    /// Entries of the output dir that were refused, with the reason. They
    /// never reach the host output folder (a size-capped output dir keeps
    /// them in the jail; a bound one has them moved to `quarantine_dir`),
    /// are never opened for their content, and must never be handed on;
    /// see [`RejectedArtifact`].
    pub rejected_artifacts: Vec<RejectedArtifact>,
    /// The input dir's digest before and after the run; `null` when no
    /// `--input` was given or the run never reached its end.
    pub input: Option<InputReport>,
    /// Host path of the output dir (created by the jail when none was given).
    pub output_dir: Option<String>,
    /// Bound output dir (`output_size: "unlimited"`) only: the folder beside
    /// it that refused entries were moved into; `null` when none was needed.
    #[serde(default)]
    pub quarantine_dir: Option<String>,
    /// With a size-capped output dir (`filesystem.output_size`): what was
    /// copied into the jail's output tmpfs and mirrored back to the host.
    #[serde(default)]
    pub output_sync: Option<OutputSync>,
    /// The network mode, and every connection the script asked the proxy
    /// for (`network.mode: allowlist`).
    #[serde(default)]
    pub network: NetworkReport,
    pub timings: Timings,
    pub setup_error: Option<SetupError>,
    /// The supervisor's own costs, for the bench and for anyone sizing hosts.
    pub supervisor: SupervisorStats,
    /// `jail session` only: the session and cell this result is of; absent
    /// from a `jail run` result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionInfo>,
    /// The code's rich results, Jupyter's way, in the order they came: each
    /// `display()` and figure (`plt.show()`, or left open and unsaved at the
    /// end), and
    /// the last expression's value (`is_main_result`). Each is the code's
    /// own word, judged by the supervisor as an artifact is (artifacts/
    /// bundle.rs) before it is listed. Empty for a step that made none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<DisplayResult>,
    /// Rich results dropped whole, past the caps of one step (count or bytes).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub results_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One rich result: a MIME bundle, as Jupyter's `display_data` and
/// `execute_result` carry one (and E2B's `Result`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct DisplayResult {
    /// The representations that passed, by MIME type: `text/plain`,
    /// `text/html`, `text/markdown`, `text/latex` and `image/svg+xml` as
    /// text; `image/png` and `image/jpeg` as base64; `application/json` as
    /// the JSON value.
    pub data: BTreeMap<String, serde_json::Value>,
    /// The value of the code's last expression (Jupyter's `execute_result`),
    /// not a `display()` or a figure.
    pub is_main_result: bool,
    /// What the judging found in them: `script` for HTML or SVG with active
    /// content, `incomplete_scan` for a scan cut short.
    #[serde(default)]
    pub flags: Vec<ContentFlag>,
    /// Representations that did not pass, and why; none of their content.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedRepresentation>,
}

/// A representation of a rich result that was left out.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct RefusedRepresentation {
    /// Its MIME type, escaped and cut as a name is.
    pub mime: String,
    /// Why: what it claimed and what it is, or the cap it passed.
    pub detail: String,
}

/// Where a `jail session` result belongs (session.rs).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SessionInfo {
    /// The session's id (its handle is `ID.sock`).
    pub id: String,
    /// This cell's number, from 1; 0 in the closing result of `jail session stop`.
    pub cell: u64,
    /// Whether the session is over: no later cell will run.
    pub ended: bool,
    /// Why it ended: `stopped`, `idle_timeout`, `max_lifetime`,
    /// `cell_killed`, `interpreter_died`, `driver_deaf`, `setup_failed`,
    /// `owner_gone` or `cancelled` (its supervisor got SIGTERM, SIGINT or
    /// SIGHUP).
    pub why: Option<String>,
    /// The same, in words.
    pub detail: Option<String>,
    /// Where this session's files go, in words: judged and delivered to
    /// the output folder once, when the session ends; each cell's
    /// `artifacts` and `rejected_artifacts` list what it changed, judged
    /// (none when the output is the host folder itself).
    pub artifacts: String,
}

/// What the supervisor process itself cost.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SupervisorStats {
    /// Peak resident set of the `jail` process itself (VmHWM: this image
    /// only, not the process it was exec'd from), measured after the run.
    pub max_rss_bytes: u64,
    /// How long after the wall-clock deadline the tree was gone (reaped);
    /// null when the deadline was not hit.
    pub deadline_overrun_ms: Option<f64>,
    /// What cancelled the run: the signal `jail run` or a session's
    /// supervisor got (`SIGTERM`, `SIGINT`, `SIGHUP`), or `pool_caller`
    /// when the caller of `jail pool` cancelled the step (`{"op":
    /// "cancel"}`); null when it was not cancelled.
    #[serde(default)]
    pub cancelled_by: Option<String>,
    /// The supervisor's own CPU (its thread's) for judging and delivering
    /// the output once the tree was dead: hashing, scanning, neutralising
    /// and copying. At most `budget::JUDGING_CPU` (1 s) is spent on the
    /// content before what is left is refused or flagged
    /// (`artifacts.past_budget`); null when the output was never judged.
    #[serde(default)]
    pub judging_cpu_ms: Option<f64>,
}

/// How the run ended. When several apply, the first in this order wins:
/// `setup_failed`, `cancelled`, `timeout_wall`, `timeout_cpu`, `oom_killed`,
/// `output_limit`, then what the script's own exit says.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The script exited 0.
    Ok,
    /// The script exited with another code (`exit_code`).
    NonzeroExit,
    /// A signal ended the script (`signal`, `signal_name`).
    Signaled,
    /// The wall-clock limit passed; the whole tree was killed.
    TimeoutWall,
    /// The CPU-time limit was reached: by the run cgroup's usage (the whole
    /// tree was killed), or by RLIMIT_CPU where there is no cgroup (the
    /// script died of SIGXCPU, or SIGKILL a second later).
    TimeoutCpu,
    /// The kernel's OOM killer killed a process of the run (it hit the
    /// memory limit) and the script did not exit 0 (`usage.oom_kills`).
    OomKilled,
    /// stdout or stderr went over its cap and was truncated (the script was
    /// not stopped; `exit_code` is still its own).
    OutputLimit,
    /// The jail itself failed before or while starting the script.
    SetupFailed,
    /// `jail` got SIGTERM, SIGINT or SIGHUP, or the pool's caller cancelled
    /// the step (`supervisor.cancelled_by` says which): the whole tree was
    /// killed and cleaned up like a timed-out one's.
    Cancelled,
}

/// One captured output stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Stream {
    /// The text kept: all of it, or the head and tail around a marker when it
    /// was over the cap. Invalid UTF-8 is replaced. Empty in streaming mode.
    pub text: String,
    /// Bytes the script wrote to the stream in total.
    pub bytes: u64,
    /// Whether `text` is missing part of the stream.
    pub truncated: bool,
    /// Whether the stream was streamed to the caller instead of captured.
    /// Streamed, it is cut at the same cap: past it the caller gets one
    /// marker line, the rest is dropped and `truncated` is true.
    pub streamed: bool,
    /// Streaming only: bytes within the cap the caller did not take before
    /// the run's deadline (it stopped reading or closed its end).
    #[serde(default)]
    pub undelivered_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct PythonError {
    /// Exception type, e.g. `ZeroDivisionError`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// The last lines of the traceback.
    pub traceback_tail: String,
}

/// What the run used. `null` means this host did not measure it; nothing
/// here is ever estimated.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Usage {
    /// From the release of the jail's PID 1 to its end.
    pub wall_ms: f64,
    /// CPU time of the whole run: the run cgroup's (cpu.stat; or cpuacct,
    /// its tick-sampled user/system split scaled to its exact total)
    /// when there is one, else getrusage of the jail's PID 1 and everything
    /// it reaped.
    pub user_cpu_ms: Option<f64>,
    pub system_cpu_ms: Option<f64>,
    /// Peak memory of the whole run: the cgroup's memory.peak (v2) or
    /// memory.max_usage_in_bytes (v1); it counts tmpfs pages the run wrote.
    /// None without a cgroup, and on cgroup v2 before Linux 5.19, which has
    /// no memory.peak (`max_rss_bytes` is the bound there).
    pub peak_memory_bytes: Option<u64>,
    /// Largest resident set of any single process in the run (getrusage).
    pub max_rss_bytes: Option<u64>,
    /// Most processes and threads at once: the cgroup's pids.peak, on
    /// kernels that have it.
    pub pids_peak: Option<u64>,
    /// Processes of the run the kernel's OOM killer killed (memory.events
    /// oom_kill on v2, memory.oom_control oom_kill on v1).
    pub oom_kills: Option<u64>,
    /// What the supervisor's CPU throttle did (`limits.cpus` enforced by
    /// `supervisor`: no cpu cgroup); `null` when it was not the enforcer.
    /// In a session, what it did during this cell.
    #[serde(default)]
    pub throttled: Option<Throttled>,
}

/// The supervisor's duty cycle of the tree (throttle.rs).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Throttled {
    /// Times the whole tree was stopped (SIGSTOP) for being over its quota.
    pub stops: u64,
    /// Wall time the tree spent stopped, in all.
    pub stopped_ms: f64,
    /// Stops that ended before any of their sweeps found every process
    /// stopped (processes forking or resuming each other faster than the
    /// sweeps); 0 when every stop held the whole tree.
    pub unsettled: u64,
}

/// The mirror of a size-capped output dir (see `output.rs`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct OutputSync {
    /// Entries copied from the host folder into the jail before the run.
    pub copied_in: u64,
    /// Entries written (created or changed) in the host folder after it.
    pub copied_out: u64,
    /// Entries the script left as they were (not rewritten).
    pub unchanged: u64,
    /// Host entries removed because the script deleted them (or replaced
    /// them with something refused).
    pub deleted: u64,
    /// Entries that stayed in the jail: refused by the artifact check, or
    /// never judged (each refusal is in `rejected_artifacts`).
    #[serde(default)]
    pub withheld: u64,
    /// Bytes the copy allocated on the host disk (what `du` counts), at most
    /// `filesystem.output_size` in all. Sparse files stay sparse: their
    /// holes cost nothing.
    #[serde(default)]
    pub bytes_written: u64,
    /// Entries that crossed in neither direction, with the reason (sockets,
    /// devices, unreadable host files, trees too deep).
    pub skipped: Vec<String>,
    /// What could not be mirrored back, with the reason.
    pub errors: Vec<String>,
}

/// The run's network: its mode and, with `allowlist`, what the supervisor's
/// proxy saw (see proxy.rs and policies/README.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct NetworkReport {
    /// `none` or `allowlist`, from the policy.
    pub mode: String,
    /// What `HTTP_PROXY` and `HTTPS_PROXY` point at inside the jail
    /// (`http://127.0.0.1:3128`); `null` with `none`, where no proxy runs.
    pub proxy: Option<String>,
    /// Names the trusted caller mapped to fixed addresses with
    /// `JAIL_TEST_RESOLVE` (tests only; loopback is allowed for exactly
    /// these). Empty in production.
    #[serde(default)]
    pub resolver_overrides: Vec<String>,
    /// Every request the proxy received, in order of arrival (at most
    /// `MAX_RECORDS`; `records_dropped` counts the rest).
    pub connections: Vec<Connection>,
    /// Requests past the record cap, counted but not listed.
    pub records_dropped: u64,
    /// Bytes relayed from the script to remote hosts, all connections.
    pub bytes_up: u64,
    /// Bytes relayed from remote hosts to the script, all connections.
    pub bytes_down: u64,
    /// Whether `network.max_bytes` was reached (connections were cut).
    pub byte_cap_reached: bool,
}

/// One request to the proxy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Connection {
    /// `CONNECT` (a tunnel, for https) or the plain-http method (`GET`, ...).
    pub method: String,
    /// The host as the script named it, lowercased; empty when the request
    /// could not be parsed.
    pub host: String,
    pub port: u16,
    /// Whether the proxy connected to the host for it.
    pub allowed: bool,
    /// Why it was refused, or how an allowed one ended: `off_list`,
    /// `port_off_list`, `bad_request`, `connection_cap`, `resolve_failed`,
    /// `forbidden_range` (the detail names the address and range),
    /// `connect_failed`; `closed` or `byte_cap` for allowed ones.
    pub reason: String,
    /// The reason in words.
    pub detail: Option<String>,
    /// The address the proxy checked and connected to (pinned: never
    /// resolved again for this connection).
    pub address: Option<String>,
    /// Bytes from the script to the host (after the request head, for
    /// CONNECT; the rewritten request included, for plain http).
    pub bytes_up: u64,
    /// Bytes from the host to the script.
    pub bytes_down: u64,
}

/// One limit of the run.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct LimitReport {
    /// The value in force (bytes, seconds, cores or a count), `null` when
    /// unlimited.
    pub value: serde_json::Value,
    /// What enforced it: `cgroup_v2`, `cgroup_v1`, `rlimit`, `tmpfs`,
    /// `supervisor`, or `none` (unlimited, or the host could not).
    pub enforced_by: String,
    /// How, in plain words (which file or rlimit, and what it covers).
    #[serde(default)]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Isolation {
    pub policy: String,
    pub policy_hash: String,
    /// Which policy the run used: `built-in` (policies/default.json,
    /// compiled into the binary) or the canonical path of `--policy FILE`.
    #[serde(default)]
    pub policy_source: String,
    pub rootfs: String,
    /// The rootfs's identity: the sha256 of its `/usr/share/jail/manifest.json`,
    /// which names every Python package and version in it, its Debian
    /// packages and the sha256 of the lock it was built from (`jail
    /// packages` prints it). The same lock gives the same id. `null` when
    /// the rootfs has no manifest.
    #[serde(default)]
    pub rootfs_id: Option<String>,
    pub namespaces: Vec<String>,
    /// uid and gid inside the jail.
    pub uid: u32,
    pub gid: u32,
    /// Host uid and gid the sandbox identity is mapped to.
    pub host_uid: u32,
    pub host_gid: u32,
    pub capabilities: Vec<String>,
    pub no_new_privs: bool,
    pub landlock: LandlockReport,
    pub seccomp: SeccompReport,
    /// Layers that are not fully enforced on this run, in plain words.
    pub degraded: Vec<String>,
    /// Whether the jail is a fork of a pool's template (template.rs): its
    /// memory began as a copy of an interpreter that imported the
    /// policy's preload and ran nothing else. Every layer above is its
    /// own; it shares that interpreter's address-space layout (ASLR is
    /// per template) and hash seed with the template's other forks.
    #[serde(default)]
    pub forked_from_template: bool,
}

/// How much of a layer this run got.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LayerStatus {
    /// Every rule of the layer is in force.
    Enforced,
    /// Some rules are in force; `missing` says which are not.
    Partial,
    /// None is (or the run failed before the layer was set up).
    #[default]
    NotEnforced,
}

/// `isolation.landlock`: the filesystem, TCP and IPC rules.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct LandlockReport {
    pub status: LayerStatus,
    /// The policy's `landlock.mode`: `required` or `best_effort`.
    pub mode: String,
    /// The Landlock ABI the rules were built for and enforced at (0: none).
    pub abi: u32,
    /// The ABI this kernel offers (0: no Landlock).
    pub kernel_abi: u32,
    /// What this kernel's ABI leaves out of the rules, in plain words.
    pub missing: Vec<String>,
    pub detail: Option<String>,
}

/// `isolation.seccomp`: the syscall allowlist.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SeccompReport {
    pub status: LayerStatus,
    /// What a syscall outside the allowlist gets, e.g. `errno ENOSYS`.
    pub default_action: String,
    /// Rules in the policy's `seccomp.rules`.
    pub rules: usize,
    /// BPF instructions in the loaded program.
    pub instructions: usize,
    /// sha256 of the loaded BPF program.
    pub filter_sha256: String,
    /// Whether refusals are counted into `denials` (seccomp user
    /// notification); false on kernels without it.
    pub denials_counted: bool,
    /// Whether `denials` stopped itemising at the answer cap (10,000 calls
    /// answered by the supervisor); the calls after it were still answered
    /// as the policy says, and are counted in `calls_past_cap`.
    #[serde(default)]
    pub denials_truncated: bool,
    /// Calls the supervisor answered after the cap (refusals, and allowlist
    /// TCP sockets let through), not itemised in `denials`.
    #[serde(default)]
    pub calls_past_cap: u64,
    pub detail: Option<String>,
}

/// One kind of refused call, counted.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Denial {
    /// The layer that refused it: `seccomp`.
    pub layer: String,
    /// The syscall's name, e.g. `socket`, `ptrace`.
    pub what: String,
    /// How many times it was refused.
    pub count: u64,
    /// For socket() and socketpair(): the address family asked for
    /// (`AF_INET`).
    pub family: Option<String>,
    /// The error the call returned (`EPERM`, `ENOSYS`).
    pub errno: Option<String>,
    /// Why the policy refuses it: the `why` of the rule (or the default).
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Timings {
    /// Wall time from the start of `jail run` to the result.
    pub total_ms: f64,
    /// From start to the child's exec of the interpreter.
    pub setup_ms: Option<f64>,
    /// Each setup stage in milliseconds, in the order it ran.
    pub stages: BTreeMap<String, f64>,
}

/// One file of the output dir that the supervisor accepted (or that the step
/// deleted). Collected from outside the jail once its process tree is dead,
/// opened beneath the output dir without following any link.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Artifact {
    /// Path relative to the output dir, `/`-separated. Always printable UTF-8:
    /// names with control characters, `..`, a leading `-` or invalid UTF-8
    /// are refused, never accepted.
    pub path: String,
    /// Size in bytes (for a deleted file: its size before the run).
    pub bytes: u64,
    /// Lowercase hex sha256 of the content read; `null` only for `deleted`.
    pub sha256: Option<String>,
    /// Media type sniffed from the content, never taken from the name alone
    /// (`image/png`, `text/csv`, `application/vnd.openxmlformats-...`); the
    /// extension only refines plain text into CSV/TSV. `null` only for
    /// `deleted`.
    pub media_type: Option<String>,
    /// What this step did to the file, against the snapshot taken before the
    /// child was released.
    pub change: Change,
    /// Risky content found in the file.
    pub flags: Vec<ContentFlag>,
    /// A small description of the content, computed outside the jail with
    /// bounded reads, so the model need not read the file to know what it is.
    pub summary: Option<Summary>,
    /// Set when the host received a neutralised copy instead of the bytes
    /// the script wrote (`artifacts.formula_cells: "neutralise"`, the
    /// default): `bytes` and `sha256` above then describe what the host
    /// folder holds, and this says what was changed.
    #[serde(default)]
    pub neutralised: Option<Neutralised>,
}

/// What neutralising a CSV/TSV changed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Neutralised {
    /// Cells that would start a formula, each now prefixed with `'`.
    pub cells: u64,
    /// Size and sha256 of the file as the script wrote it (it never left
    /// the jail in that form).
    pub original_bytes: u64,
    pub original_sha256: String,
}

/// What a step did to one file of the output dir.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Not there before the run.
    Created,
    /// There before, with a different inode, size, mtime or ctime now (ctime
    /// cannot be set back from inside, so a rewrite is never missed).
    Modified,
    /// There before and untouched.
    Unchanged,
    /// There before and gone now (only claimed when its folder was listed in
    /// full after the run).
    Deleted,
}

/// Something in a file a user should not open blindly.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct ContentFlag {
    pub kind: FlagKind,
    /// How many cells, tags or parts matched.
    pub count: u64,
    /// One line on what was found; never the matching content itself.
    pub detail: String,
    /// Where, for the first few matches: `row 2, column 1`, `Sheet1!B3`,
    /// `line 7: <script>`.
    pub locations: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FlagKind {
    /// CSV/TSV cells or XLSX strings that begin with `=`, `+`, `-`, `@`, tab
    /// or carriage return (plain numbers such as `-3.5` excepted), and XLSX
    /// cells that hold a formula: a spreadsheet would run them.
    FormulaInjection,
    /// HTML/SVG with `<script>`, `<iframe>`, `<object>` or `<embed>`, an
    /// `on*=` event handler, or a `javascript:`/`vbscript:` URL.
    Script,
    /// An Office file with a VBA project (`vbaProject.bin`).
    Macros,
    /// The extension promises another type than the content has.
    MediaTypeMismatch,
    /// The file was too large (or its archive too big or ambiguous) to be
    /// scanned in full within the jail's read caps, or its scan passed a time
    /// or memory budget (policies/README.md): the other flags may be
    /// incomplete. The detail says which.
    IncompleteScan,
}

/// A short, bounded description of a file's content. Every string in it is
/// cut to a fixed length and has its control characters escaped.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Summary {
    /// CSV/TSV: records (blank lines not counted), cells in the first record,
    /// and the first record itself (at most 50 cells).
    Csv { rows: u64, columns: u64, header: Vec<String> },
    /// PNG, JPEG or GIF: pixel size.
    Image { width: u32, height: u32 },
    /// SVG: the root element's width and height (unitless or `px`), or else
    /// its viewBox size.
    Svg { width: Option<f64>, height: Option<f64> },
    /// XLSX: each sheet (at most 64) with its `dimension` and size.
    Xlsx { sheets: Vec<SheetSummary>, partial: bool },
    /// PPTX: slide count and each slide's title (`null` for an untitled slide;
    /// at most 100).
    Pptx {
        slides: u64,
        titles: Vec<Option<String>>,
        partial: bool,
    },
    /// JSON: the top-level type (`object`, `array`, ...), its member or
    /// element count, and the first 50 keys (sorted). `partial` when the file
    /// was too large to parse (or its scan ran out of time) and only its first
    /// byte was looked at.
    Json {
        top_level: String,
        length: Option<u64>,
        keys: Vec<String>,
        partial: bool,
    },
    /// Any other text: line count and the first 5 lines.
    Text { lines: u64, first_lines: Vec<String> },
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SheetSummary {
    pub name: String,
    /// The sheet's own `dimension` (`A1:C10`), when it has one.
    pub dimension: Option<String>,
    /// Rows and columns spanned, from the dimension or else the cells seen.
    pub rows: u64,
    pub columns: u64,
}

/// One refused entry of the output dir.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct RejectedArtifact {
    /// Path relative to the output dir, with every byte that is not printable
    /// UTF-8 escaped (`\xNN`, `\u{202e}`), so it is safe to print or show.
    pub path: String,
    pub reason: RejectReason,
    /// One line on why; never the entry's content or a link's target.
    pub detail: String,
    /// Where the entry is now: never in the host output folder, unless it
    /// was there before the run and the script left it alone.
    #[serde(default)]
    pub disposition: Disposition,
    /// With `quarantined`: its host path now.
    #[serde(default)]
    pub moved_to: Option<String>,
}

/// What became of a refused entry (see policies/README.md, "What the host
/// folder receives").
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// It stayed in the jail's output tmpfs, which went with the jail: the
    /// host folder never had it.
    #[default]
    NotDelivered,
    /// Bound output folder (`output_size: "unlimited"`): moved out of it
    /// into the run's quarantine folder, `moved_to`.
    Quarantined,
    /// Bound output folder: deleted, because no quarantine folder could be
    /// made beside it (`output_sync.errors` says why).
    Removed,
    /// There before the run and untouched by the script: left where it was.
    LeftAsBefore,
    /// Could not be moved or removed (`output_sync.errors` says why): it is
    /// still in the output folder. Never expected.
    LeftInPlace,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    Symlink,
    /// A regular file with more than one name (`st_nlink > 1`).
    HardLink,
    Device,
    Fifo,
    Socket,
    /// A file with the set-user-ID or set-group-ID bit.
    SetId,
    /// On another filesystem than the output dir (a mount point).
    MountPoint,
    /// `..`, a control or bidi character, a backslash, a leading `-` or
    /// invalid UTF-8 in the name.
    BadName,
    NameTooLong,
    /// A folder whose entries would be deeper than `max_depth`; not entered.
    TooDeep,
    /// A folder with more than `max_dir_entries` entries; none of them taken.
    TooWide,
    /// The walk stopped here: more than `max_entries` entries in all.
    TooManyEntries,
    /// More than `max_files` accepted files.
    TooManyFiles,
    /// Larger than `max_file_bytes` (judged by its size; never read).
    TooLarge,
    /// A spreadsheet with formula cells that `formula_cells: "neutralise"`
    /// cannot rewrite (XLSX), or a CSV/TSV whose neutralising the run's
    /// judging budget cut short: refused rather than delivered as it is.
    FormulaCells,
    /// Writing it would pass `filesystem.output_size` in bytes written to
    /// the host (neutralising can grow a file).
    OutputFull,
    /// The run's deadline passed before the copy to the host reached it.
    CopyDeadline,
    /// Not judged in full: the walk stopped before it
    /// (`too_many_entries`), or the run's judging budget ran out before it
    /// was read to its end (`artifacts.past_budget: "refuse"`); `detail`
    /// says which.
    NotJudged,
    /// Accepting it would pass `max_total_bytes`.
    TotalTooLarge,
    ExtensionNotAllowed,
    /// The supervisor could not open or read it.
    Unreadable,
    /// It changed between listing and opening (never expected: the tree is
    /// dead by then).
    Changed,
    /// More refusals than the result lists; `detail` says how many.
    TooManyRejected,
}

/// The input dir before and after the run. It is bound read-only, so
/// `unchanged: false` means the host changed it during the run.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct InputReport {
    /// sha256 over every entry's path, type, mode and content (or, when
    /// `content_hashed` is false, size, mtime, ctime and inode instead).
    pub sha256_before: String,
    /// The same digest after the process tree was dead.
    pub sha256_after: String,
    pub unchanged: bool,
    /// Regular files and their total size (before the run).
    pub files: u64,
    pub bytes: u64,
    /// Whether file contents were hashed (total size within the policy's
    /// `input_hash_max_bytes`) or only their metadata.
    pub content_hashed: bool,
    /// Whether the digest covers the whole tree (at most 100000 entries and
    /// 64 levels).
    pub complete: bool,
}

/// Where and why the jail itself failed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SetupError {
    pub stage: String,
    pub message: String,
    pub causes: Vec<String>,
}

impl RunResult {
    /// The exit status `jail` itself should return for this result.
    pub fn jail_exit_code(&self) -> i32 {
        match self.status {
            Status::SetupFailed => EXIT_SETUP_FAILED,
            Status::TimeoutWall | Status::TimeoutCpu => EXIT_TIMEOUT,
            Status::Cancelled => crate::cancel::exit_code(self.supervisor.cancelled_by.as_deref()),
            _ => match (self.exit_code, self.signal) {
                (Some(code), _) => code,
                (None, Some(sig)) => 128 + sig,
                (None, None) => EXIT_SETUP_FAILED,
            },
        }
    }

    /// A step that ran as a session cell (a `jail pool` step) is judged
    /// when its session ends: the closing result's delivery — what was
    /// accepted, every refusal, the output sync, the quarantine, the
    /// input's digest — becomes the step's. The one way a cell's result
    /// takes its session's verdict, so no refusal is left behind in the
    /// closing.
    pub(crate) fn take_delivery(&mut self, closing: RunResult) {
        self.artifacts = closing.artifacts;
        self.rejected_artifacts = closing.rejected_artifacts;
        self.output_sync = closing.output_sync;
        self.quarantine_dir = closing.quarantine_dir;
        self.input = closing.input;
    }

    /// The quarantine folder was moved to `to` (a pool hands it over with
    /// the output folder): the result names where its entries are now.
    pub(crate) fn rehome_quarantine(&mut self, to: &std::path::Path) {
        let Some(from) = self.quarantine_dir.replace(to.display().to_string()) else { return };
        for r in &mut self.rejected_artifacts {
            if let Some(rest) = r.moved_to.as_deref().and_then(|m| std::path::Path::new(m).strip_prefix(&from).ok()) {
                r.moved_to = Some(to.join(rest).display().to_string());
            }
        }
    }

    /// A result for a run that never started.
    pub fn setup_failed(error: SetupError) -> RunResult {
        RunResult {
            schema_version: SCHEMA_VERSION,
            status: Status::SetupFailed,
            exit_code: None,
            signal: None,
            signal_name: None,
            stdout: Stream::default(),
            stderr: Stream::default(),
            error: None,
            usage: Usage::default(),
            limits: BTreeMap::new(),
            isolation: Isolation::default(),
            denials: Vec::new(),
            artifacts: Vec::new(),
            rejected_artifacts: Vec::new(),
            input: None,
            output_dir: None,
            quarantine_dir: None,
            output_sync: None,
            network: NetworkReport::default(),
            timings: Timings::default(),
            setup_error: Some(error),
            supervisor: SupervisorStats::default(),
            session: None,
            results: Vec::new(),
            results_dropped: 0,
        }
    }
}

/// Find the Python exception at the end of a stderr text.
pub(crate) fn parse_python_error(stderr: &str) -> Option<PythonError> {
    let lines: Vec<&str> = stderr.lines().collect();
    let last = lines.iter().rposition(|l| !l.trim().is_empty())?;
    let line = lines[last];
    let (kind, message) = match line.split_once(": ") {
        Some((k, m)) => (k, m),
        None => (line.trim_end_matches(':'), ""),
    };
    let looks_like_type = !kind.is_empty()
        && !kind.starts_with(' ')
        && kind.split('.').all(|part| {
            let mut c = part.chars();
            matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
                && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
        });
    let has_traceback = lines[..last]
        .iter()
        .any(|l| l.starts_with("Traceback (most recent call last):") || l.trim_start().starts_with("File \""));
    if !looks_like_type || !has_traceback {
        return None;
    }
    let start = lines[..last]
        .iter()
        .rposition(|l| l.starts_with("Traceback (most recent call last):"))
        .unwrap_or(0)
        .max((last + 1).saturating_sub(20));
    Some(PythonError {
        kind: kind.to_string(),
        message: message.to_string(),
        traceback_tail: lines[start..=last].join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(path: &str, moved_to: Option<&str>) -> RejectedArtifact {
        RejectedArtifact {
            path: path.into(),
            reason: RejectReason::Symlink,
            detail: String::new(),
            disposition: Disposition::Quarantined,
            moved_to: moved_to.map(String::from),
        }
    }

    #[test]
    fn a_cell_takes_its_sessions_whole_verdict_and_a_moved_quarantine_is_named_where_it_is() {
        let blank = || RunResult::setup_failed(SetupError { stage: String::new(), message: String::new(), causes: vec![] });
        let mut closing = blank();
        closing.rejected_artifacts = vec![refused("l.txt", Some("/slot/out.q/000001")), refused("x", None)];
        closing.quarantine_dir = Some("/slot/out.q".into());
        closing.output_sync = Some(OutputSync { withheld: 2, ..OutputSync::default() });
        let mut step = blank();
        step.take_delivery(closing.clone());
        assert_eq!(
            (&step.rejected_artifacts, &step.quarantine_dir, &step.output_sync),
            (&closing.rejected_artifacts, &closing.quarantine_dir, &closing.output_sync)
        );
        step.rehome_quarantine(std::path::Path::new("/home/u/out.jail-rejected-0"));
        assert_eq!(step.quarantine_dir.as_deref(), Some("/home/u/out.jail-rejected-0"));
        assert_eq!(step.rejected_artifacts[0].moved_to.as_deref(), Some("/home/u/out.jail-rejected-0/000001"));
        assert_eq!(step.rejected_artifacts[1].moved_to, None);
    }

    #[test]
    fn exception_at_the_end_of_stderr_is_parsed() {
        let err = "noise\nTraceback (most recent call last):\n  File \"/workspace/code/s.py\", line 1, in <module>\n    1/0\nZeroDivisionError: division by zero\n";
        let e = parse_python_error(err).unwrap();
        assert_eq!(e.kind, "ZeroDivisionError");
        assert_eq!(e.message, "division by zero");
        assert!(e.traceback_tail.starts_with("Traceback"));
    }

    #[test]
    fn dotted_exception_types_and_syntax_errors_are_parsed() {
        let err = "  File \"/workspace/code/s.py\", line 1\n    x = (\n        ^\nSyntaxError: '(' was never closed\n";
        assert_eq!(parse_python_error(err).unwrap().kind, "SyntaxError");
        let err = "Traceback (most recent call last):\n  File \"x\", line 2\nurllib.error.URLError: <urlopen error>\n";
        assert_eq!(parse_python_error(err).unwrap().kind, "urllib.error.URLError");
    }

    #[test]
    fn plain_stderr_is_not_an_exception() {
        assert_eq!(parse_python_error("warning: something happened\n"), None);
        assert_eq!(parse_python_error(""), None);
    }

    #[test]
    fn exit_code_follows_the_status() {
        let mut r = RunResult::setup_failed(SetupError { stage: "s".into(), message: "m".into(), causes: vec![] });
        assert_eq!(r.jail_exit_code(), 125);
        r.status = Status::TimeoutWall;
        assert_eq!(r.jail_exit_code(), 124);
        r.status = Status::Signaled;
        r.signal = Some(9);
        assert_eq!(r.jail_exit_code(), 137);
        r.status = Status::NonzeroExit;
        r.exit_code = Some(3);
        assert_eq!(r.jail_exit_code(), 3);
        // Cancelled: as the signal `jail` got would have ended it, whatever the script did.
        r.status = Status::Cancelled;
        r.supervisor.cancelled_by = Some("SIGINT".into());
        assert_eq!(r.jail_exit_code(), 130);
    }

    #[test]
    fn result_round_trips_through_json() {
        let r = RunResult::setup_failed(SetupError { stage: "mounts".into(), message: "m".into(), causes: vec!["c".into()] });
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"status\":\"setup_failed\""));
        let back: RunResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }
}
