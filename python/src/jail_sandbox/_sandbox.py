"""The client: run code through the ``jail`` binary (``jail run --events``,
or a ``jail pool`` child kept warm) and turn its event stream into
callbacks and an :class:`Execution`.

Every :meth:`Sandbox.run` is one fresh jail: new namespaces, a read-only
Python rootfs, no network, the policy's limits. Nothing persists between
runs except what the code leaves in the output folder.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sysconfig
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _scratch
from ._pool import REPLY_GRACE, Pool, PoolError

PathLike = Union[str, "os.PathLike[str]"]
Callback = Callable[[str], None]

#: The exit status ``jail`` gives when the run could not be set up.
EXIT_SETUP_FAILED = 125
#: The result document versions this client understands.
SCHEMA_VERSIONS = (2,)
#: Most bytes of ``jail``'s own stderr kept for an error message.
_MAX_STDERR = 64 << 10


class SandboxError(Exception):
    """Base class of everything this package raises."""


class JailNotFoundError(SandboxError):
    """The ``jail`` binary is not where this package looked for it."""


class SandboxSetupError(SandboxError):
    """The jail could not be set up, so nothing ran (``jail`` exit 125).

    Attributes:
        stage: The setup step that failed (``input``, ``policy``, ``limits``,
            ``mounts``, ...), as the result's ``setup_error.stage``.
        message: What went wrong; ``jail``'s messages name the fix
            (for example ``rootfs /x not found: build it with `make rootfs```).
        causes: The underlying errors, outermost first.
        result: The whole result document, when ``jail`` printed one.
    """

    def __init__(self, stage: str, message: str, causes: Sequence[str] = (), result: Optional[Dict[str, Any]] = None):
        self.stage = stage
        self.message = message
        self.causes = list(causes)
        self.result = result
        text = f"{message} ({stage})"
        if self.causes:
            text += ": " + ": ".join(self.causes)
        super().__init__(text)


class SessionClosedError(SandboxError):
    """The session was closed, or its jail ended (its lifetime, a crash)."""


class SandboxProtocolError(SandboxError):
    """``jail`` ended without a result this client can read."""


class ArtifactChangedError(SandboxError):
    """A session cell's artifact is not what the cell listed any more: a
    later cell (or ``session.files.write``) changed the file, or removed it,
    after that cell ended. Nothing is returned; ``session.files.read(path)``
    reads the file as it is now.

    Attributes:
        path: The artifact's path, relative to ``/workspace/output``.
    """

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(
            f"artifact {path}: {why} since the cell listed it; read it as it is now with session.files.read({path!r})"
        )


class FileRefusedError(SandboxError):
    """A session's files API (``session.files``) refused the request, for a
    local session (``jail session put|get|ls``) and a remote one (the
    service's 4xx) alike; the session lives on.

    Attributes:
        code: ``bad_path`` (``..``, an absolute path, a bad or empty name),
            ``not_found``, ``link`` (a link on the way, or the file itself:
            never followed), ``not_a_file`` (a folder where a file is meant,
            or the other way round), ``too_large`` (over 8 MiB, or over a
            service token's ``max_bytes_in``), ``rejected`` (the artifact
            rules refused the file: ``reason`` says which), ``unavailable``
            (the session's output is a host folder: ``output_size``
            ``"unlimited"``), ``failed`` (the output is full).
        reason: The artifact rules' reason (``extension_not_allowed``,
            ``bad_name``, ``hard_link``, ...; a result's
            ``rejected_artifacts[].reason``), or ``None``.
        detail: What the session said, naming the fix.
        path: The path asked for.
    """

    def __init__(self, code: str, detail: str, *, reason: Optional[str] = None, path: str = "") -> None:
        self.code = code
        self.reason = reason
        self.detail = detail
        self.path = path
        why = f"{code}, {reason}" if reason else code
        super().__init__(f"{path!r} refused ({why}): {detail}")


@dataclass(frozen=True)
class ExecutionError:
    """The exception the code ended with, parsed from its traceback.

    ``name``/``value`` are the E2B spellings of ``type``/``message``.
    """

    type: str
    message: str
    traceback: str

    @property
    def name(self) -> str:
        return self.type

    @property
    def value(self) -> str:
        return self.message


@dataclass(frozen=True)
class Usage:
    """What the run used (the result's ``usage``)."""

    wall_ms: float
    user_cpu_ms: Optional[float]
    system_cpu_ms: Optional[float]
    peak_memory_bytes: Optional[int]
    max_rss_bytes: Optional[int]
    pids_peak: Optional[int]


@dataclass(frozen=True)
class Artifact:
    """A file the code made or changed in the output folder that passed the
    jail's artifact check, described from outside the jail.

    Attributes:
        path: Relative to the output folder, ``/``-separated.
        sha256: Hex digest of what the host folder holds (``None`` for a deleted file).
        media_type: Sniffed from the content (``image/png``, ``text/csv``, ...).
        summary: A small description of the content (CSV columns, image size, ...), or ``None``.
        change: ``created``, ``modified`` or ``deleted``.
        bytes: Size in bytes.
        flags: Risky content found in the file.
        output_dir: The host folder the file is in.
    """

    path: str
    sha256: Optional[str]
    media_type: Optional[str]
    summary: Optional[Dict[str, Any]]
    change: str
    bytes: int
    flags: List[Any]
    output_dir: Optional[Path]
    # The folder this client made for the run, kept while the artifact is.
    _owner: Any = field(default=None, repr=False, compare=False)

    @property
    def host_path(self) -> Optional[Path]:
        """Where the file is on the host, if the output folder is known."""
        return None if self.output_dir is None else self.output_dir / self.path

    # builtins.bytes: the field `bytes` shadows the type in this class's body.
    def read_bytes(self) -> builtins.bytes:
        """The file's content, from the host output folder."""
        if self.host_path is None:
            raise SandboxError(f"artifact {self.path}: the result names no output folder")
        return self.host_path.read_bytes()


@dataclass(frozen=True)
class SessionArtifact(Artifact):
    """A file a session's cell made, changed or deleted, as its result lists
    it. The session delivers its output to the host folder only when it
    ends, so until then the file is the live session's: :meth:`read_bytes`
    reads it through the session's files API (:attr:`Session.files`, local
    or remote). ``output_dir`` and ``host_path`` are ``None``; ``sha256``
    and ``bytes`` are the file's as the cell left it (a CSV/TSV before its
    formula cells are neutralised). It holds its session: one dropped
    without ``close()`` is stopped once its cells' artifacts are gone too.
    """

    session: Any = field(default=None, repr=False, compare=False)

    def read_bytes(self) -> builtins.bytes:
        """The file's content as judged (a CSV's formula cells neutralised),
        read from the live session and checked to be the file this cell
        listed.

        Raises:
            ArtifactChangedError: A later cell (or ``files.write``) changed or
                removed the file: ``session.files.read(path)`` reads it as it is now.
            SessionClosedError: The session ended; what it delivered is its
                closing result's artifacts (``session.closing``).
            FileRefusedError: The files API refused it (``too_large``: over 8 MiB).
            SandboxError: The cell deleted the file.
        """
        if self.sha256 is None or self.change == "deleted":
            raise SandboxError(f"artifact {self.path}: the code deleted it; there are no bytes to read")
        return Files(self.session)._listed(self.path, self.sha256)


@dataclass(frozen=True)
class Result:
    """One rich result of a run or cell (E2B's ``Result``, Jupyter's display
    data): the value of the code's last expression (``is_main_result``), a
    ``display(obj)``, or a figure (``plt.show()``, or left open and unsaved). Each
    representation was judged by the jail before it was listed (a PNG is a
    PNG; HTML and SVG with active content are flagged in ``flags``).

    Attributes:
        data: Every representation, by MIME type (images as base64 text,
            JSON as its value).
        is_main_result: The last expression's value, not a display.
        flags: What the judging found (``script`` in HTML or SVG, ...).
    """

    data: Dict[str, Any]
    is_main_result: bool = False
    flags: List[Dict[str, Any]] = field(default_factory=list)

    def _text(self, mime: str) -> Optional[str]:
        value = self.data.get(mime)
        return value if isinstance(value, str) else None

    @property
    def text(self) -> Optional[str]:
        """``text/plain``: the object's repr."""
        return self._text("text/plain")

    @property
    def html(self) -> Optional[str]:
        """``text/html`` (a DataFrame's table)."""
        return self._text("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self._text("text/markdown")

    @property
    def svg(self) -> Optional[str]:
        return self._text("image/svg+xml")

    @property
    def png(self) -> Optional[str]:
        """``image/png`` as base64 text (``base64.b64decode`` gives the bytes)."""
        return self._text("image/png")

    @property
    def jpeg(self) -> Optional[str]:
        return self._text("image/jpeg")

    @property
    def latex(self) -> Optional[str]:
        return self._text("text/latex")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    def formats(self) -> List[str]:
        """The MIME types it has."""
        return sorted(self.data)


@dataclass(frozen=True)
class Execution:
    """The outcome of one :meth:`Sandbox.run`.

    Attributes:
        status: ``ok``, ``nonzero_exit``, ``timeout_wall``, ``timeout_cpu``,
            ``oom_killed``, ``output_limit``, ``signaled``, ``cancelled`` (see the result's
            ``status`` in the project README).
        stdout: The code's stdout; past ``limits.stdout_bytes`` its head and
            tail with a marker between (``stdout_truncated``).
        stderr: The code's stderr, likewise.
        error: The exception the code ended with, or ``None``.
        exit_code: The interpreter's exit status, ``None`` if it was killed.
        usage: Time and memory the run used.
        artifacts: Accepted output files, in the result's order. A
            session cell's are what that cell made, changed or deleted, as
            :class:`SessionArtifact` objects: the session delivers its files
            only when it ends, so ``read_bytes()`` reads each from the live
            session (through ``session.files``, judged) and raises
            :class:`ArtifactChangedError` once a later cell has changed it;
            the closing result's (``session.close()``) are the delivered ones.
        output_dir: The host folder the artifacts are in: the ``output`` the
            sandbox was given, else a folder made for this run, which is
            removed once this object and its artifacts are gone (copy what
            you keep); ``None`` when the run left no file, for a session's
            cell (its files are the session's until it ends), and for a
            :class:`~jail_sandbox.RemoteSandbox` run (its files stay on the service).
        result: The whole result document, as ``jail run --json`` prints it.
        run_id: The service's id of the run (:class:`~jail_sandbox.RemoteSandbox`), else ``None``.
        backend: Where a local run ran: ``pool`` (a jail of the sandbox's
            warm pool) or ``run`` (a ``jail run`` of its own); ``None`` for
            a session's cell and a remote run.
        results: The rich results, in order (:class:`Result`): each
            ``display(obj)`` and figure, and the last expression's value.
    """

    status: str
    stdout: str
    stderr: str
    error: Optional[ExecutionError]
    exit_code: Optional[int]
    usage: Usage
    artifacts: List[Artifact]
    output_dir: Optional[Path]
    stdout_truncated: bool
    stderr_truncated: bool
    result: Dict[str, Any] = field(repr=False)
    run_id: Optional[str] = None
    backend: Optional[str] = None
    results: List[Result] = field(default_factory=list)
    # The folder this client made for the run (see output_dir).
    _owner: Any = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Whether the code ran to the end and exited 0."""
        return self.status == "ok"

    @property
    def text(self) -> Optional[str]:
        """The last expression's value as text (``text/plain`` of the main
        result), as E2B's ``Execution.text``; ``None`` when the code ended
        with a statement. The printed output is :attr:`stdout`."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


#: The largest file a session's files API moves either way, in bytes
#: (``jail``'s ``session::MAX_FILE``).
MAX_FILE = 8 << 20
#: The refusal codes of the files API (:class:`FileRefusedError`'s ``code``).
FILE_REFUSALS = ("bad_path", "not_found", "link", "not_a_file", "too_large", "rejected", "unavailable", "failed")


@dataclass(frozen=True)
class FileInfo:
    """A file :meth:`Files.write` put in the session.

    Attributes:
        path: Relative to ``/workspace/output``.
        bytes: Its size.
        sha256: Hex digest of what was written.
    """

    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class FileEntry:
    """One entry of :meth:`Files.list`.

    Attributes:
        name: Its name in the folder listed (control characters escaped).
        kind: ``file``, ``dir``, ``symlink`` (listed, never followed) or ``other``.
        bytes: A file's size; 0 for anything else.
        path: Relative to ``/workspace/output``: the folder's path and the name.
    """

    name: str
    kind: str
    bytes: int
    path: str


class _Listing(list):  # type: ignore[type-arg]
    """A listing: its entries, and whether the folder held more."""

    truncated: bool = False


class Files:
    """A live session's ``/workspace/output``, E2B's ``sandbox.files``:
    ``session.files.write(path, data)`` puts a file there mid-session (the
    next cell reads it), ``read(path)`` gets one back, ``list(path)`` lists a
    folder. Paths are relative to ``/workspace/output`` (``/workspace/output/x``
    is taken too); the session checks each one and follows no link.

    A file read is judged as the session's artifacts are when it ends (the
    policy's ``allowed_extensions``, a CSV/TSV's formula cells neutralised,
    ...): what comes back is what would be delivered. What a caller writes
    is the session's like anything a cell writes: judged and delivered with
    the rest when the session ends. The same calls for a :class:`Session`
    (``jail session put|get|ls``, the content on a pipe, never on a command
    line) and a :class:`~jail_sandbox.RemoteSession` (``PUT``/``GET
    /v1/sessions/{id}/files/{path}``, ``GET /v1/sessions/{id}/files``).
    Served while a cell runs too.

    Raises (each call):
        FileRefusedError: The session refused it (its ``code`` says why).
        SessionClosedError: The session was closed, or its jail is gone
            (or, a local one, no longer answers).
    """

    def __init__(self, session: Any) -> None:
        self._session = session

    def write(self, path: str, data: Union[bytes, bytearray, memoryview, str]) -> FileInfo:
        """Write ``data`` (``str`` is written as UTF-8) as ``path``, whole: a
        cell never sees half of it; it replaces what had its name, and the
        folders on the way are made. At most 8 MiB (:data:`MAX_FILE`)."""
        if isinstance(data, str):
            raw = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
        else:
            raise TypeError(f"files.write: data is a {type(data).__name__}: give bytes or str")
        answer = self._session._put_file(_file_path(path), raw)
        try:
            info = FileInfo(path=str(answer["path"]), bytes=int(answer["bytes"]), sha256=str(answer["sha256"]))
        except (KeyError, TypeError, ValueError):
            raise SandboxProtocolError(f"files.write {path!r}: the answer is not a written file: {str(answer)[:200]!r}") from None
        if info.bytes != len(raw):
            raise SandboxProtocolError(f"files.write {path!r}: {info.bytes} bytes written, not the {len(raw)} given")
        return info

    def read(self, path: str) -> bytes:
        """The file ``path`` as judged (at most 8 MiB): its bytes as they
        would be delivered (a CSV's formula cells neutralised), checked
        against the sha256 the session gives. A file the artifact rules
        refuse raises :class:`FileRefusedError` with ``code`` ``rejected``."""
        return self._session._read_file(_file_path(path))[0]

    def _listed(self, path: str, sha256: str) -> bytes:
        """The judged bytes of ``path``, if it is still the file a cell
        listed with ``sha256`` (of the file as the code wrote it: for a
        neutralised copy, its original's)."""
        try:
            data, written = self._session._read_file(path)
        except FileRefusedError as e:
            if e.code == "not_found":
                raise ArtifactChangedError(path, "it was removed") from e
            raise
        except SessionClosedError as e:
            raise SessionClosedError(
                f"artifact {path} is no longer in the session ({e}); what a closed session delivered is its "
                "closing result's artifacts (session.closing)"
            ) from e
        if written != sha256:
            raise ArtifactChangedError(path, f"it was changed (sha256 {written}, not the listed {sha256})")
        return data

    def list(self, path: str = "") -> List[FileEntry]:
        """The entries of the folder ``path`` (default: ``/workspace/output``
        itself), sorted by name, as :class:`FileEntry` objects; at most 4096,
        and the list's ``truncated`` attribute is ``True`` when the folder
        held more."""
        answer = self._session._list_files(_file_path(path))
        try:
            folder = str(answer["path"])
            entries = _Listing(
                FileEntry(
                    name=str(e["name"]),
                    kind=str(e["kind"]),
                    bytes=int(e["bytes"]),
                    path=f"{folder}/{e['name']}" if folder else str(e["name"]),
                )
                for e in answer["entries"]
            )
            entries.truncated = bool(answer["truncated"])
        except (KeyError, TypeError, ValueError):
            raise SandboxProtocolError(f"files.list {path!r}: the answer is not a listing: {str(answer)[:200]!r}") from None
        return entries


def _file_path(path: str) -> str:
    if not isinstance(path, str):
        raise TypeError(f"a files path is a str, not {type(path).__name__}")
    return path


def find_jail() -> Path:
    """The ``jail`` binary this package ships: the one the wheel installed
    into this environment's scripts folder (``sys.prefix/bin``, or the user
    scheme's for ``pip install --user``), with ``jail-mcp`` and
    ``jail-serve`` beside it, else ``jail`` on ``PATH``."""
    names = [sysconfig.get_path("scripts")]
    try:
        names.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    for folder in names:
        if folder:
            candidate = Path(folder) / "jail"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    on_path = shutil.which("jail")
    if on_path:
        return Path(on_path)
    raise JailNotFoundError(
        "no jail binary in this environment's scripts folder nor on PATH: "
        "install the jail-sandbox wheel (`pip install jail-sandbox`; from a checkout, `make python-wheel`), "
        "or pass Sandbox(jail=PATH)"
    )


#: ``Sandbox(pool=AUTO)``, the default: no pool for a sandbox used once; a
#: pool of one jail from its second run on (repeated runs are what a pool
#: is for, and an idle jail holds memory).
AUTO = "auto"


def _packaged_policy(name: str) -> Optional[Path]:
    """A policy file this package ships (``policies/NAME.json``, copied from
    the repository's policies/ when the wheel is built)."""
    path = Path(__file__).resolve().parent / "policies" / f"{name}.json"
    return path if path.is_file() else None


class Sandbox:
    """A recipe for jails: which policy, rootfs and folders each run gets.

    Every :meth:`run` gets a fresh jail (new namespaces, read-only rootfs,
    no network, the policy's limits) and returns when it is gone. With a
    warm pool (``pool``) the jail was made ahead, its interpreter started
    and, on the data rootfs, numpy, pandas and matplotlib imported before
    any untrusted code existed in it; it still serves one run only.

    Args:
        policy: A policy file (default: the binary's built-in default
            policy; for a pool on the data rootfs, the shipped data policy,
            which preloads the data stack).
        rootfs: The Python root filesystem folder (default: the binary's own
            lookup: ``$JAIL_ROOTFS``, the policy's, then by ``rootfs_name``).
        rootfs_name: The rootfs looked up by name: ``"data"`` (numpy,
            pandas, matplotlib, ...; ``jail rootfs build data``) or
            ``"minimal"`` (the standard library). Default: ``data`` where one
            is built, else ``minimal``. A name that is not built raises
            :class:`SandboxSetupError` naming the command that builds it.
        input: A host folder mounted read-only at ``/workspace/input``.
        output: A host folder mounted at ``/workspace/output`` (the working
            directory); accepted files land here and are never removed by
            this package. Default: a fresh folder per run, removed once its
            :class:`Execution` is gone (none at all when the run left no file).
        timeout: Wall-clock limit of a run in seconds (default: the policy's).
        memory: Memory of a run, for example ``"512M"`` (default: the policy's).
        cpus: CPU quota in cores, for example ``"0.5"``.
        pool: Jails kept made ahead by a ``jail pool`` child of this
            sandbox: ``N`` (started now), ``0`` (never: every run is a
            ``jail run``), or ``"auto"`` (the default: one jail, from the
            second run on). A run the pool cannot serve exactly (its own
            ``output`` folder, ``args``, a timeout above the pool's) is a
            ``jail run`` of its own. End it with :meth:`close` or a ``with``
            block (else when the sandbox is garbage-collected, or at exit).
        jail: The ``jail`` binary (default: :func:`find_jail`).
        env: The environment ``jail`` itself runs with (default: ours). The
            code sees only what the policy passes through.
        envs: Environment variables for the code of every run and session,
            ``{NAME: value}`` (E2B's ``envs``); a run's or a cell's own
            ``envs`` win. Given to ``jail`` on a pipe, never on a command
            line. ``jail`` checks them (names as in a shell, not ``JAIL_*``,
            ``PYTHON*``, ``LD_*`` or the proxy variables; at most 64, 32 KiB):
            a refused one raises :class:`SandboxSetupError` naming it.
    """

    def __init__(
        self,
        *,
        policy: Optional[PathLike] = None,
        rootfs: Optional[PathLike] = None,
        rootfs_name: Optional[str] = None,
        input: Optional[PathLike] = None,
        output: Optional[PathLike] = None,
        timeout: Optional[float] = None,
        memory: Optional[str] = None,
        cpus: Optional[str] = None,
        pool: Union[int, str] = AUTO,
        jail: Optional[PathLike] = None,
        env: Optional[Dict[str, str]] = None,
        envs: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.policy = None if policy is None else Path(policy)
        self.rootfs = None if rootfs is None else Path(rootfs)
        self.rootfs_name = rootfs_name
        self.input = None if input is None else Path(input).absolute()
        self.output = None if output is None else Path(output)
        self.timeout = timeout
        self.memory = memory
        self.cpus = cpus
        if not (pool == AUTO or (isinstance(pool, int) and not isinstance(pool, bool) and 0 <= pool <= 64)):
            raise ValueError(f"pool={pool!r}: give a number of jails from 0 to 64, or 'auto'")
        self.pool_size = pool
        self.jail = Path(jail) if jail is not None else find_jail()
        self.env = env
        self.envs = _envs(envs)
        self._runs = 0
        self._pool: Optional[Pool] = None
        self._pool_failed: Optional[str] = None
        self._pool_lock = threading.Lock()
        self._closer: Optional[weakref.finalize] = None
        if isinstance(pool, int) and pool > 0:
            self._start_pool(pool, required=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the warm pool, if one was started: its jails are destroyed.
        Runs after this start a new one as needed. Safe to call twice."""
        with self._pool_lock:
            closer, self._closer, self._pool = self._closer, None, None
        if closer is not None:
            closer()

    def _env(self) -> Dict[str, str]:
        """``jail``'s environment: TMPDIR is this process's own folder, so
        the output folders ``jail`` makes for our runs are in it and go
        when we are done with them (_scratch.py)."""
        env = dict(os.environ if self.env is None else self.env)
        env["TMPDIR"] = str(_scratch.folder())
        return env

    def _rootfs_flags(self) -> List[str]:
        flags: List[str] = []
        if self.rootfs is not None:
            flags += ["--rootfs", str(self.rootfs)]
        if self.rootfs_name is not None:
            flags += ["--rootfs-name", self.rootfs_name]
        return flags

    def _flags(self) -> List[str]:
        """The folder and limit flags ``jail run`` and ``jail session start`` share."""
        flags: List[str] = []
        for flag, value in (
            ("--policy", self.policy),
            ("--input", self.input),
            ("--output", self.output),
            ("--memory", self.memory),
            ("--cpus", self.cpus),
        ):
            if value is not None:
                flags += [flag, str(value)]
        return flags + self._rootfs_flags()

    def flavour(self) -> Optional[str]:
        """The flavour (``data``, ``minimal``) of the rootfs this sandbox's
        runs use, from its manifest (``jail packages --json``); ``None``
        when there is none or it has no manifest."""
        try:
            out = subprocess.run(
                [str(self.jail), "packages", "--json"] + self._rootfs_flags(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=self._env(),
                timeout=60,
            )
            return str(json.loads(out.stdout)["manifest"]["flavour"]) if out.returncode == 0 else None
        except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired):
            return None

    # ---------------------------------------------------------------- pool
    def _start_pool(self, size: int, required: bool) -> Optional[Pool]:
        """Start the ``jail pool`` child. Its policy is ours; without one, on
        the data rootfs, the shipped data policy (the default policy with
        numpy, pandas and matplotlib.pyplot preloaded)."""
        policy = self.policy
        if policy is None and self.flavour() == "data":
            policy = _packaged_policy("data")
        cmd = [str(self.jail), "pool", "--size", str(size)] + self._rootfs_flags()
        for flag, value in (("--policy", policy), ("--memory", self.memory), ("--cpus", self.cpus)):
            if value is not None:
                cmd += [flag, str(value)]
        if self.timeout is not None:
            cmd += ["--timeout", repr(float(self.timeout))]
        try:
            pool = Pool(cmd, self._env())
        except OSError as e:
            if required:
                raise JailNotFoundError(f"cannot start {self.jail}: {e}") from e
            self._pool_failed = str(e)
            return None
        self._pool = pool
        self._closer = weakref.finalize(self, pool.close)
        return pool

    def _pool_for_run(self) -> Optional[Pool]:
        """The pool a run goes to, started when ``pool`` says so; ``None``
        when runs are spawned."""
        with self._pool_lock:
            self._runs += 1
            if self._pool is not None:
                if self._pool.alive:
                    return self._pool
                said = self._pool.said()
                self._pool = None
                if self.pool_size != AUTO:
                    raise SandboxSetupError("pool", said or "the sandbox's jail pool ended")
                # An automatic pool that ended is not started again.
                self._pool_failed = said or "ended"
                return None
            if self.pool_size == AUTO and self._runs >= 2 and self._pool_failed is None:
                self._start_pool(1, required=False)
            elif isinstance(self.pool_size, int) and self.pool_size > 0 and self._closer is None:
                # Closed, and used again.
                self._start_pool(self.pool_size, required=True)
            return None

    def session(self, *, timeout: Optional[float] = None, envs: Optional[Mapping[str, str]] = None) -> "Session":
        """Start a :class:`Session`: one jail for many cells that share one
        interpreter's state. Use it in a ``with`` block so it is closed.

        Args:
            timeout: Wall-clock limit of each cell in seconds (default: the Sandbox's).
            envs: Environment variables for every cell, over the Sandbox's.

        Raises:
            SandboxSetupError: The session's jail could not be started.
        """
        return Session(self, timeout, envs)

    def command(self, script: PathLike, *, timeout: Optional[float] = None, args: Iterable[str] = ()) -> List[str]:
        """The ``jail run --events`` command line for ``script``."""
        cmd = [str(self.jail), "run", "--events"] + self._flags()
        limit = timeout if timeout is not None else self.timeout
        if limit is not None:
            cmd += ["--timeout", repr(float(limit))]
        cmd.append(str(script))
        args = list(args)
        if args:
            cmd.append("--")
            cmd += args
        return cmd

    def run(
        self,
        code: str,
        *,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
        on_artifact: Optional[Callable[[Artifact], None]] = None,
        timeout: Optional[float] = None,
        args: Iterable[str] = (),
        envs: Optional[Mapping[str, str]] = None,
    ) -> Execution:
        """Run ``code`` in a fresh jail and wait for it to end.

        Args:
            code: Python source, run as ``/workspace/code/main.py``.
            on_stdout: Called with each chunk of the code's stdout as it is written.
            on_stderr: Likewise for stderr.
            on_artifact: Called with each accepted artifact, once the run has ended.
            timeout: Wall-clock limit of this run in seconds (overrides the Sandbox's).
            args: ``sys.argv[1:]`` for the code.
            envs: Environment variables for this run, over the Sandbox's.

        Returns:
            The :class:`Execution`. A timeout, a crash or an exception in the
            code is a status, never an exception here.

        Raises:
            SandboxSetupError: The jail could not be set up; nothing ran.
            SandboxProtocolError: ``jail`` printed no result this client reads.
            JailNotFoundError: The binary cannot be started.
        """
        args = list(args)
        variables = dict(self.envs, **_envs(envs))
        pool = self._pool_for_run()
        execution = None
        if pool is not None and self.output is None and not args:
            execution = self._run_pooled(pool, code, (timeout, variables), on_stdout, on_stderr)
        if execution is None:
            script_dir = _scratch.new_dir("script")
            try:
                script = script_dir / "main.py"
                script.write_text(code, encoding="utf-8")
                # The jail copies the script in as the caller, who owns it.
                script.chmod(0o644)
                execution = self._run_script(script, (timeout, variables), args, on_stdout, on_stderr)
            finally:
                shutil.rmtree(script_dir, ignore_errors=True)
        if on_artifact is not None:
            for a in execution.artifacts:
                on_artifact(a)
        return execution

    # E2B's spelling.
    run_code = run

    def _run_pooled(
        self,
        pool: Pool,
        code: str,
        limits: Tuple[Optional[float], Dict[str, str]],
        on_stdout: Optional[Callback],
        on_stderr: Optional[Callback],
    ) -> Optional[Execution]:
        """The run in a pooled jail; ``None`` when the pool cannot take it
        (a limit above its own), so it is spawned instead."""
        timeout, variables = limits
        request: Dict[str, Any] = {"code": code}
        if variables:
            request["env"] = variables
        if self.input is not None:
            request["input"] = str(self.input)
        limit = timeout if timeout is not None else self.timeout
        if limit is not None:
            request["limits"] = {"wall_time_secs": float(limit)}
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}

        def on_event(event: Dict[str, Any]) -> None:
            cb = callbacks.get(str(event.get("type")))
            if cb is not None:
                cb(_chunk_text(event))

        live = on_stdout is not None or on_stderr is not None
        # The step's own limit bounds the wait; a pool without a timeout
        # uses the policy's, which may be up to a day.
        wait = (float(limit) if limit is not None else 24 * 3600.0) + REPLY_GRACE
        try:
            result = pool.run(request, wait, on_event if live else None)
        except PoolError as e:
            if e.code in ("limit_above_policy",):
                return None
            if e.code == "pool_gone" and self.pool_size == AUTO:
                return None
            raise SandboxSetupError("pool", e.message) from None
        execution = dataclasses.replace(_checked(result, "", own=True), backend="pool")
        if not live:
            # Without events the pool sends the streams with the result.
            for cb, text in ((on_stdout, execution.stdout), (on_stderr, execution.stderr)):
                if cb is not None and text:
                    cb(text)
        return execution

    def _run_script(
        self,
        script: Path,
        limits: Tuple[Optional[float], Dict[str, str]],
        args: Iterable[str],
        on_stdout: Optional[Callback],
        on_stderr: Optional[Callback],
    ) -> Execution:
        timeout, variables = limits
        cmd = self.command(script, timeout=timeout, args=args)
        if variables:
            # On stdin, never on the command line (which others may read).
            cmd[3:3] = ["--env-fd", "0"]
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if variables else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env(),
            )
        except OSError as e:
            raise JailNotFoundError(f"cannot start {self.jail}: {e}") from e
        if variables:
            _give(proc, variables)
        stderr_kept = bytearray()

        def read_stderr() -> None:
            assert proc.stderr is not None
            for chunk in iter(lambda: proc.stderr.read(8192), b""):  # type: ignore[union-attr]
                if len(stderr_kept) < _MAX_STDERR:
                    stderr_kept.extend(chunk[: _MAX_STDERR - len(stderr_kept)])

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        result: Optional[Dict[str, Any]] = None
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    raise SandboxProtocolError(f"jail printed a line that is not an event: {line[:200]!r}") from None
                kind = event.get("type")
                if kind in callbacks:
                    cb = callbacks[kind]
                    if cb is not None:
                        cb(_chunk_text(event))
                elif kind == "result":
                    result = event.get("result")
        finally:
            proc.stdout.close()  # type: ignore[union-attr]
            returncode = proc.wait()
            reader.join()
        jail_stderr = stderr_kept.decode("utf-8", "replace").strip()
        if result is None:
            if returncode == EXIT_SETUP_FAILED:
                # Refused before a run began (bad arguments).
                raise SandboxSetupError("arguments", jail_stderr or "jail refused its arguments")
            raise SandboxProtocolError(f"jail exited {returncode} without a result: {jail_stderr[:400]}")
        return dataclasses.replace(_checked(result, jail_stderr, own=True), backend="run")


def _artifact_fields(a: Dict[str, Any]) -> Dict[str, Any]:
    """An ``artifacts`` entry's fields as :class:`Artifact` takes them, for
    the local and the remote artifact alike."""
    return {
        "path": a["path"],
        "sha256": a.get("sha256"),
        "media_type": a.get("media_type"),
        "summary": a.get("summary"),
        "change": a.get("change") or "",
        "bytes": int(a.get("bytes") or 0),
        "flags": list(a.get("flags") or []),
    }


def _checked(
    result: Any,
    jail_stderr: str,
    make_artifact: Optional[Callable[[Dict[str, Any]], Artifact]] = None,
    run_id: Optional[str] = None,
    own: bool = False,
) -> Execution:
    """The :class:`Execution` of a result this client reads; a setup failure raised.

    ``make_artifact`` builds each artifact instead of a host-folder one (a
    remote result's ``output_dir`` is a folder on the service, never ours).
    ``own``: the result is a run's end (not a session's cell), so an output
    folder ``jail`` made for it in this process's folder is this
    Execution's, removed when it and its artifacts are gone."""
    if not isinstance(result, dict):
        raise SandboxProtocolError(f"the result is not a JSON object: {str(result)[:200]!r}")
    version = result.get("schema_version")
    if version not in SCHEMA_VERSIONS:
        raise SandboxProtocolError(
            f"jail's result has schema_version {version!r}, this client reads {SCHEMA_VERSIONS}: "
            "install the jail-sandbox wheel that matches the binary"
        )
    setup = result.get("setup_error")
    if result.get("status") == "setup_failed" or setup:
        setup = setup or {}
        try:
            stage, message, causes = str(setup["stage"]), str(setup["message"]), [str(c) for c in setup.get("causes", [])]
        except (KeyError, TypeError, AttributeError):
            stage, message, causes = "unknown", jail_stderr or f"setup failed: {str(setup)[:200]}", []
        raise SandboxSetupError(stage, message, causes, result)
    try:
        return _execution(result, make_artifact, run_id, own)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise SandboxProtocolError(f"the result does not have the documented shape ({type(e).__name__}: {e})") from None


class Session:
    """One jail whose interpreter keeps its state from cell to cell
    (``jail session start|exec|stop``). Made by :meth:`Sandbox.session`;
    use it as a context manager so the jail ends however the block does::

        with sandbox.session() as s:
            s.run("x = 41")
            print(s.run("print(x + 1)").stdout)  # 42

    Each cell's output comes back whole when it ends (``on_stdout`` and
    ``on_stderr`` are called once, with the cell's text); the sandbox's
    ``timeout`` is each cell's wall-clock limit.
    """

    def __init__(
        self, sandbox: "Sandbox", timeout: Optional[float] = None, envs: Optional[Mapping[str, str]] = None
    ) -> None:
        self.sandbox = sandbox
        self._envs = dict(sandbox.envs, **_envs(envs))
        self.closing: Optional[Execution] = None
        self.handle: Optional[str] = None
        limit = timeout if timeout is not None else sandbox.timeout
        claimed = self._claim(limit)
        #: ``pool`` (a jail of the sandbox's warm pool, its preload
        #: imported) or ``start`` (``jail session start``).
        self.backend = "pool" if claimed is not None else "start"
        started = claimed or self._start(limit)
        try:
            self.handle = str(started["handle"])
            self.id = str(started["id"])
            self.pid = int(started["pid"])
        except (KeyError, TypeError, ValueError):
            raise SandboxProtocolError(f"jail printed no session handle: {str(started)[:200]!r}") from None
        # A session dropped without close() is stopped, not left to its idle timeout.
        self._stopper = weakref.finalize(self, _stop_quietly, str(sandbox.jail), self.handle, sandbox._env())

    def _claim(self, limit: Optional[float]) -> Optional[Dict[str, Any]]:
        """A session from the sandbox's warm pool (its jail made ahead, the
        preload imported), when one is up and can serve it: no output
        folder of the caller's (a pooled session's is made for it), and
        each cell lowered to ``limit`` within the pool's own."""
        sandbox = self.sandbox
        pool = sandbox._pool
        if pool is None or not pool.alive or sandbox.output is not None:
            return None
        if limit is not None and (sandbox.timeout is None or float(limit) > float(sandbox.timeout)):
            return None
        self._cell_timeout = limit
        request: Dict[str, Any] = {"op": "session"}
        if sandbox.input is not None:
            request["input"] = str(sandbox.input)
        if self._envs:
            request["env"] = self._envs
        try:
            return pool.run(request, REPLY_GRACE)
        except PoolError:
            return None

    def _start(self, limit: Optional[float]) -> Dict[str, Any]:
        self._cell_timeout = None
        cmd = [str(self.sandbox.jail), "session", "start", "--json"] + self.sandbox._flags()
        if limit is not None:
            cmd += ["--timeout", repr(float(limit))]
        stdin = None
        if self._envs:
            # On stdin, never on the command line (which others may read).
            cmd += ["--env-fd", "0"]
            stdin = json.dumps(self._envs).encode("utf-8")
        out = self._call(cmd, stdin)
        if out.returncode != 0:
            message = out.stderr.decode("utf-8", "replace").strip() or f"jail session start exited {out.returncode}"
            raise SandboxSetupError("session", message)
        try:
            started = json.loads(out.stdout)
        except ValueError:
            raise SandboxProtocolError(f"jail session start printed no handle: {out.stdout[:200]!r}") from None
        if not isinstance(started, dict):
            raise SandboxProtocolError(f"jail session start printed no handle: {out.stdout[:200]!r}")
        return started

    def _call(
        self, cmd: List[str], stdin: Optional[bytes], variables: Optional[Dict[str, str]] = None
    ) -> "subprocess.CompletedProcess[bytes]":
        """Run ``cmd``; ``variables`` go on a pipe of their own (``--env-fd``
        names it), as stdin carries the cell."""
        fds: Tuple[int, ...] = ()
        if variables:
            read, write = os.pipe()
            fds = (read,)
            cmd = cmd[:3] + ["--env-fd", str(read)] + cmd[3:]
        try:
            if variables:
                # Under a pipe's buffer, so this never waits for the reader.
                # A cut document is never parsed: jail reads at most 32 KiB
                # and one byte, and refuses more by its size (envs.rs).
                try:
                    os.write(write, json.dumps(variables).encode("utf-8")[: 60 << 10])
                finally:
                    os.close(write)
            return subprocess.run(cmd, input=stdin, capture_output=True, env=self.sandbox._env(), pass_fds=fds)
        except OSError as e:
            raise JailNotFoundError(f"cannot start {self.sandbox.jail}: {e}") from e
        finally:
            for fd in fds:
                os.close(fd)

    def _alive(self) -> bool:
        """Whether the session's supervisor still runs."""
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except OSError:
            return True

    def _result(
        self,
        cmd: List[str],
        stdin: Optional[bytes],
        own: bool = False,
        variables: Optional[Dict[str, str]] = None,
        make_artifact: Optional[Callable[[Dict[str, Any]], Artifact]] = None,
    ) -> Execution:
        out = self._call(cmd, stdin, variables)
        jail_stderr = out.stderr.decode("utf-8", "replace").strip()
        try:
            result = json.loads(out.stdout)
        except ValueError:
            if cmd[2] == "exec" and out.returncode == EXIT_SETUP_FAILED and self._alive():
                # Refused before the cell reached the session (its variables,
                # say), which lives on.
                raise SandboxSetupError("arguments", jail_stderr or "jail refused the cell") from None
            raise SessionClosedError(
                f"jail session {cmd[2]} exited {out.returncode} without a result: {jail_stderr[:400]}"
            ) from None
        return _checked(result, jail_stderr, make_artifact, own=own)

    def run(
        self,
        code: str,
        *,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
        envs: Optional[Mapping[str, str]] = None,
    ) -> Execution:
        """Run ``code`` as the session's next cell; names it defined stay for the next.

        Args:
            envs: Environment variables for this cell only, over the
                session's; set back once it ends.

        Returns:
            The cell's :class:`Execution` (an exception in the code is its
            ``error``, never raised here).

        Raises:
            SessionClosedError: The session was closed, or its jail is gone.
            SandboxSetupError, SandboxProtocolError: As for :meth:`Sandbox.run`.
        """
        if self.handle is None:
            raise SessionClosedError("the session is closed: start another with Sandbox.session()")
        cmd = [str(self.sandbox.jail), "session", "exec"]
        if self._cell_timeout is not None:
            cmd += ["--timeout", repr(float(self._cell_timeout))]
        execution = self._result(
            cmd + [self.handle, "-"], code.encode("utf-8"), variables=_envs(envs), make_artifact=self._artifact
        )
        for cb, text in ((on_stdout, execution.stdout), (on_stderr, execution.stderr)):
            if cb is not None and text:
                cb(text)
        return execution

    run_code = run

    def _artifact(self, a: Dict[str, Any]) -> Artifact:
        """A cell's artifact: in the session until it ends, so read from it."""
        return SessionArtifact(**_artifact_fields(a), output_dir=None, session=self)

    @property
    def files(self) -> Files:
        """The session's ``/workspace/output`` while it lives (:class:`Files`:
        ``write``, ``read``, ``list``), through ``jail session put|get|ls``."""
        return Files(self)

    def _files(self, op: str, path: str, stdin: Optional[bytes] = None) -> Dict[str, Any]:
        """``jail session OP --json`` on ``path`` (the content, for ``put``,
        on stdin): the answer; a refusal raised."""
        if self.handle is None:
            raise SessionClosedError("the session is closed: start another with Sandbox.session()")
        # `--`: a path that starts with `-` is the session's to judge, not an option.
        cmd = [str(self.sandbox.jail), "session", op, "--json", "--", self.handle, path] + (["-"] if op == "put" else [])
        out = self._call(cmd, stdin)
        jail_stderr = out.stderr.decode("utf-8", "replace").strip()
        if out.returncode == EXIT_SETUP_FAILED:
            # The session gave no answer: it ended or is gone (its
            # supervisor may still be delivering its output), or it no
            # longer answers; jail's line says which.
            raise SessionClosedError(f"{jail_stderr[:400] or 'the session gave no answer'}: start another with Sandbox.session()")
        try:
            answer = json.loads(out.stdout)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and out.returncode == 1 and answer.get("status") == "refused":
            raise FileRefusedError(
                str(answer.get("code")), str(answer.get("detail") or ""), reason=answer.get("reason"), path=path
            )
        if not isinstance(answer, dict) or out.returncode != 0:
            raise SandboxProtocolError(f"jail session {op} exited {out.returncode} without an answer: {jail_stderr[:400]}")
        return answer

    def _put_file(self, path: str, data: bytes) -> Dict[str, Any]:
        return self._files("put", path, data)

    def _read_file(self, path: str) -> Tuple[bytes, str]:
        """The judged bytes of ``path`` and the sha256 of the file as the
        code wrote it (a neutralised copy's original's)."""
        answer = self._files("get", path)
        try:
            data = base64.b64decode(answer["data"], validate=True)
            artifact = answer["artifact"]
            sha256 = artifact["sha256"]
            written = str((artifact.get("neutralised") or {}).get("original_sha256") or sha256)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SandboxProtocolError(f"jail session get {path!r}: the answer is not a file read") from None
        _check_sha256(path, data, sha256)
        return data, written

    def _list_files(self, path: str) -> Dict[str, Any]:
        return self._files("ls", path)

    def close(self) -> Optional[Execution]:
        """End the session: its jail is killed and removed, its artifacts
        delivered. Returns the closing result (its ``artifacts``); ``None``
        when it was closed already. Safe to call twice."""
        if self.handle is None:
            return self.closing
        handle, self.handle = self.handle, None
        self._stopper.detach()
        self.closing = self._result([str(self.sandbox.jail), "session", "stop", handle], None, own=True)
        return self.closing

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        except SandboxError:
            # An exception from the block wins; the jail is gone either way.
            if exc[0] is None:
                raise


def _check_sha256(
    path: str, data: bytes, sha256: Any, error: Callable[[str], SandboxError] = SandboxProtocolError
) -> None:
    """Refuse a file read whose bytes are not the ones the session judged."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise error(f"files.read {path!r}: the bytes' sha256 {digest} is not {sha256!r}, the one judged: refused")


def _envs(envs: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """``envs`` as a dict of strings; ``jail`` checks the names and sizes."""
    if envs is None:
        return {}
    if not isinstance(envs, Mapping):
        raise TypeError(f"envs must be a mapping of names to strings, not {type(envs).__name__}")
    for name, value in envs.items():
        if not isinstance(name, str):
            raise TypeError(f"envs: the name {name!r} is not a str")
        if not isinstance(value, str):
            raise TypeError(f"envs[{name!r}] is a {type(value).__name__}: give a str")
    return dict(envs)


def _give(proc: "subprocess.Popen[bytes]", variables: Dict[str, str]) -> None:
    """Write ``variables`` as JSON to ``proc``'s stdin and close it; a
    ``jail`` that refused them and exited already says why on stderr."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(variables).encode("utf-8"))
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _stop_quietly(jail: str, handle: str, env: Dict[str, str]) -> None:
    """Stop a session no one closed (its closing result is dropped)."""
    try:
        subprocess.run([jail, "session", "stop", handle], capture_output=True, env=env, timeout=60)
    except (OSError, subprocess.SubprocessError):
        pass


def _chunk_text(event: Dict[str, Any]) -> str:
    """A chunk event's text; for bytes that were not UTF-8, the exact bytes
    decoded with ``surrogateescape`` (so ``.encode("utf-8", "surrogateescape")``
    gives them back)."""
    raw = event.get("base64")
    if raw is not None:
        return base64.b64decode(raw).decode("utf-8", "surrogateescape")
    return str(event.get("data", ""))


def _execution(
    r: Dict[str, Any],
    make_artifact: Optional[Callable[[Dict[str, Any]], Artifact]] = None,
    run_id: Optional[str] = None,
    own: bool = False,
) -> Execution:
    err = r.get("error")
    error = None
    if err:
        error = ExecutionError(
            type=err.get("type") or "", message=err.get("message") or "", traceback=err.get("traceback_tail") or ""
        )
    u = r.get("usage") or {}
    usage = Usage(
        wall_ms=float(u.get("wall_ms") or 0.0),
        user_cpu_ms=u.get("user_cpu_ms"),
        system_cpu_ms=u.get("system_cpu_ms"),
        peak_memory_bytes=u.get("peak_memory_bytes"),
        max_rss_bytes=u.get("max_rss_bytes"),
        pids_peak=u.get("pids_peak"),
    )
    out_dir = Path(r["output_dir"]) if r.get("output_dir") and make_artifact is None else None
    owner = _scratch.Owned(out_dir) if own and out_dir is not None and _scratch.owns(out_dir) else None
    artifacts = [
        make_artifact(a)
        if make_artifact is not None
        else Artifact(**_artifact_fields(a), output_dir=out_dir, _owner=owner)
        for a in r.get("artifacts") or []
    ]
    stdout = r.get("stdout") or {}
    stderr = r.get("stderr") or {}
    return Execution(
        status=r.get("status", ""),
        stdout=stdout.get("text", ""),
        stderr=stderr.get("text", ""),
        error=error,
        exit_code=r.get("exit_code"),
        usage=usage,
        artifacts=artifacts,
        output_dir=out_dir,
        stdout_truncated=bool(stdout.get("truncated")),
        stderr_truncated=bool(stderr.get("truncated")),
        result=r,
        run_id=run_id,
        results=[
            Result(data=dict(x.get("data") or {}), is_main_result=bool(x.get("is_main_result")), flags=list(x.get("flags") or []))
            for x in r.get("results") or []
            if isinstance(x, dict)
        ],
        _owner=owner,
    )
