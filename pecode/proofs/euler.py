"""Proofs about complex numbers and Euler's formula (chapter 7), the groundwork of RoPE.

Six claims, each a :class:`~pecode.proofs.core.Proof` whose steps sympy checks:

1. :func:`multiplication_by_i`: multiplying by ``i`` maps ``(a, b)`` to ``(-b, a)``,
   which is the rotation matrix at ``+π/2`` (computed from ``cos`` and ``sin``).
2. :func:`euler_formula`: the finite part of Euler's formula. For a symbolic number of
   terms, the partial sum ``Σ_{n=0}^{2N+1} (iθ)^n / n!`` equals
   ``Σ_{j=0}^{N} (-1)^j θ^{2j}/(2j)! + i Σ_{j=0}^{N} (-1)^j θ^{2j+1}/(2j+1)!``, by
   induction on ``N``. No step uses sympy's ``exp``, ``cos`` or ``sin``: the sums are
   polynomials in ``θ``. The limit ``N → ∞``, which turns this into
   ``e^{iθ} = cos θ + i sin θ``, is argued in prose in chapter 7 (the three series
   converge absolutely; the two real ones are the Taylor series of ``cos`` and ``sin``).
3. :func:`angle_addition`: ``cis(α) cis(β) = cis(α + β)`` and ``R(α) R(β) = R(α + β)``,
   with the angle-addition formulas of cosine and sine as its real and imaginary parts.
4. :func:`de_moivre`: ``cis(θ)^m = cis(mθ)`` for every integer ``m``: base case and
   induction step for a symbolic ``m ≥ 0`` (the step holds only with the induction
   hypothesis substituted), then ``-m`` through the inverse of a unit complex number,
   which is its conjugate.
5. :func:`rotation_preserves_length`: ``|cis(θ) z| = |z|``, and ``cis(θ)`` moves along
   the unit circle at unit speed.
6. :func:`relative_phase`: ``Re[q cis(mθ) conj(k cis(nθ))] = Re[q conj(k) cis((m-n)θ)]``,
   the one line that makes RoPE relative (proven in full in chapter 8).

``cis(x)`` is ``cos x + i sin x``. Every statement except Euler's formula is about
``cis``, the right-hand side of Euler's formula, and its steps are checked by
:func:`trig_residual`: multiplying out, the angle-addition formulas (``expand_trig``),
differentiation, and, in the steps that say so, ``cos² + sin² = 1``. Not ``simplify``,
which may rewrite ``cos`` and ``sin`` as ``exp`` and so prove a claim about ``cis``
with sympy's rules for ``e^{iθ}``, i.e. with Euler's formula (it proves De Moivre's
formula in one line). The steps of Euler's formula have no ``exp``, ``cos`` or ``sin``
on either side (polynomials in ``θ`` and powers of ``i``) and keep the default
residual. The tests check that computing any residual of this module builds no
``exp``. All symbols are real unless a step says otherwise. Every proof takes an
argument that turns it into its false neighbour (a plausibly wrong claim, same
derivation); :data:`CASES` lists where each one fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step

__all__ = [
    "CASES",
    "angle_addition",
    "cis",
    "de_moivre",
    "euler_formula",
    "multiplication_by_i",
    "relative_phase",
    "rotation_matrix",
    "rotation_preserves_length",
    "trig_residual",
]


def cis(angle: sp.Expr) -> sp.Expr:
    """``cos(angle) + i sin(angle)``: the point of the unit circle at ``angle`` radians."""
    return sp.cos(angle) + sp.I * sp.sin(angle)


def rotation_matrix(angle: sp.Expr) -> sp.Matrix:
    """The 2x2 matrix that turns the plane counterclockwise by ``angle`` radians.

    ``[[cos, -sin], [sin, cos]]``: column ``(a, b)`` goes to
    ``(a cos - b sin, a sin + b cos)``.
    """
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


def _pythagoras(expr: sp.Expr) -> sp.Expr:
    """Replace every ``sin(x)^k`` (``k ≥ 2``) by ``sin(x)^(k mod 2) (1 - cos(x)^2)^(k // 2)``.

    After this and ``expand``, a polynomial in ``cos x`` and ``sin x`` has ``sin x`` at
    most to the first power, so it is zero exactly when ``cos² + sin² = 1`` makes it so.
    """
    return expr.replace(
        lambda e: e.is_Pow and isinstance(e.base, sp.sin) and e.exp.is_Integer and e.exp >= 2,
        lambda e: e.base ** (e.exp % 2) * (1 - sp.cos(e.base.args[0]) ** 2) ** (e.exp // 2),
    )


def trig_residual(
    lhs: Any, rhs: Any, subs: Mapping[Any, Any] | None = None, pythagoras: bool = False
) -> Any:
    """``lhs - rhs`` reduced with algebra and the angle-addition formulas only.

    The difference (after ``subs``) is differentiated where it holds a derivative,
    multiplied out (``expand``, which also expands the arguments, so ``cos((m+1)θ)``
    becomes ``cos(mθ + θ)``), split by the angle-addition formulas (``expand_trig``),
    put over one denominator, and its numerator multiplied out again; with
    ``pythagoras``, ``cos² + sin² = 1`` is applied too. No ``simplify``: sympy's
    ``simplify`` may rewrite ``cos`` and ``sin`` as ``exp`` and then prove a statement
    about ``cos θ + i sin θ`` with its rules for ``e^{iθ}``, which is Euler's formula
    itself (it proves ``(cos θ + i sin θ)^m = cos mθ + i sin mθ`` in one line). Here a
    symbolic power such as ``(cos θ + i sin θ)^m`` stays as it is, so an induction step
    holds only with its hypothesis substituted.
    """
    diff = lhs - rhs
    if subs:
        diff = diff.subs(dict(subs))
    if diff.has(sp.Derivative):
        diff = diff.doit()  # the derivative rules of cos and sin

    def reduce(expr: sp.Expr) -> sp.Expr:
        numerator, denominator = sp.fraction(
            sp.together(sp.expand(sp.expand_trig(sp.expand(expr))))
        )
        numerator = sp.expand(numerator)
        if pythagoras:
            numerator = sp.expand(_pythagoras(numerator))
        return numerator / denominator

    if isinstance(diff, sp.MatrixBase):
        return diff.applyfunc(reduce)
    return reduce(sp.sympify(diff))


@dataclass(frozen=True)
class _TrigStep(Step):
    """A :class:`Step` checked by :func:`trig_residual` instead of ``simplify``.

    Every step of this module about ``cos`` and ``sin`` is one, so that none of them is
    proven by sympy's knowledge of ``e^{iθ}``. ``pythagoras=True`` lets the residual use
    ``cos² + sin² = 1`` as well; the steps that need it say so.
    """

    pythagoras: bool = False

    @cached_property
    def residual(self) -> Any:  # type: ignore[override]
        return trig_residual(self.lhs, self.rhs, self.subs, self.pythagoras)


def _real_part(w: sp.Expr) -> sp.Expr:
    """``(w + conj(w)) / 2``, left unexpanded so that the step's residual does the algebra.

    (``sympy.re`` of a product of real-symbol sums evaluates as it is built, which would
    put the answer into the step's side.)
    """
    return (w + sp.conjugate(w)) / 2


def _imag_part(w: sp.Expr) -> sp.Expr:
    """``(w - conj(w)) / (2i)``, left unexpanded, for the reason of :func:`_real_part`."""
    return (w - sp.conjugate(w)) / (2 * sp.I)


def multiplication_by_i(turn: sp.Expr = sp.pi / 2) -> Proof:
    """Multiplying by ``i`` turns a point of the plane by 90 degrees counterclockwise.

    With ``z = a + ib`` (``a, b`` real): sympy multiplies out ``i z = -b + ia``; the pair
    ``(Re iz, Im iz)`` equals ``R(φ) (a, b)`` with ``R`` built from ``cos φ`` and
    ``sin φ`` and ``φ = π/2`` substituted in the step (not typed as the matrix
    ``[[0, -1], [1, 0]]``); the map keeps lengths; and two such turns give ``-I``.
    Step 2 multiplies out ``Re`` and ``Im`` of ``iz`` (written as ``(w ± conj w)/2``) and
    evaluates ``cos`` and ``sin`` at the angle; step 4 is an evaluation ("by
    substitution"). Any angle other than ``π/2`` (mod ``2π``) fails step 2.

    Args:
        turn: the claimed angle of the rotation; ``-π/2`` (clockwise) is the false
            neighbour, which fails at step 2 only (it, too, squares to ``-I``); an angle
            such as ``π`` or ``π/4`` fails at steps 2 and 4.
    """
    a, b, phi = sp.symbols("a b phi", real=True)
    z = a + sp.I * b
    rotation = rotation_matrix(phi)
    turned = sp.I * z
    return Proof(
        "Multiplication by i",
        "Multiplying $z = a + ib$ by $i$ maps $(a, b)$ to $(-b, a)$, which is the rotation "
        f"by ${sp.latex(turn)}$: $R({sp.latex(turn)})$, computed from $\\cos$ and $\\sin$.",
        (
            _TrigStep(
                "Multiply out, with $i^2 = -1$",
                turned,
                -b + sp.I * a,
                latex="i\\,(a + ib) = -b + ia",
            ),
            _TrigStep(
                f"The pair $(\\operatorname{{Re}}, \\operatorname{{Im}})$ of $iz$ is the "
                f"rotation matrix $R(\\varphi)$ applied to $(a, b)$, at "
                f"$\\varphi = {sp.latex(turn)}$",
                sp.Matrix([_real_part(turned), _imag_part(turned)]),
                rotation * sp.Matrix([a, b]),
                subs={phi: turn},
                latex=(
                    "\\begin{pmatrix}\\operatorname{Re}(iz)\\\\ \\operatorname{Im}(iz)"
                    "\\end{pmatrix} = \\begin{pmatrix}\\cos\\varphi & -\\sin\\varphi\\\\ "
                    "\\sin\\varphi & \\cos\\varphi\\end{pmatrix}"
                    "\\begin{pmatrix}a\\\\ b\\end{pmatrix}, \\quad \\varphi = "
                    f"{sp.latex(turn)}"
                ),
            ),
            _TrigStep(
                "The turn keeps lengths: $|iz|^2 = |z|^2$",
                turned * sp.conjugate(turned),
                a**2 + b**2,
                latex="(iz)\\,\\overline{(iz)} = a^2 + b^2",
            ),
            _TrigStep(
                "Two such turns are a half turn, $R(\\varphi)^2 = -I$: that is $i^2 = -1$",
                rotation * rotation,
                -sp.eye(2),
                subs={phi: turn},
                latex=f"R(\\varphi)^2 = -I, \\quad \\varphi = {sp.latex(turn)}",
            ),
        ),
    )


def euler_formula(i_squared: int = -1) -> Proof:
    """The finite part of Euler's formula, for a symbolic number of terms.

    For every integer ``N ≥ 0`` and real ``θ``, with ``S_M = Σ_{n=0}^{M} (iθ)^n/n!``,
    ``C_N = Σ_{j=0}^{N} (-1)^j θ^{2j}/(2j)!`` and ``O_N = Σ_{j=0}^{N} (-1)^j θ^{2j+1}/(2j+1)!``:
    ``S_{2N+1} = C_N + i O_N``. Steps 1-2 are the summand identities for a symbolic index
    ``j`` (``i^{2j} = (-1)^j``, ``i^{2j+1} = i(-1)^j``); step 3 is the base case
    ``N = 0``; step 4 splits the last terms off a partial sum (any summand); step 5 is
    the induction step, with the hypothesis ``S_{2N+1} = C_N + i O_N`` substituted: the
    two terms ``n = 2N+2, 2N+3`` added on the left are the terms ``j = N+1`` added on
    the right. No step involves ``exp``, ``cos`` or ``sin``.

    What this does not prove: the limit. Letting ``N → ∞`` gives Euler's formula
    because all three series converge absolutely and the two real ones are the Taylor
    series of ``cos`` and ``sin``; chapter 7 argues it in prose.

    Args:
        i_squared: the value of ``i²`` behind the sign pattern, ``(i²)^j``. ``+1`` is
            the false neighbour, the all-plus reading ``cosh θ + i sinh θ``; it fails
            at steps 1, 2 and 5.
    """
    theta = sp.Symbol("theta", real=True)
    n, j, big_n = sp.symbols("n j N", integer=True, nonnegative=True)
    g, h = sp.Function("g"), sp.Function("h")

    def exp_term(index: sp.Expr) -> sp.Expr:
        return (sp.I * theta) ** index / sp.factorial(index)

    def cos_term(index: sp.Expr) -> sp.Expr:
        return i_squared**index * theta ** (2 * index) / sp.factorial(2 * index)

    def sin_term(index: sp.Expr) -> sp.Expr:
        return i_squared**index * theta ** (2 * index + 1) / sp.factorial(2 * index + 1)

    # Partial sums as symbolic Sums; the residuals only ever evaluate them with numeric
    # limits (N = 0) or after they cancel, so sympy never looks for a closed form.
    exp_sum = sp.Sum(exp_term(n), (n, 0, 2 * big_n + 1))
    cos_sum = sp.Sum(cos_term(j), (j, 0, big_n))
    sin_sum = sp.Sum(sin_term(j), (j, 0, big_n))

    def sign(index: str) -> str:
        # the factor (i²)^index in LaTeX
        return f"(-1)^{{{index}}}" if i_squared == -1 else f"{sp.latex(i_squared)}^{{{index}}}"

    sj, sn = sign("j"), sign("N+1")

    return Proof(
        "Euler's formula: the partial sums split into the cosine and sine series",
        "For every integer $N \\ge 0$ and real $\\theta$, $S_{2N+1} = C_N + iO_N$, where "
        "$S_M = \\sum_{n=0}^{M}\\frac{(i\\theta)^n}{n!}$, "
        f"$C_N = \\sum_{{j=0}}^{{N}} {sj}\\frac{{\\theta^{{2j}}}}{{(2j)!}}$ and "
        f"$O_N = \\sum_{{j=0}}^{{N}} {sj}\\frac{{\\theta^{{2j+1}}}}{{(2j+1)!}}$: "
        "by induction on $N$ (steps 3-5), with no knowledge of $\\exp$, $\\cos$ or $\\sin$.",
        (
            Step(
                "Powers of $i$ in pairs, for a symbolic integer $j \\ge 0$",
                sp.Matrix([sp.I ** (2 * j), sp.I ** (2 * j + 1)]),
                sp.Matrix([i_squared**j, sp.I * i_squared**j]),
                latex=f"\\left(i^{{2j}},\\ i^{{2j+1}}\\right) = \\left({sj},\\ i\\,{sj}\\right)",
            ),
            Step(
                "So the even terms of the exponential series at $i\\theta$ are the cosine "
                "terms and the odd ones $i$ times the sine terms",
                sp.Matrix([exp_term(2 * j), exp_term(2 * j + 1)]),
                sp.Matrix([cos_term(j), sp.I * sin_term(j)]),
                latex=(
                    "\\left(\\frac{(i\\theta)^{2j}}{(2j)!},\\ "
                    "\\frac{(i\\theta)^{2j+1}}{(2j+1)!}\\right) = "
                    f"\\left({sj}\\frac{{\\theta^{{2j}}}}{{(2j)!}},\\ "
                    f"i\\,{sj}\\frac{{\\theta^{{2j+1}}}}{{(2j+1)!}}\\right)"
                ),
            ),
            Step(
                "Base case $N = 0$: the sums have two terms on the left and one in each "
                "series on the right",
                exp_sum,
                cos_sum + sp.I * sin_sum,
                subs={big_n: 0},
                latex=(
                    "\\sum_{n=0}^{1}\\frac{(i\\theta)^n}{n!} = "
                    f"\\sum_{{j=0}}^{{0}} {sj}\\frac{{\\theta^{{2j}}}}{{(2j)!}} + "
                    f"i\\sum_{{j=0}}^{{0}} {sj}\\frac{{\\theta^{{2j+1}}}}{{(2j+1)!}}"
                ),
            ),
            Step(
                "From $N$ to $N + 1$ a partial sum gains its last terms (any summands "
                "$g$, $h$): two on the left, one in each series on the right",
                sp.Matrix([sp.Sum(g(n), (n, 0, 2 * big_n + 3)), sp.Sum(h(j), (j, 0, big_n + 1))]),
                sp.Matrix(
                    [
                        sp.Sum(g(n), (n, 0, 2 * big_n + 1))
                        + sp.Sum(g(n), (n, 2 * big_n + 2, 2 * big_n + 3)),
                        sp.Sum(h(j), (j, 0, big_n)) + sp.Sum(h(j), (j, big_n + 1, big_n + 1)),
                    ]
                ),
                latex=(
                    "\\sum_{n=0}^{2N+3} g(n) = \\sum_{n=0}^{2N+1} g(n) + "
                    "\\sum_{n=2N+2}^{2N+3} g(n), \\quad "
                    "\\sum_{j=0}^{N+1} h(j) = \\sum_{j=0}^{N} h(j) + \\sum_{j=N+1}^{N+1} h(j)"
                ),
            ),
            Step(
                "Induction step: substitute the hypothesis for $N$; the two new terms "
                "$n = 2N+2, 2N+3$ on the left are the new terms $j = N + 1$ on the right",
                # A 1x1 matrix: its residual is expanded before it is simplified, which
                # splits i^(2N+3) into i^3 i^(2N) (step 1 at j = N + 1).
                sp.Matrix([exp_sum + exp_term(2 * big_n + 2) + exp_term(2 * big_n + 3)]),
                sp.Matrix(
                    [cos_sum + cos_term(big_n + 1) + sp.I * sin_sum + sp.I * sin_term(big_n + 1)]
                ),
                subs={exp_sum: cos_sum + sp.I * sin_sum},
                latex=(
                    "\\underbrace{S_{2N+1}}_{= C_N + iO_N}"
                    " + \\frac{(i\\theta)^{2N+2}}{(2N+2)!} + \\frac{(i\\theta)^{2N+3}}{(2N+3)!}"
                    f" = C_N + {sn}\\frac{{\\theta^{{2N+2}}}}{{(2N+2)!}}"
                    f" + i\\left(O_N + {sn}"
                    "\\frac{\\theta^{2N+3}}{(2N+3)!}\\right)"
                ),
            ),
        ),
    )


def angle_addition(sign: int = -1) -> Proof:
    """Multiplying unit complex numbers adds their angles.

    ``cis(α) cis(β) = cis(α + β)``: sympy multiplies out the product, and its real and
    imaginary parts are the angle-addition formulas of cosine and sine; in matrix form,
    ``R(α) R(β) = R(α + β)`` (explicit 2x2 matrices with symbolic entries, multiplied).
    The real formulas themselves are sympy's (``expand_trig`` expands ``cos(α + β)`` and
    ``sin(α + β)`` in :func:`trig_residual`): what is proven is that multiplying unit
    complex numbers, or rotation matrices, performs exactly them.

    Args:
        sign: the sign of ``sin α sin β`` in the cosine of the sum. ``+1`` is the false
            neighbour ``cos(α + β) = cos α cos β + sin α sin β``; it fails at steps 1
            and 2.
    """
    alpha, beta = sp.symbols("alpha beta", real=True)
    cos_part = sp.cos(alpha) * sp.cos(beta) + sign * sp.sin(alpha) * sp.sin(beta)
    sin_part = sp.sin(alpha) * sp.cos(beta) + sp.cos(alpha) * sp.sin(beta)
    sign_tex = "-" if sign == -1 else "+"
    cos_tex = f"\\cos\\alpha\\cos\\beta {sign_tex} \\sin\\alpha\\sin\\beta"
    return Proof(
        "Multiplying unit complex numbers adds angles",
        "$(\\cos\\alpha + i\\sin\\alpha)(\\cos\\beta + i\\sin\\beta) = "
        "\\cos(\\alpha + \\beta) + i\\sin(\\alpha + \\beta)$ for all real $\\alpha, \\beta$, "
        f"with real part ${cos_tex}$.",
        (
            _TrigStep(
                "Multiply out the two unit complex numbers",
                cis(alpha) * cis(beta),
                cos_part + sp.I * sin_part,
                latex=(
                    "(\\cos\\alpha + i\\sin\\alpha)(\\cos\\beta + i\\sin\\beta) = "
                    f"({cos_tex}) + "
                    "i(\\sin\\alpha\\cos\\beta + \\cos\\alpha\\sin\\beta)"
                ),
            ),
            _TrigStep(
                "The real part is the cosine of the sum",
                cos_part,
                sp.cos(alpha + beta),
                latex=f"{cos_tex} = \\cos(\\alpha + \\beta)",
            ),
            _TrigStep(
                "The imaginary part is the sine of the sum",
                sin_part,
                sp.sin(alpha + beta),
                latex="\\sin\\alpha\\cos\\beta + \\cos\\alpha\\sin\\beta = \\sin(\\alpha + \\beta)",
            ),
            _TrigStep(
                "So the product is the unit complex number at angle $\\alpha + \\beta$",
                cis(alpha) * cis(beta),
                cis(alpha + beta),
                latex=(
                    "(\\cos\\alpha + i\\sin\\alpha)(\\cos\\beta + i\\sin\\beta) = "
                    "\\cos(\\alpha + \\beta) + i\\sin(\\alpha + \\beta)"
                ),
            ),
            _TrigStep(
                "The same in matrix form: rotations compose by adding angles",
                rotation_matrix(alpha) * rotation_matrix(beta),
                rotation_matrix(alpha + beta),
                latex="R(\\alpha)R(\\beta) = R(\\alpha + \\beta)",
            ),
        ),
    )


def de_moivre(sine_sign: int = 1) -> Proof:
    """De Moivre's formula ``cis(θ)^m = cis(mθ)`` for every integer ``m``.

    Steps 1-2 prove it for every integer ``m ≥ 0`` by induction on a symbolic ``m``:
    the base case ``m = 0`` (an evaluation: ``m = 0`` substituted into both sides), and
    the induction step, where the hypothesis ``cis(θ)^m = cis(mθ)`` is substituted into
    ``cis(θ)^m cis(θ)``, the product is multiplied out and ``cos((m+1)θ)``,
    ``sin((m+1)θ)`` are split by the angle-addition formulas. Step 3: the inverse of a
    unit complex number is its conjugate (``cos² + sin² = 1``). Step 4 covers negative
    exponents: ``cis(θ)^(-m) = 1 / cis(mθ) = cis(-mθ)``, with the ``m ≥ 0`` case
    substituted.

    Every step is checked by :func:`trig_residual`, which knows only algebra, the
    angle-addition formulas and (steps 3-4) ``cos² + sin² = 1``; it cannot simplify the
    symbolic power ``cis(θ)^m``, so steps 2 and 4 fail without the hypothesis. (sympy's
    ``simplify`` would prove ``cis(θ)^m = cis(mθ)`` outright, through ``exp``.)

    Args:
        sine_sign: the sign of ``i sin(mθ)`` in the claim. ``-1`` is the false neighbour
            ``cis(θ)^m = cos mθ - i sin mθ``, which holds at ``m = 0`` and fails at the
            induction step (step 2) only.
    """
    theta = sp.Symbol("theta", real=True)
    m = sp.Symbol("m", integer=True, nonnegative=True)
    unit = cis(theta)

    def claim(multiple: sp.Expr) -> sp.Expr:
        return sp.cos(multiple * theta) + sine_sign * sp.I * sp.sin(multiple * theta)

    sign_tex = "+" if sine_sign == 1 else "-"

    def claim_tex(angle: str) -> str:
        return f"\\cos {angle} {sign_tex} i\\sin {angle}"

    at_0, at_m = claim_tex("0"), claim_tex("m\\theta")
    at_next, at_minus = claim_tex("(m+1)\\theta"), claim_tex("(-m\\theta)")

    return Proof(
        "De Moivre's formula",
        f"$(\\cos\\theta + i\\sin\\theta)^m = {at_m}$ for every integer $m$ "
        "and real $\\theta$: by induction for $m \\ge 0$ (steps 1-2), and for $-m$ "
        "through the inverse (steps 3-4).",
        (
            _TrigStep(
                "Base case $m = 0$",
                unit**m,
                claim(m),
                subs={m: 0},
                latex=f"(\\cos\\theta + i\\sin\\theta)^0 = 1 = {at_0}",
            ),
            _TrigStep(
                "Induction step: substitute the hypothesis for $m$ and multiply once "
                "more; the angle-addition formulas give the angle $(m + 1)\\theta$",
                unit**m * unit,
                claim(m + 1),
                subs={unit**m: claim(m)},
                latex=(
                    "(\\cos\\theta + i\\sin\\theta)^m(\\cos\\theta + i\\sin\\theta) = "
                    f"({at_m})(\\cos\\theta + i\\sin\\theta) = "
                    f"{at_next}"
                ),
            ),
            _TrigStep(
                "The inverse of a unit complex number is its conjugate, the point at "
                "$-\\theta$, since $\\cos^2\\theta + \\sin^2\\theta = 1$",
                1 / unit,
                sp.conjugate(unit),
                pythagoras=True,
                latex=(
                    "\\frac{1}{\\cos\\theta + i\\sin\\theta} = "
                    "\\overline{\\cos\\theta + i\\sin\\theta} = \\cos\\theta - i\\sin\\theta"
                ),
            ),
            _TrigStep(
                "Negative exponents, $m \\ge 0$: substitute the case $m$ and invert it as "
                "in step 3, at the angle $m\\theta$",
                unit ** (-m),
                claim(-m),
                subs={unit**m: claim(m)},
                pythagoras=True,
                latex=(
                    f"(\\cos\\theta + i\\sin\\theta)^{{-m}} = \\frac{{1}}{{{at_m}}} = {at_minus}"
                ),
            ),
        ),
    )


def rotation_preserves_length(radius: sp.Expr | int = 1) -> Proof:
    """Multiplying by ``cis(θ)`` keeps the length of every complex number.

    For ``z = a + ib``: sympy multiplies out ``cis(θ) z`` and finds ``R(θ) (a, b)``;
    ``|cis(θ) z|² = |z|²``; ``R(θ)`` is orthogonal. The last two steps say why ``θ`` is
    an angle: the velocity ``d/dθ (cos θ, sin θ)`` is the position turned by 90° (the
    pair of ``i cis(θ)``; sympy differentiates), and it has length 1, so the point runs
    along the unit circle at unit speed and has travelled the arc length ``θ``. Steps
    2, 3 and 5 use ``cos² + sin² = 1`` (see :func:`trig_residual`).

    Args:
        radius: the modulus of the multiplier ``radius · cis(θ)``. Any value other than
            1 is a false neighbour (the claim that every multiplication keeps lengths);
            ``2`` fails at steps 1, 2 and 5.
    """
    radius = sp.sympify(radius)
    a, b, theta = sp.symbols("a b theta", real=True)
    z = a + sp.I * b
    multiplier = radius * cis(theta)
    turned = rotation_matrix(theta) * sp.Matrix([a, b])
    position = sp.Matrix([radius * sp.cos(theta), radius * sp.sin(theta)])
    velocity = sp.I * multiplier
    factor = "" if radius == 1 else sp.latex(radius)
    return Proof(
        "Rotation preserves length",
        f"$|{factor}(\\cos\\theta + i\\sin\\theta)\\, z| = |z|$ for every complex $z$ "
        "and real $\\theta$.",
        (
            _TrigStep(
                f"Multiplying by ${factor}(\\cos\\theta + i\\sin\\theta)$ applies the "
                "rotation matrix to $(a, b)$",
                multiplier * z,
                turned[0] + sp.I * turned[1],
                latex=(
                    f"{factor}(\\cos\\theta + i\\sin\\theta)(a + ib) = "
                    "(a\\cos\\theta - b\\sin\\theta) + i(a\\sin\\theta + b\\cos\\theta)"
                ),
            ),
            _TrigStep(
                "Its squared length is that of $z$, since $\\cos^2\\theta + \\sin^2\\theta = 1$",
                multiplier * z * sp.conjugate(multiplier * z),
                z * sp.conjugate(z),
                pythagoras=True,
                latex=(
                    f"\\left|{factor}(\\cos\\theta + i\\sin\\theta)\\,z\\right|^2 = "
                    "(a + ib)(a - ib)"
                ),
            ),
            _TrigStep(
                "Equivalently, $R(\\theta)$ is orthogonal, by the same identity",
                rotation_matrix(theta).T * rotation_matrix(theta),
                sp.eye(2),
                pythagoras=True,
                latex="R(\\theta)^\\top R(\\theta) = I",
            ),
            _TrigStep(
                "The velocity of the point is the position multiplied by $i$, i.e. turned by 90°",
                sp.Matrix([sp.Derivative(coordinate, theta) for coordinate in position]),
                sp.Matrix([_real_part(velocity), _imag_part(velocity)]),
                latex=(
                    f"\\frac{{d}}{{d\\theta}}\\,{factor}(\\cos\\theta, \\sin\\theta) = "
                    "(\\operatorname{Re}, \\operatorname{Im})\\,"
                    f"\\bigl(i\\,{factor}(\\cos\\theta + i\\sin\\theta)\\bigr)"
                ),
            ),
            _TrigStep(
                "and has length 1, by the same identity, so after time $\\theta$ the point "
                "has travelled an arc of length $\\theta$ on the unit circle",
                velocity * sp.conjugate(velocity),
                1,
                pythagoras=True,
                latex=(f"\\left|i\\,{factor}(\\cos\\theta + i\\sin\\theta)\\right|^2 = 1"),
            ),
        ),
    )


def relative_phase(conjugate: bool = True) -> Proof:
    """The one line that makes RoPE relative, for one pair of features.

    Write a query pair as ``q = q0 + i q1`` and a key pair as ``k = k0 + i k1``; place
    the query at position ``m`` and the key at ``n`` by turning them by ``mθ`` and
    ``nθ``. Then the real dot product of the turned pairs is
    ``Re[q cis(mθ) conj(k cis(nθ))] = Re[q conj(k) cis((m-n)θ)]``: it depends on the
    positions only through ``m - n`` (Su et al. 2024, §3.2.1, the 2D case).
    ``Re w`` is written ``(w + conj(w))/2`` and sympy multiplies it out. Chapter 8
    proves the general ``d``-dimensional statement.

    Args:
        conjugate: whether the key is conjugated. ``False`` is the false neighbour
            (``Re[x y]`` for the dot product, so the angles add); it fails at steps 1,
            2 and 4.
    """
    q0, q1, k0, k1, m, n, theta, shift = sp.symbols("q_0 q_1 k_0 k_1 m n theta s", real=True)
    x0, x1, y0, y1 = sp.symbols("x_0 x_1 y_0 y_1", real=True)
    q = q0 + sp.I * q1
    k = k0 + sp.I * k1

    def bar(w: sp.Expr) -> sp.Expr:
        return sp.conjugate(w) if conjugate else w

    def score(query_pos: sp.Expr, key_pos: sp.Expr) -> sp.Expr:
        return _real_part(q * cis(query_pos * theta) * bar(k * cis(key_pos * theta)))

    q_pair, k_pair = sp.Matrix([q0, q1]), sp.Matrix([k0, k1])
    bar_k = "\\bar k" if conjugate else "k"
    bar_y = "\\bar y" if conjugate else "y"
    return Proof(
        "The score of turned pairs depends on m - n",
        "$\\operatorname{Re}[q e^{im\\theta}\\,"
        + ("\\overline{k e^{in\\theta}}" if conjugate else "k e^{in\\theta}")
        + f"] = \\operatorname{{Re}}[q{bar_k}\\, e^{{i(m-n)\\theta}}]$ for real "
        "$m, n, \\theta$ and complex $q, k$, where $e^{ix}$ stands for "
        "$\\cos x + i\\sin x$.",
        (
            _TrigStep(
                "The real part of $x\\bar y$ is the dot product of the pairs "
                "$(\\operatorname{Re}, \\operatorname{Im})$",
                _real_part((x0 + sp.I * x1) * bar(y0 + sp.I * y1)),
                x0 * y0 + x1 * y1,
                latex=f"\\operatorname{{Re}}[x{bar_y}] = x_0 y_0 + x_1 y_1",
            ),
            _TrigStep(
                "The conjugate turns the key backwards, so the two angles subtract",
                score(m, n),
                _real_part(q * bar(k) * cis((m - n) * theta)),
                latex=(
                    "\\operatorname{Re}[q e^{im\\theta}\\,"
                    + ("\\overline{k e^{in\\theta}}" if conjugate else "k e^{in\\theta}")
                    + f"] = \\operatorname{{Re}}[q{bar_k}\\, e^{{i(m-n)\\theta}}]"
                ),
            ),
            _TrigStep(
                "In matrix form: the dot product of the turned pairs",
                (rotation_matrix(m * theta) * q_pair).dot(rotation_matrix(n * theta) * k_pair),
                (q_pair.T * rotation_matrix((n - m) * theta) * k_pair)[0],
                latex=(
                    "\\langle R(m\\theta)q, R(n\\theta)k\\rangle = q^\\top R((n-m)\\theta)\\, k"
                ),
            ),
            _TrigStep(
                "Shifting both positions by the same $s$ changes nothing, since "
                "$\\cos^2 s\\theta + \\sin^2 s\\theta = 1$",
                score(m + shift, n + shift),
                score(m, n),
                pythagoras=True,
                latex=(
                    "\\operatorname{Re}[q e^{i(m+s)\\theta}\\,"
                    + ("\\overline{k e^{i(n+s)\\theta}}" if conjugate else "k e^{i(n+s)\\theta}")
                    + "] = \\operatorname{Re}[q e^{im\\theta}\\,"
                    + ("\\overline{k e^{in\\theta}}" if conjugate else "k e^{in\\theta}")
                    + "]"
                ),
            ),
        ),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "euler.multiplication_by_i",
        multiplication_by_i,
        lambda: multiplication_by_i(turn=-sp.pi / 2),
        (2,),
    ),
    ProofCase(
        "euler.euler_formula",
        euler_formula,
        lambda: euler_formula(i_squared=1),
        (1, 2, 5),
    ),
    ProofCase(
        "euler.angle_addition",
        angle_addition,
        lambda: angle_addition(sign=1),
        (1, 2),
    ),
    ProofCase(
        "euler.de_moivre",
        de_moivre,
        lambda: de_moivre(sine_sign=-1),
        (2,),
    ),
    ProofCase(
        "euler.rotation_preserves_length",
        rotation_preserves_length,
        lambda: rotation_preserves_length(radius=2),
        (1, 2, 5),
    ),
    ProofCase(
        "euler.relative_phase",
        relative_phase,
        lambda: relative_phase(conjugate=False),
        (1, 2, 4),
    ),
)
"""Every proof of this module with its false neighbour and the steps where it fails."""
