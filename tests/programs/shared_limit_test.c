/* shared_limit_test: a tenant's memory limit holds for memory that its
 * processes share (issue 8's limit, issue 10's sharing). Memory another
 * process imported outlives its exporter's free: the driver keeps it for
 * the importer. Were the importer not charged for it, a tenant could
 * allocate, share, free and allocate again past its limit, for ever.
 *
 * Usage: shared_limit_test --via shareable|ipc --mib S --rounds R
 *                          [--limit-mib L]
 *
 * R rounds, each: the parent allocates S MiB (cuMemCreate exported as a
 * POSIX file descriptor, or cuMemAlloc exported with cuIpcGetMemHandle)
 * and hands it to a child (this program again, over a socket pair), which
 * imports it (and maps it) and keeps it; then the parent frees its own
 * handle. So the child accumulates what the parent allocated.
 *   - With --limit-mib (a tenant limited to L MiB): at no point may the
 *     child's imports and the parent's allocation together pass L (an
 *     allocation or import past it fails with CUDA_ERROR_OUT_OF_MEMORY),
 *     and when R S passes L something was refused. Once the child let go
 *     and ended, S MiB are granted again.
 *   - Without (natively): every round succeeds.
 *
 * Prints "round K: ..." lines, then "shared_limit_test: N checks passed"
 * (exit 0) or every failed check (exit 1). */
#define _GNU_SOURCE

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rgpu_cuda.h"
#include "checks.h"
#include "rgpu_vmm.h"

#define CUDA_ERROR_OUT_OF_MEMORY 2
#define IPC_HANDLE_SIZE 64
#define IPC_LAZY_ENABLE_PEER_ACCESS 1

typedef struct {
    char reserved[IPC_HANDLE_SIZE];
} IpcMemHandle;

#define cuIpcOpenMemHandle cuIpcOpenMemHandle_v2
CUresult cuIpcGetMemHandle(IpcMemHandle *handle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, IpcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);

static void check(int ok, const char *what) {
    if (ok) checks_passed++;
    else {
        checks_failed++;
        printf("FAIL: %s\n", what);
    }
}

static int context(void) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        printf("FAIL: no CUDA context\n");
        return -1;
    }
    return 0;
}

/* The memory the parent shares: a physical allocation or device memory. */
typedef struct {
    int shareable;
    size_t size;
    MemHandle physical;
    CUdeviceptr ptr;
} Shared;

static CUresult allocate(Shared *s) {
    if (s->shareable) {
        AllocationProp prop = device_prop(0, HANDLE_POSIX_FD);
        return cuMemCreate(&s->physical, s->size, &prop, 0);
    }
    return cuMemAlloc(&s->ptr, s->size);
}

static CUresult release(Shared *s) {
    return s->shareable ? cuMemRelease(s->physical) : cuMemFree(s->ptr);
}

/* Sends `text`, and `fd` when it is not -1, as one message. */
static int send_message(int sock, const char *text, int fd) {
    struct iovec iov = {(void *)text, strlen(text) + 1};
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        msg.msg_control = control.bytes;
        msg.msg_controllen = sizeof control.bytes;
        struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
    }
    return sendmsg(sock, &msg, 0) < 0 ? -1 : 0;
}

/* Receives a message into `text` (NUL-terminated) and the descriptor it
 * carried into `fd` (-1: none); -1 at the end. */
static int receive_message(int sock, char *text, size_t len, int *fd) {
    struct iovec iov = {text, len - 1};
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.bytes,
                         .msg_controllen = sizeof control.bytes};
    ssize_t got = recvmsg(sock, &msg, 0);
    if (got <= 0) return -1;
    text[got] = '\0';
    *fd = -1;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    if (cmsg && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS)
        memcpy(fd, CMSG_DATA(cmsg), sizeof *fd);
    return 0;
}

/* The child: for each message ("fd" with a descriptor, or "ipc:HEX"),
 * imports it, maps it and answers "held" or "refused RC"; at the end lets
 * go of everything. */
static int child(int sock, size_t size) {
    if (context()) return 1;
    enum { MAX_HELD = 64 };
    CUdeviceptr at[MAX_HELD];
    MemHandle imported[MAX_HELD];
    int shareable[MAX_HELD];
    int held = 0;
    char text[256];
    int fd;
    while (held < MAX_HELD && receive_message(sock, text, sizeof text, &fd) == 0) {
        CUresult rc;
        at[held] = 0;
        shareable[held] = fd >= 0;
        if (fd >= 0) {
            rc = cuMemImportFromShareableHandle(&imported[held], (void *)(intptr_t)fd,
                                                HANDLE_POSIX_FD);
            close(fd);
            if (rc == CUDA_SUCCESS) {
                CUresult mapped = cuMemAddressReserve(&at[held], size, 0, 0, 0);
                if (mapped == CUDA_SUCCESS) mapped = cuMemMap(at[held], size, 0, imported[held], 0);
                AccessDesc access = {{DEVICE, 0}, READ_WRITE};
                if (mapped == CUDA_SUCCESS) mapped = cuMemSetAccess(at[held], size, &access, 1);
                if (mapped != CUDA_SUCCESS) {
                    printf("FAIL: child: map: %d (%s)\n", mapped, error_name(mapped));
                    return 1;
                }
            }
        } else {
            IpcMemHandle handle;
            if (strncmp(text, "ipc:", 4) != 0 ||
                unhex((unsigned char *)handle.reserved, text + 4, IPC_HANDLE_SIZE)) {
                printf("FAIL: child: bad message\n");
                return 1;
            }
            rc = cuIpcOpenMemHandle(&at[held], handle, IPC_LAZY_ENABLE_PEER_ACCESS);
        }
        char answer[64];
        if (rc == CUDA_SUCCESS) {
            held++;
            snprintf(answer, sizeof answer, "held");
        } else {
            snprintf(answer, sizeof answer, "refused %d", rc);
        }
        if (send_message(sock, answer, -1)) return 1;
    }
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < held && rc == CUDA_SUCCESS; i++) {
        if (shareable[i]) {
            rc = cuMemUnmap(at[i], size);
            if (rc == CUDA_SUCCESS) rc = cuMemAddressFree(at[i], size);
            if (rc == CUDA_SUCCESS) rc = cuMemRelease(imported[i]);
        } else {
            rc = cuIpcCloseMemHandle(at[i]);
        }
    }
    return rc == CUDA_SUCCESS ? 0 : 1;
}

static void usage(void) { fprintf(stderr, "usage: see the comment at the top of %s\n", __FILE__); }

int main(int argc, char **argv) {
    const char *via = NULL;
    size_t mib = 0, limit_mib = 0;
    long rounds = 0;
    int child_sock = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--via") && i + 1 < argc) via = argv[++i];
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atol(argv[++i]);
        else if (!strcmp(argv[i], "--limit-mib") && i + 1 < argc)
            limit_mib = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--child") && i + 1 < argc) child_sock = atoi(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (mib == 0) {
        usage();
        return 2;
    }
    if (child_sock >= 0) return child(child_sock, mib << 20);
    if (!via || (strcmp(via, "shareable") && strcmp(via, "ipc")) || rounds < 1 || rounds > 32) {
        usage();
        return 2;
    }
    Shared shared = {.shareable = !strcmp(via, "shareable"), .size = mib << 20};
    if (context()) return 1;
    int socks[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, socks)) return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(socks[0]);
        char sock[16], size[32];
        snprintf(sock, sizeof sock, "%d", socks[1]);
        snprintf(size, sizeof size, "%zu", mib);
        execl("/proc/self/exe", argv[0], "--child", sock, "--mib", size, (char *)NULL);
        _exit(127);
    }
    close(socks[1]);

    size_t held_mib = 0, refused = 0;
    for (long round = 1; round <= rounds; round++) {
        CUresult rc = allocate(&shared);
        if (rc != CUDA_SUCCESS) {
            printf("round %ld: the child holds %zu MiB; %zu MiB more: %d (%s)\n", round, held_mib,
                   mib, rc, error_name(rc));
            check(limit_mib && rc == CUDA_ERROR_OUT_OF_MEMORY,
                  "only a limit refuses an allocation, with CUDA_ERROR_OUT_OF_MEMORY");
            refused++;
            continue;
        }
        check(!limit_mib || held_mib + mib <= limit_mib,
              "the child's imports and the allocation stay within the limit");
        char text[2 * IPC_HANDLE_SIZE + 8];
        int fd = -1;
        if (shared.shareable) {
            REQUIRE_CU(cuMemExportToShareableHandle(&fd, shared.physical, HANDLE_POSIX_FD, 0));
            snprintf(text, sizeof text, "fd");
        } else {
            IpcMemHandle handle;
            REQUIRE_CU(cuIpcGetMemHandle(&handle, shared.ptr));
            strcpy(text, "ipc:");
            hex(text + 4, (const unsigned char *)handle.reserved, IPC_HANDLE_SIZE);
        }
        char answer[64] = "";
        int none;
        if (send_message(socks[0], text, fd) ||
            receive_message(socks[0], answer, sizeof answer, &none)) {
            check(0, "the child answers");
            break;
        }
        if (fd >= 0) close(fd);
        if (!strcmp(answer, "held")) {
            held_mib += mib;
        } else {
            check(limit_mib && !strcmp(answer, "refused 2"),
                  "only a limit refuses an import, with CUDA_ERROR_OUT_OF_MEMORY");
            refused++;
        }
        /* The parent's own handle goes; the child's import keeps the memory. */
        CHECK_CU(release(&shared));
        printf("round %ld: the child %s; it holds %zu MiB\n", round, answer, held_mib);
        check(!limit_mib || held_mib <= limit_mib, "the child's imports stay within the limit");
    }
    if (limit_mib && rounds * mib > limit_mib)
        check(refused > 0, "past the limit, an allocation or an import was refused");
    if (!limit_mib) check(refused == 0, "natively, every round succeeds");

    close(socks[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child lets go and ends");
    /* What the child held is the tenant's again (its session ends on the
     * host shortly after the process: a limited tenant may wait a moment). */
    CUresult rc = allocate(&shared);
    for (int tries = 0; limit_mib && rc == CUDA_ERROR_OUT_OF_MEMORY && tries < 250; tries++) {
        struct timespec nap = {0, 20000000};
        nanosleep(&nap, NULL);
        rc = allocate(&shared);
    }
    CHECK_CU(rc);
    if (rc == CUDA_SUCCESS) CHECK_CU(release(&shared));
    if (checks_failed) return 1;
    printf("shared_limit_test: %ld checks passed\n", checks_passed);
    return 0;
}
