#!/usr/bin/env bash
# rgpu's main job in one command: build, start vhost-device-rgpu, and run a
# CUDA driver-API program through it in local mode.
#
# On a host with NVIDIA's driver the daemon uses the GPU (--executor cuda);
# without one it says so and uses the sim executor, a test fixture that runs
# the reference kernels on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

command -v cc >/dev/null || { echo "demo: a C compiler (cc) is needed: apt-get install gcc" >&2; exit 1; }
cargo build --release --workspace --quiet
target=${CARGO_TARGET_DIR:-$root/target}/release

work=$(mktemp -d /tmp/rgpu-demo.XXXXXX)
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# Our libcuda.so.1 lives only in this folder, which only the application sees.
mkdir -p "$work/lib"
ln -s "$target/libcuda.so" "$work/lib/libcuda.so.1"
ln -s "$target/libcuda.so" "$work/lib/libcuda.so"
cc -O2 -std=c11 -Wall -I tests/programs -o "$work/driver_api_test" \
    tests/programs/driver_api_test.c -L "$work/lib" -lcuda

executor=cuda
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 ' && [ ! -e /usr/local/nvidia/lib64/libcuda.so.1 ]; then
    echo "demo: no NVIDIA driver on this host: using the sim executor (a CPU test fixture, not a GPU)"
    executor=sim
fi

socket="$work/rgpu.sock"
env -u LD_LIBRARY_PATH RGPU_LOG=${RGPU_LOG:-info} "$target/vhost-device-rgpu" \
    --executor "$executor" --socket-path "$socket" --stats-socket "$work/stats.sock" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.05; done
[ -S "$socket" ] || { echo "demo: the daemon did not start" >&2; exit 1; }

echo "demo: running a CUDA driver-API program through rgpu ($executor executor)"
RGPU_SOCKET="$socket" LD_LIBRARY_PATH="$work/lib" "$work/driver_api_test" \
    --ptx tests/programs/reference_kernels.ptx
echo "demo: daemon accounting: $(python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.makefile().readline().strip())' "$work/stats.sock" 2>/dev/null || true)"
