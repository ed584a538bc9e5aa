"""Proofs about complex numbers and Euler's formula (chapter 7), the groundwork of RoPE.

Five claims, each a :class:`~pecode.proofs.core.Proof`:

1. :func:`multiplication_by_i`: multiplying by ``i`` maps ``(a, b)`` to ``(-b, a)``,
   the rotation by 90 degrees.
2. :func:`euler_formula`: ``exp(iθ) = cos θ + i sin θ``, from the Taylor series split
   into even and odd terms (term by term for a symbolic index ``k``).
3. :func:`angle_addition`: ``exp(iα) exp(iβ) = exp(i(α + β))``, and with it the
   angle-addition formulas of cosine and sine.
4. :func:`rotation_preserves_length`: ``|exp(iθ) z| = |z|``, and ``exp(iθ)`` moves
   along the unit circle at unit speed.
5. :func:`relative_phase`: ``Re[q e^{imθ} conj(k e^{inθ})] = Re[q conj(k) e^{i(m-n)θ}]``,
   the one line that makes RoPE relative (proven in full in chapter 8).

All symbols are real unless a step says otherwise; ``cis(x)`` below is
``cos x + i sin x``, the right-hand side of Euler's formula, so the steps that use it do
not lean on sympy's own knowledge of ``exp`` of an imaginary number.
"""

from __future__ import annotations

import sympy as sp

from pecode.proofs.core import Proof, Step

__all__ = [
    "angle_addition",
    "cis",
    "euler_formula",
    "multiplication_by_i",
    "relative_phase",
    "rotation_matrix",
    "rotation_preserves_length",
]

_MAX_ORDER = 40


def cis(angle: sp.Expr) -> sp.Expr:
    """``cos(angle) + i sin(angle)``: the point of the unit circle at ``angle`` radians."""
    return sp.cos(angle) + sp.I * sp.sin(angle)


def rotation_matrix(angle: sp.Expr) -> sp.Matrix:
    """The 2x2 matrix that turns the plane counterclockwise by ``angle`` radians.

    ``[[cos, -sin], [sin, cos]]``: column ``(a, b)`` goes to
    ``(a cos - b sin, a sin + b cos)``.
    """
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


def _as_pair(z: sp.Expr) -> sp.Matrix:
    """Column ``(Re z, Im z)`` of a complex sympy expression in real symbols."""
    expanded = sp.expand_complex(z)
    return sp.Matrix([sp.re(expanded), sp.im(expanded)])


def multiplication_by_i() -> Proof:
    """Multiplying by ``i`` turns a point of the plane by 90 degrees counterclockwise.

    With ``z = a + ib`` (``a, b`` real): ``i z = -b + ia``, i.e. ``(a, b) -> (-b, a)``;
    that map is the matrix ``[[0, -1], [1, 0]]``, which is the rotation matrix at
    ``π/2``; it keeps lengths; and doing it twice gives ``-1`` (a half turn), which is
    why ``i² = -1``.
    """
    a, b = sp.symbols("a b", real=True)
    z = a + sp.I * b
    quarter_turn = sp.Matrix([[0, -1], [1, 0]])
    pair = sp.Matrix([a, b])
    return Proof(
        "Multiplication by i",
        "Multiplying $z = a + ib$ by $i$ maps $(a, b)$ to $(-b, a)$: a rotation by 90°.",
        (
            Step(
                "Expand the product with $i^2 = -1$",
                sp.expand(sp.I * z),
                -b + sp.I * a,
                latex="i\\,(a + ib) = -b + ia",
            ),
            Step(
                "As a map of the plane, $(\\operatorname{Re}, \\operatorname{Im})$ of $iz$ is "
                "the matrix $J$ applied to $(a, b)$",
                _as_pair(sp.I * z),
                quarter_turn * pair,
                latex=(
                    "\\begin{pmatrix}\\operatorname{Re}(iz)\\\\ \\operatorname{Im}(iz)"
                    "\\end{pmatrix} = \\begin{pmatrix}0 & -1\\\\ 1 & 0\\end{pmatrix}"
                    "\\begin{pmatrix}a\\\\ b\\end{pmatrix}"
                ),
            ),
            Step(
                "$J$ is the rotation matrix at $\\theta = \\pi/2$",
                quarter_turn,
                rotation_matrix(sp.pi / 2),
                latex=(
                    "\\begin{pmatrix}0 & -1\\\\ 1 & 0\\end{pmatrix} = "
                    "\\begin{pmatrix}\\cos\\frac{\\pi}{2} & -\\sin\\frac{\\pi}{2}\\\\ "
                    "\\sin\\frac{\\pi}{2} & \\cos\\frac{\\pi}{2}\\end{pmatrix}"
                ),
            ),
            Step(
                "The turn keeps lengths: $|iz|^2 = |z|^2$",
                sp.expand(sp.I * z * sp.conjugate(sp.I * z)),
                a**2 + b**2,
                latex="|iz|^2 = a^2 + b^2 = |z|^2",
            ),
            Step(
                "Two quarter turns are a half turn, $J^2 = -I$: that is $i^2 = -1$",
                quarter_turn * quarter_turn,
                -sp.eye(2),
                latex="J^2 = -I",
            ),
        ),
    )


def _check_order(order: int) -> None:
    if isinstance(order, bool) or not isinstance(order, int):
        raise TypeError(f"order must be an int, got {type(order).__name__}")
    if not 0 <= order <= _MAX_ORDER:
        raise ValueError(f"order must be between 0 and {_MAX_ORDER}, got {order}")


def euler_formula(order: int = 9) -> Proof:
    """Euler's formula ``exp(iθ) = cos θ + i sin θ`` from the Taylor series.

    Steps 1-4 hold for a symbolic index ``k ≥ 0``: the even terms of the series of
    ``exp(iθ)`` are the terms of the cosine series, the odd terms ``i`` times those of
    the sine series. Step 5 checks the truncated sums for the given ``order`` against
    ``sympy.series`` of ``cos`` and ``sin`` (computed by sympy from derivatives, so an
    independent reference). Steps 6-8 sum the three infinite series with
    ``sympy.summation``. Regrouping an infinite series into its even and odd terms is
    allowed because the exponential series converges absolutely for every complex
    argument.

    Args:
        order: highest power ``n`` kept in the partial sum ``Σ_{n≤order} (iθ)^n / n!``
            of step 5 (0 to 40).

    Raises:
        TypeError: ``order`` is not an int.
        ValueError: ``order`` is out of range.
    """
    _check_order(order)
    theta = sp.Symbol("theta", real=True)
    k = sp.Symbol("k", integer=True, nonnegative=True)
    n = sp.Symbol("n", integer=True, nonnegative=True)

    even_term = (sp.I * theta) ** (2 * k) / sp.factorial(2 * k)
    odd_term = (sp.I * theta) ** (2 * k + 1) / sp.factorial(2 * k + 1)
    cos_term = (-1) ** k * theta ** (2 * k) / sp.factorial(2 * k)
    sin_term = (-1) ** k * theta ** (2 * k + 1) / sp.factorial(2 * k + 1)

    def split_powers(expr: sp.Expr) -> sp.Expr:
        # i^(2k+1) -> i * i^(2k): sympy keeps the power whole unless asked
        return sp.expand(expr, power_base=True, power_exp=True, mul=False, multinomial=False)

    partial = sp.expand(sum((sp.I * theta) ** j / sp.factorial(j) for j in range(order + 1)))
    cos_series = sp.series(sp.cos(theta), theta, 0, order + 1).removeO()
    sin_series = sp.series(sp.sin(theta), theta, 0, order + 1).removeO()

    exp_sum = sp.summation((sp.I * theta) ** n / sp.factorial(n), (n, 0, sp.oo))
    cos_sum = sp.summation(cos_term, (k, 0, sp.oo))
    sin_sum = sp.summation(sin_term, (k, 0, sp.oo))

    return Proof(
        "Euler's formula",
        "$e^{i\\theta} = \\cos\\theta + i\\sin\\theta$ for every real $\\theta$.",
        (
            Step(
                "Even powers of $i$ alternate in sign (symbolic integer $k \\ge 0$)",
                sp.I ** (2 * k),
                (-1) ** k,
                latex="i^{2k} = (i^2)^k = (-1)^k",
            ),
            Step(
                "Odd powers are $i$ times an even power",
                split_powers(sp.I ** (2 * k + 1)),
                sp.I * (-1) ** k,
                latex="i^{2k+1} = i\\,(-1)^k",
            ),
            Step(
                "So the even terms of the series of $e^{i\\theta}$ are the cosine terms",
                split_powers(even_term),
                cos_term,
                latex=("\\frac{(i\\theta)^{2k}}{(2k)!} = (-1)^k\\frac{\\theta^{2k}}{(2k)!}"),
            ),
            Step(
                "and the odd terms are $i$ times the sine terms",
                split_powers(odd_term),
                sp.I * sin_term,
                latex=(
                    "\\frac{(i\\theta)^{2k+1}}{(2k+1)!} = i\\,(-1)^k\\frac{\\theta^{2k+1}}{(2k+1)!}"
                ),
            ),
            Step(
                f"Truncated at $n = {order}$, the partial sum is sympy's Taylor polynomial "
                "of $\\cos$ plus $i$ times that of $\\sin$",
                partial,
                cos_series + sp.I * sin_series,
                latex=(
                    f"\\sum_{{n=0}}^{{{order}}} \\frac{{(i\\theta)^n}}{{n!}} = "
                    f"{sp.latex(cos_series)} + i\\left({sp.latex(sin_series)}\\right)"
                ),
            ),
            Step(
                "The even terms sum to $\\cos\\theta$",
                cos_sum,
                sp.cos(theta),
                latex=("\\sum_{k=0}^{\\infty} (-1)^k\\frac{\\theta^{2k}}{(2k)!} = \\cos\\theta"),
            ),
            Step(
                "The odd terms (without the $i$) sum to $\\sin\\theta$",
                sin_sum,
                sp.sin(theta),
                latex=(
                    "\\sum_{k=0}^{\\infty} (-1)^k\\frac{\\theta^{2k+1}}{(2k+1)!} = \\sin\\theta"
                ),
            ),
            Step(
                "The whole series is the exponential, and it equals even part plus "
                "$i$ times odd part",
                exp_sum,
                cos_sum + sp.I * sin_sum,
                latex=(
                    "e^{i\\theta} = \\sum_{n=0}^{\\infty}\\frac{(i\\theta)^n}{n!} = "
                    "\\cos\\theta + i\\sin\\theta"
                ),
            ),
        ),
    )


def angle_addition() -> Proof:
    """Multiplying unit complex numbers adds their angles.

    ``cis(α) cis(β) = cis(α + β)``, i.e. ``exp(iα) exp(iβ) = exp(i(α + β))``; its real
    and imaginary parts are the angle-addition formulas of cosine and sine, and its
    matrix form is ``R(α) R(β) = R(α + β)``. Repeating it gives de Moivre's formula,
    checked here for ``m = 2, 3``.
    """
    alpha, beta, theta = sp.symbols("alpha beta theta", real=True)
    product = sp.expand(cis(alpha) * cis(beta))
    cos_part = sp.cos(alpha) * sp.cos(beta) - sp.sin(alpha) * sp.sin(beta)
    sin_part = sp.sin(alpha) * sp.cos(beta) + sp.cos(alpha) * sp.sin(beta)
    return Proof(
        "Multiplying unit complex numbers adds angles",
        "$e^{i\\alpha} e^{i\\beta} = e^{i(\\alpha + \\beta)}$ for all real $\\alpha, \\beta$.",
        (
            Step(
                "Expand the product of the two Euler forms",
                product,
                cos_part + sp.I * sin_part,
                latex=(
                    "(\\cos\\alpha + i\\sin\\alpha)(\\cos\\beta + i\\sin\\beta) = "
                    "(\\cos\\alpha\\cos\\beta - \\sin\\alpha\\sin\\beta) + "
                    "i(\\sin\\alpha\\cos\\beta + \\cos\\alpha\\sin\\beta)"
                ),
            ),
            Step(
                "The real part is the cosine of the sum",
                cos_part,
                sp.cos(alpha + beta),
                latex="\\cos\\alpha\\cos\\beta - \\sin\\alpha\\sin\\beta = \\cos(\\alpha + \\beta)",
            ),
            Step(
                "The imaginary part is the sine of the sum",
                sin_part,
                sp.sin(alpha + beta),
                latex="\\sin\\alpha\\cos\\beta + \\cos\\alpha\\sin\\beta = \\sin(\\alpha + \\beta)",
            ),
            Step(
                "So the product is the unit complex number at angle $\\alpha + \\beta$",
                product,
                cis(alpha + beta),
                latex="e^{i\\alpha}e^{i\\beta} = e^{i(\\alpha+\\beta)}",
            ),
            Step(
                "The same in matrix form: rotations compose by adding angles",
                rotation_matrix(alpha) * rotation_matrix(beta),
                rotation_matrix(alpha + beta),
                latex="R(\\alpha)R(\\beta) = R(\\alpha + \\beta)",
            ),
            Step(
                "Repeating it, $m$ steps of $\\theta$ are one step of $m\\theta$ "
                "(de Moivre, $m = 2, 3$)",
                sp.Matrix([sp.expand(cis(theta) ** 2), sp.expand(cis(theta) ** 3)]),
                sp.Matrix([cis(2 * theta), cis(3 * theta)]),
                latex="(e^{i\\theta})^m = e^{im\\theta}, \\quad m = 2, 3",
            ),
        ),
    )


def rotation_preserves_length() -> Proof:
    """Multiplying by ``exp(iθ)`` keeps the length of every complex number.

    For ``z = a + ib``: ``exp(iθ) z = (a cos θ - b sin θ) + i (a sin θ + b cos θ)``,
    which is ``R(θ) (a, b)``; its squared length is ``a² + b²``; ``R(θ)`` is orthogonal.
    The last two steps say why ``θ`` is an angle: ``d/dθ exp(iθ) = i exp(iθ)``, a
    velocity perpendicular to the position and of length 1, so the point runs along
    the unit circle at unit speed and has travelled the arc length ``θ``.
    """
    a, b, theta = sp.symbols("a b theta", real=True)
    z = a + sp.I * b
    rotated = sp.expand(cis(theta) * z)
    rotated_pair = sp.Matrix(
        [a * sp.cos(theta) - b * sp.sin(theta), a * sp.sin(theta) + b * sp.cos(theta)]
    )
    velocity = sp.diff(cis(theta), theta)
    return Proof(
        "Rotation preserves length",
        "$|e^{i\\theta} z| = |z|$ for every complex $z$ and real $\\theta$.",
        (
            Step(
                "Multiplying by $e^{i\\theta}$ applies the rotation matrix to $(a, b)$",
                _as_pair(rotated),
                rotation_matrix(theta) * sp.Matrix([a, b]),
                latex=(
                    "\\begin{pmatrix}\\operatorname{Re}(e^{i\\theta}z)\\\\ "
                    "\\operatorname{Im}(e^{i\\theta}z)\\end{pmatrix} = R(\\theta)"
                    "\\begin{pmatrix}a\\\\ b\\end{pmatrix}"
                ),
            ),
            Step(
                "Its squared length is that of $z$",
                (rotated_pair.T * rotated_pair)[0],
                a**2 + b**2,
                latex=(
                    "(a\\cos\\theta - b\\sin\\theta)^2 + (a\\sin\\theta + b\\cos\\theta)^2 "
                    "= a^2 + b^2"
                ),
            ),
            Step(
                "Equivalently, $R(\\theta)$ is orthogonal",
                rotation_matrix(theta).T * rotation_matrix(theta),
                sp.eye(2),
                latex="R(\\theta)^\\top R(\\theta) = I",
            ),
            Step(
                "The derivative of $e^{i\\theta}$ is $i$ times itself: the velocity is the "
                "position turned by 90°",
                velocity,
                sp.I * cis(theta),
                latex="\\frac{d}{d\\theta}e^{i\\theta} = i\\,e^{i\\theta}",
            ),
            Step(
                "and has length 1, so after time $\\theta$ the point has travelled an arc "
                "of length $\\theta$ on the unit circle",
                sp.expand(velocity * sp.conjugate(velocity)),
                1,
                latex="\\left|\\frac{d}{d\\theta}e^{i\\theta}\\right|^2 = 1",
            ),
        ),
    )


def relative_phase() -> Proof:
    """The one line that makes RoPE relative, for one pair of features.

    Write a query pair as ``q = q0 + i q1`` and a key pair as ``k = k0 + i k1``; place
    the query at position ``m`` and the key at ``n`` by turning them by ``mθ`` and
    ``nθ``. Then the real dot product of the turned pairs is
    ``Re[q e^{imθ} conj(k e^{inθ})] = Re[q conj(k) e^{i(m-n)θ}]``: it depends on the
    positions only through ``m - n`` (Su et al. 2024, §3.2.1, the 2D case).
    Chapter 8 proves the general ``d``-dimensional statement.
    """
    q0, q1, k0, k1, m, n, theta, shift = sp.symbols("q_0 q_1 k_0 k_1 m n theta s", real=True)
    x0, x1, y0, y1 = sp.symbols("x_0 x_1 y_0 y_1", real=True)
    q = q0 + sp.I * q1
    k = k0 + sp.I * k1

    def score(query_pos: sp.Expr, key_pos: sp.Expr) -> sp.Expr:
        return sp.re(sp.expand(q * cis(query_pos * theta) * sp.conjugate(k * cis(key_pos * theta))))

    relative = sp.re(sp.expand(q * sp.conjugate(k) * cis((m - n) * theta)))
    q_pair, k_pair = sp.Matrix([q0, q1]), sp.Matrix([k0, k1])
    return Proof(
        "The score of turned pairs depends on m - n",
        "$\\operatorname{Re}[q e^{im\\theta}\\,\\overline{k e^{in\\theta}}] = "
        "\\operatorname{Re}[q\\bar k\\, e^{i(m-n)\\theta}]$ for real $m, n, \\theta$ "
        "and complex $q, k$.",
        (
            Step(
                "The real part of $x\\bar y$ is the dot product of the pairs "
                "$(\\operatorname{Re}, \\operatorname{Im})$",
                sp.re(sp.expand((x0 + sp.I * x1) * sp.conjugate(y0 + sp.I * y1))),
                x0 * y0 + x1 * y1,
                latex="\\operatorname{Re}[x\\bar y] = x_0 y_0 + x_1 y_1",
            ),
            Step(
                "The conjugate turns the key backwards, so the two angles subtract",
                score(m, n),
                relative,
                latex=(
                    "\\operatorname{Re}[q e^{im\\theta}\\,\\overline{k e^{in\\theta}}] = "
                    "\\operatorname{Re}[q\\bar k\\, e^{i(m-n)\\theta}]"
                ),
            ),
            Step(
                "In matrix form: the dot product of the turned pairs",
                (rotation_matrix(m * theta) * q_pair).dot(rotation_matrix(n * theta) * k_pair),
                (q_pair.T * rotation_matrix((n - m) * theta) * k_pair)[0],
                latex=(
                    "\\langle R(m\\theta)q, R(n\\theta)k\\rangle = q^\\top R((n-m)\\theta)\\, k"
                ),
            ),
            Step(
                "Shifting both positions by the same $s$ changes nothing",
                score(m + shift, n + shift),
                score(m, n),
                latex=(
                    "\\operatorname{Re}[q e^{i(m+s)\\theta}\\,\\overline{k e^{i(n+s)\\theta}}]"
                    " = \\operatorname{Re}[q e^{im\\theta}\\,\\overline{k e^{in\\theta}}]"
                ),
            ),
        ),
    )
