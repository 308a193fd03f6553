/* fault_test: launches rgpu_fault (a store to address 0) and checks that the
 * fault is sticky for the whole process, as NVIDIA's driver makes it: the
 * context reports CUDA_ERROR_ILLEGAL_ADDRESS, and so does a fresh context.
 * The daemon serves each connection in its own process, so other programs
 * are not affected (tests/tests/isolation.rs).
 *
 * Usage: fault_test --ptx reference_kernels.ptx [--stop-file PATH]
 *
 *   --stop-file PATH  after the checks, print "poisoned" and stay connected
 *                     until PATH appears
 *
 * Prints "fault_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "wait_for_file.h"

/* Not in rgpu_cuda.h (the other programs use the primary context). */
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device);

static int checks_passed;
static int checks_failed;

/* `rc` must be `want`. */
static void expect(int line, const char *what, CUresult rc, CUresult want) {
    if (rc == want) {
        checks_passed++;
    } else {
        checks_failed++;
        printf("FAIL line %d: %s: expected %d, got %d\n", line, what, want, rc);
    }
}

#define EXPECT(call, want) expect(__LINE__, #call, (call), (want))

/* The fault may surface at the launch itself or at the next call that
 * waits for the device; either way it is CUDA_ERROR_ILLEGAL_ADDRESS. */
static void expect_fault(int line, const char *what, CUresult rc) {
    if (rc == CUDA_ERROR_ILLEGAL_ADDRESS || rc == CUDA_SUCCESS) {
        checks_passed++;
    } else {
        checks_failed++;
        printf("FAIL line %d: %s: expected the fault or success, got %d\n", line, what, rc);
    }
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long size;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        text = malloc((size_t)size + 1);
        if (text && fread(text, 1, (size_t)size, f) == (size_t)size) {
            text[size] = '\0';
        } else {
            free(text);
            text = NULL;
        }
    }
    fclose(f);
    return text;
}

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    const char *stop_file = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--ptx") == 0) {
            ptx_path = argv[i + 1];
        } else if (strcmp(argv[i], "--stop-file") == 0) {
            stop_file = argv[i + 1];
        }
    }
    if (!ptx_path) {
        fprintf(stderr, "usage: %s --ptx reference_kernels.ptx [--stop-file PATH]\n", argv[0]);
        return 2;
    }
    char *ptx = read_file(ptx_path);
    if (!ptx) {
        fprintf(stderr, "fault_test: cannot read %s\n", ptx_path);
        return 2;
    }

    CUdevice device = 0;
    CUcontext ctx = NULL;
    CUmodule module = NULL;
    CUfunction fault = NULL;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&device, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    EXPECT(cuModuleLoadData(&module, ptx), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&fault, module, "rgpu_fault"), CUDA_SUCCESS);
    if (checks_failed == 0) {
        expect_fault(__LINE__, "cuLaunchKernel(rgpu_fault)",
                     cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        EXPECT(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        /* Sticky: the context stays broken. */
        CUdeviceptr ptr = 0;
        EXPECT(cuMemAlloc(&ptr, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
        /* And the whole process: a fresh context fails too, at creation or
         * at its first use. */
        CUcontext fresh = NULL;
        CUresult rc = cuCtxCreate_v2(&fresh, 0, device);
        if (rc == CUDA_SUCCESS) rc = cuMemAlloc(&ptr, 4096);
        expect(__LINE__, "a fresh context after the fault", rc, CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    free(ptx);

    if (stop_file) {
        printf("poisoned\n");
        fflush(stdout);
        wait_for_file(stop_file, 10 * 1000000L);
    }
    if (checks_failed) {
        printf("fault_test: %d checks failed, %d passed\n", checks_failed, checks_passed);
        return 1;
    }
    printf("fault_test: %d checks passed\n", checks_passed);
    return 0;
}
