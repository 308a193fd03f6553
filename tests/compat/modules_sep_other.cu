/* The second unit of modules_sep (see modules_sep_main.cu). */
#include <cuda_runtime.h>

__constant__ int other_base;

namespace {
__global__ void fill(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = other_base - i;
}
} // namespace

void other_set_base(int base) { cudaMemcpyToSymbol(other_base, &base, sizeof base); }

void other_fill(int *out, int n) { fill<<<(n + 63) / 64, 64>>>(out, n); }
