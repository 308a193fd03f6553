/* launch_attributes_test: cuLaunchKernelEx with the launch attributes the
 * driver accepts (issue 10): each reaches the host's driver, and the kernel
 * runs as launched.
 *
 * Usage: launch_attributes_test --ptx reference_kernels.ptx
 *
 * - priority, memory sync domain and its map, cluster scheduling policy,
 *   programmatic stream serialization, shared memory carveout, and an
 *   access policy window over the launch's own buffer: each launch fills
 *   its buffer, read back;
 * - a launch completion event: NOT_READY behind a 20 ms kernel, then
 *   complete after cuEventSynchronize; a programmatic event completes too;
 * - an attribute only graph nodes take fails;
 * - stream attributes: a priority and an access policy window set on a
 *   stream and read back, copied to another stream, whose launch fills
 *   its buffer.
 * Through rgpu (RGPU_SOCKET set), also: an access policy window over memory
 * the process does not own is refused (the next synchronize returns
 * CUDA_ERROR_INVALID_VALUE), as are an event that is not one and an event
 * of another context (CUDA_ERROR_INVALID_HANDLE at once).
 *
 * Prints "launch_attributes_test: N checks passed" (exit 0) or every failed
 * check (exit 1). Declarations written from NVIDIA's public driver API
 * reference. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "checks.h"

#ifndef CUDA_ERROR_NOT_SUPPORTED
#define CUDA_ERROR_NOT_SUPPORTED 801
#endif
#include "rgpu_launch.h"

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuStreamSetAttribute(CUstream stream, int attr, const void *value);
CUresult cuStreamGetAttribute(CUstream stream, int attr, void *value);
CUresult cuStreamCopyAttributes(CUstream dst, CUstream src);

#define N 256
#define EVENT_DISABLE_TIMING 2

static CUfunction fill, spin;

static LaunchConfig config_with(LaunchAttribute *attribute, unsigned int threads) {
    LaunchConfig config = {1, 1, 1, threads, 1, 1, 0, NULL, attribute, attribute ? 1 : 0};
    return config;
}

/* Fills `out` through cuLaunchKernelEx with `attribute`; the launch's
 * result, after checking what it wrote. */
static CUresult fill_with(LaunchAttribute *attribute, CUdeviceptr out, unsigned int base) {
    unsigned int n = N;
    void *params[] = {&out, &base, &n};
    LaunchConfig config = config_with(attribute, N);
    CUresult rc = cuLaunchKernelEx(&config, fill, params, NULL);
    if (rc != CUDA_SUCCESS) return rc;
    unsigned int host[N];
    CHECK_CU(cuMemcpyDtoH(host, out, sizeof host));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += host[i] != base + (unsigned int)i;
    CHECK_EQ_INT(wrong, 0);
    return CUDA_SUCCESS;
}

static int run(int through_rgpu, CUdevice dev, CUcontext primary) {
    CUdeviceptr out = 0;
    REQUIRE_CU(cuMemAlloc(&out, N * sizeof(unsigned int)));

    LaunchAttribute a;
    struct {
        unsigned int id;
        int value;
        const char *name;
    } plain[] = {
        {LAUNCH_ATTRIBUTE_PRIORITY, -1, "priority"},
        {LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, 1, "memory sync domain"},
        {LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, 1, "cluster scheduling policy"},
        {LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1, "programmatic stream serialization"},
        {LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50, "shared memory carveout"},
    };
    for (unsigned int i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        memset(&a, 0, sizeof a);
        a.id = plain[i].id;
        a.value.number = plain[i].value;
        CUresult rc = fill_with(&a, out, 1000 * (i + 1));
        printf("%s: rc %d %s\n", plain[i].name, rc, error_name(rc));
        CHECK_EQ_INT(rc, CUDA_SUCCESS);
    }
    memset(&a, 0, sizeof a);
    a.id = LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP;
    a.value.map[0] = 0;
    a.value.map[1] = 1;
    CHECK_CU(fill_with(&a, out, 7000));
    memset(&a, 0, sizeof a);
    a.id = LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW;
    a.value.window.base = (void *)(uintptr_t)out;
    a.value.window.bytes = N * sizeof(unsigned int);
    a.value.window.hit_ratio = 0.5f;
    a.value.window.hit_property = 2; /* persisting */
    a.value.window.miss_property = 1; /* streaming */
    CHECK_CU(fill_with(&a, out, 8000));

    /* Events the launch records. */
    CUevent done = NULL, programmatic = NULL;
    REQUIRE_CU(cuEventCreate(&done, EVENT_DISABLE_TIMING));
    REQUIRE_CU(cuEventCreate(&programmatic, EVENT_DISABLE_TIMING));
    uint64_t ns = 20 * 1000 * 1000;
    void *spin_params[] = {&ns};
    memset(&a, 0, sizeof a);
    a.id = LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
    a.value.completion.event = done;
    LaunchConfig config = config_with(&a, 1);
    CHECK_CU(cuLaunchKernelEx(&config, spin, spin_params, NULL));
    /* How soon the event triggers is the driver's (its blocks trigger
     * it); 2 ms into the 20 ms kernel, native and rgpu runs print what
     * they saw, for the suite to compare. */
    CUresult early = cuEventQuery(done);
    CHECK_TRUE(early == CUDA_SUCCESS || early == CUDA_ERROR_NOT_READY);
    struct timespec two_ms = {0, 2000000};
    nanosleep(&two_ms, NULL);
    printf("launch completion event 2 ms into a 20 ms kernel: rc %d\n", (int)cuEventQuery(done));
    CHECK_CU(cuEventSynchronize(done));
    CHECK_CU(cuEventQuery(done));
    memset(&a, 0, sizeof a);
    a.id = LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
    a.value.programmatic.event = programmatic;
    CHECK_CU(fill_with(&a, out, 9000));
    CHECK_CU(cuEventSynchronize(programmatic));
    CHECK_CU(cuEventQuery(programmatic));

    /* A graph node's attribute is no launch's (driver 580 on the H200:
     * CUDA_ERROR_NOT_SUPPORTED). */
    memset(&a, 0, sizeof a);
    a.id = LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE;
    a.value.number = 1;
    CHECK_EQ_INT(fill_with(&a, out, 1), CUDA_ERROR_NOT_SUPPORTED);
    cuCtxSynchronize();

    if (through_rgpu) {
        /* A window over memory this process does not own: refused. */
        CUdeviceptr gone = 0;
        REQUIRE_CU(cuMemAlloc(&gone, 1 << 20));
        CHECK_CU(cuMemFree(gone));
        memset(&a, 0, sizeof a);
        a.id = LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW;
        a.value.window.base = (void *)(uintptr_t)gone;
        a.value.window.bytes = 1 << 20;
        a.value.window.hit_ratio = 1.0f;
        a.value.window.hit_property = 2;
        a.value.window.miss_property = 1;
        unsigned int base = 1, n = N;
        void *params[] = {&out, &base, &n};
        config = config_with(&a, N);
        CHECK_CU(cuLaunchKernelEx(&config, fill, params, NULL));
        CHECK_RC(cuCtxSynchronize(), CUDA_ERROR_INVALID_VALUE);
        /* An event pointer that is no event. */
        memset(&a, 0, sizeof a);
        a.id = LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
        a.value.completion.event = (CUevent)(uintptr_t)0x1234;
        CHECK_RC(cuLaunchKernelEx(&config, fill, params, NULL), CUDA_ERROR_INVALID_HANDLE);
        CHECK_CU(cuCtxSynchronize());
        /* An event of another context. */
        CUcontext other = NULL;
        CUevent foreign = NULL;
        if (cuCtxCreate_v2(&other, 0, dev) == CUDA_SUCCESS) {
            CHECK_CU(cuEventCreate(&foreign, EVENT_DISABLE_TIMING));
            CHECK_CU(cuCtxSetCurrent(primary));
            a.value.completion.event = foreign;
            CHECK_RC(cuLaunchKernelEx(&config, fill, params, NULL), CUDA_ERROR_INVALID_HANDLE);
            CHECK_CU(cuCtxSetCurrent(other));
            CHECK_CU(cuEventDestroy(foreign));
            CHECK_CU(cuCtxDestroy(other));
            CHECK_CU(cuCtxSetCurrent(primary));
        } else {
            fail(__LINE__, "cuCtxCreate for the foreign event");
        }
    }
    CHECK_CU(cuEventDestroy(done));
    CHECK_CU(cuEventDestroy(programmatic));

    /* Stream attributes. */
    {
        CUstream first = NULL, second = NULL;
        LaunchAttribute set, got;
        CHECK_CU(cuStreamCreate(&first, 0));
        CHECK_CU(cuStreamCreate(&second, 0));
        memset(&set, 0, sizeof set);
        set.value.number = -1;
        CHECK_CU(cuStreamSetAttribute(first, LAUNCH_ATTRIBUTE_PRIORITY, &set.value));
        memset(&got, 0x5a, sizeof got);
        CHECK_CU(cuStreamGetAttribute(first, LAUNCH_ATTRIBUTE_PRIORITY, &got.value));
        CHECK_EQ_INT(got.value.number, -1);
        memset(&set, 0, sizeof set);
        set.value.window.base = (void *)(uintptr_t)out;
        set.value.window.bytes = N * sizeof(unsigned int);
        set.value.window.hit_ratio = 0.5f;
        set.value.window.hit_property = 2; /* persisting; a miss may not be */
        set.value.window.miss_property = 1;
        CHECK_CU(cuStreamSetAttribute(first, LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &set.value));
        CHECK_CU(cuStreamCopyAttributes(second, first));
        memset(&got, 0x5a, sizeof got);
        CHECK_CU(cuStreamGetAttribute(second, LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got.value));
        CHECK_TRUE(got.value.window.base == set.value.window.base &&
                   got.value.window.bytes == set.value.window.bytes &&
                   got.value.window.hit_property == 2 && got.value.window.miss_property == 1);
        memset(&got, 0x5a, sizeof got);
        CHECK_CU(cuStreamGetAttribute(second, LAUNCH_ATTRIBUTE_PRIORITY, &got.value));
        CHECK_EQ_INT(got.value.number, -1);
        unsigned int base = 7000, n = N;
        void *params[] = {&out, &base, &n};
        CHECK_CU(cuLaunchKernel(fill, 1, 1, 1, N, 1, 1, 0, second, params, NULL));
        CHECK_CU(cuStreamSynchronize(second));
        unsigned int host[N];
        CHECK_CU(cuMemcpyDtoH(host, out, sizeof host));
        int wrong = 0;
        for (int i = 0; i < N; i++) wrong += host[i] != base + (unsigned int)i;
        CHECK_EQ_INT(wrong, 0);
        CHECK_CU(cuStreamDestroy(second));
        CHECK_CU(cuStreamDestroy(first));
    }
    CHECK_CU(cuMemFree(out));
    return 0;
}

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--ptx")) ptx_path = argv[i + 1];
    if (!ptx_path) {
        fprintf(stderr, "usage: launch_attributes_test --ptx reference_kernels.ptx\n");
        return 2;
    }
    char *ptx = read_file(ptx_path);
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    if (!ptx || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        cuModuleLoadData(&module, ptx) != CUDA_SUCCESS ||
        cuModuleGetFunction(&fill, module, "rgpu_fill_index") != CUDA_SUCCESS ||
        cuModuleGetFunction(&spin, module, "rgpu_spin") != CUDA_SUCCESS) {
        printf("FAIL: setup (PTX, context, module)\n");
        return 1;
    }
    run(getenv("RGPU_SOCKET") != NULL, dev, ctx);
    cuModuleUnload(module);
    cuDevicePrimaryCtxRelease(dev);
    free(ptx);
    if (checks_failed) {
        printf("launch_attributes_test: %ld checks failed, %ld passed\n", checks_failed, checks_passed);
        return 1;
    }
    printf("launch_attributes_test: %ld checks passed\n", checks_passed);
    return 0;
}
