"""Proofs about ALiBi (chapter 6): what a causal softmax sees of the bias ``-m (i - j)``.

Under a causal mask, row ``i`` of ALiBi's bias is ``m j`` minus the row constant
``m i``, and a softmax ignores a constant added to its row: causal ALiBi is the same
attention as the key-position bias ``m j`` (:func:`alibi_causal_row_shift`). Without the
mask the symmetric variant ``-m |i - j|`` is *not* any key-position bias
(:func:`alibi_symmetric_is_not_key_bias`): equal softmax rows force equal logit
differences, so a key-position bias makes ``b(i, j) - b(i, k)`` the same on every row,
and the symmetric bias breaks that on the rows ``j`` and ``k``.

Each proof function takes a keyword that builds its false neighbour (the key bias with
the wrong sign; the linear bias in place of the symmetric one); :data:`CASES` lists
them with the steps at which they fail.
"""

from __future__ import annotations

import sympy as sp

from pecode.proofs.attention import softmax_rows
from pecode.proofs.core import Proof, ProofCase, Step

__all__ = [
    "CASES",
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


def _check_sign(key_sign: int) -> None:
    if key_sign not in (1, -1):
        raise ValueError(f"key_sign must be 1 or -1, got {key_sign!r}")


def alibi_key_bias_equivalence(n: int = 3, variant: str = "causal", *, key_sign: int = 1) -> Step:
    """One explicit check: does ``variant`` give the same attention as the bias ``m j``?

    Every entry of the ``n x n`` scores ``S`` and the slope ``m`` is a free symbol.

    - ``"causal"``: bias ``-m (i - j)`` under a causal mask, against ``m j`` under
      the same mask (holds);
    - ``"unmasked"``: the same linear bias ``-m (i - j)`` with no mask, against ``m j``
      with no mask (holds: without the mask the linear bias is only a key bias);
    - ``"symmetric"``: ``-m |i - j|`` with no mask, against ``m j`` (does not hold).

    Args:
        n: the number of positions (1 to 4).
        variant: which bias, as above.
        key_sign: ``-1`` compares with the key bias of the wrong sign, ``-m j``.

    Raises:
        TypeError, ValueError: ``n`` is not an int from 1 to 4, ``variant`` is unknown,
            or ``key_sign`` is not ``1`` or ``-1``.
    """
    _check_n(n, 4)
    _check_sign(key_sign)
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
    key_bias = sp.Matrix(n, n, lambda i, j: key_sign * m * j)
    key_tex = "m\\,j" if key_sign == 1 else "-m\\,j"
    where = "under a causal mask" if variant == "causal" else "with no mask"
    where_tex = "\\text{causal mask}" if variant == "causal" else "\\text{no mask}"
    return Step(
        f"With ${formula}$ {where}, every row of the attention equals the one from the "
        f"key-position bias ${key_tex}$ (explicit ${n}\\times{n}$, symbolic scores and $m$)",
        softmax_rows(scores + bias, allowed),
        softmax_rows(scores + key_bias, allowed),
        latex=(
            f"\\operatorname{{softmax}}\\big(S_{{ij}} {formula}\\big) = "
            f"\\operatorname{{softmax}}\\big(S_{{ij}} {'+' if key_sign == 1 else ''}"
            f" {key_tex}\\big)"
            f"\\quad ({where_tex},\\ n={n})"
        ),
    )


def alibi_causal_row_shift(n: int = 4, *, key_sign: int = 1) -> Proof:
    """Under a causal mask, ALiBi's bias acts exactly like the key-position bias ``m j``.

    Row ``i`` of ALiBi (Press et al. 2022, §3) adds ``-m (i - j)`` to the scores of
    the keys ``j <= i``. Steps 1-3 are symbolic in ``m``, ``i``, ``j`` and the scores
    (the softmax over the visible keys is a sympy ``Sum`` from 0 to ``i``, so they hold
    for every length); step 4 checks the whole ``n x n`` attention with free symbols
    (a check for one size); step 5, that a shift leaves the bias unchanged, holds by
    definition (the bias is a function of ``i - j``) and is marked so.

    Args:
        n: the size of the explicit check (1 to 4).
        key_sign: ``-1`` builds the false neighbour, the key bias ``-m j`` (the row shift
            with the wrong sign); steps 1, 3 and 4 then fail.

    Raises:
        TypeError, ValueError: ``n`` is not an int from 1 to 4, or ``key_sign`` is not
            ``1`` or ``-1``.
    """
    _check_n(n, 4)
    _check_sign(key_sign)
    m = sp.Symbol("m", positive=True)
    i, j, k, t = sp.symbols("i j k t", integer=True, nonnegative=True)
    i2, j2 = sp.symbols("i' j'", integer=True, nonnegative=True)
    c = sp.Symbol("c", real=True)
    s = sp.IndexedBase("s", real=True)
    key_tex = "m\\,j" if key_sign == 1 else "-m\\,j"

    def causal_softmax(logit):  # softmax over the keys 0..i of row i
        return sp.exp(logit(j)) / sp.Sum(sp.exp(logit(k)), (k, 0, i))

    step_split = Step(
        f"ALiBi's bias is the key term ${key_tex}$ plus a term $-m\\,i$ that depends on "
        "the row only",
        -m * (i - j),
        key_sign * m * j - m * i,
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
    sign_tex = "+" if key_sign == 1 else "-"
    # compared as a ratio: sympy's simplify of the difference of two such quotients of
    # sums fails inside sympy (sum_combine) when they differ; their ratio simplifies
    step_row = Step(
        f"So row $i$ of causal ALiBi equals the softmax of the scores plus ${key_tex}$: "
        "their ratio is $1$ (symbolic $i$, $m$ and scores $s_k$)",
        causal_softmax(lambda x: s[x] - m * (i - x))
        / causal_softmax(lambda x: s[x] + key_sign * m * x),
        sp.Integer(1),
        latex=(
            "\\frac{e^{s_j - m(i-j)}}{\\sum_{k=0}^{i} e^{s_k - m(i-k)}} \\Big/ "
            f"\\frac{{e^{{s_j {sign_tex} m j}}}}{{\\sum_{{k=0}}^{{i}} e^{{s_k {sign_tex} m k}}}}"
            " = 1"
        ),
    )
    step_matrix = alibi_key_bias_equivalence(n, "causal", key_sign=key_sign)
    step_translate = Step(
        "Shifting every position by $t$ ($i' = i + t$, $j' = j + t$) leaves ALiBi's bias "
        "unchanged; the key form changes by $m\\,t$, a row constant the softmax ignores",
        -m * (i2 - j2),
        -m * (i - j),
        subs={i2: i + t, j2: j + t},
        latex="-m(i' - j') = -m(i - j) \\quad (i' = i + t,\\ j' = j + t)",
        by_definition=True,  # a function of i - j: a shift cannot change it
    )
    return Proof(
        "Causal ALiBi is a key-position bias",
        f"Under a causal mask, the attention with bias $-m(i-j)$ equals the attention "
        f"with bias ${key_tex}$, for every row $i$, every slope $m > 0$ and all scores"
        + (" — tested here with the wrong sign." if key_sign == -1 else "."),
        (step_split, step_shift, step_row, step_matrix, step_translate),
    )


def alibi_symmetric_is_not_key_bias(*, bias: str = "symmetric") -> Proof:
    """The symmetric variant ``-m |i - j|`` cannot be replaced by any bias on key positions.

    Suppose ``softmax_j(s_ij + b(i, j)) = softmax_j(s_ij + g(j))`` for every row ``i``
    and all scores. The steps:

    1. a softmax row determines the differences of its logits (a symbolic row of ``n``
       entries), so ``b(i, j) - b(i, k) = g(j) - g(k)`` on every row;
    2. then the mixed difference ``b(i,j) - b(i,k) - b(i',j) + b(i',k)`` is 0 for all
       rows and keys (sympy substitutes the equation of step 1);
    3. the linear bias ``-m (i - j)`` meets step 1's condition with ``g(j) = m j``;
    4. the symmetric bias at keys ``j`` and ``k = j + t`` and rows ``i = j``, ``i' = k``
       has mixed difference ``2 m t``,
    5. whose sign is ``+1`` for ``m > 0``, ``t > 0``: it contradicts step 2, so no ``g``
       exists.

    The implications between the steps are the prose of the proof (an argument, with
    each step's algebra checked by sympy for symbolic ``n``, ``i``, ``j``, ``t`` and
    ``m``); the side conditions ``n >= 2`` and ``j + t <= n - 1`` (both keys exist) are
    in the words too.

    Args:
        bias: ``"symmetric"``; ``"linear"`` builds the false neighbour, the claim that the
            unmasked linear bias is not a key bias either; steps 4 and 5 then fail.

    Raises:
        ValueError: ``bias`` is not ``"symmetric"`` or ``"linear"``.
    """
    if bias not in ("symmetric", "linear"):
        raise ValueError(f"bias must be 'symmetric' or 'linear', got {bias!r}")
    m = sp.Symbol("m", positive=True)
    n = sp.Symbol("n", integer=True, positive=True)
    i, i2, j, k, ell = sp.symbols("i i' j k l", integer=True, nonnegative=True)
    t = sp.Symbol("t", integer=True, positive=True)
    x = sp.IndexedBase("x", real=True)
    b, g = sp.Function("b"), sp.Function("g")

    def linear(row, key):
        return -m * (row - key)

    def symmetric(row, key):
        return -m * sp.Abs(row - key)

    chosen = symmetric if bias == "symmetric" else linear
    chosen_tex = "-m|i-j|" if bias == "symmetric" else "-m(i-j)"

    def mixed(f, row, row2, key, key2):
        return f(row, key) - f(row, key2) - f(row2, key) + f(row2, key2)

    mixed_tex = "b(i,j) - b(i,k) - b(i',j) + b(i',k)"
    row_sum = sp.Sum(sp.exp(x[ell]), (ell, 0, n - 1))
    corners = {i: j, i2: j + t, k: j + t}
    step_logratio = Step(
        "A softmax row of $n$ logits determines their differences; so equal rows for all "
        "scores need $b(i,j) - b(i,k) = g(j) - g(k)$ on every row $i$",
        # built unevaluated, so that the normaliser cancels in the residual, not here
        sp.log(
            sp.Mul(
                sp.exp(x[j]) / row_sum,
                sp.Pow(sp.exp(x[k]) / row_sum, -1, evaluate=False),
                evaluate=False,
            )
        ),
        x[j] - x[k],
        latex=(
            "\\log\\frac{\\operatorname{softmax}(x)_j}{\\operatorname{softmax}(x)_k}"
            " = \\log\\frac{e^{x_j} / \\sum_{l<n} e^{x_l}}{e^{x_k} / \\sum_{l<n} e^{x_l}}"
            " = x_j - x_k"
        ),
    )
    step_rows_agree = Step(
        "Then $b(i,j) - b(i,k)$ is the same on every row: the mixed difference of two rows "
        "$i, i'$ and two keys $j, k$ vanishes",
        mixed(b, i, i2, j, k),
        sp.Integer(0),
        subs={b(i, j): b(i, k) + g(j) - g(k), b(i2, j): b(i2, k) + g(j) - g(k)},
        latex=f"{mixed_tex} = 0",
    )
    step_linear = Step(
        "The linear bias $-m(i-j)$ meets the condition with $g(j) = m\\,j$: with no mask "
        "it is only a key bias",
        linear(i, j) - linear(i, k),
        m * j - m * k,
        latex="-m(i-j) + m(i-k) = m\\,j - m\\,k",
    )
    step_value = Step(
        f"The bias ${chosen_tex}$ at keys $j$ and $k = j + t$ ($t > 0$) and rows $i = j$, "
        "$i' = k$ has mixed difference $2mt$",
        mixed(chosen, i, i2, j, k),
        2 * m * t,
        subs=corners,
        latex=f"{mixed_tex} = 2mt \\quad (b(i,j) = {chosen_tex},\\ i = j,\\ i' = k = j + t)",
    )
    step_sign = Step(
        "which is positive for $m > 0$, $t > 0$, not $0$ as step 2 requires: no $g$ exists",
        sp.sign(mixed(chosen, i, i2, j, k)),
        sp.Integer(1),
        subs=corners,
        latex=f"\\operatorname{{sign}}\\big({mixed_tex}\\big) = 1",
    )
    return Proof(
        "Symmetric ALiBi is not a key-position bias"
        if bias == "symmetric"
        else "The unmasked linear bias and key-position biases",
        f"No $g$ gives attention with bias $g(j)$ equal to attention with ${chosen_tex}$ "
        "on every row, for all scores"
        + (" — tested here for the linear bias without a mask." if bias == "linear" else "."),
        (step_logratio, step_rows_agree, step_linear, step_value, step_sign),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "alibi.alibi_causal_row_shift",
        alibi_causal_row_shift,
        lambda: alibi_causal_row_shift(3, key_sign=-1),
        (1, 3, 4),
    ),
    ProofCase(
        "alibi.alibi_symmetric_is_not_key_bias",
        alibi_symmetric_is_not_key_bias,
        lambda: alibi_symmetric_is_not_key_bias(bias="linear"),
        (4, 5),
    ),
)
"""The proofs of this module with their false neighbours."""
