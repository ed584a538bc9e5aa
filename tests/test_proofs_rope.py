"""The RoPE proofs of chapter 8 state what they claim: their symbolic-size statements agree
with explicit matrices and with ``pecode.rope`` at concrete sizes, and the false neighbours
fail for real (a nonzero number), not only because sympy could not simplify them.

Every proof holding, its steps able to fail and its neighbour failing at the named steps
are checked for all proof modules in ``tests/test_proofs_catalogue.py``.
"""

from __future__ import annotations

import cmath
import random

import numpy as np
import pytest
import sympy as sp
import torch

from pecode.proofs import rope as proofs
from pecode.rope import (
    apply_rope,
    apply_rope_rotate_half,
    layout_permutation,
    rope_cos_sin,
    rope_rotation_matrix,
    rotate_half,
)

N = proofs.pairs


def _concrete(expr, size: int, values: dict) -> complex:
    """``expr`` with ``N = size``, every symbolic sum expanded, then ``values`` substituted."""
    return complex(sp.N(expr.subs(N, size).doit().subs(values)))


def _random_values(*symbols) -> dict:
    rng = random.Random(0)
    return {s: sp.Float(rng.uniform(-2, 2)) for s in symbols}


def _rope_matrix_numeric(position: float, inv_freq: torch.Tensor) -> np.ndarray:
    """``R^d_{Θ,position}`` from ``pecode.rope`` (interleaved), in float64."""
    return rope_rotation_matrix(torch.tensor([position], dtype=torch.float64), inv_freq)[0].numpy()


@pytest.mark.parametrize(
    ("proof", "second"), [(proofs.relative_identity, 3.0), (proofs.norm_preserved, None)]
)
def test_block_step_matches_pecode_rope_matrices(proof, second):
    # step 1 (block (i, l) of R_m^T R_n, or R_m^T R_m) at N = 3 against the 6x6 product of
    # pecode.rope's matrices in float64; both sides of the step, every block
    step = proof().steps[0]
    inv_freq = torch.tensor([1.0, 0.3, 0.05], dtype=torch.float64)
    pos_m = 7.0
    pos_n = pos_m if second is None else second
    product = _rope_matrix_numeric(pos_m, inv_freq).T @ _rope_matrix_numeric(pos_n, inv_freq)
    values = {proofs.m: pos_m, proofs.n: pos_n}
    values.update({proofs._th[j + 1]: float(inv_freq[j]) for j in range(3)})
    for row in range(1, 4):
        for col in range(1, 4):
            want = product[2 * row - 2 : 2 * row, 2 * col - 2 : 2 * col]
            for side in (step.lhs, step.rhs):
                block = side.subs({proofs._i: row, proofs._l: col, N: 3}).doit().subs(values)
                np.testing.assert_allclose(np.array(block, dtype=float), want, atol=1e-12)


def test_forgotten_transpose_fails_for_real():
    proof = proofs.relative_identity(transpose=False)
    product = proof.steps[0]
    # R_m R_n is the rotation by (m + n) theta_i, not (n - m) theta_i: off by 2 m theta_i
    block = product.lhs.subs({proofs._i: 2, proofs._l: 2, N: 3}).doit()
    values = {proofs.m: 1.3, proofs.n: -0.4, proofs._th[2]: 0.7}
    got = np.array(block.subs(values), dtype=float)
    rotation = proofs.block_rotation((1.3 - 0.4) * 0.7)
    np.testing.assert_allclose(got, np.array(rotation, dtype=float), atol=1e-12)
    assert (
        abs(float(sp.N(product.residual[0, 1].subs({proofs._i: 2, proofs._l: 2}).subs(values))))
        > 1e-3
    )
    # the score holds the transpose, so the forgotten identity cannot be substituted into it
    assert not proof.steps[1].holds


def test_relative_identity_equals_rope_scores_at_a_concrete_width():
    # the last step's sum of g_i at d = 6, against pecode.rope in float64
    step = proofs.relative_identity().steps[-1]
    q = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    k = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    inv_freq = torch.tensor([1.0, 0.3, 0.05], dtype=torch.float64)
    pos_m, pos_n = 7, 3
    values = {proofs.m: pos_m, proofs.n: pos_n}
    values.update({proofs._q[j + 1]: float(q[j]) for j in range(6)})
    values.update({proofs._k[j + 1]: float(k[j]) for j in range(6)})
    values.update({proofs._th[j + 1]: float(inv_freq[j]) for j in range(3)})

    def rotated(vec, pos):
        cos, sin = rope_cos_sin(torch.tensor([pos]), inv_freq)
        return apply_rope(vec[None], cos, sin, "interleaved")[0]

    want = float(rotated(q, pos_m) @ rotated(k, pos_n))
    for side in (step.lhs, step.rhs):
        assert _concrete(side, 3, values).real == pytest.approx(want, abs=1e-12)


def test_relative_shift_article_sign_fails_for_real_and_only_off_the_diagonal():
    step = proofs.relative_shift("m-n").steps[0]
    assert not step.holds
    # at m = n the two signs agree
    assert sp.simplify(step.residual.subs(proofs.n, proofs.m)) == sp.zeros(2, 2)
    # off the diagonal of blocks (l != i) both sides are zero; on it they differ
    assert step.residual.subs(proofs._l, proofs._i + 1) == sp.zeros(2, 2)
    values = _random_values(proofs.m, proofs.n)
    values[proofs._th[proofs._i]] = 0.7
    on_diagonal = step.residual[0, 1].subs(proofs._l, proofs._i).subs(values)
    assert abs(complex(sp.N(on_diagonal))) > 1e-3


def test_forms_agree_steps_match_pecode_rope():
    # the element-wise formula the proof uses, for pair 2 of d = 6, against apply_rope
    proof = proofs.forms_agree()
    x = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    inv_freq = torch.tensor([1.0, 0.4, 0.1], dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.tensor([5]), inv_freq)
    want = apply_rope(x[None], cos, sin, "interleaved")[0][2:4]
    values = {proofs.m: 5, proofs._th[2]: 0.4}
    values.update({proofs._x[j + 1]: float(x[j]) for j in range(6)})
    got = proof.steps[0].rhs.subs(proofs._i, 2).subs(values)
    np.testing.assert_allclose(np.array(got, dtype=float).ravel(), want.numpy(), atol=1e-12)


def test_norm_scaled_blocks_fail_for_real():
    step = proofs.norm_preserved(scale=2).steps[0]
    assert not step.holds
    # (2R)^T (2R) = 4 I on the diagonal blocks: 3 I too much
    assert step.residual == 3 * sp.KroneckerDelta(proofs._i, proofs._l) * sp.eye(2)


def test_layout_proof_uses_pecode_permutation():
    for half in range(1, 6):
        assert proofs._layout_order(half) == layout_permutation(2 * half).tolist()
        assert proofs._layout_order(half, mistake=True) != layout_permutation(2 * half).tolist()


def test_layout_mistake_turns_the_rotation_the_other_way():
    step = proofs.layout_permutation_proof(1, mistake=True).steps[1]
    assert not step.holds
    # with the slots swapped, P R_half P^T is the interleaved rotation by -m
    turned_back = step.lhs.subs(step.subs) - step.rhs.subs(proofs.m, -proofs.m)
    assert sp.simplify(turned_back) == sp.zeros(2, 1)


def test_summation_by_parts_and_the_decay_bound_at_concrete_sizes():
    proof = proofs.abel_summation()
    mutant = proofs.abel_summation(boundary_offset=1)
    rng = np.random.default_rng(4)
    for size in (1, 2, 5, 64):
        h = rng.normal(size=size + 1) + 1j * rng.normal(size=size + 1)
        s = np.concatenate(([0], np.cumsum(np.exp(1j * rng.uniform(0, 6, size=size)))))
        hs, ss = sp.IndexedBase("h"), sp.IndexedBase("S")
        values = {hs[i]: complex(h[i]) for i in range(size + 1)}
        values.update({ss[i]: complex(s[i]) for i in range(size + 1)})
        if size <= 5:
            for built, sign in ((proof, 0), (mutant, 1)):
                step = built.steps[2]
                lhs, rhs = (_concrete(side, size, values) for side in (step.lhs, step.rhs))
                # the identity holds; the off-by-one boundary misses by h_N S_N - h_{N-1} S_N
                miss = abs(s[size] * (h[size] - h[size - 1]))
                assert abs(lhs - rhs) == pytest.approx(sign * miss, abs=1e-9)
        # the bound, proven by hand from the identity, with h_N = 0 and S_0 = 0
        h[size] = 0
        score = np.sum(h[:size] * (s[1:] - s[:-1]))
        bound = np.max(np.abs(h[1:] - h[:-1])) * np.sum(np.abs(s[1:]))
        assert abs(score) <= bound + 1e-12


def test_source000_scalar_formula_fails_for_real_with_distinct_frequencies():
    step = proofs.source000_rotate_half_derivation(True).steps[2]
    t = proofs._th
    values = _random_values(proofs.m, proofs.n)
    values.update({proofs._q[j]: 0.3 * j - 0.5 for j in range(1, 5)})
    values.update({proofs._k[j]: 0.7 - 0.2 * j for j in range(1, 5)})
    distinct = {**values, t[1]: 1.0, t[2]: 0.1}
    same = {**values, t[1]: 1.0, t[2]: 1.0}
    difference = step.lhs - step.rhs
    assert abs(_concrete(difference, 2, distinct)) > 1e-3
    # with one frequency after all, the article's formula holds again
    assert abs(_concrete(difference, 2, same)) < 1e-12


def _rotate_2d(vec: tuple[float, float], position: float, freq: float) -> torch.Tensor:
    """One pair rotated by ``pecode.rope.apply_rope`` (interleaved), float64."""
    cos, sin = rope_cos_sin(
        torch.tensor([position], dtype=torch.float64), torch.tensor([freq], dtype=torch.float64)
    )
    pair = torch.tensor([vec], dtype=torch.float64)
    return apply_rope(pair, cos.double(), sin.double(), "interleaved")[0]


def _at(expr, subs, values) -> complex:
    return complex(sp.N(expr.subs(dict(subs or {})).subs(values)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_complex_solution_2d_against_complex_arithmetic_and_apply_rope(seed):
    # every step's two sides at random real points, against Python's complex numbers
    # (cmath.exp) and pecode's apply_rope; the flipped sine misses both at step 2 and 4
    rng = random.Random(seed)
    q1, q2, k1, k2, pos_m, pos_n = (rng.uniform(-2, 2) for _ in range(6))
    freq = rng.uniform(0.1, 1.5)
    values = {proofs.q1: q1, proofs.q2: q2, proofs.k1: k1, proofs.k2: k2}
    values |= {proofs.m: pos_m, proofs.n: pos_n, proofs.theta: freq}
    zq, zk = complex(q1, q2), complex(k1, k2)
    # step 3 is about the complex numbers themselves
    values |= {sp.Symbol("z_q"): sp.sympify(zq), sp.Symbol("z_k"): sp.sympify(zk)}
    turned = zq * cmath.exp(1j * pos_m * freq)
    score = (turned * (zk * cmath.exp(1j * pos_n * freq)).conjugate()).real
    rotated = _rotate_2d((q1, q2), pos_m, freq)
    assert score == pytest.approx(float(rotated @ _rotate_2d((k1, k2), pos_n, freq)), abs=1e-12)
    wants = (
        [(zq * zk.conjugate()).real],
        [turned.real, turned.imag],
        [zq * zk.conjugate() * cmath.exp(1j * (pos_m - pos_n) * freq)],
        [score],
    )
    proof, mutant = proofs.complex_solution_2d(), proofs.complex_solution_2d(sine=-1)
    for number, (step, wrong, want) in enumerate(
        zip(proof.steps, mutant.steps, wants, strict=True), start=1
    ):
        for side in (step.lhs, step.rhs):
            got = [_at(entry, step.subs, values) for entry in sp.Matrix([side])]
            np.testing.assert_allclose(got, want, atol=1e-12)
        if number in (2, 4):
            # the side that holds the rotation matrices is off
            rotated_side = wrong.rhs if number == 2 else wrong.lhs
            got = [_at(entry, wrong.subs, values) for entry in sp.Matrix([rotated_side])]
            assert np.max(np.abs(np.array(got) - np.array(want))) > 1e-6
    np.testing.assert_allclose(
        [_at(e, None, values) for e in proof.steps[1].rhs], rotated.numpy(), atol=1e-12
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_relative_identity_block_against_apply_rope(seed):
    # the 2x2 identities and the score of one block at random points, against pecode
    rng = random.Random(seed)
    q1, q2, k1, k2, pos_m, pos_n = (rng.uniform(-2, 2) for _ in range(6))
    freq = rng.uniform(0.1, 1.5)
    values = {proofs.q1: q1, proofs.q2: q2, proofs.k1: k1, proofs.k2: k2}
    values |= {proofs.m: pos_m, proofs.n: pos_n, proofs.theta: freq}
    inv_freq = torch.tensor([freq], dtype=torch.float64)
    r_m, r_n = _rope_matrix_numeric(pos_m, inv_freq), _rope_matrix_numeric(pos_n, inv_freq)
    score = float(_rotate_2d((q1, q2), pos_m, freq) @ _rotate_2d((k1, k2), pos_n, freq))
    proof = proofs.relative_identity_block()
    wants = (np.eye(2), r_m.T @ r_n, np.array([[score]]))
    for step, want in zip(proof.steps, wants, strict=True):
        for side in (step.lhs, step.rhs):
            got = np.array(sp.Matrix([side]).subs(values), dtype=float)
            np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-12)
    # the flipped sine turns the other way: its score is the one at positions -m, -n
    wrong = proofs.relative_identity_block(sine=-1).steps[2]
    flipped = float(_rotate_2d((q1, q2), -pos_m, freq) @ _rotate_2d((k1, k2), -pos_n, freq))
    assert float(wrong.lhs.subs(values)) == pytest.approx(flipped, abs=1e-12)
    assert abs(float(wrong.rhs.subs(values)) - flipped) > 1e-6


def test_source000_rotate_half_is_pecode_rotate_half():
    # the proof's RotateHalf, entries j and j + N (1-based), against pecode.rope.rotate_half
    x = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    xs = sp.IndexedBase("x")
    values = {xs[j + 1]: float(x[j]) for j in range(8)}
    got = torch.zeros(8, dtype=torch.float64)
    for j in range(1, 5):
        first, second = proofs._rotate_half_pair(xs, sp.Integer(j))
        got[j - 1] = float(first.subs(N, 4).subs(values))
        got[j + 3] = float(second.subs(N, 4).subs(values))
    assert torch.equal(got, rotate_half(x))


def test_source000_score_is_pecode_rotate_half_rope():
    # the score the derivation starts from, RoPE(q, m) . RoPE(k, n) with one frequency,
    # against apply_rope_rotate_half with the tables cat(cos, cos), cat(sin, sin), d = 8
    step = proofs.source000_rotate_half_derivation().steps[2]
    gen = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, 8, dtype=torch.float64, generator=gen)
    freq, pos_m, pos_n = 0.37, 5.0, 2.0
    inv_freq = torch.full((4,), freq, dtype=torch.float64)

    def rope(vec, pos):
        cos, sin = rope_cos_sin(torch.tensor([pos], dtype=torch.float64), inv_freq)
        full_cos, full_sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        return apply_rope_rotate_half(vec[None], full_cos, full_sin)[0]

    want = float(rope(q, pos_m) @ rope(k, pos_n))
    values = {proofs.m: pos_m, proofs.n: pos_n, proofs.theta: freq}
    values.update({proofs._q[j + 1]: float(q[j]) for j in range(8)})
    values.update({proofs._k[j + 1]: float(k[j]) for j in range(8)})
    for side in (step.lhs, step.rhs):
        assert _concrete(side, 4, values).real == pytest.approx(want, abs=1e-12)


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
        proofs.layout_permutation_proof(bad)


@pytest.mark.parametrize(
    ("function", "kwargs", "match"),
    [
        (proofs.relative_shift, {"sign": "m+n"}, "sign"),
        (proofs.complex_solution_2d, {"sine": 2}, "sine"),
        (proofs.relative_identity_block, {"sine": True}, "sine"),
        (proofs.forms_agree, {"sine": 0}, "sine"),
        (proofs.abel_summation, {"boundary_offset": 2}, "boundary_offset"),
        (proofs.relative_identity, {"transpose": 1}, "transpose"),
    ],
)
def test_bad_arguments_raise(function, kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        function(**kwargs)
