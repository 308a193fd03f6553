#!/usr/bin/env bash
# rgpu's compatibility suite, for the GPU host (CUDA toolkit there).
#
#   run-compat.sh [--regenerate] [NAME...]
#
# Builds every program of tests/compat with nvcc's defaults (static cudart),
# runs each natively (NVIDIA's libcuda.so.1) and through rgpu (guest-lib's
# libcuda.so.1 in its place), and compares each run's stdout byte for byte
# with expected/NAME.out; then the same for python/cupy_check.py and
# python/triton_check.py with the host's python3. Prints a table
# (program | native | rgpu); the exit status is the number of FAIL cells.
# NAME... limits the run to those programs (e.g. params cupy_check).
# --regenerate first writes expected/NAME.out from each native run that
# exited 0 (review the diff before committing it).
#
# Where rgpu comes from (environment), in this order:
#   RGPU_SOCKET + RGPU_LIB_DIR   a running daemon's socket, and a folder with
#                                guest-lib's libcuda.so.1 (and libcuda.so);
#                                RGPU_STATS_SOCKET, if set, lets the script
#                                check that each rgpu run connected to it
#   RGPU_BUNDLE                  a folder made by tests/gpu/make-bundle.sh:
#                                the script starts vhost-device-rgpu from it
#                                and stops it at the end
#   neither                      native runs only; the rgpu column says skip
# Other environment: CUDA_HOME (default /usr/local/cuda), NATIVE_LIBCUDA
# (default /usr/local/nvidia/lib64/libcuda.so.1), PYTHON (default python3),
# SKIP_PYTHON=1, OUT (logs; default a temp folder, printed at the end),
# RGPU_EXECUTOR (default cuda; sim only to try the script without a GPU),
# RGPU_DAEMON_ARGS (more daemon options; with --listen and RGPU_SERVER set,
# the rgpu runs go through the network carrier).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
regenerate=0
only=()
for arg in "$@"; do
    case "$arg" in
        --regenerate) regenerate=1 ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        -*) echo "run-compat.sh: unknown option $arg" >&2; exit 2 ;;
        *) only+=("$arg") ;;
    esac
done

cuda_home=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda_home/bin/nvcc
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
python=${PYTHON:-python3}
logs=${OUT:-$(mktemp -d /tmp/rgpu-compat.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-compat-work.XXXXXX)
daemon_pid=

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null
        wait "$daemon_pid" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# name:sources:extra nvcc flags. fault leaves its context unusable on
# purpose; the programs after it show that the daemon and other sessions
# carry on.
programs=(
    "params:params.cu:"
    "shared_atomics:shared_atomics.cu:"
    "symbols:symbols.cu:"
    "memory:memory.cu:"
    "streams:streams.cu:"
    "device_query:device_query.cu:"
    "errors:errors.cu:"
    "fault:fault.cu:"
    "modules_rdc:modules_rdc_main.cu modules_rdc_lib.cu:-rdc=true"
    "modules_sep:modules_sep_main.cu modules_sep_other.cu:"
    "printf:printf.cu:"
    "curand:curand.cu:-lcurand"
    "cublas:cublas.cu:-lcublas"
)
python_checks=(cupy_check triton_check torch_ipc_check torch_features_check jax_check)

selected() {
    [ ${#only[@]} -eq 0 ] && return 0
    local want
    for want in "${only[@]}"; do [ "$want" = "$1" ] && return 0; done
    return 1
}

# --- where NVIDIA's library and rgpu's are --------------------------------
native_path=$cuda_home/lib64
if [ -e "$native_lib" ]; then
    native_path=$(dirname "$native_lib"):$native_path
else
    echo "note: no $native_lib; native runs use the loader's default libcuda.so.1"
fi

rgpu_socket=
rgpu_lib=
rgpu_stats=${RGPU_STATS_SOCKET:-}
if [ -n "${RGPU_SOCKET:-}" ] && [ -n "${RGPU_LIB_DIR:-}" ]; then
    rgpu_socket=$RGPU_SOCKET
    rgpu_lib=$(cd "$RGPU_LIB_DIR" && pwd)
    [ -e "$rgpu_lib/libcuda.so.1" ] || { echo "FAIL setup: no libcuda.so.1 in $rgpu_lib"; exit 1; }
elif [ -n "${RGPU_BUNDLE:-}" ]; then
    bundle=$(cd "$RGPU_BUNDLE" && pwd)
    for f in vhost-device-rgpu libcuda.so; do
        [ -e "$bundle/$f" ] || { echo "FAIL setup: $bundle/$f is missing"; exit 1; }
    done
    rgpu_lib=$work/rgpu-lib
    mkdir -p "$rgpu_lib"
    ln -s "$bundle/libcuda.so" "$rgpu_lib/libcuda.so.1"
    ln -s "$bundle/libcuda.so" "$rgpu_lib/libcuda.so"
    # rgpu's NVML beside its libcuda, as a guest has them: NVIDIA's NVML
    # would talk to the local driver, not to the host's GPU.
    if [ -e "$bundle/libnvidia_ml.so" ]; then
        ln -s "$bundle/libnvidia_ml.so" "$rgpu_lib/libnvidia-ml.so.1"
    fi
    rgpu_socket=$work/rgpu.sock
    rgpu_stats=$work/stats.sock
    # The daemon sees NVIDIA's library only, never ours.
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$(dirname "$native_lib")" RGPU_LOG="${RGPU_LOG:-info}" \
        "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" --socket-path "$rgpu_socket" \
        --stats-socket "$rgpu_stats" ${RGPU_DAEMON_ARGS:-} >"$logs/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 200); do [ -S "$rgpu_socket" ] && [ -S "$rgpu_stats" ] && break; sleep 0.05; done
    if [ ! -S "$rgpu_socket" ]; then
        echo "FAIL setup: the daemon did not start; see $logs/daemon.log"
        tail -n 20 "$logs/daemon.log" | sed 's/^/    /'
        exit 1
    fi
fi

# connections_total from the daemon's stats socket, or nothing.
connections_total() {
    [ -n "$rgpu_stats" ] && [ -S "$rgpu_stats" ] || return 0
    python3 -c 'import json,socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
print(json.loads(s.makefile().readline())["connections_total"])' "$rgpu_stats" 2>/dev/null
}

# --- one run: verdict PASS, FAIL or skip on stdout, logs in $logs ---------
# run_one NAME SIDE COMMAND...: runs COMMAND, compares its stdout with
# expected/NAME.out.
run_one() {
    local name=$1 side=$2
    shift 2
    local out=$logs/$name-$side.out err=$logs/$name-$side.err expected=$here/expected/$name.out
    local before after rc
    before=$(connections_total)
    timeout 300 "$@" >"$out" 2>"$err"
    rc=$?
    echo "exit status $rc" >>"$err"
    if [ "$side" = native ] && [ "$regenerate" = 1 ]; then
        if [ "$rc" = 0 ]; then cp "$out" "$expected"; else echo "not regenerating $name: native exit $rc" >&2; fi
    fi
    if [ "$side" = rgpu ] && [ -n "$before" ]; then
        after=$(connections_total)
        if [ "$after" = "$before" ]; then
            echo "the daemon saw no new connection: this run did not load guest-lib" >>"$err"
            echo FAIL
            return
        fi
    fi
    if [ ! -e "$expected" ]; then
        echo "no $expected" >>"$err"
        echo FAIL
    elif [ "$rc" = 0 ] && cmp -s "$expected" "$out"; then
        echo PASS
    else
        diff -u "$expected" "$out" >"$logs/$name-$side.diff" 2>&1
        echo FAIL
    fi
}

declare -A verdict
failures=0
record() {
    verdict[$1-$2]=$3
    [ "$3" = FAIL ] && failures=$((failures + 1))
    [ "$3" = FAIL ] && [ -s "$logs/$1-$2.diff" ] && sed -n '1,12p' "$logs/$1-$2.diff" | sed "s/^/    $1 $2: /"
    echo "$1 $2: $3"
}

# --- CUDA programs ---------------------------------------------------------
names=()
for entry in "${programs[@]}"; do
    IFS=: read -r name sources flags <<<"$entry"
    selected "$name" || continue
    names+=("$name")
    srcs=()
    for s in $sources; do srcs+=("$here/$s"); done
    # shellcheck disable=SC2086 # flags is a word list on purpose
    if ! "$nvcc" -arch=sm_90 -I "$here" $flags -o "$work/$name" "${srcs[@]}" \
        >"$logs/build-$name.log" 2>&1; then
        record "$name" native FAIL
        record "$name" rgpu FAIL
        echo "    build failed; see $logs/build-$name.log"
        tail -n 10 "$logs/build-$name.log" | sed 's/^/    /'
        continue
    fi
    record "$name" native "$(run_one "$name" native \
        env -u RGPU_SOCKET -u RGPU_SERVER -u RGPU_DEVICES LD_LIBRARY_PATH="$native_path" "$work/$name")"
    if [ -n "$rgpu_socket" ]; then
        record "$name" rgpu "$(run_one "$name" rgpu \
            env RGPU_SOCKET="$rgpu_socket" LD_LIBRARY_PATH="$rgpu_lib:$cuda_home/lib64" "$work/$name")"
    else
        record "$name" rgpu skip
    fi
done

# --- Python: CuPy and Triton -----------------------------------------------
# Natively the environment is left as it is; through rgpu, guest-lib's folder
# goes first on LD_LIBRARY_PATH, so whoever asks for libcuda.so.1 (CuPy's
# extensions, PyTorch's dlopen, Triton's launcher) gets ours. Each run has
# fresh kernel caches so nothing compiled natively is reused.
if [ "${SKIP_PYTHON:-0}" != 1 ]; then
    for name in "${python_checks[@]}"; do
        selected "$name" || continue
        names+=("$name")
        for side in native rgpu; do
            if [ "$side" = rgpu ] && [ -z "$rgpu_socket" ]; then
                record "$name" rgpu skip
                continue
            fi
            mkdir -p "$work/cache-$name-$side"
            cache=(CUPY_CACHE_DIR="$work/cache-$name-$side/cupy"
                TRITON_CACHE_DIR="$work/cache-$name-$side/triton" PYTHONDONTWRITEBYTECODE=1)
            if [ "$side" = native ]; then
                record "$name" native "$(cd "$here/python" && run_one "$name" native \
                    env -u RGPU_SOCKET -u RGPU_SERVER -u RGPU_DEVICES "${cache[@]}" "$python" "$name.py")"
            else
                record "$name" rgpu "$(cd "$here/python" && run_one "$name" rgpu \
                    env "${cache[@]}" RGPU_SOCKET="$rgpu_socket" TRITON_LIBCUDA_PATH="$rgpu_lib" \
                    LD_LIBRARY_PATH="$rgpu_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                    "$python" "$name.py")"
            fi
        done
    done
fi

if [ -n "$daemon_pid" ]; then
    if kill -0 "$daemon_pid" 2>/dev/null; then
        echo "daemon alive after the suite"
    else
        echo "FAIL daemon died during the suite; see $logs/daemon.log"
        failures=$((failures + 1))
    fi
fi

echo
printf '%-16s %-8s %s\n' program native rgpu
for name in "${names[@]}"; do
    printf '%-16s %-8s %s\n' "$name" "${verdict[$name-native]:-?}" "${verdict[$name-rgpu]:-?}"
done
echo
# Issue 10: every "not supported" line the runs through rgpu logged (their
# stderr and the daemon's log), each distinct message once with its count,
# for the README's list of what stays unsupported and why.
unsupported=$(cat "$logs"/*-rgpu.err "$logs/daemon.log" 2>/dev/null | grep -i "not supported" |
    sed -E 's/^\[[^]]*\] *//; s/(pid|ctx|conn|worker) [0-9.]+/\1 N/g' | sort | uniq -c | sort -rn)
echo "compat: not-supported lines through rgpu: $(printf '%s' "$unsupported" | grep -c .) distinct"
printf '%s\n' "$unsupported" | grep . | head -30 | sed 's/^ */compat:   /'
echo "compat suite: $failures failure(s); logs in $logs"
exit "$failures"
