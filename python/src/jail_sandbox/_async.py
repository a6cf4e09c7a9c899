"""The same clients as coroutines: :class:`AsyncSandbox` and
:class:`AsyncRemoteSandbox` (E2B's ``AsyncSandbox``), each call the
synchronous client's own, run on a worker thread
(:func:`asyncio.to_thread`), so the event loop never blocks on a jail and
there is no second copy of the protocol to drift::

    async with AsyncSandbox(envs={"REGION": "eu"}) as sandbox:
        execution = await sandbox.run_code("print(6 * 7)")
        async with await sandbox.session() as s:
            await s.run_code("x = 41")
            print((await s.run_code("print(x + 1)")).stdout)

Callbacks (``on_stdout``, ``on_stderr``, ``on_artifact``) are called on
that worker thread, as the synchronous client calls them; use
``loop.call_soon_threadsafe`` to reach the loop from them. A task that is
cancelled stops waiting at once; the jail's run or cell still ends within
its own time limit, and a session is closed by its ``async with``.
"""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional, Union

from ._remote import RemoteSandbox, RemoteSession
from ._sandbox import Execution, FileEntry, FileInfo, Files, Sandbox, Session


class AsyncFiles:
    """A session's :class:`~jail_sandbox.Files` whose calls are coroutines
    (``AsyncSession.files``): the same ``write``, ``read`` and ``list``, the
    same exceptions."""

    def __init__(self, files: Files) -> None:
        #: The synchronous files every call goes through.
        self.files = files

    async def write(self, path: str, data: Union[bytes, bytearray, memoryview, str]) -> FileInfo:
        """As :meth:`Files.write`."""
        return await asyncio.to_thread(self.files.write, path, data)

    async def read(self, path: str) -> bytes:
        """As :meth:`Files.read`."""
        return await asyncio.to_thread(self.files.read, path)

    async def list(self, path: str = "") -> List[FileEntry]:
        """As :meth:`Files.list`."""
        return await asyncio.to_thread(self.files.list, path)


class AsyncSession:
    """A :class:`~jail_sandbox.Session` (or a
    :class:`~jail_sandbox.RemoteSession`) whose calls are coroutines. Made by
    ``await AsyncSandbox.session()``; ``async with`` closes it however the
    block ends."""

    def __init__(self, session: Union[Session, RemoteSession]) -> None:
        #: The synchronous session every call goes through.
        self.session = session

    async def run(self, code: str, **kwargs: Any) -> Execution:
        """The next cell, as :meth:`Session.run` (the same arguments, ``envs=`` included)."""
        return await asyncio.to_thread(self.session.run, code, **kwargs)

    run_code = run

    @property
    def files(self) -> AsyncFiles:
        """The session's ``/workspace/output`` while it lives, as
        :attr:`Session.files` with coroutines (:class:`AsyncFiles`)."""
        return AsyncFiles(self.session.files)

    async def close(self) -> Optional[Execution]:
        """End the session, as :meth:`Session.close`: its closing result."""
        return await asyncio.to_thread(self.session.close)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.session.__exit__, *exc)


class AsyncSandbox:
    """:class:`~jail_sandbox.Sandbox` with coroutines: ``AsyncSandbox(**kwargs)``
    takes exactly :class:`~jail_sandbox.Sandbox`'s arguments (``envs=``,
    ``pool=``, ``timeout=``, ...), or wraps one given as ``sandbox=``."""

    def __init__(self, sandbox: Optional[Sandbox] = None, **kwargs: Any) -> None:
        if sandbox is not None and kwargs:
            raise TypeError("give either sandbox= or Sandbox's arguments, not both")
        #: The synchronous sandbox every call goes through.
        self.sandbox: Any = sandbox if sandbox is not None else Sandbox(**kwargs)

    async def run(self, code: str, **kwargs: Any) -> Execution:
        """A fresh jail for ``code``, as :meth:`Sandbox.run` (the same arguments)."""
        return await asyncio.to_thread(self.sandbox.run, code, **kwargs)

    run_code = run

    async def session(self, **kwargs: Any) -> AsyncSession:
        """A session, as :meth:`Sandbox.session` (``timeout=``, ``envs=``)."""
        return AsyncSession(await asyncio.to_thread(self.sandbox.session, **kwargs))

    async def close(self) -> None:
        """End the sandbox's warm pool, as :meth:`Sandbox.close`."""
        await asyncio.to_thread(self.sandbox.close)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncRemoteSandbox(AsyncSandbox):
    """:class:`~jail_sandbox.RemoteSandbox` with coroutines: the same
    arguments (``url``, ``token``, ``envs=``, ...), or one given as
    ``sandbox=``."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        sandbox: Optional[RemoteSandbox] = None,
        **kwargs: Any,
    ) -> None:
        if sandbox is not None and (url is not None or token is not None or kwargs):
            raise TypeError("give either sandbox= or RemoteSandbox's arguments, not both")
        super().__init__(sandbox if sandbox is not None else RemoteSandbox(url, token, **kwargs))  # type: ignore[arg-type]

    async def close(self) -> None:
        """Nothing to end: every call of a remote sandbox opens its own connection."""
        return None
