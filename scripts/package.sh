#!/usr/bin/env bash
# Builds rgpu's Debian packages with dpkg-deb (Debian's own tool; no
# packaging tool to install):
#
#   scripts/package.sh OUTDIR
#
#   OUTDIR/vhost-device-rgpu_VERSION_ARCH.deb   the host: the daemon, systemd
#       units (rgpu.service for /etc/rgpu/rgpu.toml; rgpu@.socket and
#       rgpu@.service, one socket-activated tenant each), the rgpu group,
#       an example /etc/rgpu/rgpu.toml
#   OUTDIR/rgpu-guest_VERSION_ARCH.deb          a guest: libcuda.so.1 and
#       libnvidia-ml.so.1 in /usr/lib/rgpu with an ld.so.conf.d entry,
#       rgpu-run (the LD_PRELOAD wrapper), rgpu-diag, the udev rule
#
# Release binaries come from `cargo build --release --no-default-features`
# (the daemon without the sim executor, a test fixture; CARGO_TARGET_DIR is
# honoured). Prints the two paths.
set -euo pipefail
out=${1:?usage: scripts/package.sh OUTDIR}
cd "$(dirname "$0")/.."
root=$(pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

echo "package.sh: building release binaries (cargo build --release --no-default-features)"
cargo build --release --no-default-features -p vhost-device-rgpu -p guest-lib -p rgpu-nvml \
    -p rgpu-transport
target=${CARGO_TARGET_DIR:-$root/target}/release
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
[ -n "$version" ] || { echo "package.sh: no version in Cargo.toml" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# control FILE PACKAGE DEPENDS DESCRIPTION...: a binary package's control file.
control() {
    local file=$1 package=$2 depends=$3
    shift 3
    mkdir -p "$(dirname "$file")"
    cat >"$file" <<CONTROL
Package: $package
Version: $version
Architecture: $arch
Maintainer: rgpu developers <rgpu-dev@localhost>
Section: misc
Priority: optional
Depends: $depends
Description: $1
CONTROL
    shift
    for line in "$@"; do echo " $line" >>"$file"; done
}

docs() {
    local doc=$1/usr/share/doc/$2
    install -d "$doc"
    install -m 0644 README.md CHANGELOG.md "$doc/"
    cat LICENSE-APACHE LICENSE-BSD-3-Clause >"$doc/copyright"
    chmod 0644 "$doc/copyright"
}

# The host package.
host=$stage/host
install -D -m 0755 "$target/vhost-device-rgpu" "$host/usr/bin/vhost-device-rgpu"
strip --strip-debug "$host/usr/bin/vhost-device-rgpu"
for unit in rgpu.service rgpu@.socket rgpu@.service; do
    install -D -m 0644 "packaging/host/$unit" "$host/lib/systemd/system/$unit"
done
install -D -m 0644 packaging/host/rgpu.toml "$host/etc/rgpu/rgpu.toml"
docs "$host" vhost-device-rgpu
control "$host/DEBIAN/control" vhost-device-rgpu "libc6 (>= 2.36), passwd" \
    "CUDA on a host GPU for virtual machines and local processes" \
    "vhost-device-rgpu is a vhost-user backend of a virtio-gpu device whose" \
    "guests run unmodified CUDA programs on this host's NVIDIA GPU, with" \
    "per-tenant memory limits, compute shares, priorities and metrics." \
    "NVIDIA's driver must be installed on the host."
echo /etc/rgpu/rgpu.toml >"$host/DEBIAN/conffiles"
cat >"$host/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    # Members of group rgpu (and VMMs running in it) may use the sockets.
    getent group rgpu >/dev/null || groupadd --system rgpu
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
    fi
fi
exit 0
SCRIPT
cat >"$host/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
exit 0
SCRIPT
chmod 0755 "$host/DEBIAN/postinst" "$host/DEBIAN/postrm"

# The guest package.
guest=$stage/guest
install -D -m 0644 "$target/libcuda.so" "$guest/usr/lib/rgpu/libcuda.so.1"
install -D -m 0644 "$target/libnvidia_ml.so" "$guest/usr/lib/rgpu/libnvidia-ml.so.1"
strip --strip-debug "$guest/usr/lib/rgpu/libcuda.so.1" "$guest/usr/lib/rgpu/libnvidia-ml.so.1"
ln -s libcuda.so.1 "$guest/usr/lib/rgpu/libcuda.so"
ln -s libnvidia-ml.so.1 "$guest/usr/lib/rgpu/libnvidia-ml.so"
install -D -m 0755 "$target/rgpu-diag" "$guest/usr/bin/rgpu-diag"
strip --strip-debug "$guest/usr/bin/rgpu-diag"
install -D -m 0755 packaging/guest/rgpu-run "$guest/usr/bin/rgpu-run"
install -D -m 0644 guest-driver-notes/70-rgpu.rules "$guest/lib/udev/rules.d/70-rgpu.rules"
install -d "$guest/etc/ld.so.conf.d"
echo /usr/lib/rgpu >"$guest/etc/ld.so.conf.d/rgpu.conf"
chmod 0644 "$guest/etc/ld.so.conf.d/rgpu.conf"
docs "$guest" rgpu-guest
control "$guest/DEBIAN/control" rgpu-guest "libc6 (>= 2.36)" \
    "rgpu's CUDA driver library for guests of vhost-device-rgpu" \
    "A drop-in libcuda.so.1 and libnvidia-ml.so.1 that run unmodified CUDA" \
    "programs (nvcc binaries, PyTorch, CuPy, Triton) on the host's GPU" \
    "through rgpu's virtio-gpu device, plus rgpu-diag and rgpu-run."
echo /etc/ld.so.conf.d/rgpu.conf >"$guest/DEBIAN/conffiles"
cat >"$guest/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    ldconfig
    # The render node of the device: group render (70-rgpu.rules).
    getent group render >/dev/null || groupadd --system render
    if command -v udevadm >/dev/null && [ -d /run/udev ]; then
        udevadm control --reload-rules || true
        udevadm trigger --subsystem-match=drm || true
    fi
fi
exit 0
SCRIPT
cat >"$guest/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
ldconfig
exit 0
SCRIPT
chmod 0755 "$guest/DEBIAN/postinst" "$guest/DEBIAN/postrm"

for part in host guest; do
    find "$stage/$part" -type d -exec chmod 0755 {} +
done
dpkg-deb --root-owner-group -Zxz --build "$host" "$out/vhost-device-rgpu_${version}_${arch}.deb" >/dev/null
dpkg-deb --root-owner-group -Zxz --build "$guest" "$out/rgpu-guest_${version}_${arch}.deb" >/dev/null
echo "$out/vhost-device-rgpu_${version}_${arch}.deb"
echo "$out/rgpu-guest_${version}_${arch}.deb"
