#!/usr/bin/env bash
# Install a built `jail` (and the `jail-mcp` beside it) into PREFIX: scripts/install.sh BINARY PREFIX
#
# The binary needs nothing beside it: the default policy and the rootfs
# recipes are compiled in. Installed: PREFIX/bin/jail, and for reading,
# PREFIX/share/jail/policies (example policies for --policy) and
# PREFIX/share/doc/jail (README.md, policies/README.md). A rootfs is built
# afterwards by the user: `jail rootfs build minimal` (root: into
# /var/lib/jail/rootfs; others: into ~/.local/share/jail/rootfs).
set -euo pipefail
bin=${1:?usage: scripts/install.sh BINARY PREFIX}
prefix=${2:?usage: scripts/install.sh BINARY PREFIX}
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$bin" ] || { echo "install.sh: $bin is not an executable; build it first (make release)" >&2; exit 2; }
install -D -m 0755 "$bin" "$prefix/bin/jail"
# `jail mcp` runs the MCP server jail-mcp from beside the jail binary.
mcp="$(dirname "$bin")/jail-mcp"
[ -x "$mcp" ] || { echo "install.sh: no $mcp beside $bin; build it first (make release)" >&2; exit 2; }
install -D -m 0755 "$mcp" "$prefix/bin/jail-mcp"
# `jail serve` runs the HTTP service jail-serve from beside the jail binary.
serve="$(dirname "$bin")/jail-serve"
[ -x "$serve" ] && install -D -m 0755 "$serve" "$prefix/bin/jail-serve"
# A pool's template loads libjail.so from beside the jail binary.
lib="$(dirname "$bin")/libjail.so"
[ -f "$lib" ] && install -D -m 0755 "$lib" "$prefix/bin/libjail.so"
install -d -m 0755 "$prefix/share/jail/policies" "$prefix/share/doc/jail"
install -m 0644 "$here"/policies/*.json "$prefix/share/jail/policies/"
install -m 0644 "$here/README.md" "$prefix/share/doc/jail/README.md"
install -m 0644 "$here/policies/README.md" "$prefix/share/doc/jail/policies.md"
echo "installed $prefix/bin/jail; build a rootfs with: $prefix/bin/jail rootfs build minimal"
