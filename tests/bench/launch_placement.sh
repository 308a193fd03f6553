#!/usr/bin/env bash
# Whether thread placement or a daemon option explains the run-to-run
# spread of the launch rate (issue 9), on the GPU host:
#
#   launch_placement.sh BUNDLE [LABEL:APP_CPUS:DAEMON_CPUS[:DAEMON_ARGS[:BENCH_ARGS[:BUILD]]]] ...
#
# Starts one daemon per layout (default: nothing pinned; the benchmark on
# CPU 0 and the daemon on 2-3; on 0 and 2-9; on 2 and 8-9), under
# `taskset` when CPUs are given and with DAEMON_ARGS, then runs rgpu_bench
# (with BENCH_ARGS) against each layout's daemon in turn, ROUNDS times
# (default 3), printing
# the five launch runs in turn (native/rgpu, 1/s), their worst and mean
# ratio, the sync round trip (native, rgpu, difference) and launch + sync
# after 1 ms idle (native, rgpu, ratio; us). BUILD is a
# folder in BUNDLE with another build's vhost-device-rgpu and
# libcuda.so.1 (ab-old, from make-bundle.sh with RGPU_AB_OLD), or
# `native`: no daemon, NVIDIA's library on the rgpu side too (a control).
# BUNDLE is a folder from tests/gpu/make-bundle.sh; ROUNDS comes from
# $ROUNDS; logs go to $OUT when set.
set -uo pipefail
bundle=$(cd "${1:?usage: launch_placement.sh BUNDLE [LABEL:APP_CPUS:DAEMON_CPUS ...]}" && pwd)
shift
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=(free:: "app0-d2-3:0:2,3" app0-d2-9:0:2-9 "app2-d8-9:2:8,9")
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
work=$(mktemp -d /tmp/rgpu-placement.XXXXXX)
logs=${OUT:-$work}
daemons=()
cleanup() {
    for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$logs"
gcc -O2 -std=c11 -I "$bundle" -o "$work/rgpu_bench" "$bundle/rgpu_bench.c" -ldl || exit 1
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))"
for layout in "${layouts[@]}"; do
    IFS=: read -r label _ daemon_cpus daemon_args _ build <<<"$layout"
    [ "$build" = native ] && continue
    build_dir=$bundle/${build:-.}
    guest_lib=$build_dir/libcuda.so.1
    [ -e "$guest_lib" ] || guest_lib=$build_dir/libcuda.so
    mkdir -p "$work/lib-$label"
    ln -s "$guest_lib" "$work/lib-$label/libcuda.so.1"
    daemon=()
    [ -n "$daemon_cpus" ] && daemon=(taskset -c "$daemon_cpus")
    socket=$work/$label.sock
    # shellcheck disable=SC2086 # the options are words
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" "${daemon[@]}" "$build_dir/vhost-device-rgpu" \
        --executor cuda --socket-path "$socket" $daemon_args >"$logs/daemon-$label.log" 2>&1 &
    daemons+=($!)
    for _ in $(seq 200); do [ -S "$socket" ] && break; sleep 0.05; done
done
for rep in $(seq "${ROUNDS:-3}"); do
    for layout in "${layouts[@]}"; do
        IFS=: read -r label app_cpus _ _ bench_args build <<<"$layout"
        rgpu_lib=$work/lib-$label/libcuda.so.1
        [ "$build" = native ] && rgpu_lib=$native_lib
        app=()
        [ -n "$app_cpus" ] && app=(taskset -c "$app_cpus")
        out=$logs/bench-$label-$rep.txt
        # shellcheck disable=SC2086 # the options are words
        RGPU_SOCKET=$work/$label.sock "${app[@]}" "$work/rgpu_bench" --native "$native_lib" \
            --rgpu "$rgpu_lib" --ptx "$bundle/reference_kernels.ptx" \
            --sync-iters 2000 --launches 100000 --mib 1 --repeats 1 $bench_args >"$out" 2>&1
        runs=$(grep 'runs in turn' "$out" | sed 's/.*1\/s)://')
        ratios=$(tr ' ' '\n' <<<"$runs" | awk -F/ 'NF == 2 { r = $2 / $1; s += r; n++
            if (n == 1 || r < w) w = r } END { if (n) printf "worst %.3f mean %.3f", w, s / n }')
        echo "$label rep $rep: $runs | $ratios | sync" \
            "$(grep 'sync round trip, median' "$out" | awk '{print $6, $7, $8}')" \
            "| after idle $(grep 'after 1 ms idle' "$out" | awk '{print $9, $10, $11}')"
    done
done
