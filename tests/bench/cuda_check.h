/* CHECK(call): a driver-API call that must succeed, for the native probes in
 * tests/bench (launch_split.c, sync_probe.c); a failure prints the call and
 * its CUDA error and ends the program. */
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

#endif
