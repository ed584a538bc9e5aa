"""Proofs about the long-context RoPE rules (chapter 10), for symbolic sizes and factors.

The head dimension ``d``, the base ``b``, the factor ``s`` and the lengths are positive
symbols, so each statement holds for every value, not for one configuration.
"""

from __future__ import annotations

import sympy as sp

from pecode.proofs.core import Proof, Step

__all__ = [
    "attention_factor_squares",
    "dynamic_equals_default",
    "linear_is_position_interpolation",
    "llama3_continuity",
    "ntk_endpoints",
    "yarn_boundary",
]

d, b, s = sp.symbols("d b s", positive=True)
i = sp.Symbol("i", nonnegative=True)
m = sp.Symbol("m", real=True)
L, L0 = sp.symbols("L L_0", positive=True)


def _theta(base: sp.Expr, index: sp.Expr) -> sp.Expr:
    return base ** (-2 * index / d)


def linear_is_position_interpolation() -> Proof:
    """Dividing every frequency by ``s`` rotates position ``m`` as the default rule
    rotates position ``m / s`` (Chen et al. 2023)."""
    theta = _theta(b, i)
    return Proof(
        "Linear scaling is position interpolation",
        r"For every pair $i$, position $m$ and factor $s$:"
        r" $m \cdot (\theta_i / s) = (m/s) \cdot \theta_i$,"
        " so the cos and sin tables, and every rotated query and key, are those of position $m/s$.",
        (
            Step(
                "The angle of pair $i$ at position $m$ with frequency $\\theta_i/s$ equals the"
                " default angle at position $m/s$",
                m * (theta / s),
                (m / s) * theta,
            ),
            Step(
                "hence the same rotation (cosine and sine of equal angles)",
                sp.Matrix([sp.cos(m * (theta / s)), sp.sin(m * (theta / s))]),
                sp.Matrix([sp.cos((m / s) * theta), sp.sin((m / s) * theta)]),
            ),
        ),
    )


def ntk_endpoints() -> Proof:
    """NTK-aware base ``b' = b s^(d/(d-2))`` keeps ``θ_0`` and divides ``θ_{d/2-1}`` by ``s``."""
    new_base = b * s ** (d / (d - 2))
    last = d / 2 - 1
    return Proof(
        "NTK-aware scaling fixes both ends of the spectrum",
        r"With $b' = b\, s^{d/(d-2)}$ and $\theta'_i = b'^{-2i/d}$: the highest frequency"
        r" $\theta'_0 = \theta_0 = 1$, and the lowest"
        r" $\theta'_{d/2-1} = \theta_{d/2-1}/s$ exactly.",
        (
            Step("The highest frequency ($i = 0$) is unchanged", _theta(new_base, 0), _theta(b, 0)),
            Step(
                "The exponent of the lowest pair is $-2(d/2-1)/d = -(d-2)/d$",
                -2 * last / d,
                -(d - 2) / d,
            ),
            Step(
                "so $s^{d/(d-2)}$ is raised to $-(d-2)/d$, which leaves $1/s$",
                sp.powdenest(sp.expand_power_base(_theta(new_base, last), force=True), force=True),
                _theta(b, last) / s,
            ),
        ),
    )


def dynamic_equals_default() -> Proof:
    """Dynamic NTK's base factor ``(s L/L0 - (s-1))`` is 1 at ``L = L0`` and grows with ``L``."""
    grown = s * L / L0 - (s - 1)
    return Proof(
        "Dynamic NTK is the default rule up to the trained length",
        r"The dynamic base is $b\,(sL/L_0 - (s-1))^{d/(d-2)}$ for $L > L_0$ and $b$ otherwise."
        r" At $L = L_0$ the bracket is exactly 1, so the rule is continuous there and equals the"
        r" default; past $L_0$ the bracket grows linearly, with slope $s/L_0 > 0$.",
        (
            Step("At the trained length the bracket is 1", grown.subs(L, L0), sp.Integer(1)),
            Step("so the base is unchanged", b * grown.subs(L, L0) ** (d / (d - 2)), b),
            Step("The bracket grows with slope $s/L_0$", sp.diff(grown, L), s / L0),
        ),
    )


def llama3_continuity() -> Proof:
    """The Llama 3.1 middle band meets both outer bands (continuity at the band edges)."""
    theta, lam = sp.symbols("theta lambda", positive=True)
    lo, hi = sp.symbols("f_low f_high", positive=True)
    w = (L0 / lam - lo) / (hi - lo)
    middle = (1 - w) * theta / s + w * theta
    return Proof(
        "The Llama 3.1 rule is continuous at its band edges",
        r"With weight $w(\lambda) = (L_0/\lambda - f_\text{low})/(f_\text{high} - f_\text{low})$"
        r" the middle band $(1-w)\,\theta/s + w\,\theta$ equals $\theta/s$"
        r" (the long-wavelength band) at"
        r" $\lambda = L_0/f_\text{low}$ and $\theta$ (the short-wavelength band) at"
        r" $\lambda = L_0/f_\text{high}$.",
        (
            Step("At $\\lambda = L_0/f_\\text{low}$ the weight is 0", w.subs(lam, L0 / lo), 0),
            Step(
                "so the middle band gives $\\theta/s$, as the long-wavelength band does",
                middle.subs(lam, L0 / lo),
                theta / s,
            ),
            Step("At $\\lambda = L_0/f_\\text{high}$ the weight is 1", w.subs(lam, L0 / hi), 1),
            Step(
                "so the middle band gives $\\theta$, as the short-wavelength band does",
                middle.subs(lam, L0 / hi),
                theta,
            ),
        ),
    )


def yarn_boundary() -> Proof:
    """Pair ``i(β) = d ln(L0/(2πβ)) / (2 ln b)`` turns exactly ``β`` times over ``L0``."""
    beta = sp.Symbol("beta", positive=True)
    index = d * sp.log(L0 / (2 * sp.pi * beta)) / (2 * sp.log(b))
    turns = L0 * _theta(b, index) / (2 * sp.pi)  # r = L0 / λ = L0 θ / (2π)
    return Proof(
        "Where YaRN's ramp starts and ends",
        r"Pair $i$ turns $r_i = L_0\theta_i/(2\pi) = L_0 / (2\pi b^{2i/d})$ times over the trained"
        r" context. The (real) index with $r = \beta$ is"
        r" $i(\beta) = d\ln(L_0/(2\pi\beta))/(2\ln b)$.",
        (
            Step(
                "Substituting $i(\\beta)$ into $r_i$ gives back $\\beta$",
                sp.simplify(sp.powsimp(sp.expand_log(turns, force=True), force=True)),
                beta,
            ),
        ),
    )


def attention_factor_squares() -> Proof:
    """Multiplying the cos and sin tables by ``c`` multiplies every logit by ``c²``."""
    c = sp.Symbol("c", positive=True)
    a1, a2, k1, k2 = sp.symbols("q_1 q_2 k_1 k_2", real=True)
    phi, psi = sp.symbols("phi psi", real=True)

    def rotate(x1, x2, angle, scale):
        cos, sin = scale * sp.cos(angle), scale * sp.sin(angle)
        return sp.Matrix([x1 * cos - x2 * sin, x1 * sin + x2 * cos])

    scaled = rotate(a1, a2, phi, c).dot(rotate(k1, k2, psi, c))
    plain = rotate(a1, a2, phi, 1).dot(rotate(k1, k2, psi, 1))
    return Proof(
        "An attention factor on cos and sin scales the logits by its square",
        r"Rotating a pair with tables $c\cos\varphi$, $c\sin\varphi$ multiplies it by $c$; the dot"
        r" product of a rotated query pair and key pair, and so the sum over pairs, gains $c^2$."
        r" This is how YaRN's temperature $1/t = (0.1\ln s + 1)^2$ reaches the logits.",
        (
            Step(
                "For one pair with query angle $\\varphi$ and key angle $\\psi$",
                sp.expand(sp.trigsimp(scaled)),
                sp.expand(sp.trigsimp(c**2 * plain)),
            ),
        ),
    )
