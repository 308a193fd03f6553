/* spin_test: a kernel that runs for a set time (rgpu_spin, on the GPU's
 * global timer), then a synchronisation; with the daemon's kernel watchdog
 * (--kernel-timeout-s) a kernel that overruns it ends in
 * CUDA_ERROR_LAUNCH_TIMEOUT, and the context is gone afterwards.
 *
 * Usage: spin_test --ptx reference_kernels.ptx --spin-ms N
 *            N = 0: spin forever
 *
 * Prints "spin: synchronize rc R NAME after T ms" and "after: rc R NAME"
 * (a cuMemAlloc after it) and exits 0; the verdict is the caller's. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "checks.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    long spin_ms = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--ptx") == 0) ptx_path = argv[i + 1];
        else if (strcmp(argv[i], "--spin-ms") == 0) spin_ms = strtol(argv[i + 1], NULL, 10);
    }
    if (!ptx_path || spin_ms < 0) {
        fprintf(stderr, "usage: %s --ptx PTX --spin-ms N\n", argv[0]);
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction spin;
    char *ptx = read_file(ptx_path);
    if (!ptx || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuModuleLoadData(&module, ptx) != CUDA_SUCCESS ||
        cuModuleGetFunction(&spin, module, "rgpu_spin") != CUDA_SUCCESS) {
        printf("FAIL: no CUDA context or kernel\n");
        return 1;
    }
    uint64_t ns = spin_ms == 0 ? UINT64_MAX : (uint64_t)spin_ms * 1000000u;
    void *params[] = {&ns};
    double start = now_ms();
    CUresult rc = cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    if (rc == CUDA_SUCCESS) rc = cuCtxSynchronize();
    printf("spin: synchronize rc %d %s after %.0f ms\n", rc, error_name(rc), now_ms() - start);
    fflush(stdout);
    CUdeviceptr p = 0;
    rc = cuMemAlloc(&p, 4096);
    printf("after: rc %d %s\n", rc, error_name(rc));
    return 0;
}
