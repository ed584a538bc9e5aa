"""Paired statistics of chapters 13 and 14: Student's t-interval against printed t tables
and hand-worked cases, its coverage by simulation at the seed counts the book uses (and
the exact bootstrap's, the false neighbour, which falls short), and the exact bootstrap
against hand-worked cases and brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pecode.experiments.stats import (
    MAX_BOOTSTRAP_SEEDS,
    paired_bootstrap,
    paired_t_interval,
    simulated_coverage,
    t_quantile,
)

# Student's t quantiles as printed in a standard table (e.g. NIST/SEMATECH e-Handbook of
# Statistical Methods, 1.3.6.7.2, "Critical values of the Student's t distribution"):
# (upper-tail probability, degrees of freedom) -> value, to the table's three decimals.
PRINTED_T = {
    (0.025, 1): 12.706,
    (0.025, 4): 2.776,
    (0.025, 9): 2.262,
    (0.05, 4): 2.132,
    (0.005, 4): 4.604,
    (0.025, 30): 2.042,
}


@pytest.mark.parametrize(("tail", "df"), sorted(PRINTED_T))
def test_t_quantile_matches_the_printed_table(tail, df):
    assert round(t_quantile(1 - tail, df), 3) == PRINTED_T[tail, df]
    assert t_quantile(tail, df) == pytest.approx(-t_quantile(1 - tail, df))


def test_t_quantile_is_the_normal_quantile_for_many_degrees():
    assert t_quantile(0.975, 100_000) == pytest.approx(1.959964, abs=1e-4)


def test_t_quantile_rejects_bad_input():
    with pytest.raises(ValueError, match="probability"):
        t_quantile(1.0, 4)
    with pytest.raises(ValueError, match="degrees_of_freedom"):
        t_quantile(0.975, 0)
    with pytest.raises(TypeError, match="degrees_of_freedom"):
        t_quantile(0.975, 4.0)


def test_t_interval_by_hand():
    # 1, 2, 3, 4, 5: mean 3, s = sqrt(2.5) = 1.5811, s / sqrt(5) = 0.70711;
    # t(0.975, 4) = 2.7764: 3 +- 1.9632
    result = paired_t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert result.mean == 3.0
    assert (result.low, result.high) == pytest.approx((3 - 1.96324, 3 + 1.96324), abs=1e-5)
    assert (result.positive, result.negative, result.count) == (5, 0, 5)
    assert result.above_zero
    # 90 %: t(0.95, 4) = 2.13185: 3 +- 1.50744
    ninety = paired_t_interval([1.0, 2.0, 3.0, 4.0, 5.0], confidence=0.9)
    assert ninety.high == pytest.approx(3 + 1.50744, abs=1e-5)
    # equal differences: no spread, the interval is the value
    same = paired_t_interval([0.5, 0.5, 0.5])
    assert (same.low, same.high) == (0.5, 0.5)
    # negating swaps the ends
    back = paired_t_interval([-1.0, -2.0, -3.0, -4.0, -5.0])
    assert (back.low, back.high) == pytest.approx((-result.high, -result.low))


def test_t_interval_is_wider_than_the_bootstrap_where_the_bootstrap_undercovers():
    values = [0.1, 0.25, -0.05, 0.3, 0.15]
    t, boot = paired_t_interval(values), paired_bootstrap(values)
    assert t.low < boot.low
    assert t.high > boot.high


def test_t_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="differences"):
        paired_t_interval([1.0])
    with pytest.raises(ValueError, match="finite"):
        paired_t_interval([0.0, float("inf")])
    with pytest.raises(TypeError, match="differences"):
        paired_t_interval([0.1, None])
    with pytest.raises(ValueError, match="confidence"):
        paired_t_interval([0.0, 1.0], confidence=0.0)


# --- coverage, by simulation -----------------------------------------------------------
# 2,000 simulated experiments per case: the share's standard error at a true 0.95 is
# 0.0049, so [0.935, 0.965] is a three-standard-error band.


@pytest.mark.parametrize("seeds", [2, 5])
def test_t_interval_covers_95_percent_of_normal_differences(seeds):
    coverage = simulated_coverage(paired_t_interval, seeds, distribution="normal")
    assert 0.935 <= coverage <= 0.965


def test_t_interval_on_skewed_differences_covers_what_the_docs_say():
    # Exp(1) - 1 (skewness 2) at five seeds: about 0.88, as the book states next to its
    # intervals; the check fails if the method or the simulation changes
    coverage = simulated_coverage(paired_t_interval, 5, distribution="skewed")
    assert 0.86 <= coverage <= 0.90


@pytest.mark.parametrize(("seeds", "at_most"), [(2, 0.55), (5, 0.87)])
def test_the_bootstrap_falls_short_of_its_label(seeds, at_most):
    # the false neighbour: the percentile bootstrap labelled 95 % covers about 0.50 at two
    # seeds and 0.83 at five, so the coverage test above would fail for it
    coverage = simulated_coverage(paired_bootstrap, seeds, distribution="normal")
    assert coverage <= at_most


def test_simulated_coverage_rejects_bad_input():
    with pytest.raises(ValueError, match="distribution"):
        simulated_coverage(paired_t_interval, 5, distribution="cauchy")
    with pytest.raises(ValueError, match="seeds"):
        simulated_coverage(paired_t_interval, 1)


def test_two_seeds_by_hand():
    # resamples of (0, 1): (0,0) mean 0, (0,1) and (1,0) mean 0.5, (1,1) mean 1;
    # P(M <= 0) = 1/4, P(M >= 1) = 1/4, P(M >= 0.5) = 3/4
    wide = paired_bootstrap([0.0, 1.0], confidence=0.95)
    assert (wide.low, wide.mean, wide.high) == (0.0, 0.5, 1.0)
    # a = 0.25: P(M <= 0) = 1/4 reaches a; P(M >= 1) = 1/4 reaches a
    assert (paired_bootstrap([0.0, 1.0], confidence=0.5).low, 0.0) == (0.0, 0.0)
    # a = 0.3: the ends move in to 0.5
    narrow = paired_bootstrap([0.0, 1.0], confidence=0.4)
    assert (narrow.low, narrow.high) == (0.5, 0.5)


def test_three_seeds_by_hand():
    # resamples of (0, 0, 3): the mean is k, the number of draws of the 3, and
    # k ~ Binomial(3, 1/3): P = 8/27, 12/27, 6/27, 1/27 for k = 0, 1, 2, 3.
    # 90 %: a = 0.05; P(M >= 3) = 0.037 < a, P(M >= 2) = 0.259 >= a  ->  (0, 2)
    ninety = paired_bootstrap([0.0, 0.0, 3.0], confidence=0.90)
    assert (ninety.low, ninety.high) == (0.0, 2.0)
    # 95 %: a = 0.025 <= 1/27  ->  (0, 3)
    ninety_five = paired_bootstrap([0.0, 0.0, 3.0], confidence=0.95)
    assert (ninety_five.low, ninety_five.high) == (0.0, 3.0)
    # 50 %: a = 0.25; P(M <= 0) = 0.296 >= a; P(M >= 2) = 0.259 >= a  ->  (0, 2)
    half = paired_bootstrap([0.0, 0.0, 3.0], confidence=0.5)
    assert (half.low, half.high) == (0.0, 2.0)
    assert (ninety.positive, ninety.negative, ninety.count) == (1, 0, 3)
    assert ninety.mean == 1.0


def _brute_force(values, confidence):
    """Every one of the n**n ordered resamples, counted one by one (a slow reference)."""
    n = len(values)
    means = sorted(math.fsum(d) / n for d in itertools.product(values, repeat=n))
    tail = (1 - confidence) / 2 * len(means)
    low = next(m for i, m in enumerate(means) if i + 1 >= tail)
    high = next(m for i, m in enumerate(reversed(means)) if i + 1 >= tail)
    return low, high


@pytest.mark.parametrize("seed", range(6))
def test_matches_all_ordered_resamples(seed):
    rng = random.Random(seed)
    n = rng.choice([3, 4, 5])
    values = [round(rng.uniform(-1, 1), 2) for _ in range(n)]
    result = paired_bootstrap(values, confidence=0.9)
    assert (result.low, result.high) == _brute_force(values, 0.9)


def test_negating_the_differences_swaps_the_ends():
    values = [0.3, -0.1, 0.25, 0.05, 0.4]
    forward, backward = paired_bootstrap(values), paired_bootstrap([-v for v in values])
    assert (backward.low, backward.high) == (-forward.high, -forward.low)
    assert (forward.positive, backward.positive) == (4, 1)


def test_direction_only_when_the_interval_excludes_zero():
    all_up = paired_bootstrap([0.1, 0.2, 0.05, 0.3, 0.15])
    assert all_up.above_zero
    assert not all_up.below_zero
    assert str(all_up) == "+0.16 [+0.09, +0.24]"
    mixed = paired_bootstrap([0.02, 0.01, -0.03, 0.04, -0.01])
    assert not mixed.above_zero
    assert not mixed.below_zero
    one_far_down = paired_bootstrap([0.1, 0.2, 0.05, 0.3, -2.0])  # 4 of 5 up, mean down
    assert one_far_down.low < 0 < one_far_down.high


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="differences"):
        paired_bootstrap([1.0])
    with pytest.raises(ValueError, match="differences"):
        paired_bootstrap([0.0] * (MAX_BOOTSTRAP_SEEDS + 1))
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap([0.0, float("nan")])
    with pytest.raises(TypeError, match="differences"):
        paired_bootstrap("0.1")
    with pytest.raises(TypeError, match="differences"):
        paired_bootstrap([0.1, True])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([0.0, 1.0], confidence=1.0)
