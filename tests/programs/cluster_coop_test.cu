/* cluster_coop_test: what frameworks at full strength ask of a Hopper GPU
 * (issue 10), from an nvcc runtime program (static cudart), natively and
 * through rgpu:
 *   - thread-block clusters of 2 whose blocks read each other's shared
 *     memory (distributed shared memory), the cluster shape given at
 *     compile time (__cluster_dims__) and at launch time (cudaLaunchKernelEx
 *     with cudaLaunchAttributeClusterDimension), and
 *     cudaOccupancyMaxActiveClusters for both;
 *   - a cooperative launch (cudaLaunchCooperativeKernel) of as many blocks
 *     as the device holds at once, with a grid-wide barrier between each
 *     block's write and its read of another block's.
 * For the GPU host (sm_90); not built on CI.
 *
 *   nvcc -arch=sm_90 -cudart static -o cluster_coop_test cluster_coop_test.cu
 *
 * Prints one line per check ("ok line N: ..." or "FAIL line N: ..."), then
 * "cluster_coop_test: N checks passed" (exit 0) or "cluster_coop_test: N
 * checks failed, M passed" (exit 1). */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <vector>

namespace cg = cooperative_groups;

static int passed, failed;

static bool check(int line, bool ok, const char *what) {
    if (ok) {
        passed++;
        printf("ok line %d: %s\n", line, what);
    } else {
        failed++;
        printf("FAIL line %d: %s\n", line, what);
    }
    return ok;
}

static bool check_cuda(int line, const char *what, cudaError_t rc) {
    if (rc == cudaSuccess) return check(line, true, what);
    failed++;
    printf("FAIL line %d: %s: %s (%s)\n", line, what, cudaGetErrorName(rc),
           cudaGetErrorString(rc));
    return false;
}

#define CK(call) check_cuda(__LINE__, #call, (call))

/* Threads per block, blocks of the cluster launches (32 clusters of 2). */
constexpr int kThreads = 128;
constexpr int kClusterBlocks = 64;
constexpr unsigned kClusterSize = 2;

/* What block `block` writes for thread `thread`: never 0 or -1 (the
 * output buffers start as -1), different for every block and thread. */
__host__ __device__ inline int slot_value(unsigned block, unsigned thread) {
    return (int)(block * 1000u + thread + 1u);
}

/* Each block fills its shared tile; after the cluster barrier every thread
 * reads its partner block's tile (rank ^ 1) through distributed shared
 * memory, one element further on so that no thread reads the element
 * written by the thread of the same index. out[block][thread] gets what it
 * read, meta[block] the block's rank in its cluster and the cluster size
 * (rank | size << 8). A launch that is not a cluster of 2 skips the remote
 * read (rank 1 of a one-block cluster does not exist) and leaves -1. */
__device__ void read_partner_tile(int *tile, int *out, int *meta) {
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    const unsigned size = cluster.num_blocks();
    tile[threadIdx.x] = slot_value(blockIdx.x, threadIdx.x);
    cluster.sync();
    int seen = -1;
    if (size == kClusterSize) {
        const int *remote = cluster.map_shared_rank(tile, (int)(rank ^ 1u));
        seen = remote[(threadIdx.x + 1) % kThreads];
    }
    out[blockIdx.x * kThreads + threadIdx.x] = seen;
    if (threadIdx.x == 0) meta[blockIdx.x] = (int)(rank | size << 8);
    /* A block's shared memory must outlive its partner's reads of it. */
    cluster.sync();
}

/* The cluster shape fixed at compile time. */
__global__ void __cluster_dims__(2, 1, 1) dsm_compile_time(int *out, int *meta) {
    __shared__ int tile[kThreads];
    read_partner_tile(tile, out, meta);
}

/* The same, the cluster shape given by the launch. */
__global__ void dsm_launch_time(int *out, int *meta) {
    __shared__ int tile[kThreads];
    read_partner_tile(tile, out, meta);
}

/* Every block writes its row of `slots`, waits for the whole grid, then
 * copies the next block's row (the last block the first's) into `seen`. */
__global__ void grid_exchange(int *slots, int *seen) {
    cg::grid_group grid = cg::this_grid();
    const unsigned block = blockIdx.x, next = (blockIdx.x + 1) % gridDim.x;
    slots[block * blockDim.x + threadIdx.x] = slot_value(block, threadIdx.x);
    grid.sync();
    seen[block * blockDim.x + threadIdx.x] = slots[next * blockDim.x + threadIdx.x];
}

/* Checks what a cluster launch left in d_out / d_meta; `how` names it. */
static void check_partner_reads(int line, const char *how, const int *d_out, const int *d_meta) {
    std::vector<int> out(kClusterBlocks * kThreads), meta(kClusterBlocks);
    if (!check_cuda(line, "cudaMemcpy(out)",
                    cudaMemcpy(out.data(), d_out, out.size() * sizeof(int),
                               cudaMemcpyDeviceToHost)) ||
        !check_cuda(line, "cudaMemcpy(meta)",
                    cudaMemcpy(meta.data(), d_meta, meta.size() * sizeof(int),
                               cudaMemcpyDeviceToHost)))
        return;
    long bad = 0;
    char first[200] = "";
    for (unsigned b = 0; b < (unsigned)kClusterBlocks; b++) {
        const int expected_meta = (int)((b % kClusterSize) | kClusterSize << 8);
        if (meta[b] != expected_meta) {
            if (bad == 0)
                snprintf(first, sizeof first,
                         "block %u: rank %d in a cluster of %d, expected rank %u of %u", b,
                         meta[b] & 0xff, meta[b] >> 8, b % kClusterSize, kClusterSize);
            bad++;
        }
        for (unsigned t = 0; t < (unsigned)kThreads; t++) {
            const int expected = slot_value(b ^ 1u, (t + 1) % kThreads);
            const int got = out[b * kThreads + t];
            if (got != expected) {
                if (bad == 0)
                    snprintf(first, sizeof first, "block %u thread %u read %d, expected %d", b,
                             t, got, expected);
                bad++;
            }
        }
    }
    char what[400];
    if (bad)
        snprintf(what, sizeof what, "%s: %ld wrong values, the first: %s", how, bad, first);
    else
        snprintf(what, sizeof what,
                 "%s: %d blocks x %d threads each read their partner block's shared memory",
                 how, kClusterBlocks, kThreads);
    check(line, bad == 0, what);
}

static void cluster_part(void) {
    int *d_out = NULL, *d_meta = NULL;
    const size_t out_bytes = (size_t)kClusterBlocks * kThreads * sizeof(int);
    const size_t meta_bytes = (size_t)kClusterBlocks * sizeof(int);
    if (!CK(cudaMalloc(&d_out, out_bytes)) || !CK(cudaMalloc(&d_meta, meta_bytes))) {
        cudaFree(d_out);
        return;
    }
    char what[200];

    /* Compile-time cluster shape: an ordinary launch. */
    CK(cudaMemset(d_out, 0xff, out_bytes));
    CK(cudaMemset(d_meta, 0xff, meta_bytes));
    dsm_compile_time<<<kClusterBlocks, kThreads>>>(d_out, d_meta);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    check_partner_reads(__LINE__, "__cluster_dims__(2,1,1) launch", d_out, d_meta);

    /* Launch-time cluster shape. The buffers are reset first: both kernels
     * leave the same values. */
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = kClusterSize;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kClusterBlocks);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = 0;
    config.stream = 0;
    config.attrs = &attribute;
    config.numAttrs = 1;
    CK(cudaMemset(d_out, 0xff, out_bytes));
    CK(cudaMemset(d_meta, 0xff, meta_bytes));
    CK(cudaLaunchKernelEx(&config, dsm_launch_time, d_out, d_meta));
    CK(cudaDeviceSynchronize());
    check_partner_reads(__LINE__, "cudaLaunchKernelEx with a cluster dimension of 2", d_out,
                        d_meta);

    /* How many clusters fit at once: the kernel's own shape (no attribute),
     * then the launch's. */
    int clusters = -1;
    cudaLaunchConfig_t plain = config;
    plain.attrs = NULL;
    plain.numAttrs = 0;
    if (CK(cudaOccupancyMaxActiveClusters(&clusters, (const void *)dsm_compile_time, &plain))) {
        snprintf(what, sizeof what, "cudaOccupancyMaxActiveClusters(dsm_compile_time) = %d > 0",
                 clusters);
        check(__LINE__, clusters > 0, what);
    }
    clusters = -1;
    if (CK(cudaOccupancyMaxActiveClusters(&clusters, (const void *)dsm_launch_time, &config))) {
        snprintf(what, sizeof what,
                 "cudaOccupancyMaxActiveClusters(dsm_launch_time, cluster of 2) = %d > 0",
                 clusters);
        check(__LINE__, clusters > 0, what);
    }
    CK(cudaFree(d_out));
    CK(cudaFree(d_meta));
}

static void cooperative_part(int sms) {
    int per_sm = 0;
    char what[300];
    if (!CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_exchange, kThreads, 0)))
        return;
    snprintf(what, sizeof what, "grid_exchange: %d blocks of %d threads per SM (> 0)", per_sm,
             kThreads);
    if (!check(__LINE__, per_sm > 0, what)) return;
    /* Every block must be resident at once for grid.sync(). */
    const int blocks = per_sm * sms;
    const size_t bytes = (size_t)blocks * kThreads * sizeof(int);
    int *d_slots = NULL, *d_seen = NULL;
    if (!CK(cudaMalloc(&d_slots, bytes)) || !CK(cudaMalloc(&d_seen, bytes))) {
        cudaFree(d_slots);
        return;
    }
    CK(cudaMemset(d_slots, 0xff, bytes));
    CK(cudaMemset(d_seen, 0xff, bytes));
    void *args[] = {&d_slots, &d_seen};
    CK(cudaLaunchCooperativeKernel((const void *)grid_exchange, dim3(blocks), dim3(kThreads), args,
                                   0, 0));
    CK(cudaDeviceSynchronize());
    std::vector<int> seen((size_t)blocks * kThreads);
    if (CK(cudaMemcpy(seen.data(), d_seen, bytes, cudaMemcpyDeviceToHost))) {
        long bad = 0;
        char first[160] = "";
        for (unsigned b = 0; b < (unsigned)blocks; b++) {
            const unsigned next = (b + 1) % (unsigned)blocks;
            for (unsigned t = 0; t < (unsigned)kThreads; t++) {
                const int expected = slot_value(next, t);
                const int got = seen[(size_t)b * kThreads + t];
                if (got != expected) {
                    if (bad == 0)
                        snprintf(first, sizeof first, "block %u thread %u read %d, expected %d",
                                 b, t, got, expected);
                    bad++;
                }
            }
        }
        if (bad)
            snprintf(what, sizeof what,
                     "cooperative launch of %d blocks (%d SMs x %d): %ld wrong values, the "
                     "first: %s",
                     blocks, sms, per_sm, bad, first);
        else
            snprintf(what, sizeof what,
                     "cooperative launch of %d blocks (%d SMs x %d): after grid.sync() each "
                     "block read the next block's %d values",
                     blocks, sms, per_sm, kThreads);
        check(__LINE__, bad == 0, what);
    }
    CK(cudaFree(d_slots));
    CK(cudaFree(d_seen));
}

int main(void) {
    int dev = 0, major = 0, minor = 0, sms = 0, cluster_launch = -1, cooperative = -1;
    char what[200];
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, dev));
    CK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, dev));
    snprintf(what, sizeof what, "compute capability %d.%d (>= 9.0), %d SMs (> 0)", major, minor,
             sms);
    check(__LINE__, major >= 9 && sms > 0, what);
    snprintf(what, sizeof what, "cudaDevAttrClusterLaunch = %d (1)", cluster_launch);
    check(__LINE__, cluster_launch == 1, what);
    snprintf(what, sizeof what, "cudaDevAttrCooperativeLaunch = %d (1)", cooperative);
    check(__LINE__, cooperative == 1, what);

    cluster_part();
    if (sms > 0) cooperative_part(sms);

    if (failed) {
        printf("cluster_coop_test: %d checks failed, %d passed\n", failed, passed);
        return 1;
    }
    printf("cluster_coop_test: %d checks passed\n", passed);
    return 0;
}
