"""The suite runs against the installed wheel (its bundled `jail` binary)
and the real rootfs: `make test-python` sets JAIL_ROOTFS to the build's
minimal rootfs. As root it runs again as an ordinary user."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The sandbox's host gid for a run started by root (policies/default.json,
# identity.root_host_gid): a folder the script writes must be its group's.
ROOT_HOST_GID = 1879048192


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
