#!/usr/bin/env bash
# The sharing benchmark (issue 8), for the GPU host: native processes and
# rgpu tenants side by side, from one run, released together (staggered
# starts fake both unfairness and overlap).
#
#   sharing_bench.sh BUNDLE        (a folder from tests/gpu/make-bundle.sh)
#
# Rows:
#   - 8 equal tenants of fixed work (400 kernels of about 1 ms each),
#     natively (8 processes) and through rgpu (8 tenants of one daemon, one
#     process each): slowest/fastest and total time;
#   - two saturating tenants with compute_weight 300:100 (rgpu), GPU time
#     share of the first (target 75 +-5);
#   - a lone tenant with compute_max 30% (rgpu): work done against alone
#     (target 27-33%);
#   - a high-priority tenant's launch+synchronize latency for a 20 us
#     kernel beside a low-priority tenant saturating the GPU: p99 against
#     alone (target <= 1.5x), over up to 30000 samples or 2 s (a p99 of a
#     few thousand samples is decided by one stall of a few ms);
#   - PyTorch in a tenant with memory_limit 4GiB (memory_limit_torch.py):
#     it sees 4 GiB, a tensor past it raises torch.cuda.OutOfMemoryError, a
#     training loop that fits trains.
# Environment: NATIVE_LIBCUDA, OUT (logs).
set -uo pipefail
bundle=$(cd "${1:?usage: sharing_bench.sh BUNDLE}" && pwd)
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
logs=${OUT:-$(mktemp -d /tmp/rgpu-sharing.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-sharing-work.XXXXXX)
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
ptx=$bundle/reference_kernels.ptx
mkdir -p "$work/native-lib" "$work/rgpu-lib"
ln -s "$native_lib" "$work/native-lib/libcuda.so"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so.1"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so"
ln -s "$bundle/libnvidia_ml.so" "$work/rgpu-lib/libnvidia-ml.so.1"
for side in native rgpu; do
    gcc -O2 -std=c11 -I "$bundle" -o "$work/tenant-$side" "$bundle/share_tenant.c" \
        -L "$work/$side-lib" -lcuda || { echo "FAIL build share_tenant-$side"; exit 1; }
done
native() { env LD_LIBRARY_PATH="$native_dir" "$work/tenant-native" --ptx "$ptx" "$@"; }
through() { # tenant args...
    local tenant=$1
    shift
    env RGPU_SOCKET="$work/$tenant.sock" LD_LIBRARY_PATH="$work/rgpu-lib" "$work/tenant-rgpu" --ptx "$ptx" "$@"
}

iterations=$(native calibrate 1 | sed -n 's/^iterations //p')
echo "fixed-work kernel: $iterations iterations for about 1 ms alone"

# One daemon, tenants t1..t8 (equal), hi/lo (priority), w3/w1 (weights),
# capped (compute_max 30%).
{
    echo '[daemon]'
    printf 'control_socket = "%s/control.sock"\n' "$work"
    for t in 1 2 3 4 5 6 7 8; do
        printf '[[tenant]]\nname = "t%s"\nsocket = "%s/t%s.sock"\n' "$t" "$work" "$t"
    done
    printf '[[tenant]]\nname = "w3"\nsocket = "%s/w3.sock"\ncompute_weight = 300\n' "$work"
    printf '[[tenant]]\nname = "w1"\nsocket = "%s/w1.sock"\ncompute_weight = 100\n' "$work"
    printf '[[tenant]]\nname = "capped"\nsocket = "%s/capped.sock"\ncompute_max = "30%%"\n' "$work"
    printf '[[tenant]]\nname = "hi"\nsocket = "%s/hi.sock"\npriority = "high"\n' "$work"
    printf '[[tenant]]\nname = "lo"\nsocket = "%s/lo.sock"\npriority = "low"\n' "$work"
    printf '[[tenant]]\nname = "torch"\nsocket = "%s/torch.sock"\nmemory_limit = "4GiB"\n' "$work"
} >"$work/rgpu.toml"
env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" "$bundle/vhost-device-rgpu" --executor cuda \
    --config "$work/rgpu.toml" >"$logs/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 600); do [ -S "$work/torch.sock" ] && break; sleep 0.05; done
[ -S "$work/torch.sock" ] || { echo "FAIL daemon (see $logs/daemon.log)"; tail "$logs/daemon.log"; exit 1; }
sleep 2 # every tenant's standby ready

# Runs "$@" for each of N tenants at once, released together; prints each
# one's last output line.
release() { # start-file, then commands (one per line on stdin)
    local start=$1 pids=() i=0
    rm -f "$start"
    while IFS= read -r command; do
        i=$((i + 1))
        bash -c "$command" >"$work/out-$i" 2>&1 &
        pids+=($!)
    done
    sleep 3 # every process has its context and module
    local t0
    t0=$(date +%s.%N)
    touch "$start"
    wait "${pids[@]}"
    awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN { printf "wall %.3f\n", e - s }'
    for j in $(seq "$i"); do tail -n 1 "$work/out-$j"; done
}
# gpu_seconds TENANT: the GPU time the daemon measured for it so far.
gpu_seconds() {
    "$bundle/vhost-device-rgpu" ctl --control-socket "$work/control.sock" list \
        | awk -v t="$1" '$1 == t { print $NF }'
}
export -f native through
export work ptx native_dir

echo "== 8 equal tenants, 400 kernels each"
for side in native rgpu; do
    for t in 1 2 3 4 5 6 7 8; do
        if [ $side = native ]; then echo "native work $iterations 400 $work/go"
        else echo "through t$t work $iterations 400 $work/go"; fi
    done | release "$work/go" >"$logs/equal-$side.txt"
    wall=$(sed -n 's/^wall //p' "$logs/equal-$side.txt")
    spread=$(awk '/^done/ { t = $2; if (min == "" || t < min) min = t; if (t > max) max = t } END { printf "%.3f", max / min }' "$logs/equal-$side.txt")
    times=$(awk '/^done/ { printf "%s ", $2 }' "$logs/equal-$side.txt")
    echo "$side: total ${wall} s, slowest/fastest $spread ($times)"
    eval "equal_${side}_wall=$wall equal_${side}_spread=$spread"
done

echo "== two saturating tenants, weights 300:100 (rgpu), 4 s"
printf '%s\n' "through w3 busy $iterations 4 $work/go" "through w1 busy $iterations 4 $work/go" \
    | release "$work/go" >"$logs/weights.txt"
w3=$(sed -n '2,$s/^kernels //p' "$logs/weights.txt" | sed -n 1p)
w1=$(sed -n '2,$s/^kernels //p' "$logs/weights.txt" | sed -n 2p)
share=$(awk -v a="$w3" -v b="$w1" 'BEGIN { printf "%.1f", 100 * a / (a + b) }')
echo "w3 $w3 kernels, w1 $w1 kernels: w3's share $share% (target 75 +-5)"
g3=$(gpu_seconds w3) g1=$(gpu_seconds w1)
gpu_share=$(awk -v a="$g3" -v b="$g1" 'BEGIN { if (a + b > 0) printf "%.1f", 100 * a / (a + b); else print "-" }')
echo "GPU time measured by the daemon: w3 $g3 s, w1 $g1 s: w3's share $gpu_share%"

echo "== a lone tenant capped at 30% (rgpu), 3 s"
printf '%s\n' "through t1 busy $iterations 3 $work/go" | release "$work/go" >"$logs/alone.txt"
printf '%s\n' "through capped busy $iterations 3 $work/go" | release "$work/go" >"$logs/capped.txt"
alone=$(sed -n 's/^kernels //p' "$logs/alone.txt")
capped=$(sed -n 's/^kernels //p' "$logs/capped.txt")
cap=$(awk -v a="$alone" -v c="$capped" 'BEGIN { printf "%.1f", 100 * c / a }')
echo "alone $alone kernels, capped $capped: $cap% (target 27-33)"
echo "GPU time measured by the daemon: alone (t1, with its earlier run) $(gpu_seconds t1) s, capped $(gpu_seconds capped) s in 3 s"

echo "== latency of a 20 us kernel: alone, and beside a tenant saturating the GPU"
for side in native rgpu; do
    if [ $side = native ]; then lat="native latency 30000 $work/go"; busy="native busy $iterations 6 $work/go"
    else lat="through hi latency 30000 $work/go"; busy="through lo busy $iterations 6 $work/go"; fi
    printf '%s\n' "$lat" | release "$work/go" >"$logs/latency-alone-$side.txt"
    cp "$work/out-1" "$logs/latency-alone-$side-samples.txt"
    printf '%s\n' "$lat" "$busy" | release "$work/go" >"$logs/latency-busy-$side.txt"
    cp "$work/out-1" "$logs/latency-busy-$side-samples.txt"
    echo "$side alone: $(grep '^latency' "$logs/latency-alone-$side.txt")"
    echo "$side beside a busy tenant: $(grep '^latency' "$logs/latency-busy-$side.txt")"
    for run in alone busy; do
        sed -n "s/^\(samples\|slow\)/  $run: \1/p" "$logs/latency-$run-$side-samples.txt"
    done
done

echo "== PyTorch in a tenant limited to 4 GiB"
env RGPU_SOCKET="$work/torch.sock" LD_LIBRARY_PATH="$work/rgpu-lib" \
    python3 "$bundle/memory_limit_torch.py" >"$logs/torch.txt" 2>&1
cat "$logs/torch.txt"
torch_result=$(grep '^memory_limit_torch:' "$logs/torch.txt" || echo "no result (see $logs/torch.txt)")

cat <<EOF

| metric | native | rgpu | target |
| --- | --- | --- | --- |
| 8 equal tenants: slowest/fastest | $equal_native_spread | $equal_rgpu_spread | <= 1.10 |
| 8 equal tenants: total time | ${equal_native_wall} s | ${equal_rgpu_wall} s | rgpu <= native |
| weights 300:100: first tenant's share (kernels) | - | $share% | 75 +-5 |
| weights 300:100: first tenant's share (daemon's GPU time) | - | $gpu_share% | 75 +-5 |
| compute_max 30%: work against alone | - | $cap% | 27-33 |
| 20 us kernel beside a busy tenant, p99 | $(sed -n 's/.*p99 \([0-9.]*\) us/\1/p' "$logs/latency-busy-native.txt") us | $(sed -n 's/.*p99 \([0-9.]*\) us/\1/p' "$logs/latency-busy-rgpu.txt") us | <= 1.5x alone |
| PyTorch, memory_limit 4GiB | - | $torch_result | every check passes |
| 20 us kernel alone, p99 | $(sed -n 's/.*p99 \([0-9.]*\) us/\1/p' "$logs/latency-alone-native.txt") us | $(sed -n 's/.*p99 \([0-9.]*\) us/\1/p' "$logs/latency-alone-rgpu.txt") us | |
EOF
echo "logs in $logs"
