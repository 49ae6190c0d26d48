"""cpu_ratio.py: a Python program that splits its CPU time 3:1 between two
Python functions, each reached through a caller of its own, for profiles
of Python code named from the perf map that CPython 3.12+ writes under
`-X perf` (/tmp/perf-PID.map: one trampoline per Python function).

usage: python3.12 -X perf cpu_ratio.py SECONDS [--wait-stdin]

At exit it prints one line to stdout:

    pid=P heavy_ns=A light_ns=B

heavy_ns and light_ns: the time spent in each leaf, timed by the program
(time.perf_counter_ns around each slice of calls).
"""

import os
import sys
import time


def spin_heavy(n):
    x = 0
    for i in range(n):
        x = (x * 1103515245 + 12345) % 2147483647
    return x


def spin_light(n):
    x = 1
    for i in range(n):
        x = (x * 69069 + 1) % 2147483647
    return x


def call_heavy(n):
    return spin_heavy(n)


def call_light(n):
    return spin_light(n)


def run(seconds):
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    heavy = light = 0
    # Three slices of the heavy leaf for one of the light, by time.
    slice_ns = 2_000_000
    while time.perf_counter_ns() < deadline:
        for _ in range(3):
            t0 = time.perf_counter_ns()
            while time.perf_counter_ns() - t0 < slice_ns:
                call_heavy(200)
            heavy += time.perf_counter_ns() - t0
        t0 = time.perf_counter_ns()
        while time.perf_counter_ns() - t0 < slice_ns:
            call_light(200)
        light += time.perf_counter_ns() - t0
    return heavy, light


def main():
    if len(sys.argv) < 2:
        print("usage: cpu_ratio.py SECONDS [--wait-stdin]", file=sys.stderr)
        sys.exit(2)
    seconds = float(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--wait-stdin":
        print(f"ready pid={os.getpid()}", flush=True)
        sys.stdin.read(1)
    heavy, light = run(seconds)
    print(f"pid={os.getpid()} heavy_ns={heavy} light_ns={light}", flush=True)


if __name__ == "__main__":
    main()
