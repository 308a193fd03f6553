/* pinned_limit_test: page-locked memory the host cannot map. A worker maps
 * each run of a blob's pages as one mapping, so a blob of too many
 * scattered pages is refused (vm.max_map_count; the tests lower the limit
 * with RGPU_MAX_MAPPED_RUNS and scatter local blobs with
 * RGPU_LOCAL_SCATTER_BLOBS=1). The allocation must fail at once with
 * CUDA_ERROR_OUT_OF_MEMORY, as the driver's does when it cannot pin, and
 * the context must go on working.
 *
 * Usage: pinned_limit_test BIG_MIB
 *   cuMemAllocHost(BIG_MIB MiB) fails with CUDA_ERROR_OUT_OF_MEMORY;
 *   then 1 MiB of page-locked memory is allocated and round-trips through
 *   the device.
 *
 * Prints "pinned_limit_test: N checks passed" (exit 0) or every failed
 * check (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: pinned_limit_test BIG_MIB\n");
        return 2;
    }
    size_t big = (size_t)atol(argv[1]) << 20;
    CUdevice dev;
    CUcontext ctx;
    REQUIRE_CU(cuInit(0));
    REQUIRE_CU(cuDeviceGet(&dev, 0));
    REQUIRE_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    REQUIRE_CU(cuCtxSetCurrent(ctx));
    void *refused = NULL;
    CHECK_RC(cuMemAllocHost(&refused, big), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_TRUE(refused == NULL);

    const size_t small = 1 << 20;
    uint32_t *pinned = NULL;
    CUdeviceptr d = 0;
    REQUIRE_CU(cuMemAllocHost((void **)&pinned, small));
    REQUIRE_CU(cuMemAlloc(&d, small));
    for (size_t i = 0; i < small / 4; i++) pinned[i] = (uint32_t)(i * 2654435761u);
    CHECK_CU(cuMemcpyHtoD(d, pinned, small));
    memset(pinned, 0, small);
    CHECK_CU(cuMemcpyDtoH(pinned, d, small));
    size_t wrong = 0;
    for (size_t i = 0; i < small / 4; i++) wrong += pinned[i] != (uint32_t)(i * 2654435761u);
    CHECK_EQ_INT((int)wrong, 0);
    CHECK_CU(cuMemFree(d));
    CHECK_CU(cuMemFreeHost(pinned));
    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) return 1;
    printf("pinned_limit_test: %ld checks passed\n", checks_passed);
    return 0;
}
