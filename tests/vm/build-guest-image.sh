#!/usr/bin/env bash
# Builds a bootable Debian 13 guest disk image with rgpu's guest package
# installed by dpkg (issue 12: "a step in a cloud image build"; the same
# steps work on any Debian image: guest-driver-notes/cloud-image.md):
#
#   tests/vm/build-guest-image.sh OUTDIR GUEST_DEB [SRC=DEST...]
#
#   OUTDIR/disk.raw    ext4 root file system (the whole disk, no partition
#                      table), label rgpu-root
#   OUTDIR/vmlinuz     the image's own kernel, and
#   OUTDIR/initrd.img  its initramfs (initramfs-tools), to boot it with
#                      root=/dev/vda init=/sbin/rgpu-test-init
#
# SRC=DEST copies a file into the image (a test script as /test.sh, test
# programs). The image has users `cuda` and `cuda2` in group render, and
# /sbin/rgpu-test-init: it mounts what a minimal system needs, loads
# virtio-gpu, then runs tests/vm/guest-boot-run.sh (the render node to group
# render, as the package's udev rule would where udev runs; the boot
# markers; /test.sh) and powers off.
#
# The base system (debootstrap minbase, linux-image-amd64, initramfs-tools)
# is built once under $RGPU_CACHE/guest-image-base (default
# /var/cache/rgpu; about 2 minutes and 400 MB). Needs root.
set -euo pipefail

die() { echo "build-guest-image: error: $*" >&2; exit 1; }
say() { echo "build-guest-image: $*"; }

[ $# -ge 2 ] || die "usage: $0 OUTDIR GUEST_DEB [SRC=DEST...]"
out=$1
deb=$2
shift 2
[ -f "$deb" ] || die "no guest package at $deb (scripts/package.sh builds it)"
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot)"
for tool in debootstrap mkfs.ext4 chroot; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install debootstrap e2fsprogs)"
done
cache=${RGPU_CACHE:-/var/cache/rgpu}
base=$cache/guest-image-base
marker=$base/.rgpu-image-base-ready

# in_chroot ROOT CMD...: runs CMD in ROOT with /proc and /dev there.
in_chroot() {
    local root=$1
    shift
    mount -t proc proc "$root/proc"
    mount --bind /dev "$root/dev"
    local rc=0
    chroot "$root" "$@" || rc=$?
    umount "$root/dev" "$root/proc"
    return $rc
}

if [ ! -e "$marker" ]; then
    say "building the base system in $base (once: debootstrap, kernel, initramfs-tools)"
    rm -rf "$base"
    mkdir -p "$cache"
    debootstrap --variant=minbase trixie "$base" >"$cache/guest-image-debootstrap.log" 2>&1 \
        || die "debootstrap failed; see $cache/guest-image-debootstrap.log"
    # No bootloader in the image: the kernel and initrd boot from outside.
    echo 'do_symlinks = no' >"$base/etc/kernel-img.conf"
    in_chroot "$base" sh -c 'apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            initramfs-tools linux-image-amd64 kmod procps &&
        apt-get clean' >"$cache/guest-image-apt.log" 2>&1 \
        || die "installing the kernel failed; see $cache/guest-image-apt.log"
    ls "$base"/boot/vmlinuz-* "$base"/boot/initrd.img-* >/dev/null 2>&1 \
        || die "the base has no kernel and initrd in /boot"
    touch "$marker"
fi

stage=$(mktemp -d /tmp/rgpu-image.XXXXXX)
trap 'rc=$?; umount "$stage/dev" "$stage/proc" 2>/dev/null || true; rm -rf "$stage"; exit $rc' EXIT
cp -a "$base/." "$stage/"
rm -f "$stage/.rgpu-image-base-ready"

# The step a cloud image build runs: the guest package, by dpkg.
cp "$deb" "$stage/tmp/rgpu-guest.deb"
in_chroot "$stage" sh -c 'dpkg -i /tmp/rgpu-guest.deb && rm /tmp/rgpu-guest.deb' \
    >"$stage.dpkg.log" 2>&1 || { cat "$stage.dpkg.log" >&2; rm -f "$stage.dpkg.log"; die "dpkg -i failed"; }
rm -f "$stage.dpkg.log"
in_chroot "$stage" sh -c 'useradd -m -G render cuda && useradd -m -G render cuda2'

for spec in "$@"; do
    src=${spec%%=*}
    dest=${spec#*=}
    [ "$src" != "$spec" ] || die "$spec: expected SRC=DEST"
    install -D -m 0755 "$src" "$stage$dest"
done

install -D -m 0644 "$(dirname "$0")/guest-boot-run.sh" "$stage/lib/rgpu/boot-run.sh"
cat >"$stage/sbin/rgpu-test-init" <<'INIT'
#!/bin/sh
# PID 1 of rgpu's test image (tests/vm/build-guest-image.sh).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
echo "RGPU-BOOT kernel $(uname -r) from the disk image (root $(findmnt -n -o SOURCE /))"
echo "RGPU-BOOT rgpu-guest $(dpkg-query -W -f '${Version}' rgpu-guest) installed by dpkg"
modprobe virtio-gpu || echo "RGPU-BOOT modprobe virtio-gpu failed"
. /lib/rgpu/boot-run.sh
mount -o remount,ro / 2>/dev/null
echo o >/proc/sysrq-trigger
sleep 10
INIT
chmod 0755 "$stage/sbin/rgpu-test-init"

mkdir -p "$out"
cp "$(ls "$stage"/boot/vmlinuz-* | sort -V | tail -n1)" "$out/vmlinuz"
cp "$(ls "$stage"/boot/initrd.img-* | sort -V | tail -n1)" "$out/initrd.img"
size_mb=$(( $(du -sm "$stage" | cut -f1) + 256 ))
rm -f "$out/disk.raw"
mkfs.ext4 -q -F -L rgpu-root -d "$stage" "$out/disk.raw" "${size_mb}M"
say "$out/disk.raw (${size_mb} MiB, kernel $(basename "$(ls "$stage"/boot/vmlinuz-* | sort -V | tail -n1)"))"
