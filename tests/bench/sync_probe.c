/* What an idle cuCtxSynchronize costs natively in the conditions of rgpu's
 * worker, for issue 9's synchronous round trip: the worker's profile gave
 * the driver's call 0.8 µs where rgpu_bench's native loop took 0.55 µs. In
 * one process against NVIDIA's libcuda, the median of one idle
 * cuCtxSynchronize (timed as rgpu_bench times it) with:
 *   alone       the application's thread only (rgpu_bench's native row)
 *   parked      another thread that made the context current and launched,
 *               now blocked (rgpu's launch thread between bursts)
 *   registered  64 MiB of host memory registered (cuMemHostRegister, as
 *               the worker registers a process's blobs)
 *   created     a context of its own (cuCtxCreate with CU_CTX_MAP_HOST, as
 *               the worker's second and later sessions get), before and
 *               after it ran launches of its own
 *   seccomp     under a seccomp filter that allows every call after 115
 *               comparisons (the worker's allow-list is that long)
 * Each condition adds to the ones before it ("primary again": the primary
 * context again, with all of them).
 *
 *   sync_probe PTX [SAMPLES]
 *   sync_probe PTX fresh      the same median in a fresh primary context as
 *                             it is used step by step: untouched (rgpu_bench
 *                             measures its sync row first thing), 64 MiB
 *                             registered, a module loaded, one launch, 2000
 *                             launches
 *   sync_probe PTX foreign    the same median once a module is loaded, after
 *                             2000 launches made by another thread (which
 *                             then blocks, as rgpu's launch thread parks;
 *                             this thread synchronizes once before timing),
 *                             after 2000 launches of this thread's own, and
 *                             after another thread's again: whether the
 *                             driver's idle synchronize costs more on a
 *                             thread that did not submit the work, as the
 *                             worker's session thread does not
 *   sync_probe PTX hold       holds a context with 1 MiB allocated until
 *                             killed: run the probe again meanwhile for its
 *                             figures beside another process's context (the
 *                             benchmark's native side stays alive while its
 *                             rgpu side runs)
 *
 * Built beside tests/programs/rgpu_cuda.h: gcc -O2 -pthread -I tests/programs
 *   tests/bench/sync_probe.c LIBCUDA -o sync_probe */
#define _GNU_SOURCE
#include "cuda_check.h"
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags);
CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned int flags, CUdevice dev);
#define CU_CTX_MAP_HOST 0x08

static CUcontext ctx;
static CUfunction empty;
static long samples = 20000;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int released;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of `samples` idle synchronizations, in µs. */
static double idle_sync_us(void) {
    double *lat = malloc(samples * sizeof *lat);
    if (!lat) exit(1);
    CHECK(cuCtxSynchronize());
    for (long i = 0; i < samples; i++) {
        double t0 = now_s();
        CHECK(cuCtxSynchronize());
        lat[i] = (now_s() - t0) * 1e6;
    }
    qsort(lat, samples, sizeof *lat, compare_doubles);
    double median = lat[samples / 2];
    free(lat);
    return median;
}

/* Prints `label` and the median idle synchronize now. */
static void report(const char *label) { printf("%-24s %.3f us\n", label, idle_sync_us()); }

/* Lets every blocked launching thread end. */
static void release_threads(void) {
    pthread_mutex_lock(&lock);
    released = 1;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
}

/* A burst of `count` empty launches from a thread of its own, which then
 * blocks until the end (rgpu's launch thread between bursts); returns once
 * the launches are made, not run. */
struct burst {
    int count;
    int made;
};

static void *foreign_burst(void *arg) {
    struct burst *burst = arg;
    CHECK(cuCtxSetCurrent(ctx));
    for (int i = 0; i < burst->count; i++)
        CHECK(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    pthread_mutex_lock(&lock);
    burst->made = 1;
    pthread_cond_broadcast(&wake);
    while (!released) pthread_cond_wait(&wake, &lock);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void launch_on_another_thread(int count) {
    static struct burst bursts[4];
    static int used;
    if (used == 4) exit(1);
    struct burst *burst = &bursts[used++];
    burst->count = count;
    pthread_t thread;
    if (pthread_create(&thread, NULL, foreign_burst, burst) != 0) exit(1);
    pthread_mutex_lock(&lock);
    while (!burst->made) pthread_cond_wait(&wake, &lock);
    pthread_mutex_unlock(&lock);
    CHECK(cuCtxSynchronize());
}

/* Allows every system call, after as many comparisons as the worker's
 * allow-list makes for one near its end. */
static void allow_all_seccomp(void) {
    enum { RULES = 115 };
    struct sock_filter filter[RULES + 2];
    filter[0] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0);
    for (int i = 0; i < RULES; i++)
        filter[1 + i] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 100000 + i, 0, 0);
    filter[RULES + 1] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog program = {.len = RULES + 2, .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
        perror("seccomp");
        exit(1);
    }
}

/* Loads the reference kernels' rgpu_empty into `empty`. */
static void load_module(const char *path) {
    CUmodule module;
    CHECK(cuModuleLoadData(&module, read_ptx(path)));
    CHECK(cuModuleGetFunction(&empty, module, "rgpu_empty"));
}

static void launch_empty(int count) {
    for (int i = 0; i < count; i++) CHECK(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
}

static void load_empty(const char *path) {
    load_module(path);
    launch_empty(2000);
}

/* 64 MiB of host memory registered as the worker registers blobs. */
static void register_host(void) {
    size_t bytes = 64 << 20;
    void *host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) exit(1);
    memset(host, 1, bytes);
    CHECK(cuMemHostRegister_v2(host, bytes, 0x01 | 0x02));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: sync_probe PTX [SAMPLES] | PTX fresh [SAMPLES] | PTX foreign [SAMPLES] | "
                "PTX hold\n");
        return 2;
    }
    int hold = argc > 2 && strcmp(argv[2], "hold") == 0;
    int fresh = argc > 2 && strcmp(argv[2], "fresh") == 0;
    int foreign = argc > 2 && strcmp(argv[2], "foreign") == 0;
    if (argc > 2 && !hold && !fresh && !foreign) samples = atol(argv[2]);
    if ((fresh || foreign) && argc > 3) samples = atol(argv[3]);
    if (samples < 1) samples = 1;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    if (hold) {
        CUdeviceptr held;
        CHECK(cuMemAlloc(&held, 1 << 20));
        printf("holding a context\n");
        fflush(stdout);
        for (;;) pause();
    }
    if (fresh) {
        report("fresh");
        register_host();
        report("registered");
        load_module(argv[1]);
        report("module");
        launch_empty(1);
        report("one launch");
        launch_empty(2000);
        report("2000 launches");
        return 0;
    }
    if (foreign) {
        load_module(argv[1]);
        report("module");
        launch_on_another_thread(2000);
        report("another thread launched");
        launch_empty(2000);
        report("this thread launched");
        launch_on_another_thread(2000);
        report("another thread again");
        release_threads();
        return 0;
    }
    load_empty(argv[1]);
    report("alone");
    report("alone");
    launch_on_another_thread(1000);
    report("parked");
    register_host();
    report("registered");
    CUcontext own;
    CHECK(cuCtxCreate_v4(&own, NULL, CU_CTX_MAP_HOST, dev));
    report("created");
    load_empty(argv[1]);
    report("created, used");
    CHECK(cuCtxSetCurrent(ctx));
    report("primary again");
    allow_all_seccomp();
    report("seccomp");
    CHECK(cuCtxSetCurrent(own));
    report("seccomp, created");
    release_threads();
    return 0;
}
