"""Every identity the book states simplifies to zero in sympy; false ones do not."""

from __future__ import annotations

import pytest
import sympy as sp
import torch

from pecode.proofs import (
    Proof,
    Step,
    attention_permutation_equivariance,
    is_zero,
    permutation_matrix,
    residual,
    softmax_rows,
)
from pecode.proofs.attention import explicit_equivariance_residual


def test_attention_is_permutation_equivariant_for_every_n():
    proof = attention_permutation_equivariance()
    assert proof.holds(), proof.failing_steps()
    assert is_zero(proof.residual)
    # n is a symbol: no step writes out a matrix of one size
    assert not any(isinstance(step.lhs, sp.MatrixBase) for step in proof.steps)


def test_the_range_of_sigma_is_what_makes_the_index_steps_hold():
    """Without ``σ(i) < n`` (the step's substitution), ``P 1 = 1`` is not derivable."""
    step = attention_permutation_equivariance().steps[0]
    assert step.holds
    assert not Step(step.text, step.lhs, step.rhs).holds


def test_a_mask_tied_to_positions_breaks_equivariance_where_the_softmax_moves():
    proof = attention_permutation_equivariance(causal=True)
    assert not proof.holds()
    assert proof.failing_steps() == [5, 8]
    # the failure is the mask and nothing else: with every mask entry 1 the residuals vanish
    for number in proof.failing_steps():
        residual = proof.steps[number - 1].residual
        unmasked = residual.replace(
            lambda e: isinstance(e, sp.Indexed) and e.base.label.name == "M", lambda e: 1
        )
        assert sp.simplify(unmasked.doit()) == 0


def test_softmax_commutes_with_a_permutation_numerically():
    """Independent of sympy: torch's softmax, n = 7, a random permutation, float64."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(7, 7, generator=gen, dtype=torch.float64)
    P = torch.eye(7, dtype=torch.float64)[torch.randperm(7, generator=gen)]
    lhs = (P @ scores @ P.T).softmax(-1)
    rhs = P @ scores.softmax(-1) @ P.T
    assert torch.allclose(lhs, rhs, rtol=0, atol=1e-15)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    masked_lhs = (P @ scores @ P.T).masked_fill(~causal, float("-inf")).softmax(-1)
    masked_rhs = P @ scores.masked_fill(~causal, float("-inf")).softmax(-1) @ P.T
    assert not torch.allclose(masked_lhs, masked_rhs)


@pytest.mark.parametrize(("n", "d"), [(1, 1), (2, 2), (3, 1)])
def test_explicit_attention_is_equivariant_for_small_sizes(n, d):
    assert explicit_equivariance_residual(n, d).is_zero_matrix


def test_explicit_causal_counterexample():
    residual = explicit_equivariance_residual(2, 1, causal=True)
    assert residual[:2, :].is_zero_matrix  # the identity permutation
    # the swap's block is nonzero at a concrete point, checked numerically
    point = {
        symbol: sp.Rational(i + 1, 3)
        for i, symbol in enumerate(sorted(residual.free_symbols, key=str))
    }
    values = [complex(entry.subs(point).evalf(30)) for entry in residual[2:, :]]
    assert max(abs(v) for v in values) > 1e-3


def test_causal_with_one_token_is_trivially_equivariant():
    assert explicit_equivariance_residual(1, 1, causal=True).is_zero_matrix


def test_a_false_step_is_caught():
    a, b = sp.symbols("a b")
    true_step = Step("square of a sum", (a + b) ** 2, a**2 + 2 * a * b + b**2)
    false_step = Step("freshman's dream", (a + b) ** 2, a**2 + b**2)
    assert true_step.holds
    assert not false_step.holds
    assert sp.expand(false_step.residual - 2 * a * b) == 0
    proof = Proof("demo", "claim", (true_step, false_step))
    assert not proof.holds()
    assert proof.failing_steps() == [2]
    assert "not zero" in proof._repr_markdown_()


def test_step_assumptions_are_substituted():
    n = sp.Symbol("n", integer=True, positive=True)
    P, A = sp.MatrixSymbol("P", n, n), sp.MatrixSymbol("A", n, n)
    without = Step("needs PᵀP = I", P.T * P * A, A)
    with_assumption = Step("uses PᵀP = I", P.T * P * A, A, subs={P.T * P: sp.Identity(n)})
    assert not without.holds
    assert with_assumption.holds


def test_permutation_matrix_reorders_rows():
    P = permutation_matrix([2, 0, 1])
    X = sp.Matrix([[10], [20], [30]])
    assert sp.Matrix([[30], [10], [20]]) == P * X
    with pytest.raises(ValueError, match="perm"):
        permutation_matrix([0, 0, 1])


def test_softmax_rows_against_a_direct_formula():
    s = sp.Matrix([[0, sp.log(3)], [sp.log(2), sp.log(2)]])
    assert softmax_rows(s) == sp.Matrix(
        [[sp.Rational(1, 4), sp.Rational(3, 4)], [sp.Rational(1, 2), sp.Rational(1, 2)]]
    )
    masked = softmax_rows(s, lambda i, j: j <= i)
    assert masked == sp.Matrix([[1, 0], [sp.Rational(1, 2), sp.Rational(1, 2)]])


def test_residual_of_matrices_is_entrywise():
    x = sp.Symbol("x")
    assert is_zero(residual(sp.Matrix([[sp.sin(x) ** 2 + sp.cos(x) ** 2]]), sp.Matrix([[1]])))
    assert not is_zero(residual(sp.Matrix([[x]]), sp.Matrix([[0]])))


@pytest.mark.parametrize(("n", "d"), [(0, 1), (4, 1), (2, 0), (2, 3)])
def test_sizes_out_of_range_are_refused(n, d):
    with pytest.raises(ValueError, match="must be between"):
        explicit_equivariance_residual(n, d)


def test_non_integer_sizes_are_refused():
    with pytest.raises(TypeError, match="n must be an int"):
        explicit_equivariance_residual(2.0, 1)


def test_steps_say_how_they_hold():
    a, b, s = sp.symbols("a b s", positive=True)
    definition = Step("a name", a * (b / s), (a / s) * b, by_definition=True)
    substituted = Step("at s = 1", a * b / s, a * b, subs={s: 1})
    derived = Step("a square", (a + b) ** 2, a**2 + 2 * a * b + b**2)
    assert definition.is_restatement
    assert not substituted.is_restatement
    assert substituted.by_substitution
    assert not derived.by_substitution
    shown = Proof("demo", "claim", (definition, substituted, derived))._repr_markdown_()
    assert "(by definition)" in shown
    assert "(by substitution, residual $0$ ✓)" in shown
    assert shown.count("✓") == 2
    assert Proof("demo", "claim", (definition, substituted, derived)).derived_steps() == [2, 3]
