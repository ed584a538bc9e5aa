"""The proof machinery: a :class:`Proof` is a list of :class:`Step`\\ s with residuals.

A step proves something only if it could have failed: if its two sides are already
equal as sympy builds them (``m*(θ/s)`` and ``(m/s)*θ`` are one object), its residual
is zero whatever the mathematics, and it is a definition or a restatement. Such a step
must say so (``by_definition=True``): it is shown "by definition", without a check mark,
and it does not count as proof. A step whose substitutions alone make its sides equal
(an evaluation at a point, a hypothesis put in) is shown "by substitution": it can fail
when the expression or the value is wrong, but its work is the substitution. Every
proof the book states comes with a false neighbour (:class:`ProofCase`), the same
derivation of a plausibly wrong claim, which must fail at a named step.

See :mod:`pecode.proofs` for how the book uses them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import sympy as sp
from sympy.matrices.expressions.matexpr import MatrixExpr

__all__ = [
    "ForcedStep",
    "Proof",
    "ProofCase",
    "Step",
    "equal_as_built",
    "is_zero",
    "residual",
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


def equal_as_built(lhs: Any, rhs: Any) -> bool:
    """True when ``lhs - rhs`` is zero before any simplification.

    That is, sympy's automatic evaluation alone (canonical ordering of products and
    sums, collection of numbers, cancellation of identical terms) already makes the two
    sides one object: comparing them checks nothing.
    """
    if lhs == rhs:
        return True
    try:
        diff = lhs - rhs
    except (TypeError, ValueError, sp.ShapeError):
        return False
    if isinstance(diff, sp.MatrixBase):
        return all(entry == 0 for entry in diff)
    if isinstance(diff, MatrixExpr):
        return bool(diff.is_ZeroMatrix)
    return sp.sympify(diff) == 0


@dataclass(frozen=True)
class Step:
    """One step of a proof: the claim ``lhs = rhs``, checked by sympy.

    Args:
        text: what the step says, in words (Markdown; math in ``$...$``).
        lhs, rhs: the two sides, as sympy objects.
        subs: assumptions substituted before simplifying, e.g. ``{P.T*P: I}``.
        latex: how to display the claim when the sides are too large to print
            (for example a check over every permutation); defaults to ``lhs = rhs``.
        by_definition: the step defines a name or restates a side in other words; it is
            shown without a check mark and proves nothing. A step whose sides are
            equal as built (:func:`equal_as_built`) must be marked so.
    """

    text: str
    lhs: Any
    rhs: Any
    subs: Mapping[Any, Any] | None = None
    latex: str | None = None
    by_definition: bool = False

    @property
    def is_restatement(self) -> bool:
        """True when the sides are equal before any simplification (:func:`equal_as_built`)."""
        return equal_as_built(self.lhs, self.rhs)

    @property
    def by_substitution(self) -> bool:
        """True when the step's substitutions alone make the sides equal as built.

        Such a step is an evaluation: it fails if the expression or the substituted
        value is wrong, but sympy's work in it is the substitution and its automatic
        arithmetic, not a simplification. It is shown "by substitution".
        """
        if not self.subs or self.is_restatement:
            return False
        values = dict(self.subs)

        def substituted(side: Any) -> Any:
            return side.subs(values) if hasattr(side, "subs") else side

        return equal_as_built(substituted(self.lhs), substituted(self.rhs))

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


class ForcedStep(Step):
    """A :class:`Step` whose residual first applies rules that hold for positive symbols.

    Such rules (``(b s)^x = b^x s^x``, ``ln(x^y) = y ln x``) are wrong for a symbol that
    may be negative, and sympy applies them only with ``force=True``; a subclass names
    them in :meth:`forced`, and they are used only when every symbol of the step is
    positive (otherwise the step gets the usual residual).
    """

    def forced(self, diff: Any) -> Any:
        """The simplified ``diff`` under the forced rules (for positive symbols)."""
        raise NotImplementedError

    @cached_property
    def residual(self) -> Any:  # type: ignore[override]
        diff = self.lhs - self.rhs
        if self.subs:
            diff = diff.subs(dict(self.subs))
        if not all(symbol.is_positive for symbol in diff.free_symbols):
            return residual(self.lhs, self.rhs, self.subs)
        return self.forced(diff)


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

    def unmarked_restatements(self) -> list[int]:
        """1-based numbers of the steps that are equal as built but not marked ``by_definition``."""
        return [
            i
            for i, step in enumerate(self.steps, start=1)
            if step.is_restatement and not step.by_definition
        ]

    def derived_steps(self) -> list[int]:
        """1-based numbers of the steps that count as proof (not marked ``by_definition``)."""
        return [i for i, step in enumerate(self.steps, start=1) if not step.by_definition]

    def _repr_markdown_(self) -> str:
        lines = [f"**{self.title}.** {self.claim}", ""]
        for number, step in enumerate(self.steps, start=1):
            if step.by_definition:
                verdict = "by definition" if step.holds else "definition, **not equal** ✗"
            elif not step.holds:
                verdict = "residual **not zero** ✗"
            elif step.by_substitution:
                verdict = "by substitution, residual $0$ ✓"
            else:
                verdict = "residual $0$ ✓"
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


@dataclass(frozen=True)
class ProofCase:
    """A proof the book states and its false neighbour.

    Args:
        name: the proof function's name, ``module.function`` (with its arguments
            where one function states several proofs, e.g. ``rope.relative_shift``).
        build: returns the proof, which must hold.
        mutant: returns the same derivation of a plausibly wrong claim (a flipped sign,
            an exponent off by one, a swapped index, a wrong weight).
        fails_at: the 1-based steps at which the mutant fails, exactly.
    """

    name: str
    build: Callable[[], Proof]
    mutant: Callable[[], Proof]
    fails_at: tuple[int, ...]
