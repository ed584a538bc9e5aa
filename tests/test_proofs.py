"""Every identity the book states simplifies to zero in sympy; false ones do not."""

from __future__ import annotations

import pytest
import sympy as sp

from pecode.proofs import (
    Proof,
    Step,
    attention_permutation_equivariance,
    is_zero,
    permutation_matrix,
    residual,
    softmax_rows,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("d", [1, 2])
def test_attention_is_permutation_equivariant(n, d):
    proof = attention_permutation_equivariance(n, d)
    assert proof.holds(), proof.failing_steps()
    assert is_zero(proof.residual)


def test_causal_mask_breaks_equivariance_at_the_softmax_step():
    proof = attention_permutation_equivariance(2, 1, causal=True)
    assert not proof.holds()
    assert proof.failing_steps() == [4, 6]
    # the counterexample is real: it is nonzero at a concrete point, checked numerically
    point = {
        symbol: sp.Rational(i + 1, 3)
        for i, symbol in enumerate(sorted(proof.residual.free_symbols, key=str))
    }
    values = [complex(entry.subs(point).evalf(30)) for entry in proof.residual]
    assert max(abs(v) for v in values) > 1e-3


def test_causal_with_one_token_is_trivially_equivariant():
    assert attention_permutation_equivariance(1, 1, causal=True).holds()


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


@pytest.mark.parametrize(("n", "d"), [(0, 1), (5, 1), (2, 0), (2, 4)])
def test_sizes_out_of_range_are_refused(n, d):
    with pytest.raises(ValueError, match="must be between"):
        attention_permutation_equivariance(n, d)


def test_non_integer_sizes_are_refused():
    with pytest.raises(TypeError, match="n must be an int"):
        attention_permutation_equivariance(2.0, 1)
