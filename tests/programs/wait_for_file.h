/* Holding a test program at a point until its test creates a file: the
 * stop files and start barriers of the isolation, limit and sharing tests.
 * Needs nanosleep: define _POSIX_C_SOURCE (199309L or later) first. */
#ifndef RGPU_WAIT_FOR_FILE_H
#define RGPU_WAIT_FOR_FILE_H

#include <errno.h>
#include <sys/stat.h>
#include <time.h>

/* Returns once `path` exists, looking every `poll_ns` nanoseconds. */
static inline void wait_for_file(const char *path, long poll_ns) {
    struct stat st;
    struct timespec t = {0, poll_ns};
    while (stat(path, &st) != 0) {
        struct timespec left = t;
        while (nanosleep(&left, &left) == -1 && errno == EINTR) {
        }
    }
}

#endif
