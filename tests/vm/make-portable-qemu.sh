#!/usr/bin/env bash
# Makes a portable QEMU from the Debian 13 chroot of tests/vm/setup-host.sh,
# runnable on any x86-64 Linux host without installing anything (the GPU
# host of TEST-HOSTS.md):
#
#   tests/vm/make-portable-qemu.sh DIR
#
# DIR/bin/qemu-system-x86_64      the binary (chroot's QEMU, >= 10.2)
# DIR/lib/                        every library it needs and the chroot's
#                                 ld-linux-x86-64.so.2
# DIR/share/                      firmware: bios-256k.bin, kvmvapic.bin,
#                                 linuxboot_dma.bin, efi-virtio.rom
# DIR/vmlinuz                     the stock Debian guest kernel
# DIR/qemu-system-x86_64          the wrapper to run (QEMU=DIR/qemu-system-x86_64
#                                 for qemu-configs/qemu-vhost-user-test-device.sh)
# DIR.tar.gz                      all of it, to copy to another host
#
# The wrapper runs the binary through the bundled loader, so the host's own
# glibc and libraries are never mixed in.
set -euo pipefail

die() { echo "make-portable-qemu: error: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 DIR"
DIR=$1
ROOT=${RGPU_CACHE:-/var/cache/rgpu}/trixie
[ -e "$ROOT/.rgpu-chroot-ready" ] \
    || die "no Debian 13 chroot at $ROOT: run tests/vm/setup-host.sh (as root) first"

LOADER=$ROOT/lib64/ld-linux-x86-64.so.2
LIBPATH=$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib/x86_64-linux-gnu
BINARY=$ROOT/usr/bin/qemu-system-x86_64

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/share"
cp -L "$BINARY" "$DIR/bin/qemu-system-x86_64"
cp -L "$LOADER" "$DIR/lib/ld-linux-x86-64.so.2"

listing=$("$LOADER" --inhibit-cache --library-path "$LIBPATH" --list "$BINARY")
if grep -q 'not found' <<<"$listing"; then
    die "libraries of $BINARY missing in $ROOT:"$'\n'"$listing"
fi
while read -r name arrow path _; do
    [ "$arrow" = "=>" ] && [[ $name != /* ]] || continue
    cp -L "$path" "$DIR/lib/$name"
done <<<"$listing"

for firmware in bios-256k.bin kvmvapic.bin linuxboot_dma.bin efi-virtio.rom; do
    found=$(find -L "$ROOT/usr/share/qemu" "$ROOT/usr/share/seabios" "$ROOT/usr/lib/ipxe" \
        -name "$firmware" -type f 2>/dev/null | head -n1 || true)
    [ -n "$found" ] || die "firmware $firmware not found in $ROOT"
    cp -L "$found" "$DIR/share/$firmware"
done

kernel=$(ls "$ROOT"/boot/vmlinuz-* | sort -V | tail -n1)
cp "$kernel" "$DIR/vmlinuz"
basename "$kernel" | sed 's/^vmlinuz-//' >"$DIR/kernel-version"

cat >"$DIR/qemu-system-x86_64" <<'WRAPPER'
#!/bin/sh
# Portable QEMU (made by rgpu's tests/vm/make-portable-qemu.sh): runs the
# bundled binary through the bundled loader and libraries, firmware from share/.
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/lib/ld-linux-x86-64.so.2" --inhibit-cache --library-path "$here/lib" \
    "$here/bin/qemu-system-x86_64" -L "$here/share" "$@"
WRAPPER
chmod 0755 "$DIR/qemu-system-x86_64"

version=$("$DIR/qemu-system-x86_64" --version | head -n1)
"$DIR/qemu-system-x86_64" -device help | grep -q '"vhost-user-test-device-pci"' \
    || die "the portable QEMU has no vhost-user-test-device-pci"

tar -C "$(dirname "$DIR")" -czf "$DIR.tar.gz" "$(basename "$DIR")"
echo "make-portable-qemu: $DIR ($version; $(du -sh "$DIR" | cut -f1), $DIR.tar.gz $(du -h "$DIR.tar.gz" | cut -f1))"
