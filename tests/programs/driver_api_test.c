/* driver_api_test: exercises the CUDA driver API end to end and checks every
 * value it reads back. Runs the same against rgpu's libcuda.so.1 (sim or cuda
 * executor) and NVIDIA's.
 *
 * Usage: driver_api_test --ptx reference_kernels.ptx [--iterations N]
 *        [--hold-ms M] [--stop-file PATH] [--big-mb N] [--bulk-pinned-mb N]
 *        [--no-bogus-handles]
 *
 *   --ptx PATH         the reference kernels (read at run time)
 *   --iterations N     repeat the whole check loop N times (default 1)
 *   --hold-ms M        sleep M ms between iterations (lets a test kill us mid-run)
 *   --stop-file PATH   stop after the iteration during which PATH appeared
 *   --big-mb N         size of the large pageable copy (default 64)
 *   --bulk-pinned-mb N also copy N MiB from pinned memory to the device and
 *                      check it there with a kernel (default 0: skipped)
 *   --no-bogus-handles skip using a destroyed stream handle (undefined
 *                      behaviour with NVIDIA's driver; rgpu must reject it)
 *
 * Prints "running" after the first iteration, then either
 * "driver_api_test: N checks passed" (exit 0) or every failed check (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "checks.h"


/* Compares two u32 arrays, reports the first mismatches; one check. */
static void check_words(int line, const char *what, const uint32_t *actual,
                        const uint32_t *expected, size_t count) {
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        if (actual[i] != expected[i]) {
            if (bad < 5)
                printf("FAIL line %d: %s[%zu]: expected 0x%08x, got 0x%08x\n", line, what, i,
                       expected[i], actual[i]);
            bad++;
        }
    }
    if (bad) {
        checks_failed++;
        printf("FAIL line %d: %s: %zu of %zu words differ\n", line, what, bad, count);
    } else {
        checks_passed++;
    }
}

static void check_bytes(int line, const char *what, const uint8_t *actual,
                        const uint8_t *expected, size_t count) {
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        if (actual[i] != expected[i]) {
            if (bad < 5)
                printf("FAIL line %d: %s[%zu]: expected 0x%02x, got 0x%02x\n", line, what, i,
                       expected[i], actual[i]);
            bad++;
        }
    }
    if (bad) {
        checks_failed++;
        printf("FAIL line %d: %s: %zu of %zu bytes differ\n", line, what, bad, count);
    } else {
        checks_passed++;
    }
}

/* Floats are compared bit for bit: the kernels do one IEEE operation each,
 * rounded to nearest, exactly as the host computes the expected values. */
#define CHECK_WORDS(actual, expected, count) \
    check_words(__LINE__, #actual, (const uint32_t *)(actual), (const uint32_t *)(expected), count)
#define CHECK_BYTES(actual, expected, count) \
    check_bytes(__LINE__, #actual, (const uint8_t *)(actual), (const uint8_t *)(expected), count)

struct kernels {
    CUmodule module;
    CUfunction vector_add;
    CUfunction scale;
    CUfunction fill_index;
    CUfunction count_mismatches;
    CUfunction empty;
};

struct options {
    const char *ptx_path;
    long iterations;
    long hold_ms;
    const char *stop_file;
    long big_mb;
    long bulk_pinned_mb;
    int bogus_handles;
};

/* Blocks of `block` threads covering n elements (the last one partial). */
static unsigned blocks_for(unsigned n, unsigned block) { return (n + block - 1) / block; }

static int step_memset(void) {
    enum { BYTES = 4096 };
    CUdeviceptr m = 0;
    uint8_t expected[BYTES], actual[BYTES];
    REQUIRE_CU(cuMemAlloc(&m, BYTES));

    /* Overlapping memsets of each width at unaligned-for-the-wider-width
     * offsets; the host applies the same operations to its own image. */
    REQUIRE_CU(cuMemsetD8(m, 0xA5, BYTES));
    memset(expected, 0xA5, BYTES);
    REQUIRE_CU(cuMemcpyDtoH(actual, m, BYTES));
    CHECK_BYTES(actual, expected, BYTES);

    REQUIRE_CU(cuMemsetD16(m + 2, 0x1234, 1000));
    for (size_t i = 0; i < 1000; i++) {
        expected[2 + 2 * i] = 0x34;
        expected[3 + 2 * i] = 0x12;
    }
    REQUIRE_CU(cuMemsetD32(m + 2048, 0xDEADBEEF, 300));
    for (size_t i = 0; i < 300; i++) {
        uint32_t v = 0xDEADBEEF;
        memcpy(&expected[2048 + 4 * i], &v, 4);
    }
    REQUIRE_CU(cuMemsetD8(m + 4001, 0x5A, 7));
    memset(&expected[4001], 0x5A, 7);
    memset(actual, 0, BYTES);
    REQUIRE_CU(cuMemcpyDtoH(actual, m, BYTES));
    CHECK_BYTES(actual, expected, BYTES);

    REQUIRE_CU(cuMemFree(m));
    return 0;
}

static int step_kernels(const struct kernels *k, unsigned iteration) {
    const unsigned n = 100003;
    const size_t bytes = (size_t)n * 4;
    int status = -1;
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes), *expected = malloc(bytes);
    uint32_t *u = malloc(bytes), *uexpected = malloc(bytes);
    CUdeviceptr da = 0, db = 0, dc = 0, dd = 0;
    if (!a || !b || !c || !expected || !u || !uexpected) {
        fail(__LINE__, "host allocation");
        goto out;
    }
    for (unsigned i = 0; i < n; i++) {
        a[i] = (float)i * 0.5f;
        b[i] = 1000.0f - (float)i + (float)iteration;
    }
    if (cuMemAlloc(&da, bytes) || cuMemAlloc(&db, bytes) || cuMemAlloc(&dc, bytes) ||
        cuMemAlloc(&dd, bytes)) {
        fail(__LINE__, "cuMemAlloc of the kernel buffers");
        goto out;
    }
    checks_passed++;
    CHECK_TRUE(da != 0 && db != 0 && dc != 0 && dd != 0 && da != db && db != dc && dc != dd);

    /* Pageable host memory in. */
    CHECK_CU(cuMemcpyHtoD(da, a, bytes));
    CHECK_CU(cuMemcpyHtoD(db, b, bytes));

    /* c = a + b on the legacy default stream. */
    {
        unsigned count = n;
        void *params[] = {&da, &db, &dc, &count};
        CHECK_CU(cuLaunchKernel(k->vector_add, blocks_for(n, 256), 1, 1, 256, 1, 1, 0, NULL,
                                params, NULL));
    }
    CHECK_CU(cuCtxSynchronize());
    memset(c, 0, bytes);
    CHECK_CU(cuMemcpyDtoH(c, dc, bytes));
    for (unsigned i = 0; i < n; i++) expected[i] = a[i] + b[i];
    CHECK_WORDS(c, expected, n);

    /* c *= 2.5 with blocks of 128. */
    {
        float factor = 2.5f;
        unsigned count = n;
        void *params[] = {&dc, &factor, &count};
        CHECK_CU(cuLaunchKernel(k->scale, blocks_for(n, 128), 1, 1, 128, 1, 1, 0, NULL, params,
                                NULL));
    }
    memset(c, 0, bytes);
    CHECK_CU(cuMemcpyDtoH(c, dc, bytes));
    for (unsigned i = 0; i < n; i++) expected[i] = expected[i] * 2.5f;
    CHECK_WORDS(c, expected, n);

    /* d = base + i for the first n - 5 elements; the tail keeps its memset. */
    {
        unsigned base = 7 + iteration;
        unsigned count = n - 5;
        void *params[] = {&dd, &base, &count};
        CHECK_CU(cuMemsetD32(dd, 0xFFFFFFFFu, n));
        CHECK_CU(cuLaunchKernel(k->fill_index, blocks_for(count, 192), 1, 1, 192, 1, 1, 0, NULL,
                                params, NULL));
        for (unsigned i = 0; i < n; i++) uexpected[i] = i < count ? base + i : 0xFFFFFFFFu;
    }
    memset(u, 0, bytes);
    CHECK_CU(cuMemcpyDtoH(u, dd, bytes));
    CHECK_WORDS(u, uexpected, n);

    /* The empty kernel launches and completes. */
    CHECK_CU(cuLaunchKernel(k->empty, 4, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK_CU(cuCtxSynchronize());

    /* Device to device, then read a window at an offset. */
    CHECK_CU(cuMemcpyDtoD(db, dd, bytes));
    memset(u, 0, bytes);
    CHECK_CU(cuMemcpyDtoH(u, db + 4 * 1000, 4 * 5000));
    CHECK_WORDS(u, uexpected + 1000, 5000);
    status = 0;

out:
    if (da) CHECK_CU(cuMemFree(da));
    if (db) CHECK_CU(cuMemFree(db));
    if (dc) CHECK_CU(cuMemFree(dc));
    if (dd) CHECK_CU(cuMemFree(dd));
    free(a);
    free(b);
    free(c);
    free(expected);
    free(u);
    free(uexpected);
    return status;
}

static int step_global(const struct kernels *k, unsigned iteration) {
    CUdeviceptr global = 0;
    size_t size = 0;
    uint32_t value = 0xC0FFEE00u + iteration, readback = 0;
    REQUIRE_CU(cuModuleGetGlobal(&global, &size, k->module, "rgpu_global_counter"));
    CHECK_TRUE(global != 0);
    CHECK_EQ_INT(size, 4);
    REQUIRE_CU(cuMemcpyHtoD(global, &value, 4));
    REQUIRE_CU(cuMemcpyDtoH(&readback, global, 4));
    CHECK_EQ_INT(readback, value);
    REQUIRE_CU(cuMemsetD32(global, 0, 1));
    REQUIRE_CU(cuMemcpyDtoH(&readback, global, 4));
    CHECK_EQ_INT(readback, 0);
    return 0;
}

/* Two streams with copies from pinned memory, launches, events and a
 * cross-stream dependency. */
static int step_streams(const struct kernels *k, unsigned iteration) {
    const unsigned n = 65536 + 77;
    const size_t bytes = (size_t)n * 4;
    int status = -1;
    CUstream s1 = NULL, s2 = NULL;
    CUevent start = NULL, end = NULL, on_s2 = NULL, untimed = NULL;
    float *pin_in1 = NULL, *pin_in2 = NULL, *pin_out1 = NULL, *pin_out2 = NULL;
    float *expected = malloc(bytes);
    CUdeviceptr x1 = 0, x2 = 0, y2 = 0, z = 0;

    if (!expected) {
        fail(__LINE__, "host allocation");
        goto out;
    }
    if (cuStreamCreate(&s1, CU_STREAM_DEFAULT) || cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) ||
        cuEventCreate(&start, CU_EVENT_DEFAULT) || cuEventCreate(&end, CU_EVENT_DEFAULT) ||
        cuEventCreate(&on_s2, CU_EVENT_DEFAULT) ||
        cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING)) {
        fail(__LINE__, "creating streams and events");
        goto out;
    }
    checks_passed++;
    CHECK_TRUE(s1 != NULL && s2 != NULL && s1 != s2);
    if (cuMemAllocHost((void **)&pin_in1, bytes) || cuMemAllocHost((void **)&pin_in2, bytes) ||
        cuMemAllocHost((void **)&pin_out1, bytes) || cuMemAllocHost((void **)&pin_out2, bytes)) {
        fail(__LINE__, "cuMemAllocHost");
        goto out;
    }
    checks_passed++;
    if (cuMemAlloc(&x1, bytes) || cuMemAlloc(&x2, bytes) || cuMemAlloc(&y2, bytes) ||
        cuMemAlloc(&z, bytes)) {
        fail(__LINE__, "cuMemAlloc of the stream buffers");
        goto out;
    }
    checks_passed++;
    for (unsigned i = 0; i < n; i++) {
        pin_in1[i] = (float)(i % 1000) + 0.25f * (float)iteration;
        pin_in2[i] = (float)i * 0.125f;
        pin_out1[i] = -1.0f;
        pin_out2[i] = -1.0f;
    }

    /* s1: x1 = in1 * 3, back to out1. */
    CHECK_CU(cuEventRecord(start, s1));
    CHECK_CU(cuMemcpyHtoDAsync(x1, pin_in1, bytes, s1));
    {
        float factor = 3.0f;
        unsigned count = n;
        void *params[] = {&x1, &factor, &count};
        CHECK_CU(cuLaunchKernel(k->scale, blocks_for(n, 256), 1, 1, 256, 1, 1, 0, s1, params,
                                NULL));
    }
    CHECK_CU(cuMemcpyDtoHAsync(pin_out1, x1, bytes, s1));

    /* s2: y2 = in2 + in2. */
    CHECK_CU(cuMemcpyHtoDAsync(x2, pin_in2, bytes, s2));
    {
        unsigned count = n;
        void *params[] = {&x2, &x2, &y2, &count};
        CHECK_CU(cuLaunchKernel(k->vector_add, blocks_for(n, 256), 1, 1, 256, 1, 1, 0, s2,
                                params, NULL));
    }
    CHECK_CU(cuEventRecord(on_s2, s2));
    CHECK_CU(cuEventRecord(untimed, s2));

    /* s1 waits for s2's result, then copies it on and back to out2. */
    CHECK_CU(cuStreamWaitEvent(s1, on_s2, 0));
    CHECK_CU(cuMemcpyDtoDAsync(z, y2, bytes, s1));
    CHECK_CU(cuMemcpyDtoHAsync(pin_out2, z, bytes, s1));
    CHECK_CU(cuEventRecord(end, s1));

    CHECK_CU(cuEventSynchronize(end));
    CHECK_CU(cuEventQuery(end));
    CHECK_CU(cuStreamQuery(s1));
    CHECK_CU(cuStreamSynchronize(s2));
    CHECK_CU(cuEventQuery(untimed));
    {
        float ms = -1.0f;
        CHECK_CU(cuEventElapsedTime(&ms, start, end));
        CHECK_TRUE(ms >= 0.0f);
    }

    for (unsigned i = 0; i < n; i++) expected[i] = pin_in1[i] * 3.0f;
    CHECK_WORDS(pin_out1, expected, n);
    for (unsigned i = 0; i < n; i++) expected[i] = pin_in2[i] + pin_in2[i];
    CHECK_WORDS(pin_out2, expected, n);

    /* Synchronous copies into pinned memory too. */
    memset(pin_out1, 0, bytes);
    CHECK_CU(cuMemcpyDtoH(pin_out1, y2, bytes));
    CHECK_WORDS(pin_out1, expected, n);

    /* A memset on a created stream. */
    CHECK_CU(cuMemsetD32Async(z, 0x01020304u, n, s2));
    CHECK_CU(cuMemcpyDtoHAsync(pin_out2, z, bytes, s2));
    CHECK_CU(cuStreamSynchronize(s2));
    for (unsigned i = 0; i < n; i++) ((uint32_t *)expected)[i] = 0x01020304u;
    CHECK_WORDS(pin_out2, expected, n);
    status = 0;

out:
    if (x1) CHECK_CU(cuMemFree(x1));
    if (x2) CHECK_CU(cuMemFree(x2));
    if (y2) CHECK_CU(cuMemFree(y2));
    if (z) CHECK_CU(cuMemFree(z));
    if (pin_in1) CHECK_CU(cuMemFreeHost(pin_in1));
    if (pin_in2) CHECK_CU(cuMemFreeHost(pin_in2));
    if (pin_out1) CHECK_CU(cuMemFreeHost(pin_out1));
    if (pin_out2) CHECK_CU(cuMemFreeHost(pin_out2));
    if (start) CHECK_CU(cuEventDestroy(start));
    if (end) CHECK_CU(cuEventDestroy(end));
    if (on_s2) CHECK_CU(cuEventDestroy(on_s2));
    if (untimed) CHECK_CU(cuEventDestroy(untimed));
    if (s1) CHECK_CU(cuStreamDestroy(s1));
    if (s2) CHECK_CU(cuStreamDestroy(s2));
    free(expected);
    return status;
}

/* A large pageable copy: rgpu stages it through the ring in chunks. */
static int step_big_copy(long big_mb, unsigned iteration) {
    const size_t words = (size_t)big_mb * 1024 * 1024 / 4;
    const size_t bytes = words * 4;
    int status = -1;
    uint32_t *src = malloc(bytes), *dst = malloc(bytes);
    CUdeviceptr d = 0;
    if (!src || !dst) {
        fail(__LINE__, "host allocation");
        goto out;
    }
    for (size_t i = 0; i < words; i++) src[i] = (uint32_t)(i * 2654435761u) ^ iteration;
    if (cuMemAlloc(&d, bytes)) {
        fail(__LINE__, "cuMemAlloc of the large buffer");
        goto out;
    }
    checks_passed++;
    CHECK_CU(cuMemcpyHtoD(d, src, bytes));
    memset(dst, 0, bytes);
    CHECK_CU(cuMemcpyDtoH(dst, d, bytes));
    CHECK_WORDS(dst, src, words);
    /* An unaligned window in the middle. */
    memset(dst, 0, bytes);
    CHECK_CU(cuMemcpyDtoH((uint8_t *)dst + 3, d + bytes / 2 + 1, 100001));
    CHECK_BYTES((uint8_t *)dst + 3, (uint8_t *)src + bytes / 2 + 1, 100001);
    status = 0;
out:
    if (d) CHECK_CU(cuMemFree(d));
    free(src);
    free(dst);
    return status;
}

/* A large host-to-device copy from pinned (cuMemAllocHost) memory: rgpu's
 * zero-copy path, checked on the device by a kernel that counts the words
 * that differ from the pattern (no copy back). */
static int step_bulk_pinned(const struct kernels *k, long mb, unsigned iteration) {
    const unsigned words = (unsigned)((size_t)mb * 1024 * 1024 / 4);
    const unsigned base = 0x51000000u + iteration;
    uint32_t *pinned = NULL;
    uint32_t mismatches = 0xFFFFFFFFu;
    CUdeviceptr d = 0, counter = 0;
    REQUIRE_CU(cuMemAllocHost((void **)&pinned, (size_t)words * 4));
    for (unsigned i = 0; i < words; i++) pinned[i] = base + i;
    REQUIRE_CU(cuMemAlloc(&d, (size_t)words * 4));
    REQUIRE_CU(cuMemAlloc(&counter, 4));
    REQUIRE_CU(cuMemsetD32(counter, 0, 1));
    CHECK_CU(cuMemcpyHtoD(d, pinned, (size_t)words * 4));
    {
        unsigned n = words;
        unsigned b = base;
        void *params[] = {&d, &b, &n, &counter};
        CHECK_CU(cuLaunchKernel(k->count_mismatches, blocks_for(n, 256), 1, 1, 256, 1, 1, 0, NULL,
                                params, NULL));
        CHECK_CU(cuMemcpyDtoH(&mismatches, counter, 4));
        CHECK_EQ_INT(mismatches, 0);
        /* The check must be able to fail: a wrong base counts every word. */
        b = base + 1;
        REQUIRE_CU(cuMemsetD32(counter, 0, 1));
        CHECK_CU(cuLaunchKernel(k->count_mismatches, blocks_for(n, 256), 1, 1, 256, 1, 1, 0, NULL,
                                params, NULL));
        CHECK_CU(cuMemcpyDtoH(&mismatches, counter, 4));
        CHECK_EQ_INT(mismatches, words);
    }
    printf("bulk: %ld MiB host-to-device from pinned memory, checked on the device\n", mb);
    CHECK_CU(cuMemFree(d));
    CHECK_CU(cuMemFree(counter));
    CHECK_CU(cuMemFreeHost(pinned));
    return 0;
}

/* Errors are reported and the context keeps working. */
static int step_errors(int bogus_handles) {
    uint32_t word = 42;
    CUdeviceptr d = 0;
    if (bogus_handles) {
        CUstream s = NULL;
        REQUIRE_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
        REQUIRE_CU(cuStreamDestroy(s));
        CHECK_CU_FAILS(cuStreamSynchronize(s));
        CHECK_CU_FAILS(cuStreamSynchronize((CUstream)(uintptr_t)0x7e57ab1eu));
    }
    CHECK_CU_FAILS(cuMemcpyHtoD((CUdeviceptr)0x10, &word, sizeof word));
    /* The errors above were returned by their own calls: nothing lingers. */
    CHECK_CU(cuCtxSynchronize());
    REQUIRE_CU(cuMemAlloc(&d, 4));
    REQUIRE_CU(cuMemcpyHtoD(d, &word, 4));
    word = 0;
    REQUIRE_CU(cuMemcpyDtoH(&word, d, 4));
    CHECK_EQ_INT(word, 42);
    REQUIRE_CU(cuMemFree(d));
    return 0;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags);

/* Page-locked memory under unified addressing: its pointer is itself a
 * device address, which memsets and copies may name (XLA relies on it),
 * in local mode and in a VM. Not over the network carrier, whose
 * page-locked memory the host's GPU does not see. */
static int step_unified_pinned(void) {
    enum { WORDS = 1024 };
    uint32_t *h = NULL, back[16], expected[16];
    CUdeviceptr dh = 0;
    unsigned wrong = 0;
    if (getenv("RGPU_SERVER")) return 0;
    REQUIRE_CU(cuMemAllocHost((void **)&h, WORDS * 4));
    CHECK_CU(cuMemHostGetDevicePointer_v2(&dh, h, 0));
    CHECK_TRUE(dh == (CUdeviceptr)(uintptr_t)h);
    for (unsigned i = 0; i < WORDS; i++) h[i] = i;
    CHECK_CU(cuMemsetD32((CUdeviceptr)(uintptr_t)(h + 16), 0xABCD1234u, 16));
    CHECK_CU(cuCtxSynchronize());
    for (unsigned i = 0; i < 16; i++) expected[i] = 0xABCD1234u;
    CHECK_CU(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)(h + 16), sizeof back));
    CHECK_WORDS(back, expected, 16);
    for (unsigned i = 0; i < WORDS; i++) wrong += h[i] != (i >= 16 && i < 32 ? 0xABCD1234u : i);
    CHECK_TRUE(wrong == 0);
    REQUIRE_CU(cuMemFreeHost(h));
    return 0;
}

static int run_iteration(const struct kernels *k, const struct options *o, unsigned iteration) {
    int status = 0;
    status |= step_memset();
    status |= step_kernels(k, iteration);
    status |= step_global(k, iteration);
    status |= step_streams(k, iteration);
    status |= step_big_copy(o->big_mb, iteration);
    if (o->bulk_pinned_mb > 0) status |= step_bulk_pinned(k, o->bulk_pinned_mb, iteration);
    status |= step_unified_pinned();
    status |= step_errors(o->bogus_handles);
    return status;
}

static int setup(const char *ptx, CUdevice *device, CUcontext *ctx, struct kernels *k) {
    int count = 0, version = 0, value = 0;
    char name[256] = {0};
    size_t total = 0, free_bytes = 0, total_bytes = 0;
    CUcontext current = NULL;
    CUdevice current_device = -1;

    REQUIRE_CU(cuInit(0));
    REQUIRE_CU(cuDriverGetVersion(&version));
    CHECK_TRUE(version >= 12000);
    REQUIRE_CU(cuDeviceGetCount(&count));
    CHECK_TRUE(count >= 1);
    REQUIRE_CU(cuDeviceGet(device, 0));
    REQUIRE_CU(cuDeviceGetName(name, (int)sizeof name, *device));
    CHECK_TRUE(name[0] != '\0');
    REQUIRE_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, *device));
    CHECK_TRUE(value >= 5);
    REQUIRE_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, *device));
    CHECK_TRUE(value >= 0 && value <= 9);
    REQUIRE_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, *device));
    CHECK_EQ_INT(value, 32);
    REQUIRE_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, *device));
    CHECK_TRUE(value >= 256);
    REQUIRE_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, *device));
    CHECK_TRUE(value >= 1);
    REQUIRE_CU(cuDeviceTotalMem(&total, *device));
    CHECK_TRUE(total > 0);

    REQUIRE_CU(cuDevicePrimaryCtxRetain(ctx, *device));
    CHECK_TRUE(*ctx != NULL);
    REQUIRE_CU(cuCtxSetCurrent(*ctx));
    REQUIRE_CU(cuCtxGetCurrent(&current));
    CHECK_TRUE(current == *ctx);
    REQUIRE_CU(cuCtxGetDevice(&current_device));
    CHECK_EQ_INT(current_device, *device);

    REQUIRE_CU(cuMemGetInfo(&free_bytes, &total_bytes));
    CHECK_TRUE(total_bytes > 0 && free_bytes <= total_bytes);

    REQUIRE_CU(cuModuleLoadData(&k->module, ptx));
    REQUIRE_CU(cuModuleGetFunction(&k->vector_add, k->module, "rgpu_vector_add"));
    REQUIRE_CU(cuModuleGetFunction(&k->scale, k->module, "rgpu_scale"));
    REQUIRE_CU(cuModuleGetFunction(&k->fill_index, k->module, "rgpu_fill_index"));
    REQUIRE_CU(cuModuleGetFunction(&k->count_mismatches, k->module, "rgpu_count_mismatches"));
    REQUIRE_CU(cuModuleGetFunction(&k->empty, k->module, "rgpu_empty"));
    {
        CUfunction missing = NULL;
        CHECK_CU_FAILS(cuModuleGetFunction(&missing, k->module, "rgpu_no_such_kernel"));
    }
    return 0;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) == -1 && errno == EINTR) {
    }
}

static int parse_long(const char *text, long *out) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 0) return -1;
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv, struct options *o) {
    o->ptx_path = NULL;
    o->iterations = 1;
    o->hold_ms = 0;
    o->stop_file = NULL;
    o->big_mb = 64;
    o->bulk_pinned_mb = 0;
    o->bogus_handles = 1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--no-bogus-handles") == 0) {
            o->bogus_handles = 0;
            continue;
        }
        if (!next) return -1;
        if (strcmp(arg, "--ptx") == 0) o->ptx_path = next;
        else if (strcmp(arg, "--stop-file") == 0) o->stop_file = next;
        else if (strcmp(arg, "--iterations") == 0) {
            if (parse_long(next, &o->iterations) || o->iterations < 1) return -1;
        } else if (strcmp(arg, "--hold-ms") == 0) {
            if (parse_long(next, &o->hold_ms)) return -1;
        } else if (strcmp(arg, "--big-mb") == 0) {
            if (parse_long(next, &o->big_mb) || o->big_mb < 1) return -1;
        } else if (strcmp(arg, "--bulk-pinned-mb") == 0) {
            if (parse_long(next, &o->bulk_pinned_mb) || o->bulk_pinned_mb < 0 ||
                o->bulk_pinned_mb > 4096)
                return -1;
        } else return -1;
        i++;
    }
    return o->ptx_path ? 0 : -1;
}

int main(int argc, char **argv) {
    struct options o;
    struct kernels k = {0};
    CUdevice device = 0;
    CUcontext ctx = NULL;
    char *ptx;
    struct stat st;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_options(argc, argv, &o)) {
        fprintf(stderr,
                "usage: %s --ptx reference_kernels.ptx [--iterations N] [--hold-ms M] "
                "[--stop-file PATH] [--big-mb N] [--bulk-pinned-mb N] [--no-bogus-handles]\n",
                argv[0]);
        return 2;
    }
    ptx = read_file(o.ptx_path);
    if (!ptx) {
        fprintf(stderr, "driver_api_test: cannot read %s\n", o.ptx_path);
        return 2;
    }

    if (setup(ptx, &device, &ctx, &k) == 0) {
        for (long i = 0; i < o.iterations; i++) {
            if (run_iteration(&k, &o, (unsigned)i) != 0) break;
            if (i == 0) printf("running\n");
            if (o.stop_file && stat(o.stop_file, &st) == 0) break;
            if (o.hold_ms > 0 && i + 1 < o.iterations) sleep_ms(o.hold_ms);
        }
        CHECK_CU(cuModuleUnload(k.module));
        CHECK_CU(cuCtxSynchronize());
        {
            /* A reset primary context keeps its handle and works again once
             * retained, as runtimes (cudaDeviceReset) expect. */
            CUcontext again = NULL;
            CUdeviceptr d = 0;
            uint32_t word = 7;
            CHECK_CU(cuDevicePrimaryCtxReset(device));
            CHECK_CU(cuDevicePrimaryCtxRetain(&again, device));
            CHECK_TRUE(again == ctx);
            CHECK_CU(cuCtxSetCurrent(again));
            CHECK_CU(cuMemAlloc(&d, 4));
            CHECK_CU(cuMemcpyHtoD(d, &word, 4));
            word = 0;
            CHECK_CU(cuMemcpyDtoH(&word, d, 4));
            CHECK_EQ_INT(word, 7);
            CHECK_CU(cuMemFree(d));
            CHECK_CU(cuDevicePrimaryCtxRelease(device));
        }
        CHECK_CU(cuDevicePrimaryCtxRelease(device));
    }
    free(ptx);

    if (checks_failed) {
        printf("driver_api_test: %ld checks failed, %ld passed\n", checks_failed, checks_passed);
        return 1;
    }
    printf("driver_api_test: %ld checks passed\n", checks_passed);
    return 0;
}
