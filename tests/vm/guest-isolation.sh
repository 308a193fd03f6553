#!/bin/sh
# /test.sh of rgpu's VM-mode isolation test (tests/tests/vm_mode.rs): two
# unprivileged users of one guest, each guest process in a host worker of
# its own. The daemon runs the sim executor with its poison mode on
# (RGPU_SIM_FAULT_POISONS_PROCESS=1: a faulting kernel breaks the whole host
# process, as NVIDIA's driver does).
#
# Markers as in guest-test.sh: "RGPU-TEST-BEGIN/END name rc=N" frame each
# step; at "RGPU-WAIT what" the guest waits for the host's answer.
. /lib/rgpu/functions.sh

BIN=/opt/rgpu/bin
PTX=/opt/rgpu/share/reference_kernels.ptx
ARGS="--ptx $PTX --big-mb 4"

# (a) User cuda's kernel faults and poisons its own worker; user cuda2's
# driver-API test passes meanwhile, and the host shows one worker each.
poisoned_neighbour() {
    rm -f /tmp/stop-fault /tmp/stop-b
    rgpu_as cuda $BIN/fault_test --ptx $PTX --stop-file /tmp/stop-fault >/tmp/fault.log 2>&1 &
    local faulty=$!
    rgpu_wait_line '^poisoned' /tmp/fault.log || return 1
    rgpu_as cuda2 $BIN/driver_api_test $ARGS --iterations 1000 --hold-ms 50 \
        --stop-file /tmp/stop-b >/tmp/b.log 2>&1 &
    local b=$!
    rgpu_wait_line '^running' /tmp/b.log && rgpu_host_check two-workers
    local checked=$?
    touch /tmp/stop-b
    wait $b
    local rb=$?
    sed 's/^/[cuda2] /' /tmp/b.log
    # The poisoned process is still there, and another of cuda2's runs passes.
    rgpu_as cuda2 $BIN/driver_api_test $ARGS
    local rc=$?
    touch /tmp/stop-fault
    wait $faulty
    local rf=$?
    sed 's/^/[cuda] /' /tmp/fault.log
    echo "poisoned-neighbour: fault rc=$rf neighbour rc=$rb again rc=$rc"
    [ $checked = 0 ] && [ $rf = 0 ] && [ $rb = 0 ] && [ $rc = 0 ] && rgpu_host_check none-left
}
rgpu_step poisoned-neighbour poisoned_neighbour

# (b) cuda2 cannot read or write cuda's device memory given its pointer.
foreign_pointer() {
    rm -f /tmp/stop-owner
    rgpu_as cuda $BIN/foreign_pointer_test own --stop-file /tmp/stop-owner >/tmp/owner.log 2>&1 &
    local owner=$!
    rgpu_wait_line '^pointer ' /tmp/owner.log || return 1
    local pointer
    pointer=$(sed -n 's/^pointer //p' /tmp/owner.log)
    rgpu_as cuda2 $BIN/foreign_pointer_test probe "$pointer"
    local rp=$?
    touch /tmp/stop-owner
    wait $owner
    local ro=$?
    cat /tmp/owner.log
    echo "foreign-pointer: probe rc=$rp owner rc=$ro"
    [ $rp = 0 ] && [ $ro = 0 ]
}
rgpu_step foreign-pointer foreign_pointer

# (b1) A scan of addresses never handed out (copies and memsets), as the
# unprivileged user cuda2, while cuda holds pinned memory of its own.
forged_scan() {
    rm -f /tmp/stop-pinned-scan
    rgpu_as cuda $BIN/kernel_probe_test --ptx $PTX pinned --stop-file /tmp/stop-pinned-scan \
        >/tmp/pinned-scan.log 2>&1 &
    local owner=$!
    rgpu_wait_line '^pinned ' /tmp/pinned-scan.log || return 1
    rgpu_as cuda2 $BIN/forged_pointer_test --pinned-mb 16
    local rc=$?
    touch /tmp/stop-pinned-scan
    wait $owner
    return $rc
}
rgpu_step forged-scan forged_scan

# Asks the host for a value: the markers go to the console (stderr), the
# answer to stdout.
host_value() {
    local reply=""
    echo "RGPU-WAIT $1" >&2
    read -t 120 -r reply
    echo "RGPU-HOST-SAID $reply" >&2
    printf '%s\n' "$reply"
}

# (b2) cuda2's kernel, handed addresses of cuda's memory as a parameter,
# reads none of it: cuda's pinned memory where the host mapped it (the host
# reads that address off its log), and cuda's pinned pointer as cuda sees it.
kernel_probe() {
    rm -f /tmp/stop-pinned
    rgpu_as cuda $BIN/kernel_probe_test --ptx $PTX pinned --stop-file /tmp/stop-pinned \
        >/tmp/pinned.log 2>&1 &
    local owner=$!
    rgpu_wait_line '^pinned ' /tmp/pinned.log || return 1
    local guest_pointer host_address
    guest_pointer=$(sed -n 's/^pinned //p' /tmp/pinned.log)
    host_address=$(host_value owner-blob-address)
    rgpu_as cuda2 $BIN/kernel_probe_test --ptx $PTX self
    for address in $host_address $guest_pointer; do
        rgpu_as cuda2 $BIN/kernel_probe_test --ptx $PTX read "$address"
    done
    touch /tmp/stop-pinned
    wait $owner
    echo "kernel-probe: owner rc=$?"
}
rgpu_step kernel-probe kernel_probe

# (c) A process killed in the middle of its copies leaves nothing behind.
killed_copying() {
    rgpu_as cuda $BIN/driver_api_test --ptx $PTX --big-mb 32 --iterations 100000 >/tmp/k.log 2>&1 &
    local shell=$!
    rgpu_wait_line '^running' /tmp/k.log || return 1
    rgpu_host_check copying || return 1
    kill -9 "$(pidof driver_api_test)"
    wait $shell
    echo "killed-copying: rc=$?"
    rgpu_host_check nothing-after-kill
}
rgpu_step killed-copying killed_copying

# (d) The driver is unbound with a process holding a context, bound again:
# the host drops everything of before, and a new run passes.
rebind() {
    rm -f /tmp/stop-h
    rgpu_as cuda $BIN/driver_api_test $ARGS --iterations 1000 --hold-ms 50 \
        --stop-file /tmp/stop-h >/tmp/h.log 2>&1 &
    local held=$!
    rgpu_wait_line '^running' /tmp/h.log && rgpu_host_check before-unbind || return 1
    local dev
    dev=$(basename "$(readlink -f /sys/bus/virtio/drivers/virtio_gpu/virtio*)")
    echo "rebind: unbinding $dev"
    echo "$dev" >/sys/bus/virtio/drivers/virtio_gpu/unbind || return 1
    rgpu_host_check unbound || return 1
    touch /tmp/stop-h
    kill -9 "$(pidof driver_api_test)" 2>/dev/null
    wait $held
    echo "$dev" >/sys/bus/virtio/drivers/virtio_gpu/bind || return 1
    local i=0
    while ! ls /dev/dri/renderD* >/dev/null 2>&1 && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    for node in /dev/dri/renderD*; do
        chown root:render "$node" && chmod 0660 "$node"
    done
    rgpu_as cuda $BIN/driver_api_test $ARGS
}
rgpu_step rebind rebind
