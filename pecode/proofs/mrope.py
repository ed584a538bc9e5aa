"""Proofs about multi-axis RoPE (M-RoPE, 2-D RoPE), for any number of pairs and any axis map.

A head has a symbolic number ``N`` of pairs; pair ``j`` turns by the position on axis
``a(j)`` times its frequency ``θ_j``, where ``a`` is an undefined integer function: the
chunked layout, the interleaved one and 2-D RoPE's row/column split (RoPE-Axial) are all
values of it. RoPE-Mixed turns pair ``j`` by ``Σ_a ω_{j,a} m_a``, every axis at once
(:func:`mixed_frequency_offsets`). Positions are indexed symbols ``m_a`` (the query's
index on axis ``a``) and ``n_a`` (the key's), so every statement holds for any number of
axes and any sections. sympy evaluates the sums over ``j`` together with the
trigonometry. Every proof has a false neighbour in :data:`CASES`.

That text (one index on every axis) is 1-D RoPE needs no proof: with ``m_a = p`` for
every ``a`` the angles are ``p·θ_j`` by definition. What can go wrong there is code, and
``tests/test_mrope.py`` checks it against transformers.
"""

from __future__ import annotations

import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step

__all__ = ["CASES", "mixed_frequency_offsets", "multi_axis_offsets"]

_j = sp.Symbol("j", integer=True, positive=True)
_pairs = sp.Symbol("N", integer=True, positive=True)
_theta = sp.IndexedBase("theta", positive=True)
_q, _k = sp.IndexedBase("q", real=True), sp.IndexedBase("k", real=True)
_m, _n, _s = (sp.IndexedBase(name, real=True) for name in ("m", "n", "s"))
_axis = sp.Function("a", integer=True)  # the axis pair j reads
_other_axis = sp.Function("b", integer=True)  # another map, for the neighbours
_a = sp.Symbol("a", integer=True, positive=True)  # an axis, of A
_axes = sp.Symbol("A", integer=True, positive=True)
_omega = sp.IndexedBase("omega", real=True)  # RoPE-Mixed: pair j's frequency on axis a
_nu = sp.IndexedBase("nu", real=True)  # another table, for the neighbour


def _rotated(angle: sp.Expr, x: sp.IndexedBase) -> tuple[sp.Expr, sp.Expr]:
    """Pair ``j`` of ``x`` turned by ``angle``."""
    c, s = sp.cos(angle), sp.sin(angle)
    return c * x[_j, 1] - s * x[_j, 2], s * x[_j, 1] + c * x[_j, 2]


def _score(query_angle: sp.Expr, key_angle: sp.Expr) -> sp.Expr:
    """``Σ_j <R(query_angle_j) q_j, R(key_angle_j) k_j>`` over the ``N`` pairs."""
    (a1, a2), (b1, b2) = _rotated(query_angle, _q), _rotated(key_angle, _k)
    return sp.Sum(a1 * b1 + a2 * b2, (_j, 1, _pairs))


def _g(angle: sp.Expr) -> sp.Expr:
    """RoFormer's ``g``: one pair's score as a function of its relative angle."""
    dot = _q[_j, 1] * _k[_j, 1] + _q[_j, 2] * _k[_j, 2]
    cross = _q[_j, 2] * _k[_j, 1] - _q[_j, 1] * _k[_j, 2]
    return dot * sp.cos(angle) - cross * sp.sin(angle)


def multi_axis_offsets(same_map: bool = True) -> Proof:
    """The score depends on the positions only through the offset on each axis.

    Query and key rotate pair ``j`` by their index on axis ``a(j)``. Then the score is
    ``Σ_j g(q_j, k_j, (m_{a(j)} - n_{a(j)}) θ_j)``, and moving both tokens by any shift
    ``s_a`` per axis (an image patch and its neighbour, both moved down three rows and
    right two columns) leaves it unchanged. ``same_map=False`` is a port whose keys read
    another map ``b`` than its queries (sections chunked for one, interleaved for the
    other): both steps fail.
    """
    key_axis = _axis if same_map else _other_axis
    query_angle = _m[_axis(_j)] * _theta[_j]
    key_angle = _n[key_axis(_j)] * _theta[_j]
    shifted_query = (_m[_axis(_j)] + _s[_axis(_j)]) * _theta[_j]
    shifted_key = (_n[key_axis(_j)] + _s[key_axis(_j)]) * _theta[_j]
    offset = (_m[_axis(_j)] - _n[_axis(_j)]) * _theta[_j]
    steps = (
        Step(
            "Each pair turns by its own axis's index, so its score is $g$ of that axis's offset",
            _score(query_angle, key_angle),
            sp.Sum(_g(offset), (_j, 1, _pairs)),
            latex=(
                "\\sum_{j=1}^{N} \\langle R(m_{a(j)}\\theta_j) q_j, R(n_{a(j)}\\theta_j) k_j "
                "\\rangle = \\sum_{j=1}^{N} g(q_j, k_j, (m_{a(j)} - n_{a(j)})\\theta_j)"
            ),
        ),
        Step(
            "Moving both tokens by $s_a$ on every axis $a$ leaves the score unchanged",
            _score(shifted_query, shifted_key),
            _score(query_angle, key_angle),
            latex=(
                "\\mathrm{score}(m + s, n + s) = \\mathrm{score}(m, n) "
                "\\text{ for every shift } s = (s_0, s_1, \\dots)"
            ),
        ),
    )
    title = "Multi-axis RoPE sees offsets per axis"
    if not same_map:
        title += " (keys reading another axis map than queries)"
    return Proof(
        title,
        "For any number of pairs and any axis map, the rotated score depends on the two "
        "tokens' positions only through their offset on each axis.",
        steps,
    )


def _mixed_angle(frequency: sp.IndexedBase, p: sp.IndexedBase, shift: bool = False) -> sp.Expr:
    """``Σ_a ω_{j,a} p_a`` (or ``Σ_a ω_{j,a} (p_a + s_a)``) over the ``A`` axes."""
    position = p[_a] + _s[_a] if shift else p[_a]
    return sp.Sum(frequency[_j, _a] * position, (_a, 1, _axes))


def mixed_frequency_offsets(same_frequencies: bool = True) -> Proof:
    """With mixed frequencies the score still depends only on the offset on each axis.

    RoPE-Mixed (Heo et al. 2024) turns pair ``j`` by ``Σ_a ω_{j,a} m_a``, every axis at
    once with its own (learned) frequency. The angle is linear in the position, so the
    query's angle minus the key's is ``Σ_a ω_{j,a} (m_a - n_a)``: the score is
    ``Σ_j g(q_j, k_j, Σ_a ω_{j,a}(m_a - n_a))``, and moving both tokens by a shift
    ``s`` leaves it unchanged. The axial split is the case where ``ω_{j,a}`` is zero
    but on one axis per pair, which :func:`multi_axis_offsets` proves for any axis map.
    ``same_frequencies=False`` is keys turned by another table ``ν``, as when a key head
    shared by query heads with different frequencies (grouped-query attention) takes
    one head's table: both steps fail.
    """
    key_frequency = _omega if same_frequencies else _nu
    query_angle, key_angle = _mixed_angle(_omega, _m), _mixed_angle(key_frequency, _n)
    offset = sp.Sum(_omega[_j, _a] * (_m[_a] - _n[_a]), (_a, 1, _axes))
    steps = (
        Step(
            "A pair's query and key angles differ by the mixed angle of the offset, so its "
            "score is $g$ of that angle",
            _score(query_angle, key_angle),
            sp.Sum(_g(offset), (_j, 1, _pairs)),
            latex=(
                "\\sum_{j=1}^{N} \\langle R(\\textstyle\\sum_a \\omega_{j,a} m_a) q_j, "
                "R(\\textstyle\\sum_a \\omega_{j,a} n_a) k_j \\rangle = \\sum_{j=1}^{N} "
                "g\\big(q_j, k_j, \\textstyle\\sum_{a=1}^{A} \\omega_{j,a} (m_a - n_a)\\big)"
            ),
        ),
        Step(
            "Moving both tokens by $s_a$ on every axis $a$ leaves the score unchanged",
            _score(
                _mixed_angle(_omega, _m, shift=True), _mixed_angle(key_frequency, _n, shift=True)
            ),
            _score(query_angle, key_angle),
            latex=(
                "\\mathrm{score}(m + s, n + s) = \\mathrm{score}(m, n) "
                "\\text{ for every shift } s = (s_1, \\dots, s_A)"
            ),
        ),
    )
    title = "Mixed-frequency 2-D RoPE sees offsets per axis"
    if not same_frequencies:
        title += " (keys turned by another frequency table)"
    return Proof(
        title,
        "For any number of pairs and axes and any frequencies $\\omega_{j,a}$, the rotated "
        "score depends on the two tokens' positions only through their offset on each axis.",
        steps,
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "mrope.multi_axis_offsets",
        multi_axis_offsets,
        lambda: multi_axis_offsets(same_map=False),
        (1, 2),
    ),
    ProofCase(
        "mrope.mixed_frequency_offsets",
        mixed_frequency_offsets,
        lambda: mixed_frequency_offsets(same_frequencies=False),
        (1, 2),
    ),
)
"""Every proof about multi-axis and 2-D RoPE with its false neighbour and the steps where
that one fails."""
