#!/bin/sh
# Installs rgpu's guest library into the system it runs in: a VM, a chroot of
# an image, or an image build (see cloud-image.md). Idempotent; needs root.
#
#   SRC         folder holding libcuda.so.1 (guest-lib's target/release/
#               libcuda.so, renamed), and optionally rgpu-diag and
#               70-rgpu.rules (default: the folder of this script)
#   PREFIX      where it goes (default /opt/rgpu: lib/ and bin/)
#   CUDA_USERS  users to add to group "render" (space-separated; optional)
set -eu

SRC=${SRC:-$(dirname "$0")}
PREFIX=${PREFIX:-/opt/rgpu}
CUDA_USERS=${CUDA_USERS:-}

say() { echo "install-guest-lib: $*"; }

[ -f "$SRC/libcuda.so.1" ] || { say "error: no $SRC/libcuda.so.1" >&2; exit 1; }

install -d -m 0755 "$PREFIX/lib"
install -m 0755 "$SRC/libcuda.so.1" "$PREFIX/lib/libcuda.so.1"
# For programs that link with -lcuda.
ln -sf libcuda.so.1 "$PREFIX/lib/libcuda.so"
if [ -f "$SRC/rgpu-diag" ]; then
    install -d -m 0755 "$PREFIX/bin"
    install -m 0755 "$SRC/rgpu-diag" "$PREFIX/bin/rgpu-diag"
    ln -sf "$PREFIX/bin/rgpu-diag" /usr/local/bin/rgpu-diag
fi

# Every program that dlopens libcuda.so.1 finds ours through the ld.so cache.
echo "$PREFIX/lib" > /etc/ld.so.conf.d/rgpu.conf
ldconfig

# Render node: root:render 0660 (distributions differ; see README.md).
if [ -f "$SRC/70-rgpu.rules" ]; then
    install -D -m 0644 "$SRC/70-rgpu.rules" /etc/udev/rules.d/70-rgpu.rules
fi
getent group render >/dev/null || groupadd --system render
for user in $CUDA_USERS; do
    usermod -aG render "$user"
done

# NVIDIA's libcuda.so.1 next to ours makes the choice unpredictable.
others=$(ldconfig -p | awk '$1 == "libcuda.so.1" { print $NF }' | grep -v "^$PREFIX/lib/" || true)
if [ -n "$others" ]; then
    say "warning: another libcuda.so.1 is installed ($others); remove it or run CUDA programs with LD_PRELOAD=$PREFIX/lib/libcuda.so.1" >&2
fi
say "installed in $PREFIX"
