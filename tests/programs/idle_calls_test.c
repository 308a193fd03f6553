/* idle_calls_test: calls that each find rgpu's host thread asleep.
 *
 * Usage: idle_calls_test --ptx reference_kernels.ptx [--calls N] [--gap-us US]
 *
 * Loads the reference kernels, then N times (default 20): sleeps US
 * microseconds (default 2000, far past the host's 50 us spin), launches
 * rgpu_empty and synchronizes, checking both results. Which way the host
 * was woken (the channel's wake word in local mode, or a doorbell) is for
 * the caller to read from the daemon's counters.
 *
 * Prints "idle_calls_test: N checks passed" (exit 0) or every failed
 * check (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "checks.h"

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    long calls = 20, gap_us = 2000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ptx") == 0 && i + 1 < argc) {
            ptx_path = argv[++i];
        } else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            calls = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--gap-us") == 0 && i + 1 < argc) {
            gap_us = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s --ptx FILE [--calls N] [--gap-us US]\n", argv[0]);
            return 2;
        }
    }
    char *ptx = ptx_path ? read_file(ptx_path) : NULL;
    if (!ptx || calls < 1 || gap_us < 0) {
        fprintf(stderr, "idle_calls_test: need a readable --ptx, calls >= 1, gap >= 0\n");
        return 2;
    }
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    CUfunction empty;
    REQUIRE_CU(cuInit(0));
    REQUIRE_CU(cuDeviceGet(&device, 0));
    REQUIRE_CU(cuDevicePrimaryCtxRetain(&ctx, device));
    REQUIRE_CU(cuCtxSetCurrent(ctx));
    REQUIRE_CU(cuModuleLoadData(&module, ptx));
    REQUIRE_CU(cuModuleGetFunction(&empty, module, "rgpu_empty"));
    struct timespec gap = {gap_us / 1000000, (gap_us % 1000000) * 1000};
    for (long i = 0; i < calls; i++) {
        nanosleep(&gap, NULL);
        CHECK_CU(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK_CU(cuCtxSynchronize());
    }
    CHECK_CU(cuModuleUnload(module));
    CHECK_CU(cuDevicePrimaryCtxRelease(device));
    free(ptx);
    if (checks_failed) {
        printf("idle_calls_test: %ld of %ld checks failed\n", checks_failed,
               checks_passed + checks_failed);
        return 1;
    }
    printf("idle_calls_test: %ld checks passed\n", checks_passed);
    return 0;
}
