/* graph_test: CUDA graphs by stream capture (issue 10), as PyTorch's
 * torch.cuda.graph uses them.
 *
 * Usage: graph_test --ptx reference_kernels.ptx [--no-mapped-memory]
 *
 * On a stream: begin capture (the stream then reports ACTIVE, with a
 * capture id); a memset of a buffer, rgpu_fill_index over it and
 * rgpu_scale x2 of a float buffer are recorded, not run (the buffers keep
 * their old contents); end capture (NONE again), instantiate, launch three
 * times: the index buffer holds base + i and the floats were doubled
 * three times; the same graph launched on another stream works too;
 * destroyed, it cannot be launched. A host function captured into a graph
 * runs once per replay, in order with the work around it, and so do host
 * functions queued directly.
 *
 * --no-mapped-memory: through rgpu's network carrier, which shares no
 * memory with the host, so page-locked memory is the program's own and no
 * graph reaches it. In a capture, a memset or device copy naming it, a
 * copy from or to it and a host function are refused with
 * CUDA_ERROR_NOT_SUPPORTED at the call, and the capture goes on without
 * them (its graph holds the rest and runs); directly on a stream, host
 * functions run in order with copies from and to page-locked memory, a
 * stream memory operation naming it as device memory is refused, and a
 * device copy or memset naming it so copies or fills the program's own
 * bytes.
 * Everything else runs as without it.
 *
 * Prints "graph_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"

typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuStreamIsCapturing(CUstream stream, int *status);
CUresult cuStreamGetCaptureInfo(CUstream stream, int *status, unsigned long long *id);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuGraphGetNodes(CUgraph graph, void **nodes, size_t *count);
CUresult cuGraphGetRootNodes(CUgraph graph, void **nodes, size_t *count);
typedef struct CUgraphNode_st *CUgraphNode;
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, unsigned long long *id,
                                   CUgraph *graph, const CUgraphNode **deps, size_t *count);
CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int *status, unsigned long long *id,
                                   CUgraph *graph, const CUgraphNode **deps, const void **edges,
                                   size_t *count);
CUresult cuStreamUpdateCaptureDependencies(CUstream stream, CUgraphNode *deps, size_t count,
                                           unsigned flags);
CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                             size_t count);
CUresult cuGraphNodeGetType(CUgraphNode node, int *type);
CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, size_t *count);
CUresult cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode *deps, size_t *count);
CUresult cuGraphGetEdges(CUgraph graph, CUgraphNode *from, CUgraphNode *to, size_t *count);
#define NODE_KERNEL 0
#define NODE_MEMSET 2
#define NODE_EMPTY 5
#define SET_CAPTURE_DEPENDENCIES 1
#ifndef CUDA_ERROR_NOT_SUPPORTED
#define CUDA_ERROR_NOT_SUPPORTED 801
#endif
CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void *), void *data);
CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, unsigned value, unsigned flags);
CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, unsigned value, unsigned flags);

#define N 4096u
#define CAPTURE_MODE_THREAD_LOCAL 1

/* A host function that counts its calls, notes the first page-locked
 * word (written by the stream before it) and writes the second (which the
 * stream copies after it). */
struct ordered {
    volatile unsigned *words;
    unsigned first_word;
    int calls;
};
static void look_then_write(void *data) {
    struct ordered *o = data;
    o->calls++;
    o->first_word = o->words[0];
    o->words[1] = 777;
}

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    int mapped_memory = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-mapped-memory")) mapped_memory = 0;
        else if (i + 1 < argc && !strcmp(argv[i], "--ptx")) ptx_path = argv[++i];
    }
    char *ptx = ptx_path ? read_file(ptx_path) : NULL;
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction fill_index, scale;
    if (!ptx || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, ptx) ||
        cuModuleGetFunction(&fill_index, module, "rgpu_fill_index") ||
        cuModuleGetFunction(&scale, module, "rgpu_scale")) {
        printf("FAIL: no CUDA context or kernels (usage: graph_test --ptx PTX "
               "[--no-mapped-memory])\n");
        return 1;
    }
    static uint32_t indices[N];
    static float floats[N], expected[N];
    for (unsigned i = 0; i < N; i++) floats[i] = (float)i * 0.5f;
    CUdeviceptr d_index = 0, d_float = 0;
    CUstream stream, other;
    REQUIRE_CU(cuMemAlloc(&d_index, N * 4));
    REQUIRE_CU(cuMemAlloc(&d_float, N * 4));
    REQUIRE_CU(cuMemsetD32(d_index, 0x11111111u, N));
    REQUIRE_CU(cuMemcpyHtoD(d_float, floats, N * 4));
    REQUIRE_CU(cuStreamCreate(&stream, 0));
    REQUIRE_CU(cuStreamCreate(&other, 0));

    int status = -1;
    unsigned long long id = 0;
    CHECK_CU(cuStreamIsCapturing(stream, &status));
    CHECK_EQ_INT(status, 0);
    CHECK_CU(cuStreamBeginCapture_v2(stream, CAPTURE_MODE_THREAD_LOCAL));
    CHECK_CU(cuStreamIsCapturing(stream, &status));
    CHECK_EQ_INT(status, 1);
    CHECK_CU(cuStreamGetCaptureInfo(stream, &status, &id));
    CHECK_EQ_INT(status, 1);
    CHECK_TRUE(id != 0);
    CHECK_CU(cuStreamIsCapturing(other, &status));
    CHECK_EQ_INT(status, 0);
    /* Captured, not run. */
    unsigned base = 1000, count = N;
    float factor = 2.0f;
    void *fill_params[] = {&d_index, &base, &count};
    void *scale_params[] = {&d_float, &factor, &count};
    CHECK_CU(cuMemsetD32Async(d_index, 0, N, stream));
    CHECK_CU(cuLaunchKernel(fill_index, N / 128, 1, 1, 128, 1, 1, 0, stream, fill_params, NULL));
    CHECK_CU(cuLaunchKernel(scale, N / 128, 1, 1, 128, 1, 1, 0, stream, scale_params, NULL));
    CUgraph graph = NULL;
    CHECK_CU(cuStreamEndCapture(stream, &graph));
    CHECK_TRUE(graph != NULL);
    /* The driver made its nodes, a memset and two kernels (PyTorch asks
     * how many at the end of each capture). */
    size_t nodes = 0;
    CHECK_CU(cuGraphGetNodes(graph, NULL, &nodes));
    CHECK_EQ_INT(nodes, 3);
    /* One root: the memset (XLA checks that a trace recorded any). */
    size_t roots = 0;
    CHECK_CU(cuGraphGetRootNodes(graph, NULL, &roots));
    CHECK_EQ_INT(roots, 1);
    CHECK_CU(cuStreamIsCapturing(stream, &status));
    CHECK_EQ_INT(status, 0);
    CHECK_CU(cuMemcpyDtoH(indices, d_index, N * 4));
    CHECK_EQ_INT(indices[7], 0x11111111u);

    CUgraphExec exec = NULL;
    CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
    for (int i = 0; i < 3; i++) CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuMemcpyDtoH(indices, d_index, N * 4));
    CHECK_CU(cuMemcpyDtoH(expected, d_float, N * 4));
    int index_mismatches = 0, float_mismatches = 0;
    for (unsigned i = 0; i < N; i++) {
        if (indices[i] != base + i) index_mismatches++;
        if (expected[i] != floats[i] * 8.0f) float_mismatches++;
    }
    CHECK_EQ_INT(index_mismatches, 0);
    CHECK_EQ_INT(float_mismatches, 0);

    /* The same graph on another stream: doubled once more. */
    CHECK_CU(cuGraphLaunch(exec, other));
    CHECK_CU(cuStreamSynchronize(other));
    CHECK_CU(cuMemcpyDtoH(expected, d_float, N * 4));
    CHECK_TRUE(expected[3] == floats[3] * 16.0f);

    CHECK_CU(cuGraphExecDestroy(exec));
    CHECK_CU(cuGraphDestroy(graph));

    /* What a capture records into, and what its next node will depend on
     * (cuStreamGetCaptureInfo), named as the driver holds them: the
     * capturing graph and the kernel just captured. An empty node added to
     * that graph after the kernel, made the capture's dependency, comes
     * before what is captured next; the capture ends in that same graph,
     * whose nodes, roots, edges and node edges are then named and typed,
     * and which runs as captured: memset -> fill -> empty -> scale. */
    {
        unsigned named_base = 2000;
        void *named_fill[] = {&d_index, &named_base, &count};
        CUgraph capturing = NULL, capturing_again = NULL, ended = NULL;
        const CUgraphNode *deps = NULL, *deps_again = NULL;
        const void *edges_again = NULL;
        size_t ndeps = 0, ndeps_again = 0;
        int type = -1;
        CHECK_CU(cuStreamBeginCapture_v2(stream, CAPTURE_MODE_THREAD_LOCAL));
        CHECK_CU(cuMemsetD32Async(d_index, 0, N, stream));
        CHECK_CU(cuLaunchKernel(fill_index, N / 128, 1, 1, 128, 1, 1, 0, stream, named_fill, NULL));
        CHECK_CU(cuStreamGetCaptureInfo_v2(stream, &status, &id, &capturing, &deps, &ndeps));
        CHECK_EQ_INT(status, 1);
        CHECK_TRUE(capturing != NULL);
        CHECK_EQ_INT((int)ndeps, 1);
        CUgraphNode fill_node = ndeps == 1 && deps ? deps[0] : NULL;
        CHECK_CU(cuGraphNodeGetType(fill_node, &type));
        CHECK_EQ_INT(type, NODE_KERNEL);
        CUgraphNode joint = NULL;
        CHECK_CU(cuGraphAddEmptyNode(&joint, capturing, &fill_node, 1));
        CHECK_CU(cuStreamUpdateCaptureDependencies(stream, &joint, 1, SET_CAPTURE_DEPENDENCIES));
        CHECK_CU(cuStreamGetCaptureInfo_v3(stream, &status, &id, &capturing_again, &deps_again,
                                           &edges_again, &ndeps_again));
        CHECK_TRUE(capturing_again == capturing);
        CHECK_TRUE(ndeps_again == 1 && deps_again && deps_again[0] == joint);
        CHECK_TRUE(edges_again != NULL);
        CHECK_CU(cuLaunchKernel(scale, N / 128, 1, 1, 128, 1, 1, 0, stream, scale_params, NULL));
        CHECK_CU(cuStreamEndCapture(stream, &ended));
        CHECK_TRUE(ended == capturing);
        CUgraphNode all[8], roots_named[8], from[8], to[8], edge_nodes[8];
        size_t n_all = 8, n_roots = 8, n_edges = 8, n_edge_nodes = 8;
        CHECK_CU(cuGraphGetNodes(ended, (void **)all, &n_all));
        CHECK_EQ_INT((int)n_all, 4);
        unsigned kinds = 0, found = 0;
        for (size_t i = 0; i < n_all && i < 8; i++) {
            if (cuGraphNodeGetType(all[i], &type) == CUDA_SUCCESS && type >= 0 && type < 32)
                kinds |= 1u << type;
            found += all[i] == fill_node || all[i] == joint;
        }
        CHECK_EQ_INT(kinds, (1u << NODE_KERNEL) | (1u << NODE_MEMSET) | (1u << NODE_EMPTY));
        CHECK_EQ_INT(found, 2);
        CHECK_CU(cuGraphGetRootNodes(ended, (void **)roots_named, &n_roots));
        CHECK_EQ_INT((int)n_roots, 1);
        CHECK_CU(cuGraphNodeGetType(roots_named[0], &type));
        CHECK_EQ_INT(type, NODE_MEMSET);
        CHECK_CU(cuGraphGetEdges(ended, from, to, &n_edges));
        CHECK_EQ_INT((int)n_edges, 3);
        CHECK_CU(cuGraphNodeGetDependencies(joint, edge_nodes, &n_edge_nodes));
        CHECK_TRUE(n_edge_nodes == 1 && edge_nodes[0] == fill_node);
        n_edge_nodes = 8;
        CHECK_CU(cuGraphNodeGetDependentNodes(joint, edge_nodes, &n_edge_nodes));
        CHECK_EQ_INT((int)n_edge_nodes, 1);
        CHECK_CU(cuGraphNodeGetType(edge_nodes[0], &type));
        CHECK_EQ_INT(type, NODE_KERNEL);
        CUgraphExec named_exec = NULL;
        CHECK_CU(cuMemcpyHtoD(d_float, floats, N * 4));
        CHECK_CU(cuGraphInstantiateWithFlags(&named_exec, ended, 0));
        CHECK_CU(cuGraphLaunch(named_exec, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_CU(cuMemcpyDtoH(indices, d_index, N * 4));
        CHECK_CU(cuMemcpyDtoH(expected, d_float, N * 4));
        index_mismatches = float_mismatches = 0;
        for (unsigned i = 0; i < N; i++) {
            if (indices[i] != named_base + i) index_mismatches++;
            if (expected[i] != floats[i] * 2.0f) float_mismatches++;
        }
        CHECK_EQ_INT(index_mismatches, 0);
        CHECK_EQ_INT(float_mismatches, 0);
        CHECK_CU(cuGraphExecDestroy(named_exec));
        CHECK_CU(cuGraphDestroy(ended));
    }

    /* A stream that waits on an event recorded in a capture joins it (and
     * reports so) until the capture ends on the stream that began it. */
    {
        CUevent forked = NULL, joined = NULL;
        CUgraph fork_graph = NULL;
        unsigned long long first = 0, second = 0;
        REQUIRE_CU(cuEventCreate(&forked, 0));
        REQUIRE_CU(cuEventCreate(&joined, 0));
        CHECK_CU(cuStreamBeginCapture_v2(stream, CAPTURE_MODE_THREAD_LOCAL));
        CHECK_CU(cuEventRecord(forked, stream));
        CHECK_CU(cuStreamWaitEvent(other, forked, 0));
        CHECK_CU(cuStreamIsCapturing(other, &status));
        CHECK_EQ_INT(status, 1);
        CHECK_CU(cuStreamGetCaptureInfo(stream, &status, &first));
        CHECK_CU(cuStreamGetCaptureInfo(other, &status, &second));
        CHECK_TRUE(first != 0 && first == second);
        CHECK_CU(cuMemsetD32Async(d_index, 5, N, other));
        CHECK_CU(cuEventRecord(joined, other));
        CHECK_CU(cuStreamWaitEvent(stream, joined, 0));
        CHECK_CU(cuStreamEndCapture(stream, &fork_graph));
        CHECK_CU(cuStreamIsCapturing(other, &status));
        CHECK_EQ_INT(status, 0);
        CHECK_CU(cuGraphDestroy(fork_graph));
        CHECK_CU(cuEventDestroy(forked));
        CHECK_CU(cuEventDestroy(joined));
    }

    /* A host function queued during a capture is part of the graph: not
     * run while capturing, run once per replay, in order (it sees the
     * memset before it; the copy after it sees what it wrote). */
    if (mapped_memory) {
        struct ordered seen = {NULL, 0, 0};
        CUgraph host_graph = NULL;
        CUgraphExec host_exec = NULL;
        CUdeviceptr d_word = 0;
        unsigned got = 0;
        REQUIRE_CU(cuMemAllocHost((void **)&seen.words, 8));
        REQUIRE_CU(cuMemAlloc(&d_word, 4));
        seen.words[0] = seen.words[1] = 0;
        CHECK_CU(cuStreamBeginCapture_v2(other, CAPTURE_MODE_THREAD_LOCAL));
        CHECK_CU(cuMemsetD32Async((CUdeviceptr)(uintptr_t)seen.words, 1234, 1, other));
        CHECK_CU(cuLaunchHostFunc(other, look_then_write, &seen));
        CHECK_CU(cuMemcpyDtoDAsync(d_word, (CUdeviceptr)(uintptr_t)(seen.words + 1), 4, other));
        CHECK_CU(cuStreamEndCapture(other, &host_graph));
        CHECK_EQ_INT(seen.calls, 0);
        CHECK_CU(cuGraphInstantiateWithFlags(&host_exec, host_graph, 0));
        for (int i = 0; i < 3; i++) CHECK_CU(cuGraphLaunch(host_exec, other));
        CHECK_CU(cuStreamSynchronize(other));
        CHECK_EQ_INT(seen.calls, 3);
        CHECK_EQ_INT((int)seen.first_word, 1234);
        CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
        CHECK_EQ_INT((int)got, 777);
        CHECK_CU(cuGraphExecDestroy(host_exec));
        CHECK_CU(cuGraphDestroy(host_graph));

        /* Directly on a stream, a few in a row: each after the work before
         * it, each before the work after it. */
        seen.calls = 0;
        seen.first_word = 0;
        for (int i = 0; i < 4; i++) {
            seen.words[1] = 0;
            CHECK_CU(cuMemsetD32Async((CUdeviceptr)(uintptr_t)seen.words, 4321u + i, 1, stream));
            CHECK_CU(cuLaunchHostFunc(stream, look_then_write, &seen));
            CHECK_CU(cuMemcpyDtoDAsync(d_word, (CUdeviceptr)(uintptr_t)(seen.words + 1), 4,
                                       stream));
            CHECK_CU(cuStreamSynchronize(stream));
            CHECK_EQ_INT((int)seen.first_word, (int)(4321u + i));
            got = 0;
            CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
            CHECK_EQ_INT((int)got, 777);
        }
        CHECK_EQ_INT(seen.calls, 4);

        /* Stream memory operations on device memory: a write, then a wait
         * that the write satisfies (CU_STREAM_WAIT_VALUE_EQ). */
        got = 0;
        CHECK_CU(cuStreamWriteValue32_v2(stream, d_word, 99, 0));
        CHECK_CU(cuStreamWaitValue32_v2(stream, d_word, 99, 0x1));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
        CHECK_EQ_INT((int)got, 99);
        CHECK_CU(cuMemFree(d_word));
        CHECK_CU(cuMemFreeHost((void *)(uintptr_t)seen.words));
    } else {
        /* The network carrier: refused at the call in a capture, which
         * goes on (its graph is the one memset of device memory). */
        struct ordered seen = {NULL, 0, 0};
        CUgraph host_graph = NULL;
        CUgraphExec host_exec = NULL;
        CUdeviceptr d_word = 0;
        CUdeviceptr pinned_word = 0;
        unsigned got = 0;
        size_t held = 0;
        REQUIRE_CU(cuMemAllocHost((void **)&seen.words, 8));
        REQUIRE_CU(cuMemAlloc(&d_word, 4));
        seen.words[0] = seen.words[1] = 0;
        pinned_word = (CUdeviceptr)(uintptr_t)seen.words;
        CHECK_CU(cuStreamBeginCapture_v2(other, CAPTURE_MODE_THREAD_LOCAL));
        CHECK_RC(cuMemsetD32Async(pinned_word, 1234, 1, other), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_RC(cuLaunchHostFunc(other, look_then_write, &seen), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_RC(cuMemcpyDtoDAsync(d_word, pinned_word + 4, 4, other), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_RC(cuMemcpyHtoDAsync(d_word, (const void *)(uintptr_t)(seen.words + 1), 4, other),
                 CUDA_ERROR_NOT_SUPPORTED);
        CHECK_RC(cuMemcpyDtoHAsync((void *)(uintptr_t)seen.words, d_word, 4, other),
                 CUDA_ERROR_NOT_SUPPORTED);
        CHECK_CU(cuMemsetD32Async(d_word, 4242, 1, other));
        CHECK_CU(cuStreamIsCapturing(other, &status));
        CHECK_EQ_INT(status, 1);
        CHECK_CU(cuStreamEndCapture(other, &host_graph));
        CHECK_CU(cuGraphGetNodes(host_graph, NULL, &held));
        CHECK_EQ_INT((int)held, 1);
        CHECK_CU(cuGraphInstantiateWithFlags(&host_exec, host_graph, 0));
        CHECK_CU(cuGraphLaunch(host_exec, other));
        CHECK_CU(cuStreamSynchronize(other));
        CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
        CHECK_EQ_INT((int)got, 4242);
        CHECK_EQ_INT(seen.calls, 0);
        CHECK_TRUE(seen.words[0] == 0 && seen.words[1] == 0);
        CHECK_CU(cuGraphExecDestroy(host_exec));
        CHECK_CU(cuGraphDestroy(host_graph));

        /* Directly on a stream, a few in a row: the device word copied
         * into the first page-locked word before each host function, the
         * second copied back after it. */
        for (int i = 0; i < 4; i++) {
            seen.words[1] = 0;
            CHECK_CU(cuMemsetD32Async(d_word, 4321u + i, 1, stream));
            CHECK_CU(cuMemcpyDtoHAsync((void *)(uintptr_t)seen.words, d_word, 4, stream));
            CHECK_CU(cuLaunchHostFunc(stream, look_then_write, &seen));
            CHECK_CU(cuMemcpyHtoDAsync(d_word, (const void *)(uintptr_t)(seen.words + 1), 4,
                                       stream));
            CHECK_CU(cuStreamSynchronize(stream));
            CHECK_EQ_INT((int)seen.first_word, (int)(4321u + i));
            got = 0;
            CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
            CHECK_EQ_INT((int)got, 777);
        }
        CHECK_EQ_INT(seen.calls, 4);
        /* Not device memory here: a stream memory operation naming it is
         * refused and leaves it alone; a device copy into it downloads the
         * program's own bytes, a memset fills them (XLA does both). */
        CHECK_RC(cuStreamWriteValue32_v2(stream, pinned_word, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT((int)seen.words[0], 4324);
        CHECK_CU(cuMemcpyDtoDAsync(pinned_word, d_word, 4, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT((int)seen.words[0], 777);
        CHECK_CU(cuMemsetD32Async(pinned_word, 1, 1, stream));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT((int)seen.words[0], 1);
        CHECK_EQ_INT((int)seen.words[1], 777);

        /* Stream memory operations on device memory, as above. */
        got = 0;
        CHECK_CU(cuStreamWriteValue32_v2(stream, d_word, 99, 0));
        CHECK_CU(cuStreamWaitValue32_v2(stream, d_word, 99, 0x1));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_CU(cuMemcpyDtoH(&got, d_word, 4));
        CHECK_EQ_INT((int)got, 99);
        CHECK_CU(cuMemFree(d_word));
        CHECK_CU(cuMemFreeHost((void *)(uintptr_t)seen.words));
    }
    CHECK_CU_FAILS(cuGraphLaunch(exec, stream));
    CHECK_CU(cuStreamDestroy(stream));
    CHECK_CU(cuStreamDestroy(other));
    CHECK_CU(cuMemFree(d_index));
    CHECK_CU(cuMemFree(d_float));
    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) return 1;
    printf("graph_test: %ld checks passed\n", checks_passed);
    return 0;
}
