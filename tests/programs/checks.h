/* The checks rgpu's C test programs share. Each check counts a pass or
 * prints "FAIL line N: ..." and counts a failure, so a program runs to its
 * end and reports every failure; REQUIRE_CU gives up the current step
 * (returns -1). Include after the CUDA declarations (rgpu_cuda.h). */
#ifndef RGPU_CHECKS_H
#define RGPU_CHECKS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Unused by programs that only print what they saw for a caller to judge. */
static long checks_passed __attribute__((unused));
static long checks_failed __attribute__((unused));

/* A whole file, NUL-terminated (PTX is passed as a string), and its
 * length in `len` when that is not NULL; NULL if it cannot be read. Free
 * it. */
static inline char *read_file_len(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *data = NULL;
    long size;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        data = malloc((size_t)size + 1);
        if (data && fread(data, 1, (size_t)size, f) == (size_t)size) {
            data[size] = '\0';
            if (len) *len = (size_t)size;
        } else {
            free(data);
            data = NULL;
        }
    }
    fclose(f);
    return data;
}

static inline char *read_file(const char *path) { return read_file_len(path, NULL); }

/* `len` bytes as 2 `len` hex digits and a NUL at `out` (a handle passed to
 * a child process on its command line), and back: -1 unless `text` is
 * exactly that. */
static inline void hex(char *out, const unsigned char *bytes, size_t len) {
    for (size_t i = 0; i < len; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
}

static inline int unhex(unsigned char *out, const char *text, size_t len) {
    if (strlen(text) != 2 * len) return -1;
    for (size_t i = 0; i < len; i++) {
        unsigned byte;
        if (sscanf(text + 2 * i, "%2x", &byte) != 1) return -1;
        out[i] = (unsigned char)byte;
    }
    return 0;
}

static inline const char *error_name(CUresult rc) {
    const char *name = NULL;
    if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL) return "?";
    return name;
}

static inline void fail(int line, const char *what) {
    checks_failed++;
    printf("FAIL line %d: %s\n", line, what);
}

/* A CUDA call that must return `expected`; on failure the program goes on. */
#define CHECK_RC(call, expected)                                                   \
    do {                                                                           \
        CUresult rc_ = (call);                                                     \
        if (rc_ != (expected)) {                                                   \
            checks_failed++;                                                       \
            printf("FAIL line %d: %s: expected %d, got %d (%s)\n", __LINE__, #call, \
                   (int)(expected), rc_, error_name(rc_));                         \
        } else {                                                                   \
            checks_passed++;                                                       \
        }                                                                          \
    } while (0)

/* A CUDA call that must succeed; on failure the program goes on. */
#define CHECK_CU(call) CHECK_RC(call, CUDA_SUCCESS)

/* A CUDA call that must fail (any error code). */
#define CHECK_CU_FAILS(call)                                                            \
    do {                                                                                \
        CUresult rc_ = (call);                                                          \
        if (rc_ == CUDA_SUCCESS) {                                                      \
            checks_failed++;                                                            \
            printf("FAIL line %d: %s: expected an error, got CUDA_SUCCESS\n", __LINE__, \
                   #call);                                                              \
        } else {                                                                        \
            checks_passed++;                                                            \
        }                                                                               \
    } while (0)

/* A CUDA call that must succeed; on failure the current step gives up. */
#define REQUIRE_CU(call)                                                              \
    do {                                                                              \
        CUresult rc_ = (call);                                                        \
        if (rc_ != CUDA_SUCCESS) {                                                    \
            checks_failed++;                                                          \
            printf("FAIL line %d: %s: expected CUDA_SUCCESS, got %d (%s)\n", __LINE__, \
                   #call, rc_, error_name(rc_));                                      \
            return -1;                                                                \
        }                                                                             \
        checks_passed++;                                                              \
    } while (0)

#define CHECK_EQ_INT(actual, expected)                                                   \
    do {                                                                                 \
        long long a_ = (long long)(actual), e_ = (long long)(expected);                  \
        if (a_ != e_) {                                                                  \
            checks_failed++;                                                             \
            printf("FAIL line %d: %s: expected %lld, got %lld\n", __LINE__, #actual, e_, \
                   a_);                                                                  \
        } else {                                                                         \
            checks_passed++;                                                             \
        }                                                                                \
    } while (0)

#define CHECK_TRUE(cond)                                          \
    do {                                                          \
        if (!(cond)) fail(__LINE__, "expected true: " #cond);     \
        else checks_passed++;                                     \
    } while (0)

#endif
