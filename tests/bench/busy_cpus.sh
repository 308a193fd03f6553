#!/usr/bin/env bash
# Whether busy CPUs slow the driver's own calls on the GPU host (issue 9:
# rgpu keeps more threads busy than the native program it stands in for):
# rgpu_bench's native side alone, then beside 2 and 4 processes spinning on
# other CPUs, in ROUNDS rounds; prints its sync rows and best launch rate.
#
#   tests/bench/busy_cpus.sh BUNDLE [ROUNDS] [FIRST_CPU]
#
# The spinners are pinned from FIRST_CPU on (default 8). BUNDLE is a folder
# from tests/gpu/make-bundle.sh; NATIVE_LIBCUDA names the driver.
set -uo pipefail
bundle=$(cd "${1:?usage: busy_cpus.sh BUNDLE [ROUNDS] [FIRST_CPU]}" && pwd)
rounds=${2:-2}
first=${3:-8}
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
work=$(mktemp -d /tmp/rgpu-busy-cpus.XXXXXX)
spinners=()
stop_spinners() {
    [ ${#spinners[@]} -gt 0 ] && kill "${spinners[@]}" 2>/dev/null && wait "${spinners[@]}" 2>/dev/null
    spinners=()
}
trap 'stop_spinners; rm -rf "$work"' EXIT
gcc -O2 -std=c11 -I "$bundle" -o "$work/rgpu_bench" "$bundle/rgpu_bench.c" -ldl || exit 1
for round in $(seq "$rounds"); do
    for count in 0 2 4; do
        for cpu in $(seq "$first" $((first + count - 1))); do
            taskset -c "$cpu" sh -c 'while :; do :; done' &
            spinners+=($!)
        done
        echo "== round $round: native beside $count spinning processes"
        "$work/rgpu_bench" --native "$native_lib" --ptx "$bundle/reference_kernels.ptx" \
            --sync-iters 20000 --launches 100000 --mib 1 --repeats 1 2>&1 \
            | grep -E "sync round trip, median|sync, after|launches, best"
        stop_spinners
    done
done
