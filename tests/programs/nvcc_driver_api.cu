/* nvcc_driver_api: a driver-API program whose kernels nvcc compiles into a
 * fatbin, a cubin or PTX, loaded with cuModuleLoadData, cuModuleLoadDataEx or
 * cuModuleLoadFatBinary; every result is checked on the host.
 * For the GPU host (CUDA toolkit there); not built on CI.
 *
 * One file, two builds (tests/gpu/run-gpu-suite.sh does both):
 *   nvcc -fatbin -arch=sm_90 -o kernels.fatbin nvcc_driver_api.cu
 *   g++ -DRGPU_HOST_PART -x c++ -I/usr/local/cuda/include -o nvcc_driver_api \
 *       nvcc_driver_api.cu -L<libcuda dir> -lcuda
 *   (also nvcc -cubin / -ptx for the other image kinds)
 * Run: nvcc_driver_api [--loader data|dataex|fatbinary] IMAGE
 * Prints "nvcc_driver_api: N checks passed" (exit 0) or each failure (exit 1). */

#ifndef RGPU_HOST_PART

extern "C" __global__ void saxpy(float a, const float *x, float *y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

/* out[block] = sum of the block's elements, reduced in dynamic shared memory
 * (blockDim.x must be a power of two). */
extern "C" __global__ void block_sum(const float *in, float *out, unsigned n) {
    extern __shared__ float partial[];
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    partial[threadIdx.x] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

#else

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static long passed, failed;
/* Which driver entry point loads the image (--loader). */
static const char *loader = "data";

#define CHECK_CU(call)                                                                    \
    do {                                                                                  \
        CUresult rc_ = (call);                                                            \
        if (rc_ != CUDA_SUCCESS) {                                                        \
            const char *name_ = "?";                                                      \
            cuGetErrorName(rc_, &name_);                                                  \
            printf("FAIL line %d: %s: expected CUDA_SUCCESS, got %d (%s)\n", __LINE__, #call, \
                   (int)rc_, name_);                                                      \
            failed++;                                                                     \
            return 1;                                                                     \
        }                                                                                 \
        passed++;                                                                         \
    } while (0)

static void check_floats(int line, const char *what, const float *actual, const float *expected,
                         size_t count) {
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        if (memcmp(&actual[i], &expected[i], sizeof(float)) != 0) {
            if (bad < 5)
                printf("FAIL line %d: %s[%zu]: expected %.9g, got %.9g\n", line, what, i,
                       (double)expected[i], (double)actual[i]);
            bad++;
        }
    }
    if (bad) {
        printf("FAIL line %d: %s: %zu of %zu values differ\n", line, what, bad, count);
        failed++;
    } else {
        passed++;
    }
}

static std::vector<char> read_file(const char *path) {
    std::vector<char> data;
    FILE *f = fopen(path, "rb");
    if (!f) return data;
    char buffer[65536];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, f)) > 0) data.insert(data.end(), buffer, buffer + n);
    fclose(f);
    return data;
}

static int run(const std::vector<char> &fatbin) {
    const unsigned n = (1u << 20) + 333; /* several blocks, a partial last one */
    const unsigned block = 256;
    const unsigned blocks = (n + block - 1) / block;
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction saxpy, block_sum;
    CUstream stream;
    CUdeviceptr dx, dy, dsums;
    float *x, *y;

    CHECK_CU(cuInit(0));
    CHECK_CU(cuDeviceGet(&dev, 0));
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK_CU(cuCtxSetCurrent(ctx));
    if (!strcmp(loader, "dataex")) {
        CUjit_option options[] = {CU_JIT_LOG_VERBOSE};
        void *values[] = {(void *)0};
        CHECK_CU(cuModuleLoadDataEx(&module, fatbin.data(), 1, options, values));
    } else if (!strcmp(loader, "fatbinary")) {
        CHECK_CU(cuModuleLoadFatBinary(&module, fatbin.data()));
    } else {
        CHECK_CU(cuModuleLoadData(&module, fatbin.data()));
    }
    CHECK_CU(cuModuleGetFunction(&saxpy, module, "saxpy"));
    CHECK_CU(cuModuleGetFunction(&block_sum, module, "block_sum"));
    CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuMemAllocHost((void **)&x, n * sizeof(float)));
    CHECK_CU(cuMemAllocHost((void **)&y, n * sizeof(float)));
    CHECK_CU(cuMemAlloc(&dx, n * sizeof(float)));
    CHECK_CU(cuMemAlloc(&dy, n * sizeof(float)));
    CHECK_CU(cuMemAlloc(&dsums, blocks * sizeof(float)));

    /* Small integers: every sum below is exact in float. */
    std::vector<float> expected(n), sums(blocks), expected_sums(blocks, 0.0f);
    for (unsigned i = 0; i < n; i++) {
        x[i] = (float)(i % 7);
        y[i] = (float)(i % 5);
    }
    float a = 3.0f;
    for (unsigned i = 0; i < n; i++) expected[i] = a * x[i] + y[i];

    CHECK_CU(cuMemcpyHtoDAsync(dx, x, n * sizeof(float), stream));
    CHECK_CU(cuMemcpyHtoDAsync(dy, y, n * sizeof(float), stream));
    unsigned count = n;
    void *saxpy_params[] = {&a, &dx, &dy, &count};
    CHECK_CU(cuLaunchKernel(saxpy, blocks, 1, 1, block, 1, 1, 0, stream, saxpy_params, NULL));
    CHECK_CU(cuMemcpyDtoHAsync(y, dy, n * sizeof(float), stream));
    CHECK_CU(cuStreamSynchronize(stream));
    check_floats(__LINE__, "saxpy", y, expected.data(), n);

    void *sum_params[] = {&dy, &dsums, &count};
    CHECK_CU(cuLaunchKernel(block_sum, blocks, 1, 1, block, 1, 1, block * sizeof(float), stream,
                            sum_params, NULL));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuMemcpyDtoH(sums.data(), dsums, blocks * sizeof(float)));
    for (unsigned i = 0; i < n; i++) expected_sums[i / block] += expected[i];
    check_floats(__LINE__, "block_sum", sums.data(), expected_sums.data(), blocks);

    CHECK_CU(cuMemFree(dx));
    CHECK_CU(cuMemFree(dy));
    CHECK_CU(cuMemFree(dsums));
    CHECK_CU(cuMemFreeHost(x));
    CHECK_CU(cuMemFreeHost(y));
    CHECK_CU(cuStreamDestroy(stream));
    CHECK_CU(cuModuleUnload(module));
    CHECK_CU(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *image_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--loader") && i + 1 < argc) {
            loader = argv[++i];
        } else {
            image_path = argv[i];
        }
    }
    if (!image_path || (strcmp(loader, "data") && strcmp(loader, "dataex") &&
                        strcmp(loader, "fatbinary"))) {
        fprintf(stderr, "usage: %s [--loader data|dataex|fatbinary] IMAGE (fatbin, cubin or PTX)\n",
                argv[0]);
        return 2;
    }
    std::vector<char> fatbin = read_file(image_path);
    if (fatbin.empty()) {
        fprintf(stderr, "nvcc_driver_api: cannot read %s\n", image_path);
        return 2;
    }
    /* PTX text is handed to the driver NUL-terminated. */
    fatbin.push_back(0);
    run(fatbin);
    if (failed) {
        printf("nvcc_driver_api: %ld checks failed, %ld passed\n", failed, passed);
        return 1;
    }
    printf("nvcc_driver_api: %ld checks passed\n", passed);
    return 0;
}

#endif
