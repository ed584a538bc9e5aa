"""Proofs in sympy: every identity the book states, as a function that checks it.

A proof is a list of :class:`~pecode.proofs.core.Step`\\ s. Each step states ``lhs = rhs`` and sympy
computes its *residual*, ``lhs - rhs`` simplified (after the step's stated
assumptions are substituted). A step holds when its residual is exactly zero; a
proof holds when all its steps do. Where a statement is about every size ``n``,
the algebra is done with symbolic sizes: matrix symbols of symbolic shape, symbolic sums
and induction steps, and, where entries are needed (a softmax), index notation with a
symbolic size (a permutation matrix as ``P_{ik} = δ_{σ(i)k}``, with sums from 0 to
``n - 1`` that sympy evaluates). What is only checked for small sizes is said so.

In a notebook a :class:`~pecode.proofs.core.Proof` renders its steps as Markdown with LaTeX.

Every proof can fail: a step whose sides are equal before simplification is marked as a
definition and proves nothing, and every proof has a false neighbour that fails at a
named step. Each submodule lists its proofs with their neighbours in ``CASES``;
:func:`~pecode.proofs.catalogue` gathers them, and the tests walk it.

Submodules hold the proofs of one chapter or family each; the names below are
re-exported for convenience.
"""

from pecode.proofs.attention import (
    attention_permutation_equivariance,
    permutation_matrix,
    softmax_rows,
)
from pecode.proofs.core import Proof, ProofCase, Step, is_zero, residual

__all__ = [
    "Proof",
    "ProofCase",
    "Step",
    "attention_permutation_equivariance",
    "catalogue",
    "is_zero",
    "permutation_matrix",
    "residual",
    "softmax_rows",
]

MODULES = (
    "alibi",
    "attention",
    "bias_family",
    "euler",
    "mla",
    "mrope",
    "relative",
    "rope",
    "rope_base",
    "scaling",
    "sinusoidal",
    "xpos",
)
"""The submodules that state proofs, one per chapter or family."""


def catalogue() -> dict[str, ProofCase]:
    """Every proof the book states, with its false neighbour: the submodules' ``CASES``.

    Raises:
        ValueError: two cases share a name.
    """
    import importlib

    cases: dict[str, ProofCase] = {}
    for name in MODULES:
        for case in getattr(importlib.import_module(f"pecode.proofs.{name}"), "CASES", ()):
            if case.name in cases:
                raise ValueError(f"two proof cases are named {case.name!r}")
            cases[case.name] = case
    return cases
