"""A tool for the OpenAI Agents SDK that runs the model's Python in a jail
(``pip install 'jail-sandbox[openai-agents]'``)::

    from agents import Agent, Runner
    from jail_sandbox import Sandbox
    from jail_sandbox.integrations.openai_agents import python_tool

    analyst = Agent(name="analyst", tools=[python_tool(Sandbox(input="data/"), stateful=True)])

The tool is a ``FunctionTool`` named ``run_python`` taking ``{"code": ...}``;
it answers with :func:`~jail_sandbox.integrations.describe`'s JSON. With
``stateful=True`` every call is a cell of one session (close it with
``tool.close()``), else each call is a fresh jail. The code runs in the jail,
never in the agent's process; the SDK runs the (blocking) call as it runs
any synchronous tool.
"""

from __future__ import annotations

from typing import Any, Optional

from agents import function_tool

from .. import Sandbox
from . import DESCRIPTION, Runner


def python_tool(sandbox: Optional[Sandbox] = None, *, stateful: bool = False, **naming: str) -> Any:
    """An Agents SDK ``FunctionTool`` taking ``code`` (a string of Python):
    the arguments (``sandbox``, ``stateful``, ``name``, ``description``)
    and the answers are :func:`jail_sandbox.integrations.langchain.python_tool`'s;
    ``tool.close()`` ends a stateful tool's session."""
    runner = Runner(sandbox, stateful)
    tool = function_tool(
        runner.function(),
        name_override=naming.get("name", "run_python"),
        description_override=naming.get("description", DESCRIPTION),
    )
    tool.close = runner.close  # type: ignore[attr-defined]
    return tool
