"""Reference for ALiBi (chapter 6): exact slopes in sympy and the bias one entry at a time."""

from __future__ import annotations

import math

import sympy as sp
import torch
from torch import Tensor

__all__ = ["alibi_bias_loop", "alibi_slopes_exact", "alibi_slopes_geometric_exact"]


def _is_power_of_two(n: int) -> bool:
    power = 1
    while power < n:
        power *= 2
    return power == n


def alibi_slopes_geometric_exact(num_heads: int) -> list[sp.Expr]:
    """The sentence of Press et al. (2022, §3) taken literally, for any ``n``.

    "For ``n`` heads, our set of slopes is the geometric sequence that starts at
    ``2**(-8/n)`` and uses that same value as its ratio": term ``h`` (from 1) is
    ``start**h``, an exact sympy power of two.

    Raises:
        ValueError: ``num_heads`` is not a positive int.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    start = sp.Integer(2) ** sp.Rational(-8, num_heads)
    terms = [start]
    while len(terms) < num_heads:
        terms.append(sp.powsimp(terms[-1] * start))
    return terms


def alibi_slopes_exact(num_heads: int) -> list[sp.Expr]:
    """The slopes of the ALiBi paper's official code, step by step and exact.

    Follows the recursion of the official implementation (Press et al. 2022, code
    release): for a power of two, the geometric sequence above; otherwise, with
    ``p`` the largest power of two below ``n``, the list for ``p`` heads followed by
    every other entry (indices 0, 2, 4, ...) of the list for ``2p`` heads, cut to
    ``n`` entries in total.

    Raises:
        ValueError: ``num_heads`` is not a positive int.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if _is_power_of_two(num_heads):
        return alibi_slopes_geometric_exact(num_heads)
    power = 1
    while power * 2 < num_heads:
        power *= 2
    every_other = alibi_slopes_exact(2 * power)[0::2]
    return alibi_slopes_exact(power) + every_other[: num_heads - power]


def alibi_bias_loop(
    slopes: list[float] | Tensor,
    q_positions: list[int],
    k_positions: list[int],
    *,
    symmetric: bool = False,
) -> Tensor:
    """ALiBi's bias entry by entry in float64, straight from the definition.

    Causal: ``-m (i - j)`` for a key at or before the query, ``-inf`` after it.
    Symmetric: ``-m |i - j|``.

    Shapes::

        returns: [H, len(q_positions), len(k_positions)](float64, CPU)
    """
    slopes = [float(m) for m in slopes]
    out = torch.empty(len(slopes), len(q_positions), len(k_positions), dtype=torch.float64)
    for h, m in enumerate(slopes):
        for a, i in enumerate(q_positions):
            for b, j in enumerate(k_positions):
                if symmetric:
                    out[h, a, b] = -m * abs(i - j)
                elif j <= i:
                    out[h, a, b] = -m * (i - j)
                else:
                    out[h, a, b] = -math.inf
    return out
