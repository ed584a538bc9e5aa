"""Proofs about the sinusoidal encoding (chapter 2).

Notation: pair ``i`` of a width-``d`` table has the angular frequency
``ω_i = b^{-2i/d}`` (``b`` is the base, 10000 in Vaswani et al. 2017, §3.5), and
``PE(pos)`` holds ``(sin(pos ω_i), cos(pos ω_i))`` in columns ``2i, 2i+1``.

Every statement about one pair is proven with ``pos``, ``k``, ``i``, ``d`` and ``b``
all symbolic. Statements about the whole vector use a symbolic sum over ``i`` with
``d`` symbolic, or follow from the per-pair statement because the matrix is
block-diagonal (said in words); they are also checked written out for an explicit
width with every other quantity symbolic.

Each proof function takes a keyword that builds its false neighbour, the same
derivation of a plausibly wrong claim (the listing's exponent off by one, the shift
block's sine sign flipped, source 003's table with the cosine on the next column's
frequency); :data:`CASES` lists them with the steps at which they fail.
"""

from __future__ import annotations

from functools import cached_property

import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step

__all__ = [
    "CASES",
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
        # sums over the same range: their difference is the sum of the differences, zero
        # when the summands agree term by term; otherwise the unevaluated sum is reported
        # as not zero (a step may then fail that a cleverer summation would prove, never
        # the other way round)
        summand = clean(lhs.function - rhs.function)
        return sp.Integer(0) if summand == 0 else sp.Sum(summand, *lhs.limits)
    diff = lhs - rhs
    if isinstance(diff, sp.MatrixBase):
        return diff.applyfunc(clean)
    return clean(diff)


class _TrigStep(Step):
    """A :class:`Step` whose residual expands ``sin(a + b)`` and ``cos(a + b)`` first."""

    @cached_property
    def residual(self):  # type: ignore[override]
        values = dict(self.subs or {})
        lhs, rhs = (sp.sympify(side).subs(values) for side in (self.lhs, self.rhs))
        return _trig_residual(lhs, rhs)


def sinusoidal_pair(pos: sp.Expr, omega: sp.Expr) -> sp.Matrix:
    """The two entries ``(sin(pos ω), cos(pos ω))`` of one frequency pair, as a column."""
    return sp.Matrix([sp.sin(pos * omega), sp.cos(pos * omega)])


def _rotation(angle: sp.Expr, sine_sign: int = 1) -> sp.Matrix:
    # in (sin, cos) coordinates, advancing the angle by `angle` is this matrix
    # (sine_sign=-1 builds the false neighbour, the usual (cos, sin) convention)
    sin = sine_sign * sp.sin(angle)
    return sp.Matrix([[sp.cos(angle), sin], [-sin, sp.cos(angle)]])


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


def _cos_omega(i: sp.Expr, d: sp.Expr, cos_offset: int, base: sp.Expr = BASE) -> sp.Expr:
    # the cosine column's frequency b^{-(2i + cos_offset)/d}: 0 gives Vaswani et al.'s
    # (the sine's own frequency), 1 source 003's table, where column j gets b^{-j/d}
    return base ** (-(2 * sp.sympify(i) + cos_offset) / d)


def _explicit_pe(pos: sp.Expr, dim: int, base: sp.Expr = BASE, cos_offset: int = 0) -> sp.Matrix:
    pairs = [
        sp.Matrix(
            [sp.sin(pos * _omega(i, dim, base)), sp.cos(pos * _cos_omega(i, dim, cos_offset, base))]
        )
        for i in range(dim // 2)
    ]
    return sp.Matrix.vstack(*pairs)


def frequency_exp_log_form(column_offset: int = 0) -> Proof:
    """``b^{-2i/d} = exp(-(2i/d) ln b)``: the power and the exp/log form are the same number.

    Many listings compute the frequencies as ``exp(arange(0, d, 2) * (-ln(b) / d))``;
    this proves that form equals ``1 / b^{2i/d}``, the denominator of Vaswani et al.
    (2017), §3.5, for symbolic ``i``, ``d`` and ``b > 0``. Step 1 is how sympy writes a
    reciprocal power (a restatement); steps 2 and 3 are simplified by sympy.

    Args:
        column_offset: added to the listing's column index ``2i``; 0 is right; 1, the
            false neighbour, is the exponent off by one (the odd column's index, as in
            source 003's table).
    """
    omega = _omega()
    two_i = 2 * I_
    column = two_i + column_offset
    return Proof(
        "The exp/log form of the frequencies",
        "For every $b > 0$, $d \\ge 1$ and $i$: $b^{-2i/d} = \\exp(-\\tfrac{2i}{d}\\ln b)$, "
        "so the listings' `exp(arange(0, d, 2) * (-log(b) / d))` is $1/b^{2i/d}$.",
        (
            Step(
                "Dividing by $b^{2i/d}$ is multiplying by $b^{-2i/d}$; sympy writes both alike",
                1 / BASE ** (two_i / D),
                omega,
                latex="\\frac{1}{b^{2i/d}} = b^{-2i/d}",
                by_definition=True,
            ),
            Step(
                "$a^x = e^{x \\ln a}$ for $a > 0$",
                omega,
                sp.exp(-(two_i / D) * sp.log(BASE)),
            ),
            Step(
                "The listing's grouping: column index $2i$ times the constant $-\\ln(b)/d$",
                sp.exp(column * (-sp.log(BASE) / D)),
                omega,
                latex=(
                    f"\\exp\\!\\left(({sp.latex(column)}) \\cdot \\left(-\\tfrac{{\\ln b}}{{d}}"
                    "\\right)\\right) = b^{-2i/d}"
                ),
            ),
        ),
    )


def sinusoidal_shift_is_rotation(dim: int = 4, sine_sign: int = 1) -> Proof:
    """``PE(pos + k) = M_k PE(pos)`` with one block-diagonal rotation ``M_k`` for all ``pos``.

    Vaswani et al. (2017), §3.5, state that ``PE(pos + k)`` is a linear function of
    ``PE(pos)``. Steps 1 and 4 to 6 are about one pair, with ``pos``, ``k``, ``j``,
    ``i``, ``d`` and ``b`` symbolic, so they hold for every block of ``M_k`` at every
    width: the identity, that the block is orthogonal with determinant 1 (a rotation),
    and that shifts compose, ``M_j M_k = M_{j+k}``. Because ``M_k`` is block-diagonal,
    pair ``i`` of ``M_k PE(pos)`` is block ``i`` times pair ``i`` of ``PE(pos)``, so
    step 1 is the statement for the whole vector; step 2 checks it written out for an
    explicit ``dim`` (everything else symbolic). Step 3, that ``M_k`` has no ``pos`` in
    it, is read off its entries (a definition, not a proof).

    Args:
        dim: the explicit even width for step 2 (2 to 8).
        sine_sign: the sign of the upper-right sine of each block; 1 is right; -1, the
            false neighbour, is the usual rotation convention, which turns the
            ``(sin, cos)`` plane the wrong way.

    Raises:
        ValueError: ``dim`` is not an even int between 2 and 8.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (2, 4, 6, 8):
        raise ValueError(f"dim must be one of 2, 4, 6, 8, got {dim!r}")
    omega = _omega()
    M = sp.diag(*[_rotation(K * _omega(i, dim), sine_sign) for i in range(dim // 2)])
    pe, pe_shifted = _explicit_pe(POS, dim), _explicit_pe(POS + K, dim)
    block = _rotation(K * omega, sine_sign)
    upper, lower = ("", "-") if sine_sign == 1 else ("-", "")
    return Proof(
        "A shift is a rotation",
        "For every offset $k$ there is one matrix $M_k$, independent of $pos$, made of "
        "$2\\times 2$ rotation blocks, with $PE(pos + k) = M_k\\,PE(pos)$.",
        (
            _TrigStep(
                "One pair, all of $pos, k, i, d, b$ symbolic: the angle-sum formulas",
                block * sinusoidal_pair(POS, omega),
                sinusoidal_pair(POS + K, omega),
                latex=(
                    f"\\begin{{pmatrix}}\\cos k\\omega_i & {upper}\\sin k\\omega_i\\\\ "
                    f"{lower}\\sin k\\omega_i & \\cos k\\omega_i\\end{{pmatrix}}"
                    "\\begin{pmatrix}\\sin pos\\,\\omega_i\\\\"
                    " \\cos pos\\,\\omega_i\\end{pmatrix} = \\begin{pmatrix}\\sin (pos+k)"
                    "\\omega_i\\\\ \\cos (pos+k)\\omega_i\\end{pmatrix},\\quad \\omega_i = "
                    + sp.latex(omega)
                ),
            ),
            _TrigStep(
                f"The whole vector written out, $d = {dim}$, block-diagonal $M_k$",
                M * pe,
                pe_shifted,
                latex=f"M_k\\,PE(pos) = PE(pos + k) \\quad (d = {dim})",
            ),
            Step(
                "$M_k$ is built from $k$ and the $\\omega_i$ alone: $pos$ does not occur in it",
                M.diff(POS),
                sp.zeros(dim, dim),
                latex="\\partial M_k / \\partial pos = 0",
                by_definition=True,
            ),
            _TrigStep(
                "Each block is orthogonal, with $k, i, d, b$ symbolic",
                block.T * block,
                sp.eye(2),
                latex="B_k^\\top B_k = I, \\quad B_k = "
                f"\\begin{{pmatrix}}\\cos k\\omega_i & {upper}\\sin k\\omega_i\\\\"
                f" {lower}\\sin k\\omega_i & \\cos k\\omega_i\\end{{pmatrix}}",
            ),
            _TrigStep(
                "and has determinant 1, so it is a rotation (no reflection)",
                block.det(),
                sp.Integer(1),
                latex="\\det B_k = 1",
            ),
            _TrigStep(
                "Shifts compose: shifting by $k$, then by $j$, is shifting by $j + k$",
                _rotation(J * omega, sine_sign) * block,
                _rotation((J + K) * omega, sine_sign),
                latex="B_j B_k = B_{j+k}",
            ),
        ),
    )


def _pair_dot(pos: sp.Expr, offset: sp.Expr, cos_offset: int) -> sp.Expr:
    """Pair ``i``'s share of ``PE(pos)·PE(pos + offset)``, ``i`` and ``d`` symbolic."""
    w_sin, w_cos = _omega(), _cos_omega(I_, D, cos_offset)
    first = sp.Matrix([sp.sin(pos * w_sin), sp.cos(pos * w_cos)])
    second = sp.Matrix([sp.sin((pos + offset) * w_sin), sp.cos((pos + offset) * w_cos)])
    return (first.T * second)[0]


def sinusoidal_dot_product(dim: int = 4, cos_offset: int = 0) -> Proof:
    """``PE(pos)·PE(pos + k) = Σ_i cos(k ω_i)``: a function of ``k`` alone, and even in ``k``.

    Step 1 proves the per-pair term for symbolic ``pos``, ``k``, ``i``, ``d``, ``b``;
    step 2 sums it over ``i = 0 .. d/2 - 1`` with ``d`` symbolic; step 3 checks the
    whole dot product written out for an explicit ``dim``; step 4 shows, with ``d``
    symbolic, that the offsets ``k`` and ``-k`` give the same dot product, so it cannot
    tell a key ``k`` positions before the query from one ``k`` positions after.

    Args:
        dim: the explicit even width for step 3 (2 to 8).
        cos_offset: added to the cosine column's exponent ``2i``; 0 is right; 1, the
            false neighbour, is source 003's table (column ``j`` gets ``b^{-j/d}``), whose
            dot product depends on ``pos``.

    Raises:
        ValueError: ``dim`` is not an even int between 2 and 8.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (2, 4, 6, 8):
        raise ValueError(f"dim must be one of 2, 4, 6, 8, got {dim!r}")
    omega = _omega()
    pairs = (I_, 0, D / 2 - 1)
    total = sp.Sum(sp.cos(K * omega), pairs)
    pe = _explicit_pe(POS, dim, cos_offset=cos_offset)
    pe_shifted = _explicit_pe(POS + K, dim, cos_offset=cos_offset)
    explicit_total = sum(sp.cos(K * _omega(i, dim)) for i in range(dim // 2))
    pair_term = (
        "\\sin(pos\\,\\omega_i)\\sin((pos{0})\\omega_i) + \\cos(pos\\,\\omega_i)\\cos((pos{0})"
        + ("\\omega_i)" if cos_offset == 0 else "\\omega'_i)")
    )
    return Proof(
        "The dot product sees only the offset",
        "$PE(pos)\\cdot PE(pos+k) = \\sum_{i=0}^{d/2-1} \\cos(k\\,\\omega_i)$, which does "
        "not involve $pos$ and is the same for $k$ and $-k$.",
        (
            _TrigStep(
                "One pair, all of $pos, k, i, d, b$ symbolic: "
                "$\\sin a \\sin c + \\cos a \\cos c = \\cos(c - a)$",
                _pair_dot(POS, K, cos_offset),
                sp.cos(K * omega),
            ),
            _TrigStep(
                "Summed over the $d/2$ pairs, $d$ symbolic: the summands agree term by term",
                sp.Sum(_pair_dot(POS, K, cos_offset), pairs),
                total,
                latex=(
                    "\\sum_{i=0}^{d/2-1}\\left["
                    + pair_term.format("+k")
                    + "\\right] = "
                    + sp.latex(total)
                ),
            ),
            _TrigStep(
                f"The whole vector written out, $d = {dim}$",
                (pe.T * pe_shifted)[0],
                explicit_total,
                latex=f"PE(pos)^\\top PE(pos+k) = {sp.latex(explicit_total)}",
            ),
            _TrigStep(
                "Even in $k$, $d$ symbolic: the offsets $k$ and $-k$ give the same dot product",
                sp.Sum(_pair_dot(POS, K, cos_offset), pairs),
                sp.Sum(_pair_dot(POS, -K, cos_offset), pairs),
                latex=(
                    "\\sum_{i=0}^{d/2-1}\\left["
                    + pair_term.format("+k")
                    + "\\right] = \\sum_{i=0}^{d/2-1}\\left["
                    + pair_term.format("-k")
                    + "\\right]"
                ),
            ),
        ),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "sinusoidal.frequency_exp_log_form",
        frequency_exp_log_form,
        lambda: frequency_exp_log_form(column_offset=1),
        (3,),
    ),
    ProofCase(
        "sinusoidal.sinusoidal_shift_is_rotation",
        sinusoidal_shift_is_rotation,
        lambda: sinusoidal_shift_is_rotation(sine_sign=-1),
        (1, 2),
    ),
    ProofCase(
        "sinusoidal.sinusoidal_dot_product",
        sinusoidal_dot_product,
        lambda: sinusoidal_dot_product(cos_offset=1),
        (1, 2, 3, 4),
    ),
)
"""Every proof of this module with its false neighbour and the steps where it fails."""
