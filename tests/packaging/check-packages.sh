#!/usr/bin/env bash
# Checks the Debian packages scripts/package.sh built (issue 12), without
# installing them:
#
#   tests/packaging/check-packages.sh PKGDIR
#
#   1. each package holds what it must (dpkg-deb --contents);
#   2. systemd-analyze verify accepts the host package's units;
#   3. the packaged daemon leaves the sim executor out;
#   4. rgpu.service's ExecStart, run as written with the example config
#      (its /run/rgpu paths moved to a temporary folder, the sim executor
#      added: CI has no GPU, so the daemon is $RGPU_SIM_DAEMON, a build of
#      the same source with the test fixture), serves the example's tenant
#      on a 0660 socket and root's 0600 control socket, which lists it;
#   5. rgpu@.service's ExecStart, started by systemd-socket-activate with
#      the listening socket as descriptor 3 (as rgpu@.socket does), serves
#      the guest package's rgpu-diag.
# Prints "PASS ..." per check, "FAIL ..." with the reason; exit 1 on any
# failure. Cleans up every process and file it made.
set -uo pipefail
pkgdir=$(cd "${1:?usage: check-packages.sh PKGDIR}" && pwd)
work=$(mktemp -d /tmp/rgpu-packages.XXXXXX)
failures=0
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1${2:+: $2}"; failures=$((failures + 1)); }

# systemd-analyze and systemd-socket-activate come with Debian's systemd.
if ! command -v systemd-analyze >/dev/null || ! command -v systemd-socket-activate >/dev/null; then
    echo "check-packages: installing systemd (for systemd-analyze and systemd-socket-activate)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd
fi

host_deb=$(ls "$pkgdir"/vhost-device-rgpu_*.deb 2>/dev/null | head -n1)
guest_deb=$(ls "$pkgdir"/rgpu-guest_*.deb 2>/dev/null | head -n1)
if [ -z "$host_deb" ] || [ -z "$guest_deb" ]; then
    echo "FAIL packages: no vhost-device-rgpu_*.deb and rgpu-guest_*.deb in $pkgdir"
    exit 1
fi

# 1. Contents.
contains() {
    local deb=$1
    shift
    local listing missing=()
    listing=$(dpkg-deb --contents "$deb" | awk '{print $6}')
    for path in "$@"; do
        grep -qx "./$path" <<<"$listing" || missing+=("$path")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        pass "$(basename "$deb") holds $*"
    else
        fail "$(basename "$deb")" "missing ${missing[*]}"
    fi
}
contains "$host_deb" usr/bin/vhost-device-rgpu lib/systemd/system/rgpu.service \
    lib/systemd/system/rgpu@.socket lib/systemd/system/rgpu@.service etc/rgpu/rgpu.toml \
    usr/share/doc/vhost-device-rgpu/copyright
contains "$guest_deb" usr/lib/rgpu/libcuda.so.1 usr/lib/rgpu/libnvidia-ml.so.1 \
    usr/lib/rgpu/libcuda.so etc/ld.so.conf.d/rgpu.conf usr/bin/rgpu-diag usr/bin/rgpu-run \
    lib/udev/rules.d/70-rgpu.rules usr/share/doc/rgpu-guest/copyright
if dpkg-deb --ctrl-tarfile "$host_deb" | tar -xO ./postinst | grep -q 'groupadd --system rgpu'; then
    pass "the host package's postinst creates the rgpu group"
else
    fail "the host package's postinst" "does not create the rgpu group"
fi

host=$work/host
guest=$work/guest
dpkg-deb -x "$host_deb" "$host"
dpkg-deb -x "$guest_deb" "$guest"
daemon=$host/usr/bin/vhost-device-rgpu
units=$host/lib/systemd/system
sim_daemon=${RGPU_SIM_DAEMON:-}

# 2. The units, with ExecStart pointing at the extracted daemon (verify
# checks that the command exists), templates instantiated.
mkdir -p "$work/units"
for unit in rgpu.service rgpu@.socket rgpu@.service; do
    sed "s|/usr/bin/vhost-device-rgpu|$daemon|" "$units/$unit" >"$work/units/$unit"
done
cp "$work/units/rgpu@.socket" "$work/units/rgpu@local.socket"
cp "$work/units/rgpu@.service" "$work/units/rgpu@local.service"
if verify=$(cd "$work/units" && systemd-analyze verify --man=no rgpu.service \
    rgpu@local.socket rgpu@local.service 2>&1) && [ -z "$verify" ]; then
    pass "systemd-analyze verify accepts rgpu.service, rgpu@.socket, rgpu@.service"
else
    fail "systemd-analyze verify" "$verify"
fi

# 3. The test fixture is no part of the package.
if refusal=$("$daemon" --executor sim --socket-path "$work/none.sock" 2>&1); then
    fail "the packaged daemon leaves the sim executor out" "it accepted --executor sim"
elif grep -q "invalid value 'sim'" <<<"$refusal"; then
    pass "the packaged daemon leaves the sim executor out"
else
    fail "the packaged daemon leaves the sim executor out" "$refusal"
fi
if [ ! -x "$sim_daemon" ]; then
    fail "RGPU_SIM_DAEMON" "set it to a vhost-device-rgpu built with the sim executor (tests/run.sh does)"
    echo "packages: $failures failure(s)"
    exit 1
fi

# ExecStart of UNIT, its binary replaced by the sim build of the daemon.
exec_start() {
    sed -n 's/^ExecStart=//p' "$units/$1" | sed "s|/usr/bin/vhost-device-rgpu|$sim_daemon|"
}
wait_for_socket() {
    for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
    return 1
}

# 4. rgpu.service with the example config.
run=$work/run
mkdir -p "$run"
sed -e "s|/run/rgpu/|$run/|g" -e 's|127.0.0.1:9400|127.0.0.1:0|' \
    "$host/etc/rgpu/rgpu.toml" >"$work/rgpu.toml"
read -r -a command <<<"$(exec_start rgpu.service | sed "s|/etc/rgpu/rgpu.toml|$work/rgpu.toml|")"
RGPU_LOG=info "${command[@]}" --executor sim >"$work/service.log" 2>&1 &
pids+=($!)
if wait_for_socket "$run/local.sock" && wait_for_socket "$run/control.sock"; then
    modes="$(stat -c %a "$run/local.sock") $(stat -c %a "$run/control.sock")"
    if [ "$modes" = "660 600" ]; then
        pass "rgpu.service's command serves the example config: local.sock 0660, control.sock 0600"
    else
        fail "socket modes" "local.sock and control.sock are $modes, not 660 600"
    fi
    if listing=$("$sim_daemon" ctl --control-socket "$run/control.sock" list 2>&1) &&
        grep -q '^local ' <<<"$listing"; then
        pass "ctl list names the example's tenant \"local\""
    else
        fail "ctl list" "$listing"
    fi
else
    fail "rgpu.service's command" "no sockets; its log: $(tail -n 5 "$work/service.log")"
fi

# 5. rgpu@.service, socket-activated.
read -r -a command <<<"$(exec_start rgpu@.service | sed 's/ \$RGPU_ARGS//')"
systemd-socket-activate --listen="$run/activated.sock" \
    env RGPU_LOG=info "${command[@]}" --executor sim >"$work/activated.log" 2>&1 &
pids+=($!)
if wait_for_socket "$run/activated.sock" &&
    diag=$(timeout 60 "$guest/usr/bin/rgpu-diag" --socket "$run/activated.sock" 2>&1); then
    pass "rgpu@.service's command, socket-activated on descriptor 3, serves rgpu-diag ($(grep -m1 -io 'capset[^,]*' <<<"$diag" || echo ok))"
else
    fail "socket activation" "${diag:-no socket}; daemon log: $(tail -n 5 "$work/activated.log")"
fi

echo "packages: $failures failure(s)"
[ "$failures" -eq 0 ]
