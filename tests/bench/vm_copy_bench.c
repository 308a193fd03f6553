/* vm_copy_bench: pinned-memory copy bandwidth in a VM guest, from guest
 * pinned memory whose pages are contiguous or deliberately scattered
 * (issue 9, "scattered blob rows from the QEMU guest").
 *
 *   vm_copy_bench [--mib N] [--repeats N]
 *                 [--fragment MIB [--keep-pages K] [--hole-pages H]
 *                                 [--fragment-with pagetables|anon]]
 *                 [--label NAME]
 *
 * Allocates N MiB (default 256) with cuMemAllocHost (in VM mode: a
 * virtio-gpu guest blob, whose guest pages the host worker maps into one
 * contiguous range of its own), fills it with a pattern, and times
 * cuMemcpyHtoDAsync of it to the device, then cuMemcpyDtoHAsync back into
 * it (cleared first), with CUDA events recorded around each copy on the
 * stream (best of --repeats, default 5). Events time the copy on the host's
 * GPU: a guest under TCG runs its CPU slowly, the host's DMA not. The data
 * must round-trip: the pattern is compared after the last copy back.
 *
 * --fragment MIB first scatters the guest's free memory: it has the kernel
 * allocate MIB MiB of pages one by one, then releases H pages after every K
 * kept ones (default 1 and 1: every other page), keeping the rest for the
 * whole run. The kernel's free lists then hold single pages between held
 * ones, and order-0 allocations of the same migrate type take those first.
 * Release at least N MiB (MIB * H / (K + H) >= N) for the whole buffer to
 * be scattered. The bench and its helpers stay on one CPU until the buffer
 * is allocated: freed pages wait on the freeing CPU's per-CPU free list,
 * which another CPU's allocation does not see. The guest's /proc/buddyinfo
 * is printed before fragmenting and before the buffer is allocated (pages
 * on per-CPU free lists are not in it).
 *
 * Which pages: a virtio-gpu blob's pages are drm_gem_shmem pages, which
 * the kernel allocates unmovable (GFP_HIGHUSER, no __GFP_MOVABLE: they stay
 * pinned). Holes among movable pages (anonymous memory) do not scatter
 * them: an unmovable allocation that finds no unmovable free page steals
 * the largest free block of another type instead. So by default
 * (--fragment-with pagetables) the pages are page-table pages, unmovable
 * too: helper processes map a sparse read-only range and read one byte per
 * 2 MiB (each read faults in the zero page and one new page table), then
 * unmap the 2 MiB regions of the holes, which frees their page tables. Each
 * helper keeps at most 30000 mappings (the guest's vm.max_map_count is
 * 65530) and holds its page tables until the bench exits.
 * --fragment-with anon touches anonymous memory page by page instead
 * (MADV_NOHUGEPAGE) and releases the holes with MADV_DONTNEED: movable
 * holes, to show that they leave the blob contiguous.
 *
 * Output: "LABEL HtoD 53.12 GB/s (...)", "LABEL DtoH ...", and "LABEL data
 * check PASS" or "... FAIL"; LABEL is "contiguous", or "scattered" with
 * --fragment. Exit status 0 when every CUDA call succeeded and the data
 * check passed; a failing CUDA call prints the call and its code and exits
 * with 2, a failed data check with 1.
 *
 * Built like tests/programs' tests (tests/vm/build-initramfs.sh): cc -O2
 * -I tests/programs vm_copy_bench.c -lcuda, against guest-lib's libcuda.so
 * or NVIDIA's. */
#define _GNU_SOURCE

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rgpu_cuda.h"

static const char *label = NULL;

static const char *cu_name(CUresult rc) {
    const char *name = NULL;
    if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL) return "?";
    return name;
}

#define CU(call)                                                                               \
    do {                                                                                       \
        CUresult rc_ = (call);                                                                 \
        if (rc_ != CUDA_SUCCESS) {                                                             \
            printf("FAIL %s: %s returned %d (%s) at line %d\n", label, #call, (int)rc_,       \
                   cu_name(rc_), __LINE__);                                                    \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static long parse_long(const char *option, const char *value, long min) {
    char *end = NULL;
    long v;
    if (value == NULL) {
        fprintf(stderr, "%s needs a value\n", option);
        exit(64);
    }
    errno = 0;
    v = strtol(value, &end, 10);
    if (errno || end == value || *end != '\0' || v < min) {
        fprintf(stderr, "%s: bad value %s (at least %ld)\n", option, value, min);
        exit(64);
    }
    return v;
}

static void print_buddyinfo(const char *when) {
    char line[512];
    FILE *f = fopen("/proc/buddyinfo", "r");
    if (f == NULL) return;
    printf("%s %s: free blocks per order 0..10 (/proc/buddyinfo)\n", label, when);
    while (fgets(line, sizeof line, f)) printf("%s   %s", label, line);
    fclose(f);
}

/* Touches `mib` MiB of anonymous memory page by page and releases `hole`
 * pages after every `keep` kept ones; the kept pages stay mapped until the
 * process ends. */
static void fragment_anon(long mib, long keep, long hole) {
    const long page = sysconf(_SC_PAGESIZE);
    const size_t bytes = (size_t)mib << 20;
    const size_t pages = bytes / (size_t)page;
    size_t released = 0, holes = 0;
    double t0 = now_ms();
    unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        printf("FAIL %s: mmap of %ld MiB to fragment: %s\n", label, mib, strerror(errno));
        exit(2);
    }
    /* Base pages only: a huge page would be freed (and reused) whole. */
    if (madvise(p, bytes, MADV_NOHUGEPAGE) != 0)
        printf("%s: madvise(MADV_NOHUGEPAGE): %s (going on)\n", label, strerror(errno));
    print_buddyinfo("before fragmenting");
    for (size_t i = 0; i < pages; i++) p[i * (size_t)page] = (unsigned char)(i | 1);
    /* MADV_DONTNEED, not munmap: one mapping stays one VMA (munmap of every
     * other page would pass the guest's vm.max_map_count). */
    for (size_t i = (size_t)keep; i < pages; i += (size_t)(keep + hole)) {
        size_t n = (size_t)hole;
        if (i + n > pages) n = pages - i;
        if (madvise(p + i * (size_t)page, n * (size_t)page, MADV_DONTNEED) != 0) {
            printf("FAIL %s: madvise(MADV_DONTNEED): %s\n", label, strerror(errno));
            exit(2);
        }
        released += n;
        holes++;
    }
    printf("%s: fragmented %ld MiB of anonymous memory: released %zu MiB in %zu holes of %ld "
           "page(s), kept %zu MiB (%.0f ms)\n",
           label, mib, released * (size_t)page >> 20, holes, hole,
           (pages - released) * (size_t)page >> 20, now_ms() - t0);
    print_buddyinfo("after fragmenting");
}

/* The helpers holding page tables (killed when the bench ends). */
static pid_t helpers[64];
static int helper_go[64];
static int helper_count = 0;

static void end_helpers(void) {
    for (int i = 0; i < helper_count; i++) kill(helpers[i], SIGKILL);
    for (int i = 0; i < helper_count; i++) waitpid(helpers[i], NULL, 0);
    helper_count = 0;
}

/* One helper: takes `tables` page tables and says so (a byte to `ready`);
 * on a byte from `go`, frees `hole` of every `keep + hole` of them again
 * and says so; then holds the rest. */
static void pagetable_helper(size_t tables, long keep, long hole, int ready, int go,
                             pid_t parent) {
    const size_t region = (size_t)2 << 20; /* what one x86-64 page table maps */
    const size_t span = tables * region;
    char ok = 1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    char *p = mmap(NULL, span + region, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    volatile const char *base = NULL;
    if (p == MAP_FAILED) {
        printf("FAIL %s: helper mmap of %zu GiB: %s\n", label, (span + region) >> 30,
               strerror(errno));
        ok = 0;
    } else {
        base = (const char *)(((uintptr_t)p + region - 1) & ~(uintptr_t)(region - 1));
        /* No huge zero page: each read must take a page table. */
        if (madvise(p, span + region, MADV_NOHUGEPAGE) != 0)
            printf("%s: madvise(MADV_NOHUGEPAGE): %s (going on)\n", label, strerror(errno));
        for (size_t i = 0; i < tables; i++) (void)base[i * region];
    }
    if (write(ready, &ok, 1) != 1 || read(go, &ok, 1) != 1) _exit(1);
    for (size_t i = (size_t)keep; i < tables && ok; i += (size_t)(keep + hole)) {
        size_t n = (size_t)hole;
        if (i + n > tables) n = tables - i;
        if (munmap((void *)(base + i * region), n * region) != 0) {
            printf("FAIL %s: helper munmap: %s\n", label, strerror(errno));
            ok = 0;
        }
    }
    if (write(ready, &ok, 1) != 1) _exit(1);
    for (;;) pause();
}

/* Has the kernel allocate `mib` MiB of page tables and frees `hole` of
 * every `keep + hole` of them again, in helper processes that hold the
 * rest until the bench exits. Every helper takes its page tables (one
 * helper after the other, so each one's come in a row) before any frees
 * its holes: a later helper would otherwise take an earlier one's holes. */
static void fragment_pagetables(long mib, long keep, long hole) {
    const long page = sysconf(_SC_PAGESIZE);
    const size_t tables = ((size_t)mib << 20) / (size_t)page;
    /* Mappings left per helper: one per kept group. */
    const size_t per_helper = (size_t)30000 * (size_t)(keep + hole);
    size_t done = 0, released = 0, holes = 0;
    double t0 = now_ms();
    int ready[2];
    char ok = 0;
    print_buddyinfo("before fragmenting");
    if (pipe(ready) != 0) {
        printf("FAIL %s: pipe: %s\n", label, strerror(errno));
        exit(2);
    }
    fflush(stdout);
    while (done < tables) {
        size_t n = tables - done < per_helper ? tables - done : per_helper;
        int go[2];
        if (helper_count == (int)(sizeof helpers / sizeof helpers[0])) {
            printf("FAIL %s: more than %d helpers needed\n", label, helper_count);
            exit(2);
        }
        if (pipe(go) != 0) {
            printf("FAIL %s: pipe: %s\n", label, strerror(errno));
            exit(2);
        }
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
            printf("FAIL %s: fork: %s\n", label, strerror(errno));
            exit(2);
        }
        if (pid == 0) {
            close(ready[0]);
            close(go[1]);
            pagetable_helper(n, keep, hole, ready[1], go[0], parent);
        }
        close(go[0]);
        helper_go[helper_count] = go[1];
        helpers[helper_count++] = pid;
        if (read(ready[0], &ok, 1) != 1 || !ok) {
            printf("FAIL %s: page-table helper %d failed\n", label, (int)pid);
            end_helpers();
            exit(2);
        }
        for (size_t i = (size_t)keep; i < n; i += (size_t)(keep + hole)) {
            released += (size_t)hole < n - i ? (size_t)hole : n - i;
            holes++;
        }
        done += n;
    }
    for (int i = 0; i < helper_count; i++) {
        if (write(helper_go[i], &ok, 1) != 1 || read(ready[0], &ok, 1) != 1 || !ok) {
            printf("FAIL %s: page-table helper %d failed to free its holes\n", label,
                   (int)helpers[i]);
            end_helpers();
            exit(2);
        }
        close(helper_go[i]);
    }
    close(ready[0]);
    close(ready[1]);
    printf("%s: fragmented %ld MiB of page tables (%zu, in %d helper processes): released %zu "
           "MiB in %zu holes of %ld page(s), kept %zu MiB (%.0f ms)\n",
           label, mib, tables, helper_count, released * (size_t)page >> 20, holes, hole,
           (tables - released) * (size_t)page >> 20, now_ms() - t0);
}

static inline uint64_t pattern(size_t i, uint64_t seed) {
    return (i * 0x9E3779B97F4A7C15ull) ^ seed;
}

/* Times `repeats` copies of `bytes` on `stream` with events; the best
 * (shortest) in ms by events, and the wall time of that same copy. */
static float time_copies(int to_device, CUdeviceptr d, void *h, size_t bytes, long repeats,
                         CUstream stream, CUevent start, CUevent end, double *wall_best) {
    float best = -1.0f;
    for (long r = 0; r < repeats; r++) {
        float ms = 0.0f;
        double w0 = now_ms();
        CU(cuEventRecord(start, stream));
        if (to_device)
            CU(cuMemcpyHtoDAsync(d, h, bytes, stream));
        else
            CU(cuMemcpyDtoHAsync(h, d, bytes, stream));
        CU(cuEventRecord(end, stream));
        CU(cuEventSynchronize(end));
        double w1 = now_ms();
        CU(cuEventElapsedTime(&ms, start, end));
        if (best < 0.0f || ms < best) {
            best = ms;
            *wall_best = w1 - w0;
        }
    }
    return best;
}

static void report(const char *direction, size_t bytes, long repeats, float ms, double wall) {
    double gbps = ms > 0.0f ? (double)bytes / 1e9 / ((double)ms / 1e3) : 0.0;
    printf("%s %s %.2f GB/s (%zu MiB, best of %ld by events: %.3f ms; wall %.1f ms)\n", label,
           direction, gbps, bytes >> 20, repeats, (double)ms, wall);
}

int main(int argc, char **argv) {
    long mib = 256, repeats = 5, frag_mib = 0, keep = 1, hole = 1;
    int anon = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--mib") == 0) {
            mib = parse_long(arg, value, 1);
            i++;
        } else if (strcmp(arg, "--repeats") == 0) {
            repeats = parse_long(arg, value, 1);
            i++;
        } else if (strcmp(arg, "--fragment") == 0) {
            frag_mib = parse_long(arg, value, 1);
            i++;
        } else if (strcmp(arg, "--keep-pages") == 0) {
            keep = parse_long(arg, value, 1);
            i++;
        } else if (strcmp(arg, "--hole-pages") == 0) {
            hole = parse_long(arg, value, 1);
            i++;
        } else if (strcmp(arg, "--fragment-with") == 0) {
            if (value == NULL || (strcmp(value, "pagetables") != 0 && strcmp(value, "anon") != 0)) {
                fprintf(stderr, "--fragment-with: pagetables or anon\n");
                return 64;
            }
            anon = strcmp(value, "anon") == 0;
            i++;
        } else if (strcmp(arg, "--label") == 0) {
            if (value == NULL) {
                fprintf(stderr, "--label needs a value\n");
                return 64;
            }
            label = value;
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [--mib N] [--repeats N] [--fragment MIB [--keep-pages K] "
                    "[--hole-pages H] [--fragment-with pagetables|anon]] [--label NAME]\n",
                    argv[0]);
            return 64;
        }
    }
    if (label == NULL) label = frag_mib ? "scattered" : "contiguous";

    const size_t bytes = (size_t)mib << 20;
    const uint64_t seed = 0x5ca77e7ed0000000ull ^ (uint64_t)bytes ^ (frag_mib ? 0xf00du : 0u);
    const size_t words = bytes / 8;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUevent start, end;
    CUdeviceptr d = 0;
    uint64_t *h = NULL;
    char name[256] = "?";
    double wall = 0.0;

    /* Before cuInit: the helpers are forked from a process with no CUDA in
     * it yet (the context's own small blobs take a few of the holes). The
     * bench and its helpers run on one CPU until the buffer is allocated:
     * freed pages first go to the freeing CPU's per-CPU free list, which an
     * allocation on another CPU does not see. */
    cpu_set_t all_cpus, cpu0;
    int pinned_cpu = 0;
    if (frag_mib && sched_getaffinity(0, sizeof all_cpus, &all_cpus) == 0) {
        CPU_ZERO(&cpu0);
        for (int c = 0; c < CPU_SETSIZE; c++) {
            if (CPU_ISSET(c, &all_cpus)) {
                CPU_SET(c, &cpu0);
                break;
            }
        }
        pinned_cpu = sched_setaffinity(0, sizeof cpu0, &cpu0) == 0;
    }
    if (frag_mib && anon)
        fragment_anon(frag_mib, keep, hole);
    else if (frag_mib)
        fragment_pagetables(frag_mib, keep, hole);

    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDeviceGetName(name, (int)sizeof name, dev));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CU(cuEventCreate(&end, CU_EVENT_DEFAULT));
    printf("%s: device %s, %ld MiB pinned, best of %ld\n", label, name, mib, repeats);

    if (frag_mib) {
        /* Page tables are freed after an RCU grace period. */
        sleep(1);
        printf("%s: %s\n", label, pinned_cpu ? "on one CPU until the buffer is allocated"
                                             : "not pinned to one CPU");
    }
    /* Pages on per-CPU free lists are not in buddyinfo. */
    print_buddyinfo("before allocating");

    double t0 = now_ms();
    CU(cuMemAllocHost((void **)&h, bytes));
    double t1 = now_ms();
    if (pinned_cpu) sched_setaffinity(0, sizeof all_cpus, &all_cpus);
    for (size_t i = 0; i < words; i++) h[i] = pattern(i, seed);
    printf("%s: pinned buffer at %p (cuMemAllocHost %.0f ms, filled in %.0f ms)\n", label,
           (void *)h, t1 - t0, now_ms() - t1);
    CU(cuMemAlloc(&d, bytes));
    CU(cuMemsetD32(d, 0xDEADBEEFu, bytes / 4));
    CU(cuCtxSynchronize());

    float ms = time_copies(1, d, h, bytes, repeats, stream, start, end, &wall);
    report("HtoD", bytes, repeats, ms, wall);

    memset(h, 0, bytes);
    ms = time_copies(0, d, h, bytes, repeats, stream, start, end, &wall);
    report("DtoH", bytes, repeats, ms, wall);
    CU(cuStreamSynchronize(stream));

    size_t bad = 0, first = 0;
    for (size_t i = 0; i < words; i++) {
        if (h[i] != pattern(i, seed)) {
            if (bad == 0) first = i;
            bad++;
        }
    }
    if (bad == 0) {
        printf("%s data check PASS (%ld MiB round-tripped host-device-host)\n", label, mib);
    } else {
        printf("%s data check FAIL (%zu of %zu words differ; first at byte %zu: %#llx, want "
               "%#llx)\n",
               label, bad, words, first * 8, (unsigned long long)h[first],
               (unsigned long long)pattern(first, seed));
    }

    end_helpers();
    CU(cuMemFree(d));
    CU(cuMemFreeHost(h));
    CU(cuEventDestroy(start));
    CU(cuEventDestroy(end));
    CU(cuStreamDestroy(stream));
    CU(cuDevicePrimaryCtxRelease(dev));
    return bad == 0 ? 0 : 1;
}
