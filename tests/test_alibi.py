"""pecode.alibi against published slopes, exact sympy slopes and float64 loop references."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pecode.alibi import ALiBi, alibi_bias, alibi_bias_from_positions, alibi_key_bias, alibi_slopes
from pecode.attention import MultiHeadAttention
from pecode.reference import multi_head_attention_loop
from pecode.reference.alibi import (
    alibi_bias_loop,
    alibi_slopes_exact,
    alibi_slopes_geometric_exact,
)


def exp2_fractions(exponents: list[Fraction]) -> torch.Tensor:
    return torch.tensor([2.0 ** float(e) for e in exponents], dtype=torch.float64)


# Press et al. (2022), §3: 8 heads get 1/2, 1/4, ..., 1/256; 16 heads get
# 2^-0.5, 2^-1, ..., 2^-8.
PUBLISHED = {
    8: [Fraction(-k) for k in range(1, 9)],
    16: [Fraction(-k, 2) for k in range(1, 17)],
}
# The official code's rule, worked out by hand: p = 4, 8, 16 slopes, then every other
# slope of the 2p-head sequence, starting with its first.
HAND_DERIVED = {
    6: [Fraction(-2), Fraction(-4), Fraction(-6), Fraction(-8), Fraction(-1), Fraction(-3)],
    12: [Fraction(-k) for k in range(1, 9)] + [Fraction(-(2 * k + 1), 2) for k in range(4)],
    20: [Fraction(-k, 2) for k in range(1, 17)] + [Fraction(-(2 * k + 1), 4) for k in range(4)],
    3: [Fraction(-4), Fraction(-8), Fraction(-2)],
}


@pytest.mark.parametrize(("num_heads", "exponents"), [*PUBLISHED.items(), *HAND_DERIVED.items()])
def test_slopes_match_published_and_hand_derived_values(num_heads, exponents):
    slopes = alibi_slopes(num_heads, dtype=torch.float64)
    # within one rounding of float64: exp2 of a fraction need not be correctly rounded
    assert torch.allclose(slopes, exp2_fractions(exponents), rtol=1e-15, atol=0)


def test_eight_heads_are_exactly_the_papers_fractions():
    assert alibi_slopes(8).tolist() == [1 / 2**k for k in range(1, 9)]


@pytest.mark.parametrize("num_heads", range(1, 70))
def test_slopes_match_the_exact_recursion_of_the_official_code(num_heads):
    exact = torch.tensor([float(s) for s in alibi_slopes_exact(num_heads)], dtype=torch.float64)
    assert torch.allclose(alibi_slopes(num_heads, dtype=torch.float64), exact, rtol=1e-15, atol=0)


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16, 32, 64])
def test_powers_of_two_follow_the_papers_general_sentence(num_heads):
    literal = torch.tensor([float(s) for s in alibi_slopes_geometric_exact(num_heads)])
    assert torch.allclose(alibi_slopes(num_heads, dtype=torch.float64), literal.double())


@pytest.mark.parametrize("num_heads", [3, 5, 6, 12, 20, 24, 40])
def test_other_counts_differ_from_the_papers_general_sentence(num_heads):
    literal = torch.tensor([float(s) for s in alibi_slopes_geometric_exact(num_heads)])
    assert not torch.allclose(alibi_slopes(num_heads, dtype=torch.float64), literal.double())


@given(st.integers(min_value=1, max_value=300))
def test_slopes_are_a_subset_of_the_next_power_of_two(num_heads):
    next_power = 1 << (num_heads - 1).bit_length()
    pool = set(alibi_slopes(next_power, dtype=torch.float64).tolist())
    slopes = alibi_slopes(num_heads, dtype=torch.float64).tolist()
    assert set(slopes) <= pool
    assert len(set(slopes)) == num_heads  # no two heads share a slope
    assert min(slopes) == 2.0**-8  # the smallest slope is always 1/256
    assert max(slopes) <= 2.0**-0.0


def test_slope_dtype_and_device():
    assert alibi_slopes(4, dtype=torch.float16).dtype == torch.float16
    assert alibi_slopes(4).dtype == torch.float32


@pytest.mark.parametrize("bad", [0, -3])
def test_non_positive_head_count_is_refused(bad):
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(bad)
    with pytest.raises(ValueError, match="num_heads"):
        ALiBi(bad)


@pytest.mark.parametrize("bad", [2.0, True, "8"])
def test_non_int_head_count_is_refused(bad):
    with pytest.raises(TypeError, match="num_heads"):
        alibi_slopes(bad)


def test_integer_dtype_is_refused():
    with pytest.raises(TypeError, match="dtype"):
        alibi_slopes(4, dtype=torch.int64)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize(("q_len", "k_len"), [(1, 1), (5, 5), (3, 8), (1, 6)])
@pytest.mark.parametrize("num_heads", [1, 3, 8])
def test_bias_matches_loop_reference(symmetric, q_len, k_len, num_heads):
    slopes = alibi_slopes(num_heads, dtype=torch.float64)
    fast = alibi_bias(num_heads, q_len, k_len, symmetric=symmetric, dtype=torch.float64)
    queries = list(range(k_len - q_len, k_len))
    slow = alibi_bias_loop(slopes, queries, list(range(k_len)), symmetric=symmetric)
    assert fast.shape == (num_heads, q_len, k_len)
    assert torch.equal(fast, slow)


@given(
    st.lists(st.integers(-50, 50), min_size=1, max_size=6),
    st.lists(st.integers(-50, 50), min_size=1, max_size=6),
)
@settings(max_examples=40, deadline=None)
def test_bias_from_arbitrary_positions_matches_loop(q_pos, k_pos):
    slopes = alibi_slopes(3, dtype=torch.float64)
    fast = alibi_bias_from_positions(
        slopes, torch.tensor(q_pos), torch.tensor(k_pos), symmetric=True
    )
    assert torch.equal(fast, alibi_bias_loop(slopes, q_pos, k_pos, symmetric=True))
    if min(k_pos) <= min(q_pos):  # every query sees a key: causal is defined
        fast = alibi_bias_from_positions(slopes, torch.tensor(q_pos), torch.tensor(k_pos))
        assert torch.equal(fast, alibi_bias_loop(slopes, q_pos, k_pos))


def test_cache_layout_gives_the_last_rows_of_the_full_bias():
    full = alibi_bias(4, 9, dtype=torch.float64)
    assert torch.equal(alibi_bias(4, 3, 9, dtype=torch.float64), full[:, -3:])


def test_batched_positions_give_a_batched_bias():
    slopes = alibi_slopes(2, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2], [10, 11, 12]])
    bias = alibi_bias_from_positions(slopes, positions, positions, symmetric=True)
    assert bias.shape == (2, 2, 3, 3)
    assert torch.equal(bias[0], bias[1])  # only offsets matter


@pytest.mark.parametrize("symmetric", [False, True])
def test_scheme_inside_attention_matches_loop_reference(symmetric):
    torch.manual_seed(0)
    layer = MultiHeadAttention(12, 3, position=ALiBi(3, symmetric=symmetric)).double()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    bias = alibi_bias(3, 6, symmetric=symmetric, dtype=torch.float64)
    with torch.no_grad():
        fast = layer(x, causal=not symmetric)
    slow = multi_head_attention_loop(layer, x, causal=not symmetric, bias=bias)
    assert torch.allclose(fast, slow, atol=1e-12)


def test_causal_scheme_is_causal_even_without_the_flag():
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 2, position=ALiBi(2)).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        weights = layer.attention_weights(x)
    assert torch.all(weights.triu(diagonal=1) == 0)
    with torch.no_grad():
        assert torch.allclose(layer(x), layer(x, causal=True), atol=1e-14)


@pytest.mark.parametrize("symmetric", [False, True])
def test_shifting_all_positions_changes_nothing(symmetric):
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 4, position=ALiBi(4, symmetric=symmetric)).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        base = layer(x)
        shifted = layer(x, positions=torch.arange(7) + 1000)
    assert torch.allclose(base, shifted, atol=1e-12)


def test_key_bias_gives_the_same_causal_attention():
    torch.manual_seed(0)
    scores = torch.randn(4, 10, 10, dtype=torch.float64)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    key_form = (scores + alibi_key_bias(4, 10, dtype=torch.float64)).masked_fill(~mask, -math.inf)
    paper_form = scores + alibi_bias(4, 10, dtype=torch.float64)
    assert torch.allclose(key_form.softmax(-1), paper_form.softmax(-1), atol=1e-15)
    # without the mask the key form is not the symmetric variant
    symmetric = scores + alibi_bias(4, 10, symmetric=True, dtype=torch.float64)
    unmasked = scores + alibi_key_bias(4, 10, dtype=torch.float64)
    assert not torch.allclose(unmasked.softmax(-1), symmetric.softmax(-1), atol=1e-3)


def test_bad_lengths_and_shapes_are_refused():
    with pytest.raises(ValueError, match="q_len"):
        alibi_bias(4, 0)
    with pytest.raises(ValueError, match="exceeds"):
        alibi_bias(4, 5, 3)
    with pytest.raises(TypeError, match="k_len"):
        alibi_bias(4, 3, 4.0)
    with pytest.raises(ValueError, match="k_len"):
        alibi_key_bias(4, 0)
    with pytest.raises(ValueError, match="slopes"):
        alibi_bias(torch.ones(2, 2), 3)
    with pytest.raises(TypeError, match="slopes"):
        alibi_bias(torch.ones(2, dtype=torch.int64), 3)
    with pytest.raises(TypeError, match="q_positions"):
        alibi_bias_from_positions(torch.ones(2), torch.ones(3), torch.arange(3))
    with pytest.raises(ValueError, match="batch sizes"):
        alibi_bias_from_positions(
            torch.ones(2), torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long)
        )
    with pytest.raises(ValueError, match="no key"):
        alibi_bias_from_positions(torch.ones(2), torch.tensor([0, 1]), torch.tensor([1, 2]))
    # "False" is truthy: before the check it gave the symmetric bias
    with pytest.raises(TypeError, match="symmetric must be a bool"):
        alibi_bias(4, 3, symmetric="False")
    with pytest.raises(TypeError, match="symmetric must be a bool"):
        ALiBi(4, symmetric="False")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_slopes_are_refused(bad):
    slopes = torch.tensor([0.5, bad], dtype=torch.float64)
    with pytest.raises(ValueError, match="slopes must be finite"):
        ALiBi(2, slopes=slopes)
    with pytest.raises(ValueError, match="slopes must be finite"):
        ALiBi(2, slopes=[0.5, bad])
    with pytest.raises(ValueError, match="slopes must be finite"):
        alibi_bias(slopes, 3)
    with pytest.raises(ValueError, match="slopes must be finite"):
        alibi_key_bias(slopes, 3)
    with pytest.raises(ValueError, match="slopes must be finite"):
        alibi_bias_from_positions(slopes, torch.arange(3), torch.arange(3))


def test_slopes_given_as_numbers():
    alibi = ALiBi(2, slopes=[0.5, 1])
    assert alibi.slopes.tolist() == [0.5, 1.0]
    assert alibi.slopes.dtype == torch.float64
    with pytest.raises(TypeError, match="sequence of numbers"):
        ALiBi(2, slopes=["0.5", "1"])
    with pytest.raises(TypeError, match="sequence of numbers"):
        ALiBi(2, slopes=[True, 0.5])
    with pytest.raises(TypeError, match="sequence of numbers"):
        ALiBi(2, slopes=0.5)


def test_scheme_refuses_mismatched_heads():
    with pytest.raises(ValueError, match="expected num_heads"):
        ALiBi(4, slopes=torch.ones(3))
    with pytest.raises(ValueError, match="num_heads"):  # refused when the layer is built
        MultiHeadAttention(8, 2, position=ALiBi(4))
    q, positions = torch.zeros(1, 2, 3, 4), torch.arange(3)
    with pytest.raises(ValueError, match="heads"):
        ALiBi(4).score_bias(q, q, positions, positions)


def test_scheme_slopes_follow_the_module_and_are_not_saved():
    layer = MultiHeadAttention(8, 2, position=ALiBi(2))
    assert not any("slopes" in key for key in layer.state_dict())
    assert layer.position.slopes.dtype == torch.float64
    assert "num_heads=2" in repr(layer.position)
