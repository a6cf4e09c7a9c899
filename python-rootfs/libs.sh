# Sourced by flavours/minimal.sh and data-wheels.sh: copy a shared library
# of the host into the rootfs "$root", at the path the loader looks for it.
#
#   copy_lib /lib/x86_64-linux-gnu/libstdc++.so.6
#
# The file is copied (not linked) under its own name into the rootfs's
# folder of the same kind (the multiarch folder it resolves into, or
# /usr/lib, /usr/lib64), once.
copy_lib() {
    local lib=$1 real dest
    real=$(readlink -f "$lib")
    case "$(dirname "$real")" in
        /usr/lib|/lib) dest="$root/usr/lib" ;;
        /usr/lib64|/lib64) dest="$root/usr/lib64" ;;
        *) dest="$root/usr/lib/$(basename "$(dirname "$real")")" ;;
    esac
    mkdir -p "$dest"
    [ -e "$dest/$(basename "$lib")" ] || cp -L "$lib" "$dest/$(basename "$lib")"
}
