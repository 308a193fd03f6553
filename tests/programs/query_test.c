/* query_test: cuEventQuery and cuStreamQuery never wait (issue 9).
 *
 * Usage: query_test --ptx reference_kernels.ptx [--host-busy-ms N]
 *                   [--no-mapped-memory] [--quick-us US]
 *
 * 1. Behind 2000 queued launches of rgpu_spin (10 us each): an event
 *    recorded after them and their stream are NOT_READY, and each query
 *    returns within microseconds; after cuEventSynchronize both are
 *    SUCCESS. An event never recorded is SUCCESS.
 * 2. While another thread of the process waits in cuStreamSynchronize for
 *    a kernel of N ms (default 300) on a second stream: an event recorded
 *    behind that kernel and the stream are NOT_READY, an event that
 *    completed before is SUCCESS, and the answers come at once (natively,
 *    too: the driver never waits in a query; through rgpu a query sent to
 *    the host would wait for the synchronize).
 * 3. Behind a stream memory operation: after a kernel the stream finished,
 *    cuStreamWaitValue32 on a word of mapped page-locked memory holds the
 *    stream (NOT_READY, and an event recorded behind it too) until this
 *    process writes the word; then both are SUCCESS. A batch of those
 *    operations (cuStreamBatchMemOp) writes and waits in order. Left out
 *    with --no-mapped-memory (the network carrier shares no memory with
 *    the host, so page-locked memory has no device address there).
 * 4. Behind a launch alone, with no other command after it: a kernel of
 *    50 ms on a stream of its own keeps it NOT_READY at every look over
 *    the next 10 ms (through rgpu the host looks at the stream between
 *    commands while the launch may still wait on its launch thread, or,
 *    with RGPU_SIM_DEFER_LAUNCHES, be held back by the sim), then SUCCESS
 *    after cuStreamSynchronize.
 * 5. A synchronize after synchronizes (the host answers one that follows
 *    another without asking the driver, nothing having run between) still
 *    waits for what came after them: a 50 ms kernel launched after two
 *    cuCtxSynchronize calls is done when the third returns, which took
 *    the kernel's time.
 *
 * Prints "MEASURED <what> <us>" lines and "query_test: N checks passed"
 * (exit 0) or every failed check (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rgpu_cuda.h"
#include "checks.h"

CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags);
/* What cuda.h names since CUDA 12; the names without _v2 are the
 * pre-12 entry points, which need CAN_USE_STREAM_MEM_OPS_V1. */
CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, unsigned value, unsigned flags);
CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, unsigned value, unsigned flags);
#define DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 92
#ifndef CUDA_ERROR_NOT_SUPPORTED
#define CUDA_ERROR_NOT_SUPPORTED 801
#endif
/* CUstreamBatchMemOpParams: a wait or a write of a value. */
typedef struct {
    unsigned operation;
    unsigned pad;
    CUdeviceptr address;
    unsigned long long value;
    unsigned flags;
    unsigned pad2;
    CUdeviceptr alias;
    unsigned long long reserved;
} BatchMemOp;
CUresult cuStreamBatchMemOp_v2(CUstream stream, unsigned count, BatchMemOp *ops, unsigned flags);
#define MEM_OP_WAIT_VALUE_32 1
#define MEM_OP_WRITE_VALUE_32 2
#define MEM_OP_WRITE_VALUE_64 5
#define MEMHOSTALLOC_DEVICEMAP 0x02
#define STREAM_WAIT_VALUE_EQ 0x1

#define QUEUED 2000
/* A query answered without waiting takes far less; one sent behind the
 * queue, or behind the other thread's synchronize, takes longer
 * (--quick-us changes it). */
static double quick_us = 5000.0;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static CUfunction spin;
static CUcontext ctx;

static CUresult launch_spin(uint64_t ns, CUstream stream) {
    void *params[] = {&ns};
    return cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

/* The timed query: its result, and its time in `us`. */
static CUresult timed(CUresult (*query)(void *), void *what, double *us) {
    double t0 = now_us();
    CUresult rc = query(what);
    *us = now_us() - t0;
    return rc;
}

static CUresult query_event(void *e) { return cuEventQuery((CUevent)e); }
static CUresult query_stream(void *s) { return cuStreamQuery((CUstream)s); }

struct waiter {
    CUstream stream;
    CUresult rc;
};

static void *synchronize_stream(void *arg) {
    struct waiter *w = arg;
    w->rc = cuCtxSetCurrent(ctx);
    if (w->rc == CUDA_SUCCESS) w->rc = cuStreamSynchronize(w->stream);
    return NULL;
}

int main(int argc, char **argv) {
    const char *ptx_path = NULL;
    long busy_ms = 300;
    int mapped_memory = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-mapped-memory")) mapped_memory = 0;
        else if (i + 1 < argc && !strcmp(argv[i], "--ptx")) ptx_path = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--host-busy-ms")) busy_ms = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--quick-us")) quick_us = atof(argv[++i]);
    }
    char *ptx = ptx_path ? read_file(ptx_path) : NULL;
    CUdevice dev;
    CUmodule module;
    if (!ptx || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, ptx) ||
        cuModuleGetFunction(&spin, module, "rgpu_spin")) {
        printf("FAIL: no CUDA context or rgpu_spin (usage: query_test --ptx PTX)\n");
        return 1;
    }

    /* 1. Behind queued launches. */
    CUstream stream;
    CUevent after, never;
    CHECK_CU(cuStreamCreate(&stream, 0));
    CHECK_CU(cuEventCreate(&after, 0));
    CHECK_CU(cuEventCreate(&never, 0));
    CHECK_CU(cuEventQuery(never));
    for (int i = 0; i < QUEUED; i++) launch_spin(10000, stream);
    CHECK_CU(cuEventRecord(after, stream));
    double us;
    CHECK_RC(timed(query_event, after, &us), CUDA_ERROR_NOT_READY);
    printf("MEASURED event query behind %d queued launches %.1f\n", QUEUED, us);
    CHECK_TRUE(us < quick_us);
    CHECK_RC(timed(query_stream, stream, &us), CUDA_ERROR_NOT_READY);
    printf("MEASURED stream query behind %d queued launches %.1f\n", QUEUED, us);
    CHECK_TRUE(us < quick_us);
    CHECK_CU(cuEventSynchronize(after));
    CHECK_CU(cuEventQuery(after));
    CHECK_CU(cuStreamQuery(stream));
    /* Recorded again behind new work: pending again. */
    launch_spin(50000000, stream);
    CHECK_CU(cuEventRecord(after, stream));
    CHECK_RC(cuEventQuery(after), CUDA_ERROR_NOT_READY);
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuEventQuery(after));

    /* 2. While another thread waits for a long kernel. */
    CUstream other;
    CUevent done_before, behind;
    CHECK_CU(cuStreamCreate(&other, 0));
    CHECK_CU(cuEventCreate(&done_before, 0));
    CHECK_CU(cuEventCreate(&behind, 0));
    launch_spin(1000, stream);
    CHECK_CU(cuEventRecord(done_before, stream));
    CHECK_CU(cuEventSynchronize(done_before));
    /* The long kernel, then an event behind it, then another thread waits
     * for the stream. */
    CHECK_CU(launch_spin((uint64_t)busy_ms * 1000000ull, other));
    CHECK_CU(cuEventRecord(behind, other));
    struct waiter w = {.stream = other, .rc = CUDA_SUCCESS};
    pthread_t thread;
    if (pthread_create(&thread, NULL, synchronize_stream, &w) != 0) {
        fail(__LINE__, "pthread_create");
        return 1;
    }
    struct timespec settle = {0, 20000000};
    nanosleep(&settle, NULL); /* the other thread is in its synchronize */
    double t_start = now_us();
    CHECK_RC(timed(query_event, behind, &us), CUDA_ERROR_NOT_READY);
    printf("MEASURED event query during another thread's synchronize %.1f\n", us);
    CHECK_TRUE(us < quick_us);
    CHECK_RC(timed(query_event, done_before, &us), CUDA_SUCCESS);
    printf("MEASURED completed event query during another thread's synchronize %.1f\n", us);
    CHECK_TRUE(us < quick_us);
    CHECK_RC(timed(query_stream, other, &us), CUDA_ERROR_NOT_READY);
    CHECK_TRUE(us < quick_us);
    /* All of it happened while the long kernel ran. */
    CHECK_TRUE(now_us() - t_start < busy_ms * 1000.0 / 2);
    pthread_join(thread, NULL);
    CHECK_CU(w.rc);
    CHECK_CU(cuEventSynchronize(behind));
    CHECK_CU(cuEventQuery(behind));
    CHECK_CU(cuStreamQuery(other));

    /* 3. Behind a stream memory operation. */
    if (mapped_memory) {
        volatile uint32_t *word = NULL;
        CUdeviceptr d_word = 0;
        CUevent past_wait;
        CHECK_CU(cuEventCreate(&past_wait, 0));
        REQUIRE_CU(cuMemHostAlloc((void **)&word, 4096, MEMHOSTALLOC_DEVICEMAP));
        *word = 0;
        REQUIRE_CU(cuMemHostGetDevicePointer_v2(&d_word, (void *)word, 0));
        launch_spin(1000, stream);
        CHECK_CU(cuStreamSynchronize(stream));
        int v1_memory_ops = -1;
        CHECK_CU(cuDeviceGetAttribute(&v1_memory_ops, DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev));
        if (v1_memory_ops == 0)
            CHECK_RC(cuStreamWaitValue32(stream, d_word, 1, STREAM_WAIT_VALUE_EQ), CUDA_ERROR_NOT_SUPPORTED);
        CHECK_CU(cuStreamWaitValue32_v2(stream, d_word, 1, STREAM_WAIT_VALUE_EQ));
        /* The stream alone first: an event recorded on it is work the
         * guest notes anyway. */
        CHECK_RC(cuStreamQuery(stream), CUDA_ERROR_NOT_READY);
        struct timespec look = {0, 20000000};
        nanosleep(&look, NULL);
        CHECK_RC(cuStreamQuery(stream), CUDA_ERROR_NOT_READY);
        CHECK_CU(cuEventRecord(past_wait, stream));
        CHECK_RC(cuEventQuery(past_wait), CUDA_ERROR_NOT_READY);
        *word = 1;
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_CU(cuStreamQuery(stream));
        CHECK_CU(cuEventQuery(past_wait));
        /* A batch: write 7 to the word, wait for it, write 64 bits past. */
        BatchMemOp ops[3];
        memset(ops, 0, sizeof ops);
        ops[0].operation = MEM_OP_WRITE_VALUE_32;
        ops[0].address = d_word;
        ops[0].value = 7;
        ops[1].operation = MEM_OP_WAIT_VALUE_32;
        ops[1].address = d_word;
        ops[1].value = 7;
        ops[1].flags = STREAM_WAIT_VALUE_EQ;
        ops[2].operation = MEM_OP_WRITE_VALUE_64;
        ops[2].address = d_word + 8;
        ops[2].value = 0x1122334455667788ull;
        CHECK_CU(cuStreamBatchMemOp_v2(stream, 3, ops, 0));
        CHECK_CU(cuStreamSynchronize(stream));
        CHECK_EQ_INT(word[0], 7);
        CHECK_TRUE(*(volatile unsigned long long *)(word + 2) == 0x1122334455667788ull);
        CHECK_CU(cuEventDestroy(past_wait));
        CHECK_CU(cuMemFreeHost((void *)word));
    }

    /* 4. Behind a launch alone. A short kernel waited for first, then a
     * moment idle (longer than the host's 50 us between looks, shorter
     * than its 1 ms between the scheduler's fences, which drain what is
     * queued): the host's first look at the new stream comes right after
     * the launch, between commands, while the launch may still be queued. */
    CUstream lone;
    CHECK_CU(cuStreamCreate(&lone, 0));
    CHECK_CU(launch_spin(1000, stream));
    CHECK_CU(cuStreamSynchronize(stream));
    struct timespec idle = {0, 200000};
    nanosleep(&idle, NULL);
    CHECK_CU(launch_spin(50000000, lone));
    for (int look = 0; look < 5; look++) {
        CHECK_RC(cuStreamQuery(lone), CUDA_ERROR_NOT_READY);
        struct timespec later = {0, 2000000};
        nanosleep(&later, NULL);
    }
    CHECK_CU(cuStreamSynchronize(lone));
    CHECK_CU(cuStreamQuery(lone));
    CHECK_CU(cuStreamDestroy(lone));

    /* 5. A synchronize after synchronizes. */
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(launch_spin(50000000, stream));
    double synchronize_start = now_us();
    CHECK_CU(cuCtxSynchronize());
    double synchronize_took = now_us() - synchronize_start;
    CHECK_CU(cuStreamQuery(stream));
    printf("MEASURED synchronize behind a 50 ms kernel after two synchronizes %.0f\n", synchronize_took);
    CHECK_TRUE(synchronize_took >= 40000.0);

    CHECK_CU(cuEventDestroy(after));
    CHECK_CU(cuEventDestroy(never));
    CHECK_CU(cuEventDestroy(done_before));
    CHECK_CU(cuEventDestroy(behind));
    CHECK_CU(cuStreamDestroy(stream));
    CHECK_CU(cuStreamDestroy(other));
    cuDevicePrimaryCtxRelease(dev);
    if (checks_failed) return 1;
    printf("query_test: %ld checks passed\n", checks_passed);
    return 0;
}
