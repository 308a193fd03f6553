/* rgpu_bench: native CUDA and rgpu side by side, measured in one run.
 *
 *   rgpu_bench --native /usr/local/nvidia/lib64/libcuda.so.1 \
 *              --rgpu /path/to/guest-lib/libcuda.so.1 \
 *              --ptx tests/programs/reference_kernels.ptx
 *              [--sync-iters N] [--launches N] [--mib N] [--repeats N]
 *              [--launch-blocks N] [--rgpu-side-launcher caller|thread]
 *              [--driver-cpu K --caller-cpu M]
 *
 * Each library is dlopen'ed on its own (RTLD_LOCAL) and driven through
 * function pointers with the same code. The rgpu side needs RGPU_SOCKET set
 * to a daemon started with --executor cuda. Either side may be left out.
 *
 * Measurements:
 *   - synchronous round trip: cuCtxSynchronize on an idle context (median and
 *     mean of --sync-iters calls after a warm-up), first on a context that
 *     has run nothing yet, again (median) after the launch rows;
 *   - launch throughput: --launches launches of rgpu_empty, then one
 *     cuCtxSynchronize, five times (the best run's rate), then five more
 *     runs of each side taken in turn: the "worst run" row is the worst
 *     of those five ratios. A run in turn is --launch-blocks (default
 *     10) blocks of each side, each block its share of the launches and
 *     a cuCtxSynchronize, the sides alternating block by block (native
 *     first in even blocks, rgpu first in odd ones), so that both sides
 *     of a ratio sample the same second of the host's drifting launch
 *     rate (the GPU's own rate from events too). With
 *     --rgpu-side-launcher thread, the rgpu side's blocks in turn are
 *     launched from a second thread of the process: a control (NVIDIA's
 *     library on both sides) of what running the driver on another vCPU
 *     than the native side's alone does to the ratio, as rgpu's launch
 *     thread does. With --driver-cpu K and --caller-cpu M, the runs in
 *     turn call the driver from CPU K alone: the native side's blocks
 *     (and the second thread's) run pinned to K, the rgpu side's caller
 *     to M, for a daemon started with --launch-cpus K (the driver's
 *     launch rate differs between CPUs and rgpu's launch thread calls it
 *     from a CPU of its own);
 *   - graph replay: 100 rgpu_empty launches captured on a stream into a
 *     graph, the instantiated graph launched 1000 times, then one
 *     cuStreamSynchronize (kernels per second);
 *   - launch + synchronize latency: one rgpu_empty and cuCtxSynchronize
 *     (median of 2000); and the same after 1 ms idle (median of 200):
 *     by then every thread on rgpu's way that polls for work (the
 *     session's, the launch thread, 50 us by default) sleeps, as for the
 *     first launch of a request to a server that idled;
 *   - a small pageable copy: 4 KiB cuMemcpyHtoDAsync from malloc'ed memory
 *     on an idle queue (median of 2000, each after a synchronize);
 *   - --mib MiB from and into malloc'ed (pageable) memory, best of
 *     --repeats;
 *   - host-to-device and device-to-host bandwidth: --mib MiB from
 *     cuMemAllocHost memory, best of --repeats;
 *   - queries (median of 200): cuEventRecord + cuEventQuery, and
 *     cuStreamQuery, on an idle queue and behind 200 queued empty launches
 *     (behind them also the 10th and 90th percentiles and how many
 *     answered NOT_READY).
 * Targets (issue 9): sync within 0.5 us of native, launches >= 95% of
 * native in each run, graph replay >= 95% of native (issue 10), small
 * pageable copy <= 1.2x native, pinned bandwidth >= 99% of native,
 * pageable bandwidth >= native, queries <= 1.5x native. */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rgpu_cuda.h"

/* Graph handles: rgpu_cuda.h declares no graph API (the bench reaches it
 * through dlsym only). */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

struct api {
    const char *label;
    void *lib;
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*primary_ctx_release)(CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_alloc_host)(void **, size_t);
    CUresult (*mem_free_host)(void *);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*memcpy_htod_async)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*module_load_data)(CUmodule *, const void *);
    CUresult (*module_unload)(CUmodule);
    CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_destroy)(CUevent);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
    CUresult (*stream_query)(CUstream);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*stream_begin_capture)(CUstream, int);
    CUresult (*stream_end_capture)(CUstream, CUgraph *);
    CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*graph_exec_destroy)(CUgraphExec);
    CUresult (*graph_destroy)(CUgraph);
};

#define LAUNCH_RUNS 5
#define LATENCY_SAMPLES 2000
#define IDLE_SAMPLES 200
#define IDLE_GAP_NS 1000000L
/* Graph replay: kernels captured into the graph, and timed graph launches. */
#define GRAPH_KERNELS 100
#define GRAPH_LAUNCHES 1000
/* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: the bench has one thread. */
#define CAPTURE_MODE_THREAD_LOCAL 1

/* A query row's spread: percentiles (us) and NOT_READY answers. */
struct spread {
    double p10_us, p90_us;
    int not_ready;
};

struct results {
    int valid;
    char device[256];
    double sync_median_us;
    double sync_mean_us;
    /* The same once the context has launched kernels. */
    double sync_used_median_us;
    double launches_per_s;
    double launch_runs[LAUNCH_RUNS];
    double launch_gpu_runs[LAUNCH_RUNS];
    double graph_kernels_per_s;
    double launch_sync_us;
    double idle_launch_sync_us;
    double small_pageable_us;
    double htod_pageable_gbps;
    double dtoh_pageable_gbps;
    double htod_gbps;
    double dtoh_gbps;
    double event_idle_us;
    double event_queued_us;
    double stream_idle_us;
    double stream_queued_us;
    /* Behind queued work: the 10th and 90th percentiles and how many of
     * the samples answered NOT_READY (event, then stream). */
    struct spread queued_spread[2];
};

struct config {
    const char *native_path;
    const char *rgpu_path;
    const char *ptx_path;
    long sync_iters;
    long launches;
    long mib;
    long repeats;
    long launch_blocks;
    /* The rgpu side's blocks in turn come from a second thread. */
    int rgpu_side_thread;
    /* CPUs for the runs in turn: the driver's calls, the rgpu side's
     * caller (-1: unpinned). */
    int driver_cpu;
    int caller_cpu;
};

/* Confines the calling thread to `cpu` (-1: leaves it be). */
static int pin_to(int cpu) {
    if (cpu < 0) return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) == 0) return 0;
    perror("rgpu_bench: sched_setaffinity");
    return -1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define RESOLVE(field, name)                                                          \
    do {                                                                              \
        *(void **)(&a->field) = dlsym(a->lib, name);                                  \
        if (!a->field) {                                                              \
            fprintf(stderr, "%s: %s has no %s\n", a->label, path, name);              \
            return -1;                                                                \
        }                                                                             \
    } while (0)

static int load_api(struct api *a, const char *label, const char *path) {
    memset(a, 0, sizeof *a);
    a->label = label;
    a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        fprintf(stderr, "%s: dlopen %s: %s\n", label, path, dlerror());
        return -1;
    }
    RESOLVE(init, "cuInit");
    RESOLVE(device_get, "cuDeviceGet");
    RESOLVE(device_get_name, "cuDeviceGetName");
    RESOLVE(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    RESOLVE(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
    RESOLVE(ctx_set_current, "cuCtxSetCurrent");
    RESOLVE(ctx_synchronize, "cuCtxSynchronize");
    RESOLVE(mem_alloc, "cuMemAlloc_v2");
    RESOLVE(mem_free, "cuMemFree_v2");
    RESOLVE(mem_alloc_host, "cuMemAllocHost_v2");
    RESOLVE(mem_free_host, "cuMemFreeHost");
    RESOLVE(memcpy_htod, "cuMemcpyHtoD_v2");
    RESOLVE(memcpy_dtoh, "cuMemcpyDtoH_v2");
    RESOLVE(memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
    RESOLVE(module_load_data, "cuModuleLoadData");
    RESOLVE(module_unload, "cuModuleUnload");
    RESOLVE(module_get_function, "cuModuleGetFunction");
    RESOLVE(launch_kernel, "cuLaunchKernel");
    RESOLVE(event_create, "cuEventCreate");
    RESOLVE(event_destroy, "cuEventDestroy_v2");
    RESOLVE(event_record, "cuEventRecord");
    RESOLVE(event_query, "cuEventQuery");
    RESOLVE(event_elapsed, "cuEventElapsedTime");
    RESOLVE(stream_query, "cuStreamQuery");
    RESOLVE(stream_create, "cuStreamCreate");
    RESOLVE(stream_destroy, "cuStreamDestroy_v2");
    RESOLVE(stream_synchronize, "cuStreamSynchronize");
    RESOLVE(stream_begin_capture, "cuStreamBeginCapture_v2");
    RESOLVE(stream_end_capture, "cuStreamEndCapture");
    RESOLVE(graph_instantiate, "cuGraphInstantiateWithFlags");
    RESOLVE(graph_launch, "cuGraphLaunch");
    RESOLVE(graph_exec_destroy, "cuGraphExecDestroy");
    RESOLVE(graph_destroy, "cuGraphDestroy");
    return 0;
}

#define CALL(expr)                                                                   \
    do {                                                                             \
        CUresult rc_ = (expr);                                                       \
        if (rc_ != CUDA_SUCCESS) {                                                   \
            fprintf(stderr, "%s: %s failed with %d\n", a->label, #expr, rc_);        \
            goto out;                                                                \
        }                                                                            \
    } while (0)

#define QUERY_SAMPLES 200
#define QUEUED_LAUNCHES 200

/* Median time (us) of one query (an event record + query, or a stream
 * query) after `queued` empty launches, each sample after a synchronize.
 * A query may answer NOT_READY: only its time counts. With `spread`, its
 * percentiles and NOT_READY count too. -1 on an error. */
static double query_median(struct api *a, CUfunction empty, CUevent event, int use_event,
                           int queued, struct spread *spread) {
    double samples[QUERY_SAMPLES];
    int not_ready = 0;
    for (int i = 0; i < QUERY_SAMPLES; i++) {
        if (a->ctx_synchronize() != CUDA_SUCCESS) return -1;
        for (int k = 0; k < queued; k++)
            if (a->launch_kernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
                return -1;
        double t0 = now_s();
        CUresult rc = use_event ? a->event_record(event, NULL) : CUDA_SUCCESS;
        if (rc == CUDA_SUCCESS) rc = use_event ? a->event_query(event) : a->stream_query(NULL);
        samples[i] = (now_s() - t0) * 1e6;
        if (rc == CUDA_ERROR_NOT_READY) not_ready++;
        else if (rc != CUDA_SUCCESS) return -1;
    }
    if (a->ctx_synchronize() != CUDA_SUCCESS) return -1;
    qsort(samples, QUERY_SAMPLES, sizeof *samples, compare_doubles);
    if (spread) {
        spread->p10_us = samples[QUERY_SAMPLES / 10];
        spread->p90_us = samples[QUERY_SAMPLES * 9 / 10];
        spread->not_ready = not_ready;
    }
    return samples[QUERY_SAMPLES / 2];
}

/* The median and mean (us) of `iters` idle synchronizations, after 1000
 * untimed; `samples` holds `iters`. Nonzero on an error. */
static int sync_median(struct api *a, long iters, double *samples, double *median, double *mean) {
    for (int i = 0; i < 1000; i++)
        if (a->ctx_synchronize() != CUDA_SUCCESS) return -1;
    double sum = 0;
    for (long i = 0; i < iters; i++) {
        double t0 = now_s();
        if (a->ctx_synchronize() != CUDA_SUCCESS) return -1;
        samples[i] = (now_s() - t0) * 1e6;
        sum += samples[i];
    }
    qsort(samples, (size_t)iters, sizeof *samples, compare_doubles);
    *median = samples[iters / 2];
    *mean = sum / (double)iters;
    return 0;
}

/* Median time (us) of one rgpu_empty launch and cuCtxSynchronize, of
 * `count` (into `samples`), each after `gap_ns` idle (0: back to back). */
static int launch_sync_median(struct api *a, CUfunction f, int count, long gap_ns, double *samples,
                              double *median) {
    for (int i = 0; i < count; i++) {
        struct timespec gap = {0, gap_ns};
        if (gap_ns > 0) nanosleep(&gap, NULL);
        double t0 = now_s();
        if (a->launch_kernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS ||
            a->ctx_synchronize() != CUDA_SUCCESS)
            return -1;
        samples[i] = (now_s() - t0) * 1e6;
    }
    qsort(samples, (size_t)count, sizeof *samples, compare_doubles);
    *median = samples[count / 2];
    return 0;
}

static int measure(struct api *a, const struct config *c, const char *ptx, struct results *r) {
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CUmodule module = NULL;
    CUfunction empty = NULL;
    CUdeviceptr d = 0;
    void *pinned = NULL;
    char *pageable = NULL;
    CUevent event = NULL, launch_start = NULL, launch_end = NULL;
    CUstream stream = NULL;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    double *samples = NULL;
    const size_t bytes = (size_t)c->mib << 20;
    int status = -1;

    memset(r, 0, sizeof *r);
    CALL(a->init(0));
    CALL(a->device_get(&dev, 0));
    CALL(a->device_get_name(r->device, (int)sizeof r->device, dev));
    CALL(a->primary_ctx_retain(&ctx, dev));
    CALL(a->ctx_set_current(ctx));

    /* Synchronous round trip on an idle context, before it ran anything. */
    samples = malloc(sizeof *samples * (size_t)c->sync_iters);
    if (!samples) goto out;
    if (sync_median(a, c->sync_iters, samples, &r->sync_median_us, &r->sync_mean_us)) {
        fprintf(stderr, "%s: a synchronize failed\n", a->label);
        goto out;
    }

    /* Empty-kernel launches, then one synchronize. */
    CALL(a->module_load_data(&module, ptx));
    CALL(a->module_get_function(&empty, module, "rgpu_empty"));
    for (int i = 0; i < 1000; i++) CALL(a->launch_kernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CALL(a->ctx_synchronize());
    /* The GPU's own rate too (events around the run): where it is the
     * wall rate, the GPU is what bounds launches, not the CPU. */
    CALL(a->event_create(&launch_start, 0));
    CALL(a->event_create(&launch_end, 0));
    for (int run = 0; run < LAUNCH_RUNS; run++) {
        double t0 = now_s();
        CALL(a->event_record(launch_start, NULL));
        for (long i = 0; i < c->launches; i++)
            CALL(a->launch_kernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CALL(a->event_record(launch_end, NULL));
        CALL(a->ctx_synchronize());
        r->launch_runs[run] = (double)c->launches / (now_s() - t0);
        float gpu_ms = 0;
        CALL(a->event_elapsed(&gpu_ms, launch_start, launch_end));
        r->launch_gpu_runs[run] = gpu_ms > 0 ? (double)c->launches / (gpu_ms * 1e-3) : 0;
        if (r->launch_runs[run] > r->launches_per_s) r->launches_per_s = r->launch_runs[run];
    }

    /* Graph replay: empty launches captured on a stream of its own, the
     * graph launched once untimed (first-launch upload), then timed. */
    CALL(a->stream_create(&stream, 0));
    CALL(a->stream_begin_capture(stream, CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < GRAPH_KERNELS; i++)
        CALL(a->launch_kernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
    CALL(a->stream_end_capture(stream, &graph));
    CALL(a->graph_instantiate(&exec, graph, 0));
    CALL(a->graph_launch(exec, stream));
    CALL(a->stream_synchronize(stream));
    {
        double t0 = now_s();
        for (int i = 0; i < GRAPH_LAUNCHES; i++) CALL(a->graph_launch(exec, stream));
        CALL(a->stream_synchronize(stream));
        r->graph_kernels_per_s = (double)GRAPH_KERNELS * GRAPH_LAUNCHES / (now_s() - t0);
    }
    {
        /* Cleared first: a handle whose destroy fails is not destroyed
         * again at `out`. */
        CUgraphExec e = exec;
        CUgraph g = graph;
        CUstream s = stream;
        exec = NULL;
        graph = NULL;
        stream = NULL;
        CALL(a->graph_exec_destroy(e));
        CALL(a->graph_destroy(g));
        CALL(a->stream_destroy(s));
    }

    /* Launch + synchronize, and a small pageable copy on an idle queue. */
    {
        double lat[LATENCY_SAMPLES];
        if (launch_sync_median(a, empty, LATENCY_SAMPLES, 0, lat, &r->launch_sync_us) ||
            launch_sync_median(a, empty, IDLE_SAMPLES, IDLE_GAP_NS, lat, &r->idle_launch_sync_us)) {
            fprintf(stderr, "%s: a launch + synchronize failed\n", a->label);
            goto out;
        }
        char small[4096];
        memset(small, 0x3c, sizeof small);
        CALL(a->mem_alloc(&d, bytes > sizeof small ? bytes : sizeof small));
        for (int i = 0; i < LATENCY_SAMPLES; i++) {
            CALL(a->ctx_synchronize());
            double t0 = now_s();
            CALL(a->memcpy_htod_async(d, small, sizeof small, NULL));
            lat[i] = (now_s() - t0) * 1e6;
        }
        CALL(a->ctx_synchronize());
        qsort(lat, LATENCY_SAMPLES, sizeof *lat, compare_doubles);
        r->small_pageable_us = lat[LATENCY_SAMPLES / 2];
    }

    /* The synchronous round trip again, now that the context has run
     * kernels: the driver's own idle synchronize costs more from then on. */
    {
        double mean_unused;
        if (sync_median(a, c->sync_iters, samples, &r->sync_used_median_us, &mean_unused)) {
            fprintf(stderr, "%s: a synchronize failed\n", a->label);
            goto out;
        }
    }

    /* Queries, idle and behind queued launches. */
    CALL(a->event_create(&event, 0x2 /* CU_EVENT_DISABLE_TIMING */));
    r->event_idle_us = query_median(a, empty, event, 1, 0, NULL);
    r->event_queued_us = query_median(a, empty, event, 1, QUEUED_LAUNCHES, &r->queued_spread[0]);
    r->stream_idle_us = query_median(a, empty, event, 0, 0, NULL);
    r->stream_queued_us = query_median(a, empty, event, 0, QUEUED_LAUNCHES, &r->queued_spread[1]);
    if (r->event_idle_us < 0 || r->event_queued_us < 0 || r->stream_idle_us < 0 ||
        r->stream_queued_us < 0) {
        fprintf(stderr, "%s: a query failed\n", a->label);
        goto out;
    }

    /* Bandwidth from and into pageable, then pinned, host memory. */
    pageable = malloc(bytes);
    if (!pageable) goto out;
    memset(pageable, 0x5a, bytes);
    for (long i = 0; i < c->repeats; i++) {
        double t0 = now_s();
        CALL(a->memcpy_htod(d, pageable, bytes));
        CALL(a->ctx_synchronize());
        double gbps = (double)bytes / (now_s() - t0) / 1e9;
        if (gbps > r->htod_pageable_gbps) r->htod_pageable_gbps = gbps;
    }
    for (long i = 0; i < c->repeats; i++) {
        double t0 = now_s();
        CALL(a->memcpy_dtoh(pageable, d, bytes));
        double gbps = (double)bytes / (now_s() - t0) / 1e9;
        if (gbps > r->dtoh_pageable_gbps) r->dtoh_pageable_gbps = gbps;
    }
    CALL(a->mem_alloc_host(&pinned, bytes));
    memset(pinned, 0x5a, bytes);
    CALL(a->memcpy_htod(d, pinned, bytes));
    CALL(a->ctx_synchronize());
    for (long i = 0; i < c->repeats; i++) {
        double t0 = now_s();
        CALL(a->memcpy_htod(d, pinned, bytes));
        CALL(a->ctx_synchronize());
        double gbps = (double)bytes / (now_s() - t0) / 1e9;
        if (gbps > r->htod_gbps) r->htod_gbps = gbps;
    }
    for (long i = 0; i < c->repeats; i++) {
        double t0 = now_s();
        CALL(a->memcpy_dtoh(pinned, d, bytes));
        CALL(a->ctx_synchronize());
        double gbps = (double)bytes / (now_s() - t0) / 1e9;
        if (gbps > r->dtoh_gbps) r->dtoh_gbps = gbps;
    }
    r->valid = 1;
    status = 0;

out:
    free(pageable);
    if (event) a->event_destroy(event);
    if (launch_start) a->event_destroy(launch_start);
    if (launch_end) a->event_destroy(launch_end);
    if (exec) a->graph_exec_destroy(exec);
    if (graph) a->graph_destroy(graph);
    if (stream) a->stream_destroy(stream);
    if (pinned) a->mem_free_host(pinned);
    if (d) a->mem_free(d);
    if (module) a->module_unload(module);
    if (ctx) a->primary_ctx_release(dev);
    free(samples);
    return status;
}

/* `count` launches of `f` and a synchronize, timed (seconds). */
static int launch_block(struct api *a, CUfunction f, long count, double *seconds) {
    double t0 = now_s();
    for (long i = 0; i < count; i++)
        if (a->launch_kernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) return -1;
    if (a->ctx_synchronize() != CUDA_SUCCESS) return -1;
    *seconds = now_s() - t0;
    return 0;
}

/* A second thread that runs one side's blocks when asked
 * (--rgpu-side-launcher thread). */
enum helper_state { HELPER_IDLE, HELPER_POSTED, HELPER_DONE, HELPER_QUIT };
struct helper {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    enum helper_state state;
    struct api *a;
    CUcontext ctx;
    CUfunction f;
    /* The CPU it runs on (-1: any). */
    int cpu;
    long count;
    double seconds;
    int status;
};

static void *helper_main(void *arg) {
    struct helper *h = arg;
    int current = 0;
    int pinned = pin_to(h->cpu) == 0;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (h->state == HELPER_IDLE || h->state == HELPER_DONE)
            pthread_cond_wait(&h->changed, &h->lock);
        if (h->state == HELPER_QUIT) break;
        pthread_mutex_unlock(&h->lock);
        double seconds = 0;
        if (!current) current = h->a->ctx_set_current(h->ctx) == CUDA_SUCCESS;
        int status = current && pinned ? launch_block(h->a, h->f, h->count, &seconds) : -1;
        pthread_mutex_lock(&h->lock);
        h->status = status;
        h->seconds = seconds;
        h->state = HELPER_DONE;
        pthread_cond_broadcast(&h->changed);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

/* One block on the helper thread; its own timing. */
static int helper_block(struct helper *h, long count, double *seconds) {
    pthread_mutex_lock(&h->lock);
    h->count = count;
    h->state = HELPER_POSTED;
    pthread_cond_broadcast(&h->changed);
    while (h->state != HELPER_DONE) pthread_cond_wait(&h->changed, &h->lock);
    h->state = HELPER_IDLE;
    int status = h->status;
    *seconds = h->seconds;
    pthread_mutex_unlock(&h->lock);
    return status;
}

static void helper_stop(struct helper *h) {
    pthread_mutex_lock(&h->lock);
    h->state = HELPER_QUIT;
    pthread_cond_broadcast(&h->changed);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->changed);
    pthread_mutex_destroy(&h->lock);
}

/* Launch runs of both sides taken in turn, interleaved block by block: in
 * measure() a side's five runs come a minute after the other's, and the
 * host's own launch rate drifts by 15% in that time; runs of 100000
 * launches taken one after the other still differed by up to 10% between
 * two runs of the driver itself. */
static int launches_in_turn(struct api *sides[2], const struct config *c, const char *ptx,
                            double runs[2][LAUNCH_RUNS]) {
    CUdevice dev[2] = {0, 0};
    CUcontext ctx[2] = {NULL, NULL};
    CUmodule module[2] = {NULL, NULL};
    CUfunction empty[2] = {NULL, NULL};
    struct api *a = sides[0];
    int status = -1;
    struct helper helper = {.state = HELPER_IDLE};
    int helper_started = 0;
    /* The thread's CPUs before the runs pinned it, given back after. */
    cpu_set_t unpinned;
    int restore = 0;
    for (int s = 0; s < 2; s++) {
        a = sides[s];
        CALL(a->init(0));
        CALL(a->device_get(&dev[s], 0));
        CALL(a->primary_ctx_retain(&ctx[s], dev[s]));
        CALL(a->ctx_set_current(ctx[s]));
        CALL(a->module_load_data(&module[s], ptx));
        CALL(a->module_get_function(&empty[s], module[s], "rgpu_empty"));
        for (int i = 0; i < 1000; i++)
            CALL(a->launch_kernel(empty[s], 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CALL(a->ctx_synchronize());
    }
    helper.a = sides[1];
    helper.ctx = ctx[1];
    helper.f = empty[1];
    helper.cpu = c->driver_cpu;
    restore = c->driver_cpu >= 0 && sched_getaffinity(0, sizeof unpinned, &unpinned) == 0;
    if (c->rgpu_side_thread) {
        pthread_mutex_init(&helper.lock, NULL);
        pthread_cond_init(&helper.changed, NULL);
        if (pthread_create(&helper.thread, NULL, helper_main, &helper)) goto out;
        helper_started = 1;
    }
    for (int run = 0; run < LAUNCH_RUNS; run++) {
        double seconds[2] = {0, 0};
        for (long block = 0; block < c->launch_blocks; block++) {
            /* The last block takes what the division leaves. */
            long count = c->launches / c->launch_blocks;
            if (block == c->launch_blocks - 1) count = c->launches - count * block;
            for (int turn = 0; turn < 2; turn++) {
                int s = block % 2 == 0 ? turn : 1 - turn;
                double took = 0;
                if (pin_to(s == 0 ? c->driver_cpu : c->caller_cpu)) goto out;
                int failed = s == 1 && helper_started ? helper_block(&helper, count, &took)
                                                      : launch_block(sides[s], empty[s], count, &took);
                if (failed) {
                    fprintf(stderr, "%s: a block of launches failed\n", sides[s]->label);
                    goto out;
                }
                seconds[s] += took;
            }
        }
        for (int s = 0; s < 2; s++) runs[s][run] = (double)c->launches / seconds[s];
    }
    status = 0;
out:
    if (restore) sched_setaffinity(0, sizeof unpinned, &unpinned);
    if (helper_started) helper_stop(&helper);
    for (int s = 0; s < 2; s++) {
        if (module[s]) sides[s]->module_unload(module[s]);
        if (ctx[s]) sides[s]->primary_ctx_release(dev[s]);
    }
    return status;
}

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

static void print_value(double v, int valid, const char *format) {
    if (valid) printf(format, v);
    else printf(" %13s", "-");
}

/* How a row's relation is judged. */
enum relation { HIGHER_RATIO, DIFFERENCE, LOWER_RATIO };

/* One row: native, rgpu, their relation, the target and whether it is met.
 * DIFFERENCE rows compare rgpu - native against `limit` (lower is better);
 * HIGHER_RATIO rows rgpu / native against `limit` (higher is better),
 * LOWER_RATIO rows rgpu / native (lower is better). */
static void row(const char *metric, double native, double rgpu, const struct results *n,
                const struct results *g, enum relation kind, double limit, const char *target) {
    printf("%-38s", metric);
    print_value(native, n->valid, " %13.2f");
    print_value(rgpu, g->valid, " %13.2f");
    if (n->valid && g->valid) {
        int difference = kind == DIFFERENCE;
        double relation = difference ? rgpu - native : rgpu / native;
        int met = kind == HIGHER_RATIO ? relation >= limit : relation <= limit;
        printf(difference ? " %+11.2fus" : " %13.3f", relation);
        /* A row without a limit is reported, not judged. */
        printf("   %-26s %s\n", target, limit == 0 ? "" : met ? "met" : "NOT MET");
    } else {
        printf(" %13s   %-26s\n", "-", target);
    }
}

static int parse_cpu(const char *text, int *out) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 0 || v >= CPU_SETSIZE) return -1;
    *out = (int)v;
    return 0;
}

static int parse_long(const char *text, long *out) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    struct config c = {NULL, NULL, NULL, 10000, 100000, 256, 5, 10, 0, -1, -1};
    struct api native_api, rgpu_api;
    struct results native = {0}, rgpu = {0};
    char *ptx;

    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        int bad = 0;
        if (!strcmp(k, "--native")) c.native_path = v;
        else if (!strcmp(k, "--rgpu")) c.rgpu_path = v;
        else if (!strcmp(k, "--ptx")) c.ptx_path = v;
        else if (!strcmp(k, "--sync-iters")) bad = parse_long(v, &c.sync_iters);
        else if (!strcmp(k, "--launches")) bad = parse_long(v, &c.launches);
        else if (!strcmp(k, "--mib")) bad = parse_long(v, &c.mib);
        else if (!strcmp(k, "--repeats")) bad = parse_long(v, &c.repeats);
        else if (!strcmp(k, "--launch-blocks")) bad = parse_long(v, &c.launch_blocks);
        else if (!strcmp(k, "--driver-cpu")) bad = parse_cpu(v, &c.driver_cpu);
        else if (!strcmp(k, "--caller-cpu")) bad = parse_cpu(v, &c.caller_cpu);
        else if (!strcmp(k, "--rgpu-side-launcher")) {
            c.rgpu_side_thread = !strcmp(v, "thread");
            bad = !c.rgpu_side_thread && strcmp(v, "caller");
        }
        else bad = 1;
        if (bad) {
            fprintf(stderr, "rgpu_bench: bad option %s %s\n", k, v);
            return 2;
        }
    }
    if ((c.driver_cpu < 0) != (c.caller_cpu < 0) || (c.driver_cpu >= 0 && c.driver_cpu == c.caller_cpu)) {
        fprintf(stderr, "rgpu_bench: --driver-cpu and --caller-cpu go together, two CPUs\n");
        return 2;
    }
    if (c.launch_blocks > c.launches) {
        fprintf(stderr, "rgpu_bench: --launch-blocks %ld is more than --launches %ld\n",
                c.launch_blocks, c.launches);
        return 2;
    }
    if (argc % 2 == 0 || !c.ptx_path || (!c.native_path && !c.rgpu_path)) {
        fprintf(stderr,
                "usage: %s [--native LIBCUDA] [--rgpu LIBCUDA] --ptx reference_kernels.ptx "
                "[--sync-iters N] [--launches N] [--mib N] [--repeats N] [--launch-blocks N]\n"
                "       [--rgpu-side-launcher caller|thread] [--driver-cpu K --caller-cpu M]\n",
                argv[0]);
        return 2;
    }
    ptx = read_file(c.ptx_path);
    if (!ptx) {
        fprintf(stderr, "rgpu_bench: cannot read %s\n", c.ptx_path);
        return 2;
    }

    int failed = 0;
    if (c.native_path) {
        if (load_api(&native_api, "native", c.native_path) || measure(&native_api, &c, ptx, &native))
            failed = 1;
    }
    if (c.rgpu_path) {
        if (load_api(&rgpu_api, "rgpu", c.rgpu_path) || measure(&rgpu_api, &c, ptx, &rgpu))
            failed = 1;
    }
    double in_turn[2][LAUNCH_RUNS];
    int have_in_turn = 0;
    if (native.valid && rgpu.valid) {
        struct api *sides[2] = {&native_api, &rgpu_api};
        have_in_turn = launches_in_turn(sides, &c, ptx, in_turn) == 0;
        if (!have_in_turn) failed = 1;
    }
    free(ptx);

    printf("rgpu_bench: device %s; %ld sync calls, %ld launches, %ld MiB copies (best of %ld)\n",
           native.valid ? native.device : rgpu.device, c.sync_iters, c.launches, c.mib, c.repeats);
    printf("%-38s %13s %13s %13s   %-26s %s\n", "metric", "native", "rgpu", "rgpu vs nat",
           "target", "verdict");
    row("sync round trip, median (us)", native.sync_median_us, rgpu.sync_median_us, &native, &rgpu,
        DIFFERENCE, 0.5, "within 0.5 us of native");
    row("sync round trip, mean (us)", native.sync_mean_us, rgpu.sync_mean_us, &native, &rgpu,
        DIFFERENCE, 0.5, "within 0.5 us of native");
    row("sync, after kernels ran, median (us)", native.sync_used_median_us,
        rgpu.sync_used_median_us, &native, &rgpu, DIFFERENCE, 0.5, "within 0.5 us of native");
    row("empty-kernel launches, best (1/s)", native.launches_per_s, rgpu.launches_per_s, &native,
        &rgpu, HIGHER_RATIO, 0.95, ">= 95% of native");
    {
        /* The worst of five runs taken in turn, each against the native
         * run interleaved with it. */
        double worst = 0, worst_native = 0, worst_rgpu = 0;
        for (int i = 0; i < LAUNCH_RUNS && have_in_turn; i++) {
            double ratio = in_turn[1][i] / in_turn[0][i];
            if (i == 0 || ratio < worst) {
                worst = ratio;
                worst_native = in_turn[0][i];
                worst_rgpu = in_turn[1][i];
            }
        }
        row("empty-kernel launches, worst run", worst_native, worst_rgpu, &native, &rgpu,
            HIGHER_RATIO, 0.95, ">= 95% of native, each run");
        if (have_in_turn) {
            printf("  runs in turn (native/rgpu%s", c.rgpu_side_thread ? " from a second thread" : "");
            if (c.driver_cpu >= 0)
                printf(", driver on CPU %d, rgpu caller on %d", c.driver_cpu, c.caller_cpu);
            printf(", 1/s):");
            for (int i = 0; i < LAUNCH_RUNS; i++) printf(" %.0f/%.0f", in_turn[0][i], in_turn[1][i]);
            printf("\n");
        }
    }
    {
        /* Each side's GPU rate in the run where its wall rate was best. */
        double gpu_native = 0, gpu_rgpu = 0;
        for (int i = 0; i < LAUNCH_RUNS; i++) {
            if (native.launch_runs[i] == native.launches_per_s) gpu_native = native.launch_gpu_runs[i];
            if (rgpu.launch_runs[i] == rgpu.launches_per_s) gpu_rgpu = rgpu.launch_gpu_runs[i];
        }
        row("launches, GPU's own rate (1/s)", gpu_native, gpu_rgpu, &native, &rgpu, HIGHER_RATIO,
            0, "(reported: = wall rate when GPU-bound)");
    }
    row("graph replay, 100 kernels (kernels/s)", native.graph_kernels_per_s,
        rgpu.graph_kernels_per_s, &native, &rgpu, HIGHER_RATIO, 0.95, ">= 95% of native");
    row("launch + synchronize (us)", native.launch_sync_us, rgpu.launch_sync_us, &native, &rgpu,
        LOWER_RATIO, 0, "(reported)");
    row("launch + sync after 1 ms idle (us)", native.idle_launch_sync_us,
        rgpu.idle_launch_sync_us, &native, &rgpu, LOWER_RATIO, 0, "(reported)");
    row("4 KiB pageable copy (us)", native.small_pageable_us, rgpu.small_pageable_us, &native,
        &rgpu, LOWER_RATIO, 1.2, "<= 1.2x native");
    row("HtoD from pinned (GB/s)", native.htod_gbps, rgpu.htod_gbps, &native, &rgpu, HIGHER_RATIO,
        0.99, ">= 99% of native");
    row("DtoH into pinned (GB/s)", native.dtoh_gbps, rgpu.dtoh_gbps, &native, &rgpu, HIGHER_RATIO,
        0.99, ">= 99% of native");
    row("HtoD from pageable (GB/s)", native.htod_pageable_gbps, rgpu.htod_pageable_gbps, &native,
        &rgpu, HIGHER_RATIO, 1.0, ">= native");
    row("DtoH into pageable (GB/s)", native.dtoh_pageable_gbps, rgpu.dtoh_pageable_gbps, &native,
        &rgpu, HIGHER_RATIO, 1.0, ">= native");
    row("event record+query, idle (us)", native.event_idle_us, rgpu.event_idle_us, &native, &rgpu,
        LOWER_RATIO, 1.5, "<= 1.5x native");
    row("event record+query, queued (us)", native.event_queued_us, rgpu.event_queued_us, &native,
        &rgpu, LOWER_RATIO, 1.5, "<= 1.5x native");
    row("stream query, idle (us)", native.stream_idle_us, rgpu.stream_idle_us, &native, &rgpu,
        LOWER_RATIO, 1.5, "<= 1.5x native");
    row("stream query, queued (us)", native.stream_queued_us, rgpu.stream_queued_us, &native,
        &rgpu, LOWER_RATIO, 1.5, "<= 1.5x native");
    {
        const struct results *sides[2] = {&native, &rgpu};
        const char *names[2] = {"native", "rgpu"};
        printf("  behind queued work, p10/p50/p90 us (NOT_READY of %d):", QUERY_SAMPLES);
        for (int s = 0; s < 2; s++) {
            if (!sides[s]->valid) continue;
            const struct spread *e = &sides[s]->queued_spread[0], *q = &sides[s]->queued_spread[1];
            printf(" %s event %.2f/%.2f/%.2f (%d), stream %.2f/%.2f/%.2f (%d);", names[s],
                   e->p10_us, sides[s]->event_queued_us, e->p90_us, e->not_ready, q->p10_us,
                   sides[s]->stream_queued_us, q->p90_us, q->not_ready);
        }
        printf("\n");
    }
    return failed;
}
