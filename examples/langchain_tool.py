"""A LangChain tool that runs the model's Python in a jail
(jail_sandbox.integrations.langchain).

Bind it to any chat model (`model.bind_tools([tool])`) or a LangGraph
`ToolNode([tool])`; here it is invoked directly, as a ToolNode would, so the
example runs without an LLM:

    pip install 'jail-sandbox[langchain]'
    python examples/langchain_tool.py

`make test-python` runs this file.
"""

import json

from jail_sandbox import Sandbox
from jail_sandbox.integrations.langchain import python_tool

tool = python_tool(Sandbox(timeout=20), stateful=True)
try:
    # The calls a model would make, as LangChain passes them to the tool.
    first = json.loads(tool.invoke({"code": "rows = [(n, n * n) for n in range(1, 6)]"}))
    assert first["status"] == "ok", first
    reply = tool.invoke(
        {"code": "open('squares.csv', 'w').write('n,sq\\n' + ''.join(f'{a},{b}\\n' for a, b in rows))\nprint(sum(b for _, b in rows))"}
    )
    print(reply)
    out = json.loads(reply)
    assert out["status"] == "ok" and out["stdout"] == "55\n", out
    failed = json.loads(tool.invoke({"code": "undefined_name"}))
    assert failed["error"].startswith("NameError"), failed
finally:
    tool.close()
