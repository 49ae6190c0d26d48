/*
 * deep_stack: burns CPU at the bottom of a recursion whose frames each hold
 * a 1 KiB array, alternating between a deep recursion (DEEP_LEVELS levels,
 * far more stack than a 16 KiB copy of the user stack holds) ending in
 * burn_deep and a shallow one (SHALLOW_LEVELS levels, which fits) ending in
 * burn_shallow, for a wall-clock duration:
 *   main -> run -> descend -> descend -> ... -> burn_deep / burn_shallow
 * Built without frame pointers.
 *
 * usage: deep_stack SECONDS [--wait-stdin] [--futex-wait] [--malloc]
 *
 * With --futex-wait, burn_deep also waits 200 us on a futex (FUTEX_WAIT
 * with a timeout, on a word nobody wakes) after each burn: a blocking
 * wait at the bottom of the deep recursion, for block profiles. With
 * --malloc, it allocates and frees 64 KiB after each burn, for heap
 * profiles.
 *
 * At exit it prints one line to stdout:
 *   pid=P rounds=R frame_bytes=F leaf_sp_page_offset=O
 * where F is the stack one level of the recursion takes (the distance
 * between the arrays of two consecutive levels) and O the offset in its
 * page of the stack pointer in burn_deep (the array of the last level is
 * at the stack pointer of descend, which calls burn_deep: one return
 * address lower).
 * and leaves with _exit from main, so that even the exit system call is
 * made with main on the stack.
 *
 * Build: gcc -O2 -g -o deep_stack deep_stack.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

#define DEEP_LEVELS 64
#define SHALLOW_LEVELS 3
/* Multiply-add steps per burn (about a millisecond). */
#define STEPS 1000000

static volatile uint64_t sink;
/* Addresses of the arrays of the last two levels of a deep descent. */
static volatile uintptr_t pad_at[3];
/* Whether burn_deep waits on a futex after each burn (--futex-wait). */
static int futex_wait;
static int futex_word;
/* Whether burn_deep allocates after each burn (--malloc). */
static int do_malloc;
static void *volatile allocated;

static uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

NOINLINE uint64_t burn_deep(uint64_t x)
{
    for (int i = 0; i < STEPS; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    if (futex_wait) {
        struct timespec timeout = {0, 200000};
        syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    }
    if (do_malloc) {
        allocated = malloc(64 * 1024);
        free(allocated);
    }
    return x;
}

NOINLINE uint64_t burn_shallow(uint64_t x)
{
    for (int i = 0; i < STEPS; i++)
        x = x * 2862933555777941757ULL + 3037000493ULL;
    return x;
}

/* One level of recursion with a 1 KiB array that stays live across the
 * recursive call (so that the call is neither a tail call nor a loop). */
NOINLINE uint64_t descend(int levels, int deep, uint64_t x)
{
    volatile unsigned char pad[1024];
    pad[0] = (unsigned char)x;
    pad[sizeof pad - 1] = (unsigned char)(x >> 8);
    if (deep && levels <= 2)
        pad_at[levels] = (uintptr_t)pad;
    uint64_t r;
    if (levels <= 1)
        r = deep ? burn_deep(x) : burn_shallow(x);
    else
        r = descend(levels - 1, deep, x * 31 + 7);
    return r + pad[0] + pad[sizeof pad - 1];
}

/* Alternates a deep and a shallow descent until the deadline. */
NOINLINE unsigned run(double seconds)
{
    uint64_t end = clock_ns() + (uint64_t)(seconds * 1e9);
    uint64_t x = sink + 1;
    unsigned rounds = 0;
    while (clock_ns() < end) {
        x = descend(DEEP_LEVELS, 1, x);
        x = descend(SHALLOW_LEVELS, 0, x);
        rounds++;
    }
    sink = x;
    return rounds;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SECONDS [--wait-stdin] [--futex-wait] [--malloc]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0) {
            char byte;
            if (read(0, &byte, 1) < 0)
                perror("read stdin");
        } else if (strcmp(argv[i], "--futex-wait") == 0) {
            futex_wait = 1;
        } else if (strcmp(argv[i], "--malloc") == 0) {
            do_malloc = 1;
        } else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    unsigned rounds = run(seconds);
    printf("pid=%d rounds=%u frame_bytes=%llu leaf_sp_page_offset=%llu\n", (int)getpid(),
           rounds, (unsigned long long)(pad_at[2] - pad_at[1]),
           (unsigned long long)((pad_at[1] - 8) & 4095));
    fflush(stdout);
    _exit(0);
}
