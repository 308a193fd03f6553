# Sourced by the profiling scripts (launch_profile.sh, torch_profile.sh)
# once they have set `bundle` (a folder from tests/gpu/make-bundle.sh) and
# `name`. Sets native_lib (NATIVE_LIBCUDA or the driver's usual place),
# logs ($OUT, or a temp folder), work (a temp folder, removed at exit, whose
# rgpu-lib/ holds rgpu's libcuda.so.1 and NVML library) and socket, and
# stops the daemon at exit.
#
#   start_profiling_daemon LOG [WRAPPER...]
#       starts the bundle's daemon on $socket (executor RGPU_EXECUTOR,
#       default cuda; options RGPU_DAEMON_ARGS) with sessions that time
#       every launch and waited synchronize (RGPU_PROFILE_LAUNCHES=1),
#       under WRAPPER (e.g. taskset -c 3), logging to LOG
#   stop_profiling_daemon LOG
#       stops it once its sessions had a moment to log their profiles,
#       and prints those lines of LOG (each session's, and each launch
#       thread's: its driver time and its waits for the session)
#   pin CPUS
#       prints "taskset -c CPUS" for a non-empty CPUS (a wrapper's words)
# shellcheck shell=bash
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
logs=${OUT:-$(mktemp -d "/tmp/rgpu-$name.XXXXXX")}
mkdir -p "$logs"
work=$(mktemp -d "/tmp/rgpu-$name-work.XXXXXX")
socket=$work/rgpu.sock
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/rgpu-lib"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so.1"
ln -s "$bundle/libnvidia_ml.so" "$work/rgpu-lib/libnvidia-ml.so.1"

start_profiling_daemon() {
    local log=$1
    shift
    rm -f "$socket"
    # shellcheck disable=SC2086 # the options are words
    env LD_LIBRARY_PATH="$(dirname "$native_lib")" RGPU_PROFILE_LAUNCHES=1 "$@" \
        "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" --socket-path "$socket" \
        ${RGPU_DAEMON_ARGS:-} >"$log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 600); do [ -S "$socket" ] && return 0; sleep 0.05; done
    echo "FAIL daemon (see $log)"
    exit 1
}

stop_profiling_daemon() {
    sleep 1
    kill "$daemon_pid" && wait "$daemon_pid" 2>/dev/null
    daemon_pid=
    grep -h -E "profile: |launch thread: " "$1" | sed -e 's/.*profile: /worker: /' \
        -e 's/.*launch thread: /launch thread: /'
}

pin() { [ -n "$1" ] && echo taskset -c "$1"; }
