/*
 * mixed: a little of everything a profile type looks at, for tests that
 * check every type is written under a given set of privileges rather than
 * its accuracy. For SECONDS, the main thread burns CPU in mixed_burn and
 * allocates in mixed_alloc, while two threads take turns holding one mutex
 * for 1 ms (futex waits, contended wake-ups and blocking switches).
 *
 * usage: mixed SECONDS [--wait-stdin]
 *   --wait-stdin  print "ready pid=P", then read one byte (or EOF) from
 *                 stdin before starting, so that a profiler can attach first
 *
 * Prints "done pid=P" when finished.
 *
 * Build: gcc -O2 -g -pthread -o mixed mixed.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int stop;
static volatile unsigned long sink;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void mixed_burn(void)
{
    unsigned long x = sink;
    for (int i = 0; i < 2000000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
}

__attribute__((noinline)) static void mixed_alloc(void)
{
    for (int i = 0; i < 2000; i++) {
        char *p = malloc(4096 + i);
        if (p == NULL)
            abort();
        p[0] = (char)i;
        sink += (unsigned char)p[0];
        free(p);
    }
}

__attribute__((noinline)) static void *mixed_lock(void *arg)
{
    (void)arg;
    while (!stop) {
        pthread_mutex_lock(&lock);
        usleep(1000);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SECONDS [--wait-stdin]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 2 && strcmp(argv[2], "--wait-stdin") == 0) {
        printf("ready pid=%d\n", getpid());
        char c;
        (void)!read(0, &c, 1);
    }
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, mixed_lock, NULL);
    double end = now() + seconds;
    while (now() < end) {
        mixed_burn();
        mixed_alloc();
    }
    stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    printf("done pid=%d\n", getpid());
    return 0;
}
