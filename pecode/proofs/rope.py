"""Proofs about rotary position embedding (chapter 8), with symbolic positions and frequencies.

Positions ``m, n`` are real symbols and frequencies ``θ_i`` positive symbols throughout.
Statements "for every ``d``" are written as sums over ``i = 1 .. d/2`` of indexed symbols
(``q_{2i-1}, q_{2i}`` become ``a_i, b_i``), so sympy proves them for a symbolic number of
pairs; statements about explicit ``d x d`` matrices are checked for ``d = 2 .. 2·num_pairs``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from pecode.proofs.core import Proof, Step

__all__ = [
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


def block_rotation(angle: sp.Expr) -> sp.Matrix:
    """The 2x2 rotation ``[[cos φ, -sin φ], [sin φ, cos φ]]`` (RoFormer §3.2.1)."""
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


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


def _thetas(num_pairs: int) -> list[sp.Symbol]:
    return list(sp.symbols(f"theta_1:{num_pairs + 1}", positive=True))


def _vector(name: str, size: int) -> sp.Matrix:
    return sp.Matrix(sp.symbols(f"{name}_1:{size + 1}", real=True))


def _g_2d(a, b, c, d, angle):
    """``Re[(a + ib)(c - id) e^{iφ}]``: RoFormer's ``g`` for one pair."""
    return (a * c + b * d) * sp.cos(angle) - (b * c - a * d) * sp.sin(angle)


def complex_solution_2d() -> Proof:
    """In 2-D, ``f(q, m) = q e^{imθ}`` solves ``<f(q, m), f(k, n)> = g(q, k, m - n)``.

    RoFormer §3.4.1 derives this solution; the steps here check it.
    The vector ``(q_1, q_2)`` is read as ``z_q = q_1 + i q_2``; the real inner product
    is ``Re[z_q conj(z_k)]``, multiplication by ``e^{imθ}`` is the rotation matrix,
    and the product of two rotated numbers keeps only ``e^{i(m-n)θ}``.
    """
    zq, zk = q1 + sp.I * q2, k1 + sp.I * k2
    rotor_m, rotor_n = sp.exp(sp.I * m * theta), sp.exp(sp.I * n * theta)
    rotated = block_rotation(m * theta) * sp.Matrix([q1, q2])
    goal_lhs = (block_rotation(m * theta) * sp.Matrix([q1, q2])).dot(
        block_rotation(n * theta) * sp.Matrix([k1, k2])
    )
    steps = (
        Step(
            "The real inner product of two 2-vectors is the real part of $z_q \\overline{z_k}$",
            q1 * k1 + q2 * k2,
            sp.re(sp.expand(zq * sp.conjugate(zk))),
            latex="q_1 k_1 + q_2 k_2 = \\operatorname{Re}\\left[z_q \\overline{z_k}\\right]",
        ),
        Step(
            "Multiplying $z_q$ by $e^{im\\theta}$ is the rotation matrix $R(m\\theta)$ "
            "acting on $(q_1, q_2)$ (real part, then imaginary part)",
            sp.Matrix([sp.re(sp.expand(zq * rotor_m)), sp.im(sp.expand(zq * rotor_m))]),
            rotated,
            latex=(
                "\\begin{pmatrix}\\operatorname{Re} \\\\ \\operatorname{Im}\\end{pmatrix}"
                "(z_q e^{im\\theta}) = R(m\\theta) \\begin{pmatrix} q_1 \\\\ q_2\\end{pmatrix}"
            ),
        ),
        Step(
            "The positions meet only as a difference: "
            "$z_q e^{im\\theta}\\,\\overline{z_k e^{in\\theta}} = "
            "z_q \\overline{z_k}\\, e^{i(m-n)\\theta}$",
            sp.expand(zq * rotor_m * sp.conjugate(zk * rotor_n)),
            sp.expand(zq * sp.conjugate(zk) * sp.exp(sp.I * (m - n) * theta)),
            latex=(
                "z_q e^{im\\theta}\\,\\overline{z_k e^{in\\theta}} = "
                "z_q \\overline{z_k}\\, e^{i(m-n)\\theta}"
            ),
        ),
        Step(
            "So $\\langle R(m\\theta) q, R(n\\theta) k\\rangle = "
            "g(q, k, m-n) = \\operatorname{Re}[z_q \\overline{z_k} e^{i(m-n)\\theta}]$",
            goal_lhs,
            sp.re(sp.expand(zq * sp.conjugate(zk) * sp.exp(sp.I * (m - n) * theta))),
            latex=(
                "\\langle R(m\\theta) q, R(n\\theta) k\\rangle = "
                "\\operatorname{Re}\\left[z_q \\overline{z_k}\\, e^{i(m-n)\\theta}\\right]"
            ),
        ),
    )
    return Proof(
        "The 2-D solution",
        "Rotating $q$ by $m\\theta$ and $k$ by $n\\theta$ makes their inner product a "
        "function of $q$, $k$ and $m - n$ only.",
        steps,
    )


def relative_identity_block() -> Proof:
    """One 2-D block: ``R(mθ)ᵀ R(nθ) = R((n - m)θ)``, hence ``<R_m q, R_n k> = g(q, k, m - n)``."""
    r_m, r_n = block_rotation(m * theta), block_rotation(n * theta)
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
            block_rotation((n - m) * theta),
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
    return Proof(
        "The relative identity for one block",
        "For one pair of features, rotated scores depend on the positions only through $m - n$.",
        steps,
    )


def relative_identity(num_pairs: int = 3) -> Proof:
    """For every ``d``: ``<R^d_m q, R^d_n k> = Σ_i g_i(q, k, m - n)`` (RoFormer §3.2.2).

    Step 1 is proven for a symbolic number of pairs ``d/2`` (a sum of indexed
    symbols); steps 2 and 3 check the explicit ``d x d`` matrices for
    ``d = 2 .. 2·num_pairs`` with symbolic entries and frequencies.

    Raises:
        TypeError, ValueError: ``num_pairs`` is not an int from 1 to 5.
    """
    _check_pairs(num_pairs)
    i = sp.Symbol("i", integer=True, positive=True)
    half = sp.Symbol("h", integer=True, positive=True)  # d / 2
    th, a, b, c, d = (sp.IndexedBase(s) for s in ("theta", "a", "b", "c", "d"))

    def rot(x, y, pos):
        angle = pos * th[i]
        return x * sp.cos(angle) - y * sp.sin(angle), x * sp.sin(angle) + y * sp.cos(angle)

    (qa, qb), (ka, kb) = rot(a[i], b[i], m), rot(c[i], d[i], n)
    step_sum = Step(
        "Block by block, for a symbolic number $d/2$ of pairs "
        "$(a_i, b_i)$ of $q$ and $(c_i, d_i)$ of $k$",
        sp.Sum(qa * ka + qb * kb, (i, 1, half)),
        sp.Sum(_g_2d(a[i], b[i], c[i], d[i], (m - n) * th[i]), (i, 1, half)),
        latex=(
            "\\langle R^d_{\\Theta,m} q, R^d_{\\Theta,n} k\\rangle = "
            "\\sum_{i=1}^{d/2} g_i(q, k, m - n)"
        ),
    )
    matrices, identities, scores, sums = [], [], [], []
    for pairs in range(1, num_pairs + 1):
        thetas = _thetas(pairs)
        q, k = _vector("q", 2 * pairs), _vector("k", 2 * pairs)
        r_m, r_n = rope_matrix(m, thetas), rope_matrix(n, thetas)
        matrices.append(r_m.T * r_n)
        identities.append(rope_matrix(n - m, thetas))
        scores.append((r_m * q).dot(r_n * k))
        sums.append(
            sum(
                _g_2d(q[2 * j], q[2 * j + 1], k[2 * j], k[2 * j + 1], (m - n) * thetas[j])
                for j in range(pairs)
            )
        )
    dims = f"$d = 2, \\dots, {2 * num_pairs}$"
    step_matrix = Step(
        f"The block-diagonal matrices compose the same way ({dims}, symbolic $\\theta_i$)",
        sp.diag(*matrices),
        sp.diag(*identities),
        latex="(R^d_{\\Theta,m})^\\top R^d_{\\Theta,n} = R^d_{\\Theta,n-m}",
    )
    step_scores = Step(
        f"and the explicit scores are the sums of the block terms ({dims})",
        sp.Matrix(scores),
        sp.Matrix(sums),
        latex=(
            "q^\\top (R^d_{\\Theta,m})^\\top R^d_{\\Theta,n} k = "
            "\\sum_{i} g(q_{(i)}, k_{(i)}, m - n)"
        ),
    )
    return Proof(
        "The relative identity in $d$ dimensions",
        "With $d/2$ frequencies, the rotated score is a sum of per-pair terms that "
        "each depend on $m - n$ only.",
        (step_sum, step_matrix, step_scores),
    )


def relative_shift(sign: str = "n-m", num_pairs: int = 2) -> Proof:
    """``<R_m q, R_n k> = <q, R_{n-m} k>``; with ``sign="m-n"`` the claim of source 002 fails.

    Raises:
        ValueError: ``sign`` is neither ``"n-m"`` nor ``"m-n"``.
        TypeError, ValueError: ``num_pairs`` is not an int from 1 to 5.
    """
    if sign not in ("n-m", "m-n"):
        raise ValueError(f"sign must be 'n-m' or 'm-n', got {sign!r}")
    _check_pairs(num_pairs)
    thetas = _thetas(num_pairs)
    q, k = _vector("q", 2 * num_pairs), _vector("k", 2 * num_pairs)
    shift = n - m if sign == "n-m" else m - n
    shown = "n - m" if sign == "n-m" else "m - n"
    step = Step(
        f"Move both rotations onto the key ($d = {2 * num_pairs}$, symbolic entries)",
        (rope_matrix(m, thetas) * q).dot(rope_matrix(n, thetas) * k),
        q.dot(rope_matrix(shift, thetas) * k),
        latex=(
            "\\langle \\mathrm{RoPE}(q, m), \\mathrm{RoPE}(k, n)\\rangle = "
            f"\\langle q, \\mathrm{{RoPE}}(k, {shown})\\rangle"
        ),
    )
    return Proof(
        f"Relative shift onto the key ({shown})",
        f"The query's rotation can be moved onto the key as a rotation by ${shown}$.",
        (step,),
    )


def norm_preserved(num_pairs: int = 3) -> Proof:
    """``||R^d_m x|| = ||x||`` for every ``d`` (a sum over pairs) and ``RᵀR = I`` explicitly.

    Raises:
        TypeError, ValueError: ``num_pairs`` is not an int from 1 to 5.
    """
    _check_pairs(num_pairs)
    i = sp.Symbol("i", integer=True, positive=True)
    half = sp.Symbol("h", integer=True, positive=True)
    th, a, b = (sp.IndexedBase(s) for s in ("theta", "a", "b"))
    angle = m * th[i]
    ra, rb = (
        a[i] * sp.cos(angle) - b[i] * sp.sin(angle),
        a[i] * sp.sin(angle) + b[i] * sp.cos(angle),
    )
    step_sum = Step(
        "Squared norm, pair by pair, for a symbolic number $d/2$ of pairs",
        sp.Sum(ra**2 + rb**2, (i, 1, half)),
        sp.Sum(a[i] ** 2 + b[i] ** 2, (i, 1, half)),
        latex="\\lVert R^d_{\\Theta,m} x\\rVert^2 = \\sum_{i=1}^{d/2} (a_i^2 + b_i^2) = "
        "\\lVert x\\rVert^2",
    )
    products = [
        rope_matrix(m, _thetas(p)).T * rope_matrix(m, _thetas(p)) for p in range(1, num_pairs + 1)
    ]
    step_orthogonal = Step(
        f"The explicit matrices are orthogonal ($d = 2, \\dots, {2 * num_pairs}$)",
        sp.diag(*products),
        sp.diag(*[sp.eye(2 * p) for p in range(1, num_pairs + 1)]),
        latex="(R^d_{\\Theta,m})^\\top R^d_{\\Theta,m} = I_d",
    )
    return Proof(
        "RoPE preserves norms",
        "Every $R^d_{\\Theta,m}$ is orthogonal, so rotated queries and keys keep their lengths.",
        (step_sum, step_orthogonal),
    )


def forms_agree(num_pairs: int = 3) -> Proof:
    """The matrix, complex and element-wise forms of RoPE are the same map.

    Raises:
        TypeError, ValueError: ``num_pairs`` is not an int from 1 to 5.
    """
    _check_pairs(num_pairs)
    thetas = _thetas(num_pairs)
    x = _vector("x", 2 * num_pairs)
    matrix_form = rope_matrix(m, thetas) * x
    complex_rows, element_rows = [], []
    for i, th in enumerate(thetas):
        a, b = x[2 * i], x[2 * i + 1]
        z = sp.expand((a + sp.I * b) * sp.exp(sp.I * m * th))
        complex_rows += [sp.re(z), sp.im(z)]
        element_rows += [
            a * sp.cos(m * th) - b * sp.sin(m * th),
            a * sp.sin(m * th) + b * sp.cos(m * th),
        ]
    d = 2 * num_pairs
    return Proof(
        "Three forms, one map",
        f"For $d = {d}$ with symbolic $x$ and $\\theta_i$: the block-diagonal matrix, "
        "complex multiplication and the element-wise formula agree.",
        (
            Step(
                "Matrix form equals complex form $(x_{2i-1} + i x_{2i}) e^{im\\theta_i}$",
                matrix_form,
                sp.Matrix(complex_rows),
                latex="R^d_{\\Theta,m} x = \\left(\\operatorname{Re}, \\operatorname{Im}\\right)"
                "\\left[(x_{2i-1} + i x_{2i}) e^{im\\theta_i}\\right]_{i=1}^{d/2}",
            ),
            Step(
                "Complex form equals the element-wise formula $(a\\cos m\\theta_i - "
                "b\\sin m\\theta_i,\\ a\\sin m\\theta_i + b\\cos m\\theta_i)$",
                sp.Matrix(complex_rows),
                sp.Matrix(element_rows),
                latex="\\left(\\operatorname{Re}, \\operatorname{Im}\\right)"
                "\\left[(a + ib) e^{im\\theta}\\right] = "
                "(a\\cos m\\theta - b\\sin m\\theta,\\ a\\sin m\\theta + b\\cos m\\theta)",
            ),
        ),
    )


def _permutation_matrix(perm: Sequence[int]) -> sp.Matrix:
    size = len(perm)
    matrix = sp.zeros(size, size)
    for row, col in enumerate(perm):
        matrix[row, col] = 1
    return matrix


def layout_permutation_proof(num_pairs: int = 3) -> Proof:
    """Half and interleaved RoPE are one map up to the permutation ``P``: ``R_int = P R_half Pᵀ``.

    ``P`` moves half-layout feature ``i`` to slot ``2i`` and ``i + d/2`` to ``2i + 1``
    (:func:`pecode.rope.layout_permutation`). Consequence for checkpoints: scores
    with interleaved RoPE and weights ``W_q, W_k`` equal scores with half RoPE and
    weights ``Pᵀ W_q, Pᵀ W_k`` (rows permuted per head).

    Raises:
        TypeError, ValueError: ``num_pairs`` is not an int from 1 to 5.
    """
    _check_pairs(num_pairs)
    lhs_perm, rhs_perm, lhs_map, rhs_map, lhs_score, rhs_score = [], [], [], [], [], []
    for pairs in range(1, num_pairs + 1):
        thetas = _thetas(pairs)
        dim = 2 * pairs
        perm = [j for i in range(pairs) for j in (i, i + pairs)]
        p = _permutation_matrix(perm)
        lhs_perm.append(p * p.T)
        rhs_perm.append(sp.eye(dim))
        half_m = rope_matrix(m, thetas, "half")
        lhs_map.append(p * half_m * p.T)
        rhs_map.append(rope_matrix(m, thetas, "interleaved"))
        # q, k produced by interleaved-layout weights; P^T q, P^T k by converted weights
        q, k = _vector("q", dim), _vector("k", dim)
        lhs_score.append((half_m * p.T * q).dot(rope_matrix(n, thetas, "half") * p.T * k))
        rhs_score.append(
            (rope_matrix(m, thetas) * q).dot(rope_matrix(n, thetas) * k),
        )
    dims = f"$d = 2, \\dots, {2 * num_pairs}$"
    return Proof(
        "Half versus interleaved layout",
        "The two layouts are the same rotation with the features permuted by $P$.",
        (
            Step(
                f"$P$ is a permutation, so $PP^\\top = I$ ({dims})",
                sp.diag(*lhs_perm),
                sp.diag(*rhs_perm),
                latex="P P^\\top = I_d",
            ),
            Step(
                f"Conjugating the half-layout matrix by $P$ gives the interleaved one ({dims})",
                sp.diag(*lhs_map),
                sp.diag(*rhs_map),
                latex="P\\, R^{\\text{half}}_{\\Theta,m} P^\\top = R^{\\text{int}}_{\\Theta,m}",
            ),
            Step(
                "Hence half-layout RoPE on $P^\\top q, P^\\top k$ gives the interleaved "
                f"scores of $q, k$ ({dims})",
                sp.Matrix(lhs_score),
                sp.Matrix(rhs_score),
                latex="\\langle R^{\\text{half}}_m P^\\top q, R^{\\text{half}}_n P^\\top k\\rangle"
                " = \\langle R^{\\text{int}}_m q, R^{\\text{int}}_n k\\rangle",
            ),
        ),
    )


def abel_summation(num_pairs: int = 4) -> Proof:
    """Summation by parts behind RoFormer's long-term decay bound (§3.4.3).

    With ``S_0 = 0``, ``S_j = Σ_{i<j} e^{i(m-n)θ_i}`` and ``h_{d/2} = 0``:
    ``Σ_{i=0}^{d/2-1} h_i e^{i(m-n)θ_i} = -Σ_{i=0}^{d/2-1} S_{i+1} (h_{i+1} - h_i)``,
    checked for ``d/2 = 1 .. num_pairs`` with symbolic ``h_i`` and ``S_j``; the
    bound ``|Σ| <= max_i |h_{i+1} - h_i| · Σ_j |S_j|`` follows by the triangle
    inequality.

    Raises:
        TypeError, ValueError: ``num_pairs`` is not an int from 1 to 5.
    """
    _check_pairs(num_pairs)
    lhs, rhs = [], []
    for pairs in range(1, num_pairs + 1):
        h = [*sp.symbols(f"h_0:{pairs}"), sp.Integer(0)]
        s = [sp.Integer(0), *sp.symbols(f"S_1:{pairs + 1}")]
        # e^{i(m-n)θ_i} = S_{i+1} - S_i
        lhs.append(sum(h[i] * (s[i + 1] - s[i]) for i in range(pairs)))
        rhs.append(-sum(s[i + 1] * (h[i + 1] - h[i]) for i in range(pairs)))
    return Proof(
        "Summation by parts",
        "The score's sum over frequencies rewritten with partial sums $S_j$.",
        (
            Step(
                f"For $d/2 = 1, \\dots, {num_pairs}$ with symbolic $h_i$ and $S_j$",
                sp.Matrix(lhs),
                sp.Matrix(rhs),
                latex="\\sum_{i=0}^{d/2-1} h_i (S_{i+1} - S_i) = "
                "-\\sum_{i=0}^{d/2-1} S_{i+1} (h_{i+1} - h_i)",
            ),
        ),
    )


def _rotate_half(v: sp.Matrix) -> sp.Matrix:
    half = v.shape[0] // 2
    return sp.Matrix.vstack(-v[half:, :], v[:half, :])


def source000_rotate_half_derivation(distinct_frequencies: bool = False) -> Proof:
    """Source 000's derivation of the RoPE score with ``RotateHalf``, step by step, for ``d = 4``.

    The article writes ``RoPE(x, m) = x cos(mθ) + RotateHalf(x) sin(mθ)`` and ends with
    ``q·k cos((m-n)θ) + RotateHalf(q)·k sin((m-n)θ)``, treating ``θ`` as one scalar.
    With one frequency for every pair the steps hold; with the real RoPE
    frequencies (``distinct_frequencies=True``: feature ``j`` uses ``θ_{j mod d/2}``,
    the table ``cat(cos, cos)``) the final scalar formula has no meaning, and its
    per-feature version is what holds (checked as a separate last step).
    """
    q, k = _vector("q", 4), _vector("k", 4)
    if distinct_frequencies:
        t1, t2 = sp.symbols("theta_1 theta_2", positive=True)
        freqs = [t1, t2, t1, t2]
    else:
        freqs = [theta] * 4

    def rope(v, pos):
        return sp.Matrix(
            [
                v[j] * sp.cos(pos * freqs[j]) + _rotate_half(v)[j] * sp.sin(pos * freqs[j])
                for j in range(4)
            ]
        )

    score = rope(q, m).dot(rope(k, n))
    rh_q, rh_k = _rotate_half(q), _rotate_half(k)
    steps = [
        Step(
            "$q \\cdot \\mathrm{RotateHalf}(k) = -\\mathrm{RotateHalf}(q) \\cdot k$",
            q.dot(rh_k),
            -rh_q.dot(k),
        ),
        Step(
            "$\\mathrm{RotateHalf}(q) \\cdot \\mathrm{RotateHalf}(k) = q \\cdot k$",
            rh_q.dot(rh_k),
            q.dot(k),
        ),
    ]
    if distinct_frequencies:
        per_feature = sum(
            q[j] * k[j] * sp.cos((m - n) * freqs[j]) + rh_q[j] * k[j] * sp.sin((m - n) * freqs[j])
            for j in range(4)
        )
        steps.append(
            Step(
                "The article's scalar result, read with the first frequency $\\theta_1$ "
                "(it names only one $\\theta$)",
                score,
                q.dot(k) * sp.cos((m - n) * freqs[0]) + rh_q.dot(k) * sp.sin((m - n) * freqs[0]),
                latex="\\mathrm{RoPE}(q,m)\\cdot\\mathrm{RoPE}(k,n) = "
                "q\\cdot k\\cos((m-n)\\theta) + \\mathrm{RotateHalf}(q)\\cdot k\\sin((m-n)\\theta)",
            )
        )
        steps.append(
            Step(
                "What holds instead: the same formula feature by feature, "
                "$\\sum_j [q_j k_j \\cos((m-n)\\theta_j) + \\mathrm{RotateHalf}(q)_j k_j "
                "\\sin((m-n)\\theta_j)]$",
                score,
                per_feature,
                latex="\\mathrm{RoPE}(q,m)\\cdot\\mathrm{RoPE}(k,n) = \\sum_j "
                "\\left[q_j k_j\\cos((m-n)\\theta_j) + \\mathrm{RotateHalf}(q)_j k_j "
                "\\sin((m-n)\\theta_j)\\right]",
            )
        )
    else:
        steps.append(
            Step(
                "The article's result, with one frequency $\\theta$ for every pair",
                score,
                q.dot(k) * sp.cos((m - n) * theta) + rh_q.dot(k) * sp.sin((m - n) * theta),
                latex="\\mathrm{RoPE}(q,m)\\cdot\\mathrm{RoPE}(k,n) = "
                "q\\cdot k\\cos((m-n)\\theta) + \\mathrm{RotateHalf}(q)\\cdot k\\sin((m-n)\\theta)",
            )
        )
    which = (
        "distinct frequencies $\\theta_1 \\ne \\theta_2$"
        if distinct_frequencies
        else ("a single frequency $\\theta$")
    )
    return Proof(
        "Source 000's RotateHalf derivation",
        f"Checked for $d = 4$ with {which}.",
        tuple(steps),
    )
