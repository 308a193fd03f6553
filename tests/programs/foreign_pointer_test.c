/* foreign_pointer_test: one process's device memory is out of another's
 * reach, as natively (a second process's pointer is CUDA_ERROR_INVALID_VALUE
 * to cuMemcpyDtoH). Run two of them: an owner, then a prober given the
 * owner's pointer.
 *
 * Usage: foreign_pointer_test own --stop-file PATH
 *            allocates 1 MiB, fills it with 0xA5, prints "pointer 0x..."
 *            and waits until PATH appears; then checks the bytes are intact
 *        foreign_pointer_test probe ADDR
 *            tries to read, write and copy 4 KiB at ADDR before allocating
 *            anything itself: each must fail with CUDA_ERROR_INVALID_VALUE;
 *            then its own memory still works
 *
 * Prints "foreign_pointer_test: N checks passed" (exit 0) or every failed
 * check (exit 1). */
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

#define OWNED_BYTES (1u << 20)
#define PROBE_BYTES 4096u
#define MARKER 0xA5

static int own(const char *stop_file) {
    CUdeviceptr dptr = 0;
    static unsigned char back[OWNED_BYTES];
    REQUIRE_CU(cuMemAlloc(&dptr, OWNED_BYTES));
    REQUIRE_CU(cuMemsetD8(dptr, MARKER, OWNED_BYTES));
    REQUIRE_CU(cuCtxSynchronize());
    printf("pointer 0x%llx\n", (unsigned long long)dptr);
    fflush(stdout);
    wait_for_file(stop_file, 10 * 1000000L);
    CHECK_CU(cuMemcpyDtoH(back, dptr, OWNED_BYTES));
    size_t intact = 0;
    for (size_t i = 0; i < OWNED_BYTES; i++) intact += back[i] == MARKER;
    CHECK_EQ_INT(intact, OWNED_BYTES);
    printf("intact=%s\n", intact == OWNED_BYTES ? "yes" : "NO");
    CHECK_CU(cuMemFree(dptr));
    return 0;
}

static int probe(CUdeviceptr foreign) {
    static unsigned char buf[PROBE_BYTES];
    CUdeviceptr mine = 0;
    memset(buf, 0, sizeof buf);
    /* Before this process holds any memory of its own. */
    CHECK_RC(cuMemcpyDtoH(buf, foreign, PROBE_BYTES), CUDA_ERROR_INVALID_VALUE);
    size_t seen = 0;
    for (size_t i = 0; i < PROBE_BYTES; i++) seen += buf[i] == MARKER;
    CHECK_EQ_INT(seen, 0);
    CHECK_RC(cuMemsetD8(foreign, 0, PROBE_BYTES), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemcpyHtoD(foreign, buf, PROBE_BYTES), CUDA_ERROR_INVALID_VALUE);
    /* Its own memory still works, and cannot be filled from the foreign
     * pointer either. */
    REQUIRE_CU(cuMemAlloc(&mine, PROBE_BYTES));
    if (mine != foreign) {
        CHECK_RC(cuMemcpyDtoD(mine, foreign, PROBE_BYTES), CUDA_ERROR_INVALID_VALUE);
    }
    CHECK_CU(cuMemsetD8(mine, 0x3c, PROBE_BYTES));
    CHECK_CU(cuMemcpyDtoH(buf, mine, PROBE_BYTES));
    size_t ok = 0;
    for (size_t i = 0; i < PROBE_BYTES; i++) ok += buf[i] == 0x3c;
    CHECK_EQ_INT(ok, PROBE_BYTES);
    CHECK_CU(cuMemFree(mine));
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s own --stop-file PATH | probe ADDR\n", argv[0]);
        return 2;
    }
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        printf("FAIL: no CUDA context\n");
        return 1;
    }
    if (strcmp(argv[1], "own") == 0 && argc == 4 && strcmp(argv[2], "--stop-file") == 0) {
        own(argv[3]);
    } else if (strcmp(argv[1], "probe") == 0 && argc == 3) {
        char *end = NULL;
        errno = 0;
        unsigned long long addr = strtoull(argv[2], &end, 0);
        if (errno != 0 || end == argv[2] || *end != '\0') {
            fprintf(stderr, "bad address %s\n", argv[2]);
            return 2;
        }
        probe((CUdeviceptr)addr);
    } else {
        fprintf(stderr, "usage: %s own --stop-file PATH | probe ADDR\n", argv[0]);
        return 2;
    }
    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) {
        printf("foreign_pointer_test: %ld checks FAILED, %ld passed\n", checks_failed,
               checks_passed);
        return 1;
    }
    printf("foreign_pointer_test: %ld checks passed\n", checks_passed);
    return 0;
}
