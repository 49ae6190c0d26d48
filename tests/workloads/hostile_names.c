/*
 * hostile_names: a process and a thread with names no tool expects, and a
 * stack deeper than any unwinder keeps.
 *
 * The process names itself PROC_NAME (prctl PR_SET_NAME: '/', a newline and
 * a byte that is not UTF-8) and starts a worker thread that names itself
 * THREAD_NAME (pthread_setname_np: '/', a newline and a truncated UTF-8
 * sequence). Then, for SECONDS of wall-clock time, the worker burns CPU in
 * thread_burn while the main thread burns in deep_burn at the bottom of a
 * recursion of DEPTH levels of recurse:
 *   main -> recurse -> ... (DEPTH) ... -> recurse -> deep_burn
 *   worker -> thread_burn
 *
 * usage: hostile_names SECONDS DEPTH [--wait-stdin]
 *
 * Once both names are set it prints "named pid=P" and, with --wait-stdin,
 * waits for a byte on stdin before burning. At exit it prints
 *   pid=P main_rounds=M thread_rounds=T
 *
 * Build: gcc -O2 -fno-omit-frame-pointer -g -pthread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define STEPS 200000

static const char PROC_NAME[] = "p/a\nb\xff";
static const char THREAD_NAME[] = "t/\n\xc3(x";

static volatile uint64_t sink;
static uint64_t deadline;
static pthread_mutex_t named_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t named_cond = PTHREAD_COND_INITIALIZER;
static int thread_named;
static int go;

static uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

NOINLINE uint64_t deep_burn(uint64_t x)
{
    for (int i = 0; i < STEPS; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

NOINLINE uint64_t thread_burn(uint64_t x)
{
    for (int i = 0; i < STEPS; i++)
        x = x * 2862933555777941757ULL + 3037000493ULL;
    return x;
}

/* One level; the work after the call keeps it from being a tail call. At
 * the bottom, burns until the deadline so that the deep stack stays. */
NOINLINE uint64_t recurse(int levels, uint64_t x, unsigned *rounds)
{
    volatile uint64_t keep = x;
    if (levels <= 1) {
        while (clock_ns() < deadline) {
            x = deep_burn(x);
            (*rounds)++;
        }
        return x;
    }
    return recurse(levels - 1, x * 31 + 7, rounds) + keep;
}

static void *worker(void *arg)
{
    unsigned *rounds = arg;
    if (pthread_setname_np(pthread_self(), THREAD_NAME) != 0)
        fprintf(stderr, "pthread_setname_np failed\n");
    pthread_mutex_lock(&named_lock);
    thread_named = 1;
    pthread_cond_broadcast(&named_cond);
    while (!go)
        pthread_cond_wait(&named_cond, &named_lock);
    pthread_mutex_unlock(&named_lock);
    uint64_t x = 1;
    while (clock_ns() < deadline) {
        x = thread_burn(x);
        (*rounds)++;
    }
    sink = x;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s SECONDS DEPTH [--wait-stdin]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    int depth = atoi(argv[2]);
    int wait_stdin = argc > 3 && strcmp(argv[3], "--wait-stdin") == 0;
    if (prctl(PR_SET_NAME, PROC_NAME, 0, 0, 0) != 0) {
        perror("prctl");
        return 1;
    }
    unsigned main_rounds = 0, thread_rounds = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, worker, &thread_rounds) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }
    pthread_mutex_lock(&named_lock);
    while (!thread_named)
        pthread_cond_wait(&named_cond, &named_lock);
    pthread_mutex_unlock(&named_lock);
    printf("named pid=%d\n", (int)getpid());
    fflush(stdout);
    if (wait_stdin) {
        char byte;
        if (read(0, &byte, 1) < 0)
            perror("read stdin");
    }
    deadline = clock_ns() + (uint64_t)(seconds * 1e9);
    pthread_mutex_lock(&named_lock);
    go = 1;
    pthread_cond_broadcast(&named_cond);
    pthread_mutex_unlock(&named_lock);
    sink = recurse(depth, 3, &main_rounds);
    pthread_join(t, NULL);
    printf("pid=%d main_rounds=%u thread_rounds=%u\n", (int)getpid(), main_rounds,
           thread_rounds);
    fflush(stdout);
    return 0;
}
