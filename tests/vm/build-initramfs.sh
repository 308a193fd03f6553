#!/usr/bin/env bash
# Builds the busybox initramfs of rgpu's VM-mode test guest from the Debian 13
# chroot of tests/vm/setup-host.sh:
#
#   tests/vm/build-initramfs.sh OUT.cpio.gz [SRC[=DEST]...]
#
# Contents: busybox-static and its applets; the guest kernel's virtio-gpu
# module and its dependencies (decompressed, loaded in dependency order); the
# chroot's glibc runtime that the programs need; guest-lib's libcuda.so as
# /opt/rgpu/lib/libcuda.so.1 (found through an ld.so.conf entry, as on a real
# guest); rgpu-diag if it was built; tests/programs/driver_api_test (built
# here with cc against guest-lib) and reference_kernels.ptx in
# /opt/rgpu/share; a non-root user `cuda` (uid 1000) in group `render`; and an
# /init that mounts the pseudo file systems, loads the modules, gives
# /dev/dri/renderD* to root:render 0660 (what a udev rule does on a real
# distribution), runs /test.sh and powers off.
#
# Each extra SRC is copied to DEST (default /opt/rgpu/bin/<name>); pass
# `my-test.sh=/test.sh` to provide the test script. Executables among them
# get their libraries too. /lib/rgpu/functions.sh gives test scripts
# `rgpu_step NAME CMD...` (prints "RGPU-TEST-BEGIN NAME" and
# "RGPU-TEST-END NAME rc=N"), `rgpu_as_user CMD...` (runs as `cuda`),
# `rgpu_host_check NAME` and `rgpu_wait_line PATTERN FILE...`.
#
# Environment: RGPU_CACHE (the chroot's parent, default /var/cache/rgpu),
# RGPU_PROFILE_DIR (where libcuda.so and rgpu-diag were built; default
# target/debug of this workspace, or $CARGO_TARGET_DIR/debug).
set -euo pipefail

die() { echo "build-initramfs: error: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: $0 OUT.cpio.gz [SRC[=DEST]...]"
OUT=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
WORKSPACE=$(cd "$HERE/../.." && pwd)
ROOT=${RGPU_CACHE:-/var/cache/rgpu}/trixie
PROFILE=${RGPU_PROFILE_DIR:-${CARGO_TARGET_DIR:-$WORKSPACE/target}/debug}
LIBCUDA=$PROFILE/libcuda.so
PROGRAMS=$WORKSPACE/tests/programs

[ -e "$ROOT/.rgpu-chroot-ready" ] \
    || die "no Debian 13 chroot at $ROOT: run tests/vm/setup-host.sh (as root) first"
[ -e "$LIBCUDA" ] || die "$LIBCUDA does not exist: run cargo build --workspace first"
for tool in cc cpio gzip xz strip; do
    command -v "$tool" >/dev/null || die "$tool is missing: run tests/vm/setup-host.sh"
done

KVER=$(ls "$ROOT/lib/modules" | sort -V | tail -n1)
[ -n "$KVER" ] || die "no kernel modules in $ROOT/lib/modules"
MODDIR=$ROOT/lib/modules/$KVER

STAGE=$(mktemp -d /tmp/rgpu-initramfs.XXXXXX)
chmod 0755 "$STAGE"
trap 'rm -rf "$STAGE"' EXIT
BUILD=$STAGE.build
mkdir -p "$BUILD"
trap 'rm -rf "$STAGE" "$BUILD"' EXIT

mkdir -p "$STAGE"/{bin,sbin,dev,proc,sys,tmp,etc,root,home/cuda,home/cuda2,lib/modules,lib/rgpu,lib64} \
    "$STAGE"/lib/x86_64-linux-gnu "$STAGE"/opt/rgpu/{bin,lib,share}
chmod 1777 "$STAGE/tmp"
mkdir -p "$STAGE/usr"
ln -s ../bin "$STAGE/usr/bin"
ln -s ../sbin "$STAGE/usr/sbin"
ln -s ../lib "$STAGE/usr/lib"

# busybox and its applets.
cp "$ROOT/bin/busybox" "$STAGE/bin/busybox"
for applet in $("$STAGE/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$STAGE/bin/$applet"
done

# The virtio-gpu module and its dependencies, dependency first. modules.dep
# lists each module's full dependency closure; a depth-first walk orders it.
declare -A DEPS=() SEEN=()
while IFS=: read -r module deps; do
    DEPS[$module]=$deps
done <"$MODDIR/modules.dep"
ORDER=()
visit() {
    local m=$1 d
    [ -n "${SEEN[$m]:-}" ] && return
    SEEN[$m]=1
    for d in ${DEPS[$m]}; do visit "$d"; done
    ORDER+=("$m")
}
TOP=$(grep -o '^[^:]*/virtio-gpu\.ko[^:]*' "$MODDIR/modules.dep") \
    || die "no virtio-gpu module in $MODDIR/modules.dep"
visit "$TOP"
: >"$STAGE/etc/rgpu-modules"
for m in "${ORDER[@]}"; do
    name=$(basename "$m")
    name=${name%.xz}
    name=${name%.zst}
    case $m in
        *.xz) xz -dc "$MODDIR/$m" >"$STAGE/lib/modules/$name" ;;
        *.zst) zstd -qdc "$MODDIR/$m" >"$STAGE/lib/modules/$name" ;;
        *) cp "$MODDIR/$m" "$STAGE/lib/modules/$name" ;;
    esac
    echo "$name" >>"$STAGE/etc/rgpu-modules"
done

# guest-lib (debug info stripped: the initramfs stays small and boots fast).
strip --strip-debug -o "$STAGE/opt/rgpu/lib/libcuda.so.1" "$LIBCUDA"
ln -s libcuda.so.1 "$STAGE/opt/rgpu/lib/libcuda.so"
echo /opt/rgpu/lib >"$STAGE/etc/ld.so.conf"
[ -e "$PROFILE/rgpu-diag" ] && strip --strip-debug -o "$STAGE/opt/rgpu/bin/rgpu-diag" "$PROFILE/rgpu-diag"

# The C test program, linked against guest-lib like tests/src builds it.
mkdir -p "$BUILD/lib"
ln -s "$LIBCUDA" "$BUILD/lib/libcuda.so"
for program in driver_api_test fault_test foreign_pointer_test forged_pointer_test kernel_probe_test; do
    cc -O2 -std=c11 -Wall -Wextra -Werror -I "$PROGRAMS" -o "$STAGE/opt/rgpu/bin/$program" \
        "$PROGRAMS/$program.c" -L "$BUILD/lib" -lcuda
done
cp "$PROGRAMS/reference_kernels.ptx" "$STAGE/opt/rgpu/share/"

# Extra files from the command line.
SCAN=("$STAGE/opt")
for spec in "$@"; do
    src=${spec%%=*}
    if [ "$spec" = "$src" ]; then dest=/opt/rgpu/bin/$(basename "$src"); else dest=${spec#*=}; fi
    [ -e "$src" ] || die "$src does not exist"
    mkdir -p "$STAGE$(dirname "$dest")"
    cp -L "$src" "$STAGE$dest"
    SCAN+=("$STAGE$dest")
done

# The chroot's glibc runtime for every dynamic executable and library in the
# image, resolved by the chroot's own loader (never the host's libraries).
LOADER=$ROOT/lib64/ld-linux-x86-64.so.2
LIBPATH=$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib/x86_64-linux-gnu
cp -L "$LOADER" "$STAGE/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$STAGE/lib64/ld-linux-x86-64.so.2"
needed=(libc.so.6 libm.so.6 libgcc_s.so.1)
while IFS= read -r -d '' file; do
    head -c4 "$file" | grep -q ELF || continue
    listing=$("$LOADER" --inhibit-cache --library-path "$LIBPATH:$STAGE/opt/rgpu/lib" --list "$file" 2>&1) || continue
    if grep -q 'not found' <<<"$listing"; then
        die "libraries of $file missing in $ROOT:"$'\n'"$listing"
    fi
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] && [[ $name != /* && $path == "$ROOT"/* ]] && needed+=("$name")
    done <<<"$listing"
done < <(find "${SCAN[@]}" -type f -print0)
for name in $(printf '%s\n' "${needed[@]}" | sort -u); do
    path=$(ls "$ROOT/lib/x86_64-linux-gnu/$name" "$ROOT/usr/lib/x86_64-linux-gnu/$name" 2>/dev/null | head -n1 || true)
    [ -n "$path" ] || die "$name not found in $ROOT"
    cp -L "$path" "$STAGE/lib/x86_64-linux-gnu/$name"
done
/sbin/ldconfig -r "$STAGE" 2>/dev/null || ldconfig -r "$STAGE"

# Users: the test programs run as `cuda` (and, where two users must not
# reach each other, `cuda2`), members of `render` only.
cat >"$STAGE/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
cuda:x:1000:1000:cuda:/home/cuda:/bin/sh
cuda2:x:1001:1001:cuda2:/home/cuda2:/bin/sh
PASSWD
cat >"$STAGE/etc/group" <<'GROUP'
root:x:0:
render:x:993:cuda,cuda2
cuda:x:1000:
cuda2:x:1001:
GROUP
cat >"$STAGE/etc/shadow" <<'SHADOW'
root:*:19000:0:99999:7:::
cuda:*:19000:0:99999:7:::
cuda2:*:19000:0:99999:7:::
SHADOW
chmod 0640 "$STAGE/etc/shadow"

cat >"$STAGE/lib/rgpu/functions.sh" <<'FUNCTIONS'
# Helpers for /test.sh (sourced). The host parses these markers off the
# serial console.

# rgpu_step NAME CMD...: runs CMD with markers around it.
rgpu_step() {
    local name=$1 rc
    shift
    echo "RGPU-TEST-BEGIN $name"
    "$@"
    rc=$?
    echo "RGPU-TEST-END $name rc=$rc"
    return $rc
}

# rgpu_as USER CMD...: runs CMD as the non-root USER (groups from
# /etc/group, so it is in `render`) with a clean environment.
rgpu_as() {
    local user=$1 quoted="" arg
    shift
    for arg in "$@"; do
        quoted="$quoted '$(printf '%s' "$arg" | sed "s/'/'\\\\''/g")'"
    done
    su -s /bin/sh "$user" -c "cd /home/$user && exec$quoted"
}

# rgpu_as_user CMD...: runs CMD as the non-root user `cuda`.
rgpu_as_user() {
    rgpu_as cuda "$@"
}

# rgpu_host_check NAME: tells the host to check NAME ("RGPU-WAIT NAME")
# and waits (up to 120 s) for its answer; true when it says go.
rgpu_host_check() {
    local reply=""
    echo "RGPU-WAIT $1"
    read -t 120 -r reply
    echo "RGPU-HOST-SAID $reply"
    [ "$reply" = go ]
}

# rgpu_wait_line PATTERN FILE...: waits (up to 120 s in all) until each
# FILE holds a line matching PATTERN (a grep pattern).
rgpu_wait_line() {
    local pattern=$1 i=0 file
    shift
    for file in "$@"; do
        while ! grep -q "$pattern" "$file" 2>/dev/null; do
            i=$((i + 1))
            if [ $i -gt 1200 ]; then
                echo "RGPU-ERROR $file never printed $pattern:"
                cat "$file"
                return 1
            fi
            sleep 0.1
        done
    done
}
FUNCTIONS

install -m 0644 "$HERE/guest-boot-run.sh" "$STAGE/lib/rgpu/boot-run.sh"
cat >"$STAGE/init" <<'INIT'
#!/bin/sh
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
chown cuda:cuda /home/cuda
chown cuda2:cuda2 /home/cuda2
echo "RGPU-BOOT kernel $(uname -r)"
for module in $(cat /etc/rgpu-modules); do
    insmod "/lib/modules/$module" || echo "RGPU-BOOT insmod $module failed"
done
. /lib/rgpu/boot-run.sh
poweroff -f
INIT
chmod 0755 "$STAGE/init"
[ -e "$STAGE/test.sh" ] && chmod 0755 "$STAGE/test.sh"

(cd "$STAGE" && find . -print0 | cpio --null -o -H newc --owner=0:0 --quiet) >"$BUILD/initramfs.cpio"
gzip -1 -c "$BUILD/initramfs.cpio" >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "build-initramfs: $OUT ($(du -h "$OUT" | cut -f1); kernel $KVER; modules: $(tr '\n' ' ' <"$STAGE/etc/rgpu-modules"))"
