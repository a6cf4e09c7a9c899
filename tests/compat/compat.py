#!/usr/bin/python3
"""The compatibility bar: CPython's own regression tests, bare and in the jail.

For each module of tests/compat/modules.txt this runs tests/compat/runner.py
twice with the same interpreter (/usr/bin/python3, which the minimal rootfs
copies) and the same test files (Debian's libpython3.11-testsuite): bare, as
an ordinary user (TEST_USER when run as root, so neither side has
privileges), and in the jail, on a copy of the minimal rootfs with the suite
added where the host has it; the working directory is a fresh folder in /tmp
on both sides. Every test case's outcome is compared. A case that differs must be
listed in tests/compat/differences.txt with the reason; an unlisted
difference fails the run. A listed one that no longer differs is reported
(stale) without failing, since timing-sensitive cases come and go.

Usage: tests/compat/compat.py [MODULE...]   (default: every module listed)
Environment: JAIL_BIN (default target/debug/jail), JAIL_ROOTFS (default
python-rootfs/out/minimal), TEST_USER (default jailtest), COMPAT_KEEP=1
(keep the work folder with every module's raw results),
COMPAT_TIMEOUT (seconds per module and side, default 600).
"""

import fnmatch
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PYTHON = "/usr/bin/python3"
TESTSUITE = Path("/usr/lib/python3.11/test")
# The jail's limits for these runs: the policy's own, except the ones a test
# suite outgrows that say nothing about compatibility (a module of the suite
# runs for minutes, starts hundreds of threads). The rest (RLIMIT_FSIZE 256M,
# the /tmp size, open files, no network) stay as every script gets them.
JAIL_LIMITS = ["--cpu-time", "unlimited", "--memory", "2G", "--pids", "1024"]


class CompatError(Exception):
    pass


def log(msg):
    print(f"compat: {msg}", flush=True)


def read_list(path):
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def read_differences(path):
    """(pattern, expected jail status, reason) per line: `ID_GLOB STATUS REASON`;
    STATUS is the outcome in the jail (or `*`)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise CompatError(f"{path}:{n}: want TEST_ID_GLOB JAIL_STATUS REASON, got {line!r}")
        out.append(tuple(parts))
    return out


def outcomes(path):
    """Case id -> (status, detail) from a runner's results file; a case that
    started and never ended is `hung`; plus the module-level note."""
    cases, started, note = {}, None, None
    if not path.exists():
        return cases, "no results file"
    for line in path.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "start" in ev:
            started = ev["start"]
        elif "id" in ev:
            prev = cases.get(ev["id"])
            # A case with failing subtests reports them before its end.
            if prev is None or prev[0] in ("ok", "skip"):
                cases[ev["id"]] = (ev["status"], ev.get("detail", ""))
            started = None
        elif "module_error" in ev:
            note = "module error: " + ev["module_error"]
        elif "done" in ev:
            note = note or "done"
    if started is not None and started not in cases:
        cases[started] = ("hung", "never finished (killed at the module's time limit)")
    return cases, note or "did not finish"


def prepare(work, rootfs):
    """The runner in a code folder of its own, and the rootfs for the jail
    side: the minimal rootfs with the test suite added at the same place as
    on the host (the stdlib's `test` package), so that the suite's child
    interpreters, which run isolated (-I: no script folder on sys.path),
    find it on both sides."""
    if not (TESTSUITE / "test_os.py").exists():
        raise CompatError(f"no CPython test suite at {TESTSUITE}: install it with `make test-compat` "
                          "(apt-get install libpython3.11-testsuite)")
    code = work / "code"
    code.mkdir()
    shutil.copy2(HERE / "runner.py", code / "runner.py")
    (code / "runner.py").chmod(0o644)
    code.chmod(0o755)
    jail_rootfs = work / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(jail_rootfs)], check=True)
    subprocess.run(["cp", "-a", str(TESTSUITE), str(jail_rootfs / TESTSUITE.relative_to("/"))], check=True)
    return code, jail_rootfs


def check_rootfs(rootfs):
    """The jail must run the interpreter the bare side runs: the minimal
    rootfs is a copy of the host's Python, taken when it was built, and
    installing the test suite can upgrade the host's Python under it."""
    stdlib = Path("/usr/lib/python3.11")
    stale = [p.name for p in sorted(stdlib.glob("*.py"))
             if (rootfs / p.relative_to("/")).exists() and (rootfs / p.relative_to("/")).read_bytes() != p.read_bytes()]
    if stale or (rootfs / "usr/bin/python3.11").read_bytes() != Path("/usr/bin/python3.11").read_bytes():
        raise CompatError(f"the rootfs {rootfs} holds another Python than the host's ({', '.join(stale[:3]) or 'python3.11'} "
                          "differ): rebuild it with `make rootfs`")


def bare_command(user):
    # The jail's environment (policies/default.json) but for the thread caps.
    env = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1",
           "PYTHONNOUSERSITE=1", "TMPDIR=/tmp"]
    if os.getuid() == 0:
        return ["runuser", "-u", user, "--", *env]
    return env


def run_bare(code, module, out_dir, user, timeout):
    results = out_dir / f"{module}.bare.jsonl"
    out_dir.chmod(0o777)
    t0 = time.monotonic()
    try:
        subprocess.run([*bare_command(user), PYTHON, str(code / "runner.py"), module, str(results)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        pass
    return results, time.monotonic() - t0


def run_jail(jail, rootfs, code, module, out_dir, timeout):
    out = Path(tempfile.mkdtemp(prefix=f"compat-{module}-", dir=out_dir))
    # Root runs lease a host uid per run: the folder is open to whichever.
    out.chmod(0o777)
    t0 = time.monotonic()
    cmd = [jail, "run", "--json", "--rootfs", str(rootfs), "--code", str(code), "--output", str(out),
           "--timeout", str(int(timeout)), *JAIL_LIMITS, str(code / "runner.py"), module, "/workspace/output/results.jsonl"]
    # The jail ends the run at its wall-clock limit and still reports.
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout + 120)
    took = time.monotonic() - t0
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise CompatError(f"{module}: jail printed no result (exit {r.returncode}): {r.stderr[-500:]}")
    if doc.get("status") == "setup_failed":
        raise CompatError(f"{module}: the jail failed to start: {doc.get('setup_error')}")
    results = out_dir / f"{module}.jail.jsonl"
    src = out / "results.jsonl"
    if src.exists():
        shutil.copy(src, results)
    denials = {d["what"]: d["count"] for d in doc.get("denials", [])}
    return results, took, doc.get("status"), denials


def main(argv):
    t_start = time.monotonic()
    modules = read_list(HERE / "modules.txt")
    if argv:
        unknown = [a for a in argv if a not in modules]
        if unknown:
            raise CompatError(f"not in tests/compat/modules.txt: {', '.join(unknown)}")
        modules = argv
    diffs = read_differences(HERE / "differences.txt")
    jail = os.environ.get("JAIL_BIN", str(REPO / "target/debug/jail"))
    rootfs = Path(os.environ.get("JAIL_ROOTFS", REPO / "python-rootfs/out/minimal"))
    user = os.environ.get("TEST_USER", "jailtest")
    timeout = float(os.environ.get("COMPAT_TIMEOUT", "600"))
    if os.getuid() == 0:
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise CompatError(f"no user {user} for the bare runs (create it: useradd -m {user}, or set TEST_USER)")
    check_rootfs(rootfs)
    work = Path(tempfile.mkdtemp(prefix="jail-compat-"))
    work.chmod(0o755)
    unlisted, listed, stale, totals = [], [], set(p for p, _, _ in diffs), {"cases": 0, "same": 0}
    try:
        code, jail_rootfs = prepare(work, rootfs)
        res = work / "results"
        res.mkdir()
        for module in modules:
            bare_file, t_bare = run_bare(code, module, res, user, timeout)
            jail_file, t_jail, status, denials = run_jail(jail, jail_rootfs, code, module, res, timeout)
            bare, bare_note = outcomes(bare_file)
            inside, jail_note = outcomes(jail_file)
            if bare_note != "done" or any(c.startswith("unittest.loader._FailedTest") for c in bare):
                raise CompatError(f"{module} does not run bare ({bare_note}): not a module of this test suite?")
            n_diff = 0
            for case in sorted(set(bare) | set(inside)):
                b = bare.get(case, ("absent", ""))
                j = inside.get(case, ("absent", ""))
                totals["cases"] += 1
                if b[0] == j[0]:
                    totals["same"] += 1
                    continue
                n_diff += 1
                match = next(((p, s, why) for p, s, why in diffs
                              if fnmatch.fnmatchcase(case, p) and s in ("*", j[0])), None)
                row = (case, b[0], j[0], j[1] or b[1])
                if match:
                    stale.discard(match[0])
                    listed.append((*row, match[2]))
                else:
                    unlisted.append(row)
            print(f"  {module:<28} {len(bare):>5} cases bare ({t_bare:5.1f} s, {bare_note}), "
                  f"{len(inside):>5} in the jail ({t_jail:5.1f} s, {status}, {jail_note}); {n_diff} differ"
                  + (f"; denials {denials}" if denials else ""), flush=True)
    finally:
        if os.environ.get("COMPAT_KEEP") == "1":
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n== compatibility: {totals['cases']} cases in {len(modules)} modules, {totals['same']} the same, "
          f"{len(listed)} listed differences, {len(unlisted)} unlisted; {time.monotonic() - t_start:.0f} s", flush=True)
    for case, b, j, detail, why in listed:
        print(f"  listed    {case}: bare {b}, jail {j} -- {why}")
    for case, b, j, detail in unlisted:
        print(f"  UNLISTED  {case}: bare {b}, jail {j}: {detail}")
    if argv:
        stale = set()  # only a full run can tell
    for p in sorted(stale):
        print(f"  stale     {p}: listed in differences.txt but the same on both sides now")
    if unlisted:
        print("compat: FAIL: fix each unlisted difference or list it in tests/compat/differences.txt with its reason")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CompatError as e:
        print(f"compat: error: {e}", file=sys.stderr)
        sys.exit(1)
