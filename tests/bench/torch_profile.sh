#!/usr/bin/env bash
# Where PyTorch's time goes through rgpu (issue 9): torch_train.py once
# natively and once through a daemon whose sessions time every launch and
# waited synchronize (RGPU_PROFILE_LAUNCHES=1), the guest library timing
# each call it waits for (RGPU_PROFILE_CALLS=1). Prints both runs' steps per
# second and the profiles: how many calls of a training run wait for the
# host, and what they cost. Run from the repository root on the GPU host:
#
#   tests/bench/torch_profile.sh BUNDLE [STEPS]
#
# TASKSET_DAEMON / TASKSET_PROGRAM pin the daemon or the training runs (both
# sides) to CPUs; RGPU_DAEMON_ARGS adds daemon options. Logs go to $OUT (or
# a temp folder).
set -uo pipefail
bundle=$(cd "${1:?usage: torch_profile.sh BUNDLE [STEPS]}" && pwd)
steps=${2:-400}
name=torch-profile
# shellcheck source=tests/bench/profiling.sh
. "$(dirname "${BASH_SOURCE[0]}")/profiling.sh"
# shellcheck disable=SC2046 # pin's words are meant to split
start_profiling_daemon "$logs/daemon.log" $(pin "${TASKSET_DAEMON:-}")
# shellcheck disable=SC2046
echo "native: $(env LD_LIBRARY_PATH="$(dirname "$native_lib")" $(pin "${TASKSET_PROGRAM:-}") \
    python3 "$bundle/torch_train.py" "$steps")"
# The guest library and the worker log a session's profile as it closes:
# the primary context, which PyTorch never releases (and holds several
# times over), is reset at the end.
# shellcheck disable=SC2046
env RGPU_SOCKET="$socket" RGPU_PROFILE_CALLS=1 RGPU_LOG=info LD_LIBRARY_PATH="$work/rgpu-lib" \
    $(pin "${TASKSET_PROGRAM:-}") python3 -c 'import ctypes, runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
print("primary context reset:", ctypes.CDLL("libcuda.so.1").cuDevicePrimaryCtxReset_v2(0))' \
    "$bundle/torch_train.py" "$steps" >"$logs/rgpu.txt" 2>&1
echo "rgpu: $(grep steps_per_s "$logs/rgpu.txt"); $(grep "reset:" "$logs/rgpu.txt")"
grep -h "call profile" "$logs/rgpu.txt" | sed 's/.*call profile: /guest: /'
stop_profiling_daemon "$logs/daemon.log"
