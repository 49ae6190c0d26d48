/*
 * cond_wait: a thread ("sleeper") waits on a condition variable, over and
 * over, for another ("signaler") that sets a flag and signals it every
 * few milliseconds. The sleeper alternates pthread_cond_wait
 * (sleeper_wait) and pthread_cond_timedwait with a far deadline
 * (sleeper_timedwait), and times each wait itself (CLOCK_MONOTONIC around
 * the call): their total is the time it was blocked on the condition,
 * which a block profile charges to those two sites, labelled with the
 * condition's address.
 *
 * usage: cond_wait [--wait-stdin] [--iterations N] [--period-us U]
 *   --wait-stdin    print "ready pid=P", then read one byte (or EOF) from
 *                   stdin before starting the threads
 *   --iterations N  signals (default 300)
 *   --period-us U   time between signals in microseconds (default 2000)
 *
 * Output on stdout, line buffered, after the work:
 *   cond addr=A mutex=M       (decimal addresses of the condition, mutex)
 *   sleeper waits=W wait_ns=T timed_waits=TW timed_wait_ns=TT
 *     W calls of pthread_cond_wait took T ns in all; TW of
 *     pthread_cond_timedwait took TT ns
 *   signaler signals=S waited_ns=D
 *     S signals found the sleeper waiting, for D ns in all by then (from
 *     its clock before the call to the signaler's before the signal): what
 *     a mutex profile charges the signaler, without the sleeper's wake-up
 *   work pid=P
 *
 * Build: gcc -O2 -g -pthread -o cond_wait cond_wait.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int ready, done;
static long iterations = 300;
static long period_us = 2000;
static volatile uint64_t calls;
/* When the sleeper's current wait began (0: not waiting), and what the
 * signaler found; both under mu. */
static uint64_t wait_started, signals, signaled_ns;

struct sleeper_tally {
    uint64_t waits, wait_ns, timed_waits, timed_wait_ns;
};

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void check(int err, const char *what)
{
    if (err != 0) {
        fprintf(stderr, "%s: %s\n", what, strerror(err));
        exit(1);
    }
}

/* The two wait sites; the counter after the call keeps them off a tail
 * call. */
NOINLINE uint64_t sleeper_wait(void)
{
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    wait_started = start;
    check(pthread_cond_wait(&cv, &mu), "pthread_cond_wait");
    wait_started = 0;
    calls++;
    return clock_ns(CLOCK_MONOTONIC) - start;
}

NOINLINE uint64_t sleeper_timedwait(void)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 60;
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    wait_started = start;
    int err = pthread_cond_timedwait(&cv, &mu, &deadline);
    wait_started = 0;
    if (err != ETIMEDOUT)
        check(err, "pthread_cond_timedwait");
    calls++;
    return clock_ns(CLOCK_MONOTONIC) - start;
}

static void *sleeper(void *arg)
{
    struct sleeper_tally *t = arg;
    pthread_setname_np(pthread_self(), "sleeper");
    check(pthread_mutex_lock(&mu), "pthread_mutex_lock");
    for (long n = 0; !done; n++) {
        while (!ready && !done) {
            if (n % 2 == 0) {
                t->wait_ns += sleeper_wait();
                t->waits++;
            } else {
                t->timed_wait_ns += sleeper_timedwait();
                t->timed_waits++;
            }
        }
        ready = 0;
    }
    check(pthread_mutex_unlock(&mu), "pthread_mutex_unlock");
    return NULL;
}

static void *signaler(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "signaler");
    for (long i = 0; i < iterations; i++) {
        usleep(period_us);
        check(pthread_mutex_lock(&mu), "pthread_mutex_lock");
        ready = 1;
        if (i == iterations - 1)
            done = 1;
        if (wait_started != 0) {
            signals++;
            signaled_ns += clock_ns(CLOCK_MONOTONIC) - wait_started;
        }
        check(pthread_cond_signal(&cv), "pthread_cond_signal");
        check(pthread_mutex_unlock(&mu), "pthread_mutex_unlock");
    }
    return NULL;
}

static long parse_long(const char *s, const char *what)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v <= 0) {
        fprintf(stderr, "bad %s %s\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    int wait = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0) {
            wait = 1;
        } else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
            iterations = parse_long(argv[++i], "--iterations");
        } else if (strcmp(argv[i], "--period-us") == 0 && i + 1 < argc) {
            period_us = parse_long(argv[++i], "--period-us");
        } else {
            fprintf(stderr, "usage: %s [--wait-stdin] [--iterations N] [--period-us U]\n",
                    argv[0]);
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

    struct sleeper_tally tally;
    memset(&tally, 0, sizeof tally);
    pthread_t s, g;
    check(pthread_create(&s, NULL, sleeper, &tally), "pthread_create");
    check(pthread_create(&g, NULL, signaler, NULL), "pthread_create");
    check(pthread_join(g, NULL), "pthread_join");
    check(pthread_join(s, NULL), "pthread_join");

    printf("cond addr=%llu mutex=%llu\n", (unsigned long long)(uintptr_t)&cv,
           (unsigned long long)(uintptr_t)&mu);
    printf("sleeper waits=%llu wait_ns=%llu timed_waits=%llu timed_wait_ns=%llu\n",
           (unsigned long long)tally.waits, (unsigned long long)tally.wait_ns,
           (unsigned long long)tally.timed_waits, (unsigned long long)tally.timed_wait_ns);
    printf("signaler signals=%llu waited_ns=%llu\n", (unsigned long long)signals,
           (unsigned long long)signaled_ns);
    printf("work pid=%d\n", (int)getpid());
    return 0;
}
