"""What users copy: README.md's "From Python" snippets (the local one and
the RemoteSandbox one, against the suite's `jail-serve`), run exactly as
written, and the integration examples in examples/, run as scripts against
the real frameworks from PyPI (python/requirements-test.txt), no LLM: each
drives the tool or executor object as its framework would."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO, TOKEN


def readme_snippet(remote: bool) -> str:
    """The From Python section's local snippet, or its RemoteSandbox one."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the From Python section has two python blocks: local and remote"
    [block] = [b for b in blocks if ("RemoteSandbox(" in b) == remote]
    return block


def run_python(args, rootfs, cwd, **env_vars):
    # The rootfs comes the way a user's does: the binary's own lookup
    # ($JAIL_ROOTFS here), never from the snippet.
    env = dict(os.environ, JAIL_ROOTFS=str(rootfs), **env_vars)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_readme_snippet_runs_as_written(rootfs, tmp_path):
    done = run_python(["-c", readme_snippet(remote=False)], rootfs, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["45", "nonzero_exit 1"], lines
    assert "nonzero_exit 1" in lines
    assert "KeyError 'late'" in lines
    assert "42" in lines, "the session's second cell saw the first's x"
    assert "[('total.csv', 'created')]" in lines, "the session cell's result lists the file it made"
    assert "total,'=SUM(B2)" in lines, "the file the session's cell wrote came back judged, its formula neutralised"
    assert lines[-1].startswith("input rootfs /no/such/rootfs") and "jail rootfs build" in lines[-1], lines


def test_the_readme_remote_snippet_runs_as_written_against_the_service(rootfs, server, tmp_path):
    done = run_python(["-c", readme_snippet(remote=True)], rootfs, tmp_path, JAIL_URL=server.url, JAIL_TOKEN=TOKEN)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["45", "ok True", "squares.csv text/csv b'n,square\\n3,9\\n'"], lines
    assert lines[3] == "42", "the session's second cell saw the first's x"
    assert lines[4].startswith("401 the token was refused (401): check JAIL_TOKEN"), lines
    assert len(lines) == 5, lines


def test_the_langchain_example_runs(rootfs, tmp_path):
    done = run_python([str(REPO / "examples" / "langchain_tool.py")], rootfs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"stdout": "55\\n"' in done.stdout


def test_the_smolagents_example_keeps_state_through_a_session(rootfs, tmp_path):
    done = run_python([str(REPO / "examples" / "smolagents_executor.py")], rootfs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "raised: ZeroDivisionError" in done.stdout
    assert "21.3" in done.stdout, "the second action used the first one's `total`"


def test_the_openai_agents_example_runs(rootfs, tmp_path):
    done = run_python([str(REPO / "examples" / "openai_agents_tool.py")], rootfs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run_python" in done.stdout and "5.0" in done.stdout
