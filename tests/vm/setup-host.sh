#!/usr/bin/env bash
# Installs what rgpu's VM-mode test needs on a Debian/Ubuntu host (CI and
# developers), idempotently:
#  - host tools: debootstrap, cpio, xz-utils, gzip, kmod (only those missing);
#  - a Debian 13 (trixie) chroot in ${RGPU_CACHE:-/var/cache/rgpu}/trixie with
#    QEMU from trixie-backports (>= 10.2: vhost-user-test-device-pci), the
#    stock guest kernel (linux-image-amd64) and busybox-static.
#  - a portable QEMU made from it in ${RGPU_CACHE:-/var/cache/rgpu}/qemu
#    (tests/vm/make-portable-qemu.sh): the QEMU and guest kernel the VM test
#    runs, the same bundle the GPU host uses.
# The chroot is built once (1-2 minutes, ~500 MB); a marker file written last
# makes reruns take a second. Remove the directory to rebuild it.
# Needs root (apt-get, debootstrap).
set -euo pipefail

CACHE=${RGPU_CACHE:-/var/cache/rgpu}
ROOT=$CACHE/trixie
MARKER=$ROOT/.rgpu-chroot-ready
PORTABLE=$CACHE/qemu
HERE=$(cd "$(dirname "$0")" && pwd)
# The oldest QEMU whose generic vhost-user device is user-creatable.
QEMU_MIN=10.2

say() { echo "setup-host: $*"; }
die() { echo "setup-host: error: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Host tools, installed only when a command is missing (apt-get update once).
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v cpio >/dev/null || need+=(cpio)
command -v xz >/dev/null || need+=(xz-utils)
command -v gzip >/dev/null || need+=(gzip)
command -v cc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
    say "installing host packages: ${need[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

check_chroot() {
    local version
    version=$(as_root chroot "$ROOT" qemu-system-x86_64 --version | head -n1) \
        || die "qemu-system-x86_64 does not run in $ROOT"
    local number=${version#QEMU emulator version }
    number=${number%% *}
    if [ "$(printf '%s\n%s\n' "$QEMU_MIN" "$number" | sort -V | head -n1)" != "$QEMU_MIN" ]; then
        die "$ROOT has QEMU $number; rgpu needs >= $QEMU_MIN (remove $ROOT and rerun)"
    fi
    as_root chroot "$ROOT" qemu-system-x86_64 -device help | grep -q '"vhost-user-test-device-pci"' \
        || die "QEMU $number in $ROOT has no vhost-user-test-device-pci"
    ls "$ROOT"/boot/vmlinuz-* >/dev/null 2>&1 || die "$ROOT has no guest kernel"
    [ -x "$ROOT/bin/busybox" ] || die "$ROOT has no busybox-static"
    say "ready: $ROOT (QEMU $number, kernel $(basename "$(ls "$ROOT"/boot/vmlinuz-* | sort -V | tail -n1)"))"
}

# The portable QEMU, remade when missing or older than the chroot.
portable_qemu() {
    if [ ! -x "$PORTABLE/qemu-system-x86_64" ] || [ "$MARKER" -nt "$PORTABLE/qemu-system-x86_64" ]; then
        say "making the portable QEMU in $PORTABLE"
        as_root env RGPU_CACHE="$CACHE" bash "$HERE/make-portable-qemu.sh" "$PORTABLE"
    else
        say "ready: $PORTABLE ($("$PORTABLE/qemu-system-x86_64" --version | head -n1))"
    fi
}

if [ -e "$MARKER" ]; then
    check_chroot
    portable_qemu
    exit 0
fi

say "building the Debian 13 chroot in $ROOT (1-2 minutes, ~500 MB)"
as_root mkdir -p "$CACHE"
if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
    as_root rm -rf "$ROOT"
    say "debootstrap --variant=minbase trixie $ROOT"
    as_root debootstrap --variant=minbase trixie "$ROOT" >"$CACHE/debootstrap.log" 2>&1 \
        || die "debootstrap failed; see $CACHE/debootstrap.log"
fi

# The backports source, derived from the chroot's own source by replacing
# the suite name (works for both sources.list and deb822 .sources files).
if [ -s "$ROOT/etc/apt/sources.list" ]; then
    sed -n 's/^\(deb .*\) trixie \(.*\)$/\1 trixie-backports \2/p' "$ROOT/etc/apt/sources.list" \
        | head -n1 | as_root tee "$ROOT/etc/apt/sources.list.d/backports.list" >/dev/null
else
    for f in "$ROOT"/etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] || continue
        sed 's/^Suites:.*/Suites: trixie-backports/' "$f" \
            | as_root tee "$ROOT/etc/apt/sources.list.d/backports.sources" >/dev/null
        break
    done
fi
ls "$ROOT"/etc/apt/sources.list.d/backports.* >/dev/null 2>&1 && \
    grep -q trixie-backports "$ROOT"/etc/apt/sources.list.d/backports.* \
    || die "could not derive a trixie-backports source from $ROOT/etc/apt"

# The kernel's postinst must not try to build an initramfs or touch a
# bootloader in the chroot: we only want its files.
as_root mkdir -p "$ROOT/etc/kernel" "$ROOT/etc/initramfs-tools"
echo 'do_symlinks = no' | as_root tee "$ROOT/etc/kernel-img.conf" >/dev/null

say "apt-get install -t trixie-backports qemu-system-x86; linux-image-amd64 busybox-static"
{
    as_root chroot "$ROOT" apt-get update -qq
    as_root chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends -t trixie-backports qemu-system-x86
    as_root chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends linux-image-amd64 busybox-static kmod
    as_root chroot "$ROOT" apt-get clean
} >"$CACHE/apt.log" 2>&1 || die "installing into the chroot failed; see $CACHE/apt.log"

check_chroot
as_root touch "$MARKER"
portable_qemu
say "done"
