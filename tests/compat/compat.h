/* compat.h: the small harness every compatibility program shares.
 *
 * Each check is a function returning true when it passed; check() prints
 * "NAME PASS" or "NAME FAIL" on stdout, details of a failure on stderr, and
 * clears the runtime's last error so one failure does not spill into the
 * next check. finish() prints "PROGRAM: N passed, N failed" and gives the
 * exit status. Stdout carries only machine-independent text: run-compat.sh
 * compares it byte for byte with expected/PROGRAM.out. */
#pragma once

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

static int compat_passed, compat_failed;

/* Fails the enclosing check (returns false) when a runtime call fails. */
#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t ck_ = (call);                                                         \
        if (ck_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s:%d: %s returned %s\n", __FILE__, __LINE__, #call,         \
                    cudaGetErrorName(ck_));                                               \
            return false;                                                                 \
        }                                                                                 \
    } while (0)

/* Fails the enclosing check when a condition does not hold. */
#define EXPECT(cond)                                                                      \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);           \
            return false;                                                                 \
        }                                                                                 \
    } while (0)

/* Line-buffered stdout keeps host lines and device printf in program order
 * and leaves every finished line in the log if the program dies. */
static inline void compat_start(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

static inline void check(const char *name, bool (*fn)(void)) {
    bool ok = fn();
    (void)cudaGetLastError();
    printf("%s %s\n", name, ok ? "PASS" : "FAIL");
    if (ok)
        compat_passed++;
    else
        compat_failed++;
}

static inline int finish(const char *program) {
    printf("%s: %d passed, %d failed\n", program, compat_passed, compat_failed);
    return compat_failed == 0 ? 0 : 1;
}
