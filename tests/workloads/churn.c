/*
 * churn: short-lived processes or threads at a steady rate, each of which
 * allocates, waits on a futex and burns a little CPU, so that every profile
 * type sees a stream of tasks that appear and vanish.
 *
 * usage: churn procs|threads RATE SECONDS [--wait-stdin]
 *        churn tid SECONDS
 *   procs    fork RATE children a second; every other child execs this
 *            program again (a new image, mappings read afresh) before it
 *            works; each exits within a few milliseconds
 *   threads  create RATE threads a second in this process; each locks a
 *            mutex shared with the others, works and exits
 *   tid      burn SECONDS in churn_burn, then SECONDS more on one new
 *            thread; once that thread is gone print "tid=T pid=P" (its id
 *            is free for another task to take) and wait for stdin to close
 *   --wait-stdin  print "ready pid=P", then read one byte (or EOF) from
 *                 stdin before starting
 *
 * Starts are paced against the clock; when a start is more than one period
 * late it still happens (counted in late=). At most MAX_LIVE tasks run at
 * once; a start that would exceed that is skipped (counted in skipped=).
 * At the end it waits for every task and prints
 *   "started=N finished=N failed=N late=N skipped=N seconds_x1000=T"
 *
 * Build: gcc -O2 -g -pthread -o churn churn.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIVE 512

static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t wait_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static volatile uint64_t sink;
static atomic_long live_threads;
static atomic_long finished_threads;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static void churn_burn(void)
{
    uint64_t x = sink, end = mono_ns() + 300000;
    while (mono_ns() < end)
        for (int i = 0; i < 1000; i++)
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
}

/* About 100 KiB in blocks of 1 to 16 KiB, touched and freed. */
__attribute__((noinline)) static void churn_alloc(void)
{
    char *blocks[24];
    for (int i = 0; i < 24; i++) {
        blocks[i] = malloc(1024 + (size_t)i * 4096 % 16384);
        if (blocks[i] == NULL)
            abort();
        blocks[i][0] = (char)i;
    }
    for (int i = 0; i < 24; i++) {
        sink += (unsigned char)blocks[i][0];
        free(blocks[i]);
    }
}

/* A futex wait of about 0.5 ms: a condition nobody signals. */
__attribute__((noinline)) static void churn_wait(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 500000;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&wait_lock);
    while (pthread_cond_timedwait(&never, &wait_lock, &until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&wait_lock);
    sink++;
}

/* The shared mutex held across a little CPU: contended between threads. */
__attribute__((noinline)) static void churn_lock(void)
{
    pthread_mutex_lock(&shared_lock);
    churn_burn();
    pthread_mutex_unlock(&shared_lock);
    /* Not a tail call: the unlock's wake-ups are charged to churn_lock. */
    sink++;
}

__attribute__((noinline)) static void churn_work(void)
{
    churn_alloc();
    churn_wait();
    churn_lock();
    /* Not a tail call: churn_work stays on the stacks below churn_lock. */
    sink++;
}

static void *churn_thread(void *arg)
{
    (void)arg;
    churn_work();
    atomic_fetch_add(&finished_threads, 1);
    atomic_fetch_sub(&live_threads, 1);
    return NULL;
}

static void sleep_until(uint64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000ULL, .tv_nsec = ns % 1000000000ULL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* Reaps exited children without blocking (or blocking, when `block`). */
static void reap(int block, long *live, long *finished, long *failed)
{
    int status;
    pid_t pid;
    while (*live > 0 && (pid = waitpid(-1, &status, block ? 0 : WNOHANG)) > 0) {
        (*live)--;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            (*finished)++;
        else
            (*failed)++;
    }
}

/* Burns about `seconds` in churn_burn. */
static void burn_for(double seconds)
{
    uint64_t end = mono_ns() + (uint64_t)(seconds * 1e9);
    while (mono_ns() < end)
        churn_burn();
}

static double tid_seconds;

static void *tid_thread(void *arg)
{
    *(pid_t *)arg = (pid_t)syscall(SYS_gettid);
    burn_for(tid_seconds);
    return NULL;
}

/* The `tid` mode: a sampled process whose thread's id is left free. */
static int tid_mode(double seconds)
{
    tid_seconds = seconds;
    /* Sampled first: the process is known before its thread starts. */
    burn_for(seconds);
    pid_t tid = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, tid_thread, &tid) != 0 || pthread_join(t, NULL) != 0)
        return 1;
    /* The id is released a little after the join returns. */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d", (int)tid);
    for (int i = 0; i < 5000 && access(path, F_OK) == 0; i++)
        usleep(1000);
    printf("tid=%d pid=%d\n", (int)tid, getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "tid") == 0)
        return tid_mode(atof(argv[2]));
    if (argc == 2 && strcmp(argv[1], "--child") == 0) {
        churn_work();
        return 0;
    }
    if (argc < 4 || (strcmp(argv[1], "procs") != 0 && strcmp(argv[1], "threads") != 0)) {
        fprintf(stderr, "usage: churn procs|threads RATE SECONDS [--wait-stdin]\n"
                        "       churn tid SECONDS\n");
        return 2;
    }
    int threads = strcmp(argv[1], "threads") == 0;
    double rate = atof(argv[2]), seconds = atof(argv[3]);
    if (rate <= 0 || seconds <= 0) {
        fprintf(stderr, "churn: RATE and SECONDS must be positive\n");
        return 2;
    }
    if (argc > 4 && strcmp(argv[4], "--wait-stdin") == 0) {
        char c;
        printf("ready pid=%d\n", getpid());
        fflush(stdout);
        if (read(0, &c, 1) < 0)
            return 1;
    }
    uint64_t period = (uint64_t)(1e9 / rate), start = mono_ns();
    uint64_t end = start + (uint64_t)(seconds * 1e9), next = start;
    long started = 0, finished = 0, failed = 0, late = 0, skipped = 0, live = 0;
    /* Exec by the program's own path: its name becomes the comm (exec'ing
     * /proc/self/exe would name the process "exe"). */
    char self[4096];
    ssize_t self_len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (self_len <= 0)
        return 1;
    self[self_len] = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    while (next < end) {
        sleep_until(next);
        if (mono_ns() > next + period)
            late++;
        next += period;
        if (threads) {
            if (atomic_load(&live_threads) >= MAX_LIVE) {
                skipped++;
                continue;
            }
            pthread_t t;
            atomic_fetch_add(&live_threads, 1);
            if (pthread_create(&t, &attr, churn_thread, NULL) != 0) {
                atomic_fetch_sub(&live_threads, 1);
                failed++;
                continue;
            }
            started++;
        } else {
            reap(0, &live, &finished, &failed);
            if (live >= MAX_LIVE) {
                skipped++;
                continue;
            }
            int do_exec = started % 2 == 1;
            pid_t pid = fork();
            if (pid < 0) {
                failed++;
                continue;
            }
            if (pid == 0) {
                if (do_exec) {
                    execl(self, "churn", "--child", (char *)NULL);
                    _exit(127);
                }
                churn_work();
                _exit(0);
            }
            live++;
            started++;
        }
    }
    if (threads) {
        while (atomic_load(&live_threads) > 0)
            usleep(1000);
        finished = atomic_load(&finished_threads);
    } else {
        reap(1, &live, &finished, &failed);
    }
    printf("started=%ld finished=%ld failed=%ld late=%ld skipped=%ld seconds_x1000=%lu\n",
           started, finished, failed, late, skipped,
           (unsigned long)((mono_ns() - start) / 1000000));
    return 0;
}
