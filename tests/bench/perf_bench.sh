#!/usr/bin/env bash
# Issue 9's benchmark on the GPU host, native and rgpu side by side from
# one run:
#
#   perf_bench.sh BUNDLE        (a folder from tests/gpu/make-bundle.sh)
#
#   1. rgpu_bench: sync round trip, launch throughput (five runs), launch +
#      synchronize, event and stream queries idle and behind 200 launches,
#      a 4 KiB pageable copy, 256 MiB pinned and pageable both ways; and
#      again with rgpu's blobs scattered (RGPU_LOCAL_SCATTER_BLOBS=1); then
#      the control: its sync, launch and query rows with NVIDIA's library
#      on both sides, the host's own spread in this run (lines "control:"),
#      and its launch runs in turn again with the second side launching
#      from a thread of its own (the spread between two vCPUs); then the
#      launch runs in turn with the driver called from one CPU on both
#      sides (lines "pinned:"): a second daemon with --launch-cpus K, the
#      benchmark's native blocks on K and its rgpu caller on M
#      (PINNED_CPUS=K,M, default 2,0), and the control so pinned;
#   2. start-up: 1 and 8 short driver-API programs started at once (wall
#      time until all are done);
#   3. PyTorch: torch_train.py, three alternating native/rgpu pairs; the
#      median ratio of steps per second, and the losses; again against the
#      pinned daemon with the training loop's thread on M on both sides
#      (lines "pinned:").
# Environment: NATIVE_LIBCUDA, OUT (logs), RGPU_DAEMON_ARGS (more daemon
# options); with RGPU_SERVER set (and --listen among those options) every
# rgpu run goes through the network carrier, and the scattered-blob rows
# give way to a plain TLS loopback stream of 256 MiB (tls_loopback_bench),
# the yardstick of the copy rows (issue 11).
set -uo pipefail
bundle=$(cd "${1:?usage: perf_bench.sh BUNDLE}" && pwd)
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
logs=${OUT:-$(mktemp -d /tmp/rgpu-perf.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-perf-work.XXXXXX)
daemon_pid= pinned_pid=
cleanup() {
    for pid in $daemon_pid $pinned_pid; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
ptx=$bundle/reference_kernels.ptx
mkdir -p "$work/native-lib" "$work/rgpu-lib"
ln -s "$native_lib" "$work/native-lib/libcuda.so"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so.1"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so"
ln -s "$bundle/libnvidia_ml.so" "$work/rgpu-lib/libnvidia-ml.so.1"
gcc -O2 -std=c11 -I "$bundle" -o "$work/rgpu_bench" "$bundle/rgpu_bench.c" -ldl || exit 1
for side in native rgpu; do
    gcc -O2 -std=c11 -I "$bundle" -o "$work/short-$side" "$bundle/memory_limit_test.c" \
        -L "$work/$side-lib" -lcuda || exit 1
done
socket=$work/rgpu.sock
env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" "$bundle/vhost-device-rgpu" --executor cuda \
    --socket-path "$socket" ${RGPU_DAEMON_ARGS:-} >"$logs/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 600); do [ -S "$socket" ] && break; sleep 0.05; done
[ -S "$socket" ] || { echo "FAIL daemon (see $logs/daemon.log)"; exit 1; }
sleep 1

echo "== 1. rgpu_bench"
env RGPU_SOCKET="$socket" "$work/rgpu_bench" --native "$native_lib" \
    --rgpu "$work/rgpu-lib/libcuda.so.1" --ptx "$ptx" | tee "$logs/rgpu_bench.txt"
if [ -z "${RGPU_SERVER:-}" ]; then
    echo "-- with scattered blobs"
    env RGPU_SOCKET="$socket" RGPU_LOCAL_SCATTER_BLOBS=1 "$work/rgpu_bench" --native "$native_lib" \
        --rgpu "$work/rgpu-lib/libcuda.so.1" --ptx "$ptx" --sync-iters 1000 --launches 10000 \
        | grep -E "pinned|pageable" | tee "$logs/rgpu_bench-scattered.txt"
elif [ -x "$bundle/tls_loopback_bench" ]; then
    echo "-- the yardstick of the copy rows over the network carrier"
    "$bundle/tls_loopback_bench" 256 | tee "$logs/tls_loopback.txt"
fi

echo "-- control: NVIDIA's library on both sides"
"$work/rgpu_bench" --native "$native_lib" --rgpu "$native_lib" --ptx "$ptx" --sync-iters 20000 \
    --launches 100000 --mib 1 --repeats 1 >"$logs/rgpu_bench-control.txt" 2>&1
grep -E "sync round trip, median|sync, after|empty-kernel launches|runs in turn|, queued" \
    "$logs/rgpu_bench-control.txt" | sed 's/^/control: /'
# The same library's second side launching from a thread of its own, as
# rgpu's launch thread does: another vCPU's share of the host's spread.
"$work/rgpu_bench" --native "$native_lib" --rgpu "$native_lib" --ptx "$ptx" --sync-iters 1000 \
    --launches 100000 --mib 1 --repeats 1 --rgpu-side-launcher thread \
    >"$logs/rgpu_bench-control-thread.txt" 2>&1
grep -E "worst run|runs in turn" "$logs/rgpu_bench-control-thread.txt" | sed 's/^/control: /'
# The driver's launch rate differs between CPUs: rgpu's launch thread and
# the native side pinned to the same one, the daemon's other threads and
# rgpu's caller elsewhere.
# shellcheck source=tests/bench/pinned_cpus.sh
source "$(dirname "$0")/pinned_cpus.sh"
if [ -z "${RGPU_SERVER:-}" ] && [ "$(nproc)" -ge 4 ]; then
    pinned_socket=$work/pinned.sock
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" taskset -c "$others" "$bundle/vhost-device-rgpu" \
        --executor cuda --socket-path "$pinned_socket" --launch-cpus "$driver_cpu" ${RGPU_DAEMON_ARGS:-} \
        >"$logs/daemon-pinned.log" 2>&1 &
    pinned_pid=$!
    for _ in $(seq 600); do [ -S "$pinned_socket" ] && break; sleep 0.05; done
    pinning=(--sync-iters 1000 --launches 100000 --mib 1 --repeats 1 --driver-cpu "$driver_cpu"
        --caller-cpu "$caller_cpu")
    env RGPU_SOCKET="$pinned_socket" "$work/rgpu_bench" --native "$native_lib" \
        --rgpu "$work/rgpu-lib/libcuda.so.1" --ptx "$ptx" "${pinning[@]}" >"$logs/rgpu_bench-pinned.txt" 2>&1
    grep -E "worst run|runs in turn" "$logs/rgpu_bench-pinned.txt" | sed 's/^/pinned: /'
    "$work/rgpu_bench" --native "$native_lib" --rgpu "$native_lib" --ptx "$ptx" "${pinning[@]}" \
        --rgpu-side-launcher thread >"$logs/rgpu_bench-pinned-control.txt" 2>&1
    grep -E "worst run|runs in turn" "$logs/rgpu_bench-pinned-control.txt" | sed 's/^/pinned: control: /'
fi

echo "== 2. start-up: short programs started at once"
run_at_once() { # side count
    local side=$1 count=$2 pids=() start
    start=$(date +%s.%N)
    for _ in $(seq "$count"); do
        if [ "$side" = native ]; then
            env LD_LIBRARY_PATH="$native_dir" "$work/short-native" --max-mb 16 >/dev/null 2>&1 &
        else
            env RGPU_SOCKET="$socket" LD_LIBRARY_PATH="$work/rgpu-lib" "$work/short-rgpu" \
                --max-mb 16 >/dev/null 2>&1 &
        fi
        pids+=($!)
    done
    wait "${pids[@]}"
    awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.3f", e - s }'
}
for count in 1 8; do
    n=$(run_at_once native "$count") r=$(run_at_once rgpu "$count")
    echo "$count at once: native $n s, rgpu $r s, ratio $(awk -v n="$n" -v r="$r" 'BEGIN { printf "%.2f", r / n }') (target <= 1.2 for 8)"
done

# torch_pairs SOCKET LABEL [ENV...]: three alternating native/rgpu pairs of
# torch_train.py (ENV for both runs), their median ratio of steps per second.
torch_pairs() {
    local socket=$1 label=$2 ratios=() pair n r
    shift 2
    for pair in 1 2 3; do
        n=$(env "$@" LD_LIBRARY_PATH="$native_dir" python3 "$bundle/torch_train.py" \
            2>"$logs/torch-${label:-plain}-native-$pair.err")
        r=$(env "$@" RGPU_SOCKET="$socket" LD_LIBRARY_PATH="$work/rgpu-lib" python3 "$bundle/torch_train.py" \
            2>"$logs/torch-${label:-plain}-rgpu-$pair.err")
        echo "${label:+$label: }pair $pair: native $n | rgpu $r"
        ratios+=("$(awk -v n="${n#steps_per_s }" -v r="${r#steps_per_s }" 'BEGIN { split(n, a, " "); split(r, b, " "); if (a[1] > 0) printf "%.3f", b[1] / a[1] }')")
    done
    printf '%s\n' "${ratios[@]}" | sort -n | sed -n 2p \
        | awk -v label="${label:+$label: }" '{ print label "median steps/s ratio " $1 " (target >= 0.98, identical loss)" }'
}
echo "== 3. PyTorch training, three alternating pairs"
torch_pairs "$socket" ""
# The vCPUs differ in speed: the training loop's thread on the caller's
# CPU on both sides, rgpu's launch thread on the driver's.
if [ -n "$pinned_pid" ]; then
    torch_pairs "$pinned_socket" pinned TORCH_TRAIN_CPU="$caller_cpu"
fi
echo "logs in $logs"
