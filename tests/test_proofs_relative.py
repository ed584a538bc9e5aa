"""The relative-encoding proofs hold, and fail when the claim is broken."""

from __future__ import annotations

import pytest
import sympy as sp

from pecode.proofs.core import Step
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


def test_four_term_expansion_detects_a_missing_term():
    x = sp.MatrixSymbol("x", 1, 2)
    p = sp.MatrixSymbol("p", 1, 2)
    w = sp.MatrixSymbol("W", 2, 2)
    wrong = Step("no cross terms", sp.expand((x + p) * w * ((x + p) * w).T),
                 x * w * (x * w).T + p * w * (p * w).T)  # fmt: skip
    assert not wrong.holds


def test_four_term_expansion_bad_sizes():
    with pytest.raises(ValueError, match="d_k"):
        four_term_expansion(2, 0)
    with pytest.raises(TypeError, match="d"):
        four_term_expansion(2.0, 2)


@pytest.mark.parametrize("d_k", [1, 3])
def test_transformer_xl_regrouping(d_k):
    assert transformer_xl_regrouping(d_k).holds()


def test_relative_shift_index_and_shift_invariance():
    assert relative_shift_index().holds()
    assert clipped_offset_shift_invariance().holds()


def test_four_term_table():
    rows = {row.method: row.slots for row in four_term_table()}
    assert set(rows) == set(method_scores())
    assert rows["absolute (Vaswani, BERT)"] == (
        "kept", "kept (absolute)", "kept (absolute)", "kept (absolute)",
    )  # fmt: skip
    assert rows["T5"][:3] == ("kept", "dropped", "dropped")
    assert "beta" in rows["T5"][3]
    assert rows["Shaw et al."][2:] == ("dropped", "dropped")
    assert "a^K" in rows["Shaw et al."][1]
    assert rows["DeBERTa"][3] == "dropped"
    assert "delta(i,j)" in rows["DeBERTa"][1]
    assert "delta(j,i)" in rows["DeBERTa"][2]
    assert all(slot != "dropped" for slot in rows["Transformer-XL / XLNet"])
    assert rows["RoPE"][1:] == ("dropped", "dropped", "dropped")
