"""off_cpu.py: a Python program whose two threads wait off the CPU in two
Python functions, for off-CPU profiles of Python code: nap_long sleeps
3 ms a call, nap_short 1 ms, each from a loop of its own thread.

usage: python3 off_cpu.py SECONDS [--wait-stdin]

At exit it prints one line to stdout:

    pid=P long_ns=A short_ns=B long_calls=C short_calls=D

long_ns and short_ns: the time each thread spent in its function's calls,
timed by the program (time.perf_counter_ns around each call). Each call
is made through C (`any(map(nap, ...))`).
"""

import os
import sys
import threading
import time


def nap_long(_):
    time.sleep(0.003)


def nap_short(_):
    time.sleep(0.001)


def napper(nap, deadline, totals, key):
    spent = calls = 0
    while time.perf_counter_ns() < deadline:
        t0 = time.perf_counter_ns()
        # Through C builtins that call back into Python (any, map): the
        # evaluator is entered again under C frames, which a profile
        # shows between napper and the nap.
        any(map(nap, (None,)))
        spent += time.perf_counter_ns() - t0
        calls += 1
    totals[key] = (spent, calls)


def main():
    if len(sys.argv) < 2:
        print("usage: off_cpu.py SECONDS [--wait-stdin]", file=sys.stderr)
        sys.exit(2)
    seconds = float(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--wait-stdin":
        print(f"ready pid={os.getpid()}", flush=True)
        sys.stdin.read(1)
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    totals = {}
    threads = [
        threading.Thread(target=napper, args=(nap_long, deadline, totals, "long")),
        threading.Thread(target=napper, args=(nap_short, deadline, totals, "short")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (long_ns, long_calls), (short_ns, short_calls) = totals["long"], totals["short"]
    print(
        f"pid={os.getpid()} long_ns={long_ns} short_ns={short_ns} "
        f"long_calls={long_calls} short_calls={short_calls}",
        flush=True,
    )


if __name__ == "__main__":
    main()
