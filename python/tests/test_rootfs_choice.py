"""Which rootfs a Sandbox gets (issue 38 item 3): the data rootfs where one
is built, else the minimal one; `rootfs_name=` names one; a name not built
is a SandboxSetupError naming the command that builds it. The rootfs are
found the way a user's are, by name in `~/.local/share/jail/rootfs` (here a
HOME of the test's own, its entries links to the suite's rootfs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jail_sandbox import Sandbox, SandboxSetupError


def user_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAIL_") and k != "XDG_DATA_HOME"}
    env["HOME"] = str(home)
    return env


def installed(tmp_path: Path, **rootfs: Path) -> dict:
    tmp_path.chmod(0o755)
    folder = tmp_path / "home" / ".local" / "share" / "jail" / "rootfs"
    folder.mkdir(parents=True)
    for name, path in rootfs.items():
        (folder / name).symlink_to(path)
    return user_env(tmp_path / "home")


def where(ex) -> Path:
    return Path(ex.result["isolation"]["rootfs"])


def test_the_data_rootfs_is_the_default_where_it_is_built(tmp_path, rootfs, data_rootfs):
    env = installed(tmp_path, minimal=rootfs, data=data_rootfs)
    ex = Sandbox(env=env, pool=0).run("import pandas\nprint('pandas', pandas.__version__ > '0')")
    assert ex.ok and ex.stdout == "pandas True\n", ex.stderr
    assert where(ex) == data_rootfs.resolve()
    small = Sandbox(env=env, pool=0, rootfs_name="minimal").run("import sys\nprint(1)")
    assert where(small) == rootfs.resolve()


def test_without_data_the_minimal_rootfs_is_used(tmp_path, rootfs):
    env = installed(tmp_path, minimal=rootfs)
    ex = Sandbox(env=env, pool=0).run("print('minimal')")
    assert ex.ok and where(ex) == rootfs.resolve()


def test_a_name_not_built_names_its_build(tmp_path, rootfs):
    env = installed(tmp_path, minimal=rootfs)
    with pytest.raises(SandboxSetupError) as info:
        Sandbox(env=env, pool=0, rootfs_name="data").run("print(1)")
    message = info.value.message
    assert "no rootfs `data` found" in message and "`jail rootfs build data`" in message, message
    assert "\n" not in message


def test_no_rootfs_at_all_names_both_builds(tmp_path):
    env = installed(tmp_path)
    if any(Path("/var/lib/jail/rootfs", n).exists() for n in ("data", "minimal")):
        pytest.skip("this host has a system rootfs, which every user finds")
    with pytest.raises(SandboxSetupError) as info:
        Sandbox(env=env, pool=0).run("print(1)")
    message = info.value.message
    assert "jail rootfs build minimal" in message and "jail rootfs build data" in message, message
