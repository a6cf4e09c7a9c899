"""A smolagents executor that runs every code action in a fresh jail.

Give it to a CodeAgent as `CodeAgent(tools=[], model=..., executor=JailExecutor())`;
here the executor is called with code directly, as the agent calls it, so
the example runs without an LLM:

    python examples/smolagents_executor.py

Each action is its own jail: variables do not carry over between actions
(stateful sessions wait for the jail's sessions, issue 18); variables sent
with `send_variables` are prepended to every action. Needs the jail-sandbox
wheel and smolagents (pinned in python/requirements-test.txt);
`make test-python` runs this file.
"""

import json
from typing import Any

from smolagents.local_python_executor import CodeOutput, PythonExecutor
from smolagents.tools import Tool

from jail_sandbox import Sandbox

# The last line of stdout when the action called final_answer(value).
_MARK = "\x00jail-final-answer\x00"

_PRELUDE = f"""
import json as _json, sys as _sys
def final_answer(answer):
    print({_MARK!r} + _json.dumps(answer, default=str))
    _sys.exit(0)
"""


class JailExecutionError(RuntimeError):
    """The action raised, timed out or was killed; the message has its logs."""


class JailExecutor(PythonExecutor):
    """smolagents' PythonExecutor interface over jail_sandbox.Sandbox."""

    def __init__(self, sandbox: Sandbox | None = None) -> None:
        self.sandbox = sandbox or Sandbox(timeout=30)
        self.variables: dict[str, Any] = {}

    def send_tools(self, tools: dict[str, Tool]) -> None:
        # Only final_answer runs inside (the prelude defines it): other tools
        # would need the host, which the jail does not reach.
        unsupported = sorted(set(tools) - {"final_answer"})
        if unsupported:
            raise ValueError(f"JailExecutor runs no host tools inside the jail: {unsupported}")

    def send_variables(self, variables: dict[str, Any]) -> None:
        self.variables.update(variables)

    def __call__(self, code_action: str) -> CodeOutput:
        setup = f"globals().update(_json.loads({json.dumps(json.dumps(self.variables))}))\n"
        ex = self.sandbox.run(_PRELUDE + setup + code_action)
        logs, _, last = ex.stdout.rstrip("\n").rpartition("\n")
        if not last.startswith(_MARK):
            logs, last = ex.stdout, ""
        if ex.status != "ok" and not last:
            detail = f"{ex.error.type}: {ex.error.message}" if ex.error else ex.status
            raise JailExecutionError(f"{detail}\n{ex.stdout}{ex.stderr[-2000:]}")
        if last:
            return CodeOutput(output=json.loads(last[len(_MARK):]), logs=logs, is_final_answer=True)
        return CodeOutput(output=None, logs=logs, is_final_answer=False)


if __name__ == "__main__":
    executor = JailExecutor()
    executor.send_tools({})
    executor.send_variables({"prices": [3.5, 4.25, 10.0]})
    step = executor("total = sum(prices)\nprint('adding', len(prices), 'prices')")
    print(step)
    assert (step.logs, step.is_final_answer) == ("adding 3 prices\n", False), step
    done = executor("final_answer({'total': sum(prices)})")
    print(done)
    assert done.is_final_answer and done.output == {"total": 17.75}, done
    try:
        executor("1 / 0")
    except JailExecutionError as e:
        print("raised:", str(e).splitlines()[0])
        assert str(e).startswith("ZeroDivisionError")
    else:
        raise AssertionError("an error in the action must raise")
