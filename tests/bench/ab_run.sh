#!/usr/bin/env bash
# Two prebuilt rgpu builds against each other, the builds in turn, each
# round with a daemon of its own (issue 9). sim_ab.sh builds the two and
# calls this; on the GPU host (no Rust there) the bundle carries them.
#
#   ab_run.sh OLD_DIR NEW_DIR [ROUNDS]
#
# Each DIR holds vhost-device-rgpu and libcuda.so.1. Environment:
#   AB_EXECUTOR   sim (default) or cuda;
#   AB_NATIVE     the driver's libcuda.so.1: rgpu_bench then runs native
#                 too, and each row gets the native figure and the ratio
#                 of launches taken in turn with native (cuda only);
#   AB_BENCH      a built rgpu_bench; AB_PTX the reference kernels' PTX;
#   AB_ARGS       rgpu_bench's sizes (default: a short run);
#   AB_LOGS       where daemon logs and each run's output go.
# Prints per round and build the synchronous round trip (median, µs), the
# best launch rate (1/s), launch + synchronize (µs), and with AB_NATIVE the
# native sync, the worst launch ratio of five runs in turn and the five.
set -euo pipefail
old_dir=$(cd "${1:?usage: ab_run.sh OLD_DIR NEW_DIR [ROUNDS]}" && pwd)
new_dir=$(cd "${2:?usage: ab_run.sh OLD_DIR NEW_DIR [ROUNDS]}" && pwd)
rounds=${3:-3}
executor=${AB_EXECUTOR:-sim}
bench=${AB_BENCH:?AB_BENCH: a built rgpu_bench}
ptx=${AB_PTX:?AB_PTX: the reference kernels PTX}
logs=${AB_LOGS:-$(mktemp -d /tmp/rgpu-ab.XXXXXX)}
mkdir -p "$logs"
daemon_env=()
native_args=()
if [ -n "${AB_NATIVE:-}" ]; then
    native_args=(--native "$AB_NATIVE")
    daemon_env=(LD_LIBRARY_PATH="$(dirname "$AB_NATIVE")")
fi
# shellcheck disable=SC2206 # sizes are words
sizes=(${AB_ARGS:---sync-iters 5000 --launches 300000 --mib 1 --repeats 3})
daemon_pid=
socket=
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    [ -n "$socket" ] && rm -f "$socket"
}
trap cleanup EXIT

# The figures of rgpu_bench's row ROW (native, rgpu, ratio; "-" if absent).
figures() {
    awk -v row="$1" 'index($0, row) == 1 { print substr($0, 39); exit }'
}

printf '%-5s %-5s %12s %16s %18s' round build "sync (us)" "launches (1/s)" "launch+sync (us)"
[ ${#native_args[@]} -gt 0 ] && printf ' %12s %12s  %s' "native sync" "worst ratio" "runs in turn (native/rgpu)"
printf '\n'
for round in $(seq 1 "$rounds"); do
    for label in old new; do
        dir=$old_dir
        [ "$label" = new ] && dir=$new_dir
        socket=$logs/$label.sock
        rm -f "$socket"
        env "${daemon_env[@]}" "$dir/vhost-device-rgpu" --executor "$executor" \
            --socket-path "$socket" >>"$logs/$label-daemon.log" 2>&1 &
        daemon_pid=$!
        for _ in $(seq 300); do [ -S "$socket" ] && break; sleep 0.05; done
        out=$(RGPU_SOCKET=$socket timeout 300 "$bench" --rgpu "$dir/libcuda.so.1" "${native_args[@]}" \
            --ptx "$ptx" "${sizes[@]}" 2>&1) || true
        printf '%s\n' "$out" >"$logs/round$round-$label.txt"
        kill "$daemon_pid"
        wait "$daemon_pid" 2>/dev/null || true
        daemon_pid=
        read -r sync_native sync_rgpu _ <<<"$(figures 'sync round trip, median' <<<"$out")"
        read -r _ launches _ <<<"$(figures 'empty-kernel launches, best' <<<"$out")"
        read -r _ launch_sync _ <<<"$(figures 'launch + synchronize' <<<"$out")"
        printf '%-5s %-5s %12s %16s %18s' "$round" "$label" "$sync_rgpu" "$launches" "$launch_sync"
        if [ ${#native_args[@]} -gt 0 ]; then
            read -r _ _ worst _ <<<"$(figures 'empty-kernel launches, worst run' <<<"$out")"
            printf ' %12s %12s  %s' "$sync_native" "$worst" \
                "$(sed -n 's/^  runs in turn (native\/rgpu, 1\/s)://p' <<<"$out")"
        fi
        printf '\n'
    done
done
