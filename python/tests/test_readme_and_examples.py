"""What users copy: README.md's "From Python" snippet, run exactly as
written, and the two examples in examples/, run as scripts."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO


def readme_snippet() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the From Python section has one python block"
    return blocks[0]


def run_python(args, rootfs, cwd):
    # The rootfs comes the way a user's does: the binary's own lookup
    # ($JAIL_ROOTFS here), never from the snippet.
    env = dict(os.environ, JAIL_ROOTFS=str(rootfs))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_readme_snippet_runs_as_written(rootfs, tmp_path):
    done = run_python(["-c", readme_snippet()], rootfs, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["45", "nonzero_exit 1"], lines
    assert "nonzero_exit 1" in lines
    assert "KeyError 'late'" in lines
    assert "42" in lines, "the session's second cell saw the first's x"
    assert lines[-1].startswith("input rootfs /no/such/rootfs") and "jail rootfs build" in lines[-1], lines


def test_the_langchain_example_runs(rootfs, tmp_path):
    done = run_python([str(REPO / "examples" / "langchain_tool.py")], rootfs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"stdout": "55\\n"' in done.stdout


def test_the_smolagents_example_runs(rootfs, tmp_path):
    done = run_python([str(REPO / "examples" / "smolagents_executor.py")], rootfs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "raised: ZeroDivisionError" in done.stdout
