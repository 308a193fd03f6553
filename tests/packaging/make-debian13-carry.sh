#!/usr/bin/env bash
# Builds what tests/packaging/debian13-chroot.sh needs, on the build host,
# into OUTDIR (about 34 MB: it travels to the GPU machine):
#
#   tests/packaging/make-debian13-carry.sh OUTDIR
#
#   - the two packages (scripts/package.sh);
#   - trixie-root.tar.xz: the Debian 13 chroot of tests/vm/setup-host.sh
#     (${RGPU_CACHE:-/var/cache/rgpu}/trixie, only read), without what the
#     run does not use (kernel, firmware, documentation, QEMU);
#   - driver_api_test linked against the guest package's libcuda.so.1, no
#     rpath (the chroot has no C compiler), and reference_kernels.ptx.
set -euo pipefail
out=$(mkdir -p "${1:?usage: make-debian13-carry.sh OUTDIR}" && cd "$1" && pwd)
cd "$(dirname "$0")/../.."
root=${RGPU_CACHE:-/var/cache/rgpu}/trixie
[ -x "$root/usr/bin/dpkg" ] || { echo "no Debian 13 chroot in $root: run tests/vm/setup-host.sh" >&2; exit 1; }
work=$(mktemp -d /tmp/rgpu-debian13-carry.XXXXXX)
trap 'rm -rf "$work"' EXIT
scripts/package.sh "$work/pkg"
cp "$work"/pkg/vhost-device-rgpu_*.deb "$work"/pkg/rgpu-guest_*.deb "$out/"
tar -C "$root" --numeric-owner -cJf "$out/trixie-root.tar.xz" \
    --exclude=./boot --exclude=./usr/lib/modules --exclude=./usr/lib/firmware \
    --exclude=./usr/share/doc --exclude=./usr/share/man --exclude=./usr/share/locale \
    --exclude=./usr/share/info --exclude='./var/cache/apt/*' --exclude='./var/lib/apt/lists/*' \
    --exclude='./usr/bin/qemu-*' --exclude=./usr/share/qemu --exclude=./usr/lib/qemu \
    --exclude='./usr/lib/x86_64-linux-gnu/libcapstone*' --exclude='./usr/lib/udev/hwdb.*' \
    --exclude=./.rgpu-chroot-ready .
dpkg-deb -x "$out"/rgpu-guest_*.deb "$work/guest"
mkdir -p "$work/link"
ln -s "$work/guest/usr/lib/rgpu/libcuda.so.1" "$work/link/libcuda.so"
cc -O2 -std=c11 -I tests/programs -o "$out/driver_api_test" tests/programs/driver_api_test.c \
    -L "$work/link" -lcuda
cp tests/programs/reference_kernels.ptx "$out/"
du -sh "$out"
