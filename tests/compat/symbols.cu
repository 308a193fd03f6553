/* symbols: __constant__ and __device__ variables — static initialisers as
 * the module loads them, cudaMemcpyToSymbol/FromSymbol (with offsets, and
 * the Async forms on a stream), cudaGetSymbolAddress and cudaGetSymbolSize,
 * and kernels that read and update them. */
#include "compat.h"

__constant__ float coeffs[16];
__constant__ int cscale;
__constant__ int cinit[4] = {11, 22, 33, 44};
__device__ int dinit = 42;
__device__ int dcounter;
__device__ unsigned long long dtable[64];

__global__ void apply_coeffs(const float *in, float *out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * coeffs[i % 16] + (float)cscale;
}

static bool constant_to_symbol(void) {
    float c[16];
    for (int k = 0; k < 16; k++) c[k] = (float)(k + 1) * 0.5f;
    const int scale = 7;
    CK(cudaMemcpyToSymbol(coeffs, c, sizeof c));
    CK(cudaMemcpyToSymbol(cscale, &scale, sizeof scale));
    const unsigned n = 512;
    float in[n], out[n];
    for (unsigned i = 0; i < n; i++) in[i] = (float)i;
    float *d_in, *d_out;
    CK(cudaMalloc(&d_in, sizeof in));
    CK(cudaMalloc(&d_out, sizeof out));
    CK(cudaMemcpy(d_in, in, sizeof in, cudaMemcpyHostToDevice));
    apply_coeffs<<<2, 256>>>(d_in, d_out, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_in));
    CK(cudaFree(d_out));
    for (unsigned i = 0; i < n; i++) EXPECT(out[i] == (float)i * c[i % 16] + 7.0f);
    float back[16];
    CK(cudaMemcpyFromSymbol(back, coeffs, sizeof back));
    for (int k = 0; k < 16; k++) EXPECT(back[k] == c[k]);
    return true;
}

static bool symbol_offsets(void) {
    const float patch[3] = {100.0f, 200.0f, 300.0f};
    CK(cudaMemcpyToSymbol(coeffs, patch, sizeof patch, 5 * sizeof(float)));
    float back[4];
    CK(cudaMemcpyFromSymbol(back, coeffs, sizeof back, 4 * sizeof(float)));
    EXPECT(back[0] == 2.5f && back[1] == 100.0f && back[2] == 200.0f && back[3] == 300.0f);
    return true;
}

__global__ void read_initialised(int *out) {
    out[0] = dinit;
    for (int k = 0; k < 4; k++) out[1 + k] = cinit[k];
}

static bool static_initialisers(void) {
    int *d_out, out[5];
    CK(cudaMalloc(&d_out, sizeof out));
    read_initialised<<<1, 1>>>(d_out);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_out));
    EXPECT(out[0] == 42 && out[1] == 11 && out[2] == 22 && out[3] == 33 && out[4] == 44);
    int host_view;
    CK(cudaMemcpyFromSymbol(&host_view, dinit, sizeof host_view));
    EXPECT(host_view == 42);
    return true;
}

__global__ void count_and_fill(unsigned long long salt) {
    unsigned i = threadIdx.x;
    atomicAdd(&dcounter, 1);
    if (i < 64) dtable[i] = salt + i * i;
}

static bool device_variables(void) {
    const int zero = 0;
    CK(cudaMemcpyToSymbol(dcounter, &zero, sizeof zero));
    count_and_fill<<<3, 100>>>(1000000000000ULL);
    CK(cudaGetLastError());
    int counter;
    unsigned long long table[64];
    CK(cudaMemcpyFromSymbol(&counter, dcounter, sizeof counter));
    CK(cudaMemcpyFromSymbol(table, dtable, sizeof table));
    EXPECT(counter == 300);
    for (unsigned long long i = 0; i < 64; i++) EXPECT(table[i] == 1000000000000ULL + i * i);
    return true;
}

static bool symbol_address_and_size(void) {
    void *addr = NULL;
    size_t size = 0;
    CK(cudaGetSymbolAddress(&addr, dtable));
    CK(cudaGetSymbolSize(&size, dtable));
    EXPECT(addr != NULL && size == 64 * sizeof(unsigned long long));
    unsigned long long values[64];
    for (int k = 0; k < 64; k++) values[k] = 0xABCD0000ULL + k;
    CK(cudaMemcpy(addr, values, sizeof values, cudaMemcpyHostToDevice));
    unsigned long long back[64];
    CK(cudaMemcpyFromSymbol(back, dtable, sizeof back));
    for (int k = 0; k < 64; k++) EXPECT(back[k] == 0xABCD0000ULL + k);
    CK(cudaGetSymbolSize(&size, coeffs));
    EXPECT(size == 16 * sizeof(float));
    return true;
}

static bool symbol_async_on_stream(void) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    float *pinned;
    CK(cudaMallocHost(&pinned, 32 * sizeof(float)));
    for (int k = 0; k < 16; k++) pinned[k] = -(float)k;
    CK(cudaMemcpyToSymbolAsync(coeffs, pinned, 16 * sizeof(float), 0, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyFromSymbolAsync(pinned + 16, coeffs, 16 * sizeof(float), 0,
                                 cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int k = 0; k < 16; k++) EXPECT(pinned[16 + k] == -(float)k);
    CK(cudaFreeHost(pinned));
    CK(cudaStreamDestroy(s));
    return true;
}

int main(void) {
    compat_start();
    check("symbols: __device__ and __constant__ static initialisers", static_initialisers);
    check("symbols: __constant__ via cudaMemcpyToSymbol, read back", constant_to_symbol);
    check("symbols: ToSymbol/FromSymbol with offsets", symbol_offsets);
    check("symbols: __device__ variables updated by a kernel", device_variables);
    check("symbols: cudaGetSymbolAddress and cudaGetSymbolSize", symbol_address_and_size);
    check("symbols: ToSymbolAsync/FromSymbolAsync on a stream", symbol_async_on_stream);
    return finish("symbols");
}
