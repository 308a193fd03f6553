/* Device printf through rgpu: launches rgpu_printf (one thread), prints its
 * own lines around cuCtxSynchronize, and expects the kernel's line on its
 * stdout between them, as NVIDIA's driver prints it natively.
 * Usage: printf_test REFERENCE_KERNELS.ptx VALUE */
#include <stdio.h>
#include <stdlib.h>

#include "rgpu_cuda.h"

#define CK(call)                                                          \
    do {                                                                  \
        CUresult r_ = (call);                                             \
        if (r_ != CUDA_SUCCESS) {                                         \
            fprintf(stderr, "printf_test: %s failed: %d\n", #call, r_); \
            return 1;                                                     \
        }                                                                 \
    } while (0)

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
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    CUfunction kernel;
    unsigned value;
    void *params[1];
    char *ptx;
    if (argc != 3 || !(ptx = read_file(argv[1]))) {
        fprintf(stderr, "usage: printf_test REFERENCE_KERNELS.ptx VALUE\n");
        return 2;
    }
    value = (unsigned)strtoul(argv[2], NULL, 10);
    params[0] = &value;
    CK(cuInit(0));
    CK(cuDeviceGet(&device, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, device));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&module, ptx));
    CK(cuModuleGetFunction(&kernel, module, "rgpu_printf"));
    /* Buffered on purpose: the kernel's text must still come after it. */
    printf("printf_test: before the launch\n");
    CK(cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CK(cuCtxSynchronize());
    printf("printf_test: after the synchronisation\n");
    CK(cuModuleUnload(module));
    CK(cuDevicePrimaryCtxRelease(device));
    free(ptx);
    return 0;
}
