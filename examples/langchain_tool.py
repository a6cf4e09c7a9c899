"""A LangChain tool that runs the model's Python in a fresh jail.

Bind `run_python` to any chat model (`model.bind_tools([run_python])`, or a
LangGraph `ToolNode([run_python])`); here it is invoked directly, as a
ToolNode would, so the example runs without an LLM:

    python examples/langchain_tool.py

Needs the jail-sandbox wheel and langchain-core (pinned in
python/requirements-test.txt); `make test-python` runs this file.
"""

import json

from langchain_core.tools import tool

from jail_sandbox import Sandbox, SandboxSetupError

SANDBOX = Sandbox(timeout=20)


@tool
def run_python(code: str) -> str:
    """Run Python code in an isolated sandbox (no network, read-only system,
    files written to the working directory come back as artifacts) and
    return its output, error and artifacts as JSON."""
    try:
        ex = SANDBOX.run(code)
    except SandboxSetupError as e:
        return json.dumps({"status": "setup_failed", "stage": e.stage, "message": e.message})
    return json.dumps(
        {
            "status": ex.status,
            "stdout": ex.stdout,
            "stderr": ex.stderr[-2000:],
            "error": None if ex.error is None else f"{ex.error.type}: {ex.error.message}",
            "artifacts": [{"path": a.path, "media_type": a.media_type, "summary": a.summary} for a in ex.artifacts],
        }
    )


if __name__ == "__main__":
    # The call a model would make, as LangChain passes it to the tool.
    reply = run_python.invoke(
        {"code": "rows = [(n, n * n) for n in range(1, 6)]\nopen('squares.csv', 'w').write('n,sq\\n' + ''.join(f'{a},{b}\\n' for a, b in rows))\nprint(sum(b for _, b in rows))"}
    )
    print(reply)
    out = json.loads(reply)
    assert out["status"] == "ok" and out["stdout"] == "55\n", out
    assert out["artifacts"][0]["path"] == "squares.csv", out
