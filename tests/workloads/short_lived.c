/*
 * short_lived: burns CPU in short_lived_burn for about one second of wall
 * time, then exits; a process that is gone before the profile is written.
 *
 * usage: short_lived [SECONDS] [--wait-stdin]
 * At exit it prints "pid=P" to stdout.
 *
 * Build: gcc -O2 -fno-omit-frame-pointer -g -o short_lived short_lived.c
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

__attribute__((noinline, noclone)) uint64_t short_lived_burn(double seconds)
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
    double seconds = 1.0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0) {
            char byte;
            if (read(0, &byte, 1) < 0)
                perror("read stdin");
        } else {
            seconds = atof(argv[i]);
        }
    }
    short_lived_burn(seconds);
    printf("pid=%d\n", (int)getpid());
    return 0;
}
