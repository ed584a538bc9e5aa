"""The ALiBi proofs hold where the book says they do, fail where it says they fail, and
agree with pecode.alibi's biases."""

from __future__ import annotations

import pytest
import sympy as sp
import torch

from pecode.alibi import alibi_bias
from pecode.proofs.alibi import (
    alibi_causal_row_shift,
    alibi_key_bias_equivalence,
    alibi_symmetric_is_not_key_bias,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_causal_alibi_is_a_key_position_bias(n):
    proof = alibi_causal_row_shift(n)
    assert proof.holds(), proof.failing_steps()


def test_the_row_shift_with_the_wrong_sign_fails():
    proof = alibi_causal_row_shift(2, key_sign=-1)
    assert proof.failing_steps() == [1, 3, 4]
    # step 1's residual is exactly the sign error, 2 m j
    residual = proof.steps[0].residual
    m = next(s for s in residual.free_symbols if s.name == "m")
    j = next(s for s in residual.free_symbols if s.name == "j")
    assert sp.simplify(residual - 2 * m * j) == 0


def test_symmetric_alibi_is_not_a_key_position_bias():
    proof = alibi_symmetric_is_not_key_bias()
    assert proof.holds(), proof.failing_steps()


def test_the_linear_bias_without_a_mask_is_a_key_bias_so_its_neighbour_fails():
    proof = alibi_symmetric_is_not_key_bias(bias="linear")
    assert proof.failing_steps() == [4, 5]
    assert proof.steps[4].residual == -1  # sign(0) - 1: the mixed difference is 0


def _mixed(bias, rows, keys):
    (i, i2), (j, k) = rows, keys
    return bias[i, j] - bias[i, k] - bias[i2, j] + bias[i2, k]


@pytest.mark.parametrize(("j", "t"), [(0, 1), (1, 3), (2, 5)])
def test_the_mixed_difference_of_the_implemented_biases(j, t):
    """Step 4's value, 2 m t, for pecode's symmetric bias; 0 for the linear one (step 3)."""
    slopes = torch.tensor([0.25, 0.5], dtype=torch.float64)
    symmetric = alibi_bias(slopes, 10, symmetric=True, dtype=torch.float64)
    causal = alibi_bias(slopes, 10, dtype=torch.float64)
    for h, m in enumerate(slopes.tolist()):
        assert float(_mixed(symmetric[h], (j, j + t), (j, j + t))) == pytest.approx(2 * m * t)
        # the linear bias on the visible keys (j, k <= both rows): mixed difference 0
        assert float(_mixed(causal[h], (j + t, j + t + 1), (j, j + t))) == pytest.approx(0)


@pytest.mark.parametrize(
    ("variant", "holds"), [("causal", True), ("unmasked", True), ("symmetric", False)]
)
def test_which_variants_equal_the_key_bias(variant, holds):
    assert alibi_key_bias_equivalence(3, variant).holds is holds


def test_symmetric_counterexample_is_nonzero_at_equal_scores():
    """With all scores 0 and m = 1, row 0 of the difference is exactly computable and nonzero."""
    step = alibi_key_bias_equivalence(3, "symmetric")
    zero_scores = {symbol: 0 for symbol in step.residual.free_symbols if symbol.name != "m"}
    m = next(symbol for symbol in step.residual.free_symbols if symbol.name == "m")
    row = sp.simplify(step.residual.subs(zero_scores).subs(m, 1)[0, :])
    # query 0: symmetric weights are e^0, e^-1, e^-2; key-bias weights e^0, e^1, e^2
    expected_first = 1 / (1 + sp.exp(-1) + sp.exp(-2)) - 1 / (1 + sp.E + sp.exp(2))
    assert sp.simplify(row[0] - expected_first) == 0
    assert float(row[0]) > 0.4


def test_a_wrong_sign_is_caught():
    """Negative control: against the key bias with the wrong sign, -m j, the check fails."""
    assert not alibi_key_bias_equivalence(3, "causal", key_sign=-1).holds


@pytest.mark.parametrize("bad", [0, 5])
def test_sizes_are_checked(bad):
    with pytest.raises(ValueError, match="n must be"):
        alibi_causal_row_shift(bad)
    with pytest.raises(ValueError, match="variant"):
        alibi_key_bias_equivalence(3, "bidirectional")


def test_options_are_checked():
    with pytest.raises(ValueError, match="key_sign"):
        alibi_causal_row_shift(2, key_sign=2)
    with pytest.raises(ValueError, match="bias"):
        alibi_symmetric_is_not_key_bias(bias="quadratic")
