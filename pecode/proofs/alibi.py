"""Proofs about ALiBi (chapter 6): what a causal softmax sees of the bias ``-m (i - j)``.

Under a causal mask, row ``i`` of ALiBi's bias is ``m j`` minus the row constant
``m i``, and a softmax ignores a constant added to its row: causal ALiBi is the same
attention as the key-position bias ``m j``. Without the mask the symmetric variant
``-m |i - j|`` is *not* any key-position bias, because it is not of the form
``f(i) + g(j)``.
"""

from __future__ import annotations

import sympy as sp

from pecode.proofs.attention import softmax_rows
from pecode.proofs.core import Proof, Step

__all__ = [
    "alibi_causal_row_shift",
    "alibi_key_bias_equivalence",
    "alibi_symmetric_is_not_key_bias",
]

_VARIANTS = ("causal", "symmetric", "unmasked")


def _check_n(n: int, largest: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if not 1 <= n <= largest:
        raise ValueError(f"n must be between 1 and {largest}, got {n}")


def alibi_key_bias_equivalence(n: int = 3, variant: str = "causal") -> Step:
    """One explicit check: does ``variant`` give the same attention as the bias ``m j``?

    Every entry of the ``n x n`` scores ``S`` and the slope ``m`` is a free symbol.

    - ``"causal"``: bias ``-m (i - j)`` under a causal mask, against ``m j`` under
      the same mask (holds);
    - ``"unmasked"``: the same linear bias ``-m (i - j)`` with no mask, against ``m j``
      with no mask (holds: without the mask the linear bias is only a key bias);
    - ``"symmetric"``: ``-m |i - j|`` with no mask, against ``m j`` (does not hold).

    Raises:
        TypeError, ValueError: ``n`` is not an int from 1 to 4, or ``variant`` is unknown.
    """
    _check_n(n, 4)
    if variant not in _VARIANTS:
        raise ValueError(f"variant must be one of {_VARIANTS}, got {variant!r}")
    m = sp.Symbol("m", positive=True)
    scores = sp.Matrix(n, n, lambda i, j: sp.Symbol(f"s_{{{i}{j}}}", real=True))
    allowed = (lambda i, j: j <= i) if variant == "causal" else None
    if variant == "symmetric":
        bias = sp.Matrix(n, n, lambda i, j: -m * abs(i - j))
        formula = "-m|i-j|"
    else:
        bias = sp.Matrix(n, n, lambda i, j: -m * (i - j))
        formula = "-m(i-j)"
    key_bias = sp.Matrix(n, n, lambda i, j: m * j)
    where = "under a causal mask" if variant == "causal" else "with no mask"
    where_tex = "\\text{causal mask}" if variant == "causal" else "\\text{no mask}"
    return Step(
        f"With ${formula}$ {where}, every row of the attention equals the one from the "
        f"key-position bias $m\\,j$ (explicit ${n}\\times{n}$, symbolic scores and $m$)",
        softmax_rows(scores + bias, allowed),
        softmax_rows(scores + key_bias, allowed),
        latex=(
            f"\\operatorname{{softmax}}\\big(S_{{ij}} {formula}\\big) = "
            f"\\operatorname{{softmax}}\\big(S_{{ij}} + m\\,j\\big)"
            f"\\quad ({where_tex},\\ n={n})"
        ),
    )


def alibi_causal_row_shift(n: int = 4) -> Proof:
    """Under a causal mask, ALiBi's bias acts exactly like the key-position bias ``m j``.

    Row ``i`` of ALiBi (Press et al. 2022, §3) adds ``-m (i - j)`` to the scores of
    the keys ``j <= i``. Steps 1–3 are symbolic in ``m``, ``i``, ``j`` and the
    scores (so they hold for every length); step 4 checks the whole ``n x n``
    attention with free symbols; step 5 says what the bias depends on.

    Raises:
        TypeError, ValueError: ``n`` is not an int from 1 to 4.
    """
    _check_n(n, 4)
    m = sp.Symbol("m", positive=True)
    i, j, k, t = sp.symbols("i j k t", integer=True, nonnegative=True)
    c = sp.Symbol("c", real=True)
    s = sp.IndexedBase("s", real=True)

    def causal_softmax(logit):  # softmax over the keys 0..i of row i
        return sp.exp(logit(j)) / sp.Sum(sp.exp(logit(k)), (k, 0, i))

    step_split = Step(
        "ALiBi's bias is the key term $m\\,j$ plus a term $-m\\,i$ that depends on the row only",
        -m * (i - j),
        m * j - m * i,
    )
    step_shift = Step(
        "A softmax over the visible keys $0..i$ ignores a constant $c$ added to all of them",
        causal_softmax(lambda x: s[x] + c),
        causal_softmax(lambda x: s[x]),
        latex=(
            "\\frac{e^{s_j + c}}{\\sum_{k=0}^{i} e^{s_k + c}} = "
            "\\frac{e^{s_j}}{\\sum_{k=0}^{i} e^{s_k}}"
        ),
    )
    step_row = Step(
        "So row $i$ of causal ALiBi equals the softmax of the scores plus $m\\,j$ "
        "(symbolic $i$, $m$ and scores $s_k$)",
        causal_softmax(lambda x: s[x] - m * (i - x)),
        causal_softmax(lambda x: s[x] + m * x),
        latex=(
            "\\frac{e^{s_j - m(i-j)}}{\\sum_{k=0}^{i} e^{s_k - m(i-k)}} = "
            "\\frac{e^{s_j + m j}}{\\sum_{k=0}^{i} e^{s_k + m k}}"
        ),
    )
    step_matrix = alibi_key_bias_equivalence(n, "causal")
    step_translate = Step(
        "Shifting every position by $t$ leaves ALiBi's bias unchanged; the key form "
        "$m\\,j$ changes by $m\\,t$, a row constant the softmax ignores",
        -m * ((i + t) - (j + t)),
        -m * (i - j),
        latex="-m\\big((i + t) - (j + t)\\big) = -m(i - j)",
    )
    return Proof(
        "Causal ALiBi is a key-position bias",
        "Under a causal mask, the attention with bias $-m(i-j)$ equals the attention "
        "with bias $m\\,j$, for every row $i$, every slope $m$ and all scores.",
        (step_split, step_shift, step_row, step_matrix, step_translate),
    )


def alibi_symmetric_is_not_key_bias() -> Proof:
    """The symmetric variant ``-m |i - j|`` cannot be replaced by any bias on key positions.

    Two biases give the same softmax rows for all scores exactly when they differ by
    a constant along each row (step 2), so a bias acts like a key-position bias
    ``g(j)`` exactly when it has the form ``f(i) + g(j)``, which makes its mixed
    difference vanish (step 1). The linear bias has mixed difference 0 (step 3);
    the symmetric one has ``2 m |i - i'| > 0`` (step 4).
    """
    m = sp.Symbol("m", positive=True)
    i, i2, j, j2 = sp.symbols("i i' j j'", integer=True, nonnegative=True)
    f, g = sp.Function("f"), sp.Function("g")
    x0, x1, x2 = sp.symbols("x_0 x_1 x_2", real=True)

    def mixed(b, a, a2, c, c2):
        return b(a, c) - b(a, c2) - b(a2, c) + b(a2, c2)

    mixed_latex = "b(i,j) - b(i,j') - b(i',j) + b(i',j')"
    total = sp.exp(x0) + sp.exp(x1) + sp.exp(x2)
    step_form = Step(
        "A bias of the form $f(i) + g(j)$ has zero mixed difference",
        mixed(lambda a, c: f(a) + g(c), i, i2, j, j2),
        sp.Integer(0),
        latex=f"{mixed_latex} = 0 \\quad \\text{{for }} b(i,j) = f(i) + g(j)",
    )
    step_logratio = Step(
        "A softmax row determines the differences of its logits, so equal rows differ "
        "by a constant",
        sp.log((sp.exp(x0) / total) / (sp.exp(x1) / total)),
        x0 - x1,
        latex=(
            "\\log\\frac{\\operatorname{softmax}(x)_0}{\\operatorname{softmax}(x)_1} = x_0 - x_1"
        ),
    )
    step_linear = Step(
        "The linear bias $-m(i-j)$ has zero mixed difference: with no mask it is "
        "only the key bias $m\\,j$",
        mixed(lambda a, c: -m * (a - c), i, i2, j, j2),
        sp.Integer(0),
        latex=f"{mixed_latex} = 0 \\quad \\text{{for }} b(i,j) = -m(i-j)",
    )
    step_symmetric = Step(
        "The symmetric bias $-m|i-j|$ has mixed difference $2m|i-i'|$ at $j = i$, "
        "$j' = i'$, which is not 0 when $i \\ne i'$",
        mixed(lambda a, c: -m * sp.Abs(a - c), i, i2, i, i2),
        2 * m * sp.Abs(i - i2),
        latex="b(i,i) - b(i,i') - b(i',i) + b(i',i') = 2m\\,|i - i'| \\quad "
        "\\text{for } b(i,j) = -m|i-j|",
    )
    return Proof(
        "Symmetric ALiBi is not a key-position bias",
        "No $g$ gives attention with bias $g(j)$ equal to attention with $-m|i-j|$ for "
        "all scores: the symmetric bias is not of the form $f(i) + g(j)$.",
        (step_form, step_logratio, step_linear, step_symmetric),
    )
