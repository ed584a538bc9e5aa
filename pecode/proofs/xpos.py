"""Proofs about xPos (Sun et al. 2023, arXiv 2212.10554): RoPE with a decay ``ζ^((n-m)/B)``.

xPos multiplies the rotated query at position ``n`` by ``ζ^(n/B)`` and the rotated key at
position ``m`` by ``ζ^(-m/B)``, pair by pair (:mod:`pecode.xpos`). For one pair of
features, with the rotation angle ``θ``, a base ``ζ > 0`` and a scale base ``B > 0`` all
symbolic, :func:`xpos_relative_score` proves that the score is ``ζ^((n-m)/B)`` times
RoPE's and depends on the positions only through ``n - m``. Its false neighbour scales
the key by ``ζ^(+m/B)`` (the query's factor, not its inverse): the factors then multiply
to ``ζ^((n+m)/B)``, which moves with both positions. :data:`CASES` lists it.
"""

from __future__ import annotations

from functools import cached_property

import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step

__all__ = ["CASES", "xpos_relative_score"]


def _rotation(angle: sp.Expr) -> sp.Matrix:
    """``[[cos φ, -sin φ], [sin φ, cos φ]]`` (RoFormer's block, as in :mod:`pecode.proofs.rope`)."""
    c, s = sp.cos(angle), sp.sin(angle)
    return sp.Matrix([[c, -s], [s, c]])


def _is_sine_squared(expr: sp.Expr) -> bool:
    return bool(expr.is_Pow and expr.base.func == sp.sin and expr.exp == 2)


class _TrigStep(Step):
    """A :class:`Step` whose residual is reduced as a polynomial in ``cos`` and ``sin``.

    The difference is expanded (angle sums included, ``cos((n-m)θ)`` into ``cos nθ cos mθ
    + sin nθ sin mθ``; powers of ``ζ`` into products), then ``sin² x`` is replaced by
    ``1 - cos² x`` and the result expanded again. No sine in these steps is raised above
    the square, so this is a normal form: a polynomial in the symbols, the ``ζ`` powers
    and ``cos x``, each ``sin x`` to the first power at most, which is zero exactly when
    every coefficient is. (``simplify`` reaches the same zeros, several times slower.)
    """

    @cached_property
    def residual(self):  # type: ignore[override]
        diff = self.lhs - self.rhs
        if self.subs:
            diff = diff.subs(dict(self.subs))
        expanded = sp.expand(diff, trig=True)
        return sp.expand(
            expanded.replace(_is_sine_squared, lambda p: 1 - sp.cos(p.base.args[0]) ** 2)
        )


def xpos_relative_score(*, key_sign: int = -1) -> Proof:
    """For one pair, xPos's score is ``ζ^((n-m)/B)`` times RoPE's and depends on ``n - m`` only.

    With ``q' = ζ^(n/B) R(nθ) q`` and ``k' = ζ^(key_sign·m/B) R(mθ) k`` (``R`` the 2x2
    rotation, ``q, k`` symbolic pairs, ``n, m`` real, ``θ, ζ, B`` positive):

    1. the two factors multiply to ``ζ^((n-m)/B)``;
    2. so ``q'·k'`` is ``ζ^((n-m)/B)`` times RoPE's score ``(R(nθ) q)·(R(mθ) k)``;
    3. RoPE's score is ``qᵀ R((m-n)θ) k``, a function of ``m - n`` (RoFormer §3.4.2);
    4. shifting both positions by ``s`` leaves ``q'·k'`` unchanged;
    5. with ``n = m + t``, ``q'·k' = ζ^(t/B) qᵀ R(-tθ) k``: no ``m`` is left.

    Args:
        key_sign: ``-1``, the key's factor ``ζ^(-m/B)`` (xPos); ``+1`` builds the false
            neighbour, the key scaled like the query, which fails at steps 1, 2, 4 and 5
            (step 3, RoPE's own identity, holds either way).

    Raises:
        ValueError: ``key_sign`` is not ``-1`` or ``1``.
    """
    if isinstance(key_sign, bool) or key_sign not in (-1, 1):
        raise ValueError(f"key_sign must be -1 or 1, got {key_sign!r}")
    n, m, t, s = sp.symbols("n m t s", real=True)
    theta, zeta, base = sp.symbols("theta zeta B", positive=True)
    q = sp.Matrix(sp.symbols("q_1 q_2", real=True))
    k = sp.Matrix(sp.symbols("k_1 k_2", real=True))

    def rope_score(qpos: sp.Expr, kpos: sp.Expr) -> sp.Expr:
        return ((_rotation(qpos * theta) * q).T * (_rotation(kpos * theta) * k))[0]

    def xpos_score(qpos: sp.Expr, kpos: sp.Expr) -> sp.Expr:
        q_scaled = zeta ** (qpos / base) * (_rotation(qpos * theta) * q)
        k_scaled = zeta ** (key_sign * kpos / base) * (_rotation(kpos * theta) * k)
        return (q_scaled.T * k_scaled)[0]

    key_tex = "-m/B" if key_sign == -1 else "m/B"
    decay = zeta ** ((n - m) / base)
    relative = (q.T * _rotation((m - n) * theta) * k)[0]
    step_factors = Step(
        f"The query's factor $\\zeta^{{n/B}}$ and the key's $\\zeta^{{{key_tex}}}$ multiply "
        "to $\\zeta^{(n-m)/B}$ ($\\zeta, B > 0$)",
        zeta ** (n / base) * zeta ** (key_sign * m / base),
        decay,
        latex=f"\\zeta^{{n/B}}\\,\\zeta^{{{key_tex}}} = \\zeta^{{(n-m)/B}}",
    )
    step_factorise = Step(
        "So the score of the scaled, rotated pair is $\\zeta^{(n-m)/B}$ times RoPE's score "
        "(the factors are scalars on each vector)",
        xpos_score(n, m),
        decay * rope_score(n, m),
        latex=(
            f"\\big(\\zeta^{{n/B}} R(n\\theta) q\\big)^\\top \\big(\\zeta^{{{key_tex}}} "
            "R(m\\theta) k\\big) = \\zeta^{(n-m)/B}\\, (R(n\\theta) q)^\\top R(m\\theta) k"
        ),
    )
    step_rope = _TrigStep(
        "RoPE's score for one pair is $q^\\top R((m-n)\\theta) k$: it depends on $m - n$ "
        "only (the angle sums expanded)",
        rope_score(n, m),
        relative,
        latex="(R(n\\theta) q)^\\top R(m\\theta) k = q^\\top R((m-n)\\theta)\\, k",
    )
    step_shift = _TrigStep(
        "Shifting both positions by $s$ leaves the xPos score unchanged",
        xpos_score(n + s, m + s),
        xpos_score(n, m),
        latex=(
            "\\langle f_q(q, n + s), f_k(k, m + s)\\rangle = \\langle f_q(q, n), f_k(k, m)\\rangle"
        ),
    )
    step_offset = _TrigStep(
        "With $n = m + t$ the xPos score is $\\zeta^{t/B} q^\\top R(-t\\theta) k$: a function "
        "of the offset $t = n - m$ alone, decaying as $\\zeta^{t/B}$ for $0 < \\zeta < 1$",
        xpos_score(n, m),
        zeta ** (t / base) * (q.T * _rotation(-t * theta) * k)[0],
        subs={n: m + t},
        latex=(
            "\\langle f_q(q, m + t), f_k(k, m)\\rangle = \\zeta^{t/B}\\, q^\\top R(-t\\theta)\\, k"
        ),
    )
    return Proof(
        "xPos's score depends on the offset only"
        + ("" if key_sign == -1 else " (key scaled like the query)"),
        "For one pair of features, the xPos score of a query at $n$ and a key at $m$ is "
        "$\\zeta^{(n-m)/B}$ times RoPE's, and depends on $n$ and $m$ only through $n - m$"
        + (" — tested here with the key's factor $\\zeta^{m/B}$." if key_sign == 1 else "."),
        (step_factors, step_factorise, step_rope, step_shift, step_offset),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "xpos.xpos_relative_score",
        xpos_relative_score,
        lambda: xpos_relative_score(key_sign=1),
        (1, 2, 4, 5),
    ),
)
"""The proofs of this module with their false neighbours."""
