"""An OpenAI Agents SDK tool that runs the model's Python in a jail
(jail_sandbox.integrations.openai_agents).

Give it to an agent as `Agent(name=..., tools=[python_tool(...)])`; here the
tool is invoked directly, as the SDK's runner invokes it for a model's tool
call, so the example runs without an LLM:

    pip install 'jail-sandbox[openai-agents]'
    python examples/openai_agents_tool.py

`make test-python` runs this file.
"""

import asyncio
import json

from agents.tool_context import ToolContext

from jail_sandbox import Sandbox
from jail_sandbox.integrations.openai_agents import python_tool

tool = python_tool(Sandbox(timeout=20), stateful=True)


async def call(code: str) -> dict:
    args = json.dumps({"code": code})
    ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="call_1", tool_arguments=args)
    return json.loads(await tool.on_invoke_tool(ctx, args))


async def main() -> None:
    print(tool.name, json.dumps(tool.params_json_schema))
    assert tool.params_json_schema["required"] == ["code"]
    first = await call("import statistics\nsamples = [2.5, 3.5, 9.0]")
    assert first["status"] == "ok", first
    out = await call("print(statistics.mean(samples))")
    print(out)
    assert out["status"] == "ok" and out["stdout"] == "5.0\n", out


try:
    asyncio.run(main())
finally:
    tool.close()
