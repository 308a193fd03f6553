#!/usr/bin/env bash
# Builds release binaries on the build host and gathers everything
# run-gpu-suite.sh needs into one folder to carry to the GPU host.
#
#   tests/gpu/make-bundle.sh DIR
#
# With RGPU_AB_OLD=REF it also builds REF's daemon and guest library into
# DIR/ab-old, for tests/bench/ab_run.sh there (check-all.sh part 6): the
# two builds measured in turn on one machine, as the GPU host's own spread
# hides a few percent between runs.
set -euo pipefail
dir=${1:?usage: make-bundle.sh DIR}
cd "$(dirname "$0")/../.."
cargo build --release --no-default-features -p vhost-device-rgpu -p guest-lib -p rgpu-nvml
target=${CARGO_TARGET_DIR:-$(pwd)/target}/release
mkdir -p "$dir"
cp "$target/vhost-device-rgpu" "$target/libcuda.so" "$target/libnvidia_ml.so" "$dir/"
# Issue 11 (check-all.sh parts 4 and 5): the TLS yardstick, the Rust remote
# tests (run there with the cuda executor beside the bundle's daemon), and
# certificates for the daemon and one client, valid for a week.
cargo build --release -p rgpu-tests --bin tls_loopback_bench
cp "$target/tls_loopback_bench" "$dir/"
# malformed_input: hand-written and stale commands against the cuda
# executor (check-all.sh part 3).
mkdir -p "$dir/rust-tests/deps"
for test in remote malformed_input; do
    built=$(cargo test --release -p rgpu-tests --test "$test" --no-run 2>&1 \
        | sed -n "s|.*(\(.*/deps/$test-[0-9a-f]*\)).*|\1|p" | tail -1)
    cp "$built" "$dir/rust-tests/deps/$test"
done
mkdir -p "$dir/tls"
(
    cd "$dir/tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
        -days 7 -subj "/CN=rgpu bundle CA" 2>/dev/null
    for who in server client; do
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $who.key -out $who.csr \
            -subj "/CN=$([ $who = server ] && echo localhost || echo default)" 2>/dev/null
    done
    printf 'basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
    printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' >client.ext
    for who in server client; do
        openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 7 \
            -extfile $who.ext 2>/dev/null
    done
    rm -f ./*.csr ./*.ext ca.srl
)
# Function names stay for backtraces; line tables would only fatten the bundle.
strip --strip-debug "$dir/vhost-device-rgpu" "$dir/libcuda.so" "$dir/libnvidia_ml.so" \
    "$dir/tls_loopback_bench" "$dir"/rust-tests/deps/*
cp tests/programs/rgpu_cuda.h tests/programs/driver_api_test.c \
    tests/programs/reference_kernels.ptx tests/programs/nvcc_driver_api.cu \
    tests/bench/rgpu_bench.c tests/gpu/run-gpu-suite.sh \
    tests/programs/library_api_test.c tests/programs/nvml_test.c \
    tests/programs/framework_queries_test.c tests/programs/checks.h tests/programs/wait_for_file.h \
    tests/programs/forged_pointer_test.c tests/programs/foreign_pointer_test.c \
    tests/programs/kernel_probe_test.c tests/programs/fault_test.c tests/programs/spin_test.c \
    tests/programs/memory_limit_test.c tests/gpu/memory_limit_torch.py \
    tests/programs/driver_memory_test.c tests/programs/nvml_list.c tests/programs/rgpu_nvml.h \
    tests/programs/graph_test.c tests/programs/graph_api_test.c \
    tests/programs/query_test.c tests/programs/vmm_test.c tests/programs/pool_test.c \
    tests/programs/shareable_test.c tests/programs/shared_limit_test.c \
    tests/programs/launch_attributes_test.c tests/programs/rgpu_launch.h tests/programs/rgpu_vmm.h \
    tests/bench/perf_bench.sh tests/bench/launch_profile.sh tests/bench/profiling.sh tests/bench/torch_train.py \
    tests/bench/torch_options.sh tests/bench/busy_cpus.sh \
    tests/bench/pingpong.c tests/bench/cpu_distance.c tests/bench/launch_split.c tests/bench/launch_params.c tests/bench/sync_probe.c tests/bench/cuda_check.h tests/bench/ab_run.sh tests/bench/launch_placement.sh tests/bench/pinned_cpus.sh \
    tests/bench/share_tenant.c tests/bench/sharing_bench.sh tests/bench/priority_options.sh \
    tests/gpu-tools/registration_probe.c tests/gpu/run-isolation-suite.sh \
    tests/gpu/multi_device_runtime.cu tests/programs/ipc_test.c \
    tests/programs/cluster_coop_test.cu tests/programs/tensor_map_test.cu "$dir/"
mkdir -p "$dir/fixtures"
cp tests/fixtures/fatbin/kernels.cu tests/fixtures/fatbin/second_unit.cu \
    tests/fixtures/fatbin/make-fixtures.sh "$dir/fixtures/"
if [ -n "${RGPU_AB_OLD:-}" ]; then
    cache=${RGPU_AB_CACHE:-/tmp/rgpu-sim-ab}
    tests/bench/build_ref.sh "$RGPU_AB_OLD" "$dir/ab-old" "$cache/target-old" --no-default-features
    strip --strip-debug "$dir/ab-old/vhost-device-rgpu" "$dir/ab-old/libcuda.so.1"
    git rev-parse "$RGPU_AB_OLD" >"$dir/ab-old/REF"
fi
echo "bundle ready in $dir: run $dir/run-gpu-suite.sh on the GPU host"
