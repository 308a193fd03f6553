#!/bin/sh
# /test.sh of rgpu's VM-mode copy bench (issue 9, "scattered blob rows from
# the QEMU guest"; GUEST=bench tests/vm/run-vm-test.sh): pinned-memory
# copies of BENCH_MIB MiB to and from the device, timed with CUDA events,
# first from a freshly booted guest's memory (its pinned blob of few,
# long page runs), then after tests/bench/vm_copy_bench.c --fragment left
# the guest's free memory in single pages between held ones (its pinned
# blob of scattered pages).
#
# Settings come on the kernel command line (run-vm-test.sh passes them):
# rgpu_bench_mib (256), rgpu_bench_fragment_mib (2 * mib + 256: releases
# mib + 128 MiB of holes), rgpu_bench_keep_pages and rgpu_bench_hole_pages
# (1 and 1: every other page), rgpu_bench_repeats (5),
# rgpu_bench_fragment_with (pagetables; anon: holes among movable pages,
# which leave the blob contiguous: see vm_copy_bench.c).
#
# Markers as in guest-test.sh; at "RGPU-WAIT bench-blob LABEL" the host
# reads how its worker mapped the LABEL run's blob off the daemon's log.
. /lib/rgpu/functions.sh

BENCH=/opt/rgpu/bin/vm_copy_bench

# cmdline_value NAME DEFAULT: NAME=digits from the kernel command line.
cmdline_value() {
    local value
    value=$(tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=\([0-9][0-9]*\)\$/\1/p" | tail -n1)
    echo "${value:-$2}"
}
MIB=$(cmdline_value rgpu_bench_mib 256)
FRAG=$(cmdline_value rgpu_bench_fragment_mib $((2 * MIB + 256)))
KEEP=$(cmdline_value rgpu_bench_keep_pages 1)
HOLE=$(cmdline_value rgpu_bench_hole_pages 1)
REPEATS=$(cmdline_value rgpu_bench_repeats 5)
WITH=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^rgpu_bench_fragment_with=\([a-z]*\)$/\1/p' | tail -n1)
WITH=${WITH:-pagetables}
echo "bench: $MIB MiB, best of $REPEATS; scattered: $FRAG MiB of $WITH touched, $HOLE page(s) released after every $KEEP kept"
grep -E '^(MemTotal|MemFree):' /proc/meminfo | sed 's/^/bench: /'

# The fragmenter holds what it touched at its peak; then the holes and the
# buffer must still fit.
free_mib=$(($(sed -n 's/^MemFree: *\([0-9]*\) kB/\1/p' /proc/meminfo) / 1024))
if [ $((FRAG + MIB + 128)) -gt "$free_mib" ]; then
    echo "RGPU-ERROR bench: $FRAG MiB to fragment and $MIB MiB pinned need more than the guest's $free_mib MiB free (MEM)"
fi

# bench LABEL [ARGS...]: one vm_copy_bench run as the user cuda, then the
# host's look at its blob.
bench() {
    local label=$1 rc
    shift
    rgpu_as_user $BENCH --mib "$MIB" --repeats "$REPEATS" --label "$label" "$@"
    rc=$?
    rgpu_host_check "bench-blob $label" || echo "bench: the host did not answer for $label"
    return $rc
}

rgpu_step bench-contiguous bench contiguous
rgpu_step bench-scattered bench scattered --fragment "$FRAG" --keep-pages "$KEEP" --hole-pages "$HOLE" \
    --fragment-with "$WITH"
