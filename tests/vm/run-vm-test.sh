#!/usr/bin/env bash
# rgpu's VM-mode test without Rust (the GPU host): the daemon, then QEMU with
# the test guest of tests/vm/guest-test.sh, answering the guest's host checks
# from the daemon's stats socket, as tests/tests/vm_mode.rs does.
#
#   run-vm-test.sh [BUNDLE]     (default: the folder this script is in; made
#                                by tests/vm/make-gpu-vm-bundle.sh)
#
# Environment: RGPU_EXECUTOR (default cuda; sim to try it without a GPU),
# GUEST (test: the driver-API guest, default; isolation: two users of one
# guest, tests/vm/guest-isolation.sh; bench: pinned copies from contiguous
# and scattered guest pages, tests/vm/guest-bench.sh), MEM (guest memory,
# default 1G; 2G for bench), OUT (where logs go; default a temp folder).
# GUEST=bench also reads BENCH_MIB (the copy size, default 256),
# BENCH_REPEATS (best of, default 5), BENCH_FRAGMENT_MIB (memory the
# scattered run touches and half releases, default 2 * BENCH_MIB + 256),
# BENCH_KEEP_PAGES and BENCH_HOLE_PAGES (the fragment pattern: pages kept,
# pages released; default 1 and 1, every other page), BENCH_FRAGMENT_WITH
# (pagetables, default; anon: holes among movable pages, which leave the
# blob contiguous) and BENCH_TARGET (the scattered/contiguous bandwidth
# ratio to reach, default 0.90; judged with the cuda executor only).
# Prints PASS/FAIL per step (and MEASURED lines for GUEST=bench); the exit
# status is the number of failures.
set -uo pipefail

bundle=$(cd "${1:-$(dirname "$0")}" && pwd)
executor=${RGPU_EXECUTOR:-cuda}
guest=${GUEST:-test}
case $guest in
    test) initrd=initramfs.cpio.gz; log_level=${RGPU_LOG:-info} ;;
    # Debug: the runner reads where a worker mapped a blob off the log.
    isolation) initrd=initramfs-isolation.cpio.gz; log_level=debug ;;
    # Debug: the runner reads how many page runs each blob resolved into.
    bench) initrd=initramfs-bench.cpio.gz; log_level=debug ;;
    *) echo "FAIL GUEST=$guest: test, isolation or bench"; exit 1 ;;
esac
mem=${MEM:-1G}
append=${APPEND:-}
if [ "$guest" = bench ]; then
    mem=${MEM:-2G}
    bench_mib=${BENCH_MIB:-256}
    bench_bytes=$((bench_mib << 20))
    append="$append rgpu_bench_mib=$bench_mib rgpu_bench_repeats=${BENCH_REPEATS:-5}"
    append="$append rgpu_bench_keep_pages=${BENCH_KEEP_PAGES:-1} rgpu_bench_hole_pages=${BENCH_HOLE_PAGES:-1}"
    # A worker maps each page run of a blob as one mapping, at most
    # vm.max_map_count - 8192 of them in all (vhost-device-rgpu's
    # worker_process/blob_mapping.rs): a blob of single scattered pages
    # needs one per page, and the context's own blobs (allocated after the
    # fragmenting too) some 4100 more. Where that does not fit, the
    # scattered run by default releases only as many holes as fit (the
    # rest of its buffer comes from contiguous memory).
    max_map_count=$(cat /proc/sys/vm/max_map_count 2>/dev/null || echo 65530)
    worker_runs=$((max_map_count - 8192))
    bench_pages=$((bench_mib * 256))
    bench_hole=${BENCH_HOLE_PAGES:-1}
    bench_keep=${BENCH_KEEP_PAGES:-1}
    if [ -n "${BENCH_FRAGMENT_MIB:-}" ]; then
        fragment_mib=$BENCH_FRAGMENT_MIB
    elif [ $((bench_pages + 8192)) -le "$worker_runs" ]; then
        fragment_mib=$(((2 * bench_mib + 256) * (bench_keep + bench_hole) / (2 * bench_hole)))
    else
        holes=$((worker_runs - 8192))
        fragment_mib=$((holes * (bench_keep + bench_hole) / bench_hole / 256))
        echo "NOTE host vm.max_map_count $max_map_count: a worker maps at most $worker_runs page runs," \
            "and $bench_mib MiB of single scattered pages would be $bench_pages of them (+ ~4100 of" \
            "the context's blobs): the scattered run releases only $((holes / 256)) MiB of holes" \
            "(BENCH_FRAGMENT_MIB=$fragment_mib), the rest of its buffer is contiguous." \
            "For a wholly scattered buffer: sysctl -w vm.max_map_count=262144 (root) first."
    fi
    echo "bench: host vm.max_map_count $max_map_count (a worker maps at most $worker_runs page runs);" \
        "scattered run: $fragment_mib MiB fragmented, $bench_hole page(s) released after every $bench_keep kept"
    append="$append rgpu_bench_fragment_mib=$fragment_mib"
    [ -n "${BENCH_FRAGMENT_WITH:-}" ] && append="$append rgpu_bench_fragment_with=$BENCH_FRAGMENT_WITH"
    declare -A bandwidth=()
    declare -A blob_runs=()
fi
logs=${OUT:-$(mktemp -d /tmp/rgpu-vm-test.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-vm-work.XXXXXX)
failures=0
daemon_pid=
qemu_pid=

cleanup() {
    exec 3>&- 2>/dev/null
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null && wait "$qemu_pid" 2>/dev/null
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+ ($2)}"; failures=$((failures + 1)); }

for f in vhost-device-rgpu "$initrd" qemu/qemu-system-x86_64 qemu/vmlinuz \
    qemu-vhost-user-test-device.sh; do
    [ -e "$bundle/$f" ] || { echo "FAIL bundle: $bundle/$f is missing"; exit 1; }
done

# One field of the stats socket's JSON line.
stat() {
    python3 - "$work/stats.sock" "$1" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
print(json.loads(s.makefile().readline())[sys.argv[2]])
PY
}

# Waits up to 15 s for a shell condition over stats; 0 when it held.
wait_stats() {
    for _ in $(seq 150); do
        eval "$1" && return 0
        sleep 0.1
    done
    return 1
}

RGPU_LOG=$log_level RGPU_SIM_FAULT_POISONS_PROCESS=1 \
    "$bundle/vhost-device-rgpu" --executor "$executor" --socket-path "$work/rgpu.sock" \
    --stats-socket "$work/stats.sock" >"$logs/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do
    [ -S "$work/rgpu.sock" ] && [ -S "$work/stats.sock" ] && break
    sleep 0.1
done
[ -S "$work/stats.sock" ] || { fail daemon "see $logs/daemon.log"; exit 1; }
echo "daemon: executor $(stat executor), log $logs/daemon.log"

# The guest's console input is a fifo: the runner answers its host checks.
mkfifo "$work/console-in"
start=$(date +%s.%N)
RGPU_SOCKET=$work/rgpu.sock KERNEL=$bundle/qemu/vmlinuz INITRD=$bundle/$initrd \
    QEMU=$bundle/qemu/qemu-system-x86_64 MEM=$mem APPEND=$append \
    timeout -k 10 600 bash "$bundle/qemu-vhost-user-test-device.sh" \
    <"$work/console-in" >"$logs/console.log" 2>&1 &
qemu_pid=$!
exec 3>"$work/console-in"

answer() { if [ "$1" = 0 ]; then echo go >&3; else echo no >&3; fi; }

# GUEST=bench: how the last bench run's blob (BENCH_MIB MiB) resolved into
# page runs, off the daemon's debug log: the device's "resource N: guest
# blob of B bytes in E entries, R runs" and the worker's "blob of B bytes
# in R runs mapped at ADDRESS". Only lines newer than the last call count.
blob_lines_seen=0
mapped_lines_seen=0
refused_lines_seen=0
blob_report() {
    local label=$1 lines line entries runs mapped pages=$((bench_bytes / 4096))
    local created="guest blob of $bench_bytes bytes in "
    local placed="blob of $bench_bytes bytes in [0-9]* runs mapped at"
    local refused="would map [0-9]* page runs"
    lines=$(grep -c "$created" "$logs/daemon.log")
    if [ "$lines" -le "$blob_lines_seen" ]; then
        echo "MEASURED $label blob: no new '$created' line in $logs/daemon.log"
    else
        line=$(grep "$created" "$logs/daemon.log" | tail -n1)
        entries=$(sed -n 's/.*guest blob of [0-9]* bytes in \([0-9]*\) entries, .*/\1/p' <<<"$line")
        runs=$(sed -n 's/.*guest blob of [0-9]* bytes in [0-9]* entries, \([0-9]*\) runs.*/\1/p' <<<"$line")
        mapped=
        if [ "$(grep -c "$placed" "$logs/daemon.log")" -gt "$mapped_lines_seen" ]; then
            mapped="$(grep "$placed" "$logs/daemon.log" | tail -n1 \
                | sed -n 's/.*bytes in \([0-9]*\) runs mapped at.*/\1/p') runs mapped"
        fi
        blob_runs[$label]=$runs
        echo "MEASURED $label blob: $bench_mib MiB ($pages pages) in ${entries:-?} guest entries," \
            "${runs:-?} page runs on the host, average $(awk -v p="$pages" -v r="${runs:-0}" \
            'BEGIN { if (r > 0) printf "%.1f", p / r; else printf "?" }') pages (worker: ${mapped:-not mapped})"
    fi
    blob_lines_seen=$lines
    mapped_lines_seen=$(grep -c "$placed" "$logs/daemon.log")
    lines=$(grep -c "$refused" "$logs/daemon.log")
    if [ "$lines" -gt "$refused_lines_seen" ]; then
        grep "$refused" "$logs/daemon.log" | tail -n1 | sed "s/^/MEASURED $label: the worker refused the mapping: /"
    fi
    refused_lines_seen=$lines
}

boot_ok=0
while IFS= read -r line; do
    line=${line//$'\r'/}
    case $line in
        *"[drm] features: +context_init"*) boot_ok=$((boot_ok + 1)) ;;
        *"[drm] cap set 0: id 23"*) boot_ok=$((boot_ok + 1)) ;;
        *"RGPU-BOOT node crw-rw----"*root*render*renderD128) boot_ok=$((boot_ok + 1)) ;;
        *"RGPU-BOOT ready"*)
            if [ $boot_ok -ge 3 ]; then pass "boot (+context_init, capset 23, renderD128 root:render 0660)"
            else fail boot "see $logs/console.log"; fi ;;
        *"RGPU-WAIT two-running"*)
            wait_stats '[ "$(stat sessions_active)" = 2 ]'; r=$?
            [ $r = 0 ] || fail "two sessions on the host"; answer $r ;;
        *"RGPU-WAIT held"*)
            wait_stats '[ "$(stat sessions_active)" = 1 ]'; r=$?
            [ $r = 0 ] || fail "held session on the host"; answer $r ;;
        *"RGPU-WAIT killed"*)
            wait_stats '[ "$(stat sessions_active)" = 0 ] && [ "$(stat device_memory_bytes)" = 0 ]'; r=$?
            [ $r = 0 ] || fail "killed session freed on the host"; answer $r ;;
        *"RGPU-WAIT bulk-start"*)
            zc0=$(stat zero_copy_bytes); cpu0=$(stat host_cpu_copy_bytes)
            un0=$(stat unregistered_copy_bytes); answer 0 ;;
        *"RGPU-WAIT bulk-done"*)
            zc=$(($(stat zero_copy_bytes) - zc0)); cpu=$(($(stat host_cpu_copy_bytes) - cpu0))
            un=$(($(stat unregistered_copy_bytes) - un0)); dma=$(stat dma_registered_bytes)
            echo "bulk: zero_copy_bytes +$zc, host_cpu_copy_bytes +$cpu, unregistered_copy_bytes +$un, dma_registered_bytes $dma"
            # Not copied on the host: neither by the daemon (host_cpu_copy)
            # nor staged by the driver (every byte lay in registered memory).
            # Registered only while its process lived (a worker registers
            # its own process's blobs): nothing stays registered after.
            if [ $zc -ge $((256 << 20)) ] && [ $cpu -lt $((4 << 20)) ] && [ $un = 0 ] &&
                [ "$dma" = 0 ]; then
                pass "bulk 256 MiB zero-copy (no host CPU copy, no driver staging)"; answer 0
            else
                fail "bulk 256 MiB zero-copy" "zero_copy +$zc, host_cpu_copy +$cpu, unregistered +$un, registered $dma"; answer 1
            fi ;;
        # The isolation guest's checks.
        *"RGPU-WAIT two-workers"*)
            wait_stats '[ "$(stat workers_active)" = 2 ] && [ "$(stat connections_active)" = 1 ]'; r=$?
            [ $r = 0 ] && pass "one worker per guest process (2)" || fail "two workers"; answer $r ;;
        *"RGPU-WAIT none-left"*|*"RGPU-WAIT nothing-after-kill"*)
            wait_stats '[ "$(stat workers_active)" = 0 ] && [ "$(stat sessions_active)" = 0 ] && [ "$(stat device_memory_bytes)" = 0 ]'; r=$?
            [ $r = 0 ] && pass "no worker, session or device memory left (${line#*RGPU-WAIT })" \
                || fail "nothing left (${line#*RGPU-WAIT })"; answer $r ;;
        *"RGPU-WAIT copying"*)
            wait_stats '[ "$(stat workers_active)" = 1 ]'; r=$?
            [ $r = 0 ] || fail "copying worker"; answer $r ;;
        *"RGPU-WAIT before-unbind"*)
            wait_stats '[ "$(stat workers_active)" = 1 ]'; r=$?
            [ $r = 0 ] || fail "held worker before unbind"; answer $r ;;
        *"RGPU-WAIT unbound"*)
            wait_stats '[ "$(stat workers_active)" = 0 ] && [ "$(stat sessions_active)" = 0 ] && [ "$(stat dma_registered_bytes)" = 0 ]'; r=$?
            [ $r = 0 ] && pass "driver unbind: nothing of before left on the host" || fail "unbind left state"; answer $r ;;
        *"RGPU-WAIT owner-blob-address"*)
            address=$(grep "blob of 1048576 bytes in " "$logs/daemon.log" | tail -n1 \
                | sed -n 's/.*mapped at \(0x[0-9a-f]*\).*/\1/p')
            echo "owner's blob mapped at ${address:-?} in its worker"
            echo "${address:-0x0}" >&3 ;;
        *"read 0x"*": rc "*)
            echo "kernel probe: ${line#*read }"
            case $line in *"secret yes"*) fail "a kernel read another process's memory: $line" ;; esac ;;
        # The bench guest's lines (tests/vm/guest-bench.sh, vm_copy_bench).
        *"RGPU-WAIT bench-blob "*)
            # The bench process ended: its worker retires and its blobs go.
            wait_stats '[ "$(stat workers_active)" = 0 ] && [ "$(stat sessions_active)" = 0 ]' \
                || echo "NOTE ${line#*RGPU-WAIT bench-blob }: a worker or session still active 15 s after the bench ended"
            blob_report "${line#*RGPU-WAIT bench-blob }"; answer 0 ;;
        *" HtoD "*" GB/s"*|*" DtoH "*" GB/s"*)
            if [[ $line =~ ([a-z]+)\ (HtoD|DtoH)\ ([0-9.]+)\ GB/s ]]; then
                bandwidth[${BASH_REMATCH[1]} ${BASH_REMATCH[2]}]=${BASH_REMATCH[3]}
                echo "MEASURED ${BASH_REMATCH[0]}${line#*"${BASH_REMATCH[0]}"}"
            fi ;;
        *" data check PASS"*) pass "$line" ;;
        *" data check FAIL"*) fail "$line" ;;
        *"FAIL contiguous: "*|*"FAIL scattered: "*) fail "bench: ${line#*FAIL }" ;;
        *": fragmented "*|*"bench: "*|*"RGPU-ERROR bench"*|*" Node "*", zone "*) echo "$line" ;;
        *"RGPU-TEST-END "*" rc=0") pass "guest step ${line#*RGPU-TEST-END }" ;;
        *"RGPU-TEST-END "*) fail "guest step ${line#*RGPU-TEST-END }" "see $logs/console.log" ;;
        *"RGPU-TEST-SH-EXIT"*) break ;;
    esac
done < <(tail -n +1 -F --pid="$qemu_pid" "$logs/console.log" 2>/dev/null)
# The guest powers off once its script ended: QEMU exits within seconds.
# A guest stuck in its power-off (its device reset never answered) would
# hold the run until the timeout: QEMU gets 60 s, then TERM (KILL 10 s on).
for _ in $(seq 600); do
    kill -0 "$qemu_pid" 2>/dev/null || break
    sleep 0.1
done
hung=0
if kill -0 "$qemu_pid" 2>/dev/null; then
    hung=1
    why="guest powered off: $(grep -c 'reboot: Power down' "$logs/console.log") times; daemon log"
    why="$why lines \"queue that's not ready\": $(grep -c "queue that's not ready" "$logs/daemon.log"); see $logs"
    fail "QEMU still running 60 s after the guest's script ended" "$why"
    kill "$qemu_pid" 2>/dev/null
fi
wait "$qemu_pid"
rc=$?
qemu_pid=
[ $rc = 0 ] || [ $hung = 1 ] || fail "QEMU exit status $rc" "see $logs/console.log"
grep -q "RGPU-TEST-SH-EXIT rc=0" "$logs/console.log" || fail "guest test script" "see $logs/console.log"
if [ "$guest" = bench ]; then
    target_ratio=${BENCH_TARGET:-0.90}
    for direction in HtoD DtoH; do
        c=${bandwidth[contiguous $direction]:-}
        s=${bandwidth[scattered $direction]:-}
        if [ -z "$c" ] || [ -z "$s" ]; then
            fail "bench $direction" "no bandwidth for both cases; see $logs/console.log"
            continue
        fi
        ratio=$(awk -v s="$s" -v c="$c" 'BEGIN { if (c > 0) printf "%.3f", s / c; else print 0 }')
        echo "MEASURED scattered/contiguous $direction $ratio (scattered $s GB/s, contiguous $c GB/s; target >= $target_ratio)"
        if [ "$executor" = cuda ]; then
            if awk -v r="$ratio" -v t="$target_ratio" 'BEGIN { exit !(r >= t) }'; then
                pass "scattered $direction at $ratio of contiguous (>= $target_ratio)"
            else
                fail "scattered $direction at $ratio of contiguous" "target >= $target_ratio"
            fi
        fi
    done
    [ "$executor" = cuda ] || echo "NOTE executor $executor: bandwidth not judged (only the cuda executor's numbers mean anything)"
    # The scattered run must really have been scattered: its blob's average
    # page run no longer than 4 holes, and shorter than the contiguous one's.
    rs=${blob_runs[scattered]:-}
    rcont=${blob_runs[contiguous]:-}
    if [ -n "$rs" ] && [ -n "$rcont" ]; then
        pages=$((bench_bytes / 4096))
        if [ $((rs * 4 * ${BENCH_HOLE_PAGES:-1})) -ge "$pages" ] && [ "$rs" -gt "$rcont" ]; then
            pass "scattered blob really scattered ($rs page runs for $pages pages; contiguous: $rcont)"
        else
            fail "scattered blob really scattered" "$rs page runs for $pages pages; contiguous: $rcont"
        fi
    else
        echo "NOTE blob page runs not found in $logs/daemon.log: not judged"
    fi
fi
echo "VM test: $failures failure(s) in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s; logs in $logs"
exit "$failures"
