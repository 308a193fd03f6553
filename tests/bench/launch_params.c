/* launch_params: what the two ways of handing a kernel its parameters cost
 * the driver (issue 9), on the GPU host, natively:
 *
 *   launch_params LIBCUDA reference_kernels.ptx CPU [ROUNDS]
 *
 * rgpu's launch thread passes a launch's parameter block as `extra`
 * (CU_LAUNCH_PARAM_BUFFER_POINTER); programs usually pass `kernelParams`,
 * an array of pointers to each parameter. Pinned to CPU, each round
 * launches blocks of 20000 of rgpu_empty (no parameters: NULL against an
 * empty buffer) and of rgpu_vector_add (four parameters, doing nothing:
 * n = 0) both ways, the ways alternating block by block, and prints each
 * way's rate and the ratio extra / kernelParams. It also prints what one
 * clock_gettime(CLOCK_MONOTONIC) costs here (the launch thread's profile
 * takes two per launch). */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"

#define BLOCK 20000
#define BLOCKS 10

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) fprintf(stderr, "launch_params: no %s\n", name);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s LIBCUDA reference_kernels.ptx CPU [ROUNDS]\n", argv[0]);
        return 2;
    }
    int cpu = atoi(argv[3]);
    int rounds = argc > 4 ? atoi(argv[4]) : 3;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set)) {
        perror("sched_setaffinity");
        return 1;
    }
    const char *ptx = read_ptx(argv[2]);

    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "launch_params: %s\n", dlerror());
        return 1;
    }
    CUresult (*init)(unsigned) = sym(lib, "cuInit");
    CUresult (*device_get)(CUdevice *, int) = sym(lib, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = sym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = sym(lib, "cuCtxSetCurrent");
    CUresult (*synchronize)(void) = sym(lib, "cuCtxSynchronize");
    CUresult (*load)(CUmodule *, const void *) = sym(lib, "cuModuleLoadData");
    CUresult (*get_function)(CUfunction *, CUmodule, const char *) = sym(lib, "cuModuleGetFunction");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = sym(lib, "cuMemAlloc_v2");
    launch_fn launch = (launch_fn)sym(lib, "cuLaunchKernel");
    if (!init || !device_get || !retain || !set_current || !synchronize || !load || !get_function ||
        !mem_alloc || !launch)
        return 1;

    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction empty, add;
    CUdeviceptr d;
    CHECK(init(0));
    CHECK(device_get(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(set_current(ctx));
    CHECK(load(&module, ptx));
    CHECK(get_function(&empty, module, "rgpu_empty"));
    CHECK(get_function(&add, module, "rgpu_vector_add"));
    CHECK(mem_alloc(&d, 4096));

    /* rgpu_vector_add(a, b, out, n) with n = 0: nothing to do. */
    struct {
        CUdeviceptr a, b, out;
        unsigned n;
        unsigned pad;
    } block = {d, d, d, 0, 0};
    void *pointers[] = {&block.a, &block.b, &block.out, &block.n};
    size_t add_size = 28, empty_size = 0;
    char nothing[8] = {0};
    void *add_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &block, CU_LAUNCH_PARAM_BUFFER_SIZE,
                         &add_size, CU_LAUNCH_PARAM_END};
    void *empty_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, nothing, CU_LAUNCH_PARAM_BUFFER_SIZE,
                           &empty_size, CU_LAUNCH_PARAM_END};
    struct way {
        const char *name;
        CUfunction f;
        void **params;
        void **extra;
    } ways[2][2] = {
        {{"empty, kernelParams NULL", empty, NULL, NULL}, {"empty, extra (0 bytes)", empty, NULL, empty_extra}},
        {{"vector_add, kernelParams", add, pointers, NULL}, {"vector_add, extra (28 bytes)", add, NULL, add_extra}},
    };

    for (int i = 0; i < 5000; i++) CHECK(launch(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK(synchronize());

    int samples = 1000000;
    double t0 = now_s();
    struct timespec t;
    for (int i = 0; i < samples; i++) clock_gettime(CLOCK_MONOTONIC, &t);
    printf("clock_gettime: %.1f ns each (CPU %d)\n", (now_s() - t0) * 1e9 / samples, cpu);

    for (int round = 1; round <= rounds; round++) {
        for (int k = 0; k < 2; k++) {
            double seconds[2] = {0, 0};
            for (int b = 0; b < BLOCKS; b++) {
                for (int turn = 0; turn < 2; turn++) {
                    int w = b % 2 == 0 ? turn : 1 - turn;
                    struct way *way = &ways[k][w];
                    double start = now_s();
                    for (int i = 0; i < BLOCK; i++)
                        CHECK(launch(way->f, 1, 1, 1, 32, 1, 1, 0, NULL, way->params, way->extra));
                    CHECK(synchronize());
                    seconds[w] += now_s() - start;
                }
            }
            double rate[2];
            for (int w = 0; w < 2; w++) rate[w] = BLOCK * BLOCKS / seconds[w];
            printf("round %d: %-28s %8.0f/s  %-30s %8.0f/s  extra/kernelParams %.3f\n", round,
                   ways[k][0].name, rate[0], ways[k][1].name, rate[1], rate[1] / rate[0]);
        }
    }
    return 0;
}
