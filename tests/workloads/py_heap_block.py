"""py_heap_block.py: a Python program whose heap and block profiles have
known Python answers.

usage: python3 py_heap_block.py heap|block SECONDS [--wait-stdin]

heap: alloc_big and alloc_small each make a bytearray per call, in turn,
of BIG and SMALL bytes (3:1; both far above the 512 bytes CPython's own
allocator keeps: they go to malloc).

block: a holder thread (hold_lock) takes a threading.Lock, sleeps HOLD
seconds holding it and lets go; the main thread waits for it in
wait_for_lock, at the line marked WAIT, each time the holder lets go.

At exit it prints one line to stdout:

    pid=P big_bytes=A small_bytes=B waited_ns=W waits=N wait_line=L

big_bytes and small_bytes: bytes each function allocated; waited_ns: the
time wait_for_lock spent in its acquire calls (time.perf_counter_ns
around them); wait_line: the WAIT line's number.
"""

import os
import sys
import threading
import time

BIG = 3 * 8192
SMALL = 8192
HOLD = 0.004


def alloc_big():
    return bytearray(BIG)


def alloc_small():
    return bytearray(SMALL)


def allocate(deadline):
    calls = 0
    while time.perf_counter_ns() < deadline:
        for _ in range(100):
            alloc_big()
            alloc_small()
        calls += 100
    return calls * BIG, calls * SMALL


def hold_lock(lock, stop, handed):
    while not stop.is_set():
        with lock:
            handed.set()
            time.sleep(HOLD)
        # Room for the waiter to take it before the next hold.
        time.sleep(HOLD / 4)


def wait_for_lock(lock, handed):
    handed.wait()
    handed.clear()
    t0 = time.perf_counter_ns()
    lock.acquire()  # WAIT
    spent = time.perf_counter_ns() - t0
    lock.release()
    return spent


def block(deadline):
    lock = threading.Lock()
    stop = threading.Event()
    handed = threading.Event()
    holder = threading.Thread(target=hold_lock, args=(lock, stop, handed))
    holder.start()
    waited = waits = 0
    while time.perf_counter_ns() < deadline:
        waited += wait_for_lock(lock, handed)
        waits += 1
    stop.set()
    holder.join()
    return waited, waits


def wait_line():
    with open(__file__) as source:
        for number, line in enumerate(source, 1):
            if line.rstrip().endswith("# WAIT"):
                return number
    return 0


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("heap", "block"):
        print("usage: py_heap_block.py heap|block SECONDS [--wait-stdin]", file=sys.stderr)
        sys.exit(2)
    seconds = float(sys.argv[2])
    if len(sys.argv) > 3 and sys.argv[3] == "--wait-stdin":
        print(f"ready pid={os.getpid()}", flush=True)
        sys.stdin.read(1)
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    big = small = waited = waits = 0
    if sys.argv[1] == "heap":
        big, small = allocate(deadline)
    else:
        waited, waits = block(deadline)
    print(
        f"pid={os.getpid()} big_bytes={big} small_bytes={small} "
        f"waited_ns={waited} waits={waits} wait_line={wait_line()}",
        flush=True,
    )


if __name__ == "__main__":
    main()
