#!/usr/bin/env bash
# Install what building and testing jail needs from Debian's packages.
# Idempotent: does nothing when everything is present.
set -euo pipefail
pkgs=(libseccomp-dev pkg-config python3 gcc make debootstrap)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust (https://rustup.rs)" >&2; exit 1; }
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
