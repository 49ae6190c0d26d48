/*
 * block_sites: the block profiler's bias example made real. Three sites
 * block in futex waits of 1, 2 and 3 ms, as many times as it takes for
 * their blocked time to be equal (counts in the ratio 3 : 1.5 : 1). Each
 * wait is a FUTEX_WAIT on a word nobody changes, with a relative timeout of
 * the site's length: a real futex wait that ends when it times out. The
 * program times every wait itself (CLOCK_MONOTONIC around the system call)
 * and prints per site the number of waits and their measured total, so that
 * a block profile can be compared with the truth.
 *
 * usage: block_sites [--wait-stdin] [--rounds N]
 *   --wait-stdin  print "ready pid=P", then read one byte (or EOF) from
 *                 stdin before waiting, so that a profiler can attach first
 *   --rounds N    rounds of waits (default 200); each round makes 6 waits
 *                 of 1 ms, 3 of 2 ms and 2 of 3 ms, so that a load that
 *                 varies over time touches every site alike
 *
 * Output on stdout, line buffered, after the work:
 *   site NAME wait_ns W waits N total_ns T min_ns A max_ns Z
 *     one line per site: N waits asked to last W ns, measured to total T
 *     ns, the shortest A ns and the longest Z ns
 *   work pid=P start_ns=S end_ns=E   (CLOCK_REALTIME around the work)
 *
 * Build: gcc -O2 -g -o block_sites block_sites.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define MS 1000000ULL

struct tally {
    uint64_t waits, total_ns, min_ns, max_ns;
};

/* Never changed: every wait on it lasts until its timeout. */
static uint32_t word;

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* One futex wait of `ns`, timed and counted in `t`. */
NOINLINE void futex_wait_for(uint64_t ns, struct tally *t)
{
    struct timespec timeout = {.tv_sec = ns / 1000000000ULL, .tv_nsec = ns % 1000000000ULL};
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    long r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    uint64_t took = clock_ns(CLOCK_MONOTONIC) - start;
    if (r != -1 || errno != ETIMEDOUT) {
        fprintf(stderr, "futex wait of %llu ns returned %ld (%s), not a timeout\n",
                (unsigned long long)ns, r, strerror(errno));
        exit(1);
    }
    if (t->waits == 0 || took < t->min_ns)
        t->min_ns = took;
    if (took > t->max_ns)
        t->max_ns = took;
    t->waits++;
    t->total_ns += took;
}

/* One function per site, so that each has a stack of its own. */
NOINLINE void site_wait_1ms(int n, struct tally *t)
{
    for (int i = 0; i < n; i++)
        futex_wait_for(1 * MS, t);
}

NOINLINE void site_wait_2ms(int n, struct tally *t)
{
    for (int i = 0; i < n; i++)
        futex_wait_for(2 * MS, t);
}

NOINLINE void site_wait_3ms(int n, struct tally *t)
{
    for (int i = 0; i < n; i++)
        futex_wait_for(3 * MS, t);
}

struct site {
    const char *name;
    void (*run)(int, struct tally *);
    uint64_t wait_ns;
    int per_round;
};

/* Equal blocked time per round: 6 x 1 ms = 3 x 2 ms = 2 x 3 ms. */
static const struct site sites[] = {
    {"site_wait_1ms", site_wait_1ms, 1 * MS, 6},
    {"site_wait_2ms", site_wait_2ms, 2 * MS, 3},
    {"site_wait_3ms", site_wait_3ms, 3 * MS, 2},
};
#define N_SITES (sizeof sites / sizeof sites[0])

int main(int argc, char **argv)
{
    int wait = 0;
    long rounds = 200;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0) {
            wait = 1;
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            char *end;
            rounds = strtol(argv[++i], &end, 10);
            if (*end != '\0' || rounds < 0) {
                fprintf(stderr, "bad --rounds %s\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--wait-stdin] [--rounds N]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (wait) {
        printf("ready pid=%d\n", (int)getpid());
        char byte;
        if (read(0, &byte, 1) < 0)
            perror("read stdin");
    }

    struct tally tallies[N_SITES];
    memset(tallies, 0, sizeof tallies);
    uint64_t start_ns = clock_ns(CLOCK_REALTIME);
    for (long r = 0; r < rounds; r++)
        for (size_t s = 0; s < N_SITES; s++)
            sites[s].run(sites[s].per_round, &tallies[s]);
    uint64_t end_ns = clock_ns(CLOCK_REALTIME);

    for (size_t s = 0; s < N_SITES; s++) {
        const struct tally *t = &tallies[s];
        printf("site %s wait_ns %llu waits %llu total_ns %llu min_ns %llu max_ns %llu\n",
               sites[s].name, (unsigned long long)sites[s].wait_ns,
               (unsigned long long)t->waits, (unsigned long long)t->total_ns,
               (unsigned long long)t->min_ns, (unsigned long long)t->max_ns);
    }
    printf("work pid=%d start_ns=%llu end_ns=%llu\n", (int)getpid(),
           (unsigned long long)start_ns, (unsigned long long)end_ns);
    return 0;
}
