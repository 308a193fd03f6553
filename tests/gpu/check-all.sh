#!/usr/bin/env bash
# Every GPU-host check of the open issues, in parts that each fit one
# device command (10 minutes), run from the repository root on the GPU host:
#
#   tests/gpu/check-all.sh BUNDLE 1     sharing benchmark (issue 8), GPU
#                                       suite with both benchmarks (issue 9:
#                                       queries, scattered blobs), isolation
#                                       suite (issue 7)
#   tests/gpu/check-all.sh BUNDLE 2     compatibility suite (PyTorch, CuPy,
#                                       Triton, nvcc programs)
#   tests/gpu/check-all.sh BUNDLE 3     issue 9's benchmark (perf_bench.sh:
#                                       rgpu_bench, start-up, PyTorch pairs),
#                                       and the malformed-input tests (stale
#                                       handles) with the cuda executor
#   tests/gpu/check-all.sh BUNDLE 4     issue 11 on loopback: the GPU suite
#                                       and the benchmark through the network
#                                       carrier (mutual TLS), and the Rust
#                                       remote tests (refusals, a cut
#                                       connection) with the cuda executor
#   tests/gpu/check-all.sh BUNDLE 5     the compatibility suite through the
#                                       network carrier
#   tests/gpu/check-all.sh BUNDLE 6     the bundle's build against an older
#                                       one (BUNDLE/ab-old, make-bundle.sh
#                                       with RGPU_AB_OLD), taken in turn with
#                                       native (tests/bench/ab_run.sh)
#   tests/gpu/check-all.sh BUNDLE 7     issue 9 pinned: the launch runs in
#                                       turn with the driver called from CPU
#                                       K on both sides (PINNED_CPUS=K,M,
#                                       default 2,0), the bundle's build,
#                                       BUNDLE/ab-old's and NVIDIA's library
#                                       against itself, three rounds
#                                       (launch_placement.sh); then PyTorch
#                                       pairs with the training thread on M,
#                                       rgpu's and the native control's
#                                       (torch_options.sh), and a third
#                                       layout as pinned under
#                                       --profile-launches: where PyTorch's
#                                       launches' time goes; then each
#                                       thread's CPU time in the pinned
#                                       launch runs, the worker's seccomp
#                                       filter on and off, and the pinned
#                                       CPUs' irq, softirq and steal ticks
#                                       (thread_cpu_time.sh)
#
# CHECK_STEPS (a regex of step names: sharing, suite, isolation, compat,
# perf, malformed-tests, remote-suite, remote-tests, remote-perf,
# remote-compat, ab, placement, torch-control, thread-time) runs only those
# steps of a part.
#
# BUNDLE is a folder from tests/gpu/make-bundle.sh. Each step prints its
# summary lines and its time. Logs go to a temp folder; with $OUT set, one
# archive of them lands there (logs.tgz): the device tool brings back only
# a few files from $OUT, and the suites write hundreds. The output of a
# step with a FAIL line is copied beside it too, as FAIL-<step>.log (at
# most 4 steps).
set -uo pipefail
bundle=$(cd "${1:?usage: check-all.sh BUNDLE 1|2|3|4|5|6|7}" && pwd)
part=${2:?usage: check-all.sh BUNDLE 1|2|3|4|5|6|7}
cd "$(dirname "$0")/../.." || exit 1
out=$(mktemp -d /tmp/rgpu-check.XXXXXX)
keep=${OUT:-}
save_logs() {
    [ -n "$keep" ] || return 0
    mkdir -p "$keep"
    tar czf "$keep/logs.tgz" -C "$out" . 2>/dev/null
    grep -rl '^FAIL' "$out"/*.txt 2>/dev/null | head -4 | while read -r failed; do
        cp "$failed" "$keep/FAIL-$(basename "$failed" .txt).log"
    done
}
trap save_logs EXIT
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1 | head -1

# step NAME SECONDS SUMMARY-REGEX COMMAND...: runs COMMAND (log in
# $out/NAME.txt) for at most SECONDS, then prints the lines matching REGEX.
step() {
    local name=$1 seconds=$2 summary=$3
    shift 3
    [[ $name =~ ^(${CHECK_STEPS:-.*})$ ]] || return 0
    local start
    start=$(date +%s)
    echo "== $name"
    timeout "$seconds" env OUT="$out/$name" "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    grep -E "$summary" "$out/$name.txt" | head -60
    echo "   ($name: exit $rc, $(($(date +%s) - start)) s)"
}

# Parts 6 and 7 compare the bundle's build with BUNDLE/ab-old's.
need_ab_old() {
    [ -d "$bundle/ab-old" ] || { echo "check-all.sh: no $bundle/ab-old (make-bundle.sh with RGPU_AB_OLD)" >&2; exit 2; }
    echo "old: $(cat "$bundle/ab-old/REF" 2>/dev/null)"
}

case $part in
1)
    step sharing 170 '^(native|rgpu|w3|GPU|alone)|^  (alone|busy): (samples|slow sample [0-9]+ at)|^\||memory_limit_torch' \
        bash tests/bench/sharing_bench.sh "$bundle"
    step suite 230 '^FAIL|gpu suite:|^(sync|empty|HtoD|DtoH|event|stream) ' \
        bash "$bundle/run-gpu-suite.sh" "$bundle"
    step isolation 150 '^(PASS|FAIL)|suite:' bash "$bundle/run-isolation-suite.sh" "$bundle"
    ;;
2)
    step compat 540 '^\||FAIL|compat' env RGPU_BUNDLE="$bundle" bash tests/compat/run-compat.sh
    ;;
3)
    step perf 540 '^(==|--|control|pinned|[0-9] at once|pair|median|  runs in turn)|^[a-zA-Z0-9 +,()/-]+ +[-0-9.]+ +[-0-9.]+ ' \
        bash tests/bench/perf_bench.sh "$bundle"
    # Hand-written, malformed and stale commands against the cuda executor
    # (the test binary finds the daemon and guest-lib beside its deps/).
    rust=$bundle/rust-tests
    for f in vhost-device-rgpu libcuda.so libnvidia_ml.so; do ln -sf "$bundle/$f" "$rust/$f"; done
    step malformed-tests 120 '^test |test result' env RGPU_TEST_PREBUILT=1 RGPU_TEST_EXECUTOR=cuda \
        RGPU_TEST_PROGRAMS_DIR="$PWD/tests/programs" \
        RGPU_TEST_DRIVER_DIR="$(dirname "${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}")" \
        "$rust/deps/malformed_input" --test-threads 1
    ;;
4 | 5)
    # The daemon listens with the bundle's certificates (make-bundle.sh);
    # guest processes prefer RGPU_SERVER to RGPU_SOCKET.
    tls=$bundle/tls port=47400
    export RGPU_DAEMON_ARGS="--listen 127.0.0.1:$port --tls-cert $tls/server.pem --tls-key $tls/server.key --tls-client-ca $tls/ca.pem"
    export RGPU_SERVER=tls://localhost:$port RGPU_TLS_CA=$tls/ca.pem RGPU_TLS_CERT=$tls/client.pem \
        RGPU_TLS_KEY=$tls/client.key
    if [ "$part" = 4 ]; then
        step remote-suite 260 '^FAIL|gpu suite:|^(sync|empty|HtoD|DtoH|event|stream) ' \
            bash "$bundle/run-gpu-suite.sh" "$bundle"
        # The test binary finds the daemon and guest-lib beside its deps/.
        rust=$bundle/rust-tests
        for f in vhost-device-rgpu libcuda.so libnvidia_ml.so; do ln -sf "$bundle/$f" "$rust/$f"; done
        step remote-tests 200 '^test |test result' env -u RGPU_SERVER -u RGPU_DAEMON_ARGS \
            -u RGPU_TLS_CA -u RGPU_TLS_CERT -u RGPU_TLS_KEY \
            RGPU_TEST_PREBUILT=1 RGPU_TEST_EXECUTOR=cuda RGPU_TEST_PROGRAMS_DIR="$PWD/tests/programs" \
            RGPU_TEST_DRIVER_DIR="$(dirname "${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}")" \
            "$rust/deps/remote" --test-threads 1 --skip the_certificate_names_the_tenant
        step remote-perf 300 '^(==|--|control|pinned|[0-9] at once|pair|median|tls loopback|  runs in turn)|^[a-zA-Z0-9 +,()/-]+ +[-0-9.]+ +[-0-9.]+ ' \
            bash tests/bench/perf_bench.sh "$bundle"
    else
        step remote-compat 540 '^\||FAIL|compat' env RGPU_BUNDLE="$bundle" bash tests/compat/run-compat.sh
    fi
    ;;
6)
    need_ab_old
    native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
    ab=$(mktemp -d /tmp/rgpu-ab.XXXXXX)
    gcc -O2 -std=c11 -I "$bundle" -o "$ab/rgpu_bench" "$bundle/rgpu_bench.c" -ldl || exit 1
    mkdir -p "$ab/new"
    ln -s "$bundle/vhost-device-rgpu" "$ab/new/vhost-device-rgpu"
    ln -s "$bundle/libcuda.so" "$ab/new/libcuda.so.1"
    step ab 540 '^(round|[0-9]+ +(old|new)) ' env AB_EXECUTOR=cuda AB_NATIVE="$native_lib" \
        AB_BENCH="$ab/rgpu_bench" AB_PTX="$bundle/reference_kernels.ptx" AB_LOGS="$out/ab-logs" \
        AB_ARGS="${AB_ARGS:---sync-iters 10000 --launches 100000 --mib 1 --repeats 3}" \
        bash "$bundle/ab_run.sh" "$bundle/ab-old" "$ab/new" "${AB_ROUNDS:-4}"
    rm -rf "$ab"
    ;;
7)
    need_ab_old
    # shellcheck source=tests/bench/pinned_cpus.sh
    source tests/bench/pinned_cpus.sh
    pinning="--driver-cpu $driver_cpu --caller-cpu $caller_cpu"
    step placement 200 ' rep [0-9]+: ' env ROUNDS="${PLACEMENT_ROUNDS:-3}" bash tests/bench/launch_placement.sh \
        "$bundle" "new-pinned::$others:--launch-cpus $driver_cpu:$pinning" \
        "old-pinned::$others:--launch-cpus $driver_cpu:$pinning:ab-old" \
        "control-pinned::::--rgpu-side-launcher thread $pinning:native"
    step torch-control 330 '^round |: median |^profile ' env TORCH_TRAIN_CPU="$caller_cpu" \
        bash tests/bench/torch_options.sh "$bundle" 3 "pinned::$others:--launch-cpus $driver_cpu" \
        "control::::native" "profiled::$others:--launch-cpus $driver_cpu --profile-launches"
    step thread-time 120 '^==|worst run|runs in turn|^   ' env PINNED_CPUS="$driver_cpu,$caller_cpu" \
        bash tests/bench/thread_cpu_time.sh "$bundle"
    ;;
*)
    echo "check-all.sh: part 1 to 7" >&2
    exit 2
    ;;
esac
echo "logs in $out${keep:+ (archived in $keep/logs.tgz)}"
