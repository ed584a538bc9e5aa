"""The xPos proof holds, its false neighbour fails where its case says, and its claim agrees
with pecode.xpos on numbers."""

from __future__ import annotations

import pytest
import sympy as sp
import torch

from pecode.proofs.xpos import CASES, xpos_relative_score
from pecode.xpos import XPos


@pytest.fixture(scope="module")
def proof():
    return xpos_relative_score()


def _symbol(expr, name):
    return next(s for s in expr.free_symbols if s.name == name)


def test_the_score_depends_on_the_offset_only(proof):
    assert proof.holds(), proof.failing_steps()
    assert proof.unmarked_restatements() == []
    assert proof.derived_steps() == [1, 2, 3, 4, 5]


def test_the_key_scaled_like_the_query_fails_where_the_case_says():
    (case,) = CASES
    assert case.name == "xpos.xpos_relative_score"
    mutant = case.mutant()
    assert mutant.failing_steps() == list(case.fails_at) == [1, 2, 4, 5]
    # step 1's residual is exactly the wrong product of factors, ζ^((n+m)/B) - ζ^((n-m)/B)
    residual = mutant.steps[0].residual
    zeta, n, m, b = (_symbol(residual, name) for name in ("zeta", "n", "m", "B"))
    want = zeta ** ((n + m) / b) - zeta ** ((n - m) / b)
    assert sp.simplify(residual - want) == 0


def test_the_claim_evaluated_equals_pecodes_xpos(proof):
    """Step 5's right side at numbers equals the score of pecode's XPos for one pair
    (head_dim 2: θ = 1 and ζ = γ/(1+γ)), a query at n and a key at m = n - t."""
    rhs = proof.steps[4].rhs
    symbols = {s.name: s for s in rhs.free_symbols}
    scale_base, smoothing = 16.0, 0.4
    scheme = XPos(2, scale_base=scale_base, smoothing=smoothing, dtype=torch.float64)
    q, k = [0.3, -1.2], [0.7, 0.5]
    for n, m in ((5, 2), (9, 9), (20, 3)):
        qt = torch.tensor(q, dtype=torch.float64).view(1, 1, 1, 2)
        kt = torch.tensor(k, dtype=torch.float64).view(1, 1, 1, 2)
        q2, k2 = scheme.transform_qk(qt, kt, torch.tensor([n]), torch.tensor([m]))
        values = {
            symbols["zeta"]: sp.Rational(2, 7),  # 0.4 / 1.4
            symbols["B"]: scale_base,
            symbols["theta"]: 1,
            symbols["t"]: n - m,
            symbols["q_1"]: q[0],
            symbols["q_2"]: q[1],
            symbols["k_1"]: k[0],
            symbols["k_2"]: k[1],
        }
        assert float((q2 * k2).sum()) == pytest.approx(float(rhs.subs(values)), rel=1e-12)


def test_key_sign_is_checked():
    with pytest.raises(ValueError, match="key_sign"):
        xpos_relative_score(key_sign=0)
    with pytest.raises(ValueError, match="key_sign"):
        xpos_relative_score(key_sign=True)
