"""Run one CPython regression-test module and record every test case.

Runs the same way bare and in the jail: `python3 runner.py MODULE RESULTS`.
The `test` package is the stdlib's (Debian's libpython3.11-testsuite: on
the host where the package put it, in the jail in a copy of the minimal
rootfs that compat.py adds it to), so both sides run the same files. The working directory is a fresh folder under the system temp dir
(the suite writes its scratch files to the current directory). RESULTS gets
one JSON line per event as it happens, so a module that hangs or is killed
still leaves everything it finished, and the case it was in:
  {"start": ID}                      a case began
  {"id": ID, "status": S, "detail"}  it ended: ok, fail, error, skip,
                                     xfail (expected failure), xpass
  {"module_error": TEXT}             the module could not be loaded
  {"done": N}                        the module finished
"""

import json
import os
import sys
import tempfile
import traceback
import unittest

def last_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


class Recorder(unittest.TestResult):
    def __init__(self, out):
        super().__init__()
        self.out = out

    def emit(self, **kw):
        self.out.write(json.dumps(kw) + "\n")
        self.out.flush()

    def startTest(self, test):
        super().startTest(test)
        self.emit(start=test.id())

    def addSuccess(self, test):
        self.emit(id=test.id(), status="ok", detail="")

    def addFailure(self, test, err):
        self.emit(id=test.id(), status="fail", detail=last_line("".join(traceback.format_exception(*err))))

    def addError(self, test, err):
        self.emit(id=test.id(), status="error", detail=last_line("".join(traceback.format_exception(*err))))

    def addSkip(self, test, reason):
        self.emit(id=test.id(), status="skip", detail=str(reason)[:300])

    def addExpectedFailure(self, test, err):
        self.emit(id=test.id(), status="xfail", detail="")

    def addUnexpectedSuccess(self, test):
        self.emit(id=test.id(), status="xpass", detail="")

    def addSubTest(self, test, subtest, err):
        # A failing subtest fails its case (reported under the case's id).
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self.emit(id=test.id(), status=kind, detail=last_line("".join(traceback.format_exception(*err))))


def main():
    module, results = sys.argv[1], sys.argv[2]
    os.chdir(tempfile.mkdtemp(prefix="compat-"))
    with open(results, "w") as out:
        rec = Recorder(out)
        try:
            from test import support
            support.verbose = 0
            # As regrtest does without -u: no optional resources (network,
            # largefile, cpu, ...), the same on both sides.
            support.use_resources = []
            suite = unittest.defaultTestLoader.loadTestsFromName("test." + module)
        except Exception:
            rec.emit(module_error=last_line(traceback.format_exc()))
            return 1
        # The suite's own chatter goes nowhere: only RESULTS matters.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        suite.run(rec)
        rec.emit(done=rec.testsRun)
    return 0


if __name__ == "__main__":
    sys.exit(main())
