"""Paired comparisons over a few seeds: the exact bootstrap interval of a mean difference.

Two readings of the same trained weights (plain RoPE and RoPE with YaRN frequencies,
say), or two models trained with the same seed on the same data and tested on the same
sequences, give one *difference* per seed. The comparison is about the mean of those
differences, and the differences, not the two columns of accuracies, carry its spread:
a seed that is hard for both readings cancels out.

:func:`paired_bootstrap` gives the percentile bootstrap interval of the mean difference
(Efron and Tibshirani 1993, ch. 13), computed *exactly*: with ``n`` seeds there are only
``n**n`` equally likely resamples, so instead of drawing some at random we enumerate
their distinct multisets with their multinomial weights. The interval is then a
property of the differences alone: no random numbers, the same on every machine.

With five seeds the bootstrap is a rough tool: it cannot see a spread larger than the
one the seeds showed, and it tends to give intervals that are too narrow. The book
therefore also prints how many seeds agree in sign, and asserts a direction only where
the whole interval lies on one side of zero.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations_with_replacement

__all__ = ["MAX_BOOTSTRAP_SEEDS", "PairedInterval", "paired_bootstrap"]

MAX_BOOTSTRAP_SEEDS = 10
"""The most differences :func:`paired_bootstrap` enumerates (92,378 multisets for 10)."""


@dataclass(frozen=True)
class PairedInterval:
    """The mean of paired differences, its bootstrap interval and the sign count.

    Attributes:
        mean: the mean difference.
        low, high: the interval's ends.
        confidence: the interval's nominal coverage, e.g. 0.95.
        positive, negative, count: how many differences are > 0, < 0, and in all.
    """

    mean: float
    low: float
    high: float
    confidence: float
    positive: int
    negative: int
    count: int

    @property
    def above_zero(self) -> bool:
        """True when the whole interval is above zero (the data support "greater")."""
        return self.low > 0

    @property
    def below_zero(self) -> bool:
        """True when the whole interval is below zero (the data support "smaller")."""
        return self.high < 0

    def __str__(self) -> str:
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def _check_differences(differences: Sequence[float]) -> list[float]:
    if isinstance(differences, str) or not isinstance(differences, Sequence):
        raise TypeError(
            f"differences must be a sequence of numbers, got {type(differences).__name__}"
        )
    values = []
    for value in differences:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"differences must hold numbers, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"differences must be finite, got {value}")
        values.append(float(value))
    if not 2 <= len(values) <= MAX_BOOTSTRAP_SEEDS:
        raise ValueError(
            f"differences must hold 2 to {MAX_BOOTSTRAP_SEEDS} values (one per seed), "
            f"got {len(values)}"
        )
    return values


def paired_bootstrap(differences: Sequence[float], *, confidence: float = 0.95) -> PairedInterval:
    """The exact percentile bootstrap interval of the mean of per-seed differences.

    Resampling ``n`` differences with replacement gives ``n**n`` equally likely
    resamples; the distinct ones are the multisets of ``n`` indices, each with
    probability ``n! / (c_1! ... c_n!) / n**n`` (``c_i``: how often index ``i`` is
    drawn). With ``M`` the mean of a resample and ``a = (1 - confidence) / 2``:

    * ``low`` is the smallest value of ``M`` with ``P(M <= low) >= a``,
    * ``high`` is the largest value of ``M`` with ``P(M >= high) >= a``,

    so that negating every difference negates and swaps the ends.

    Args:
        differences: one difference per seed (2 to ``MAX_BOOTSTRAP_SEEDS`` finite
            numbers), e.g. accuracy of reading A minus accuracy of reading B.
        confidence: nominal coverage, in ``(0, 1)``.

    Returns:
        A :class:`PairedInterval`.

    Raises:
        TypeError: ``differences`` is not a sequence of numbers.
        ValueError: fewer than 2 or more than ``MAX_BOOTSTRAP_SEEDS`` values, a
            value that is not finite, or ``confidence`` outside ``(0, 1)``.
    """
    values = _check_differences(differences)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise TypeError(f"confidence must be a number, got {type(confidence).__name__}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    n = len(values)
    total = n**n
    weights: Counter[float] = Counter()  # resample mean -> number of ordered resamples
    for draw in combinations_with_replacement(range(n), n):
        counts = Counter(draw).values()
        ways = math.factorial(n) // math.prod(math.factorial(c) for c in counts)
        weights[math.fsum(values[i] for i in draw) / n] += ways
    means = sorted(weights)
    tail = (1 - confidence) / 2 * total  # in units of ordered resamples
    below = 0
    for low in means:  # smallest mean with P(M <= low) >= tail
        below += weights[low]
        if below >= tail:
            break
    above = 0
    for high in reversed(means):  # largest mean with P(M >= high) >= tail
        above += weights[high]
        if above >= tail:
            break
    mean = math.fsum(values) / n
    return PairedInterval(
        mean=mean,
        low=low,
        high=high,
        confidence=float(confidence),
        positive=sum(v > 0 for v in values),
        negative=sum(v < 0 for v in values),
        count=n,
    )
