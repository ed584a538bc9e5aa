"""The sinusoidal identities hold in sympy, false variants do not, and numbers agree."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

from pecode.absolute import sinusoidal_encoding, sinusoidal_frequencies, sinusoidal_table
from pecode.proofs.sinusoidal import (
    BASE,
    I_,
    POS,
    D,
    K,
    frequency_exp_log_form,
    sinusoidal_dot_product,
    sinusoidal_shift_is_rotation,
    sinusoidal_shift_matrix,
)


def test_exp_log_form():
    proof = frequency_exp_log_form()
    assert proof.holds(), proof.failing_steps()
    assert proof.steps[0].by_definition  # 1/b^x and b^-x are one sympy object


@pytest.mark.parametrize("dim", [4, 512])
def test_the_listing_step_is_the_frequencies_pecode_computes(dim):
    # step 3's left side, the exp/log listing, at b = 10000 against the float64 power
    listing = frequency_exp_log_form().steps[2].lhs.subs({BASE: 10000, D: dim})
    values = [float(listing.subs(I_, i)) for i in range(dim // 2)]
    assert torch.allclose(torch.tensor(values, dtype=torch.float64), sinusoidal_frequencies(dim))


def test_the_exponent_off_by_one_fails_at_the_listing_step():
    proof = frequency_exp_log_form(column_offset=1)
    assert proof.failing_steps() == [3]
    # the residual is the odd column's frequency minus the even one's: b^{-1/d} too small
    ratio = sp.simplify(proof.steps[2].lhs / proof.steps[2].rhs)
    assert sp.simplify(ratio - BASE ** (-1 / D)) == 0


@pytest.mark.parametrize("dim", [2, 4, 6])
def test_shift_is_rotation(dim):
    proof = sinusoidal_shift_is_rotation(dim)
    assert proof.holds(), proof.failing_steps()


@pytest.mark.parametrize("dim", [2, 4, 6])
def test_dot_product_depends_on_offset_only(dim):
    proof = sinusoidal_dot_product(dim)
    assert proof.holds(), proof.failing_steps()


@pytest.mark.parametrize("dim", [2, 4, 6])
@pytest.mark.parametrize(("cos_offset", "depends_on_pos"), [(0, False), (1, True)])
def test_the_explicit_dot_product_loses_pos_only_for_the_right_table(
    dim, cos_offset, depends_on_pos
):
    # Independent of the proof's own right-hand side (which has no pos by construction):
    # the derivative in pos of the explicit left-hand side, evaluated at a few points,
    # vanishes for the right table and not for source 003's (cos_offset=1).
    lhs = sinusoidal_dot_product(dim, cos_offset=cos_offset).steps[2].lhs
    derivative = sp.diff(lhs, POS)
    points = [{POS: 3.7, K: 1.3}, {POS: 11.0, K: -2.9}]
    values = [abs(float(derivative.subs({**point, BASE: 10000, D: dim}))) for point in points]
    assert (max(values) > 1e-6) is depends_on_pos, values


def test_the_transposed_block_is_a_rotation_but_the_wrong_one():
    # the usual (cos, sin) convention, -sin in the upper right: still orthogonal with
    # determinant 1 and composing (steps 4 to 6 hold), but it turns the (sin, cos) plane
    # the wrong way, so PE(pos + k) = M_k PE(pos) fails, per pair and for the whole vector
    proof = sinusoidal_shift_is_rotation(sine_sign=-1)
    assert proof.failing_steps() == [1, 2]
    assert all(proof.steps[n].holds for n in (3, 4, 5))


def test_source_003_table_has_a_dot_product_that_depends_on_pos():
    # source 003 gives the cosine of pair i the next column's frequency b^{-(2i+1)/d}
    proof = sinusoidal_dot_product(cos_offset=1)
    assert proof.failing_steps() == [1, 2, 3, 4]
    assert POS in proof.steps[0].residual.free_symbols
    assert POS in proof.steps[2].residual.free_symbols


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
