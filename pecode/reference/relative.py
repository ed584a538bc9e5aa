"""References for relative encodings (chapters 4-5): each paper's formula, one scalar at a time.

Every function takes per-head tensors ``[B, H, L, Dh]``, works in float64 with Python
loops over ``i`` and ``j``, and spells out the case distinctions of the paper (clipping,
buckets, ``δ``) with ``if`` statements rather than tensor operations. They share no code
with :mod:`pecode.relative`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "deberta_log_bucket_loop",
    "deberta_scores_loop",
    "shaw_attention_loop",
    "t5_bucket_loop",
    "transformer_xl_scores_loop",
]


def _lists(t: Tensor) -> list:
    return t.detach().double().cpu().tolist()


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def shaw_attention_loop(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_table: Tensor,
    value_table: Tensor,
    max_distance: int,
    *,
    causal: bool = False,
) -> Tensor:
    """Shaw et al. (2018), eqs. (3)-(7), for every head: the attention output ``z``.

    ``e_ij = q_i · (k_j + a^K_ij) / sqrt(Dh)``, ``α = softmax_j(e)``,
    ``z_i = Σ_j α_ij (v_j + a^V_ij)`` with ``a_ij = table[clip(j - i, k) + k]``.
    Positions are ``0 .. L-1``.

    Shapes::

        q, k, v: [B, H, L, Dh]    key_table, value_table: [2k + 1, Dh]
        returns: [B, H, L, Dh] (float64)
    """
    batch, heads, length, head_dim = q.shape
    qs, ks, vs = _lists(q), _lists(k), _lists(v)
    tk, tv = _lists(key_table), _lists(value_table)
    out = torch.zeros(batch, heads, length, head_dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                logits = {}
                for j in range(length):
                    if causal and j > i:
                        continue
                    offset = j - i
                    if offset > max_distance:
                        offset = max_distance
                    if offset < -max_distance:
                        offset = -max_distance
                    row = offset + max_distance
                    key = [ks[b][h][j][c] + tk[row][c] for c in range(head_dim)]
                    logits[j] = (_dot(qs[b][h][i], key) / math.sqrt(head_dim), row)
                top = max(value for value, _ in logits.values())
                exps = {j: math.exp(value - top) for j, (value, _) in logits.items()}
                total = sum(exps.values())
                for j, e in exps.items():
                    row = logits[j][1]
                    for c in range(head_dim):
                        out[b, h, i, c] += e / total * (vs[b][h][j][c] + tv[row][c])
    return out


def transformer_xl_scores_loop(
    q: Tensor, k: Tensor, rel_proj_weight: Tensor, u: Tensor, v: Tensor, model_dim: int
) -> Tensor:
    """Dai et al. (2019), §3.3: all four terms ``(a)+(b)+(c)+(d)`` of ``A^rel_ij``, unscaled.

    ``R_{i-j}`` is built entry by entry with ``math.sin``/``math.cos`` at frequencies
    ``10000^(-2m/D)`` (sines then cosines), ``r = W_{k,R} R`` with ``rel_proj_weight``
    the ``[H * Dh, D]`` weight of the projection. Keys are at positions ``0 .. Lk-1`` and
    the queries are the last ``Lq`` of them (``Lk - Lq .. Lk - 1``, the layout of a
    segment after its memory); every pair is computed, whatever its sign of ``i - j``.

    Shapes::

        q: [B, H, Lq, Dh]    k: [B, H, Lk, Dh] (Lk >= Lq)    u, v: [H, Dh]
        returns: [B, H, Lq, Lk] (float64)
    """
    batch, heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    qs, ks, w = _lists(q), _lists(k), _lists(rel_proj_weight)
    us, vs = _lists(u), _lists(v)
    half = model_dim // 2

    def encoding(distance: int) -> list[float]:
        freqs = [10000.0 ** (-2 * m / model_dim) for m in range(half)]
        return [math.sin(distance * f) for f in freqs] + [math.cos(distance * f) for f in freqs]

    out = torch.zeros(batch, heads, q_len, k_len, dtype=torch.float64)
    for h in range(heads):
        rows = range(h * head_dim, (h + 1) * head_dim)
        for i in range(q_len):
            query_position = k_len - q_len + i
            for j in range(k_len):
                r_enc = encoding(query_position - j)
                r = [_dot(w[row], r_enc) for row in rows]  # W_{k,R} R_{i-j}, this head
                for b in range(batch):
                    a = _dot(qs[b][h][i], ks[b][h][j])
                    term_b = _dot(qs[b][h][i], r)
                    term_c = _dot(us[h], ks[b][h][j])
                    term_d = _dot(vs[h], r)
                    out[b, h, i, j] = a + term_b + term_c + term_d
    return out


def t5_bucket_loop(
    relative_position: int,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> int:
    """T5's bucketing rule (Raffel et al. 2020, §2.1) for one ``key - query`` offset.

    Written from the rule in words: with ``bidirectional``, half the buckets are for keys
    after the query; in a half of ``n`` buckets the first ``n/2`` distances are exact,
    the rest are spaced logarithmically up to ``max_distance`` and saturate in the last
    bucket. Uses Python floats (float64) for the logarithm.
    """
    buckets = num_buckets // 2 if bidirectional else num_buckets
    bucket = 0
    if bidirectional:
        if relative_position > 0:
            bucket = buckets
        distance = abs(relative_position)
    else:
        distance = -relative_position if relative_position < 0 else 0
    exact = buckets // 2
    if distance < exact:
        return bucket + distance
    spread = math.log(distance / exact) / math.log(max_distance / exact)
    step = int(spread * (buckets - exact))
    return bucket + min(exact + step, buckets - 1)


def deberta_log_bucket_loop(offset: int, position_buckets: int, max_distance: int) -> int:
    """DeBERTa-v2/v3's log bucket of one query-minus-key offset, from the rule in words.

    Offsets up to ``m = position_buckets // 2`` in size keep their value; a larger one
    keeps its sign and gets ``m`` plus the ceiling of ``(m - 1)`` times the logarithm of
    ``|offset| / m`` to the base ``(max_distance - 1) / m``. Python floats (float64).
    """
    mid = position_buckets // 2
    size = -offset if offset < 0 else offset
    if size <= mid:
        return offset
    steps = math.ceil(math.log(size / mid) / math.log((max_distance - 1) / mid) * (mid - 1))
    return (mid + steps) if offset > 0 else -(mid + steps)


def deberta_scores_loop(
    q: Tensor,
    k: Tensor,
    q_rel: Tensor,
    k_rel: Tensor,
    max_distance: int,
    *,
    p2c_index: str = "released",
    position_buckets: int | None = None,
) -> Tensor:
    """He et al. (2021), eq. (4): ``c2c + c2p + p2c`` for positions ``0 .. L-1``, unscaled.

    ``δ(i, j)`` by its three cases (eq. 3), or with ``position_buckets = b`` the offset
    replaced by :func:`deberta_log_bucket_loop` and clipped to ``0 .. 2b - 1`` after
    adding ``b``; ``c2p_ij = Q^c_i · K^r_{δ(i,j)}``. ``p2c_ij = K^c_j · Q^r_{δ(i,j)}``
    with ``p2c_index="released"`` (the authors' and Hugging Face's code), or
    ``K^c_j · Q^r_{δ(j,i)}`` with ``"paper"`` (eq. 4 as printed).

    Shapes::

        q, k: [B, H, L, Dh]    q_rel, k_rel: [H, rows, Dh]    returns: [B, H, L, L] (float64)
    """
    if p2c_index not in ("released", "paper"):
        raise ValueError(f"p2c_index must be 'released' or 'paper', got {p2c_index!r}")
    batch, heads, length, _ = q.shape
    qs, ks, qr, kr = _lists(q), _lists(k), _lists(q_rel), _lists(k_rel)

    def delta(i: int, j: int) -> int:
        if position_buckets is not None:
            row = deberta_log_bucket_loop(i - j, position_buckets, max_distance)
            row += position_buckets
            return min(max(row, 0), 2 * position_buckets - 1)
        if i - j <= -max_distance:
            return 0
        if i - j >= max_distance:
            return 2 * max_distance - 1
        return i - j + max_distance

    out = torch.zeros(batch, heads, length, length, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                for j in range(length):
                    p2c_row = delta(i, j) if p2c_index == "released" else delta(j, i)
                    c2c = _dot(qs[b][h][i], ks[b][h][j])
                    c2p = _dot(qs[b][h][i], kr[h][delta(i, j)])
                    p2c = _dot(ks[b][h][j], qr[h][p2c_row])
                    out[b, h, i, j] = c2c + c2p + p2c
    return out
