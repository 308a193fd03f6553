/* framework_queries_test: the queries CuPy, Triton and PyTorch make of the
 * driver, checked value by value: pointer attributes of device, page-locked
 * and foreign memory, stream capture state, stream and context identity,
 * occupancy, a function attribute set then read (and needed by a launch),
 * cache configuration round trips. Runs the same against rgpu's libcuda.so.1
 * (sim or cuda executor) and NVIDIA's.
 *
 * Usage: framework_queries_test --image PATH [--require-clusters] [--mapped-host]
 *                               [--mapped-kernel]
 *
 *   --image PATH  reference_kernels.ptx (rgpu_vector_add and rgpu_empty)
 *   --require-clusters  cuOccupancyMaxActiveClusters must answer (the sim
 *                 executor does; a GPU may refuse clusters for sm_52 PTX)
 *
 * Prints "framework_queries_test: N checks passed" (exit 0) or every failed
 * check (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"
#include "rgpu_launch.h"

#define cuMemGetAddressRange cuMemGetAddressRange_v2

#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_FILE_NOT_FOUND 301
#define MEMORYTYPE_HOST 1
#define MEMORYTYPE_DEVICE 2
#define POINTER_ATTRIBUTE_CONTEXT 1
#define POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define POINTER_ATTRIBUTE_HOST_POINTER 4
#define POINTER_ATTRIBUTE_BUFFER_ID 7
#define POINTER_ATTRIBUTE_IS_MANAGED 8
#define POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define POINTER_ATTRIBUTE_RANGE_SIZE 12
#define POINTER_ATTRIBUTE_MAPPED 13
#define FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define FUNC_ATTRIBUTE_NUM_REGS 4
#define FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39
#define DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define STREAM_CAPTURE_STATUS_NONE 0
#define FUNC_CACHE_PREFER_SHARED 1
#define FUNC_CACHE_PREFER_L1 2
/* Rounds of PyTorch's set-then-read pattern (tests/tests/framework_queries.rs
 * relies on the count). */
#define ATTRIBUTE_STEPS 20
typedef size_t (*BlockToDynamicSmem)(int block_size);

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
CUresult cuModuleLoad(CUmodule *module, const char *fname);
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags);
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuPointerGetAttributes(unsigned int count, int *attributes, void **data, CUdeviceptr ptr);
CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
CUresult cuStreamIsCapturing(CUstream stream, int *status);
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, unsigned long long *id,
                                   void **graph, const void **dependencies, size_t *count);
CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx);
CUresult cuStreamGetId(CUstream stream, unsigned long long *id);
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id);
CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f, int block_size,
                                                     size_t dynamic_smem);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction f,
                                                              int block_size, size_t dynamic_smem,
                                                              unsigned int flags);
CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *bytes, CUfunction f, int blocks,
                                                 int block_size);
CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f,
                                          BlockToDynamicSmem callback, size_t dynamic_smem,
                                          int limit);
CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction f, const LaunchConfig *config);
CUresult cuOccupancyMaxPotentialClusterSize(int *size, CUfunction f, const LaunchConfig *config);
CUresult cuFuncSetAttribute(CUfunction f, int attribute, int value);
CUresult cuFuncSetCacheConfig(CUfunction f, int config);
CUresult cuCtxGetCacheConfig(int *config);
CUresult cuCtxSetCacheConfig(int config);
CUresult cuCtxGetSharedMemConfig(int *config);
CUresult cuCtxResetPersistingL2Cache(void);
CUresult cuDeviceCanAccessPeer(int *can_access, CUdevice device, CUdevice peer);

static int device_memory(CUcontext ctx) {
    const size_t size = 1 << 20;
    CUdeviceptr d = 0, d2 = 0, base = 0, range_start = 0, dptr = 0;
    size_t range = 0;
    unsigned int type = 0;
    unsigned long long id = 0, id2 = 0;
    CUcontext owner = NULL;
    int ordinal = -1;
    unsigned char managed = 7, mapped = 0;
    void *host = (void *)1;

    REQUIRE_CU(cuMemAlloc(&d, size));
    REQUIRE_CU(cuMemAlloc(&d2, 4096));
    CHECK_CU(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, d + 100));
    CHECK_TRUE(type == MEMORYTYPE_DEVICE);
    CHECK_CU(cuPointerGetAttribute(&dptr, POINTER_ATTRIBUTE_DEVICE_POINTER, d + 100));
    CHECK_TRUE(dptr == d + 100);
    CHECK_CU(cuPointerGetAttribute(&owner, POINTER_ATTRIBUTE_CONTEXT, d));
    CHECK_TRUE(owner == ctx);
    CHECK_CU(cuPointerGetAttribute(&ordinal, POINTER_ATTRIBUTE_DEVICE_ORDINAL, d));
    CHECK_TRUE(ordinal == 0);
    CHECK_CU(cuPointerGetAttribute(&managed, POINTER_ATTRIBUTE_IS_MANAGED, d));
    CHECK_TRUE(managed == 0);
    CHECK_CU(cuPointerGetAttribute(&mapped, POINTER_ATTRIBUTE_MAPPED, d));
    CHECK_TRUE(mapped == 1);
    CHECK_CU(cuPointerGetAttribute(&range_start, POINTER_ATTRIBUTE_RANGE_START_ADDR, d + size - 1));
    CHECK_TRUE(range_start == d);
    CHECK_CU(cuPointerGetAttribute(&range, POINTER_ATTRIBUTE_RANGE_SIZE, d + 5));
    CHECK_TRUE(range == size);
    CHECK_CU(cuPointerGetAttribute(&id, POINTER_ATTRIBUTE_BUFFER_ID, d));
    CHECK_CU(cuPointerGetAttribute(&id2, POINTER_ATTRIBUTE_BUFFER_ID, d2));
    CHECK_TRUE(id != 0 && id2 != 0 && id != id2);
    /* Device memory has no host pointer. */
    CHECK_RC(cuPointerGetAttribute(&host, POINTER_ATTRIBUTE_HOST_POINTER, d),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemGetAddressRange(&base, &range, d + 4096));
    CHECK_TRUE(base == d && range == size);

    {
        int attributes[4] = {POINTER_ATTRIBUTE_MEMORY_TYPE, POINTER_ATTRIBUTE_DEVICE_POINTER,
                             POINTER_ATTRIBUTE_HOST_POINTER, POINTER_ATTRIBUTE_DEVICE_ORDINAL};
        void *data[4] = {&type, &dptr, &host, &ordinal};
        type = 0;
        dptr = 0;
        ordinal = -1;
        CHECK_CU(cuPointerGetAttributes(4, attributes, data, d + 8));
        CHECK_TRUE(type == MEMORYTYPE_DEVICE && dptr == d + 8 && host == NULL && ordinal == 0);
    }

    /* Past the end and after the free, the memory is no longer known. */
    CHECK_RC(cuMemGetAddressRange(&base, &range, d2 + 8192), CUDA_ERROR_NOT_FOUND);
    CHECK_CU(cuMemFree(d2));
    CHECK_RC(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, d2),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemFree(d));
    return 0;
}

static int pinned_and_foreign_memory(CUcontext ctx) {
    void *h = NULL, *host = NULL;
    unsigned int type = 0;
    CUdeviceptr start = 0;
    size_t range = 0;
    CUcontext owner = NULL;
    int on_stack = 0;
    CUdeviceptr foreign = (CUdeviceptr)(uintptr_t)&on_stack;

    REQUIRE_CU(cuMemAllocHost(&h, 4096));
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)h;
    CHECK_CU(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, p + 8));
    CHECK_TRUE(type == MEMORYTYPE_HOST);
    CHECK_CU(cuPointerGetAttribute(&host, POINTER_ATTRIBUTE_HOST_POINTER, p + 8));
    CHECK_TRUE(host == (char *)h + 8);
    CHECK_CU(cuPointerGetAttribute(&start, POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 8));
    CHECK_TRUE(start == p);
    CHECK_CU(cuPointerGetAttribute(&range, POINTER_ATTRIBUTE_RANGE_SIZE, p));
    CHECK_TRUE(range == 4096);
    CHECK_CU(cuPointerGetAttribute(&owner, POINTER_ATTRIBUTE_CONTEXT, p));
    CHECK_TRUE(owner == ctx);

    /* Memory CUDA never saw: an error alone, zeros in a list. */
    CHECK_RC(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, foreign),
             CUDA_ERROR_INVALID_VALUE);
    {
        int attributes[3] = {POINTER_ATTRIBUTE_MEMORY_TYPE, POINTER_ATTRIBUTE_DEVICE_POINTER,
                             POINTER_ATTRIBUTE_IS_MANAGED};
        CUdeviceptr dptr = 1;
        unsigned char managed = 1;
        void *data[3] = {&type, &dptr, &managed};
        type = 9;
        CHECK_CU(cuPointerGetAttributes(3, attributes, data, foreign));
        CHECK_TRUE(type == 0 && dptr == 0 && managed == 0);
    }
    CHECK_CU(cuMemFreeHost(h));
    CHECK_RC(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, p),
             CUDA_ERROR_INVALID_VALUE);

    /* Memory the application registered: host memory of the device (XLA
     * asks a registered buffer's device ordinal). */
    {
        char *mine = aligned_alloc(4096, 8192);
        CUdeviceptr inside = (CUdeviceptr)(uintptr_t)(mine + 100);
        int ordinal = -1;
        if (!mine) return 1;
        REQUIRE_CU(cuMemHostRegister_v2(mine, 8192, 0));
        CHECK_CU(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, inside));
        CHECK_TRUE(type == MEMORYTYPE_HOST);
        CHECK_CU(cuPointerGetAttribute(&ordinal, POINTER_ATTRIBUTE_DEVICE_ORDINAL, inside));
        CHECK_TRUE(ordinal == 0);
        CHECK_CU(cuMemHostUnregister(mine));
        CHECK_RC(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, inside),
                 CUDA_ERROR_INVALID_VALUE);
        free(mine);
    }
    return 0;
}

/* Mapped page-locked memory (cuMemHostGetDevicePointer, XLA's and
 * zero-copy code's): its device address answers pointer queries like the
 * host address; with `run_kernel`, a kernel scales it in place and the
 * host reads the result without a copy (not in sim, whose kernels do not
 * reach host memory). */
static int mapped_host_memory(CUfunction scale, int run_kernel) {
    unsigned n = 1024;
    float factor = 3.0f, *h = NULL;
    CUdeviceptr dh = 0, other = 0, dptr = 0;
    void *host = NULL;
    unsigned int type = 0;
    int ordinal = -1, wrong = 0, can_map = -1, unified = -1;
    CHECK_CU(cuDeviceGetAttribute(&can_map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0));
    CHECK_CU(cuDeviceGetAttribute(&unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
    CHECK_EQ_INT(can_map, 1);
    CHECK_EQ_INT(unified, 1);
    REQUIRE_CU(cuMemHostAlloc((void **)&h, n * sizeof(float), 0x02 /* DEVICEMAP */));
    for (unsigned i = 0; i < n; i++) h[i] = (float)i;
    CHECK_CU(cuMemHostGetDevicePointer_v2(&dh, h, 0));
    CHECK_TRUE(dh != 0);
    CHECK_RC(cuMemHostGetDevicePointer_v2(&other, h, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuPointerGetAttribute(&dptr, POINTER_ATTRIBUTE_DEVICE_POINTER,
                                   (CUdeviceptr)(uintptr_t)(h + 8)));
    CHECK_TRUE(dptr == dh + 8 * sizeof(float));
    CHECK_CU(cuPointerGetAttribute(&ordinal, POINTER_ATTRIBUTE_DEVICE_ORDINAL, dh + 32));
    CHECK_TRUE(ordinal == 0);
    CHECK_CU(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, dh + 32));
    CHECK_TRUE(type == MEMORYTYPE_HOST);
    CHECK_CU(cuPointerGetAttribute(&host, POINTER_ATTRIBUTE_HOST_POINTER, dh + 32));
    CHECK_TRUE(host == (void *)(h + 8));
    if (run_kernel) {
        void *params[] = {&dh, &factor, &n};
        CHECK_CU(cuLaunchKernel(scale, n / 128, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
        CHECK_CU(cuCtxSynchronize());
        for (unsigned i = 0; i < n; i++) wrong += h[i] != 3.0f * (float)i;
        CHECK_EQ_INT(wrong, 0);
    }
    CHECK_CU(cuMemFreeHost(h));
    return 0;
}

/* Unified addressing of page-locked memory (XLA's redzone checker,
 * comparator and while-loop predicates): a cuMemHostAlloc pointer is
 * itself the device address. Memsets and copies name it as device memory;
 * with `run_kernel`, a kernel is given the host pointer itself. */
static int unified_host_memory(CUfunction scale, int run_kernel) {
    unsigned n = 1024, wrong = 0;
    float factor = 2.0f, *h = NULL, back[16];
    CUdeviceptr dh = 0, d = 0;
    CUstream stream = NULL;
    REQUIRE_CU(cuMemHostAlloc((void **)&h, n * sizeof(float), 0x01 /* PORTABLE */));
    CHECK_CU(cuMemHostGetDevicePointer_v2(&dh, h, 0));
    CHECK_TRUE(dh == (CUdeviceptr)(uintptr_t)h);
    REQUIRE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    for (unsigned i = 0; i < n; i++) h[i] = -1.0f;
    CHECK_CU(cuMemsetD32Async((CUdeviceptr)(uintptr_t)h, 0, n / 2, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    for (unsigned i = 0; i < n; i++) wrong += h[i] != (i < n / 2 ? 0.0f : -1.0f);
    CHECK_EQ_INT(wrong, 0);
    for (unsigned i = 0; i < n; i++) h[i] = (float)i;
    REQUIRE_CU(cuMemAlloc(&d, n * sizeof(float)));
    CHECK_CU(cuMemcpyDtoD(d, (CUdeviceptr)(uintptr_t)(h + 16), 16 * sizeof(float)));
    CHECK_CU(cuMemcpyDtoH(back, d, sizeof back));
    wrong = 0;
    for (unsigned i = 0; i < 16; i++) wrong += back[i] != (float)(16 + i);
    CHECK_EQ_INT(wrong, 0);
    CHECK_CU(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)(h + 100), sizeof back));
    wrong = 0;
    for (unsigned i = 0; i < 16; i++) wrong += back[i] != (float)(100 + i);
    CHECK_EQ_INT(wrong, 0);
    if (run_kernel) {
        CUdeviceptr as_device = (CUdeviceptr)(uintptr_t)h;
        void *params[] = {&as_device, &factor, &n};
        CHECK_CU(cuLaunchKernel(scale, n / 128, 1, 1, 128, 1, 1, 0, stream, params, NULL));
        CHECK_CU(cuStreamSynchronize(stream));
        wrong = 0;
        for (unsigned i = 0; i < n; i++) wrong += h[i] != 2.0f * (float)i;
        CHECK_EQ_INT(wrong, 0);
    }
    CHECK_CU(cuMemFree(d));
    CHECK_CU(cuStreamDestroy(stream));
    CHECK_CU(cuMemFreeHost(h));
    /* Freed: no longer device memory of this process. */
    CHECK_RC(cuMemsetD32Async(dh, 0, 1, NULL), CUDA_ERROR_INVALID_VALUE);
    return 0;
}

/* Over the network carrier, page-locked memory is the process's own: XLA
 * still zeroes its timers' page-locked flags with a memset naming them as
 * device memory and copies them so, which the process does itself,
 * asynchronous or not; a memset running past the allocation is refused. */
static int process_only_host_memory(void) {
    unsigned n = 1024, wrong = 0;
    unsigned *h = NULL;
    CUstream stream = NULL;
    int can_map = -1, unified = -1;
    /* The remote GPU says it cannot reach this process's memory, so XLA
     * skips its timing kernel, which spins on a page-locked flag. */
    CHECK_CU(cuDeviceGetAttribute(&can_map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0));
    CHECK_CU(cuDeviceGetAttribute(&unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
    CHECK_EQ_INT(can_map, 0);
    CHECK_EQ_INT(unified, 0);
    REQUIRE_CU(cuMemHostAlloc((void **)&h, n * sizeof(unsigned), 0x01 /* PORTABLE */));
    REQUIRE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr as_device = (CUdeviceptr)(uintptr_t)h;
    for (unsigned i = 0; i < n; i++) h[i] = 0xffffffffu;
    CHECK_CU(cuMemsetD32Async(as_device, 0x01020304u, n / 2, stream));
    CHECK_CU(cuMemsetD8(as_device + 4 * (n / 2), 0x5a, 8));
    CHECK_CU(cuMemsetD16Async(as_device + 4 * (n - 1), 0x7788, 2, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    for (unsigned i = 0; i < n / 2; i++) wrong += h[i] != 0x01020304u;
    wrong += h[n / 2] != 0x5a5a5a5au || h[n / 2 + 1] != 0x5a5a5a5au;
    for (unsigned i = n / 2 + 2; i < n - 1; i++) wrong += h[i] != 0xffffffffu;
    wrong += h[n - 1] != 0x77887788u;
    CHECK_EQ_INT(wrong, 0);
    CHECK_RC(cuMemsetD32(as_device + 4 * (n - 1), 0, 2), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_TRUE(h[n - 1] == 0x77887788u);
    /* Copies naming it as device memory copy the program's own bytes: up
     * to the device, down into it, and within it. */
    CUdeviceptr d = 0;
    unsigned back[4] = {0, 0, 0, 0};
    REQUIRE_CU(cuMemAlloc(&d, 16));
    CHECK_CU(cuMemcpyDtoD(d, as_device, 16));
    CHECK_CU(cuMemcpyDtoH(back, d, 16));
    CHECK_TRUE(back[0] == 0x01020304u && back[3] == 0x01020304u);
    back[0] = 0xabcdef01u;
    CHECK_CU(cuMemcpyHtoD(as_device + 16, back, 4));
    CHECK_TRUE(h[4] == 0xabcdef01u);
    CHECK_CU(cuMemsetD32(d, 9, 4));
    CHECK_CU(cuMemcpyDtoDAsync(as_device + 20, d, 4, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_TRUE(h[5] == 9);
    CHECK_CU(cuMemcpyDtoH(back, as_device + 16, 8));
    CHECK_TRUE(back[0] == 0xabcdef01u && back[1] == 9);
    CHECK_CU(cuMemFree(d));
    CHECK_CU(cuStreamDestroy(stream));
    CHECK_CU(cuMemFreeHost(h));
    return 0;
}

/* Tensor maps (XLA's and Triton's Hopper kernels): encoded, refused where
 * the driver documents a refusal, and the address replaced as a fresh
 * encoding would put it. */
typedef struct {
    _Alignas(64) unsigned long long opaque[16];
} TensorMap;
CUresult cuTensorMapEncodeTiled(TensorMap *map, int data_type, unsigned rank, void *address,
                                const unsigned long long *dims, const unsigned long long *strides,
                                const unsigned *box, const unsigned *element_strides,
                                int interleave, int swizzle, int l2, int oob);
CUresult cuTensorMapReplaceAddress(TensorMap *map, void *address);
#define TENSOR_MAP_FLOAT32 7

static CUresult tiled(TensorMap *map, CUdeviceptr at, unsigned rank, unsigned box_edge) {
    unsigned long long dims[2] = {64, 64}, strides[1] = {64 * sizeof(float)};
    unsigned box[2] = {box_edge, box_edge}, element_strides[2] = {1, 1};
    return cuTensorMapEncodeTiled(map, TENSOR_MAP_FLOAT32, rank, (void *)(uintptr_t)at, dims,
                                  strides, box, element_strides, 0, 0, 0, 0);
}

static int tensor_maps(void) {
    CUdeviceptr d = 0;
    TensorMap first, again, moved, replaced;
    REQUIRE_CU(cuMemAlloc(&d, 64 * 64 * sizeof(float)));
    CHECK_CU(tiled(&first, d, 2, 16));
    CHECK_CU(tiled(&again, d, 2, 16));
    CHECK_TRUE(memcmp(&first, &again, sizeof first) == 0);
    CHECK_CU(tiled(&moved, d + 256, 2, 16));
    CHECK_TRUE(memcmp(&first, &moved, sizeof first) != 0);
    replaced = first;
    CHECK_CU(cuTensorMapReplaceAddress(&replaced, (void *)(uintptr_t)(d + 256)));
    CHECK_TRUE(memcmp(&replaced, &moved, sizeof moved) == 0);
    CHECK_RC(tiled(&again, d + 4, 2, 16), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(tiled(&again, d, 2, 512), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(tiled(&again, d, 0, 16), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(tiled(&again, d, 6, 16), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemFree(d));
    return 0;
}

/* cuModuleLoad: an image by path (Triton's and Inductor's launchers). */
static int module_from_file(const char *path) {
    CUmodule from_file = NULL;
    CUfunction empty = NULL;
    REQUIRE_CU(cuModuleLoad(&from_file, path));
    CHECK_CU(cuModuleGetFunction(&empty, from_file, "rgpu_empty"));
    CHECK_CU(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(cuModuleUnload(from_file));
    CHECK_RC(cuModuleLoad(&from_file, "/nonexistent/rgpu-module.ptx"), CUDA_ERROR_FILE_NOT_FOUND);
    return 0;
}

static int streams_and_contexts(CUcontext ctx, CUdevice device) {
    CUstream s1 = NULL, s2 = NULL;
    CUevent event = NULL;
    CUcontext owner = NULL;
    int status = -1, peer = -1;
    unsigned long long id1 = 0, id2 = 0, ctx_id = 0, capture_id = 7;
    size_t count = 9;

    REQUIRE_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    REQUIRE_CU(cuStreamCreate(&s2, CU_STREAM_DEFAULT));
    CHECK_CU(cuStreamIsCapturing(s1, &status));
    CHECK_TRUE(status == STREAM_CAPTURE_STATUS_NONE);
    status = -1;
    CHECK_CU(cuStreamIsCapturing(NULL, &status));
    CHECK_TRUE(status == STREAM_CAPTURE_STATUS_NONE);
    status = -1;
    CHECK_CU(cuStreamGetCaptureInfo_v2(s2, &status, &capture_id, NULL, NULL, &count));
    CHECK_TRUE(status == STREAM_CAPTURE_STATUS_NONE);
    CHECK_CU(cuStreamGetCtx(s1, &owner));
    CHECK_TRUE(owner == ctx);
    CHECK_CU(cuStreamGetId(s1, &id1));
    CHECK_CU(cuStreamGetId(s2, &id2));
    CHECK_TRUE(id1 != id2);
    CHECK_CU(cuCtxGetId(NULL, &ctx_id));
    CHECK_TRUE(ctx_id != 0);
    REQUIRE_CU(cuEventCreate(&event, CU_EVENT_DEFAULT));
    CHECK_CU(cuEventRecordWithFlags(event, s1, 0));
    CHECK_CU(cuEventSynchronize(event));
    CHECK_RC(cuEventRecordWithFlags(event, s1, 0x80), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuDeviceCanAccessPeer(&peer, device, device));
    CHECK_TRUE(peer == 0);
    CHECK_CU(cuCtxResetPersistingL2Cache());
    CHECK_CU(cuEventDestroy(event));
    CHECK_CU(cuStreamDestroy(s1));
    CHECK_CU(cuStreamDestroy(s2));
    return 0;
}

static size_t quarter_kib_per_thread(int block_size) { return (size_t)block_size * 256; }

static int occupancy_and_attributes(CUfunction add, CUfunction empty, CUdevice device,
                                    int require_clusters) {
    int blocks = -1, again = -1, threads_per_sm = 0, optin = 0, min_grid = 0, block = 0;
    int sms = 0, value = 0;
    size_t available = 0;
    const int big = 64 * 1024;

    REQUIRE_CU(cuDeviceGetAttribute(&threads_per_sm, DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                                    device));
    REQUIRE_CU(cuDeviceGetAttribute(&optin, DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                    device));
    REQUIRE_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));

    CHECK_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, empty, 256, 0));
    CHECK_TRUE(blocks > 0 && blocks * 256 <= threads_per_sm);
    CHECK_CU(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&again, empty, 256, 0, 0));
    CHECK_TRUE(again == blocks);
    CHECK_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, empty, 1024, 0));
    CHECK_TRUE(blocks >= 1 && blocks * 1024 <= threads_per_sm);
    CHECK_CU(cuOccupancyAvailableDynamicSMemPerBlock(&available, empty, 1, 128));
    CHECK_TRUE(available > 0 && available <= (size_t)optin);

    CHECK_CU(cuOccupancyMaxPotentialBlockSize(&min_grid, &block, empty, NULL, 0, 0));
    CHECK_TRUE(block > 0 && block <= 1024 && block % 32 == 0);
    CHECK_TRUE(min_grid > 0 && min_grid % sms == 0);
    CHECK_CU(cuOccupancyMaxPotentialBlockSize(&min_grid, &block, empty, quarter_kib_per_thread,
                                              0, 128));
    CHECK_TRUE(block > 0 && block <= 128);

    /* 64 KiB of dynamic shared memory needs the function attribute. */
    CHECK_CU(cuFuncSetAttribute(add, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, big));
    CHECK_CU(cuFuncGetAttribute(&value, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, add));
    CHECK_TRUE(value == big);
    CHECK_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add, 128, (size_t)big));
    CHECK_TRUE(blocks > 0 && (long)blocks * big <= 240 * 1024);
    CHECK_RC(cuFuncSetAttribute(add, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin + 1),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuFuncSetAttribute(add, FUNC_ATTRIBUTE_NUM_REGS, 32), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuFuncGetAttribute(&value, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, add));
    CHECK_TRUE(value == big);
    /* PyTorch's pattern, every training step: set a kernel's dynamic shared
     * memory, then read its attributes. A set changes none of the others
     * (through rgpu they stay cached: tests/tests/framework_queries.rs
     * counts the round trips). */
    {
        int regs = -1, threads = -1, regs_now = -1, threads_now = -1;
        CHECK_CU(cuFuncGetAttribute(&regs, FUNC_ATTRIBUTE_NUM_REGS, add));
        CHECK_CU(cuFuncGetAttribute(&threads, FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, add));
        for (int step = 0; step < ATTRIBUTE_STEPS; step++) {
            const int size = step % 2 ? big : big / 2;
            CHECK_CU(cuFuncSetAttribute(add, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, size));
            CHECK_CU(cuFuncGetAttribute(&value, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, add));
            CHECK_TRUE(value == size);
            CHECK_CU(cuFuncGetAttribute(&regs_now, FUNC_ATTRIBUTE_NUM_REGS, add));
            CHECK_CU(cuFuncGetAttribute(&threads_now, FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, add));
            CHECK_TRUE(regs_now == regs && threads_now == threads);
        }
        CHECK_CU(cuFuncSetAttribute(add, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, big));
    }
    CHECK_CU(cuFuncSetCacheConfig(add, FUNC_CACHE_PREFER_L1));
    /* Refused values left nothing sticky behind. */
    CHECK_CU(cuCtxSynchronize());

    {
        LaunchAttribute cluster;
        LaunchConfig config;
        int clusters = -1;
        CUresult rc;
        memset(&cluster, 0, sizeof cluster);
        memset(&config, 0, sizeof config);
        cluster.id = LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        cluster.value.dims[0] = 2;
        cluster.value.dims[1] = 1;
        cluster.value.dims[2] = 1;
        config.grid_x = 16;
        config.grid_y = config.grid_z = 1;
        config.block_x = 128;
        config.block_y = config.block_z = 1;
        config.attrs = &cluster;
        config.num_attrs = 1;
        rc = cuOccupancyMaxActiveClusters(&clusters, empty, &config);
        if (rc == CUDA_SUCCESS) {
            CHECK_TRUE(clusters > 0);
        } else if (require_clusters) {
            CHECK_CU(rc);
        } else {
            printf("note: cuOccupancyMaxActiveClusters: %d (%s)\n", rc, error_name(rc));
        }
        /* The largest cluster the kernel can launch with: the portable 8
         * (more only where the function allows non-portable sizes). */
        int size = -1;
        rc = cuOccupancyMaxPotentialClusterSize(&size, empty, &config);
        if (rc == CUDA_SUCCESS) {
            CHECK_TRUE(size >= 1 && size <= 16);
        } else if (require_clusters) {
            CHECK_CU(rc);
        } else {
            printf("note: cuOccupancyMaxPotentialClusterSize: %d (%s)\n", rc, error_name(rc));
        }
    }
    return 0;
}

/* The launch that needs the attribute set above: c = a + b with 64 KiB of
 * dynamic shared memory. */
static int launch_with_big_shared_memory(CUfunction add) {
    enum { N = 1000 };
    float a[N], b[N], c[N];
    CUdeviceptr da = 0, db = 0, dc = 0;
    unsigned int n = N;
    void *params[4] = {&da, &db, &dc, &n};
    int i, wrong = 0;
    for (i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 0.5f;
    }
    REQUIRE_CU(cuMemAlloc(&da, sizeof a));
    REQUIRE_CU(cuMemAlloc(&db, sizeof b));
    REQUIRE_CU(cuMemAlloc(&dc, sizeof c));
    CHECK_CU(cuMemcpyHtoD(da, a, sizeof a));
    CHECK_CU(cuMemcpyHtoD(db, b, sizeof b));
    CHECK_CU(cuLaunchKernel(add, (N + 127) / 128, 1, 1, 128, 1, 1, 64 * 1024, NULL, params, NULL));
    CHECK_CU(cuMemcpyDtoH(c, dc, sizeof c));
    for (i = 0; i < N; i++) wrong += c[i] != (float)i + 0.5f;
    CHECK_TRUE(wrong == 0);
    CHECK_CU(cuMemFree(da));
    CHECK_CU(cuMemFree(db));
    CHECK_CU(cuMemFree(dc));
    return 0;
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                                   unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                                   unsigned int block_z, unsigned int shared_mem_bytes,
                                   CUstream stream, void **params);

/* cuLaunchKernelEx in thread-block clusters of 2 and cooperatively (what
 * cuDNN's Hopper kernels ask for), and cuLaunchCooperativeKernel: the
 * kernel runs as launched. */
static int launch_in_clusters_and_cooperatively(CUfunction add) {
    enum { N = 1024 };
    float a[N], b[N], c[N];
    CUdeviceptr da = 0, db = 0, dc = 0;
    unsigned int n = N;
    void *params[4] = {&da, &db, &dc, &n};
    int i;
    for (i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 2.0f;
    }
    REQUIRE_CU(cuMemAlloc(&da, sizeof a));
    REQUIRE_CU(cuMemAlloc(&db, sizeof b));
    REQUIRE_CU(cuMemAlloc(&dc, sizeof c));
    CHECK_CU(cuMemcpyHtoD(da, a, sizeof a));
    CHECK_CU(cuMemcpyHtoD(db, b, sizeof b));
    LaunchAttribute cluster, cooperative;
    LaunchConfig config;
    memset(&cluster, 0, sizeof cluster);
    memset(&cooperative, 0, sizeof cooperative);
    memset(&config, 0, sizeof config);
    cluster.id = LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.dims[0] = 2;
    cluster.value.dims[1] = 1;
    cluster.value.dims[2] = 1;
    cooperative.id = LAUNCH_ATTRIBUTE_COOPERATIVE;
    cooperative.value.dims[0] = 1;
    config.grid_x = N / 128;
    config.grid_y = config.grid_z = 1;
    config.block_x = 128;
    config.block_y = config.block_z = 1;
    config.attrs = &cluster;
    config.num_attrs = 1;
    for (int round = 0; round < 3; round++) {
        int wrong = 0;
        CHECK_CU(cuMemsetD32(dc, 0, N));
        if (round < 2) {
            CHECK_CU(cuLaunchKernelEx(&config, add, params, NULL));
        } else {
            CHECK_CU(cuLaunchCooperativeKernel(add, N / 128, 1, 1, 128, 1, 1, 0, NULL, params));
        }
        CHECK_CU(cuMemcpyDtoH(c, dc, sizeof c));
        for (i = 0; i < N; i++) wrong += c[i] != (float)i + 2.0f;
        CHECK_TRUE(wrong == 0);
        config.attrs = &cooperative;
    }
    CHECK_CU(cuMemFree(da));
    CHECK_CU(cuMemFree(db));
    CHECK_CU(cuMemFree(dc));
    return 0;
}

static int cache_configuration(void) {
    int config = -1;
    CHECK_CU(cuCtxSetCacheConfig(FUNC_CACHE_PREFER_SHARED));
    CHECK_CU(cuCtxGetCacheConfig(&config));
    CHECK_TRUE(config == FUNC_CACHE_PREFER_SHARED);
    CHECK_CU(cuCtxSetCacheConfig(FUNC_CACHE_PREFER_L1));
    CHECK_CU(cuCtxGetCacheConfig(&config));
    CHECK_TRUE(config == FUNC_CACHE_PREFER_L1);
    CHECK_RC(cuCtxSetCacheConfig(7), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuCtxGetSharedMemConfig(&config));
    CHECK_TRUE(config >= 0 && config <= 2);
    return 0;
}

int main(int argc, char **argv) {
    const char *image_path = NULL;
    int require_clusters = 0, mapped_host = 0, mapped_kernel = 0, process_only_host = 0, i;
    char *image;
    CUdevice device = 0;
    CUcontext ctx = NULL;
    CUmodule module = NULL;
    CUfunction add = NULL, empty = NULL, scale = NULL;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--image") == 0 && i + 1 < argc) {
            image_path = argv[++i];
        } else if (strcmp(argv[i], "--require-clusters") == 0) {
            require_clusters = 1;
        } else if (strcmp(argv[i], "--mapped-host") == 0) {
            mapped_host = 1;
        } else if (strcmp(argv[i], "--mapped-kernel") == 0) {
            mapped_host = mapped_kernel = 1;
        } else if (strcmp(argv[i], "--process-only-host") == 0) {
            process_only_host = 1;
        } else {
            fprintf(stderr,
                    "usage: %s --image PATH [--require-clusters] [--mapped-host] "
                    "[--mapped-kernel] [--process-only-host]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!image_path || !(image = read_file(image_path))) {
        fprintf(stderr, "cannot read the module image\n");
        return 2;
    }

    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuModuleLoadData(&module, image) != CUDA_SUCCESS ||
        cuModuleGetFunction(&add, module, "rgpu_vector_add") != CUDA_SUCCESS ||
        cuModuleGetFunction(&empty, module, "rgpu_empty") != CUDA_SUCCESS ||
        cuModuleGetFunction(&scale, module, "rgpu_scale") != CUDA_SUCCESS) {
        printf("FAIL: setting up a context and the module\n");
        return 1;
    }

    device_memory(ctx);
    pinned_and_foreign_memory(ctx);
    module_from_file(image_path);
    tensor_maps();
    /* Not over the network carrier, where page-locked memory is the
     * process's own and the host's GPU cannot see it. */
    if (mapped_host) mapped_host_memory(scale, mapped_kernel);
    if (mapped_host) unified_host_memory(scale, mapped_kernel);
    if (process_only_host) process_only_host_memory();
    streams_and_contexts(ctx, device);
    occupancy_and_attributes(add, empty, device, require_clusters);
    launch_with_big_shared_memory(add);
    launch_in_clusters_and_cooperatively(add);
    cache_configuration();

    CHECK_CU(cuModuleUnload(module));
    CHECK_CU(cuDevicePrimaryCtxRelease(device));
    free(image);
    if (checks_failed) {
        printf("framework_queries_test: %ld of %ld checks failed\n", checks_failed,
               checks_failed + checks_passed);
        return 1;
    }
    printf("framework_queries_test: %ld checks passed\n", checks_passed);
    return 0;
}
