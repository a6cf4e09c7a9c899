"""The client against the real binary and rootfs: what a run returns, the
live callbacks, artifacts, and the typed errors for a run that cannot start."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import pytest

import jail_sandbox
from jail_sandbox import Execution, Sandbox, SandboxSetupError, SessionClosedError


def test_the_binary_is_the_one_inside_the_wheel():
    found = jail_sandbox.find_jail()
    assert found.is_file()
    # Installed from the wheel into this environment, not picked up elsewhere.
    assert Path(sys.prefix).resolve() in found.resolve().parents, found


def test_a_run_returns_its_output_status_and_usage(rootfs):
    ex = Sandbox(rootfs=rootfs).run("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)\n")
    assert isinstance(ex, Execution)
    assert (ex.status, ex.exit_code, ex.ok) == ("ok", 0, True)
    # E2B's `text` is the last expression's value: a print() has none.
    assert ex.stdout == "42\n" and ex.text is None
    assert ex.stderr == "warn\n"
    assert ex.error is None
    assert ex.usage.wall_ms > 0
    assert ex.result["isolation"]["namespaces"], "the whole result document is kept"


def test_an_exception_in_the_code_is_an_error_not_a_raise(rootfs):
    ex = Sandbox(rootfs=rootfs).run("def f():\n    raise ValueError('bad value')\nf()\n")
    assert ex.status == "nonzero_exit" and ex.exit_code == 1
    assert ex.error is not None
    assert (ex.error.type, ex.error.message) == ("ValueError", "bad value")
    assert (ex.error.name, ex.error.value) == ("ValueError", "bad value")
    assert "Traceback (most recent call last)" in ex.error.traceback
    assert "in f" in ex.error.traceback


def test_callbacks_get_the_output_while_the_code_runs(rootfs):
    seen = []

    def on_stdout(text: str) -> None:
        seen.append(("stdout", text, time.monotonic()))

    def on_stderr(text: str) -> None:
        seen.append(("stderr", text, time.monotonic()))

    code = "import sys, time\nprint('first', flush=True)\nprint('oops', file=sys.stderr, flush=True)\ntime.sleep(1.5)\nprint('last')\n"
    ex = Sandbox(rootfs=rootfs).run(code, on_stdout=on_stdout, on_stderr=on_stderr)
    ended = time.monotonic()
    out = "".join(t for k, t, _ in seen if k == "stdout")
    err = "".join(t for k, t, _ in seen if k == "stderr")
    assert out == ex.stdout == "first\nlast\n"
    assert err == ex.stderr == "oops\n"
    first_at = next(at for k, t, at in seen if "first" in t)
    # Live: the first line came well before the run was over.
    assert ended - first_at > 1.0, ended - first_at


def test_output_that_is_not_utf8_reaches_the_callback_exactly(rootfs):
    got = []
    Sandbox(rootfs=rootfs).run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\n')\n", on_stdout=got.append)
    assert "".join(got).encode("utf-8", "surrogateescape") == b"ok \xff\n"


def test_artifacts_are_objects_with_path_sha256_media_type_and_summary(rootfs, folders):
    inp, out = folders
    (inp / "numbers.txt").write_text("1\n2\n3\n")
    (inp / "numbers.txt").chmod(0o644)
    seen = []
    code = (
        "nums = [int(x) for x in open('/workspace/input/numbers.txt')]\n"
        "with open('/workspace/output/table.csv', 'w') as f:\n"
        "    f.write('n,square\\n' + ''.join(f'{n},{n*n}\\n' for n in nums))\n"
        "print(sum(nums))\n"
    )
    ex = Sandbox(rootfs=rootfs, input=inp, output=out).run(code, on_artifact=seen.append)
    assert ex.ok, ex.stderr
    assert ex.stdout == "6\n"
    assert ex.output_dir == out.resolve()
    [a] = ex.artifacts
    assert seen == [a]
    assert (a.path, a.media_type, a.change) == ("table.csv", "text/csv", "created")
    content = (out / "table.csv").read_bytes()
    assert a.read_bytes() == content
    assert a.sha256 == hashlib.sha256(content).hexdigest()
    assert a.summary == {"kind": "csv", "rows": 4, "columns": 2, "header": ["n", "square"]}


def test_a_timeout_is_a_status(rootfs):
    started = time.monotonic()
    ex = Sandbox(rootfs=rootfs, timeout=1).run("import time\ntime.sleep(30)\n")
    assert ex.status == "timeout_wall"
    assert ex.exit_code is None
    assert time.monotonic() - started < 10


def test_args_reach_the_code(rootfs):
    ex = Sandbox(rootfs=rootfs).run("import sys\nprint(sys.argv[1:])\n", args=["--flag", "x y"])
    assert ex.stdout == "['--flag', 'x y']\n"


def test_a_missing_rootfs_is_a_setup_error_naming_the_fix(tmp_path):
    with pytest.raises(SandboxSetupError) as info:
        Sandbox(rootfs=tmp_path / "nowhere").run("print('never')\n")
    e = info.value
    assert e.stage == "input"
    assert "nowhere" in e.message and "jail rootfs build" in e.message, e.message
    assert e.result is not None and e.result["status"] == "setup_failed"


def test_a_bad_policy_is_a_setup_error_at_the_policy_stage(rootfs, tmp_path):
    bad = tmp_path / "policy.json"
    bad.write_text('{"name": 1}')
    with pytest.raises(SandboxSetupError) as info:
        Sandbox(rootfs=rootfs, policy=bad).run("print('never')\n")
    assert info.value.stage == "policy"
    assert "jail check" in info.value.message


def test_an_out_of_range_timeout_is_a_setup_error(rootfs):
    with pytest.raises(SandboxSetupError) as info:
        Sandbox(rootfs=rootfs, timeout=0).run("print('never')\n")
    assert info.value.stage == "input" and "--timeout" in info.value.message


def test_a_missing_binary_is_its_own_error(rootfs, tmp_path):
    with pytest.raises(jail_sandbox.JailNotFoundError):
        Sandbox(rootfs=rootfs, jail=tmp_path / "no-jail").run("print(1)\n")


def test_the_jail_still_confines_code_run_from_python(rootfs):
    # The package adds no way out: no network, a read-only root, no host files.
    code = (
        "import socket, os\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net')\n"
        "except OSError: print('no net')\n"
        "try:\n    open('/usr/evil', 'w'); print('wrote')\n"
        "except OSError: print('read-only')\n"
        "print(os.path.exists('/etc/shadow'), os.path.exists('" + str(Path(__file__).resolve().parent) + "'))\n"
    )
    ex = Sandbox(rootfs=rootfs).run(code)
    assert ex.stdout.splitlines() == ["no net", "read-only", "False False"], ex.stdout + ex.stderr


def test_a_session_keeps_state_between_cells_and_ends_with_its_block(rootfs):
    seen = []
    with Sandbox(rootfs=rootfs).session() as s:
        first = s.run("x = 41\nprint('set')")
        second = s.run("print(x + 1)", on_stdout=seen.append)
        third = s.run("raise ValueError('bad cell')")
        pid = s.pid
    assert isinstance(first, Execution) and first.stdout == "set\n"
    assert (second.status, second.stdout) == ("ok", "42\n")
    assert seen == ["42\n"]
    assert third.error is not None and third.error.type == "ValueError"
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the session's jail outlived the block"
    with pytest.raises(SessionClosedError):
        s.run("print(x)")
    assert s.close() is not None, "close twice returns the closing result"


def test_a_session_is_closed_when_its_block_raises(rootfs):
    with pytest.raises(KeyError):
        with Sandbox(rootfs=rootfs).session() as s:
            s.run("y = 1")
            pid = s.pid
            raise KeyError("caller")
    assert s.handle is None and s.closing is not None
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the session's jail outlived the block"


def test_a_session_that_cannot_start_is_a_setup_error(tmp_path):
    with pytest.raises(SandboxSetupError) as info:
        Sandbox(rootfs=tmp_path / "nope").session()
    assert "nope" in info.value.message
