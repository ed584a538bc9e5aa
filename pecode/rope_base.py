"""Choosing RoPE's base for a context length: the critical dimension and the base bound.

Two rules from the papers, as pure functions of the head width, the base and the lengths
(chapter 11.1):

* **The critical dimension** (Liu et al. 2023, "Scaling Laws of RoPE-based Extrapolation",
  arXiv 2310.05209): pair ``i`` of a head of width ``d`` turns ``L0 θ_i / 2π`` times over
  a trained context of ``L0`` tokens, with ``θ_i = b^(-2i/d)``. The pairs below the real
  index ``i_c = (d/2) log_b(L0/2π)`` complete at least one turn in training and so have
  seen every angle; the pairs above it have not, and their angles past ``L0`` are new.
  Liu et al. call ``2⌈i_c⌉`` the critical dimension. A base small enough that
  ``i_c ≥ d/2 - 1``, ``b ≤ (L0/2π)^(d/(d-2))``, leaves no pair short of a turn: why a
  small base extrapolates too.
* **The base bound** (Men et al. 2024, "Base of RoPE Bounds Context Length", arXiv
  2405.14591): for queries and keys with independent entries of equal variance, a key
  equal to the query outscores a random key at relative distance ``m`` by a multiple of
  ``B_m = Σ_i cos(m θ_i)``. The bound is the smallest base for which ``B_m ≥ 0`` at every
  distance up to the context length.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from pecode._checks import check_int
from pecode.frequencies import check_rope_base, check_rope_dim, rope_inv_freq

__all__ = [
    "BASE_BOUNDS",
    "MEN_ET_AL_TABLE_2",
    "base_lower_bound",
    "critical_dimension",
    "critical_index",
    "first_negative_margin",
    "first_negative_similarity",
    "similarity_margin",
    "turning_base",
]


def critical_index(dim: int, base: float, trained_length: int) -> float:
    """The real pair index ``i_c = (d/2) log_b(L0 / 2π)`` at which a pair turns exactly once
    over ``trained_length`` positions: pairs below it complete a turn, pairs above do not.

    Raises:
        TypeError, ValueError: ``dim`` not a positive even int, ``base`` not a real number
            above 1, ``trained_length`` not a positive int.
    """
    check_rope_dim("dim", dim)
    base = check_rope_base("base", base)
    check_int("trained_length", trained_length)
    return dim / 2 * math.log(trained_length / (2 * math.pi)) / math.log(base)


def critical_dimension(dim: int, base: float, trained_length: int) -> int:
    """Liu et al.'s critical dimension ``2⌈i_c⌉``, clipped to ``[0, dim]``: the features
    whose pairs see a whole turn within the trained context (:func:`critical_index`).

    It is twice the number of pairs ``i`` with ``L0 θ_i ≥ 2π`` except when ``i_c`` is a
    whole number (then that pair turns exactly once, and the count has one pair more).

    Raises:
        TypeError, ValueError: as :func:`critical_index`.
    """
    index = critical_index(dim, base, trained_length)
    return min(dim, max(0, 2 * math.ceil(index)))


def turning_base(dim: int, trained_length: int) -> float:
    """The largest base at which every pair completes a turn within ``trained_length``
    positions: ``(L0 / 2π)^(d / (d - 2))``, where ``i_c = d/2 - 1``, the last pair.

    Raises:
        TypeError, ValueError: ``dim`` not an even int of at least 4, ``trained_length``
            not a positive int.
    """
    check_rope_dim("dim", dim)
    if dim < 4:
        raise ValueError(f"dim must be at least 4 (one pair always has frequency 1), got {dim}")
    check_int("trained_length", trained_length)
    return (trained_length / (2 * math.pi)) ** (dim / (dim - 2))


def similarity_margin(dim: int, base: float, distances: Tensor) -> Tensor:
    """Men et al.'s ``B_m = Σ_{i<d/2} cos(m θ_i)`` at each distance ``m``, in float64.

    Shapes::

        distances: [...] (integer)
        returns:   [...] float64

    Raises:
        TypeError: ``distances`` is not an integer tensor; ``dim``, ``base`` as
            :func:`~pecode.frequencies.rope_inv_freq`.
        ValueError: as :func:`~pecode.frequencies.rope_inv_freq`.
    """
    if not isinstance(distances, Tensor) or distances.is_floating_point():
        what = distances.dtype if isinstance(distances, Tensor) else type(distances).__name__
        raise TypeError(f"distances must be an integer torch.Tensor, got {what}")
    inv_freq = rope_inv_freq(dim, base, dtype=torch.float64)
    angles = distances.to(torch.float64).unsqueeze(-1) * inv_freq
    return torch.cos(angles).sum(-1)


def _first_negatives(
    frequencies: Callable[[Tensor], Tensor], rows: int, context: int, first_chunk: int, cells: int
) -> Tensor:
    """For each of ``rows`` sets of frequencies, the smallest distance ``m <= context`` with
    Men et al.'s ``Σ_i cos(m θ_i) < 0``, or -1 where there is none.

    The scan, shared by :func:`first_negative_margin` and :func:`_passing`'s sieve, takes
    the distances in chunks to bound memory: ``first_chunk`` of them, then twice as many
    while a chunk holds at most ``cells`` angles ``m θ_i`` (never fewer than
    ``first_chunk``). A row leaves the scan at its first negative sum, and
    ``frequencies(index)`` gives the frequencies of the rows ``index`` still scanned
    (``[len(index), pairs]``, float64), so a sieve computes only those.
    """
    first = torch.full((rows,), -1, dtype=torch.int64)
    left = torch.arange(rows)  # the rows whose sums are non-negative so far
    start, chunk = 0, first_chunk
    while start <= context and len(left):
        inv_freq = frequencies(left)
        distances = torch.arange(start, min(start + chunk, context + 1), dtype=torch.float64)
        margin = torch.cos(distances.unsqueeze(-1) * inv_freq.unsqueeze(1)).sum(-1)
        negative = margin < 0  # [left, chunk]
        found = negative.any(1)
        first[left[found]] = start + negative[found].int().argmax(1)  # the first True
        largest = max(first_chunk, cells // max(1, inv_freq.numel()))
        start, chunk = start + chunk, min(2 * chunk, largest)
        left = left[~found]
    return first


_FIRST_CHUNK, _LAST_CHUNK = 1 << 10, 1 << 13  # distances per step of the scan, doubling


def first_negative_margin(inv_freq: Tensor, context: int) -> int | None:
    """The smallest distance ``m <= context`` with ``Σ_i cos(m θ_i) < 0`` for the given
    frequencies (scaled ones, say), or None when the sum stays non-negative to ``context``.

    Shapes::

        inv_freq: [pairs](floating)

    Raises:
        TypeError: ``inv_freq`` is not a floating tensor, ``context`` not an int.
        ValueError: ``inv_freq`` is not 1-D, ``context`` not positive.
    """
    if not isinstance(inv_freq, Tensor) or not inv_freq.is_floating_point():
        raise TypeError("inv_freq must be a floating torch.Tensor")
    if inv_freq.dim() != 1:
        raise ValueError(f"inv_freq must be 1-D, got shape {tuple(inv_freq.shape)}")
    check_int("context", context)
    inv_freq = inv_freq.to(torch.float64).unsqueeze(0)
    cells = _LAST_CHUNK * max(1, inv_freq.numel())  # at most _LAST_CHUNK distances a chunk
    first = int(_first_negatives(lambda index: inv_freq[index], 1, context, _FIRST_CHUNK, cells)[0])
    return None if first < 0 else first


def first_negative_similarity(dim: int, base: float, context: int) -> int | None:
    """The smallest distance ``m <= context`` with ``B_m < 0`` (:func:`similarity_margin`),
    or None when ``B_m >= 0`` at every distance from 0 to ``context``.

    Raises:
        TypeError, ValueError: as :func:`similarity_margin`; ``context`` not a positive int.
    """
    return first_negative_margin(rope_inv_freq(dim, base, dtype=torch.float64), context)


def _passing(dim: int, bases: Tensor, context: int) -> Tensor:
    """Which of ``bases`` keep ``B_m >= 0`` for every distance up to ``context``: a sieve
    that tests all of them on the first distances and only the survivors further."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim

    def frequencies(index: Tensor) -> Tensor:
        return bases[index].unsqueeze(1) ** -exponents  # [len(index), d/2]

    # chunks of 256 distances and more, up to 2^21 angles
    return _first_negatives(frequencies, len(bases), context, 256, 1 << 21) < 0


def base_lower_bound(dim: int, context: int, *, ratio: float = 1.001) -> float:
    """The smallest base with ``B_m ≥ 0`` at every distance up to ``context`` (Men et al.
    2024, eq. 11; :func:`first_negative_similarity`), on a geometric grid.

    The bases that pass do not form an interval: above the smallest one, some fail again
    (for ``d = 128`` and a context of 4096, the test flips nine times between 1e3 and
    1e6), and some windows of passing bases are narrower than 1%. So no bisection: the
    grid ``2, 2·ratio, 2·ratio², …`` is tested in blocks, each base on all distances from
    0 to ``context``, and the first base that passes is returned. A window narrower than
    one grid step can be missed; the answer is within a factor ``ratio`` above the
    smallest passing base otherwise.

    Raises:
        TypeError, ValueError: ``dim`` not a positive even int, ``context`` not a positive
            int, ``ratio`` not a number above 1; ValueError when no base up to 1e15 passes.
    """
    check_rope_dim("dim", dim)
    check_int("context", context)
    if isinstance(ratio, bool) or not isinstance(ratio, float | int):
        raise TypeError(f"ratio must be a float, got {type(ratio).__name__}")
    if not ratio > 1.0:
        raise ValueError(f"ratio must be greater than 1, got {ratio}")
    steps = math.ceil(math.log(1e15 / 2) / math.log(ratio))
    for first in range(0, steps + 1, 1024):
        grid = 2.0 * ratio ** torch.arange(first, min(first + 1024, steps + 1), dtype=torch.float64)
        passing = _passing(dim, grid, context).nonzero()
        if len(passing):
            return float(grid[int(passing[0])])
    raise ValueError(f"no base up to 1e15 keeps B_m >= 0 up to context={context}")


MEN_ET_AL_TABLE_2: dict[int, float] = {
    1024: 4.3e3,
    2048: 1.6e4,
    4096: 2.7e4,
    8192: 8.4e4,
    16384: 3.1e5,
    32768: 6.4e5,
    65536: 2.1e6,
    131072: 7.8e6,
    262144: 3.6e7,
    524288: 6.4e7,
    1048576: 5.1e8,
}
"""The lower bounds on the base that Men et al. (2024) print in their Table 2, by context
length (1k to 1M tokens; a head width of 128, as in Llama 2), quoted from the paper."""

BASE_BOUNDS: dict[tuple[int, int], float] = {
    # computed by tools/base_bounds.py with base_lower_bound's defaults (grid ratio 1.001)
    (128, 1024): 4295.450581545556,
    (128, 2048): 11589.045391023603,
    (128, 4096): 26967.651915530067,
    (128, 8192): 83769.70681258156,
    (128, 16384): 234055.3885749997,
    (128, 32768): 630216.0018775224,
    (128, 65536): 2091136.5907076276,
    (128, 131072): 4870930.6785044605,
}
""":func:`base_lower_bound` for (head width, context) pairs, computed once by
``tools/base_bounds.py`` because the long contexts take minutes; the tests recompute the
short ones."""
