"""Proofs about the long-context RoPE rules (chapter 11), for symbolic sizes and factors.

The head dimension ``d``, the base ``b``, the factor ``s`` and the lengths are positive
symbols, so each statement holds for every value, not for one configuration. In every
step sympy does the work: the rule is written as built (an unsubstituted expression,
an explicit rotation matrix, a symbolic sum) and the step's substitutions, expansion
and simplification must bring the two sides together.

Each proof function takes a keyword that builds its false neighbour, the same
derivation of a plausibly wrong rule (frequencies multiplied instead of divided, the
NTK exponent ``d/(d-1)``, a dynamic bracket without its ``+1``, Llama 3.1's band
factors swapped, YaRN's ``2π`` halved, logits scaled by ``c`` instead of ``c²``);
:data:`CASES` lists them with the steps at which they fail.
"""

from __future__ import annotations

from functools import cached_property

import sympy as sp

from pecode.proofs.core import ForcedStep, Proof, ProofCase, Step, residual

__all__ = [
    "CASES",
    "attention_factor_squares",
    "dynamic_equals_default",
    "linear_is_position_interpolation",
    "llama3_continuity",
    "ntk_endpoints",
    "yarn_boundary",
]

d, b, s = sp.symbols("d b s", positive=True)
i = sp.Symbol("i", nonnegative=True)
m, n = sp.symbols("m n", real=True)
L, L0 = sp.symbols("L L_0", positive=True)


def _theta(base: sp.Expr, index: sp.Expr) -> sp.Expr:
    return base ** (-2 * index / d)


def _rotation(angle: sp.Expr, scale: sp.Expr | int = 1) -> sp.Matrix:
    """RoPE's 2x2 block for one pair, built from the tables ``scale·cos`` and ``scale·sin``."""
    cos, sin = scale * sp.cos(angle), scale * sp.sin(angle)
    return sp.Matrix([[cos, -sin], [sin, cos]])


class _PowerStep(ForcedStep):
    """A :class:`Step` whose residual multiplies out powers of products first.

    ``(b s^e)^x = b^x s^{e x}`` holds for ``b, s > 0`` and real exponents; sympy does not
    apply it by itself because it cannot tell that ``e = d/(d-2)`` is finite (it is, for
    every head dimension ``d > 2``), hence ``force=True``. The forced rules are wrong for
    a base that may be negative (``sqrt(x**2) = x``), so they are used only when every
    symbol of the step is positive; otherwise the step gets the usual residual.
    """

    def forced(self, diff):
        return sp.simplify(sp.powdenest(sp.expand_power_base(diff, force=True), force=True))


class _SumStep(Step):
    """A :class:`Step` between sums over one range: its residual is one sum of differences.

    ``c·Σ f - Σ g`` over the same limits is ``Σ (c f - g)``; the summand is expanded and
    simplified. A zero summand proves the step for every number of terms; a nonzero one
    is reported as the residual (the step may then fail where a cleverer summation would
    succeed, never the other way round). Sides of another shape use the usual residual.
    """

    @cached_property
    def residual(self):  # type: ignore[override]
        diff = self.lhs - self.rhs
        summands, limits = [], None
        for term in sp.Add.make_args(diff):
            sums = [factor for factor in sp.Mul.make_args(term) if isinstance(factor, sp.Sum)]
            if self.subs or len(sums) != 1 or limits not in (None, sums[0].limits):
                return residual(self.lhs, self.rhs, self.subs)
            limits, coefficient = sums[0].limits, term / sums[0]
            if coefficient.has(limits[0][0]):  # only a factor free of the index moves inside
                return residual(self.lhs, self.rhs, self.subs)
            summands.append(coefficient * sums[0].function)
        summand = sp.simplify(sp.expand(sp.Add(*summands)))
        return sp.Integer(0) if summand == 0 else sp.Sum(summand, *limits)


def linear_is_position_interpolation(frequency_factor: sp.Expr | None = None) -> Proof:
    """Dividing every frequency by ``s`` rotates position ``m`` as the default rule
    rotates position ``m / s`` (Chen et al. 2023).

    Step 1 (a definition): the rotation matrix at position ``m`` with frequency
    ``θ' = θ/s`` is the default rotation matrix at position ``p = m/s``; the angle
    ``m·(θ/s) = (m/s)·θ`` is one number written two ways, and sympy builds both as one
    object, so the step proves nothing and is marked so. Step 2 carries the proof: the
    logit of a query pair at ``m`` and a key pair at ``n`` is the trained model's logit at
    the offset ``(n - m)/s`` (sympy multiplies out the rotated pairs and combines the
    angle differences). ``θ``, ``m``, ``n``, ``s`` and the pairs are symbolic.

    Args:
        frequency_factor: what multiplies each frequency; ``1/s`` (the default) is the
            rule; ``s``, the false neighbour, mistakes "positions divided by ``s``" for
            "frequencies multiplied by ``s``".
    """
    factor = 1 / s if frequency_factor is None else frequency_factor
    theta = sp.Symbol("theta_i", positive=True)
    theta_new = sp.Symbol("theta_i'", positive=True)
    p = sp.Symbol("p", real=True)
    q = sp.Matrix(sp.symbols("q_1 q_2", real=True))
    k = sp.Matrix(sp.symbols("k_1 k_2", real=True))
    scaled_logit = ((_rotation(m * theta_new) * q).T * (_rotation(n * theta_new) * k))[0]
    trained_logit = (q.T * _rotation((n - m) / s * theta) * k)[0]
    new_frequency = r"\theta'_i = " + sp.latex(factor * theta)
    return Proof(
        "Linear scaling is position interpolation",
        r"For every frequency $\theta_i$, positions $m, n$ and factor $s$: with"
        r" $\theta'_i = \theta_i/s$ the rotation at position $m$ is the trained rotation at"
        r" position $m/s$, and the logit of a query at $m$ and a key at $n$ is the trained"
        r" model's logit at the offset $(n-m)/s$.",
        (
            Step(
                f"The rotation at position $m$ with ${new_frequency}$ is the default"
                " rotation at position $p = m/s$: the angle $m\\theta_i/s$ is the number"
                " $(m/s)\\theta_i$ written another way",
                _rotation(m * theta_new),
                _rotation(p * theta),
                subs={theta_new: factor * theta, p: m / s},
                by_definition=True,
                latex=(
                    r"R_{\theta'_i}(m) = R_{\theta_i}(p), \quad "
                    + new_frequency
                    + r",\ p = \tfrac{m}{s}"
                ),
            ),
            Step(
                "The logit of a query pair $q$ at $m$ and a key pair $k$ at $n$ is the trained"
                " logit at the offset $(n-m)/s$, once sympy expands the angle differences",
                scaled_logit,
                trained_logit,
                subs={theta_new: factor * theta},
                latex=(
                    r"\bigl(R_{\theta'_i}(m)\,q\bigr)^\top R_{\theta'_i}(n)\,k"
                    r" = q^\top R_{\theta_i}\!\bigl(\tfrac{n-m}{s}\bigr)\,k, \quad " + new_frequency
                ),
            ),
        ),
    )


def ntk_endpoints(exponent: sp.Expr | None = None) -> Proof:
    """NTK-aware base ``b' = b s^(d/(d-2))`` keeps ``θ_0`` and divides ``θ_{d/2-1}`` by ``s``.

    Each step substitutes the pair index into the unsubstituted ``b'^{-2i/d}``; in step 3
    the residual multiplies out ``(b s^{d/(d-2)})^{-(d-2)/d}`` itself.

    Args:
        exponent: the power of ``s`` in the new base; ``d/(d-2)`` (the default) is the
            rule; ``d/(d-1)``, the false neighbour, misses the lowest pair's exponent.
    """
    power = d / (d - 2) if exponent is None else exponent
    new_base = b * s**power
    last = d / 2 - 1
    return Proof(
        "NTK-aware scaling fixes both ends of the spectrum",
        r"With $b' = b\, s^{d/(d-2)}$ and $\theta'_i = b'^{-2i/d}$: the highest frequency"
        r" $\theta'_0 = \theta_0 = 1$, and the lowest"
        r" $\theta'_{d/2-1} = \theta_{d/2-1}/s$ exactly, for every $d > 2$, $b > 0$, $s > 0$.",
        (
            Step(
                "The highest frequency ($i = 0$) is unchanged",
                _theta(new_base, i),
                _theta(b, i),
                subs={i: 0},
                latex=rf"\left.{sp.latex(_theta(new_base, i))}\right|_{{i=0}} = "
                rf"\left.{sp.latex(_theta(b, i))}\right|_{{i=0}}",
            ),
            Step(
                "The exponent of the lowest pair is $-(d-2)/d$",
                -2 * i / d,
                -(d - 2) / d,
                subs={i: last},
                latex=r"\left.-\tfrac{2i}{d}\right|_{i=d/2-1} = -\tfrac{d-2}{d}",
            ),
            _PowerStep(
                f"so $s^{{{sp.latex(power)}}}$ is raised to $-(d-2)/d$, which leaves $1/s$",
                _theta(new_base, i),
                _theta(b, i) / s,
                subs={i: last},
                latex=rf"\left.{sp.latex(_theta(new_base, i))}\right|_{{i=d/2-1}} = "
                rf"\left.\frac{{{sp.latex(_theta(b, i))}}}{{s}}\right|_{{i=d/2-1}}",
            ),
        ),
    )


def dynamic_equals_default(offset: sp.Expr | None = None) -> Proof:
    """Dynamic NTK's bracket ``s L/L0 - (s-1)`` is 1 at ``L = L0``; the base grows with ``L``.

    The bracket is the one of emozilla's 2023 post and Hugging Face transformers (the
    ``dynamic`` kind of :mod:`pecode.scaling`); the YaRN paper's form is ``s = 1``.

    The bracket is substituted and differentiated inside the steps; the base formula
    itself (``b`` for ``L ≤ L0``) is the definition. Step 5 differentiates the base
    ``b·bracket^{d/(d-2)}`` (sympy applies the chain rule) and shows the derivative is the
    product ``b · d/(d-2) · s/L0 · bracket^{d/(d-2)} / bracket``. That every factor is
    positive for ``d > 2``, ``s > 0`` and ``L > L0`` (the bracket is then ``> 1`` by
    step 3), so that the base increases, is argued in words, not in sympy.

    Args:
        offset: what the bracket subtracts from ``s L/L0``; ``s - 1`` (the default) is the
            rule; ``s``, the false neighbour, drops the ``+1`` and gives the bracket
            ``s(L/L0 - 1)``, which is 0 at ``L0``.
    """
    subtract = s - 1 if offset is None else offset
    bracket = s * L / L0 - subtract
    exponent = d / (d - 2)
    return Proof(
        "Dynamic NTK is the default rule up to the trained length",
        r"The dynamic base is $b\,(sL/L_0 - (s-1))^{d/(d-2)}$ for $L > L_0$ and $b$ otherwise."
        r" At $L = L_0$ the bracket is exactly 1, so the rule is continuous there and equals the"
        r" default; past $L_0$ the bracket is $1 + s(L - L_0)/L_0$, which grows with slope"
        r" $s/L_0$, and the base's derivative in $L$ is a product of factors that are"
        r" positive for $d > 2$, $s > 0$, $L > L_0$ (the positivity argued in words).",
        (
            Step(
                "At the trained length the bracket is 1",
                bracket,
                sp.Integer(1),
                subs={L: L0},
                latex=rf"\left.{sp.latex(bracket)}\right|_{{L=L_0}} = 1",
            ),
            Step(
                "so the base of the $L > L_0$ branch meets the default base $b$",
                b * bracket**exponent,
                b,
                subs={L: L0},
                latex=rf"\left.{sp.latex(b * bracket**exponent)}\right|_{{L=L_0}} = b",
            ),
            Step(
                "Past $L_0$ the bracket is 1 plus $s$ times the relative excess length",
                bracket,
                1 + s * (L - L0) / L0,
            ),
            Step(
                "so it grows with slope $s/L_0 > 0$",
                sp.Derivative(bracket, L),
                s / L0,
            ),
            Step(
                "The base's derivative in $L$ is the product of $b$, $d/(d-2)$, $s/L_0$ and"
                " $\\text{bracket}^{d/(d-2)}/\\text{bracket}$ (sympy applies the chain rule)."
                " For $d > 2$, $s > 0$ and $L > L_0$ each factor is positive (the bracket is"
                " $1 + s(L-L_0)/L_0 > 1$ by step 3), so the base increases with $L$; that last"
                " sign argument is in words",
                sp.Derivative(b * bracket**exponent, L),
                b * exponent * (s / L0) * bracket**exponent / bracket,
                latex=(
                    rf"\frac{{\partial}}{{\partial L}}\,{sp.latex(b * bracket**exponent)} = "
                    r"b\cdot\frac{d}{d-2}\cdot\frac{s}{L_0}\cdot"
                    rf"\frac{{\left({sp.latex(bracket)}\right)^{{\frac{{d}}{{d-2}}}}}}"
                    rf"{{{sp.latex(bracket)}}}"
                ),
            ),
        ),
    )


def llama3_continuity(swap_factors: bool = False) -> Proof:
    """The Llama 3.1 middle band meets both outer bands (continuity at the band edges).

    The band edges are substituted into the unsubstituted weight and middle band inside
    the steps.

    Args:
        swap_factors: the false neighbour: ``f_low`` and ``f_high`` exchanged in the
            weight, which then is 1 where the rule needs 0 and 0 where it needs 1.
    """
    theta, lam = sp.symbols("theta lambda", positive=True)
    lo, hi = sp.symbols("f_low f_high", positive=True)
    first, second = (hi, lo) if swap_factors else (lo, hi)
    w = (L0 / lam - first) / (second - first)
    middle = (1 - w) * theta / s + w * theta
    return Proof(
        "The Llama 3.1 rule is continuous at its band edges",
        r"With weight $w(\lambda) = (L_0/\lambda - f_\text{low})/(f_\text{high} - f_\text{low})$"
        r" the middle band $(1-w)\,\theta/s + w\,\theta$ equals $\theta/s$"
        r" (the long-wavelength band) at"
        r" $\lambda = L_0/f_\text{low}$ and $\theta$ (the short-wavelength band) at"
        r" $\lambda = L_0/f_\text{high}$.",
        (
            Step(
                "At $\\lambda = L_0/f_\\text{low}$ the weight is 0",
                w,
                sp.Integer(0),
                subs={lam: L0 / lo},
                latex=rf"\left.{sp.latex(w)}\right|_{{\lambda = L_0/f_\text{{low}}}} = 0",
            ),
            Step(
                "so the middle band gives $\\theta/s$, as the long-wavelength band does",
                middle,
                theta / s,
                subs={lam: L0 / lo},
                latex=r"\left.\bigl((1-w)\,\theta/s + w\,\theta\bigr)"
                r"\right|_{\lambda = L_0/f_\text{low}} = \theta/s",
            ),
            Step(
                "At $\\lambda = L_0/f_\\text{high}$ the weight is 1",
                w,
                sp.Integer(1),
                subs={lam: L0 / hi},
                latex=rf"\left.{sp.latex(w)}\right|_{{\lambda = L_0/f_\text{{high}}}} = 1",
            ),
            Step(
                "so the middle band gives $\\theta$, as the short-wavelength band does",
                middle,
                theta,
                subs={lam: L0 / hi},
                latex=r"\left.\bigl((1-w)\,\theta/s + w\,\theta\bigr)"
                r"\right|_{\lambda = L_0/f_\text{high}} = \theta",
            ),
        ),
    )


def yarn_boundary(angle_per_turn: sp.Expr = 2 * sp.pi) -> Proof:
    """Pair ``i(β) = d ln(L0/(2πβ)) / (2 ln b)`` turns exactly ``β`` times over ``L0``.

    Step 1 is an evaluation by substitution: ``i(β)`` is substituted into the
    unsubstituted ``r_i = L0 b^{-2i/d} / (2π)``, and sympy's automatic evaluation of
    ``b^{-\\ln(x)/\\ln b}`` to ``1/x`` (as the substituted expression is built, not a
    simplification) leaves ``β``; a wrong index formula leaves something else and fails.
    Step 2 differentiates ``r_i`` in ``i`` (sympy's derivative): ``-(2 ln b/d) r_i``,
    negative for ``b > 1`` (said in words), so the pairs below ``i(β)`` turn more than
    ``β`` times and those above fewer.

    Args:
        angle_per_turn: the angle of one turn in the index formula; ``2π`` (the default)
            is right; ``π``, the false neighbour, gives the index where the pair turns
            ``β/2`` times.
    """
    beta = sp.Symbol("beta", positive=True)
    index = d * sp.log(L0 / (angle_per_turn * beta)) / (2 * sp.log(b))
    turns = L0 * _theta(b, i) / (2 * sp.pi)  # r_i = L0 / λ_i = L0 θ_i / (2π)
    return Proof(
        "Where YaRN's ramp starts and ends",
        r"Pair $i$ turns $r_i = L_0\theta_i/(2\pi) = L_0 / (2\pi b^{2i/d})$ times over the trained"
        r" context. The (real) index with $r = \beta$ is"
        r" $i(\beta) = d\ln(L_0/(2\pi\beta))/(2\ln b)$, and $r_i$ decreases in $i$.",
        (
            Step(
                "Substituting $i(\\beta)$ into $r_i$ gives back $\\beta$; sympy writes"
                " $b^{-\\ln x/\\ln b}$ as $1/x$ as the substituted expression is built",
                turns,
                beta,
                subs={i: index},
                latex=rf"\left.{sp.latex(turns)}\right|_{{i = {sp.latex(index)}}} = \beta",
            ),
            Step(
                "and $r_i$ falls as $i$ grows: its derivative is $-(2\\ln b/d)\\, r_i$, negative"
                " for $b > 1$, so pairs $i < i(\\beta)$ turn more than $\\beta$ times",
                sp.Derivative(turns, i),
                -2 * sp.log(b) / d * turns,
                latex=rf"\frac{{\partial}}{{\partial i}}\,{sp.latex(turns)} = "
                rf"-\frac{{2\ln b}}{{d}}\,{sp.latex(turns)}",
            ),
        ),
    )


def attention_factor_squares(power: int = 2) -> Proof:
    """Multiplying the cos and sin tables by ``c`` multiplies every logit by ``c²``.

    Step 1 multiplies the scaled rotation out against a symbolic pair; step 2 expands the
    dot product of a rotated query pair and key pair; step 3 is the whole logit: a
    symbolic sum over any number ``n`` of pairs, with indexed angles ``φ_j, ψ_j`` and
    entries ``q_{2j}, q_{2j+1}, k_{2j}, k_{2j+1}``, the rotations written out inside the
    summand, which sympy multiplies out and compares with ``c^power`` times the sum of the
    plain rotated dot products.

    Args:
        power: the power of ``c`` the logits are claimed to gain; 2 is right; 1, the
            false neighbour, confuses the factor on the tables with one on the logits
            (steps 2 and 3 fail).
    """
    c = sp.Symbol("c", positive=True)
    q = sp.Matrix(sp.symbols("q_1 q_2", real=True))
    k = sp.Matrix(sp.symbols("k_1 k_2", real=True))
    phi, psi = sp.symbols("phi psi", real=True)
    j = sp.Symbol("j", integer=True, nonnegative=True)
    pairs = sp.Symbol("n", integer=True, positive=True)
    angle_q, angle_k = sp.IndexedBase("varphi", real=True), sp.IndexedBase("psi", real=True)
    q_all, k_all = sp.IndexedBase("q", real=True), sp.IndexedBase("k", real=True)
    q_j = sp.Matrix([q_all[2 * j], q_all[2 * j + 1]])
    k_j = sp.Matrix([k_all[2 * j], k_all[2 * j + 1]])
    scaled_q, scaled_k = _rotation(phi, c) * q, _rotation(psi, c) * k
    plain_q, plain_k = _rotation(phi) * q, _rotation(psi) * k

    def logit(scale: sp.Expr | int) -> sp.Sum:
        rotated_q = _rotation(angle_q[j], scale) * q_j
        rotated_k = _rotation(angle_k[j], scale) * k_j
        return sp.Sum(rotated_q.dot(rotated_k), (j, 0, pairs - 1))

    return Proof(
        "An attention factor on cos and sin scales the logits by its square",
        r"Rotating a pair with tables $c\cos\varphi$, $c\sin\varphi$ multiplies it by $c$; the dot"
        r" product of a rotated query pair and key pair, and so the sum over any number of"
        r" pairs, gains $c^2$. This is how YaRN's temperature $1/t = (0.1\ln s + 1)^2$ reaches"
        r" the logits.",
        (
            Step(
                "Tables $c\\cos\\varphi$, $c\\sin\\varphi$ rotate a pair $q$ and multiply it"
                " by $c$",
                scaled_q,
                c * plain_q,
                latex=r"R^{(c)}_\varphi\, q = c\, R_\varphi\, q",
            ),
            Step(
                f"so the logit of a query pair and a key pair gains ${sp.latex(c**power)}$",
                scaled_q.dot(scaled_k),
                c**power * plain_q.dot(plain_k),
                latex=rf"(R^{{(c)}}_\varphi q)^\top R^{{(c)}}_\psi k = {sp.latex(c**power)}\,"
                r"(R_\varphi q)^\top R_\psi k",
            ),
            _SumStep(
                "and so does the whole logit, a sum over any number $n$ of pairs with angles"
                " $\\varphi_j$, $\\psi_j$ (symbolic $n$; sympy multiplies out the rotations"
                " in the summand)",
                logit(c),
                c**power * logit(1),
                latex=(
                    r"\sum_{j=0}^{n-1} (R^{(c)}_{\varphi_j} q_{(j)})^\top R^{(c)}_{\psi_j} k_{(j)}"
                    rf" = {sp.latex(c**power)} \sum_{{j=0}}^{{n-1}}"
                    r" (R_{\varphi_j} q_{(j)})^\top R_{\psi_j} k_{(j)}"
                ),
            ),
        ),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "scaling.linear_is_position_interpolation",
        linear_is_position_interpolation,
        lambda: linear_is_position_interpolation(frequency_factor=s),
        (1, 2),
    ),
    ProofCase(
        "scaling.ntk_endpoints",
        ntk_endpoints,
        lambda: ntk_endpoints(exponent=d / (d - 1)),
        (3,),
    ),
    ProofCase(
        "scaling.dynamic_equals_default",
        dynamic_equals_default,
        lambda: dynamic_equals_default(offset=s),
        (1, 2, 3),
    ),
    ProofCase(
        "scaling.yarn_boundary",
        yarn_boundary,
        lambda: yarn_boundary(angle_per_turn=sp.pi),
        (1,),
    ),
    ProofCase(
        "scaling.llama3_continuity",
        llama3_continuity,
        lambda: llama3_continuity(swap_factors=True),
        (1, 2, 3, 4),
    ),
    ProofCase(
        "scaling.attention_factor_squares",
        attention_factor_squares,
        lambda: attention_factor_squares(power=1),
        (2, 3),
    ),
)
"""Every proof of this module with its false neighbour and the steps where it fails."""
