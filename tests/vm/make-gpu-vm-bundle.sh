#!/usr/bin/env bash
# Gathers what the VM-mode test needs on the GPU host (no Rust, no chroot
# there) into one folder, built on the build host:
#
#   tests/vm/make-gpu-vm-bundle.sh DIR      then on the GPU host: DIR/run-vm-test.sh
#
# DIR/vhost-device-rgpu                 the daemon (release)
# DIR/initramfs.cpio.gz                 the test guest (release guest-lib,
#                                       rgpu-diag, driver_api_test,
#                                       tests/vm/guest-test.sh as /test.sh)
# DIR/initramfs-isolation.cpio.gz       the same with tests/vm/guest-isolation.sh
#                                       (GUEST=isolation run-vm-test.sh)
# DIR/initramfs-bench.cpio.gz           the same with tests/bench/vm_copy_bench.c
#                                       and tests/vm/guest-bench.sh (GUEST=bench
#                                       run-vm-test.sh: pinned copies from
#                                       contiguous and scattered guest pages)
# DIR/qemu/                             the portable QEMU and guest kernel
# DIR/qemu-vhost-user-test-device.sh    qemu-configs/' command line, as is
# DIR/run-vm-test.sh                    the runner
set -euo pipefail
dir=${1:?usage: make-gpu-vm-bundle.sh DIR}
cd "$(dirname "$0")/../.."
cargo build --release --no-default-features -p vhost-device-rgpu -p guest-lib -p rgpu-transport
target=${CARGO_TARGET_DIR:-$(pwd)/target}/release
mkdir -p "$dir"
strip --strip-debug -o "$dir/vhost-device-rgpu" "$target/vhost-device-rgpu"
RGPU_PROFILE_DIR=$target bash tests/vm/build-initramfs.sh "$dir/initramfs.cpio.gz" \
    tests/vm/guest-test.sh=/test.sh
RGPU_PROFILE_DIR=$target bash tests/vm/build-initramfs.sh "$dir/initramfs-isolation.cpio.gz" \
    tests/vm/guest-isolation.sh=/test.sh
# The copy bench, linked against guest-lib as build-initramfs.sh links its
# programs.
bench_build=$(mktemp -d /tmp/rgpu-bench-build.XXXXXX)
trap 'rm -rf "$bench_build"' EXIT
ln -s "$target/libcuda.so" "$bench_build/libcuda.so"
cc -O2 -std=c11 -Wall -Wextra -Werror -I tests/programs -o "$bench_build/vm_copy_bench" \
    tests/bench/vm_copy_bench.c -L "$bench_build" -lcuda
RGPU_PROFILE_DIR=$target bash tests/vm/build-initramfs.sh "$dir/initramfs-bench.cpio.gz" \
    tests/vm/guest-bench.sh=/test.sh "$bench_build/vm_copy_bench"
bash tests/vm/make-portable-qemu.sh "$dir/qemu"
rm -f "$dir/qemu.tar.gz"
cp qemu-configs/qemu-vhost-user-test-device.sh tests/vm/run-vm-test.sh "$dir/"
echo "bundle ready in $dir ($(du -sh "$dir" | cut -f1)): run $dir/run-vm-test.sh on the GPU host"
