#!/usr/bin/env bash
# Two builds of rgpu against each other on the sim executor, on any
# machine (no GPU needed): what the guest library and the worker cost
# around the driver, free of the GPU host's run-to-run spread (issue 9).
#
#   tests/bench/sim_ab.sh OLD_REF [NEW_REF] [ROUNDS]
#
# Builds guest-lib and the daemon (release, sim executor) of OLD_REF and of
# NEW_REF (default: the working tree) in worktrees, then runs rgpu_bench's
# rgpu side against each build's own daemon, the two builds in turn, ROUNDS
# times (default 3), printing per round the synchronous round trip (median,
# µs), the best empty-kernel launch rate (1/s) and launch + synchronize
# (µs). Builds are kept in $RGPU_AB_CACHE (default /tmp/rgpu-sim-ab) for the
# next run. On a 2-core machine a round varies by up to 10%: compare
# ranges over the rounds, not single figures.
set -euo pipefail
old_ref=${1:?usage: sim_ab.sh OLD_REF [NEW_REF] [ROUNDS]}
new_ref=${2:-}
rounds=${3:-3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${RGPU_AB_CACHE:-/tmp/rgpu-sim-ab}
mkdir -p "$cache"

# build LABEL REF: release guest-lib and sim daemon of REF (the working tree
# when REF is empty) into $cache/LABEL.
build() {
    echo "== building $1 (${2:-working tree})" >&2
    "$repo/tests/bench/build_ref.sh" "$2" "$cache/$1" "$cache/target-$1" --features sim
}

build old "$old_ref"
build new "$new_ref"
gcc -O2 -std=c11 -I "$repo/tests/programs" -o "$cache/rgpu_bench" "$repo/tests/bench/rgpu_bench.c" -ldl
AB_BENCH=$cache/rgpu_bench AB_PTX=$repo/tests/programs/reference_kernels.ptx AB_LOGS=$cache/logs \
    "$repo/tests/bench/ab_run.sh" "$cache/old" "$cache/new" "$rounds"
