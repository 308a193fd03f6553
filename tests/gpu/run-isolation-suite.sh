#!/usr/bin/env bash
# Issue 7 on the GPU host: a guest process reaches only its own memory, and
# a worker process costs what a native process costs. For the bundle of
# tests/gpu/make-bundle.sh, beside run-gpu-suite.sh:
#
#   run-isolation-suite.sh [BUNDLE]
#
# Natively and through rgpu (local mode, --executor cuda):
#   - forged_pointer_test: copies and memsets at addresses never handed out
#     (including a scan of 0x7e0000000000-0x800000000000 in 64 MiB steps);
#   - foreign_pointer_test: a second process given the first's pointer;
#   - kernel_probe_test: a kernel handed another process's pinned memory
#     (natively its pointer; through rgpu also the address its worker
#     mapped it at, read off the daemon's debug log);
#   - device memory of one process with one context (nvidia-smi), native
#     process against rgpu's worker, and what the standby holds;
# and natively only (registration_probe): which registrations another
# context reaches, and what registering a blob costs.
# Prints PASS/FAIL per step and MEASURED lines; exit status = failures.
set -uo pipefail

bundle=$(cd "${1:-$(dirname "$0")}" && pwd)
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
cuda_home=${CUDA_HOME:-/usr/local/cuda}
logs=${OUT:-$(mktemp -d /tmp/rgpu-isolation.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-isolation-work.XXXXXX)
failures=0
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+ ($2)}"; failures=$((failures + 1)); }

mkdir -p "$work/native-lib" "$work/rgpu-lib"
ln -s "$native_lib" "$work/native-lib/libcuda.so"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so.1"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so"
ptx=$bundle/reference_kernels.ptx
native=(env LD_LIBRARY_PATH="$native_dir")

for program in forged_pointer_test foreign_pointer_test kernel_probe_test driver_api_test; do
    for side in native rgpu; do
        gcc -O2 -std=c11 -Wall -I "$bundle" -o "$work/$program-$side" "$bundle/$program.c" \
            -L "$work/$side-lib" -lcuda >"$logs/build-$program-$side.log" 2>&1 \
            || fail "build $program-$side" "see $logs/build-$program-$side.log"
    done
done
gcc -O2 -Wall -I "$cuda_home/include" -o "$work/registration_probe" "$bundle/registration_probe.c" \
    -L "$work/native-lib" -lcuda >"$logs/build-registration_probe.log" 2>&1 \
    || fail "build registration_probe" "see $logs/build-registration_probe.log"

socket=$work/rgpu.sock
env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" RGPU_LOG=debug \
    "$bundle/vhost-device-rgpu" --executor cuda --socket-path "$socket" \
    --stats-socket "$work/stats.sock" >"$logs/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$socket" ] && break; sleep 0.05; done
[ -S "$socket" ] || { fail "daemon" "see $logs/daemon.log"; exit 1; }
through_rgpu=(env RGPU_SOCKET="$socket" LD_LIBRARY_PATH="$work/rgpu-lib")

# 1. Forged pointers, copies and memsets.
for side in native rgpu; do
    if [ "$side" = native ]; then cmd=("${native[@]}"); else cmd=("${through_rgpu[@]}"); fi
    if timeout 300 "${cmd[@]}" "$work/forged_pointer_test-$side" \
        >"$logs/forged-$side.log" 2>&1 && grep -q "checks passed" "$logs/forged-$side.log"; then
        pass "forged_pointer_test $side: $(grep 'checks passed' "$logs/forged-$side.log")"
    else
        fail "forged_pointer_test $side" "see $logs/forged-$side.log"
        tail -n 15 "$logs/forged-$side.log" | sed 's/^/    /'
    fi
done

# 2. Another process's pointer, copies and memsets.
for side in native rgpu; do
    if [ "$side" = native ]; then cmd=("${native[@]}"); else cmd=("${through_rgpu[@]}"); fi
    rm -f "$work/stop"
    "${cmd[@]}" "$work/foreign_pointer_test-$side" own --stop-file "$work/stop" \
        >"$logs/foreign-owner-$side.log" 2>&1 &
    owner=$!
    for _ in $(seq 400); do grep -q '^pointer ' "$logs/foreign-owner-$side.log" && break; sleep 0.05; done
    pointer=$(sed -n 's/^pointer //p' "$logs/foreign-owner-$side.log")
    timeout 120 "${cmd[@]}" "$work/foreign_pointer_test-$side" probe "$pointer" \
        >"$logs/foreign-probe-$side.log" 2>&1
    probe_rc=$?
    touch "$work/stop"
    wait "$owner"
    owner_rc=$?
    if [ $probe_rc = 0 ] && [ $owner_rc = 0 ] && grep -q "intact=yes" "$logs/foreign-owner-$side.log"; then
        pass "foreign_pointer_test $side: $(grep 'checks passed' "$logs/foreign-probe-$side.log"), owner intact"
    else
        fail "foreign_pointer_test $side" "probe rc $probe_rc owner rc $owner_rc"
        cat "$logs/foreign-probe-$side.log" "$logs/foreign-owner-$side.log" | sed 's/^/    /'
    fi
done

# 3. A kernel handed another process's pinned memory.
for side in native rgpu; do
    if [ "$side" = native ]; then cmd=("${native[@]}"); else cmd=("${through_rgpu[@]}"); fi
    timeout 120 "${cmd[@]}" "$work/kernel_probe_test-$side" --ptx "$ptx" self \
        >"$logs/kernel-self-$side.log" 2>&1
    if grep -q "read self: rc 0 CUDA_SUCCESS secret yes" "$logs/kernel-self-$side.log"; then
        pass "kernel_probe_test $side: the probing kernel reads its own memory"
    else
        fail "kernel_probe_test $side self" "$(cat "$logs/kernel-self-$side.log")"
    fi
    rm -f "$work/stop"
    "${cmd[@]}" "$work/kernel_probe_test-$side" --ptx "$ptx" pinned --stop-file "$work/stop" \
        >"$logs/kernel-owner-$side.log" 2>&1 &
    owner=$!
    for _ in $(seq 400); do grep -q '^pinned ' "$logs/kernel-owner-$side.log" && break; sleep 0.05; done
    addresses=$(sed -n 's/^pinned //p' "$logs/kernel-owner-$side.log")
    if [ "$side" = rgpu ]; then
        mapped=$(grep "blob of 1048576 bytes in " "$logs/daemon.log" | tail -n1 | sed -n 's/.*mapped at \(0x[0-9a-f]*\).*/\1/p')
        addresses="$addresses $mapped"
    fi
    for address in $addresses; do
        timeout 120 "${cmd[@]}" "$work/kernel_probe_test-$side" --ptx "$ptx" read "$address" \
            >>"$logs/kernel-read-$side.log" 2>&1
    done
    touch "$work/stop"
    wait "$owner"
    echo "MEASURED kernel reads of another process's pinned memory ($side):"
    sed 's/^/    /' "$logs/kernel-read-$side.log"
    reads=$(grep -c '^read 0x' "$logs/kernel-read-$side.log")
    leaked=$(grep '^read 0x' "$logs/kernel-read-$side.log" | grep -c 'secret yes')
    if [ "$reads" -ge 1 ] && [ "$leaked" = 0 ]; then
        pass "kernel_probe_test $side: $reads probes, no secret read"
    else
        fail "kernel_probe_test $side" "$leaked of $reads probes read the secret"
    fi
done

# 4. Device memory of one process with one context. The test allocates
# and frees in every iteration, so one sample may land inside an
# iteration: five samples 250 ms apart, and the least of them (the memory
# held between iterations) is compared.
side_mib() { # csv file, process name pattern -> least per-sample sum (MiB)
    awk -F', ' -v name="$2" '
        /^sample/ { if (n++) { if (min == "" || sum < min) min = sum }; sum = 0; next }
        $0 ~ name { gsub(/ MiB/, "", $3); sum += $3 }
        END { if (n) { if (min == "" || sum < min) min = sum }; print min + 0 }' "$1"
}
for side in native rgpu; do
    # A destroyed stream handle is undefined behaviour with NVIDIA's driver.
    if [ "$side" = native ]; then cmd=("${native[@]}"); extra=(--no-bogus-handles)
    else cmd=("${through_rgpu[@]}"); extra=(); fi
    rm -f "$work/stop" "$logs/smi-$side.csv"
    "${cmd[@]}" "$work/driver_api_test-$side" --ptx "$ptx" --big-mb 1 --iterations 100000 \
        --hold-ms 100 --stop-file "$work/stop" "${extra[@]}" >"$logs/memory-$side.log" 2>&1 &
    held=$!
    for _ in $(seq 400); do grep -q running "$logs/memory-$side.log" && break; sleep 0.05; done
    sleep 1
    for sample in 1 2 3 4 5; do
        echo "sample $sample" >>"$logs/smi-$side.csv"
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
            >>"$logs/smi-$side.csv" 2>&1
        sleep 0.25
    done
    echo "MEASURED $side while one client runs (samples of pid, name, MiB):"
    sed 's/^/    /' "$logs/smi-$side.csv"
    [ "$side" = rgpu ] && echo "MEASURED processes of the daemon: $(pgrep -f vhost-device-rgpu | wc -l)"
    touch "$work/stop"
    wait "$held"
done
worker_mib=$(side_mib "$logs/smi-rgpu.csv" vhost-device-rgpu)
native_mib=$(side_mib "$logs/smi-native.csv" driver_api_test)
echo "MEASURED device memory, least of five samples: native process $native_mib MiB, rgpu (all daemon processes) $worker_mib MiB"
if [ "$worker_mib" -gt 0 ] && [ "$worker_mib" -le "$native_mib" ]; then
    pass "rgpu's processes hold no more device memory than the native process ($worker_mib <= $native_mib MiB)"
else
    fail "device memory" "rgpu $worker_mib MiB, native $native_mib MiB"
fi

# 5. Registrations (native): who reaches them, and their cost.
for flags in none portable devicemap both; do
    for ctx in same other; do
        for mode in copy kernel; do
            timeout 60 "${native[@]}" "$work/registration_probe" reach "$flags" "$ctx" "$mode" "$ptx" \
                >>"$logs/registration-reach.log" 2>&1
        done
    done
done
echo "MEASURED registrations reached from a context (native):"
sed 's/^/    /' "$logs/registration-reach.log"
timeout 300 "${native[@]}" "$work/registration_probe" cost 256 >"$logs/registration-cost.log" 2>&1
echo "MEASURED registration cost (native):"
sed 's/^/    /' "$logs/registration-cost.log"

# 6. The kernel watchdog with NVIDIA's driver: a kernel that never ends
# ends its process's worker after --kernel-timeout-s; the waiting call sees
# CUDA_ERROR_LAUNCH_TIMEOUT; another process is served meanwhile and after.
gcc -O2 -std=c11 -Wall -I "$bundle" -o "$work/spin_test" "$bundle/spin_test.c" \
    -L "$work/rgpu-lib" -lcuda >"$logs/build-spin_test.log" 2>&1 || fail "build spin_test"
wd_socket=$work/watchdog.sock
env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" \
    "$bundle/vhost-device-rgpu" --executor cuda --socket-path "$wd_socket" --kernel-timeout-s 2 \
    --stats-socket "$work/watchdog-stats.sock" >"$logs/watchdog-daemon.log" 2>&1 &
wd_pid=$!
for _ in $(seq 200); do [ -S "$wd_socket" ] && break; sleep 0.05; done
wd=(env RGPU_SOCKET="$wd_socket" LD_LIBRARY_PATH="$work/rgpu-lib")
timeout 60 "${wd[@]}" "$work/spin_test" --ptx "$ptx" --spin-ms 500 >"$logs/watchdog-short.log" 2>&1
timeout 60 "${wd[@]}" "$work/spin_test" --ptx "$ptx" --spin-ms 0 >"$logs/watchdog-endless.log" 2>&1 &
endless=$!
sleep 0.5
timeout 120 "${wd[@]}" "$work/driver_api_test-rgpu" --ptx "$ptx" >"$logs/watchdog-neighbour.log" 2>&1
neighbour=$?
wait "$endless"
echo "MEASURED watchdog (--kernel-timeout-s 2):"
sed 's/^/    short: /' "$logs/watchdog-short.log"
sed 's/^/    endless: /' "$logs/watchdog-endless.log"
if grep -q "synchronize rc 0 CUDA_SUCCESS" "$logs/watchdog-short.log" &&
    grep -q "synchronize rc 702 CUDA_ERROR_LAUNCH_TIMEOUT" "$logs/watchdog-endless.log" &&
    [ "$neighbour" = 0 ] && grep -q "checks passed" "$logs/watchdog-neighbour.log"; then
    pass "kernel watchdog: the endless kernel's process got CUDA_ERROR_LAUNCH_TIMEOUT, a neighbour passed"
else
    fail "kernel watchdog" "see $logs/watchdog-*.log"
fi
kill "$wd_pid" 2>/dev/null; wait "$wd_pid" 2>/dev/null

grep -E "WARN|ERROR" "$logs/daemon.log" | grep -v "rate" | tail -n 20 >"$logs/daemon-warnings.log"
echo "daemon warnings (last 20): $(wc -l <"$logs/daemon-warnings.log")"
if kill -0 "$daemon_pid" 2>/dev/null; then pass "daemon alive"; else fail "daemon alive"; fi
echo "isolation suite: $failures failure(s); logs in $logs"
exit "$failures"
