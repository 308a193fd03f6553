/* modules_sep (with modules_sep_other.cu): two translation units compiled
 * whole-program (no -rdc), so the binary registers two separate modules.
 * Each holds a kernel named fill (in an anonymous namespace: nvcc makes the
 * mangled names unique per unit) and a __constant__ of its own; each launch
 * and each symbol copy must reach the right module. */
#include "compat.h"

void other_fill(int *out, int n);
void other_set_base(int base);

__constant__ int main_base;

namespace {
__global__ void fill(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = main_base + i;
}
} // namespace

static bool same_kernel_name_in_two_modules(void) {
    const int n = 500;
    int *a, *b, out_a[n], out_b[n];
    CK(cudaMalloc(&a, sizeof out_a));
    CK(cudaMalloc(&b, sizeof out_b));
    const int base = 1000;
    CK(cudaMemcpyToSymbol(main_base, &base, sizeof base));
    other_set_base(-7000);
    CK(cudaGetLastError());
    fill<<<(n + 127) / 128, 128>>>(a, n);
    CK(cudaGetLastError());
    other_fill(b, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out_a, a, sizeof out_a, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out_b, b, sizeof out_b, cudaMemcpyDeviceToHost));
    CK(cudaFree(a));
    CK(cudaFree(b));
    for (int i = 0; i < n; i++) EXPECT(out_a[i] == 1000 + i && out_b[i] == -7000 - i);
    return true;
}

int main(void) {
    compat_start();
    check("modules_sep: a kernel named fill and a __constant__ in each of two modules",
          same_kernel_name_in_two_modules);
    return finish("modules_sep");
}
