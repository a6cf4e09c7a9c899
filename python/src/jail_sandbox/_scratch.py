"""Where the client keeps what it makes on the host (each run's script, the
output folders ``jail`` makes for its runs: it runs ``jail`` with TMPDIR
pointing here), so that nothing is left behind.

Everything goes into one folder per process, ``$TMPDIR/jail-sandbox-PID-START-XXXXXX``
(START is the process's start time in clock ticks, from ``/proc``, so a
reused pid is told apart). An output folder is removed once nothing refers
to it (its :class:`~jail_sandbox.Execution` and every one of its artifacts
are gone), the process's folder when the interpreter exits, and, should a
process die before it could clean up (SIGKILL), the next client that starts
removes the folders of every such process of the same user: a folder lives
at most as long as its process.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Optional

_PREFIX = "jail-sandbox-"
_NAME = re.compile(r"^jail-sandbox-(\d+)-(\d+)-[A-Za-z0-9_]+$")

_lock = threading.Lock()
_folder: Optional[Path] = None


def _start_ticks(pid: int) -> Optional[int]:
    """Field 22 of ``/proc/PID/stat`` (after the parenthesised command, which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(4096)
    except OSError:
        return None
    try:
        return int(text[text.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def _alive(pid: int, start: int) -> bool:
    return _start_ticks(pid) == start


def sweep(parent: Path) -> None:
    """Remove the folders of this user's clients whose process is gone.
    Only folders named as this module names them, owned by us and not a link."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    me = os.geteuid()
    for entry in entries:
        m = _NAME.match(entry.name)
        if m is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
            continue
        if _alive(int(m.group(1)), int(m.group(2))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)


def folder() -> Path:
    """This process's folder, made (and stale ones swept) on first use."""
    global _folder
    with _lock:
        if _folder is not None and _folder.is_dir():
            return _folder
        parent = Path(tempfile.gettempdir())
        sweep(parent)
        pid = os.getpid()
        made = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{pid}-{_start_ticks(pid) or 0}-", dir=parent))
        # As root a run's sandbox is an unprivileged uid, which must reach
        # an output folder bound beneath this one (a policy's
        # `output_size: "unlimited"`); it may list nothing here.
        made.chmod(0o711 if os.geteuid() == 0 else 0o700)
        atexit.register(shutil.rmtree, str(made), True)
        _folder = made
        return made


class Owned:
    """A folder this client made; removed when the last reference to this
    object goes (an :class:`Execution` and its artifacts hold it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(path), True)

    def remove(self) -> None:
        self._finalizer()

    def __repr__(self) -> str:
        return f"Owned({str(self.path)!r})"


def new_dir(kind: str) -> Path:
    """A fresh private folder in this process's folder."""
    return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=folder()))


def owns(path: Path) -> bool:
    """Whether ``path`` lies in this process's folder (a folder ``jail`` made
    there for a run of ours, with TMPDIR pointing at it)."""
    d = _folder
    return d is not None and Path(path).parent == d
