/*
 * unwind_nofp: burns CPU in work_a and work_b, both called from run, called
 * from main, in a 3:1 ratio of calls, for a wall-clock duration. Meant to be
 * built WITHOUT frame pointers (gcc's -O2 default on x86-64), so that only
 * .eh_frame unwinding finds the callers of the leaf functions.
 *
 * usage: unwind_nofp SECONDS [--wait-stdin]
 *   --wait-stdin  read one byte (or EOF) from stdin before burning, so that a
 *                 profiler can attach first
 *
 * At exit it prints one line to stdout:
 *   pid=P cpu_ns=N
 * cpu_ns is the process's own user+system time (getrusage RUSAGE_SELF).
 *
 * Build: gcc -O2 -g -o unwind_nofp unwind_nofp.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

/* Multiply-add steps per call of a worker (tens of microseconds). */
#define STEPS 20000

static volatile uint64_t sink;

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t rusage_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ULL +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ULL;
}

/* The workers keep a scratch array on the stack, so that their frames are
 * not empty: the canonical frame address is not simply the stack pointer
 * at entry, and the unwinder must follow the CFI to find the caller. */
NOINLINE uint64_t work_a(uint64_t seed)
{
    volatile uint64_t scratch[32];
    uint64_t x = seed;
    for (int i = 0; i < STEPS; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        scratch[i & 31] = x;
    }
    return x ^ scratch[seed & 31];
}

NOINLINE uint64_t work_b(uint64_t seed)
{
    volatile uint64_t scratch[16];
    uint64_t x = seed;
    for (int i = 0; i < STEPS; i++) {
        x = x * 2862933555777941757ULL + 3037000493ULL;
        scratch[i & 15] = x;
    }
    return x ^ scratch[seed & 15];
}

/* Calls work_a three times for each call of work_b until the deadline. */
NOINLINE uint64_t run(double seconds)
{
    uint64_t end = clock_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    uint64_t x = sink + 1;
    while (clock_ns(CLOCK_MONOTONIC) < end) {
        x = work_a(x);
        x = work_a(x);
        x = work_a(x);
        x = work_b(x);
    }
    return x;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SECONDS [--wait-stdin]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0) {
            char byte;
            if (read(0, &byte, 1) < 0)
                perror("read stdin");
        } else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    sink = run(seconds);
    printf("pid=%d cpu_ns=%llu\n", (int)getpid(), (unsigned long long)rusage_ns());
    return 0;
}
