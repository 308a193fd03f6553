#!/bin/sh
# /test.sh of the VM-mode boot test: the non-root user `cuda` (group render)
# can open the virtio-gpu render node read-write, as guest-lib will.
. /lib/rgpu/functions.sh

open_node() {
    rgpu_as_user id
    rgpu_as_user sh -c 'exec 3<>/dev/dri/renderD128 && echo "opened /dev/dri/renderD128 read-write"'
}
rgpu_step render-node-as-user open_node
