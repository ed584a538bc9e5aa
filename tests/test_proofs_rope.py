"""Every RoPE identity chapter 8 states simplifies to zero in sympy; the wrong ones do not."""

from __future__ import annotations

import pytest
import sympy as sp

from pecode.proofs import rope as proofs


@pytest.mark.parametrize(
    "build",
    [
        proofs.complex_solution_2d,
        proofs.relative_identity_block,
        lambda: proofs.relative_identity(2),
        lambda: proofs.norm_preserved(3),
        lambda: proofs.forms_agree(3),
        lambda: proofs.layout_permutation_proof(4),
        lambda: proofs.abel_summation(5),
        lambda: proofs.relative_shift("n-m", 2),
        lambda: proofs.source000_rotate_half_derivation(False),
    ],
)
def test_proof_holds(build):
    proof = build()
    assert proof.holds(), proof.failing_steps()
    assert "Holds" in proof._repr_markdown_()


def test_source002_sign_fails():
    proof = proofs.relative_shift("m-n", 1)
    assert not proof.holds()
    # at m = n the two signs agree, so the residual vanishes there and only there
    assert sp.simplify(proof.residual.subs(proofs.n, proofs.m)) == 0


def test_source000_scalar_formula_fails_with_distinct_frequencies():
    proof = proofs.source000_rotate_half_derivation(True)
    assert proof.failing_steps() == [3]
    t1, t2 = sp.symbols("theta_1 theta_2", positive=True)
    # with one frequency after all, the article's formula holds again
    assert sp.simplify(proof.steps[2].residual.subs(t2, t1)) == 0


def test_rope_matrix_layouts_and_errors():
    t = sp.symbols("t_1:3", positive=True)
    inter, half = proofs.rope_matrix(proofs.m, t), proofs.rope_matrix(proofs.m, t, "half")
    assert inter[1, 0] == sp.sin(proofs.m * t[0])
    assert half[2, 0] == sp.sin(proofs.m * t[0])
    assert inter[2, 0] == 0
    with pytest.raises(ValueError, match="layout"):
        proofs.rope_matrix(proofs.m, t, "other")
    with pytest.raises(ValueError, match="thetas"):
        proofs.rope_matrix(proofs.m, [])


@pytest.mark.parametrize("bad", [0, 6, 2.0, True])
def test_num_pairs_checked(bad):
    with pytest.raises((TypeError, ValueError), match="num_pairs"):
        proofs.norm_preserved(bad)


def test_relative_shift_sign_checked():
    with pytest.raises(ValueError, match="sign"):
        proofs.relative_shift("m+n")
