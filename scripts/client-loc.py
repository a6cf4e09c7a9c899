#!/usr/bin/env python3
"""Issue 35's client-code figure, for `make measure`: the lines of code in
agent, mcp and serve that spawn `jail` or speak its protocols, run at the
repository's root: `client-loc.py`.

Counted as code lines: no blank line, no comment, no `#[cfg(test)]` module.
The list below names the files and functions that are clients today; when
a step renames or moves one, update the list, and the closing note says
which list it counted."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import code  # noqa: E402

FILES = ["agent/src/runner.rs", "agent/src/cells.rs", "agent/src/live.rs", "agent/src/pool.rs",
         "mcp/src/sessions.rs", "mcp/src/stop.rs",
         "serve/src/spawn.rs", "serve/src/pool.rs", "serve/src/pool/wire.rs"]
FUNCS = [("mcp/src/server.rs", "run_step"), ("serve/src/sessions.rs", "jail"), ("serve/src/janitor.rs", "stop_session")]


def code_lines(text):
    return sum(1 for line in text.splitlines() if line.strip())


def func_text(t, name):
    m = re.search(r"\bfn\s+%s\b" % name, t)
    if not m:
        return ""
    i = t.index("{", m.end())
    j, b = i + 1, 1
    while j < len(t) and b:
        b += {"{": 1, "}": -1}.get(t[j], 0)
        j += 1
    return t[m.start():j]


def main():
    total = 0
    for f in FILES:
        if os.path.exists(f):
            n = code_lines(code(f))
            print(f"client  {n:5d}  {f}")
            total += n
    for f, fn in FUNCS:
        if os.path.exists(f):
            n = code_lines(func_text(code(f), fn))
            print(f"client  {n:5d}  {f} fn {fn}")
            total += n
    print(f"client  {total:5d}  TOTAL (agent + mcp + serve)")


if __name__ == "__main__":
    main()
