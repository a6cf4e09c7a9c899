"""Write a rootfs's package manifest (JSON) to stdout.

    python3 -I manifest.py --flavour NAME [--lock FILE] [--debian FILE] SITE_DIR...

Run by the rootfs's own interpreter (the data flavour runs it in a chroot;
the minimal flavour copies the host's interpreter, which runs it directly),
so `python.version` is the version scripts in the jail get. The jail reads
the result from /usr/share/jail/manifest.json: `jail packages` prints it and
every run reports its sha256 as `isolation.rootfs_id`.

The document is a function of its inputs only: keys and lists are sorted and
nothing about the build (time, host, paths outside the rootfs) goes in, so
the same lock and the same Debian packages give the same bytes. With
--lock, the installed distributions must be exactly the lock's, or this
fails: a rootfs that does not match its lock is never given an identity.
"""

import argparse
import hashlib
import json
import re
import sys
from importlib import metadata

SCHEMA_VERSION = 1


def canonical(name):
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def import_names(dist):
    """Top-level modules a script imports from this distribution (public ones)."""
    names = set()
    top = dist.read_text("top_level.txt")
    if top:
        names.update(line.strip() for line in top.splitlines() if line.strip())
    else:
        for f in dist.files or []:
            first = f.parts[0]
            if len(f.parts) > 1:
                if first.endswith((".dist-info", ".data")) or first in ("__pycache__", "bin"):
                    continue
                names.add(first)
            elif first.endswith(".py"):
                names.add(first[:-3])
            elif first.endswith(".so"):
                names.add(first.split(".", 1)[0])
    return sorted(n.replace("/", ".") for n in names if n.isidentifier() and not n.startswith("_"))


def read_lock(path):
    pins = {}
    with open(path, "rb") as f:
        raw = f.read()
    for line in raw.decode().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = line.split()[0]
        name, sep, version = req.partition("==")
        if not sep:
            sys.exit(f"manifest.py: {path}: `{req}` is not pinned with ==")
        pins[canonical(name)] = version
    return pins, hashlib.sha256(raw).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flavour", required=True)
    ap.add_argument("--lock", help="the lock the site dirs were installed from")
    ap.add_argument("--debian", help="tab-separated `package version` lines (dpkg-query)")
    ap.add_argument("site", nargs="*", help="folders to list installed distributions from")
    args = ap.parse_args()

    packages = {}
    for dist in metadata.distributions(path=args.site):
        name = canonical(dist.metadata["Name"])
        if name in packages:
            sys.exit(f"manifest.py: {name} is installed twice")
        packages[name] = {"name": name, "version": dist.version, "imports": import_names(dist)}

    lock_sha256 = None
    if args.lock:
        pins, lock_sha256 = read_lock(args.lock)
        installed = {n: p["version"] for n, p in packages.items()}
        if installed != pins:
            extra = sorted(set(installed.items()) - set(pins.items()))
            missing = sorted(set(pins.items()) - set(installed.items()))
            sys.exit(f"manifest.py: installed packages differ from {args.lock}: extra {extra}, missing {missing}")

    debian = {}
    if args.debian:
        with open(args.debian, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    pkg, version = line.rstrip("\n").split("\t")
                    debian[pkg] = version

    v = sys.version_info
    doc = {
        "schema_version": SCHEMA_VERSION,
        "flavour": args.flavour,
        "python": {
            "version": f"{v.major}.{v.minor}.{v.micro}",
            "implementation": sys.implementation.name,
            "debian_package": debian.get(f"python{v.major}.{v.minor}") or debian.get(f"python{v.major}.{v.minor}-minimal"),
        },
        "lock_sha256": lock_sha256,
        "packages": [packages[n] for n in sorted(packages)],
        "debian_packages": dict(sorted(debian.items())),
    }
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
