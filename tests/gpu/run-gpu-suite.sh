#!/usr/bin/env bash
# rgpu's GPU suite, for the GPU host (no Rust there: the binaries are built on
# the build host by tests/gpu/make-bundle.sh and carried over in a folder).
#
#   run-gpu-suite.sh [BUNDLE]      (default: the folder this script is in)
#
# BUNDLE holds vhost-device-rgpu, guest-lib's libcuda.so, rgpu_cuda.h,
# driver_api_test.c, reference_kernels.ptx, nvcc_driver_api.cu, rgpu_bench.c.
# The suite
#   1. compiles driver_api_test with gcc against NVIDIA's libcuda and ours;
#   2. starts vhost-device-rgpu --executor cuda;
#   3. runs driver_api_test natively, through rgpu, and four at once through
#      rgpu;
#   4. builds nvcc_driver_api (kernels: nvcc -fatbin -arch=sm_90; host: g++)
#      and runs it natively and through rgpu;
#   5. runs the benchmark (native and rgpu side by side).
# Logs go to $OUT when set (else a temp folder, printed at the end). Every
# step prints a PASS or FAIL line; the exit status is the number of failures.
#
# Environment: NATIVE_LIBCUDA (default /usr/local/nvidia/lib64/libcuda.so.1),
# CUDA_HOME (default /usr/local/cuda), SKIP_BENCH=1 to leave the benchmark out,
# RGPU_EXECUTOR (default cuda; sim only with a bundle built with the default
# features, which make-bundle.sh leaves out, to try the script without a GPU),
# RGPU_DAEMON_ARGS (more options for the daemon, e.g. --listen and TLS files;
# with RGPU_SERVER set, guest processes go through the network carrier, and
# the parts that need a second daemon or local blobs are left out),
# RGPU_IPC_DAEMON_ARGS (more options for the CUDA IPC steps' daemon, e.g.
# --worker-seccomp log).
set -uo pipefail

bundle=$(cd "${1:-$(dirname "$0")}" && pwd)
native_lib=${NATIVE_LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
native_dir=$(dirname "$native_lib")
cuda_home=${CUDA_HOME:-/usr/local/cuda}
logs=${OUT:-$(mktemp -d /tmp/rgpu-gpu-suite.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/rgpu-gpu-work.XXXXXX)
failures=0
daemon_pid=
limited_pid=
second_pid=
ipc_pid=
ipc_exporter=

cleanup() {
    [ -n "$second_pid" ] && kill "$second_pid" 2>/dev/null
    [ -n "$ipc_exporter" ] && kill "$ipc_exporter" 2>/dev/null
    if [ -n "$ipc_pid" ]; then
        kill "$ipc_pid" 2>/dev/null
        wait "$ipc_pid" 2>/dev/null
    fi
    if [ -n "$limited_pid" ]; then
        kill "$limited_pid" 2>/dev/null
        wait "$limited_pid" 2>/dev/null
    fi
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null
        wait "$daemon_pid" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+ ($2)}"; failures=$((failures + 1)); }

# Runs a named step with a time limit; its output goes to $logs/NAME.log.
step() {
    local name=$1 expect=$2
    local log=$logs/${name// /-}.log
    shift 2
    if timeout 600 "$@" >"$log" 2>&1 && grep -q "$expect" "$log"; then
        pass "$name"
    else
        fail "$name" "see $log"
        tail -n 20 "$log" | sed 's/^/    /'
    fi
}

for f in vhost-device-rgpu libcuda.so rgpu_cuda.h driver_api_test.c reference_kernels.ptx \
    nvcc_driver_api.cu rgpu_bench.c; do
    [ -e "$bundle/$f" ] || { echo "FAIL bundle: $bundle/$f is missing"; exit 1; }
done
[ -e "$native_lib" ] || { echo "FAIL setup: no NVIDIA driver library at $native_lib"; exit 1; }

# Link directories: one with NVIDIA's library, one with ours. Each program is
# built against one of them and run with that directory only.
mkdir -p "$work/native-lib" "$work/rgpu-lib"
ln -s "$native_lib" "$work/native-lib/libcuda.so"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so.1"
ln -s "$bundle/libcuda.so" "$work/rgpu-lib/libcuda.so"
ptx=$bundle/reference_kernels.ptx

build() {
    local name=$1
    local log=$logs/build-${name// /-}.log
    shift
    if "$@" >"$log" 2>&1; then
        pass "build $name"
    else
        fail "build $name" "see $log"
        tail -n 20 "$log" | sed 's/^/    /'
    fi
}
for side in native rgpu; do
    build "driver_api_test-$side" gcc -O2 -std=c11 -Wall -I "$bundle" \
        -o "$work/driver_api_test-$side" "$bundle/driver_api_test.c" -L "$work/$side-lib" -lcuda
    build "nvcc_driver_api-$side" g++ -O2 -DRGPU_HOST_PART -x c++ -I "$cuda_home/include" \
        -o "$work/nvcc_driver_api-$side" "$bundle/nvcc_driver_api.cu" -L "$work/$side-lib" -lcuda
done
build "nvcc kernels sm_90 fatbin" "$cuda_home/bin/nvcc" -fatbin -arch=sm_90 \
    -o "$work/kernels.fatbin" "$bundle/nvcc_driver_api.cu"
build "nvcc kernels sm_90 cubin" "$cuda_home/bin/nvcc" -cubin -arch=sm_90 \
    -o "$work/kernels.cubin" "$bundle/nvcc_driver_api.cu"
build "nvcc kernels PTX" "$cuda_home/bin/nvcc" -ptx -arch=compute_90 \
    -o "$work/kernels.ptx" "$bundle/nvcc_driver_api.cu"
build rgpu_bench gcc -O2 -std=c11 -Wall -I "$bundle" -o "$work/rgpu_bench" \
    "$bundle/rgpu_bench.c" -ldl

# The daemon sees NVIDIA's library directory only, never ours.
socket=$work/rgpu.sock
stats=$work/stats.sock
env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" RGPU_LOG="${RGPU_LOG:-info}" \
    "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" --socket-path "$socket" --stats-socket "$stats" \
    ${RGPU_DAEMON_ARGS:-} >"$logs/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$socket" ] && [ -S "$stats" ] && break; sleep 0.05; done
if [ -S "$socket" ]; then
    pass "daemon started (--executor ${RGPU_EXECUTOR:-cuda})"
else
    fail "daemon started" "see $logs/daemon.log"
    tail -n 20 "$logs/daemon.log" | sed 's/^/    /'
    exit "$failures"
fi

native=(env -u RGPU_SOCKET -u RGPU_SERVER -u RGPU_DEVICES LD_LIBRARY_PATH="$native_dir")
through_rgpu=(env RGPU_SOCKET="$socket" LD_LIBRARY_PATH="$work/rgpu-lib")

# Using a destroyed stream handle is undefined behaviour with NVIDIA's
# driver: the native run leaves that check out.
step "driver_api_test native" "checks passed" \
    "${native[@]}" "$work/driver_api_test-native" --ptx "$ptx" --no-bogus-handles
step "driver_api_test through rgpu" "checks passed" \
    "${through_rgpu[@]}" "$work/driver_api_test-rgpu" --ptx "$ptx" --iterations 3

pids=()
for i in 1 2 3 4; do
    "${through_rgpu[@]}" "$work/driver_api_test-rgpu" --ptx "$ptx" --iterations 2 \
        >"$logs/driver_api_test-concurrent-$i.log" 2>&1 &
    pids+=($!)
done
concurrent_ok=1
for i in 1 2 3 4; do
    if ! wait "${pids[$((i - 1))]}" || ! grep -q "checks passed" "$logs/driver_api_test-concurrent-$i.log"; then
        concurrent_ok=0
    fi
done
if [ "$concurrent_ok" = 1 ]; then
    pass "four driver_api_test at once through rgpu"
else
    fail "four driver_api_test at once through rgpu" "see $logs/driver_api_test-concurrent-*.log"
fi

# A process killed mid-run: its session and device memory must be freed.
stats_line() {
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.makefile().readline().strip())' "$stats"
}
"${through_rgpu[@]}" "$work/driver_api_test-rgpu" --ptx "$ptx" --iterations 100000 --hold-ms 20 \
    >"$logs/driver_api_test-killed.log" 2>&1 &
victim=$!
for _ in $(seq 400); do grep -q running "$logs/driver_api_test-killed.log" && break; sleep 0.05; done
busy=$(stats_line)
kill -9 "$victim"; wait "$victim" 2>/dev/null
freed=
for _ in $(seq 200); do
    after=$(stats_line)
    case "$after" in *'"sessions_active":0,'*'"device_memory_bytes":0,'*) freed=1; break ;; esac
    sleep 0.05
done
echo "while running: $busy" >"$logs/killed-stats.log"
echo "after kill -9: $after" >>"$logs/killed-stats.log"
if [ -n "$freed" ] && grep -q running "$logs/driver_api_test-killed.log"; then
    pass "process killed mid-run: session and device memory freed ($(grep -o '"sessions_active":[0-9]*' <<<"$busy") before)"
else
    fail "process killed mid-run" "see $logs/killed-stats.log"
    cat "$logs/killed-stats.log"
fi

step "nvcc_driver_api native" "checks passed" \
    "${native[@]}" "$work/nvcc_driver_api-native" "$work/kernels.fatbin"
step "nvcc_driver_api through rgpu" "checks passed" \
    "${through_rgpu[@]}" "$work/nvcc_driver_api-rgpu" "$work/kernels.fatbin"
step "nvcc_driver_api fatbin with cuModuleLoadFatBinary through rgpu" "checks passed" \
    "${through_rgpu[@]}" "$work/nvcc_driver_api-rgpu" --loader fatbinary "$work/kernels.fatbin"
step "nvcc_driver_api cubin with cuModuleLoadDataEx through rgpu" "checks passed" \
    "${through_rgpu[@]}" "$work/nvcc_driver_api-rgpu" --loader dataex "$work/kernels.cubin"
step "nvcc_driver_api PTX with cuModuleLoadData through rgpu" "checks passed" \
    "${through_rgpu[@]}" "$work/nvcc_driver_api-rgpu" "$work/kernels.ptx"

# Fatbin fixtures built here with nvcc (committed from this run's output),
# then the library API on each, natively and through rgpu.
if [ -x "$bundle/fixtures/make-fixtures.sh" ] || [ -f "$bundle/fixtures/make-fixtures.sh" ]; then
    cp -r "$bundle/fixtures" "$work/fixtures"
    build "fatbin fixtures" bash "$work/fixtures/make-fixtures.sh"
    tar czf "$logs/fixtures.tgz" -C "$work/fixtures" .
    for side in native rgpu; do
        build "library_api_test-$side" gcc -O2 -std=c11 -Wall -I "$bundle" \
            -o "$work/library_api_test-$side" "$bundle/library_api_test.c" -L "$work/$side-lib" -lcuda
    done
    for image in kernels-sm90.fatbin kernels-multi.fatbin kernels-compressed.fatbin \
        kernels-compressed-size.fatbin kernels-ptx.fatbin kernels.ptx; do
        [ -e "$work/fixtures/$image" ] || continue
        step "library_api_test $image native" "checks passed" \
            "${native[@]}" "$work/library_api_test-native" --image "$work/fixtures/$image" \
            --fixture --run-fixture-kernel
        step "library_api_test $image through rgpu" "checks passed" \
            "${through_rgpu[@]}" "$work/library_api_test-rgpu" --image "$work/fixtures/$image" \
            --fixture --run-fixture-kernel --check-stale-handles
    done
fi

# The queries frameworks make (pointer attributes, occupancy, function
# attributes, capture state), natively and through rgpu.
if [ -e "$bundle/framework_queries_test.c" ]; then
    # Mapped page-locked memory, read by a kernel: not over the network
    # carrier (the memory is the guest process's own there).
    mapped=--mapped-kernel
    [ -n "${RGPU_SERVER:-}" ] && mapped=
    for side in native rgpu; do
        build "framework_queries_test-$side" gcc -O2 -std=c11 -Wall -I "$bundle" \
            -o "$work/framework_queries_test-$side" "$bundle/framework_queries_test.c" \
            -L "$work/$side-lib" -lcuda
    done
    step "framework_queries_test native" "checks passed" \
        "${native[@]}" "$work/framework_queries_test-native" --image "$ptx" $mapped
    step "framework_queries_test through rgpu" "checks passed" \
        "${through_rgpu[@]}" "$work/framework_queries_test-rgpu" --image "$ptx" $mapped
fi

# Graphs by stream capture, the virtual-memory API and memory pools (issue
# 10), queries that never wait (issue 9) and launch attributes (issue 10),
# natively and through rgpu.
for program in graph_test graph_api_test query_test vmm_test shareable_test pool_test launch_attributes_test; do
    [ -e "$bundle/$program.c" ] || continue
    for side in native rgpu; do
        build "$program-$side" gcc -O2 -std=c11 -Wall -I "$bundle" \
            -o "$work/$program-$side" "$bundle/$program.c" -L "$work/$side-lib" -lcuda -lpthread
    done
    step "$program native" "checks passed" "${native[@]}" "$work/$program-native" --ptx "$ptx"
    # The network carrier shares no memory with the host: no mapped words,
    # and graph calls naming page-locked memory must be refused.
    remote_only=()
    case $program in
    query_test | graph_test | graph_api_test)
        [ -n "${RGPU_SERVER:-}" ] && remote_only=(--no-mapped-memory) ;;
    esac
    step "$program through rgpu" "checks passed" \
        "${through_rgpu[@]}" "$work/$program-rgpu" --ptx "$ptx" "${remote_only[@]}"
    grep -h '^MEASURED' "$logs/$program-native.log" "$logs/$program-through-rgpu.log" 2>/dev/null
    for side in native through-rgpu; do
        grep -h '^launch completion' "$logs/$program-$side.log" 2>/dev/null | sed "s/^/$side: /"
    done
done

# Several GPUs in one program (issue 11): an nvcc runtime program switching
# devices with cudaSetDevice, through two daemons on the one GPU
# (RGPU_DEVICES); no native run (the host has one GPU).
if [ -e "$bundle/multi_device_runtime.cu" ] && [ -z "${RGPU_SERVER:-}" ]; then
    second_socket=$work/second.sock
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" RGPU_LOG="${RGPU_LOG:-info}" \
        "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" --socket-path "$second_socket" \
        >"$logs/second-daemon.log" 2>&1 &
    second_pid=$!
    for _ in $(seq 200); do [ -S "$second_socket" ] && break; sleep 0.05; done
    build multi_device_runtime "$cuda_home/bin/nvcc" -arch=sm_90 -o "$work/multi_device_runtime" \
        "$bundle/multi_device_runtime.cu"
    step "multi_device_runtime through two daemons" "checks passed" \
        env RGPU_DEVICES="$socket,$second_socket" LD_LIBRARY_PATH="$work/rgpu-lib" \
        "$work/multi_device_runtime"
    kill "$second_pid" 2>/dev/null
    wait "$second_pid" 2>/dev/null
fi

# Thread-block clusters reading each other's shared memory and a
# cooperative launch with a grid-wide barrier (issue 10): an nvcc runtime
# program (static cudart), natively and through rgpu.
if [ -e "$bundle/cluster_coop_test.cu" ]; then
    build cluster_coop_test "$cuda_home/bin/nvcc" -arch=sm_90 -cudart static \
        -o "$work/cluster_coop_test" "$bundle/cluster_coop_test.cu"
    step "cluster_coop_test native" "checks passed" \
        "${native[@]}" "$work/cluster_coop_test"
    step "cluster_coop_test through rgpu" "checks passed" \
        "${through_rgpu[@]}" "$work/cluster_coop_test"
fi

# Hopper's tensor memory accelerator reading through maps that
# cuTensorMapEncodeTiled and cuTensorMapReplaceAddress made (issue 10; the
# host's driver encodes them through rgpu).
if [ -e "$bundle/tensor_map_test.cu" ]; then
    build tensor_map_test "$cuda_home/bin/nvcc" -arch=sm_90a -cudart static \
        -o "$work/tensor_map_test" "$bundle/tensor_map_test.cu"
    step "tensor_map_test native" "checks passed" \
        "${native[@]}" "$work/tensor_map_test"
    step "tensor_map_test through rgpu" "checks passed" \
        "${through_rgpu[@]}" "$work/tensor_map_test"
fi

# CUDA IPC within a tenant (issue 10): process A exports device memory and
# an interprocess event, process B opens both, waits for the event, reads
# A's data (to the host and into its own memory) and overwrites it, and A
# reads B's words back; natively, then through a daemon serving two tenants
# (ipc-a, ipc-b), where a process of ipc-b, forged handles and the handles
# of A's freed memory and destroyed event are refused with
# CUDA_ERROR_INVALID_HANDLE. The native runs with a forged handle and after
# the free only print what NVIDIA's driver answers. With
# RGPU_EXECUTOR=sim, B's opens answer CUDA_ERROR_NOT_SUPPORTED (the fixture
# cannot map another process's memory) and A expects no write.
ipc_opened=opened
ipc_write=--expect-write
if [ "${RGPU_EXECUTOR:-cuda}" = sim ]; then ipc_opened=unsupported ipc_write=; fi
#   ipc_export LOG DIR RUNNER...: starts A in the background (its output in
#   $logs/LOG-exporter.log); returns once it printed "exported", 1 if it
#   ended first or took over 30 s.
ipc_export() {
    local log=$logs/$1-exporter.log dir=$2
    shift 2
    rm -rf "$dir" && mkdir -p "$dir"
    "$@" export "$dir" $ipc_write >"$log" 2>&1 &
    ipc_exporter=$!
    for _ in $(seq 600); do
        grep -qx exported "$log" && return 0
        kill -0 "$ipc_exporter" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
#   ipc_free LOG DIR: A frees its memory and destroys its event.
ipc_free() {
    touch "$2/free"
    for _ in $(seq 600); do
        grep -qx freed "$logs/$1-exporter.log" && return 0
        kill -0 "$ipc_exporter" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
#   ipc_end LOG DIR LABEL: A ends; PASS when all its checks passed (and,
#   unless in sim, it read B's write back).
ipc_end() {
    local log=$logs/$1-exporter.log waited=0
    touch "$2/exit"
    while kill -0 "$ipc_exporter" 2>/dev/null && [ "$waited" -lt 600 ]; do
        sleep 0.05
        waited=$((waited + 1))
    done
    kill "$ipc_exporter" 2>/dev/null
    wait "$ipc_exporter" 2>/dev/null
    ipc_exporter=
    if grep -q '^ipc_test: [0-9]* checks passed$' "$log" &&
        { [ -z "$ipc_write" ] || grep -q "^A sees B's write$" "$log"; }; then
        pass "$3: A's checks, and A reads back what B wrote into its memory"
    else
        fail "$3: A's checks, and A reads back what B wrote into its memory" "see $log"
        tail -n 20 "$log" | sed 's/^/    /'
    fi
}
if [ -e "$bundle/ipc_test.c" ] && [ -z "${RGPU_SERVER:-}" ]; then
    passed='^ipc_test: [0-9]* checks passed$'
    for side in native rgpu; do
        build "ipc_test-$side" gcc -O2 -std=c11 -Wall -I "$bundle" -o "$work/ipc_test-$side" \
            "$bundle/ipc_test.c" -L "$work/$side-lib" -lcuda
    done
    ipc_dir=$work/ipc-native
    if ipc_export ipc_test-native "$ipc_dir" "${native[@]}" "$work/ipc_test-native"; then
        step "ipc_test native: B opens A's memory and event" "$passed" \
            "${native[@]}" "$work/ipc_test-native" open "$ipc_dir" --expect opened
        "${native[@]}" "$work/ipc_test-native" open "$ipc_dir" --expect any --flip 37 \
            >"$logs/ipc_test-native-forged.log" 2>&1
        ipc_free ipc_test-native "$ipc_dir"
        "${native[@]}" "$work/ipc_test-native" open "$ipc_dir" --expect any \
            >"$logs/ipc_test-native-freed.log" 2>&1
        grep -h '^open' "$logs/ipc_test-native-forged.log" | sed 's/^/NVIDIA, a forged handle: /'
        grep -h '^open' "$logs/ipc_test-native-freed.log" | sed 's/^/NVIDIA, freed memory: /'
        ipc_end ipc_test-native "$ipc_dir" "ipc_test native"
    else
        fail "ipc_test native: A exports" "see $logs/ipc_test-native-exporter.log"
        tail -n 20 "$logs/ipc_test-native-exporter.log" | sed 's/^/    /'
    fi

    printf '[[tenant]]\nname = "ipc-a"\nsocket = "%s"\n\n[[tenant]]\nname = "ipc-b"\nsocket = "%s"\n' \
        "$work/ipc-a.sock" "$work/ipc-b.sock" >"$work/ipc.toml"
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" \
        RGPU_LOG="${RGPU_LOG:-info},rgpu_session::ipc=debug" \
        "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" --config "$work/ipc.toml" \
        ${RGPU_IPC_DAEMON_ARGS:-} >"$logs/ipc-daemon.log" 2>&1 &
    ipc_pid=$!
    for _ in $(seq 400); do [ -S "$work/ipc-a.sock" ] && [ -S "$work/ipc-b.sock" ] && break; sleep 0.05; done
    ipc_a=(env RGPU_SOCKET="$work/ipc-a.sock" LD_LIBRARY_PATH="$work/rgpu-lib")
    ipc_b=(env RGPU_SOCKET="$work/ipc-b.sock" LD_LIBRARY_PATH="$work/rgpu-lib")
    ipc_dir=$work/ipc-rgpu
    if ipc_export ipc_test-rgpu "$ipc_dir" "${ipc_a[@]}" "$work/ipc_test-rgpu"; then
        step "ipc_test through rgpu: B of the same tenant opens A's memory and event" "$passed" \
            "${ipc_a[@]}" "$work/ipc_test-rgpu" open "$ipc_dir" --expect "$ipc_opened" --check-closed
        step "ipc_test through rgpu: a process of another tenant is refused" "$passed" \
            "${ipc_b[@]}" "$work/ipc_test-rgpu" open "$ipc_dir" --expect refused
        step "ipc_test through rgpu: a handle with a byte flipped is refused" "$passed" \
            "${ipc_a[@]}" "$work/ipc_test-rgpu" open "$ipc_dir" --expect refused --flip 37
        step "ipc_test through rgpu: random bytes are refused" "$passed" \
            "${ipc_a[@]}" "$work/ipc_test-rgpu" open "$ipc_dir" --expect refused --random
        ipc_free ipc_test-rgpu "$ipc_dir"
        step "ipc_test through rgpu: freed memory and a destroyed event are refused" "$passed" \
            "${ipc_a[@]}" "$work/ipc_test-rgpu" open "$ipc_dir" --expect refused
        ipc_end ipc_test-rgpu "$ipc_dir" "ipc_test through rgpu"
    else
        fail "ipc_test through rgpu: A exports" "see $logs/ipc_test-rgpu-exporter.log"
        tail -n 20 "$logs/ipc_test-rgpu-exporter.log" | sed 's/^/    /'
    fi
    if grep -q SIGSYS "$logs/ipc-daemon.log"; then
        echo "    a worker died of SIGSYS (seccomp): run again with RGPU_IPC_DAEMON_ARGS='--worker-seccomp log'"
        echo "    and look for type=SECCOMP in the kernel log (journalctl -k) to see which call IPC needs"
    fi
    grep -hoE 'IPC (Memory|Event) handle (accepted|refused)' "$logs/ipc-daemon.log" | sort | uniq -c |
        sed 's/^ */ipc daemon: /'
    kill "$ipc_pid" 2>/dev/null
    wait "$ipc_pid" 2>/dev/null
    ipc_pid=
fi

# NVML: rgpu's libnvidia-ml.so.1 must report what NVIDIA's reports.
if [ -e "$bundle/libnvidia_ml.so" ]; then
    ln -s "$bundle/libnvidia_ml.so" "$work/rgpu-lib/libnvidia-ml.so.1"
    ln -s "$bundle/libnvidia_ml.so" "$work/rgpu-lib/libnvidia-ml.so"
    ln -s "$native_dir/libnvidia-ml.so.1" "$work/native-lib/libnvidia-ml.so"
    for side in native rgpu; do
        build "nvml_test-$side" gcc -O2 -std=c11 -Wall -o "$work/nvml_test-$side" \
            "$bundle/nvml_test.c" -L "$work/$side-lib" -lnvidia-ml
    done
    # Line-buffered: what it printed survives if NVIDIA's library crashes
    # on a later check.
    "${native[@]}" NVML_TEST_NATIVE=1 stdbuf -oL "$work/nvml_test-native" >"$logs/nvml-native.log" 2>&1 ||
        echo "note: nvml_test against NVIDIA's library ended with rc $? (see $logs/nvml-native.log)"
    step "nvml_test through rgpu" "checks passed" \
        "${through_rgpu[@]}" "$work/nvml_test-rgpu"
    for key in count cuda_driver_version driver_version name uuid compute_capability; do
        n=$(grep "^$key=" "$logs/nvml-native.log"); r=$(grep "^$key=" "$logs/nvml_test-through-rgpu.log")
        if [ -n "$n" ] && [ "$n" = "$r" ]; then pass "nvml $n (same as NVIDIA's)"
        else fail "nvml $key" "native '$n', rgpu '$r'"; fi
    done
    n=$(grep '^memory=' "$logs/nvml-native.log" | cut -d/ -f1)
    r=$(grep '^memory=' "$logs/nvml_test-through-rgpu.log" | cut -d/ -f1)
    if [ -n "$n" ] && [ "$n" = "$r" ]; then pass "nvml total ${n#memory=} bytes (same as NVIDIA's)"
    else fail "nvml memory total" "native '$n', rgpu '$r'"; fi
fi

# A tenant limited to 2 GiB (issue 8): the context's own memory and module
# globals count against the limit, and NVML alone (as nvidia-smi) lists
# the tenant's processes with what NVIDIA's nvidia-smi says they hold.
if [ -e "$bundle/driver_memory_test.c" ] && [ -e "$bundle/libnvidia_ml.so" ] && [ -z "${RGPU_SERVER:-}" ]; then
    limited_socket=$work/limited.sock
    env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$native_dir" RGPU_LOG="${RGPU_LOG:-info},rgpu_session::driver_memory=debug" \
        "$bundle/vhost-device-rgpu" --executor "${RGPU_EXECUTOR:-cuda}" --socket-path "$limited_socket" \
        --memory-limit 2GiB >"$logs/limited-daemon.log" 2>&1 &
    limited_pid=$!
    for _ in $(seq 200); do [ -S "$limited_socket" ] && break; sleep 0.05; done
    limited=(env RGPU_SOCKET="$limited_socket" LD_LIBRARY_PATH="$work/rgpu-lib")
    build driver_memory_test gcc -O2 -std=c11 -Wall -I "$bundle" -o "$work/driver_memory_test" \
        "$bundle/driver_memory_test.c" -L "$work/rgpu-lib" -lcuda
    build memory_limit_test gcc -O2 -std=c11 -Wall -I "$bundle" -o "$work/memory_limit_test" \
        "$bundle/memory_limit_test.c" -L "$work/rgpu-lib" -lcuda
    build nvml_list gcc -O2 -std=c11 -Wall -o "$work/nvml_list" "$bundle/nvml_list.c" \
        -L "$work/rgpu-lib" -lnvidia-ml
    start_ns=$(date +%s%N)
    step "driver_memory_test under a 2 GiB limit" "checks passed" \
        "${limited[@]}" "$work/driver_memory_test" --limit-mb 2048 --global-mb 256
    echo "driver_memory_test: $(( ($(date +%s%N) - start_ns) / 1000000 )) ms"
    grep -E '^(start|loaded|after|all|allocated)' "$logs/driver_memory_test-under-a-2-GiB-limit.log"
    rm -f "$work/release"
    "${limited[@]}" "$work/memory_limit_test" --max-mb 256 --hold-file "$work/release" \
        >"$logs/nvml-holder.log" 2>&1 &
    holder=$!
    for _ in $(seq 400); do grep -q holding "$logs/nvml-holder.log" && break; sleep 0.05; done
    # The lister stays alive while nvidia-smi looks: it asked NVML only, so
    # its worker must hold no context (no DMA registration without a copy).
    rm -f "$work/lister-release"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >"$logs/nvidia-smi-before.log" 2>&1
    "${limited[@]}" "$work/nvml_list" --hold "$work/lister-release" >"$logs/nvml-list.log" 2>&1 &
    lister=$!
    for _ in $(seq 400); do grep -q holding "$logs/nvml-list.log" && break; sleep 0.05; done
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >"$logs/nvidia-smi-apps.log" 2>&1
    touch "$work/lister-release" "$work/release"; wait "$lister" "$holder"
    # Memory shared between the tenant's processes counts while they hold
    # it: nine rounds of 256 MiB handed to a child and freed by the parent
    # (natively all granted; under the limit the child never holds more).
    if [ -e "$bundle/shared_limit_test.c" ]; then
        for side in native rgpu; do
            build "shared_limit_test-$side" gcc -O2 -std=c11 -Wall -I "$bundle" \
                -o "$work/shared_limit_test-$side" "$bundle/shared_limit_test.c" \
                -L "$work/$side-lib" -lcuda
        done
        for via in shareable ipc; do
            step "shared_limit_test native, $via" "shared_limit_test: [0-9]* checks passed" \
                "${native[@]}" "$work/shared_limit_test-native" --via "$via" --mib 256 --rounds 9
            step "shared_limit_test through rgpu, $via, under a 2 GiB limit" \
                "shared_limit_test: [0-9]* checks passed" "${limited[@]}" \
                "$work/shared_limit_test-rgpu" --via "$via" --mib 256 --rounds 9 --limit-mib 2048
            grep -h '^round' "$logs/shared_limit_test-through-rgpu,-$via,-under-a-2-GiB-limit.log" \
                | sed "s/^/    $via: /"
        done
    fi
    echo "nvml through rgpu (holder is guest pid $holder):"; sed 's/^/    /' "$logs/nvml-list.log"
    echo "nvidia-smi on the host, while both ran:"; sed 's/^/    /' "$logs/nvidia-smi-apps.log"
    used=$(sed -n "s/^pid=$holder used=//p" "$logs/nvml-list.log")
    if [ -n "$used" ] && [ "$used" -gt $((256 << 20)) ] && grep -q '^processes 1$' "$logs/nvml-list.log"; then
        pass "nvml lists the tenant's process $holder with $((used >> 20)) MiB (256 MiB allocated + the context's own)"
    else
        fail "nvml process list under a limit" "see $logs/nvml-list.log"
    fi
    before=$(grep -c MiB "$logs/nvidia-smi-before.log") during=$(grep -c MiB "$logs/nvidia-smi-apps.log")
    if [ "$before" = "$during" ]; then
        pass "a process that only asks NVML holds no context on the host ($during processes in nvidia-smi with it, $before before)"
    else
        fail "an NVML-only process holds a context on the host" "see $logs/nvidia-smi-apps.log"
    fi
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    step "benchmark" "rgpu_bench: device" \
        env RGPU_SOCKET="$socket" "$work/rgpu_bench" --native "$native_lib" \
        --rgpu "$work/rgpu-lib/libcuda.so.1" --ptx "$ptx"
    cat "$logs/benchmark.log" 2>/dev/null
    # The same with rgpu's blobs (channel, pinned buffers) laid out as
    # shuffled runs of 1-8 pages, as a VM that has run a while hands them
    # out: the copy rows against the contiguous ones above (issue 9).
    [ -z "${RGPU_SERVER:-}" ] && step "scattered-blob benchmark" "rgpu_bench: device" \
        env RGPU_SOCKET="$socket" RGPU_LOCAL_SCATTER_BLOBS=1 "$work/rgpu_bench" \
        --rgpu "$work/rgpu-lib/libcuda.so.1" --ptx "$ptx" --sync-iters 1000 --launches 10000
    cat "$logs/scattered-blob-benchmark.log" 2>/dev/null
fi

if command -v python3 >/dev/null; then
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.makefile().readline().strip())' \
        "$stats" >"$logs/daemon-stats.json" 2>&1 && echo "daemon stats: $(cat "$logs/daemon-stats.json")"
fi
if kill -0 "$daemon_pid" 2>/dev/null; then
    pass "daemon alive after the suite"
else
    fail "daemon alive after the suite" "see $logs/daemon.log"
fi

echo "gpu suite: $failures failure(s); logs in $logs"
exit "$failures"
