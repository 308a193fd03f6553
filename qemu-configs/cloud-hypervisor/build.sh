#!/usr/bin/env bash
# rgpu's patch to cloud-hypervisor, applied, built and tested as far as a
# machine without KVM allows (cloud-hypervisor cannot boot a guest without
# KVM or MSHV):
#
#   qemu-configs/cloud-hypervisor/build.sh CH_SRC DAEMON
#
#   CH_SRC   a cloud-hypervisor source tree (a checkout, or a bare git
#            repository: its HEAD is exported); copied, never changed
#   DAEMON   a vhost-device-rgpu binary built with the sim executor
#
# Steps, each printing PASS or FAIL:
#   1. the probe (rgpu_feature_probe.rs, rgpu's code, built as an example
#      of cloud-hypervisor's virtio-devices crate) creates the generic
#      vhost-user device on a sim daemon's socket exactly as the VMM does
#      for --generic-vhost-user device_type=16, and reads the features it
#      would offer the guest: without the patch VIRGL, RESOURCE_BLOB and
#      CONTEXT_INIT must be missing...
#   2. ...the patch applies (git apply --check, then git apply),
#   3. the patch's unit tests pass (cargo test -p virtio-devices),
#   4. and with the patch the probe finds all three offered.
# With BUILD_VMM=1 it also builds the cloud-hypervisor binary (release) and
# checks that it parses --generic-vhost-user.
#
# cloud-hypervisor depends on micro_http from a git repository; where that
# cannot be fetched, MICRO_HTTP_SRC names a local copy. The build's target
# folder is cached in $RGPU_CACHE/cloud-hypervisor-target (default
# /var/cache/rgpu): a rebuild takes seconds.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:?usage: build.sh CH_SRC DAEMON}
daemon=${2:?usage: build.sh CH_SRC DAEMON}
cache=${RGPU_CACHE:-/var/cache/rgpu}
export CARGO_TARGET_DIR=$cache/cloud-hypervisor-target
work=$(mktemp -d /tmp/rgpu-ch.XXXXXX)
failures=0
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+: $2}"; failures=$((failures + 1)); }

tree=$work/cloud-hypervisor
mkdir -p "$tree"
if [ -d "$src/.git" ] || [ ! -d "$src/objects" ]; then
    (cd "$src" && tar --exclude=./target --exclude=./.git -cf - .) | tar -xf - -C "$tree"
else
    git --git-dir="$src" archive HEAD | tar -xf - -C "$tree"
fi
(cd "$tree" && git init -q && git add -A && git -c user.name=rgpu -c user.email=rgpu@localhost commit -qm base)
echo "cloud-hypervisor source: $(grep -m1 '^version' "$tree/cloud-hypervisor/Cargo.toml" 2>/dev/null || echo '?')"
cargo_args=()
if [ -n "${MICRO_HTTP_SRC:-}" ]; then
    cargo_args+=(--config "patch.\"https://github.com/firecracker-microvm/micro-http\".micro_http.path=\"$MICRO_HTTP_SRC\"")
fi
mkdir -p "$tree/virtio-devices/examples"
cp "$here/rgpu_feature_probe.rs" "$tree/virtio-devices/examples/"

socket=$work/rgpu.sock
RGPU_LOG=warn "$daemon" --executor sim --socket-path "$socket" >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$socket" ] && break; sleep 0.05; done

probe() {
    (cd "$tree" && cargo run -q "${cargo_args[@]}" -p virtio-devices --example rgpu_feature_probe \
        -- "$socket") >"$work/probe-$1.log" 2>&1
    local rc=$?
    sed 's/^/    /' "$work/probe-$1.log"
    return $rc
}

probe unpatched
rc=$?
if [ $rc = 1 ] && grep -q 'CONTEXT_INIT (bit 4) MISSING' "$work/probe-unpatched.log"; then
    pass "without the patch the generic device masks the backend's device features (probe exit 1)"
else
    fail "probe without the patch" "exit $rc, expected 1 (features missing)"
fi

patch=$here/0001-generic-vhost-user-offer-device-type-features.patch
if (cd "$tree" && git apply --check "$patch" && git apply "$patch"); then
    pass "the patch applies"
else
    fail "the patch applies"
fi
if (cd "$tree" && cargo test -q "${cargo_args[@]}" -p virtio-devices --lib generic_vhost_user) \
    >"$work/unit.log" 2>&1 && grep -q 'test result: ok. 2 passed' "$work/unit.log"; then
    pass "the patch's unit tests ($(grep -m1 'test result' "$work/unit.log"))"
else
    fail "the patch's unit tests" "$(tail -n 5 "$work/unit.log")"
fi
probe patched
rc=$?
if [ $rc = 0 ]; then
    pass "with the patch the device offers VIRGL, RESOURCE_BLOB and CONTEXT_INIT (probe exit 0)"
else
    fail "probe with the patch" "exit $rc"
fi

if [ "${BUILD_VMM:-0}" = 1 ]; then
    if (cd "$tree" && cargo build -q --release "${cargo_args[@]}" -p cloud-hypervisor) >"$work/vmm.log" 2>&1 &&
        "$CARGO_TARGET_DIR/release/cloud-hypervisor" --help | grep -q -- '--generic-vhost-user'; then
        pass "cloud-hypervisor builds ($("$CARGO_TARGET_DIR/release/cloud-hypervisor" --version | head -n1)) and takes --generic-vhost-user"
    else
        fail "cloud-hypervisor build" "$(tail -n 5 "$work/vmm.log")"
    fi
fi
echo "cloud-hypervisor: $failures failure(s)"
[ "$failures" -eq 0 ]
