"""The remote client: the same API as :class:`~jail_sandbox.Sandbox`, with
each run or session cell done by a ``jail serve`` service over HTTP.

What it speaks (README "As a service", ``GET /openapi.json``):

- ``POST /v1/runs`` with ``"wait": true`` when no live callback is asked
  for (the run is tied to the request: a client that goes away ends it),
  else ``"wait": false`` and ``GET /v1/runs/{id}/events`` (server-sent
  events: each ``jail run --events`` line, the last one the ``result`` or
  ``error`` event, then ``event: end``; a ``: keepalive`` comment every 15 s
  of silence). The service records the run before it sends its last event,
  so its artifacts are there once the result event is. A followed run this
  client stops following (an exception in a callback, Ctrl-C, a timeout)
  is cancelled: ``DELETE /v1/runs/{id}``.
- ``GET /v1/runs/{id}/artifacts/{path}`` for an accepted artifact's bytes,
  checked against the ``sha256`` and ``bytes`` the result lists.
- ``POST /v1/sessions`` (with the input folder's ``files`` or
  ``input_tar``), ``POST /v1/sessions/{id}/exec``, ``DELETE
  /v1/sessions/{id}``, and ``GET /v1/sessions/{id}/artifacts/{path}`` for
  the artifacts a deleted session's closing result lists.
- A live session's files (``session.files``): ``PUT
  /v1/sessions/{id}/files/{path}`` (the raw bytes), ``GET`` of the same
  (the judged bytes, checked against ``x-jail-sha256``) and ``GET
  /v1/sessions/{id}/files?path=DIR``; a refusal (the service's 4xx with a
  files code) is a :class:`~jail_sandbox.FileRefusedError`, as locally.
  A cell's artifacts are read through the same ``GET`` (the session has
  delivered nothing yet), each checked against the sha256 the cell listed
  (``x-jail-original-sha256`` for a neutralised copy).

The service is trusted less than the local binary: every request has a
timeout, every reply is read up to a cap, every result's
``schema_version`` and shape are checked, nothing the service names is
used as a local path, and an artifact whose bytes differ from what the
result lists is refused. Retries are made only where nothing ran: a 429 or
503 that carries ``Retry-After`` (a few times, each wait capped), and a GET
that could not connect.

Standard library only (``http.client``, ``json``, ``base64``, ``tarfile``).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import http.client
import io
import json
import os
import re
import socket
import ssl
import stat
import tarfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from ._sandbox import (
    FILE_REFUSALS,
    MAX_FILE,
    SCHEMA_VERSIONS,
    Artifact,
    Callback,
    Execution,
    FileRefusedError,
    Files,
    PathLike,
    SandboxError,
    SandboxProtocolError,
    SessionArtifact,
    SessionClosedError,
    _artifact_fields,
    _check_sha256,
    _checked,
    _chunk_text,
    _envs,
)

#: Bytes of a JSON reply read at most (the service caps a run's events at 64 MiB).
MAX_REPLY_BYTES = 64 << 20
#: Bytes of an error reply read at most.
MAX_ERROR_BYTES = 64 << 10
#: Bytes of one run's event stream read at most (its events, then the result).
MAX_EVENTS_BYTES = 80 << 20
#: Bytes of one artifact fetched at most (the service serves at most 256 MiB).
MAX_ARTIFACT_BYTES = 256 << 20
#: Bytes a second a reply's body must come at, past the request's timeout.
MIN_READ_RATE = 64 << 10
#: Bytes asked of the socket at a time while a body is read.
READ_CHUNK = 1 << 20
#: Bytes of an input folder sent at most, before encoding.
MAX_INPUT_BYTES = 256 << 20
#: Input files the ``files`` field may carry; more go as a tar.
MAX_INPUT_FILES = 256
#: Seconds a run or cell is waited for beyond its own limit: the service
#: gives a hung run 30 s past its deadline, then its setup and delivery.
WAIT_SLACK = 60.0
#: Seconds a run or cell is waited for when no timeout is given (the
#: tenant's most applies then, which the client cannot know).
DEFAULT_WAIT = 900.0
#: Seconds an event stream may be silent before it is deemed broken and
#: opened again: the service sends a keepalive comment every 15 s.
EVENTS_SILENCE = 45.0
#: Seconds a cancel (``DELETE /v1/runs/{id}``) of a run this client stops
#: following is given.
CANCEL_TIMEOUT = 20.0

# Ids the service makes are 128 random bits in hex; anything else is not put in a URL.
_ID = re.compile(r"^[0-9A-Za-z_-]{1,128}$")


class RemoteError(SandboxError):
    """The service refused a request or failed it (an HTTP error status).

    Attributes:
        status: The HTTP status (``None`` when there was no answer at all).
        code: The JSON error's ``code``: ``bad_request``, ``unauthorized``,
            ``not_found``, ``too_large``, ``busy``, ``draining``, ``session_ended``,
            ``failed`` (``None`` when the body was not the service's JSON error).
        field: The request field at fault, as the service names it
            (``limits.timeout_secs``), or ``None``.
        message: The service's message (it names the fix), or the start of the body.
        retry_after: Seconds the service asked to wait (``Retry-After``), or ``None``.
        method, path: The request.
        reason: The artifact rules' reason the service gave with a files
            API refusal, or ``None``.
    """

    def __init__(
        self,
        text: str,
        *,
        status: Optional[int],
        code: Optional[str] = None,
        field: Optional[str] = None,
        message: str = "",
        retry_after: Optional[float] = None,
        method: str = "",
        path: str = "",
        reason: Optional[str] = None,
    ) -> None:
        super().__init__(text)
        self.status = status
        self.code = code
        self.field = field
        self.message = message
        self.retry_after = retry_after
        self.method = method
        self.path = path
        self.reason = reason


class RemoteConnectionError(RemoteError):
    """The service could not be reached, or did not answer in time."""


class RemoteTimeoutError(RemoteConnectionError):
    """The service did not answer within the request's timeout (never retried:
    it may still be working on the request)."""


class ArtifactMismatchError(SandboxProtocolError):
    """The bytes the service sent for an artifact are not the ones its result
    lists (size or sha256): refused, never returned."""


@dataclass(frozen=True)
class RemoteArtifact(Artifact):
    """An accepted artifact of a remote run, or of a remote session's
    closing result (a live session's cell lists
    :class:`~jail_sandbox.SessionArtifact` objects). Its bytes stay on the service
    until :meth:`read_bytes` fetches them (``GET
    /v1/runs/{id}/artifacts/{path}``) and checks them against ``sha256`` and
    ``bytes``; ``output_dir`` and ``host_path`` are ``None``.

    Attributes:
        run_id: The run whose output it is, or ``None``.
        session_id: The session whose closing result lists it (``GET
            /v1/sessions/{id}/artifacts/{path}``), or ``None``.
    """

    run_id: Optional[str] = None
    sandbox: Optional["RemoteSandbox"] = field(default=None, repr=False, compare=False)
    session_id: Optional[str] = None

    def read_bytes(self) -> bytes:
        """The artifact's content, fetched from the service and checked.

        Raises:
            ArtifactMismatchError: The size or sha256 differs from the result's.
            RemoteError: The service refused (for example 404: the service
                keeps a tenant's last 64 runs and 64 ended sessions, older
                ones are gone).
            SandboxError: The artifact was deleted.
        """
        if self.sandbox is None or (self.run_id is None and self.session_id is None):
            raise SandboxError(f"artifact {self.path}: it belongs to no run or ended session of the service")
        return self.sandbox._fetch_artifact(self)


class RemoteSandbox:
    """A ``jail serve`` service, used like a local :class:`~jail_sandbox.Sandbox`::

        remote = RemoteSandbox("http://127.0.0.1:8080", token)
        execution = remote.run("print(6 * 7)", on_stdout=print)
        with remote.session() as s:
            s.run("x = 41")

    Each :meth:`run` is a fresh jail on the service; :meth:`session` keeps
    one. Policy and rootfs are the service's; the limits asked for must be
    within the token's (else :class:`RemoteError` 400 naming the field).

    Args:
        url: The service's base URL, ``http://`` or ``https://`` (default: ``$JAIL_URL``).
        token: The bearer token the service's operator gave you (default: ``$JAIL_TOKEN``).
        input: A local folder whose files the code reads at ``/workspace/input``
            (sent with each run: UTF-8 text files of one level as ``files``,
            anything else as a tar; links and special files are refused).
        timeout: Wall-clock limit of a run in seconds (default: the token's most).
        memory: Memory of a run, ``"256M"``/``"1G"`` or an int of MiB (default: the token's most).
        request_timeout: Seconds to connect and for each read of a call that
            does not wait for code (default 30); a reply's body still coming
            after it must come at 64 KiB/s at least.
        wait_timeout: Seconds a run or cell is waited for at most (default:
            its timeout plus 60 s, or 15 minutes when no timeout is given).
        retries: How many times a request refused with 429 or 503 and a
            ``Retry-After`` is sent again (default 3).
        max_retry_wait: The longest ``Retry-After`` waited for, in seconds
            (default 30); a longer one is raised at once.
        envs: Environment variables for the code of every run and session
            (``env`` in the request); a run's or a cell's own ``envs`` win.
            The service checks them as ``jail`` does: a refused one is a
            :class:`RemoteError` 400 with ``field == "env"``.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        input: Optional[PathLike] = None,
        timeout: Optional[float] = None,
        memory: Union[int, str, None] = None,
        request_timeout: float = 30.0,
        wait_timeout: Optional[float] = None,
        retries: int = 3,
        max_retry_wait: float = 30.0,
        envs: Optional[Mapping[str, str]] = None,
    ) -> None:
        url = url if url is not None else os.environ.get("JAIL_URL")
        token = token if token is not None else os.environ.get("JAIL_TOKEN")
        if not url:
            raise SandboxError("no service URL: pass RemoteSandbox(url, ...) or set JAIL_URL (e.g. http://127.0.0.1:8080)")
        if not token:
            raise SandboxError("no token: pass RemoteSandbox(url, token) or set JAIL_TOKEN to the token the service's operator gave you")
        if any(c in token for c in "\r\n\0") or token != token.strip():
            raise SandboxError("the token has whitespace or control characters around or in it: check JAIL_TOKEN")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SandboxError(f"service URL {url!r} is not http://HOST[:PORT][/PREFIX] or https://...: check JAIL_URL")
        if parts.query or parts.fragment:
            raise SandboxError(f"service URL {url!r} has a query or fragment: give the base URL alone")
        try:
            port = parts.port
        except ValueError:
            raise SandboxError(f"service URL {url!r} has a bad port: check JAIL_URL") from None
        self.url = url.rstrip("/")
        self._scheme = parts.scheme
        # One TLS context (its CA store loaded once) for every connection.
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._host = parts.hostname
        self._port = port
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self.input = None if input is None else Path(input)
        self.timeout = timeout
        self.memory_mib = _mib(memory)
        if request_timeout <= 0:
            raise SandboxError("request_timeout must be above 0 seconds")
        self.request_timeout = float(request_timeout)
        self.wait_timeout = wait_timeout
        self.retries = max(0, int(retries))
        self.max_retry_wait = float(max_retry_wait)
        self.envs = _envs(envs)

    def __repr__(self) -> str:
        # Never the token.
        return f"RemoteSandbox({self.url!r})"

    def __enter__(self) -> "RemoteSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        # Nothing held: every call opens and closes its own connection.
        return None

    # ------------------------------------------------------------- runs

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
        """Run ``code`` in a fresh jail on the service and wait for it to end.

        With ``on_stdout`` or ``on_stderr`` the run is started with
        ``"wait": false`` and followed through its server-sent events, so the
        callbacks get each chunk as the code writes it; if the following
        stops before the run ends (a callback raised, Ctrl-C, a timeout) the
        run is cancelled on the service (``DELETE /v1/runs/{id}``). Without
        them the reply waits for the run, and a client that goes away ends it.

        Args:
            code: Python source, run as ``/workspace/code/main.py``.
            on_stdout, on_stderr: Called with each chunk of output, live.
            on_artifact: Called with each accepted :class:`RemoteArtifact` once the run ended.
            timeout: Wall-clock limit of this run in seconds (overrides the sandbox's).
            args: Not supported by the service: must be empty.
            envs: Environment variables for this run, over the sandbox's.

        Returns:
            The :class:`~jail_sandbox.Execution`; its artifacts are
            :class:`RemoteArtifact` (``read_bytes()`` fetches them).

        Raises:
            SandboxSetupError: The jail could not be set up on the service; nothing ran.
            RemoteError: The service refused the request (the token, a limit
                above the token's, a body too large, busy past the retries).
            SandboxProtocolError: The service's reply is not one this client reads.
        """
        if list(args):
            raise SandboxError(
                "args: the service takes no argv for a run (POST /v1/runs has no args field): "
                "put the values in the code, or run locally with Sandbox"
            )
        limit = timeout if timeout is not None else self.timeout
        body: Dict[str, Any] = {"code": code, "limits": self._limits(limit)}
        variables = dict(self.envs, **_envs(envs))
        if variables:
            body["env"] = variables
        if self.input is not None:
            body.update(input_payload(self.input))
        wait_for = self._wait_for(limit)
        live = on_stdout is not None or on_stderr is not None
        body["wait"] = not live
        reply = self._json("POST", "/v1/runs", body, timeout=wait_for if not live else self.request_timeout)
        run_id = _id_of(reply)
        result: Any
        if live:
            result = self._follow(run_id, on_stdout, on_stderr, wait_for)
        else:
            result = reply.get("result")
            if reply.get("state") != "done" or result is None:
                raise SandboxProtocolError(f"the service answered a waited run with state {reply.get('state')!r} and no result")
        execution = self._execution(result, run_id)
        if on_artifact is not None:
            for a in execution.artifacts:
                on_artifact(a)
        return execution

    # E2B's spelling.
    run_code = run

    def session(
        self,
        *,
        timeout: Optional[float] = None,
        memory: Union[int, str, None] = None,
        session_id: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
    ) -> "RemoteSession":
        """Start a :class:`RemoteSession` on the service (``POST /v1/sessions``):
        one jail whose interpreter keeps its state from cell to cell. Use it in
        a ``with`` block so it is deleted however the block ends.

        Args:
            timeout: Wall-clock limit of each cell in seconds (default: the sandbox's).
            memory: Memory of the session's jail (default: the sandbox's).
            session_id: Attach to a session this token opened before (its
                ``id``) instead of starting one.
            envs: Environment variables for every cell, over the sandbox's.

        The sandbox's ``input`` folder is sent with the request, as a run's
        (``files`` or ``input_tar``), and read by every cell at
        ``/workspace/input``.

        Raises:
            RemoteError: The service refused (for example 429: the token's sessions are all open).
            SandboxError: The input folder holds a link or a special file, or is too large.
        """
        if session_id is not None:
            if not isinstance(session_id, str) or not _ID.match(session_id):
                raise SandboxError(f"session id {session_id!r} is not an id the service makes: check it")
            return RemoteSession(self, session_id, self._cell_limit(timeout))
        limit = self._cell_limit(timeout)
        limits = self._limits(limit)
        mib = _mib(memory)
        if mib is not None:
            limits["memory_mib"] = mib
        body: Dict[str, Any] = {"limits": limits}
        variables = dict(self.envs, **_envs(envs))
        if variables:
            body["env"] = variables
        if self.input is not None:
            body.update(input_payload(self.input))
        reply = self._json("POST", "/v1/sessions", body, timeout=self.request_timeout, ok=(201,))
        return RemoteSession(self, _id_of(reply), limit)

    # ------------------------------------------------------------- the pieces

    def _cell_limit(self, timeout: Optional[float]) -> Optional[float]:
        return timeout if timeout is not None else self.timeout

    def _limits(self, timeout: Optional[float]) -> Dict[str, Any]:
        limits: Dict[str, Any] = {}
        if timeout is not None:
            limits["timeout_secs"] = float(timeout)
        if self.memory_mib is not None:
            limits["memory_mib"] = self.memory_mib
        return limits

    def _wait_for(self, limit: Optional[float]) -> float:
        if self.wait_timeout is not None:
            return float(self.wait_timeout)
        return (float(limit) if limit is not None and limit > 0 else DEFAULT_WAIT) + WAIT_SLACK

    def _execution(
        self, result: Any, run_id: Optional[str], session_id: Optional[str] = None, cell_of: Optional["RemoteSession"] = None
    ) -> Execution:
        """``cell_of``: the live session whose cell this is; its artifacts
        are that session's until it ends, read through its files route."""
        _check_result_shape(result)

        def make(a: Dict[str, Any]) -> Artifact:
            if cell_of is not None:
                return SessionArtifact(**_artifact_fields(a), output_dir=None, session=cell_of)
            return RemoteArtifact(**_artifact_fields(a), output_dir=None, run_id=run_id, sandbox=self, session_id=session_id)

        return _checked(result, "", make, run_id)

    def _follow(
        self, run_id: str, on_stdout: Optional[Callback], on_stderr: Optional[Callback], wait_for: float
    ) -> Dict[str, Any]:
        """The run's result, read from its server-sent events; each chunk
        handed to its callback as it comes. A dropped stream is opened again
        (the service replays it from the start; what was handed on is skipped).
        The service records the run before its last event, so once the
        result event is here its artifacts are too; a run that ended without
        a result ends with an ``error`` event, raised as :class:`RemoteError`."""
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        deadline = time.monotonic() + wait_for
        result: Optional[Dict[str, Any]] = None
        failure: Optional[Dict[str, Any]] = None
        seen = 0
        reconnects = 0
        try:
            while True:
                handed = 0
                try:
                    for data in self._events(run_id, deadline):
                        handed += 1
                        if handed <= seen:
                            continue
                        seen = handed
                        try:
                            event = json.loads(data)
                        except ValueError:
                            raise SandboxProtocolError(f"run {run_id}: an event is not JSON: {data[:200]!r}") from None
                        if not isinstance(event, dict):
                            raise SandboxProtocolError(f"run {run_id}: an event is not a JSON object: {data[:200]!r}")
                        kind = event.get("type")
                        if kind in callbacks:
                            cb = callbacks[kind]
                            if cb is not None:
                                cb(_chunk_text(event))
                        elif kind == "result":
                            found = event.get("result")
                            if not isinstance(found, dict):
                                raise SandboxProtocolError(f"run {run_id}: the result event holds no result object")
                            result = found
                        elif kind == "error":
                            error = event.get("error")
                            failure = error if isinstance(error, dict) else {}
                    break
                except _StreamDropped as e:
                    reconnects += 1
                    if reconnects > self.retries or time.monotonic() >= deadline:
                        raise RemoteConnectionError(
                            f"run {run_id}: the event stream broke {reconnects} times ({e}): "
                            "check the network to the service; the run was cancelled on the service",
                            status=None,
                            method="GET",
                            path=f"/v1/runs/{run_id}/events",
                        ) from None
        except BaseException:
            # Not followed to its end: not left running on the service.
            self._cancel(run_id)
            raise
        if result is not None:
            return result
        path = f"/v1/runs/{run_id}/events"
        if failure is not None:
            code = failure.get("code") if isinstance(failure.get("code"), str) else None
            message = str(failure.get("message") or "")[:2000]
            raise RemoteError(
                f"run {run_id} failed on the service ({code}): {message}",
                status=None,
                code=code,
                message=message,
                method="GET",
                path=path,
            )
        raise SandboxProtocolError(f"run {run_id}: the service ended its events with neither a result nor an error")

    def _cancel(self, run_id: str) -> None:
        """Cancel a run (``DELETE /v1/runs/{id}``), as well as can be: the
        caller is already on its way out with another error."""
        try:
            self._json("DELETE", f"/v1/runs/{run_id}", None, timeout=CANCEL_TIMEOUT, ok=(200, 202))
        except (SandboxError, OSError):
            pass

    def _events(self, run_id: str, deadline: float) -> Iterator[str]:
        """The ``data`` of each server-sent event of the run, until ``event: end``."""
        path = f"/v1/runs/{run_id}/events"
        # Each read waits at most EVENTS_SILENCE: the service sends a
        # keepalive every 15 s, so silence that long is a broken connection.
        silence = min(max(1.0, deadline - time.monotonic()), EVENTS_SILENCE)
        conn, resp = self._send("GET", path, None, timeout=silence, accept="text/event-stream")
        try:
            if resp.status != 200:
                raise _error("GET", path, resp, 0)
            kind = (resp.getheader("Content-Type") or "").split(";")[0].strip()
            if kind != "text/event-stream":
                raise SandboxProtocolError(f"GET {path} answered {kind or 'no content type'}, not text/event-stream")
            budget = MAX_EVENTS_BYTES
            data: List[str] = []
            event = ""
            while True:
                if time.monotonic() >= deadline:
                    raise RemoteTimeoutError(
                        f"run {run_id}: no end of its events within its wait_timeout: "
                        "the service or the network is stuck (raise wait_timeout for longer runs)",
                        status=None,
                        method="GET",
                        path=path,
                    )
                try:
                    raw = resp.readline(budget + 1)
                except socket.timeout:
                    raise _StreamDropped(f"nothing, not even a keepalive, for {silence:.0f} s") from None
                except (OSError, http.client.HTTPException) as e:
                    raise _StreamDropped(str(e) or type(e).__name__) from None
                if not raw:
                    raise _StreamDropped("the connection closed before `event: end`")
                budget -= len(raw)
                if budget < 0 or not raw.endswith(b"\n"):
                    if budget < 0:
                        raise SandboxProtocolError(f"run {run_id}: its events are over {MAX_EVENTS_BYTES} bytes: refused")
                    raise _StreamDropped("the connection closed inside an event")
                line = raw.decode("utf-8", "replace").rstrip("\n").rstrip("\r")
                if line == "":
                    # A blank line ends an event.
                    if event == "end":
                        return
                    if data and event in ("", "message"):
                        yield "\n".join(data)
                    data, event = [], ""
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    data.append(value)
                elif name == "event":
                    event = value
        finally:
            conn.close()

    def _fetch_artifact(self, artifact: RemoteArtifact) -> bytes:
        if artifact.sha256 is None or artifact.change == "deleted":
            raise SandboxError(f"artifact {artifact.path}: the code deleted it; there are no bytes to fetch")
        want = artifact.bytes
        if want > MAX_ARTIFACT_BYTES:
            raise SandboxProtocolError(f"artifact {artifact.path}: {want} bytes is over this client's {MAX_ARTIFACT_BYTES}")
        owner = f"runs/{artifact.run_id}" if artifact.run_id is not None else f"sessions/{artifact.session_id}"
        path = f"/v1/{owner}/artifacts/{urllib.parse.quote(artifact.path, safe='/')}"
        conn, resp = self._call("GET", path, None, timeout=self.request_timeout, ok=(200,))
        try:
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) != want:
                raise ArtifactMismatchError(
                    f"artifact {artifact.path}: the service sends {length} bytes, its result lists {want}: refused"
                )
            data = _read(resp, want + 1, path, self.request_timeout)
        finally:
            conn.close()
        if len(data) != want:
            sent = f"more than {want}" if len(data) > want else str(len(data))
            raise ArtifactMismatchError(
                f"artifact {artifact.path}: the service sent {sent} bytes, its result lists {want}: refused"
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != artifact.sha256:
            raise ArtifactMismatchError(
                f"artifact {artifact.path}: sha256 {digest} of the bytes sent is not {artifact.sha256}, "
                "the one its result lists: refused"
            )
        return data

    # ------------------------------------------------------------- HTTP

    def _json(
        self,
        method: str,
        path: str,
        body: Optional[Dict[str, Any]],
        *,
        timeout: float,
        ok: Tuple[int, ...] = (200, 202),
        raw: Optional[bytes] = None,
    ) -> Dict[str, Any]:
        """Send a request (``raw``: bytes as they are, not ``body``'s JSON),
        take a JSON object back (bounded)."""
        conn, resp = self._call(method, path, body, timeout=timeout, ok=ok, raw=raw)
        try:
            raw = _read(resp, MAX_REPLY_BYTES, path, timeout)
        finally:
            conn.close()
        try:
            reply = json.loads(raw)
        except ValueError:
            raise SandboxProtocolError(f"{method} {path} answered {resp.status} with a body that is not JSON: {raw[:200]!r}") from None
        if not isinstance(reply, dict):
            raise SandboxProtocolError(f"{method} {path} answered {resp.status} with JSON that is not an object")
        return reply

    def _call(
        self,
        method: str,
        path: str,
        body: Optional[Dict[str, Any]],
        *,
        timeout: float,
        ok: Tuple[int, ...],
        raw: Optional[bytes] = None,
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request (``raw``: an ``application/octet-stream`` body);
        an answer with a status in ``ok``. 429 and 503 with ``Retry-After``
        are sent again (nothing ran), a GET that could not connect too; any
        other status is a :class:`RemoteError`."""
        payload = raw if raw is not None else _encode(body)
        kind = "application/octet-stream" if raw is not None else "application/json"
        attempt = 0
        while True:
            try:
                conn, resp = self._send(method, path, payload, timeout=timeout, content_type=kind)
            except RemoteTimeoutError:
                raise
            except RemoteConnectionError:
                if method != "GET" or attempt >= self.retries:
                    raise
                attempt += 1
                time.sleep(min(2.0, 0.25 * 2**attempt))
                continue
            if resp.status in ok:
                return conn, resp
            try:
                error = _error(method, path, resp, attempt)
            finally:
                conn.close()
            wait = error.retry_after
            if (
                resp.status in (429, 503)
                and wait is not None
                and wait <= self.max_retry_wait
                and attempt < self.retries
            ):
                attempt += 1
                time.sleep(wait)
                continue
            raise error

    def _send(
        self,
        method: str,
        path: str,
        payload: Optional[bytes],
        *,
        timeout: float,
        accept: str = "application/json",
        content_type: str = "application/json",
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """One request; ``payload`` is a JSON body made by :func:`_encode`,
        or a file's bytes (``content_type``)."""
        conn: http.client.HTTPConnection
        if self._tls is not None:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._tls)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": accept,
            "User-Agent": "jail-sandbox (python)",
        }
        if payload is not None:
            headers["Content-Type"] = content_type
        try:
            conn.request(method, self._prefix + path, body=payload, headers=headers)
            resp = conn.getresponse()
        except socket.timeout:
            conn.close()
            raise RemoteTimeoutError(
                f"{method} {path}: no answer from {self.url} within {timeout:.0f} s: the service is stuck or the "
                "network drops packets (raise request_timeout or wait_timeout if the code runs longer)",
                status=None,
                method=method,
                path=path,
            ) from None
        except ssl.SSLError as e:
            conn.close()
            raise RemoteConnectionError(
                f"{method} {path}: TLS with {self.url} failed ({e}): check the URL's scheme and the service's certificate",
                status=None,
                method=method,
                path=path,
            ) from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise RemoteConnectionError(
                f"{method} {path}: cannot reach the service at {self.url} ({e or type(e).__name__}): "
                "is `jail serve` running there? check JAIL_URL",
                status=None,
                method=method,
                path=path,
            ) from None
        return conn, resp


def _encode(body: Optional[Dict[str, Any]]) -> Optional[bytes]:
    """A request's JSON body, made once however often it is sent."""
    if body is None:
        return None
    try:
        return json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise SandboxError(f"the request holds text that is not valid Unicode ({e.reason}): send str without lone surrogates") from None


class RemoteSession:
    """One jail on the service whose interpreter keeps its state from cell to
    cell. Made by :meth:`RemoteSandbox.session`; a context manager that
    deletes the session however the block ends::

        with remote.session() as s:
            s.run("x = 41")
            print(s.run("print(x + 1)").stdout)  # 42

    A cell's output comes back whole when it ends (``on_stdout`` and
    ``on_stderr`` are called once, with the cell's text). The service ends an
    idle session after the policy's idle timeout; a call on it then raises
    :class:`~jail_sandbox.SessionClosedError`.

    Attributes:
        id: The service's session id (give it to ``RemoteSandbox.session(session_id=...)`` to attach again).
        closing: The closing result once :meth:`close` ran: its artifacts
            (what the cells left in ``/workspace/output`` that passed) are
            :class:`RemoteArtifact` objects, fetched from the service by ``read_bytes()``.
    """

    def __init__(self, sandbox: RemoteSandbox, session_id: str, timeout: Optional[float]) -> None:
        self.sandbox = sandbox
        self.id = session_id
        self.timeout = timeout
        self.closed = False
        self.closing: Optional[Execution] = None
        # Why it ended by itself, once the service said so (410).
        self._ended: Optional[str] = None

    def __repr__(self) -> str:
        return f"RemoteSession({self.id!r}, closed={self.closed})"

    def _gone(self, e: RemoteError) -> SessionClosedError:
        if e.status == 410:
            # It ended by itself (a cell that ignored its KeyboardInterrupt
            # past the grace, one that ended the interpreter, the idle
            # timeout): the service's message says which. The service keeps
            # its closing result for close().
            self._ended = (
                f"session {self.id} ended ({e.message}): its variables are gone; start another with "
                "RemoteSandbox.session() (close() still gives its closing result)"
            )
            return SessionClosedError(self._ended)
        self.closed = True
        return SessionClosedError(
            f"session {self.id} is gone ({e.status}: {e.message}): it ended (idle timeout, lifetime, a server "
            "restart, a DELETE) or the id is not this token's: start another with RemoteSandbox.session()"
        )

    def run(
        self,
        code: str,
        *,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
        envs: Optional[Mapping[str, str]] = None,
    ) -> Execution:
        """Run ``code`` as the session's next cell (``POST /v1/sessions/{id}/exec``).

        Args:
            envs: Environment variables for this cell only, over the
                session's; set back once it ends.

        Raises:
            SessionClosedError: The session was closed, or the service no longer has it.
            RemoteError, SandboxSetupError, SandboxProtocolError: As for :meth:`RemoteSandbox.run`.
        """
        if self.closed:
            raise SessionClosedError("the session is closed: start another with RemoteSandbox.session()")
        if self._ended is not None:
            raise SessionClosedError(self._ended)
        body: Dict[str, Any] = {"code": code}
        variables = _envs(envs)
        if variables:
            body["env"] = variables
        try:
            reply = self.sandbox._json(
                "POST",
                f"/v1/sessions/{self.id}/exec",
                body,
                timeout=self.sandbox._wait_for(self.timeout),
                ok=(200,),
            )
        except RemoteError as e:
            if e.status in (404, 410):
                raise self._gone(e) from e
            raise
        execution = self.sandbox._execution(reply.get("result"), None, cell_of=self)
        for cb, text in ((on_stdout, execution.stdout), (on_stderr, execution.stderr)):
            if cb is not None and text:
                cb(text)
        return execution

    run_code = run

    @property
    def files(self) -> Files:
        """The session's ``/workspace/output`` while it lives
        (:class:`~jail_sandbox.Files`: ``write``, ``read``, ``list``), through
        ``/v1/sessions/{id}/files``."""
        return Files(self)

    def _file_url(self, path: str) -> str:
        if not path:
            # The URL has no place for an empty path; the session would refuse it too.
            raise FileRefusedError("bad_path", "an empty path: name a file", reason="bad_name", path=path)
        try:
            return f"/v1/sessions/{self.id}/files/{urllib.parse.quote(path, safe='/')}"
        except UnicodeEncodeError:
            raise FileRefusedError("bad_path", "the path is not valid Unicode", reason="bad_name", path=path) from None

    def _file_call(self, method: str, url: str, path: str, raw: Optional[bytes] = None) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """One files API request; a refusal raised as :class:`FileRefusedError`,
        a session that is gone as :class:`SessionClosedError`."""
        if self.closed:
            raise SessionClosedError("the session is closed: start another with RemoteSandbox.session()")
        if self._ended is not None:
            raise SessionClosedError(self._ended)
        try:
            return self.sandbox._call(method, url, None, timeout=self.sandbox.request_timeout, ok=(200,), raw=raw)
        except RemoteError as e:
            # A missing file names the field `path`; a missing session none.
            if e.status == 410 or (e.status == 404 and e.field != "path"):
                raise self._gone(e) from e
            if e.code in FILE_REFUSALS and e.status is not None and 400 <= e.status < 600:
                raise FileRefusedError(e.code, e.message, reason=e.reason, path=path) from e
            raise

    def _put_file(self, path: str, data: bytes) -> Dict[str, Any]:
        if len(data) > MAX_FILE:
            # Not sent: no door takes it.
            raise FileRefusedError(
                "too_large", f"{len(data)} bytes, over the {MAX_FILE >> 20} MiB a file may be here", path=path
            )
        url = self._file_url(path)
        return self._file_answer("PUT", url, path, MAX_ERROR_BYTES, raw=data)

    def _read_file(self, path: str) -> Tuple[bytes, str]:
        """The judged bytes of ``path`` and the sha256 of the file as the
        code wrote it (``x-jail-original-sha256`` for a neutralised copy)."""
        url = self._file_url(path)
        conn, resp = self._file_call("GET", url, path)
        try:
            sha256 = resp.getheader("x-jail-sha256")
            original = resp.getheader("x-jail-original-sha256")
            data = _read(resp, MAX_FILE, url, self.sandbox.request_timeout)
        finally:
            conn.close()
        if sha256 is None:
            raise SandboxProtocolError(f"GET {url}: the service sent no x-jail-sha256: refused")
        _check_sha256(path, data, sha256, ArtifactMismatchError)
        return data, original or sha256

    def _list_files(self, path: str) -> Dict[str, Any]:
        url = f"/v1/sessions/{self.id}/files"
        if path:
            url += "?" + urllib.parse.urlencode({"path": path})
        return self._file_answer("GET", url, path, MAX_REPLY_BYTES)

    def _file_answer(self, method: str, url: str, path: str, limit: int, raw: Optional[bytes] = None) -> Dict[str, Any]:
        """A files route's JSON object answer, read within ``limit`` bytes."""
        conn, resp = self._file_call(method, url, path, raw=raw)
        try:
            body = _read(resp, limit, url, self.sandbox.request_timeout)
        finally:
            conn.close()
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise SandboxProtocolError(f"{method} {url} answered with a body that is not a JSON object: {body[:200]!r}")
        return answer

    def close(self) -> Optional[Execution]:
        """Delete the session (``DELETE /v1/sessions/{id}``): its jail is
        stopped. Returns the closing result; safe to call twice.

        Raises:
            SessionClosedError: The service no longer had the session.
        """
        if self.closed:
            return self.closing
        self.closed = True
        try:
            reply = self.sandbox._json(
                "DELETE", f"/v1/sessions/{self.id}", None, timeout=self.sandbox.request_timeout + WAIT_SLACK, ok=(200,)
            )
        except RemoteError as e:
            if e.status == 404:
                raise self._gone(e) from e
            raise
        self.closing = self.sandbox._execution(reply.get("result"), None, self.id)
        return self.closing

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        except SandboxError:
            # An exception from the block wins.
            if exc[0] is None:
                raise


class _StreamDropped(Exception):
    """The event stream broke before its end (opened again by the caller)."""


def input_payload(folder: PathLike) -> Dict[str, Any]:
    """The request fields that send ``folder``'s files: ``{"files": {NAME:
    TEXT}}`` when it holds only UTF-8 text files and no folders (at most
    256), else ``{"input_tar": BASE64}``, a gzipped tar of its regular files
    and folders. Nothing inside is followed: a symbolic link, a fifo, a
    socket or a device in it is refused with an error naming it.

    Raises:
        SandboxError: The folder cannot be read, or holds something that is
            not a regular file or folder, or is over 256 MiB.
    """
    root = os.fspath(folder)
    entries = list(_walk(root))
    if not entries:
        return {}
    flat = len(entries) <= MAX_INPUT_FILES and all(data is not None and "/" not in rel for rel, _, data in entries)
    if flat:
        texts: Dict[str, str] = {}
        for rel, _, data in entries:
            assert data is not None
            try:
                texts[rel] = data.decode("utf-8")
            except UnicodeDecodeError:
                flat = False
                break
        if flat:
            return {"files": texts}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tar:
        for rel, st, data in entries:
            info = tarfile.TarInfo(rel)
            info.mtime = int(st.st_mtime)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.type = tarfile.REGTYPE
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return {"input_tar": base64.b64encode(buf.getvalue()).decode("ascii")}


def _walk(root: str) -> Iterator[Tuple[str, os.stat_result, Optional[bytes]]]:
    """``(relative path, stat, bytes)`` for each file under ``root`` and
    ``(relative path, stat, None)`` for each folder, parents first, sorted;
    every entry opened beneath its parent's descriptor without following a link."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxError(f"input folder {root}: {e.strerror}: give a folder you can read") from None
    total = [0]
    try:
        yield from _walk_fd(root, fd, "", total)
    finally:
        os.close(fd)


def _walk_fd(root: str, fd: int, prefix: str, total: List[int]) -> Iterator[Tuple[str, os.stat_result, Optional[bytes]]]:
    try:
        names = sorted(os.listdir(fd))
    except OSError as e:
        raise SandboxError(f"input folder {os.path.join(root, prefix)}: {e.strerror}: make it readable") from None
    for name in names:
        rel = prefix + name
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise SandboxError(f"input {os.path.join(root, rel)!r}: the name is not UTF-8: rename it") from None
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as e:
            raise SandboxError(f"input {os.path.join(root, rel)}: {e.strerror}") from None
        where = os.path.join(root, rel)
        if stat.S_ISLNK(st.st_mode):
            raise SandboxError(
                f"input {where} is a symbolic link: links are never followed nor sent; "
                "copy the file it points to in its place, or remove it"
            )
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                raise SandboxError(f"input folder {where}: {e.strerror}: make it readable") from None
            try:
                yield rel, st, None
                yield from _walk_fd(root, sub, rel + "/", total)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            data = _read_file(name, fd, where, st)
            total[0] += len(data)
            if total[0] > MAX_INPUT_BYTES:
                raise SandboxError(f"input folder {root} holds over {MAX_INPUT_BYTES} bytes: send less, or run locally with Sandbox(input=...)")
            yield rel, st, data
        else:
            raise SandboxError(
                f"input {where} is a {_kind(st.st_mode)}: only regular files and folders are sent; remove it"
            )


def _read_file(name: str, dir_fd: int, where: str, st: os.stat_result) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        raise SandboxError(f"input {where}: {e.strerror}: make it readable") from None
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(f.fileno())
        # Swapped for something else since it was looked at: refuse rather than guess.
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise SandboxError(f"input {where} changed while it was read: send it again once it stays put")
        data = f.read(MAX_INPUT_BYTES + 1)
    return data


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _mib(memory: Union[int, str, None]) -> Optional[int]:
    """Memory as whole MiB: an int is MiB, a string is bytes with an
    optional K, M, G or T (as ``jail --memory``)."""
    if memory is None:
        return None
    if isinstance(memory, bool):
        raise SandboxError(f"memory {memory!r}: give MiB as an int, or a size such as '256M'")
    if isinstance(memory, int):
        return memory
    m = re.fullmatch(r"\s*(\d+)\s*([KkMmGgTt]?)\s*", str(memory))
    if not m:
        raise SandboxError(f"memory {memory!r} is not a size: write bytes, or a number with K, M, G or T ('256M')")
    n = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]
    if n % (1 << 20):
        raise SandboxError(f"memory {memory!r}: the service takes whole MiB: write it as '256M' or an int of MiB")
    return n >> 20


def _id_of(reply: Dict[str, Any]) -> str:
    value = reply.get("id")
    if not isinstance(value, str) or not _ID.match(value):
        raise SandboxProtocolError(f"the service's reply has no usable id: {str(value)[:80]!r}")
    return value


def _read(resp: http.client.HTTPResponse, limit: int, path: str, within: float) -> bytes:
    """The body, at most ``limit`` bytes; more is refused. Bounded in time as
    well as per read: a body still coming after ``within`` seconds must have
    come at :data:`MIN_READ_RATE` bytes a second at least, so a service that
    drips a byte now and then cannot hold the caller for ever."""
    started = time.monotonic()
    chunks: List[bytes] = []
    got = 0
    while got <= limit:
        if time.monotonic() - started > within + got / MIN_READ_RATE:
            raise RemoteTimeoutError(
                f"{path}: the reply came slower than {MIN_READ_RATE >> 10} KiB/s ({got} bytes in "
                f"{time.monotonic() - started:.0f} s): the service is stuck or the network is too slow",
                status=None,
                path=path,
            )
        try:
            chunk = resp.read1(min(READ_CHUNK, limit + 1 - got))
        except socket.timeout:
            raise RemoteTimeoutError(
                f"{path}: the service stopped sending its reply: it is stuck or the network drops packets",
                status=None,
                path=path,
            ) from None
        except (OSError, http.client.HTTPException) as e:
            raise RemoteConnectionError(f"{path}: the reply broke off ({e or type(e).__name__})", status=None, path=path) from None
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > limit:
        raise SandboxProtocolError(f"{path}: the service's reply is over {limit} bytes: refused")
    return b"".join(chunks)


def _retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` as seconds: an integer, or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


# What each status means to the user and what to do; the service's message follows.
_HINTS = {
    400: "the service refused the request",
    401: "the token was refused (401): check JAIL_TOKEN, the token the service's operator gave you",
    403: "the token may not do this (403): ask the service's operator",
    404: "not found (404)",
    413: "the request is over this token's size limit (413): send less code or a smaller input folder",
    429: "the service is busy (429)",
    503: "the service is unavailable (503)",
}


def _error(method: str, path: str, resp: http.client.HTTPResponse, retried: int) -> RemoteError:
    """The :class:`RemoteError` of an error answer (its body read, bounded)."""
    try:
        raw = resp.read(MAX_ERROR_BYTES)
    except (OSError, http.client.HTTPException):
        raw = b""
    code = field_name = reason = None
    message = raw.decode("utf-8", "replace").strip()[:500]
    try:
        detail = json.loads(raw).get("error")
        if isinstance(detail, dict) and isinstance(detail.get("message"), str):
            message = detail["message"]
            code = detail.get("code") if isinstance(detail.get("code"), str) else None
            field_name = detail.get("field") if isinstance(detail.get("field"), str) else None
            reason = detail.get("reason") if isinstance(detail.get("reason"), str) else None
    except (ValueError, AttributeError):
        pass
    status = resp.status
    retry_after = _retry_after(resp.getheader("Retry-After"))
    hint = _HINTS.get(status) or (
        f"the service failed ({status})" if status >= 500 else f"unexpected HTTP {status} from {method} {path}"
    )
    if status == 400:
        hint = f"the service refused `{field_name}` (400)" if field_name else "the service refused the request (400)"
    if status in (429, 503) and retried:
        hint += f", still after {retried} retries"
    if status in (429, 503) and retry_after is not None:
        hint += f"; it asks to retry after {retry_after:.0f} s"
    text = f"{hint}: {message}" if message else hint
    return RemoteError(
        text,
        status=status,
        code=code,
        field=field_name,
        message=message,
        retry_after=retry_after,
        method=method,
        path=path,
        reason=reason,
    )


def _check_result_shape(result: Any) -> None:
    """Refuse a result whose fields this client reads have the wrong types
    (the service is trusted less than the local binary)."""
    if not isinstance(result, dict):
        raise SandboxProtocolError(f"the service's result is not a JSON object: {str(result)[:200]!r}")
    if result.get("schema_version") not in SCHEMA_VERSIONS:
        return  # _checked names the version.

    def bad(what: str) -> SandboxProtocolError:
        return SandboxProtocolError(f"the service's result has a bad `{what}`: refused")

    if not isinstance(result.get("status"), str):
        raise bad("status")
    if result.get("exit_code") is not None and not isinstance(result.get("exit_code"), int):
        raise bad("exit_code")
    for stream in ("stdout", "stderr"):
        s = result.get(stream)
        if s is not None and not (isinstance(s, dict) and isinstance(s.get("text", ""), str)):
            raise bad(stream)
    artifacts = result.get("artifacts") or []
    if not isinstance(artifacts, list):
        raise bad("artifacts")
    for a in artifacts:
        if not isinstance(a, dict) or not _safe_relative(a.get("path")):
            raise bad("artifacts[].path")
        sha = a.get("sha256")
        if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
            raise bad("artifacts[].sha256")
        size = a.get("bytes", 0)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise bad("artifacts[].bytes")


def _safe_relative(path: Any) -> bool:
    """A ``/``-separated relative path with no empty, ``.`` or ``..`` part and no control character."""
    if not isinstance(path, str) or not path or len(path) > 4096:
        return False
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
