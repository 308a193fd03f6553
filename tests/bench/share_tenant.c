/* share_tenant: one tenant of tests/bench/sharing_bench.sh, natively or
 * through rgpu (whichever libcuda.so.1 it is run with).
 *
 *   share_tenant --ptx PTX calibrate MS
 *       prints "iterations N": rgpu_fixed_work's iterations for a kernel of
 *       about MS milliseconds alone (132x4 blocks of 128 threads)
 *   share_tenant --ptx PTX work ITERATIONS KERNELS START_FILE
 *       waits for START_FILE, launches KERNELS fixed-work kernels, then
 *       synchronises; prints "done S" (seconds from the start file on)
 *   share_tenant --ptx PTX busy ITERATIONS SECONDS START_FILE
 *       waits for START_FILE, keeps the GPU busy for SECONDS with
 *       fixed-work kernels (one synchronisation per 4 launches); prints
 *       "kernels K"
 *   share_tenant --ptx PTX latency ITERS START_FILE
 *       waits for START_FILE, then ITERS times (or for LATENCY_SECONDS): a
 *       20 us kernel (rgpu_spin) and a synchronisation; lists the first
 *       slow samples, then prints "latency p50 A us p99 B us"
 *   share_tenant --ptx PTX spin NANOSECONDS SECONDS START_FILE
 *       as busy, with rgpu_spin kernels of NANOSECONDS each (the kernel the
 *       sim executor runs for its time too), two batches of 4 in flight;
 *       prints "kernels K"
 * Every mode that waits for START_FILE prints "ready" first. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "wait_for_file.h"
#include "checks.h"

#define BLOCKS (132 * 4)
#define THREADS 128
/* A latency run ends after ITERS samples or this long, whichever first. */
#define LATENCY_SECONDS 2.0
/* Samples at least this slow are listed (about 4x a 20 us kernel alone). */
#define SLOW_US 150.0

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static CUfunction work, spin;
static CUdeviceptr sink;

static CUresult launch_work(unsigned iterations) {
    void *params[] = {&sink, &iterations};
    return cuLaunchKernel(work, BLOCKS, 1, 1, THREADS, 1, 1, 0, NULL, params, NULL);
}

/* Says the context and module are ready, then waits for `path`. */
static void ready_then_wait(const char *path) {
    printf("ready\n");
    fflush(stdout);
    wait_for_file(path, 100000L);
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    if (argc < 5 || strcmp(argv[1], "--ptx") != 0) {
        fprintf(stderr, "usage: see the comment at the top of %s\n", __FILE__);
        return 2;
    }
    char *ptx = read_file(argv[2]);
    if (!ptx || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, ptx) ||
        cuModuleGetFunction(&work, module, "rgpu_fixed_work") ||
        cuModuleGetFunction(&spin, module, "rgpu_spin") || cuMemAlloc(&sink, 4)) {
        printf("FAIL: no CUDA context or kernels\n");
        return 1;
    }
    const char *mode = argv[3];
    if (!strcmp(mode, "calibrate")) {
        double target = atof(argv[4]) * 1e-3;
        unsigned iterations = 10000;
        for (int round = 0; round < 8; round++) {
            launch_work(iterations);
            cuCtxSynchronize();
            double t0 = now_s();
            for (int i = 0; i < 10; i++) launch_work(iterations);
            cuCtxSynchronize();
            double each = (now_s() - t0) / 10;
            iterations = (unsigned)(iterations * (target / each));
        }
        printf("iterations %u\n", iterations);
    } else if (!strcmp(mode, "work") && argc == 7) {
        unsigned iterations = (unsigned)strtoul(argv[4], NULL, 10);
        long kernels = strtol(argv[5], NULL, 10);
        launch_work(iterations); /* warm */
        cuCtxSynchronize();
        ready_then_wait(argv[6]);
        double t0 = now_s();
        for (long i = 0; i < kernels; i++) launch_work(iterations);
        CUresult rc = cuCtxSynchronize();
        printf("done %.3f rc %d\n", now_s() - t0, rc);
    } else if (!strcmp(mode, "busy") && argc == 7) {
        unsigned iterations = (unsigned)strtoul(argv[4], NULL, 10);
        double seconds = atof(argv[5]);
        launch_work(iterations);
        cuCtxSynchronize();
        ready_then_wait(argv[6]);
        double t0 = now_s();
        long kernels = 0;
        while (now_s() - t0 < seconds) {
            for (int i = 0; i < 4; i++) launch_work(iterations);
            cuCtxSynchronize();
            kernels += 4;
        }
        printf("kernels %ld\n", kernels);
    } else if (!strcmp(mode, "spin") && argc == 7) {
        uint64_t ns = strtoull(argv[4], NULL, 10);
        double seconds = atof(argv[5]);
        void *params[] = {&ns};
        /* Two batches in flight: the process waits for the older one while
         * the newer keeps its context busy, so the time a loaded machine
         * takes to wake it does not leave the GPU to the other tenants. */
        CUevent batch_done[2];
        if (cuEventCreate(&batch_done[0], CU_EVENT_DISABLE_TIMING) ||
            cuEventCreate(&batch_done[1], CU_EVENT_DISABLE_TIMING)) {
            printf("FAIL: events\n");
            return 1;
        }
        ready_then_wait(argv[6]);
        double t0 = now_s();
        long kernels = 0;
        for (unsigned batch = 0; now_s() - t0 < seconds; batch++) {
            for (int i = 0; i < 4; i++) cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
            kernels += 4;
            if (cuEventRecord(batch_done[batch % 2], NULL) ||
                (batch > 0 && cuEventSynchronize(batch_done[(batch + 1) % 2]))) {
                printf("FAIL: event\n");
                return 1;
            }
        }
        if (cuCtxSynchronize() != CUDA_SUCCESS) {
            printf("FAIL: synchronize\n");
            return 1;
        }
        printf("kernels %ld\n", kernels);
    } else if (!strcmp(mode, "latency") && argc == 6) {
        long iters = strtol(argv[4], NULL, 10);
        if (iters < 1 || iters > 1000000) return 2;
        double *lat = malloc(sizeof(double) * (size_t)iters);
        double *at = malloc(sizeof(double) * (size_t)iters);
        uint64_t ns = 20000;
        void *params[] = {&ns};
        cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        cuCtxSynchronize();
        ready_then_wait(argv[5]);
        double start = now_s();
        long n = 0;
        while (n < iters && now_s() - start < LATENCY_SECONDS) {
            double t0 = now_s();
            cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
            cuCtxSynchronize();
            lat[n] = (now_s() - t0) * 1e6;
            at[n] = (t0 - start) * 1e3;
            n++;
        }
        /* Where the slow samples lie (a start-up transient or a period). */
        int shown = 0;
        long slow = 0;
        for (long i = 0; i < n; i++) {
            if (lat[i] < SLOW_US) continue;
            slow++;
            if (shown++ < 12) printf("slow sample %ld at %.2f ms: %.1f us\n", i, at[i], lat[i]);
        }
        qsort(lat, (size_t)n, sizeof(double), compare);
        printf("samples %ld in %.3f s, %ld of them over %.0f us, p99.9 %.1f us, max %.1f us\n", n,
               now_s() - start, slow, SLOW_US, lat[n * 999 / 1000], lat[n - 1]);
        printf("latency p50 %.1f us p99 %.1f us\n", lat[n / 2], lat[n * 99 / 100]);
        free(lat);
        free(at);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    cuDevicePrimaryCtxRelease(dev);
    return 0;
}
