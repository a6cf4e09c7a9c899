"""The wheel itself (issue 38 items 1 and 8): a manylinux_2_31 wheel (its
tag and its binaries checked by auditwheel, the PyPA's own tool) carrying
jail, jail-mcp and jail-serve beside one another, libseccomp linked in;
real metadata; the shipped data policy; the API reference current."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import jail_sandbox

REPO = Path(__file__).resolve().parents[2]


def the_wheel() -> Path:
    wheel = os.environ.get("JAIL_WHEEL")
    assert wheel and Path(wheel).is_file(), "JAIL_WHEEL is not set: run the suite with `make test-python`"
    return Path(wheel)


def test_the_wheel_is_manylinux_2_31_by_auditwheel():
    wheel = the_wheel()
    assert wheel.name.endswith("-py3-none-manylinux_2_31_x86_64.whl"), wheel.name
    auditwheel = Path(sys.executable).with_name("auditwheel")
    shown = subprocess.run([str(auditwheel), "show", str(wheel)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert 'consistent with the following platform tag: "manylinux_2_31_x86_64"' in text, text
    assert "libseccomp" not in text, f"the wheel must not need the host's libseccomp: {text}"


def test_jail_mcp_and_serve_are_installed_beside_jail_and_link_no_libseccomp():
    jail = jail_sandbox.find_jail()
    for name in ("jail", "jail-mcp", "jail-serve"):
        binary = jail.with_name(name)
        assert binary.is_file() and os.access(binary, os.X_OK), binary
        needed = subprocess.run(["readelf", "-dW", str(binary)], capture_output=True, text=True, check=True).stdout
        assert "libseccomp" not in needed, f"{name} links libseccomp dynamically"
    for sub in ("mcp", "serve"):
        helped = subprocess.run([str(jail), sub, "--help"], capture_output=True, text=True, timeout=60)
        assert helped.returncode == 0 and "--rootfs-name" in helped.stdout, (sub, helped.stdout, helped.stderr)


def test_the_package_has_real_metadata():
    meta = metadata.metadata("jail-sandbox")
    assert "jail" in meta["Summary"].lower() and len(meta["Summary"]) > 40
    assert meta["License"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier")
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    for label, doc in urls.items():
        assert (REPO / doc).is_file(), f"Project-URL {label} names {doc}, which the repository lacks"
    assert set(meta.get_all("Provides-Extra")) == {"smolagents", "langchain", "openai-agents"}
    assert meta.get_payload().startswith("# jail-sandbox"), "the long description is python/README.md"


def test_the_data_policy_ships_and_is_the_repositorys():
    shipped = Path(jail_sandbox.__file__).parent / "policies" / "data.json"
    assert shipped.read_bytes() == (REPO / "policies" / "data.json").read_bytes()


def test_the_api_reference_is_generated_from_the_docstrings():
    made = subprocess.run(
        [sys.executable, str(REPO / "python" / "apidoc.py")], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert made == (REPO / "python" / "API.md").read_text(encoding="utf-8"), (
        "python/API.md is not what the docstrings say: run `make python-api`"
    )
