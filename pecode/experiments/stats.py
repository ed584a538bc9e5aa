"""Paired comparisons over a few seeds: an interval for a mean difference that covers.

Two readings of the same trained weights (plain RoPE and RoPE with YaRN frequencies,
say), or two models trained with the same seed and tested on the same sequences, give
one *difference* per seed. The comparison is about the mean of those differences, and
the differences, not the two columns of scores, carry its spread: a seed that is hard
for both readings cancels out.

:func:`paired_t_interval` is the interval the book uses: Student's t-interval on the
paired differences, ``mean +- t_{(1+c)/2, n-1} s / sqrt(n)``. Its coverage is exactly
``c`` when the differences are normal, at every ``n >= 2``; :func:`simulated_coverage`
measures it on normal and on skewed differences (tests/test_experiments_stats.py runs
that simulation at the seed counts the book uses). Why not the others:

* :func:`paired_bootstrap`, the exact percentile bootstrap the book used before, is
  kept as the counter-example: at two seeds its "95 %" interval is the range of the two
  values and covers the mean half the time; at five seeds it covers about 0.83, because
  it cannot see more spread than the seeds showed and ignores that ``s`` is estimated.
* an exact sign-flip permutation test cannot reach the 5 % level with five seeds: its
  smallest two-sided p-value is ``2 / 2**5 = 0.0625``.

Each interval is reported with the sign count (how many seeds agree in direction), and
a direction is asserted only where the whole interval lies on one side of zero.
"""

from __future__ import annotations

import functools
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations_with_replacement

from pecode._checks import check_int

__all__ = [
    "COVERAGE_DISTRIBUTIONS",
    "MAX_BOOTSTRAP_SEEDS",
    "PairedInterval",
    "paired_bootstrap",
    "paired_t_interval",
    "simulated_coverage",
    "t_quantile",
]

MAX_BOOTSTRAP_SEEDS = 10
"""The most differences :func:`paired_bootstrap` enumerates (92,378 multisets for 10)."""


@dataclass(frozen=True)
class PairedInterval:
    """The mean of paired differences, an interval for it and the sign count.

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


def _check_differences(
    differences: Sequence[float], most: int = MAX_BOOTSTRAP_SEEDS
) -> list[float]:
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
    if not 2 <= len(values) <= most:
        raise ValueError(
            f"differences must hold 2 to {most} values (one per seed), got {len(values)}"
        )
    return values


def _check_confidence(confidence: float) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise TypeError(f"confidence must be a number, got {type(confidence).__name__}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    return float(confidence)


def paired_bootstrap(differences: Sequence[float], *, confidence: float = 0.95) -> PairedInterval:
    """The exact percentile bootstrap interval of the mean of per-seed differences.

    Not the book's interval: with few seeds it covers far less than ``confidence``
    (:func:`simulated_coverage`); use :func:`paired_t_interval`.

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
    confidence = _check_confidence(confidence)
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
        confidence=confidence,
        positive=sum(v > 0 for v in values),
        negative=sum(v < 0 for v in values),
        count=n,
    )


def t_quantile(probability: float, degrees_of_freedom: int) -> float:
    """The ``probability`` quantile of Student's t distribution.

    Solves ``F(t) = probability`` by bisection, with the CDF written through the
    regularized incomplete beta function, ``F(t) = 1 - I_x(nu/2, 1/2) / 2`` for
    ``t >= 0`` and ``x = nu / (nu + t**2)`` (Abramowitz and Stegun 26.7.1), evaluated by
    mpmath (a dependency of sympy) to 30 digits.

    Raises:
        TypeError: ``degrees_of_freedom`` is not an int.
        ValueError: ``probability`` outside ``(0, 1)`` or ``degrees_of_freedom < 1``.
    """
    if isinstance(degrees_of_freedom, bool) or not isinstance(degrees_of_freedom, int):
        raise TypeError(
            f"degrees_of_freedom must be an int, got {type(degrees_of_freedom).__name__}"
        )
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees_of_freedom must be >= 1, got {degrees_of_freedom}")
    if not 0 < probability < 1:
        raise ValueError(f"probability must lie strictly between 0 and 1, got {probability}")
    if probability < 0.5:
        return -_upper_t_quantile(1 - probability, degrees_of_freedom)
    return _upper_t_quantile(probability, degrees_of_freedom)


@functools.lru_cache(maxsize=256)
def _upper_t_quantile(probability: float, degrees_of_freedom: int) -> float:
    import mpmath  # sympy's dependency; imported here so that pecode loads without it

    nu = mpmath.mpf(degrees_of_freedom)
    with mpmath.workdps(30):

        def cdf(t: mpmath.mpf) -> mpmath.mpf:
            return 1 - mpmath.betainc(nu / 2, 0.5, 0, nu / (nu + t * t), regularized=True) / 2

        low, high = mpmath.mpf(0), mpmath.mpf(1)
        while cdf(high) < probability:
            high *= 2
        for _ in range(200):  # 2**-200 of the bracket: far below float precision
            middle = (low + high) / 2
            if cdf(middle) < probability:
                low = middle
            else:
                high = middle
        return float((low + high) / 2)


MAX_T_SEEDS = 10_000
"""The most differences :func:`paired_t_interval` accepts (a guard against passing a
whole tensor of per-target losses where per-seed means belong)."""


def paired_t_interval(differences: Sequence[float], *, confidence: float = 0.95) -> PairedInterval:
    """Student's t-interval for the mean of per-seed differences.

    ``mean +- t_q * s / sqrt(n)`` with ``s`` the sample standard deviation
    (denominator ``n - 1``) and ``t_q`` the ``(1 + confidence) / 2`` quantile of
    Student's t with ``n - 1`` degrees of freedom
    (:func:`pecode.experiments.t_quantile`). Exact coverage
    for normal differences at any ``n >= 2``; on skewed ones somewhat less
    (:func:`simulated_coverage`). When every difference is the same the interval is
    that single value.

    Args:
        differences: one difference per seed (at least 2 finite numbers).
        confidence: nominal coverage, in ``(0, 1)``.

    Returns:
        A :class:`PairedInterval`.

    Raises:
        TypeError: ``differences`` is not a sequence of numbers.
        ValueError: fewer than 2 values, a value that is not finite, or
            ``confidence`` outside ``(0, 1)``.
    """
    values = _check_differences(differences, most=MAX_T_SEEDS)
    confidence = _check_confidence(confidence)
    n = len(values)
    mean = math.fsum(values) / n
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half_width = t_quantile((1 + confidence) / 2, n - 1) * math.sqrt(variance / n)
    return PairedInterval(
        mean=mean,
        low=mean - half_width,
        high=mean + half_width,
        confidence=confidence,
        positive=sum(v > 0 for v in values),
        negative=sum(v < 0 for v in values),
        count=n,
    )


COVERAGE_DISTRIBUTIONS: tuple[str, ...] = ("normal", "skewed")
"""Distributions :func:`simulated_coverage` draws differences from: standard normal, and
a centred exponential (``Exp(1) - 1``, skewness 2), both with true mean 0."""


def simulated_coverage(
    interval: Callable[..., PairedInterval],
    seeds: int,
    *,
    distribution: str = "normal",
    repeats: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> float:
    """How often ``interval`` covers the true mean, by simulation.

    Draws ``repeats`` experiments of ``seeds`` differences each from ``distribution``
    (true mean 0; a ``random.Random(seed)`` generator, the same on every machine) and
    returns the share whose interval, ``interval(differences, confidence=confidence)``,
    contains 0. With ``repeats = 2000`` the share has a standard error of about 0.005
    at a true coverage of 0.95.

    Raises:
        ValueError: an unknown ``distribution``, fewer than 2 ``seeds`` or no repeats.
    """
    check_int("seeds", seeds, 2)
    check_int("repeats", repeats, 1)
    if distribution not in COVERAGE_DISTRIBUTIONS:
        raise ValueError(
            f"unknown distribution {distribution!r}; accepted: {list(COVERAGE_DISTRIBUTIONS)}"
        )
    rng = random.Random(seed)
    draw = (
        (lambda: rng.gauss(0.0, 1.0))
        if distribution == "normal"
        else (lambda: rng.expovariate(1.0) - 1.0)
    )
    covered = 0
    for _ in range(repeats):
        result = interval([draw() for _ in range(seeds)], confidence=confidence)
        covered += result.low <= 0.0 <= result.high
    return covered / repeats
