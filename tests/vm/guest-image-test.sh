#!/bin/sh
# /test.sh of the disk-image VM test (tests/tests/vm_mode.rs): rgpu's guest
# package was installed by dpkg, so programs find its libcuda.so.1 through
# the ld.so cache, with no LD_LIBRARY_PATH. Runs as the non-root user cuda.
as_cuda() { su -s /bin/sh cuda -c "cd /home/cuda && exec $*"; }
step() {
    name=$1
    shift
    echo "RGPU-TEST-BEGIN $name"
    "$@"
    rc=$?
    echo "RGPU-TEST-END $name rc=$rc"
    return $rc
}
echo "RGPU-IMAGE libcuda: $(ldconfig -p | grep -m1 'libcuda.so.1 ')"
step diag as_cuda rgpu-diag
step single as_cuda /opt/rgpu-test/driver_api_test --ptx /opt/rgpu-test/reference_kernels.ptx --big-mb 8
