"""A smolagents executor whose code actions run in a jail, as cells of one
session (``pip install 'jail-sandbox[smolagents]'``)::

    from smolagents import CodeAgent
    from jail_sandbox import Sandbox
    from jail_sandbox.integrations.smolagents import JailExecutor

    agent = CodeAgent(tools=[], model=model, executor=JailExecutor(Sandbox(input="data/")))

Each action is the next cell of one ``jail session``: variables, imports and
functions an action defines are there for the next, as in smolagents' local
executor, but the code runs in the jail (no network, a read-only system, the
policy's limits), never in the agent's process. ``final_answer(value)``
ends an action with that answer (the value crosses as JSON, else its
``repr``); the value of an action's last expression is its ``output``. An
action that raises, times out or is killed raises :class:`JailExecutionError`
with its logs, which smolagents hands back to the model. Variables from
``send_variables`` are pickled into the session. Tools other than
``final_answer`` would run on the host, so they are refused. The session
ends with ``cleanup()`` (the agent's ``with`` block or ``agent.cleanup()``),
else at its idle timeout; an action after its end starts a new one.
"""

from __future__ import annotations

import base64
import json
import pickle
from typing import Any, Dict, Optional

from smolagents.local_python_executor import CodeOutput, PythonExecutor
from smolagents.tools import Tool

from .. import Execution, Sandbox, Session

# Lines the session prints for the host: an action's final answer and the
# value of its last expression, each a JSON document after the mark.
_FINAL = "\x00jail-final-answer\x00"
_VALUE = "\x00jail-last-value\x00"

# The first cell of every session: what each action runs through.
_PRELUDE = f"""
import ast as _ast, base64 as _b64, json as _json, pickle as _pickle, sys as _sys

class _JailFinalAnswer(BaseException):
    pass

def final_answer(answer):
    print({_FINAL!r} + _json.dumps(answer, default=repr), flush=True)
    raise _JailFinalAnswer()

def _jail_action(source):
    tree = _ast.parse(source, "<action>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
    scope = globals()  # the session's namespace, which every cell shares
    try:
        exec(compile(tree, "<action>", "exec"), scope)
        if last is not None:
            value = eval(compile(_ast.Expression(last.value), "<action>", "eval"), scope)
            if value is not None:
                print({_VALUE!r} + _json.dumps(value, default=repr), flush=True)
    except _JailFinalAnswer:
        pass

def _jail_variables(data):
    globals().update(_pickle.loads(_b64.b64decode(data)))
"""


class JailExecutionError(RuntimeError):
    """The action raised, timed out or was killed; the message has its logs."""


class JailExecutor(PythonExecutor):
    """smolagents' ``PythonExecutor`` over a :class:`~jail_sandbox.Session`.

    Args:
        sandbox: The jail's recipe (default: ``Sandbox(timeout=30)``, the
            data rootfs where it is built); its ``timeout`` is each action's.
    """

    def __init__(self, sandbox: Optional[Sandbox] = None) -> None:
        self.sandbox = sandbox or Sandbox(timeout=30)
        self.session: Optional[Session] = None
        self._variables: Dict[str, Any] = {}

    def _live(self) -> Session:
        if self.session is None or self.session.handle is None:
            self.session = self.sandbox.session()
            self._cell(_PRELUDE, "the executor's prelude")
            if self._variables:
                self._send(self._variables)
        return self.session

    def _cell(self, code: str, what: str) -> Execution:
        assert self.session is not None
        ex = self.session.run(code)
        if what and ex.status != "ok":
            detail = f"{ex.error.type}: {ex.error.message}" if ex.error else ex.status
            raise JailExecutionError(f"{what} failed in the jail: {detail}\n{ex.stderr[-2000:]}")
        return ex

    def _send(self, variables: Dict[str, Any]) -> None:
        data = base64.b64encode(pickle.dumps(variables, protocol=4)).decode()
        self._cell(f"_jail_variables({data!r})", "sending variables")

    def send_tools(self, tools: Dict[str, Tool]) -> None:
        """Accept ``final_answer`` (defined in the jail); refuse any other tool,
        which would need the host."""
        unsupported = sorted(set(tools) - {"final_answer"})
        if unsupported:
            raise ValueError(f"JailExecutor runs no host tools inside the jail: {unsupported}")

    def send_variables(self, variables: Dict[str, Any]) -> None:
        """Make ``variables`` global names of the session (pickled across)."""
        self._variables.update(variables)
        if self.session is not None and self.session.handle is not None:
            self._send(variables)

    def __call__(self, code_action: str) -> CodeOutput:
        """Run one action as the session's next cell.

        Raises:
            JailExecutionError: The action raised, timed out or was killed.
        """
        self._live()
        ex = self._cell(f"_jail_action({code_action!r})", "")
        logs, final, value = [], None, None
        for line in ex.stdout.splitlines(keepends=True):
            if line.startswith(_FINAL):
                final = line[len(_FINAL):]
            elif line.startswith(_VALUE):
                value = line[len(_VALUE):]
            else:
                logs.append(line)
        text = "".join(logs)
        if final is not None:
            return CodeOutput(output=json.loads(final), logs=text, is_final_answer=True)
        if ex.status != "ok":
            detail = f"{ex.error.type}: {ex.error.message}" if ex.error else ex.status
            raise JailExecutionError(f"{detail}\n{text}{ex.stderr[-2000:]}")
        return CodeOutput(output=None if value is None else json.loads(value), logs=text, is_final_answer=False)

    def cleanup(self) -> None:
        """End the session (smolagents calls it when the agent is done)."""
        if self.session is not None:
            self.session.close()
            self.session = None
