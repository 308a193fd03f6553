/* streams: several streams (cudaStreamCreateWithFlags, WithPriority, the
 * per-thread default stream), events (record, synchronize, query, elapsed
 * time checked only for being >= 0), cudaStreamWaitEvent across streams,
 * async copies both ways from cudaMallocHost, cudaHostAlloc and
 * cudaHostRegister memory, cudaLaunchHostFunc, and the legacy default
 * stream's ordering against blocking streams. */
#include "compat.h"

#include <string.h>

/* Slow on purpose (a dependent loop) so that a missing dependency between
 * streams shows up as a wrong result. v stays in 0..1023, so the comparison
 * with NEVER (-1) never holds, but the compiler cannot know that and keeps
 * the loop. */
#define NEVER (-1)
__global__ void slow_fill_kernel(int *out, int n, int value, int never) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = value;
    for (int k = 0; k < 20000; k++) v = (v * 3 + k) & 0x3ff;
    out[i] = v == never ? never : value;
}

__global__ void plus_one(const int *in, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1;
}

__global__ void scale_add(int *data, int n, int mul, int add) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = data[i] * mul + add;
}

static bool four_streams_pinned_round_trips(void) {
    const int n = 1 << 18, streams = 4;
    int priority_low = 0, priority_high = 0;
    CK(cudaDeviceGetStreamPriorityRange(&priority_low, &priority_high));
    cudaStream_t s[streams];
    CK(cudaStreamCreate(&s[0]));
    CK(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&s[2], cudaStreamNonBlocking, priority_high));
    CK(cudaStreamCreateWithPriority(&s[3], cudaStreamDefault, priority_low));
    int *host[streams], *dev[streams];
    CK(cudaMallocHost(&host[0], n * sizeof(int)));
    CK(cudaMallocHost(&host[1], n * sizeof(int)));
    CK(cudaHostAlloc(&host[2], n * sizeof(int), cudaHostAllocDefault));
    CK(cudaHostAlloc(&host[3], n * sizeof(int), cudaHostAllocPortable));
    for (int k = 0; k < streams; k++) {
        CK(cudaMalloc(&dev[k], n * sizeof(int)));
        for (int i = 0; i < n; i++) host[k][i] = i + k;
    }
    for (int k = 0; k < streams; k++) {
        CK(cudaMemcpyAsync(dev[k], host[k], n * sizeof(int), cudaMemcpyHostToDevice, s[k]));
        scale_add<<<n / 256, 256, 0, s[k]>>>(dev[k], n, 2, k);
        CK(cudaGetLastError());
        CK(cudaMemcpyAsync(host[k], dev[k], n * sizeof(int), cudaMemcpyDeviceToHost, s[k]));
    }
    for (int k = 0; k < streams; k++) CK(cudaStreamSynchronize(s[k]));
    for (int k = 0; k < streams; k++) {
        CK(cudaStreamQuery(s[k]));
        int priority = 99;
        CK(cudaStreamGetPriority(s[k], &priority));
        if (k == 2) EXPECT(priority == priority_high);
        for (int i = 0; i < n; i++) EXPECT(host[k][i] == (i + k) * 2 + k);
    }
    for (int k = 0; k < streams; k++) {
        CK(cudaFreeHost(host[k]));
        CK(cudaFree(dev[k]));
        CK(cudaStreamDestroy(s[k]));
    }
    return true;
}

static bool events_and_stream_wait_event(void) {
    const int n = 1 << 16;
    cudaStream_t producer, consumer;
    CK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    cudaEvent_t start, produced, done;
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&produced));
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    int *a, *b, *host;
    CK(cudaMalloc(&a, n * sizeof(int)));
    CK(cudaMalloc(&b, n * sizeof(int)));
    CK(cudaMallocHost(&host, n * sizeof(int)));
    CK(cudaMemsetAsync(a, 0, n * sizeof(int), producer));
    CK(cudaEventRecord(start, producer));
    slow_fill_kernel<<<n / 256, 256, 0, producer>>>(a, n, 41, NEVER);
    CK(cudaGetLastError());
    CK(cudaEventRecord(produced, producer));
    CK(cudaStreamWaitEvent(consumer, produced, 0));
    plus_one<<<n / 256, 256, 0, consumer>>>(a, b, n);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(host, b, n * sizeof(int), cudaMemcpyDeviceToHost, consumer));
    CK(cudaEventRecord(done, consumer));
    CK(cudaEventSynchronize(done));
    CK(cudaEventQuery(done));
    CK(cudaEventQuery(produced));
    for (int i = 0; i < n; i++) EXPECT(host[i] == 42);
    float ms = -1.0f;
    CK(cudaEventElapsedTime(&ms, start, produced));
    EXPECT(ms >= 0.0f);
    /* An event without timing cannot measure time. */
    EXPECT(cudaEventElapsedTime(&ms, start, done) != cudaSuccess);
    (void)cudaGetLastError();
    CK(cudaEventDestroy(start));
    CK(cudaEventDestroy(produced));
    CK(cudaEventDestroy(done));
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFreeHost(host));
    CK(cudaStreamDestroy(producer));
    CK(cudaStreamDestroy(consumer));
    return true;
}

static void CUDART_CB mark_done(void *arg) { *(volatile int *)arg = 1234; }

static bool host_function(void) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int *d;
    CK(cudaMalloc(&d, 1 << 20));
    static volatile int flag = 0;
    slow_fill_kernel<<<16, 256, 0, s>>>(d, 4096, 1, NEVER);
    CK(cudaGetLastError());
    CK(cudaLaunchHostFunc(s, mark_done, (void *)&flag));
    CK(cudaStreamSynchronize(s));
    EXPECT(flag == 1234);
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
    return true;
}

static bool registered_host_memory(void) {
    const size_t n = 1 << 18;
    /* cudaHostRegister wants page-aligned memory for portability. */
    int *host = (int *)aligned_alloc(4096, n * sizeof(int));
    EXPECT(host != NULL);
    for (size_t i = 0; i < n; i++) host[i] = (int)i;
    CK(cudaHostRegister(host, n * sizeof(int), cudaHostRegisterDefault));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int *d;
    CK(cudaMalloc(&d, n * sizeof(int)));
    CK(cudaMemcpyAsync(d, host, n * sizeof(int), cudaMemcpyHostToDevice, s));
    scale_add<<<(unsigned)(n / 256), 256, 0, s>>>(d, (int)n, -1, 5);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(host, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; i++) EXPECT(host[i] == 5 - (int)i);
    CK(cudaHostUnregister(host));
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
    free(host);
    return true;
}

static bool per_thread_default_stream(void) {
    const int n = 1 << 14;
    int *d, *host;
    CK(cudaMalloc(&d, n * sizeof(int)));
    CK(cudaMallocHost(&host, n * sizeof(int)));
    for (int i = 0; i < n; i++) host[i] = i;
    CK(cudaMemcpyAsync(d, host, n * sizeof(int), cudaMemcpyHostToDevice, cudaStreamPerThread));
    scale_add<<<n / 256, 256, 0, cudaStreamPerThread>>>(d, n, 3, 0);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(host, d, n * sizeof(int), cudaMemcpyDeviceToHost, cudaStreamPerThread));
    CK(cudaStreamSynchronize(cudaStreamPerThread));
    for (int i = 0; i < n; i++) EXPECT(host[i] == 3 * i);
    CK(cudaFree(d));
    CK(cudaFreeHost(host));
    return true;
}

/* A blocking stream's work finishes before a later legacy-default-stream
 * copy starts, without any explicit synchronisation. */
static bool legacy_default_stream_ordering(void) {
    const int n = 1 << 16;
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int *d;
    CK(cudaMalloc(&d, n * sizeof(int)));
    slow_fill_kernel<<<n / 256, 256, 0, s>>>(d, n, 77, NEVER);
    CK(cudaGetLastError());
    static int host[n];
    CK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT(host[i] == 77);
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
    return true;
}

int main(void) {
    compat_start();
    check("streams: four streams (flags, priorities), pinned async round trips",
          four_streams_pinned_round_trips);
    check("streams: events, cudaStreamWaitEvent, elapsed time >= 0",
          events_and_stream_wait_event);
    check("streams: cudaLaunchHostFunc", host_function);
    check("streams: cudaHostRegister memory, async copies", registered_host_memory);
    check("streams: per-thread default stream", per_thread_default_stream);
    check("streams: legacy default stream waits for blocking streams",
          legacy_default_stream_ordering);
    return finish("streams");
}
