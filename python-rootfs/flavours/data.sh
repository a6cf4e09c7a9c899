#!/usr/bin/env bash
# The data flavour: Debian bookworm (debootstrap --variant=minbase, python3)
# with the analysis and office stack from data.lock (numpy, pandas,
# matplotlib, seaborn, scipy, scikit-learn, openpyxl, python-pptx,
# python-docx, pillow, tabulate and what they need), filled into "$1".
#
# As root: needs debootstrap and the network: the Debian mirror configured
# in /etc/apt/sources.list* (or JAIL_DEBIAN_MIRROR) and PyPI for the wheels,
# each checked against its sha256 in data.lock. As an ordinary user (or with
# JAIL_DATA_FROM=wheels) it is data-wheels.sh instead: the host's Python and
# the wheels locked for it in wheels/, no root.
# Everything is done at build time: bytecode is compiled by the rootfs's own
# interpreter and matplotlib's font list is built, so nothing is compiled or
# written into the rootfs at run time.
#
# The finished tree is cached under JAIL_ROOTFS_CACHE (default
# /var/cache/jail-rootfs) keyed by the sha256 of every input of this recipe;
# a build with the same inputs copies the cache instead (set
# JAIL_ROOTFS_NO_CACHE=1 to build from scratch and refresh it).
set -euo pipefail
root=$1
here=$(cd "$(dirname "$0")/.." && pwd)
suite=bookworm
pyver=3.11
site=/usr/local/lib/python$pyver/dist-packages
share=/usr/share/jail

die() { echo "data.sh: $*" >&2; exit 1; }
# An ordinary user (or JAIL_DATA_FROM=wheels) gets the same stack without
# root: the host's Python with the locked wheels on top (data-wheels.sh).
if [ "$(id -u)" != 0 ] || [ "${JAIL_DATA_FROM:-}" = wheels ]; then
    exec bash "$here/data-wheels.sh" "$root"
fi
command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap"
command -v unshare >/dev/null || die "unshare not found: apt-get install util-linux"

# Everything below runs in a private mount namespace: the mounts debootstrap
# and the chroot steps make vanish with it, even when the build is killed, so
# none can be left on the host (or under a tree that build.sh later removes).
if [ "${JAIL_DATA_IN_NS:-}" != 1 ]; then
    exec env JAIL_DATA_IN_NS=1 unshare --mount --propagation private -- bash "$0" "$@"
fi

# ------------------------------------------------------------------ cache
inputs=("$here/data.lock" "$here/flavours/data.sh" "$here/wheel-target.sh" "$here/manifest.py" "$here/data-site/sitecustomize.py")
key=$(cat "${inputs[@]}" | sha256sum | cut -c1-16)
cache_root=${JAIL_ROOTFS_CACHE:-/var/cache/jail-rootfs}
cache="$cache_root/data-$key"
if [ "${JAIL_ROOTFS_NO_CACHE:-}" != 1 ] && [ -f "$cache/$share/manifest.json" ]; then
    echo "data.sh: using the cached build $cache (inputs unchanged)"
    cp -a "$cache/." "$root/"
    exit 0
fi

# ------------------------------------------------------------------ debian
# The configured mirror for the suite and for its security updates, read
# from apt's own sources (one-line and deb822), so the build uses only the
# package sources this host already trusts.
read_sources() {
    /usr/bin/python3 - "$suite" <<'PY'
import glob, sys
suite = sys.argv[1]
found = {}
def add(types, uris, suites, comps):
    if "deb" not in types or "main" not in comps:
        return
    for s in suites:
        for u in uris:
            found.setdefault(s, u.rstrip("/"))
for path in sorted(glob.glob("/etc/apt/sources.list") + glob.glob("/etc/apt/sources.list.d/*.list")):
    for line in open(path, encoding="utf-8", errors="replace"):
        parts = line.split("#", 1)[0].split()
        if len(parts) >= 4 and parts[0] == "deb":
            words = [p for p in parts[1:] if not p.startswith("[")]
            if len(words) >= 3:
                add(["deb"], [words[0]], [words[1]], words[2:])
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in open(path, encoding="utf-8", errors="replace").read().split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.split()
        if fields.get("enabled", ["yes"])[0].lower() == "no":
            continue
        add(fields.get("types", []), fields.get("uris", []), fields.get("suites", []), fields.get("components", []))
for s in (suite, suite + "-updates", suite + "-security"):
    if s in found:
        print(s, found[s])
PY
}
mapfile -t sources < <(read_sources)
mirror=${JAIL_DEBIAN_MIRROR:-}
for line in "${sources[@]}"; do
    [ "${line%% *}" = "$suite" ] && [ -z "$mirror" ] && mirror=${line#* }
done
[ -n "$mirror" ] || die "no Debian $suite mirror in /etc/apt/sources.list*: add one, or set JAIL_DEBIAN_MIRROR=URL"

echo "data.sh: debootstrap $suite from $mirror"
debootstrap --variant=minbase --include=python3 --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
    "$suite" "$root" "$mirror" > "$root.debootstrap.log" 2>&1 \
    || { tail -20 "$root.debootstrap.log" >&2; die "debootstrap failed (log above: $root.debootstrap.log)"; }
rm -f "$root.debootstrap.log"

# The point release debootstrap installs, brought up to date with the
# configured -updates and -security suites: the interpreter that runs
# untrusted code gets its security fixes.
{
    echo "deb $mirror $suite main"
    for line in "${sources[@]}"; do
        s=${line%% *}
        [ "$s" = "$suite" ] || echo "deb ${line#* } $s main"
    done
} > "$root/etc/apt/sources.list"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root "$@"; }
mount -t proc proc "$root/proc"
in_root apt-get -qq update
in_root env DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get -qq -y -o Dpkg::Use-Pty=0 upgrade >/dev/null 2>&1 \
    || die "apt-get upgrade in the rootfs failed (rerun it by hand: chroot $root apt-get upgrade)"
in_root apt-get -qq clean
umount "$root/proc"

# What the jail never uses: package lists and caches, docs, man pages,
# translations, logs; home folders (the sandbox's HOME is /tmp) and device
# nodes (the jail mounts its own /dev).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
    "$root"/var/log/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/root "$root"/home "$root"/srv "$root"/opt "$root"/media "$root"/mnt
rm -f "$root"/etc/apt/sources.list
# No one logs in: no password files (build.sh makes the whole tree readable,
# and a readable shadow file, even one without passwords, is a bad example).
rm -f "$root"/etc/shadow "$root"/etc/shadow- "$root"/etc/gshadow "$root"/etc/gshadow- \
    "$root"/etc/passwd- "$root"/etc/group- "$root"/var/cache/debconf/passwords.dat

# The sandbox's uid and gid (1000 by default) get a name, as in the minimal
# flavour, so pwd and getpass lookups inside the jail succeed.
grep -q '^sandbox:' "$root/etc/passwd" || echo 'sandbox:x:1000:1000:sandbox:/tmp:/usr/sbin/nologin' >> "$root/etc/passwd"
grep -q '^sandbox:' "$root/etc/group" || echo 'sandbox:x:1000:' >> "$root/etc/group"
# debootstrap copied the build host's name and resolver; the jail has its
# own hostname and no network, and carries nothing of the build host.
printf '127.0.0.1 localhost jail\n::1 localhost\n' > "$root/etc/hosts"
printf 'jail\n' > "$root/etc/hostname"
: > "$root/etc/resolv.conf"

got=$(chroot "$root" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$got" = "$pyver" ] || die "the rootfs's python is $got, but data.lock is for $pyver: update pyver here and wheel-target.sh, then run lock-data.sh"

# ------------------------------------------------------------------ wheels
# The host's pip installs into the rootfs for the rootfs's interpreter
# (wheel-target.sh), exactly the files data.lock names: binary wheels only,
# no dependency resolution at install time, every file hash-checked.
# shellcheck source=../wheel-target.sh
. "$here/wheel-target.sh"
pip=(${PIP:-python3 -m pip})
"${pip[@]}" --version >/dev/null 2>&1 || die "no pip (${pip[*]}): install it (apt-get install python3-pip) or set PIP"
echo "data.sh: installing $(grep -vc '^#' "$here/data.lock") locked wheels"
"${pip[@]}" install --quiet --disable-pip-version-check --no-warn-script-location --root-user-action=ignore \
    --require-hashes --no-deps --only-binary=:all: --no-compile \
    "${WHEEL_TARGET[@]}" --target "$root$site" -r "$here/data.lock"
# Console scripts carry the host interpreter's path; the jail runs scripts,
# not these tools. The packages' own test suites (a fifth of the size, and of
# the compile time) are never imported by a script.
rm -rf "$root$site/bin"
find "$root$site" -depth -type d -name tests -prune -exec rm -rf {} +

# Debian's sitecustomize only looks for apport; ours prepares matplotlib's
# cache dir and joblib's core count when they are first imported
# (data-site/sitecustomize.py says why and how).
install -m 0644 "$here/data-site/sitecustomize.py" "$root/etc/python$pyver/sitecustomize.py"

# Bytecode, by the rootfs's own interpreter. unchecked-hash: the rootfs is
# read-only, so the sources never change and are never stat'ed to validate.
mount -t tmpfs -o size=64m tmpfs "$root/dev/shm"
in_root python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash "$site" >/dev/null
# sitecustomize is imported through its /usr/lib symlink, so its bytecode
# lives beside that path; -f replaces what Debian compiled for the old file.
in_root python3 -m compileall -q -f --invalidation-mode unchecked-hash /usr/lib/python$pyver/sitecustomize.py >/dev/null
umount "$root/dev/shm"
# Every module has its bytecode (Debian compiled the standard library when
# it installed it): a missing .pyc would be compiled again, in memory, on
# every run.
in_root python3 - "$site" "/usr/lib/python$pyver" <<'PY' || die "modules without bytecode (listed above)"
import importlib.util, os, sys
missing = [os.path.join(d, f) for top in sys.argv[1:] for d, _, files in os.walk(top) for f in files
           if f.endswith(".py") and not os.path.exists(importlib.util.cache_from_source(os.path.join(d, f)))]
if missing:
    print("\n".join(missing[:20]), file=sys.stderr)
sys.exit(1 if missing else 0)
PY

# Matplotlib's font list, built once here and copied into the writable
# MPLCONFIGDIR by sitecustomize when a script imports matplotlib.
mkdir -p "$root$share/matplotlib"
in_root env MPLCONFIGDIR=$share/matplotlib MPLBACKEND=Agg python3 -c 'import matplotlib.font_manager'
ls "$root$share"/matplotlib/fontlist-v*.json >/dev/null 2>&1 || die "matplotlib built no font list"
rm -rf "$root$share/matplotlib"/*.matplotlib-lock

# ------------------------------------------------------------------ manifest
install -m 0644 "$here/data.lock" "$root$share/data.lock"
chroot "$root" dpkg-query -W -f='${Package}\t${Version}\n' > "$root$share/debian-packages.tsv"
install -m 0644 "$here/manifest.py" "$root/tmp/manifest.py"
in_root python3 -I /tmp/manifest.py --flavour data --lock "$share/data.lock" \
    --debian "$share/debian-packages.tsv" "$site" /usr/lib/python3/dist-packages > "$root$share/manifest.json.new"
mv "$root$share/manifest.json.new" "$root$share/manifest.json"
rm -f "$root/tmp/manifest.py" "$root$share/debian-packages.tsv"
find "$root/tmp" "$root/var/tmp" -mindepth 1 -delete
printf 'data python%s\n' "$pyver" > "$root/etc/jail-rootfs"
rm -rf "$root"/dev/*

# ------------------------------------------------------------------ cache
# Saved whole and renamed into place, so a cache entry is complete or absent;
# older entries of this flavour go (one build's worth of disk, not many).
chmod -R a+rX "$root"
mkdir -p "$cache_root"
rm -rf "$cache.new"
cp -a "$root" "$cache.new"
for old in "$cache_root"/data-*; do
    [ "$old" = "$cache.new" ] || rm -rf "$old"
done
mv "$cache.new" "$cache"
echo "data.sh: cached as $cache"
