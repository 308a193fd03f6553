/* printf: device-side printf from one thread (so the order is fixed), with
 * integers, a 64-bit value, hex, a float, a string; the driver prints the
 * buffer at the next synchronisation. Through rgpu the text must reach this
 * process's stdout, in the same place as natively. */
#include "compat.h"

__global__ void talk(int value) {
    if (blockIdx.x == 1 && threadIdx.x == 3) {
        printf("device printf: block %d thread %d value %d\n", blockIdx.x, threadIdx.x, value);
        printf("device printf: int64 %lld hex %x float %.3f string %s\n", -(1LL << 40), 0xBEEFu,
               1.5f, "rgpu");
        for (int k = 1; k <= 3; k++) printf("device printf: line %d of 3\n", k);
    }
}

static bool printf_kernel(void) {
    printf("printf: before the kernel\n");
    fflush(stdout);
    talk<<<2, 32>>>(42);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    fflush(stdout);
    printf("printf: after the synchronisation\n");
    return true;
}

int main(void) {
    compat_start();
    check("printf: kernel with device printf completed", printf_kernel);
    return finish("printf");
}
