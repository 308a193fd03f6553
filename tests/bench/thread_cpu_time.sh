#!/usr/bin/env bash
# Where the pinned launch bench spends CPU time, thread by thread (issue 9:
# rgpu's launch thread runs 1-5% below NVIDIA's library called from a
# second thread on the same CPU, not yet located), on the GPU host:
#
#   thread_cpu_time.sh BUNDLE [DAEMON_ARGS ...]
#
# For each DAEMON_ARGS (default: "--worker-seccomp enforce" and
# "--worker-seccomp off"), starts a daemon on every CPU but K and M
# (anywhere on a machine of two) with --launch-cpus K and those
# arguments, runs rgpu_bench's launch runs with the driver called from
# CPU K on both sides and rgpu's caller on M
# (PINNED_CPUS=K,M, default 2,0), samples every thread of the daemon's
# processes and of the bench every 0.2 s, and prints each thread that used
# CPU time: user and system time (ticks of 10 ms) and voluntary and
# involuntary context switches, as last seen before it ended. System time
# on the worker's launch thread (rgpu-launch) that the bench's own
# thread lacks would mean system calls per launch in the worker;
# involuntary switches, that something else ran on CPU K; irq, softirq
# or steal ticks on CPU K (from /proc/stat, printed per pinned CPU), that
# interrupts or the hypervisor took its time. BUNDLE is a
# folder from tests/gpu/make-bundle.sh; logs go to $OUT when set;
# THREAD_TIME_LAUNCHES sets rgpu_bench's --launches (default 100000).
set -uo pipefail
bundle=$(cd "${1:?usage: thread_cpu_time.sh BUNDLE [DAEMON_ARGS ...]}" && pwd)
shift
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=("--worker-seccomp enforce" "--worker-seccomp off")
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
# shellcheck source=tests/bench/pinned_cpus.sh
source "$(dirname "$0")/pinned_cpus.sh"
work=$(mktemp -d /tmp/rgpu-thread-time.XXXXXX)
logs=${OUT:-$work}
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/lib" "$logs"
ln -s "$bundle/libcuda.so" "$work/lib/libcuda.so.1"
gcc -O2 -std=c11 -I "$bundle" -o "$work/rgpu_bench" "$bundle/rgpu_bench.c" -ldl || exit 1

# The process and its descendants, two levels down (connection processes,
# their workers).
family() {
    local children
    children=$(pgrep -P "$1" | tr '\n' ' ')
    echo "$1" $children
    for child in $children; do pgrep -P "$child"; done
}

# One line per thread of PIDS: pid tid comm user system voluntary
# involuntary; one awk for all of them, as this runs every 0.2 s beside
# the benchmark.
thread_lines() {
    local pid task files=()
    for pid in "$@"; do
        for task in /proc/"$pid"/task/*; do files+=("$task/stat" "$task/status"); done
    done
    [ ${#files[@]} -gt 0 ] || return 0
    awk '{ split(FILENAME, path, "/"); key = path[3] " " path[5] }
        FILENAME ~ /stat$/ {
            comm = $0; sub(/^[^(]*\(/, "", comm); sub(/\) .*/, "", comm); gsub(/ /, "_", comm)
            rest = $0; sub(/.*\) /, "", rest); split(rest, field, " ")
            times[key] = comm " " field[12] " " field[13]
        }
        /^voluntary_ctxt_switches/ { voluntary[key] = $2 }
        /^nonvoluntary_ctxt_switches/ { involuntary[key] = $2 }
        END { for (key in times) print key, times[key], voluntary[key], involuntary[key] }' \
        "${files[@]}" 2>/dev/null
}

# Each pinned CPU's time, from /proc/stat before and after: interrupts
# taken on CPU K (irq, softirq) and time the hypervisor ran something
# else there (steal) slow the driver's calls without showing in any
# thread's counts.
cpu_time() {
    awk -v k="cpu$driver_cpu" -v m="cpu$caller_cpu" '
        NR == FNR { for (i = 2; i <= 9; i++) before[$1, i] = $i; next }
        {
            for (i = 2; i <= 9; i++) d[i] = $i - before[$1, i]
            if ($1 == k || $1 == m)
                printf "   %s (%s): user %d system %d idle %d irq %d softirq %d steal %d\n",
                    $1, $1 == k ? "driver" : "caller", d[2] + d[3], d[4], d[5] + d[6], d[7], d[8], d[9]
            else { irq += d[7]; softirq += d[8]; steal += d[9] }
        }
        END { printf "   the other CPUs together: irq %d softirq %d steal %d\n", irq, softirq, steal }' "$1" "$2"
}

for variant in "${variants[@]}"; do
    label=$(tr -c 'a-z0-9\n' - <<<"$variant" | sed 's/^-*//')
    # shellcheck disable=SC2086 # the variant's words
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" ${others:+taskset -c "$others"} "$bundle/vhost-device-rgpu" \
        --executor "${RGPU_EXECUTOR:-cuda}" --socket-path "$work/$label.sock" --launch-cpus "$driver_cpu" \
        $variant >"$logs/daemon-$label.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 600); do [ -S "$work/$label.sock" ] && break; sleep 0.05; done
    if [ ! -S "$work/$label.sock" ]; then
        echo "== $variant: FAIL daemon did not start"
        tail -n 5 "$logs/daemon-$label.log"
        kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
        daemon_pid=
        continue
    fi
    grep '^cpu[0-9]' /proc/stat >"$work/cpu-before-$label.txt"
    env RGPU_SOCKET="$work/$label.sock" "$work/rgpu_bench" --native "$native_lib" --rgpu "$work/lib/libcuda.so.1" \
        --ptx "$bundle/reference_kernels.ptx" --sync-iters 1000 --launches "${THREAD_TIME_LAUNCHES:-100000}" \
        --mib 1 --repeats 1 --driver-cpu "$driver_cpu" --caller-cpu "$caller_cpu" >"$logs/bench-$label.txt" 2>&1 &
    bench_pid=$!
    # The sampler stays off the pinned CPUs, whose threads it measures.
    (
        [ -n "$others" ] && taskset -cp "$others" "$BASHPID" >/dev/null
        while kill -0 "$bench_pid" 2>/dev/null; do
            # shellcheck disable=SC2046 # the pids are words
            thread_lines $(family "$daemon_pid") "$bench_pid"
            sleep 0.2
        done
    ) >"$work/samples-$label.txt"
    wait "$bench_pid"
    grep '^cpu[0-9]' /proc/stat >"$work/cpu-after-$label.txt"
    echo "== $variant"
    grep -E "worst run|runs in turn" "$logs/bench-$label.txt"
    cpu_time "$work/cpu-before-$label.txt" "$work/cpu-after-$label.txt"
    echo "   pid tid thread user system voluntary involuntary"
    awk '{ last[$1 " " $2] = $0 } END { for (key in last) print last[key] }' "$work/samples-$label.txt" \
        | awk '$4 + $5 > 0' | sort -k4,4nr | sed 's/^/   /'
    kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    daemon_pid=
done
