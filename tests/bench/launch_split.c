/* Where an empty-kernel launch's time goes natively, for issue 9's launch
 * gap: rgpu's worker reads each launch from a ring that another process
 * wrote and then calls cuLaunchKernel, so this program compares, in one
 * process against NVIDIA's libcuda:
 *   direct    the application's own thread launches (rgpu_bench's native row)
 *   gpu       the GPU's own time for the same launches (events): whether
 *             the launch rate is bound by the GPU or by the CPU
 *   call      the median time of one cuLaunchKernel call with the queue full,
 *             and with an idle queue (the CPU's own cost of a launch)
 *   neighbour the direct rate while another process holds an idle context
 *             (as rgpu's standby worker does)
 *   split     a producer thread posts launch descriptors (64 bytes each) in
 *             a single-producer ring and a consumer thread reads each and
 *             launches it, as rgpu's guest library and worker do
 *   split-batched  the same, the consumer publishing its position only
 *             every 32 launches (what costs the cache-line traffic)
 * Each split runs unpinned, then with the threads pinned to CPUs 2 and 4.
 *
 *   launch_split PTX [LAUNCHES]
 *
 * Built beside tests/programs/rgpu_cuda.h: gcc -O2 -pthread -I tests/programs
 *   tests/bench/launch_split.c LIBCUDA -o launch_split */
#define _GNU_SOURCE
#include "cuda_check.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RING_SLOTS 4096
#define PUBLISH_EVERY 32

struct slot {
    uint32_t grid[3], block[3], shared;
    uint32_t pad[9];
};

struct ring {
    _Alignas(64) _Atomic uint64_t produced;
    _Alignas(64) _Atomic uint64_t consumed;
    _Alignas(64) struct slot slots[RING_SLOTS];
};

static CUcontext ctx;
static CUfunction empty;
static long launches = 200000;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void launch_one(void) {
    CHECK(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
}

static double direct(void) {
    double t0 = now_s();
    for (long i = 0; i < launches; i++) launch_one();
    CHECK(cuCtxSynchronize());
    return launches / (now_s() - t0);
}

static double gpu_rate(void) {
    CUevent start, end;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&end, CU_EVENT_DEFAULT));
    CHECK(cuEventRecord(start, NULL));
    for (long i = 0; i < launches; i++) launch_one();
    CHECK(cuEventRecord(end, NULL));
    CHECK(cuEventSynchronize(end));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, start, end));
    cuEventDestroy(start);
    cuEventDestroy(end);
    return launches / (ms * 1e-3);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median time of one call after 20000 launches filled the queue. */
static double call_us(void) {
    enum { SAMPLES = 20000 };
    static double t[SAMPLES];
    for (int i = 0; i < 20000; i++) launch_one();
    for (int i = 0; i < SAMPLES; i++) {
        double a = now_s();
        launch_one();
        t[i] = now_s() - a;
    }
    CHECK(cuCtxSynchronize());
    qsort(t, SAMPLES, sizeof t[0], cmp_double);
    return t[SAMPLES / 2] * 1e6;
}

/* Median time of one call with an idle queue: 100 launches, then a
 * synchronize, the calls timed. */
static double idle_call_us(void) {
    enum { SAMPLES = 20000, BURST = 100 };
    static double t[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) {
        if (i % BURST == 0) CHECK(cuCtxSynchronize());
        double a = now_s();
        launch_one();
        t[i] = now_s() - a;
    }
    CHECK(cuCtxSynchronize());
    qsort(t, SAMPLES, sizeof t[0], cmp_double);
    return t[SAMPLES / 2] * 1e6;
}

/* A child that waits for a byte on `go`, then creates a context of its own
 * and answers on `ready`; it lives until killed. Forked before cuInit. */
static pid_t neighbour(int *go_write, int *ready_read) {
    int go[2], ready[2];
    if (pipe(go) || pipe(ready)) exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        char byte;
        if (read(go[0], &byte, 1) != 1) _exit(0);
        CUdevice dev;
        CUcontext own;
        CHECK(cuInit(0));
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuDevicePrimaryCtxRetain(&own, dev));
        CHECK(cuCtxSetCurrent(own));
        CUdeviceptr d;
        CHECK(cuMemAlloc(&d, 1 << 20));
        if (write(ready[1], "r", 1) != 1) _exit(1);
        for (;;) pause();
    }
    close(go[0]);
    close(ready[1]);
    *go_write = go[1];
    *ready_read = ready[0];
    return pid;
}

struct split_args {
    struct ring *ring;
    int cpu;
    int publish_every;
};

static void *consumer(void *p) {
    struct split_args *a = p;
    struct ring *r = a->ring;
    pin(a->cpu);
    CHECK(cuCtxSetCurrent(ctx));
    uint64_t consumed = 0, seen = 0;
    struct slot s;
    while (consumed < (uint64_t)launches) {
        if (seen == consumed) {
            while ((seen = atomic_load_explicit(&r->produced, memory_order_acquire)) == consumed)
                __builtin_ia32_pause();
        }
        memcpy(&s, &r->slots[consumed % RING_SLOTS], sizeof s);
        CHECK(cuLaunchKernel(empty, s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1],
                             s.block[2], s.shared, NULL, NULL, NULL));
        consumed++;
        if (consumed % a->publish_every == 0 || consumed == seen)
            atomic_store_explicit(&r->consumed, consumed, memory_order_release);
    }
    atomic_store_explicit(&r->consumed, consumed, memory_order_release);
    return NULL;
}

static double split(int producer_cpu, int consumer_cpu, int publish_every) {
    struct ring *r = aligned_alloc(64, sizeof *r);
    memset(r, 0, sizeof *r);
    struct split_args a = {r, consumer_cpu, publish_every};
    pthread_t thread;
    pin(producer_cpu);
    double t0 = now_s();
    pthread_create(&thread, NULL, consumer, &a);
    uint64_t consumed_seen = 0;
    for (uint64_t i = 0; i < (uint64_t)launches; i++) {
        while (i - consumed_seen >= RING_SLOTS) {
            consumed_seen = atomic_load_explicit(&r->consumed, memory_order_acquire);
            if (i - consumed_seen >= RING_SLOTS) __builtin_ia32_pause();
        }
        struct slot *s = &r->slots[i % RING_SLOTS];
        s->grid[0] = s->grid[1] = s->grid[2] = 1;
        s->block[0] = 32;
        s->block[1] = s->block[2] = 1;
        s->shared = 0;
        atomic_store_explicit(&r->produced, i + 1, memory_order_release);
    }
    pthread_join(thread, NULL);
    CHECK(cuCtxSynchronize());
    double rate = launches / (now_s() - t0);
    free(r);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; c++) CPU_SET(c, &all);
    pthread_setaffinity_np(pthread_self(), sizeof all, &all);
    return rate;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: launch_split PTX [LAUNCHES]\n");
        return 2;
    }
    if (argc > 2) launches = atol(argv[2]);
    int go, ready;
    pid_t child = neighbour(&go, &ready);
    CUdevice dev;
    CUmodule module;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&module, read_ptx(argv[1])));
    CHECK(cuModuleGetFunction(&empty, module, "rgpu_empty"));
    for (int i = 0; i < 2000; i++) launch_one();
    CHECK(cuCtxSynchronize());
    for (int round = 1; round <= 3; round++) {
        double d = direct();
        double g = gpu_rate();
        double c = call_us();
        double idle = idle_call_us();
        double s_free = split(-1, -1, 1);
        double s_pin = split(2, 4, 1);
        double b_free = split(-1, -1, PUBLISH_EVERY);
        double b_pin = split(2, 4, PUBLISH_EVERY);
        printf("round %d: direct %.0f/s; gpu %.0f/s (%.3f of direct); one call %.2f us (idle queue %.2f us); "
               "split %.3f, pinned %.3f; batched %.3f, pinned %.3f (of direct)\n",
               round, d, g, g / d, c, idle, s_free / d, s_pin / d, b_free / d, b_pin / d);
    }
    char byte = 'g';
    if (write(go, &byte, 1) != 1 || read(ready, &byte, 1) != 1) return 1;
    for (int round = 1; round <= 2; round++) {
        double d = direct();
        double g = gpu_rate();
        printf("with another process's idle context, round %d: direct %.0f/s; gpu %.0f/s\n",
               round, d, g);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
}
