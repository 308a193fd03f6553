/* vmm_test: the virtual-memory management API (issue 10), as XLA and
 * PyTorch's expandable segments use it.
 *
 * Usage: vmm_test --ptx reference_kernels.ptx [--limit-mb N]
 *
 * Reserves two granules of addresses, creates one granule of physical
 * memory and maps it at both (one allocation, two addresses): a memset
 * through the first is read back through the second, a kernel writing the
 * first is seen through the second, and a copy spanning both mappings
 * works (on a GPU; the sim copies within one mapping). Retaining the handle from an address and releasing it keeps the
 * mapping; access and properties read back as set; misuse (a mapping
 * outside the reservation, an unknown unmap) fails.
 * With --limit-mb N (the tenant's memory limit), the device's total is N
 * MiB, physical memory as large as what is free of it is created, and one
 * granule more fails with CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Prints "vmm_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"
#include "rgpu_vmm.h"

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    long limit_mb = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ptx")) ptx_path = argv[i + 1];
        else if (!strcmp(argv[i], "--limit-mb")) limit_mb = atol(argv[i + 1]);
    }
    char *ptx = ptx_path ? read_file(ptx_path) : NULL;
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction fill_index;
    if (!ptx || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, ptx) ||
        cuModuleGetFunction(&fill_index, module, "rgpu_fill_index")) {
        printf("FAIL: no CUDA context or kernel (usage: vmm_test --ptx PTX)\n");
        return 1;
    }
    AllocationProp prop = device_prop(dev, 0);
    size_t granule = 0, recommended = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&granule, &prop, 0));
    CHECK_CU(cuMemGetAllocationGranularity(&recommended, &prop, 1));
    CHECK_TRUE(granule > 0 && (granule & (granule - 1)) == 0);
    CHECK_TRUE(recommended >= granule);
    printf("granularity %zu, recommended %zu\n", granule, recommended);

    CUdeviceptr va = 0;
    MemHandle physical = 0;
    REQUIRE_CU(cuMemAddressReserve(&va, 2 * granule, 0, 0, 0));
    REQUIRE_CU(cuMemCreate(&physical, granule, &prop, 0));
    CHECK_CU(cuMemMap(va, granule, 0, physical, 0));
    CHECK_CU(cuMemMap(va + granule, granule, 0, physical, 0));
    AccessDesc access = {{DEVICE, dev}, READ_WRITE};
    CHECK_CU(cuMemSetAccess(va, 2 * granule, &access, 1));

    /* Mapped addresses are device memory of the device (XLA asks the
     * ordinal of addresses in its virtual-memory pool). */
    {
        int ordinal = -1;
        unsigned int type = 0;
        CHECK_CU(cuPointerGetAttribute(&ordinal, 9 /* DEVICE_ORDINAL */, va + granule + 0x100));
        CHECK_EQ_INT(ordinal, dev);
        CHECK_CU(cuPointerGetAttribute(&type, 2 /* MEMORY_TYPE */, va + 0x100));
        CHECK_EQ_INT(type, 2 /* DEVICE */);
    }

    /* One allocation, two addresses. */
    uint32_t word = 0;
    CHECK_CU(cuMemsetD32(va, 0x12345678u, granule / 4));
    CHECK_CU(cuMemcpyDtoH(&word, va + granule + 4096, 4));
    CHECK_EQ_INT(word, 0x12345678u);
    unsigned base = 77, count = 1024;
    void *params[] = {&va, &base, &count};
    CHECK_CU(cuLaunchKernel(fill_index, count / 128, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
    uint32_t seen[4] = {0};
    CHECK_CU(cuMemcpyDtoH(seen, va + granule + 4 * 100, sizeof seen));
    CHECK_EQ_INT(seen[0], base + 100);
    CHECK_EQ_INT(seen[3], base + 103);
    /* A copy across the two mappings (the sim executor copies within one
     * mapping only: a GPU's copy engines see one address space). */
    char name[256] = "";
    CHECK_CU(cuDeviceGetName(name, sizeof name, dev));
    if (!strstr(name, "rgpu-sim")) {
        uint32_t across[4] = {0};
        CHECK_CU(cuMemcpyDtoH(across, va + granule - 8, sizeof across));
        CHECK_EQ_INT(across[1], 0x12345678u);
        CHECK_EQ_INT(across[2], base + 0);
    }

    /* The handle behind an address; access and properties. */
    MemHandle retained = 0;
    CHECK_CU(cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)(va + 64)));
    CHECK_TRUE(retained == physical);
    CHECK_CU(cuMemRelease(retained));
    unsigned long long flags = 0;
    CHECK_CU(cuMemGetAccess(&flags, &access.location, va));
    CHECK_EQ_INT(flags, READ_WRITE);
    AllocationProp read_back;
    memset(&read_back, 0xff, sizeof read_back);
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&read_back, physical));
    CHECK_EQ_INT(read_back.type, PINNED);
    CHECK_EQ_INT(read_back.location.id, dev);
    CHECK_CU(cuMemcpyDtoH(&word, va + 8, 4));
    CHECK_EQ_INT(word, base + 2);

    /* Misuse. */
    CHECK_CU_FAILS(cuMemMap(va + 2 * granule, granule, 0, physical, 0));
    CHECK_CU_FAILS(cuMemUnmap(va + 2 * granule, granule));

    CHECK_CU(cuMemUnmap(va, granule));
    CHECK_CU(cuMemUnmap(va + granule, granule));
    CHECK_CU(cuMemRelease(physical));
    CHECK_CU(cuMemAddressFree(va, 2 * granule));

    /* The tenant's memory limit counts physical memory: what is free of
     * it (the limit less the module's globals and the context's own
     * memory) can be created, one granule more cannot. */
    if (limit_mb > 0) {
        size_t free_b = 0, total_b = 0;
        CHECK_CU(cuMemGetInfo(&free_b, &total_b));
        CHECK_EQ_INT(total_b, (size_t)limit_mb << 20);
        size_t total = free_b / granule * granule;
        MemHandle all = 0, more = 0;
        CHECK_TRUE(total > 0);
        CHECK_CU(cuMemCreate(&all, total, &prop, 0));
        CHECK_RC(cuMemCreate(&more, granule, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
        CHECK_CU(cuMemRelease(all));
        CHECK_CU(cuMemCreate(&more, granule, &prop, 0));
        CHECK_CU(cuMemRelease(more));
    }

    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) return 1;
    printf("vmm_test: %ld checks passed\n", checks_passed);
    return 0;
}
