#!/usr/bin/env bash
# The wheel on other Linux userlands (issue 38 item 1), as a new user there
# would use it: python/userland.sh WHEEL SUITE... (root; `make
# test-python-userlands` passes bullseye and trixie).
#
# Each SUITE is a Debian userland (bullseye: glibc 2.31 and Python 3.9;
# trixie: glibc 2.41 and Python 3.13) made once by debootstrap
# (--variant=minbase, python3 and python3-venv) from the mirror apt is
# configured with (JAIL_DEBIAN_MIRROR overrides it) and cached read-only
# under JAIL_USERLANDS (default /var/cache/jail-userlands). Each test gets
# a throwaway overlay of it, entered with pivot_root in a private mount
# namespace (a chroot would do, but the kernel refuses a user namespace to
# a chrooted process, and the jail needs one), with its own /proc and /tmp,
# and runs as an ordinary user (uid 1001) with nothing of this host's
# Python: a fresh venv, `pip install WHEEL`, then
#   - `Sandbox().run` with no rootfs: the one-line error naming the build;
#   - `jail rootfs build minimal` and `Sandbox().run`;
#   - `jail rootfs build data` (the data stack without root, from the
#     wheels locked for that Python, taken from a warm folder of them:
#     JAIL_WHEELS, downloaded here once per Python and cached) and a pandas
#     chart from `Sandbox().run`;
#   - `jail mcp --help` and `jail serve --help` from the venv.
# Each step's time is printed. The overlay and everything in it go at the
# end.
set -euo pipefail
wheel=$(readlink -f "${1:?usage: python/userland.sh WHEEL SUITE...}")
shift
[ $# -gt 0 ] || set -- bullseye trixie
[ "$(id -u)" = 0 ] || { echo "userland.sh: needs root (debootstrap, mounts)" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${JAIL_USERLANDS:-/var/cache/jail-userlands}
mirror=${JAIL_DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)}
mirror=${mirror:-http://deb.debian.org/debian}

userland() { # SUITE: the cached userland's folder, made when missing
    local suite=$1 dir="$cache/$1"
    if [ ! -f "$dir/.jail-userland" ]; then
        command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
        rm -rf "$dir.new"
        mkdir -p "$cache"
        echo "userland.sh: debootstrap $suite from $mirror (once; cached in $dir)" >&2
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            --keyring=/usr/share/keyrings/debian-archive-keyring.gpg "$suite" "$dir.new" "$mirror" >"$dir.log" 2>&1 \
            || { tail -20 "$dir.log" >&2; echo "userland.sh: debootstrap $suite failed" >&2; exit 1; }
        rm -rf "$dir.new"/var/cache/apt/archives/*.deb "$dir.new"/var/lib/apt/lists/*
        echo 'u:x:1001:1001:u:/home/u:/bin/bash' >>"$dir.new/etc/passwd"
        echo 'u:x:1001:' >>"$dir.new/etc/group"
        mkdir -p "$dir.new/home/u" "$dir.new/wheels" "$dir.new/test"
        chown 1001:1001 "$dir.new/home/u"
        touch "$dir.new/.jail-userland"
        mv "$dir.new" "$dir"
        rm -f "$dir.log"
    fi
    echo "$dir"
}

wheels_for() { # PYVER (e.g. 39): a folder with the data stack's locked wheels for it, cached
    local ver=$1 dir="/var/cache/jail-python/wheels-cp$1" lock="$repo/python-rootfs/wheels/cp$1.lock"
    [ -f "$lock" ] || { echo "userland.sh: no lock for Python $ver ($lock)" >&2; exit 1; }
    if [ ! -f "$dir/.stamp" ] || ! cmp -s "$dir/.stamp" "$lock"; then
        rm -rf "$dir" && mkdir -p "$dir"
        # shellcheck disable=SC2046
        /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
            --python-version "3.${ver#3}" --implementation cp --abi "cp$ver" --abi abi3 --abi none \
            $(for m in $(seq 31 -1 17); do echo --platform manylinux_2_${m}_x86_64; done) \
            --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform any \
            -d "$dir" -r "$lock" >&2
        cp "$lock" "$dir/.stamp"
        chmod -R a+rX "$dir"
    fi
    echo "$dir"
}

# What the user runs inside, as uid 1001, from /test.
cat_inside() {
    cat <<'EOF'
set -euo pipefail
say() { printf '%s %s\n' "$(date +%s.%N | cut -c1-14)" "$*"; }
t0=$(date +%s.%N)
since() { echo "$(date +%s.%N) $1" | awk '{printf "%.1f", $1 - $2}'; }
echo "userland: $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -1), $(python3 --version)"
python3 -m venv ~/venv
~/venv/bin/pip install --quiet --disable-pip-version-check --no-deps /test/*.whl
echo "pip install: $(since "$t0") s"
export PATH=~/venv/bin:$PATH
jail doctor >/dev/null || true
jail mcp --help >/dev/null
jail serve --help >/dev/null
cat >/tmp/run.py <<'PY'
import sys
from jail_sandbox import Sandbox, SandboxSetupError
code = sys.argv[1]
try:
    ex = Sandbox(timeout=60).run(code)
except SandboxSetupError as e:
    print("setup error:", e.message)
    sys.exit(3)
print(ex.status, ex.stdout.strip(), [(a.path, a.media_type) for a in ex.artifacts], ex.result["isolation"]["rootfs"])
if not ex.ok:
    print(ex.stderr[-3000:], file=sys.stderr)
sys.exit(0 if ex.ok else 1)
PY
set +e
out=$(python /tmp/run.py 'print(1)')
code=$?
set -e
[ $code = 3 ] && grep -q 'jail rootfs build minimal' <<<"$out" || { echo "no rootfs: expected the build command, got: $out"; exit 1; }
echo "no rootfs: $out"
t=$(date +%s.%N)
jail rootfs build minimal | tail -1
python /tmp/run.py 'import sys; print(sys.version_info[:2])'
echo "minimal rootfs and a run: $(since "$t") s"
t=$(date +%s.%N)
JAIL_WHEELS=/wheels jail rootfs build data | tail -1
echo "data rootfs without root: $(since "$t") s"
t=$(date +%s.%N)
python /tmp/run.py '
import pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"units": [3, 5, 2]}, index=["n", "s", "e"])
df.plot.bar(); plt.savefig("chart.png"); print(int(df.units.sum()))' | tee /tmp/chart.out
grep -q "ok 10 \[('chart.png', 'image/png')\]" /tmp/chart.out
echo "pandas chart: $(since "$t") s"
jail packages | head -3
echo "userland ok: $(since "$t0") s in all"
EOF
}

if [ "${JAIL_USERLAND_PREPARE_ONLY:-}" = 1 ]; then
    for suite in "$@"; do
        lower=$(userland "$suite")
        wheels_for "$(readlink "$lower/usr/bin/python3" | sed -n 's/^python3\.\([0-9]*\)$/3\1/p')" >/dev/null
    done
    exit 0
fi

status=0
for suite in "$@"; do
    lower=$(userland "$suite")
    # python3 -> python3.X: the userland's Python, whose locked wheels it gets.
    pyver=$(readlink "$lower/usr/bin/python3" | sed -n 's/^python3\.\([0-9]*\)$/3\1/p')
    wheels=$(wheels_for "$pyver")
    work=$(mktemp -d /tmp/jail-userland.XXXXXX)
    mkdir -p "$work/upper" "$work/work" "$work/root"
    cat_inside >"$work/inside.sh"
    echo "== $suite (Python 3.${pyver#3}): the wheel as an ordinary user"
    # Everything mounted here lives in this namespace and goes with it.
    if ! unshare --mount --propagation private -- bash -euc '
        lower=$1 work=$2 wheel=$3 wheels=$4
        root=$work/root
        mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/work" "$root"
        cp /etc/resolv.conf "$root/etc/resolv.conf"
        cp "$wheel" "$work/inside.sh" "$root/test/"
        chmod a+r "$root"/test/*
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mount --rbind /sys "$root/sys"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        mount --bind -o ro "$wheels" "$root/wheels"
        cd "$root"
        mkdir -p .old
        pivot_root . .old
        umount -l /.old
        rmdir /.old
        exec setpriv --reuid=1001 --regid=1001 --clear-groups -- \
            env -i HOME=/home/u PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TMPDIR=/tmp bash /test/inside.sh
    ' - "$lower" "$work" "$wheel" "$wheels"; then
        echo "== $suite: FAILED" >&2
        status=1
    fi
    rm -rf "$work"
done
exit $status
