/* memory: cudaMemset and cudaMemsetAsync (unaligned ranges too), copies
 * device to device and with cudaMemcpyDefault, pitched 2-D allocations and
 * copies, cudaMemGetInfo, the stream-ordered allocator
 * (cudaMallocAsync/cudaFreeAsync) and cudaPointerGetAttributes. */
#include "compat.h"

#include <string.h>

static bool memset_unaligned(void) {
    const size_t n = 4096;
    unsigned char *d, host[n];
    CK(cudaMalloc(&d, n));
    CK(cudaMemset(d, 0x11, n));
    CK(cudaMemset(d + 3, 0xAB, 1001));
    CK(cudaMemcpy(host, d, n, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    for (size_t i = 0; i < n; i++) EXPECT(host[i] == (i >= 3 && i < 1004 ? 0xAB : 0x11));
    return true;
}

static bool memset_async(void) {
    const size_t n = 1 << 20;
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    unsigned *d, *pinned;
    CK(cudaMalloc(&d, n * sizeof(unsigned)));
    CK(cudaMallocHost(&pinned, n * sizeof(unsigned)));
    CK(cudaMemsetAsync(d, 0x5A, n * sizeof(unsigned), s));
    CK(cudaMemsetAsync(d + n / 2, 0, n / 4 * sizeof(unsigned), s));
    CK(cudaMemcpyAsync(pinned, d, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; i++)
        EXPECT(pinned[i] == (i >= n / 2 && i < n / 2 + n / 4 ? 0u : 0x5A5A5A5Au));
    CK(cudaFreeHost(pinned));
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
    return true;
}

static bool device_to_device_and_default_kind(void) {
    const size_t n = 10000;
    static int host[n], back[n];
    for (size_t i = 0; i < n; i++) host[i] = (int)(i * 31 % 1009);
    int *a, *b;
    CK(cudaMalloc(&a, sizeof host));
    CK(cudaMalloc(&b, sizeof host));
    CK(cudaMemcpy(a, host, sizeof host, cudaMemcpyDefault));
    CK(cudaMemcpy(b, a, sizeof host, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(a + 1, b, (n - 1) * sizeof(int), cudaMemcpyDefault));
    CK(cudaMemcpy(back, a, sizeof back, cudaMemcpyDefault));
    CK(cudaFree(a));
    CK(cudaFree(b));
    EXPECT(back[0] == host[0]);
    for (size_t i = 1; i < n; i++) EXPECT(back[i] == host[i - 1]);
    return true;
}

__global__ void add_row_index(float *base, size_t pitch, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < width && y < height) {
        float *row = (float *)((char *)base + y * pitch);
        row[x] += (float)(y * 1000);
    }
}

static bool pitched_2d(void) {
    const int width = 100, height = 37;
    static float host[height][width], back[height][width];
    for (int y = 0; y < height; y++)
        for (int x = 0; x < width; x++) host[y][x] = (float)x;
    float *d;
    size_t pitch = 0;
    CK(cudaMallocPitch(&d, &pitch, width * sizeof(float), height));
    EXPECT(pitch >= width * sizeof(float));
    CK(cudaMemcpy2D(d, pitch, host, width * sizeof(float), width * sizeof(float), height,
                    cudaMemcpyHostToDevice));
    add_row_index<<<dim3(1, height), 128>>>(d, pitch, width, height);
    CK(cudaGetLastError());
    CK(cudaMemcpy2D(back, width * sizeof(float), d, pitch, width * sizeof(float), height,
                    cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    for (int y = 0; y < height; y++)
        for (int x = 0; x < width; x++) EXPECT(back[y][x] == (float)(x + y * 1000));
    return true;
}

static bool mem_get_info(void) {
    size_t free_before = 0, total = 0, free_after = 0;
    CK(cudaMemGetInfo(&free_before, &total));
    EXPECT(free_before > 0 && free_before <= total);
    void *d;
    CK(cudaMalloc(&d, 256 << 20));
    CK(cudaMemGetInfo(&free_after, &total));
    CK(cudaFree(d));
    EXPECT(free_after < free_before);
    return true;
}

__global__ void iota(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i;
}

static bool stream_ordered_allocator(void) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const int n = 5000;
    int *d, host[n];
    CK(cudaMallocAsync(&d, n * sizeof(int), s));
    iota<<<(n + 255) / 256, 256, 0, s>>>(d, n);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(host, d, sizeof host, cudaMemcpyDeviceToHost, s));
    CK(cudaFreeAsync(d, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    for (int i = 0; i < n; i++) EXPECT(host[i] == i);
    return true;
}

static bool pointer_attributes(void) {
    void *d, *pinned;
    int stack_value = 0;
    CK(cudaMalloc(&d, 4096));
    CK(cudaMallocHost(&pinned, 4096));
    cudaPointerAttributes attr;
    memset(&attr, 0, sizeof attr);
    CK(cudaPointerGetAttributes(&attr, d));
    EXPECT(attr.type == cudaMemoryTypeDevice && attr.device == 0 && attr.devicePointer == d);
    CK(cudaPointerGetAttributes(&attr, pinned));
    EXPECT(attr.type == cudaMemoryTypeHost && attr.hostPointer == pinned);
    CK(cudaPointerGetAttributes(&attr, &stack_value));
    EXPECT(attr.type == cudaMemoryTypeUnregistered);
    CK(cudaFree(d));
    CK(cudaFreeHost(pinned));
    return true;
}

int main(void) {
    compat_start();
    check("memory: cudaMemset with an unaligned range", memset_unaligned);
    check("memory: cudaMemsetAsync on a stream", memset_async);
    check("memory: device-to-device and cudaMemcpyDefault copies",
          device_to_device_and_default_kind);
    check("memory: cudaMallocPitch and cudaMemcpy2D", pitched_2d);
    check("memory: cudaMemGetInfo", mem_get_info);
    check("memory: cudaMallocAsync and cudaFreeAsync", stream_ordered_allocator);
    check("memory: cudaPointerGetAttributes", pointer_attributes);
    return finish("memory");
}
