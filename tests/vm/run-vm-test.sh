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
# guest, tests/vm/guest-isolation.sh), MEM (guest memory, default 1G), OUT
# (where logs go; default a temp folder).
# Prints PASS/FAIL per step; the exit status is the number of failures.
set -uo pipefail

bundle=$(cd "${1:-$(dirname "$0")}" && pwd)
executor=${RGPU_EXECUTOR:-cuda}
guest=${GUEST:-test}
case $guest in
    test) initrd=initramfs.cpio.gz; log_level=${RGPU_LOG:-info} ;;
    # Debug: the runner reads where a worker mapped a blob off the log.
    isolation) initrd=initramfs-isolation.cpio.gz; log_level=debug ;;
    *) echo "FAIL GUEST=$guest: test or isolation"; exit 1 ;;
esac
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
    QEMU=$bundle/qemu/qemu-system-x86_64 MEM=${MEM:-1G} \
    timeout 600 bash "$bundle/qemu-vhost-user-test-device.sh" \
    <"$work/console-in" >"$logs/console.log" 2>&1 &
qemu_pid=$!
exec 3>"$work/console-in"

answer() { if [ "$1" = 0 ]; then echo go >&3; else echo no >&3; fi; }

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
        *"RGPU-TEST-END "*" rc=0") pass "guest step ${line#*RGPU-TEST-END }" ;;
        *"RGPU-TEST-END "*) fail "guest step ${line#*RGPU-TEST-END }" "see $logs/console.log" ;;
        *"RGPU-TEST-SH-EXIT"*) break ;;
    esac
done < <(tail -n +1 -F --pid="$qemu_pid" "$logs/console.log" 2>/dev/null)
wait "$qemu_pid"
rc=$?
qemu_pid=
[ $rc = 0 ] || fail "QEMU exit status $rc" "see $logs/console.log"
grep -q "RGPU-TEST-SH-EXIT rc=0" "$logs/console.log" || fail "guest test script" "see $logs/console.log"
echo "VM test: $failures failure(s) in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s; logs in $logs"
exit "$failures"
