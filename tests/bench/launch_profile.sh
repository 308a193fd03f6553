#!/usr/bin/env bash
# Where the launch rate and the synchronous round trip go (issue 9):
# rgpu_bench's launch, sync and query rows, native and through rgpu, in ROUNDS
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
name=launch-profile
# shellcheck source=tests/bench/profiling.sh
. "$(dirname "${BASH_SOURCE[0]}")/profiling.sh"
gcc -O2 -std=c11 -I "$bundle" -o "$work/rgpu_bench" "$bundle/rgpu_bench.c" -ldl || exit 1
native=()
[ -e "$native_lib" ] && native=(--native "$native_lib")
for round in $(seq "$rounds"); do
    # shellcheck disable=SC2046 # pin's words are meant to split
    start_profiling_daemon "$logs/daemon-$round.log" $(pin "${TASKSET_DAEMON:-}")
    sleep 1
    echo "== round $round"
    # shellcheck disable=SC2046
    env RGPU_SOCKET="$socket" RGPU_PROFILE_CALLS=1 RGPU_LOG=info $(pin "${TASKSET_PROGRAM:-}") \
        "$work/rgpu_bench" "${native[@]}" --rgpu "$work/rgpu-lib/libcuda.so.1" \
        --ptx "$bundle/reference_kernels.ptx" --sync-iters 20000 --launches 100000 --mib 1 \
        --repeats 1 2>&1 | grep -E "sync round trip, median|sync, after|launches|launch \+|quer|behind queued|call profile" \
        | tee "$logs/bench-$round.txt"
    stop_profiling_daemon "$logs/daemon-$round.log"
done
gcc -O2 -o "$work/pingpong" "$bundle/pingpong.c" && "$work/pingpong" 200000 | tee "$logs/pingpong.txt"
