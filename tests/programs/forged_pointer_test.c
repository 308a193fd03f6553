/* forged_pointer_test: copies and memsets on device pointers this program
 * was never given fail with CUDA_ERROR_INVALID_VALUE, change nothing, and
 * leave the context working. Runs the same against rgpu's libcuda.so.1 and
 * NVIDIA's: it asserts only what NVIDIA's driver answers for an address
 * that is no device allocation of the calling process.
 *
 * Usage: forged_pointer_test [--scan-start ADDR] [--scan-step-mb N]
 *        [--scan-probes N] [--pinned-mb N]
 *
 *   --scan-start ADDR  first address of the scan (default 0x7e0000000000)
 *   --scan-step-mb N   distance between probes (default 64)
 *   --scan-probes N    probes (default: up to 0x800000000000, 32768)
 *   --pinned-mb N      page-locked buffer made before the scan (default 128)
 *
 * The scan: a driver reaches every address of the host process it runs in,
 * host memory registered for DMA included. Under rgpu that process is the
 * daemon's, where this program's page-locked memory is registered at
 * addresses that ASLR puts in the top 2 TiB of the address space; a
 * page-locked buffer of 128 MiB is hit by any probe grid of 64 MiB steps
 * over that range. Addresses mapped in this very process are skipped:
 * there NVIDIA's driver may find host memory of ours.
 *
 * Prints "forged_pointer_test: N checks passed" (exit 0) or every failed
 * check (exit 1). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rgpu_cuda.h"
#include "checks.h"

#define MIB (1024ull * 1024ull)
/* Whole 2 MiB pages: the driver puts nothing else of ours in the same page. */
#define BUFFER_BYTES (2 * MIB)
#define PROBE_BYTES 64

struct options {
    unsigned long long scan_start;
    unsigned long long scan_step;
    unsigned long long scan_probes;
    unsigned long long pinned_bytes;
};

static int parse_options(int argc, char **argv, struct options *o) {
    o->scan_start = 0x7e0000000000ull;
    o->scan_step = 64 * MIB;
    o->scan_probes = 0;
    o->pinned_bytes = 128 * MIB;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return -1;
        unsigned long long value = strtoull(argv[i + 1], NULL, 0);
        if (strcmp(argv[i], "--scan-start") == 0) o->scan_start = value;
        else if (strcmp(argv[i], "--scan-step-mb") == 0 && value > 0) o->scan_step = value * MIB;
        else if (strcmp(argv[i], "--scan-probes") == 0) o->scan_probes = value;
        else if (strcmp(argv[i], "--pinned-mb") == 0) o->pinned_bytes = value * MIB;
        else return -1;
        i++;
    }
    if (o->scan_probes == 0 && o->scan_start < 0x800000000000ull)
        o->scan_probes = (0x800000000000ull - o->scan_start) / o->scan_step;
    return 0;
}

/* NVIDIA's driver answers a memset on a bad pointer itself; rgpu queues
 * memsets without waiting for the host, so there the error comes back from
 * the next synchronising call. Either way exactly one of the two says
 * CUDA_ERROR_INVALID_VALUE, and the context works on. */
static void check_memset_refused(int line, const char *what, CUresult rc) {
    CUresult sync = cuCtxSynchronize();
    if ((rc == CUDA_ERROR_INVALID_VALUE && sync == CUDA_SUCCESS) ||
        (rc == CUDA_SUCCESS && sync == CUDA_ERROR_INVALID_VALUE)) {
        checks_passed++;
    } else {
        checks_failed++;
        printf("FAIL line %d: %s: got %d (%s), then cuCtxSynchronize %d (%s)\n", line, what, rc,
               error_name(rc), sync, error_name(sync));
    }
}
#define CHECK_MEMSET_REFUSED(call) check_memset_refused(__LINE__, #call, (call))

/* Every copy, and the memsets if `memsets`, with [forged, forged + bytes)
 * as the device range that is not ours; `own` is an allocation of ours. */
static void check_refused(int line, const char *what, CUdeviceptr forged, size_t bytes,
                          CUdeviceptr own, int memsets) {
    unsigned char *host = malloc(bytes);
    printf("forged pointer: %s %#llx+%zu (from line %d)\n", what, forged, bytes, line);
    if (!host) {
        fail(line, "out of host memory");
        return;
    }
    memset(host, 0xee, bytes);
    CHECK_RC(cuMemcpyDtoH(host, forged, bytes), CUDA_ERROR_INVALID_VALUE);
    /* rgpu stages a pageable host-to-device copy in pieces of a quarter
     * ring (2 MiB by default): pieces inside the allocation land before a
     * later one is refused, where NVIDIA's driver refuses the whole copy
     * first. So only ranges of one piece here. */
    if (bytes <= 64 * 1024) CHECK_RC(cuMemcpyHtoD(forged, host, bytes), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemcpyDtoD(own, forged, bytes), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemcpyDtoD(forged, own, bytes), CUDA_ERROR_INVALID_VALUE);
    if (memsets) {
        CHECK_MEMSET_REFUSED(cuMemsetD8(forged, 0xee, bytes));
        /* Rounded up: never fewer bytes than the forged range. */
        if (forged % 4 == 0)
            CHECK_MEMSET_REFUSED(cuMemsetD32(forged, 0xeeeeeeee, (bytes + 3) / 4));
    }
    free(host);
}
#define CHECK_REFUSED(what, forged, bytes, own, memsets) \
    check_refused(__LINE__, what, forged, bytes, own, memsets)

static uint32_t marker_word(size_t i) { return (uint32_t)(i * 2654435761u) ^ 0x5eed1e55u; }

/* The whole buffer still holds the marker: one check. */
static void check_marker(int line, CUdeviceptr buffer, uint32_t *scratch) {
    size_t words = BUFFER_BYTES / 4, bad = 0;
    CUresult rc = cuMemcpyDtoH(scratch, buffer, BUFFER_BYTES);
    if (rc != CUDA_SUCCESS) {
        checks_failed++;
        printf("FAIL line %d: reading the marker back: %d (%s)\n", line, rc, error_name(rc));
        return;
    }
    for (size_t i = 0; i < words; i++) {
        if (scratch[i] != marker_word(i)) {
            if (bad < 5)
                printf("FAIL line %d: marker word %zu: expected 0x%08x, got 0x%08x\n", line, i,
                       marker_word(i), scratch[i]);
            bad++;
        }
    }
    if (bad) {
        checks_failed++;
        printf("FAIL line %d: %zu of %zu marker words changed\n", line, bad, words);
    } else {
        checks_passed++;
    }
}

struct mapping {
    unsigned long long start, end;
};

/* This process's own mappings (/proc/self/maps); NULL if unreadable. */
static struct mapping *read_mappings(size_t *count) {
    FILE *maps = fopen("/proc/self/maps", "r");
    size_t capacity = 256;
    struct mapping *out = malloc(capacity * sizeof *out);
    char line[4096];
    *count = 0;
    if (!maps || !out) {
        if (maps) fclose(maps);
        free(out);
        return NULL;
    }
    while (fgets(line, sizeof line, maps)) {
        unsigned long long start, end;
        if (sscanf(line, "%llx-%llx", &start, &end) != 2) continue;
        if (*count == capacity) {
            struct mapping *bigger = realloc(out, 2 * capacity * sizeof *out);
            if (!bigger) break;
            out = bigger;
            capacity *= 2;
        }
        out[(*count)++] = (struct mapping){start, end};
    }
    fclose(maps);
    return out;
}

static int mapped_here(const struct mapping *maps, size_t count, unsigned long long start,
                       unsigned long long len) {
    for (size_t i = 0; i < count; i++)
        if (start < maps[i].end && maps[i].start < start + len) return 1;
    return 0;
}

/* Probes the scan range: every probe must be refused. One check for all. */
static void scan(const struct options *o, CUdeviceptr own) {
    size_t map_count = 0, skipped = 0, accepted = 0;
    struct mapping *maps = read_mappings(&map_count);
    unsigned char host[PROBE_BYTES];
    CHECK_TRUE(maps != NULL);
    if (!maps) return;
    for (unsigned long long i = 0; i < o->scan_probes; i++) {
        unsigned long long probe = o->scan_start + i * o->scan_step;
        CUresult rc;
        if (mapped_here(maps, map_count, probe, PROBE_BYTES) ||
            (probe + PROBE_BYTES > own && probe < own + BUFFER_BYTES)) {
            skipped++;
            continue;
        }
        rc = cuMemcpyDtoH(host, probe, PROBE_BYTES);
        if (rc == CUDA_ERROR_INVALID_VALUE && i % 8 == 0)
            rc = cuMemcpyDtoD(own, probe, PROBE_BYTES);
        if (rc != CUDA_ERROR_INVALID_VALUE) {
            if (accepted < 5)
                printf("FAIL: probe %#llx: expected %d, got %d (%s)\n", probe,
                       CUDA_ERROR_INVALID_VALUE, rc, error_name(rc));
            accepted++;
        }
    }
    free(maps);
    printf("forged_pointer_test: scanned %llu addresses from %#llx in %llu MiB steps, %zu "
           "skipped (mapped in this process), %zu accepted\n",
           o->scan_probes, o->scan_start, o->scan_step / MIB, skipped, accepted);
    CHECK_EQ_INT(accepted, 0);
}

static int run(const struct options *o) {
    CUdevice device = 0;
    CUcontext ctx = NULL;
    CUdeviceptr buffer = 0, freed = 0;
    uint32_t *scratch = malloc(BUFFER_BYTES);
    void *pinned = NULL;
    unsigned char small[16];

    if (!scratch) return -1;
    REQUIRE_CU(cuInit(0));
    REQUIRE_CU(cuDeviceGet(&device, 0));
    REQUIRE_CU(cuDevicePrimaryCtxRetain(&ctx, device));
    REQUIRE_CU(cuCtxSetCurrent(ctx));

    REQUIRE_CU(cuMemAlloc(&buffer, BUFFER_BYTES));
    REQUIRE_CU(cuMemAlloc(&freed, BUFFER_BYTES));
    printf("forged_pointer_test: buffer at %#llx, freed buffer at %#llx\n", buffer, freed);
    for (size_t i = 0; i < BUFFER_BYTES / 4; i++) scratch[i] = marker_word(i);
    REQUIRE_CU(cuMemcpyHtoD(buffer, scratch, BUFFER_BYTES));
    REQUIRE_CU(cuMemcpyHtoD(freed, scratch, BUFFER_BYTES));
    REQUIRE_CU(cuMemFree(freed));
    if (o->pinned_bytes) {
        REQUIRE_CU(cuMemAllocHost(&pinned, o->pinned_bytes));
        memset(pinned, 0x77, o->pinned_bytes);
    }

    /* No memsets just past the end: measured on an H200 (driver 580.159),
     * NVIDIA's driver refuses the copies there but runs a memset that
     * starts in device memory it mapped without handing it out (the next
     * 2 MiB), writing memory this program does not own. rgpu refuses both;
     * this program asserts only what both do. */
    CHECK_REFUSED("just past the end", buffer + BUFFER_BYTES, 16, buffer, 0);
    CHECK_REFUSED("straddling the end", buffer + BUFFER_BYTES - 8, 16, buffer, 1);
    CHECK_REFUSED("one byte too many", buffer, BUFFER_BYTES + 1, buffer, 1);
    CHECK_REFUSED("never handed out", buffer + 1024 * MIB, 64, buffer, 1);
    CHECK_REFUSED("freed", freed, 64, buffer, 1);
    CHECK_REFUSED("inside a freed allocation", freed + 4096, 64, buffer, 1);
    CHECK_REFUSED("null", 0, 16, buffer, 1);
    scan(o, buffer);

    /* Nothing was written, and the context works on. */
    check_marker(__LINE__, buffer, scratch);
    memcpy(small, "forged, not used", sizeof small);
    CHECK_CU(cuMemcpyHtoD(buffer + 100, small, sizeof small));
    CHECK_CU(cuMemcpyDtoD(buffer + BUFFER_BYTES - sizeof small, buffer + 100, sizeof small));
    CHECK_CU(cuMemsetD8(buffer + 200, 0x42, 4));
    memset(small, 0, sizeof small);
    CHECK_CU(cuMemcpyDtoH(small, buffer + BUFFER_BYTES - sizeof small, sizeof small));
    CHECK_TRUE(memcmp(small, "forged, not used", sizeof small) == 0);
    CHECK_CU(cuMemcpyDtoH(small, buffer + 200, 4));
    CHECK_TRUE(small[0] == 0x42 && small[3] == 0x42);
    CHECK_CU(cuCtxSynchronize());

    if (pinned) CHECK_CU(cuMemFreeHost(pinned));
    CHECK_CU(cuMemFree(buffer));
    CHECK_CU(cuDevicePrimaryCtxRelease(device));
    free(scratch);
    return 0;
}

int main(int argc, char **argv) {
    struct options o;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_options(argc, argv, &o)) {
        fprintf(stderr,
                "usage: %s [--scan-start ADDR] [--scan-step-mb N] [--scan-probes N] "
                "[--pinned-mb N]\n",
                argv[0]);
        return 2;
    }
    run(&o);
    if (checks_failed) {
        printf("forged_pointer_test: %ld checks failed, %ld passed\n", checks_failed,
               checks_passed);
        return 1;
    }
    printf("forged_pointer_test: %ld checks passed\n", checks_passed);
    return 0;
}
