/* multi_device_runtime: an nvcc runtime program (static cudart) that
 * switches between two devices with cudaSetDevice, as multi-GPU programs
 * do. Run through rgpu with RGPU_DEVICES naming two daemons (the GPU host
 * has one GPU, so there is no native run): each device's memory lives on
 * its own daemon, a peer copy is staged through the process, and neither
 * device has peer access to the other.
 *
 * Prints one line per failed check and "multi_device_runtime: N checks
 * passed" (exit 0), or "... N checks failed" (exit 1). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

static int passed, failed;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (cond) {                                                              \
            passed++;                                                            \
        } else {                                                                 \
            failed++;                                                            \
            printf("FAIL line %d: %s\n", __LINE__, #cond);                       \
        }                                                                        \
    } while (0)
#define CK(call) CHECK((call) == cudaSuccess)

__global__ void fill(int *p, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = base + i;
}

__global__ void add(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}

/* Whether host copy `h` of n ints holds base + i + extra everywhere. */
static bool holds(const int *h, int n, int base) {
    for (int i = 0; i < n; i++)
        if (h[i] != base + i) return false;
    return true;
}

int main(void) {
    const int n = 3 << 20; /* 12 MiB: more than one staged piece */
    const size_t bytes = n * sizeof(int);
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    CHECK(count == 2);
    if (count != 2) {
        printf("multi_device_runtime: %d checks failed, %d passed\n", failed, passed);
        return 1;
    }
    int *d[2] = {NULL, NULL};
    int *h = (int *)malloc(bytes);
    for (int dev = 0; dev < 2; dev++) {
        CK(cudaSetDevice(dev));
        int current = -1;
        CK(cudaGetDevice(&current));
        CHECK(current == dev);
        CK(cudaMalloc(&d[dev], bytes));
        fill<<<(n + 255) / 256, 256>>>(d[dev], n, dev * 1000000);
        CK(cudaGetLastError());
    }
    for (int dev = 0; dev < 2; dev++) {
        CK(cudaSetDevice(dev));
        CK(cudaDeviceSynchronize());
    }
    /* Each device kept its own data. */
    for (int dev = 0; dev < 2; dev++) {
        CK(cudaSetDevice(dev));
        CK(cudaMemcpy(h, d[dev], bytes, cudaMemcpyDeviceToHost));
        CHECK(holds(h, n, dev * 1000000));
    }
    int can = -1;
    CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    CHECK(can == 0);
    /* Device 0's buffer to device 1's, then a kernel there. */
    CK(cudaMemcpyPeer(d[1], 1, d[0], 0, bytes));
    CK(cudaSetDevice(1));
    add<<<(n + 255) / 256, 256>>>(d[1], n, 7);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d[1], bytes, cudaMemcpyDeviceToHost));
    CHECK(holds(h, n, 7));
    /* And back with a plain device-to-device copy across devices. */
    CK(cudaSetDevice(0));
    CK(cudaMemcpy(d[0], d[1], bytes, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(h, d[0], bytes, cudaMemcpyDeviceToHost));
    CHECK(holds(h, n, 7));
    for (int dev = 0; dev < 2; dev++) {
        CK(cudaSetDevice(dev));
        CK(cudaFree(d[dev]));
    }
    free(h);
    if (failed) {
        printf("multi_device_runtime: %d checks failed, %d passed\n", failed, passed);
        return 1;
    }
    printf("multi_device_runtime: %d checks passed\n", passed);
    return 0;
}
