"""jail-sandbox: run untrusted, LLM-written Python in a fresh, unprivileged
Linux jail (the ``jail`` binary this wheel ships) and get the outcome as
Python objects::

    from jail_sandbox import Sandbox

    sandbox = Sandbox()
    execution = sandbox.run("print(6 * 7)", on_stdout=print)
    assert execution.stdout == "42\\n"

Each :meth:`Sandbox.run` is its own jail; state does not carry over between
runs (stateful sessions wait on the jail's sessions, issue 18).
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
    "Usage",
    "find_jail",
]
