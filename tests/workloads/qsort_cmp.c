/*
 * qsort_cmp: sorts arrays with glibc's qsort and a slow comparator, for a
 * wall-clock duration: main -> sort_many -> qsort (glibc) -> ... -> cmp_slow.
 * Nearly all of the CPU is in cmp_slow, called back from inside libc; built
 * WITHOUT frame pointers (and Debian's glibc has none either), so only
 * .eh_frame unwinding through libc finds sort_many and main.
 *
 * usage: qsort_cmp SECONDS [--wait-stdin]
 *
 * At exit it prints one line to stdout:
 *   pid=P sorts=S
 *
 * Build: gcc -O2 -g -o qsort_cmp qsort_cmp.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

/* Elements per sort: large enough for glibc's merge sort to recurse. */
#define ELEMENTS 20000
/* Extra work per comparison. */
#define CMP_STEPS 48

static volatile uint64_t sink;

static uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Compares two uint32_t after burning a little CPU. */
NOINLINE int cmp_slow(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    uint64_t x = a ^ ((uint64_t)b << 32);
    for (int i = 0; i < CMP_STEPS; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
    return (a > b) - (a < b);
}

/* Fills and sorts the array until the deadline; returns the sorts done. */
NOINLINE unsigned sort_many(double seconds, uint32_t *v, size_t n)
{
    uint64_t end = clock_ns() + (uint64_t)(seconds * 1e9);
    uint64_t x = 12345;
    unsigned sorts = 0;
    while (clock_ns() < end) {
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            v[i] = (uint32_t)(x >> 32);
        }
        qsort(v, n, sizeof *v, cmp_slow);
        for (size_t i = 1; i < n; i++)
            if (v[i - 1] > v[i])
                abort();
        sorts++;
    }
    return sorts;
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
    uint32_t *v = malloc(ELEMENTS * sizeof *v);
    if (!v) {
        perror("malloc");
        return 1;
    }
    unsigned sorts = sort_many(seconds, v, ELEMENTS);
    free(v);
    printf("pid=%d sorts=%u\n", (int)getpid(), sorts);
    return 0;
}
