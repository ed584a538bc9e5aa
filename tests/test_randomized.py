"""pecode.randomized: the drawn positions against the exact law of a uniform ordered
subset, with near-miss samplers that the same checks reject, and inside attention."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.attention import KVCache, MultiHeadAttention
from pecode.randomized import randomized_positions
from pecode.rope import RotaryEmbedding

N, K, DRAWS = 20, 5, 20000  # positions 0..N-1, K per row, DRAWS rows
SDS = 5  # tolerance of each frequency, in binomial standard deviations


def _order_statistic_law(j: int, t: int) -> float:
    """P(the j-th smallest (1-based) of a uniform K-subset of 0..N-1 is t): t positions
    below it hold j - 1 of the others, the N - 1 - t above it the other K - j."""
    return math.comb(t, j - 1) * math.comb(N - 1 - t, K - j) / math.comb(N, K)


def _largest_z(frequencies: list[float], laws: list[float]) -> float:
    """The largest |frequency - p| over its binomial sd sqrt(p (1 - p) / DRAWS); a cell
    with p = 0 counts as infinitely far if it is ever hit."""
    worst = 0.0
    for f, p in zip(frequencies, laws, strict=True):
        if p in (0.0, 1.0):
            worst = max(worst, 0.0 if f == p else math.inf)
        else:
            worst = max(worst, abs(f - p) / math.sqrt(p * (1 - p) / DRAWS))
    return worst


def _min_survival_z(rows: torch.Tensor, ts: range = range(N)) -> float:
    """Compare P(min >= t) with C(N - t, K) / C(N, K), the chance that all K fall in t..N-1."""
    smallest = rows.min(dim=-1).values
    frequencies = [float((smallest >= t).double().mean()) for t in ts]
    laws = [math.comb(N - t, K) / math.comb(N, K) for t in ts]
    return _largest_z(frequencies, laws)


def _order_statistics_z(rows: torch.Tensor) -> float:
    frequencies, laws = [], []
    for j in range(1, K + 1):
        column = rows[:, j - 1]
        for t in range(N):
            frequencies.append(float((column == t).double().mean()))
            laws.append(_order_statistic_law(j, t))
    return _largest_z(frequencies, laws)


def _draws(sampler: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if sampler == "pecode":
        return randomized_positions(DRAWS, K, N, generator=g)
    if sampler == "with replacement":  # sorted i.i.d. draws: repeats allowed
        return torch.randint(0, N, (DRAWS, K), generator=g).sort(dim=-1).values
    if sampler == "random shift":  # a contiguous block at a random offset
        return torch.randint(0, N - K + 1, (DRAWS, 1), generator=g) + torch.arange(K)
    raise AssertionError(sampler)


@pytest.fixture(scope="module")
def pecode_rows():
    return _draws("pecode")


def test_laws_are_distributions():
    for j in range(1, K + 1):
        assert sum(_order_statistic_law(j, t) for t in range(N)) == pytest.approx(1, rel=1e-12)


def test_rows_are_sorted_distinct_and_in_range(pecode_rows):
    assert pecode_rows.shape == (DRAWS, K)
    assert pecode_rows.dtype == torch.int64
    assert (pecode_rows.diff(dim=-1) > 0).all()
    assert int(pecode_rows.min()) == 0
    assert int(pecode_rows.max()) == N - 1


def test_the_smallest_position_follows_the_exact_law(pecode_rows):
    """Empirical P(min >= t), t = 0..N-1, within 5 binomial sd of C(N - t, K)/C(N, K)."""
    assert _min_survival_z(pecode_rows) < SDS


def test_every_order_statistic_follows_the_exact_law(pecode_rows):
    """Every position's frequency as the j-th smallest, within 5 sd of its exact law."""
    assert _order_statistics_z(pecode_rows) < SDS


@pytest.mark.parametrize("sampler", ["with replacement", "random shift"])
def test_near_miss_samplers_fail_the_same_checks(sampler):
    """Sorted draws with replacement (torch.randint) and a contiguous block at a random
    offset: far outside 5 sd, also on the values of t the law gives 0 < p < 1 alone."""
    rows = _draws(sampler)
    assert _min_survival_z(rows) > 2 * SDS
    assert _min_survival_z(rows, range(1, N - K + 1)) > 2 * SDS
    assert _order_statistics_z(rows) > 2 * SDS


def _min_correlation(pairs: torch.Tensor) -> float:
    first, second = pairs[:, 0].min(dim=-1).values, pairs[:, 1].min(dim=-1).values
    return float(torch.corrcoef(torch.stack((first, second)).double())[0, 1])


def test_rows_are_independent_unlike_one_draw_shared_by_the_batch():
    """The minima of two rows of one call are uncorrelated (|r| within 5 sd, 1/sqrt(S));
    the authors' code shares one draw across the batch, which this check rejects."""
    g = torch.Generator().manual_seed(1)
    calls = 4000
    ours = torch.stack([randomized_positions(2, K, N, generator=g) for _ in range(calls)])
    shared = torch.stack(
        [randomized_positions(1, K, N, generator=g).expand(2, K) for _ in range(calls)]
    )
    assert abs(_min_correlation(ours)) < SDS / math.sqrt(calls)
    assert _min_correlation(shared) == pytest.approx(1.0)


def test_all_positions_when_length_is_max_position_and_generators_reproduce():
    assert randomized_positions(3, 6, 6).tolist() == [list(range(6))] * 3
    a = randomized_positions(2, 4, 50, generator=torch.Generator().manual_seed(7))
    b = randomized_positions(2, 4, 50, generator=torch.Generator().manual_seed(7), device="cpu")
    assert torch.equal(a, b)
    assert a.device == torch.device("cpu")


def _layer():
    torch.manual_seed(0)
    return MultiHeadAttention(32, 4, position=RotaryEmbedding(8))


def test_a_rope_layer_takes_the_positions_per_row():
    """[B, L] positions from randomized_positions rotate each row by its own positions:
    the batch equals each row run alone with its positions as [L], and differs from the
    default positions 0..L-1."""
    layer = _layer()
    x = torch.randn(3, 6, 32, generator=torch.manual_seed(1))
    positions = randomized_positions(3, 6, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = layer(x, positions=positions, causal=True)
        for b in range(3):
            alone = layer(x[b : b + 1], positions=positions[b], causal=True)
            torch.testing.assert_close(out[b : b + 1], alone, rtol=1e-5, atol=1e-5)
        assert (out - layer(x, causal=True)).abs().max() > 1e-3


def test_decoding_with_the_drawn_positions_equals_one_pass():
    """With a KVCache, each step is given its slice of the draw (the cache's default would
    continue from the last position plus one)."""
    layer = _layer()
    x = torch.randn(2, 7, 32, generator=torch.manual_seed(3))
    positions = randomized_positions(2, 7, 100, generator=torch.Generator().manual_seed(4))
    cache, outputs, start = KVCache(), [], 0
    with torch.no_grad():
        full = layer(x, positions=positions, causal=True)
        for size in (4, 1, 1, 1):
            piece = slice(start, start + size)
            outputs.append(
                layer(x[:, piece], positions=positions[:, piece], causal=True, cache=cache)
            )
            start += size
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=1e-5, atol=1e-5)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="max_position"):
        randomized_positions(1, 9, 8)
    with pytest.raises(ValueError, match="batch"):
        randomized_positions(0, 2, 8)
    with pytest.raises(ValueError, match="length"):
        randomized_positions(1, 0, 8)
    with pytest.raises(ValueError, match="max_position"):
        randomized_positions(1, 2, -3)
    with pytest.raises(TypeError, match="length"):
        randomized_positions(1, 2.0, 8)
    with pytest.raises(TypeError, match="generator"):
        randomized_positions(1, 2, 8, generator=0)
