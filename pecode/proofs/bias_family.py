"""Proofs about the bias family after ALiBi (chapter to come): KERPLE, the forget gate, Sandwich.

Four schemes add to the logit of query ``i`` and key ``j`` a bias that falls with the
distance, and each meets ALiBi (Press et al. 2022, §3) somewhere. In pecode's conventions
(:mod:`pecode.alibi`), causal ALiBi is ``-m (i - j)`` on the keys ``j <= i`` and ``-inf``
above the diagonal; the symmetric variant is ``-m |i - j|`` everywhere.

1. KERPLE (Chi et al. 2022, arXiv 2205.09921, §4; :mod:`pecode.kerple`). The power kernel
   ``-r1 |i - j|^r2`` at ``r2 = 1``, ``r1 = m`` is symmetric ALiBi for all ``i, j``, and
   causal ALiBi on the keys ``j <= i`` (above the diagonal KERPLE is finite where causal
   ALiBi is ``-inf``: the two are the same attention only under a causal mask)
   (:func:`kerple_power_is_alibi`). The logarithmic kernel ``-r1 log(1 + r2 |i - j|)``
   is strictly convex in the distance for every ``r1, r2 > 0``, so no choice of its
   parameters is ALiBi (:func:`kerple_log_is_curved`), but it tends to ALiBi with slope
   ``m`` as ``r2 -> 0`` with ``r1 r2 = m`` held (:func:`kerple_log_limit_is_alibi`).
2. Conditional positive definiteness (KERPLE, §3 and Corollary 1): a kernel ``k`` is
   CPD when ``Σ_ab c_a c_b k(x_a, x_b) >= 0`` for every ``c`` with ``Σ_a c_a = 0``. The
   paper says ``-|x - y|^p`` is CPD for ``0 < p <= 2`` and ``-log(1 + r |x - y|)`` is
   CPD. Proven here: ``p = 2`` for any number of points (:func:`cpd_power_two`, the
   quadratic form is ``2 (Σ c_a x_a)^2``). Checked for each explicit size: ``p = 1``,
   ALiBi's kernel, on integer positions (:func:`alibi_kernel_cpd`, the quadratic form is
   a sum of squares). Checked numerically, not proven: other ``p`` and the log kernel
   (:func:`cpd_min_eigenvalue`).
3. The forget gate of the Forgetting Transformer (Lin et al. 2025, arXiv 2503.02130, the
   section "Forgetting Attention"; ``pecode.forgetting``): ``D_ij = Σ_{l=j+1}^{i} log f_l``.
   A constant gate ``f = e^{-m}`` makes it causal ALiBi with slope ``m``
   (:func:`forgetting_gate_constant_is_alibi`); any gates make it
   ``c_i - c_j`` with the cumulative ``c_t = Σ_{l<=t} log f_l``, a relative bias in the
   "position" ``c`` (:func:`forgetting_gate_is_relative`), which is how the authors'
   kernel computes it (a cumulative sum, then ``c_i - c_j``).
4. Sandwich (Chi et al. 2023, arXiv 2212.10356; ``pecode.sandwich``): the bias is the
   dot product of two rows of the sinusoidal table, ``p_m · p_n = Σ_i cos((m - n) ω_i)``,
   which :func:`pecode.proofs.sinusoidal.sinusoidal_dot_product` already proves (and that
   it is even in ``m - n``). New here (:func:`sandwich_bias_is_never_above_the_diagonal`):
   it is ``d̄/2`` at distance 0 and ``d̄/2 - 2 Σ_i sin^2((m - n) ω_i / 2)`` elsewhere, so
   never above its diagonal value; with NeMo's compensation ``-d̄/2`` it is 0 there.

Every proof takes a keyword that builds its false neighbour; :data:`CASES` lists them
with the steps at which they fail, and :data:`EVIDENCE` says which claims are proven and
which are only checked.
"""

from __future__ import annotations

import math
from functools import cached_property
from numbers import Real
from typing import Any

import numpy as np
import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step

__all__ = [
    "CASES",
    "EVIDENCE",
    "alibi_kernel_cpd",
    "cpd_min_eigenvalue",
    "cpd_power_two",
    "forgetting_gate_constant_is_alibi",
    "forgetting_gate_is_relative",
    "kerple_log_is_curved",
    "kerple_log_limit_is_alibi",
    "kerple_power_is_alibi",
    "sandwich_bias_is_never_above_the_diagonal",
]

# Symbols shared by the proofs. Positions are integers; the distance d >= 0 is real (the
# kernels are functions of a real distance; attention evaluates them at integers).
I_, J_ = sp.symbols("i j", integer=True)
T = sp.Symbol("t", integer=True, nonnegative=True)
DIST = sp.Symbol("d", nonnegative=True)
SLOPE = sp.Symbol("m", positive=True)
R1, R2 = sp.symbols("r_1 r_2", positive=True)


# --- residuals that do more than simplify ----------------------------------------------


class _EvaluatedStep(Step):
    """A :class:`Step` whose residual first evaluates limits, derivatives, sums and products.

    ``lhs - rhs`` (after ``subs``) is passed through ``doit``, multiplied out and
    simplified: the sides may hold an unevaluated ``Limit``, ``Derivative``, ``Sum`` or
    ``Product``, whose evaluation is the work of the step.
    """

    @cached_property
    def residual(self) -> Any:  # type: ignore[override]
        diff = sp.sympify(self.lhs - self.rhs)
        if self.subs:
            diff = diff.subs(dict(self.subs))
        return sp.simplify(sp.expand(diff.doit()))


def _split_double_sums(expr: sp.Expr, dummy: sp.Symbol) -> sp.Expr:
    """Each double sum whose summand's terms separate into products of single sums.

    ``Σ_a Σ_b f(a) g(b) = (Σ_a f(a)) (Σ_b g(b))`` for finite sums, term by term of the
    expanded summand; the single sums get the index ``dummy``, so that equal sums are one
    sympy object. A term with a factor that holds both indices leaves its sum as it is.
    """

    def split(double: sp.Sum) -> sp.Expr:
        (a, a_low, a_high), (b, b_low, b_high) = double.limits
        total = sp.Integer(0)
        for term in sp.Add.make_args(sp.expand(double.function)):
            parts: dict[Any, sp.Expr] = {a: sp.Integer(1), b: sp.Integer(1), None: sp.Integer(1)}
            for factor in sp.Mul.make_args(term):
                symbols = factor.free_symbols
                if a in symbols and b in symbols:
                    return double
                key = a if a in symbols else b if b in symbols else None
                parts[key] = parts[key] * factor
            total += (
                parts[None]
                * sp.Sum(parts[a].subs(a, dummy), (dummy, a_low, a_high))
                * sp.Sum(parts[b].subs(b, dummy), (dummy, b_low, b_high))
            )
        return total

    return expr.replace(lambda e: isinstance(e, sp.Sum) and len(e.limits) == 2, split)


class _DoubleSumStep(Step):
    """A :class:`Step` about double sums over a symbolic number of points.

    The residual splits each separable double sum into products of single sums
    (:func:`_split_double_sums`: finite sums, so the order of summation is free), *then*
    substitutes the step's hypothesis (such as ``Σ_a c_a = 0``), then simplifies.
    """

    dummy = sp.Symbol("a", integer=True)

    @cached_property
    def residual(self) -> Any:  # type: ignore[override]
        diff = _split_double_sums(sp.sympify(self.lhs - self.rhs), self.dummy)
        if self.subs:
            diff = diff.subs(dict(self.subs))
        return sp.simplify(diff)


class _TermwiseSumStep(Step):
    """A :class:`Step` between linear combinations of sums over one common range.

    Every term of ``lhs - rhs`` must be a number or symbol times a ``Sum`` with the same
    limits; the residual is that one sum of the combined summands, simplified, and 0 when
    the summands cancel term by term. Anything else gets the usual residual (a step may
    then fail that a cleverer summation would prove, never the other way round).
    """

    @cached_property
    def residual(self) -> Any:  # type: ignore[override]
        diff = sp.sympify(self.lhs - self.rhs)
        if self.subs:
            diff = diff.subs(dict(self.subs))
        limits, summand = None, sp.Integer(0)
        for term in sp.Add.make_args(diff):
            sums = [factor for factor in sp.Mul.make_args(term) if isinstance(factor, sp.Sum)]
            if len(sums) != 1 or (limits is not None and sums[0].limits != limits):
                return sp.simplify(diff.doit())
            limits = sums[0].limits
            summand += (term / sums[0]) * sums[0].function
        summand = sp.simplify(summand)
        return sp.Integer(0) if summand == 0 else sp.Sum(summand, *limits)


# --- argument checks -------------------------------------------------------------------


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_size(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(f"{name} must be finite and positive, got {value!r}")
    return float(value)


# --- 1. KERPLE and ALiBi ---------------------------------------------------------------


def _kerple(kernel: str, distance: sp.Expr) -> sp.Expr:
    """KERPLE's bias at ``distance``: ``-r1 d^r2`` (power) or ``-r1 log(1 + r2 d)`` (log)."""
    if kernel == "power":
        return -R1 * distance**R2
    return -R1 * sp.log(1 + R2 * distance)


def kerple_power_is_alibi(kernel: str = "power", exponent: int | sp.Rational = 1) -> Proof:
    """KERPLE's power kernel with ``r2 = 1`` and ``r1 = m`` is ALiBi with slope ``m``.

    Chi et al. (2022), §4, define the power bias ``-r1 |i - j|^r2``. With ``r1 = m`` and
    ``r2 = 1``, for symbolic ``m > 0``, distance ``d >= 0`` and positions ``i, j``:

    1. each unit of distance costs the slope: ``k(d) - k(d + 1) = m``;
    2. so the bias is linear in the distance: its second difference is 0;
    3. for all ``i, j`` it is ``-m |i - j|``, pecode's symmetric ALiBi
       (``alibi_bias(..., symmetric=True)``);
    4. for a key not after the query, ``j = i - t`` with ``t >= 0``, it is
       ``-m (i - j)``, pecode's causal ALiBi on and below the diagonal. Above it causal
       ALiBi is ``-inf`` and KERPLE finite: the same attention under a causal mask only.

    Steps 1 and 2 are simplified by sympy; steps 3 and 4 are the kernel evaluated at
    ``r1 = m``, ``r2 = 1`` (and ``j = i - t``), shown "by substitution".

    Args:
        kernel: ``"power"``; ``"log"`` builds a false neighbour, the logarithmic kernel
            ``-m log(1 + r2 d)`` at any ``r2 > 0`` (every step fails).
        exponent: the power ``r2``; 1 is right, 2 is a false neighbour (every step fails).

    Raises:
        ValueError: ``kernel`` is not ``"power"`` or ``"log"``.
        TypeError: ``exponent`` is not a number.
    """
    _check_choice("kernel", kernel, ("power", "log"))
    if isinstance(exponent, bool) or not isinstance(exponent, (int, sp.Rational)):
        raise TypeError(f"exponent must be an int or a sympy Rational, got {exponent!r}")
    values = {R1: SLOPE, R2: exponent} if kernel == "power" else {R1: SLOPE}
    name = f"-m\\,d^{{{sp.latex(exponent)}}}" if kernel == "power" else "-m\\log(1 + r_2 d)"

    def k(distance):
        return _kerple(kernel, distance)

    return Proof(
        "KERPLE's power kernel at exponent 1 is ALiBi",
        f"With $r_1 = m$, the KERPLE bias ${name}$ is ALiBi's bias with slope $m$: "
        "$-m|i-j|$ for all $i, j$, and $-m(i-j)$ for $j \\le i$"
        + (" — tested here with another kernel." if kernel == "log" or exponent != 1 else "."),
        (
            Step(
                "Each unit of distance lowers the bias by the slope $m$ "
                "($d \\ge 0$ and $m > 0$ symbolic)",
                k(DIST) - k(DIST + 1),
                SLOPE,
                subs=values,
                latex=f"k(d) - k(d+1) = m, \\quad k(d) = {name}",
            ),
            Step(
                "so the bias is linear in the distance: its second difference is $0$",
                k(DIST + 2) - 2 * k(DIST + 1) + k(DIST),
                sp.Integer(0),
                subs=values,
                latex="k(d+2) - 2k(d+1) + k(d) = 0",
            ),
            Step(
                "At every pair of positions it is the symmetric ALiBi bias "
                "(`alibi_bias(..., symmetric=True)`)",
                k(sp.Abs(I_ - J_)),
                -SLOPE * sp.Abs(I_ - J_),
                subs=values,
                latex=f"k(|i-j|) = -m|i-j| \\quad (k(d) = {name})",
            ),
            Step(
                "On a key not after the query ($j = i - t$, $t \\ge 0$) it is causal ALiBi "
                "$-m(i-j)$; above the diagonal causal ALiBi is $-\\infty$, so the two agree "
                "under a causal mask only",
                k(sp.Abs(I_ - J_)),
                -SLOPE * (I_ - J_),
                subs={**values, J_: I_ - T},
                latex=f"k(|i-j|) = -m(i-j) \\quad (j = i - t,\\ t \\ge 0,\\ k(d) = {name})",
            ),
        ),
    )


def kerple_log_is_curved(kernel: str = "log") -> Proof:
    """KERPLE's logarithmic kernel is ALiBi for no choice of its parameters.

    A bias that is ALiBi's is linear in the distance, so its second derivative in ``d``
    is 0 (step 1). The log kernel ``-r1 log(1 + r2 d)`` (Chi et al. 2022, §4) has second
    derivative ``r1 r2^2 / (1 + r2 d)^2`` (step 2), which is positive for every
    ``r1, r2 > 0`` and ``d >= 0`` (step 3): it is strictly convex in the distance, so no
    ``r1, r2`` make it linear. sympy differentiates and decides the sign, with all of
    ``r1, r2, d`` symbolic.

    Args:
        kernel: ``"log"``; ``"alibi"`` builds the false neighbour, the same claim about
            the power kernel at exponent 1 (ALiBi itself), which fails at steps 2 and 3.

    Raises:
        ValueError: ``kernel`` is not ``"log"`` or ``"alibi"``.
    """
    _check_choice("kernel", kernel, ("log", "alibi"))
    k = _kerple("log", DIST) if kernel == "log" else _kerple("power", DIST).subs(R2, 1)
    curvature = R1 * R2**2 / (1 + R2 * DIST) ** 2
    return Proof(
        "KERPLE's log kernel is never ALiBi",
        "For every $r_1, r_2 > 0$ the bias $-r_1\\log(1 + r_2 d)$ is strictly convex in the "
        "distance $d \\ge 0$, while ALiBi's is linear: no parameters make it ALiBi"
        + (" — tested here on ALiBi itself." if kernel == "alibi" else "."),
        (
            _EvaluatedStep(
                "ALiBi's bias $-m\\,d$ has second derivative $0$ in the distance",
                sp.Derivative(-SLOPE * DIST, (DIST, 2)),
                sp.Integer(0),
                latex="\\frac{\\partial^2}{\\partial d^2}(-m\\,d) = 0",
            ),
            _EvaluatedStep(
                "The kernel's second derivative ($r_1, r_2 > 0$, $d \\ge 0$ symbolic)",
                sp.Derivative(k, (DIST, 2)),
                curvature,
                latex=f"\\frac{{\\partial^2}}{{\\partial d^2}}\\left({sp.latex(k)}\\right)"
                f" = {sp.latex(curvature)}",
            ),
            _EvaluatedStep(
                "which is positive: the kernel is strictly convex in $d$, never linear",
                sp.sign(sp.Derivative(k, (DIST, 2))),
                sp.Integer(1),
                latex=f"\\operatorname{{sign}}\\frac{{\\partial^2}}{{\\partial d^2}}\\left("
                f"{sp.latex(k)}\\right) = 1",
            ),
        ),
    )


def kerple_log_limit_is_alibi(hold: str = "product") -> Proof:
    """As ``r2 -> 0`` with ``r1 r2 = m`` held, the log kernel tends to ALiBi with slope ``m``.

    With ``r1 = m / r2``, ``-r1 log(1 + r2 d) = -(m / r2) log(1 + r2 d)`` (step 1, a
    substitution); its limit as ``r2 -> 0+`` is ``-m d`` (step 2: ALiBi, symmetric for
    ``d = |i - j|``, causal for ``d = i - j >= 0``), and the gap closes at first order,
    ``(k + m d) / r2 -> m d^2 / 2`` (step 3). sympy's ``limit`` evaluates both, with
    ``m`` and ``d > 0`` symbolic (at ``d = 0`` both sides are 0).

    Args:
        hold: ``"product"`` holds ``r1 r2 = m``; ``"scale"`` builds the false neighbour,
            which holds ``r1 = m`` fixed instead: the kernel then tends to 0, not
            ``-m d`` (steps 2 and 3 fail).

    Raises:
        ValueError: ``hold`` is not ``"product"`` or ``"scale"``.
    """
    _check_choice("hold", hold, ("product", "scale"))
    d = sp.Symbol("d", positive=True)
    k = _kerple("log", d)
    values = {R1: SLOPE / R2} if hold == "product" else {R1: SLOPE}
    held = k.subs(values)
    held_tex = "r_1 r_2 = m" if hold == "product" else "r_1 = m"
    return Proof(
        "The log kernel tends to ALiBi",
        f"As $r_2 \\to 0^+$ with ${held_tex}$ held, $-r_1\\log(1 + r_2 d) \\to -m\\,d$"
        + (" — tested here with $r_1$ held instead." if hold == "scale" else "."),
        (
            Step(
                f"Hold ${held_tex}$: put $r_1 = {sp.latex(values[R1])}$",
                k,
                held,
                subs=values,
            ),
            _EvaluatedStep(
                "The limit is ALiBi's bias $-m\\,d$ ($m > 0$, $d > 0$ symbolic)",
                sp.Limit(held, R2, 0, "+"),
                -SLOPE * d,
                latex=f"\\lim_{{r_2 \\to 0^+}} {sp.latex(held)} = -m\\,d",
            ),
            _EvaluatedStep(
                "and the gap to it is of first order in $r_2$",
                sp.Limit((held + SLOPE * d) / R2, R2, 0, "+"),
                SLOPE * d**2 / 2,
                latex=f"\\lim_{{r_2 \\to 0^+}} \\frac{{{sp.latex(held)} + m\\,d}}{{r_2}}"
                " = \\frac{m\\,d^2}{2}",
            ),
        ),
    )


# --- 2. Conditional positive definiteness ----------------------------------------------


def cpd_power_two(n: int = 4, *, constrained: bool = True) -> Proof:
    """``-(x_a - x_b)^2`` is conditionally positive definite, for any number of points.

    For every ``c`` with ``Σ_a c_a = 0`` and all points ``x``:
    ``Σ_ab c_a c_b (-(x_a - x_b)^2) = 2 (Σ_a c_a x_a)^2 >= 0`` (KERPLE's Corollary 1 at
    ``p = 2``; Chi et al. 2022, §3).

    1. With a symbolic number of points ``N`` (indexed ``c_a``, ``x_a``), the double sum
       is ``2 (Σ c x)^2 - 2 (Σ c)(Σ c x^2)`` without any hypothesis (the residual splits
       each double sum into single sums, finite sums being free to reorder);
    2. with ``Σ_a c_a = 0`` substituted, it is ``2 (Σ c x)^2``, a square: never negative;
    3. the same written out for ``n`` points, every ``c_a`` and ``x_a`` symbolic, with
       ``c_{n-1} = -(c_0 + ... + c_{n-2})``.

    Args:
        n: the number of points of step 3 (2 to 6).
        constrained: ``False`` builds the false neighbour, the claim without
            ``Σ c_a = 0`` (positive definite, not conditionally); steps 2 and 3 fail
            (e.g. ``c = (1, 1)``, ``x = (0, 1)`` gives ``-2``).

    Raises:
        TypeError, ValueError: ``n`` is not an int from 2 to 6.
    """
    _check_size("n", n, 2, 6)
    size = sp.Symbol("N", integer=True, positive=True)
    a, b = _DoubleSumStep.dummy, sp.Symbol("b", integer=True)
    c, x = sp.IndexedBase("c", real=True), sp.IndexedBase("x", real=True)
    points = (a, 0, size - 1)

    def one(summand):
        return sp.Sum(summand, points)

    form = sp.Sum(c[a] * c[b] * (-((x[a] - x[b]) ** 2)), points, (b, 0, size - 1))
    hypothesis = {one(c[a]): 0} if constrained else None
    cs = sp.symbols(f"c_0:{n}", real=True)
    xs = sp.symbols(f"x_0:{n}", real=True)
    explicit = sum(cs[p] * cs[q] * (-((xs[p] - xs[q]) ** 2)) for p in range(n) for q in range(n))
    explicit_square = 2 * sum(cs[p] * xs[p] for p in range(n)) ** 2
    last = {cs[-1]: -sum(cs[:-1])} if constrained else None
    form_tex = "\\sum_{a,b} c_a c_b\\,\\big(-(x_a - x_b)^2\\big)"
    where = "\\sum_a c_a = 0" if constrained else "\\text{any } c"
    return Proof(
        "$-(x-y)^2$ is conditionally positive definite",
        f"For every $c$ with $\\sum_a c_a = 0$: ${form_tex} = 2\\big(\\sum_a c_a x_a\\big)^2"
        " \\ge 0$" + (" — tested here without $\\sum_a c_a = 0$." if not constrained else "."),
        (
            _DoubleSumStep(
                "Multiplied out and summed, for a symbolic number $N$ of points, with no "
                "hypothesis on $c$",
                form,
                2 * one(c[a] * x[a]) ** 2 - 2 * one(c[a]) * one(c[a] * x[a] ** 2),
                latex=f"{form_tex} = 2\\Big(\\sum_a c_a x_a\\Big)^2 - 2\\Big(\\sum_a c_a\\Big)"
                "\\Big(\\sum_a c_a x_a^2\\Big)",
            ),
            _DoubleSumStep(
                "With $\\sum_a c_a = 0$ the second term vanishes: the form is twice a "
                "square, so never negative",
                form,
                2 * one(c[a] * x[a]) ** 2,
                subs=hypothesis,
                latex=f"{form_tex} = 2\\Big(\\sum_a c_a x_a\\Big)^2 \\quad ({where})",
            ),
            Step(
                f"Written out for $n = {n}$ points, every $c_a, x_a$ symbolic",
                explicit,
                explicit_square,
                subs=last,
                latex=f"{form_tex} = 2\\Big(\\sum_a c_a x_a\\Big)^2 \\quad (n = {n},\\ {where})",
            ),
        ),
    )


def alibi_kernel_cpd(n: int = 4, *, constrained: bool = True) -> Proof:
    """ALiBi's kernel ``-|p - q|`` is conditionally positive definite on ``n`` positions.

    The argument, for every ``n``: on the integer positions ``0 .. n-1``, ``|p - q|``
    counts the thresholds ``t = 0 .. n-2`` with exactly one of ``p, q`` above ``t``, i.e.
    ``Σ_t (u_p(t) - u_q(t))^2`` with ``u_p(t) = [p > t]``; the identity of
    :func:`cpd_power_two` applied at each ``t`` turns the quadratic form into
    ``2 Σ_t S_t^2 - 2 (Σ_p c_p)(Σ_t S_t)`` with ``S_t = Σ_{p>t} c_p`` (step 1), which is
    ``2 Σ_t S_t^2 >= 0`` when ``Σ c = 0`` (step 2). sympy checks both identities for the
    given ``n``, every ``c_p`` symbolic: a check for each explicit size, not a proof for
    all sizes.

    Args:
        n: the number of positions (2 to 8).
        constrained: ``False`` builds the false neighbour, the claim without
            ``Σ c_p = 0``; step 2 fails.

    Raises:
        TypeError, ValueError: ``n`` is not an int from 2 to 8.
    """
    _check_size("n", n, 2, 8)
    cs = sp.symbols(f"c_0:{n}", real=True)
    form = sum(cs[p] * cs[q] * (-abs(p - q)) for p in range(n) for q in range(n))
    tails = [sum(cs[t + 1 :]) for t in range(n - 1)]
    squares = 2 * sum(tail**2 for tail in tails)
    last = {cs[-1]: -sum(cs[:-1])} if constrained else None
    form_tex = "\\sum_{p,q<n} c_p c_q\\,\\big(-|p-q|\\big)"
    squares_tex = "2\\sum_{t=0}^{n-2} S_t^2"
    return Proof(
        "ALiBi's kernel is conditionally positive definite",
        f"On the positions $0..n-1$, for every $c$ with $\\sum_p c_p = 0$: ${form_tex} = "
        f"{squares_tex} \\ge 0$, $S_t = \\sum_{{p > t}} c_p$ (checked for $n = {n}$)"
        + (" — tested here without $\\sum_p c_p = 0$." if not constrained else "."),
        (
            Step(
                "$|p - q|$ counts the thresholds $t$ between $p$ and $q$; summed as in "
                f"$-(x-y)^2$'s proof, with no hypothesis on $c$ ($n = {n}$, $c$ symbolic)",
                form,
                squares - 2 * sum(cs) * sum(tails),
                latex=f"{form_tex} = {squares_tex} - 2\\Big(\\sum_p c_p\\Big)"
                f"\\Big(\\sum_t S_t\\Big) \\quad (n = {n})",
            ),
            Step(
                "With $\\sum_p c_p = 0$ it is a sum of squares, never negative",
                form,
                squares,
                subs=last,
                latex=f"{form_tex} = {squares_tex} \\quad (n = {n},\\ "
                + ("\\sum_p c_p = 0)" if constrained else "\\text{any } c)"),
            ),
        ),
    )


def _sum_zero_basis(n: int) -> np.ndarray:
    """An orthonormal basis ``[n, n-1]`` of the vectors whose entries sum to 0 (Helmert's)."""
    basis = np.zeros((n, n - 1))
    for k in range(1, n):
        basis[:k, k - 1] = 1.0
        basis[k, k - 1] = -float(k)
        basis[:, k - 1] /= math.sqrt(k * (k + 1))
    return basis


def cpd_min_eigenvalue(
    kernel: str, n: int, shape: float, scale: float = 1.0, *, sum_zero: bool = True
) -> float:
    """The least eigenvalue of a KERPLE kernel's Gram matrix on the sum-zero vectors.

    A *numerical check*, not a proof, of the paper's claim that its kernels are
    conditionally positive definite (Chi et al. 2022, §3, Corollary 1): the kernel is
    CPD on the positions ``0 .. n-1`` exactly when ``c^T K c >= 0`` for every ``c`` with
    ``Σ c = 0``, i.e. when ``B^T K B`` has no negative eigenvalue, ``B`` an orthonormal
    basis of those ``c``. ``K[p, q]`` is ``-scale |p - q|^shape`` (``"power"``) or
    ``-scale log(1 + shape |p - q|)`` (``"log"``), in float64 (numpy ``eigvalsh``). A
    value above minus rounding supports the claim (rounding grows with the entries: at
    ``p = 2`` and ``n = 64`` the exact minimum is 0 and the computed one about
    ``-1e-11``; the tests allow ``-1e-9`` up to ``n = 64``); a clearly negative one
    refutes it (the power ``2.5``, or ``sum_zero=False``, the whole Gram matrix, whose
    trace is 0). It lives here, beside the proofs it complements, because the chapter
    shows both together and it needs nothing from :mod:`pecode.reference`.

    Shapes::

        returns: a float (the least eigenvalue)

    Args:
        kernel: ``"power"`` or ``"log"``.
        n: the number of positions (2 to 4096).
        shape: the power ``r2`` or the log kernel's rate ``r2`` (positive).
        scale: ``r1`` (positive).
        sum_zero: ``False`` takes every ``c``, not only those summing to 0.

    Raises:
        ValueError: ``kernel`` is unknown, ``n`` is out of range, or ``shape`` or
            ``scale`` is not finite and positive.
        TypeError: ``n`` is not an int, or ``shape`` or ``scale`` is not a real number.
    """
    _check_choice("kernel", kernel, ("power", "log"))
    _check_size("n", n, 2, 4096)
    shape = _check_positive("shape", shape)
    scale = _check_positive("scale", scale)
    positions = np.arange(n, dtype=np.float64)
    distance = np.abs(positions[:, None] - positions[None, :])
    power = kernel == "power"
    gram = -scale * (distance**shape if power else np.log1p(shape * distance))
    if sum_zero:
        basis = _sum_zero_basis(n)
        gram = basis.T @ gram @ basis
    return float(np.linalg.eigvalsh(gram).min())


# --- 3. The forget gate ----------------------------------------------------------------


def forgetting_gate_constant_is_alibi(start: str = "j+1") -> Proof:
    """A constant forget gate ``f = e^{-m}`` gives ALiBi's causal bias with slope ``m``.

    The Forgetting Transformer (Lin et al. 2025, "Forgetting Attention") adds to the logit
    of query ``i`` and key ``j <= i`` the bias ``D_ij = Σ_{l=j+1}^{i} log f_l``, the log of
    the gate product ``F_ij = Π_{l=j+1}^{i} f_l``. With ``f_l = e^{-m}`` for every ``l``
    (``m > 0`` and ``i, j`` symbolic; sympy sums and multiplies over the symbolic range):

    1. ``D_ij = -m (i - j)``, causal ALiBi's bias;
    2. ``F_ij = e^{-m (i - j)}``, its exponential;
    3. for any gates, ``D_ii = 0`` (an empty sum): the query's own key is not penalised,
       as on ALiBi's diagonal.

    Args:
        start: the first gate in the sum; ``"j+1"`` is the paper's; ``"j"`` builds the
            false neighbour, which counts the key's own gate and gives
            ``-m (i - j + 1)`` (every step fails).

    Raises:
        ValueError: ``start`` is not ``"j+1"`` or ``"j"``.
    """
    _check_choice("start", start, ("j+1", "j"))
    ell = sp.Symbol("l", integer=True)
    f = sp.IndexedBase("f", positive=True)
    low = J_ + 1 if start == "j+1" else J_
    low_tex = "j+1" if start == "j+1" else "j"
    gate = sp.exp(-SLOPE)
    return Proof(
        "A constant forget gate is ALiBi",
        f"With $f_l = e^{{-m}}$, $D_{{ij}} = \\sum_{{l={low_tex}}}^{{i}} \\log f_l = -m(i-j)$, "
        "ALiBi's causal bias with slope $m$"
        + (" — tested here with the sum starting at $l = j$." if start == "j" else "."),
        (
            _EvaluatedStep(
                "Each $\\log f_l = -m$; summed over the symbolic range",
                sp.Sum(sp.log(gate), (ell, low, I_)),
                -SLOPE * (I_ - J_),
                latex=f"\\sum_{{l={low_tex}}}^{{i}} \\log e^{{-m}} = -m(i-j)",
            ),
            _EvaluatedStep(
                "The gate product is the exponential of ALiBi's bias",
                sp.Product(gate, (ell, low, I_)),
                sp.exp(-SLOPE * (I_ - J_)),
                latex=f"\\prod_{{l={low_tex}}}^{{i}} e^{{-m}} = e^{{-m(i-j)}}",
            ),
            _EvaluatedStep(
                "For any gates the query's own key gets $D_{ii} = 0$, an empty sum",
                sp.Sum(sp.log(f[ell]), (ell, low.subs(J_, I_), I_)),
                sp.Integer(0),
                latex=f"\\sum_{{l={low_tex.replace('j', 'i')}}}^{{i}} \\log f_l = 0",
            ),
        ),
    )


def forgetting_gate_is_relative(combine: str = "difference") -> Proof:
    """The forget-gate bias is ``c_i - c_j``: relative, in the cumulative log gate ``c``.

    With ``c_t = Σ_{l=1}^{t} log f_l`` (the authors' kernel computes this cumulative sum
    and adds ``c_i - c_j``), for symbolic ``i, j`` and gates ``f_l > 0`` of an
    ``IndexedBase``:

    1. ``D_ij = Σ_{l=j+1}^{i} log f_l = c_i - c_j``: the bias depends on the two
       positions only through the difference of their "positions" ``c`` (sympy joins the
       two sums; it holds for every ``i, j``, in particular ``i > j``);
    2. a constant gate ``f = e^{-m}`` makes ``c_t = -m t``;
    3. so ``c_i - c_j = -m (i - j)``: ALiBi, for which ``c`` is the position itself,
       scaled by ``-m``.

    Args:
        combine: ``"difference"``; ``"sum"`` builds the false neighbour ``c_i + c_j``
            (an absolute, not a relative, bias); steps 1 and 3 fail.

    Raises:
        ValueError: ``combine`` is not ``"difference"`` or ``"sum"``.
    """
    _check_choice("combine", combine, ("difference", "sum"))
    ell = sp.Symbol("l", integer=True)
    f = sp.IndexedBase("f", positive=True)
    sign = -1 if combine == "difference" else 1
    op = "-" if combine == "difference" else "+"

    def c(t, log_gate=None):
        return sp.Sum(sp.log(f[ell]) if log_gate is None else log_gate, (ell, 1, t))

    constant = sp.log(sp.exp(-SLOPE))
    return Proof(
        "The forget gate is a relative bias",
        f"$D_{{ij}} = c_i {op} c_j$ with $c_t = \\sum_{{l=1}}^{{t}} \\log f_l$, for any gates"
        + (" — tested here with $c_i + c_j$." if combine == "sum" else "."),
        (
            _EvaluatedStep(
                "The sum from $j+1$ to $i$ is the sum up to $i$ minus the sum up to $j$ "
                "($i, j$ and the gates symbolic)",
                sp.Sum(sp.log(f[ell]), (ell, J_ + 1, I_)),
                c(I_) + sign * c(J_),
                latex=f"\\sum_{{l=j+1}}^{{i}} \\log f_l = \\sum_{{l=1}}^{{i}} \\log f_l {op}"
                " \\sum_{l=1}^{j} \\log f_l",
            ),
            _EvaluatedStep(
                "A constant gate $f = e^{-m}$ makes the cumulative log gate $c_t = -m\\,t$",
                c(T, constant),
                -SLOPE * T,
                latex="\\sum_{l=1}^{t} \\log e^{-m} = -m\\,t",
            ),
            _EvaluatedStep(
                "so $D_{ij}$ is ALiBi's bias $-m(i-j)$, relative in $c$ as ALiBi is in the "
                "position",
                c(I_, constant) + sign * c(J_, constant),
                -SLOPE * (I_ - J_),
                latex=f"c_i {op} c_j = -m(i - j) \\quad (c_t = -m\\,t)",
            ),
        ),
    )


# --- 4. Sandwich -----------------------------------------------------------------------


def sandwich_bias_is_never_above_the_diagonal(compensation: str = "half", dim: int = 8) -> Proof:
    """Sandwich's bias is never above its value on the diagonal.

    Sandwich (Chi et al. 2023) biases the logits by the dot product of two rows of the
    sinusoidal table of width ``d̄``, ``S(k) = p_m · p_n = Σ_i cos(k ω_i)`` with
    ``k = m - n`` and ``ω_i = b^{-2i/d̄}``
    (:func:`pecode.proofs.sinusoidal.sinusoidal_dot_product` proves this form, and that
    it is even in ``k``), divided in head ``h`` by ``ρ_h = 8h/H``. The paper's appendix
    code and attention-gym sum over ``i = 0 .. d̄/2 - 1`` and subtract nothing (see
    ``pecode.sandwich``); NeMo sums over ``i = 1 .. d̄/2`` and subtracts ``d̄/2``, a
    constant per head that no softmax row sees. Steps 1 and 4 hold for any first index
    ``a`` (symbolic), so for both frequency sets; steps 2 and 5 are about NeMo's
    compensated form, step 5 written out with ``a = 1``.

    1. ``S(0) = d̄/2`` (symbolic ``d̄``, ``a``);
    2. so the compensated bias ``(S(k) - d̄/2) / ρ`` is 0 at distance 0;
    3. per frequency, ``cos x - 1 = -2 sin^2(x/2)``;
    4. so ``S(k) - S(0) = -2 Σ_i sin^2(k ω_i / 2) <= 0`` (symbolic ``d̄``, ``a``, summands
       compared term by term): in either form the bias is never above its diagonal
       value, like ALiBi's and KERPLE's;
    5. written out for ``d̄ = dim``: the compensated bias is
       ``-(2/ρ) Σ_i sin^2(k ω_i / 2)``, minus a sum of squares over ``ρ > 0``;
    6. it is even in ``k``: a restatement here (sympy writes ``cos(-x)`` as ``cos x``),
       proven for the dot product in ``sinusoidal_dot_product``.

    Args:
        compensation: the constant NeMo subtracts; ``"half"`` (``d̄/2``) is right;
            ``"full"`` (``d̄``, as if each of the ``d̄`` entries contributed 1, when a
            pair ``sin^2 + cos^2`` does) builds the false neighbour, which fails at
            steps 2 and 5.
        dim: the explicit even width ``d̄`` of step 5 (2 to 16).

    Raises:
        ValueError: ``compensation`` is unknown, or ``dim`` is not an even int from 2
            to 16.
    """
    _check_choice("compensation", compensation, ("half", "full"))
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in range(2, 17, 2):
        raise ValueError(f"dim must be an even int from 2 to 16, got {dim!r}")
    idx = sp.Symbol("i", integer=True, nonnegative=True)
    first = sp.Symbol("a", integer=True, nonnegative=True)
    width = sp.Symbol("dbar", integer=True, positive=True)  # LaTeX \bar{d}
    base = sp.Symbol("b", positive=True)
    k = sp.Symbol("k", real=True)
    rho = sp.Symbol("rho", positive=True)
    omega = base ** (-2 * idx / width)
    pairs = (idx, first, first + width / 2 - 1)
    total = sp.Sum(sp.cos(k * omega), pairs)
    minus = width / 2 if compensation == "half" else width
    minus_tex = sp.latex(minus)
    freqs = [base ** sp.Rational(-2 * p, dim) for p in range(1, dim // 2 + 1)]
    explicit = (sum(sp.cos(k * w) for w in freqs) - minus.subs(width, dim)) / rho
    squares = -2 / rho * sum(sp.sin(k * w / 2) ** 2 for w in freqs)
    return Proof(
        "Sandwich's bias is never above the diagonal",
        f"$\\big(\\sum_i \\cos(k\\omega_i) - {minus_tex}\\big)/\\rho = "
        "-\\tfrac{2}{\\rho}\\sum_i \\sin^2(k\\omega_i/2) \\le 0$, with equality at $k = 0$"
        + (" — tested here subtracting $\\bar{d}$." if compensation == "full" else "."),
        (
            _EvaluatedStep(
                "At distance $0$ every cosine is $1$: the dot product is $\\bar{d}/2$ "
                "($\\bar{d}$ and the first index $a$ symbolic)",
                total,
                width / 2,
                subs={k: 0},
                latex=f"{sp.latex(total)}\\Big|_{{k=0}} = {sp.latex(width / 2)}",
            ),
            _EvaluatedStep(
                f"so subtracting ${minus_tex}$ puts NeMo's bias at $0$ on the diagonal",
                (total - minus) / rho,
                sp.Integer(0),
                subs={k: 0},
                latex=f"\\frac{{1}}{{\\rho}}\\Big({sp.latex(total)} - {minus_tex}\\Big)"
                "\\Big|_{k=0} = 0",
            ),
            Step(
                "One frequency: $\\cos x - 1 = -2\\sin^2(x/2)$ ($k, i, \\bar{d}, b$ symbolic)",
                sp.cos(k * omega) - 1,
                -2 * sp.sin(k * omega / 2) ** 2,
            ),
            _TermwiseSumStep(
                "Summed, $\\bar{d}$ and $a$ symbolic: the dot product minus its value at "
                "distance $0$ is minus twice a sum of squares, never positive",
                total - total.subs(k, 0),
                sp.Sum(-2 * sp.sin(k * omega / 2) ** 2, pairs),
                latex=f"{sp.latex(total)} - {sp.latex(total.subs(k, 0))} = "
                f"{sp.latex(sp.Sum(-2 * sp.sin(k * omega / 2) ** 2, pairs))}",
            ),
            Step(
                f"Written out for $\\bar{{d}} = {dim}$, $i = 1..{dim // 2}$ (NeMo's): the bias "
                "is minus a sum of squares over $\\rho > 0$, at most its value $0$ on the "
                "diagonal",
                explicit,
                squares,
                latex=f"{sp.latex(explicit)} = {sp.latex(squares)}",
            ),
            Step(
                "It is even in $k$ (a restatement: sympy writes $\\cos(-x)$ as $\\cos x$; "
                "the dot product's evenness is proven in `sinusoidal_dot_product`)",
                explicit.subs(k, -k),
                explicit,
                latex="B(-k) = B(k)",
                by_definition=True,
            ),
        ),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "bias_family.kerple_power_is_alibi",
        kerple_power_is_alibi,
        lambda: kerple_power_is_alibi(exponent=2),
        (1, 2, 3, 4),
    ),
    ProofCase(
        "bias_family.kerple_log_is_curved",
        kerple_log_is_curved,
        lambda: kerple_log_is_curved("alibi"),
        (2, 3),
    ),
    ProofCase(
        "bias_family.kerple_log_limit_is_alibi",
        kerple_log_limit_is_alibi,
        lambda: kerple_log_limit_is_alibi("scale"),
        (2, 3),
    ),
    ProofCase(
        "bias_family.cpd_power_two",
        cpd_power_two,
        lambda: cpd_power_two(3, constrained=False),
        (2, 3),
    ),
    ProofCase(
        "bias_family.alibi_kernel_cpd",
        alibi_kernel_cpd,
        lambda: alibi_kernel_cpd(4, constrained=False),
        (2,),
    ),
    ProofCase(
        "bias_family.forgetting_gate_constant_is_alibi",
        forgetting_gate_constant_is_alibi,
        lambda: forgetting_gate_constant_is_alibi("j"),
        (1, 2, 3),
    ),
    ProofCase(
        "bias_family.forgetting_gate_is_relative",
        forgetting_gate_is_relative,
        lambda: forgetting_gate_is_relative("sum"),
        (1, 3),
    ),
    ProofCase(
        "bias_family.sandwich_bias_is_never_above_the_diagonal",
        sandwich_bias_is_never_above_the_diagonal,
        lambda: sandwich_bias_is_never_above_the_diagonal("full"),
        (2, 5),
    ),
)
"""Every proof of this module with its false neighbour and the steps where it fails."""

EVIDENCE: dict[str, str] = {
    "kerple_power_is_alibi": "proven",
    "kerple_log_is_curved": "proven",
    "kerple_log_limit_is_alibi": "proven",
    "cpd_power_two": "proven",
    "alibi_kernel_cpd": "checked",
    "cpd_min_eigenvalue": "checked",
    "forgetting_gate_constant_is_alibi": "proven",
    "forgetting_gate_is_relative": "proven",
    "sandwich_bias_is_never_above_the_diagonal": "proven",
}
"""Each public function's kind of evidence (DESIGN §6), *proven* for all sizes by sympy,
or *checked* for the explicit sizes given (:func:`alibi_kernel_cpd`) or numerically
(:func:`cpd_min_eigenvalue`)."""
