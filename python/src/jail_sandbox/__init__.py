"""jail-sandbox: run untrusted, LLM-written Python in a fresh, unprivileged
Linux jail (the ``jail`` binary this wheel ships) and get the outcome as
Python objects::

    from jail_sandbox import Sandbox

    sandbox = Sandbox()
    execution = sandbox.run("print(6 * 7)", on_stdout=print)
    assert execution.stdout == "42\\n"

Each :meth:`Sandbox.run` is its own jail; state does not carry over between
runs. For stateful cells, :meth:`Sandbox.session` keeps one jail::

    with sandbox.session() as s:
        s.run("x = 41")
        assert s.run("print(x + 1)").stdout == "42\\n"
"""

from ._sandbox import (
    EXIT_SETUP_FAILED,
    Artifact,
    Execution,
    ExecutionError,
    JailNotFoundError,
    Sandbox,
    SandboxError,
    SandboxProtocolError,
    SandboxSetupError,
    Session,
    SessionClosedError,
    Usage,
    find_jail,
)

__all__ = [
    "EXIT_SETUP_FAILED",
    "Artifact",
    "Execution",
    "ExecutionError",
    "JailNotFoundError",
    "Sandbox",
    "SandboxError",
    "SandboxProtocolError",
    "SandboxSetupError",
    "Session",
    "SessionClosedError",
    "Usage",
    "find_jail",
]
