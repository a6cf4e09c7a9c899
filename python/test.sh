#!/usr/bin/env bash
# `make test-python`: install the built wheel into the pinned venv
# (python/venv.sh) and run the pytest suite (python/tests) against its
# bundled binaries, the minimal rootfs, a data rootfs the suite builds
# without root from the locked wheels (a warm wheel folder made here:
# JAIL_WHEELS), and RemoteSandbox's tests against the jail-serve JAIL_SERVE
# names (with its jail beside it; default target/release/jail-serve), which
# the suite starts on loopback; as root, then again as an ordinary user:
# TEST_USER when that account exists, else a spare uid with no account
# (tests/spare-uid.sh), as `make test` does.
#
# Each half runs with a TMPDIR of its own, which must be empty when the
# suite is done: nothing a test, a run, a pool or a service made is left
# (issue 38 item 5). The figures the suite measures are printed at its end.
#
#   [JAIL_SERVE=.../jail-serve] python/test.sh WHEEL [PYTEST ARGS...]
set -euo pipefail
wheel=${1:?usage: python/test.sh WHEEL [PYTEST ARGS...]}
wheel=$(readlink -f "$wheel")
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
venv=$(python/venv.sh)
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
rootfs="$repo/python-rootfs/out/minimal"
[ -d "$rootfs" ] || { echo "python/test.sh: no rootfs at $rootfs: build it with \`make rootfs\`" >&2; exit 1; }
serve=${JAIL_SERVE:-$repo/target/release/jail-serve}
[ -x "$serve" ] && [ -x "$(dirname "$serve")/jail" ] ||
    { echo "python/test.sh: no jail-serve with a jail beside it at $serve: build them with \`make release\`" >&2; exit 1; }

# The warm wheel cache: the data stack's locked wheels for this host's
# Python (the one a data rootfs built without root runs), downloaded once
# and kept, hash-checked by pip, readable by every user.
ver=$(/usr/bin/python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')
if [ "$(id -u)" = 0 ]; then cache=/var/cache/jail-python; else cache="${XDG_CACHE_HOME:-$HOME/.cache}/jail-python"; fi
wheels="$cache/wheels-cp$ver"
lock="$repo/python-rootfs/wheels/cp$ver.lock"
if [ ! -f "$wheels/.stamp" ] || ! cmp -s "$wheels/.stamp" "$lock"; then
    rm -rf "$wheels" && mkdir -p "$wheels"
    "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
        --python-version "3.${ver#3}" --implementation cp --abi "cp$ver" --abi abi3 --abi none \
        $(for m in $(seq 31 -1 17); do echo --platform manylinux_2_${m}_x86_64; done) \
        --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform any \
        -d "$wheels" -r "$lock"
    cp "$lock" "$wheels/.stamp"
    chmod -R a+rX "$cache"
fi

work=$(mktemp -d /tmp/jail-python-tests.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 711 "$work"

# One data rootfs for both halves, built the way an ordinary user builds it
# (the host's Python and the locked wheels; JAIL_DATA_FROM=wheels as root),
# unless JAIL_DATA_ROOTFS names one. The quickstart test builds its own, timed.
if [ -z "${JAIL_DATA_ROOTFS:-}" ]; then
    env -u JAIL_ROOTFS JAIL_WHEELS="$wheels" JAIL_DATA_FROM=wheels "$venv/bin/jail" rootfs build data --dest "$work/data" | tail -1
    export JAIL_DATA_ROOTFS="$work/data"
fi

run_suite() { # TMPDIR [COMMAND PREFIX...]: pytest with the venv's python, nothing written to the checkout
    local tmp=$1
    shift
    "$@" env PYTHONDONTWRITEBYTECODE=1 JAIL_ROOTFS="$rootfs" JAIL_SERVE="$serve" JAIL_WHEEL="$wheel" JAIL_WHEELS="$wheels" \
        JAIL_DATA_ROOTFS="$JAIL_DATA_ROOTFS" \
        TMPDIR="$tmp" ${JAIL_MUST_WORK:+JAIL_MUST_WORK=$JAIL_MUST_WORK} \
        "$venv/bin/python" -m pytest -p no:cacheprovider --basetemp="$tmp/../pytest-$(basename "$tmp")" -q -rs "${pytest_args[@]}" python/tests
    local left
    left=$(ls -A "$tmp")
    if [ -n "$left" ]; then
        echo "python/test.sh: the suite left this in its TMPDIR ($tmp): $left" >&2
        return 1
    fi
}
pytest_args=("$@")
echo "== the Python package's suite as $(id -un)"
mkdir -m 711 "$work/tmp-root"
run_suite "$work/tmp-root"

[ "$(id -u)" = 0 ] || exit 0
who=${TEST_USER:-jailtest}
if id "$who" >/dev/null 2>&1 && [ "$(id -u "$who")" != 0 ]; then
    as=(setpriv --reuid="$(id -u "$who")" --regid="$(id -g "$who")" --init-groups --)
    label=$who
else
    uid=$(tests/spare-uid.sh)
    as=(setpriv --reuid="$uid" --regid="$uid" --clear-groups --)
    label="uid $uid (no account)"
fi
# The user reads the suite, README.md, the examples, the policies, the
# shared test fixtures (tests/shows.py) and the package's sources (the API
# reference check) from a staging folder (a checkout under /root is not
# theirs to read); their HOME and TMPDIR are in it too; the rootfs, the
# wheel and jail-serve (with its jail) as well, when they cannot reach them
# where they are.
stage="$work/user"
mkdir -p "$stage/repo/python" "$stage/repo/tests" "$stage/home" "$stage/tmp"
cp -r python/tests python/src python/apidoc.py python/API.md python/README.md "$stage/repo/python/"
cp -r README.md examples policies "$stage/repo/"
cp tests/shows.py "$stage/repo/tests/"
cp "$wheel" "$stage/"
wheel="$stage/$(basename "$wheel")"
chmod -R a+rX "$stage" && chmod 777 "$stage/home" "$stage/tmp"
chmod 777 "$stage"
if ! "${as[@]}" test -r "$rootfs/usr/bin/python3"; then
    cp -a "$rootfs" "$stage/rootfs"
    chmod a+rx "$stage/rootfs"
    rootfs="$stage/rootfs"
fi
if ! "${as[@]}" test -x "$serve" -a -x "$(dirname "$serve")/jail"; then
    mkdir "$stage/bin"
    cp "$serve" "$(dirname "$serve")/jail" "$stage/bin/"
    chmod a+rx "$stage/bin" "$stage/bin/"*
    serve="$stage/bin/$(basename "$serve")"
fi
echo "== the Python package's suite again as $label"
cd "$stage/repo"
run_suite "$stage/tmp" "${as[@]}" env -i PATH=/usr/bin:/bin HOME="$stage/home"
