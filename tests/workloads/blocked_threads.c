/* Two threads that block in glibc for known times, for stacks captured
 * where a thread leaves the CPU (off-CPU) or waits on a futex (block):
 * - "locker" waits in pthread_mutex_lock (lock_site) on a mutex that main
 *   holds for HOLD_MS;
 * - "sleeper" sleeps in usleep (sleep_site), SLEEPS times SLEEP_US.
 * Each thread measures its own blocked time and prints it:
 *   lock_ns=N sleep_ns=N sleeps=N pid=P
 * With --wait-stdin it waits for a line on stdin before starting. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HOLD_MS 1500
#define SLEEPS 300
#define SLEEP_US 5000

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long lock_ns, sleep_ns;
static volatile int sink;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The work after each call keeps these functions on the stack (no tail
 * call) and out of their callers (noinline). */
__attribute__((noinline)) static void lock_site(void) {
    long long t0 = now_ns();
    pthread_mutex_lock(&mu);
    lock_ns += now_ns() - t0;
    sink++;
    pthread_mutex_unlock(&mu);
}

__attribute__((noinline)) static void sleep_site(void) {
    for (int i = 0; i < SLEEPS; i++) {
        long long t0 = now_ns();
        usleep(SLEEP_US);
        sleep_ns += now_ns() - t0;
        sink++;
    }
}

static void *locker(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "locker");
    lock_site();
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "sleeper");
    sleep_site();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--wait-stdin") == 0) {
        printf("ready pid=%d\n", getpid());
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    pthread_t a, b;
    pthread_mutex_lock(&mu);
    pthread_create(&a, NULL, locker, NULL);
    pthread_create(&b, NULL, sleeper, NULL);
    struct timespec hold = {HOLD_MS / 1000, (HOLD_MS % 1000) * 1000000L};
    nanosleep(&hold, NULL);
    pthread_mutex_unlock(&mu);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("lock_ns=%lld sleep_ns=%lld sleeps=%d pid=%d\n", lock_ns, sleep_ns, SLEEPS, getpid());
    return 0;
}
