#!/usr/bin/env bash
# Issue 12's run by hand, scripted so that it says exactly what was run:
# installs the host package on this (disposable) machine, starts the
# daemon as rgpu.service would (ExecStart with the example config, group
# rgpu, /run/rgpu 0750), and runs the driver-API test program through it
# as a non-root member of group rgpu, then as a user outside the group
# (refused). The guest library comes from the guest package, unpacked
# beside (installing it would put rgpu's libcuda.so.1 in ld.so's path of
# the host that needs NVIDIA's). Needs root, dpkg, useradd and runuser;
# it changes the system: run it on a machine or container you discard.
#
#   tests/packaging/install-and-run.sh PKGDIR PROGRAM_SOURCE_DIR
#
# PROGRAM_SOURCE_DIR holds driver_api_test.c, rgpu_cuda.h and
# reference_kernels.ptx. DEMO_BINARY=PATH: run that driver_api_test,
# already built (linked against libcuda.so.1 with no rpath; a machine with
# no C compiler, such as tests/packaging/debian13-chroot.sh's chroot),
# instead of compiling one; PROGRAM_SOURCE_DIR then needs only
# reference_kernels.ptx. The daemon's log goes to $OUT/rgpu-service.log
# (OUT defaults to /tmp).
set -uo pipefail
pkgdir=$(cd "${1:?usage: install-and-run.sh PKGDIR PROGRAM_SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: install-and-run.sh PKGDIR PROGRAM_SOURCE_DIR}" && pwd)
failures=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+: $2}"; failures=$((failures + 1)); }
daemon_pid=
cleanup() { [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null; }
trap cleanup EXIT

grep -m1 PRETTY_NAME /etc/os-release
if dpkg -i "$pkgdir"/vhost-device-rgpu_*.deb >/tmp/rgpu-dpkg.log 2>&1; then
    pass "dpkg -i $(basename "$pkgdir"/vhost-device-rgpu_*.deb)"
else
    fail "dpkg -i" "$(tail -3 /tmp/rgpu-dpkg.log)"
fi
getent group rgpu >/dev/null && pass "the package made group rgpu" || fail "no group rgpu"
guest=$(mktemp -d /tmp/rgpu-guest.XXXXXX)
dpkg-deb -x "$pkgdir"/rgpu-guest_*.deb "$guest"

# rgpu.service: RuntimeDirectory=rgpu (0750), Group=rgpu, RGPU_LOG=info.
install -d -m 0750 -g rgpu /run/rgpu
exec_start=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/rgpu.service)
echo "ExecStart: $exec_start"
# NVIDIA_LIB_DIR: where NVIDIA's libcuda.so.1 is when ld.so's path lacks it
# (a container with the driver mounted); a host with the driver installed
# needs nothing.
# shellcheck disable=SC2086 # the unit's words
env RGPU_LOG=info ${NVIDIA_LIB_DIR:+LD_LIBRARY_PATH=$NVIDIA_LIB_DIR} \
    setpriv --regid rgpu --clear-groups $exec_start >"${OUT:-/tmp}/rgpu-service.log" 2>&1 &
daemon_pid=$!
# At most 10 s, less if the daemon exits first.
for _ in $(seq 100); do
    [ -S /run/rgpu/local.sock ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
done
ls -l /run/rgpu

if [ -n "${DEMO_BINARY:-}" ]; then
    install -m 0755 "$DEMO_BINARY" /tmp/driver_api_test || fail "copy $DEMO_BINARY"
else
    cc -O2 -std=c11 -I "$src" -o /tmp/driver_api_test "$src/driver_api_test.c" \
        "$guest/usr/lib/rgpu/libcuda.so.1" -Wl,-rpath,"$guest/usr/lib/rgpu" || fail "build driver_api_test"
fi
install -m 0644 "$src/reference_kernels.ptx" /tmp/rgpu-reference_kernels.ptx
chmod 0755 /tmp/driver_api_test "$guest" && chmod -R a+rX "$guest"
id rgpu-demo >/dev/null 2>&1 || useradd -m -G rgpu rgpu-demo
id rgpu-stranger >/dev/null 2>&1 || useradd -m rgpu-stranger
# The guest library as the guest package's ld.so.conf.d entry would find
# it, ahead of any LD_LIBRARY_PATH of this machine's (NVIDIA's driver).
guest_env=(env LD_LIBRARY_PATH="$guest/usr/lib/rgpu" RGPU_SOCKET=/run/rgpu/local.sock)
out=$(timeout -k 10 300 runuser -u rgpu-demo -- "${guest_env[@]}" /tmp/driver_api_test \
    --ptx /tmp/rgpu-reference_kernels.ptx 2>&1)
rc=$?
echo "$out" | tail -2
if [ "$rc" -eq 0 ] && grep -q "^driver_api_test: [0-9]* checks passed" <<<"$out"; then
    pass "a member of group rgpu ($(id rgpu-demo)) ran driver_api_test"
else
    fail "driver_api_test as rgpu-demo" "exit $rc"
fi
out=$(timeout -k 10 60 runuser -u rgpu-stranger -- "${guest_env[@]}" /tmp/driver_api_test \
    --ptx /tmp/rgpu-reference_kernels.ptx 2>&1)
grep -m1 "Permission denied" <<<"$out"
grep -q "Permission denied" <<<"$out" && pass "a user outside group rgpu is refused" ||
    fail "rgpu-stranger was not refused"
kill -0 "$daemon_pid" 2>/dev/null && pass "daemon alive" || fail "daemon died"
echo "install-and-run: $failures failure(s)"
[ "$failures" -eq 0 ]
