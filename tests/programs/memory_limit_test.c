/* memory_limit_test: how much device memory this process can take, in
 * blocks, and what it is told the device has.
 *
 * Usage: memory_limit_test [--block-mb N] [--max-mb N] [--hold-file PATH]
 *   --block-mb N   allocation size (default 16)
 *   --max-mb N     stop after this much (default 1024)
 *   --hold-file P  after allocating, print "holding" and keep the memory
 *                  until P appears
 *
 * Prints "total MiB T", "info free F total T" (cuMemGetInfo, MiB), then
 * "allocated A MiB, then rc R NAME" (R = 0 when it stopped at --max-mb),
 * and, after freeing, "after free: info free F" and "again: rc R" (one
 * more block must fit again). Exit 0; the verdict is the caller's. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "wait_for_file.h"
#include "checks.h"

#define MAX_BLOCKS 4096

int main(int argc, char **argv) {
    long block_mb = 16, max_mb = 1024;
    const char *hold = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--block-mb")) block_mb = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--max-mb")) max_mb = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--hold-file")) hold = argv[i + 1];
    }
    CUdevice dev;
    CUcontext ctx;
    size_t total = 0, free_b = 0, info_total = 0;
    if (block_mb <= 0 || max_mb <= 0 || cuInit(0) != CUDA_SUCCESS ||
        cuDeviceGet(&dev, 0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        printf("FAIL: no CUDA context\n");
        return 1;
    }
    cuDeviceTotalMem(&total, dev);
    printf("total MiB %zu\n", total >> 20);
    cuMemGetInfo(&free_b, &info_total);
    printf("info free %zu total %zu\n", free_b >> 20, info_total >> 20);
    static CUdeviceptr blocks[MAX_BLOCKS];
    long n = 0;
    CUresult rc = CUDA_SUCCESS;
    while (n < MAX_BLOCKS && (n + 1) * block_mb <= max_mb) {
        rc = cuMemAlloc(&blocks[n], (size_t)block_mb << 20);
        if (rc != CUDA_SUCCESS) break;
        n++;
    }
    printf("allocated %ld MiB, then rc %d %s\n", n * block_mb, rc, error_name(rc));
    fflush(stdout);
    if (hold) {
        printf("holding\n");
        fflush(stdout);
        wait_for_file(hold, 10 * 1000000L);
    }
    for (long i = 0; i < n; i++) cuMemFree(blocks[i]);
    cuMemGetInfo(&free_b, &info_total);
    printf("after free: info free %zu\n", free_b >> 20);
    CUdeviceptr again = 0;
    rc = cuMemAlloc(&again, (size_t)block_mb << 20);
    printf("again: rc %d %s\n", rc, error_name(rc));
    if (rc == CUDA_SUCCESS) cuMemFree(again);
    cuDevicePrimaryCtxRelease(dev);
    return 0;
}
