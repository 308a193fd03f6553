/* fault: a kernel that writes through a null pointer. The fault comes back
 * as cudaErrorIllegalAddress from the next synchronising call and stays
 * (a sticky error: the context is unusable afterwards), without killing the
 * process — and, through rgpu, without harming the daemon or other tenants
 * (run-compat.sh runs more programs after this one). */
#include "compat.h"

__global__ void write_through(int *p) { p[threadIdx.x] = 1; }

static void report_code(const char *what, cudaError_t got, cudaError_t want) {
    printf("fault: %s returns %s %s\n", what, cudaGetErrorName(got), got == want ? "PASS" : "FAIL");
    if (got == want)
        compat_passed++;
    else
        compat_failed++;
}

int main(void) {
    compat_start();
    int *d = NULL;
    report_code("cudaMalloc before the fault", cudaMalloc(&d, 4096), cudaSuccess);
    write_through<<<1, 32>>>(NULL);
    report_code("the launch itself", cudaGetLastError(), cudaSuccess);
    report_code("cudaDeviceSynchronize", cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    report_code("cudaGetLastError (sticky)", cudaGetLastError(), cudaErrorIllegalAddress);
    report_code("cudaMemset afterwards (sticky)", cudaMemset(d, 0, 4096), cudaErrorIllegalAddress);
    return finish("fault");
}
