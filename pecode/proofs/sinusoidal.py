"""Proofs about the sinusoidal encoding (chapter 2).

Notation: pair ``i`` of a width-``d`` table has the angular frequency
``ω_i = b^{-2i/d}`` (``b`` is the base, 10000 in Vaswani et al. 2017, §3.5), and
``PE(pos)`` holds ``(sin(pos ω_i), cos(pos ω_i))`` in columns ``2i, 2i+1``.

Every statement about one pair is proven with ``pos``, ``k``, ``i``, ``d`` and ``b``
all symbolic; statements about the whole vector either use a symbolic sum over
``i`` or an explicit width with every other quantity symbolic.
"""

from __future__ import annotations

from functools import cached_property

import sympy as sp

from pecode.proofs.core import Proof, Step

__all__ = [
    "frequency_exp_log_form",
    "sinusoidal_dot_product",
    "sinusoidal_pair",
    "sinusoidal_shift_is_rotation",
    "sinusoidal_shift_matrix",
]

# Symbols shared by the proofs: positions and offsets are real (the identities hold
# for any real position, integers included); the base is positive so that its
# logarithm is real.
POS, K, J = sp.symbols("pos k j", real=True)
I_ = sp.Symbol("i", integer=True, nonnegative=True)
D = sp.Symbol("d", integer=True, positive=True)
BASE = sp.Symbol("b", positive=True)


def _omega(i: sp.Expr = I_, d: sp.Expr = D, base: sp.Expr = BASE) -> sp.Expr:
    return base ** (-2 * sp.sympify(i) / d)


def _trig_residual(lhs, rhs):
    """``lhs - rhs`` with sums of angles expanded, then simplified (entrywise for matrices)."""

    def clean(expr):
        return sp.simplify(sp.expand(sp.expand_trig(expr)))

    if isinstance(lhs, sp.Sum) and isinstance(rhs, sp.Sum) and lhs.limits == rhs.limits:
        # sums over the same range: their difference is the sum of the differences
        return sp.Sum(clean(lhs.function - rhs.function), *lhs.limits).doit()
    diff = lhs - rhs
    if isinstance(diff, sp.MatrixBase):
        return diff.applyfunc(clean)
    return clean(diff)


class _TrigStep(Step):
    """A :class:`Step` whose residual expands ``sin(a + b)`` and ``cos(a + b)`` first."""

    @cached_property
    def residual(self):  # type: ignore[override]
        return _trig_residual(self.lhs, self.rhs)


def sinusoidal_pair(pos: sp.Expr, omega: sp.Expr) -> sp.Matrix:
    """The two entries ``(sin(pos ω), cos(pos ω))`` of one frequency pair, as a column."""
    return sp.Matrix([sp.sin(pos * omega), sp.cos(pos * omega)])


def _rotation(angle: sp.Expr) -> sp.Matrix:
    # in (sin, cos) coordinates, advancing the angle by `angle` is this matrix
    return sp.Matrix([[sp.cos(angle), sp.sin(angle)], [-sp.sin(angle), sp.cos(angle)]])


def sinusoidal_shift_matrix(k: sp.Expr, dim: int, base: sp.Expr = BASE) -> sp.Matrix:
    """``M_k``: the block-diagonal matrix with ``PE(pos + k) = M_k PE(pos)`` for every ``pos``.

    Block ``i`` is ``[[cos kω_i, sin kω_i], [-sin kω_i, cos kω_i]]``, a rotation by
    ``-kω_i`` of the plane ``(sin, cos)``.

    Raises:
        ValueError: ``dim`` is not a positive even int.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim must be a positive even int, got {dim!r}")
    blocks = [_rotation(k * _omega(i, dim, base)) for i in range(dim // 2)]
    return sp.diag(*blocks)


def _explicit_pe(pos: sp.Expr, dim: int, base: sp.Expr = BASE) -> sp.Matrix:
    return sp.Matrix.vstack(*[sinusoidal_pair(pos, _omega(i, dim, base)) for i in range(dim // 2)])


def frequency_exp_log_form() -> Proof:
    """``b^{-2i/d} = exp(-(2i/d) ln b)``: the power and the exp/log form are the same number.

    Many listings compute the frequencies as ``exp(arange(0, d, 2) * (-ln(b) / d))``;
    this proves that form equals ``1 / b^{2i/d}``, the denominator of Vaswani et al.
    (2017), §3.5, for symbolic ``i``, ``d`` and ``b > 0``.
    """
    omega = _omega()
    two_i = 2 * I_
    return Proof(
        "The exp/log form of the frequencies",
        "For every $b > 0$, $d \\ge 1$ and $i$: $b^{-2i/d} = \\exp(-\\tfrac{2i}{d}\\ln b)$, "
        "so the listings' `exp(arange(0, d, 2) * (-log(b) / d))` is $1/b^{2i/d}$.",
        (
            Step(
                "Dividing by $b^{2i/d}$ is multiplying by $b^{-2i/d}$",
                1 / BASE ** (two_i / D),
                omega,
                latex="\\frac{1}{b^{2i/d}} = b^{-2i/d}",
            ),
            Step(
                "$a^x = e^{x \\ln a}$ for $a > 0$",
                omega,
                sp.exp(-(two_i / D) * sp.log(BASE)),
            ),
            Step(
                "The listing's grouping: column index $2i$ times the constant $-\\ln(b)/d$",
                sp.exp(two_i * (-sp.log(BASE) / D)),
                omega,
                latex=(
                    "\\exp\\!\\left(2i \\cdot \\left(-\\tfrac{\\ln b}{d}\\right)\\right)"
                    " = b^{-2i/d}"
                ),
            ),
        ),
    )


def sinusoidal_shift_is_rotation(dim: int = 4) -> Proof:
    """``PE(pos + k) = M_k PE(pos)`` with one block-diagonal rotation ``M_k`` for all ``pos``.

    Vaswani et al. (2017), §3.5, state that ``PE(pos + k)`` is a linear function of
    ``PE(pos)``. Step 1 proves it for one pair with ``pos``, ``k``, ``i``, ``d``, ``b``
    symbolic; steps 2 to 6 take the whole vector of an explicit ``dim`` (everything
    else symbolic): the identity, that ``M_k`` does not involve ``pos``, that it is
    orthogonal with determinant 1 (a rotation), and that shifts compose,
    ``M_j M_k = M_{j+k}``.

    Args:
        dim: the explicit even width for steps 2 to 6 (2 to 8).

    Raises:
        ValueError: ``dim`` is not an even int between 2 and 8.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (2, 4, 6, 8):
        raise ValueError(f"dim must be one of 2, 4, 6, 8, got {dim!r}")
    omega = _omega()
    M = sinusoidal_shift_matrix(K, dim)
    pe, pe_shifted = _explicit_pe(POS, dim), _explicit_pe(POS + K, dim)
    return Proof(
        "A shift is a rotation",
        "For every offset $k$ there is one matrix $M_k$, independent of $pos$, made of "
        "$2\\times 2$ rotation blocks, with $PE(pos + k) = M_k\\,PE(pos)$.",
        (
            _TrigStep(
                "One pair, all of $pos, k, i, d, b$ symbolic: the angle-sum formulas",
                _rotation(K * omega) * sinusoidal_pair(POS, omega),
                sinusoidal_pair(POS + K, omega),
                latex=(
                    "\\begin{pmatrix}\\cos k\\omega_i & \\sin k\\omega_i\\\\ -\\sin k\\omega_i "
                    "& \\cos k\\omega_i\\end{pmatrix}\\begin{pmatrix}\\sin pos\\,\\omega_i\\\\"
                    " \\cos pos\\,\\omega_i\\end{pmatrix} = \\begin{pmatrix}\\sin (pos+k)"
                    "\\omega_i\\\\ \\cos (pos+k)\\omega_i\\end{pmatrix},\\quad \\omega_i = "
                    + sp.latex(omega)
                ),
            ),
            _TrigStep(
                f"The whole vector, $d = {dim}$, block-diagonal $M_k$",
                M * pe,
                pe_shifted,
                latex=f"M_k\\,PE(pos) = PE(pos + k) \\quad (d = {dim})",
            ),
            Step(
                "$M_k$ does not depend on $pos$",
                M.diff(POS),
                sp.zeros(dim, dim),
                latex="\\partial M_k / \\partial pos = 0",
            ),
            _TrigStep(
                "$M_k$ is orthogonal",
                M.T * M,
                sp.eye(dim),
                latex="M_k^\\top M_k = I",
            ),
            _TrigStep(
                "and has determinant 1, so it is a rotation (no reflection)",
                M.det(),
                sp.Integer(1),
                latex="\\det M_k = 1",
            ),
            _TrigStep(
                "Shifts compose: shifting by $k$, then by $j$, is shifting by $j + k$",
                sinusoidal_shift_matrix(J, dim) * M,
                sinusoidal_shift_matrix(J + K, dim),
                latex="M_j M_k = M_{j+k}",
            ),
        ),
    )


def sinusoidal_dot_product(dim: int = 4) -> Proof:
    """``PE(pos)·PE(pos + k) = Σ_i cos(k ω_i)``: a function of ``k`` alone, and even in ``k``.

    Step 1 proves the per-pair term for symbolic ``pos``, ``k``, ``i``, ``d``, ``b``;
    step 2 sums it over ``i = 0 .. d/2 - 1`` with ``d`` symbolic; step 3 checks the
    whole dot product for an explicit ``dim``; step 4 shows the result is even in
    ``k``, so the dot product cannot tell a key ``k`` positions before the query from
    one ``k`` positions after.

    Args:
        dim: the explicit even width for step 3 (2 to 8).

    Raises:
        ValueError: ``dim`` is not an even int between 2 and 8.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (2, 4, 6, 8):
        raise ValueError(f"dim must be one of 2, 4, 6, 8, got {dim!r}")
    omega = _omega()
    pair_dot = (sinusoidal_pair(POS, omega).T * sinusoidal_pair(POS + K, omega))[0]
    half = D / 2
    total = sp.Sum(sp.cos(K * omega), (I_, 0, half - 1))
    pe, pe_shifted = _explicit_pe(POS, dim), _explicit_pe(POS + K, dim)
    explicit_total = sum(sp.cos(K * _omega(i, dim)) for i in range(dim // 2))
    return Proof(
        "The dot product sees only the offset",
        "$PE(pos)\\cdot PE(pos+k) = \\sum_{i=0}^{d/2-1} \\cos(k\\,\\omega_i)$, which does "
        "not involve $pos$ and is the same for $k$ and $-k$.",
        (
            _TrigStep(
                "One pair, all of $pos, k, i, d, b$ symbolic: "
                "$\\sin a \\sin c + \\cos a \\cos c = \\cos(c - a)$",
                pair_dot,
                sp.cos(K * omega),
            ),
            _TrigStep(
                "Summed over the $d/2$ pairs, $d$ symbolic: the summands agree term by term",
                sp.Sum(pair_dot, (I_, 0, half - 1)),
                total,
                latex=(
                    "\\sum_{i=0}^{d/2-1}\\left[\\sin(pos\\,\\omega_i)\\sin((pos+k)\\omega_i) + "
                    "\\cos(pos\\,\\omega_i)\\cos((pos+k)\\omega_i)\\right] = " + sp.latex(total)
                ),
            ),
            _TrigStep(
                f"The whole vector, $d = {dim}$",
                (pe.T * pe_shifted)[0],
                explicit_total,
                latex=f"PE(pos)^\\top PE(pos+k) = {sp.latex(explicit_total)}",
            ),
            Step(
                "Even in $k$: $\\cos$ is even, so offsets $k$ and $-k$ give the same value",
                total.subs(K, -K).doit(),
                total.doit(),
                latex=(
                    "\\sum_{i=0}^{d/2-1} \\cos(-k\\,\\omega_i) = "
                    "\\sum_{i=0}^{d/2-1} \\cos(k\\,\\omega_i)"
                ),
            ),
        ),
    )
