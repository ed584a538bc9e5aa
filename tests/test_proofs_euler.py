"""Chapter 7's proofs hold; the same machinery rejects nearby false claims."""

from __future__ import annotations

import cmath
import random

import pytest
import sympy as sp

from pecode.proofs import is_zero, residual
from pecode.proofs.euler import (
    angle_addition,
    cis,
    euler_formula,
    multiplication_by_i,
    relative_phase,
    rotation_matrix,
    rotation_preserves_length,
)


@pytest.mark.parametrize(
    "make",
    [multiplication_by_i, angle_addition, rotation_preserves_length, relative_phase],
)
def test_proof_holds(make):
    proof = make()
    assert proof.holds(), proof.failing_steps()
    assert "Holds" in proof._repr_markdown_()


@pytest.mark.parametrize("order", [0, 1, 4, 9])
def test_euler_formula_holds_for_each_order(order):
    proof = euler_formula(order)
    assert proof.holds(), proof.failing_steps()
    assert "\\sum_{n=0}^{" + str(order) + "}" in proof.steps[4].to_latex()


def test_wrong_signs_in_the_series_are_caught():
    theta = sp.Symbol("theta", real=True)
    # all-plus cosine series (the pattern "1 - x^2/2! + x^4/4! + ..." read literally)
    wrong_cos = 1 - theta**2 / 2 + theta**4 / 24 + theta**6 / 720
    right = sp.series(sp.cos(theta), theta, 0, 7).removeO()
    assert not is_zero(residual(wrong_cos, right))
    k = sp.Symbol("k", integer=True, nonnegative=True)
    # i^(2k+1) is not (-1)^k: the factor i matters
    assert not is_zero(residual(sp.expand(sp.I ** (2 * k + 1), power_exp=True), (-1) ** k))


def test_false_neighbours_of_the_claims_fail():
    alpha, beta, m, n, theta = sp.symbols("alpha beta m n theta", real=True)
    assert not is_zero(residual(sp.expand(cis(alpha) * cis(beta)), cis(alpha - beta)))
    # multiplying by i turns counterclockwise: the clockwise matrix is not it
    assert not is_zero(residual(sp.Matrix([[0, -1], [1, 0]]), rotation_matrix(-sp.pi / 2)))
    # without the conjugate the angles add, so the score depends on m + n, not m - n
    q0, q1, k0, k1 = sp.symbols("q0 q1 k0 k1", real=True)
    q, k = q0 + sp.I * q1, k0 + sp.I * k1
    no_conj = sp.re(sp.expand(q * cis(m * theta) * k * cis(n * theta)))
    shifted = no_conj.subs({m: m + 1, n: n + 1}, simultaneous=True)
    assert not is_zero(residual(shifted, no_conj))


def test_relative_phase_numerically_with_python_complex():
    rng = random.Random(0)
    for _ in range(50):
        q = complex(rng.gauss(0, 1), rng.gauss(0, 1))
        k = complex(rng.gauss(0, 1), rng.gauss(0, 1))
        m, n, shift = rng.randint(0, 500), rng.randint(0, 500), rng.randint(-100, 100)
        theta = rng.uniform(0, 3)
        turned_q = q * cmath.exp(1j * m * theta)
        turned_k = k * cmath.exp(1j * n * theta)
        dot = turned_q.real * turned_k.real + turned_q.imag * turned_k.imag
        relative = (q * k.conjugate() * cmath.exp(1j * (m - n) * theta)).real
        moved = (
            q
            * cmath.exp(1j * (m + shift) * theta)
            * (k * cmath.exp(1j * (n + shift) * theta)).conjugate()
        ).real
        assert abs(dot - relative) < 1e-9
        assert abs(moved - relative) < 1e-9


@pytest.mark.parametrize("order", [-1, 41])
def test_order_out_of_range_is_refused(order):
    with pytest.raises(ValueError, match="order"):
        euler_formula(order)


def test_non_integer_order_is_refused():
    with pytest.raises(TypeError, match="order"):
        euler_formula(3.0)
    with pytest.raises(TypeError, match="order"):
        euler_formula(True)
