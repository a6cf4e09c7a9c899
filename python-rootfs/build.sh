#!/usr/bin/env bash
# Build a Python root filesystem for the jail: python-rootfs/build.sh FLAVOUR [DEST]
#
# Each flavour is a script in flavours/ that fills the folder it is given.
# The build goes into DEST.new (DEST defaults to out/FLAVOUR) and is renamed
# to DEST only when complete, so a failed or interrupted build never leaves
# a half rootfs where the jail would use it. `jail rootfs build` runs a copy
# of these recipes embedded in the binary, with DEST its install folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
flavour=${1:-minimal}
recipe="$here/flavours/$flavour.sh"
[ -f "$recipe" ] || { echo "build.sh: no flavour '$flavour' (have: $(ls "$here/flavours" | sed 's/\.sh$//' | tr '\n' ' '))" >&2; exit 2; }
out=${2:-"$here/out/$flavour"}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
work="$out.new"
mkdir -p "$(dirname "$out")"
rm -rf "$work"
mkdir -p "$work"
start=$(date +%s%N)
bash "$recipe" "$work"
# The jail binds the rootfs read-only; make sure any user can read it (a run
# as root maps the sandbox to an unprivileged host uid).
chmod -R a+rX "$work"
rm -rf "$out"
mv "$work" "$out"
end=$(date +%s%N)
ms=$(( (end - start) / 1000000 ))
printf 'rootfs %s: %s in %d.%03d s\n' "$flavour" "$(du -sh "$out" | cut -f1)" $((ms / 1000)) $((ms % 1000))
