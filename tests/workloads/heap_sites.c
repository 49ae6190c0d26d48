/*
 * heap_sites: allocates at known sites, each a function of its own, with
 * known sizes and numbers of calls, and prints what it did, so that a heap
 * profile can be compared with the truth.
 *
 * usage: heap_sites [--wait-stdin] [--hold] [--scale F]
 *   --wait-stdin  print "ready pid=P", then read one byte (or EOF) from
 *                 stdin before allocating, so that a profiler can attach
 *                 first (its libraries are all mapped by then)
 *   --hold        after the work, keep the leak site's objects live until
 *                 stdin gives one more byte or EOF; then free them and exit
 *   --scale F     multiply every site's number of calls (or rounds) by F
 *                 (default 1; 0 allocates nothing)
 * Without --hold it exits right after its work, the leak still live.
 *
 * Every site but site_leak frees what it allocates before it returns. One
 * call of malloc, calloc, realloc, reallocarray, posix_memalign,
 * aligned_alloc or memalign is one allocation of the size it asks for
 * (calloc: nmemb * size; realloc and reallocarray: the new size).
 *
 * Output on stdout, line buffered:
 *   ready pid=P                     (--wait-stdin, before the wait)
 * and after the work:
 *   site NAME calls N bytes B min_size A max_size Z live L live_bytes LB
 *     one line per site: N allocations of B bytes in all, each of A to Z
 *     bytes; L of them (LB bytes) still allocated when the line is printed
 *   work pid=P start_ns=S end_ns=E
 *     CLOCK_REALTIME just before the first and just after the last
 *     allocation of the work
 *   holding pid=P realtime_ns=T     (--hold: the leak is live from now on)
 *   released pid=P freed=N          (--hold: the leak is freed)
 *   done pid=P
 *
 * Build: gcc -O2 -g -o heap_sites heap_sites.c [-ljemalloc]
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define KIB 1024UL

/* A volatile store into the block and a pointer that escapes: the compiler
 * may not drop a malloc/free pair whose memory it can prove unused. */
static void *volatile escaped;
#define TOUCH(p, n)                                                            \
    do {                                                                       \
        ((volatile unsigned char *)(p))[0] = 1;                                \
        ((volatile unsigned char *)(p))[(n) - 1] = 1;                          \
        escaped = (p);                                                         \
    } while (0)

struct tally {
    unsigned long calls, bytes, min_size, max_size, live, live_bytes;
};

static void count(struct tally *t, unsigned long size)
{
    if (t->calls == 0 || size < t->min_size)
        t->min_size = size;
    if (size > t->max_size)
        t->max_size = size;
    t->calls++;
    t->bytes += size;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* Fixed-size malloc/free pairs; one function per size so that each has a
 * stack of its own. */
#define MALLOC_SITE(name, size)                                                \
    NOINLINE void name(unsigned long n, struct tally *t)                       \
    {                                                                          \
        for (unsigned long i = 0; i < n; i++) {                                \
            void *p = malloc(size);                                            \
            if (!p)                                                            \
                die("malloc");                                                 \
            TOUCH(p, size);                                                    \
            count(t, size);                                                    \
            free(p);                                                           \
        }                                                                      \
    }

MALLOC_SITE(site_malloc_16, 16)
MALLOC_SITE(site_malloc_256, 256)
MALLOC_SITE(site_malloc_4k, 4 * KIB)
MALLOC_SITE(site_malloc_64k, 64 * KIB)
MALLOC_SITE(site_malloc_512k, 512 * KIB)

#define CALLOC_NMEMB 64
#define CALLOC_SIZE 16

NOINLINE void site_calloc(unsigned long n, struct tally *t)
{
    for (unsigned long i = 0; i < n; i++) {
        void *p = calloc(CALLOC_NMEMB, CALLOC_SIZE);
        if (!p)
            die("calloc");
        TOUCH(p, CALLOC_NMEMB * CALLOC_SIZE);
        count(t, CALLOC_NMEMB * CALLOC_SIZE);
        free(p);
    }
}

/* Growth from nothing to 512 KiB in steps of 64 KiB, every size at least
 * 128 KiB: far above the sampling rates the tests use, so that every call
 * is nearly sure to be sampled and the rescaling of a stack by its mean
 * size is exact despite the varying sizes. The first call of each round is
 * realloc(NULL, n), which glibc serves by calling malloc: still one
 * allocation. */
#define GROW_MIN (128 * KIB)
#define GROW_MAX (512 * KIB)
#define GROW_STEP (64 * KIB)

NOINLINE void site_realloc(unsigned long rounds, struct tally *t)
{
    for (unsigned long r = 0; r < rounds; r++) {
        void *buf = NULL;
        for (unsigned long size = GROW_MIN; size <= GROW_MAX; size += GROW_STEP) {
            void *grown = realloc(buf, size);
            if (!grown)
                die("realloc");
            buf = grown;
            TOUCH(buf, size);
            count(t, size);
        }
        free(buf);
    }
}

/* The same growth through reallocarray (glibc's calls realloc). */
#define GROW_ELEM (8 * KIB)

NOINLINE void site_reallocarray(unsigned long rounds, struct tally *t)
{
    for (unsigned long r = 0; r < rounds; r++) {
        void *buf = NULL;
        for (unsigned long n = GROW_MIN / GROW_ELEM; n <= GROW_MAX / GROW_ELEM;
             n += GROW_STEP / GROW_ELEM) {
            void *grown = reallocarray(buf, n, GROW_ELEM);
            if (!grown)
                die("reallocarray");
            buf = grown;
            TOUCH(buf, n * GROW_ELEM);
            count(t, n * GROW_ELEM);
        }
        free(buf);
    }
}

/* Alignments above malloc's own 16 bytes: glibc hands smaller ones to
 * malloc. */
#define PM_ALIGN 64
#define PM_SIZE (2 * KIB)

NOINLINE void site_posix_memalign(unsigned long n, struct tally *t)
{
    for (unsigned long i = 0; i < n; i++) {
        void *p = NULL;
        if (posix_memalign(&p, PM_ALIGN, PM_SIZE) != 0)
            die("posix_memalign");
        TOUCH(p, PM_SIZE);
        count(t, PM_SIZE);
        free(p);
    }
}

#define AA_ALIGN (4 * KIB)
#define AA_SIZE (8 * KIB)

NOINLINE void site_aligned_alloc(unsigned long n, struct tally *t)
{
    for (unsigned long i = 0; i < n; i++) {
        void *p = aligned_alloc(AA_ALIGN, AA_SIZE);
        if (!p)
            die("aligned_alloc");
        TOUCH(p, AA_SIZE);
        count(t, AA_SIZE);
        free(p);
    }
}

#define MA_ALIGN 256
#define MA_SIZE (3 * KIB)

NOINLINE void site_memalign(unsigned long n, struct tally *t)
{
    for (unsigned long i = 0; i < n; i++) {
        void *p = memalign(MA_ALIGN, MA_SIZE);
        if (!p)
            die("memalign");
        TOUCH(p, MA_SIZE);
        count(t, MA_SIZE);
        free(p);
    }
}

/* Objects that stay allocated until the process ends or, with --hold,
 * until site_leak_free. */
#define LEAK_SIZE (4 * KIB)
static void **leaked;
static unsigned long n_leaked;

NOINLINE void site_leak(unsigned long n, struct tally *t)
{
    for (unsigned long i = 0; i < n; i++) {
        void *p = malloc(LEAK_SIZE);
        if (!p)
            die("malloc");
        TOUCH(p, LEAK_SIZE);
        count(t, LEAK_SIZE);
        leaked[n_leaked++] = p;
    }
    t->live = n_leaked;
    t->live_bytes = n_leaked * LEAK_SIZE;
}

NOINLINE unsigned long site_leak_free(void)
{
    unsigned long n = n_leaked;
    for (unsigned long i = 0; i < n; i++)
        free(leaked[i]);
    n_leaked = 0;
    return n;
}

struct site {
    const char *name;
    void (*run)(unsigned long, struct tally *);
    /* Calls, or rounds of growth for the realloc sites, at scale 1. */
    unsigned long base;
};

/* At scale 1 each site expects at least about 1400 samples at a sampling
 * rate of 16 KiB: calls * (1 - exp(-size / 16384)). */
static const struct site sites[] = {
    {"site_malloc_16", site_malloc_16, 1500000},
    {"site_malloc_256", site_malloc_256, 150000},
    {"site_malloc_4k", site_malloc_4k, 12000},
    {"site_malloc_64k", site_malloc_64k, 3000},
    {"site_malloc_512k", site_malloc_512k, 1500},
    {"site_calloc", site_calloc, 60000},
    {"site_realloc", site_realloc, 200},
    {"site_reallocarray", site_reallocarray, 200},
    {"site_posix_memalign", site_posix_memalign, 25000},
    {"site_aligned_alloc", site_aligned_alloc, 8000},
    {"site_memalign", site_memalign, 15000},
    {"site_leak", site_leak, 12000},
};
#define N_SITES (sizeof sites / sizeof sites[0])

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* One byte of stdin, or EOF. */
static void wait_stdin(void)
{
    char byte;
    if (read(0, &byte, 1) < 0)
        perror("read stdin");
}

int main(int argc, char **argv)
{
    int wait = 0, hold = 0;
    double scale = 1.0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0) {
            wait = 1;
        } else if (strcmp(argv[i], "--hold") == 0) {
            hold = 1;
        } else if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc) {
            char *end;
            scale = strtod(argv[++i], &end);
            if (*end != '\0' || !(scale >= 0)) {
                fprintf(stderr, "bad --scale %s\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--wait-stdin] [--hold] [--scale F]\n", argv[0]);
            return 2;
        }
    }
    /* A static buffer: stdio must not allocate behind the sites' backs, and
     * each line must reach a pipe at once. */
    static char outbuf[8192];
    setvbuf(stdout, outbuf, _IOLBF, sizeof outbuf);

    unsigned long runs[N_SITES];
    for (size_t s = 0; s < N_SITES; s++)
        runs[s] = (unsigned long)((double)sites[s].base * scale + 0.5);
    for (size_t s = 0; s < N_SITES; s++)
        if (sites[s].run == site_leak) {
            leaked = calloc(runs[s] + 1, sizeof *leaked);
            if (!leaked)
                die("calloc");
        }
    struct tally tallies[N_SITES];
    memset(tallies, 0, sizeof tallies);

    if (wait) {
        printf("ready pid=%d\n", (int)getpid());
        wait_stdin();
    }
    uint64_t start_ns = realtime_ns();
    for (size_t s = 0; s < N_SITES; s++)
        sites[s].run(runs[s], &tallies[s]);
    uint64_t end_ns = realtime_ns();

    int pid = (int)getpid();
    for (size_t s = 0; s < N_SITES; s++) {
        const struct tally *t = &tallies[s];
        printf("site %s calls %lu bytes %lu min_size %lu max_size %lu live %lu "
               "live_bytes %lu\n",
               sites[s].name, t->calls, t->bytes, t->min_size, t->max_size, t->live,
               t->live_bytes);
    }
    printf("work pid=%d start_ns=%llu end_ns=%llu\n", pid, (unsigned long long)start_ns,
           (unsigned long long)end_ns);
    if (hold) {
        printf("holding pid=%d realtime_ns=%llu\n", pid, (unsigned long long)realtime_ns());
        wait_stdin();
        unsigned long freed = site_leak_free();
        printf("released pid=%d freed=%lu\n", pid, freed);
    }
    printf("done pid=%d\n", pid);
    return 0;
}
