"""Proofs about attention itself (chapter 1): permutation equivariance and its exception.

:func:`attention_permutation_equivariance` proves ``Attn(PX) = P Attn(X)`` for a
symbolic number of tokens ``n`` and a symbolic width. A permutation matrix is written
in index notation, ``P_{ik} = δ_{σ(i) k}``, and sympy evaluates the sums over
``k = 0 .. n - 1`` that this puts into every entry; the only facts about ``σ`` it is
given are that ``σ(i)`` lies in ``0 .. n - 1`` (written ``n = σ(i) + 1 + r`` with
``r >= 0``) and, in words, that ``σ`` is one-to-one. The row-wise softmax is written
with an entrywise map ``φ`` (``φ = exp``): the argument uses nothing of ``exp`` but that
it acts entry by entry, so sympy keeps ``φ`` as an undefined function.

Its false neighbour puts a mask that is tied to positions (the causal mask
``M_ij = [j <= i]`` is one) into the softmax: the steps where the softmax moves with
the rows and with the columns then fail.

:func:`explicit_equivariance_residual` computes ``Attn(PX) - P Attn(X)`` written out
for every permutation of a few tokens, with every entry a free symbol: zero without a
mask, and an explicit counterexample under the causal mask.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step

__all__ = [
    "CASES",
    "attention_permutation_equivariance",
    "explicit_equivariance_residual",
    "permutation_matrix",
    "softmax_rows",
]


def permutation_matrix(perm: Sequence[int]) -> sp.Matrix:
    """The matrix ``P`` with ``(P X)[i] = X[perm[i]]``, i.e. ``P[i, perm[i]] = 1``.

    Raises:
        ValueError: ``perm`` is not a permutation of ``0 .. len(perm) - 1``.
    """
    size = len(perm)
    if sorted(perm) != list(range(size)):
        raise ValueError(f"perm must be a permutation of 0..{size - 1}, got {list(perm)}")
    matrix = sp.zeros(size, size)
    for row, col in enumerate(perm):
        matrix[row, col] = 1
    return matrix


def softmax_rows(scores: sp.MatrixBase, allowed: Callable[[int, int], bool] | None = None):
    """Row-wise softmax of an explicit sympy matrix.

    ``allowed(i, j)`` (default: always) says which entries a row may attend to;
    the others get probability 0, as with a ``-inf`` logit.
    """
    rows, cols = scores.shape
    allowed = allowed or (lambda i, j: True)
    exps = sp.Matrix(rows, cols, lambda i, j: sp.exp(scores[i, j]) if allowed(i, j) else 0)
    return sp.Matrix(rows, cols, lambda i, j: exps[i, j] / sum(exps[i, :]))


def _symbol_matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{{{i}{j}}}", real=True))


def _check_size(name: str, value: int, largest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= largest:
        raise ValueError(f"{name} must be between 1 and {largest}, got {value}")


def attention_permutation_equivariance(*, causal: bool = False) -> Proof:
    """Self-attention without positions is permutation-equivariant: Attn(PX) = P·Attn(X).

    ``Attn(X) = softmax_rows(X W_Q (X W_K)ᵀ / sqrt(d)) X W_V`` (Vaswani et al. 2017,
    eq. 1), for ``X`` of shape ``[n, d]`` and every ``n x n`` permutation matrix ``P``,
    proven for symbolic ``n`` and ``d``. The steps:

    1. ``P 1 = 1`` (index notation; sympy evaluates the sum);
    2. ``P Pᵀ = I`` (index notation), hence ``PᵀP = I``;
    3. ``Pᵀ 1 = 1`` (matrix algebra with ``PᵀP = I``);
    4. the shuffled scores are ``P S Pᵀ`` (marked as a restatement: associativity and the
       transpose of a product, which sympy applies as it builds the product);
    5. the row-wise softmax moves with the rows, ``softmax(PT) = P softmax(T)``;
    6. an entrywise map moves with the columns, ``φ(TPᵀ) = φ(T)Pᵀ``;
    7. so the row sums of ``φ(TPᵀ)`` are those of ``φ(T)``;
    8. the softmax moves with the columns, ``softmax(TPᵀ) = softmax(T)Pᵀ``;
    9. with ``A = softmax(S)``, ``Attn(PX) = P A Pᵀ P X W_V = P A X W_V``.

    Args:
        causal: the false neighbour: every softmax multiplies its entries by a mask
            ``M_ij`` fixed to the positions (the causal mask ``[j <= i]`` is one), which
            does not move with the tokens. Steps 5 and 8 then fail.
    """
    n = sp.Symbol("n", integer=True, positive=True)
    i, j, k, ell, m, r = sp.symbols("i j k l m r", integer=True, nonnegative=True)
    # a = σ(i), b = σ(j): the columns where rows i and j of P hold their 1
    a, b = sp.symbols("sigma_i sigma_j", integer=True, nonnegative=True)
    T = sp.IndexedBase("T", real=True)
    mask_base = sp.IndexedBase("M")
    phi = sp.Function("varphi")
    delta = sp.KroneckerDelta

    def total(expr, index):
        return sp.Sum(expr, (index, 0, n - 1))

    def mask(row, col):
        return mask_base[row, col] if causal else sp.Integer(1)

    row_in_range = {n: a + r + 1}  # σ(i) <= n - 1
    col_in_range = {n: b + r + 1}  # σ(j) <= n - 1

    step_ones = Step(
        "Each row of $P$ holds one $1$: $P\\mathbf{1} = \\mathbf{1}$ "
        "(symbolic $n$, $\\sigma(i) < n$)",
        total(delta(a, k), k),
        sp.Integer(1),
        subs=row_in_range,
        latex="(P\\mathbf{1})_i = \\sum_{k=0}^{n-1} \\delta_{\\sigma(i)k} = 1",
    )
    step_orthogonal = Step(
        "Entry $(i, j)$ of $PP^\\top$ is $\\delta_{\\sigma(i)\\sigma(j)}$, which is "
        "$\\delta_{ij}$ because $\\sigma$ is one-to-one: $PP^\\top = I$, so the square "
        "matrix $P$ also has $P^\\top P = I$",
        total(delta(a, k) * delta(b, k), k),
        delta(a, b),
        subs=row_in_range,
        latex=(
            "(PP^\\top)_{ij} = \\sum_{k=0}^{n-1} \\delta_{\\sigma(i)k}\\,\\delta_{\\sigma(j)k}"
            " = \\delta_{\\sigma(i)\\sigma(j)}"
        ),
    )

    # the matrix steps: symbolic n x n and n x d matrices
    d = sp.Symbol("d", integer=True, positive=True)
    P = sp.MatrixSymbol("P", n, n)
    X = sp.MatrixSymbol("X", n, d)
    W_Q, W_K, W_V = (sp.MatrixSymbol(f"W_{s}", d, d) for s in "QKV")
    A = sp.MatrixSymbol("A", n, n)
    E = sp.MatrixSymbol("E", n, n)
    ones = sp.MatrixSymbol("\\mathbf{1}", n, 1)
    identity = sp.Identity(n)

    step_columns_sum = Step(
        "Hence each column of $P$ holds one $1$: $P^\\top\\mathbf{1} = P^\\top(P\\mathbf{1}) "
        "= \\mathbf{1}$ (steps 1 and 2)",
        P.T * P * ones,
        ones,
        subs={P.T * P: identity},
        latex="P^\\top (P \\mathbf{1}) = \\mathbf{1}",
    )
    step_scores = Step(
        "The shuffled tokens' scores are $S = XW_Q(XW_K)^\\top$ permuted on both sides "
        "(associativity and $(AB)^\\top = B^\\top A^\\top$, which sympy applies as it "
        "builds the product)",
        (P * X * W_Q) * (P * X * W_K).T,
        P * (X * W_Q * W_K.T * X.T) * P.T,
        latex="(PXW_Q)(PXW_K)^\\top = P\\,(XW_QW_K^\\top X^\\top)\\,P^\\top",
        by_definition=True,
    )

    def softmax_entry(entry, row, col):
        """Entry (row, col) of the (masked) row-wise softmax of the matrix ``entry``."""
        return mask(row, col) * phi(entry(row, col)) / total(mask(row, m) * phi(entry(row, m)), m)

    def moved_rows(row, col):  # (PT)_{row, col}; row is i, whose 1 sits in column a
        return total(delta(a, k) * T[k, col], k)

    mask_note = ", mask $M$ fixed to the positions" if causal else ""
    mask_tex = "M_{ij}\\," if causal else ""
    step_rows = Step(
        "The row-wise softmax moves with the rows: $\\operatorname{softmax}(PT) = "
        f"P\\operatorname{{softmax}}(T)$ (symbolic $n$ and $T${mask_note})",
        softmax_entry(moved_rows, i, j),
        total(delta(a, k) * softmax_entry(lambda row, col: T[row, col], k, j), k),
        subs=row_in_range,
        latex=(
            f"\\frac{{{mask_tex}\\varphi\\big((PT)_{{ij}}\\big)}}"
            f"{{\\sum_{{m}} {mask_tex.replace('j', 'm')}\\varphi\\big((PT)_{{im}}\\big)}}"
            " = \\sum_{k} \\delta_{\\sigma(i)k}\\,"
            f"\\frac{{{mask_tex.replace('i', 'k')}\\varphi(T_{{kj}})}}"
            f"{{\\sum_{{m}} {mask_tex.replace('i', 'k').replace('j', 'm')}\\varphi(T_{{km}})}}"
        ),
    )

    def moved_columns(row, col):  # (TPᵀ)_{row, col}; col is j, whose 1 sits in column b
        return total(T[row, ell] * delta(b, ell), ell)

    step_entrywise = Step(
        "An entrywise map moves with the columns: $\\varphi(TP^\\top) = \\varphi(T)P^\\top$",
        phi(moved_columns(i, j)),
        total(phi(T[i, ell]) * delta(b, ell), ell),
        subs=col_in_range,
        latex=(
            "\\varphi\\Big(\\sum_{l} T_{il}\\,\\delta_{\\sigma(j)l}\\Big) = "
            "\\sum_{l} \\varphi(T_{il})\\,\\delta_{\\sigma(j)l}"
        ),
    )
    step_row_sums = Step(
        "So a row sum does not see the order of the columns: with $E = \\varphi(T)$, "
        "$\\varphi(TP^\\top)\\mathbf{1} = EP^\\top\\mathbf{1} = E\\mathbf{1}$ (steps 3 and 6)",
        E * P.T * ones,
        E * ones,
        subs={P.T * ones: ones},
        latex="EP^\\top\\mathbf{1} = E\\mathbf{1}",
    )
    step_columns = Step(
        "The row-wise softmax moves with the columns: $\\operatorname{softmax}(TP^\\top) = "
        "\\operatorname{softmax}(T)P^\\top$ (its denominator by step 7"
        f"{mask_note})",
        mask(i, j) * phi(moved_columns(i, j)) / total(mask(i, m) * phi(T[i, m]), m),
        total(softmax_entry(lambda row, col: T[row, col], i, ell) * delta(b, ell), ell),
        subs=col_in_range,
        latex=(
            f"\\frac{{{mask_tex}\\varphi\\big((TP^\\top)_{{ij}}\\big)}}"
            f"{{\\sum_{{m}} {mask_tex.replace('j', 'm')}\\varphi(T_{{im}})}}"
            f" = \\sum_{{l}} \\frac{{{mask_tex.replace('j', 'l')}\\varphi(T_{{il}})}}"
            f"{{\\sum_{{m}} {mask_tex.replace('j', 'm')}\\varphi(T_{{im}})}}"
            "\\,\\delta_{\\sigma(j)l}"
        ),
    )
    step_output = Step(
        "With $A = \\operatorname{softmax}(S)$, steps 4, 5 and 8 give "
        "$\\operatorname{softmax}(PSP^\\top) = PAP^\\top$, and $P^\\top P = I$ cancels "
        "between the weights and the values $(PX)W_V$",
        P * A * P.T * P * X * W_V,
        P * A * X * W_V,
        subs={P.T * P: identity},
        latex="\\operatorname{Attn}(PX) = PAP^\\top\\,PXW_V = PA\\,XW_V = P\\operatorname{Attn}(X)",
    )
    title = "Masked attention and permutations" if causal else "Permutation equivariance"
    claim = (
        "For every $n$ and every $n \\times n$ permutation matrix $P$, "
        "$\\operatorname{Attn}(PX) = P\\,\\operatorname{Attn}(X)$"
        + (
            " — tested here with a mask $M$ fixed to the positions, such as the causal mask."
            if causal
            else "."
        )
    )
    return Proof(
        title,
        claim,
        (
            step_ones,
            step_orthogonal,
            step_columns_sum,
            step_scores,
            step_rows,
            step_entrywise,
            step_row_sums,
            step_columns,
            step_output,
        ),
    )


def explicit_equivariance_residual(n: int = 2, d: int = 1, *, causal: bool = False) -> sp.Matrix:
    """``Attn(P X) - P Attn(X)`` written out, for every permutation of ``n`` tokens.

    Every entry of ``X`` (``n x d``), ``W_Q``, ``W_K``, ``W_V`` (``d x d``) is a free
    symbol; the blocks of ``n`` rows, one per permutation in ``itertools`` order, are
    stacked and simplified. Zero without a mask (checked for small sizes only; the proof
    for every ``n`` is :func:`attention_permutation_equivariance`); under the causal
    mask ``j <= i`` a nonzero block is an explicit counterexample.

    Raises:
        TypeError, ValueError: ``n`` is not an int from 1 to 3 or ``d`` from 1 to 2.
    """
    _check_size("n", n, 3)
    _check_size("d", d, 2)
    allowed = (lambda i, j: j <= i) if causal else None
    tokens = _symbol_matrix("x", n, d)
    w_q, w_k, w_v = (_symbol_matrix(name, d, d) for name in ("a", "b", "c"))

    def attn(x: sp.Matrix) -> sp.Matrix:
        scores = ((x * w_q) * (x * w_k).T / sp.sqrt(d)).applyfunc(sp.expand)
        return softmax_rows(scores, allowed) * (x * w_v)

    reference = attn(tokens)
    blocks = []
    for perm in itertools.permutations(range(n)):
        P = permutation_matrix(perm)
        difference = attn(P * tokens) - P * reference
        blocks.append(difference.applyfunc(lambda e: sp.simplify(sp.expand(e))))
    return sp.Matrix.vstack(*blocks)


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "attention.attention_permutation_equivariance",
        attention_permutation_equivariance,
        lambda: attention_permutation_equivariance(causal=True),
        (5, 8),
    ),
)
"""The proof of this module with its false neighbour (a mask tied to the positions)."""
