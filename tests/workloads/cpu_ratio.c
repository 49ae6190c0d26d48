/*
 * cpu_ratio: burns CPU in burn_a and burn_b in a 3:1 ratio of thread CPU
 * time, for a wall-clock duration, and reports what it measured itself.
 *
 * usage: cpu_ratio SECONDS [--wait-stdin] [--fork]
 *   --wait-stdin  read one byte (or EOF) from stdin before burning, so that a
 *                 profiler can attach first
 *   --fork        also fork a child that burns in child_burn for the same
 *                 duration; the parent waits for it
 *
 * At exit it prints one line to stdout:
 *   pid=P cpu_ns=N a_ns=A b_ns=B [child_pid=C child_cpu_ns=M]
 * cpu_ns is the process's own user+system time (getrusage RUSAGE_SELF),
 * a_ns and b_ns the thread CPU time spent inside burn_a and burn_b, measured
 * with CLOCK_THREAD_CPUTIME_ID, and child_cpu_ns the child's user+system time
 * (getrusage RUSAGE_CHILDREN).
 *
 * Build: gcc -O2 -fno-omit-frame-pointer -g -o cpu_ratio cpu_ratio.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

/* Thread CPU time of each slice, on average: burn_a gets three times
 * burn_b's share, in a 3.6 ms cycle that each cycle stretches by a
 * pseudo-random factor from 0.6 to 1.4. A fixed cycle beats with some
 * sampling period: with 4 ms, two periods at 499 Hz nearly matched one
 * cycle (0.72-0.82 profiled for 0.75); with 3.6 ms, five periods at 199 Hz
 * (the VMs' rate) fall on five phases, four of them in burn_a (0.81). */
#define SLICE_A_NS 2700000ULL
#define SLICE_B_NS 900000ULL
/* Multiply-add steps between two reads of the thread clock (tens of us). */
#define CHUNK 40000

static volatile uint64_t sink;

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t rusage_ns(int who)
{
    struct rusage ru;
    getrusage(who, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ULL +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ULL;
}

/* The arithmetic is spelled out in each burner so that the sampled
 * instruction pointer is inside that burner, not in a shared helper. */
#define SPIN(x)                                                                \
    do {                                                                       \
        for (int i_ = 0; i_ < CHUNK; i_++)                                     \
            (x) = (x) * 6364136223846793005ULL + 1442695040888963407ULL;       \
    } while (0)

/* Burns until this thread has used slice_ns of CPU; returns the CPU used. */
NOINLINE uint64_t burn_a(uint64_t slice_ns)
{
    uint64_t x = sink, start = clock_ns(CLOCK_THREAD_CPUTIME_ID), now;
    do {
        SPIN(x);
        now = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    } while (now - start < slice_ns);
    sink = x;
    return now - start;
}

NOINLINE uint64_t burn_b(uint64_t slice_ns)
{
    uint64_t x = sink, start = clock_ns(CLOCK_THREAD_CPUTIME_ID), now;
    do {
        SPIN(x);
        now = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    } while (now - start < slice_ns);
    sink = x;
    return now - start;
}

/* What the forked child runs: plain burning in a function of its own. */
NOINLINE uint64_t child_burn(double seconds)
{
    uint64_t x = sink, end = clock_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    while (clock_ns(CLOCK_MONOTONIC) < end)
        SPIN(x);
    sink = x;
    return x;
}

/* Alternates the burners until the wall-clock deadline. */
NOINLINE void run_workload(double seconds, uint64_t *a_ns, uint64_t *b_ns)
{
    uint64_t end = clock_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    uint64_t state = 88172645463325252ULL;
    while (clock_ns(CLOCK_MONOTONIC) < end) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        uint64_t permille = 600 + state % 801;
        *a_ns += burn_a(SLICE_A_NS * permille / 1000);
        *b_ns += burn_b(SLICE_B_NS * permille / 1000);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SECONDS [--wait-stdin] [--fork]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    int wait_stdin = 0, do_fork = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0)
            wait_stdin = 1;
        else if (strcmp(argv[i], "--fork") == 0)
            do_fork = 1;
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (wait_stdin) {
        char byte;
        if (read(0, &byte, 1) < 0)
            perror("read stdin");
    }

    pid_t child = -1;
    if (do_fork) {
        fflush(stdout);
        child = fork();
        if (child < 0) {
            perror("fork");
            return 1;
        }
        if (child == 0) {
            child_burn(seconds);
            _exit(0);
        }
    }

    uint64_t a_ns = 0, b_ns = 0;
    run_workload(seconds, &a_ns, &b_ns);

    if (child > 0) {
        int status;
        waitpid(child, &status, 0);
    }
    printf("pid=%d cpu_ns=%llu a_ns=%llu b_ns=%llu", (int)getpid(),
           (unsigned long long)rusage_ns(RUSAGE_SELF), (unsigned long long)a_ns,
           (unsigned long long)b_ns);
    if (child > 0)
        printf(" child_pid=%d child_cpu_ns=%llu", (int)child,
               (unsigned long long)rusage_ns(RUSAGE_CHILDREN));
    printf("\n");
    return 0;
}
