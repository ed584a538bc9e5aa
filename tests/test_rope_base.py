"""pecode.rope_base against loops written from the papers and the papers' own numbers.

* :func:`critical_dimension` against a plain Python loop counting the pairs ``i`` with
  ``L0 · b^(-2i/d) >= 2π`` (math.pow), over a grid of head widths, bases and lengths, and
  against Liu et al. 2023's published critical dimension for Llama 2 (92 of 128);
  :func:`turning_base` against the same loop on either side of it.
* :func:`similarity_margin` and :func:`first_negative_similarity` against a float64
  math.cos loop over ``B_m = Σ_i cos(m θ_i)`` (Men et al. 2024, eq. 11).
* :func:`base_lower_bound` against a brute force math.cos scan of the same grid (d=16),
  against :data:`BASE_BOUNDS` (whatever entries it holds), and against Men et al.'s
  Table 2 (:data:`MEN_ET_AL_TABLE_2`): 1k and 4k agree to the paper's two digits; at 2k
  the paper's 1.6e4 is not the smallest base that passes (Su Jianlin's brute force,
  kexue.fm/archives/10122, also found 1.2e4), which the math.cos loop confirms.

Each comparison has a neighbour showing that it can fail.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from pecode.rope_base import (
    BASE_BOUNDS,
    MEN_ET_AL_TABLE_2,
    base_lower_bound,
    critical_dimension,
    critical_index,
    first_negative_similarity,
    similarity_margin,
    turning_base,
)

TWO_PI = 2 * math.pi
GRID_RATIO = 1.001  # base_lower_bound's default grid: 2, 2·1.001, 2·1.001², ...


# ------------------------------------------------------------------ references (loops)


def _turning_pairs(dim: int, base: float, length: int) -> int:
    """How many pairs complete a turn within ``length`` positions: L0·b^(-2i/d) >= 2π."""
    return sum(1 for i in range(dim // 2) if length * math.pow(base, -2 * i / dim) >= TWO_PI)


def _margin(dim: int, base: float, m: int) -> float:
    """Men et al.'s B_m = Σ_{i<d/2} cos(m θ_i), θ_i = b^(-2i/d), in float64."""
    return sum(math.cos(m * math.pow(base, -2 * i / dim)) for i in range(dim // 2))


def _first_negative(dim: int, base: float, context: int) -> int | None:
    """The smallest m <= context with B_m < 0, by brute force."""
    thetas = [math.pow(base, -2 * i / dim) for i in range(dim // 2)]
    for m in range(context + 1):
        if sum(math.cos(m * t) for t in thetas) < 0:
            return m
    return None


@functools.cache
def _bound(dim: int, context: int) -> float:
    """base_lower_bound, computed once per session (1-9 s each for d=128)."""
    return base_lower_bound(dim, context)


# ------------------------------------------------------------------ critical dimension

GRID = [
    (dim, base, length)
    for dim in (4, 16, 64, 128, 256)
    for base in (10.0, 500.0, 1e4, 5e5, 1e6, 1e7)
    for length in (5, 7, 100, 2048, 4096, 32768, 131072)
]


def _whole(index: float) -> bool:
    return abs(index - round(index)) < 1e-9


def test_critical_dimension_equals_a_pair_count_loop_over_a_grid():
    checked = 0
    for dim, base, length in GRID:
        if _whole(critical_index(dim, base, length)):
            continue  # that pair turns exactly once: the count has one pair more
        expected = 2 * _turning_pairs(dim, base, length)
        assert critical_dimension(dim, base, length) == expected, (dim, base, length)
        checked += 1
    assert checked > 0.9 * len(GRID)


def test_neighbour_floor_instead_of_ceil_disagrees_with_the_loop():
    # 2⌊i_c⌋ undercounts by one pair wherever i_c is inside [0, d/2 - 1): the loop sees it
    wrong = [
        (dim, base, length)
        for dim, base, length in GRID
        if 2 * max(0, math.floor(critical_index(dim, base, length)))
        != 2 * _turning_pairs(dim, base, length)
    ]
    assert len(wrong) > 20


def test_critical_dimension_of_llama2_is_liu_et_al_2023s_92():
    # Liu et al. 2023 (arXiv 2310.05209): LLaMA2, d=128, base 10000, 4096 training tokens
    assert critical_dimension(128, 10000, 4096) == 92
    assert 2 * _turning_pairs(128, 10000.0, 4096) == 92
    # neighbour: another base or length gives another number
    assert critical_dimension(128, 500000, 4096) != 92
    assert critical_dimension(128, 10000, 8192) != 92


def test_critical_dimension_is_clipped_to_zero_and_dim():
    assert critical_dimension(64, 1e4, 6) == 0  # 6 < 2π: not even pair 0 turns
    assert _turning_pairs(64, 1e4, 6) == 0
    assert critical_dimension(64, 10.0, 131072) == 64
    assert _turning_pairs(64, 10.0, 131072) == 32


@pytest.mark.parametrize(("dim", "length"), [(4, 100), (16, 2048), (64, 4096), (128, 4096)])
def test_turning_base_is_where_the_last_pair_stops_completing_a_turn(dim, length):
    base = turning_base(dim, length)
    below, above = base * (1 - 1e-9), base * (1 + 1e-3)
    # the loop: every pair completes a turn just below, the last pair does not just above
    assert _turning_pairs(dim, below, length) == dim // 2
    assert _turning_pairs(dim, above, length) == dim // 2 - 1
    assert length * math.pow(above, -(dim - 2) / dim) < TWO_PI
    assert critical_dimension(dim, below, length) == dim
    assert critical_dimension(dim, above, length) == dim - 2


# ------------------------------------------------------------------ Men et al.'s B_m


@pytest.mark.parametrize(("dim", "base"), [(16, 10.0), (16, 1e4), (128, 1e4), (128, 5e5)])
def test_similarity_margin_equals_a_math_cos_loop(dim, base):
    distances = [0, 1, 2, 7, 100, 1000, 4095, 123_456]
    ours = similarity_margin(dim, base, torch.tensor(distances))
    assert ours.dtype == torch.float64
    expected = torch.tensor([_margin(dim, base, m) for m in distances], dtype=torch.float64)
    assert torch.allclose(ours, expected, rtol=0.0, atol=1e-9)
    assert ours[0] == dim // 2  # every cosine is 1 at distance 0
    # neighbour: the loop one distance further is another number
    shifted = torch.tensor([_margin(dim, base, m + 1) for m in distances], dtype=torch.float64)
    assert (ours - shifted).abs().max() > 1e-3


def test_similarity_margin_keeps_the_shape_of_distances():
    distances = torch.arange(12).reshape(3, 4)
    ours = similarity_margin(16, 1e4, distances)
    assert ours.shape == (3, 4)
    assert math.isclose(float(ours[2, 3]), _margin(16, 1e4, 11), abs_tol=1e-12)


@pytest.mark.parametrize("base", [10.0, 1000.0, 1e5, 1e6, 2e6, 1e7])
def test_first_negative_similarity_equals_brute_force(base):
    context = 3000
    expected = _first_negative(16, base, context)
    assert first_negative_similarity(16, base, context) == expected
    if expected is not None:  # neighbour: a context that stops just short finds none
        assert first_negative_similarity(16, base, expected - 1) is None
        assert first_negative_similarity(16, base, expected) == expected


def test_first_negative_similarity_finds_negatives_past_the_first_chunk():
    # the scan works in chunks of 1024, 2048, ...: a first negative past 1024 is found too
    found = {base: _first_negative(16, base, 3000) for base in (1e5, 1e6, 2e6, 1e7)}
    assert any(m is not None and m > 1024 for m in found.values()), found
    assert any(m is None for m in found.values()), found


# ------------------------------------------------------------------ the base bound


def test_base_lower_bound_equals_a_brute_force_scan_for_d16_context200():
    # the same grid 2·1.001^k, each base checked by the math.cos loop; the first that passes
    k = 0
    while _first_negative(16, 2.0 * GRID_RATIO**k, 200) is not None:
        k += 1
    expected = 2.0 * GRID_RATIO**k
    ours = base_lower_bound(16, 200)
    assert math.isclose(ours, expected, rel_tol=1e-12)
    # neighbours: the grid point below fails; a coarser grid lands elsewhere
    assert _first_negative(16, ours / GRID_RATIO, 200) is not None
    assert not math.isclose(base_lower_bound(16, 200, ratio=1.01), ours, rel_tol=1e-3)


def test_base_lower_bound_for_d16_context200_is_not_an_interval():
    # above the bound, some bases fail again (the reason base_lower_bound does not bisect)
    ours = base_lower_bound(16, 200)
    above = [ours * GRID_RATIO**j for j in range(1, 200)]
    assert any(_first_negative(16, base, 200) is not None for base in above)


def test_base_bounds_entries_agree_with_a_recomputation():
    # BASE_BOUNDS is filled by tools/base_bounds.py; check whatever entries it holds
    for (dim, context), value in BASE_BOUNDS.items():
        assert isinstance(dim, int), dim
        assert isinstance(context, int), context
        k = math.log(value / 2) / math.log(GRID_RATIO)
        assert abs(k - round(k)) < 1e-6, (dim, context, value)  # a point of the grid
        if context <= 4096:
            assert math.isclose(value, _bound(dim, context), rel_tol=1e-9), (dim, context)
        if context <= 16384:  # passes, and the grid point below it fails (torch scan)
            assert first_negative_similarity(dim, value, context) is None, (dim, context)
            below = first_negative_similarity(dim, value / GRID_RATIO, context)
            assert below is not None, (dim, context)
    # a bound for a longer context passes every shorter one, so it is no smaller
    for (dim, context), value in BASE_BOUNDS.items():
        for (other_dim, other_context), other in BASE_BOUNDS.items():
            if other_dim == dim and other_context > context:
                assert other >= value, (dim, context, other_context)


def test_base_bounds_neighbour_a_wrong_entry_would_fail():
    # the recomputation tells 2048's bound from 1024's and from the paper's
    assert not math.isclose(_bound(128, 2048), _bound(128, 1024), rel_tol=1e-9)
    assert not math.isclose(_bound(128, 2048), MEN_ET_AL_TABLE_2[2048], rel_tol=1e-9)


def _two_digits(value: float) -> float:
    return float(f"{value:.1e}")


@pytest.mark.parametrize("context", [1024, 4096])
def test_base_lower_bound_agrees_with_men_et_al_table_2_to_two_digits(context):
    ours = _bound(128, context)
    assert _two_digits(ours) == MEN_ET_AL_TABLE_2[context]
    assert first_negative_similarity(128, ours, context) is None
    assert first_negative_similarity(128, ours / GRID_RATIO, context) is not None


def test_men_et_al_table_2_at_2048_is_not_the_smallest_base():
    # Men et al. 2024 print 1.6e4 for 2048 tokens; the math.cos loop finds no negative B_m
    # up to 2048 at our 1.16e4 (Su Jianlin's brute force, kexue.fm/archives/10122: 1.2e4)
    # and one at the grid point just below it
    ours = _bound(128, 2048)
    paper = MEN_ET_AL_TABLE_2[2048]
    assert ours < paper
    assert _two_digits(ours) == 1.2e4 != paper
    assert _first_negative(128, ours, 2048) is None
    assert _first_negative(128, ours / GRID_RATIO, 2048) is not None
    assert _first_negative(128, paper, 2048) is None  # the paper's base passes too
    assert ours >= _bound(128, 1024)


def test_base_lower_bound_for_4096_is_not_monotone_above_it():
    # some base above the bound fails again: scan upwards in steps of 1%
    ours = _bound(128, 4096)
    failing = None
    for j in range(1, 200):
        base = ours * 1.01**j
        if first_negative_similarity(128, base, 4096) is not None:
            failing = base
            break
    assert failing is not None
    m = _first_negative(128, failing, 4096)  # the loop confirms it
    assert m is not None
    assert m <= 4096
    assert _margin(128, failing, m) < 0


def test_table_2_is_quoted_whole():
    # eleven rows, 1k to 1M tokens, increasing as longer contexts need larger bases
    assert sorted(MEN_ET_AL_TABLE_2) == [2**p for p in range(10, 21)]
    values = [MEN_ET_AL_TABLE_2[2**p] for p in range(10, 21)]
    assert values == sorted(values)


# ------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: critical_dimension(127, 1e4, 4096), ValueError, "dim"),
        (lambda: critical_dimension(True, 1e4, 4096), TypeError, "dim"),
        (lambda: critical_dimension(128, 1.0, 4096), ValueError, "base"),
        (lambda: critical_dimension(128, "x", 4096), TypeError, "base"),
        (lambda: critical_dimension(128, 1e4, 0), ValueError, "trained_length"),
        (lambda: critical_dimension(128, 1e4, 4096.0), TypeError, "trained_length"),
        (lambda: critical_index(128, 1e4, -1), ValueError, "trained_length"),
        (lambda: turning_base(2, 4096), ValueError, "dim"),
        (lambda: turning_base(128, 0), ValueError, "trained_length"),
        (lambda: similarity_margin(16, 1e4, torch.tensor([1.0])), TypeError, "distances"),
        (lambda: similarity_margin(16, 1e4, [1, 2]), TypeError, "distances"),
        (lambda: similarity_margin(15, 1e4, torch.tensor([1])), ValueError, "dim"),
        (lambda: first_negative_similarity(16, 1e4, 0), ValueError, "context"),
        (lambda: first_negative_similarity(16, 1e4, "x"), TypeError, "context"),
        (lambda: base_lower_bound(15, 100), ValueError, "dim"),
        (lambda: base_lower_bound(16, 0), ValueError, "context"),
        (lambda: base_lower_bound(16, 100, ratio=1.0), ValueError, "ratio"),
        (lambda: base_lower_bound(16, 100, ratio=0.5), ValueError, "ratio"),
        (lambda: base_lower_bound(16, 100, ratio=float("nan")), ValueError, "ratio"),
        (lambda: base_lower_bound(16, 100, ratio="x"), TypeError, "ratio"),
        (lambda: base_lower_bound(16, 100, ratio=True), TypeError, "ratio"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_neighbour_good_inputs_do_not_raise():
    assert critical_dimension(128, 10000, 4096) == 92
    assert turning_base(4, 100) > 1
    assert similarity_margin(16, 1e4, torch.tensor([0]))[0] == 8
    assert first_negative_similarity(16, 1e4, 1) is None
