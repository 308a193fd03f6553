#!/usr/bin/env bash
# What the driver offers against the delay that another process's kernels
# already on the GPU add to a latency-bound process (issue 8, priority),
# measured natively on the GPU host, for the design document:
#
#   priority_options.sh BUNDLE      (a folder from tests/gpu/make-bundle.sh)
#
#   1. the driver's time slice (nvidia-smi compute-policy), if this host
#      lets us change it;
#   2. MPS (if nvidia-cuda-mps-control exists): latency beside a busy client,
#      with the busy client's thread percentage and client priority lowered;
#      and whether a fault of one client reaches another;
#   3. green contexts partition one process's SMs: rgpu runs each guest
#      process in a worker of its own, so they cannot separate tenants (no
#      measurement).
# Each latency row: a process launching a 20 us kernel and synchronizing,
# 2000 times, p50/p99, beside a process keeping the GPU busy with kernels of
# about 1 ms (share_tenant.c). Environment: NATIVE_LIBCUDA, OUT (logs).
set -uo pipefail
bundle=$(cd "${1:?usage: priority_options.sh BUNDLE}" && pwd)
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
logs=${OUT:-$(mktemp -d /tmp/rgpu-priority.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-priority-work.XXXXXX)
mps_pipe=$work/mps-pipe
cleanup() {
    if [ -S "$mps_pipe/control" ] || [ -p "$mps_pipe/control" ]; then
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_pipe nvidia-cuda-mps-control >/dev/null 2>&1
    fi
    rm -rf "$work"
}
trap cleanup EXIT
ptx=$bundle/reference_kernels.ptx
mkdir -p "$work/lib"
ln -s "$native_lib" "$work/lib/libcuda.so"
for program in share_tenant fault_test; do
    source=$bundle/$program.c
    gcc -O2 -std=c11 -I "$bundle" -o "$work/$program" "$source" -L "$work/lib" -lcuda \
        || { echo "FAIL build $program"; exit 1; }
done
iterations=$(env LD_LIBRARY_PATH="$native_dir" "$work/share_tenant" --ptx "$ptx" calibrate 1 \
    | sed -n 's/^iterations //p')
echo "fixed-work kernel: $iterations iterations for about 1 ms alone"

# latency_beside LABEL [ENV for the busy process...]: one latency row.
latency_beside() {
    local label=$1
    shift
    local go=$work/go
    rm -f "$go"
    env LD_LIBRARY_PATH="$native_dir" "$work/share_tenant" --ptx "$ptx" latency 2000 "$go" \
        >"$work/lat.out" 2>&1 &
    local lat=$!
    env LD_LIBRARY_PATH="$native_dir" "$@" "$work/share_tenant" --ptx "$ptx" busy "$iterations" 4 "$go" \
        >"$work/busy.out" 2>&1 &
    local busy=$!
    sleep 2
    touch "$go"
    wait "$lat" "$busy"
    echo "$label: $(grep '^latency' "$work/lat.out" || tail -n 2 "$work/lat.out"); busy tenant: $(tail -n 1 "$work/busy.out")"
}

echo "== 1. the driver's time slice"
nvidia-smi compute-policy --help >"$logs/compute-policy-help.txt" 2>&1
echo "compute-policy --list: $(nvidia-smi compute-policy -l 2>&1 | tr '\n' ' ' | cut -c1-300)"
latency_beside "default time slice"
if nvidia-smi compute-policy --set-timeslice=1 >"$logs/set-timeslice.txt" 2>&1; then
    latency_beside "short time slice (1)"
    nvidia-smi compute-policy --set-timeslice=0 >/dev/null 2>&1
else
    echo "setting the time slice: $(tr '\n' ' ' <"$logs/set-timeslice.txt" | cut -c1-200)"
fi

echo "== 2. MPS"
if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "no nvidia-cuda-mps-control on this host"
    exit 0
fi
mkdir -p "$mps_pipe" "$work/mps-log"
export CUDA_MPS_PIPE_DIRECTORY=$mps_pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
if ! nvidia-cuda-mps-control -d >"$logs/mps-start.txt" 2>&1; then
    echo "MPS does not start: $(tr '\n' ' ' <"$logs/mps-start.txt" | cut -c1-200)"
    exit 0
fi
sleep 1
latency_beside "MPS, equal clients"
latency_beside "MPS, busy client at 50% of the threads" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
latency_beside "MPS, busy client at client priority 1 (below normal)" CUDA_MPS_CLIENT_PRIORITY=1
echo "-- a fault in one MPS client, another client mid-work"
rm -f "$work/go"
env LD_LIBRARY_PATH="$native_dir" "$work/share_tenant" --ptx "$ptx" work "$iterations" 3000 "$work/go" \
    >"$work/victim.out" 2>&1 &
victim=$!
sleep 2
touch "$work/go"
sleep 0.5
env LD_LIBRARY_PATH="$native_dir" "$work/fault_test" --ptx "$ptx" >"$work/fault.out" 2>&1
wait "$victim"
echo "faulting client: $(tail -n 1 "$work/fault.out")"
echo "other client (rc 0: unaffected): $(tail -n 1 "$work/victim.out")"
cp "$work/mps-log/"* "$logs/" 2>/dev/null
echo "logs in $logs"
