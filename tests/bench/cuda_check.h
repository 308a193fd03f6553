/* What the native probes in tests/bench (launch_split.c, sync_probe.c,
 * launch_params.c) share: CHECK(call), a driver-API call that must succeed
 * (a failure prints the call and its CUDA error and ends the program), and
 * read_ptx(path), the reference kernels' PTX as cuModuleLoadData takes it. */
#ifndef RGPU_BENCH_CUDA_CHECK_H
#define RGPU_BENCH_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "rgpu_cuda.h"

#define CHECK(call)                                                                   \
    do {                                                                              \
        CUresult check_rc = (call);                                                   \
        if (check_rc != CUDA_SUCCESS) {                                               \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call,      \
                    (int)check_rc);                                                   \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* The text of `path`, NUL-terminated, in a buffer of its own (1 MiB at most;
 * the reference kernels are a few KiB); a file that cannot be opened ends
 * the program. */
static inline const char *read_ptx(const char *path) {
    static char ptx[1 << 20];
    FILE *file = fopen(path, "rb");
    if (!file) {
        perror(path);
        exit(1);
    }
    size_t len = fread(ptx, 1, sizeof ptx - 1, file);
    fclose(file);
    ptx[len] = '\0';
    return ptx;
}

#endif
