#!/usr/bin/env bash
# The data flavour without root (flavours/data.sh runs this for an ordinary
# user): the minimal flavour (the host's /usr/bin/python3 and its standard
# library) with the analysis and office stack of data.in installed on top
# from the locked wheels for that interpreter, wheels/cpXY.lock, filled into
# "$1". No debootstrap, no chroot, no root: pip and the host's Python.
#
# Every wheel is checked against its sha256 in the lock (`--require-hashes
# --no-deps --only-binary=:all:`: no resolution, no build, exactly the
# lock's files), taken from pip's cache, a local folder of wheels
# (JAIL_WHEELS=DIR: that folder alone, nothing from the network) or the
# package index. As in the root build, everything is done at build time:
# bytecode is compiled (with the build folder stripped from its paths, so a
# traceback names the jail's own), matplotlib's font list is built, and the
# manifest must list exactly the lock.
set -euo pipefail
root=$1
here=$(cd "$(dirname "$0")" && pwd)
share=/usr/share/jail
die() { echo "data-wheels.sh: $*" >&2; exit 1; }

py=/usr/bin/python3
[ -x "$py" ] || die "$py not found: install python3, or build as root (debootstrap: sudo jail rootfs build data)"
ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
tag="cp${ver/./}"
lock="$here/wheels/$tag.lock"
[ -f "$lock" ] || die "no locked wheels for Python $ver (have: $(ls "$here/wheels" | sed 's/\.lock$//' | tr '\n' ' ')): build as root instead (sudo jail rootfs build data: Debian's Python 3.11 and data.lock)"
[ "$(uname -m)" = x86_64 ] || die "the locked wheels are for x86_64, this is $(uname -m)"

# pip: the caller's (PIP), else the one of the python3 on PATH (a venv's),
# else the system interpreter's. It only downloads and unpacks: the wheels
# are for the rootfs's interpreter, named by the tags below.
if [ -n "${PIP:-}" ]; then
    pip=($PIP)
elif python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
else
    pip=("$py" -m pip)
fi
"${pip[@]}" --version >/dev/null 2>&1 || die "no pip: run it from a venv (python3 -m venv), or install python3-pip"

echo "data-wheels.sh: the minimal flavour (Python $ver), then $(grep -vc '^#' "$lock") locked wheels"
bash "$here/flavours/minimal.sh" "$root"

# Where this interpreter looks for packages first (Debian:
# /usr/local/lib/python3.X/dist-packages); the same inside the jail, since
# it is the same interpreter at the same path.
site=$("$py" -c 'import site; print(site.getsitepackages()[0])')
case "$site" in /*) ;; *) die "the interpreter's site folder is $site, not an absolute path" ;; esac

source=()
if [ -n "${JAIL_WHEELS:-}" ]; then
    [ -d "$JAIL_WHEELS" ] || die "JAIL_WHEELS=$JAIL_WHEELS is not a folder"
    source=(--no-index --find-links "$JAIL_WHEELS")
fi
plats=()
for minor in $(seq 31 -1 17); do plats+=(--platform "manylinux_2_${minor}_x86_64"); done
plats+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform any)
"${pip[@]}" install --quiet --disable-pip-version-check --no-warn-script-location \
    --require-hashes --no-deps --only-binary=:all: --no-compile "${source[@]}" \
    --python-version "$ver" --implementation cp --abi "$tag" --abi abi3 --abi none "${plats[@]}" \
    --target "$root$site" -r "$lock" \
    || die "pip could not install the locked wheels (above); with JAIL_WHEELS, the folder must hold every wheel of $lock"
# Console scripts name the build's interpreter path; the packages' own test
# suites are never imported by a script (a fifth of the size).
rm -rf "$root$site/bin"
find "$root$site" -depth -type d -name tests -prune -exec rm -rf {} +

# The system libraries the wheels' extensions link and may assume by the
# manylinux policy (libstdc++, libgcc_s, ...): the host's, copied beside
# the interpreter's as the minimal flavour copies those. What a wheel
# vendors (numpy.libs, ...) is found inside the rootfs and left alone.
# shellcheck source=libs.sh
. "$here/libs.sh"
needed=$(find "$root$site" -type f -name '*.so*' -print0 | xargs -0 -r -n 64 ldd 2>/dev/null || true)
# ldd run on a vendored library alone may miss its vendored neighbour,
# which the loader finds beside it at run time: only a name the wheels do
# not carry is missing.
missing=""
for name in $(awk '/=> not found/ {print $1}' <<<"$needed" | sort -u); do
    [ -n "$(find "$root$site" -name "$name" -print -quit)" ] || missing="$missing $name"
done
[ -z "$missing" ] || die "the host lacks libraries the locked wheels need:$missing (install them, or build as root)"
while read -r lib; do
    [ -n "$lib" ] && copy_lib "$lib"
done < <(awk '/=> \// {print $3}' <<<"$needed" | grep -v "^$root/" | sort -u)
/sbin/ldconfig -r "$root" 2>/dev/null || true

# sitecustomize (data-site/sitecustomize.py says why) in the standard
# library's folder, where the interpreter imports it from: Debian's is a
# link to /etc/python3.X/sitecustomize.py, which outside a chroot would
# name the host's file, so it is replaced by a plain file.
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
custom="$root$stdlib/sitecustomize.py"
rm -f "$custom"
install -m 0644 "$here/data-site/sitecustomize.py" "$custom"

# Bytecode, by this interpreter (the rootfs's own). unchecked-hash: the
# rootfs is read-only, so sources are never stat'ed to validate it. -s/-p:
# the paths compiled in are the jail's, not the build folder's.
"$py" -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$root" -p / "$root$site" >/dev/null \
    || die "compileall failed"
# -f: replaces what the minimal flavour compiled for the host's file.
"$py" -m compileall -q -f --invalidation-mode unchecked-hash -s "$root" -p / "$custom" >/dev/null || die "compileall failed"

# Matplotlib's font list, built by this interpreter over the rootfs's
# packages (-S: none of the host's), keeping only the fonts the rootfs has
# (its own, which it names relative to its mpl-data, and any under the
# rootfs, named by their path inside it); sitecustomize copies it into the
# jail's MPLCONFIGDIR.
fonts=$(mktemp -d)
trap 'rm -rf "$fonts"' EXIT
env -i PATH=/usr/bin:/bin HOME="$fonts" MPLCONFIGDIR="$fonts" MPLBACKEND=Agg PYTHONPATH="$root$site" \
    "$py" -S -c 'import matplotlib.font_manager' >/dev/null 2>&1 || die "matplotlib did not import"
mkdir -p "$root$share/matplotlib"
"$py" -S - "$fonts" "$root" "$root$share/matplotlib" <<'PY' || die "matplotlib built no font list"
import glob, json, os, sys
found, root, dest = sys.argv[1:]
lists = glob.glob(os.path.join(found, "fontlist-v*.json"))
if not lists:
    sys.exit(1)
for path in lists:
    with open(path) as f:
        doc = json.load(f)
    for key in ("ttflist", "afmlist"):
        kept = []
        for e in doc.get(key, []):
            name = e.get("fname", "")
            if not os.path.isabs(name):
                kept.append(e)  # matplotlib's own fonts, relative to its mpl-data
            elif name.startswith(root + "/"):
                kept.append(dict(e, fname=name[len(root):]))
        doc[key] = kept
    with open(os.path.join(dest, os.path.basename(path)), "w") as f:
        json.dump(doc, f, indent=2)
PY

# The manifest, as the root build writes it: this interpreter, the Debian
# packages it was copied from (the minimal flavour's), the installed
# distributions, which must be exactly the lock's.
install -m 0644 "$lock" "$root$share/data.lock"
debs="$fonts/debian.tsv"
"$py" -c '
import json, sys
m = json.load(open(sys.argv[1]))
for name, version in sorted(m.get("debian_packages", {}).items()):
    print(f"{name}\t{version}")
' "$root$share/manifest.json" > "$debs"
"$py" -I "$here/manifest.py" --flavour data --lock "$root$share/data.lock" --debian "$debs" "$root$site" \
    > "$root$share/manifest.json.new" || die "what was installed is not the lock (above)"
mv "$root$share/manifest.json.new" "$root$share/manifest.json"
printf 'data python%s\n' "$ver" > "$root/etc/jail-rootfs"
