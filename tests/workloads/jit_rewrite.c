/* jit_rewrite.c: JIT code written over, as a runtime frees code and puts
 * other code at the same address: a spin loop is copied into anonymous
 * executable memory and named `jit_first` in the process's perf map; it
 * spins for SECONDS, then the same address is named again, `jit_second`
 * (a later line of the map, as a runtime writes it), and it spins for
 * SECONDS more. A profile must name each sample by the line that was
 * there when it was taken.
 *
 * usage: jit_rewrite SECONDS [--wait-stdin]
 *
 * At exit it prints one line to stdout:
 *
 *     pid=P first_ns=N second_ns=N
 *
 * with the CPU time each phase spun (CLOCK_PROCESS_CPUTIME_ID).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* push rbp; mov rbp, rsp; 1: dec rdi; jnz 1b; pop rbp; ret: a frame
 * pointer kept, as JIT runtimes keep them. */
static const unsigned char SPIN[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0xff,
                                     0xcf, 0x75, 0xfb, 0x5d, 0xc3};

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Spins the JIT code until `seconds` of wall time have passed; returns the
 * CPU time taken. */
static uint64_t __attribute__((noinline)) run_phase(void (*spin)(uint64_t),
                                                    double seconds) {
    uint64_t cpu = now_ns(CLOCK_PROCESS_CPUTIME_ID);
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    while (now_ns(CLOCK_MONOTONIC) < end)
        spin(2000000);
    return now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu;
}

static void name_code(FILE *map, void *code, const char *name) {
    fprintf(map, "%lx %zx %s\n", (unsigned long)(uintptr_t)code,
            sizeof(SPIN), name);
    fflush(map);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: jit_rewrite SECONDS [--wait-stdin]\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    unsigned char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memcpy(code, SPIN, sizeof(SPIN));
    if (mprotect(code, 4096, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        return 1;
    }
    char path[64];
    snprintf(path, sizeof(path), "/tmp/perf-%d.map", getpid());
    FILE *map = fopen(path, "w");
    if (!map) {
        perror(path);
        return 1;
    }
    void (*spin)(uint64_t) = (void (*)(uint64_t))code;
    if (argc > 2 && strcmp(argv[2], "--wait-stdin") == 0) {
        printf("ready pid=%d\n", getpid());
        fflush(stdout);
        char c;
        if (read(0, &c, 1) < 0)
            return 1;
    }
    name_code(map, code, "jit_first");
    uint64_t first = run_phase(spin, seconds);
    name_code(map, code, "jit_second");
    uint64_t second = run_phase(spin, seconds);
    fclose(map);
    unlink(path);
    printf("pid=%d first_ns=%llu second_ns=%llu\n", getpid(),
           (unsigned long long)first, (unsigned long long)second);
    return 0;
}
