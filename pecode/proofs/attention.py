"""Proofs about attention itself (chapter 1): permutation equivariance and its exception."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import sympy as sp

from pecode.proofs.core import Proof, Step

__all__ = ["attention_permutation_equivariance", "permutation_matrix", "softmax_rows"]


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


def attention_permutation_equivariance(n: int = 3, d: int = 2, *, causal: bool = False) -> Proof:
    """Self-attention without positions is permutation-equivariant: Attn(PX) = P·Attn(X).

    ``Attn(X) = softmax_rows(X W_Q (X W_K)ᵀ / sqrt(d)) X W_V`` (Vaswani et al. 2017,
    eq. 1), for ``X`` of shape ``[n, d]`` and any ``n x n`` permutation matrix ``P``.
    Steps 1, 2 and 5 are proven for symbolic ``n`` and ``d`` with matrix symbols;
    steps 3, 4 and 6 are checked for every one of the ``n!`` permutations, with every
    entry of ``X``, ``W_Q``, ``W_K``, ``W_V`` a free symbol.

    With ``causal=True`` each query only sees keys at or before it (a fixed mask
    that does not move with the tokens); then step 4, and with it the claim, fails:
    the returned proof's ``holds()`` is False and its residual is the counterexample.

    Args:
        n: number of tokens for the explicit checks (1 to 4; 4! = 24 permutations).
        d: model width for the explicit checks (1 to 3).
        causal: apply a causal mask to both sides.

    Raises:
        TypeError, ValueError: ``n`` or ``d`` is not an int in range.
    """
    _check_size("n", n, 4)
    _check_size("d", d, 3)
    allowed = (lambda i, j: j <= i) if causal else None

    # Steps 1, 2, 5: symbolic sizes, so they hold for every n and d.
    n_sym, d_sym = sp.symbols("n d", integer=True, positive=True)
    P = sp.MatrixSymbol("P", n_sym, n_sym)
    X = sp.MatrixSymbol("X", n_sym, d_sym)
    W_Q, W_K, W_V = (sp.MatrixSymbol(f"W_{s}", d_sym, d_sym) for s in "QKV")
    A = sp.MatrixSymbol("A", n_sym, n_sym)
    identity = sp.Identity(n_sym)

    step_projection = Step(
        "A projection acts on each row, so permuting rows first or last is the same",
        (P * X) * W_V,
        P * (X * W_V),
        latex="(PX)W_V = P(XW_V)",
    )
    step_scores = Step(
        "The score matrix $S = XW_Q(XW_K)^\\top$ is permuted on both sides",
        (P * X * W_Q) * (P * X * W_K).T,
        P * (X * W_Q * W_K.T * X.T) * P.T,
        latex="(PXW_Q)(PXW_K)^\\top = P\\,(XW_QW_K^\\top X^\\top)\\,P^\\top",
    )
    step_output = Step(
        "With $A$ the attention matrix, $P^\\top P = I$ cancels between weights and values",
        P * A * P.T * P * (X * W_V),
        P * A * (X * W_V),
        subs={P.T * P: identity},
    )

    # Steps 3, 4, 6: explicit n x n, every permutation, symbolic entries.
    perms = [permutation_matrix(p) for p in itertools.permutations(range(n))]
    S = _symbol_matrix("s", n, n)
    Xe = _symbol_matrix("x", n, d)
    WQe, WKe, WVe = (_symbol_matrix(name, d, d) for name in ("a", "b", "c"))

    def attn(tokens: sp.Matrix) -> sp.Matrix:
        scores = ((tokens * WQe) * (tokens * WKe).T / sp.sqrt(d)).applyfunc(sp.expand)
        return softmax_rows(scores, allowed) * (tokens * WVe)

    step_orthogonal = Step(
        f"Every permutation matrix is orthogonal (all {len(perms)} of size {n})",
        sp.Matrix.vstack(*[Pm.T * Pm for Pm in perms]),
        sp.Matrix.vstack(*[sp.eye(n) for _ in perms]),
        latex=f"P_\\sigma^\\top P_\\sigma = I_{{{n}}} \\quad \\forall \\sigma \\in S_{{{n}}}",
    )
    mask_note = " under the causal mask" if causal else ""
    step_softmax = Step(
        "Row-wise softmax commutes with permuting rows and columns together"
        f"{mask_note} (symbolic $S$, all {len(perms)} permutations)",
        sp.Matrix.vstack(*[softmax_rows(Pm * S * Pm.T, allowed) for Pm in perms]),
        sp.Matrix.vstack(*[Pm * softmax_rows(S, allowed) * Pm.T for Pm in perms]),
        latex=(
            "\\operatorname{softmax}(P_\\sigma S P_\\sigma^\\top) = "
            "P_\\sigma \\operatorname{softmax}(S) P_\\sigma^\\top"
            f"\\quad \\forall \\sigma \\in S_{{{n}}}"
        ),
    )
    reference = attn(Xe)
    step_claim = Step(
        f"End to end, with symbolic $X \\in \\mathbb{{R}}^{{{n}\\times{d}}}$, $W_Q, W_K, W_V$"
        f"{mask_note}",
        sp.Matrix.vstack(*[attn(Pm * Xe) for Pm in perms]),
        sp.Matrix.vstack(*[Pm * reference for Pm in perms]),
        latex=(
            "\\operatorname{Attn}(P_\\sigma X) = P_\\sigma \\operatorname{Attn}(X)"
            f"\\quad \\forall \\sigma \\in S_{{{n}}}"
        ),
    )
    title = "Causal attention and permutations" if causal else "Permutation equivariance"
    claim = (
        "For every permutation matrix $P$, "
        "$\\operatorname{Attn}(PX) = P\\,\\operatorname{Attn}(X)$"
        + (" — tested here under a causal mask." if causal else ".")
    )
    return Proof(
        title,
        claim,
        (
            step_projection,
            step_scores,
            step_orthogonal,
            step_softmax,
            step_output,
            step_claim,
        ),
    )
