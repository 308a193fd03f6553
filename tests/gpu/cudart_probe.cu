// A CUDA runtime program built with nvcc's defaults (static cudart), to run
// unmodified on NVIDIA's driver and on rgpu's libcuda.so.1. It exercises the
// runtime's start-up (the private export tables), device properties,
// allocation, copies, a <<<>>> launch, a __constant__ written with
// cudaMemcpyToSymbol, and prints one line per step.
//
//   nvcc -arch=sm_90 -o cudart_probe cudart_probe.cu
//   ./cudart_probe            # prints "cudart_probe: all N checks passed"
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

static int failures = 0;
static int checks = 0;

#define STEP(call)                                                              \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        ++checks;                                                               \
        printf("cudart_probe: %-60s -> %d (%s)\n", #call, (int)err_,            \
               cudaGetErrorName(err_));                                         \
        fflush(stdout);                                                         \
        if (err_ != cudaSuccess) {                                              \
            ++failures;                                                         \
            printf("cudart_probe: FAILED at %s:%d\n", __FILE__, __LINE__);      \
            printf("cudart_probe: %d of %d checks failed\n", failures, checks); \
            return 1;                                                           \
        }                                                                       \
    } while (0)

#define EXPECT(cond)                                                 \
    do {                                                             \
        ++checks;                                                    \
        if (!(cond)) {                                               \
            ++failures;                                              \
            printf("cudart_probe: check failed: %s (line %d)\n", #cond, \
                   __LINE__);                                        \
        }                                                            \
    } while (0)

__constant__ float scale_factor[4];

__global__ void saxpy_constant(const float *x, float *y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = scale_factor[i % 4] * x[i] + y[i];
    }
}

__global__ void fill_index(unsigned *out, unsigned base, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = base + i;
    }
}

int main() {
    int runtime_version = 0, driver_version = 0, count = 0;
    STEP(cudaRuntimeGetVersion(&runtime_version));
    STEP(cudaDriverGetVersion(&driver_version));
    printf("cudart_probe: runtime %d, driver %d\n", runtime_version, driver_version);
    STEP(cudaGetDeviceCount(&count));
    printf("cudart_probe: %d device(s)\n", count);
    EXPECT(count >= 1);

    cudaDeviceProp prop;
    STEP(cudaGetDeviceProperties(&prop, 0));
    printf("cudart_probe: device 0: %s, sm_%d%d, %zu MiB, %d SMs\n", prop.name, prop.major,
           prop.minor, prop.totalGlobalMem >> 20, prop.multiProcessorCount);
    EXPECT(prop.major >= 1 && prop.totalGlobalMem > 0 && prop.multiProcessorCount > 0);
    STEP(cudaSetDevice(0));

    const unsigned n = 1 << 20;
    const size_t bytes = n * sizeof(float);
    float *hx = (float *)malloc(bytes), *hy = (float *)malloc(bytes);
    for (unsigned i = 0; i < n; ++i) {
        hx[i] = (float)(i % 1000);
        hy[i] = 1.0f;
    }
    float *dx = nullptr, *dy = nullptr;
    STEP(cudaMalloc((void **)&dx, bytes));
    STEP(cudaMalloc((void **)&dy, bytes));
    STEP(cudaMemcpy(dx, hx, bytes, cudaMemcpyHostToDevice));
    STEP(cudaMemcpy(dy, hy, bytes, cudaMemcpyHostToDevice));

    const float factors[4] = {2.0f, 3.0f, 0.5f, -1.0f};
    STEP(cudaMemcpyToSymbol(scale_factor, factors, sizeof(factors)));
    float read_back[4] = {0, 0, 0, 0};
    STEP(cudaMemcpyFromSymbol(read_back, scale_factor, sizeof(read_back)));
    EXPECT(read_back[0] == 2.0f && read_back[3] == -1.0f);

    saxpy_constant<<<(n + 255) / 256, 256>>>(dx, dy, n);
    STEP(cudaGetLastError());
    STEP(cudaDeviceSynchronize());
    STEP(cudaMemcpy(hy, dy, bytes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (unsigned i = 0; i < n; ++i) {
        float expect = factors[i % 4] * (float)(i % 1000) + 1.0f;
        if (hy[i] != expect && bad++ < 5) {
            printf("cudart_probe: y[%u] = %f, expected %f\n", i, hy[i], expect);
        }
    }
    EXPECT(bad == 0);

    unsigned *dout = nullptr;
    STEP(cudaMalloc((void **)&dout, 1000 * sizeof(unsigned)));
    STEP(cudaMemset(dout, 0, 1000 * sizeof(unsigned)));
    cudaStream_t stream;
    STEP(cudaStreamCreate(&stream));
    fill_index<<<4, 256, 0, stream>>>(dout, 7, 1000);
    STEP(cudaGetLastError());
    unsigned *hout = nullptr;
    STEP(cudaMallocHost((void **)&hout, 1000 * sizeof(unsigned)));
    STEP(cudaMemcpyAsync(hout, dout, 1000 * sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
    STEP(cudaStreamSynchronize(stream));
    EXPECT(hout[0] == 7 && hout[999] == 1006);

    STEP(cudaFreeHost(hout));
    STEP(cudaStreamDestroy(stream));
    STEP(cudaFree(dout));
    STEP(cudaFree(dx));
    STEP(cudaFree(dy));
    free(hx);
    free(hy);
    STEP(cudaDeviceReset());

    if (failures == 0) {
        printf("cudart_probe: all %d checks passed\n", checks);
        return 0;
    }
    printf("cudart_probe: %d of %d checks failed\n", failures, checks);
    return 1;
}
