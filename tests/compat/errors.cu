/* errors: error paths that must come back as error codes, not crashes —
 * an invalid device pointer, an allocation far beyond the device's memory,
 * invalid launch configurations, an invalid device number, the
 * cudaGetLastError/cudaPeekAtLastError semantics, error names and strings —
 * and, after all of them, a kernel that still runs. Each line names the
 * code the runtime returned. */
#include "compat.h"

static void report_code(const char *what, cudaError_t got, cudaError_t want) {
    printf("errors: %s returns %s %s\n", what, cudaGetErrorName(got),
           got == want ? "PASS" : "FAIL");
    if (got == want)
        compat_passed++;
    else
        compat_failed++;
}

__global__ void fill(int *out, int value) { out[threadIdx.x] = value; }

static bool still_works(void) {
    int *d, out[32];
    CK(cudaMalloc(&d, sizeof out));
    fill<<<1, 32>>>(d, 99);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    for (int i = 0; i < 32; i++) EXPECT(out[i] == 99);
    return true;
}

int main(void) {
    compat_start();
    int host[16] = {0};
    void *d = NULL;
    (void)cudaFree(0);

    report_code("cudaMemcpy to an invalid device pointer",
                cudaMemcpy((void *)0x10, host, sizeof host, cudaMemcpyHostToDevice),
                cudaErrorInvalidValue);
    report_code("cudaGetLastError after it", cudaGetLastError(), cudaErrorInvalidValue);
    report_code("cudaGetLastError a second time", cudaGetLastError(), cudaSuccess);

    report_code("cudaMalloc of 1 PiB", cudaMalloc(&d, 1ull << 50), cudaErrorMemoryAllocation);
    report_code("cudaPeekAtLastError after it", cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    report_code("cudaPeekAtLastError again (not reset)", cudaPeekAtLastError(),
                cudaErrorMemoryAllocation);
    report_code("cudaGetLastError (resets)", cudaGetLastError(), cudaErrorMemoryAllocation);
    report_code("cudaGetLastError after the reset", cudaGetLastError(), cudaSuccess);

    int *small;
    report_code("cudaMalloc of 1 MiB after the failure", cudaMalloc(&small, 1 << 20), cudaSuccess);

    /* CUDA 13's runtime on driver 580 reports these as cudaErrorInvalidValue
     * (seen on the H200), not cudaErrorInvalidConfiguration. */
    fill<<<1, 2048>>>(small, 1);
    report_code("a launch with 2048 threads per block", cudaGetLastError(),
                cudaErrorInvalidValue);
    fill<<<dim3(1, 70000), 32>>>(small, 1);
    report_code("a launch with grid y = 70000", cudaGetLastError(),
                cudaErrorInvalidValue);
    report_code("cudaDeviceSynchronize after refused launches", cudaDeviceSynchronize(),
                cudaSuccess);

    report_code("cudaSetDevice(9999)", cudaSetDevice(9999), cudaErrorInvalidDevice);
    (void)cudaGetLastError();
    report_code("cudaFree of a host stack address", cudaFree(host), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    report_code("cudaFree(NULL)", cudaFree(NULL), cudaSuccess);
    report_code("cudaFree of the 1 MiB block", cudaFree(small), cudaSuccess);

    printf("errors: name %s, string \"%s\"\n", cudaGetErrorName(cudaErrorMemoryAllocation),
           cudaGetErrorString(cudaErrorMemoryAllocation));
    printf("errors: name %s, string \"%s\"\n", cudaGetErrorName(cudaErrorInvalidValue),
           cudaGetErrorString(cudaErrorInvalidValue));

    check("errors: a kernel still runs after all of the above", still_works);
    return finish("errors");
}
