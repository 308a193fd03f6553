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
echo "demo: building rgpu in release mode (the first build takes a few minutes)"
cargo build --release -p vhost-device-rgpu -p guest-lib
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

# The daemon logs into a file (RGPU_LOG=debug for more); the demo shows it
# only if something fails.
socket="$work/rgpu.sock"
log="$work/daemon.log"
env -u LD_LIBRARY_PATH RGPU_LOG=${RGPU_LOG:-info} "$target/vhost-device-rgpu" \
    --executor "$executor" --socket-path "$socket" --stats-socket "$work/stats.sock" >"$log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.05; done
if [ ! -S "$socket" ]; then
    echo "demo: the daemon did not start; its log:" >&2
    cat "$log" >&2
    exit 1
fi

echo "demo: running a CUDA driver-API program through rgpu ($executor executor)"
# --no-bogus-handles: skip the checks that pass deliberately bad handles;
# one deliberate error stays (a copy to address 0x10 must fail), which the
# daemon's error count below shows.
if ! RGPU_SOCKET="$socket" LD_LIBRARY_PATH="$work/lib" "$work/driver_api_test" \
    --ptx tests/programs/reference_kernels.ptx --no-bogus-handles >"$work/program.log" 2>&1; then
    echo "demo: FAILED: the program's output:" >&2
    cat "$work/program.log" >&2
    echo "demo: the daemon's log:" >&2
    cat "$log" >&2
    exit 1
fi
grep -v '^running$' "$work/program.log" | sed 's/^/  /'
stats=$(python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.makefile().readline().strip())' "$work/stats.sock" 2>/dev/null || true)
echo "demo: the daemon's accounting (command_errors: the program's deliberate bad copy): $stats"
echo "demo: OK: $(grep 'checks passed' "$work/program.log") through rgpu ($executor executor)"
