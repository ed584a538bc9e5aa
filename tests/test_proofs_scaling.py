"""Every long-context identity chapter 10 states simplifies to zero in sympy."""

from __future__ import annotations

import pytest

from pecode.proofs import scaling as proofs


@pytest.mark.parametrize(
    "build",
    [
        proofs.linear_is_position_interpolation,
        proofs.ntk_endpoints,
        proofs.dynamic_equals_default,
        proofs.llama3_continuity,
        proofs.yarn_boundary,
        proofs.attention_factor_squares,
    ],
)
def test_proof_holds(build):
    proof = build()
    assert proof.holds(), proof.failing_steps()
    assert "Holds" in proof._repr_markdown_()
