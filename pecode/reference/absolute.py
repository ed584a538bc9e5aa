"""Reference for the sinusoidal table: one entry at a time, with Python's ``math`` module."""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["sinusoidal_rows_loop"]


def sinusoidal_rows_loop(
    positions: Iterable[int], dim: int, base: float = 10000.0
) -> list[list[float]]:
    """Rows of the sinusoidal table (Vaswani et al. 2017, §3.5), entry by entry in float64.

    Written straight from the paper's formula, ``PE(pos, j) = sin(pos / base**(2i/dim))``
    for even ``j = 2i`` and ``cos(...)`` for odd ``j = 2i + 1``: the column decides the
    function and ``i = j // 2`` the denominator. It divides by the power as the paper
    writes it (the fast code multiplies by a precomputed frequency) and uses
    ``math.sin`` / ``math.cos`` on Python floats.

    Shapes::

        positions: n non-negative ints    returns: n lists of dim floats

    Raises:
        ValueError: ``dim`` is not a positive even int, or a position is negative.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim must be a positive even int, got {dim!r}")
    rows = []
    for pos in positions:
        if pos < 0:
            raise ValueError(f"positions must be non-negative, got {pos}")
        row = []
        for column in range(dim):
            i = column // 2
            angle = pos / base ** (2 * i / dim)
            row.append(math.sin(angle) if column % 2 == 0 else math.cos(angle))
        rows.append(row)
    return rows
