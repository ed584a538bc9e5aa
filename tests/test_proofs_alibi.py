"""The ALiBi proofs hold where the book says they do, and fail where it says they fail."""

from __future__ import annotations

import pytest
import sympy as sp

from pecode.proofs.alibi import (
    alibi_causal_row_shift,
    alibi_key_bias_equivalence,
    alibi_symmetric_is_not_key_bias,
)
from pecode.proofs.attention import softmax_rows
from pecode.proofs.core import Step


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_causal_alibi_is_a_key_position_bias(n):
    proof = alibi_causal_row_shift(n)
    assert proof.holds(), proof.failing_steps()


def test_symmetric_alibi_is_not_a_key_position_bias():
    proof = alibi_symmetric_is_not_key_bias()
    assert proof.holds(), proof.failing_steps()


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
    m = sp.Symbol("m", positive=True)
    scores = sp.Matrix(3, 3, lambda i, j: sp.Symbol(f"s_{i}{j}", real=True))
    causal = lambda i, j: j <= i  # noqa: E731
    alibi = softmax_rows(scores + sp.Matrix(3, 3, lambda i, j: -m * (i - j)), causal)
    wrong = softmax_rows(scores + sp.Matrix(3, 3, lambda i, j: -m * j), causal)
    assert not Step("wrong sign", alibi, wrong).holds


@pytest.mark.parametrize("bad", [0, 5])
def test_sizes_are_checked(bad):
    with pytest.raises(ValueError, match="n must be"):
        alibi_causal_row_shift(bad)
    with pytest.raises(ValueError, match="variant"):
        alibi_key_bias_equivalence(3, "bidirectional")
