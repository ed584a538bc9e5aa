"""The sinusoidal identities hold in sympy, false variants do not, and numbers agree."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

from pecode.absolute import sinusoidal_encoding, sinusoidal_table
from pecode.proofs.core import Step
from pecode.proofs.sinusoidal import (
    BASE,
    POS,
    K,
    _TrigStep,
    frequency_exp_log_form,
    sinusoidal_dot_product,
    sinusoidal_pair,
    sinusoidal_shift_is_rotation,
    sinusoidal_shift_matrix,
)


def test_exp_log_form():
    proof = frequency_exp_log_form()
    assert proof.holds(), proof.failing_steps()


def test_a_wrong_exp_log_form_fails():
    i, d = sp.symbols("i d", positive=True)
    # the log must multiply 2i/d, not i/d
    assert not Step("wrong", BASE ** (-2 * i / d), sp.exp(-(i / d) * sp.log(BASE))).holds


@pytest.mark.parametrize("dim", [2, 4, 6])
def test_shift_is_rotation(dim):
    proof = sinusoidal_shift_is_rotation(dim)
    assert proof.holds(), proof.failing_steps()


@pytest.mark.parametrize("dim", [2, 4, 6])
def test_dot_product_depends_on_offset_only(dim):
    proof = sinusoidal_dot_product(dim)
    assert proof.holds(), proof.failing_steps()
    assert POS not in proof.steps[2].rhs.free_symbols


def test_the_transposed_rotation_is_caught():
    omega = sp.Symbol("w", positive=True)
    M = sinusoidal_shift_matrix(K, 2, BASE)
    wrong = _TrigStep(
        "wrong direction",
        M.T * sinusoidal_pair(POS, omega),
        sinusoidal_pair(POS + K, omega),
    )
    assert not wrong.holds


def test_sine_and_cosine_of_different_frequencies_are_caught():
    # the pairing of column 2i+1 with the frequency of column 2i is what makes it work
    w1, w2 = sp.symbols("w1 w2", positive=True)
    a = sp.Matrix([sp.sin(POS * w1), sp.cos(POS * w2)])
    b = sp.Matrix([sp.sin((POS + K) * w1), sp.cos((POS + K) * w2)])
    step = _TrigStep("mismatched", (a.T * b)[0], (sp.cos(K * w1) + sp.cos(K * w2)) / 2)
    assert not step.holds
    assert POS in step.residual.free_symbols


def test_bad_dims_are_refused():
    for dim in (3, 0, 10, 2.0):
        with pytest.raises(ValueError, match="dim"):
            sinusoidal_shift_is_rotation(dim)
        with pytest.raises(ValueError, match="dim"):
            sinusoidal_dot_product(dim)
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_shift_matrix(K, 5)


def test_shift_matrix_numerically_on_the_fast_table():
    # the proven M_k, evaluated, maps rows of pecode's table onto rows k further on
    dim, k = 8, 37
    M = sinusoidal_shift_matrix(sp.Integer(k), dim, sp.Integer(10000))
    M = torch.tensor([[float(e) for e in row] for row in M.tolist()], dtype=torch.float64)
    table = sinusoidal_table(200, dim, dtype=torch.float64)
    assert torch.allclose(table[:-k] @ M.T, table[k:], atol=1e-12)


def test_dot_product_numerically_on_the_fast_table():
    dim = 64
    positions = torch.tensor([0, 17, 4000, 99_999])
    for k in (1, 5, 300):
        dots = (
            sinusoidal_encoding(positions, dim, dtype=torch.float64)
            * sinusoidal_encoding(positions + k, dim, dtype=torch.float64)
        ).sum(-1)
        expected = sum(math.cos(k * 10000 ** (-2 * i / dim)) for i in range(dim // 2))
        assert torch.allclose(dots, torch.full_like(dots, expected), atol=1e-9)
