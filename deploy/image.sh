#!/usr/bin/env bash
# Build the `jail serve` container image from deploy/Containerfile:
#   deploy/image.sh            (make image; JAIL_IMAGE names it, default localhost/jail-serve:dev)
#
# The image is FROM scratch and holds only what the two binaries need to
# run: `jail` and `jail-serve` (target/release, `make release`), the shared
# libraries they link (glibc, libgcc_s, libseccomp), taken out of Debian's
# own .deb packages at the versions installed on this build host (the ones
# the binaries were built and tested against) with their copyright files,
# the data rootfs (python-rootfs/out/data, `make rootfs-data`), the pod
# policy (policies/default.json with identity.root_host_uids moved into a
# pod user namespace's 65536 ids, deploy/k8s/README.md "Identity"), and a
# passwd/group naming root and the image's default user 10001. No shell, no
# package manager, no other program.
#
# Staging happens in target/deploy/ (the context is rebuilt each time; the
# .debs are kept). Installs podman and buildah from Debian when neither is
# there and this runs as root, as tests/mcp/setup.sh does for its venv.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${JAIL_IMAGE:-localhost/jail-serve:dev}
out=target/deploy
ctx=$out/context
debs=$out/debs
bin=target/release
# The pod user namespace's ids are 0..65535; runs take host uids from this
# range (policies/README.md: identity.root_host_uids). 65534 and 65535 are
# refused by the policy; 10001 is the image's default user, below the range.
run_uids_first=32768
run_uids_count=32766
run_gid=32767

die() { echo "image: $*" >&2; exit 1; }

for b in jail jail-serve; do
    [ -x "$bin/$b" ] || die "no $bin/$b: build it first (make release)"
done
rootfs=$(readlink -f python-rootfs/out/data) || true
[ -n "$rootfs" ] && [ -x "$rootfs/usr/bin/python3" ] \
    || die "no data rootfs at python-rootfs/out/data: build it first (make rootfs-data)"

if command -v podman >/dev/null; then
    builder=(podman build)
elif command -v buildah >/dev/null; then
    builder=(buildah bud)
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "image: installing podman and buildah from Debian" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah >/dev/null
    builder=(podman build)
else
    die "neither podman nor buildah is installed: apt-get install podman buildah"
fi

# ---- the libraries, out of Debian's packages
pkgs=(libc6 libgcc-s1 libseccomp2)
mkdir -p "$debs"
rm -rf "$out/debroot"
mkdir -p "$out/debroot"
manifest=()
unpack() { # PACKAGE: download the installed version's .deb (kept) and unpack it
    local p=$1 v a deb
    v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) || die "$p is not installed here; the binaries link it"
    a=$(dpkg-query -W -f='${Architecture}' "$p")
    deb="$debs/${p}_${v//:/%3a}_${a}.deb"
    if [ ! -f "$deb" ]; then
        # The version installed here: the binaries were built against it.
        (cd "$debs" && apt-get download -qq "$p=$v" 2>/dev/null) \
            || { apt-get update -qq && (cd "$debs" && apt-get download -qq "$p=$v"); } \
            || die "cannot download $p=$v from the configured Debian sources"
    fi
    [ -f "$deb" ] || die "apt-get download left no $deb"
    dpkg-deb -x "$deb" "$out/debroot"
    manifest+=("$p $v $(sha256sum "$deb" | cut -d' ' -f1)")
}
for p in "${pkgs[@]}"; do
    unpack "$p"
done
# A package whose doc folder links to another's (libgcc-s1 -> gcc-12-base)
# has its copyright there: bring that package's too.
doc_pkgs=()
for p in "${pkgs[@]}"; do
    d="$out/debroot/usr/share/doc/$p"
    if [ -L "$d" ]; then
        other=$(basename "$(readlink "$d")")
        unpack "$other"
        doc_pkgs+=("$other")
    else
        doc_pkgs+=("$p")
    fi
done

rm -rf "$ctx"
mkdir -p "$ctx/base/etc" "$ctx/base/tmp" "$ctx/base/usr/share/doc/jail-image" \
    "$ctx/bin" "$ctx/policy" "$ctx/python"
chmod 1777 "$ctx/base/tmp"

# Copy one library (and the file a symlink names) from the unpacked
# packages to the same path in the image.
copy_lib() {
    local rel=$1
    mkdir -p "$ctx/base/$(dirname "$rel")"
    cp -P "$out/debroot/$rel" "$ctx/base/$rel"
    if [ -L "$out/debroot/$rel" ]; then
        local target
        target=$(readlink "$out/debroot/$rel")
        case $target in /*) copy_lib "${target#/}" ;; *) copy_lib "$(dirname "$rel")/$target" ;; esac
    fi
}
find_lib() { # NAME -> path inside the packages, relative
    local d
    for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64; do
        [ -e "$out/debroot/$d/$1" ] && { echo "$d/$1"; return; }
    done
    die "no package of ${pkgs[*]} holds $1, which the binaries need"
}
# Every library in the binaries' NEEDED closure, and the interpreter.
todo=($(readelf -d "$bin/jail" "$bin/jail-serve" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | sort -u))
done_libs=" "
while [ ${#todo[@]} -gt 0 ]; do
    lib=${todo[0]}
    todo=("${todo[@]:1}")
    case $done_libs in *" $lib "*) continue ;; esac
    done_libs+="$lib "
    rel=$(find_lib "$lib")
    copy_lib "$rel"
    todo+=($(readelf -d "$(readlink -f "$out/debroot/$rel")" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'))
done
interp=$(readelf -l "$bin/jail" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
[ -n "$interp" ] || die "cannot read the program interpreter of $bin/jail"
copy_lib "${interp#/}"
for p in "${doc_pkgs[@]}"; do
    install -D -m 0644 "$out/debroot/usr/share/doc/$p/copyright" "$ctx/base/usr/share/doc/$p/copyright"
done
printf '%s\n' "# Debian packages whose files this image holds: package version sha256-of-.deb" \
    "${manifest[@]}" > "$ctx/base/usr/share/doc/jail-image/packages.txt"

printf '%s\n' 'root:x:0:0:root:/nonexistent:/nonexistent' 'jail:x:10001:10001:jail serve:/nonexistent:/nonexistent' \
    > "$ctx/base/etc/passwd"
printf '%s\n' 'root:x:0:' 'jail:x:10001:' "jail-runs:x:$run_gid:" > "$ctx/base/etc/group"

# ---- the binaries
install -m 0755 "$bin/jail" "$bin/jail-serve" "$ctx/bin/"

# ---- the pod policy: the default one, with the runs' host uids inside the
# pod's user namespace (which maps 0..65535 only), and the data stack as
# the warm pool's preload.
/usr/bin/python3 - "$run_uids_first" "$run_uids_count" "$run_gid" > "$ctx/policy/pod.json" <<'PY'
import json, sys
first, count, gid = (int(a) for a in sys.argv[1:4])
p = json.load(open("policies/default.json"))
p["name"] = "pod"
p["description"] = ("policies/default.json for a pod with its own user namespace (hostUsers: false): "
                    "runs take host uids %d..%d and gid %d of the pod's 0..65535 (deploy/image.sh)"
                    % (first, first + count - 1, gid))
p["identity"]["root_host_uids"] = {"first": first, "count": count}
p["identity"]["root_host_gid"] = gid
# The warm pool's jails import the data stack before a run arrives.
p["preload"] = ["numpy", "pandas", "matplotlib.pyplot"]
json.dump(p, sys.stdout, indent=2)
print()
PY
"$bin/jail" check "$ctx/policy/pod.json" >/dev/null || die "the pod policy does not pass jail check"

# ---- the data rootfs: hard links when it is on the same filesystem
# (the build copies it into the image either way).
if ! cp -al "$rootfs/." "$ctx/python/" 2>/dev/null; then
    rm -rf "$ctx/python" && mkdir -p "$ctx/python"
    cp -a "$rootfs/." "$ctx/python/"
fi

echo "image: building $image with ${builder[0]} (context $ctx, $(du -sh "$ctx" | cut -f1))" >&2
# No layer cache (each build is one image), and the image this tag named
# before is removed once nothing uses it: the machine's disk is shared.
before=$("${builder[0]}" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
"${builder[@]}" -q -f deploy/Containerfile -t "$image" \
    --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    "$ctx" >/dev/null
after=$("${builder[0]}" image inspect --format '{{.Id}}' "$image")
if [ -n "$before" ] && [ "$before" != "$after" ]; then
    "${builder[0]}" rmi "$before" >/dev/null 2>&1 || true
fi
echo "$image"
