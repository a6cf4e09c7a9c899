"""Pack the jail-sandbox wheel from the workspace's release build.

    python3 python/pack.py --bin target/release --out target/wheels

The wheel is a zip (PEP 427): the pure-Python package from src/, the data
policy beside it (``jail_sandbox/policies/data.json``, a copy of
policies/data.json, which a pool on the data rootfs preloads with), the
three binaries as scripts (``jail_sandbox-VERSION.data/scripts/jail``,
``jail-mcp``, ``jail-serve``: pip installs them into the environment's
``bin/``, beside one another, as ``jail mcp`` and ``jail serve`` want), the
metadata from pyproject.toml and README.md, and a RECORD of every file's
sha256. Nothing is compiled here: the binaries are the ones `make release`
built (so `make install` and the wheel share one build), and the wheel is
only tagged ``manylinux_2_31_x86_64`` after each binary is checked to need
no shared library beyond glibc's and no glibc symbol newer than 2.31 (the
manylinux_2_31 policy: Debian 11, Ubuntu 20.04 and newer).

Also a PEP 517 backend (pyproject.toml ``build-backend = "pack"``): ``pip
wheel python/`` packs the same wheel from ``target/release`` (``make
release`` first).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# libjail.so beside jail: what a pool's template loads to fork its jails
# (jail/src/template.rs).
BINARIES = ("jail", "jail-mcp", "jail-serve", "libjail.so")
GLIBC_MAX = (2, 31)
PLATFORM = "manylinux_2_31_x86_64"
# The shared libraries every manylinux platform may assume (PEP 600 and
# auditwheel's policy): glibc's own. libseccomp is linked in statically.
ALLOWED_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libgcc_s.so.1",
    "libutil.so.1",
    "ld-linux-x86-64.so.2",
}
# Every zip entry gets this time (1980-01-01): the same inputs give the same wheel.
_EPOCH = (1980, 1, 1, 0, 0, 0)


class PackError(Exception):
    pass


def project() -> Dict[str, object]:
    """pyproject.toml's [project] table."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python < 3.11
        raise PackError("pack.py needs Python 3.11 or newer (tomllib) to read pyproject.toml") from None
    with open(HERE / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def metadata(p: Dict[str, object]) -> str:
    """The METADATA file (core metadata 2.1) from the [project] table."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p['description']}",
        f"License: {p['license']['text']}",  # type: ignore[index]
        f"Requires-Python: {p['requires-python']}",
        f"Keywords: {','.join(p.get('keywords', []))}",  # type: ignore[arg-type]
    ]
    lines += [f"Classifier: {c}" for c in p.get("classifiers", [])]  # type: ignore[union-attr]
    lines += [f"Project-URL: {k}, {v}" for k, v in p.get("urls", {}).items()]  # type: ignore[union-attr]
    for extra, reqs in p.get("optional-dependencies", {}).items():  # type: ignore[union-attr]
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    lines.append("Description-Content-Type: text/markdown")
    readme = (HERE / str(p["readme"])).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n\n" + readme


def glibc_needs(binary: Path) -> Tuple[List[str], Tuple[int, int]]:
    """The shared libraries ``binary`` needs (DT_NEEDED) and the newest
    GLIBC_x.y symbol version it asks for, from ``readelf``."""
    try:
        dyn = subprocess.run(["readelf", "-dW", str(binary)], capture_output=True, text=True, check=True).stdout
        syms = subprocess.run(["readelf", "-VW", str(binary)], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise PackError(f"readelf {binary}: {e}: install binutils") from None
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    versions = [tuple(int(x) for x in v.split(".")[:2]) for v in re.findall(r"Name: GLIBC_(\d+\.\d+(?:\.\d+)?)", syms)]
    newest = max(versions, default=(0, 0))
    return needed, newest  # type: ignore[return-value]


def check_binary(binary: Path) -> None:
    """Refuse a binary the manylinux_2_31 tag would lie about."""
    needed, newest = glibc_needs(binary)
    foreign = [n for n in needed if n not in ALLOWED_LIBS]
    if foreign:
        raise PackError(
            f"{binary} links {', '.join(foreign)}, which a manylinux wheel cannot assume: "
            "build it with `make release` (libseccomp linked statically)"
        )
    if newest > GLIBC_MAX:
        raise PackError(
            f"{binary} needs GLIBC_{newest[0]}.{newest[1]}, newer than the 2.{GLIBC_MAX[1]} "
            f"of {PLATFORM}: build it with `make release` (linked against glibc {GLIBC_MAX[0]}.{GLIBC_MAX[1]})"
        )


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def files(bin_dir: Path, dist_info: str, data_dir: str, p: Dict[str, object], tag: str) -> Iterable[Tuple[str, bytes, int]]:
    """Every entry of the wheel: (name, bytes, mode)."""
    src = HERE / "src"
    for path in sorted(src.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed", ".json"):
            yield path.relative_to(src).as_posix(), path.read_bytes(), 0o644
    yield "jail_sandbox/policies/data.json", (REPO / "policies" / "data.json").read_bytes(), 0o644
    for name in BINARIES:
        binary = bin_dir / name
        if not binary.is_file():
            raise PackError(f"no {binary}: build it with `make release`")
        check_binary(binary)
        yield f"{data_dir}/scripts/{name}", binary.read_bytes(), 0o755
    yield f"{dist_info}/METADATA", metadata(p).encode("utf-8"), 0o644
    wheel = f"Wheel-Version: 1.0\nGenerator: jail-sandbox pack.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
    yield f"{dist_info}/WHEEL", wheel.encode(), 0o644
    yield f"{dist_info}/LICENSE", b"Apache-2.0\n", 0o644


def pack(bin_dir: Path, out_dir: Path) -> Path:
    p = project()
    name = str(p["name"]).replace("-", "_")
    version = str(p["version"])
    tag = f"py3-none-{PLATFORM}"
    dist_info = f"{name}-{version}.dist-info"
    data_dir = f"{name}-{version}.data"
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{name}-{version}-{tag}.whl"
    tmp = wheel.with_suffix(".whl.tmp")
    record: List[str] = []
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for arc, data, mode in files(bin_dir, dist_info, data_dir, p, tag):
            info = zipfile.ZipInfo(arc, date_time=_EPOCH)
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            record.append(f"{arc},{_record_hash(data)},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=_EPOCH)
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        z.writestr(info, "\n".join(record) + "\n")
    os.replace(tmp, wheel)
    return wheel


# ---------------------------------------------------------------- PEP 517
def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    return pack(REPO / "target" / "release", Path(wheel_directory)).name


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release", help="the folder with jail, jail-mcp, jail-serve")
    ap.add_argument("--out", type=Path, default=REPO / "target" / "wheels")
    args = ap.parse_args(argv)
    try:
        wheel = pack(args.bin, args.out)
    except PackError as e:
        print(f"pack.py: {e}", file=sys.stderr)
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
