"""Print the syscalls a traced jail run made after the script's exec.

Reads `strace -f -o FILE jail run ...` output. The first process is the
supervisor, the second the jail's PID 1; everything else is the worker, from
its execve of Python on, and what the script started. Prints one name per
line, sorted, with how many calls each made.
"""
import collections
import re
import sys

LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]")
lines = open(sys.argv[1]).read().splitlines()
order = []
for line in lines:
    m = LINE.match(line)
    if m and int(m.group(1)) not in order:
        order.append(int(m.group(1)))
supervisor, pid1 = order[0], order[1]
started = False
counts = collections.Counter()
for line in lines:
    m = LINE.match(line)
    if not m or int(m.group(1)) in (supervisor, pid1):
        continue
    if not started:
        started = m.group(2) == "execve" and "python" in line and "resumed" not in line
        continue
    if "resumed>" in line:
        continue
    counts[m.group(2)] += 1
for name in sorted(counts):
    print(f"{name} {counts[name]}")
