"""Proofs about choosing RoPE's base (chapter 11.1), for symbolic sizes and lengths.

The head dimension ``d``, the base ``b`` and the trained length ``L0`` are positive
symbols. :data:`CASES` lists each proof with its false neighbour and the steps at which
it fails.
"""

from __future__ import annotations

import sympy as sp

from pecode.proofs.core import ForcedStep, Proof, ProofCase, Step

__all__ = ["CASES", "critical_dimension_rule"]

d, b = sp.symbols("d b", positive=True)
i = sp.Symbol("i", nonnegative=True)
L0 = sp.Symbol("L_0", positive=True)


def _theta(base: sp.Expr, index: sp.Expr) -> sp.Expr:
    return base ** (-2 * index / d)


class _LogStep(ForcedStep):
    """A :class:`Step` whose residual splits logarithms of products and powers first.

    ``ln(x^y) = y ln x`` and ``ln(xy) = ln x + ln y`` hold for positive ``x, y`` and a real
    exponent; sympy applies them only with ``force=True``, which is wrong for a possibly
    negative argument, so it is used only when every symbol of the step is positive.
    """

    def forced(self, diff):
        return sp.simplify(sp.expand_log(diff.doit(), force=True))


def critical_dimension_rule(exponent: sp.Expr | None = None) -> Proof:
    """Liu et al.'s critical index ``i_c = (d/2) log_b(L0/2π)``, where it moves with the base,
    and the base below which every pair completes a turn.

    Step 1 substitutes ``i_c`` into ``L0 θ_i`` (an evaluation): that pair turns exactly once
    over the trained length. Step 2 differentiates ``i_c`` in ``b``: the derivative is
    negative for ``L0 > 2π`` and ``b > 1``, so a smaller base puts more pairs below
    ``i_c``. Step 3 puts ``b* = (L0/2π)^{d/(d-2)}`` into ``i_c`` and gets ``d/2 - 1``, the
    last pair: at any base up to ``b*`` every pair has turned at least once in training,
    the reason a small base extrapolates too (chapter 11.1).

    Args:
        exponent: the exponent of ``L0/2π`` in ``b*``; ``d/(d-2)`` (the default) is right;
            ``d/(d-1)``, the false neighbour, fails step 3.
    """
    exponent = d / (d - 2) if exponent is None else exponent
    index = d * sp.log(L0 / (2 * sp.pi)) / (2 * sp.log(b))
    turning = (L0 / (2 * sp.pi)) ** exponent
    return Proof(
        "The critical dimension and the base that turns every pair",
        r"Pair $i$ turns once over $L_0$ tokens at $i_c = \frac{d}{2}\log_b\frac{L_0}{2\pi}$;"
        r" $i_c$ grows as the base falls, and reaches the last pair, $d/2 - 1$, at"
        rf" $b^* = {sp.latex(turning)}$.",
        (
            Step(
                "At $i = i_c$ the pair turns exactly once over the trained length",
                L0 * _theta(b, i),
                2 * sp.pi,
                subs={i: index},
                latex=rf"\left.L_0\,{sp.latex(_theta(b, i))}\right|_{{i = {sp.latex(index)}}}"
                r" = 2\pi",
            ),
            _LogStep(
                r"$i_c$ falls as the base grows (negative for $L_0 > 2\pi$, $b > 1$)",
                sp.Derivative(index, b),
                -d * sp.log(L0 / (2 * sp.pi)) / (2 * b * sp.log(b) ** 2),
            ),
            _LogStep(
                "At $b = b^*$ the critical index is the last pair, $d/2 - 1$",
                index,
                d / 2 - 1,
                subs={b: turning},
                latex=rf"\left.{sp.latex(index)}\right|_{{b = {sp.latex(turning)}}}"
                r" = \frac{d}{2} - 1",
            ),
        ),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "rope_base.critical_dimension_rule",
        critical_dimension_rule,
        lambda: critical_dimension_rule(exponent=d / (d - 1)),
        (3,),
    ),
)
"""Every proof of this module with its false neighbour and the steps where it fails."""
