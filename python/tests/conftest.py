"""The suite runs against the installed wheel (its bundled `jail` binary)
and the real rootfs: `make test-python` sets JAIL_ROOTFS to the build's
minimal rootfs, JAIL_SERVE to the `jail-serve` the remote tests start,
JAIL_WHEEL to the wheel itself and JAIL_WHEELS to a folder of the data
stack's locked wheels (a warm cache: the data rootfs is built from it
without root, once per session, unless JAIL_DATA_ROOTFS names one). As
root it runs again as an ordinary user. The issue 38 targets are printed
at the end (``figure``)."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]

# The sandbox's host gid for a run started by root (policies/default.json,
# identity.root_host_gid): a folder the script writes must be its group's.
ROOT_HOST_GID = 1879048192


#: Figures the suite measured, printed at its end: (what, value, target).
FIGURES: List[tuple] = []


def figure(what: str, value: str, target: str) -> None:
    """Record a measured figure for the end-of-suite summary."""
    FIGURES.append((what, value, target))


def pytest_terminal_summary(terminalreporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("issue 38 targets, measured on this machine in this run")
    for what, value, target in FIGURES:
        terminalreporter.write_line(f"{what}: {value} (target: {target})")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_input_tar: needs the service's `input_tar` field of POST /v1/runs (a parallel branch adds it); "
        "fails, never skips, against a service without it",
    )


@pytest.fixture(scope="session")
def rootfs() -> Path:
    value = os.environ.get("JAIL_ROOTFS")
    if not value:
        pytest.fail("JAIL_ROOTFS is not set: run the suite with `make test-python` (it builds the rootfs)")
    path = Path(value)
    if not path.is_dir():
        pytest.fail(f"rootfs {path} not found: build it with `make rootfs`")
    return path


def shared_folder(path: Path) -> Path:
    """Make `path` writable by the sandbox: as root, its group becomes the one
    every root run shares (tests/src/lib.rs give_to_sandbox)."""
    path.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(path, -1, ROOT_HOST_GID)
        path.chmod(0o775)
    return path


def the_wheels() -> Path:
    value = os.environ.get("JAIL_WHEELS")
    if not value or not Path(value).is_dir():
        pytest.fail("JAIL_WHEELS is not a folder of the locked wheels: run the suite with `make test-python`")
    return Path(value)


@pytest.fixture(scope="session")
def data_rootfs():
    """A data rootfs: JAIL_DATA_ROOTFS, else built once for the session the
    way an ordinary user builds it (`jail rootfs build data`: the host's
    Python and the locked wheels, from JAIL_WHEELS), as root too."""
    value = os.environ.get("JAIL_DATA_ROOTFS")
    if value:
        yield Path(value)
        return
    from jail_sandbox import find_jail

    # Beneath TMPDIR, not pytest's 0700 temp: a root run's sandbox uid reads it.
    top = Path(tempfile.mkdtemp(prefix="jail-py-data-"))
    top.chmod(0o755)
    dest = top / "data"
    env = dict(os.environ, JAIL_WHEELS=str(the_wheels()), JAIL_DATA_FROM="wheels")
    env.pop("JAIL_ROOTFS", None)
    done = subprocess.run(
        [str(find_jail()), "rootfs", "build", "data", "--dest", str(dest)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield dest
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture()
def folders(tmp_path: Path):
    tmp_path.chmod(0o755)
    inp = tmp_path / "input"
    out = tmp_path / "output"
    inp.mkdir()
    out.mkdir()
    inp.chmod(0o755)
    return inp, shared_folder(out)


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


# ---------------------------------------------------------------- jail serve
# RemoteSandbox's tests talk to a real `jail-serve` (the one `make
# test-python` builds, named by JAIL_SERVE, with its `jail` beside it) on a
# loopback port the kernel picks, with a tokens file of their own and the
# suite's rootfs; stopped by its PID when the tests are done.

TOKEN = "py-remote-token-0123456789"
#: A tenant with one run at a time, for 429 and Retry-After.
SOLO_TOKEN = "py-solo-token-0123456789ab"
#: The `py` tenant's most: a run may ask for no more.
MAX_TIMEOUT_SECS = 60
MAX_MEMORY_MIB = 256


class Server:
    """A running `jail-serve`: its base URL, its process, its stderr so far."""

    def __init__(self, proc: "subprocess.Popen[bytes]", url: str, work: Path) -> None:
        self.proc = proc
        self.url = url
        self.work = work
        self.log = bytearray()

    def stop(self) -> None:
        """SIGTERM (a drain), then SIGKILL by PID if it has not exited in
        30 s; then its tokens file and work folder go."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def start_server(rootfs: Path, extra: Sequence[str] = ()) -> Server:
    binary = os.environ.get("JAIL_SERVE")
    if not binary:
        pytest.fail("JAIL_SERVE is not set: run the suite with `make test-python` (it builds jail-serve beside jail)")
    if not Path(binary).is_file() or not (Path(binary).parent / "jail").is_file():
        pytest.fail(f"no jail-serve with a jail beside it at {binary}: `make test-python` builds both")
    # As root the server's jails run as an unprivileged uid, which must
    # reach its run folder beneath this one (tests/fronts/tests/serve.rs does the same).
    work = Path(tempfile.mkdtemp(prefix="jail-py-serve-"))
    work.chmod(0o711)
    tokens = work / "tokens.json"
    tenants = {
        "tenants": [
            {
                "name": "py",
                "token": TOKEN,
                "max_runs": 4,
                "max_sessions": 2,
                "max_bytes_in": 4 << 20,
                "max_timeout_secs": MAX_TIMEOUT_SECS,
                "max_memory_mib": MAX_MEMORY_MIB,
            },
            {"name": "solo", "token": SOLO_TOKEN, "max_runs": 1, "max_sessions": 1},
        ]
    }
    tokens.write_text(json.dumps(tenants))
    tokens.chmod(0o600)
    cmd = [binary, "--listen", "127.0.0.1:0", "--tokens", str(tokens), "--work-dir", str(work), "--rootfs", str(rootfs)]
    cmd += ["--drain-secs", "10", *extra]
    # TMPDIR=/tmp: the sessions' sockets live in it, and their paths must be short.
    env = dict(os.environ, TMPDIR="/tmp")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    # Its stderr says "listening on ADDR" once it serves (a warm pool's
    # start is said first); any line before that is kept for the message.
    prefix = "jail serve: listening on "
    lines: List[str] = []
    pending = b""
    deadline = time.monotonic() + 30
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline and len(lines) < 32:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            byte = os.read(proc.stderr.fileno(), 1)
            if not byte:
                break
            pending += byte
            if byte == b"\n":
                lines.append(pending.decode("utf-8", "replace").strip())
                pending = b""
                if lines[-1].startswith(prefix):
                    break
    said = lines[-1] if lines else pending.decode("utf-8", "replace")
    if not said.startswith(prefix):
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"jail-serve did not start listening within 30 s: {lines!r} {proc.stderr.read()[:2000]!r}")
    server = Server(proc, "http://" + said[len(prefix):], work)

    def drain() -> None:
        # Kept (bounded) for a failing test's message; read so the server never blocks on it.
        for chunk in iter(lambda: os.read(proc.stderr.fileno(), 65536), b""):  # type: ignore[union-attr]
            if len(server.log) < (1 << 20):
                server.log.extend(chunk)

    threading.Thread(target=drain, daemon=True).start()
    return server


@pytest.fixture(scope="session")
def server(rootfs: Path):
    """One `jail-serve` for the whole suite."""
    s = start_server(rootfs)
    try:
        yield s
    finally:
        s.stop()
    assert s.proc.returncode == 0, f"jail-serve did not drain and exit 0 ({s.proc.returncode}): {bytes(s.log[-2000:])!r}"
