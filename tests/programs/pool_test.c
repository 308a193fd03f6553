/* pool_test: stream-ordered memory and memory pools (issue 10), as
 * PyTorch's cudaMallocAsync backend and CuPy's pools use them.
 *
 * Usage: pool_test [--limit-mb N]
 *
 * The device's default pool is its current one; cuMemAllocAsync takes
 * from it and the pool's used-memory statistics follow (current back to 0
 * after cuMemFreeAsync, high kept until reset); a created pool keeps its
 * release threshold, serves cuMemAllocFromPoolAsync, becomes the device's
 * current pool and stops being it when destroyed; the memory of a pool
 * allocation is usable. With --limit-mb N (the tenant's memory limit), N
 * MiB from a pool succeed and 16 MiB more fail with
 * CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Prints "pool_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"

typedef struct CUmemPool_st *CUmemoryPool;
typedef struct {
    unsigned int alloc_type;
    unsigned int handle_types;
    unsigned int location_type;
    int location_id;
    void *win32_security_attributes;
    size_t max_size;
    unsigned short usage;
    unsigned char reserved[54];
} PoolProps;

CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                 CUstream stream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const PoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);

#define RELEASE_THRESHOLD 4
#define USED_MEM_CURRENT 7
#define USED_MEM_HIGH 8
#define MIB (1u << 20)

static uint64_t attribute(CUmemoryPool pool, int attr) {
    uint64_t value = 12345;
    CHECK_CU(cuMemPoolGetAttribute(pool, attr, &value));
    return value;
}

int main(int argc, char **argv) {
    long limit_mb = argc == 3 && !strcmp(argv[1], "--limit-mb") ? atol(argv[2]) : 0;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuStreamCreate(&stream, 0)) {
        printf("FAIL: no CUDA context\n");
        return 1;
    }
    CUmemoryPool def = NULL, cur = NULL, pool = NULL;
    CHECK_CU(cuDeviceGetDefaultMemPool(&def, dev));
    CHECK_CU(cuDeviceGetMemPool(&cur, dev));
    CHECK_TRUE(def != NULL && def == cur);
    uint64_t base_used = attribute(def, USED_MEM_CURRENT);

    CUdeviceptr a = 0;
    CHECK_CU(cuMemAllocAsync(&a, 4 * MIB, stream));
    CHECK_EQ_INT(attribute(def, USED_MEM_CURRENT), base_used + 4 * MIB);
    uint32_t word = 0;
    CHECK_CU(cuMemsetD32Async(a, 0xabcdef01u, MIB, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuMemcpyDtoH(&word, a + 4096, 4));
    CHECK_EQ_INT(word, 0xabcdef01u);
    CHECK_CU(cuMemFreeAsync(a, stream));
    /* The free is stream-ordered: done once the stream got there. */
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(attribute(def, USED_MEM_CURRENT), base_used);
    CHECK_TRUE(attribute(def, USED_MEM_HIGH) >= base_used + 4 * MIB);
    uint64_t zero = 0;
    CHECK_CU(cuMemPoolSetAttribute(def, USED_MEM_HIGH, &zero));
    CHECK_EQ_INT(attribute(def, USED_MEM_HIGH), base_used);

    PoolProps props;
    memset(&props, 0, sizeof props);
    props.alloc_type = 1;
    props.location_type = 1;
    props.location_id = dev;
    CHECK_CU(cuMemPoolCreate(&pool, &props));
    uint64_t threshold = 64 * MIB;
    CHECK_CU(cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &threshold));
    CHECK_EQ_INT(attribute(pool, RELEASE_THRESHOLD), 64 * MIB);
    CUdeviceptr b = 0;
    CHECK_CU(cuMemAllocFromPoolAsync(&b, 2 * MIB, pool, stream));
    CHECK_EQ_INT(attribute(pool, USED_MEM_CURRENT), 2 * MIB);
    CHECK_CU(cuMemPoolTrimTo(pool, 0));
    CHECK_CU(cuDeviceSetMemPool(dev, pool));
    CHECK_CU(cuDeviceGetMemPool(&cur, dev));
    CHECK_TRUE(cur == pool);
    CUdeviceptr c = 0;
    CHECK_CU(cuMemAllocAsync(&c, MIB, stream));
    CHECK_EQ_INT(attribute(pool, USED_MEM_CURRENT), 3 * MIB);
    CHECK_CU(cuMemFreeAsync(c, stream));
    CHECK_CU_FAILS(cuMemPoolDestroy(def));
    CHECK_CU(cuMemPoolDestroy(pool));
    CHECK_CU(cuDeviceGetMemPool(&cur, dev));
    CHECK_TRUE(cur == def);

    if (limit_mb > 0) {
        CUdeviceptr all = 0, more = 0;
        CHECK_CU(cuMemAllocAsync(&all, (size_t)limit_mb * MIB, stream));
        CHECK_RC(cuMemAllocAsync(&more, 16 * MIB, stream), CUDA_ERROR_OUT_OF_MEMORY);
        CHECK_CU(cuMemFreeAsync(all, stream));
        CHECK_CU(cuMemAllocAsync(&more, 16 * MIB, stream));
        CHECK_CU(cuMemFreeAsync(more, stream));
    }

    CHECK_CU(cuStreamDestroy(stream));
    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) return 1;
    printf("pool_test: %ld checks passed\n", checks_passed);
    return 0;
}
