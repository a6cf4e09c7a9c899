"""No litter (issue 38 item 5): a run that leaves no file leaves no folder;
the folder made for a run goes once its Execution and artifacts are gone;
a process killed before it could clean up has its folder swept by the
next client; the caller's own output folder is never touched."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from jail_sandbox import Sandbox, _scratch


def scratch_entries() -> list:
    return sorted(p.name for p in _scratch.folder().iterdir())


def test_a_run_that_leaves_no_file_leaves_no_folder(rootfs):
    before = scratch_entries()
    ex = Sandbox(rootfs=rootfs, pool=0).run("print(1)")
    assert ex.ok and ex.backend == "run"
    assert ex.output_dir is None and ex.result["output_dir"] is None
    assert scratch_entries() == before, "nothing of the run is left in the client's folder"


def test_the_folder_made_for_a_run_goes_with_its_execution_and_artifacts(rootfs):
    ex = Sandbox(rootfs=rootfs, pool=0).run("open('kept.txt', 'w').write('kept')")
    out = ex.output_dir
    assert out is not None and out.parent == _scratch.folder(), out
    [artifact] = ex.artifacts
    del ex
    gc.collect()
    assert artifact.read_bytes() == b"kept", "an artifact keeps its folder"
    del artifact
    gc.collect()
    assert not out.exists(), f"{out} outlived its Execution and artifacts"


def test_the_callers_own_output_folder_is_never_touched(rootfs, folders):
    _, out = folders
    (out / "mine.txt").write_text("mine")
    sandbox = Sandbox(rootfs=rootfs, output=out, pool=0)
    nothing = sandbox.run("print('nothing written')")
    assert nothing.ok and nothing.output_dir == out.resolve()
    made = sandbox.run("open('theirs.txt', 'w').write('x')")
    del nothing, made
    gc.collect()
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "theirs.txt"]
    assert (out / "mine.txt").read_text() == "mine"


def test_a_killed_clients_folder_is_swept_by_the_next_and_a_live_ones_is_not(rootfs, tmp_path):
    tmp_path.chmod(0o755)
    child = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from jail_sandbox import Sandbox
        ex = Sandbox(rootfs={str(rootfs)!r}, pool=0).run("open('left.txt', 'w').write('x')")
        print(ex.output_dir, flush=True)
        if sys.argv[1] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
        """
    )
    env = dict(os.environ, TMPDIR=str(tmp_path))
    died = subprocess.run([sys.executable, "-c", child, "die"], env=env, capture_output=True, text=True, timeout=120)
    assert died.returncode == -signal.SIGKILL, died.stderr
    left = Path(died.stdout.strip())
    assert left.is_dir() and left.parent.parent == tmp_path, "SIGKILL left the folder for the sweep"
    live = subprocess.Popen([sys.executable, "-c", child, "live"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None
        kept = Path(live.stdout.readline().strip())
        assert kept.is_dir()
        # The next client: its first folder sweeps the dead one's, not the live one's.
        subprocess.run(
            [sys.executable, "-c", "from jail_sandbox import _scratch; _scratch.folder()"], env=env, check=True, timeout=60
        )
        assert not left.parent.exists(), "the killed client's folder was not swept"
        assert kept.is_dir(), "a live client's folder was swept"
    finally:
        os.kill(live.pid, signal.SIGKILL)
        live.wait()
    # What is left (the live one's, now dead, and the sweeper's) goes with tmp_path.
