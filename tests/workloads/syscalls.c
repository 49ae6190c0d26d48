/*
 * syscalls: spends its time in cheap system calls (write of one byte to
 * /dev/null, getppid) so that CPU samples land in the kernel.
 *
 * usage: syscalls SECONDS [--wait-stdin]
 *
 * On x86-64 the system calls are issued by an inline `syscall` instruction
 * inside do_syscalls, so the user half of each kernel sample starts in
 * do_syscalls itself (a libc wrapper without frame pointer would hide its
 * caller). At exit it prints "pid=P calls=N" to stdout.
 *
 * Build: gcc -O2 -fno-omit-frame-pointer -g -o syscalls syscalls.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

static inline __attribute__((always_inline)) long sys3(long n, long a, long b, long c)
{
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
#else
    return syscall(n, a, b, c);
#endif
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Issues system calls until the deadline; returns how many. */
NOINLINE uint64_t do_syscalls(int fd, uint64_t end_ns)
{
    static const char byte = 'x';
    uint64_t calls = 0;
    while (mono_ns() < end_ns) {
        for (int i = 0; i < 256; i++) {
            sys3(SYS_write, fd, (long)&byte, 1);
            sys3(SYS_getppid, 0, 0, 0);
            calls += 2;
        }
    }
    return calls;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SECONDS [--wait-stdin]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    if (argc > 2 && strcmp(argv[2], "--wait-stdin") == 0) {
        char byte;
        if (read(0, &byte, 1) < 0)
            perror("read stdin");
    }
    int fd = open("/dev/null", O_WRONLY);
    if (fd < 0) {
        perror("open /dev/null");
        return 1;
    }
    uint64_t calls = do_syscalls(fd, mono_ns() + (uint64_t)(seconds * 1e9));
    printf("pid=%d calls=%llu\n", (int)getpid(), (unsigned long long)calls);
    return 0;
}
