"""sympy_work.py: symbolic algebra with sympy (PyPI), code nobody here
wrote, for a profile of a real package's Python functions beside py-spy.

usage: python sympy_work.py SECONDS [--wait-stdin]

sympy is imported before the "ready" line, so that a profile of the run
holds the work, not the import. Each round integrates, factors, expands
and simplifies the same expressions, with sympy's cache cleared so that
every round does the work again. At exit it prints one line to stdout:

    pid=P rounds=N
"""

import os
import sys
import time

import sympy
from sympy.core.cache import clear_cache


def one_round(x, y):
    # The same work every round: a profile of any stretch of the run has
    # the same shares (the two profilers start a few hundred ms apart).
    k = 8
    sympy.integrate(sympy.sin(x) ** 3 * sympy.cos(x) ** 2 + x * sympy.exp(x), x)
    sympy.factor(x ** (2 * k) - y ** (2 * k))
    sympy.expand((x + y + 1) ** k)
    sympy.simplify((x ** 2 - y ** 2) / (x - y) + sympy.sin(x) ** 2 + sympy.cos(x) ** 2)


def main():
    if len(sys.argv) < 2:
        print("usage: sympy_work.py SECONDS [--wait-stdin]", file=sys.stderr)
        sys.exit(2)
    seconds = float(sys.argv[1])
    x, y = sympy.symbols("x y")
    if len(sys.argv) > 2 and sys.argv[2] == "--wait-stdin":
        print(f"ready pid={os.getpid()}", flush=True)
        sys.stdin.read(1)
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        clear_cache()
        one_round(x, y)
        rounds += 1
    print(f"pid={os.getpid()} rounds={rounds}", flush=True)


if __name__ == "__main__":
    main()
