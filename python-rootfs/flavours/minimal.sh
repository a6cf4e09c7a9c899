#!/usr/bin/env bash
# The minimal flavour: the host's /usr/bin/python3, its standard library, and
# the shared libraries they link, copied into "$1". No network, a few seconds.
set -euo pipefail
root=$1
here=$(cd "$(dirname "$0")/.." && pwd)
py=$(readlink -f /usr/bin/python3)
[ -x "$py" ] || { echo "minimal.sh: /usr/bin/python3 not found; install python3 (apt-get install python3)" >&2; exit 1; }
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
dynload="$stdlib/lib-dynload"

mkdir -p "$root"/usr/bin "$root"/usr/lib "$root"/usr/lib64 "$root"/etc
# Merged /usr, as on Debian: the loader's default paths under /lib resolve.
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"

cp -p "$py" "$root/usr/bin/python$ver"
ln -s "python$ver" "$root/usr/bin/python3"
ln -s "python$ver" "$root/usr/bin/python"

# The standard library without its test suite and GUI/tool modules, which the
# jail cannot use; precompiled bytecode comes along, so nothing compiles at
# run time.
mkdir -p "$root$stdlib"
tar -C "$stdlib" \
    --exclude=./test --exclude=./idlelib --exclude=./tkinter --exclude=./turtledemo \
    --exclude=./ensurepip --exclude=./lib2to3/tests --exclude=./site-packages \
    -cf - . | tar -C "$root$stdlib" -xf -
"$py" -m compileall -q -j 0 "$root$stdlib" >/dev/null 2>&1 || true

# Every shared library the interpreter and its extension modules link.
# shellcheck source=../libs.sh
. "$here/libs.sh"
missing=0
while read -r lib; do
    copy_lib "$lib"
done < <(
    for f in "$py" "$dynload"/*.so; do
        ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\s*\/[^ ]*ld-linux/{print $1}'
        if ldd "$f" 2>/dev/null | grep -q 'not found'; then
            echo "minimal.sh: warning: $(basename "$f") has unresolved libraries; it will not import" >&2
        fi
    done | sort -u
)
# glibc loads libgcc_s itself (dlopen, so ldd lists it nowhere) to unwind a
# thread in pthread_exit and pthread_cancel: without it, CPython ending its
# daemon threads at shutdown aborts the process ("libgcc_s.so.1 must be
# installed for pthread_exit to work"). It lives beside the interpreter's libc.
libc=$(ldd "$py" | awk '$1 ~ /^libc\.so/ {print $3}')
gcc_s="$(dirname "$libc")/libgcc_s.so.1"
[ -e "$gcc_s" ] || { echo "minimal.sh: no $gcc_s; install libgcc-s1" >&2; exit 1; }
copy_lib "$gcc_s"
# The dynamic loader, at the path the binary asks for.
interp=$(readlink -f /lib64/ld-linux-x86-64.so.2 2>/dev/null || true)
if [ -n "$interp" ]; then
    cp -L /lib64/ld-linux-x86-64.so.2 "$root/usr/lib64/ld-linux-x86-64.so.2"
fi

# ldconfig (static) for `ldconfig -p`, which ctypes.util.find_library reads
# the loader cache with (the cache below), and the C.UTF-8 locale LANG names:
# without it setlocale fails, Python falls back to the C locale and turns on
# UTF-8 mode, so the jail's Python would differ from the host's.
mkdir -p "$root/usr/sbin" "$root/usr/lib/locale"
ln -s usr/sbin "$root/sbin"
cp -p /sbin/ldconfig "$root/usr/sbin/ldconfig"
# (C.utf8 from glibc 2.35 on; Debian 11's glibc 2.31 ships it as C.UTF-8.)
for locale in C.utf8 C.UTF-8; do
    [ -d "/usr/lib/locale/$locale" ] && cp -a "/usr/lib/locale/$locale" "$root/usr/lib/locale/"
done

# A loader cache, so every library is found at the first try instead of after
# a dozen glibc-hwcaps probes per library.
printf '/usr/lib/x86_64-linux-gnu\n' > "$root/etc/ld.so.conf"
/sbin/ldconfig -r "$root" 2>/dev/null || echo "minimal.sh: warning: ldconfig failed; libraries will be searched" >&2

# Just enough /etc for pwd, grp and socket lookups inside the jail.
cat > "$root/etc/passwd" <<PASSWD
root:x:0:0:root:/root:/usr/sbin/nologin
sandbox:x:1000:1000:sandbox:/tmp:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
cat > "$root/etc/group" <<GROUP
root:x:0:
sandbox:x:1000:
nogroup:x:65534:
GROUP
printf '127.0.0.1 localhost jail\n::1 localhost\n' > "$root/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\n' > "$root/etc/nsswitch.conf"
printf 'minimal python%s\n' "$ver" > "$root/etc/jail-rootfs"

# The manifest (`jail packages`, `isolation.rootfs_id`): this interpreter,
# the Debian packages it was copied from, no packages beyond the stdlib.
mkdir -p "$root/usr/share/jail"
debs=$(mktemp)
trap 'rm -f "$debs"' EXIT
if command -v dpkg-query >/dev/null; then
    for f in "$py" "$stdlib/os.py"; do
        dpkg-query -S "$f" 2>/dev/null | cut -d: -f1 | tr ', ' '\n\n'
    done | sort -u | grep . | xargs -r dpkg-query -W -f='${Package}\t${Version}\n' > "$debs" || true
fi
"$py" -I "$here/manifest.py" --flavour minimal --debian "$debs" > "$root/usr/share/jail/manifest.json"
