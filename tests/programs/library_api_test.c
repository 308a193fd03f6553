/* library_api_test: the context-independent code API of CUDA 12+ (CUlibrary,
 * CUkernel) as NVIDIA's runtimes use it, checked value by value. Runs the same
 * against rgpu's libcuda.so.1 (sim or cuda executor) and NVIDIA's.
 *
 * Usage: library_api_test --image PATH [--fixture [--run-fixture-kernel]]
 *                         [--check-stale-handles]
 *
 *   --image PATH   a module image: PTX text (reference_kernels.ptx or the
 *                  fixtures' kernels.ptx, for the sim executor), a cubin or a
 *                  fatbin (GPU host only)
 *   --fixture      the image is built from tests/fixtures/fatbin/kernels.cu:
 *                  also write and read back its __constant__ array
 *   --run-fixture-kernel  also run rgpu_apply_coefficients, which reads the
 *                  __constant__ array and adds to the __device__ counter (not
 *                  a kernel the sim executor knows)
 *   --check-stale-handles  use handles of an unloaded library (undefined
 *                  behaviour with NVIDIA's driver; rgpu must reject them)
 *
 * The image must hold rgpu_fill_index(unsigned *out, unsigned base, unsigned n),
 * rgpu_scale(float *x, float factor, unsigned n) and a __device__ unsigned
 * rgpu_global_counter (reference_kernels.ptx and kernels.cu both do).
 *
 * Prints "library_api_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"
#include "rgpu_launch.h"

typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;

#define FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define MODULE_EAGER_LOADING 1
#define MODULE_LAZY_LOADING 2

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jit_options,
                           void **jit_values, unsigned int num_jit_options, int *library_options,
                           void **library_values, unsigned int num_library_options);
CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *file_name, int *jit_options,
                               void **jit_values, unsigned int num_jit_options,
                               int *library_options, void **library_values,
                               unsigned int num_library_options);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library);
CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
                            const char *name);
CUresult cuKernelGetFunction(CUfunction *function, CUkernel kernel);
CUresult cuKernelGetLibrary(CUlibrary *library, CUkernel kernel);
CUresult cuKernelGetAttribute(int *value, int attribute, CUkernel kernel, CUdevice device);
CUresult cuKernelSetAttribute(int attribute, int value, CUkernel kernel, CUdevice device);
CUresult cuKernelGetName(const char **name, CUkernel kernel);
CUresult cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t *offset, size_t *size);
CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t *offset, size_t *size);
CUresult cuFuncGetName(const char **name, CUfunction function);
CUresult cuModuleGetLoadingMode(int *mode);
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device);
CUresult cuCtxDestroy_v2(CUcontext ctx);


/* The whole file, plus a NUL (PTX text must end with one), 16-byte aligned. */
/* out[i] == base + i for i < n, through a CUkernel launched as a CUfunction. */
static int check_fill_index(CUkernel fill, unsigned n, unsigned base) {
    CUdeviceptr out;
    unsigned *host = calloc(n, sizeof(unsigned));
    unsigned bad = 0;
    void *params[] = {&out, &base, &n};
    if (!host) return -1;
    REQUIRE_CU(cuMemAlloc(&out, n * sizeof(unsigned)));
    CHECK_CU(cuMemsetD32(out, 0xdeadbeef, n));
    CHECK_CU(cuLaunchKernel((CUfunction)fill, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, params,
                            NULL));
    CHECK_CU(cuMemcpyDtoH(host, out, n * sizeof(unsigned)));
    for (unsigned i = 0; i < n; i++) bad += host[i] != base + i;
    CHECK_EQ_INT(bad, 0);
    CHECK_CU(cuMemFree(out));
    free(host);
    return 0;
}

static int check_globals(CUlibrary library) {
    CUdeviceptr counter = 0, again = 0;
    size_t size = 0, size_again = 0;
    unsigned value = 0xc0ffee, back = 0;
    CUmodule module = NULL;

    REQUIRE_CU(cuLibraryGetGlobal(&counter, &size, library, "rgpu_global_counter"));
    CHECK_TRUE(counter != 0);
    CHECK_EQ_INT(size, sizeof(unsigned));
    CHECK_CU(cuMemcpyHtoD(counter, &value, sizeof value));
    CHECK_CU(cuMemcpyDtoH(&back, counter, sizeof back));
    CHECK_EQ_INT(back, 0xc0ffee);
    /* The library's module in this context holds the same variable. */
    REQUIRE_CU(cuLibraryGetModule(&module, library));
    CHECK_CU(cuModuleGetGlobal(&again, &size_again, module, "rgpu_global_counter"));
    CHECK_EQ_INT(again, counter);
    CHECK_EQ_INT(size_again, size);
    CHECK_RC(cuLibraryGetGlobal(&again, &size_again, library, "no_such_global"),
             CUDA_ERROR_NOT_FOUND);
    back = 0;
    value = 0;
    CHECK_CU(cuMemcpyHtoD(counter, &value, sizeof value));
    CHECK_CU(cuMemcpyDtoH(&back, counter, sizeof back));
    CHECK_EQ_INT(back, 0);
    return 0;
}

/* kernels.cu's __constant__ float rgpu_coefficients[4], written and read
 * back; then (run_kernel) rgpu_apply_coefficients: x[i] *= rgpu_coefficients[i
 * % 4], and thread 0 adds n to rgpu_global_counter. */
static int check_fixture(CUlibrary library, int run_kernel) {
    const float coefficients[4] = {1.0f, 2.0f, 0.5f, -1.0f};
    float constants_back[4] = {0};
    enum { N = 1000 };
    static float host[N];
    CUdeviceptr constants, counter, x;
    size_t size;
    unsigned n = N, count = 0, bad = 0;
    CUkernel apply;
    void *params[] = {&x, &n};

    REQUIRE_CU(cuLibraryGetGlobal(&constants, &size, library, "rgpu_coefficients"));
    CHECK_EQ_INT(size, sizeof coefficients);
    CHECK_CU(cuMemcpyHtoD(constants, coefficients, sizeof coefficients));
    CHECK_CU(cuMemcpyDtoH(constants_back, constants, sizeof constants_back));
    CHECK_TRUE(memcmp(constants_back, coefficients, sizeof coefficients) == 0);
    if (!run_kernel) return 0;

    REQUIRE_CU(cuLibraryGetKernel(&apply, library, "rgpu_apply_coefficients"));
    REQUIRE_CU(cuLibraryGetGlobal(&counter, &size, library, "rgpu_global_counter"));
    CHECK_CU(cuMemcpyHtoD(counter, &count, sizeof count));
    for (unsigned i = 0; i < N; i++) host[i] = (float)i;
    REQUIRE_CU(cuMemAlloc(&x, sizeof host));
    CHECK_CU(cuMemcpyHtoD(x, host, sizeof host));
    CHECK_CU(cuLaunchKernel((CUfunction)apply, (N + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, params,
                            NULL));
    CHECK_CU(cuMemcpyDtoH(host, x, sizeof host));
    CHECK_CU(cuMemcpyDtoH(&count, counter, sizeof count));
    for (unsigned i = 0; i < N; i++) bad += host[i] != (float)i * coefficients[i % 4];
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(count, N);
    CHECK_CU(cuMemFree(x));
    return 0;
}

static int run(const char *path, const char *image, int fixture, int run_kernel, int stale) {
    CUdevice device = 0;
    CUcontext ctx = NULL, other = NULL;
    CUlibrary library = NULL, from_file = NULL, owner = NULL;
    CUkernel fill = NULL, scale = NULL, again = NULL;
    CUfunction scale_function = NULL;
    CUmodule module = NULL;
    const char *name = NULL;
    size_t offset = 0, size = 0;
    int mode = 0, value = 0, threads = 0;

    REQUIRE_CU(cuInit(0));
    REQUIRE_CU(cuDeviceGet(&device, 0));
    CHECK_CU(cuModuleGetLoadingMode(&mode));
    CHECK_TRUE(mode == MODULE_EAGER_LOADING || mode == MODULE_LAZY_LOADING);

    /* A library needs no context; nor does a kernel handle. */
    REQUIRE_CU(cuLibraryLoadData(&library, image, NULL, NULL, 0, NULL, NULL, 0));
    REQUIRE_CU(cuLibraryGetKernel(&fill, library, "rgpu_fill_index"));
    REQUIRE_CU(cuLibraryGetKernel(&again, library, "rgpu_fill_index"));
    CHECK_TRUE(again == fill);
    CHECK_CU(cuKernelGetName(&name, fill));
    CHECK_TRUE(name != NULL && strcmp(name, "rgpu_fill_index") == 0);
    CHECK_CU(cuKernelGetLibrary(&owner, fill));
    CHECK_TRUE(owner == library);

    REQUIRE_CU(cuDevicePrimaryCtxRetain(&ctx, device));
    REQUIRE_CU(cuCtxSetCurrent(ctx));
    CHECK_RC(cuLibraryGetKernel(&again, library, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    REQUIRE_CU(cuLibraryGetKernel(&scale, library, "rgpu_scale"));

    /* rgpu_scale(float *x, float factor, unsigned n): offsets 0, 8, 12. */
    const size_t offsets[3] = {0, 8, 12}, sizes[3] = {8, 4, 4};
    for (size_t i = 0; i < 3; i++) {
        CHECK_CU(cuKernelGetParamInfo(scale, i, &offset, &size));
        CHECK_EQ_INT(offset, offsets[i]);
        CHECK_EQ_INT(size, sizes[i]);
    }
    CHECK_RC(cuKernelGetParamInfo(scale, 3, &offset, &size), CUDA_ERROR_INVALID_VALUE);
    REQUIRE_CU(cuKernelGetFunction(&scale_function, scale));
    CHECK_CU(cuFuncGetParamInfo(scale_function, 1, &offset, &size));
    CHECK_EQ_INT(offset, 8);
    CHECK_EQ_INT(size, 4);
    CHECK_RC(cuFuncGetParamInfo(scale_function, 3, &offset, &size), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuFuncGetName(&name, scale_function));
    CHECK_TRUE(name != NULL && strcmp(name, "rgpu_scale") == 0);
    CHECK_CU(cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                scale_function));
    CHECK_TRUE(threads > 0);
    CHECK_CU(cuKernelGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale, device));
    CHECK_EQ_INT(value, threads);
    CHECK_CU(cuKernelSetAttribute(FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024, scale,
                                  device));
    CHECK_CU(cuKernelGetAttribute(&value, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, scale,
                                  device));
    CHECK_EQ_INT(value, 1024);

    /* Launches: a CUkernel where a CUfunction goes, its CUfunction, and
     * cuLaunchKernelEx with a priority hint. */
    if (check_fill_index(fill, 1000, 7) != 0) return -1;
    {
        enum { N = 300 };
        float host[N];
        CUdeviceptr x;
        float factor = 2.0f;
        unsigned n = N, bad = 0;
        void *params[] = {&x, &factor, &n};
        LaunchAttribute priority = {.id = LAUNCH_ATTRIBUTE_PRIORITY};
        LaunchConfig config = {.grid_x = 3, .grid_y = 1, .grid_z = 1, .block_x = 128,
                               .block_y = 1, .block_z = 1, .attrs = &priority, .num_attrs = 1};
        for (unsigned i = 0; i < N; i++) host[i] = (float)i;
        REQUIRE_CU(cuMemAlloc(&x, sizeof host));
        CHECK_CU(cuMemcpyHtoD(x, host, sizeof host));
        CHECK_CU(cuLaunchKernel(scale_function, 3, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
        CHECK_CU(cuLaunchKernelEx(&config, (CUfunction)scale, params, NULL));
        CHECK_CU(cuMemcpyDtoH(host, x, sizeof host));
        for (unsigned i = 0; i < N; i++) bad += host[i] != (float)i * 4.0f;
        CHECK_EQ_INT(bad, 0);
        CHECK_CU(cuMemFree(x));
    }
    if (check_globals(library) != 0) return -1;
    if (fixture && check_fixture(library, run_kernel) != 0) return -1;

    /* The same kernel in another context: its own module there. */
    REQUIRE_CU(cuCtxCreate_v2(&other, 0, device));
    if (check_fill_index(fill, 500, 100) != 0) return -1;
    CHECK_CU(cuLibraryGetModule(&module, library));
    CHECK_CU(cuCtxDestroy_v2(other));
    REQUIRE_CU(cuCtxSetCurrent(ctx));
    if (check_fill_index(fill, 64, 1) != 0) return -1;

    /* The same image again (by data and by file): one more library. */
    REQUIRE_CU(cuLibraryLoadFromFile(&from_file, path, NULL, NULL, 0, NULL, NULL, 0));
    REQUIRE_CU(cuLibraryGetKernel(&again, from_file, "rgpu_fill_index"));
    CHECK_TRUE(again != fill);
    if (check_fill_index(again, 256, 3) != 0) return -1;
    CHECK_CU(cuLibraryUnload(from_file));
    CHECK_TRUE(cuLibraryLoadFromFile(&from_file, "/nonexistent/rgpu.fatbin", NULL, NULL, 0, NULL,
                                     NULL, 0) != CUDA_SUCCESS);

    CHECK_CU(cuLibraryUnload(library));
    if (stale) {
        CHECK_RC(cuLibraryUnload(library), CUDA_ERROR_INVALID_HANDLE);
        CHECK_RC(cuKernelGetName(&name, fill), CUDA_ERROR_INVALID_HANDLE);
        CHECK_RC(cuLaunchKernel((CUfunction)fill, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
                 CUDA_ERROR_INVALID_HANDLE);
    }
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(cuDevicePrimaryCtxRelease(device));
    return 0;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int fixture = 0, run_kernel = 0, stale = 0;
    size_t len = 0;
    char *image;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--image") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(argv[i], "--fixture") == 0) {
            fixture = 1;
        } else if (strcmp(argv[i], "--run-fixture-kernel") == 0) {
            run_kernel = 1;
        } else if (strcmp(argv[i], "--check-stale-handles") == 0) {
            stale = 1;
        } else {
            path = NULL;
            break;
        }
    }
    if (!path) {
        fprintf(stderr,
                "usage: %s --image PATH [--fixture [--run-fixture-kernel]] "
                "[--check-stale-handles]\n",
                argv[0]);
        return 2;
    }
    image = read_file_len(path, &len);
    if (!image) {
        fprintf(stderr, "library_api_test: cannot read %s\n", path);
        return 2;
    }
    run(path, image, fixture, run_kernel, stale);
    free(image);

    if (checks_failed) {
        printf("library_api_test: %ld checks failed, %ld passed\n", checks_failed, checks_passed);
        return 1;
    }
    printf("library_api_test: %ld checks passed\n", checks_passed);
    return 0;
}
