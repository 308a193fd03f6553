/* graph_api_test: CUDA graphs built node by node (issue 10), the explicit
 * graph API.
 *
 * Usage: graph_api_test --ptx reference_kernels.ptx [--no-mapped-memory]
 *
 * --no-mapped-memory: through rgpu's network carrier, which shares no
 * memory with the host, so page-locked memory is the program's own: the
 * host-node section and the memcpy nodes to and from page-locked memory
 * are not run; instead every graph call naming page-locked memory (memset
 * and memcpy nodes, added or set, by the per-kind and the generic calls)
 * and every host node must be refused with CUDA_ERROR_NOT_SUPPORTED, and
 * the memcpy section's 2D and 3D nodes run between copies made outside the
 * graph. Everything else runs as without it.
 *
 * A graph: a memset node (the index buffer to 0x22222222) -> a kernel node
 * (rgpu_fill_index over it) -> a memcpy node (device to device, into a
 * second buffer) -> an event record node -> an empty node -> a child graph
 * node (a memset of a third buffer to 5). cuGraphGetNodes and
 * cuGraphNodeGetType see the six nodes, cuGraphGetRootNodes the memset,
 * cuGraphGetEdges the six edges, the record node its event, and
 * cuGraphDebugDotPrint writes a file; an instantiation with an upload
 * (cuGraphInstantiateWithParams) succeeds without the flag staying;
 * instantiated and launched three times, the copy holds base + i and
 * the third buffer 5. Node parameters (issue 10): the kernel node's read back; new arguments set in the
 * executable graph only, then in the graph (read back; the executable
 * graph keeps its own until cuGraphExecUpdate_v2 brings them, then
 * writes them); cuGraphUpload. A memset node's parameters read back, set
 * in an executable graph, in its graph and brought over by an update; an
 * update from a graph of another topology or node type fails with its
 * reason; set/get on a node of another kind, and an executable graph's
 * set on a node of another graph, are CUDA_ERROR_INVALID_VALUE;
 * cuGraphNodeGetDependencies(_v2) and cuGraphNodeGetDependentNodes answer
 * the edges the nodes were added with. Memory-allocation nodes: an
 * allocation a kernel node fills, a memcpy node copies out and a free node
 * frees, launched twice (parameters read back, node types); a free node
 * of cuMemAlloc memory and a graph with memory nodes as a child are
 * refused. Host nodes (cuGraphAddHostNode and cuGraphAddNode) run once
 * per launch, in order with the nodes around them; each executable graph
 * and each clone keeps its own function and argument (set in the graph,
 * in one executable graph, in a clone, brought by an update); a host
 * node's edges added and removed, and a host node destroyed. Memcpy nodes between
 * page-locked host memory and the device, a 2D copy between pitches with
 * unified addresses and a 3D copy of two slices, every byte checked; their
 * parameters read back, set in an executable graph (a second source
 * buffer) and in the graph (a new executable graph copies the new rows);
 * a pitch below the width refused. Edges added and removed after the
 * nodes (two memsets ordered one way, then the other; removing an edge
 * twice fails) and a node destroyed. A clone, launched after the
 * buffers were cleared, does the same as the graph. Node setters: an
 * event record node given another event in its graph (read back) and
 * in an executable graph only (each launch records the executable
 * graph's, which cuEventElapsedTime then measures; the graph's stays
 * unrecorded), through the generic call too; a child graph node of an
 * executable graph given a child of the same shape (its memset value
 * lands) but not one of another shape; a memset node disabled in an
 * executable graph (its buffer untouched, read back as disabled) and
 * enabled again; an event node cannot be disabled. Misuse: a node of another
 * graph as a dependency is refused; through rgpu, a destroyed graph takes
 * no node and no instantiation, and a memcpy node from pageable host
 * memory is CUDA_ERROR_NOT_SUPPORTED, a handle that is no node is refused, and a
 * memset node set to memory of no allocation too, and a graph
 * allocation's memory once its graph is gone; last, a kernel node whose pointer argument is
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
#include <time.h>
#include <unistd.h>

#include "rgpu_cuda.h"
#include "checks.h"

#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE 910

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

typedef struct {
    int result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} ExecUpdateResultInfo;

typedef struct {
    unsigned char from_port, to_port, type, reserved[5];
} EdgeData;

typedef struct {
    int type;
    int id;
} MemLocation;

typedef struct {
    MemLocation location;
    unsigned int flags;
} AccessDesc;

typedef struct {
    int allocType;
    int handleTypes;
    MemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} PoolProps;

typedef struct {
    PoolProps poolProps;
    const AccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} MemAllocNodeParams;

typedef struct {
    void (*fn)(void *);
    void *userData;
} HostNodeParams;

/* CUgraphNodeParams: a type, then the node's parameters in a union. */
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        KernelNodeParams kernel;
        struct {
            int flags, reserved;
            CUcontext copyCtx;
            Memcpy3D copyParams;
        } memcpy;
        struct {
            MemsetNodeParams params;
            CUcontext ctx;
        } memset;
        struct {
            void (*fn)(void *);
            void *userData;
            unsigned syncMode;
        } host;
    } u;
    long long reserved2;
} GraphNodeParams;

#define UPDATE_SUCCESS 0
#define UPDATE_TOPOLOGY_CHANGED 2
#define UPDATE_NODE_TYPE_CHANGED 3

#define MEMORYTYPE_HOST 1
#define MEMORYTYPE_DEVICE 2
#define MEMORYTYPE_UNIFIED 4
#define NODE_TYPE_KERNEL 0
#define NODE_TYPE_MEMCPY 1
#define NODE_TYPE_MEMSET 2
#define NODE_TYPE_GRAPH 4
#define NODE_TYPE_EMPTY 5
#define NODE_TYPE_EVENT_RECORD 7
#define NODE_TYPE_MEM_ALLOC 10
#define NODE_TYPE_MEM_FREE 11

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
typedef struct {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} InstantiateParams;
CUresult cuGraphAddDependencies(CUgraph graph, const CUgraphNode *from, const CUgraphNode *to,
                                size_t count);
CUresult cuGraphRemoveDependencies(CUgraph graph, const CUgraphNode *from, const CUgraphNode *to,
                                   size_t count);
CUresult cuGraphDestroyNode(CUgraphNode node);
CUresult cuGraphGetRootNodes(CUgraph graph, CUgraphNode *roots, size_t *count);
CUresult cuGraphGetEdges(CUgraph graph, CUgraphNode *from, CUgraphNode *to, size_t *count);
CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode node, CUevent *event);
CUresult cuGraphDebugDotPrint(CUgraph graph, const char *path, unsigned int flags);
CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, InstantiateParams *params);
CUresult cuGraphExecGetFlags(CUgraphExec exec, unsigned long long *flags);
CUresult cuGraphNodeFindInClone(CUgraphNode *cloned, CUgraphNode original, CUgraph clone);
CUresult cuGraphMemcpyNodeGetParams(CUgraphNode node, Memcpy3D *params);
CUresult cuGraphMemcpyNodeSetParams(CUgraphNode node, const Memcpy3D *params);
CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node, const Memcpy3D *params,
                                        CUcontext ctx);
CUresult cuGraphAddEventRecordNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                   size_t n, CUevent event);
CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  size_t n, CUgraph child);
CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);
CUresult cuGraphNodeGetType(CUgraphNode node, int *type);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, KernelNodeParams *params);
CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode node, const KernelNodeParams *params);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                           const KernelNodeParams *params);
CUresult cuGraphMemsetNodeGetParams(CUgraphNode node, MemsetNodeParams *params);
CUresult cuGraphMemsetNodeSetParams(CUgraphNode node, const MemsetNodeParams *params);
CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                        const MemsetNodeParams *params, CUcontext ctx);
CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, ExecUpdateResultInfo *info);
CUresult cuGraphUpload(CUgraphExec exec, CUstream stream);
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                size_t n, MemAllocNodeParams *params);
CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                               size_t n, CUdeviceptr dptr);
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, MemAllocNodeParams *params);
CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr *dptr);
CUresult cuGraphAddHostNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                            const HostNodeParams *params);
CUresult cuGraphHostNodeGetParams(CUgraphNode node, HostNodeParams *params);
CUresult cuGraphHostNodeSetParams(CUgraphNode node, const HostNodeParams *params);
CUresult cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                      const HostNodeParams *params);
CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, size_t *count);
CUresult cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode *deps, EdgeData *edges,
                                       size_t *count);
CUresult cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode *deps, size_t *count);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                        GraphNodeParams *params);
CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                           const EdgeData *edges, size_t n, GraphNodeParams *params);
CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, GraphNodeParams *params);
CUresult cuGraphNodeSetParams(CUgraphNode node, GraphNodeParams *params);
CUresult cuGraphEventRecordNodeSetEvent(CUgraphNode node, CUevent event);
CUresult cuGraphEventWaitNodeSetEvent(CUgraphNode node, CUevent event);
CUresult cuGraphExecEventRecordNodeSetEvent(CUgraphExec exec, CUgraphNode node, CUevent event);
CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraph child);
CUresult cuGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node, unsigned enabled);
CUresult cuGraphKernelNodeSetAttribute(CUgraphNode node, int attr, const unsigned value[16]);
CUresult cuGraphKernelNodeGetAttribute(CUgraphNode node, int attr, unsigned value[16]);
CUresult cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src);
/* CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, _PRIORITY, _PROGRAMMATIC_EVENT. */
#define ATTR_ACCESS_POLICY_WINDOW 1
#define ATTR_PRIORITY 8
#define ATTR_PROGRAMMATIC_EVENT 7
CUresult cuGraphNodeGetEnabled(CUgraphExec exec, CUgraphNode node, unsigned *enabled);
CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode *deps,
                                     const EdgeData *edges, size_t n, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);

#define N 4096u

static CUcontext ctx;

/* A host node's function: counts its calls, notes the first page-locked
 * word (set by the node before it) and writes the second (copied by the
 * node after it). */
struct host_seen {
    volatile unsigned *words;
    unsigned first_word;
    int calls;
};
static void host_fn(void *data) {
    struct host_seen *seen = data;
    seen->calls++;
    seen->first_word = seen->words[0];
    seen->words[1] = seen->first_word + 1;
}

/* A host node's function that takes its time: counts its calls after
 * 30 ms. */
static void slow_host_fn(void *data) {
    struct timespec nap = {0, 30000000};
    nanosleep(&nap, NULL);
    (*(volatile int *)data)++;
}

static MemsetNodeParams memset32(CUdeviceptr dst, unsigned value) {
    MemsetNodeParams p = {dst, N * 4, value, 4, N, 1};
    return p;
}

/* What the memcpy-node section's graph leaves in its 256 bytes: 0xcc but
 * for a 2D copy of rows first_row.. (pitch 64, from byte 8, 16 wide) to
 * rows 0..2 (pitch 32, from byte 4), and a 3D copy of two slices of two
 * 8-byte rows (source slices of four rows of pitch 16 from byte 128, the
 * destination's abutting from byte 128). */
static void copies_want(unsigned char *want, const unsigned char *src, int first_row) {
    memset(want, 0xcc, 256);
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < 16; b++) want[r * 32 + 4 + b] = src[(r + first_row) * 64 + 8 + b];
    for (int z = 0; z < 2; z++)
        for (int r = 0; r < 2; r++)
            for (int b = 0; b < 8; b++)
                want[128 + (z * 2 + r) * 8 + b] = src[128 + (z * 4 + r) * 16 + b];
}

static int bytes_differing(const unsigned char *a, const unsigned char *b, size_t n) {
    int differing = 0;
    for (size_t i = 0; i < n; i++) differing += a[i] != b[i];
    return differing;
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

/* Launches the memcpy-node section's executable graph. Without mapped
 * memory its page-locked nodes were refused: the bytes go in from `src`
 * and come out to `out` by copies made outside the graph. */
static void launch_copies(CUgraphExec exec, CUstream stream, int mapped_memory, CUdeviceptr d_src,
                          const unsigned char *src, CUdeviceptr d_dst, unsigned char *out,
                          size_t bytes) {
    if (!mapped_memory) CHECK_CU(cuMemcpyHtoD(d_src, src, bytes));
    CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    if (!mapped_memory) CHECK_CU(cuMemcpyDtoH(out, d_dst, bytes));
}

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    int mapped_memory = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-mapped-memory")) mapped_memory = 0;
        else if (i + 1 < argc && !strcmp(argv[i], "--ptx")) ptx_path = argv[++i];
    }
    char *ptx = ptx_path ? read_file(ptx_path) : NULL;
    /* --no-mapped-memory is given through rgpu's network carrier only. */
    int through_rgpu = getenv("RGPU_SOCKET") != NULL || !mapped_memory;
    CUdevice dev;
    CUmodule module;
    CUfunction fill_index;
    if (!ptx || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, ptx) ||
        cuModuleGetFunction(&fill_index, module, "rgpu_fill_index")) {
        printf("FAIL: no CUDA context or kernels (usage: graph_api_test --ptx PTX "
               "[--no-mapped-memory])\n");
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
    /* The graph's shape read back: one root, six edges, the record
     * node's event; and written out for Graphviz. */
    {
        CUgraphNode roots[4] = {NULL, NULL, NULL, NULL}, from[8], to[8];
        size_t count = 0;
        CHECK_CU(cuGraphGetRootNodes(graph, NULL, &count));
        CHECK_EQ_INT((int)count, 1);
        count = 4;
        CHECK_CU(cuGraphGetRootNodes(graph, roots, &count));
        CHECK_TRUE(count == 1 && roots[0] == n_memset);
        CHECK_CU(cuGraphGetEdges(graph, NULL, NULL, &count));
        CHECK_EQ_INT((int)count, 6);
        count = 8;
        CHECK_CU(cuGraphGetEdges(graph, from, to, &count));
        CHECK_EQ_INT((int)count, 6);
        int kernel_to_child = 0, copy_to_record = 0;
        for (size_t i = 0; i < count; i++) {
            kernel_to_child += from[i] == n_kernel && to[i] == n_child;
            copy_to_record += from[i] == n_copy && to[i] == n_record;
        }
        CHECK_TRUE(kernel_to_child == 1 && copy_to_record == 1);
        CUevent recorded = NULL;
        CHECK_CU(cuGraphEventRecordNodeGetEvent(n_record, &recorded));
        CHECK_TRUE(recorded == event);
        char dot[64];
        snprintf(dot, sizeof dot, "/tmp/graph_api_test-%d.dot", (int)getpid());
        CHECK_CU(cuGraphDebugDotPrint(graph, dot, 0));
        FILE *written = fopen(dot, "r");
        CHECK_TRUE(written != NULL && fgetc(written) != EOF);
        if (written) fclose(written);
        remove(dot);
    }

    CUgraphExec exec = NULL;
    CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
    {
        /* Instantiated with an upload on the stream: the result says so,
         * the upload flag is no flag of the executable graph. */
        InstantiateParams with = {2 /* UPLOAD */, stream, NULL, -1};
        CUgraphExec uploaded = NULL;
        unsigned long long flags = 99;
        CHECK_CU(cuGraphInstantiateWithParams(&uploaded, graph, &with));
        CHECK_EQ_INT(with.result_out, 0);
        CHECK_CU(cuGraphExecGetFlags(uploaded, &flags));
        CHECK_EQ_INT((int)flags, 0);
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_CU(cuGraphExecDestroy(uploaded));
    }
    for (int i = 0; i < 3; i++) CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuEventQuery(event));
    CHECK_EQ_INT(mismatches(d_index, base, 0), 0);
    CHECK_EQ_INT(mismatches(d_copy, base, 0), 0);
    CHECK_EQ_INT(mismatches(d_child, 5, 1), 0);

    /* A kernel node's parameters read back: the function, the shape and
     * the argument values. */
    KernelNodeParams got;
    memset(&got, 0, sizeof got);
    CHECK_CU(cuGraphKernelNodeGetParams_v2(n_kernel, &got));
    CHECK_TRUE(got.func == fill_index);
    CHECK_EQ_INT((int)got.gridDimX, (int)(N / 128));
    CHECK_EQ_INT((int)got.blockDimX, 128);
    CHECK_TRUE(got.kernelParams != NULL);
    if (got.kernelParams) {
        CHECK_TRUE(*(CUdeviceptr *)got.kernelParams[0] == d_index);
        CHECK_EQ_INT((int)*(unsigned *)got.kernelParams[1], (int)base);
        CHECK_EQ_INT((int)*(unsigned *)got.kernelParams[2], (int)count);
    }

    /* New arguments in the executable graph only: the launch writes them,
     * the graph keeps its own. */
    unsigned exec_base = 2000, graph_base = 3000;
    void *exec_params[] = {&d_index, &exec_base, &count};
    void *graph_params[] = {&d_index, &graph_base, &count};
    KernelNodeParams exec_kernel = fill_index_node(fill_index, exec_params);
    KernelNodeParams graph_kernel = fill_index_node(fill_index, graph_params);
    CHECK_CU(cuGraphExecKernelNodeSetParams_v2(exec, n_kernel, &exec_kernel));
    CHECK_CU(cuGraphUpload(exec, stream));
    CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_copy, exec_base, 0), 0);
    CHECK_CU(cuGraphKernelNodeGetParams_v2(n_kernel, &got));
    if (got.kernelParams) CHECK_EQ_INT((int)*(unsigned *)got.kernelParams[1], (int)base);
    /* New arguments in the graph: read back; the executable graph made
     * before keeps its own until it is updated from the graph. */
    CHECK_CU(cuGraphKernelNodeSetParams_v2(n_kernel, &graph_kernel));
    CHECK_CU(cuGraphKernelNodeGetParams_v2(n_kernel, &got));
    if (got.kernelParams) CHECK_EQ_INT((int)*(unsigned *)got.kernelParams[1], (int)graph_base);
    CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_copy, exec_base, 0), 0);
    ExecUpdateResultInfo info;
    memset(&info, 0xff, sizeof info);
    CHECK_CU(cuGraphExecUpdate_v2(exec, graph, &info));
    CHECK_EQ_INT(info.result, UPDATE_SUCCESS);
    CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_copy, graph_base, 0), 0);

    /* A memset node's parameters: read back, set in an executable graph,
     * set in the graph and brought to the executable graph by an update. */
    CUgraph sets = NULL;
    CUgraphNode n_set = NULL;
    CUgraphExec sets_exec = NULL;
    MemsetNodeParams seven = memset32(d_child, 7), nine = memset32(d_child, 9),
                     eleven = memset32(d_child, 11), read_back;
    CHECK_CU(cuGraphCreate(&sets, 0));
    CHECK_CU(cuGraphAddMemsetNode(&n_set, sets, NULL, 0, &seven, ctx));
    memset(&read_back, 0, sizeof read_back);
    CHECK_CU(cuGraphMemsetNodeGetParams(n_set, &read_back));
    CHECK_TRUE(read_back.dst == d_child);
    CHECK_EQ_INT((int)read_back.value, 7);
    CHECK_EQ_INT((int)read_back.elementSize, 4);
    CHECK_EQ_INT((int)read_back.width, (int)N);
    CHECK_EQ_INT((int)read_back.height, 1);
    CHECK_CU(cuGraphInstantiateWithFlags(&sets_exec, sets, 0));
    CHECK_CU(cuGraphLaunch(sets_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_child, 7, 1), 0);
    CHECK_CU(cuGraphExecMemsetNodeSetParams(sets_exec, n_set, &nine, ctx));
    CHECK_CU(cuGraphLaunch(sets_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_child, 9, 1), 0);
    CHECK_CU(cuGraphMemsetNodeSetParams(n_set, &eleven));
    CHECK_CU(cuGraphMemsetNodeGetParams(n_set, &read_back));
    CHECK_EQ_INT((int)read_back.value, 11);
    CHECK_CU(cuGraphLaunch(sets_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_child, 9, 1), 0);
    CHECK_CU(cuGraphExecUpdate_v2(sets_exec, sets, &info));
    CHECK_EQ_INT(info.result, UPDATE_SUCCESS);
    CHECK_CU(cuGraphLaunch(sets_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_child, 11, 1), 0);

    /* Updates from graphs of another shape fail, naming why. */
    CUgraph two = NULL, other_type = NULL;
    CUgraphNode n_two = NULL, n_other_type = NULL;
    CHECK_CU(cuGraphCreate(&two, 0));
    CHECK_CU(cuGraphAddMemsetNode(&n_two, two, NULL, 0, &seven, ctx));
    CHECK_CU(cuGraphAddMemsetNode(&n_two, two, &n_two, 1, &nine, ctx));
    memset(&info, 0, sizeof info);
    CUresult updated = cuGraphExecUpdate_v2(sets_exec, two, &info);
    printf("update from a graph of two nodes: rc %d, result %d\n", updated, info.result);
    CHECK_EQ_INT(updated, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    CHECK_EQ_INT(info.result, UPDATE_TOPOLOGY_CHANGED);
    CHECK_CU(cuGraphCreate(&other_type, 0));
    CHECK_CU(cuGraphAddEmptyNode(&n_other_type, other_type, NULL, 0));
    memset(&info, 0, sizeof info);
    updated = cuGraphExecUpdate_v2(sets_exec, other_type, &info);
    printf("update from a graph of an empty node: rc %d, result %d, error node %s\n", updated,
           info.result, info.errorNode == n_other_type ? "the empty node" : "another");
    CHECK_EQ_INT(updated, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    CHECK_TRUE(info.result == UPDATE_NODE_TYPE_CHANGED || info.result == UPDATE_TOPOLOGY_CHANGED);
    if (info.result == UPDATE_NODE_TYPE_CHANGED) CHECK_TRUE(info.errorNode == n_other_type);

    /* Misuse: a set or get on a node of another kind, a node of another
     * graph than the executable graph's (the documented error,
     * CUDA_ERROR_INVALID_VALUE; printed). */
    CUresult wrong_kind = cuGraphKernelNodeSetParams_v2(n_memset, &graph_kernel);
    CUresult wrong_get = cuGraphMemsetNodeGetParams(n_kernel, &read_back);
    CUresult wrong_graph = cuGraphExecMemsetNodeSetParams(exec, n_set, &nine, ctx);
    CUresult wrong_exec_kind = cuGraphExecKernelNodeSetParams_v2(exec, n_memset, &exec_kernel);
    printf("kernel params on a memset node %d, memset params of a kernel node %d, a node of "
           "another graph %d, exec kernel params on a memset node %d\n",
           wrong_kind, wrong_get, wrong_graph, wrong_exec_kind);
    CHECK_EQ_INT(wrong_kind, CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ_INT(wrong_get, CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ_INT(wrong_graph, CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ_INT(wrong_exec_kind, CUDA_ERROR_INVALID_VALUE);
    /* The graph still runs as set. */
    CHECK_CU(cuGraphLaunch(sets_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_child, 11, 1), 0);

    /* Dependencies and dependents as the nodes were added. */
    CUgraphNode deps[4] = {NULL, NULL, NULL, NULL};
    size_t ndeps = 0;
    CHECK_CU(cuGraphNodeGetDependencies(n_child, NULL, &ndeps));
    CHECK_EQ_INT((int)ndeps, 2);
    ndeps = 4;
    CHECK_CU(cuGraphNodeGetDependencies(n_child, deps, &ndeps));
    CHECK_EQ_INT((int)ndeps, 2);
    CHECK_TRUE((deps[0] == n_empty && deps[1] == n_kernel) ||
               (deps[0] == n_kernel && deps[1] == n_empty));
    CHECK_TRUE(deps[2] == NULL);
    EdgeData edges[1];
    memset(edges, 0xff, sizeof edges);
    ndeps = 1;
    CHECK_CU(cuGraphNodeGetDependencies_v2(n_copy, deps, edges, &ndeps));
    CHECK_EQ_INT((int)ndeps, 1);
    CHECK_TRUE(deps[0] == n_kernel);
    CHECK_EQ_INT(edges[0].type, 0);
    ndeps = 4;
    CHECK_CU(cuGraphNodeGetDependentNodes(n_kernel, deps, &ndeps));
    CHECK_EQ_INT((int)ndeps, 2);
    CHECK_TRUE((deps[0] == n_copy && deps[1] == n_child) ||
               (deps[0] == n_child && deps[1] == n_copy));
    ndeps = 4;
    CHECK_CU(cuGraphNodeGetDependentNodes(n_child, deps, &ndeps));
    CHECK_EQ_INT((int)ndeps, 0);
    if (through_rgpu) {
        /* Natively undefined: a handle that is no node; through rgpu the
         * host also refuses a memset node set to memory of no allocation. */
        CUgraphNode bogus = (CUgraphNode)(uintptr_t)0x1234;
        CHECK_RC(cuGraphKernelNodeGetParams_v2(bogus, &got), CUDA_ERROR_INVALID_VALUE);
        CHECK_RC(cuGraphMemsetNodeSetParams(bogus, &nine), CUDA_ERROR_INVALID_VALUE);
        CHECK_RC(cuGraphExecMemsetNodeSetParams(sets_exec, bogus, &nine, ctx),
                 CUDA_ERROR_INVALID_VALUE);
        MemsetNodeParams forged_set = memset32(d_child + (1ull << 36), 1);
        CHECK_RC(cuGraphMemsetNodeSetParams(n_set, &forged_set), CUDA_ERROR_INVALID_VALUE);
        CHECK_RC(cuGraphExecMemsetNodeSetParams(sets_exec, n_set, &forged_set, ctx),
                 CUDA_ERROR_INVALID_VALUE);
        CHECK_CU(cuGraphMemsetNodeGetParams(n_set, &read_back));
        CHECK_EQ_INT((int)read_back.value, 11);
    }
    CHECK_CU(cuGraphExecDestroy(sets_exec));
    CHECK_CU(cuGraphDestroy(sets));
    CHECK_CU(cuGraphDestroy(two));
    CHECK_CU(cuGraphDestroy(other_type));

    /* Memory-allocation nodes: the allocation a kernel node fills, a
     * memcpy node copies out and a free node frees, in each launch. */
    CUgraph mem = NULL;
    CUgraphNode n_alloc = NULL, n_fill = NULL, n_out = NULL, n_free = NULL;
    CUgraphExec mem_exec = NULL;
    MemAllocNodeParams alloc;
    memset(&alloc, 0, sizeof alloc);
    alloc.poolProps.allocType = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
    alloc.poolProps.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    alloc.poolProps.location.id = (int)dev;
    alloc.bytesize = N * 4;
    CHECK_CU(cuGraphCreate(&mem, 0));
    CHECK_CU(cuGraphAddMemAllocNode(&n_alloc, mem, NULL, 0, &alloc));
    CHECK_TRUE(alloc.dptr != 0);
    CUdeviceptr scratch = alloc.dptr;
    unsigned mem_base = 4000;
    void *mem_params[] = {&scratch, &mem_base, &count};
    KernelNodeParams fill_scratch = fill_index_node(fill_index, mem_params);
    Memcpy3D copy_out = copy_dtod(d_copy, scratch, N * 4);
    CHECK_CU(cuGraphAddKernelNode_v2(&n_fill, mem, &n_alloc, 1, &fill_scratch));
    CHECK_CU(cuGraphAddMemcpyNode(&n_out, mem, &n_fill, 1, &copy_out, ctx));
    CHECK_CU(cuGraphAddMemFreeNode(&n_free, mem, &n_out, 1, scratch));
    CHECK_CU(cuGraphNodeGetType(n_alloc, &type));
    CHECK_EQ_INT(type, NODE_TYPE_MEM_ALLOC);
    CHECK_CU(cuGraphNodeGetType(n_free, &type));
    CHECK_EQ_INT(type, NODE_TYPE_MEM_FREE);
    MemAllocNodeParams alloc_back;
    memset(&alloc_back, 0, sizeof alloc_back);
    CHECK_CU(cuGraphMemAllocNodeGetParams(n_alloc, &alloc_back));
    CHECK_TRUE(alloc_back.dptr == scratch);
    CHECK_EQ_INT((int)alloc_back.bytesize, (int)(N * 4));
    CHECK_EQ_INT(alloc_back.poolProps.location.id, (int)dev);
    CUdeviceptr freed = 0;
    CHECK_CU(cuGraphMemFreeNodeGetParams(n_free, &freed));
    CHECK_TRUE(freed == scratch);
    CHECK_CU(cuMemsetD32(d_copy, 0, N));
    CHECK_CU(cuGraphInstantiateWithFlags(&mem_exec, mem, 0));
    for (int i = 0; i < 2; i++) CHECK_CU(cuGraphLaunch(mem_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_copy, mem_base, 0), 0);
    /* As the H200's driver 580 answers: a graph with memory nodes is not
     * cloned and loses no node, but its executable graph is updated from
     * it or from a twin of the same shape with an allocation of its own,
     * whose allocations the executable graph then has: the twin is not
     * instantiated beside it, while the graph, whose allocations it no
     * longer has, is. */
    {
        CUgraph mem_clone = NULL, twin = NULL;
        CUgraphNode t_alloc = NULL, t_fill = NULL, t_out = NULL, t_free = NULL;
        CUgraphExec twin_exec = NULL, second_exec = NULL;
        CHECK_RC(cuGraphClone(&mem_clone, mem), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_RC(cuGraphDestroyNode(n_fill), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_RC(cuGraphDestroyNode(n_free), CUDA_ERROR_NOT_SUPPORTED);
        ExecUpdateResultInfo mem_info;
        memset(&mem_info, 0, sizeof mem_info);
        CHECK_CU(cuGraphExecUpdate_v2(mem_exec, mem, &mem_info));
        CHECK_EQ_INT(mem_info.result, UPDATE_SUCCESS);
        MemAllocNodeParams twin_alloc = alloc;
        twin_alloc.dptr = 0;
        CHECK_CU(cuGraphCreate(&twin, 0));
        CHECK_CU(cuGraphAddMemAllocNode(&t_alloc, twin, NULL, 0, &twin_alloc));
        CHECK_TRUE(twin_alloc.dptr != 0 && twin_alloc.dptr != scratch);
        CUdeviceptr twin_scratch = twin_alloc.dptr;
        unsigned twin_base = 7000;
        void *twin_params[] = {&twin_scratch, &twin_base, &count};
        KernelNodeParams twin_fill = fill_index_node(fill_index, twin_params);
        Memcpy3D twin_copy = copy_dtod(d_copy, twin_scratch, N * 4);
        CHECK_CU(cuGraphAddKernelNode_v2(&t_fill, twin, &t_alloc, 1, &twin_fill));
        CHECK_CU(cuGraphAddMemcpyNode(&t_out, twin, &t_fill, 1, &twin_copy, ctx));
        CHECK_CU(cuGraphAddMemFreeNode(&t_free, twin, &t_out, 1, twin_scratch));
        memset(&mem_info, 0, sizeof mem_info);
        CHECK_CU(cuGraphExecUpdate_v2(mem_exec, twin, &mem_info));
        CHECK_EQ_INT(mem_info.result, UPDATE_SUCCESS);
        CHECK_CU(cuGraphLaunch(mem_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, twin_base, 0), 0);
        CUresult twin_beside = cuGraphInstantiateWithFlags(&twin_exec, twin, 0);
        CUresult second = cuGraphInstantiateWithFlags(&second_exec, mem, 0);
        printf("a graph with memory nodes instantiated beside its executable graph: twin %d, "
               "itself %d\n",
               twin_beside, second);
        CHECK_EQ_INT(twin_beside, CUDA_ERROR_NOT_SUPPORTED);
        CHECK_EQ_INT(second, CUDA_SUCCESS);
        if (twin_beside == CUDA_SUCCESS) CHECK_CU(cuGraphExecDestroy(twin_exec));
        if (second == CUDA_SUCCESS) CHECK_CU(cuGraphExecDestroy(second_exec));
        CHECK_CU(cuGraphDestroy(twin));
    }
    /* Misuse: a free node of memory that is no graph allocation, a graph
     * with memory nodes as a child graph (documented as errors; the H200's
     * driver 580 answers INVALID_VALUE and NOT_SUPPORTED; printed). */
    CUgraph holder = NULL;
    CUgraphNode n_bad_free = NULL, n_mem_child = NULL;
    CHECK_CU(cuGraphCreate(&holder, 0));
    CUresult bad_free = cuGraphAddMemFreeNode(&n_bad_free, holder, NULL, 0, d_copy);
    CUresult mem_child = cuGraphAddChildGraphNode(&n_mem_child, holder, NULL, 0, mem);
    printf("a free node of cuMemAlloc memory %d, a graph with memory nodes as a child %d\n",
           bad_free, mem_child);
    CHECK_EQ_INT(bad_free, CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ_INT(mem_child, CUDA_ERROR_NOT_SUPPORTED);
    CHECK_CU(cuGraphDestroy(holder));
    CHECK_CU(cuGraphExecDestroy(mem_exec));
    CHECK_CU(cuGraphDestroy(mem));
    if (through_rgpu) {
        /* Once no graph holds it, its memory is no process's: a memset of
         * it is refused on the host. */
        CHECK_RC(cuMemsetD32(scratch, 0, N), CUDA_ERROR_INVALID_VALUE);
    }

    /* A clone does the same, with the kernel node's arguments as set. */
    CUgraph clone = NULL;
    CUgraphExec clone_exec = NULL;
    CHECK_CU(cuGraphClone(&clone, graph));
    {
        CUgraphNode cloned = NULL;
        CHECK_CU(cuGraphNodeFindInClone(&cloned, n_kernel, clone));
        CHECK_TRUE(cloned != NULL && cloned != n_kernel);
        CHECK_CU(cuGraphNodeGetType(cloned, &type));
        CHECK_EQ_INT(type, NODE_TYPE_KERNEL);
    }
    CHECK_CU(cuGraphGetNodes(clone, NULL, &nodes));
    CHECK_EQ_INT((int)nodes, 6);
    CHECK_CU(cuMemsetD32(d_copy, 0, N));
    CHECK_CU(cuMemsetD32(d_child, 0, N));
    CHECK_CU(cuGraphInstantiateWithFlags(&clone_exec, clone, 0));
    CHECK_CU(cuGraphLaunch(clone_exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_EQ_INT(mismatches(d_copy, graph_base, 0), 0);
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

    /* The generic node API (XLA's command buffers): memset -> kernel (with
     * plain edge data) -> memcpy, then new kernel arguments in the
     * executable graph. */
    {
        CUgraph generic = NULL;
        CUgraphExec generic_exec = NULL;
        CUgraphNode g_memset = NULL, g_kernel = NULL, g_copy = NULL;
        GraphNodeParams params;
        EdgeData plain = {0, 0, 0, {0}};
        unsigned generic_base = 7000, updated_base = 8000;
        void *generic_args[] = {&d_index, &generic_base, &count};
        void *updated_args[] = {&d_index, &updated_base, &count};
        CHECK_CU(cuMemsetD32(d_copy, 0, N));
        CHECK_CU(cuGraphCreate(&generic, 0));
        memset(&params, 0, sizeof params);
        params.type = NODE_TYPE_MEMSET;
        params.u.memset.params = memset32(d_index, 0x33333333u);
        params.u.memset.ctx = ctx;
        CHECK_CU(cuGraphAddNode(&g_memset, generic, NULL, 0, &params));
        memset(&params, 0, sizeof params);
        params.type = NODE_TYPE_KERNEL;
        params.u.kernel = fill_index_node(fill_index, generic_args);
        CHECK_CU(cuGraphAddNode_v2(&g_kernel, generic, &g_memset, &plain, 1, &params));
        memset(&params, 0, sizeof params);
        params.type = NODE_TYPE_MEMCPY;
        params.u.memcpy.copyCtx = ctx;
        params.u.memcpy.copyParams = copy_dtod(d_copy, d_index, N * 4);
        CHECK_CU(cuGraphAddNode(&g_copy, generic, &g_kernel, 1, &params));
        CHECK_CU(cuGraphNodeGetType(g_copy, &type));
        CHECK_EQ_INT(type, NODE_TYPE_MEMCPY);
        CHECK_CU(cuGraphInstantiateWithFlags(&generic_exec, generic, 0));
        CHECK_CU(cuGraphLaunch(generic_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, generic_base, 0), 0);
        memset(&params, 0, sizeof params);
        params.type = NODE_TYPE_KERNEL;
        params.u.kernel = fill_index_node(fill_index, updated_args);
        CHECK_CU(cuGraphExecNodeSetParams(generic_exec, g_kernel, &params));
        CHECK_CU(cuGraphLaunch(generic_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, updated_base, 0), 0);
        /* A programmatic edge (type 1, from the programmatic port) between
         * two kernels writing different buffers, as XLA adds them. */
        {
            CUgraph pdl = NULL;
            CUgraphExec pdl_exec = NULL;
            CUgraphNode first = NULL, second = NULL;
            EdgeData programmatic = {1, 0, 1, {0}};
            unsigned first_base = 9000, second_base = 9500;
            void *first_args[] = {&d_index, &first_base, &count};
            void *second_args[] = {&d_copy, &second_base, &count};
            CHECK_CU(cuGraphCreate(&pdl, 0));
            memset(&params, 0, sizeof params);
            params.type = NODE_TYPE_KERNEL;
            params.u.kernel = fill_index_node(fill_index, first_args);
            CHECK_CU(cuGraphAddNode_v2(&first, pdl, NULL, NULL, 0, &params));
            params.u.kernel = fill_index_node(fill_index, second_args);
            CHECK_CU(cuGraphAddNode_v2(&second, pdl, &first, &programmatic, 1, &params));
            CHECK_CU(cuGraphInstantiateWithFlags(&pdl_exec, pdl, 0));
            CHECK_CU(cuGraphLaunch(pdl_exec, stream));
            CHECK_CU(cuStreamSynchronize(stream));
            CHECK_EQ_INT(mismatches(d_index, first_base, 0), 0);
            CHECK_EQ_INT(mismatches(d_copy, second_base, 0), 0);
            CHECK_CU(cuGraphExecDestroy(pdl_exec));
            CHECK_CU(cuGraphDestroy(pdl));
        }
        CHECK_CU(cuGraphExecDestroy(generic_exec));
        CHECK_CU(cuGraphDestroy(generic));
    }

    /* Host nodes: memset of a page-locked word -> a host node (by
     * cuGraphAddHostNode, and one by cuGraphAddNode after it) -> a copy of
     * the word the last one wrote; launched twice, each host node runs
     * once per launch, in order. */
    if (mapped_memory) {
        struct host_seen seen = {NULL, 0, 0};
        CUgraph hosts = NULL;
        CUgraphExec hosts_exec = NULL;
        CUgraphNode h_set = NULL, h_first = NULL, h_second = NULL, h_copy = NULL;
        CUdeviceptr d_word = 0;
        unsigned got = 0;
        GraphNodeParams params;
        REQUIRE_CU(cuMemAllocHost((void **)&seen.words, 8));
        REQUIRE_CU(cuMemAlloc(&d_word, 4));
        CHECK_CU(cuGraphCreate(&hosts, 0));
        MemsetNodeParams set_word = {(CUdeviceptr)(uintptr_t)seen.words, 4, 500, 4, 1, 1};
        CHECK_CU(cuGraphAddMemsetNode(&h_set, hosts, NULL, 0, &set_word, ctx));
        HostNodeParams host = {host_fn, &seen};
        CHECK_CU(cuGraphAddHostNode(&h_first, hosts, &h_set, 1, &host));
        CHECK_CU(cuGraphNodeGetType(h_first, &type));
        CHECK_EQ_INT(type, 3);
        memset(&params, 0, sizeof params);
        params.type = 3;
        params.u.host.fn = host_fn;
        params.u.host.userData = &seen;
        /* The second notes word 0 again and writes word 1 the same. */
        CHECK_CU(cuGraphAddNode(&h_second, hosts, &h_first, 1, &params));
        Memcpy3D copy_word = copy_dtod(d_word, (CUdeviceptr)(uintptr_t)(seen.words + 1), 4);
        CHECK_CU(cuGraphAddMemcpyNode(&h_copy, hosts, &h_second, 1, &copy_word, ctx));
        CHECK_EQ_INT(seen.calls, 0);
        CHECK_CU(cuGraphInstantiateWithFlags(&hosts_exec, hosts, 0));
        for (int i = 0; i < 2; i++) CHECK_CU(cuGraphLaunch(hosts_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(seen.calls, 4);
        CHECK_EQ_INT((int)seen.first_word, 500);
        CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
        CHECK_EQ_INT((int)got, 501);
        /* Parameters read back; a new argument set in the graph, and a new
         * executable graph made from it runs the function with it. */
        struct host_seen other = {seen.words, 0, 0};
        HostNodeParams read_back = {NULL, NULL};
        CHECK_CU(cuGraphHostNodeGetParams(h_first, &read_back));
        CHECK_TRUE(read_back.fn == host_fn && read_back.userData == &seen);
        HostNodeParams moved = {host_fn, &other};
        CHECK_CU(cuGraphHostNodeSetParams(h_first, &moved));
        CHECK_CU(cuGraphHostNodeGetParams(h_first, &read_back));
        CHECK_TRUE(read_back.userData == &other);
        CHECK_CU(cuGraphExecDestroy(hosts_exec));
        CHECK_CU(cuGraphInstantiateWithFlags(&hosts_exec, hosts, 0));
        CHECK_CU(cuGraphLaunch(hosts_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(other.calls, 1);
        CHECK_EQ_INT(seen.calls, 5);
        CHECK_EQ_INT((int)other.first_word, 500);

        /* Each executable graph keeps its own: one made before a set in
         * the graph keeps its function; a set in one executable graph
         * (cuGraphExecHostNodeSetParams, cuGraphExecNodeSetParams) reaches
         * it alone. */
        struct host_seen third = {seen.words, 0, 0}, fourth = {seen.words, 0, 0};
        CUgraphExec kept = NULL;
        CHECK_CU(cuGraphInstantiateWithFlags(&kept, hosts, 0));
        HostNodeParams back = {host_fn, &seen}, to_third = {host_fn, &third};
        CHECK_CU(cuGraphHostNodeSetParams(h_first, &back));
        CHECK_CU(cuGraphLaunch(kept, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(other.calls, 2);
        CHECK_EQ_INT(seen.calls, 6);
        CHECK_CU(cuGraphExecHostNodeSetParams(hosts_exec, h_first, &to_third));
        CHECK_CU(cuGraphLaunch(hosts_exec, stream));
        CHECK_CU(cuGraphLaunch(kept, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(third.calls, 1);
        CHECK_EQ_INT(other.calls, 3);
        CHECK_EQ_INT(seen.calls, 8);
        memset(&params, 0, sizeof params);
        params.type = 3;
        params.u.host.fn = host_fn;
        params.u.host.userData = &fourth;
        CHECK_CU(cuGraphExecNodeSetParams(kept, h_first, &params));
        CHECK_CU(cuGraphLaunch(kept, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(fourth.calls, 1);
        CHECK_EQ_INT(other.calls, 3);

        /* A clone runs them through its own: a set in it reaches neither
         * the original nor its executable graphs, until an update brings
         * the clone's to one. */
        CUgraph twin = NULL;
        CUgraphExec twin_exec = NULL;
        CUgraphNode twin_first = NULL, twin_second = NULL, twin_set = NULL, t_empty = NULL;
        CHECK_CU(cuGraphClone(&twin, hosts));
        CHECK_CU(cuGraphNodeFindInClone(&twin_first, h_first, twin));
        CHECK_CU(cuGraphNodeFindInClone(&twin_second, h_second, twin));
        CHECK_CU(cuGraphNodeFindInClone(&twin_set, h_set, twin));
        CHECK_CU(cuGraphHostNodeSetParams(twin_first, &to_third));
        CHECK_CU(cuGraphInstantiateWithFlags(&twin_exec, twin, 0));
        CHECK_CU(cuGraphLaunch(twin_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(third.calls, 2);
        CHECK_EQ_INT(seen.calls, 10);
        CHECK_CU(cuGraphLaunch(hosts_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(third.calls, 3);
        ExecUpdateResultInfo update;
        CHECK_CU(cuGraphExecUpdate_v2(kept, twin, &update));
        CHECK_CU(cuGraphLaunch(kept, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(third.calls, 4);
        CHECK_EQ_INT(fourth.calls, 1);
        CHECK_EQ_INT(seen.calls, 12);

        /* A host node's edges, and a host node destroyed: the clone's
         * second host node goes, an empty node after the first and before
         * the copy takes its place. */
        CHECK_CU(cuGraphDestroyNode(twin_second));
        CHECK_CU(cuGraphAddEmptyNode(&t_empty, twin, NULL, 0));
        CHECK_CU(cuGraphAddDependencies(twin, &twin_first, &t_empty, 1));
        CHECK_CU(cuGraphRemoveDependencies(twin, &twin_set, &twin_first, 1));
        CHECK_CU(cuGraphAddDependencies(twin, &twin_set, &twin_first, 1));
        CHECK_CU(cuGraphExecDestroy(twin_exec));
        CHECK_CU(cuGraphInstantiateWithFlags(&twin_exec, twin, 0));
        CHECK_CU(cuGraphLaunch(twin_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(third.calls, 5);
        CHECK_EQ_INT(seen.calls, 12);
        CHECK_CU(cuGraphExecDestroy(twin_exec));
        CHECK_CU(cuGraphDestroy(twin));
        /* The original's executable graphs run on after the clone went. */
        CHECK_CU(cuGraphLaunch(hosts_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(third.calls, 6);
        CHECK_EQ_INT(seen.calls, 13);
        CHECK_CU(cuGraphExecDestroy(kept));
        CHECK_CU(cuGraphExecDestroy(hosts_exec));
        CHECK_CU(cuGraphDestroy(hosts));

        /* An executable graph destroyed while its launch runs a host node
         * finishes that launch, as natively; its gate is let go after. */
        {
            volatile int slow_calls = 0;
            CUgraph slow = NULL;
            CUgraphExec slow_exec = NULL;
            CUgraphNode s_host = NULL;
            HostNodeParams slow_params = {slow_host_fn, (void *)&slow_calls};
            CHECK_CU(cuGraphCreate(&slow, 0));
            CHECK_CU(cuGraphAddHostNode(&s_host, slow, NULL, 0, &slow_params));
            CHECK_CU(cuGraphInstantiateWithFlags(&slow_exec, slow, 0));
            CHECK_CU(cuGraphLaunch(slow_exec, stream));
            CHECK_CU(cuGraphExecDestroy(slow_exec));
            CHECK_CU(cuGraphDestroy(slow));
            CHECK_CU(cuStreamSynchronize(stream));
            CHECK_EQ_INT(slow_calls, 1);
        }
        CHECK_CU(cuMemFree(d_word));
        CHECK_CU(cuMemFreeHost((void *)(uintptr_t)seen.words));
    } else {
        /* Through the network carrier page-locked memory is this process's
         * own: a node naming it is refused at once, not made into a graph
         * that leaves it alone, and so are host nodes (their gates are
         * page-locked memory). The graph stays empty, the word untouched. */
        volatile unsigned *words = NULL;
        CUgraph refused = NULL;
        CUgraphNode n = NULL;
        CUdeviceptr d_word = 0;
        GraphNodeParams params;
        size_t held = 1;
        unsigned got = 0;
        REQUIRE_CU(cuMemAllocHost((void **)&words, 8));
        REQUIRE_CU(cuMemAlloc(&d_word, 4));
        words[0] = words[1] = 7;
        CHECK_CU(cuMemsetD32(d_word, 3, 1));
        CHECK_CU(cuGraphCreate(&refused, 0));
        MemsetNodeParams set_word = {(CUdeviceptr)(uintptr_t)words, 4, 500, 4, 1, 1};
        CHECK_RC(cuGraphAddMemsetNode(&n, refused, NULL, 0, &set_word, ctx),
                 CUDA_ERROR_NOT_SUPPORTED);
        memset(&params, 0, sizeof params);
        params.type = NODE_TYPE_MEMSET;
        params.u.memset.params = set_word;
        params.u.memset.ctx = ctx;
        CHECK_RC(cuGraphAddNode(&n, refused, NULL, 0, &params), CUDA_ERROR_NOT_SUPPORTED);
        Memcpy3D copy_word = copy_dtod(d_word, (CUdeviceptr)(uintptr_t)(words + 1), 4);
        CHECK_RC(cuGraphAddMemcpyNode(&n, refused, NULL, 0, &copy_word, ctx),
                 CUDA_ERROR_NOT_SUPPORTED);
        copy_word.srcMemoryType = MEMORYTYPE_UNIFIED;
        CHECK_RC(cuGraphAddMemcpyNode(&n, refused, NULL, 0, &copy_word, ctx),
                 CUDA_ERROR_NOT_SUPPORTED);
        memset(&params, 0, sizeof params);
        params.type = NODE_TYPE_MEMCPY;
        params.u.memcpy.copyCtx = ctx;
        params.u.memcpy.copyParams = copy_word;
        CHECK_RC(cuGraphAddNode(&n, refused, NULL, 0, &params), CUDA_ERROR_NOT_SUPPORTED);
        struct host_seen seen = {words, 0, 0};
        HostNodeParams host = {host_fn, &seen};
        CHECK_RC(cuGraphAddHostNode(&n, refused, NULL, 0, &host), CUDA_ERROR_NOT_SUPPORTED);
        memset(&params, 0, sizeof params);
        params.type = 3;
        params.u.host.fn = host_fn;
        params.u.host.userData = &seen;
        CHECK_RC(cuGraphAddNode(&n, refused, NULL, 0, &params), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_CU(cuGraphGetNodes(refused, NULL, &held));
        CHECK_EQ_INT((int)held, 0);
        CHECK_CU(cuCtxSynchronize());
        CHECK_EQ_INT(seen.calls, 0);
        CHECK_EQ_INT((int)words[0], 7);
        CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
        CHECK_EQ_INT((int)got, 3);
        /* Outside graphs it is the program's own bytes: a device copy from
         * it uploads them, a memset fills them (XLA does both). */
        words[1] = 31;
        CHECK_CU(cuMemcpyDtoD(d_word, (CUdeviceptr)(uintptr_t)(words + 1), 4));
        CHECK_CU(cuMemsetD32((CUdeviceptr)(uintptr_t)words, 500, 1));
        CHECK_EQ_INT((int)words[0], 500);
        CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
        CHECK_EQ_INT((int)got, 31);
        CHECK_CU(cuGraphDestroy(refused));
        CHECK_CU(cuMemFree(d_word));
        CHECK_CU(cuMemFreeHost((void *)(uintptr_t)words));
    }

    /* Edges after the fact: two memsets of one buffer, unordered, then
     * ordered one way by cuGraphAddDependencies, the other way after
     * cuGraphRemoveDependencies; an empty node destroyed. */
    {
        CUgraph edges = NULL;
        CUgraphExec first = NULL, second = NULL;
        CUgraphNode e_empty = NULL, e_one = NULL, e_two = NULL, got[2] = {NULL, NULL};
        MemsetNodeParams set_one = memset32(d_copy, 1), set_two = memset32(d_copy, 2);
        size_t count = 0;
        CHECK_CU(cuGraphCreate(&edges, 0));
        CHECK_CU(cuGraphAddEmptyNode(&e_empty, edges, NULL, 0));
        CHECK_CU(cuGraphAddMemsetNode(&e_one, edges, NULL, 0, &set_one, ctx));
        CHECK_CU(cuGraphAddMemsetNode(&e_two, edges, NULL, 0, &set_two, ctx));
        CHECK_CU(cuGraphAddDependencies(edges, &e_one, &e_two, 1));
        count = 2;
        CHECK_CU(cuGraphNodeGetDependencies(e_two, got, &count));
        CHECK_TRUE(count == 1 && got[0] == e_one);
        CHECK_CU(cuGraphInstantiateWithFlags(&first, edges, 0));
        CHECK_CU(cuGraphLaunch(first, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, 2, 1), 0);
        CHECK_CU(cuGraphRemoveDependencies(edges, &e_one, &e_two, 1));
        CHECK_CU_FAILS(cuGraphRemoveDependencies(edges, &e_one, &e_two, 1));
        CHECK_CU(cuGraphAddDependencies(edges, &e_two, &e_one, 1));
        CHECK_CU(cuGraphGetEdges(edges, NULL, NULL, &count));
        CHECK_EQ_INT((int)count, 1);
        CHECK_CU(cuGraphDestroyNode(e_empty));
        CHECK_CU(cuGraphGetNodes(edges, NULL, &count));
        CHECK_EQ_INT((int)count, 2);
        CHECK_CU(cuGraphInstantiateWithFlags(&second, edges, 0));
        CHECK_CU(cuGraphLaunch(second, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, 1, 1), 0);
        /* The first executable graph keeps its order. */
        CHECK_CU(cuGraphLaunch(first, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, 2, 1), 0);
        CHECK_CU(cuGraphExecDestroy(first));
        CHECK_CU(cuGraphExecDestroy(second));
        CHECK_CU(cuGraphDestroy(edges));
    }

    /* Memcpy nodes beyond 1D device to device: page-locked host memory to
     * the device and back (host memory type), a 2D copy of a 3x16-byte
     * block between pitches 64 and 32 (unified addresses), and a 3D copy
     * of two slices of two rows; launched once, every byte checked, the
     * bytes between rows left alone. */
    {
        enum { BYTES = 256 };
        CUgraph copies = NULL;
        CUgraphExec copies_exec = NULL;
        CUgraphNode c_in = NULL, c_2d = NULL, c_3d = NULL, c_out = NULL;
        unsigned char *pinned_in = NULL, *pinned_out = NULL;
        CUdeviceptr d_src = 0, d_dst = 0;
        unsigned char want[BYTES];
        REQUIRE_CU(cuMemAllocHost((void **)&pinned_in, BYTES));
        REQUIRE_CU(cuMemAllocHost((void **)&pinned_out, BYTES));
        REQUIRE_CU(cuMemAlloc(&d_src, BYTES));
        REQUIRE_CU(cuMemAlloc(&d_dst, BYTES));
        for (int i = 0; i < BYTES; i++) pinned_in[i] = (unsigned char)(i * 7 + 1);
        memset(pinned_out, 0xee, BYTES);
        CHECK_CU(cuMemsetD8(d_dst, 0xcc, BYTES));
        CHECK_CU(cuGraphCreate(&copies, 0));
        /* page-locked host -> d_src (256 bytes) */
        Memcpy3D in = copy_dtod(d_src, 0, BYTES);
        in.srcMemoryType = MEMORYTYPE_HOST;
        in.srcHost = pinned_in;
        if (mapped_memory) {
            CHECK_CU(cuGraphAddMemcpyNode(&c_in, copies, NULL, 0, &in, ctx));
        } else {
            /* No graph reaches the program's page-locked memory: refused
             * (launch_copies copies the bytes in instead). */
            CHECK_RC(cuGraphAddMemcpyNode(&c_in, copies, NULL, 0, &in, ctx),
                     CUDA_ERROR_NOT_SUPPORTED);
        }
        /* 2D: rows 1..3 of d_src (pitch 64), from byte 8, 16 wide -> d_dst
         * rows 0..2 (pitch 32) from byte 4; unified addresses. */
        Memcpy3D two = copy_dtod(d_dst, d_src, 16);
        two.srcMemoryType = two.dstMemoryType = MEMORYTYPE_UNIFIED;
        two.srcXInBytes = 8;
        two.srcY = 1;
        two.srcPitch = 64;
        two.dstXInBytes = 4;
        two.dstPitch = 32;
        two.Height = 3;
        CHECK_CU(cuGraphAddMemcpyNode(&c_2d, copies, mapped_memory ? &c_in : NULL,
                                      mapped_memory ? 1 : 0, &two, ctx));
        /* 3D: 2 slices of 2 rows (slice height 4 rows of pitch 16 on the
         * source, 2 rows of pitch 8 on the destination) of 8 bytes, from
         * d_src+128 to d_dst+128+4... the destination's slices abut. */
        Memcpy3D three = copy_dtod(d_dst + 128, d_src + 128, 8);
        three.srcPitch = 16;
        three.srcHeight = 4;
        three.dstPitch = 8;
        three.dstHeight = 2;
        three.Height = 2;
        three.Depth = 2;
        CHECK_CU(cuGraphAddMemcpyNode(&c_3d, copies, &c_2d, 1, &three, ctx));
        /* d_dst -> page-locked host */
        Memcpy3D out = copy_dtod(0, d_dst, BYTES);
        out.dstMemoryType = MEMORYTYPE_HOST;
        out.dstHost = pinned_out;
        if (mapped_memory) {
            CHECK_CU(cuGraphAddMemcpyNode(&c_out, copies, &c_3d, 1, &out, ctx));
        } else {
            CHECK_RC(cuGraphAddMemcpyNode(&c_out, copies, &c_3d, 1, &out, ctx),
                     CUDA_ERROR_NOT_SUPPORTED);
            /* Named by its address as unified memory, the same. */
            Memcpy3D out_unified = copy_dtod((CUdeviceptr)(uintptr_t)pinned_out, d_dst, BYTES);
            out_unified.dstMemoryType = MEMORYTYPE_UNIFIED;
            CHECK_RC(cuGraphAddMemcpyNode(&c_out, copies, &c_3d, 1, &out_unified, ctx),
                     CUDA_ERROR_NOT_SUPPORTED);
        }
        CHECK_CU(cuGraphInstantiateWithFlags(&copies_exec, copies, 0));
        launch_copies(copies_exec, stream, mapped_memory, d_src, pinned_in, d_dst, pinned_out,
                      BYTES);
        copies_want(want, pinned_in, 1);
        CHECK_EQ_INT(bytes_differing(pinned_out, want, BYTES), 0);
        /* Parameters read back as given. */
        Memcpy3D back;
        memset(&back, 0, sizeof back);
        CHECK_CU(cuGraphMemcpyNodeGetParams(c_2d, &back));
        CHECK_TRUE(back.srcPitch == 64 && back.dstPitch == 32 && back.Height == 3 &&
                   back.srcY == 1 && back.srcMemoryType == MEMORYTYPE_UNIFIED);
        /* New parameters in the executable graph only: the copy in reads
         * a second page-locked buffer. */
        unsigned char *pinned_in2 = NULL;
        REQUIRE_CU(cuMemAllocHost((void **)&pinned_in2, BYTES));
        for (int i = 0; i < BYTES; i++) pinned_in2[i] = (unsigned char)(i * 5 + 3);
        Memcpy3D in2 = in;
        in2.srcHost = pinned_in2;
        if (mapped_memory) {
            CHECK_CU(cuGraphExecMemcpyNodeSetParams(copies_exec, c_in, &in2, ctx));
        } else {
            /* Set on a node of the graph, page-locked memory is refused
             * as well (per kind and generic), and the node keeps its copy. */
            GraphNodeParams params;
            CHECK_RC(cuGraphExecMemcpyNodeSetParams(copies_exec, c_2d, &in2, ctx),
                     CUDA_ERROR_NOT_SUPPORTED);
            memset(&params, 0, sizeof params);
            params.type = NODE_TYPE_MEMCPY;
            params.u.memcpy.copyCtx = ctx;
            params.u.memcpy.copyParams = in2;
            CHECK_RC(cuGraphExecNodeSetParams(copies_exec, c_2d, &params),
                     CUDA_ERROR_NOT_SUPPORTED);
        }
        CHECK_CU(cuMemsetD8(d_dst, 0xcc, BYTES));
        launch_copies(copies_exec, stream, mapped_memory, d_src, pinned_in2, d_dst, pinned_out,
                      BYTES);
        copies_want(want, pinned_in2, 1);
        CHECK_EQ_INT(bytes_differing(pinned_out, want, BYTES), 0);
        /* In the graph: the 2D copy starts a row up; an executable graph
         * made from it copies that (and the first buffer: the executable
         * graph's change stayed there). */
        Memcpy3D two_up = two;
        two_up.srcY = 0;
        if (!mapped_memory) {
            /* The graph's own set too, with the 2D copy's destination in
             * page-locked memory (by type and by address), and a memset
             * node set to it: refused, the parameters as they were. */
            GraphNodeParams params;
            Memcpy3D to_pinned = two_up;
            to_pinned.dstMemoryType = MEMORYTYPE_HOST;
            to_pinned.dstHost = pinned_out;
            CHECK_RC(cuGraphMemcpyNodeSetParams(c_2d, &to_pinned), CUDA_ERROR_NOT_SUPPORTED);
            to_pinned.dstMemoryType = MEMORYTYPE_UNIFIED;
            to_pinned.dstDevice = (CUdeviceptr)(uintptr_t)pinned_out;
            CHECK_RC(cuGraphMemcpyNodeSetParams(c_2d, &to_pinned), CUDA_ERROR_NOT_SUPPORTED);
            memset(&params, 0, sizeof params);
            params.type = NODE_TYPE_MEMCPY;
            params.u.memcpy.copyCtx = ctx;
            params.u.memcpy.copyParams = to_pinned;
            CHECK_RC(cuGraphNodeSetParams(c_2d, &params), CUDA_ERROR_NOT_SUPPORTED);
            CHECK_CU(cuGraphMemcpyNodeGetParams(c_2d, &back));
            CHECK_TRUE(back.srcY == 1 && back.dstMemoryType == MEMORYTYPE_UNIFIED &&
                       back.dstDevice == d_dst);
            CUgraph sets = NULL;
            CUgraphExec sets_exec = NULL;
            CUgraphNode s_set = NULL;
            MemsetNodeParams on_device = {d_dst, BYTES, 0, 1, BYTES, 1};
            MemsetNodeParams on_pinned = {(CUdeviceptr)(uintptr_t)pinned_out, BYTES, 0, 1, BYTES, 1};
            MemsetNodeParams got_set;
            CHECK_CU(cuGraphCreate(&sets, 0));
            CHECK_CU(cuGraphAddMemsetNode(&s_set, sets, NULL, 0, &on_device, ctx));
            CHECK_CU(cuGraphInstantiateWithFlags(&sets_exec, sets, 0));
            CHECK_RC(cuGraphMemsetNodeSetParams(s_set, &on_pinned), CUDA_ERROR_NOT_SUPPORTED);
            CHECK_RC(cuGraphExecMemsetNodeSetParams(sets_exec, s_set, &on_pinned, ctx),
                     CUDA_ERROR_NOT_SUPPORTED);
            memset(&params, 0, sizeof params);
            params.type = NODE_TYPE_MEMSET;
            params.u.memset.params = on_pinned;
            params.u.memset.ctx = ctx;
            CHECK_RC(cuGraphNodeSetParams(s_set, &params), CUDA_ERROR_NOT_SUPPORTED);
            CHECK_CU(cuGraphMemsetNodeGetParams(s_set, &got_set));
            CHECK_TRUE(got_set.dst == d_dst);
            CHECK_CU(cuGraphExecDestroy(sets_exec));
            CHECK_CU(cuGraphDestroy(sets));
        }
        CHECK_CU(cuGraphMemcpyNodeSetParams(c_2d, &two_up));
        CHECK_CU(cuGraphMemcpyNodeGetParams(c_2d, &back));
        CHECK_EQ_INT((int)back.srcY, 0);
        CUgraphExec copies_exec2 = NULL;
        CHECK_CU(cuGraphInstantiateWithFlags(&copies_exec2, copies, 0));
        CHECK_CU(cuMemsetD8(d_dst, 0xcc, BYTES));
        launch_copies(copies_exec2, stream, mapped_memory, d_src, pinned_in, d_dst, pinned_out,
                      BYTES);
        copies_want(want, pinned_in, 0);
        CHECK_EQ_INT(bytes_differing(pinned_out, want, BYTES), 0);
        CHECK_CU(cuGraphExecDestroy(copies_exec2));
        CHECK_CU(cuMemFreeHost(pinned_in2));
        /* A destination pitch below the width is refused. */
        CUgraphNode c_bad = NULL;
        Memcpy3D narrow = two;
        narrow.dstPitch = 8;
        CHECK_CU_FAILS(cuGraphAddMemcpyNode(&c_bad, copies, NULL, 0, &narrow, ctx));
        if (through_rgpu) {
            /* Pageable host memory does not reach the host's GPU. */
            static unsigned char pageable[BYTES];
            Memcpy3D from_pageable = in;
            from_pageable.srcHost = pageable;
            CHECK_RC(cuGraphAddMemcpyNode(&c_bad, copies, NULL, 0, &from_pageable, ctx),
                     CUDA_ERROR_NOT_SUPPORTED);
        }
        CHECK_CU(cuGraphExecDestroy(copies_exec));
        CHECK_CU(cuGraphDestroy(copies));
        CHECK_CU(cuMemFree(d_src));
        CHECK_CU(cuMemFree(d_dst));
        CHECK_CU(cuMemFreeHost(pinned_in));
        CHECK_CU(cuMemFreeHost(pinned_out));
    }

    /* Capture into an existing graph (XLA traces library calls into its
     * command buffers so): a memset node, then a captured kernel and copy
     * after it; the capture ends in the same graph, which then serves as
     * a child graph node of another. */
    {
        CUgraph traced = NULL, ended = NULL, parent = NULL;
        CUgraphExec traced_exec = NULL, parent_exec = NULL;
        CUgraphNode t_memset = NULL, p_child = NULL;
        unsigned traced_base = 11000;
        void *traced_args[] = {&d_index, &traced_base, &count};
        MemsetNodeParams clear_copy = memset32(d_copy, 0);
        size_t held = 0;
        CHECK_CU(cuMemsetD32(d_copy, 0x5a5a5a5au, N));
        CHECK_CU(cuGraphCreate(&traced, 0));
        CHECK_CU(cuGraphAddMemsetNode(&t_memset, traced, NULL, 0, &clear_copy, ctx));
        CHECK_CU(cuStreamBeginCaptureToGraph(stream, traced, &t_memset, NULL, 1,
                                             2 /* relaxed */));
        CHECK_CU(cuLaunchKernel(fill_index, N / 128, 1, 1, 128, 1, 1, 0, stream, traced_args, NULL));
        CHECK_CU(cuMemcpyDtoDAsync(d_copy, d_index, N * 4, stream));
        CHECK_CU(cuStreamEndCapture(stream, &ended));
        CHECK_TRUE(ended == traced);
        CHECK_CU(cuGraphGetNodes(traced, NULL, &held));
        CHECK_EQ_INT((int)held, 3);
        /* Recorded, not run. */
        CHECK_EQ_INT(mismatches(d_copy, 0x5a5a5a5au, 1), 0);
        CHECK_CU(cuGraphInstantiateWithFlags(&traced_exec, traced, 0));
        CHECK_CU(cuGraphLaunch(traced_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, traced_base, 0), 0);
        CHECK_CU(cuMemsetD32(d_copy, 0, N));
        CHECK_CU(cuGraphCreate(&parent, 0));
        CHECK_CU(cuGraphAddChildGraphNode(&p_child, parent, NULL, 0, traced));
        CHECK_CU(cuGraphInstantiateWithFlags(&parent_exec, parent, 0));
        CHECK_CU(cuGraphLaunch(parent_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, traced_base, 0), 0);
        CHECK_CU(cuGraphExecDestroy(parent_exec));
        CHECK_CU(cuGraphExecDestroy(traced_exec));
        CHECK_CU(cuGraphDestroy(parent));
        CHECK_CU(cuGraphDestroy(traced));
    }

    /* Kernel node attributes: a priority and an access policy window set
     * and read back, copied to another kernel node, and the graph runs. */
    {
        CUgraph ag = NULL;
        CUgraphExec age = NULL;
        CUgraphNode k1 = NULL, k2 = NULL;
        void *args[] = {&d_index, &base, &count};
        KernelNodeParams kp = fill_index_node(fill_index, args);
        unsigned value[16], got[16];
        float hit = 0.5f;
        CHECK_CU(cuGraphCreate(&ag, 0));
        CHECK_CU(cuGraphAddKernelNode_v2(&k1, ag, NULL, 0, &kp));
        CHECK_CU(cuGraphAddKernelNode_v2(&k2, ag, &k1, 1, &kp));
        memset(value, 0, sizeof value);
        value[0] = (unsigned)-1;
        CHECK_CU(cuGraphKernelNodeSetAttribute(k1, ATTR_PRIORITY, value));
        memset(got, 0x5a, sizeof got);
        CHECK_CU(cuGraphKernelNodeGetAttribute(k1, ATTR_PRIORITY, got));
        CHECK_EQ_INT((int)got[0], -1);
        memset(value, 0, sizeof value);
        value[0] = (unsigned)d_index;
        value[1] = (unsigned)(d_index >> 32);
        value[2] = 4096;
        memcpy(&value[4], &hit, 4);
        value[5] = 2; /* persisting; a miss may not be */
        value[6] = 1; /* streaming */
        CHECK_CU(cuGraphKernelNodeSetAttribute(k1, ATTR_ACCESS_POLICY_WINDOW, value));
        CHECK_CU(cuGraphKernelNodeCopyAttributes(k2, k1));
        memset(got, 0x5a, sizeof got);
        CHECK_CU(cuGraphKernelNodeGetAttribute(k2, ATTR_PRIORITY, got));
        CHECK_EQ_INT((int)got[0], -1);
        memset(got, 0x5a, sizeof got);
        CHECK_CU(cuGraphKernelNodeGetAttribute(k2, ATTR_ACCESS_POLICY_WINDOW, got));
        CHECK_TRUE(got[0] == value[0] && got[1] == value[1] && got[2] == 4096 && got[3] == 0);
        CHECK_TRUE(got[5] == 2 && got[6] == 1);
        CHECK_CU(cuGraphInstantiateWithFlags(&age, ag, 0));
        CHECK_CU(cuGraphLaunch(age, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_index, base, 0), 0);
        {
            /* An event on a kernel node. */
            CUevent node_event;
            CHECK_CU(cuEventCreate(&node_event, 0));
            memset(value, 0, sizeof value);
            memcpy(value, &node_event, sizeof node_event);
            int programmatic = cuGraphKernelNodeSetAttribute(k1, ATTR_PROGRAMMATIC_EVENT, value);
            int completion = cuGraphKernelNodeSetAttribute(k1, 12, value);
            printf("kernel node attributes: a programmatic event %d, a launch completion event %d\n",
                   programmatic, completion);
            /* Driver 580 on the H200: a launch's events are no node's. */
            CHECK_EQ_INT(programmatic, CUDA_ERROR_INVALID_VALUE);
            CHECK_EQ_INT(completion, CUDA_ERROR_INVALID_VALUE);
            CHECK_CU(cuEventDestroy(node_event));
        }
        CHECK_CU(cuGraphExecDestroy(age));
        CHECK_CU(cuGraphDestroy(ag));
    }

    /* Node setters: event nodes, a child graph node, enabled nodes. */
    {
        CUgraph g = NULL, kid = NULL, same_shape = NULL, other_shape = NULL;
        CUgraphExec ge = NULL;
        CUgraphNode n_set = NULL, n_rec = NULL, n_kid = NULL, k_set = NULL, s_set = NULL,
                    o_set = NULL, o_empty = NULL;
        CUevent in_graph, in_exec, start, got = NULL;
        float ms = -1;
        MemsetNodeParams set7 = memset32(d_copy, 7), kid5 = memset32(d_child, 5),
                         kid9 = memset32(d_child, 9);
        CHECK_CU(cuEventCreate(&in_graph, 0));
        CHECK_CU(cuEventCreate(&in_exec, 0));
        CHECK_CU(cuEventCreate(&start, 0));
        CHECK_CU(cuGraphCreate(&kid, 0));
        CHECK_CU(cuGraphAddMemsetNode(&k_set, kid, NULL, 0, &kid5, ctx));
        CHECK_CU(cuGraphCreate(&same_shape, 0));
        CHECK_CU(cuGraphAddMemsetNode(&s_set, same_shape, NULL, 0, &kid9, ctx));
        CHECK_CU(cuGraphCreate(&other_shape, 0));
        CHECK_CU(cuGraphAddMemsetNode(&o_set, other_shape, NULL, 0, &kid9, ctx));
        CHECK_CU(cuGraphAddEmptyNode(&o_empty, other_shape, &o_set, 1));
        CHECK_CU(cuGraphCreate(&g, 0));
        CHECK_CU(cuGraphAddMemsetNode(&n_set, g, NULL, 0, &set7, ctx));
        CHECK_CU(cuGraphAddEventRecordNode(&n_rec, g, &n_set, 1, event));
        CHECK_CU(cuGraphAddChildGraphNode(&n_kid, g, &n_rec, 1, kid));
        CHECK_CU(cuGraphEventRecordNodeSetEvent(n_rec, in_graph));
        CHECK_CU(cuGraphEventRecordNodeGetEvent(n_rec, &got));
        CHECK_TRUE(got == in_graph);
        CHECK_RC(cuGraphEventWaitNodeSetEvent(n_rec, in_graph), CUDA_ERROR_INVALID_VALUE);
        CHECK_CU(cuGraphInstantiateWithFlags(&ge, g, 0));
        CHECK_CU(cuGraphExecEventRecordNodeSetEvent(ge, n_rec, in_exec));
        CHECK_CU(cuGraphExecChildGraphNodeSetParams(ge, n_kid, same_shape));
        CHECK_CU_FAILS(cuGraphExecChildGraphNodeSetParams(ge, n_kid, other_shape));
        CHECK_CU(cuMemsetD32(d_child, 0, N));
        CHECK_CU(cuEventRecord(start, stream));
        CHECK_CU(cuGraphLaunch(ge, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_CU(cuEventElapsedTime(&ms, start, in_exec));
        CHECK_RC(cuEventElapsedTime(&ms, start, in_graph), CUDA_ERROR_INVALID_HANDLE);
        CHECK_EQ_INT(mismatches(d_child, 9, 1), 0);
        CHECK_EQ_INT(mismatches(d_copy, 7, 1), 0);
        /* The graph's own event, through the generic call. */
        GraphNodeParams generic;
        memset(&generic, 0, sizeof generic);
        generic.type = NODE_TYPE_EVENT_RECORD;
        memcpy(&generic.u, &in_graph, sizeof in_graph);
        CHECK_CU(cuGraphExecNodeSetParams(ge, n_rec, &generic));
        CHECK_CU(cuGraphNodeSetParams(n_rec, &generic));
        /* The memset disabled, then enabled again. */
        unsigned enabled = 9;
        CHECK_CU(cuGraphNodeGetEnabled(ge, n_set, &enabled));
        CHECK_EQ_INT((int)enabled, 1);
        CHECK_CU(cuGraphNodeSetEnabled(ge, n_set, 0));
        CHECK_CU(cuGraphNodeGetEnabled(ge, n_set, &enabled));
        CHECK_EQ_INT((int)enabled, 0);
        CHECK_CU_FAILS(cuGraphNodeSetEnabled(ge, n_rec, 0));
        CHECK_CU(cuMemsetD32(d_copy, 0, N));
        CHECK_CU(cuGraphLaunch(ge, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, 0, 1), 0);
        CHECK_CU(cuEventElapsedTime(&ms, start, in_graph));
        CHECK_CU(cuGraphNodeSetEnabled(ge, n_set, 1));
        CHECK_CU(cuGraphLaunch(ge, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(mismatches(d_copy, 7, 1), 0);
        CHECK_CU(cuGraphExecDestroy(ge));
        CHECK_CU(cuGraphDestroy(g));
        CHECK_CU(cuGraphDestroy(other_shape));
        CHECK_CU(cuGraphDestroy(same_shape));
        CHECK_CU(cuGraphDestroy(kid));
        CHECK_CU(cuEventDestroy(start));
        CHECK_CU(cuEventDestroy(in_exec));
        CHECK_CU(cuEventDestroy(in_graph));
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
