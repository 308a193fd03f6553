/* modules_rdc (with modules_rdc_lib.cu): two translation units compiled with
 * relocatable device code (-rdc=true) and linked by nvcc's device link: a
 * kernel here calls a __device__ function and updates a __device__ variable
 * defined in the other unit, and a host wrapper there launches its own
 * kernel. */
#include "compat.h"

extern __device__ int lib_scale(int x);
extern __device__ int lib_calls;
void launch_lib_square(int *out, int n);

__global__ void use_lib(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = lib_scale(i);
        atomicAdd(&lib_calls, 1);
    }
}

static bool cross_unit_device_function(void) {
    const int n = 1000;
    int *d, out[n];
    CK(cudaMalloc(&d, sizeof out));
    const int zero = 0;
    CK(cudaMemcpyToSymbol(lib_calls, &zero, sizeof zero));
    use_lib<<<(n + 127) / 128, 128>>>(d, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    int calls = 0;
    CK(cudaMemcpyFromSymbol(&calls, lib_calls, sizeof calls));
    CK(cudaFree(d));
    for (int i = 0; i < n; i++) EXPECT(out[i] == 5 * i + 3);
    EXPECT(calls == n);
    return true;
}

static bool kernel_of_the_other_unit(void) {
    const int n = 300;
    int *d, out[n];
    CK(cudaMalloc(&d, sizeof out));
    launch_lib_square(d, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    for (int i = 0; i < n; i++) EXPECT(out[i] == i * i);
    return true;
}

int main(void) {
    compat_start();
    check("modules_rdc: __device__ function and variable from another unit",
          cross_unit_device_function);
    check("modules_rdc: kernel launched by the other unit", kernel_of_the_other_unit);
    return finish("modules_rdc");
}
