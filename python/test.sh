#!/usr/bin/env bash
# `make test-python`: install the built wheel into the pinned venv
# (python/venv.sh) and run the pytest suite (python/tests) against its
# bundled jail binary and the minimal rootfs, and RemoteSandbox's tests
# against the jail-serve JAIL_SERVE names (with its jail beside it; default
# target/release/jail-serve), which the suite starts on loopback; as root,
# then again as an ordinary user: TEST_USER when that account exists, else a
# spare uid with no account (tests/spare-uid.sh), as `make test` does.
#
#   [JAIL_SERVE=.../jail-serve] python/test.sh WHEEL [PYTEST ARGS...]
set -euo pipefail
wheel=${1:?usage: python/test.sh WHEEL [PYTEST ARGS...]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
venv=$(python/venv.sh)
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
rootfs="$repo/python-rootfs/out/minimal"
[ -d "$rootfs" ] || { echo "python/test.sh: no rootfs at $rootfs: build it with \`make rootfs\`" >&2; exit 1; }
serve=${JAIL_SERVE:-$repo/target/release/jail-serve}
[ -x "$serve" ] && [ -x "$(dirname "$serve")/jail" ] ||
    { echo "python/test.sh: no jail-serve with a jail beside it at $serve: build them with \`make python-serve\`" >&2; exit 1; }

run_suite() { # [COMMAND PREFIX...]: pytest with the venv's python, nothing written to the checkout
    "$@" env PYTHONDONTWRITEBYTECODE=1 JAIL_ROOTFS="$rootfs" JAIL_SERVE="$serve" ${JAIL_MUST_WORK:+JAIL_MUST_WORK=$JAIL_MUST_WORK} \
        "$venv/bin/python" -m pytest -p no:cacheprovider -q "${pytest_args[@]}" python/tests
}
pytest_args=("$@")
echo "== the Python package's suite as $(id -un)"
run_suite

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
# The user reads the suite, README.md and the examples from a staging
# folder (a checkout under /root is not theirs to read), which is also their
# HOME and TMPDIR; the rootfs and jail-serve (with its jail) too, when they
# cannot reach them where they are.
stage=$(mktemp -d /tmp/jail-python-tests.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/repo/python" "$stage/home"
cp -r python/tests "$stage/repo/python/"
cp -r README.md examples "$stage/repo/"
chmod -R a+rX "$stage" && chmod 777 "$stage/home"
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
run_suite "${as[@]}" env -i PATH=/usr/bin:/bin HOME="$stage/home" TMPDIR="$stage/home"
