"""Proofs in sympy: every identity the book states, as a function that checks it.

A proof is a list of :class:`Step`\\ s. Each step states ``lhs = rhs`` and sympy
computes its *residual*, ``lhs - rhs`` simplified (after the step's stated
assumptions are substituted). A step holds when its residual is exactly zero; a
proof holds when all its steps do. Where a statement is about every size ``n``,
the algebra is done with symbolic matrices (``sympy.MatrixSymbol`` of symbolic
shape); where it needs explicit entries (a softmax), it is checked for every
permutation of ``n`` tokens with fully symbolic entries, and the prose of the
book gives the index argument that covers all ``n``.

In a notebook a :class:`Proof` renders its steps as Markdown with LaTeX.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import sympy as sp
from sympy.matrices.expressions.matexpr import MatrixExpr

__all__ = [
    "Proof",
    "Step",
    "attention_permutation_equivariance",
    "is_zero",
    "permutation_matrix",
    "residual",
    "softmax_rows",
]


def residual(lhs: Any, rhs: Any, subs: Mapping[Any, Any] | None = None) -> Any:
    """Simplified ``lhs - rhs``: zero (a scalar ``0`` or a zero matrix) when they are equal.

    Args:
        lhs, rhs: sympy scalars, explicit matrices, or matrix expressions.
        subs: substitutions applied to the difference first (the step's assumptions,
            such as ``{P.T * P: Identity(n)}``).
    """
    diff = lhs - rhs
    if subs:
        diff = diff.subs(dict(subs))
    if isinstance(diff, sp.MatrixBase):
        return diff.applyfunc(lambda e: sp.simplify(sp.expand(e)))
    if isinstance(diff, MatrixExpr):
        return diff.doit()
    return sp.simplify(diff)


def is_zero(value: Any) -> bool:
    """True when a residual is exactly zero (scalar, explicit matrix or matrix expression)."""
    if isinstance(value, sp.MatrixBase):
        return all(entry == 0 for entry in value)
    if isinstance(value, MatrixExpr):
        return bool(value.is_ZeroMatrix) or value == 0
    return value == 0


@dataclass(frozen=True)
class Step:
    """One step of a proof: the claim ``lhs = rhs``, checked by sympy.

    Args:
        text: what the step says, in words (Markdown; math in ``$...$``).
        lhs, rhs: the two sides, as sympy objects.
        subs: assumptions substituted before simplifying, e.g. ``{P.T*P: I}``.
        latex: how to display the claim when the sides are too large to print
            (for example a check over every permutation); defaults to ``lhs = rhs``.
    """

    text: str
    lhs: Any
    rhs: Any
    subs: Mapping[Any, Any] | None = None
    latex: str | None = None

    @cached_property
    def residual(self) -> Any:
        """The simplified ``lhs - rhs`` after the assumptions are substituted."""
        return residual(self.lhs, self.rhs, self.subs)

    @property
    def holds(self) -> bool:
        """True when the residual is exactly zero."""
        return is_zero(self.residual)

    def to_latex(self) -> str:
        """The displayed claim in LaTeX."""
        if self.latex is not None:
            return self.latex
        return f"{sp.latex(self.lhs)} = {sp.latex(self.rhs)}"


@dataclass(frozen=True)
class Proof:
    """A named claim and the steps that establish it.

    ``proof.holds()`` is True when every step's residual is zero;
    ``proof.residual`` is the residual of the last step, which states the claim.
    """

    title: str
    claim: str
    steps: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def residual(self) -> Any:
        """Residual of the final step (the claim itself)."""
        return self.steps[-1].residual

    def holds(self) -> bool:
        """True when every step's residual simplifies to zero."""
        return all(step.holds for step in self.steps)

    def failing_steps(self) -> list[int]:
        """1-based numbers of the steps whose residual is not zero."""
        return [i for i, step in enumerate(self.steps, start=1) if not step.holds]

    def _repr_markdown_(self) -> str:
        lines = [f"**{self.title}.** {self.claim}", ""]
        for number, step in enumerate(self.steps, start=1):
            verdict = "residual $0$ ✓" if step.holds else "residual **not zero** ✗"
            lines += [f"{number}. {step.text} ({verdict})", "", f"   $${step.to_latex()}$$", ""]
        failing = self.failing_steps()
        if failing:
            lines.append(f"**Does not hold:** step(s) {', '.join(map(str, failing))} fail.")
        else:
            lines.append("**Holds:** every residual simplifies to $0$. ∎")
        return "\n".join(lines)

    def __repr__(self) -> str:
        status = "holds" if self.holds() else f"fails at steps {self.failing_steps()}"
        return f"Proof({self.title!r}: {len(self.steps)} steps, {status})"


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
