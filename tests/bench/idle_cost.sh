#!/usr/bin/env bash
# What a call after an idle gap costs through rgpu, and what the daemon's
# CPUs pay for it, under daemon options that trade one for the other
# (--host-spin-us), on any machine (sim) or the GPU host (cuda):
#
#   idle_cost.sh DAEMON GUEST_LIB [DAEMON_ARGS ...]
#
# For each DAEMON_ARGS (default: none, and "--host-spin-us 5000"), starts
# DAEMON (with --executor $EXECUTOR, default cuda) and runs a client
# (python3, ctypes on GUEST_LIB through the local carrier) that makes a
# context, then calls cuCtxSynchronize CALLS times (default 200), each
# after GAP_MS idle (default 5), and prints the calls' median and 90th
# percentile (us) and the CPU time the daemon's processes (the daemon, its
# connection processes and workers) used over those calls: user and
# system ticks of 10 ms, from /proc. Logs go to $OUT when set.
set -uo pipefail
daemon=${1:?usage: idle_cost.sh DAEMON GUEST_LIB [DAEMON_ARGS ...]}
guest_lib=${2:?usage: idle_cost.sh DAEMON GUEST_LIB [DAEMON_ARGS ...]}
shift 2
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=("" "--host-spin-us 5000")
work=$(mktemp -d /tmp/rgpu-idle-cost.XXXXXX)
logs=${OUT:-$work}
mkdir -p "$logs"
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/client.py" <<'EOF'
import ctypes, os, statistics, sys, time

def family_ticks(root):
    """User and system ticks of root and its descendants (two levels)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parents[int(entry)] = (int(fields[1]), int(fields[11]), int(fields[12]))
            except OSError:
                pass
    members = {root} | {p for p, v in parents.items() if v[0] == root}
    members |= {p for p, v in parents.items() if v[0] in members}
    user = sum(parents[p][1] for p in members if p in parents)
    system = sum(parents[p][2] for p in members if p in parents)
    return user, system

cuda = ctypes.CDLL(sys.argv[1])
calls, gap, daemon = int(sys.argv[2]), float(sys.argv[3]) / 1000, int(sys.argv[4])
ctx = ctypes.c_void_p()
device = ctypes.c_int()
for name, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), 0)),
                   ("cuCtxCreate_v2", (ctypes.byref(ctx), 0, device))):
    code = getattr(cuda, name)(*args)
    if code != 0:
        sys.exit(f"FAIL {name}: CUDA error {code}")
sync = cuda.cuCtxSynchronize
sync()
before = family_ticks(daemon)
times = []
for _ in range(calls):
    time.sleep(gap)
    start = time.perf_counter_ns()
    code = sync()
    times.append((time.perf_counter_ns() - start) / 1000)
    if code != 0:
        sys.exit(f"FAIL cuCtxSynchronize: CUDA error {code}")
after = family_ticks(daemon)
times.sort()
print(f"sync after {gap * 1000:g} ms idle: median {statistics.median(times):.1f} us, "
      f"p90 {times[int(len(times) * 0.9)]:.1f} us; daemon CPU over {calls} calls: "
      f"user {after[0] - before[0]} system {after[1] - before[1]} ticks")
EOF

for variant in "${variants[@]}"; do
    socket=$work/rgpu.sock
    rm -f "$socket"
    # shellcheck disable=SC2086 # the options are words
    "$daemon" --executor "${EXECUTOR:-cuda}" --socket-path "$socket" $variant \
        >"$logs/daemon${variant// /}.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 200); do [ -S "$socket" ] && break; sleep 0.05; done
    [ -S "$socket" ] || { echo "FAIL daemon ${variant:-(defaults)}: no socket"; exit 1; }
    echo "${variant:-(defaults)}: $(RGPU_SOCKET=$socket python3 "$work/client.py" "$guest_lib" \
        "${CALLS:-200}" "${GAP_MS:-5}" "$daemon_pid" 2>&1 | tail -1)"
    kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    daemon_pid=
done
