"""Paired statistics of chapter 12: the exact bootstrap interval against hand-worked cases."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pecode.experiments.stats import MAX_BOOTSTRAP_SEEDS, paired_bootstrap


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
