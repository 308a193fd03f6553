/* Whether the GPU host's vCPUs share cores, and how far apart they are
 * (issue 9: busy CPUs slowed that host's driver calls, and rgpu keeps more
 * threads busy than the program it serves). For each CPU j other than 0:
 *   alu        an arithmetic loop on CPU 0 while a loop without pauses
 *              spins on CPU j, as a fraction of its speed alone (well below
 *              1: j shares CPU 0's core, a hidden SMT sibling);
 *   ping-pong  one cache line's round trip between CPU 0 and CPU j (two
 *              threads, each waiting for the other's store), in ns.
 *
 *   cpu_distance [CPUS]      (default 16)
 *
 * Built with: gcc -O2 -pthread -o cpu_distance cpu_distance.c */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ALU_STEPS 200000000L
#define ROUND_TRIPS 200000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static atomic_int stop;
static int other_cpu;

static void *spin(void *arg) {
    (void)arg;
    pin(other_cpu);
    volatile unsigned long x = 1;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) x = x * 6364136223846793005UL + 1;
    return NULL;
}

/* Seconds for ALU_STEPS dependent multiply-adds. */
static double alu(void) {
    volatile unsigned long x = 1;
    double t0 = now();
    for (long i = 0; i < ALU_STEPS; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    return now() - t0;
}

static _Alignas(64) atomic_long ping;
static _Alignas(64) atomic_long pong;

static void *answer(void *arg) {
    (void)arg;
    pin(other_cpu);
    for (long i = 1; i <= ROUND_TRIPS; i++) {
        while (atomic_load_explicit(&ping, memory_order_acquire) != i) {
        }
        atomic_store_explicit(&pong, i, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int cpus = argc > 1 ? atoi(argv[1]) : 16;
    if (pin(0) != 0) {
        fprintf(stderr, "cpu_distance: cannot run on CPU 0\n");
        return 1;
    }
    double alone = alu();
    printf("alu alone on CPU 0: %.3f s\n", alone);
    for (int j = 1; j < cpus; j++) {
        pthread_t t;
        other_cpu = j;
        atomic_store(&stop, 0);
        if (pthread_create(&t, NULL, spin, NULL) != 0) return 1;
        double beside = alu();
        atomic_store(&stop, 1);
        pthread_join(t, NULL);

        atomic_store(&ping, 0);
        atomic_store(&pong, 0);
        if (pthread_create(&t, NULL, answer, NULL) != 0) return 1;
        double t0 = now();
        for (long i = 1; i <= ROUND_TRIPS; i++) {
            atomic_store_explicit(&ping, i, memory_order_release);
            while (atomic_load_explicit(&pong, memory_order_acquire) != i) {
            }
        }
        double round_trip_ns = (now() - t0) / ROUND_TRIPS * 1e9;
        pthread_join(t, NULL);
        printf("CPU 0 and CPU %2d: alu %.3f of alone, ping-pong %.0f ns\n", j, alone / beside,
               round_trip_ns);
    }
    return 0;
}
