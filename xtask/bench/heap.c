/* Allocator cost for `cargo xtask bench --heap`.
 *
 *   heap pairs N64 NMIX REPS  after a line on stdin: REPS rounds of N64
 *                             malloc(64)+free pairs and NMIX pairs of mixed
 *                             sizes (16..4096 B), printing "64 NS" and
 *                             "mix NS" (ns per pair) for each round, then
 *                             waits for stdin to close
 *   heap live N               after a line on stdin: N malloc(64) kept live,
 *                             prints "live NS" (ns per malloc), holds them
 *                             until stdin closes
 *
 * Waiting on stdin lets the parent attach its probes before any timing,
 * and read their run statistics before the process exits. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIX_SIZES 1024

static size_t mix[MIX_SIZES];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The pointer escapes into an asm statement and the block is written, so
 * the compiler may not drop the malloc/free pair. */
static inline void use(void *p) {
    *(volatile char *)p = 1;
    __asm__ volatile("" : : "r"(p) : "memory");
}

static double pairs_fixed(long n) {
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        void *p = malloc(64);
        if (!p) abort();
        use(p);
        free(p);
    }
    return (double)(now_ns() - t0) / (double)n;
}

static double pairs_mixed(long n) {
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        void *p = malloc(mix[i & (MIX_SIZES - 1)]);
        if (!p) abort();
        use(p);
        free(p);
    }
    return (double)(now_ns() - t0) / (double)n;
}

/* "ready" tells the parent that libc is mapped and nothing is timed yet. */
static void wait_line(void) {
    char line[64];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(1);
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "pairs") == 0) {
        long n64 = atol(argv[2]), nmix = atol(argv[3]);
        int reps = atoi(argv[4]);
        /* Fixed pseudo-random sizes: the same sequence in every run. */
        uint64_t x = 88172645463325252u;
        for (int i = 0; i < MIX_SIZES; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            mix[i] = 16 + x % (4096 - 16 + 1);
        }
        wait_line();
        /* Untimed warm-up: page faults and allocator caches. */
        pairs_fixed(n64 / 10 + 1);
        pairs_mixed(nmix / 10 + 1);
        for (int r = 0; r < reps; r++) {
            printf("64 %.2f\n", pairs_fixed(n64));
            printf("mix %.2f\n", pairs_mixed(nmix));
            fflush(stdout);
        }
        while (getchar() != EOF) {
        }
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "live") == 0) {
        long n = atol(argv[2]);
        void **live = malloc(sizeof(void *) * (size_t)n);
        if (!live) abort();
        wait_line();
        uint64_t t0 = now_ns();
        /* Paced at about 100k per second: with every allocation sampled,
         * each sends a stack copy, and a burst faster than the daemon
         * unwinds would overflow the ring (drops are counted, but this
         * measures the live set, not the overflow). */
        uint64_t busy = 0;
        for (long i = 0; i < n; i++) {
            uint64_t t = now_ns();
            live[i] = malloc(64);
            busy += now_ns() - t;
            if (!live[i]) abort();
            use(live[i]);
            if (i % 1000 == 999) {
                struct timespec pause = {0, 10 * 1000 * 1000};
                nanosleep(&pause, NULL);
            }
        }
        (void)t0;
        printf("live %.2f\n", (double)busy / (double)n);
        fflush(stdout);
        while (getchar() != EOF) {
        }
        for (long i = 0; i < n; i++) free(live[i]);
        free(live);
        return 0;
    }
    fprintf(stderr, "usage: heap pairs N64 NMIX REPS | heap live N\n");
    return 2;
}
