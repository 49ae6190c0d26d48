/*
 * mutex_hold: one thread ("holder") holds a mutex for a fixed time over and
 * over while another ("waiter") keeps trying to take it, so that nearly
 * every hold ends with an unlock that wakes the waiter from a futex wait.
 * The waiter times every pthread_mutex_lock itself (CLOCK_MONOTONIC around
 * the call): their total is the time it was blocked on the mutex, which a
 * block profile charges to the waiter's lock site (waiter_lock) and a mutex
 * profile to the holder's unlock site (holder_unlock).
 *
 * usage: mutex_hold [--wait-stdin] [--iterations N] [--hold-us U]
 *   --wait-stdin    print "ready pid=P", then read one byte (or EOF) from
 *                   stdin before starting the threads, so that a profiler
 *                   can attach first
 *   --iterations N  holds (default 300)
 *   --hold-us U     length of a hold in microseconds (default 2000)
 *
 * Output on stdout, line buffered, after the work:
 *   holder holds=N hold_ns=H waited_ns=W
 *     N holds measured to total H ns (lock to unlock); W ns the waiter had
 *     waited by the unlocks that found it waiting (from its clock before
 *     its lock to the holder's before the unlock): what a mutex profile
 *     charges the unlock, without the waiter's wake-up after it
 *   waiter locks=L lock_ns=T blocked=B blocked_ns=BT
 *     L locks that took T ns in all; B of them found the mutex held (a
 *     pthread_mutex_trylock failed first, so the lock waited for an
 *     unlock), BT ns in all
 *   work pid=P start_ns=S end_ns=E   (CLOCK_REALTIME around the work)
 *   mutex addr=A   (decimal address of the pthread_mutex_t)
 *
 * Build: gcc -O2 -g -pthread -o mutex_hold mutex_hold.c
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
static volatile int stop;
static long iterations = 300;
static long hold_us = 2000;

/* Stored to after the unlock: a tail call to pthread_mutex_unlock would
 * take holder_unlock off the stack (waiter_lock reads the clock after its
 * lock, which does the same). */
static volatile uint64_t unlocks;

/* Locks the waiter has taken and released: the holder waits for the count
 * to move before its next hold, so that every hold wakes the waiter once.
 * (A fixed pause let a slow-to-run waiter, on a loaded machine, find the
 * mutex held again when it woke and wait twice for one lock.) */
static uint64_t waiter_done;

/* When the waiter began a lock that found the mutex held (0: it is not
 * waiting), and what the holder's unlocks found of it. */
static uint64_t waiting_since, unlock_waited_ns;

struct waiter_tally {
    uint64_t locks, lock_ns, blocked, blocked_ns;
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

/* The unlock site: the wake-up of the waiter is made here. */
NOINLINE void holder_unlock(void)
{
    uint64_t since = __atomic_load_n(&waiting_since, __ATOMIC_ACQUIRE);
    if (since != 0)
        unlock_waited_ns += clock_ns(CLOCK_MONOTONIC) - since;
    check(pthread_mutex_unlock(&mu), "pthread_mutex_unlock");
    unlocks++;
    __asm__ volatile("" ::: "memory");
}

/* The lock site: the waiter's futex waits are made here. A lock that
 * finds the mutex held is counted as blocked: it waits for the unlock (by
 * timing alone, a wait that began late in a hold cannot be told from an
 * uncontended lock on a loaded machine). */
NOINLINE uint64_t waiter_lock(int *blocked)
{
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    int err = pthread_mutex_trylock(&mu);
    *blocked = err == EBUSY;
    if (*blocked) {
        __atomic_store_n(&waiting_since, start, __ATOMIC_RELEASE);
        check(pthread_mutex_lock(&mu), "pthread_mutex_lock");
        __atomic_store_n(&waiting_since, 0, __ATOMIC_RELEASE);
    } else
        check(err, "pthread_mutex_trylock");
    return clock_ns(CLOCK_MONOTONIC) - start;
}

static uint64_t hold_ns_total;

static void *holder(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "holder");
    for (long i = 0; i < iterations; i++) {
        check(pthread_mutex_lock(&mu), "pthread_mutex_lock");
        uint64_t locked = clock_ns(CLOCK_MONOTONIC);
        usleep(hold_us);
        hold_ns_total += clock_ns(CLOCK_MONOTONIC) - locked;
        uint64_t seen = __atomic_load_n(&waiter_done, __ATOMIC_ACQUIRE);
        holder_unlock();
        /* The woken waiter takes and releases the mutex before the next
         * hold; a second apart at most, should it never come. */
        uint64_t unlocked = clock_ns(CLOCK_MONOTONIC);
        while (__atomic_load_n(&waiter_done, __ATOMIC_ACQUIRE) == seen &&
               clock_ns(CLOCK_MONOTONIC) - unlocked < 1000000000ULL)
            usleep(20);
    }
    stop = 1;
    return NULL;
}

static void *waiter(void *arg)
{
    struct waiter_tally *t = arg;
    pthread_setname_np(pthread_self(), "waiter");
    while (!stop) {
        usleep(50);
        int blocked;
        uint64_t took = waiter_lock(&blocked);
        check(pthread_mutex_unlock(&mu), "pthread_mutex_unlock");
        __atomic_add_fetch(&waiter_done, 1, __ATOMIC_RELEASE);
        t->locks++;
        t->lock_ns += took;
        if (blocked) {
            t->blocked++;
            t->blocked_ns += took;
        }
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
        } else if (strcmp(argv[i], "--hold-us") == 0 && i + 1 < argc) {
            hold_us = parse_long(argv[++i], "--hold-us");
        } else {
            fprintf(stderr, "usage: %s [--wait-stdin] [--iterations N] [--hold-us U]\n",
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

    struct waiter_tally tally;
    memset(&tally, 0, sizeof tally);
    pthread_t h, w;
    uint64_t start_ns = clock_ns(CLOCK_REALTIME);
    check(pthread_create(&h, NULL, holder, NULL), "pthread_create");
    check(pthread_create(&w, NULL, waiter, &tally), "pthread_create");
    check(pthread_join(h, NULL), "pthread_join");
    check(pthread_join(w, NULL), "pthread_join");
    uint64_t end_ns = clock_ns(CLOCK_REALTIME);

    printf("holder holds=%ld hold_ns=%llu waited_ns=%llu\n", iterations,
           (unsigned long long)hold_ns_total, (unsigned long long)unlock_waited_ns);
    printf("waiter locks=%llu lock_ns=%llu blocked=%llu blocked_ns=%llu\n",
           (unsigned long long)tally.locks, (unsigned long long)tally.lock_ns,
           (unsigned long long)tally.blocked, (unsigned long long)tally.blocked_ns);
    printf("work pid=%d start_ns=%llu end_ns=%llu\n", (int)getpid(),
           (unsigned long long)start_ns, (unsigned long long)end_ns);
    printf("mutex addr=%llu\n", (unsigned long long)(uintptr_t)&mu);
    return 0;
}
