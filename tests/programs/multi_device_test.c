/* multi_device_test: two CUDA devices in one process, each behind a daemon
 * of its own (RGPU_DEVICES=a.sock,b.sock). Checks the device count and
 * queries, allocations on each device through its primary context, copies
 * between them (cuMemcpyPeer, cuMemcpyPeerAsync, cuMemcpyDtoD, cuMemcpy,
 * staged through the process by rgpu), that no device has peer access to
 * the other, and switching the current context back and forth.
 *
 * Usage: multi_device_test
 *
 * Prints "multi_device_test: N checks passed" (exit 0) or every failed
 * check (exit 1). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"

#define CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define CUDA_ERROR_PEER_ACCESS_NOT_ENABLED 705
#define cuCtxCreate cuCtxCreate_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2

CUresult cuDeviceCanAccessPeer(int *can_access, CUdevice device, CUdevice peer);
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);
CUresult cuCtxDisablePeerAccess(CUcontext peer);
CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice device);
CUresult cuCtxPopCurrent(CUcontext *ctx);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                      size_t bytes);
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                           CUcontext src_ctx, size_t bytes, CUstream stream);

/* Odd, and more than two of the pieces (4 MiB) a staged copy moves at once. */
#define BYTES ((size_t)9 * 1024 * 1024 + 100)

/* Compares a whole buffer with the pattern of `seed`; one check. */
static void check_pattern(int line, const char *what, const uint8_t *actual, unsigned seed) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < BYTES; i++) {
        if (actual[i] != (uint8_t)(i * 7 + seed)) {
            if (!bad) first = i;
            bad++;
        }
    }
    if (bad) {
        checks_failed++;
        printf("FAIL line %d: %s: %zu of %zu bytes differ, the first at %zu\n", line, what, bad,
               (size_t)BYTES, first);
    } else {
        checks_passed++;
    }
}
#define CHECK_PATTERN(actual, seed) check_pattern(__LINE__, #actual, actual, seed)

static void fill_pattern(uint8_t *buffer, unsigned seed) {
    for (size_t i = 0; i < BYTES; i++) buffer[i] = (uint8_t)(i * 7 + seed);
}

/* Device memory of `ctx` read back through `ctx`, the current one after. */
static int read_back(CUcontext ctx, uint8_t *host, CUdeviceptr src) {
    memset(host, 0xEE, BYTES);
    REQUIRE_CU(cuCtxSetCurrent(ctx));
    REQUIRE_CU(cuMemcpyDtoH(host, src, BYTES));
    return 0;
}

static int step_queries(void) {
    int count = 0;
    REQUIRE_CU(cuDeviceGetCount(&count));
    CHECK_EQ_INT(count, 2);
    if (count != 2) return -1;
    for (int ordinal = 0; ordinal < 2; ordinal++) {
        CUdevice device = -1;
        char name[256] = {0};
        size_t total = 0;
        int major = 0, warp = 0;
        CHECK_CU(cuDeviceGet(&device, ordinal));
        CHECK_EQ_INT(device, ordinal);
        CHECK_CU(cuDeviceGetName(name, sizeof name, device));
        CHECK_TRUE(name[0] != '\0');
        CHECK_CU(cuDeviceTotalMem(&total, device));
        CHECK_TRUE(total > 0);
        CHECK_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device));
        CHECK_TRUE(major > 0);
        CHECK_CU(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, device));
        CHECK_EQ_INT(warp, 32);
        printf("device %d: %s, %zu MiB\n", ordinal, name, total >> 20);
    }
    CUdevice none = 0;
    CHECK_RC(cuDeviceGet(&none, 2), 101 /* CUDA_ERROR_INVALID_DEVICE */);

    /* Each device is behind a daemon of its own: no peer access. */
    for (int a = 0; a < 2; a++) {
        for (int b = 0; b < 2; b++) {
            int can = -1;
            CHECK_CU(cuDeviceCanAccessPeer(&can, a, b));
            CHECK_EQ_INT(can, 0);
        }
    }
    return 0;
}

static int step_contexts(CUcontext ctx[2]) {
    for (int round = 0; round < 3; round++) {
        for (int d = 0; d < 2; d++) {
            CUcontext now = NULL;
            CUdevice device = -1;
            CUdeviceptr p = 0;
            uint32_t word = 0x1000u * (unsigned)round + (unsigned)d, back = 0;
            size_t free_bytes = 0, total_bytes = 0;
            REQUIRE_CU(cuCtxSetCurrent(ctx[d]));
            CHECK_CU(cuCtxGetCurrent(&now));
            CHECK_TRUE(now == ctx[d]);
            CHECK_CU(cuCtxGetDevice(&device));
            CHECK_EQ_INT(device, d);
            CHECK_CU(cuMemGetInfo(&free_bytes, &total_bytes));
            CHECK_TRUE(total_bytes > 0);
            REQUIRE_CU(cuMemAlloc(&p, 4));
            CHECK_CU(cuMemcpyHtoD(p, &word, 4));
            CHECK_CU(cuMemcpyDtoH(&back, p, 4));
            CHECK_EQ_INT(back, word);
            CHECK_CU(cuMemFree(p));
        }
    }

    /* A created context of device 1 lives on device 1's daemon too. */
    {
        CUcontext created = NULL, popped = NULL;
        CUdevice device = -1;
        CUdeviceptr p = 0;
        uint32_t word = 0xC0FFEE, back = 0;
        REQUIRE_CU(cuCtxCreate(&created, 0, 1));
        CHECK_CU(cuCtxGetDevice(&device));
        CHECK_EQ_INT(device, 1);
        CHECK_CU(cuMemAlloc(&p, 4));
        CHECK_CU(cuMemcpyHtoD(p, &word, 4));
        CHECK_CU(cuMemcpyDtoH(&back, p, 4));
        CHECK_EQ_INT(back, word);
        CHECK_CU(cuMemFree(p));
        CHECK_CU(cuCtxPopCurrent(&popped));
        CHECK_TRUE(popped == created);
        CHECK_CU(cuCtxDestroy(created));
    }

    /* Peer access between the two devices' contexts. */
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    CHECK_RC(cuCtxEnablePeerAccess(ctx[1], 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    CHECK_RC(cuCtxDisablePeerAccess(ctx[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    CHECK_RC(cuCtxEnablePeerAccess(ctx[0], 0), CUDA_ERROR_INVALID_CONTEXT);
    REQUIRE_CU(cuCtxSetCurrent(ctx[1]));
    CHECK_RC(cuCtxEnablePeerAccess(ctx[0], 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    return 0;
}

static int step_copies(CUcontext ctx[2], uint8_t *pattern, uint8_t *host) {
    CUdeviceptr a0 = 0, pad1 = 0, b1 = 0, c1 = 0;
    CUstream stream1 = NULL;
    void *pinned0 = NULL;

    /* Device 0: a0. Device 1: pad1 first, so that b1 and c1 lie past
     * anything device 0 handed out (two daemons may hand out the same
     * addresses: pad1 may be a0's; an address means the current device's
     * memory then). */
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    REQUIRE_CU(cuMemAlloc(&a0, BYTES));
    REQUIRE_CU(cuCtxSetCurrent(ctx[1]));
    REQUIRE_CU(cuMemAlloc(&pad1, BYTES));
    REQUIRE_CU(cuMemAlloc(&b1, BYTES));
    REQUIRE_CU(cuMemAlloc(&c1, BYTES));
    CHECK_CU(cuMemsetD8(pad1, 0, BYTES));
    CHECK_CU(cuMemsetD8(b1, 0, BYTES));
    CHECK_CU(cuMemsetD8(c1, 0, BYTES));
    CHECK_CU(cuCtxSynchronize());

    /* Device 0's buffer filled, then copied to device 1 with cuMemcpyPeer. */
    fill_pattern(pattern, 1);
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    CHECK_CU(cuMemcpyHtoD(a0, pattern, BYTES));
    CHECK_CU(cuMemcpyPeer(b1, ctx[1], a0, ctx[0], BYTES));
    if (read_back(ctx[1], host, b1) == 0) CHECK_PATTERN(host, 1);

    /* cuMemcpyDtoD from device 0 (current) to device 1. */
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    CHECK_CU(cuMemcpyDtoD(c1, a0, BYTES));
    if (read_back(ctx[1], host, c1) == 0) CHECK_PATTERN(host, 1);

    /* And read from device 0's context: another device's memory is
     * reached through that device. */
    memset(host, 0xEE, BYTES);
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    CHECK_CU(cuMemcpyDtoH(host, c1, BYTES));
    CHECK_PATTERN(host, 1);

    /* The other way: device 1's memory into device 0's, by cuMemcpy (the
     * direction found from the addresses) and by cuMemcpyPeer. */
    fill_pattern(pattern, 2);
    REQUIRE_CU(cuCtxSetCurrent(ctx[1]));
    CHECK_CU(cuMemcpyHtoD(b1, pattern, BYTES));
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    CHECK_CU(cuMemsetD8(a0, 0, BYTES));
    CHECK_CU(cuMemcpy(a0, b1, BYTES));
    if (read_back(ctx[0], host, a0) == 0) CHECK_PATTERN(host, 2);
    CHECK_CU(cuMemsetD8(a0, 0, BYTES));
    CHECK_CU(cuMemcpyPeer(a0, ctx[0], b1, ctx[1], BYTES));
    if (read_back(ctx[0], host, a0) == 0) CHECK_PATTERN(host, 2);

    /* Asynchronous, on a stream of device 1's context. */
    REQUIRE_CU(cuCtxSetCurrent(ctx[1]));
    REQUIRE_CU(cuStreamCreate(&stream1, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuMemsetD8(c1, 0, BYTES));
    CHECK_CU(cuCtxSynchronize()); /* the stream does not wait for the legacy one */
    CHECK_CU(cuMemcpyPeerAsync(c1, ctx[1], a0, ctx[0], BYTES, stream1));
    CHECK_CU(cuStreamSynchronize(stream1));
    if (read_back(ctx[1], host, c1) == 0) CHECK_PATTERN(host, 2);
    REQUIRE_CU(cuCtxSetCurrent(ctx[1]));
    CHECK_CU(cuStreamDestroy(stream1));

    /* An address both daemons handed out means the current device's
     * memory: pad1 (never written) lies inside a0 too with rgpu's sim. */
    if (pad1 >= a0 && pad1 < a0 + BYTES) {
        memset(host, 0xEE, BYTES);
        CHECK_CU(cuMemcpyDtoH(host, pad1, BYTES));
        CHECK_TRUE(host[0] == 0 && host[BYTES - 1] == 0);
        printf("an address of both devices read as the current device's\n");
    }

    /* Pinned memory of device 0's context used by device 1's. */
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    REQUIRE_CU(cuMemAllocHost(&pinned0, BYTES));
    fill_pattern(pinned0, 3);
    REQUIRE_CU(cuCtxSetCurrent(ctx[1]));
    CHECK_CU(cuMemcpyHtoD(b1, pinned0, BYTES));
    memset(pinned0, 0, BYTES);
    CHECK_CU(cuMemcpyDtoH(pinned0, b1, BYTES));
    CHECK_PATTERN((uint8_t *)pinned0, 3);
    CHECK_CU(cuMemFreeHost(pinned0));

    /* A pointer of device 1 freed while device 0 is current. */
    REQUIRE_CU(cuCtxSetCurrent(ctx[0]));
    CHECK_CU(cuMemFree(c1));
    CHECK_CU(cuMemFree(a0));
    REQUIRE_CU(cuCtxSetCurrent(ctx[1]));
    CHECK_CU(cuMemFree(b1));
    CHECK_CU(cuMemFree(pad1));
    return 0;
}

int main(void) {
    CUcontext ctx[2] = {NULL, NULL};
    uint8_t *pattern = malloc(BYTES), *host = malloc(BYTES);
    CUresult rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!pattern || !host) {
        fprintf(stderr, "multi_device_test: out of memory\n");
        return 2;
    }
    rc = cuInit(0);
    if (rc != CUDA_SUCCESS) {
        printf("multi_device_test: cuInit failed: %d (%s)\n", rc, error_name(rc));
        return 1;
    }
    if (step_queries() == 0) {
        if (cuDevicePrimaryCtxRetain(&ctx[0], 0) || cuDevicePrimaryCtxRetain(&ctx[1], 1)) {
            fail(__LINE__, "cuDevicePrimaryCtxRetain");
        } else {
            checks_passed++;
            CHECK_TRUE(ctx[0] != ctx[1]);
            step_contexts(ctx);
            step_copies(ctx, pattern, host);
            CHECK_CU(cuCtxSetCurrent(NULL));
            CHECK_CU(cuDevicePrimaryCtxRelease(0));
            CHECK_CU(cuDevicePrimaryCtxRelease(1));
        }
    }
    free(pattern);
    free(host);

    if (checks_failed) {
        printf("multi_device_test: %ld checks failed, %ld passed\n", checks_failed, checks_passed);
        return 1;
    }
    printf("multi_device_test: %ld checks passed\n", checks_passed);
    return 0;
}
