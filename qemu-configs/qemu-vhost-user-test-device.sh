#!/usr/bin/env bash
# QEMU (10.2 or newer) with rgpu attached as QEMU's generic vhost-user device.
# rgpu's VM-mode test runs exactly this file. Settings come from the
# environment; arguments are appended to QEMU's command line.
#
#   RGPU_SOCKET  the daemon's vhost-user socket (vhost-device-rgpu
#                --socket-path); required
#   KERNEL       guest kernel (bzImage); required
#   INITRD       guest initramfs; optional
#   APPEND       extra kernel command-line arguments; optional
#   MEM          guest memory size (default 1G). All of it is a shared memfd:
#                vhost-user backends map guest memory, and rgpu's GPU reads
#                guest blobs from it directly.
#   SMP          vCPUs (default 2)
#   ACCEL        accelerator (default tcg: nested KVM fails on rgpu's CI and
#                GPU host). On a real host with /dev/kvm use ACCEL=kvm.
#   QEMU         the QEMU binary or wrapper (default qemu-system-x86_64 on
#                PATH; tests/vm/make-portable-qemu.sh makes a wrapper)
#   PRINT=1      print the command line instead of running it
#
# The device: virtio-id 16 is virtio-gpu; two queues (control, cursor) of 256
# entries; config_size 16 is struct virtio_gpu_config, which the daemon serves
# (num_capsets 1, num_scanouts 0: a compute-only device). QEMU's own
# vhost-user-gpu-pci cannot carry rgpu: it hides RESOURCE_BLOB and
# CONTEXT_INIT from the guest whatever the backend offers.
#
# Serial console on stdio, no display, no network; the guest powers off at
# the end (-no-reboot turns a reboot into an exit).
set -euo pipefail

: "${RGPU_SOCKET:?set RGPU_SOCKET to the daemon socket (vhost-device-rgpu --socket-path)}"
: "${KERNEL:?set KERNEL to the guest kernel}"
MEM=${MEM:-1G}
SMP=${SMP:-2}
ACCEL=${ACCEL:-tcg}
QEMU=${QEMU:-qemu-system-x86_64}

# shellcheck disable=SC2054 # QEMU options are comma-separated on purpose.
cmd=(
    "$QEMU"
    -accel "$ACCEL"
    -machine q35
    -cpu max
    -smp "$SMP"
    -m "$MEM"
    -object "memory-backend-memfd,id=mem,size=$MEM,share=on"
    -numa node,memdev=mem
    -chardev "socket,id=rgpu,path=$RGPU_SOCKET"
    -device vhost-user-test-device-pci,chardev=rgpu,virtio-id=16,num_vqs=2,vq_size=256,config_size=16
    -kernel "$KERNEL"
)
if [ -n "${INITRD:-}" ]; then
    cmd+=(-initrd "$INITRD")
fi
cmd+=(
    -append "console=ttyS0 panic=-1 quiet ${APPEND:-}"
    -vga none
    -net none
    -nographic
    -no-reboot
    "$@"
)

if [ "${PRINT:-0}" = 1 ]; then
    printf '%q ' "${cmd[@]}"
    echo
else
    exec "${cmd[@]}"
fi
