"""A LangChain tool that runs the model's Python in a jail (``pip install
'jail-sandbox[langchain]'``).

Bind it to any chat model (``model.bind_tools([tool])``) or put it in a
LangGraph ``ToolNode([tool])``; the model calls it with ``{"code": ...}``
and gets :func:`~jail_sandbox.integrations.describe`'s JSON back::

    from jail_sandbox import Sandbox
    from jail_sandbox.integrations.langchain import python_tool

    tool = python_tool(Sandbox(input="data/", timeout=30), stateful=True)
    tool.invoke({"code": "import pandas as pd; df = pd.read_csv('/workspace/input/sales.csv')"})
    tool.invoke({"code": "print(df.shape)"})   # stateful: df is still there

With ``stateful=True`` every call is a cell of one session (names, imports
and files stay; close it with ``tool.close()`` or let it end with its
idle timeout), else each call is a fresh jail. A call the jail could not
even set up answers ``{"status": "setup_failed", ...}`` rather than
raising, so the model can read why.
"""

from __future__ import annotations

from typing import Any, Optional

from langchain_core.tools import StructuredTool

from .. import Sandbox
from . import DESCRIPTION, Runner


def python_tool(
    sandbox: Optional[Sandbox] = None,
    *,
    stateful: bool = False,
    name: str = "run_python",
    description: str = DESCRIPTION,
) -> Any:
    """A LangChain ``StructuredTool`` taking ``code`` (a string of Python).

    Args:
        sandbox: The jails' recipe (default: ``Sandbox(timeout=30)``).
        stateful: Run every call as a cell of one session.
        name: The tool's name, as the model sees it.
        description: What the model is told the tool does.

    Returns:
        The tool; ``tool.close()`` ends a stateful tool's session.
    """
    runner = Runner(sandbox, stateful)
    tool = StructuredTool.from_function(func=runner.function(), name=name, description=description)
    # pydantic model: set through object.__setattr__ so the field check is skipped.
    object.__setattr__(tool, "close", runner.close)
    return tool
