#!/usr/bin/env bash
# Issue 12's run by hand (install-and-run.sh) inside a Debian 13 (trixie)
# chroot, on a machine of another distribution that has NVIDIA's driver
# (the GPU machine: Ubuntu 24.04, the driver's user-space libraries in
# /usr/local/nvidia/lib64, no network, no Rust, no Debian 13):
#
#   debian13-chroot.sh CARRY_DIR
#
# CARRY_DIR holds trixie-root.tar.xz (a minimal Debian 13 root file
# system), vhost-device-rgpu_*.deb and rgpu-guest_*.deb (scripts/package.sh),
# driver_api_test (built elsewhere against the guest package's libcuda.so.1,
# no rpath: the chroot has no C compiler) and reference_kernels.ptx;
# install-and-run.sh is the one beside this script. Run as root. It
# unpacks the root file system into a
# fresh temporary directory, copies NVIDIA's libraries into its
# /usr/local/nvidia/lib64 (NVIDIA_LIB_DIR names the source, default
# /usr/local/nvidia/lib64), mounts /proc, /sys, /dev and /dev/shm there
# (or, where mounting is refused, copies the device nodes), runs
# install-and-run.sh in it with DEMO_BINARY, then unmounts and removes it.
# tests/packaging/make-debian13-carry.sh makes CARRY_DIR. The daemon's
# log and dpkg's go to $OUT when OUT is set. NO_MOUNT=1 tries
# no mount (the fallback, to test it); CHROOT_TIMEOUT (seconds, default
# 480) bounds the run inside.
set -uo pipefail
carry=$(cd "${1:?usage: debian13-chroot.sh CARRY_DIR}" && pwd) || exit 2
nvidia_lib_dir=${NVIDIA_LIB_DIR:-/usr/local/nvidia/lib64}
[ "$(id -u)" -eq 0 ] || { echo "debian13-chroot: needs root" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
for f in trixie-root.tar.xz driver_api_test reference_kernels.ptx; do
    [ -e "$carry/$f" ] || { echo "debian13-chroot: no $carry/$f" >&2; exit 2; }
done

root=$(mktemp -d "${TMPDIR:-/tmp}/debian13-root.XXXXXX") || exit 2
mounted=()
cleanup() {
    # Processes left running in the chroot (the daemon, should
    # install-and-run.sh not have ended it): only those whose root is ours.
    local p i left
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
    done
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" ||
            echo "debian13-chroot: could not unmount ${mounted[i]}"
    done
    left=$(awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts)
    if [ -n "$left" ]; then
        echo "debian13-chroot: still mounted, $root left in place: $left"
    else
        rm -rf --one-file-system "$root"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "debian13-chroot: unpacking Debian 13 into $root"
tar -xJf "$carry/trixie-root.tar.xz" -C "$root" --numeric-owner || { echo "debian13-chroot: unpacking failed"; exit 1; }
pretty=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/etc/os-release")
echo "debian13-chroot: the chroot is $pretty"
os_ok=0
[ "$pretty" = "Debian GNU/Linux 13 (trixie)" ] || { echo "FAIL the chroot is not Debian 13: $pretty"; os_ok=1; }

mkdir -p "$root/usr/local/nvidia/lib64"
if [ -d "$nvidia_lib_dir" ]; then
    cp -a "$nvidia_lib_dir/." "$root/usr/local/nvidia/lib64/"
    echo "debian13-chroot: copied $(find "$root/usr/local/nvidia/lib64" -name 'lib*.so*' | wc -l)" \
        "NVIDIA library files from $nvidia_lib_dir"
else
    echo "debian13-chroot: no $nvidia_lib_dir: no NVIDIA libraries in the chroot"
fi

# mount_in WHAT TARGET MOUNT_ARGS...: mounts and remembers it for cleanup.
mount_in() {
    local what=$1 where=$2 target=$root$2
    shift 2
    mkdir -p "$target"
    if [ -z "${NO_MOUNT:-}" ] && mount "$@" "$what" "$target" 2>/dev/null; then
        mounted+=("$target")
        echo "debian13-chroot: mounted $where (mount $* $what)"
        return 0
    fi
    return 1
}
mount_in proc /proc -t proc ||
    echo "debian13-chroot: mounting /proc refused: no /proc in the chroot (the daemon will fail: it finds itself through /proc/self/exe)"
mount_in /sys /sys --bind || echo "debian13-chroot: mounting /sys refused: no /sys in the chroot"
if mount_in /dev /dev --bind; then
    if [ -d /dev/shm ]; then
        mount_in /dev/shm /dev/shm --bind || echo "debian13-chroot: binding /dev/shm refused"
    fi
else
    echo "debian13-chroot: mounting /dev refused: copying device nodes instead"
    # shellcheck disable=SC2046 # the nodes that exist
    cp -a $(ls -d /dev/nvidia* 2>/dev/null) /dev/null /dev/zero /dev/urandom /dev/random /dev/full \
        "$root/dev/" || echo "debian13-chroot: copying device nodes failed (no CAP_MKNOD?)"
    find "$root/dev" -maxdepth 1 ! -type d -printf '  %M %p\n'
fi
[ -d "$root/dev/shm" ] || mkdir -p "$root/dev/shm"
chmod 1777 "$root/dev/shm" "$root/tmp"
# A /run of its own (never the host's: the package's postinst would see
# the host's systemd there).
mount_in tmpfs /run -t tmpfs -o mode=0755 || echo "debian13-chroot: /run is the chroot's own directory"
mkdir -p "$root/run/lock"

run=$root/root/run
mkdir -p "$run/out"
cp "$carry"/vhost-device-rgpu_*.deb "$carry"/rgpu-guest_*.deb "$carry/driver_api_test" \
    "$carry/reference_kernels.ptx" "$here/install-and-run.sh" "$run/" || exit 1
chmod 0755 "$run/driver_api_test" "$run/install-and-run.sh"

echo "debian13-chroot: chroot $root /bin/bash /root/run/install-and-run.sh /root/run /root/run"
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    ${CUDA_VISIBLE_DEVICES+CUDA_VISIBLE_DEVICES="$CUDA_VISIBLE_DEVICES"} \
    NVIDIA_LIB_DIR=/usr/local/nvidia/lib64 DEMO_BINARY=/root/run/driver_api_test OUT=/root/run/out \
    timeout -k 10 "${CHROOT_TIMEOUT:-480}" chroot "$root" /bin/bash /root/run/install-and-run.sh /root/run /root/run
rc=$?
cp "$root/tmp/rgpu-dpkg.log" "$run/out/" 2>/dev/null
if [ -n "${OUT:-}" ]; then
    cp "$run/out/"* "$OUT/" 2>/dev/null &&
        echo "debian13-chroot: logs in $OUT:" "$(find "$run/out" -type f -printf '%f ')"
fi
if [ "$rc" -ne 0 ]; then
    echo "debian13-chroot: the daemon's log (last 15 lines):"
    tail -n 15 "$run/out/rgpu-service.log" 2>/dev/null | sed 's/^/  /'
fi
echo "debian13-chroot: install-and-run exited $rc"
[ "$rc" -eq 0 ] && [ "$os_ok" -eq 0 ]
