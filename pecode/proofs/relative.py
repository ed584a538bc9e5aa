"""Proofs for relative encodings (chapters 4-5): the four-term expansion and what each
method does with it, the regrouping behind Transformer-XL's fast form, the index
arithmetic of the relative shift, and the clipped offsets of Shaw et al.

Each proof function takes a keyword that builds its false neighbour, the same
derivation of a plausibly wrong claim (an expansion without a cross term, Transformer-XL's
``u`` and ``v`` swapped, the shift in the wrong direction, an offset clipped on one side
only); :data:`CASES` lists them with the steps at which they fail.

The four-term table (:func:`four_term_table`) is not a proof: it is read off the
implementations. Each method's formula (:func:`method_scores`, from its paper) is
expanded into the four slots; the implementation in :mod:`pecode.relative`,
:mod:`pecode.alibi`, :mod:`pecode.rope` or :mod:`pecode.absolute` is run on random
float64 inputs, its logit split into the same four slots by switching the query's and
the key's content off, and every slot of the formula is fitted to the implementation's.
A cell shows the formula's term only where the implementation's slot equals it with
coefficient 1; a term of the wrong sign, or a term the formula does not have, shows in
the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, reduce

import numpy as np
import sympy as sp
import torch
from sympy.matrices.expressions.matexpr import MatrixExpr

from pecode import absolute as _absolute
from pecode import alibi as _alibi
from pecode import relative as _relative
from pecode import rope as _rope
from pecode.proofs.core import Proof, ProofCase, Step
from pecode.reference.absolute import sinusoidal_rows_loop
from pecode.reference.relative import t5_bucket_loop
from pecode.reference.rope import rope_inv_freq_loop

__all__ = [
    "CASES",
    "FourTermRow",
    "clipped_offset_shift_invariance",
    "four_term_expansion",
    "four_term_table",
    "method_scores",
    "relative_shift_index",
    "transformer_xl_regrouping",
]

_d, _dk = sp.symbols("d d_k", integer=True, positive=True)
_x_i = sp.MatrixSymbol("x_i", 1, _d)
_x_j = sp.MatrixSymbol("x_j", 1, _d)
_p_i = sp.MatrixSymbol("p_i", 1, _d)
_p_j = sp.MatrixSymbol("p_j", 1, _d)
_W_Q = sp.MatrixSymbol("W_Q", _d, _dk)
_W_K = sp.MatrixSymbol("W_K", _d, _dk)


class _DistributeStep(Step):
    """A :class:`Step` whose residual first distributes products over sums (``sp.expand``).

    sympy keeps a product of matrix sums such as ``(x + p) W`` as it is built; its
    ``expand`` multiplies it out, and the terms that then agree cancel.
    """

    @cached_property
    def residual(self):  # type: ignore[override]
        diff = self.lhs - self.rhs
        if self.subs:
            diff = diff.subs(dict(self.subs))
        diff = sp.expand(diff)
        if isinstance(diff, sp.MatrixBase):
            return diff.applyfunc(sp.simplify)
        return diff.doit() if isinstance(diff, MatrixExpr) else sp.simplify(diff)


def _row(name: str, size: int) -> sp.Matrix:
    return sp.Matrix(1, size, lambda _, c: sp.Symbol(f"{name}_{{{c}}}", real=True))


def _matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda r, c: sp.Symbol(f"{name}_{{{r}{c}}}", real=True))


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")


_MISTAKES = (None, "missing cross term")


def four_term_expansion(d: int = 3, d_k: int = 2, *, mistake: str | None = None) -> Proof:
    """``(x_i + p_i) W_Q ((x_j + p_j) W_K)ᵀ`` is the sum of four terms.

    Content-content, content-position, position-content and position-position
    (the expansion behind Dai et al. 2019, §3.3, and Ke et al. 2021). Step 1 uses
    matrix symbols of symbolic size ``1 x d`` and ``d x d_k``, and sympy's ``expand``
    multiplies the product out; step 2 checks the same with every entry a free symbol
    for the given sizes.

    Args:
        d, d_k: sizes for the explicit check (1 to 4 each).
        mistake: ``"missing cross term"`` builds the false neighbour, an expansion
            without the position-content term (3); both steps then fail.

    Raises:
        TypeError, ValueError: a size is not an int in ``1 .. 4``, or an unknown mistake.
    """
    _check_int("d", d, 1, 4)
    _check_int("d_k", d_k, 1, 4)
    if mistake not in _MISTAKES:
        raise ValueError(f"mistake must be one of {_MISTAKES}, got {mistake!r}")
    keep = (0, 1, 3) if mistake else (0, 1, 2, 3)
    terms = _four_terms(_x_i, _x_j, _p_i, _p_j, _W_Q, _W_K)
    named = (
        "x_iW_QW_K^\\top x_j^\\top",
        "x_iW_QW_K^\\top p_j^\\top",
        "p_iW_QW_K^\\top x_j^\\top",
        "p_iW_QW_K^\\top p_j^\\top",
    )
    step_symbolic = _DistributeStep(
        "Multiply the product out (symbolic sizes $1\\times d$, $d \\times d_k$)",
        (_x_i + _p_i) * _W_Q * ((_x_j + _p_j) * _W_K).T,
        sp.MatAdd(*(terms[t] for t in keep)),
        latex="(x_i + p_i)W_Q\\big((x_j + p_j)W_K\\big)^\\top = "
        + " + ".join(named[t] for t in keep),
    )
    xi, xj, pi, pj = (_row(n, d) for n in ("x", "y", "p", "s"))
    wq, wk = _matrix("a", d, d_k), _matrix("b", d, d_k)
    explicit = _four_terms(xi, xj, pi, pj, wq, wk)
    step_explicit = Step(
        f"The same with every entry a free symbol ($d = {d}$, $d_k = {d_k}$)",
        (xi + pi) * wq * ((xj + pj) * wk).T,
        reduce(lambda s, t: s + t, (explicit[t] for t in keep)),
        latex=(
            f"(x_i + p_i)W_Q\\big((x_j + p_j)W_K\\big)^\\top = \\textstyle\\sum_{{t}}"
            f" \\text{{term}}_t \\quad (x \\in \\mathbb{{R}}^{{1\\times {d}}},"
            f" W \\in \\mathbb{{R}}^{{{d}\\times {d_k}}},\\ "
            f"t \\in \\{{{', '.join(str(t + 1) for t in keep)}\\}})"
        ),
    )
    return Proof(
        "The four-term expansion",
        "With absolute positions added to the inputs, every attention logit is the sum of a "
        "content-content, a content-position, a position-content and a position-position term"
        + (" — tested here without the position-content term." if mistake else "."),
        (step_symbolic, step_explicit),
    )


def _four_terms(xi, xj, pi, pj, wq, wk) -> list:
    return [
        xi * wq * wk.T * xj.T,
        xi * wq * wk.T * pj.T,
        pi * wq * wk.T * xj.T,
        pi * wq * wk.T * pj.T,
    ]


def transformer_xl_regrouping(d_k: int = 3, *, swap_uv: bool = False) -> Proof:
    """Terms (a)+(b)+(c)+(d) of Transformer-XL regroup into two products.

    ``q kᵀ + q rᵀ + u kᵀ + v rᵀ = (q + u) kᵀ + (q + v) rᵀ`` with ``q = x_i W_Q``,
    ``k = x_j W_K``, ``r = R_{i-j} W_{K,R}`` (Dai et al. 2019, §3.3). This is why the
    fast form computes ``(q + v)`` against all distances once. Step 1 with symbolic
    width (sympy's ``expand`` multiplies the right side out), step 2 with explicit entries.

    Args:
        d_k: the width for the explicit check (1 to 6).
        swap_uv: the false neighbour, ``(q + v) kᵀ + (q + u) rᵀ`` (the content and the
            position bias exchanged); both steps then fail.

    Raises:
        TypeError, ValueError: ``d_k`` is not an int in ``1 .. 6``.
    """
    _check_int("d_k", d_k, 1, 6)
    q, k, r, u, v = (sp.MatrixSymbol(n, 1, _dk) for n in ("q_i", "k_j", "r_{i-j}", "u", "v"))
    on_k, on_r = (v, u) if swap_uv else (u, v)  # what the regrouped form adds to q_i
    step_symbolic = _DistributeStep(
        "Group the terms by what multiplies $k_j$ and $r_{i-j}$ (symbolic width $d_k$)",
        q * k.T + q * r.T + u * k.T + v * r.T,
        (q + on_k) * k.T + (q + on_r) * r.T,
        latex=(
            "q_ik_j^\\top + q_ir_{i-j}^\\top + uk_j^\\top + vr_{i-j}^\\top = "
            f"(q_i + {on_k.name})k_j^\\top + (q_i + {on_r.name})r_{{i-j}}^\\top"
        ),
    )
    qe, ke, re, ue, ve = (_row(n, d_k) for n in ("q", "k", "r", "u", "v"))
    on_ke, on_re = (ve, ue) if swap_uv else (ue, ve)
    step_explicit = Step(
        f"The same with explicit entries ($d_k = {d_k}$)",
        qe * ke.T + qe * re.T + ue * ke.T + ve * re.T,
        (qe + on_ke) * ke.T + (qe + on_re) * re.T,
    )
    return Proof(
        "Transformer-XL's score in two products",
        (
            "$(a)+(b)+(c)+(d) = (q_i + v)\\cdot k_j + (q_i + u)\\cdot r_{i-j}$ "
            "— tested here with $u$ and $v$ swapped."
            if swap_uv
            else "$(a)+(b)+(c)+(d) = (q_i + u)\\cdot k_j + (q_i + v)\\cdot r_{i-j}$."
        ),
        (step_symbolic, step_explicit),
    )


def relative_shift_index(*, shift: str = "left") -> Proof:
    """The strided view of :func:`pecode.relative.relative_shift` picks distance ``i - j``.

    With ``W = L_q + L_k - 1`` columns ordered by distance ``δ_c = L_q - 1 - c``, row
    ``i`` is shifted left by ``L_q - 1 - i``: entry ``(i, j)`` reads column
    ``c = L_q - 1 - i + j``. (1) That column holds distance ``i - j``; (2) its flat
    offset ``i W + c`` equals ``i (W - 1) + (L_q - 1) + j``, a view with row stride
    ``W - 1`` and start ``L_q - 1``; (3) ``c`` is ``0`` at ``(L_q - 1, 0)`` and
    ``W - 1`` at ``(0, L_k - 1)``, and (4) it falls by 1 per row and grows by 1 per
    column, so (3) are its extremes and every column read is in range. All with symbolic
    integers; the column is substituted into each step (``subs``), so sympy does the
    arithmetic.

    Args:
        shift: ``"left"`` (the implementation); ``"right"`` builds the false neighbour,
            each row shifted right by ``L_q - 1 - i`` (``c = j - (L_q - 1 - i)``), which
            fails at every step.

    Raises:
        ValueError: ``shift`` is not ``"left"`` or ``"right"``.
    """
    if shift not in ("left", "right"):
        raise ValueError(f"shift must be 'left' or 'right', got {shift!r}")
    i, j, lq, lk = sp.symbols("i j L_q L_k", integer=True, nonnegative=True)
    c = sp.Symbol("c", integer=True)
    width = lq + lk - 1

    def column(row, key):
        moved = lq - 1 - row
        return key + moved if shift == "left" else key - moved

    column_tex = "L_q - 1 - i + j" if shift == "left" else "j - (L_q - 1 - i)"
    corners = sp.symbols("i_0 j_0 i_1 j_1", integer=True, nonnegative=True)
    i0, j0, i1, j1 = corners
    c0, c1, c_down, c_right = sp.symbols("c_0 c_1 c_{down} c_{right}", integer=True)
    return Proof(
        "The relative shift as a strided view",
        "Entry $(i, j)$ of the view with row stride $W-1$ and offset $L_q-1$ is the score "
        "of distance $i - j$"
        + (" — tested here with the rows shifted right." if shift == "right" else "."),
        (
            Step(
                f"Column $c = {column_tex}$ holds distance $\\delta_c = L_q - 1 - c$",
                lq - 1 - c,
                i - j,
                subs={c: column(i, j)},
                latex=f"L_q - 1 - c = i - j \\quad (c = {column_tex})",
            ),
            Step(
                "Its flat offset in a row-major $[L_q, W]$ block",
                i * width + c,
                i * (width - 1) + (lq - 1) + j,
                subs={c: column(i, j)},
                latex="iW + c = i(W - 1) + (L_q - 1) + j",
            ),
            Step(
                "At the corners $(i, j) = (L_q - 1, 0)$ and $(0, L_k - 1)$ the column is "
                "$0$ and $W - 1$",
                sp.Matrix([c0, c1]),
                sp.Matrix([0, width - 1]),
                subs={
                    c0: column(i0, j0),
                    c1: column(i1, j1),
                    i0: lq - 1,
                    j0: 0,
                    i1: 0,
                    j1: lk - 1,
                },
                latex="\\big(c(L_q - 1, 0),\\ c(0, L_k - 1)\\big) = (0,\\ W - 1)",
            ),
            Step(
                "One row down, the column falls by $1$; one key right, it grows by $1$: "
                "the corners are its extremes, and every column read lies in $0..W-1$",
                sp.Matrix([c_down - c, c_right - c]),
                sp.Matrix([-1, 1]),
                subs={c_down: column(i + 1, j), c_right: column(i, j + 1), c: column(i, j)},
                latex="\\big(c(i+1, j) - c(i, j),\\ c(i, j+1) - c(i, j)\\big) = (-1,\\ 1)",
            ),
        ),
    )


def clipped_offset_shift_invariance(*, one_sided: bool = False) -> Proof:
    """Shaw's clipped offset depends only on ``j - i`` and uses rows ``0 .. 2k`` of the table.

    ``clip(x, k) = max(-k, min(k, x))`` (Shaw et al. 2018, eqs. 5-7). (1) It is unchanged
    when both positions move by ``s``, as every function of ``j - i`` is (a definition,
    shown so), so every method whose position term is a function of the offset gives the
    same logits for a shifted sequence; (2) every offset at or below ``-k`` uses table
    row ``clip + k = 0`` and (3) every offset at or above ``k`` row ``2k`` (checked in
    sympy for symbolic ``k`` and distance ``t`` past the clip). Symbolic integers ``i, j,
    s`` and ``k, t >= 0``; positions and offsets enter through ``subs``.

    Args:
        one_sided: the false neighbour, ``min(k, x)`` (no clip below ``-k``): step 2 fails,
            because far keys on the left then index rows below 0.
    """
    i, j, s, x = sp.symbols("i j s x", integer=True)
    i2, j2 = sp.symbols("i' j'", integer=True)
    k, t = sp.symbols("k t", integer=True, nonnegative=True)

    def clip(value):
        upper = sp.Min(k, value)
        return upper if one_sided else sp.Max(-k, upper)

    clip_tex = "\\min(k, x)" if one_sided else "\\max(-k, \\min(k, x))"
    return Proof(
        "Clipped offsets",
        f"$\\operatorname{{clip}}(x, k) = {clip_tex}$ depends on the positions only through "
        "$j - i$ (by definition), and the table row $\\operatorname{clip}(j - i, k) + k$ is $0$ "
        "for every offset at or below $-k$ and $2k$ for every offset at or above $k$ (in "
        "between it is $j - i + k$, by the definition of clipping)"
        + (" — tested here with the offset clipped above only." if one_sided else "."),
        (
            Step(
                "Shift both positions by $s$: $i' = i + s$, $j' = j + s$ leave $j - i$, and "
                "so every function of it, unchanged",
                clip(j2 - i2),
                clip(j - i),
                subs={i2: i + s, j2: j + s},
                latex="\\operatorname{clip}(j' - i', k) = \\operatorname{clip}(j - i, k)",
                by_definition=True,  # holds for any function of j - i: nothing to check
            ),
            Step(
                "Every offset $x = -k - t$ at or below $-k$ uses row $0$",
                clip(x) + k,
                sp.Integer(0),
                subs={x: -k - t},
                latex="\\operatorname{clip}(-k - t, k) + k = 0 \\quad (t \\ge 0)",
            ),
            Step(
                "Every offset $x = k + t$ at or above $k$ uses row $2k$",
                clip(x) + k,
                2 * k,
                subs={x: k + t},
                latex="\\operatorname{clip}(k + t, k) + k = 2k \\quad (t \\ge 0)",
            ),
        ),
    )


# --------------------------------------------------------------------------- the table


def method_scores() -> dict[str, MatrixExpr]:
    """Each method's logit (before scaling) as its paper writes it, in the book's notation.

    Row vectors: ``x_i``, ``x_j`` content, ``p_i``, ``p_j`` absolute positions;
    ``a^K_{ij}`` Shaw's relation vector; ``R_{i-j}`` a sinusoid of the distance;
    ``P_{δ(i,j)}`` DeBERTa's relative embedding; ``u``, ``v`` global biases; ``β``, ``m``
    scalars (``1 x 1``); ``Θ_{j-i}`` RoPE's rotation. Papers: Vaswani et al. 2017,
    Shaw et al. 2018, Dai et al. 2019, Raffel et al. 2020, He et al. 2021,
    Press et al. 2022, Su et al. 2024. These are the candidates that
    :func:`four_term_table` fits to the implementations. DeBERTa's row is eq. (4) as
    printed, position-to-content indexed by ``δ(j, i)``, fitted to pecode's
    ``p2c_index="paper"``; the released code (pecode's default) reads ``δ(i, j)`` there,
    which fills the same slot (chapter 5).
    """
    a_k = sp.MatrixSymbol("a^K_{ij}", 1, _dk)
    r_rel = sp.MatrixSymbol("R_{i-j}", 1, _d)
    w_kr = sp.MatrixSymbol("W_{K,R}", _d, _dk)
    u = sp.MatrixSymbol("u", 1, _dk)
    v = sp.MatrixSymbol("v", 1, _dk)
    beta = sp.MatrixSymbol(r"\beta_{\mathrm{bucket}(j-i)}", 1, 1)
    p_ij = sp.MatrixSymbol(r"P_{\delta(i,j)}", 1, _d)
    p_ji = sp.MatrixSymbol(r"P_{\delta(j,i)}", 1, _d)
    w_qr = sp.MatrixSymbol("W_{Q,r}", _d, _dk)
    w_kr_deb = sp.MatrixSymbol("W_{K,r}", _d, _dk)
    alibi = sp.MatrixSymbol(r"\left(-m\,(i-j)\right)", 1, 1)
    rotation = sp.MatrixSymbol(r"\Theta_{j-i}", _dk, _dk)
    q_i, k_j = _x_i * _W_Q, _x_j * _W_K
    return {
        "absolute (Vaswani, BERT)": (_x_i + _p_i) * _W_Q * ((_x_j + _p_j) * _W_K).T,
        "Shaw et al.": q_i * (k_j + a_k).T,
        "Transformer-XL / XLNet": q_i * k_j.T
        + q_i * (r_rel * w_kr).T
        + u * k_j.T
        + v * (r_rel * w_kr).T,
        "T5": q_i * k_j.T + beta,
        "DeBERTa": q_i * k_j.T + q_i * (p_ij * w_kr_deb).T + (p_ji * w_qr) * k_j.T,
        "ALiBi": q_i * k_j.T + alibi,
        "RoPE": q_i * rotation * k_j.T,
    }


@dataclass(frozen=True)
class FourTermRow:
    """One method's row of the four-term table, read off its implementation.

    Attributes:
        method: the method's name (a key of :func:`method_scores`).
        slots: what fills each slot, in Markdown with LaTeX: ``"dropped"``, ``"kept"``,
            ``"kept (absolute)"`` or the formula's term, prefixed by the fitted
            coefficient where it is not 1, or a note where the implementation has a term
            the formula does not.
        coefficients: per slot, the least-squares coefficient of the formula's term in
            the implementation's slot (``None`` where the formula has no term there).
        matches: every slot of the implementation equals the formula's (coefficient 1,
            relative misfit below the table's tolerance; a slot the formula drops is zero).
    """

    method: str
    slots: tuple[str, str, str, str]
    coefficients: tuple[float | None, float | None, float | None, float | None]
    matches: bool


_ABSOLUTE = {"p_i", "p_j"}
_TOLERANCE = 1e-5  # relative misfit; float32 enters only through Transformer-XL's sinusoid


def _formula_slots(expr: MatrixExpr) -> list[list[MatrixExpr]]:
    """The expanded terms of a method's formula, sorted by which of ``x_i``, ``x_j`` they hold."""
    slots: list[list[MatrixExpr]] = [[], [], [], []]
    for term in sp.Add.make_args(sp.expand(expr)):
        names = {m.name for m in term.atoms(sp.MatrixSymbol)}
        has_q, has_k = "x_i" in names, "x_j" in names
        slots[0 if has_q and has_k else 1 if has_q else 2 if has_k else 3].append(term)
    return slots


def _label(slot: int, terms: list[MatrixExpr]) -> str:
    names = set().union(*({m.name for m in t.atoms(sp.MatrixSymbol)} for t in terms))
    if slot == 0 and names <= {"x_i", "x_j", "W_Q", "W_K"}:
        return "kept"
    if slot > 0 and names & _ABSOLUTE:
        return "kept (absolute)"
    return " + ".join(f"${sp.latex(t)}$" for t in terms)


def _evaluate(expr: MatrixExpr, values: dict[str, np.ndarray]) -> float:
    """A ``1 x 1`` matrix expression evaluated with numbers for its matrix symbols."""

    def walk(e):
        if isinstance(e, sp.MatrixSymbol):
            return values[e.name]
        if isinstance(e, sp.Transpose):
            return walk(e.arg).T
        if isinstance(e, sp.MatAdd):
            return sum(walk(a) for a in e.args)
        if isinstance(e, sp.MatMul):
            coefficient, matrices = e.as_coeff_matrices()
            return float(coefficient) * reduce(np.matmul, (walk(m) for m in matrices))
        raise TypeError(f"cannot evaluate {type(e).__name__}")

    return float(walk(expr)[0, 0])


def _clip(offset: int, k: int) -> int:
    return max(-k, min(k, offset))


def _deberta_delta(i: int, j: int, k: int) -> int:
    """He et al. (2021), eq. (3), as the paper states it."""
    if i - j <= -k:
        return 0
    if i - j >= k:
        return 2 * k - 1
    return i - j + k


def _xl_sinusoid(distance: int, dim: int) -> list[float]:
    """Transformer-XL's ``R_d``: sines then cosines of ``d ω_m``, ``ω_m = 10000^(-2m/dim)``."""
    omegas = [10000.0 ** (-2 * m / dim) for m in range(dim // 2)]
    return [math.sin(distance * w) for w in omegas] + [math.cos(distance * w) for w in omegas]


def _rope_rotation(offset: int, dim: int) -> np.ndarray:
    """Rotation by ``offset θ_m`` in each plane ``(m, m + dim/2)`` (the half layout)."""
    half = dim // 2
    out = np.zeros((dim, dim))
    for m, theta in enumerate(rope_inv_freq_loop(dim)):
        c, s = math.cos(offset * theta), math.sin(offset * theta)
        out[m, m], out[m, m + half], out[m + half, m], out[m + half, m + half] = c, -s, s, c
    return out


@dataclass
class _Method:
    """A method's logit as its implementation computes it, and its formula's bindings."""

    # (query content on/off, key content on/off) as 0-d tensors 1 or 0 -> logits [L, L]
    logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    bind: Callable[[int, int], dict[str, np.ndarray]]  # (i, j) -> values of the symbols
    visible: np.ndarray  # [L, L] bool: the pairs where the logit is defined


def _methods(length: int, start: int, seed: int) -> dict[str, _Method]:
    """Every method of :func:`method_scores` with random float64 parameters."""
    gen = torch.Generator().manual_seed(seed)
    d, dk, kmax = 8, 4, 2
    buckets, t5_max = 8, 16

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    w_q, w_k = rand(d, dk), rand(d, dk)
    positions = torch.arange(start, start + length)
    everywhere = np.ones((length, length), dtype=bool)

    def heads(x, w):  # content [L, d] -> one head [1, 1, L, dk]
        return (x @ w)[None, None]

    def content(q, k):
        return (q @ k.transpose(-2, -1))[0, 0]

    def common(i, j, xq, xk):
        return {
            "x_i": xq[i : i + 1].numpy(),
            "x_j": xk[j : j + 1].numpy(),
            "W_Q": w_q.numpy(),
            "W_K": w_k.numpy(),
        }

    methods: dict[str, tuple[Callable, Callable, np.ndarray]] = {}

    def absolute(xq, xk):
        table = _absolute.sinusoidal_table(start + length, d, dtype=torch.float64)[start:]
        return content(heads(xq + table, w_q), heads(xk + table, w_k))

    def absolute_bind(i, j):
        rows = sinusoidal_rows_loop([start + i, start + j], d)
        return {"p_i": np.array(rows[:1]), "p_j": np.array(rows[1:])}

    methods["absolute (Vaswani, BERT)"] = (absolute, absolute_bind, everywhere)

    key_table = rand(2 * kmax + 1, dk)

    def shaw(xq, xk):
        q, k = heads(xq, w_q), heads(xk, w_k)
        rel = _relative.shaw_key_logits(q, key_table, positions, positions, kmax)
        return content(q, k) + rel[0, 0]

    def shaw_bind(i, j):
        return {"a^K_{ij}": key_table[_clip(j - i, kmax) + kmax][None].numpy()}

    methods["Shaw et al."] = (shaw, shaw_bind, everywhere)

    w_kr, u, v = rand(d, dk), rand(1, dk), rand(1, dk)

    def transformer_xl(xq, xk):
        q, k = heads(xq, w_q), heads(xk, w_k)
        distances = _relative.relative_distances(length, length)
        encoding = _relative.sinusoidal_relative_encoding(distances, d).double()
        terms = _relative.transformer_xl_position_terms(q, k, (encoding @ w_kr)[None], u, v)
        return content(q, k) + terms[0, 0]

    def transformer_xl_bind(i, j):
        return {
            "R_{i-j}": np.array([_xl_sinusoid(i - j, d)]),
            "W_{K,R}": w_kr.numpy(),
            "u": u.numpy(),
            "v": v.numpy(),
        }

    methods["Transformer-XL / XLNet"] = (transformer_xl, transformer_xl_bind, everywhere)

    t5 = _relative.T5RelativePositionBias(1, num_buckets=buckets, max_distance=t5_max).double()
    t5_table = rand(buckets, 1)
    with torch.no_grad():
        t5.bias.weight.copy_(t5_table)

    def t5_logits(xq, xk):
        q, k = heads(xq, w_q), heads(xk, w_k)
        with torch.no_grad():
            return content(q, k) + t5.score_bias(q, k, positions, positions)[0]

    def t5_bind(i, j):
        bucket = t5_bucket_loop(j - i, True, buckets, t5_max)
        return {r"\beta_{\mathrm{bucket}(j-i)}": t5_table[bucket : bucket + 1].numpy()}

    methods["T5"] = (t5_logits, t5_bind, everywhere)

    rel_embeddings, w_qr, w_kr_deb = rand(2 * kmax, d), rand(d, dk), rand(d, dk)

    def deberta(xq, xk):
        q, k = heads(xq, w_q), heads(xk, w_k)
        c2p, p2c = _relative.deberta_position_terms(
            q,
            k,
            (rel_embeddings @ w_qr)[None],
            (rel_embeddings @ w_kr_deb)[None],
            positions,
            positions,
            kmax,
            "paper",  # eq. (4)'s delta(j, i) in p2c; the released code reads delta(i, j)
        )
        return content(q, k) + (c2p + p2c)[0, 0]

    def deberta_bind(i, j):
        return {
            r"P_{\delta(i,j)}": rel_embeddings[_deberta_delta(i, j, kmax)][None].numpy(),
            r"P_{\delta(j,i)}": rel_embeddings[_deberta_delta(j, i, kmax)][None].numpy(),
            "W_{Q,r}": w_qr.numpy(),
            "W_{K,r}": w_kr_deb.numpy(),
        }

    methods["DeBERTa"] = (deberta, deberta_bind, everywhere)

    slope = 0.5

    def alibi(xq, xk):
        q, k = heads(xq, w_q), heads(xk, w_k)
        slopes = torch.tensor([slope], dtype=torch.float64)
        bias = _alibi.alibi_bias_from_positions(slopes, positions, positions)[0]
        return content(q, k) + bias

    def alibi_bind(i, j):
        return {r"\left(-m\,(i-j)\right)": np.array([[-slope * (i - j)]])}

    causal = np.tril(everywhere)  # ALiBi defines its bias on the keys a query sees
    methods["ALiBi"] = (alibi, alibi_bind, causal)

    def rope(xq, xk):
        cos, sin = _rope.rope_cos_sin(positions, _rope.rope_inv_freq(dk, dtype=torch.float64))
        q = _rope.apply_rope(heads(xq, w_q), cos, sin)
        k = _rope.apply_rope(heads(xk, w_k), cos, sin)
        return content(q, k)

    def rope_bind(i, j):
        return {r"\Theta_{j-i}": _rope_rotation(j - i, dk)}

    methods["RoPE"] = (rope, rope_bind, everywhere)

    xq, xk = rand(length, d), rand(length, d)
    out = {}
    for name, (logits, bind, visible) in methods.items():

        def bind_all(i, j, bind=bind):
            return {**common(i, j, xq, xk), **bind(i, j)}

        def logits_of(qc, kc, logits=logits):
            return logits(xq * qc, xk * kc)

        out[name] = _Method(logits_of, bind_all, visible)
    return out


def _implementation_slots(method: _Method) -> list[np.ndarray]:
    """The implementation's logit split into the four slots by switching content off.

    With ``L(q, k)`` the logit for query content on (``q = 1``) or off (``q = 0``), and the
    same for the key: position-position ``L(0, 0)``, content-position ``L(1, 0) - L(0, 0)``,
    position-content ``L(0, 1) - L(0, 0)``, content-content the rest. Entries outside
    ``method.visible`` (ALiBi's ``-inf`` above the diagonal) are set to 0.
    """

    def at(qc, kc):
        value = method.logits(torch.tensor(float(qc)), torch.tensor(float(kc)))
        return np.where(method.visible, value.detach().numpy(), 0.0)

    none, query, key, both = at(0, 0), at(1, 0), at(0, 1), at(1, 1)
    return [both - query - key + none, query - none, key - none, none]


def four_term_table(length: int = 6, *, start: int = 3, seed: int = 0) -> list[FourTermRow]:
    """The four-term table, each row read off the method's implementation.

    For each method of :func:`method_scores`, the formula is expanded and its terms
    sorted into the four slots by which of ``x_i`` and ``x_j`` they contain (both:
    slot 1; only the query: slot 2; only the key: slot 3; neither: slot 4). The
    implementation (pecode's own functions, with random float64 weights, tables and
    content) computes the logits of ``length`` tokens at positions ``start ..``; its
    logit is split into the same four slots by switching the query's and the key's
    content off (position-position: neither content; content-position: what the query's
    content adds to that; position-content: what the key's adds; content-content: the
    rest). The formula's slot is evaluated pair by pair with the paper's index rules
    written out here (``clip(j - i, k)``, T5's buckets from
    :func:`pecode.reference.relative.t5_bucket_loop`, DeBERTa's ``δ``, the sinusoids,
    RoPE's rotation by ``(j - i) θ``) and fitted to the implementation's slot by least
    squares. The cell shows the formula's term when the coefficient is 1 and the misfit
    below ``1e-5``; otherwise the coefficient, or a note, and the row does not match.
    This is a numerical check on one draw of random inputs, not a proof.

    Raises:
        TypeError, ValueError: ``length`` not an int in ``2 .. 16`` or ``start`` negative.
    """
    _check_int("length", length, 2, 16)
    _check_int("start", start, 0, 10**6)
    formulas = method_scores()
    rows = []
    for name, method in _methods(length, start, seed).items():
        formula = _formula_slots(formulas[name])
        measured = _implementation_slots(method)
        scale = max(float(np.abs(sum(measured)).max()), 1.0)
        cells, coefficients, matches = [], [], True
        for slot, (terms, got) in enumerate(zip(formula, measured, strict=True)):
            if not terms:
                coefficients.append(None)
                if float(np.abs(got).max()) <= _TOLERANCE * scale:
                    cells.append("dropped")
                else:
                    cells.append("**a term the formula does not have**")
                    matches = False
                continue
            expected = np.zeros_like(got)
            for i, j in zip(*np.nonzero(method.visible), strict=True):
                values = method.bind(int(i), int(j))
                expected[i, j] = sum(_evaluate(t, values) for t in terms)
            norm = float((expected * expected).sum())
            coefficient = float((got * expected).sum()) / norm if norm > 0 else 0.0
            misfit = float(np.abs(got - coefficient * expected).max()) / scale
            coefficients.append(coefficient)
            label = _label(slot, terms)
            if misfit > _TOLERANCE:
                cells.append(f"**not** {label}")
                matches = False
            elif abs(coefficient - 1) > _TOLERANCE:
                cells.append(f"**{coefficient:+.3g} ×** {label}")
                matches = False
            else:
                cells.append(label)
        rows.append(FourTermRow(name, tuple(cells), tuple(coefficients), matches))
    return rows


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "relative.four_term_expansion",
        four_term_expansion,
        lambda: four_term_expansion(mistake="missing cross term"),
        (1, 2),
    ),
    ProofCase(
        "relative.transformer_xl_regrouping",
        transformer_xl_regrouping,
        lambda: transformer_xl_regrouping(swap_uv=True),
        (1, 2),
    ),
    ProofCase(
        "relative.relative_shift_index",
        relative_shift_index,
        lambda: relative_shift_index(shift="right"),
        (1, 2, 3, 4),
    ),
    ProofCase(
        "relative.clipped_offset_shift_invariance",
        clipped_offset_shift_invariance,
        lambda: clipped_offset_shift_invariance(one_sided=True),
        (2,),
    ),
)
"""The proofs of this module with their false neighbours."""
