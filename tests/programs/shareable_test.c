/* shareable_test: shareable handles of the virtual-memory API (issue 10),
 * as PyTorch's expandable segments share tensors between processes:
 * cuMemExportToShareableHandle to a POSIX file descriptor, passed to
 * another process, which imports and maps it.
 *
 * Usage: shareable_test [--ptx FILE] [--other-socket PATH]
 *
 * The parent creates one granule of physical memory that may be exported
 * as a file descriptor, maps it, fills it with an index pattern and
 * exports it; one that did not ask to be exported is refused. A child
 * (this program again, exec'ed with the descriptor inherited) imports the
 * descriptor, maps it, checks the pattern and overwrites it with
 * 0xB0B0B0B0; the parent reads that back through its own mapping.
 *
 * Through rgpu (RGPU_SOCKET, RGPU_SERVER or RGPU_DEVICES set), more
 * children are refused with CUDA_ERROR_INVALID_VALUE: a descriptor of
 * random bytes, one in rgpu's format with one byte of its token changed,
 * the true descriptor in another tenant (with --other-socket, that
 * tenant's daemon socket), and the true descriptor after the parent
 * released its handle (rgpu withdraws an export at release; natively the
 * descriptor keeps the memory and imports, which is checked natively).
 * Fabric handles are CUDA_ERROR_NOT_SUPPORTED through rgpu.
 *
 * Prints "shareable_test: N checks passed" (exit 0) or every failed check
 * (exit 1); a child prints "shareable_test child: ..." likewise. */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rgpu_cuda.h"
#include "checks.h"
#include "rgpu_vmm.h"

#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_SUPPORTED 801
#define WRITTEN 0xB0B0B0B0u

static CUresult setup(CUcontext *ctx, size_t *granularity) {
    CUdevice dev;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGet(&dev, 0);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(ctx, dev);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(*ctx);
    AllocationProp prop = device_prop(0, HANDLE_POSIX_FD);
    if (rc == CUDA_SUCCESS) rc = cuMemGetAllocationGranularity(granularity, &prop, 0);
    return rc;
}

/* Maps `handle` (one granule) at a new reservation, read-write. */
static CUresult map_granule(MemHandle handle, size_t size, CUdeviceptr *at) {
    CUresult rc = cuMemAddressReserve(at, size, 0, 0, 0);
    if (rc == CUDA_SUCCESS) rc = cuMemMap(*at, size, 0, handle, 0);
    AccessDesc access = {{DEVICE, 0}, READ_WRITE};
    if (rc == CUDA_SUCCESS) rc = cuMemSetAccess(*at, size, &access, 1);
    return rc;
}

/* The child: imports `fd`; `expect` is "mapped" (check the pattern, write
 * WRITTEN) or "refused" (CUDA_ERROR_INVALID_VALUE) or "any-failure". */
static int child(int fd, const char *expect) {
    CUcontext ctx;
    size_t granularity = 0;
    MemHandle handle = 0;
    if (setup(&ctx, &granularity) != CUDA_SUCCESS) {
        printf("FAIL child setup\n");
        return 1;
    }
    CUresult rc = cuMemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd, HANDLE_POSIX_FD);
    if (!strcmp(expect, "refused")) {
        CHECK_RC(rc, CUDA_ERROR_INVALID_VALUE);
    } else if (!strcmp(expect, "any-failure")) {
        CHECK_TRUE(rc != CUDA_SUCCESS);
    } else {
        CHECK_RC(rc, CUDA_SUCCESS);
        CUdeviceptr at = 0;
        if (rc == CUDA_SUCCESS && map_granule(handle, granularity, &at) == CUDA_SUCCESS) {
            size_t words = granularity / 4;
            uint32_t *host = malloc(granularity);
            CHECK_CU(cuMemcpyDtoH(host, at, granularity));
            size_t wrong = 0;
            for (size_t i = 0; i < words; i++) wrong += host[i] != (uint32_t)i;
            CHECK_EQ_INT((int)wrong, 0);
            CHECK_CU(cuMemsetD32(at, WRITTEN, words));
            CHECK_CU(cuCtxSynchronize());
            CHECK_CU(cuMemUnmap(at, granularity));
            CHECK_CU(cuMemAddressFree(at, granularity));
            free(host);
        } else {
            CHECK_TRUE(0);
        }
        if (rc == CUDA_SUCCESS) CHECK_CU(cuMemRelease(handle));
    }
    printf("shareable_test child (%s): %ld checks passed, %ld failed\n", expect, checks_passed,
           checks_failed);
    return checks_failed ? 1 : 0;
}

/* Runs this program as a child importing `fd`, with RGPU_SOCKET `socket`
 * if not NULL; its exit status. */
static int run_child(int fd, const char *expect, const char *socket) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        char number[16];
        snprintf(number, sizeof number, "%d", fd);
        int flags = fcntl(fd, F_GETFD);
        if (flags >= 0) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
        if (socket) setenv("RGPU_SOCKET", socket, 1);
        execl("/proc/self/exe", "shareable_test", "--child", number, expect, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* A memfd holding `bytes` (a forged descriptor). */
static int memfd_with(const void *bytes, size_t len) {
    int fd = memfd_create("forged", 0);
    if (fd >= 0 && write(fd, bytes, len) != (ssize_t)len) {
        close(fd);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child")) return child(atoi(argv[2]), argv[3]);
    const char *other_socket = NULL;
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--other-socket")) other_socket = argv[i + 1];
    int through_rgpu =
        getenv("RGPU_SOCKET") || getenv("RGPU_SERVER") || getenv("RGPU_DEVICES");
    CUcontext ctx;
    size_t granularity = 0;
    if (setup(&ctx, &granularity) != CUDA_SUCCESS) {
        printf("FAIL setup\n");
        return 1;
    }
    size_t words = granularity / 4;
    AllocationProp shareable = device_prop(0, HANDLE_POSIX_FD);
    AllocationProp private_ = device_prop(0, 0);
    MemHandle handle = 0, unshared = 0;
    CUdeviceptr at = 0;
    int fd = -1;
    REQUIRE_CU(cuMemCreate(&handle, granularity, &shareable, 0));
    REQUIRE_CU(map_granule(handle, granularity, &at));
    uint32_t *host = malloc(granularity);
    for (size_t i = 0; i < words; i++) host[i] = (uint32_t)i;
    CHECK_CU(cuMemcpyHtoD(at, host, granularity));
    CHECK_CU(cuMemExportToShareableHandle(&fd, handle, HANDLE_POSIX_FD, 0));
    CHECK_TRUE(fd >= 0);
    /* Only what asked to be shared is. */
    int no_fd = -1;
    CHECK_CU(cuMemCreate(&unshared, granularity, &private_, 0));
    CHECK_CU_FAILS(cuMemExportToShareableHandle(&no_fd, unshared, HANDLE_POSIX_FD, 0));
    CHECK_CU(cuMemRelease(unshared));
    if (through_rgpu) {
        char fabric[64];
        CHECK_RC(cuMemExportToShareableHandle(fabric, handle, HANDLE_FABRIC, 0),
                 CUDA_ERROR_NOT_SUPPORTED);
    }

    /* Another process imports, reads and writes it. */
    CHECK_EQ_INT(run_child(fd, "mapped", NULL), 0);
    memset(host, 0, granularity);
    CHECK_CU(cuMemcpyDtoH(host, at, granularity));
    size_t wrong = 0;
    for (size_t i = 0; i < words; i++) wrong += host[i] != WRITTEN;
    CHECK_EQ_INT((int)wrong, 0);
    for (size_t i = 0; i < words; i++) host[i] = (uint32_t)i;
    CHECK_CU(cuMemcpyHtoD(at, host, granularity));

    /* Forged descriptors. */
    unsigned char junk[48];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 37 + 5);
    int random_fd = memfd_with(junk, sizeof junk);
    CHECK_TRUE(random_fd >= 0);
    CHECK_EQ_INT(run_child(random_fd, through_rgpu ? "refused" : "any-failure", NULL), 0);
    close(random_fd);
    if (through_rgpu) {
        /* rgpu's format, one byte of the token changed. */
        unsigned char content[48];
        CHECK_EQ_INT((int)pread(fd, content, sizeof content, 0), (int)sizeof content);
        content[40] ^= 1;
        int altered = memfd_with(content, sizeof content);
        CHECK_EQ_INT(run_child(altered, "refused", NULL), 0);
        close(altered);
        if (other_socket) CHECK_EQ_INT(run_child(fd, "refused", other_socket), 0);
    }

    /* Released by its exporter: rgpu withdraws the export; natively the
     * descriptor still holds the memory. */
    CHECK_CU(cuMemRelease(handle));
    CHECK_EQ_INT(run_child(fd, through_rgpu ? "refused" : "mapped", NULL), 0);
    close(fd);
    CHECK_CU(cuMemUnmap(at, granularity));
    CHECK_CU(cuMemAddressFree(at, granularity));
    free(host);
    cuDevicePrimaryCtxRelease(0);
    if (checks_failed) return 1;
    printf("shareable_test: %ld checks passed\n", checks_passed);
    return 0;
}
