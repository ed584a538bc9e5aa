"""The relative-encoding proofs hold, fail when the claim is broken, and agree with the
implementations; the four-term table follows the implementations, sign errors included."""

from __future__ import annotations

from unittest import mock

import pytest
import sympy as sp
import torch

import pecode.absolute
import pecode.alibi
import pecode.relative
import pecode.relative.t5
import pecode.rope
from pecode.proofs.relative import (
    clipped_offset_shift_invariance,
    four_term_expansion,
    four_term_table,
    method_scores,
    relative_shift_index,
    transformer_xl_regrouping,
)


@pytest.mark.parametrize(("d", "d_k"), [(1, 1), (2, 3), (3, 2)])
def test_four_term_expansion(d, d_k):
    proof = four_term_expansion(d, d_k)
    assert proof.holds(), proof.failing_steps()


def test_an_expansion_without_a_cross_term_leaves_that_term_over():
    proof = four_term_expansion(2, 2, mistake="missing cross term")
    assert proof.failing_steps() == [1, 2]
    # what is left over is exactly the position-content term
    assert str(proof.steps[0].residual) == "p_i*W_Q*W_K.T*x_j.T"


def test_four_term_expansion_bad_arguments():
    with pytest.raises(ValueError, match="d_k"):
        four_term_expansion(2, 0)
    with pytest.raises(TypeError, match="d"):
        four_term_expansion(2.0, 2)
    with pytest.raises(ValueError, match="mistake"):
        four_term_expansion(mistake="no terms")


@pytest.mark.parametrize("d_k", [1, 3])
def test_transformer_xl_regrouping(d_k):
    assert transformer_xl_regrouping(d_k).holds()
    assert transformer_xl_regrouping(d_k, swap_uv=True).failing_steps() == [1, 2]


def test_transformer_xl_regrouping_against_the_implementation():
    """(q + u)·k + (q + v)·r is what transformer_xl_position_terms adds to q·k."""
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, 4, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    rel = torch.randn(1, 7, 3, generator=gen, dtype=torch.float64)
    u, v = (torch.randn(1, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    total = q @ k.transpose(-2, -1) + pecode.relative.transformer_xl_position_terms(q, k, rel, u, v)
    regrouped = (q + u) @ k.transpose(-2, -1) + pecode.relative.relative_shift(
        (q + v) @ rel.transpose(-2, -1)
    )
    assert torch.allclose(total, regrouped, rtol=0, atol=1e-12)


def _column(proof):
    c = sp.Symbol("c", integer=True)
    symbols = {s.name: s for s in proof.steps[0].subs[c].free_symbols}
    return sp.lambdify(
        [symbols[n] for n in ("i", "j", "L_q")], proof.steps[0].subs[c], modules="math"
    )


def test_relative_shift_index_is_the_implementations_view():
    """The column the proof reads is the one pecode.relative.relative_shift returns."""
    assert relative_shift_index().holds()
    column = _column(relative_shift_index())
    wrong = _column(relative_shift_index(shift="right"))
    q_len, k_len = 3, 5
    scores = torch.arange(q_len * (q_len + k_len - 1)).view(q_len, -1)
    shifted = pecode.relative.relative_shift(scores)
    picked = [[int(scores[i, column(i, j, q_len)]) for j in range(k_len)] for i in range(q_len)]
    assert shifted.tolist() == picked
    assert any(wrong(i, j, q_len) != column(i, j, q_len) for i in range(q_len) for j in range(2))


def test_a_shift_in_the_wrong_direction_fails_everywhere():
    assert relative_shift_index(shift="right").failing_steps() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="shift"):
        relative_shift_index(shift="up")


def test_clipped_offsets_against_shaws_index():
    """The proof's row ``clip(j - i, k) + k`` is what shaw_relative_index computes."""
    proof = clipped_offset_shift_invariance()
    assert proof.holds()
    row = proof.steps[1].lhs  # clip(x, k) + k
    x, k = sorted(row.free_symbols, key=lambda s: s.name)[::-1]
    positions = torch.arange(9)
    index = pecode.relative.shaw_relative_index(positions, positions, 3)
    expected = [[int(row.subs({x: j - i, k: 3})) for j in range(9)] for i in range(9)]
    assert index.tolist() == expected


def test_an_offset_clipped_on_one_side_leaves_the_table():
    proof = clipped_offset_shift_invariance(one_sided=True)
    assert proof.failing_steps() == [2]
    row = proof.steps[1].lhs
    x, k = sorted(row.free_symbols, key=lambda s: s.name)[::-1]
    assert row.subs({x: -5, k: 2}) < 0  # a row index below the table


def test_the_four_term_table_matches_every_implementation():
    rows = {row.method: row for row in four_term_table()}
    assert set(rows) == set(method_scores())
    assert all(row.matches for row in rows.values())
    slots = {name: row.slots for name, row in rows.items()}
    assert slots["absolute (Vaswani, BERT)"] == (
        "kept", "kept (absolute)", "kept (absolute)", "kept (absolute)",
    )  # fmt: skip
    assert slots["T5"][:3] == ("kept", "dropped", "dropped")
    assert "beta" in slots["T5"][3]
    assert slots["Shaw et al."][2:] == ("dropped", "dropped")
    assert "a^K" in slots["Shaw et al."][1]
    assert slots["DeBERTa"][3] == "dropped"
    assert "delta(i,j)" in slots["DeBERTa"][1]
    assert "delta(j,i)" in slots["DeBERTa"][2]
    assert all(slot != "dropped" for slot in slots["Transformer-XL / XLNet"])
    assert slots["RoPE"][1:] == ("dropped", "dropped", "dropped")
    for row in rows.values():
        for cell, coefficient in zip(row.slots, row.coefficients, strict=True):
            assert (cell == "dropped") == (coefficient is None)
            assert coefficient is None or abs(coefficient - 1) < 1e-6  # float32 sinusoid (XL)


def _negated(function):
    def wrapper(*args, **kwargs):
        return -function(*args, **kwargs)

    return wrapper


# Each line breaks one implementation the way a sign error would, and names the slots
# (1-based) whose cells must change and what the fitted coefficient becomes there
# (None: the term is no longer the formula's at any coefficient).
SIGN_ERRORS = {
    "Shaw key term negated": (
        pecode.relative, "shaw_key_logits", _negated, "Shaw et al.", {2: -1.0},
    ),
    "absolute table negated": (
        pecode.absolute, "sinusoidal_table", _negated, "absolute (Vaswani, BERT)",
        {2: -1.0, 3: -1.0},
    ),
    "ALiBi slope negated": (
        pecode.alibi, "alibi_bias_from_positions",
        lambda f: lambda slopes, *a, **kw: f(-slopes, *a, **kw), "ALiBi", {4: -1.0},
    ),
    "RoPE rotating the other way": (
        pecode.rope, "apply_rope", lambda f: lambda x, cos, sin, *a: f(x, cos, -sin, *a),
        "RoPE", {1: None},
    ),
    "Transformer-XL u and v swapped": (
        pecode.relative, "transformer_xl_position_terms",
        lambda f: lambda q, k, rel, u, v: f(q, k, rel, v, u), "Transformer-XL / XLNet",
        {3: None, 4: None},
    ),
    "T5 offset negated": (  # patched where T5RelativePositionBias looks it up
        pecode.relative.t5, "t5_relative_position_bucket",
        lambda f: lambda offset, *a: f(-offset, *a), "T5", {4: None},
    ),
    "DeBERTa position-to-content term negated": (
        pecode.relative, "deberta_position_terms",
        lambda f: lambda *a: (lambda c2p, p2c: (c2p, -p2c))(*f(*a)), "DeBERTa", {3: -1.0},
    ),
}  # fmt: skip


@pytest.mark.parametrize("error", SIGN_ERRORS.values(), ids=list(SIGN_ERRORS))
def test_a_sign_error_in_an_implementation_changes_its_row(error):
    module, name, mutate, method, changed = error
    before = {row.method: row for row in four_term_table()}
    with mock.patch.object(module, name, mutate(getattr(module, name))):
        after = {row.method: row for row in four_term_table()}
    assert not after[method].matches
    for slot in range(1, 5):
        if slot not in changed:
            assert after[method].slots[slot - 1] == before[method].slots[slot - 1]
            continue
        cell = after[method].slots[slot - 1]
        coefficient = after[method].coefficients[slot - 1]
        if changed[slot] is None:
            assert cell.startswith("**not**")
        else:
            assert cell.startswith(f"**{changed[slot]:+.3g} ×**")
            assert coefficient == pytest.approx(changed[slot], abs=1e-9)
    others = {m: row for m, row in after.items() if m != method}
    assert all(row.matches for row in others.values())


def test_a_term_the_formula_lacks_is_reported():
    """A position-position term added to Shaw's key logits (a bias) is not in Shaw's formula."""
    original = pecode.relative.shaw_key_logits

    def with_bias(q, table, qp, kp, k):
        return original(q, table, qp, kp, k) + (kp - qp.unsqueeze(-1)).double()

    with mock.patch.object(pecode.relative, "shaw_key_logits", with_bias):
        row = next(r for r in four_term_table() if r.method == "Shaw et al.")
    assert not row.matches
    assert row.slots[3] == "**a term the formula does not have**"


def test_four_term_table_bad_arguments():
    with pytest.raises(ValueError, match="length"):
        four_term_table(1)
    with pytest.raises(TypeError, match="start"):
        four_term_table(start=1.5)
