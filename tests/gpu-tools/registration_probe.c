/* Measurements behind rgpu's DMA registration (docs/ARCHITECTURE.md §5),
 * against NVIDIA's driver on the GPU host only (gcc ... -lcuda, cuda.h).
 *
 *   registration_probe reach FLAGS CTX MODE PTX
 *       registers 1 MiB of host memory holding a secret in context A with
 *       FLAGS (none|portable|devicemap|both), then reads it by its host
 *       address from context CTX (same: A; other: a second context B) with
 *       MODE (copy: cuMemcpyDtoD; kernel: rgpu_vector_add from PTX). Prints
 *       "reach FLAGS CTX MODE: rc N secret yes|no". A kernel fault poisons
 *       the process: run one probe per process.
 *   registration_probe cost MIB
 *       maps MIB MiB of a memfd three ways into one virtual range, as a
 *       worker maps a guest blob: contiguous, 2 MiB pieces in shuffled
 *       order, 4 KiB pages in shuffled order; for each prints the mapping
 *       time, cuMemHostRegister and cuMemHostUnregister times, and HtoD and
 *       DtoH bandwidth of one copy of the whole range (timed with events).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SECRET 1234.5f
#define PROBE_BYTES (1u << 20)
#define FLOATS 1024

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *name(CUresult rc) {
    const char *n = NULL;
    return cuGetErrorName(rc, &n) == CUDA_SUCCESS && n ? n : "?";
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(size + 1);
    if (text && fread(text, 1, size, f) == (size_t)size) text[size] = 0;
    fclose(f);
    return text;
}

static int reach(const char *flags_name, const char *ctx_name, const char *mode, const char *ptx) {
    unsigned flags = 0;
    if (!strcmp(flags_name, "portable")) flags = CU_MEMHOSTREGISTER_PORTABLE;
    else if (!strcmp(flags_name, "devicemap")) flags = CU_MEMHOSTREGISTER_DEVICEMAP;
    else if (!strcmp(flags_name, "both"))
        flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
    else if (strcmp(flags_name, "none")) return 2;
    CUdevice dev;
    CUcontext a, b;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate(&a, NULL, 0, dev) ||
        cuCtxCreate(&b, NULL, 0, dev))
        return 1;
    float *host = aligned_alloc(4096, PROBE_BYTES);
    for (size_t i = 0; i < PROBE_BYTES / sizeof(float); i++) host[i] = SECRET;
    cuCtxSetCurrent(a);
    CUresult rc = cuMemHostRegister(host, PROBE_BYTES, flags);
    if (rc) {
        printf("reach %s %s %s: register rc %d %s\n", flags_name, ctx_name, mode, rc, name(rc));
        return 0;
    }
    cuCtxSetCurrent(strcmp(ctx_name, "other") ? a : b);
    CUdeviceptr out = 0, zeros = 0;
    float back[FLOATS];
    memset(back, 0, sizeof back);
    cuMemAlloc(&out, sizeof back);
    cuMemAlloc(&zeros, sizeof back);
    cuMemsetD32(zeros, 0, FLOATS);
    cuMemsetD32(out, 0, FLOATS);
    CUdeviceptr src = (CUdeviceptr)(uintptr_t)host;
    if (!strcmp(mode, "copy")) {
        rc = cuMemcpyDtoD(out, src, sizeof back);
    } else {
        CUmodule module;
        CUfunction add;
        char *text = read_file(ptx);
        if (!text || cuModuleLoadData(&module, text) ||
            cuModuleGetFunction(&add, module, "rgpu_vector_add"))
            return 1;
        unsigned n = FLOATS;
        void *params[] = {&src, &zeros, &out, &n};
        rc = cuLaunchKernel(add, FLOATS / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL);
        if (!rc) rc = cuCtxSynchronize();
    }
    int seen = 0;
    if (!rc && !cuMemcpyDtoH(back, out, sizeof back))
        for (int i = 0; i < FLOATS; i++) seen += back[i] == SECRET;
    printf("reach %s %s %s: rc %d %s secret %s\n", flags_name, ctx_name, mode, rc, name(rc),
           seen == FLOATS ? "yes" : "no");
    return 0;
}

/* Maps `bytes` of `fd` into a fresh range in pieces of `piece` bytes, in a
 * shuffled order of file offsets (contiguous when piece == bytes). */
static char *map_pieces(int fd, size_t bytes, size_t piece, double *seconds) {
    double t0 = now();
    char *base = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return NULL;
    size_t count = bytes / piece;
    size_t *order = malloc(count * sizeof *order);
    for (size_t i = 0; i < count; i++) order[i] = i;
    srand(42);
    for (size_t i = count - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < count; i++) {
        if (mmap(base + i * piece, piece, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 (off_t)(order[i] * piece)) == MAP_FAILED) {
            printf("  mmap of piece %zu failed (vm.max_map_count?)\n", i);
            munmap(base, bytes);
            free(order);
            return NULL;
        }
    }
    free(order);
    *seconds = now() - t0;
    return base;
}

static int cost(size_t mib) {
    size_t bytes = mib << 20;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx))
        return 1;
    int fd = memfd_create("rgpu-probe", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)bytes)) return 1;
    CUdeviceptr dev_buf;
    if (cuMemAlloc(&dev_buf, bytes)) return 1;
    CUevent start, stop;
    cuEventCreate(&start, 0);
    cuEventCreate(&stop, 0);
    size_t pieces[] = {bytes, 2u << 20, 4096};
    const char *names[] = {"contiguous", "2 MiB pieces", "4 KiB pages"};
    for (int k = 0; k < 3; k++) {
        double map_s = 0;
        char *base = map_pieces(fd, bytes, pieces[k], &map_s);
        if (!base) {
            printf("cost %zu MiB %s: not mapped\n", mib, names[k]);
            continue;
        }
        memset(base, k + 1, bytes);
        double t0 = now();
        CUresult rc = cuMemHostRegister(base, bytes, CU_MEMHOSTREGISTER_PORTABLE);
        double reg_s = now() - t0;
        float htod_ms = 0, dtoh_ms = 0;
        if (!rc) {
            cuEventRecord(start, NULL);
            cuMemcpyHtoDAsync(dev_buf, base, bytes, NULL);
            cuEventRecord(stop, NULL);
            cuEventSynchronize(stop);
            cuEventElapsedTime(&htod_ms, start, stop);
            cuEventRecord(start, NULL);
            cuMemcpyDtoHAsync(base, dev_buf, bytes, NULL);
            cuEventRecord(stop, NULL);
            cuEventSynchronize(stop);
            cuEventElapsedTime(&dtoh_ms, start, stop);
        }
        t0 = now();
        if (!rc) cuMemHostUnregister(base);
        double unreg_s = now() - t0;
        printf("cost %zu MiB %s: %zu mappings in %.1f ms, register rc %d in %.1f ms, "
               "unregister %.1f ms, HtoD %.2f GB/s, DtoH %.2f GB/s\n",
               mib, names[k], bytes / pieces[k], map_s * 1e3, rc, reg_s * 1e3, unreg_s * 1e3,
               htod_ms > 0 ? bytes / (htod_ms * 1e6) : 0, dtoh_ms > 0 ? bytes / (dtoh_ms * 1e6) : 0);
        munmap(base, bytes);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "reach")) return reach(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 3 && !strcmp(argv[1], "cost")) return cost(strtoul(argv[2], NULL, 10));
    fprintf(stderr, "usage: %s reach FLAGS same|other copy|kernel PTX | cost MIB\n", argv[0]);
    return 2;
}
