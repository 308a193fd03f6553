/* shared_atomics: static and dynamic shared memory (with more than the
 * default 48 KiB through cudaFuncSetAttribute), integer and float atomics,
 * atomicCAS loops, atomicMax/Min/Or, and warp shuffles. All results are
 * integers or exactly representable floats, whatever the order of the
 * atomic operations. */
#include "compat.h"

__global__ void reverse_blocks(const int *in, int *out) {
    __shared__ int tile[256];
    unsigned base = blockIdx.x * 256;
    tile[threadIdx.x] = in[base + threadIdx.x];
    __syncthreads();
    out[base + threadIdx.x] = tile[255 - threadIdx.x];
}

static bool static_shared(void) {
    const int n = 256 * 16;
    static int in[n], out[n];
    for (int i = 0; i < n; i++) in[i] = i * 3 + 1;
    int *d_in, *d_out;
    CK(cudaMalloc(&d_in, sizeof in));
    CK(cudaMalloc(&d_out, sizeof out));
    CK(cudaMemcpy(d_in, in, sizeof in, cudaMemcpyHostToDevice));
    reverse_blocks<<<16, 256>>>(d_in, d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_in));
    CK(cudaFree(d_out));
    for (int b = 0; b < 16; b++)
        for (int t = 0; t < 256; t++) EXPECT(out[b * 256 + t] == in[b * 256 + 255 - t]);
    return true;
}

/* out[block] = sum of the block's elements (blockDim.x a power of two). */
__global__ void block_sums(const int *in, long long *out) {
    extern __shared__ long long partial[];
    partial[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

static bool dynamic_shared(void) {
    const int blocks = 32, threads = 512, n = blocks * threads;
    static int in[n];
    long long out[blocks];
    for (int i = 0; i < n; i++) in[i] = i;
    int *d_in;
    long long *d_out;
    CK(cudaMalloc(&d_in, sizeof in));
    CK(cudaMalloc(&d_out, sizeof out));
    CK(cudaMemcpy(d_in, in, sizeof in, cudaMemcpyHostToDevice));
    block_sums<<<blocks, threads, threads * sizeof(long long)>>>(d_in, d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_in));
    CK(cudaFree(d_out));
    for (long long b = 0; b < blocks; b++) {
        long long first = b * threads, last = first + threads - 1;
        EXPECT(out[b] == (first + last) * threads / 2);
    }
    return true;
}

/* Each block writes a pattern over all of its (large) dynamic shared memory,
 * then every thread checks words written by other threads. */
__global__ void big_shared(unsigned words, unsigned *bad) {
    extern __shared__ unsigned big[];
    for (unsigned w = threadIdx.x; w < words; w += blockDim.x) big[w] = w * 2654435761u + blockIdx.x;
    __syncthreads();
    for (unsigned w = (threadIdx.x + 1) % blockDim.x; w < words; w += blockDim.x)
        if (big[w] != w * 2654435761u + blockIdx.x) atomicAdd(bad, 1u);
}

static bool dynamic_shared_above_48k(void) {
    const unsigned bytes = 100 * 1024, words = bytes / 4;
    CK(cudaFuncSetAttribute(big_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    unsigned *d_bad, bad = 1;
    CK(cudaMalloc(&d_bad, sizeof bad));
    CK(cudaMemset(d_bad, 0, sizeof bad));
    big_shared<<<4, 256, bytes>>>(words, d_bad);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_bad));
    EXPECT(bad == 0);
    return true;
}

__global__ void histogram(unsigned n, unsigned *bins, float *fsum) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        atomicAdd(&bins[i % 256], 1u);
        atomicAdd(fsum, 0.5f);
    }
}

static bool atomic_add_int_float(void) {
    const unsigned n = 1u << 20;
    unsigned *d_bins, bins[256];
    float *d_sum, sum;
    CK(cudaMalloc(&d_bins, sizeof bins));
    CK(cudaMalloc(&d_sum, sizeof sum));
    CK(cudaMemset(d_bins, 0, sizeof bins));
    CK(cudaMemset(d_sum, 0, sizeof sum));
    histogram<<<128, 256>>>(n, d_bins, d_sum);
    CK(cudaGetLastError());
    CK(cudaMemcpy(bins, d_bins, sizeof bins, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_bins));
    CK(cudaFree(d_sum));
    for (int b = 0; b < 256; b++) EXPECT(bins[b] == n / 256);
    /* Every partial sum is a multiple of 0.5 below 2^19: exact in any order. */
    EXPECT(sum == 524288.0f);
    return true;
}

/* Double addition through an atomicCAS loop, and a slot that exactly one
 * thread may claim. */
__global__ void cas_kernel(double *dsum, int *slot, unsigned *winners) {
    unsigned long long *bits = (unsigned long long *)dsum;
    unsigned long long old = *bits, assumed;
    do {
        assumed = old;
        old = atomicCAS(bits, assumed, __double_as_longlong(__longlong_as_double(assumed) + 0.25));
    } while (old != assumed);
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    if (atomicCAS(slot, -1, tid) == -1) atomicAdd(winners, 1u);
}

static bool atomic_cas(void) {
    double *d_sum, sum = 0.0;
    int *d_slot, slot = -1;
    unsigned *d_winners, winners = 0;
    CK(cudaMalloc(&d_sum, sizeof sum));
    CK(cudaMalloc(&d_slot, sizeof slot));
    CK(cudaMalloc(&d_winners, sizeof winners));
    CK(cudaMemcpy(d_sum, &sum, sizeof sum, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_slot, &slot, sizeof slot, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_winners, &winners, sizeof winners, cudaMemcpyHostToDevice));
    cas_kernel<<<64, 256>>>(d_sum, d_slot, d_winners);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&slot, d_slot, sizeof slot, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&winners, d_winners, sizeof winners, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_sum));
    CK(cudaFree(d_slot));
    CK(cudaFree(d_winners));
    EXPECT(sum == 64 * 256 * 0.25);
    EXPECT(winners == 1 && slot >= 0 && slot < 64 * 256);
    return true;
}

__global__ void max_min_or(const int *in, unsigned n, int *mx, int *mn, unsigned *bits) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicMax(mx, in[i]);
        atomicMin(mn, in[i]);
        atomicOr(bits, 1u << (i % 32));
    }
}

static bool atomic_max_min_or(void) {
    const unsigned n = 100000;
    static int in[n];
    int want_max = -2147483647, want_min = 2147483647;
    for (unsigned i = 0; i < n; i++) {
        in[i] = (int)((i * 7919u) % 100003u) - 50000;
        if (in[i] > want_max) want_max = in[i];
        if (in[i] < want_min) want_min = in[i];
    }
    int *d_in, *d_max, *d_min, mx = -2147483647, mn = 2147483647;
    unsigned *d_bits, bits = 0;
    CK(cudaMalloc(&d_in, sizeof in));
    CK(cudaMalloc(&d_max, sizeof mx));
    CK(cudaMalloc(&d_min, sizeof mn));
    CK(cudaMalloc(&d_bits, sizeof bits));
    CK(cudaMemcpy(d_in, in, sizeof in, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_max, &mx, sizeof mx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_min, &mn, sizeof mn, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_bits, &bits, sizeof bits, cudaMemcpyHostToDevice));
    max_min_or<<<(n + 255) / 256, 256>>>(d_in, n, d_max, d_min, d_bits);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&mx, d_max, sizeof mx, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&mn, d_min, sizeof mn, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&bits, d_bits, sizeof bits, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_in));
    CK(cudaFree(d_max));
    CK(cudaFree(d_min));
    CK(cudaFree(d_bits));
    EXPECT(mx == want_max && mn == want_min && bits == 0xffffffffu);
    return true;
}

/* out[warp] = sum of the warp's lane values, by __shfl_down_sync. */
__global__ void warp_sums(const int *in, int *out) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) out[i / 32] = v;
}

static bool warp_shuffle(void) {
    const int n = 1024, warps = n / 32;
    int in[n], out[warps];
    for (int i = 0; i < n; i++) in[i] = i % 97;
    int *d_in, *d_out;
    CK(cudaMalloc(&d_in, sizeof in));
    CK(cudaMalloc(&d_out, sizeof out));
    CK(cudaMemcpy(d_in, in, sizeof in, cudaMemcpyHostToDevice));
    warp_sums<<<4, 256>>>(d_in, d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_in));
    CK(cudaFree(d_out));
    for (int w = 0; w < warps; w++) {
        int want = 0;
        for (int l = 0; l < 32; l++) want += in[w * 32 + l];
        EXPECT(out[w] == want);
    }
    return true;
}

int main(void) {
    compat_start();
    check("shared: static __shared__ array", static_shared);
    check("shared: dynamic shared memory", dynamic_shared);
    check("shared: 100 KiB dynamic shared memory via cudaFuncSetAttribute",
          dynamic_shared_above_48k);
    check("atomics: atomicAdd unsigned and float", atomic_add_int_float);
    check("atomics: atomicCAS loop (double add) and claim", atomic_cas);
    check("atomics: atomicMax atomicMin atomicOr", atomic_max_min_or);
    check("warp: __shfl_down_sync reduction", warp_shuffle);
    return finish("shared_atomics");
}
