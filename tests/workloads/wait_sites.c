/*
 * wait_sites: the block profiler's bias example as a user writes it. Sites
 * wait_a, wait_b and wait_c make timed futex waits of 1, 2 and 3 ms (counts
 * in the ratio 3 : 1.5 : 1, equal blocked time per site) by calling
 * syscall(2) themselves. The three functions have the same code and frame,
 * and are called from the same function at the same depth, so every wait
 * starts from the same registers (ip in glibc's syscall, sp, bp): only the
 * return address in the stack tells the sites apart. Built as a user
 * builds it: gcc -O1 -g -fno-omit-frame-pointer -fno-inline.
 *
 * Every wait is a FUTEX_WAIT on a word nobody changes, with a relative
 * timeout of the site's length, timed by the program (CLOCK_MONOTONIC
 * around the system call) and tallied per site and thread, with the CPU
 * time the thread used meanwhile (CLOCK_THREAD_CPUTIME_ID around the same
 * span): the wait's time off CPU is the difference.
 *
 * usage: wait_sites [--wait-stdin] [--rounds N] [--threads T] [--phase-ms P]
 *                   [--depth D]
 *   --wait-stdin  print "ready pid=P", then read one byte (or EOF) from
 *                 stdin before waiting, so that a profiler can attach first
 *   --rounds N    rounds per thread (default 100); a round makes 6 waits
 *                 of 1 ms, 3 of 2 ms and 2 of 3 ms
 *   --threads T   threads running the rounds at once, at the same sites
 *                 (default 1; 1 runs them on the main thread)
 *   --phase-ms P  the sites change with time: in each P ms phase a thread
 *                 leaves one site out in turn (a, then b, then c), so
 *                 that a window holds some sites and not others
 *                 (default 0: every round visits every site)
 *   --depth D     every round is called through D more frames of
 *                 `descend` (default 0), so that walks of every length
 *                 the profiler treats apart can be had
 *
 * Output on stdout, line buffered, after the work:
 *   site NAME wait_ns W waits N total_ns T min_ns A max_ns Z oncpu_ns C
 *     one line per site, over all threads
 *   work pid=P start_ns=S end_ns=E   (CLOCK_REALTIME around the work)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define MS 1000000ULL
#define N_SITES 3
#define MAX_THREADS 16

struct tally {
    uint64_t waits, total_ns, min_ns, max_ns, oncpu_ns;
};

struct worker {
    pthread_t thread;
    long rounds;
    long phase_ms;
    long depth;
    struct tally tallies[N_SITES];
};

/* Never changed: every wait on it lasts until its timeout. */
static uint32_t word;

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void tally(struct tally *t, uint64_t took, uint64_t oncpu)
{
    t->oncpu_ns += oncpu;
    if (t->waits == 0 || took < t->min_ns)
        t->min_ns = took;
    if (took > t->max_ns)
        t->max_ns = took;
    t->waits++;
    t->total_ns += took;
}

static void check(long r, uint64_t ns)
{
    if (r != -1 || errno != ETIMEDOUT) {
        fprintf(stderr, "futex wait of %llu ns returned %ld (%s), not a timeout\n",
                (unsigned long long)ns, r, strerror(errno));
        exit(1);
    }
}

/* The sites: the same code, each calling syscall(2) itself. */
NOINLINE void wait_a(struct tally *t)
{
    struct timespec timeout = {.tv_sec = 0, .tv_nsec = 1 * MS};
    uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    long r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    uint64_t took = clock_ns(CLOCK_MONOTONIC) - start;
    check(r, 1 * MS);
    tally(t, took, clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu);
}

NOINLINE void wait_b(struct tally *t)
{
    struct timespec timeout = {.tv_sec = 0, .tv_nsec = 2 * MS};
    uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    long r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    uint64_t took = clock_ns(CLOCK_MONOTONIC) - start;
    check(r, 2 * MS);
    tally(t, took, clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu);
}

NOINLINE void wait_c(struct tally *t)
{
    struct timespec timeout = {.tv_sec = 0, .tv_nsec = 3 * MS};
    uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    long r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    uint64_t took = clock_ns(CLOCK_MONOTONIC) - start;
    check(r, 3 * MS);
    tally(t, took, clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu);
}

static const struct {
    const char *name;
    void (*wait)(struct tally *);
    uint64_t wait_ns;
    int per_round;
} sites[N_SITES] = {
    {"wait_a", wait_a, 1 * MS, 6},
    {"wait_b", wait_b, 2 * MS, 3},
    {"wait_c", wait_c, 3 * MS, 2},
};

/* One round: every site (or all but one, by phase), interleaved so that
 * consecutive waits change site. */
NOINLINE void round_of_waits(struct worker *w, int skip)
{
    for (int i = 0; i < 6; i++)
        for (int s = 0; s < N_SITES; s++)
            if (s != skip && i < sites[s].per_round)
                sites[s].wait(&w->tallies[s]);
}

/* D frames more between the thread's root and its round of waits; the
 * call is not in tail position, so each level keeps its frame. */
NOINLINE int descend(struct worker *w, int skip, long d)
{
    if (d > 0) {
        int r = descend(w, skip, d - 1);
        __asm__ volatile("" ::: "memory");
        return r;
    }
    round_of_waits(w, skip);
    return 0;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    for (long r = 0; r < w->rounds; r++) {
        int skip = -1;
        if (w->phase_ms > 0)
            skip = (int)(((clock_ns(CLOCK_MONOTONIC) - start) / (w->phase_ms * MS)) % N_SITES);
        descend(w, skip, w->depth);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int wait = 0;
    long rounds = 100, threads = 1, phase_ms = 0, depth = 0;
    for (int i = 1; i < argc; i++) {
        long *value = NULL;
        if (strcmp(argv[i], "--wait-stdin") == 0) {
            wait = 1;
            continue;
        } else if (strcmp(argv[i], "--rounds") == 0) {
            value = &rounds;
        } else if (strcmp(argv[i], "--threads") == 0) {
            value = &threads;
        } else if (strcmp(argv[i], "--phase-ms") == 0) {
            value = &phase_ms;
        } else if (strcmp(argv[i], "--depth") == 0) {
            value = &depth;
        }
        char *end = NULL;
        if (value == NULL || i + 1 >= argc ||
            (*value = strtol(argv[++i], &end, 10), *end != '\0') || *value < 0) {
            fprintf(stderr,
                    "usage: %s [--wait-stdin] [--rounds N] [--threads T] [--phase-ms P] "
                    "[--depth D]\n",
                    argv[0]);
            return 2;
        }
    }
    if (threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "--threads must be 1 to %d\n", MAX_THREADS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (wait) {
        printf("ready pid=%d\n", (int)getpid());
        char byte;
        if (read(0, &byte, 1) < 0)
            perror("read stdin");
    }

    static struct worker workers[MAX_THREADS];
    uint64_t start_ns = clock_ns(CLOCK_REALTIME);
    for (long t = 0; t < threads; t++) {
        workers[t].rounds = rounds;
        workers[t].phase_ms = phase_ms;
        workers[t].depth = depth;
    }
    if (threads == 1) {
        run(&workers[0]);
    } else {
        for (long t = 0; t < threads; t++)
            if (pthread_create(&workers[t].thread, NULL, run, &workers[t]) != 0) {
                perror("pthread_create");
                return 1;
            }
        for (long t = 0; t < threads; t++)
            pthread_join(workers[t].thread, NULL);
    }
    uint64_t end_ns = clock_ns(CLOCK_REALTIME);

    for (int s = 0; s < N_SITES; s++) {
        struct tally all = {0};
        for (long t = 0; t < threads; t++) {
            const struct tally *x = &workers[t].tallies[s];
            if (x->waits == 0)
                continue;
            if (all.waits == 0 || x->min_ns < all.min_ns)
                all.min_ns = x->min_ns;
            if (x->max_ns > all.max_ns)
                all.max_ns = x->max_ns;
            all.waits += x->waits;
            all.total_ns += x->total_ns;
            all.oncpu_ns += x->oncpu_ns;
        }
        printf("site %s wait_ns %llu waits %llu total_ns %llu min_ns %llu max_ns %llu "
               "oncpu_ns %llu\n",
               sites[s].name, (unsigned long long)sites[s].wait_ns,
               (unsigned long long)all.waits, (unsigned long long)all.total_ns,
               (unsigned long long)all.min_ns, (unsigned long long)all.max_ns,
               (unsigned long long)all.oncpu_ns);
    }
    printf("work pid=%d start_ns=%llu end_ns=%llu\n", (int)getpid(),
           (unsigned long long)start_ns, (unsigned long long)end_ns);
    return 0;
}
