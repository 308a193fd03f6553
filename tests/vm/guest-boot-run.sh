# Sourced by the init of rgpu's test guests (tests/vm/build-initramfs.sh,
# tests/vm/build-guest-image.sh) once virtio-gpu is loaded: gives the render
# node to group render (what a udev rule does on a real distribution),
# prints the boot markers the VM tests read, runs /test.sh and says how it
# ended. The init powers off afterwards.
i=0
while ! ls /dev/dri/renderD* >/dev/null 2>&1 && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
for node in /dev/dri/renderD*; do
    [ -e "$node" ] || continue
    chown root:render "$node"
    chmod 0660 "$node"
    echo "RGPU-BOOT node $(ls -l "$node")"
done
dmesg | grep -i -E 'virtio.gpu|\[drm\]' | sed 's/^/RGPU-DMESG /'
echo "RGPU-BOOT ready"
if [ -x /test.sh ]; then
    /test.sh
    echo "RGPU-TEST-SH-EXIT rc=$?"
else
    echo "RGPU-TEST-SH-EXIT rc=127 (no /test.sh)"
fi
sync
