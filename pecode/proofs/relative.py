"""Proofs for relative encodings (chapters 4-5): the four-term expansion and what each
method does with it, the regrouping behind Transformer-XL's fast form, the index
arithmetic of the relative shift, and the shift invariance of clipped offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
from sympy.matrices.expressions.matexpr import MatrixExpr

from pecode.proofs.core import Proof, Step

__all__ = [
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


def _row(name: str, size: int) -> sp.Matrix:
    return sp.Matrix(1, size, lambda _, c: sp.Symbol(f"{name}_{{{c}}}", real=True))


def _matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda r, c: sp.Symbol(f"{name}_{{{r}{c}}}", real=True))


def four_term_expansion(d: int = 3, d_k: int = 2) -> Proof:
    """``(x_i + p_i) W_Q ((x_j + p_j) W_K)ᵀ`` is the sum of four terms.

    Content-content, content-position, position-content and position-position
    (the expansion behind Dai et al. 2019, §3.3, and Ke et al. 2021). Step 1 uses
    matrix symbols of symbolic size ``1 x d`` and ``d x d_k`` (sympy distributes the
    product); step 2 checks the same with every entry a free symbol for the given sizes.

    Args:
        d, d_k: sizes for the explicit check (1 to 4 each).

    Raises:
        TypeError, ValueError: a size is not an int in ``1 .. 4``.
    """
    for name, value in (("d", d), ("d_k", d_k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= 4:
            raise ValueError(f"{name} must be between 1 and 4, got {value}")
    product = (_x_i + _p_i) * _W_Q * ((_x_j + _p_j) * _W_K).T
    terms = _four_terms(_x_i, _x_j, _p_i, _p_j, _W_Q, _W_K)
    step_symbolic = Step(
        "Distribute the product (symbolic sizes $1\\times d$, $d \\times d_k$)",
        sp.expand(product),
        sum(terms[1:], terms[0]),
        latex=(
            "(x_i + p_i)W_Q\\big((x_j + p_j)W_K\\big)^\\top = "
            "x_iW_QW_K^\\top x_j^\\top + x_iW_QW_K^\\top p_j^\\top"
            " + p_iW_QW_K^\\top x_j^\\top + p_iW_QW_K^\\top p_j^\\top"
        ),
    )
    xi, xj, pi, pj = (_row(n, d) for n in ("x", "y", "p", "s"))
    wq, wk = _matrix("a", d, d_k), _matrix("b", d, d_k)
    explicit = _four_terms(xi, xj, pi, pj, wq, wk)
    step_explicit = Step(
        f"The same with every entry a free symbol ($d = {d}$, $d_k = {d_k}$)",
        (xi + pi) * wq * ((xj + pj) * wk).T,
        explicit[0] + explicit[1] + explicit[2] + explicit[3],
        latex=(
            f"(x_i + p_i)W_Q\\big((x_j + p_j)W_K\\big)^\\top = \\textstyle\\sum_{{t=1}}^4"
            f" \\text{{term}}_t \\quad (x \\in \\mathbb{{R}}^{{1\\times {d}}},"
            f" W \\in \\mathbb{{R}}^{{{d}\\times {d_k}}})"
        ),
    )
    return Proof(
        "The four-term expansion",
        "With absolute positions added to the inputs, every attention logit is the sum of a "
        "content-content, a content-position, a position-content and a position-position term.",
        (step_symbolic, step_explicit),
    )


def _four_terms(xi, xj, pi, pj, wq, wk) -> list:
    return [
        xi * wq * wk.T * xj.T,
        xi * wq * wk.T * pj.T,
        pi * wq * wk.T * xj.T,
        pi * wq * wk.T * pj.T,
    ]


def transformer_xl_regrouping(d_k: int = 3) -> Proof:
    """Terms (a)+(b)+(c)+(d) of Transformer-XL regroup into two products.

    ``q kᵀ + q rᵀ + u kᵀ + v rᵀ = (q + u) kᵀ + (q + v) rᵀ`` with ``q = x_i W_Q``,
    ``k = x_j W_K``, ``r = R_{i-j} W_{K,R}`` (Dai et al. 2019, §3.3). This is why the
    fast form computes ``(q + v)`` against all distances once. Step 1 with symbolic
    width, step 2 with explicit entries.

    Raises:
        TypeError, ValueError: ``d_k`` is not an int in ``1 .. 6``.
    """
    if isinstance(d_k, bool) or not isinstance(d_k, int):
        raise TypeError(f"d_k must be an int, got {type(d_k).__name__}")
    if not 1 <= d_k <= 6:
        raise ValueError(f"d_k must be between 1 and 6, got {d_k}")
    q, k, r, u, v = (sp.MatrixSymbol(n, 1, _dk) for n in ("q_i", "k_j", "r_{i-j}", "u", "v"))
    four = q * k.T + q * r.T + u * k.T + v * r.T
    two = (q + u) * k.T + (q + v) * r.T
    step_symbolic = Step(
        "Group the terms by what multiplies $k_j$ and $r_{i-j}$ (symbolic width $d_k$)",
        four,
        sp.expand(two),
        latex=(
            "q_ik_j^\\top + q_ir_{i-j}^\\top + uk_j^\\top + vr_{i-j}^\\top"
            " = (q_i + u)k_j^\\top + (q_i + v)r_{i-j}^\\top"
        ),
    )
    qe, ke, re, ue, ve = (_row(n, d_k) for n in ("q", "k", "r", "u", "v"))
    step_explicit = Step(
        f"The same with explicit entries ($d_k = {d_k}$)",
        qe * ke.T + qe * re.T + ue * ke.T + ve * re.T,
        (qe + ue) * ke.T + (qe + ve) * re.T,
    )
    return Proof(
        "Transformer-XL's score in two products",
        "$(a)+(b)+(c)+(d) = (q_i + u)\\cdot k_j + (q_i + v)\\cdot r_{i-j}$.",
        (step_symbolic, step_explicit),
    )


def relative_shift_index() -> Proof:
    """The strided view of :func:`pecode.relative.relative_shift` picks distance ``i - j``.

    With ``W = L_q + L_k - 1`` columns ordered by distance ``δ_c = L_q - 1 - c``, entry
    ``(i, j)`` needs column ``c = L_q - 1 - i + j``: (1) that column holds distance
    ``i - j``; (2) its flat offset ``i W + c`` equals ``i (W - 1) + (L_q - 1) + j``, a
    view with row stride ``W - 1`` and start ``L_q - 1``; (3) ``0 <= c <= W - 1`` for
    all ``0 <= i < L_q``, ``0 <= j < L_k``. All with symbolic integers.
    """
    i, j, lq, lk = sp.symbols("i j L_q L_k", integer=True, nonnegative=True)
    width = lq + lk - 1
    column = lq - 1 - i + j
    return Proof(
        "The relative shift as a strided view",
        "Entry $(i, j)$ of the view with row stride $W-1$ and offset $L_q-1$ is the score "
        "of distance $i - j$.",
        (
            Step(
                "Column $c = L_q - 1 - i + j$ holds distance $\\delta_c = L_q - 1 - c$",
                lq - 1 - column,
                i - j,
                latex="L_q - 1 - (L_q - 1 - i + j) = i - j",
            ),
            Step(
                "Its flat offset in a row-major $[L_q, W]$ block",
                i * width + column,
                i * (width - 1) + (lq - 1) + j,
                latex="iW + (L_q - 1 - i + j) = i(W - 1) + (L_q - 1) + j",
            ),
            Step(
                "The column is in range: $c$ at its extremes ($i = L_q - 1, j = 0$ and "
                "$i = 0, j = L_k - 1$) is $0$ and $W - 1$",
                sp.Matrix([column.subs({i: lq - 1, j: 0}), column.subs({i: 0, j: lk - 1})]),
                sp.Matrix([0, width - 1]),
            ),
        ),
    )


def clipped_offset_shift_invariance() -> Proof:
    """Shaw's clipped offset, T5's and DeBERTa's inputs depend only on ``j - i``.

    ``clip(j - i, k)`` is unchanged when both positions move by ``s``, so every
    method whose position term is a function of the offset gives the same logits for a
    shifted sequence (Shaw et al. 2018, eqs. 5-7). Symbolic integers ``i, j, s, k``.
    """
    i, j, s = sp.symbols("i j s", integer=True)
    k = sp.Symbol("k", integer=True, nonnegative=True)

    def clip(x):
        return sp.Max(-k, sp.Min(k, x))

    return Proof(
        "Clipped offsets are shift-invariant",
        "$\\operatorname{clip}((j+s)-(i+s), k) = \\operatorname{clip}(j-i, k)$ "
        "for every shift $s$.",
        (
            Step(
                "Shift both positions by $s$",
                clip((j + s) - (i + s)),
                clip(j - i),
                latex=("\\max(-k, \\min(k, (j+s)-(i+s))) = \\max(-k, \\min(k, j-i))"),
            ),
        ),
    )


# --------------------------------------------------------------------------- the table


def method_scores() -> dict[str, MatrixExpr]:
    """Each method's logit (before scaling) as a sympy expression in the book's notation.

    Row vectors: ``x_i``, ``x_j`` content, ``p_i``, ``p_j`` absolute positions;
    ``a^K_{ij}`` Shaw's relation vector; ``R_{i-j}`` a sinusoid of the distance;
    ``P_{δ(i,j)}`` DeBERTa's relative embedding; ``u``, ``v`` global biases; ``β``, ``m``
    scalars (``1 x 1``); ``Θ_{j-i}`` RoPE's rotation. Papers: Vaswani et al. 2017,
    Shaw et al. 2018, Dai et al. 2019, Raffel et al. 2020, He et al. 2021,
    Press et al. 2022, Su et al. 2024.
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
    """One method's row of the four-term table: what fills each slot, in LaTeX."""

    method: str
    slots: tuple[str, str, str, str]


_CONTENT = {"x_i": "query", "x_j": "key"}
_ABSOLUTE = {"p_i", "p_j"}


def four_term_table() -> list[FourTermRow]:
    """Classify every term of :func:`method_scores` into the four slots of the expansion.

    Each method's expression is expanded; a term goes to slot 1 if it contains both
    ``x_i`` and ``x_j``, slot 2 if only ``x_i``, slot 3 if only ``x_j``, slot 4 if
    neither. The slot then reads "dropped" (no term), "kept" (the absolute term itself)
    or the LaTeX of what replaced it. Nothing in the table is typed by hand.
    """
    rows = []
    for method, expr in method_scores().items():
        slots: list[list[MatrixExpr]] = [[], [], [], []]
        for term in sp.Add.make_args(sp.expand(expr)):
            names = {m.name for m in term.atoms(sp.MatrixSymbol)}
            has_q, has_k = "x_i" in names, "x_j" in names
            slot = 0 if has_q and has_k else 1 if has_q else 2 if has_k else 3
            slots[slot].append(term)
        cells = []
        for slot, terms in enumerate(slots):
            if not terms:
                cells.append("dropped")
                continue
            names = set().union(*({m.name for m in t.atoms(sp.MatrixSymbol)} for t in terms))
            if slot == 0 and names <= {"x_i", "x_j", "W_Q", "W_K"}:
                cells.append("kept")
            elif slot > 0 and names & _ABSOLUTE:
                cells.append("kept (absolute)")
            else:
                cells.append(" + ".join(f"${sp.latex(t)}$" for t in terms))
        rows.append(FourTermRow(method, tuple(cells)))
    return rows
