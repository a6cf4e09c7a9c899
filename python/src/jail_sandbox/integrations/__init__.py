"""Adapters from agent frameworks to :class:`~jail_sandbox.Sandbox`, each an
optional extra that installs its framework:

- ``jail_sandbox.integrations.smolagents`` (``pip install
  'jail-sandbox[smolagents]'``): :class:`JailExecutor`, a smolagents
  ``PythonExecutor`` whose code actions are cells of one jail session, so
  variables, imports and functions carry from one action to the next.
- ``jail_sandbox.integrations.langchain`` (``'jail-sandbox[langchain]'``):
  :func:`python_tool`, a LangChain tool for any chat model's
  ``bind_tools`` or a LangGraph ``ToolNode``.
- ``jail_sandbox.integrations.openai_agents``
  (``'jail-sandbox[openai-agents]'``): :func:`python_tool`, a
  ``FunctionTool`` for an OpenAI Agents SDK ``Agent(tools=[...])``.

Every tool answers with :func:`describe`'s JSON: the status, stdout, the
end of stderr, the exception and the artifacts (path, media type, summary),
which is what a model needs to go on. The code runs in the jail; nothing of
the host is reachable from it, and the framework's own process never runs it.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, Optional

from .._sandbox import Execution, Sandbox, SandboxSetupError, Session

#: Characters of stdout and of stderr a tool's answer keeps (their ends).
MAX_TEXT = 8000


def describe(execution: Execution) -> str:
    """The JSON a tool answers a model with for one run or cell."""

    def tail(text: str) -> str:
        return text if len(text) <= MAX_TEXT else "[...]\n" + text[-MAX_TEXT:]

    doc: Dict[str, Any] = {
        "status": execution.status,
        "stdout": tail(execution.stdout),
        "stderr": tail(execution.stderr),
        "error": None if execution.error is None else f"{execution.error.type}: {execution.error.message}",
        "artifacts": [{"path": a.path, "media_type": a.media_type, "summary": a.summary} for a in execution.artifacts],
    }
    return json.dumps(doc)


def describe_setup_error(e: SandboxSetupError) -> str:
    """The JSON a tool answers with when the jail could not be set up."""
    return json.dumps({"status": "setup_failed", "stage": e.stage, "error": e.message})


class Runner:
    """What a tool calls: one sandbox, and for a stateful tool one session
    that every call is the next cell of (started at the first call, again
    after it ended). Never raises for what the jail did: every outcome is
    :func:`describe`'s JSON for the model."""

    def __init__(self, sandbox: Optional[Sandbox], stateful: bool) -> None:
        self.sandbox = sandbox or Sandbox(timeout=30)
        self.stateful = stateful
        self.session: Optional[Session] = None
        self.lock = threading.Lock()

    def __call__(self, code: str) -> str:
        try:
            if not self.stateful:
                return describe(self.sandbox.run(code))
            with self.lock:
                if self.session is None or self.session.handle is None:
                    self.session = self.sandbox.session()
                return describe(self.session.run(code))
        except SandboxSetupError as e:
            return describe_setup_error(e)

    def function(self) -> Any:
        """``run_python(code: str) -> str``, the plain function a framework
        turns into a tool (its schema read from the signature)."""

        def run_python(code: str) -> str:
            return self(code)

        return run_python

    def close(self) -> None:
        """End a stateful tool's session."""
        with self.lock:
            if self.session is not None:
                self.session.close()
                self.session = None


#: What a model is told a code tool does.
DESCRIPTION = (
    "Run Python code in an isolated sandbox: no network, a read-only system, input files "
    "under /workspace/input, and files written to the working directory (/workspace/output) "
    "come back as artifacts. numpy, pandas and matplotlib are there when the data rootfs is. "
    "Returns JSON with status, stdout, stderr, error and artifacts."
)
