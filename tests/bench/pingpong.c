/* The floor under rgpu's synchronous round trip (issue 9): two processes
 * that share a page, one writing a request word and spinning on a reply
 * word, the other spinning on the request and answering, as guest-lib and
 * a worker do around every call that waits. No CUDA: what a round trip
 * through shared memory costs on this machine before any work is done.
 *
 *   pingpong [ROUND_TRIPS]
 *
 * Prints the median and mean round trip, unpinned and with the processes
 * pinned to CPUs 2 and 4. Built with: gcc -O2 -o pingpong pingpong.c */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct page {
    _Alignas(64) _Atomic uint64_t request;
    _Alignas(64) _Atomic uint64_t reply;
};

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void measure(long trips, int cpu_a, int cpu_b, const char *label) {
    struct page *p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                          -1, 0);
    if (p == MAP_FAILED) exit(1);
    pid_t child = fork();
    if (child == 0) {
        pin(cpu_b);
        for (uint64_t seen = 0;;) {
            uint64_t r;
            while ((r = atomic_load_explicit(&p->request, memory_order_acquire)) == seen)
                __builtin_ia32_pause();
            seen = r;
            atomic_store_explicit(&p->reply, r, memory_order_release);
        }
    }
    pin(cpu_a);
    double *t = malloc(sizeof(double) * (size_t)trips);
    double sum = 0;
    for (long i = 0; i < trips; i++) {
        double a = now_us();
        atomic_store_explicit(&p->request, (uint64_t)i + 1, memory_order_release);
        while (atomic_load_explicit(&p->reply, memory_order_acquire) != (uint64_t)i + 1)
            __builtin_ia32_pause();
        t[i] = now_us() - a;
        sum += t[i];
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    qsort(t, (size_t)trips, sizeof t[0], cmp_double);
    printf("%s: round trip median %.3f us, mean %.3f us\n", label, t[trips / 2], sum / trips);
    free(t);
    munmap(p, sizeof *p);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; c++) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof all, &all);
}

int main(int argc, char **argv) {
    long trips = argc > 1 ? atol(argv[1]) : 200000;
    for (int round = 1; round <= 2; round++) {
        measure(trips, -1, -1, "unpinned");
        measure(trips, 2, 4, "CPUs 2 and 4");
    }
    return 0;
}
