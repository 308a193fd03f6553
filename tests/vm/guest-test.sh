#!/bin/sh
# /test.sh of rgpu's VM-mode test (tests/tests/vm_mode.rs puts it into the
# initramfs of tests/vm/build-initramfs.sh). Every CUDA program runs as the
# non-root user `cuda` through the stock virtio_gpu driver.
#
# The host reads the serial console as it streams: "RGPU-TEST-BEGIN/END name
# rc=N" frame each step; at "RGPU-WAIT what" the guest waits for the host to
# check the daemon's counters and answer a line on the console.
. /lib/rgpu/functions.sh

DAT=/opt/rgpu/bin/driver_api_test
PTX=/opt/rgpu/share/reference_kernels.ptx
# Small bulk copies: TCG emulates every guest instruction.
ARGS="--ptx $PTX --big-mb 8"

# (a) The diagnostic, when it was built.
if [ -x /opt/rgpu/bin/rgpu-diag ]; then
    rgpu_step diag rgpu_as_user /opt/rgpu/bin/rgpu-diag
else
    echo "RGPU-TEST-SKIP diag (rgpu-diag was not built)"
fi

# (b) The driver-API test, once.
rgpu_step single rgpu_as_user $DAT $ARGS

# (c) Two processes at once: both hold a session until the host saw two.
two() {
    rm -f /tmp/stop-two
    rgpu_as_user $DAT $ARGS --iterations 1000 --hold-ms 50 --stop-file /tmp/stop-two \
        >/tmp/two-a.log 2>&1 &
    local a=$!
    rgpu_as_user $DAT $ARGS --iterations 1000 --hold-ms 50 --stop-file /tmp/stop-two \
        >/tmp/two-b.log 2>&1 &
    local b=$!
    rgpu_wait_line '^running$' /tmp/two-a.log /tmp/two-b.log && rgpu_host_check two-running
    local checked=$?
    touch /tmp/stop-two
    wait $a
    local ra=$?
    wait $b
    local rb=$?
    sed 's/^/[a] /' /tmp/two-a.log
    sed 's/^/[b] /' /tmp/two-b.log
    echo "two: a rc=$ra b rc=$rb"
    [ $checked = 0 ] && [ $ra = 0 ] && [ $rb = 0 ]
}
rgpu_step two two

# (d) A process killed mid-run: the host sees its session, then sees it freed.
killed() {
    rgpu_as_user $DAT $ARGS --iterations 1000 --hold-ms 200 >/tmp/held.log 2>&1 &
    local shell=$!
    rgpu_wait_line '^running$' /tmp/held.log || return 1
    local pid
    pid=$(pidof driver_api_test)
    echo "held: pid $pid uid $(awk '/^Uid:/ {print $2}' /proc/$pid/status)"
    rgpu_host_check held || return 1
    kill -9 "$pid"
    wait $shell
    local rc=$?
    echo "held: exit rc=$rc"
    cat /tmp/held.log
    [ $rc = 137 ] && rgpu_host_check killed
}
rgpu_step killed killed

# (e) The device still works after the kill.
rgpu_step after-kill rgpu_as_user $DAT $ARGS

# (f) Bulk data: 256 MiB host-to-device from guest pinned memory, checked on
# the device; the host compares its copy counters around it.
bulk() {
    rgpu_host_check bulk-start || return 1
    rgpu_as_user $DAT $ARGS --bulk-pinned-mb 256 || return 1
    rgpu_host_check bulk-done
}
rgpu_step bulk bulk
