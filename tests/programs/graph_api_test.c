/* graph_api_test: CUDA graphs built node by node (issue 10), the explicit
 * graph API.
 *
 * Usage: graph_api_test --ptx reference_kernels.ptx
 *
 * A graph: a memset node (the index buffer to 0x22222222) -> a kernel node
 * (rgpu_fill_index over it) -> a memcpy node (device to device, into a
 * second buffer) -> an event record node -> an empty node -> a child graph
 * node (a memset of a third buffer to 5). cuGraphGetNodes and
 * cuGraphNodeGetType see the six nodes; instantiated and launched three
 * times, the copy holds base + i and the third buffer 5; a clone, launched
 * after the buffers were cleared, does the same. Misuse: a node of another
 * graph as a dependency is refused; through rgpu, a destroyed graph takes
 * no node and no instantiation, and a memcpy node from host memory is
 * CUDA_ERROR_NOT_SUPPORTED; last, a kernel node whose pointer argument is
 * no memory of this process makes the graph's launch fail as a launch of
 * a forged pointer does (CUDA_ERROR_ILLEGAL_ADDRESS, at the launch or the
 * synchronisation after it).
 *
 * Prints "graph_api_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"

#define CUDA_ERROR_NOT_SUPPORTED 801

typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;

typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;
    CUcontext ctx;
} KernelNodeParams;

typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
} MemsetNodeParams;

typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} Memcpy3D;

#define MEMORYTYPE_HOST 1
#define MEMORYTYPE_DEVICE 2
#define NODE_TYPE_KERNEL 0
#define NODE_TYPE_MEMCPY 1
#define NODE_TYPE_MEMSET 2
#define NODE_TYPE_GRAPH 4
#define NODE_TYPE_EMPTY 5
#define NODE_TYPE_EVENT_RECORD 7

CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphClone(CUgraph *clone, CUgraph original);
CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                 size_t n, const KernelNodeParams *params);
CUresult cuGraphAddMemsetNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                              const MemsetNodeParams *params, CUcontext ctx);
CUresult cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                              const Memcpy3D *params, CUcontext ctx);
CUresult cuGraphAddEventRecordNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                   size_t n, CUevent event);
CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  size_t n, CUgraph child);
CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);
CUresult cuGraphNodeGetType(CUgraphNode node, int *type);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);

#define N 4096u

static CUcontext ctx;

static MemsetNodeParams memset32(CUdeviceptr dst, unsigned value) {
    MemsetNodeParams p = {dst, N * 4, value, 4, N, 1};
    return p;
}

static Memcpy3D copy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    Memcpy3D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = MEMORYTYPE_DEVICE;
    p.srcDevice = src;
    p.dstMemoryType = MEMORYTYPE_DEVICE;
    p.dstDevice = dst;
    p.WidthInBytes = bytes;
    p.Height = 1;
    p.Depth = 1;
    return p;
}

static KernelNodeParams fill_index_node(CUfunction f, void **params) {
    KernelNodeParams p;
    memset(&p, 0, sizeof p);
    p.func = f;
    p.gridDimX = N / 128;
    p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 128;
    p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = params;
    return p;
}

/* Counts buffer words not equal to base + i (or to `value`, if `fixed`). */
static int mismatches(CUdeviceptr d, unsigned base, int fixed) {
    static uint32_t host[N];
    if (cuMemcpyDtoH(host, d, N * 4) != CUDA_SUCCESS) return -1;
    int wrong = 0;
    for (unsigned i = 0; i < N; i++) wrong += host[i] != (fixed ? base : base + i);
    return wrong;
}

int main(int argc, char **argv) {
    const char *ptx_path = argc == 3 && !strcmp(argv[1], "--ptx") ? argv[2] : NULL;
    char *ptx = ptx_path ? read_file(ptx_path) : NULL;
    int through_rgpu = getenv("RGPU_SOCKET") != NULL;
    CUdevice dev;
    CUmodule module;
    CUfunction fill_index;
    if (!ptx || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, ptx) ||
        cuModuleGetFunction(&fill_index, module, "rgpu_fill_index")) {
        printf("FAIL: no CUDA context or kernels (usage: graph_api_test --ptx PTX)\n");
        return 1;
    }
    CUdeviceptr d_index = 0, d_copy = 0, d_child = 0;
    CUstream stream;
    CUevent event;
    REQUIRE_CU(cuMemAlloc(&d_index, N * 4));
    REQUIRE_CU(cuMemAlloc(&d_copy, N * 4));
    REQUIRE_CU(cuMemAlloc(&d_child, N * 4));
    REQUIRE_CU(cuMemsetD32(d_copy, 0xffffffffu, N));
    REQUIRE_CU(cuMemsetD32(d_child, 0, N));
    REQUIRE_CU(cuStreamCreate(&stream, 0));
    REQUIRE_CU(cuEventCreate(&event, 0));

    /* The child: one memset node. */
    CUgraph child = NULL, graph = NULL;
    CUgraphNode child_memset = NULL;
    MemsetNodeParams child_params = memset32(d_child, 5);
    CHECK_CU(cuGraphCreate(&child, 0));
    CHECK_CU(cuGraphAddMemsetNode(&child_memset, child, NULL, 0, &child_params, ctx));

    /* memset -> kernel -> memcpy -> event record -> empty -> child. */
    unsigned base = 1000, count = N;
    void *fill_params[] = {&d_index, &base, &count};
    MemsetNodeParams set = memset32(d_index, 0x22222222u);
    KernelNodeParams kernel = fill_index_node(fill_index, fill_params);
    Memcpy3D copy = copy_dtod(d_copy, d_index, N * 4);
    CUgraphNode n_memset = NULL, n_kernel = NULL, n_copy = NULL, n_record = NULL, n_empty = NULL,
                n_child = NULL;
    CHECK_CU(cuGraphCreate(&graph, 0));
    CHECK_CU(cuGraphAddMemsetNode(&n_memset, graph, NULL, 0, &set, ctx));
    CHECK_CU(cuGraphAddKernelNode_v2(&n_kernel, graph, &n_memset, 1, &kernel));
    CHECK_CU(cuGraphAddMemcpyNode(&n_copy, graph, &n_kernel, 1, &copy, ctx));
    CHECK_CU(cuGraphAddEventRecordNode(&n_record, graph, &n_copy, 1, event));
    CHECK_CU(cuGraphAddEmptyNode(&n_empty, graph, &n_record, 1));
    CUgraphNode before_child[] = {n_empty, n_kernel};
    CHECK_CU(cuGraphAddChildGraphNode(&n_child, graph, before_child, 2, child));
    /* Nothing ran yet. */
    CHECK_EQ_INT(mismatches(d_copy, 0xffffffffu, 1), 0);

    size_t nodes = 0;
    CHECK_CU(cuGraphGetNodes(graph, NULL, &nodes));
    CHECK_EQ_INT((int)nodes, 6);
    int type = -1;
    CHECK_CU(cuGraphNodeGetType(n_kernel, &type));
    CHECK_EQ_INT(type, NODE_TYPE_KERNEL);
    CHECK_CU(cuGraphNodeGetType(n_copy, &type));
    CHECK_EQ_INT(type, NODE_TYPE_MEMCPY);
    CHECK_CU(cuGraphNodeGetType(n_memset, &type));
    CHECK_EQ_INT(type, NODE_TYPE_MEMSET);
    CHECK_CU(cuGraphNodeGetType(n_record, &type));
    CHECK_EQ_INT(type, NODE_TYPE_EVENT_RECORD);
    CHECK_CU(cuGraphNodeGetType(n_empty, &type));
    CHECK_EQ_INT(type, NODE_TYPE_EMPTY);
    CHECK_CU(cuGraphNodeGetType(n_child, &type));
    CHECK_EQ_INT(type, NODE_TYPE_GRAPH);

    CUgraphExec exec = NULL;
    CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
    for (int i = 0; i < 3; i++) CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuEventQuery(event));
    CHECK_EQ_INT(mismatches(d_index, base, 0), 0);
    CHECK_EQ_INT(mismatches(d_copy, base, 0), 0);
    CHECK_EQ_INT(mismatches(d_child, 5, 1), 0);

    /* A clone does the same. */
    CUgraph clone = NULL;
    CUgraphExec clone_exec = NULL;
    CHECK_CU(cuGraphClone(&clone, graph));
    CHECK_CU(cuGraphGetNodes(clone, NULL, &nodes));
    CHECK_EQ_INT((int)nodes, 6);
    CHECK_CU(cuMemsetD32(d_copy, 0, N));
    CHECK_CU(cuMemsetD32(d_child, 0, N));
    CHECK_CU(cuGraphInstantiateWithFlags(&clone_exec, clone, 0));
    CHECK_CU(cuGraphLaunch(clone_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_copy, base, 0), 0);
    CHECK_EQ_INT(mismatches(d_child, 5, 1), 0);

    /* A node of another graph is no dependency. */
    CUgraph other = NULL;
    CUgraphNode n_other = NULL;
    CHECK_CU(cuGraphCreate(&other, 0));
    CHECK_CU_FAILS(cuGraphAddEmptyNode(&n_other, other, &n_kernel, 1));
    CHECK_CU(cuGraphAddEmptyNode(&n_other, other, NULL, 0));
    CHECK_CU_FAILS(cuGraphAddEmptyNode(&n_other, graph, &n_other, 1));
    if (through_rgpu) {
        /* Natively these are undefined: a destroyed graph, host memory. */
        static uint32_t host[N];
        Memcpy3D from_host = copy_dtod(d_copy, 0, N * 4);
        from_host.srcMemoryType = MEMORYTYPE_HOST;
        from_host.srcHost = host;
        CHECK_RC(cuGraphAddMemcpyNode(&n_other, other, NULL, 0, &from_host, ctx),
                 CUDA_ERROR_NOT_SUPPORTED);
        CHECK_CU(cuGraphDestroy(other));
        CHECK_CU_FAILS(cuGraphAddEmptyNode(&n_other, other, NULL, 0));
        CUgraphExec never = NULL;
        CHECK_CU_FAILS(cuGraphInstantiateWithFlags(&never, other, 0));
    } else {
        CHECK_CU(cuGraphDestroy(other));
    }

    CHECK_CU(cuGraphExecDestroy(clone_exec));
    CHECK_CU(cuGraphExecDestroy(exec));
    CHECK_CU(cuGraphDestroy(clone));
    CHECK_CU(cuGraphDestroy(graph));
    CHECK_CU(cuGraphDestroy(child));

    /* Last (the fault may end the context): a kernel node whose pointer
     * argument is no memory of this process. */
    CUdeviceptr forged = d_index + (1ull << 36);
    void *forged_params[] = {&forged, &base, &count};
    KernelNodeParams forged_kernel = fill_index_node(fill_index, forged_params);
    CUgraph bad = NULL;
    CUgraphNode n_bad = NULL;
    CUgraphExec bad_exec = NULL;
    CHECK_CU(cuGraphCreate(&bad, 0));
    CHECK_CU(cuGraphAddKernelNode_v2(&n_bad, bad, NULL, 0, &forged_kernel));
    CHECK_CU(cuGraphInstantiateWithFlags(&bad_exec, bad, 0));
    CUresult launched = cuGraphLaunch(bad_exec, stream);
    CUresult synced = cuStreamSynchronize(stream);
    printf("forged kernel node: launch rc %d, synchronize rc %d\n", launched, synced);
    CHECK_TRUE(launched == CUDA_ERROR_ILLEGAL_ADDRESS ||
               (launched == CUDA_SUCCESS && synced == CUDA_ERROR_ILLEGAL_ADDRESS));

    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) return 1;
    printf("graph_api_test: %ld checks passed\n", checks_passed);
    return 0;
}
