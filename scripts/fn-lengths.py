#!/usr/bin/env python3
"""The longest functions of Rust sources, for `make measure` (issue 35's
before and after): `fn-lengths.py [--tests] [-n N] DIR...`.

A function's length is its lines from the `fn` line to its closing brace,
comments and blank lines included; `#[cfg(test)]` modules are left out
unless --tests. Prints `lines path:line name`, longest first."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import strip, drop_test_mods  # noqa: E402


def lengths(path, tests):
    with open(path, encoding="utf-8") as f:
        t = strip(f.read())
    if not tests:
        t = drop_test_mods(t)
    for m in re.finditer(r"\bfn\s+(\w+)", t):
        # The body's opening brace: the first `{` at bracket depth 0, unless a `;` (a declaration) comes first.
        i, depth = m.end(), 0
        while i < len(t):
            c = t[i]
            if c in "(<[":
                depth += 1
            elif c in ")>]" and not (c == ">" and t[i - 1] == "-"):
                depth -= 1
            elif c == ";" and depth <= 0:
                i = -1
                break
            elif c == "{" and depth <= 0:
                break
            i += 1
        if i < 0 or i >= len(t):
            continue
        j, b = i + 1, 1
        while j < len(t) and b:
            b += {"{": 1, "}": -1}.get(t[j], 0)
            j += 1
        start = t.count("\n", 0, m.start()) + 1
        end = t.count("\n", 0, j) + 1
        yield end - start + 1, f"{path}:{start}", m.group(1)


def main(argv):
    tests = "--tests" in argv
    n = 20
    if "-n" in argv:
        i = argv.index("-n")
        n = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    rows = []
    for d in (a for a in argv if not a.startswith("--")):
        for root, _, names in os.walk(d):
            for name in sorted(names):
                if name.endswith(".rs"):
                    rows.extend(lengths(os.path.join(root, name), tests))
    rows.sort(key=lambda r: (-r[0], r[1]))
    for r in rows[:n]:
        print(f"{r[0]:5d} {r[1]} {r[2]}")


if __name__ == "__main__":
    main(sys.argv[1:])
