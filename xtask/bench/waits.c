/* Futex wait/wake cost for `cargo xtask bench --waits`.
 *
 *   waits pingpong MS REPS CPU after a line on stdin: REPS batches of MS
 *                              milliseconds of round trips between two
 *                              threads, printing per batch "pingpong ROUND_TRIPS
 *                              NS WOKEN EAGAIN WAKES_HIT VCSW IVCSW" (waits
 *                              that slept and were woken, waits that found
 *                              the word changed, wakes that woke a thread,
 *                              voluntary and involuntary context switches of
 *                              the process); then "total CALLS ROUND_TRIPS
 *                              VCSW" over the process's life (futex calls,
 *                              round trips, voluntary switches), and waits
 *                              for stdin to close
 *   waits condpingpong MS REPS CPU   the same, the token passed through a
 *                              pthread mutex and condition variable
 *                              (pthread_cond_wait / pthread_cond_signal)
 *                              instead of a bare futex word
 *   waits rate OPS SECS CPU    after a line on stdin: round trips paced at
 *                              OPS futex calls per second for SECS seconds,
 *                              printing "rate CALLS NS WOKEN VCSW" (futex
 *                              calls, elapsed ns, waits that slept, voluntary
 *                              switches), then waits for stdin to close
 *
 * A round trip: the main thread stores 1 and wakes the partner, then waits
 * until the partner stores 0 and wakes it back; each side makes one wait
 * and one wake, so a round trip is two wait/wake pairs. CPU >= 0 pins both
 * threads to that CPU, -1 leaves them free.
 *
 * Waiting on stdin lets the parent attach its probes before any timing,
 * and read their run statistics before the process exits. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic int word;
static _Atomic int stop;
static int cpu = -1;
/* condpingpong: the token goes through a condition variable. */
static int use_cond;
static pthread_mutex_t cond_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond_cv = PTHREAD_COND_INITIALIZER;

/* Per-thread tallies, summed by the main thread between batches (the
 * partner's are read while it waits, after a release store). */
struct tally {
    _Atomic long woken, eagain, wakes_hit, calls;
};
static struct tally main_t, partner_t;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void wait_while(int value, struct tally *t) {
    if (use_cond) {
        pthread_mutex_lock(&cond_mu);
        while (atomic_load_explicit(&word, memory_order_acquire) == value) {
            pthread_cond_wait(&cond_cv, &cond_mu);
            atomic_fetch_add_explicit(&t->calls, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->woken, 1, memory_order_relaxed);
        }
        pthread_mutex_unlock(&cond_mu);
        return;
    }
    while (atomic_load_explicit(&word, memory_order_acquire) == value) {
        long r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
        atomic_fetch_add_explicit(&t->calls, 1, memory_order_relaxed);
        if (r == 0)
            atomic_fetch_add_explicit(&t->woken, 1, memory_order_relaxed);
        else if (errno == EAGAIN)
            atomic_fetch_add_explicit(&t->eagain, 1, memory_order_relaxed);
    }
}

static void set_and_wake(int value, struct tally *t) {
    if (use_cond) {
        pthread_mutex_lock(&cond_mu);
        atomic_store_explicit(&word, value, memory_order_release);
        pthread_cond_signal(&cond_cv);
        pthread_mutex_unlock(&cond_mu);
        atomic_fetch_add_explicit(&t->calls, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->wakes_hit, 1, memory_order_relaxed);
        return;
    }
    atomic_store_explicit(&word, value, memory_order_release);
    long r = syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    atomic_fetch_add_explicit(&t->calls, 1, memory_order_relaxed);
    if (r > 0)
        atomic_fetch_add_explicit(&t->wakes_hit, 1, memory_order_relaxed);
}

/* SCHED_BATCH: a woken thread does not preempt its waker, so on one CPU
 * the waker goes on to its own wait and every wait really sleeps (under
 * SCHED_OTHER most wakes preempt the waker, whose wait then finds the word
 * already changed and returns at once). */
static void pin(void) {
    struct sched_param sp = {0};
    if (sched_setscheduler(0, SCHED_BATCH, &sp) != 0) {
        perror("sched_setscheduler");
        exit(1);
    }
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        exit(1);
    }
}

static void *partner(void *arg) {
    (void)arg;
    pin();
    for (;;) {
        wait_while(0, &partner_t);
        if (atomic_load_explicit(&stop, memory_order_acquire))
            return NULL;
        set_and_wake(0, &partner_t);
    }
}

static void round_trip(void) {
    set_and_wake(1, &main_t);
    wait_while(1, &main_t);
}

static long sum(_Atomic long *a, _Atomic long *b) {
    return atomic_load(a) + atomic_load(b);
}

static void switches(long *vol, long *invol) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *vol = ru.ru_nvcsw;
    *invol = ru.ru_nivcsw;
}

static pthread_t start_partner(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, partner, NULL) != 0) {
        perror("pthread_create");
        exit(1);
    }
    pin();
    return t;
}

static void stop_partner(pthread_t t) {
    atomic_store_explicit(&stop, 1, memory_order_release);
    set_and_wake(1, &main_t);
    pthread_join(t, NULL);
}

/* "ready" tells the parent that nothing is timed yet. */
static void wait_line(void) {
    char line[64];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        exit(1);
}

static void hold_until_eof(void) {
    while (getchar() != EOF) {
    }
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "condpingpong") == 0) {
        use_cond = 1;
        argv[1] = "pingpong";
    }
    if (argc == 5 && strcmp(argv[1], "pingpong") == 0) {
        uint64_t batch_ns = (uint64_t)atol(argv[2]) * 1000000u;
        int reps = atoi(argv[3]);
        cpu = atoi(argv[4]);
        pthread_t t = start_partner();
        wait_line();
        long trips = 0;
        /* Untimed warm-up: both threads settle on their CPU. */
        for (uint64_t end = now_ns() + batch_ns / 4; now_ns() < end; trips++)
            round_trip();
        for (int r = 0; r < reps; r++) {
            long w0 = sum(&main_t.woken, &partner_t.woken);
            long e0 = sum(&main_t.eagain, &partner_t.eagain);
            long h0 = sum(&main_t.wakes_hit, &partner_t.wakes_hit);
            long v0, i0, v1, i1, n = 0;
            switches(&v0, &i0);
            uint64_t t0 = now_ns(), t1;
            /* Batches of a fixed length, whatever a round trip costs; the
             * clock is read every 64 round trips. */
            do {
                for (int i = 0; i < 64; i++)
                    round_trip();
                n += 64;
                t1 = now_ns();
            } while (t1 - t0 < batch_ns);
            switches(&v1, &i1);
            trips += n;
            printf("pingpong %ld %llu %ld %ld %ld %ld %ld\n", n, (unsigned long long)(t1 - t0),
                   sum(&main_t.woken, &partner_t.woken) - w0,
                   sum(&main_t.eagain, &partner_t.eagain) - e0,
                   sum(&main_t.wakes_hit, &partner_t.wakes_hit) - h0, v1 - v0, i1 - i0);
            fflush(stdout);
        }
        stop_partner(t);
        long v, i;
        switches(&v, &i);
        printf("total %ld %ld %ld\n", sum(&main_t.calls, &partner_t.calls), trips, v);
        fflush(stdout);
        hold_until_eof();
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "rate") == 0) {
        long ops = atol(argv[2]);
        long secs = atol(argv[3]);
        cpu = atoi(argv[4]);
        pthread_t t = start_partner();
        wait_line();
        /* A round trip makes four futex calls; a burst every millisecond
         * keeps the rate steady without a sleep per call. */
        long per_tick = ops / 4 / 1000;
        if (per_tick < 1)
            per_tick = 1;
        long c0 = sum(&main_t.calls, &partner_t.calls);
        long w0 = sum(&main_t.woken, &partner_t.woken);
        long v0, i0, v1, i1;
        switches(&v0, &i0);
        struct timespec next;
        clock_gettime(CLOCK_MONOTONIC, &next);
        uint64_t t0 = now_ns(), end = t0 + (uint64_t)secs * 1000000000u;
        while (now_ns() < end) {
            for (long i = 0; i < per_tick; i++)
                round_trip();
            next.tv_nsec += 1000000;
            if (next.tv_nsec >= 1000000000) {
                next.tv_nsec -= 1000000000;
                next.tv_sec++;
            }
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        }
        uint64_t t1 = now_ns();
        switches(&v1, &i1);
        printf("rate %ld %llu %ld %ld\n", sum(&main_t.calls, &partner_t.calls) - c0,
               (unsigned long long)(t1 - t0), sum(&main_t.woken, &partner_t.woken) - w0,
               v1 - v0);
        fflush(stdout);
        stop_partner(t);
        hold_until_eof();
        return 0;
    }
    fprintf(stderr, "usage: waits pingpong|condpingpong N REPS CPU | waits rate OPS SECS CPU\n");
    return 2;
}
