/* kernel_probe_test: can a kernel read memory this process was never given,
 * when handed its address as a parameter? Natively another process's
 * pinned host memory faults; through rgpu, another guest process's blob
 * (at the address the host mapped it) must fault the same way.
 *
 * Usage: kernel_probe_test --ptx reference_kernels.ptx pinned --stop-file PATH
 *            fills 1 MiB of pinned host memory with a secret (floats
 *            1234.5), prints "pinned 0x..." (this process's pointer), and
 *            waits until PATH appears
 *        kernel_probe_test --ptx reference_kernels.ptx read ADDR
 *            launches rgpu_vector_add with ADDR as its first input; prints
 *            "read ADDR: rc N NAME secret yes|no"
 *        kernel_probe_test --ptx reference_kernels.ptx self
 *            the same read of its own pinned memory copied to the device:
 *            the kernel works and sees the secret
 *
 * Exit 0 once the line is printed (the verdict is the caller's). */
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

#define FLOATS 1024
#define PINNED_BYTES (1u << 20)
#define SECRET 1234.5f

/* out[i] = in[i] + 0 over FLOATS floats; returns the launch's and the
 * synchronisation's first error and whether `out` holds the secret. */
static CUresult read_through_kernel(CUfunction add, CUdeviceptr in, int *secret) {
    CUdeviceptr zeros = 0, out = 0;
    float host[FLOATS];
    unsigned n = FLOATS;
    *secret = 0;
    CUresult rc = cuMemAlloc(&zeros, sizeof host);
    if (rc == CUDA_SUCCESS) rc = cuMemAlloc(&out, sizeof host);
    if (rc == CUDA_SUCCESS) rc = cuMemsetD32(zeros, 0, FLOATS);
    if (rc == CUDA_SUCCESS) rc = cuMemsetD32(out, 0, FLOATS);
    if (rc != CUDA_SUCCESS) return rc;
    void *params[] = {&in, &zeros, &out, &n};
    rc = cuLaunchKernel(add, FLOATS / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL);
    CUresult sync = cuCtxSynchronize();
    if (rc == CUDA_SUCCESS) rc = sync;
    if (rc == CUDA_SUCCESS && cuMemcpyDtoH(host, out, sizeof host) == CUDA_SUCCESS) {
        int seen = 0;
        for (int i = 0; i < FLOATS; i++) seen += host[i] == SECRET;
        *secret = seen == FLOATS;
    }
    return rc;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction add;
    const char *ptx_path = NULL;
    int arg = 1;
    if (argc >= 3 && strcmp(argv[1], "--ptx") == 0) {
        ptx_path = argv[2];
        arg = 3;
    }
    if (!ptx_path || arg >= argc) {
        fprintf(stderr, "usage: %s --ptx PTX pinned --stop-file PATH | read ADDR | self\n",
                argv[0]);
        return 2;
    }
    char *ptx = read_file(ptx_path);
    if (!ptx || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuModuleLoadData(&module, ptx) != CUDA_SUCCESS ||
        cuModuleGetFunction(&add, module, "rgpu_vector_add") != CUDA_SUCCESS) {
        printf("FAIL: no CUDA context or kernel\n");
        return 1;
    }
    const char *mode = argv[arg];
    if (strcmp(mode, "pinned") == 0 && arg + 2 < argc && strcmp(argv[arg + 1], "--stop-file") == 0) {
        float *pinned = NULL;
        if (cuMemAllocHost((void **)&pinned, PINNED_BYTES) != CUDA_SUCCESS) {
            printf("FAIL: cuMemAllocHost\n");
            return 1;
        }
        for (size_t i = 0; i < PINNED_BYTES / sizeof(float); i++) pinned[i] = SECRET;
        printf("pinned %p\n", (void *)pinned);
        fflush(stdout);
        wait_for_file(argv[arg + 2], 10 * 1000000L);
        cuMemFreeHost(pinned);
    } else if (strcmp(mode, "read") == 0 && arg + 1 < argc) {
        char *end = NULL;
        errno = 0;
        unsigned long long addr = strtoull(argv[arg + 1], &end, 0);
        if (errno != 0 || end == argv[arg + 1] || *end != '\0') {
            fprintf(stderr, "bad address %s\n", argv[arg + 1]);
            return 2;
        }
        int secret = 0;
        CUresult rc = read_through_kernel(add, (CUdeviceptr)addr, &secret);
        printf("read 0x%llx: rc %d %s secret %s\n", addr, rc, error_name(rc), secret ? "yes" : "no");
    } else if (strcmp(mode, "self") == 0) {
        float *pinned = NULL;
        CUdeviceptr copy = 0;
        int secret = 0;
        CUresult rc = cuMemAllocHost((void **)&pinned, FLOATS * sizeof(float));
        if (rc == CUDA_SUCCESS) {
            for (int i = 0; i < FLOATS; i++) pinned[i] = SECRET;
            rc = cuMemAlloc(&copy, FLOATS * sizeof(float));
        }
        if (rc == CUDA_SUCCESS) rc = cuMemcpyHtoD(copy, pinned, FLOATS * sizeof(float));
        if (rc == CUDA_SUCCESS) rc = read_through_kernel(add, copy, &secret);
        printf("read self: rc %d %s secret %s\n", rc, error_name(rc), secret ? "yes" : "no");
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    fflush(stdout);
    return 0;
}
