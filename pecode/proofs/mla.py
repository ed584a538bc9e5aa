"""Proofs about multi-head latent attention (MLA, DeepSeek-V2 arXiv 2405.04434, §2.1.2–2.1.3).

MLA caches a latent ``c_kv`` per token and reads every head's key back up, ``k = W_UK
c_kv``; the query comes from its own latent, ``q = W_UQ c_q``. Three statements:

- without positions the key's up-projection folds into the query's:
  ``qᵀk = c_qᵀ (W_UQᵀ W_UK) c_kv``, one matrix computed once (:func:`absorbed_key_projection`);
- with RoPE on the up-projected query and key, the rotation sits *between* the two
  projections, ``c_qᵀ W_UQᵀ R_{n-m} W_UK c_kv``: the matrix changes with the offset, and
  the fixed ``W_UQᵀ W_UK`` is right at offset 0 only (:func:`rope_between_projections`,
  whose false neighbour is the fixed absorption);
- the decoupled form, ``q_Cᵀ k_C + (R_m q_R)ᵀ (R_n k_R)`` with one rotary key ``k_R`` per
  token, absorbs its content part and is 1-D RoPE's relative identity in its rotary
  part (:func:`decoupled_rope_score`).

The matrices are explicit matrices of symbols, so these are *checked for the sizes
built*, not proven for every size: a head of ``2`` features (one rotated pair, frequency
``θ_1``) and latents of ``2`` (the decoupled head: ``2`` content features turned by
nothing, or by ``θ_2`` in the neighbour, ``2`` rotary ones, latents of ``1``). sympy's
trigonometric simplification grows fast with the sizes; what the proofs use holds pair by
pair (RoPE's rotation is block-diagonal, and the scores are sums over pairs and latent
entries), so more pairs and wider latents add terms of the same form. Every proof has a
false neighbour in :data:`CASES`.
"""

from __future__ import annotations

import sympy as sp

from pecode.proofs.core import Proof, ProofCase, Step

__all__ = [
    "CASES",
    "absorbed_key_projection",
    "decoupled_rope_score",
    "rope_between_projections",
    "rotation",
]

_m, _n = sp.symbols("m n", integer=True)
_thetas = sp.symbols("theta_1 theta_2", positive=True)


def _matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    """An explicit ``rows × cols`` matrix of real symbols ``name_{ij}``."""
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{{{i + 1}{j + 1}}}", real=True))


def rotation(position: sp.Expr, thetas: tuple[sp.Expr, ...] = _thetas[:1]) -> sp.Matrix:
    """RoPE's block-diagonal rotation ``R_p``: pair ``i`` (features ``2i, 2i+1``) turns by
    ``p · θ_i``; ``2 · len(thetas)`` features."""
    blocks = []
    for theta in thetas:
        c, s = sp.cos(position * theta), sp.sin(position * theta)
        blocks.append(sp.Matrix([[c, -s], [s, c]]))
    return sp.diag(*blocks)


_HEAD, _KV_RANK, _Q_RANK = 2, 2, 2
_W_UQ, _W_UK = _matrix("W^{UQ}", _HEAD, _Q_RANK), _matrix("W^{UK}", _HEAD, _KV_RANK)
_c_q, _c_kv = _matrix("c^{Q}", _Q_RANK, 1), _matrix("c^{KV}", _KV_RANK, 1)


def absorbed_key_projection(order: str = "W_UQ^T W_UK") -> Proof:
    """Without positions, ``W_UK`` folds into the query: one precomputed matrix.

    ``q = W_UQ c_q`` and ``k = W_UK c_kv``, so ``qᵀk = c_qᵀ (W_UQᵀ W_UK) c_kv``: the
    ``r_q × r_kv`` matrix ``W_UQᵀ W_UK`` is computed once, and attention runs on the
    cached latents without expanding any key. ``order="W_UK^T W_UQ"`` is the neighbour
    that multiplies the projections the other way round, ``c_qᵀ (W_UKᵀ W_UQ) c_kv``
    (the transposed matrix between the same latents): it fails.
    """
    if order == "W_UQ^T W_UK":
        rhs = _c_q.T * (_W_UQ.T * _W_UK) * _c_kv
    elif order == "W_UK^T W_UQ":
        # the transposed fold between the same latents (the ranks are equal here, so
        # the shapes fit): W_UKᵀ W_UQ is (W_UQᵀ W_UK)ᵀ, not the same matrix
        rhs = _c_q.T * (_W_UK.T * _W_UQ) * _c_kv
    else:
        raise ValueError(f"order must be 'W_UQ^T W_UK' or 'W_UK^T W_UQ', got {order!r}")
    q, k = _W_UQ * _c_q, _W_UK * _c_kv
    steps = (
        Step(
            "The score of the up-projected query and key is a bilinear form of the two "
            "latents, through one matrix",
            q.T * k,
            rhs,
            latex=(
                "(W^{UQ} c^Q)^\\top (W^{UK} c^{KV}) = c^{Q\\top} "
                + ("(W^{UQ\\top} W^{UK})" if order == "W_UQ^T W_UK" else "(W^{UK\\top} W^{UQ})")
                + " c^{KV}"
            ),
        ),
    )
    title = "Without positions, the key's up-projection absorbs into the query"
    if order != "W_UQ^T W_UK":
        title += " (the projections multiplied the other way round)"
    return Proof(
        title,
        "For every query latent and key latent, the score is c_qᵀ M c_kv with the fixed "
        "matrix M = W_UQᵀ W_UK (checked for a 2-wide head and latents of 2).",
        steps,
    )


def rope_between_projections(absorb_fixed: bool = False) -> Proof:
    """With RoPE on the up-projected query and key, the matrix between the latents moves.

    ``(R_m W_UQ c_q)ᵀ (R_n W_UK c_kv) = c_qᵀ (W_UQᵀ R_{n-m} W_UK) c_kv``: the rotation of
    the offset sits between the two projections, so no one matrix serves every pair of
    positions, and the cache would have to hold every head's rotated key. The fixed
    ``W_UQᵀ W_UK`` is that matrix at offset 0 only. ``absorb_fixed=True`` is the false
    neighbour, the claim that the absorbed matrix is still ``W_UQᵀ W_UK``: it fails at
    step 3 for ``n ≠ m`` (its residual, ``W_UQᵀ (R_{n-m} - I) W_UK``, is not identically
    zero).
    """
    r_m, r_n, r_offset = rotation(_m), rotation(_n), rotation(_n - _m)
    rotated = (r_m * _W_UQ).T * (r_n * _W_UK)  # the matrix between the latents, as built
    claimed = _W_UQ.T * _W_UK if absorb_fixed else _W_UQ.T * r_offset * _W_UK
    score = (r_m * _W_UQ * _c_q).T * (r_n * _W_UK * _c_kv)
    steps = (
        Step(
            "RoPE's relative identity: turning the query back by $m$ and the key on by "
            "$n$ is one turn by the offset",
            r_m.T * r_n,
            r_offset,
            latex="R_m^\\top R_n = R_{n-m}",
        ),
        Step(
            "The score of the rotated up-projections is a bilinear form of the two latents",
            score,
            _c_q.T * rotated * _c_kv,
            latex=(
                "(R_m W^{UQ} c^Q)^\\top (R_n W^{UK} c^{KV}) = c^{Q\\top} "
                "\\left[(R_m W^{UQ})^\\top (R_n W^{UK})\\right] c^{KV}"
            ),
        ),
        Step(
            "Its matrix is "
            + ("the fixed $W^{UQ\\top} W^{UK}$" if absorb_fixed else "$W^{UQ\\top} R_{n-m} W^{UK}$")
            + ": the rotation of the offset sits between the two projections",
            rotated,
            claimed,
            latex=(
                "(R_m W^{UQ})^\\top (R_n W^{UK}) = "
                + ("W^{UQ\\top} W^{UK}" if absorb_fixed else "W^{UQ\\top} R_{n-m} W^{UK}")
            ),
        ),
        Step(
            "The fixed absorbed matrix is the one of offset $0$ only",
            _W_UQ.T * r_m.T * r_n * _W_UK,
            _W_UQ.T * _W_UK,
            subs={_n: _m},
            latex="W^{UQ\\top} R_m^\\top R_n W^{UK} \\big|_{n = m} = W^{UQ\\top} W^{UK}",
        ),
    )
    title = "RoPE sits between MLA's two projections"
    if absorb_fixed:
        title += " (claiming the fixed absorbed matrix still serves)"
    return Proof(
        title,
        "With RoPE applied to the up-projected query and key, the matrix between the "
        "latents is W_UQᵀ R_{n-m} W_UK, which depends on the offset; W_UQᵀ W_UK is it at "
        "n = m only (checked for a 2-wide head, one pair, and latents of 2).",
        steps,
    )


def decoupled_rope_score(decoupled: bool = True) -> Proof:
    """The decoupled form: the content part absorbs, the rotary part is relative.

    DeepSeek-V2's head is ``q = [q_C; R_m q_R]`` and ``k = [k_C; R_n k_R]`` with
    ``q_C = W_UQ c_q``, ``k_C = W_UK c_kv`` and one rotary key ``k_R`` per token, shared
    by all heads and cached beside the latent. The score splits into the content part,
    which absorbs (``c_qᵀ (W_UQᵀ W_UK) c_kv``), and the rotary part ``q_Rᵀ R_{n-m} k_R``,
    so it depends on the positions through the offset alone. ``decoupled=False`` is the
    false neighbour that rotates the content part too (RoPE over the whole head, as in
    a Llama head, with the latents kept): the content part no longer absorbs (steps 2
    and 4 fail).
    """
    content, rope = 2, 2
    w_uq, w_uk = _matrix("W^{UQ}", content, 1), _matrix("W^{UK}", content, 1)
    c_q, c_kv = _matrix("c^{Q}", 1, 1), _matrix("c^{KV}", 1, 1)
    q_r, k_r = _matrix("q^{R}", rope, 1), _matrix("k^{R}", rope, 1)
    theta = (_thetas[0],)
    q_c, k_c = w_uq * c_q, w_uk * c_kv
    if not decoupled:  # the content features turn too, with the next frequency
        q_c = rotation(_m, (_thetas[1],)) * q_c
        k_c = rotation(_n, (_thetas[1],)) * k_c
    rotated_q, rotated_k = rotation(_m, theta) * q_r, rotation(_n, theta) * k_r
    q, k = q_c.col_join(rotated_q), k_c.col_join(rotated_k)
    absorbed = c_q.T * (w_uq.T * w_uk) * c_kv
    relative = q_r.T * rotation(_n - _m, theta) * k_r
    steps = (
        Step(
            "The head's score is its content part plus its rotary part",
            q.T * k,
            q_c.T * k_c + rotated_q.T * rotated_k,
            by_definition=True,
            latex=(
                "\\begin{bmatrix} q^C \\\\ R_m q^R \\end{bmatrix}^\\top "
                "\\begin{bmatrix} k^C \\\\ R_n k^R \\end{bmatrix} "
                "= q^{C\\top} k^C + (R_m q^R)^\\top R_n k^R"
            ),
        ),
        Step(
            "The content part absorbs $W^{UK}$ into the query, as without positions",
            q_c.T * k_c,
            absorbed,
            latex="q^{C\\top} k^C = c^{Q\\top} (W^{UQ\\top} W^{UK}) c^{KV}",
        ),
        Step(
            "The rotary part is 1-D RoPE's relative identity on the shared key",
            rotated_q.T * rotated_k,
            relative,
            latex="(R_m q^R)^\\top (R_n k^R) = q^{R\\top} R_{n-m} k^R",
        ),
        Step(
            "So the score is a fixed bilinear form of the latents plus a term of the offset alone",
            q.T * k,
            absorbed + relative,
            latex=("q^\\top k = c^{Q\\top} (W^{UQ\\top} W^{UK}) c^{KV} + q^{R\\top} R_{n-m} k^R"),
        ),
    )
    title = "Decoupled RoPE: the content part absorbs, the rotary part is relative"
    if not decoupled:
        title += " (RoPE over the content features too)"
    return Proof(
        title,
        "With one rotary key per token beside the latent, the score is "
        "c_qᵀ (W_UQᵀ W_UK) c_kv + q_Rᵀ R_{n-m} k_R for every pair of positions (checked "
        "for 2 content and 2 rotary features, latents of 1).",
        steps,
    )


CASES: tuple[ProofCase, ...] = (
    ProofCase(
        "mla.absorbed_key_projection",
        absorbed_key_projection,
        lambda: absorbed_key_projection("W_UK^T W_UQ"),
        (1,),
    ),
    ProofCase(
        "mla.rope_between_projections",
        rope_between_projections,
        lambda: rope_between_projections(absorb_fixed=True),
        (3,),
    ),
    ProofCase(
        "mla.decoupled_rope_score",
        decoupled_rope_score,
        lambda: decoupled_rope_score(decoupled=False),
        (2, 4),
    ),
)
"""Every proof about MLA's absorption and decoupled RoPE with its false neighbour and the
steps where that one fails."""
