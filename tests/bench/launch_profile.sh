#!/usr/bin/env bash
# Where the launch rate and the synchronous round trip go (issue 9):
# rgpu_bench's launch and sync rows, native and through rgpu, in ROUNDS
# rounds, each against a fresh daemon whose sessions time every launch and
# every cuCtxSynchronize (RGPU_PROFILE_LAUNCHES=1) and log, when they end,
# how long reading it from the ring, executing it and the bookkeeping after
# (the reply included) took, and the guest library's own split of each
# waited call (RGPU_PROFILE_CALLS=1: writing the command, then waiting for
# the answer and reading it). Then tests/bench/pingpong: the floor of a
# round trip through shared memory on this machine, with rgpu's ring
# layouts. Run from the repository root on the GPU host:
#
#   tests/bench/launch_profile.sh BUNDLE [ROUNDS]
#
# RGPU_EXECUTOR=sim tries the script without a GPU (no native side).
# RGPU_DAEMON_ARGS adds daemon options (e.g. "--worker-seccomp off");
# TASKSET_DAEMON / TASKSET_PROGRAM pin the daemon or the program to CPUs.
# Logs go to $OUT (or a temp folder).
set -uo pipefail
bundle=$(cd "${1:?usage: launch_profile.sh BUNDLE [ROUNDS]}" && pwd)
rounds=${2:-3}
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
logs=${OUT:-$(mktemp -d /tmp/rgpu-launch-profile.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-launch-profile-work.XXXXXX)
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/rgpu-lib"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so.1"
gcc -O2 -std=c11 -I "$bundle" -o "$work/rgpu_bench" "$bundle/rgpu_bench.c" -ldl || exit 1
pin() { [ -n "$1" ] && echo taskset -c "$1"; }
socket=$work/rgpu.sock
native=()
[ -e "$native_lib" ] && native=(--native "$native_lib")
for round in $(seq "$rounds"); do
    rm -f "$socket"
    # shellcheck disable=SC2046 # pin's words are meant to split
    env LD_LIBRARY_PATH="$(dirname "$native_lib")" RGPU_PROFILE_LAUNCHES=1 \
        $(pin "${TASKSET_DAEMON:-}") "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" \
        --socket-path "$socket" ${RGPU_DAEMON_ARGS:-} >"$logs/daemon-$round.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 600); do [ -S "$socket" ] && break; sleep 0.05; done
    [ -S "$socket" ] || { echo "FAIL daemon (see $logs/daemon-$round.log)"; exit 1; }
    sleep 1
    echo "== round $round"
    # shellcheck disable=SC2046
    env RGPU_SOCKET="$socket" RGPU_PROFILE_CALLS=1 RGPU_LOG=info $(pin "${TASKSET_PROGRAM:-}") \
        "$work/rgpu_bench" "${native[@]}" --rgpu "$work/rgpu-lib/libcuda.so.1" \
        --ptx "$bundle/reference_kernels.ptx" --sync-iters 20000 --launches 100000 --mib 1 \
        --repeats 1 2>&1 | grep -E "sync round trip, median|launches|launch \+|call profile" \
        | tee "$logs/bench-$round.txt"
    # The session logs its profile as it ends.
    sleep 1
    kill "$daemon_pid" && wait "$daemon_pid" 2>/dev/null
    daemon_pid=
    grep -h "profile: " "$logs/daemon-$round.log" | sed 's/.*profile: /profile: /'
done
gcc -O2 -o "$work/pingpong" "$bundle/pingpong.c" && "$work/pingpong" 200000 | tee "$logs/pingpong.txt"
