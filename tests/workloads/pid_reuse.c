/*
 * pid_reuse: starts a child with a chosen pid (clone3 with set_tid, which
 * needs CAP_CHECKPOINT_RESTORE in the pid namespace) that burns CPU in
 * reuse_burn, without exec: a process that reuses the pid of an exited one.
 *
 * usage: pid_reuse PID SECONDS
 * Prints "pid=P child_pid=C" once the child has exited. Exits 3 if the pid
 * is taken (EEXIST), 1 on other errors.
 *
 * Build: gcc -O2 -fno-omit-frame-pointer -g -o pid_reuse pid_reuse.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline, noclone)) uint64_t reuse_burn(double seconds)
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
    if (argc != 3) {
        fprintf(stderr, "usage: pid_reuse PID SECONDS\n");
        return 2;
    }
    pid_t want = (pid_t)atoi(argv[1]);
    struct clone_args args;
    memset(&args, 0, sizeof(args));
    args.exit_signal = SIGCHLD;
    args.set_tid = (uint64_t)(uintptr_t)&want;
    args.set_tid_size = 1;
    long pid = syscall(SYS_clone3, &args, sizeof(args));
    if (pid < 0) {
        int err = errno;
        perror("clone3 with set_tid");
        return err == EEXIST ? 3 : 1;
    }
    if (pid == 0) {
        reuse_burn(atof(argv[2]));
        _exit(0);
    }
    int status;
    if (waitpid((pid_t)pid, &status, 0) < 0) {
        perror("waitpid");
        return 1;
    }
    printf("pid=%d child_pid=%ld\n", (int)getpid(), pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
