"""Tabulate Men et al.'s lower bound on RoPE's base (pecode.rope_base.base_lower_bound).

The search takes from a second (1k tokens) to many minutes (1M tokens) per entry, so
the table pecode.rope_base.BASE_BOUNDS is computed once by this script and committed;
tests/test_rope_base.py recomputes its short-context rows.

    python tools/base_bounds.py 128 10 20   # head width 128, contexts 2^10 .. 2^20
"""

from __future__ import annotations

import sys
import time

from pecode.rope_base import base_lower_bound


def main(dim: int, first: int, last: int) -> None:
    for power in range(first, last + 1):
        start = time.perf_counter()
        bound = base_lower_bound(dim, 2**power)
        print(f"({dim}, {2**power}): {bound!r},  # {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:4]))
