"""Proofs about rotary position embedding (chapter 8), with symbolic positions and frequencies.

Positions ``m, n`` are real symbols and frequencies ``θ_i`` positive symbols throughout.
Statements "for every ``d``" are proven for a symbolic number ``N = d/2`` of pairs:

- the block-diagonal matrix ``R^d_{Θ,m}`` is written block by block, its block
  ``(j, i)`` being ``δ_{ji} R(mθ_j)`` with ``θ`` an indexed symbol, and sympy multiplies
  two such matrices block by block, a symbolic ``Sum`` over ``j = 1 .. N`` that it
  evaluates together with the trigonometry (a block index ``i`` in range is written
  ``N = i + r``, ``r >= 0``): this derives ``(R^d_{Θ,m})ᵀ R^d_{Θ,n} = R^d_{Θ,n-m}`` and
  ``(R^d_{Θ,m})ᵀ R^d_{Θ,m} = I_d`` for symbolic ``N``; those identities are then
  substituted into scores and norms with ``MatrixSymbol`` algebra;
- sums over pairs are symbolic ``Sum``\\ s of indexed symbols; summation by parts is
  proven for a symbolic number of terms (sympy combines the sums into a telescoping sum).

The layout permutation is checked for ``d = 2 .. 2·num_pairs`` with explicit matrices
applied to symbolic vectors. Every proof has a false neighbour in :data:`CASES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, cached_property

import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step, residual

__all__ = [
    "CASES",
    "abel_summation",
    "block_rotation",
    "complex_solution_2d",
    "forms_agree",
    "layout_permutation_proof",
    "norm_preserved",
    "relative_identity",
    "relative_identity_block",
    "relative_shift",
    "rope_matrix",
    "source000_rotate_half_derivation",
]

m, n = sp.symbols("m n", real=True)
theta = sp.Symbol("theta", positive=True)
q1, q2, k1, k2 = sp.symbols("q_1 q_2 k_1 k_2", real=True)

# A symbolic number of pairs N = d/2, block indices, and indexed frequencies and features.
pairs = sp.Symbol("N", integer=True, positive=True)
_rest = sp.Symbol("r", integer=True, nonnegative=True)  # N = i + r: block i is in range
_i, _j, _l = sp.symbols("i j l", integer=True, positive=True)
_th = sp.IndexedBase("theta", positive=True)
_q, _k, _x = (sp.IndexedBase(name, real=True) for name in ("q", "k", "x"))


def block_rotation(angle: sp.Expr) -> sp.Matrix:
    """The 2x2 rotation ``[[cos φ, -sin φ], [sin φ, cos φ]]`` (RoFormer §3.2.1)."""
    return _rotation(angle)


def _rotation(angle: sp.Expr, sine: int = 1, scale: sp.Expr = 1) -> sp.Matrix:
    """``scale · [[cos φ, -sine·sin φ], [sine·sin φ, cos φ]]``: ``sine=-1`` flips the sine."""
    c, s = sp.cos(angle), sine * sp.sin(angle)
    return scale * sp.Matrix([[c, -s], [s, c]])


def rope_matrix(position: sp.Expr, thetas: Sequence[sp.Expr], layout: str = "interleaved"):
    """The explicit ``d x d`` RoPE matrix ``R^d_{Θ,m}`` (RoFormer §3.2.2) for ``d = 2·len(thetas)``.

    ``layout="interleaved"`` puts block ``i`` on rows/columns ``2i, 2i+1`` (the paper);
    ``layout="half"`` on ``i, i + d/2``.

    Raises:
        ValueError: ``layout`` is unknown or ``thetas`` is empty.
    """
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    if len(thetas) == 0:
        raise ValueError("thetas must hold at least one frequency")
    half = len(thetas)
    dim = 2 * half
    matrix = sp.zeros(dim, dim)
    for i, th in enumerate(thetas):
        first, second = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + half)
        block = block_rotation(position * th)
        matrix[first, first], matrix[first, second] = block[0, 0], block[0, 1]
        matrix[second, first], matrix[second, second] = block[1, 0], block[1, 1]
    return matrix


def _check_pairs(num_pairs: int, largest: int = 5) -> None:
    if isinstance(num_pairs, bool) or not isinstance(num_pairs, int):
        raise TypeError(f"num_pairs must be an int, got {type(num_pairs).__name__}")
    if not 1 <= num_pairs <= largest:
        raise ValueError(f"num_pairs must be between 1 and {largest}, got {num_pairs}")


def _check_choice(name: str, value: object, allowed: Sequence[object]) -> None:
    if isinstance(value, bool) or value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _thetas(num_pairs: int) -> list[sp.Symbol]:
    return list(sp.symbols(f"theta_1:{num_pairs + 1}", positive=True))


def _vector(name: str, size: int) -> sp.Matrix:
    return sp.Matrix(sp.symbols(f"{name}_1:{size + 1}", real=True))


def _g_2d(a, b, c, d, angle):
    """``Re[(a + ib)(c - id) e^{iφ}]``: RoFormer's ``g`` for one pair."""
    return (a * c + b * d) * sp.cos(angle) - (b * c - a * d) * sp.sin(angle)


def _pair(vector: sp.IndexedBase, index: sp.Expr) -> sp.Matrix:
    """Pair ``index`` of a vector in the interleaved layout: ``(x_{2i-1}, x_{2i})``."""
    return sp.Matrix([vector[2 * index - 1], vector[2 * index]])


def _in_range(index: sp.Symbol) -> dict[sp.Symbol, sp.Expr]:
    """The assumption ``1 <= index <= N``, written ``N = index + r`` with ``r >= 0``."""
    return {pairs: index + _rest}


def _real_part(w: sp.Expr) -> sp.Expr:
    """``Re w = (w + conj w) / 2``, left unexpanded so that the step's residual does the algebra.

    (``sympy.re`` and ``sympy.im`` of a product of real-symbol sums evaluate as they are
    built, which would put the answer into the step's side.)
    """
    return (w + sp.conjugate(w)) / 2


def _imag_part(w: sp.Expr) -> sp.Expr:
    """``Im w = (w - conj w) / (2i)``, unexpanded like :func:`_real_part`."""
    return (w - sp.conjugate(w)) / (2 * sp.I)


def _cis(angle: sp.Expr) -> sp.Expr:
    """``e^{iφ}`` written ``cos φ + i sin φ`` (Euler's formula, proven in chapter 7)."""
    return sp.cos(angle) + sp.I * sp.sin(angle)


class _TrigStep(Step):
    """A :class:`Step` whose residual evaluates symbolic sums, then expands ``cos(a ± b)``.

    Kronecker-delta sums leave products such as ``δ_{il} (cos a cos b + sin a sin b)``,
    which ``simplify`` alone does not combine with ``δ_{il} cos(a - b)``; expanding the
    angle sums first makes the difference a polynomial in ``cos`` and ``sin``.
    """

    @cached_property
    def residual(self):  # type: ignore[override]
        diff = self.lhs - self.rhs
        if self.subs:
            diff = diff.subs(dict(self.subs))
        return diff.applyfunc(lambda entry: sp.simplify(sp.expand(entry.doit(), trig=True)))


class _SumStep(Step):
    """A :class:`Step` between sums over one range: its residual is one sum of differences.

    ``c·Σ f - Σ g`` over the same limits is ``Σ (c f - g)``; the summand is expanded (sums
    of angles included) and simplified. A zero summand proves the step for every number
    of terms; a nonzero one is reported as the residual (a step may then fail that a
    cleverer summation would prove, never the other way round). Sides of another shape
    fall back to the usual residual.
    """

    @cached_property
    def residual(self):  # type: ignore[override]
        diff = self.lhs - self.rhs
        if self.subs:
            diff = diff.subs(dict(self.subs))
        summands, limits = [], None
        for term in sp.Add.make_args(diff):
            sums = [factor for factor in sp.Mul.make_args(term) if isinstance(factor, sp.Sum)]
            if len(sums) != 1 or limits not in (None, sums[0].limits):
                return residual(self.lhs, self.rhs, self.subs)
            limits, coefficient = sums[0].limits, term / sums[0]
            if coefficient.has(limits[0][0]):  # only a factor free of the index moves inside
                return residual(self.lhs, self.rhs, self.subs)
            summands.append(coefficient * sums[0].function)
        summand = sp.simplify(sp.expand(sp.Add(*summands), trig=True))
        return sp.Integer(0) if summand == 0 else sp.Sum(summand, *limits)


# ---------------------------------------------------------------------------------------
# The 2-D solution and one block
# ---------------------------------------------------------------------------------------


def complex_solution_2d(sine: int = 1) -> Proof:
    """In 2-D, ``f(q, m) = q e^{imθ}`` solves ``<f(q, m), f(k, n)> = g(q, k, m - n)``.

    RoFormer §3.4.1 derives this solution; the steps here check it. The vector
    ``(q_1, q_2)`` is read as ``z_q = q_1 + i q_2`` and ``e^{iφ}`` as ``cos φ + i sin φ``
    (substitutions sympy carries out in each step). Real and imaginary parts are written
    ``(w ± conj w)/2`` (and ``/ i``), unexpanded, so that the residual multiplies them out:
    the real inner product is ``Re[z_q conj(z_k)]``, multiplication by ``e^{imθ}`` is the
    rotation matrix, and the product of two rotated numbers keeps only ``e^{i(m-n)θ}``.
    ``sine=-1`` writes the rotation with a flipped sine (``[[cos, sin], [-sin, cos]]``),
    the false neighbour: steps 2 and 4 fail.

    Raises:
        ValueError: ``sine`` is neither 1 nor -1.
    """
    _check_choice("sine", sine, (1, -1))
    zq, zk, w, wm, wn = sp.symbols("z_q z_k w w_m w_n")
    as_complex = {zq: q1 + sp.I * q2, zk: k1 + sp.I * k2}
    r_m, r_n = _rotation(m * theta, sine), _rotation(n * theta, sine)
    q, k = sp.Matrix([q1, q2]), sp.Matrix([k1, k2])
    steps = (
        Step(
            "The real inner product of two 2-vectors is the real part of $z_q \\overline{z_k}$ "
            "(with $z_q = q_1 + i q_2$, $z_k = k_1 + i k_2$ substituted and "
            "$\\operatorname{Re} w = (w + \\overline{w})/2$ multiplied out)",
            q1 * k1 + q2 * k2,
            _real_part(zq * sp.conjugate(zk)),
            subs=as_complex,
            latex="q_1 k_1 + q_2 k_2 = \\operatorname{Re}\\left[z_q \\overline{z_k}\\right]",
        ),
        Step(
            "Multiplying $z_q$ by $w = e^{im\\theta} = \\cos m\\theta + i \\sin m\\theta$ is the "
            "rotation matrix $R(m\\theta)$ acting on $(q_1, q_2)$ (real part, then imaginary "
            "part)",
            sp.Matrix([_real_part(zq * w), _imag_part(zq * w)]),
            r_m * q,
            subs={**as_complex, w: _cis(m * theta)},
            latex=(
                "\\begin{pmatrix}\\operatorname{Re}(z_q e^{im\\theta})\\\\ "
                "\\operatorname{Im}(z_q e^{im\\theta})\\end{pmatrix} = R(m\\theta) q"
            ),
        ),
        Step(
            "The positions meet only as a difference "
            "($w_m = e^{im\\theta}$, $w_n = e^{in\\theta}$, $w = e^{i(m-n)\\theta}$ substituted "
            "as cosines and sines)",
            zq * wm * sp.conjugate(zk * wn),
            zq * sp.conjugate(zk) * w,
            subs={wm: _cis(m * theta), wn: _cis(n * theta), w: _cis((m - n) * theta)},
            latex="z_q w_m\\,\\overline{z_k w_n} = z_q \\overline{z_k}\\, e^{i(m-n)\\theta}",
        ),
        Step(
            "So $\\langle R(m\\theta) q, R(n\\theta) k\\rangle = "
            "g(q, k, m-n) = \\operatorname{Re}[z_q \\overline{z_k} e^{i(m-n)\\theta}]$",
            (r_m * q).dot(r_n * k),
            _real_part(zq * sp.conjugate(zk) * w),
            subs={**as_complex, w: _cis((m - n) * theta)},
            latex=(
                "\\langle R(m\\theta) q, R(n\\theta) k\\rangle = "
                "\\operatorname{Re}\\left[z_q \\overline{z_k}\\, e^{i(m-n)\\theta}\\right]"
            ),
        ),
    )
    flipped = "" if sine == 1 else " (rotation written with a flipped sine)"
    return Proof(
        "The 2-D solution" + flipped,
        "Rotating $q$ by $m\\theta$ and $k$ by $n\\theta$ makes their inner product a "
        "function of $q$, $k$ and $m - n$ only.",
        steps,
    )


def relative_identity_block(sine: int = 1) -> Proof:
    """One 2-D block: ``R(mθ)ᵀ R(nθ) = R((n - m)θ)``, hence ``<R_m q, R_n k> = g(q, k, m - n)``.

    Explicit 2x2 matrices with symbolic entries, multiplied by sympy. ``sine=-1`` writes
    the rotation with a flipped sine: it is still orthogonal and still composes by
    adding angles (steps 1 and 2 hold), but it turns the other way, so the score is
    ``g(q, k, n - m)`` and step 3 fails.

    Raises:
        ValueError: ``sine`` is neither 1 nor -1.
    """
    _check_choice("sine", sine, (1, -1))
    r_m, r_n = _rotation(m * theta, sine), _rotation(n * theta, sine)
    q, k = sp.Matrix([q1, q2]), sp.Matrix([k1, k2])
    steps = (
        Step(
            "A rotation's transpose is its inverse",
            r_m.T * r_m,
            sp.eye(2),
            latex="R(m\\theta)^\\top R(m\\theta) = I_2",
        ),
        Step(
            "Rotations compose by adding angles: $R(m\\theta)^\\top R(n\\theta) = R((n-m)\\theta)$",
            r_m.T * r_n,
            _rotation((n - m) * theta, sine),
            latex="R(m\\theta)^\\top R(n\\theta) = R((n-m)\\theta)",
        ),
        Step(
            "Hence the score depends on $m - n$ only, through "
            "$g = (q\\cdot k)\\cos((m-n)\\theta) - (q_2 k_1 - q_1 k_2)\\sin((m-n)\\theta)$",
            (r_m * q).dot(r_n * k),
            _g_2d(q1, q2, k1, k2, (m - n) * theta),
            latex="\\langle R(m\\theta) q, R(n\\theta) k\\rangle = g(q, k, m - n)",
        ),
    )
    flipped = "" if sine == 1 else " (rotation written with a flipped sine)"
    return Proof(
        "The relative identity for one block" + flipped,
        "For one pair of features, rotated scores depend on the positions only through $m - n$.",
        steps,
    )


# ---------------------------------------------------------------------------------------
# d dimensions: a symbolic number N = d/2 of blocks
# ---------------------------------------------------------------------------------------


def _rope_block(position: sp.Expr, row: sp.Expr, col: sp.Expr, scale: sp.Expr = 1) -> sp.Matrix:
    """Block ``(row, col)`` of ``R^d_{Θ,position}``: ``δ_{row,col} R(position·θ_row)``."""
    return sp.KroneckerDelta(row, col) * _rotation(position * _th[row], scale=scale)


def _block_of_product(first: sp.Expr, second: sp.Expr, transpose: bool = True, scale=1):
    """Block ``(i, l)`` of ``(R^d_{Θ,first})ᵀ R^d_{Θ,second}``: a symbolic sum over block rows."""
    left = _rope_block(first, _j, _i, scale)
    product = (left.T if transpose else left) * _rope_block(second, _j, _l, scale)
    return product.applyfunc(lambda entry: sp.Sum(entry, (_j, 1, pairs)))


def _matrices(shown: str) -> tuple[sp.MatrixSymbol, ...]:
    size = 2 * pairs
    names = ("R^d_{\\Theta,m}", "R^d_{\\Theta,n}", f"R^d_{{\\Theta,{shown}}}")
    return tuple(sp.MatrixSymbol(name, size, size) for name in names)


@cache  # one pair of Step objects, so their residuals are computed once for every proof
def _shift_steps(shift: sp.Expr, transpose: bool = True) -> tuple[Step, Step]:
    """Steps 1-2 of :func:`relative_shift` and :func:`relative_identity`.

    Step 1 derives ``(R^d_m)ᵀ R^d_n = R^d_shift`` block by block for a symbolic number of
    blocks; step 2 substitutes it into the score. ``transpose=False`` forgets the
    transpose of the query's matrix in both.
    """
    shown = "n-m" if shift == n - m else "m-n"
    r_m, r_n, r_shift = _matrices(shown)
    q, k = (sp.MatrixSymbol(name, 2 * pairs, 1) for name in ("q", "k"))
    top = "^\\top" if transpose else ""
    product = f"(R^d_{{\\Theta,m}}){top} R^d_{{\\Theta,n}}"
    blocks = _TrigStep(
        f"Block $(i, l)$ of ${product}$ sums over the $N = d/2$ block rows $j$, block "
        "$(j, i)$ of $R^d_{\\Theta,m}$ being $\\delta_{ji} R(m\\theta_j)$; sympy evaluates the "
        f"Kronecker-delta sums and the trigonometry: it is $\\delta_{{il}} R(({shown})"
        f"\\theta_i)$, block $(i, l)$ of $R^d_{{\\Theta,{shown}}}$. So ${product} = "
        f"R^d_{{\\Theta,{shown}}}$ (symbolic $N$ and $\\theta_i$, $1 \\le i \\le N$)",
        _block_of_product(m, n, transpose),
        sp.KroneckerDelta(_i, _l) * _rotation(shift * _th[_i]),
        subs=_in_range(_i),
        latex=(
            f"\\left[{product}\\right]_{{il}} = \\sum_{{j=1}}^{{N}} "
            f"(\\delta_{{ji}} R(m\\theta_j)){top}\\, \\delta_{{jl}} R(n\\theta_j) = "
            f"\\delta_{{il}} R(({shown})\\theta_i)"
        ),
    )
    move = Step(
        f"Substitute step 1, ${product} = R^d_{{\\Theta,{shown}}}$, into the score "
        "(matrix symbols of size $d = 2N$): the query's rotation moves onto the key",
        (r_m * q).T * (r_n * k),
        q.T * r_shift * k,
        subs={(r_m.T if transpose else r_m) * r_n: r_shift},
        latex=(
            "(R^d_{\\Theta,m} q)^\\top R^d_{\\Theta,n} k = q^\\top (R^d_{\\Theta,m})^\\top "
            f"R^d_{{\\Theta,n}} k = q^\\top R^d_{{\\Theta,{shown}}} k"
        ),
    )
    return blocks, move


def relative_shift(sign: str = "n-m") -> Proof:
    """``<R^d_m q, R^d_n k> = <q, R^d_{n-m} k>`` for every ``d``; ``sign="m-n"``: source 002.

    Step 1 derives ``(R^d_{Θ,m})ᵀ R^d_{Θ,n} = R^d_{Θ,n-m}`` for a symbolic number
    ``N = d/2`` of blocks: block ``(i, l)`` of the product is a symbolic ``Sum`` over the
    block rows of products of Kronecker deltas and rotation blocks, which sympy evaluates
    to ``δ_{il} R((n - m)θ_i)``. Step 2 substitutes this matrix identity into the score
    with ``MatrixSymbol`` algebra (an evaluation by substitution). With ``sign="m-n"``
    step 1 fails.

    Raises:
        ValueError: ``sign`` is neither ``"n-m"`` nor ``"m-n"``.
    """
    _check_choice("sign", sign, ("n-m", "m-n"))
    shift = n - m if sign == "n-m" else m - n
    shown = "n - m" if sign == "n-m" else "m - n"
    return Proof(
        f"Relative shift onto the key ({shown})",
        f"For every even $d$: $\\langle R^d_{{\\Theta,m}} q, R^d_{{\\Theta,n}} k\\rangle = "
        f"\\langle q, R^d_{{\\Theta,{shown}}} k\\rangle$: the query's rotation moves onto the "
        f"key as a rotation by ${shown}$.",
        _shift_steps(shift, True),
    )


@cache
def _pair_steps() -> tuple[Step, Step]:
    """Steps 4-5 of :func:`relative_identity`: ``R^d_{Θ,n-m}`` on ``k``, then the sum of ``g_i``."""
    shift = n - m
    rotation = _rotation(shift * _th[_i])
    apply_block = Step(
        "The block-diagonal $R^d_{\\Theta,n-m}$ acts pair by pair: pair $i$ of "
        "$R^d_{\\Theta,n-m} k$ sums block row $i$ against the $N$ pairs $k_{(l)} = "
        "(k_{2l-1}, k_{2l})$ ($1 \\le i \\le N$)",
        (sp.KroneckerDelta(_i, _l) * rotation * _pair(_k, _l)).applyfunc(
            lambda entry: sp.Sum(entry, (_l, 1, pairs))
        ),
        rotation * _pair(_k, _i),
        subs=_in_range(_i),
        latex=(
            "\\bigl(R^d_{\\Theta,n-m} k\\bigr)_{(i)} = \\sum_{l=1}^{N} \\delta_{il}\\, "
            "R((n-m)\\theta_i)\\, k_{(l)} = R((n-m)\\theta_i)\\, k_{(i)}"
        ),
    )
    qa, qb, ka, kb = _q[2 * _i - 1], _q[2 * _i], _k[2 * _i - 1], _k[2 * _i]
    sum_of_g = Step(
        "The score is the sum of the $N$ pair terms, each RoFormer's $g_i(q, k, m-n)$ "
        "(a symbolic sum over $i = 1, \\dots, N$)",
        sp.Sum((_pair(_q, _i).T * rotation * _pair(_k, _i))[0], (_i, 1, pairs)),
        sp.Sum(_g_2d(qa, qb, ka, kb, (m - n) * _th[_i]), (_i, 1, pairs)),
        latex=(
            "\\langle q, R^d_{\\Theta,n-m} k\\rangle = \\sum_{i=1}^{N} q_{(i)}^\\top "
            "R((n-m)\\theta_i)\\, k_{(i)} = \\sum_{i=1}^{N} g_i(q, k, m - n)"
        ),
    )
    return apply_block, sum_of_g


def relative_identity(transpose: bool = True) -> Proof:
    """For every ``d``: ``<R^d_m q, R^d_n k> = <q, R^d_{n-m} k> = Σ_i g_i(q, k, m - n)``.

    RoFormer §3.2.2, for a symbolic number ``N = d/2`` of blocks. Steps 1-2 are those of
    :func:`relative_shift` (``(R^d_{Θ,m})ᵀ R^d_{Θ,n} = R^d_{Θ,n-m}`` block by block,
    then substituted into the score); step 3 applies the block-diagonal ``R^d_{Θ,n-m}``
    to ``k`` (a symbolic ``Sum`` over blocks); step 4 sums the pair terms into RoFormer's
    ``g_i`` (a symbolic ``Sum`` over ``i = 1 .. N``). ``transpose=False`` forgets the
    transpose of the query's matrix, ``R^d_{Θ,m} R^d_{Θ,n} = R^d_{Θ,n-m}`` (the false
    neighbour): its block product fails (step 1), and the score, which holds
    ``(R^d_{Θ,m})ᵀ``, has nothing to substitute it into (step 2).

    Raises:
        TypeError: ``transpose`` is not a bool.
    """
    if not isinstance(transpose, bool):
        raise TypeError(f"transpose must be a bool, got {type(transpose).__name__}")
    shift = n - m
    forgotten = "" if transpose else " (transpose forgotten)"
    return Proof(
        "The relative identity in $d$ dimensions" + forgotten,
        "For every even $d = 2N$: $(R^d_{\\Theta,m})^\\top R^d_{\\Theta,n} = R^d_{\\Theta,n-m}$, "
        "and the rotated score is a sum of $N$ per-pair terms that each depend on $m - n$ only.",
        (*_shift_steps(shift, transpose), *_pair_steps()),
    )


def norm_preserved(scale: sp.Expr = 1) -> Proof:
    """``(R^d_m)ᵀ R^d_m = I_d`` and ``||R^d_m x|| = ||x||`` for every ``d``.

    Step 1 derives ``(R^d_{Θ,m})ᵀ R^d_{Θ,m} = I_d`` for a symbolic number ``N = d/2`` of
    blocks: block ``(i, l)`` is a symbolic ``Sum`` over block rows of Kronecker deltas
    and rotation blocks, which sympy evaluates to ``δ_{il} I_2``. Step 2 substitutes it
    into ``||R^d_m x||²`` with ``MatrixSymbol`` algebra (an evaluation by substitution).
    ``scale=2`` scales every block (the false neighbour): step 1 fails.
    """
    r_m = sp.MatrixSymbol("R^d_{\\Theta,m}", 2 * pairs, 2 * pairs)
    x = sp.MatrixSymbol("x", 2 * pairs, 1)
    shown = "" if scale == 1 else f"{sp.latex(scale)}\\,"
    steps = (
        _TrigStep(
            "Block $(i, l)$ of $(R^d_{\\Theta,m})^\\top R^d_{\\Theta,m}$ sums over the "
            f"$N = d/2$ block rows $j$, block $(j, i)$ being $\\delta_{{ji}}\\, {shown}"
            "R(m\\theta_j)$; sympy evaluates the Kronecker-delta sums and the trigonometry: it "
            "is $\\delta_{il} I_2$, block $(i, l)$ of $I_d$. So $(R^d_{\\Theta,m})^\\top "
            "R^d_{\\Theta,m} = I_d$ (symbolic $N$ and $\\theta_i$, $1 \\le i \\le N$)",
            _block_of_product(m, m, scale=scale),
            sp.KroneckerDelta(_i, _l) * sp.eye(2),
            subs=_in_range(_i),
            latex=(
                "\\left[(R^d_{\\Theta,m})^\\top R^d_{\\Theta,m}\\right]_{il} = "
                f"\\sum_{{j=1}}^{{N}} (\\delta_{{ji}}\\, {shown}R(m\\theta_j))^\\top\\, "
                f"\\delta_{{jl}}\\, {shown}R(m\\theta_j) = \\delta_{{il}} I_2"
            ),
        ),
        Step(
            "Substitute step 1, $(R^d_{\\Theta,m})^\\top R^d_{\\Theta,m} = I_d$, into the "
            "squared norm (matrix symbols of size $d = 2N$)",
            (r_m * x).T * (r_m * x),
            x.T * x,
            subs={r_m.T * r_m: sp.Identity(2 * pairs)},
            latex="\\lVert R^d_{\\Theta,m} x\\rVert^2 = x^\\top (R^d_{\\Theta,m})^\\top "
            "R^d_{\\Theta,m} x = \\lVert x\\rVert^2",
        ),
    )
    scaled = "" if scale == 1 else f" (blocks scaled by {scale})"
    return Proof(
        "RoPE preserves norms" + scaled,
        "For every even $d$, $R^d_{\\Theta,m}$ is orthogonal, so rotated queries and keys "
        "keep their lengths.",
        steps,
    )


def forms_agree(sine: int = 1) -> Proof:
    """The matrix, complex and element-wise forms of RoPE are the same map, for every ``d``.

    Pair ``i`` of ``R^d_{Θ,m} x`` is computed from the block-diagonal matrix (a symbolic
    ``Sum`` over the ``N = d/2`` blocks of row ``i``) and from complex multiplication
    ``(x_{2i-1} + i x_{2i}) e^{imθ_i}`` (substituted into real and imaginary parts); both
    equal the element-wise formula. ``sine=-1`` flips the sine in the element-wise
    formula (a rotation the wrong way): both steps fail.

    Raises:
        ValueError: ``sine`` is neither 1 nor -1.
    """
    _check_choice("sine", sine, (1, -1))
    a, b = _x[2 * _i - 1], _x[2 * _i]
    angle = m * _th[_i]
    elementwise = sp.Matrix(
        [
            a * sp.cos(angle) - sine * b * sp.sin(angle),
            sine * a * sp.sin(angle) + b * sp.cos(angle),
        ]
    )
    first, second = ("-", "") if sine == 1 else ("+", "-")
    formula = (
        f"(x_{{2i-1}}\\cos m\\theta_i {first} x_{{2i}}\\sin m\\theta_i,\\ "
        f"{second}x_{{2i-1}}\\sin m\\theta_i + x_{{2i}}\\cos m\\theta_i)"
    )
    z, w = sp.symbols("z w")
    steps = (
        Step(
            "Matrix form: pair $i$ of $R^d_{\\Theta,m} x$ sums block row $i$ against the $N$ "
            "pairs of $x$, and equals the element-wise formula ($1 \\le i \\le N$)",
            (sp.KroneckerDelta(_i, _l) * _rotation(m * _th[_i]) * _pair(_x, _l)).applyfunc(
                lambda entry: sp.Sum(entry, (_l, 1, pairs))
            ),
            elementwise,
            subs=_in_range(_i),
            latex=("\\sum_{l=1}^{N} \\delta_{il} R(m\\theta_i) x_{(l)} = " + formula),
        ),
        Step(
            "Complex form: $(\\operatorname{Re}, \\operatorname{Im})(z w)$ with "
            "$z = x_{2i-1} + i x_{2i}$ and $w = e^{im\\theta_i} = \\cos m\\theta_i + "
            "i \\sin m\\theta_i$ substituted, $\\operatorname{Re} u = (u + \\overline{u})/2$ "
            "and $\\operatorname{Im} u = (u - \\overline{u})/(2i)$ multiplied out, equals the "
            "element-wise formula",
            sp.Matrix([_real_part(z * w), _imag_part(z * w)]),
            elementwise,
            subs={z: a + sp.I * b, w: _cis(angle)},
            latex=(
                "\\left(\\operatorname{Re}, \\operatorname{Im}\\right)"
                "\\left[(x_{2i-1} + i x_{2i}) e^{im\\theta_i}\\right] = " + formula
            ),
        ),
    )
    flipped = "" if sine == 1 else " (element-wise formula with a flipped sine)"
    return Proof(
        "Three forms, one map" + flipped,
        "For every even $d = 2N$ and every pair $i \\le N$, with symbolic $x$ and "
        "$\\theta_i$: the block-diagonal matrix, complex multiplication and the element-wise "
        "formula agree.",
        steps,
    )


# ---------------------------------------------------------------------------------------
# Layouts (explicit sizes)
# ---------------------------------------------------------------------------------------


def _layout_order(half: int, mistake: bool = False) -> list[int]:
    """Slot ``2i`` takes half-layout feature ``i``, slot ``2i + 1`` feature ``i + half``.

    ``mistake=True`` swaps the two slots of every pair.
    """
    slots = (1, 0) if mistake else (0, 1)
    return [(i, i + half)[slot] for i in range(half) for slot in slots]


def _permutation_matrix(perm: Sequence[int]) -> sp.Matrix:
    size = len(perm)
    matrix = sp.zeros(size, size)
    for row, col in enumerate(perm):
        matrix[row, col] = 1
    return matrix


def layout_permutation_proof(num_pairs: int = 4, mistake: bool = False) -> Proof:
    """Half and interleaved RoPE are one map up to the permutation ``P``: ``R_int = P R_half Pᵀ``.

    ``P`` moves half-layout feature ``i`` to slot ``2i`` and ``i + d/2`` to ``2i + 1``
    (:func:`pecode.rope.layout_permutation`). Consequence for checkpoints: scores
    with interleaved RoPE and weights ``W_q, W_k`` equal scores with half RoPE and
    weights ``Pᵀ W_q, Pᵀ W_k`` (rows permuted per head).

    Checked for ``d = 2, 4, .., 2·num_pairs`` (not for a symbolic ``d``): explicit
    matrices with symbolic frequencies act on symbolic vectors ``y``, and sympy
    substitutes ``y = P x`` (or ``Pᵀ x``) in each step. ``mistake=True`` swaps the slots
    of each pair (feature ``i + d/2`` to slot ``2i``): still a permutation (step 1 holds),
    but the rotation turns the other way (steps 2 and 3 fail).

    Raises:
        TypeError, ValueError: ``num_pairs`` is not an int from 1 to 5.
    """
    _check_pairs(num_pairs)
    undo, maps, scores = [], [], []
    undo_rhs, maps_rhs, scores_rhs = [], [], []
    subs: dict[sp.Symbol, sp.Expr] = {}
    score_subs: dict[sp.Symbol, sp.Expr] = {}
    for half in range(1, num_pairs + 1):
        thetas, dim = _thetas(half), 2 * half
        p = _permutation_matrix(_layout_order(half, mistake))
        x, q, k, y, u, v = (
            _vector(f"{name}^{{({dim})}}", dim) for name in ("x", "q", "k", "y", "u", "v")
        )
        half_m, half_n = rope_matrix(m, thetas, "half"), rope_matrix(n, thetas, "half")
        inter_m, inter_n = rope_matrix(m, thetas), rope_matrix(n, thetas)
        # sympy substitutes y = P x and u = P^T x (steps 1, 2), u, v = P^T q, P^T k (step 3)
        undo.append(p.T * y)
        undo_rhs.append(x)
        maps.append(p * half_m * u)
        maps_rhs.append(inter_m * x)
        scores.append((half_m * u).dot(half_n * v))
        scores_rhs.append((inter_m * q).dot(inter_n * k))
        subs.update({**dict(zip(y, p * x, strict=True)), **dict(zip(u, p.T * x, strict=True))})
        score_subs.update(
            {**dict(zip(u, p.T * q, strict=True)), **dict(zip(v, p.T * k, strict=True))}
        )
    dims = "$d = " + ", ".join(str(2 * p) for p in range(1, num_pairs + 1)) + "$"
    return Proof(
        "Half versus interleaved layout" + (" (pair slots swapped)" if mistake else ""),
        f"Checked for {dims}: the two layouts are the same rotation with the features "
        "permuted by $P$.",
        (
            Step(
                f"$P$ is a permutation: $P^\\top y = x$ for $y = P x$ ({dims}, symbolic $x$)",
                sp.Matrix.vstack(*undo),
                sp.Matrix.vstack(*undo_rhs),
                subs=subs,
                latex="P^\\top (P x) = x",
            ),
            Step(
                "Conjugating the half-layout matrix by $P$ gives the interleaved one: "
                f"$P R^{{\\text{{half}}}}_m u = R^{{\\text{{int}}}}_m x$ for $u = P^\\top x$ "
                f"({dims})",
                sp.Matrix.vstack(*maps),
                sp.Matrix.vstack(*maps_rhs),
                subs=subs,
                latex="P\\, R^{\\text{half}}_{\\Theta,m} P^\\top x = R^{\\text{int}}_{\\Theta,m} x",
            ),
            Step(
                "Hence half-layout RoPE on $u = P^\\top q$, $v = P^\\top k$ gives the interleaved "
                f"scores of $q, k$ ({dims})",
                sp.Matrix(scores),
                sp.Matrix(scores_rhs),
                subs=score_subs,
                latex="\\langle R^{\\text{half}}_m P^\\top q, R^{\\text{half}}_n P^\\top k\\rangle"
                " = \\langle R^{\\text{int}}_m q, R^{\\text{int}}_n k\\rangle",
            ),
        ),
    )


# ---------------------------------------------------------------------------------------
# Long-term decay: summation by parts
# ---------------------------------------------------------------------------------------


def abel_summation(boundary_offset: int = 0) -> Proof:
    """Summation by parts behind RoFormer's long-term decay bound (§3.4.3), for every ``d``.

    With ``N = d/2`` symbolic, ``h_i`` and ``S_j`` indexed symbols and ``Σ`` over
    ``i = 0 .. N-1``:
    ``Σ h_i (S_{i+1} - S_i) = h_N S_N - h_0 S_0 - Σ S_{i+1} (h_{i+1} - h_i)``.
    Sympy combines the two sums into a telescoping sum and evaluates it (steps 1-3); with
    RoFormer's ``S_0 = 0`` and ``h_{d/2} = 0`` the boundary terms vanish (step 4). The
    bound ``|Σ| <= max_i |h_{i+1} - h_i| · Σ_j |S_j|`` then follows by the triangle
    inequality, by hand (not in sympy). ``boundary_offset=1`` writes the boundary term
    as ``h_{N-1} S_N`` (an index off by one): steps 2, 3 and 4 fail.

    Raises:
        ValueError: ``boundary_offset`` is neither 0 nor 1.
    """
    _check_choice("boundary_offset", boundary_offset, (0, 1))
    i = sp.Symbol("i", integer=True, nonnegative=True)
    h, s = sp.IndexedBase("h"), sp.IndexedBase("S")
    big_n = pairs
    weighted = sp.Sum(h[i] * (s[i + 1] - s[i]), (i, 0, big_n - 1))
    by_parts = sp.Sum(s[i + 1] * (h[i + 1] - h[i]), (i, 0, big_n - 1))
    boundary = h[big_n - boundary_offset] * s[big_n] - h[0] * s[0]
    shown = "h_N S_N" if boundary_offset == 0 else "h_{N-1} S_N"
    steps = (
        Step(
            "The two sums combine into one telescoping sum (symbolic $N = d/2$)",
            weighted + by_parts,
            sp.Sum(h[i + 1] * s[i + 1] - h[i] * s[i], (i, 0, big_n - 1)),
        ),
        Step(
            "The telescoping sum collapses to its boundary terms",
            sp.Sum(h[i + 1] * s[i + 1] - h[i] * s[i], (i, 0, big_n - 1)),
            boundary,
        ),
        Step(
            "Summation by parts",
            weighted,
            boundary - by_parts,
        ),
        Step(
            "With RoFormer's $S_0 = 0$ and $h_{d/2} = h_N = 0$ the boundary terms vanish",
            boundary - by_parts,
            -by_parts,
            subs={s[0]: 0, h[big_n]: 0},
        ),
    )
    return Proof(
        "Summation by parts" + ("" if boundary_offset == 0 else " (boundary index off by one)"),
        "For a symbolic number $N = d/2$ of terms, the score's sum over frequencies "
        f"rewritten with partial sums $S_j$; boundary term ${shown} - h_0 S_0$.",
        steps,
    )


# ---------------------------------------------------------------------------------------
# Source 000's RotateHalf derivation
# ---------------------------------------------------------------------------------------


def _half_pair(x: sp.IndexedBase, j: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """Pair ``j`` in the half layout (1-based): features ``x_j`` and ``x_{j+N}``."""
    return x[j], x[j + pairs]


def _rotate_half_pair(x: sp.IndexedBase, j: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """Entries ``j``, ``j + N`` of ``RotateHalf(x)``: ``-x_{j+N}``, ``x_j`` (source 000's code)."""
    return -x[j + pairs], x[j]


def source000_rotate_half_derivation(distinct_frequencies: bool = False) -> Proof:
    """Source 000's derivation of the RoPE score with ``RotateHalf``, for every ``d``.

    The article writes ``RoPE(x, m) = x cos(mθ) + RotateHalf(x) sin(mθ)`` and ends with
    ``q·k cos((m-n)θ) + RotateHalf(q)·k sin((m-n)θ)``, treating ``θ`` as one scalar.
    Feature ``j`` and ``j + N`` (``N = d/2`` symbolic) form pair ``j``, and
    ``RotateHalf(x)`` has ``-x_{j+N}`` at ``j`` and ``x_j`` at ``j + N``; every dot
    product is a symbolic ``Sum`` over the ``N`` pairs, computed from these definitions.
    With one frequency for every pair the steps hold; with the real RoPE frequencies
    (``distinct_frequencies=True``: pair ``j`` uses ``θ_j``, the table ``cat(cos, cos)``)
    the final scalar formula, read with ``θ_1``, fails (step 3), and its per-feature
    version is what holds (step 4).
    """
    j = _j
    big_n = pairs
    freq = _th[j] if distinct_frequencies else theta
    article_freq = _th[1] if distinct_frequencies else theta

    def pair(x: sp.IndexedBase) -> tuple[sp.Expr, sp.Expr]:
        return _half_pair(x, j)

    def rotate_half(x: sp.IndexedBase) -> tuple[sp.Expr, sp.Expr]:
        return _rotate_half_pair(x, j)

    def dot(u: tuple[sp.Expr, sp.Expr], v: tuple[sp.Expr, sp.Expr]) -> sp.Expr:
        return u[0] * v[0] + u[1] * v[1]

    def rope(x: sp.IndexedBase, pos: sp.Expr) -> tuple[sp.Expr, ...]:
        return tuple(
            a * sp.cos(pos * freq) + b * sp.sin(pos * freq)
            for a, b in zip(pair(x), rotate_half(x), strict=True)
        )

    def over_pairs(term: sp.Expr) -> sp.Sum:
        return sp.Sum(term, (j, 1, big_n))

    q, k = _q, _k
    qk, rq_k = dot(pair(q), pair(k)), dot(rotate_half(q), pair(k))
    cm, sm, cn, sn = (f(p * freq) for p in (m, n) for f in (sp.cos, sp.sin))
    score = over_pairs(dot(rope(q, m), rope(k, n)))
    t = "\\theta_j" if distinct_frequencies else "\\theta"
    rh = "\\mathrm{RotateHalf}"
    per_pair = " (pair by pair)" if distinct_frequencies else ""
    steps = [
        _SumStep(
            f"Second and third terms{per_pair}: $q \\cdot {rh}(k) = -{rh}(q) \\cdot k$, so they "
            f"combine to ${rh}(q)\\cdot k\\,\\sin((m-n){t})$",
            over_pairs(dot(pair(q), rotate_half(k)) * cm * sn + rq_k * sm * cn),
            over_pairs(rq_k * sp.sin((m - n) * freq)),
            latex=(
                f"q\\cdot {rh}(k)\\cos m{t}\\sin n{t} + {rh}(q)\\cdot k\\sin m{t}\\cos n{t} "
                f"= {rh}(q)\\cdot k\\,\\sin((m-n){t})"
            ),
        ),
        _SumStep(
            f"First and fourth terms{per_pair}: ${rh}(q) \\cdot {rh}(k) = q \\cdot k$, so they "
            f"combine to $q\\cdot k\\cos((m-n){t})$",
            over_pairs(qk * cm * cn + dot(rotate_half(q), rotate_half(k)) * sm * sn),
            over_pairs(qk * sp.cos((m - n) * freq)),
            latex=(
                f"q\\cdot k\\cos m{t}\\cos n{t} + {rh}(q)\\cdot {rh}(k)\\sin m{t}\\sin n{t} "
                f"= q\\cdot k\\cos((m-n){t})"
            ),
        ),
    ]
    article = over_pairs(
        qk * sp.cos((m - n) * article_freq) + rq_k * sp.sin((m - n) * article_freq)
    )
    article_latex = (
        "\\mathrm{RoPE}(q,m)\\cdot\\mathrm{RoPE}(k,n) = "
        "q\\cdot k\\cos((m-n)\\theta) + \\mathrm{RotateHalf}(q)\\cdot k\\sin((m-n)\\theta)"
    )
    if distinct_frequencies:
        steps.append(
            _SumStep(
                "The article's scalar result, read with the first frequency $\\theta_1$ "
                "(it names only one $\\theta$)",
                score,
                article,
                latex=article_latex,
            )
        )
        steps.append(
            _SumStep(
                "What holds instead: the same formula feature by feature, "
                "$\\sum_j [q_j k_j \\cos((m-n)\\theta_j) + \\mathrm{RotateHalf}(q)_j k_j "
                "\\sin((m-n)\\theta_j)]$",
                score,
                over_pairs(qk * sp.cos((m - n) * freq) + rq_k * sp.sin((m - n) * freq)),
                latex="\\mathrm{RoPE}(q,m)\\cdot\\mathrm{RoPE}(k,n) = \\sum_j "
                "\\left[q_j k_j\\cos((m-n)\\theta_j) + \\mathrm{RotateHalf}(q)_j k_j "
                "\\sin((m-n)\\theta_j)\\right]",
            )
        )
    else:
        steps.append(
            _SumStep(
                "The article's result, with one frequency $\\theta$ for every pair",
                score,
                article,
                latex=article_latex,
            )
        )
    which = (
        "distinct frequencies $\\theta_j$ (pair $j$ is features $j$, $j + N$)"
        if distinct_frequencies
        else "a single frequency $\\theta$"
    )
    return Proof(
        "Source 000's RotateHalf derivation",
        f"For every even $d = 2N$ (symbolic sums over the $N$ pairs), with {which}.",
        tuple(steps),
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "rope.complex_solution_2d",
        complex_solution_2d,
        lambda: complex_solution_2d(sine=-1),
        (2, 4),
    ),
    ProofCase(
        "rope.relative_identity_block",
        relative_identity_block,
        lambda: relative_identity_block(sine=-1),
        (3,),
    ),
    ProofCase(
        "rope.relative_shift",
        relative_shift,
        lambda: relative_shift("m-n"),
        (1,),
    ),
    ProofCase(
        "rope.relative_identity",
        relative_identity,
        lambda: relative_identity(transpose=False),
        (1, 2),
    ),
    ProofCase(
        "rope.norm_preserved",
        norm_preserved,
        lambda: norm_preserved(scale=2),
        (1,),
    ),
    ProofCase(
        "rope.forms_agree",
        forms_agree,
        lambda: forms_agree(sine=-1),
        (1, 2),
    ),
    ProofCase(
        "rope.layout_permutation_proof",
        lambda: layout_permutation_proof(2),
        lambda: layout_permutation_proof(2, mistake=True),
        (2, 3),
    ),
    ProofCase(
        "rope.abel_summation",
        abel_summation,
        lambda: abel_summation(boundary_offset=1),
        (2, 3, 4),
    ),
    ProofCase(
        "rope.source000_rotate_half_derivation",
        source000_rotate_half_derivation,
        lambda: source000_rotate_half_derivation(distinct_frequencies=True),
        (3,),
    ),
)
"""Every proof of chapter 8 with its false neighbour and the steps where that one fails."""
