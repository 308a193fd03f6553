/* The floor under rgpu's synchronous round trip (issue 9): two processes
 * that share a page, one writing a request word and spinning on a reply
 * word, the other spinning on the request and answering, as guest-lib and
 * a worker do around every call that waits. No CUDA: what a round trip
 * through shared memory costs on this machine before any work is done.
 *
 *   pingpong [ROUND_TRIPS]
 *
 * Prints the median and mean round trip, unpinned and with the processes
 * pinned to CPUs 2 and 4, for three layouts:
 *   - floor: one request word, one reply word;
 *   - counter: as rgpu's ring did up to the eleventh session: the command
 *     on a line of its own, then a `produced` counter (SeqCst store, then a
 *     load of an `idle` word), the answerer polling the counter and then
 *     reading the command;
 *   - stamped: the same publication, the answerer polling the command's
 *     own line for its stamp instead of the counter;
 *   - both: the answerer polling the stamp and, while it is not there, the
 *     counter too (rgpu's worker up to the sixteenth session, which polls
 *     the stamp alone since).
 * Then stamped and both again with spin loops that do not pause between
 * polls, and what one pause and one clock_gettime(CLOCK_MONOTONIC) cost.
 * Built with: gcc -O2 -o pingpong pingpong.c */
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
    _Alignas(64) _Atomic uint64_t produced;
    _Alignas(64) _Atomic uint64_t idle;
    _Alignas(64) _Atomic uint64_t command[8];
};

enum layout { FLOOR, COUNTER, STAMPED, BOTH };
static const char *layout_names[] = {"floor", "counter", "stamped", "both"};

/* Whether the spin loops pause between polls (as rgpu's do). */
static int pausing = 1;

static inline void relax(void) {
    if (pausing) __builtin_ia32_pause();
}

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

static void measure(long trips, int cpu_a, int cpu_b, const char *label, enum layout layout) {
    struct page *p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                          -1, 0);
    if (p == MAP_FAILED) exit(1);
    pid_t child = fork();
    if (child == 0) {
        pin(cpu_b);
        for (uint64_t seen = 0;;) {
            uint64_t r;
            _Atomic uint64_t *polled = layout == FLOOR     ? &p->request
                                       : layout == COUNTER ? &p->produced
                                                           : &p->command[2];
            if (layout == BOTH) {
                /* The stamp, then the counter, as has_work read them. */
                for (;;) {
                    r = atomic_load_explicit(&p->command[2], memory_order_acquire);
                    if (r != seen) break;
                    if (atomic_load_explicit(&p->produced, memory_order_seq_cst) != seen) {
                        r = atomic_load_explicit(&p->command[2], memory_order_acquire);
                        if (r != seen) break;
                    }
                    relax();
                }
            } else {
                while ((r = atomic_load_explicit(polled, memory_order_acquire)) == seen)
                    relax();
            }
            seen = r;
            if (layout != FLOOR)
                r = atomic_load_explicit(&p->command[0], memory_order_relaxed);
            atomic_store_explicit(&p->reply, r, memory_order_release);
        }
    }
    pin(cpu_a);
    double *t = malloc(sizeof(double) * (size_t)trips);
    double sum = 0;
    for (long i = 0; i < trips; i++) {
        double a = now_us();
        uint64_t n = (uint64_t)i + 1;
        if (layout == FLOOR) {
            atomic_store_explicit(&p->request, n, memory_order_release);
        } else {
            atomic_store_explicit(&p->command[0], n, memory_order_relaxed);
            atomic_store_explicit(&p->command[2], n, memory_order_release);
            atomic_store_explicit(&p->produced, n, memory_order_seq_cst);
            if (atomic_load_explicit(&p->idle, memory_order_seq_cst)) exit(2);
        }
        while (atomic_load_explicit(&p->reply, memory_order_acquire) != (uint64_t)i + 1)
            relax();
        t[i] = now_us() - a;
        sum += t[i];
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    qsort(t, (size_t)trips, sizeof t[0], cmp_double);
    printf("%-8s %s: round trip median %.3f us, mean %.3f us\n", layout_names[layout], label,
           t[trips / 2], sum / trips);
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
        for (enum layout l = FLOOR; l <= BOTH; l++) {
            measure(trips, -1, -1, "unpinned", l);
            measure(trips, 2, 4, "CPUs 2 and 4", l);
        }
    }
    pausing = 0;
    measure(trips, -1, -1, "unpinned, no pause", STAMPED);
    measure(trips, -1, -1, "unpinned, no pause", BOTH);
    pausing = 1;
    double paused = now_us();
    for (int i = 0; i < 1000000; i++) relax();
    printf("pause: %.1f ns\n", (now_us() - paused) * 1e3 / 1e6);
    double start = now_us();
    volatile double sink = 0;
    for (int i = 0; i < 1000000; i++) sink += now_us();
    printf("clock_gettime: %.1f ns a call\n", (now_us() - start) * 1e3 / 1e6);
    return 0;
}
