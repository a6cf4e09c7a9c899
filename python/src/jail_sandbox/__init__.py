"""jail-sandbox: run untrusted, LLM-written Python in a fresh, unprivileged
Linux jail (the ``jail`` binary this wheel ships) and get the outcome as
Python objects::

    from jail_sandbox import Sandbox

    sandbox = Sandbox()
    execution = sandbox.run("print(6 * 7)", on_stdout=print)
    assert execution.stdout == "42\\n"

Runs use the data rootfs (numpy, pandas, matplotlib, ...; ``jail rootfs
build data``, no root needed) where one is built, else the minimal one
(``rootfs_name=`` names one). Each :meth:`Sandbox.run` is its own jail;
state does not carry over between runs. From a sandbox's second run on,
runs go to a warm pool of jails made ahead (``pool=N``; ``pool=0`` for
none), with the data stack imported before any run. For stateful cells,
:meth:`Sandbox.session` keeps one jail::

    with sandbox.session() as s:
        s.run("x = 41")
        assert s.run("print(x + 1)").stdout == "42\\n"

:class:`RemoteSandbox` has the same API over HTTP, against a ``jail serve``
service (``RemoteSandbox(url, token)``, else ``$JAIL_URL`` and
``$JAIL_TOKEN``); its artifacts are fetched on demand and checked against
the result's sha256 and size, and a refused request is a :class:`RemoteError`
carrying the HTTP status, the service's error code, field and message::

    remote = RemoteSandbox("http://127.0.0.1:8080", token)
    execution = remote.run("open('out.txt', 'w').write('hi')")
    assert execution.artifacts[0].read_bytes() == b"hi"

:class:`AsyncSandbox` and :class:`AsyncRemoteSandbox` give the same calls as
coroutines (each runs the synchronous client's own on a worker thread)::

    async with AsyncSandbox() as sandbox:
        execution = await sandbox.run_code("print(1)", envs={"REGION": "eu"})

A session's ``/workspace/output`` is reachable while it lives, E2B's way
(:class:`Files`; a refusal is a :class:`FileRefusedError`)::

    with sandbox.session() as s:
        s.files.write("prices.csv", "item,price\\npen,2\\n")
        s.run("import csv; n = len(list(csv.reader(open('prices.csv'))))")
        data = s.files.read("prices.csv")

Agent frameworks plug in through :mod:`jail_sandbox.integrations`
(smolagents, LangChain/LangGraph, the OpenAI Agents SDK).
"""

from ._async import AsyncFiles, AsyncRemoteSandbox, AsyncSandbox, AsyncSession
from ._remote import (
    ArtifactMismatchError,
    RemoteArtifact,
    RemoteConnectionError,
    RemoteError,
    RemoteSandbox,
    RemoteSession,
    RemoteTimeoutError,
)
from ._sandbox import (
    EXIT_SETUP_FAILED,
    Artifact,
    ArtifactChangedError,
    Execution,
    ExecutionError,
    FileEntry,
    FileInfo,
    FileRefusedError,
    Files,
    JailNotFoundError,
    Result,
    Sandbox,
    SandboxError,
    SandboxProtocolError,
    SandboxSetupError,
    Session,
    SessionArtifact,
    SessionClosedError,
    Usage,
    find_jail,
)

__all__ = [
    "EXIT_SETUP_FAILED",
    "Artifact",
    "ArtifactChangedError",
    "ArtifactMismatchError",
    "AsyncFiles",
    "AsyncRemoteSandbox",
    "AsyncSandbox",
    "AsyncSession",
    "Execution",
    "ExecutionError",
    "FileEntry",
    "FileInfo",
    "FileRefusedError",
    "Files",
    "JailNotFoundError",
    "RemoteArtifact",
    "RemoteConnectionError",
    "RemoteError",
    "RemoteSandbox",
    "RemoteSession",
    "RemoteTimeoutError",
    "Result",
    "Sandbox",
    "SandboxError",
    "SandboxProtocolError",
    "SandboxSetupError",
    "Session",
    "SessionArtifact",
    "SessionClosedError",
    "Usage",
    "find_jail",
]
