"""Partial sums of exp(iθ) against sympy's exact Taylor polynomials and the remainder bound."""

from __future__ import annotations

import cmath
import math

import pytest
import sympy as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

from pecode.complex_plane import exp_partial_sums, exp_remainder_bound


@pytest.mark.parametrize("order", [0, 1, 5, 12])
def test_partial_sums_match_exact_sympy_polynomials(order):
    theta = torch.tensor([-2.5, -0.75, 0.0, 1.0, 3.0], dtype=torch.float64)
    sums = exp_partial_sums(theta, order)
    assert sums.shape == (order + 1, 5)
    assert sums.dtype == torch.complex128
    x = sp.Symbol("x")
    for degree in range(order + 1):
        polynomial = sum((sp.I * x) ** n / sp.factorial(n) for n in range(degree + 1))
        for index, value in enumerate(theta.tolist()):
            exact = complex(polynomial.subs(x, sp.Rational(value)).evalf(30))
            assert abs(complex(sums[degree, index]) - exact) < 1e-12


def test_long_partial_sums_converge_to_cmath_exp():
    theta = torch.linspace(-2 * math.pi, 2 * math.pi, 41, dtype=torch.float64)
    last = exp_partial_sums(theta, 60)[-1]
    for value, angle in zip(last.tolist(), theta.tolist(), strict=True):
        assert abs(value - cmath.exp(1j * angle)) < 1e-12


def test_euler_identity_at_pi():
    sums = exp_partial_sums(torch.tensor(math.pi, dtype=torch.float64), 30)
    assert abs(complex(sums[-1]) + 1) < 1e-14
    assert sums.shape == (31,)


@given(
    theta=st.floats(min_value=-12.0, max_value=12.0, allow_nan=False),
    order=st.integers(min_value=0, max_value=40),
)
def test_error_never_exceeds_the_remainder_bound(theta, order):
    angle = torch.tensor(theta, dtype=torch.float64)
    error = abs(complex(exp_partial_sums(angle, order)[-1]) - cmath.exp(1j * theta))
    bound = float(exp_remainder_bound(angle, order))
    # float64 rounding of the partial sum scales with its largest term, at most e^|θ|
    rounding = 1e-14 * math.exp(abs(theta))
    assert error <= bound * (1 + 1e-9) + rounding


def test_remainder_bound_against_factorial_formula():
    theta = torch.tensor([0.0, 0.5, -3.0, 7.0], dtype=torch.float64)
    for order in (0, 3, 10, 25):
        expected = [abs(t) ** (order + 1) / math.factorial(order + 1) for t in theta.tolist()]
        got = exp_remainder_bound(theta, order).tolist()
        assert got == pytest.approx(expected, rel=1e-12, abs=0.0)


def test_float32_input_is_summed_in_float64():
    theta = torch.tensor([1.0], dtype=torch.float32)
    assert exp_partial_sums(theta, 3).dtype == torch.complex128
    assert exp_remainder_bound(theta, 3).dtype == torch.float64


@pytest.mark.parametrize("function", [exp_partial_sums, exp_remainder_bound])
def test_bad_input_is_refused(function):
    with pytest.raises(TypeError, match="theta"):
        function([0.5], 3)
    with pytest.raises(TypeError, match="theta"):
        function(torch.tensor([1, 2]), 3)
    with pytest.raises(TypeError, match="order"):
        function(torch.tensor([0.5]), 3.0)
    with pytest.raises(ValueError, match="order"):
        function(torch.tensor([0.5]), -1)
