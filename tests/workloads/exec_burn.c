/*
 * exec_burn: burns CPU in before_exec_burn, sleeps, then replaces itself
 * with another program (same pid): a target whose binary changes.
 *
 * usage: exec_burn SECONDS PAUSE_SECONDS [--wait-stdin] -- PROGRAM [ARGS...]
 * Before the exec it prints "pid=P" to stdout.
 *
 * Build: gcc -O2 -fno-omit-frame-pointer -g -o exec_burn exec_burn.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline, noclone)) uint64_t before_exec_burn(double seconds)
{
    uint64_t x = sink, end = mono_ns() + (uint64_t)(seconds * 1e9);
    while (mono_ns() < end)
        for (int i = 0; i < 40000; i++)
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
    return x;
}

int main(int argc, char **argv)
{
    int i, wait_stdin = 0;
    for (i = 3; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--wait-stdin") == 0)
            wait_stdin = 1;
    if (argc < 3 || i + 1 >= argc) {
        fprintf(stderr, "usage: exec_burn SECONDS PAUSE_SECONDS [--wait-stdin] -- PROGRAM [ARGS...]\n");
        return 2;
    }
    if (wait_stdin) {
        char byte;
        if (read(0, &byte, 1) < 0)
            perror("read stdin");
    }
    before_exec_burn(atof(argv[1]));
    usleep((useconds_t)(atof(argv[2]) * 1e6));
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    execv(argv[i + 1], &argv[i + 1]);
    perror("execv");
    return 1;
}
