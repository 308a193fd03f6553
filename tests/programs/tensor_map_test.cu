/* tensor_map_test: Hopper's tensor memory accelerator reading through a
 * tensor map (issue 10: XLA's and Triton's Hopper kernels), from an nvcc
 * runtime program (static cudart), natively and through rgpu:
 *   - cuTensorMapEncodeTiled (found with cudaGetDriverEntryPointByVersion,
 *     as the runtime and frameworks find it) describes a 64x64 float matrix;
 *     a kernel copies 16x16 tiles into shared memory with
 *     cp.async.bulk.tensor and writes them out: an inner tile, and one
 *     that runs past the matrix's corner (filled with zeros);
 *   - cuTensorMapReplaceAddress points the same map at a second matrix,
 *     and the kernel reads that one.
 * For the GPU host (sm_90); not built on CI.
 *
 *   nvcc -arch=sm_90a -cudart static -o tensor_map_test tensor_map_test.cu
 *
 * Prints one line per check, then "tensor_map_test: N checks passed"
 * (exit 0) or "tensor_map_test: N checks failed, M passed" (exit 1). */
#include <cuda.h>
#include <cuda/barrier>
#include <cuda_runtime.h>
#include <stdio.h>

#include <utility>
#include <vector>

using block_barrier = cuda::barrier<cuda::thread_scope_block>;
namespace cde = cuda::device::experimental;

constexpr int kEdge = 64, kTile = 16;

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
#define CHECK(ok, what) check(__LINE__, (ok), (what))
#define CHECK_CUDA(call) check(__LINE__, (call) == cudaSuccess, #call)
#define CHECK_CU(call) check(__LINE__, (call) == CUDA_SUCCESS, #call)

__global__ void copy_tile(const __grid_constant__ CUtensorMap map, int x, int y, float *out) {
    __shared__ alignas(128) float tile[kTile][kTile];
#pragma nv_diag_suppress static_var_with_dynamic_init
    __shared__ block_barrier bar;
    if (threadIdx.x == 0) {
        init(&bar, blockDim.x);
        cde::fence_proxy_async_shared_cta();
    }
    __syncthreads();
    block_barrier::arrival_token token;
    if (threadIdx.x == 0) {
        cde::cp_async_bulk_tensor_2d_global_to_shared(&tile, &map, x, y, bar);
        token = cuda::device::barrier_arrive_tx(bar, 1, sizeof(tile));
    } else {
        token = bar.arrive();
    }
    bar.wait(std::move(token));
    for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) out[i] = tile[i / kTile][i % kTile];
}

typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
typedef CUresult (*ReplaceAddress)(CUtensorMap *, void *);

/* The tile at column x, row y of a matrix whose element (r, c) is
 * base + r * kEdge + c; zero outside it. */
static int wrong_elements(const std::vector<float> &got, int x, int y, float base) {
    int wrong = 0;
    for (int r = 0; r < kTile; r++) {
        for (int c = 0; c < kTile; c++) {
            int row = y + r, col = x + c;
            float want = row < kEdge && col < kEdge ? base + row * kEdge + col : 0.0f;
            wrong += got[r * kTile + c] != want;
        }
    }
    return wrong;
}

static bool read_tile(const CUtensorMap &map, int x, int y, float *d_out, std::vector<float> &got) {
    copy_tile<<<1, 128>>>(map, x, y, d_out);
    return CHECK_CUDA(cudaGetLastError()) && CHECK_CUDA(cudaDeviceSynchronize()) &&
           CHECK_CUDA(cudaMemcpy(got.data(), d_out, got.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost));
}

int main() {
    EncodeTiled encode = nullptr;
    ReplaceAddress replace = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (!CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode,
                                                     12000, cudaEnableDefault, &found)) ||
        !CHECK(found == cudaDriverEntryPointSuccess && encode, "cuTensorMapEncodeTiled found") ||
        !CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapReplaceAddress",
                                                     (void **)&replace, 12000, cudaEnableDefault,
                                                     &found)) ||
        !CHECK(found == cudaDriverEntryPointSuccess && replace, "cuTensorMapReplaceAddress found")) {
        printf("tensor_map_test: %d checks failed, %d passed\n", failed, passed);
        return 1;
    }
    std::vector<float> a(kEdge * kEdge), b(kEdge * kEdge), got(kTile * kTile);
    for (int i = 0; i < kEdge * kEdge; i++) {
        a[i] = (float)i;
        b[i] = 100000.0f + (float)i;
    }
    float *d_a = nullptr, *d_b = nullptr, *d_out = nullptr;
    CHECK_CUDA(cudaMalloc(&d_a, a.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_b, b.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_out, got.size() * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(d_a, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_b, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));

    CUtensorMap map;
    cuuint64_t dims[2] = {kEdge, kEdge}, strides[1] = {kEdge * sizeof(float)};
    cuuint32_t box[2] = {kTile, kTile}, element_strides[2] = {1, 1};
    CHECK_CU(encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, d_a, dims, strides, box,
                    element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                    CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    if (read_tile(map, 16, 32, d_out, got))
        CHECK(wrong_elements(got, 16, 32, 0.0f) == 0, "inner tile of A read through the map");
    if (read_tile(map, 56, 56, d_out, got))
        CHECK(wrong_elements(got, 56, 56, 0.0f) == 0, "corner tile of A, zeros past the edge");
    CHECK_CU(replace(&map, d_b));
    if (read_tile(map, 8, 40, d_out, got))
        CHECK(wrong_elements(got, 8, 40, 100000.0f) == 0, "tile of B after the address moved");

    CHECK_CUDA(cudaFree(d_a));
    CHECK_CUDA(cudaFree(d_b));
    CHECK_CUDA(cudaFree(d_out));
    if (failed) {
        printf("tensor_map_test: %d checks failed, %d passed\n", failed, passed);
        return 1;
    }
    printf("tensor_map_test: %d checks passed\n", passed);
    return 0;
}
