/* The second unit of modules_rdc (see modules_rdc_main.cu). */
#include <cuda_runtime.h>

__device__ int lib_calls;

__device__ int lib_scale(int x) { return 5 * x + 3; }

__global__ void lib_square(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * i;
}

void launch_lib_square(int *out, int n) { lib_square<<<(n + 63) / 64, 64>>>(out, n); }
