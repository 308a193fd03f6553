#!/usr/bin/env bash
# cloud-hypervisor with rgpu attached as its generic vhost-user device.
#
# NEEDS rgpu's PATCH (qemu-configs/cloud-hypervisor/), not run (no KVM).
# In unpatched cloud-hypervisor (virtio-devices/src/vhost_user/
# generic_vhost_user.rs), the generic device offers the guest only the
# transport feature bits (VERSION_1, EVENT_IDX, INDIRECT_DESC, ...) of what
# the backend offers, never device-specific ones. The guest then sees
# "-virgl ... -resource_blob" and "-context_init", so the stock virtio_gpu
# driver refuses CONTEXT_INIT and EXECBUFFER and rgpu cannot run. Details and
# sources: guest-driver-notes/VMMS.md. The command line is kept here, correct
# as far as the source shows, for the day that changes; `rgpu-diag` in the
# guest names the missing features.
#
# Settings come from the environment; arguments are appended to
# cloud-hypervisor's command line.
#   DAEMON      vhost-device-rgpu binary (default: on PATH)
#   EXECUTOR    cuda (default) or sim
#   SOCKET      vhost-user socket (default /run/rgpu/rgpu.sock)
#   KERNEL      guest kernel (vmlinux with a PVH note) or firmware
#               (CLOUDHV.fd, booting DISK); required
#   INITRD      guest initramfs; optional
#   DISK        guest disk image; optional
#   CMDLINE     kernel command line (default "console=ttyS0 root=/dev/vda1 rw")
#   MEM         guest memory (default 4G); always shared=on: vhost-user needs it
#   CPUS        vCPUs (default 2)
#   API_SOCKET  cloud-hypervisor API socket (default /run/rgpu/ch-api.sock),
#               for hot-plug: ch-remote --api-socket "$API_SOCKET" \
#                 add-generic-vhost-user "socket=$SOCKET,device_type=16,queue_sizes=[256,256]"
#
# Syntax of --generic-vhost-user: device_type= (a number, or the name "gpu"),
# socket=, queue_sizes=[...] (one entry per queue: virtio-gpu has two, control
# and cursor). Early releases spelled device_type as virtio_id (still accepted
# as a deprecated alias): use VMM_KEY=virtio_id there.
set -euo pipefail

DAEMON=${DAEMON:-vhost-device-rgpu}
EXECUTOR=${EXECUTOR:-cuda}
SOCKET=${SOCKET:-/run/rgpu/rgpu.sock}
: "${KERNEL:?set KERNEL to the guest kernel}"
CMDLINE=${CMDLINE:-console=ttyS0 root=/dev/vda1 rw}
MEM=${MEM:-4G}
CPUS=${CPUS:-2}
API_SOCKET=${API_SOCKET:-/run/rgpu/ch-api.sock}
VMM_KEY=${VMM_KEY:-device_type}

mkdir -p "$(dirname "$SOCKET")" "$(dirname "$API_SOCKET")"

# The daemon first: cloud-hypervisor connects to the socket at start-up.
"$DAEMON" --socket-path "$SOCKET" --executor "$EXECUTOR" &
daemon=$!
trap 'kill "$daemon" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    [ -S "$SOCKET" ] && break
    kill -0 "$daemon" 2>/dev/null || { echo "vhost-device-rgpu exited" >&2; exit 1; }
    sleep 0.1
done
[ -S "$SOCKET" ] || { echo "no socket at $SOCKET after 10 s" >&2; exit 1; }

cmd=(
    cloud-hypervisor
    --api-socket "path=$API_SOCKET"
    --cpus "boot=$CPUS"
    --memory "size=$MEM,shared=on"
    --kernel "$KERNEL"
    --cmdline "$CMDLINE"
    --serial tty
    --console off
    --generic-vhost-user "socket=$SOCKET,$VMM_KEY=16,queue_sizes=[256,256]"
)
if [ -n "${INITRD:-}" ]; then
    cmd+=(--initramfs "$INITRD")
fi
if [ -n "${DISK:-}" ]; then
    cmd+=(--disk "path=$DISK")
fi
"${cmd[@]}" "$@"
