/* pool_test: stream-ordered memory and memory pools (issue 10), as
 * PyTorch's cudaMallocAsync backend and CuPy's pools use them.
 *
 * Usage: pool_test [--limit-mb N] [--pool-ipc opened|not-supported]
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
 * The CUDA 13 calls by location (cuMemGetDefaultMemPool, cuMemGetMemPool,
 * cuMemSetMemPool) name the same pools. cuMemcpyBatchAsync copies from
 * page-locked host memory and between device buffers in one call, not on
 * the legacy stream.
 *
 * Pools between processes: a pool made with POSIX file-descriptor
 * handles exports itself and an allocation's pointer (one made without
 * them does neither); a child process (this program again) imports the
 * pool (from which it cannot allocate) and the pointer, reads the
 * parent's pattern and writes one the parent reads back, then frees it
 * (--pool-ipc opened, the default). With not-supported (the sim
 * executor, whose workers cannot map each other's memory) the import of
 * the pointer passes the tenant's registry and fails with
 * CUDA_ERROR_NOT_SUPPORTED. Through rgpu, a pointer's export data with a
 * byte changed is CUDA_ERROR_INVALID_HANDLE and a descriptor of random
 * bytes imports no pool.
 *
 * Prints "pool_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _GNU_SOURCE

#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
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
/* CUDA 13: pools by location. */
typedef struct {
    int type;
    int id;
} MemLocation;
CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, MemLocation *location, int alloc_type);
CUresult cuMemGetMemPool(CUmemoryPool *pool, MemLocation *location, int alloc_type);
CUresult cuMemSetMemPool(MemLocation *location, int alloc_type, CUmemoryPool pool);
/* CUmemcpyAttributes and cuMemcpyBatchAsync as CUDA 13 has them. */
typedef struct {
    int src_access_order;
    MemLocation src_hint, dst_hint;
    unsigned int flags;
} MemcpyAttributes;
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                               MemcpyAttributes *attrs, size_t *attr_indices, size_t num_attrs,
                               CUstream stream);
#define LOCATION_DEVICE 1
#define ALLOCATION_PINNED 1
typedef struct {
    MemLocation location;
    int flags;
} PoolAccessDesc;
CUresult cuMemPoolSetAccess(CUmemoryPool pool, const PoolAccessDesc *map, size_t count);
CUresult cuMemPoolGetAccess(int *flags, CUmemoryPool pool, MemLocation *location);
#define ACCESS_READ_WRITE 3
#ifndef CUDA_ERROR_INVALID_DEVICE
#define CUDA_ERROR_INVALID_DEVICE 101
#endif
#define SRC_ACCESS_ORDER_STREAM 1
typedef struct {
    unsigned char reserved[64];
} PoolPtrExportData;
CUresult cuMemPoolExportToShareableHandle(void *handle, CUmemoryPool pool, int type,
                                          unsigned long long flags);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle, int type,
                                            unsigned long long flags);
CUresult cuMemPoolExportPointer(PoolPtrExportData *data, CUdeviceptr ptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *ptr, CUmemoryPool pool, PoolPtrExportData *data);

#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_SUPPORTED 801
#define HANDLE_POSIX_FD 1
#define PARENT_WORD 0x600dcafeu
#define CHILD_WORD 0xb0b0b0b0u

#define RELEASE_THRESHOLD 4
#define USED_MEM_CURRENT 7
#define USED_MEM_HIGH 8
#define MIB (1u << 20)

/* The child: imports the pool from descriptor `fd` and the pointer
 * `data_hex`; `expect` says what the pointer's import returns. */
static int pool_child(int fd, const char *data_hex, const char *expect) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        printf("FAIL: child: no CUDA context\n");
        return 1;
    }
    PoolPtrExportData data;
    if (unhex(data.reserved, data_hex, sizeof data.reserved)) {
        printf("FAIL: child: bad export data\n");
        return 1;
    }
    CUmemoryPool imported = NULL;
    CHECK_CU(cuMemPoolImportFromShareableHandle(&imported, (void *)(intptr_t)fd, HANDLE_POSIX_FD,
                                                0));
    CUdeviceptr ptr = 0, own = 0;
    CHECK_CU_FAILS(cuMemAllocFromPoolAsync(&own, MIB, imported, NULL));
    CUresult rc = cuMemPoolImportPointer(&ptr, imported, &data);
    if (!strcmp(expect, "opened")) {
        CHECK_CU(rc);
        uint32_t word = 0;
        CHECK_CU(cuMemcpyDtoH(&word, ptr + 4096, 4));
        CHECK_EQ_INT(word, PARENT_WORD);
        CHECK_CU(cuMemsetD32(ptr, CHILD_WORD, MIB / 4));
        CHECK_CU(cuMemFreeAsync(ptr, NULL));
        CHECK_CU(cuCtxSynchronize());
    } else if (!strcmp(expect, "not-supported")) {
        CHECK_RC(rc, CUDA_ERROR_NOT_SUPPORTED);
    } else {
        CHECK_RC(rc, CUDA_ERROR_INVALID_HANDLE);
    }
    CHECK_CU(cuMemPoolDestroy(imported));
    printf("pool_test child (%s): %ld checks passed, %ld failed\n", expect, checks_passed,
           checks_failed);
    return checks_failed ? 1 : 0;
}

/* Runs the child with descriptor `fd` and export data `data`; its exit
 * status. */
static int run_child(const char *self, int fd, const PoolPtrExportData *data,
                     const char *expect) {
    char fd_text[16], data_hex[2 * sizeof data->reserved + 1];
    snprintf(fd_text, sizeof fd_text, "%d", fd);
    hex(data_hex, data->reserved, sizeof data->reserved);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, "pool_test", "--pool-child", fd_text, data_hex, expect, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Pools between processes (see the comment at the top). */
static void pools_between_processes(CUdevice dev, CUstream stream, const char *expect) {
    int through_rgpu = getenv("RGPU_SOCKET") || getenv("RGPU_SERVER") || getenv("RGPU_DEVICES");
    PoolProps props;
    memset(&props, 0, sizeof props);
    props.alloc_type = 1;
    props.location_type = 1;
    props.location_id = dev;
    CUmemoryPool plain = NULL, shared = NULL;
    CHECK_CU(cuMemPoolCreate(&plain, &props));
    props.handle_types = HANDLE_POSIX_FD;
    CHECK_CU(cuMemPoolCreate(&shared, &props));
    int fd = -1;
    CHECK_RC(cuMemPoolExportToShareableHandle(&fd, plain, HANDLE_POSIX_FD, 0),
             CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr p = 0, q = 0;
    CHECK_CU(cuMemAllocFromPoolAsync(&p, MIB, shared, stream));
    CHECK_CU(cuMemAllocFromPoolAsync(&q, MIB, plain, stream));
    CHECK_CU(cuMemsetD32Async(p, PARENT_WORD, MIB / 4, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    PoolPtrExportData data;
    CHECK_RC(cuMemPoolExportPointer(&data, q), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemPoolExportToShareableHandle(&fd, shared, HANDLE_POSIX_FD, 0));
    CHECK_CU(cuMemPoolExportPointer(&data, p));
    if (fd >= 0) {
        CHECK_EQ_INT(run_child("/proc/self/exe", fd, &data, expect), 0);
        if (!strcmp(expect, "opened")) {
            uint32_t word = 0;
            CHECK_CU(cuMemcpyDtoH(&word, p + 4096, 4));
            CHECK_EQ_INT(word, CHILD_WORD);
        }
        if (through_rgpu) {
            PoolPtrExportData forged = data;
            forged.reserved[37] ^= 1;
            CHECK_EQ_INT(run_child("/proc/self/exe", fd, &forged, "refused"), 0);
            /* A descriptor of random bytes imports no pool. */
            int random_fd = memfd_create("random", 0);
            unsigned char junk[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
            CUmemoryPool none = NULL;
            CHECK_TRUE(random_fd >= 0 && write(random_fd, junk, sizeof junk) == sizeof junk);
            CHECK_RC(cuMemPoolImportFromShareableHandle(&none, (void *)(intptr_t)random_fd,
                                                        HANDLE_POSIX_FD, 0),
                     CUDA_ERROR_INVALID_VALUE);
            close(random_fd);
        }
        close(fd);
    }
    CHECK_CU(cuMemFreeAsync(p, stream));
    CHECK_CU(cuMemFreeAsync(q, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuMemPoolDestroy(shared));
    CHECK_CU(cuMemPoolDestroy(plain));
}

static uint64_t attribute(CUmemoryPool pool, int attr) {
    uint64_t value = 12345;
    CHECK_CU(cuMemPoolGetAttribute(pool, attr, &value));
    return value;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--pool-child"))
        return pool_child(atoi(argv[2]), argv[3], argv[4]);
    long limit_mb = 0;
    const char *pool_ipc = "opened";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--limit-mb")) limit_mb = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--pool-ipc")) pool_ipc = argv[i + 1];
    }
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
    /* Access: the pool's own device reads and writes it. */
    {
        MemLocation here = {LOCATION_DEVICE, dev}, nowhere = {LOCATION_DEVICE, 4096};
        int flags = -1;
        CHECK_CU(cuMemPoolGetAccess(&flags, pool, &here));
        CHECK_EQ_INT(flags, ACCESS_READ_WRITE);
        PoolAccessDesc desc = {here, ACCESS_READ_WRITE};
        CHECK_CU(cuMemPoolSetAccess(pool, &desc, 1));
        /* NVIDIA's driver: INVALID_VALUE to ask, INVALID_DEVICE to set. */
        CHECK_RC(cuMemPoolGetAccess(&flags, pool, &nowhere), CUDA_ERROR_INVALID_VALUE);
        desc.location = nowhere;
        CHECK_RC(cuMemPoolSetAccess(pool, &desc, 1), CUDA_ERROR_INVALID_DEVICE);
    }
    /* The same pools by location. */
    {
        MemLocation here = {LOCATION_DEVICE, dev};
        CUmemoryPool by_location = NULL;
        CHECK_CU(cuMemGetDefaultMemPool(&by_location, &here, ALLOCATION_PINNED));
        CHECK_TRUE(by_location == def);
        CHECK_CU(cuMemGetMemPool(&by_location, &here, ALLOCATION_PINNED));
        CHECK_TRUE(by_location == pool);
        CHECK_CU(cuMemSetMemPool(&here, ALLOCATION_PINNED, def));
        CHECK_CU(cuDeviceGetMemPool(&cur, dev));
        CHECK_TRUE(cur == def);
        CHECK_CU(cuMemSetMemPool(&here, ALLOCATION_PINNED, pool));
    }
    CHECK_CU_FAILS(cuMemPoolDestroy(def));
    CHECK_CU(cuMemPoolDestroy(pool));
    CHECK_CU(cuDeviceGetMemPool(&cur, dev));
    CHECK_TRUE(cur == def);

    /* A batch of two copies. */
    {
        uint32_t *host = NULL, back[2] = {0, 0};
        CUdeviceptr from_host = 0, from_device = 0, source = 0;
        REQUIRE_CU(cuMemAllocHost((void **)&host, 4096));
        for (int i = 0; i < 1024; i++) host[i] = 0x11110000u + (uint32_t)i;
        CHECK_CU(cuMemAlloc(&from_host, 4096));
        CHECK_CU(cuMemAlloc(&from_device, 4096));
        CHECK_CU(cuMemAlloc(&source, 4096));
        CHECK_CU(cuMemsetD32(source, 0x22222222u, 1024));
        CUdeviceptr dsts[2] = {from_host, from_device};
        CUdeviceptr srcs[2] = {(CUdeviceptr)(uintptr_t)host, source};
        size_t sizes[2] = {4096, 4096}, first = 0;
        MemcpyAttributes attrs;
        memset(&attrs, 0, sizeof attrs);
        attrs.src_access_order = SRC_ACCESS_ORDER_STREAM;
        CHECK_RC(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, &attrs, &first, 1, NULL),
                 CUDA_ERROR_INVALID_VALUE);
        CHECK_CU(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, &attrs, &first, 1, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_CU(cuMemcpyDtoH(&back[0], from_host + 4092, 4));
        CHECK_CU(cuMemcpyDtoH(&back[1], from_device + 4092, 4));
        CHECK_EQ_INT(back[0], 0x11110000u + 1023);
        CHECK_EQ_INT(back[1], 0x22222222u);
        CHECK_CU(cuMemFree(source));
        CHECK_CU(cuMemFree(from_device));
        CHECK_CU(cuMemFree(from_host));
        CHECK_CU(cuMemFreeHost(host));
    }

    if (limit_mb > 0) {
        CUdeviceptr all = 0, more = 0;
        CHECK_CU(cuMemAllocAsync(&all, (size_t)limit_mb * MIB, stream));
        CHECK_RC(cuMemAllocAsync(&more, 16 * MIB, stream), CUDA_ERROR_OUT_OF_MEMORY);
        CHECK_CU(cuMemFreeAsync(all, stream));
        CHECK_CU(cuMemAllocAsync(&more, 16 * MIB, stream));
        CHECK_CU(cuMemFreeAsync(more, stream));
    }

    pools_between_processes(dev, stream, pool_ipc);

    CHECK_CU(cuStreamDestroy(stream));
    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) return 1;
    printf("pool_test: %ld checks passed\n", checks_passed);
    return 0;
}
