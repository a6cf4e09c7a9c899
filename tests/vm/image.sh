#!/usr/bin/env bash
# Build the guest's root disk image: tests/vm/image.sh OUT.img SUITE MIRROR
#
# A Debian SUITE (minbase) from MIRROR with systemd as init and nothing else
# that runs at boot: the default target starts one service, jail-vm.service,
# which mounts the host's 9p share and runs the guest.sh found there, then
# powers the machine off. The kernel is not in the image (the host boots it
# directly with an initramfs that also loads the 9p modules), so one image
# serves every kernel of the matrix. The image is built in a temporary folder
# and written to OUT.img only when complete. Needs root (debootstrap, chroot).
# This file is part of the cache key: any change here rebuilds the image.
set -euo pipefail
out=${1:?usage: image.sh OUT.img SUITE MIRROR}
suite=${2:?usage: image.sh OUT.img SUITE MIRROR}
mirror=${3:?usage: image.sh OUT.img SUITE MIRROR}
[ "$(id -u)" = 0 ] || { echo "image.sh: building the guest image needs root (debootstrap, chroot)" >&2; exit 1; }

work=$(mktemp -d "$(dirname "$out")/image.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

# systemd as init; libseccomp2 for the jail; the system and user buses and
# logind, so that a lingering user gets a user manager the jail can ask for
# a delegated scope (delegate.rs); nothing from Recommends.
debootstrap --variant=minbase --include=systemd,systemd-sysv,libseccomp2,dbus,dbus-user-session,libpam-systemd \
    "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; echo "image.sh: debootstrap $suite from $mirror failed" >&2; exit 1; }

echo jail-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost jail-vm\n' >"$root/etc/hosts"
# A fixed machine id: no first-boot logic, and the same guest every run.
echo 6a61696c766d00000000000000000001 >"$root/etc/machine-id"
: >"$root/etc/fstab"
# The ordinary user whose tests run in a systemd-delegated cgroup.
chroot "$root" useradd --create-home --uid 1000 --shell /bin/bash jailtest

cat >"$root/usr/local/sbin/jail-vm-boot" <<'BOOT'
#!/bin/bash
# Mount the host's share and hand over to the guest.sh it carries.
set -u
mkdir -p /mnt/share
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none jailshare /mnt/share; then
    echo "jail-vm: cannot mount the 9p share 'jailshare'"
    exit 1
fi
exec /bin/bash /mnt/share/guest.sh
BOOT
chmod 755 "$root/usr/local/sbin/jail-vm-boot"

cat >"$root/etc/systemd/system/jail-vm.target" <<'UNIT'
[Unit]
Description=jail VM test run
Wants=jail-vm.service
AllowIsolate=yes
UNIT
# SuccessAction= and FailureAction= are [Unit] settings. Output goes to the
# second serial port (a file on the host); the first carries the console.
cat >"$root/etc/systemd/system/jail-vm.service" <<'UNIT'
[Unit]
Description=jail VM test run
DefaultDependencies=no
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/jail-vm-boot
# The root part hands the jail a cgroup subtree of its own (guest.sh
# delegate_parent), as any root service running jail should be set up.
Delegate=yes
StandardInput=null
StandardOutput=file:/dev/ttyS1
StandardError=inherit
TimeoutStartSec=infinity
UNIT
ln -sf jail-vm.target "$root/etc/systemd/system/default.target"

# Smaller image: no documentation, locales or package lists.
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* \
       "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb

# An ext4 image filled from the folder (no loop mount needed); sparse, with
# room for the payload the guest unpacks (the guest writes to a snapshot):
# 1.5 GiB of debug binaries and the rootfs (jail-serve's 120 MB filled the
# 1.5 GiB this had, and the user part ran out of space), plus what the
# tests write in /tmp.
size_mb=$(( $(du -sm "$root" | cut -f1) + 3072 ))
truncate -s "${size_mb}M" "$work/root.img"
mkfs.ext4 -q -F -L jail-vm -d "$root" "$work/root.img"
mv "$work/root.img" "$out"
