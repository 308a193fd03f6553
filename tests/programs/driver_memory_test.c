/* driver_memory_test: memory the driver takes for a process beyond its
 * allocations counts against the tenant's memory limit (issue 8): the
 * context's own overhead, and module globals.
 *
 * Usage: driver_memory_test --limit-mb L --global-mb G [--overhead-mb O]
 *   L  the tenant's memory limit
 *   G  the size of the one global of the module it loads again and again
 *   O  the context's overhead if known exactly (the sim's); without it
 *      (a real driver) only "some" is checked, and figures allow for the
 *      driver's own rounding
 *
 * Checks: the device's total is L and a fresh context leaves less than L
 * free; modules load until the next one's global would pass the limit,
 * and that load fails with CUDA_ERROR_OUT_OF_MEMORY; each global counts
 * (free memory falls by G per module) and comes back when its module is
 * unloaded; allocations, plain and pitched, then stop where the limit is;
 * an array either fails as not supported or counts. Prints the figures
 * ("start: free F total T", "loaded N modules, then rc R NAME", ...) and
 * "driver_memory_test: N checks passed" (exit 0) or each failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"

#define MAX_MODULES 64
#define MAX_BLOCKS 4096
#define BLOCK_MB 16
#define MIB ((size_t)1 << 20)
#define CU_AD_FORMAT_FLOAT 0x20
#ifndef CUDA_ERROR_NOT_SUPPORTED
#define CUDA_ERROR_NOT_SUPPORTED 801
#endif

/* Not in rgpu_cuda.h: written from NVIDIA's public driver API reference. */
typedef struct CUarray_st *CUarray;
typedef struct {
    size_t Width;
    size_t Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width_bytes, size_t height,
                            unsigned int element_size);
CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *descriptor);
CUresult cuArrayDestroy(CUarray array);

static size_t free_mib(void) {
    size_t free_b = 0, total_b = 0;
    if (cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS) return 0;
    return free_b / MIB;
}

int main(int argc, char **argv) {
    long limit_mb = 0, global_mb = 0, overhead_mb = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--limit-mb")) limit_mb = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--global-mb")) global_mb = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--overhead-mb")) overhead_mb = strtol(argv[i + 1], NULL, 10);
    }
    if (limit_mb <= 0 || global_mb <= 0) {
        fprintf(stderr, "usage: driver_memory_test --limit-mb L --global-mb G [--overhead-mb O]\n");
        return 2;
    }
    /* The driver's rounding and the code it loads with each module. */
    const long slack = overhead_mb >= 0 ? 0 : 8;
    char ptx[512];
    snprintf(ptx, sizeof ptx,
             ".version 7.0\n.target sm_50\n.address_size 64\n"
             ".visible .global .align 8 .b8 rgpu_big[%lld];\n",
             (long long)global_mb * (long long)MIB);

    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        printf("FAIL: no CUDA context\n");
        return 1;
    }
    size_t total_b = 0, free_b = 0, info_total = 0;
    CHECK_CU(cuDeviceTotalMem(&total_b, dev));
    CHECK_CU(cuMemGetInfo(&free_b, &info_total));
    size_t start = free_b / MIB;
    printf("start: free %zu total %zu\n", start, info_total / MIB);
    CHECK_EQ_INT(total_b / MIB, limit_mb);
    CHECK_EQ_INT(info_total / MIB, limit_mb);
    if (overhead_mb >= 0) CHECK_EQ_INT(start, limit_mb - overhead_mb);
    else CHECK_TRUE(start < (size_t)limit_mb); /* the context's own memory counts */

    CUmodule modules[MAX_MODULES];
    int loaded = 0;
    CUresult rc = CUDA_SUCCESS;
    while (loaded < MAX_MODULES) {
        rc = cuModuleLoadData(&modules[loaded], ptx);
        if (rc != CUDA_SUCCESS) break;
        CUdeviceptr big = 0;
        size_t size = 0;
        CHECK_CU(cuModuleGetGlobal(&big, &size, modules[loaded], "rgpu_big"));
        CHECK_EQ_INT(size, (size_t)global_mb * MIB);
        if (big) CHECK_CU(cuMemsetD8(big, (unsigned char)loaded, size));
        loaded++;
    }
    size_t after_loads = free_mib();
    printf("loaded %d modules of %ld MiB, then rc %d %s; free %zu\n", loaded, global_mb, rc,
           error_name(rc), after_loads);
    CHECK_EQ_INT(rc, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_TRUE(loaded >= 1);
    /* Every global counted, and the refused one would not have fit. */
    CHECK_TRUE(after_loads + (size_t)loaded * (size_t)global_mb <= start);
    CHECK_TRUE(after_loads < (size_t)(global_mb + slack));
    if (overhead_mb >= 0) CHECK_EQ_INT(after_loads, start - (size_t)loaded * (size_t)global_mb);

    if (loaded >= 1) {
        CHECK_CU(cuModuleUnload(modules[loaded - 1]));
        size_t after_unload = free_mib();
        printf("after one unload: free %zu\n", after_unload);
        CHECK_TRUE(after_unload + (size_t)slack >= after_loads + (size_t)global_mb);
        CHECK_CU(cuModuleLoadData(&modules[loaded - 1], ptx));
    }
    for (int i = 0; i < loaded; i++) CHECK_CU(cuModuleUnload(modules[i]));
    size_t unloaded = free_mib();
    printf("all unloaded: free %zu\n", unloaded);
    CHECK_TRUE(unloaded + (size_t)slack >= start);

    static CUdeviceptr blocks[MAX_BLOCKS];
    long n = 0;
    rc = CUDA_SUCCESS;
    while (n < MAX_BLOCKS) {
        rc = cuMemAlloc(&blocks[n], (size_t)BLOCK_MB * MIB);
        if (rc != CUDA_SUCCESS) break;
        n++;
    }
    printf("allocated %ld MiB, then rc %d %s\n", n * BLOCK_MB, rc, error_name(rc));
    CHECK_EQ_INT(rc, CUDA_ERROR_OUT_OF_MEMORY);
    /* Allocations stop where the limit is, the context's memory included. */
    CHECK_TRUE((size_t)(n * BLOCK_MB) <= unloaded);
    CHECK_TRUE((size_t)((n + 1) * BLOCK_MB) > unloaded);
    for (long i = 0; i < n; i++) CHECK_CU(cuMemFree(blocks[i]));

    /* Pitched allocations take from the same budget (4096 bytes wide:
     * a pitch of 4096, 16 MiB a block). */
    size_t before_pitch = free_mib();
    long pitched = 0;
    rc = CUDA_SUCCESS;
    while (pitched < MAX_BLOCKS) {
        size_t pitch = 0;
        rc = cuMemAllocPitch_v2(&blocks[pitched], &pitch, 4096, 4096, 4);
        if (rc != CUDA_SUCCESS) break;
        CHECK_EQ_INT(pitch, 4096);
        pitched++;
    }
    printf("pitched %ld MiB, then rc %d %s\n", pitched * BLOCK_MB, rc, error_name(rc));
    CHECK_EQ_INT(rc, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_TRUE((size_t)(pitched * BLOCK_MB) <= before_pitch);
    CHECK_TRUE((size_t)((pitched + 1) * BLOCK_MB) > before_pitch);
    for (long i = 0; i < pitched; i++) CHECK_CU(cuMemFree(blocks[i]));

    /* Arrays: where they exist, a 4 MiB one counts; rgpu has none yet, so
     * none can take memory. */
    CUDA_ARRAY_DESCRIPTOR desc = {1024, 1024, CU_AD_FORMAT_FLOAT, 1};
    CUarray array;
    size_t before_array = free_mib();
    rc = cuArrayCreate_v2(&array, &desc);
    printf("array: rc %d %s\n", rc, error_name(rc));
    if (rc == CUDA_SUCCESS) {
        CHECK_TRUE(free_mib() + 4 <= before_array);
        CHECK_CU(cuArrayDestroy(array));
    } else {
        CHECK_EQ_INT(rc, CUDA_ERROR_NOT_SUPPORTED);
    }

    CHECK_CU(cuDevicePrimaryCtxRelease(dev));
    if (checks_failed) {
        printf("driver_memory_test: %ld checks failed\n", checks_failed);
        return 1;
    }
    printf("driver_memory_test: %ld checks passed\n", checks_passed);
    return 0;
}
