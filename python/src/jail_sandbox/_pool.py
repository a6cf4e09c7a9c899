"""A ``jail pool`` child: jails made ahead, each with the policy's preload
(numpy, pandas, matplotlib with the data policy) imported before any
untrusted code exists in it, each serving one step and then destroyed.

This speaks the pool's JSON-lines protocol as the project README ("Warm
pool") and ``jail/src/client/pool.rs`` define it; nothing of its own: a
request line ``{"id", "code", "input", "args", "limits": {"wall_time_secs"},
"events": true}``, then ``{"id", "event"}`` lines while the step runs and one
``{"id", "result"}`` or ``{"id", "error": {"code", "message"}}`` reply;
``{"op": "cancel", "id"}`` stops a step. Requests are pipelined (one
reader thread hands each line to the request with its id), so one pool
serves every thread of the caller.

The pool lives as long as its stdin is open: :meth:`Pool.close` (or this
process's exit, by any means) closes it, and the pool destroys its jails
and exits.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional

#: Most bytes of one line from the pool: a result is bounded by the
#: policy's stream caps (1 MiB each by default) plus its JSON.
_MAX_LINE = 64 << 20
#: Most bytes of the pool's stderr kept, for an error message.
_MAX_STDERR = 64 << 10
#: How long a closed pool gets to destroy its jails before it is killed.
_CLOSE_GRACE = 30.0
#: How long past a step's own limit its reply may take (the pool kills the
#: step at its limit; this covers making a jail on a loaded machine).
REPLY_GRACE = 60.0


class PoolError(Exception):
    """The pool answered a request with an error, or is gone.

    Attributes:
        code: The protocol's error code (``limit_above_policy``,
            ``internal``, ``draining``, ...), or ``pool_gone``.
    """

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{message} ({code})")


_GONE = object()


class Pool:
    """One ``jail pool --size N`` child and the requests in flight to it."""

    def __init__(self, cmd: List[str], env: Optional[Dict[str, str]]) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self._ids = itertools.count(1)
        self._write = threading.Lock()
        self._waiting: Dict[str, "queue.Queue[Any]"] = {}
        self._waiting_lock = threading.Lock()
        self._stderr = bytearray()
        self._gone = False
        threading.Thread(target=self._read, name="jail-pool-reader", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="jail-pool-stderr", daemon=True).start()

    # ---------------------------------------------------------------- reading
    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            while True:
                line = out.readline(_MAX_LINE)
                if not line:
                    break
                if not line.endswith(b"\n"):
                    # Over the cap: the pool is not speaking the protocol.
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict):
                    continue
                with self._waiting_lock:
                    q = self._waiting.get(msg.get("id"))  # type: ignore[arg-type]
                if q is not None:
                    q.put(msg)
        finally:
            with self._waiting_lock:
                self._gone = True
                waiting = list(self._waiting.values())
            for q in waiting:
                q.put(_GONE)

    def _read_stderr(self) -> None:
        err = self.proc.stderr
        assert err is not None
        for chunk in iter(lambda: os.read(err.fileno(), 8192), b""):
            if len(self._stderr) < _MAX_STDERR:
                self._stderr.extend(chunk[: _MAX_STDERR - len(self._stderr)])

    def said(self) -> str:
        """What the pool wrote on stderr so far (its start errors say why)."""
        return self._stderr.decode("utf-8", "replace").strip()

    @property
    def alive(self) -> bool:
        return not self._gone and self.proc.poll() is None

    # ---------------------------------------------------------------- writing
    def _send(self, line: Dict[str, Any]) -> None:
        data = (json.dumps(line) + "\n").encode("utf-8")
        with self._write:
            stdin = self.proc.stdin
            if stdin is None or stdin.closed:
                raise PoolError("pool_gone", "the pool was closed")
            try:
                stdin.write(data)
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as e:
                raise PoolError("pool_gone", f"the pool is gone ({e}): {self.said()[-400:]}") from None

    def run(
        self,
        request: Dict[str, Any],
        wait: float,
        on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> Dict[str, Any]:
        """Send one step (``request`` without its ``id``) and wait up to
        ``wait`` seconds for its result document (for ``"op": "session"``,
        the session's handle, id, pid and output folder). Events go to
        ``on_event`` as they come. A callback that raises, or Ctrl-C,
        cancels the step (its reply is waited for) and the exception goes on.

        Raises:
            PoolError: The pool refused the step, or is gone.
        """
        rid = f"py{next(self._ids)}"
        q: "queue.Queue[Any]" = queue.Queue()
        with self._waiting_lock:
            if self._gone:
                raise PoolError("pool_gone", f"the pool is gone: {self.said()[-400:]}")
            self._waiting[rid] = q
        try:
            line = dict(request, id=rid)
            if on_event is not None:
                line["events"] = True
            self._send(line)
            deadline = time.monotonic() + wait
            try:
                return self._reply(q, deadline, on_event)
            except BaseException:
                # Stop the step in its jail, and take its one reply, so
                # nothing of it goes on running for no one.
                if self.alive:
                    try:
                        self._send({"op": "cancel", "id": rid})
                        self._reply(q, time.monotonic() + _CLOSE_GRACE, None)
                    except BaseException:
                        pass
                raise
        finally:
            with self._waiting_lock:
                self._waiting.pop(rid, None)

    def _reply(
        self, q: "queue.Queue[Any]", deadline: float, on_event: Optional[Callable[[Dict[str, Any]], None]]
    ) -> Dict[str, Any]:
        while True:
            try:
                msg = q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise PoolError("timeout", "the pool did not answer in time; it was stopped") from None
            if msg is _GONE:
                raise PoolError("pool_gone", f"the pool ended: {self.said()[-400:]}")
            if "event" in msg:
                if on_event is not None and isinstance(msg["event"], dict):
                    on_event(msg["event"])
                continue
            if "result" in msg:
                return msg["result"]
            if "session" in msg:
                return msg["session"]
            err = msg.get("error") or {}
            raise PoolError(str(err.get("code", "internal")), str(err.get("message", msg)))

    # ---------------------------------------------------------------- ending
    def close(self) -> None:
        """End of stdin: the pool answers what is in flight, destroys every
        jail and exits; killed if it has not within 30 s."""
        with self._write:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=_CLOSE_GRACE)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL by pid: its jails end with their lifeline, its janitor
        removes its folders."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
