/* ipc_test: CUDA IPC between two processes (what PyTorch's multiprocessing
 * does through cudart to share CUDA tensors): one process exports device
 * memory and an event, another opens them. Runs against rgpu's libcuda.so.1
 * (sim or cuda executor) and NVIDIA's.
 *
 * Usage:
 *   ipc_test export DIR [--expect-write]
 *     Allocates 1 MiB, fills it (an index pattern, then 0xE7 bytes in its
 *     last 4 KiB written on a stream behind which an interprocess event is
 *     recorded), writes the 64-byte handles to DIR/mem.handle and
 *     DIR/event.handle, prints "exported", and waits for DIR/free. Then
 *     (--expect-write) checks that the memory holds what the opener wrote
 *     (0xB0B0B0B0 words), frees the memory and destroys the event, prints
 *     "freed", and waits for DIR/exit.
 *   ipc_test open DIR --expect opened|refused|unsupported|any
 *            [--flip N | --random] [--check-closed]
 *     Opens both handles (A's handle with byte N flipped, or 64 random
 *     bytes) and prints "open memory: rc R NAME" and "open event: rc R NAME".
 *     opened: both open; the event is waited for (cuEventSynchronize and
 *     through a stream), A's data is read (a copy to the host and one into
 *     its own allocation), pointer queries answer for the mapping, a second
 *     open answers the same pointer, the mapping is overwritten with
 *     0xB0B0B0B0 words and closed (with --check-closed: then no longer
 *     known, and a second close fails). refused: both fail with
 *     CUDA_ERROR_INVALID_HANDLE. unsupported: both fail with
 *     CUDA_ERROR_NOT_SUPPORTED (rgpu's sim executor, once the tenant's
 *     registry accepted the handles). any: prints the results only.
 *
 * Prints "ipc_test: N checks passed" (exit 0) or every failed check
 * (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"
#include "wait_for_file.h"

#define CUDA_ERROR_NOT_SUPPORTED 801
#define CU_EVENT_INTERPROCESS 0x4
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define CU_IPC_HANDLE_SIZE 64
#define POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10
#define POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define POINTER_ATTRIBUTE_RANGE_SIZE 12
#define MEMORYTYPE_DEVICE 2

typedef struct {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;
typedef struct {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcEventHandle;

#define cuIpcOpenMemHandle cuIpcOpenMemHandle_v2
#define cuMemGetAddressRange cuMemGetAddressRange_v2

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event);
CUresult cuIpcOpenEventHandle(CUevent *event, CUipcEventHandle handle);
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

#define BYTES (1u << 20)
#define WORDS (BYTES / 4)
#define TAIL 4096u
#define TAIL_BYTE 0xE7u
#define B_WORD 0xB0B0B0B0u

static uint32_t pattern(uint32_t i) { return i ^ 0xA5A50000u; }

static void path_in(char *out, size_t len, const char *dir, const char *name) {
    snprintf(out, len, "%s/%s", dir, name);
}

/* Writes `len` bytes to DIR/name whole (a temporary file, then a rename),
 * so a reader that sees the file sees all of it. */
static int write_whole(const char *dir, const char *name, const void *data, size_t len) {
    char path[4096], tmp[4200];
    path_in(path, sizeof path, dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

static int read_handle(const char *dir, const char *name, char out[CU_IPC_HANDLE_SIZE]) {
    char path[4096];
    path_in(path, sizeof path, dir, name);
    size_t len = 0;
    char *data = read_file_len(path, &len);
    if (!data || len != CU_IPC_HANDLE_SIZE) {
        free(data);
        return -1;
    }
    memcpy(out, data, CU_IPC_HANDLE_SIZE);
    free(data);
    return 0;
}

static void wait_for(const char *dir, const char *name) {
    char path[4096];
    path_in(path, sizeof path, dir, name);
    wait_for_file(path, 10 * 1000000L);
}

static int context(CUdevice *device, CUcontext *ctx) {
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(device, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(ctx, *device) != CUDA_SUCCESS ||
        cuCtxSetCurrent(*ctx) != CUDA_SUCCESS) {
        printf("FAIL: no CUDA context\n");
        return -1;
    }
    return 0;
}

static int export_side(const char *dir, int expect_write) {
    CUdevice device;
    CUcontext ctx;
    if (context(&device, &ctx)) return -1;
    CUdeviceptr buf = 0;
    CUstream stream = NULL;
    CUevent event = NULL, timed = NULL;
    uint32_t *host = malloc(BYTES);
    if (!host) return -1;
    for (uint32_t i = 0; i < WORDS; i++) host[i] = pattern(i);
    REQUIRE_CU(cuMemAlloc(&buf, BYTES));
    REQUIRE_CU(cuMemcpyHtoD(buf, host, BYTES));
    REQUIRE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    REQUIRE_CU(cuEventCreate(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    REQUIRE_CU(cuMemsetD32Async(buf + BYTES - TAIL, TAIL_BYTE * 0x01010101u, TAIL / 4, stream));
    REQUIRE_CU(cuEventRecord(event, stream));

    /* Only interprocess events have handles: the flags reach the host. */
    CUipcEventHandle no_handle;
    REQUIRE_CU(cuEventCreate(&timed, CU_EVENT_DEFAULT));
    CHECK_CU_FAILS(cuIpcGetEventHandle(&no_handle, timed));
    CHECK_CU(cuEventDestroy(timed));
    /* Only device memory of this process has a handle. */
    CUipcMemHandle mem_handle;
    CHECK_CU_FAILS(cuIpcGetMemHandle(&mem_handle, (CUdeviceptr)0x1000));
    unsigned char capable = 0;
    CHECK_CU(cuPointerGetAttribute(&capable, POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, buf));
    CHECK_EQ_INT(capable, 1);

    CUipcEventHandle event_handle;
    REQUIRE_CU(cuIpcGetMemHandle(&mem_handle, buf));
    REQUIRE_CU(cuIpcGetEventHandle(&event_handle, event));
    if (write_whole(dir, "mem.handle", &mem_handle, sizeof mem_handle) ||
        write_whole(dir, "event.handle", &event_handle, sizeof event_handle)) {
        fail(__LINE__, "writing the handles");
        return -1;
    }
    printf("exported\n");
    fflush(stdout);

    wait_for(dir, "free");
    if (expect_write) {
        REQUIRE_CU(cuMemcpyDtoH(host, buf, BYTES));
        long wrong = 0;
        for (uint32_t i = 0; i < WORDS; i++) wrong += host[i] != B_WORD;
        CHECK_EQ_INT(wrong, 0);
        if (wrong == 0) printf("A sees B's write\n");
    }
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuMemFree(buf));
    CHECK_CU(cuEventDestroy(event));
    CHECK_CU(cuStreamDestroy(stream));
    printf("freed\n");
    fflush(stdout);
    wait_for(dir, "exit");
    free(host);
    CHECK_CU(cuDevicePrimaryCtxRelease(device));
    return 0;
}

/* What an opened mapping and event allow: A's data is there once its event
 * completed, pointer queries know the mapping, a second open is counted,
 * and the opener's write lands in A's memory. */
static int use_opened(CUdeviceptr mem, CUevent event) {
    CUstream stream = NULL;
    CUdeviceptr own = 0;
    uint32_t *host = malloc(BYTES);
    if (!host) return -1;
    CHECK_CU(cuEventSynchronize(event));
    CHECK_CU(cuEventQuery(event));
    REQUIRE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamWaitEvent(stream, event, 0));
    CHECK_CU(cuStreamSynchronize(stream));

    memset(host, 0, BYTES);
    REQUIRE_CU(cuMemcpyDtoH(host, mem, BYTES));
    long wrong = 0;
    for (uint32_t i = 0; i < WORDS - TAIL / 4; i++) wrong += host[i] != pattern(i);
    for (uint32_t i = WORDS - TAIL / 4; i < WORDS; i++) wrong += host[i] != TAIL_BYTE * 0x01010101u;
    CHECK_EQ_INT(wrong, 0);
    if (wrong == 0) printf("B reads A's data\n");

    /* A device-to-device copy from the mapping into B's own memory. */
    REQUIRE_CU(cuMemAlloc(&own, BYTES));
    CHECK_CU(cuMemcpyDtoD(own, mem, BYTES));
    uint32_t first[4] = {0};
    CHECK_CU(cuMemcpyDtoH(first, own + 4 * 1000, sizeof first));
    CHECK_EQ_INT(first[0], pattern(1000));
    CHECK_EQ_INT(first[3], pattern(1003));
    CHECK_CU(cuMemFree(own));

    /* Pointer queries answer for the mapping. */
    CUdeviceptr start = 0, base = 0;
    size_t size = 0, range = 0;
    unsigned int type = 0;
    CHECK_CU(cuPointerGetAttribute(&type, POINTER_ATTRIBUTE_MEMORY_TYPE, mem + 64));
    CHECK_EQ_INT(type, MEMORYTYPE_DEVICE);
    CHECK_CU(cuPointerGetAttribute(&start, POINTER_ATTRIBUTE_RANGE_START_ADDR, mem + 64));
    CHECK_EQ_INT(start, mem);
    CHECK_CU(cuPointerGetAttribute(&size, POINTER_ATTRIBUTE_RANGE_SIZE, mem + 64));
    CHECK_TRUE(size >= BYTES);
    CHECK_CU(cuMemGetAddressRange(&base, &range, mem + 4096));
    CHECK_EQ_INT(base, mem);
    CHECK_TRUE(range >= BYTES);

    /* B writes into A's memory; A reads it back after B is done. */
    CHECK_CU(cuMemsetD32(mem, B_WORD, WORDS));
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(cuStreamDestroy(stream));
    free(host);
    return 0;
}

static int open_side(const char *dir, const char *expect, int flip, int random_bytes,
                     int check_closed) {
    CUdevice device;
    CUcontext ctx;
    if (context(&device, &ctx)) return -1;
    CUipcMemHandle mem_handle;
    CUipcEventHandle event_handle;
    if (read_handle(dir, "mem.handle", mem_handle.reserved) ||
        read_handle(dir, "event.handle", event_handle.reserved)) {
        fail(__LINE__, "reading the handles");
        return -1;
    }
    if (flip >= 0 && flip < CU_IPC_HANDLE_SIZE) {
        mem_handle.reserved[flip] ^= 0x5a;
        event_handle.reserved[flip] ^= 0x5a;
    }
    if (random_bytes) {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(mem_handle.reserved, 1, CU_IPC_HANDLE_SIZE, f) != CU_IPC_HANDLE_SIZE ||
            fread(event_handle.reserved, 1, CU_IPC_HANDLE_SIZE, f) != CU_IPC_HANDLE_SIZE) {
            fail(__LINE__, "reading /dev/urandom");
            if (f) fclose(f);
            return -1;
        }
        fclose(f);
    }
    CUdeviceptr mem = 0;
    CUevent event = NULL;
    CUresult rc_mem = cuIpcOpenMemHandle(&mem, mem_handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    printf("open memory: rc %d %s\n", rc_mem, error_name(rc_mem));
    CUresult rc_event = cuIpcOpenEventHandle(&event, event_handle);
    printf("open event: rc %d %s\n", rc_event, error_name(rc_event));
    fflush(stdout);

    if (!strcmp(expect, "refused")) {
        CHECK_RC(rc_mem, CUDA_ERROR_INVALID_HANDLE);
        CHECK_RC(rc_event, CUDA_ERROR_INVALID_HANDLE);
    } else if (!strcmp(expect, "unsupported")) {
        CHECK_RC(rc_mem, CUDA_ERROR_NOT_SUPPORTED);
        CHECK_RC(rc_event, CUDA_ERROR_NOT_SUPPORTED);
    } else if (!strcmp(expect, "opened")) {
        CHECK_CU(rc_mem);
        CHECK_CU(rc_event);
        if (rc_mem == CUDA_SUCCESS && rc_event == CUDA_SUCCESS) {
            /* A second open of the same handle answers the same mapping,
             * counted: one close leaves it usable. */
            CUdeviceptr again = 0;
            CHECK_CU(cuIpcOpenMemHandle(&again, mem_handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
            CHECK_EQ_INT(again, mem);
            if (again == mem) CHECK_CU(cuIpcCloseMemHandle(again));
            use_opened(mem, event);
            CHECK_CU(cuIpcCloseMemHandle(mem));
            if (check_closed) {
                CUdeviceptr start = 0;
                CHECK_CU_FAILS(
                    cuPointerGetAttribute(&start, POINTER_ATTRIBUTE_RANGE_START_ADDR, mem));
                CHECK_CU_FAILS(cuIpcCloseMemHandle(mem));
            }
            CHECK_CU(cuEventDestroy(event));
            char path[4096];
            path_in(path, sizeof path, dir, "written");
            FILE *f = fopen(path, "w");
            if (f) fclose(f);
        }
    } else if (strcmp(expect, "any")) {
        fail(__LINE__, "--expect must be opened, refused, unsupported or any");
    }
    CHECK_CU(cuDevicePrimaryCtxRelease(device));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        printf("usage: ipc_test export|open DIR [options]\n");
        return 2;
    }
    const char *mode = argv[1], *dir = argv[2], *expect = "opened";
    int expect_write = 0, flip = -1, random_bytes = 0, check_closed = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--expect-write")) expect_write = 1;
        else if (!strcmp(argv[i], "--random")) random_bytes = 1;
        else if (!strcmp(argv[i], "--check-closed")) check_closed = 1;
        else if (!strcmp(argv[i], "--expect") && i + 1 < argc) expect = argv[++i];
        else if (!strcmp(argv[i], "--flip") && i + 1 < argc) flip = atoi(argv[++i]);
        else {
            printf("unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!strcmp(mode, "export")) export_side(dir, expect_write);
    else if (!strcmp(mode, "open")) open_side(dir, expect, flip, random_bytes, check_closed);
    else {
        printf("unknown mode %s\n", mode);
        return 2;
    }
    if (checks_failed) {
        printf("ipc_test: %ld of %ld checks failed\n", checks_failed,
               checks_failed + checks_passed);
        return 1;
    }
    printf("ipc_test: %ld checks passed\n", checks_passed);
    return 0;
}
