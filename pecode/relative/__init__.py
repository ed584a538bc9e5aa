"""Relative position encodings: Shaw et al., Transformer-XL/XLNet, T5 and DeBERTa.

Each method is a set of pure functions over per-head tensors plus a thin
:class:`~pecode.attention.PositionScheme` that holds its parameters, so it runs inside
:class:`~pecode.attention.MultiHeadAttention`:

========================================  ==========================================
scheme                                     hooks it uses
========================================  ==========================================
:class:`ShawRelativePosition`              ``score_bias`` (key term), ``output_term``
                                           (value term)
:class:`TransformerXLRelativePosition`     ``score_bias`` (terms (b), (c), (d); with
                                           ``causal=True`` only the causal part)
:class:`T5RelativePositionBias`            ``score_bias`` (a learned bias per bucket),
                                           ``logit_scale`` (1, as in T5)
:class:`DebertaRelativePosition`           ``score_bias`` (c2p + p2c, as the released
                                           code indexes them), ``logit_scale``
                                           (``1/sqrt(3 d)``)
========================================  ==========================================

Shapes use ``B`` batch, ``H`` heads, ``Lq``/``Lk`` query/key lengths, ``Dh`` head
dimension. Positions are integer tensors ``[L]`` (shared by the batch) or ``[B, L]``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pecode._checks import check_int, check_integer_tensor, check_position_pair, check_positions
from pecode.attention import MultiHeadAttention, PositionScheme, causal_mask

__all__ = [
    "DebertaRelativePosition",
    "ShawRelativePosition",
    "T5RelativePositionBias",
    "TransformerXLRelativePosition",
    "deberta_attention",
    "deberta_log_bucket",
    "deberta_position_terms",
    "deberta_relative_index",
    "deberta_table_rows",
    "peak_tensor_memory",
    "relative_distances",
    "relative_shift",
    "shaw_key_logits",
    "shaw_key_logits_naive",
    "shaw_relative_index",
    "shaw_value_term",
    "shaw_value_term_naive",
    "sinusoidal_relative_encoding",
    "t5_relative_position_bucket",
    "transformer_xl_position_terms",
]


# --------------------------------------------------------------------------- checks


def _pairwise_offsets(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """``k_positions[j] - q_positions[i]``: ``[Lq, Lk]``, or ``[B, Lq, Lk]`` if batched."""
    check_position_pair(q_positions, k_positions)
    return k_positions.unsqueeze(-2) - q_positions.unsqueeze(-1)


def _check_heads(name: str, t: Tensor, head_dim: int | None = None) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
    if t.dim() != 4:
        raise ValueError(f"{name} must have shape [B, H, L, Dh], got {tuple(t.shape)}")
    if head_dim is not None and t.shape[-1] != head_dim:
        raise ValueError(f"{name} must have head dimension {head_dim}, got {t.shape[-1]}")


def _check_table(name: str, table: Tensor, rows: int, head_dim: int) -> None:
    if not isinstance(table, Tensor) or not table.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor")
    if tuple(table.shape) != (rows, head_dim):
        raise ValueError(f"{name} must have shape [{rows}, {head_dim}], got {tuple(table.shape)}")


def _index_for_heads(index: Tensor, batch: int, heads: int) -> Tensor:
    """``[Lq, Lk]`` or ``[B, Lq, Lk]`` index -> expanded view ``[B, H, Lq, Lk]``."""
    if index.dim() == 3:
        if index.shape[0] not in (1, batch):
            raise ValueError(f"positions have batch {index.shape[0]}, the queries {batch}")
        index = index.unsqueeze(1)
    return index.expand(batch, heads, *index.shape[-2:])


# --------------------------------------------------------------------------- Shaw


def shaw_relative_index(q_positions: Tensor, k_positions: Tensor, max_distance: int) -> Tensor:
    """Row of Shaw et al.'s relation table for each (query, key) pair.

    Shaw et al. (2018), eqs. (5)-(7): ``a_ij = w_{clip(j - i, k)}`` with
    ``clip(x, k) = max(-k, min(k, x))``; the table has ``2k + 1`` rows, row
    ``clip(j - i, k) + k``. Note the sign: the offset is key minus query.

    Shapes::

        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]
        returns: [Lq, Lk] or [B, Lq, Lk] (int64, values in 0 .. 2k)

    Raises:
        TypeError: positions are not integer tensors, or ``max_distance`` is not an int.
        ValueError: ``max_distance`` is negative, or the positions have bad shapes.
    """
    k = check_int("max_distance", max_distance, 0)
    # in place: the index is as large as the logits, no need for three copies of it
    return _pairwise_offsets(q_positions, k_positions).long().clamp_(-k, k).add_(k)


def _shaw_index(
    name: str,
    tensor: Tensor,
    table_name: str,
    table: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    max_distance: int,
) -> Tensor:
    """Validate the inputs of a Shaw term and return the table row of every pair."""
    index = shaw_relative_index(q_positions, k_positions, max_distance)
    _check_heads(name, tensor)
    width = tensor.shape[-1] if table_name == "key_table" else table.shape[-1]
    _check_table(table_name, table, 2 * max_distance + 1, width)
    lengths = tuple(index.shape[-2:])
    expected = lengths if name == "weights" else lengths[:1]
    got = tuple(tensor.shape[2:4]) if name == "weights" else tuple(tensor.shape[2:3])
    if got != expected:
        raise ValueError(f"{name} has lengths {list(got)} but the positions give {list(expected)}")
    return index


def shaw_key_logits_naive(
    q: Tensor, key_table: Tensor, q_positions: Tensor, k_positions: Tensor, max_distance: int
) -> Tensor:
    """Shaw's key term ``q_i · a^K_ij``, built the direct way from an ``[Lq, Lk, Dh]`` tensor.

    Shaw et al. (2018), eq. (4), the part ``x_i W^Q (a^K_ij)^T`` (before the division by
    ``sqrt(d_z)``). The relation vectors are shared by all heads, as in the paper, so
    the tensor of relation vectors is ``[Lq, Lk, Dh]`` (``[B, Lq, Lk, Dh]`` for batched
    positions). :func:`shaw_key_logits` computes the same without it.

    Shapes::

        q: [B, H, Lq, Dh]    key_table: [2 * max_distance + 1, Dh]
        returns: [B, H, Lq, Lk]

    Raises:
        TypeError, ValueError: as :func:`shaw_relative_index`, or ``q`` / ``key_table``
            have the wrong type or shape.
    """
    index = _shaw_index("q", q, "key_table", key_table, q_positions, k_positions, max_distance)
    relations = key_table[index]  # [Lq, Lk, Dh]: the L x L x d tensor
    if relations.dim() == 3:
        return torch.einsum("bhid,ijd->bhij", q, relations)
    return torch.einsum("bhid,bijd->bhij", q, relations.expand(q.shape[0], -1, -1, -1))


def shaw_key_logits(
    q: Tensor, key_table: Tensor, q_positions: Tensor, k_positions: Tensor, max_distance: int
) -> Tensor:
    """Shaw's key term ``q_i · a^K_ij`` without building the ``[Lq, Lk, Dh]`` tensor.

    Each query meets only ``2k + 1`` distinct relation vectors, so compute
    ``q_i · w_r`` for every row ``r`` of the table once (``[B, H, Lq, 2k + 1]``) and
    gather the entry of row ``clip(j - i, k) + k`` for each key: the same numbers as
    :func:`shaw_key_logits_naive` in ``O(Lq (2k + 1))`` extra memory instead of
    ``O(Lq Lk Dh)``. The first step is Huang et al.'s (2019, §3.4) product of the
    queries with every relative embedding; a gather with Shaw's clipping then takes the
    place of their "skewing".

    Shapes::

        q: [B, H, Lq, Dh]    key_table: [2 * max_distance + 1, Dh]
        returns: [B, H, Lq, Lk]

    Raises:
        TypeError, ValueError: as :func:`shaw_key_logits_naive`.
    """
    index = _shaw_index("q", q, "key_table", key_table, q_positions, k_positions, max_distance)
    per_row = q @ key_table.transpose(0, 1)  # [B, H, Lq, 2k + 1]
    return per_row.gather(-1, _index_for_heads(index, q.shape[0], q.shape[1]))


def shaw_value_term_naive(
    weights: Tensor,
    value_table: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    max_distance: int,
) -> Tensor:
    """Shaw's value term ``Σ_j α_ij a^V_ij``, built from an ``[Lq, Lk, Dh]`` tensor.

    Shaw et al. (2018), eq. (3): ``z_i = Σ_j α_ij (x_j W^V + a^V_ij)``; this is the
    second part. :func:`shaw_value_term` computes the same without the big tensor.

    Shapes::

        weights: [B, H, Lq, Lk] (the attention probabilities α)
        value_table: [2 * max_distance + 1, Dh]
        returns: [B, H, Lq, Dh]

    Raises:
        TypeError, ValueError: as :func:`shaw_relative_index`, or bad ``weights`` /
            ``value_table``.
    """
    index = _shaw_index(
        "weights", weights, "value_table", value_table, q_positions, k_positions, max_distance
    )
    relations = value_table[index]
    if relations.dim() == 3:
        return torch.einsum("bhij,ijd->bhid", weights, relations)
    return torch.einsum("bhij,bijd->bhid", weights, relations.expand(weights.shape[0], -1, -1, -1))


def shaw_value_term(
    weights: Tensor,
    value_table: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    max_distance: int,
) -> Tensor:
    """Shaw's value term ``Σ_j α_ij a^V_ij`` without the ``[Lq, Lk, Dh]`` tensor.

    Keys at the same clipped offset share a relation vector, so first add up the weights
    per table row, ``β_ir = Σ_{j: clip(j-i,k)+k = r} α_ij`` (a scatter-add into
    ``[B, H, Lq, 2k + 1]``), then ``Σ_r β_ir w^V_r`` is one matrix product.
    Shaw et al. (2018), eq. (3).

    Shapes::

        weights: [B, H, Lq, Lk]    value_table: [2 * max_distance + 1, Dh]
        returns: [B, H, Lq, Dh]

    Raises:
        TypeError, ValueError: as :func:`shaw_value_term_naive`.
    """
    index = _shaw_index(
        "weights", weights, "value_table", value_table, q_positions, k_positions, max_distance
    )
    batch, heads, q_len, _ = weights.shape
    per_row = weights.new_zeros(batch, heads, q_len, 2 * max_distance + 1)
    per_row = per_row.scatter_add(-1, _index_for_heads(index, batch, heads), weights)
    return per_row @ value_table


class ShawRelativePosition(PositionScheme):
    """Shaw et al. (2018) relative position representations, keys and values.

    ``e_ij = q_i (k_j + a^K_ij)ᵀ / sqrt(Dh)`` and ``z_i = Σ_j α_ij (v_j + a^V_ij)``
    with ``a_ij = w_{clip(j - i, k)}`` (eqs. 3-7). The two tables of ``2k + 1`` learned
    vectors of size ``Dh`` are shared by all heads, as in the paper.

    Args:
        head_dim: ``Dh`` (positive).
        max_distance: ``k``, the clipping distance (non-negative).
        memory_efficient: use the gather/scatter forms (:func:`shaw_key_logits`,
            :func:`shaw_value_term`) instead of building ``[Lq, Lk, Dh]`` tensors.

    Raises:
        TypeError, ValueError: ``head_dim`` not a positive int, ``max_distance`` not a
            non-negative int.
    """

    def __init__(self, head_dim: int, max_distance: int, *, memory_efficient: bool = True):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim, 1)
        self.max_distance = check_int("max_distance", max_distance, 0)
        self.memory_efficient = memory_efficient
        rows = 2 * max_distance + 1
        # Shaw et al. do not state an initialization; small normal values, like embeddings.
        self.key_table = nn.Parameter(torch.randn(rows, head_dim) * head_dim**-0.5)
        self.value_table = nn.Parameter(torch.randn(rows, head_dim) * head_dim**-0.5)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``q_i · a^K_ij / sqrt(Dh)``: ``[B, H, Lq, Lk]``."""
        logits = shaw_key_logits if self.memory_efficient else shaw_key_logits_naive
        rel = logits(q, self.key_table, q_positions, k_positions, self.max_distance)
        return rel * self.logit_scale(q.shape[-1])

    def output_term(self, weights: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``Σ_j α_ij a^V_ij``: ``[B, H, Lq, Dh]``."""
        term = shaw_value_term if self.memory_efficient else shaw_value_term_naive
        return term(weights, self.value_table, q_positions, k_positions, self.max_distance)


# --------------------------------------------------------------------------- Transformer-XL


def relative_distances(q_len: int, k_len: int, offset: int = 0, *, causal: bool = False) -> Tensor:
    """The query-minus-key distances that :func:`relative_shift` expects, largest first.

    Column ``c`` of the un-shifted scores belongs to distance
    ``i - j = offset + (q_len - 1) - c``, where ``offset = q_positions[0] - k_positions[0]``.
    All of them (``causal=False``): ``c = 0 .. q_len + k_len - 2``, every distance a pair
    of the ``q_len`` queries and ``k_len`` keys can have. Causal (``causal=True``): only
    ``c = 0 .. k_len - 1``, the distances of the pairs at or below the causal diagonal
    when the queries are the last ``q_len`` of the keys (the layout of
    :func:`pecode.attention.causal_mask`); with ``offset = k_len - q_len`` these are
    ``k_len - 1, ..., 1, 0``, the distances Transformer-XL's code builds.

    Shapes::

        returns: [q_len + k_len - 1] or, causal, [k_len] (int64)

    Raises:
        TypeError: a length is not an int, ``offset`` not an int, ``causal`` not a bool.
        ValueError: a length is not positive, or ``causal`` with ``k_len < q_len``.
    """
    check_int("q_len", q_len, 1)
    check_int("k_len", k_len, 1)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    _check_causal_lengths(causal, q_len, k_len)
    last = offset + q_len - (k_len if causal else q_len + k_len - 1)
    return torch.arange(offset + q_len - 1, last - 1, -1)


def _check_causal_lengths(causal: object, q_len: int, k_len: int) -> None:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if causal and k_len < q_len:
        raise ValueError(
            f"causal needs k_len >= q_len (the queries are the last q_len keys), "
            f"got q_len={q_len}, k_len={k_len}"
        )


def relative_shift(scores: Tensor, *, causal: bool = False) -> Tensor:
    """Turn scores indexed by (query, distance) into scores indexed by (query, key).

    ``out[..., i, j] = scores[..., i, (Lq - 1) - i + j]``: with the columns ordered as in
    :func:`relative_distances`, entry ``(i, j)`` picks the column of distance ``i - j``
    (plus the offset). Row ``i`` is row ``i`` of the input shifted left by
    ``Lq - 1 - i``; in memory that is a strided view with row stride ``W - 1`` for an
    input of ``W`` columns, so no ``[Lq, Lk]`` index and no copy beyond making the input
    contiguous.

    ``causal=False``: ``W = Lq + Lk - 1`` columns, every distance; every entry of the
    result is right.

    ``causal=True``: ``W = Lk`` columns, the distances of :func:`relative_distances` with
    ``causal=True``. Only the entries at or below the causal diagonal,
    ``j <= i + (Lk - Lq)``, are right; an entry above it holds a score of the next row
    (another pair's), so the caller must mask those pairs, as a causal model does anyway.
    This is what Transformer-XL's ``_rel_shift`` (Dai et al. 2019, App. B, and their
    code) and the Music Transformer's "skewing" (Huang et al. 2019, §3.4, described for
    masked attention) compute with a pad-and-reshape: the same entries below the
    diagonal, other wrong ones above it. It multiplies by ``Lk`` distances instead of
    ``Lq + Lk - 1``, about half the work of terms (b) + (d) when ``Lq = Lk``.

    Shapes::

        scores: [..., Lq, Lq + Lk - 1], or causal [..., Lq, Lk] with Lk >= Lq
        returns: [..., Lq, Lk] (a view)

    Raises:
        TypeError: ``scores`` is not a tensor, or ``causal`` not a bool.
        ValueError: ``scores`` has fewer than two dimensions, fewer than ``Lq`` columns.
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if scores.dim() < 2:
        raise ValueError(f"scores must have at least 2 dimensions, got {scores.dim()}")
    q_len, width = scores.shape[-2:]
    k_len = width if causal else width - q_len + 1
    _check_causal_lengths(causal, q_len, k_len)
    if width < q_len:
        raise ValueError(f"scores must have at least Lq={q_len} columns, got {width}")
    scores = scores.contiguous()
    # flat offset of (i, j) = i * W + (Lq - 1) - i + j = i * (W - 1) + (Lq - 1) + j; the
    # largest, (Lq - 1) * W + W - 1, stays inside the input in both modes
    size = (*scores.shape[:-2], q_len, k_len)
    stride = (*scores.stride()[:-2], width - 1, 1)
    return scores.as_strided(size, stride, scores.storage_offset() + q_len - 1)


def sinusoidal_relative_encoding(distances: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Sinusoidal encodings ``R_d`` of (possibly negative) distances, Transformer-XL's layout.

    ``R_d = [sin(d ω_0), ..., sin(d ω_{D/2-1}), cos(d ω_0), ..., cos(d ω_{D/2-1})]`` with
    ``ω_m = base^(-2m/D)``: Vaswani et al.'s frequencies, sines first then cosines, as in
    Dai et al.'s code. The order of the features does not matter to the model, which
    multiplies ``R`` by a learned ``W_{k,R}``.

    Shapes::

        distances: [N] (integer or floating)    returns: [N, dim] (float32)

    Raises:
        TypeError: ``distances`` is not a tensor, ``dim`` not an int.
        ValueError: ``dim`` is not positive and even, or ``distances`` is not 1-D.
    """
    if not isinstance(distances, Tensor):
        raise TypeError(f"distances must be a torch.Tensor, got {type(distances).__name__}")
    if distances.dim() != 1:
        raise ValueError(f"distances must be 1-D, got shape {tuple(distances.shape)}")
    check_int("dim", dim, 2)
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = distances.to(torch.float32).unsqueeze(-1) * inv_freq.to(distances.device)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def transformer_xl_position_terms(
    q: Tensor, k: Tensor, rel_keys: Tensor, u: Tensor, v: Tensor, *, causal: bool = False
) -> Tensor:
    """Terms (b) + (c) + (d) of Transformer-XL's relative attention score.

    Dai et al. (2019), §3.3: ``A_ij = (a) q_iᵀk_j + (b) q_iᵀ W_{k,R} R_{i-j}
    + (c) uᵀ k_j + (d) vᵀ W_{k,R} R_{i-j}``, with ``q_i = W_q x_i``, ``k_j = W_{k,E} x_j``.
    Term (a) is ordinary attention; this returns the rest, unscaled. (c) is
    ``u · k_j`` for every query; (b) + (d) is ``(q_i + v) · r_{i-j}`` with
    ``r = W_{k,R} R``: one product against the projected encodings of the distances of
    :func:`relative_distances`, then :func:`relative_shift`, so the ``[Lq, Lk, Dh]``
    tensor never exists.

    ``causal=False``: ``rel_keys`` holds all ``Lq + Lk - 1`` distances and every entry is
    right. ``causal=True``: ``rel_keys`` holds the ``Lk`` distances of the causal part
    (about half the product when ``Lq = Lk``), and only the entries with
    ``j <= i + (Lk - Lq)`` are right; the others hold other pairs' terms and must be
    masked, as :class:`TransformerXLRelativePosition` does.

    Shapes::

        q: [B, H, Lq, Dh]    k: [B, H, Lk, Dh]
        rel_keys: [H, Lq + Lk - 1, Dh], or causal [H, Lk, Dh], column c for the distance
                  of :func:`relative_distances`
        u, v: [H, Dh] (the global content and position biases)
        returns: [B, H, Lq, Lk]

    Raises:
        TypeError, ValueError: bad types or mismatched shapes, ``causal`` with ``Lk < Lq``.
    """
    _check_heads("q", q)
    _check_heads("k", k, q.shape[-1])
    heads, head_dim = q.shape[1], q.shape[-1]
    if k.shape[:2] != q.shape[:2]:
        raise ValueError(f"q and k must agree in [B, H], got {tuple(q.shape)}, {tuple(k.shape)}")
    _check_causal_lengths(causal, q.shape[2], k.shape[2])
    width = k.shape[2] if causal else q.shape[2] + k.shape[2] - 1
    if tuple(rel_keys.shape) != (heads, width, head_dim):
        raise ValueError(
            f"rel_keys must have shape [{heads}, {width}, {head_dim}], got {tuple(rel_keys.shape)}"
        )
    for name, bias in (("u", u), ("v", v)):
        if tuple(bias.shape) != (heads, head_dim):
            raise ValueError(
                f"{name} must have shape [{heads}, {head_dim}], got {tuple(bias.shape)}"
            )
    content_bias = (k @ u.unsqueeze(-1)).transpose(-2, -1)  # (c): [B, H, 1, Lk]
    by_distance = (q + v.unsqueeze(1)) @ rel_keys.transpose(-2, -1)  # (b)+(d): [B, H, Lq, W]
    return relative_shift(by_distance, causal=causal) + content_bias


def _consecutive_start(name: str, positions: Tensor) -> int:
    """First position of a 1-D run ``p, p + 1, ...``; the relative shift needs one."""
    check_positions(name, positions)
    if positions.dim() != 1:
        raise ValueError(f"{name} must be 1-D for Transformer-XL, got {tuple(positions.shape)}")
    start = int(positions[0])
    expected = torch.arange(start, start + positions.numel(), device=positions.device)
    if not torch.equal(positions, expected.to(positions.dtype)):
        raise ValueError(f"{name} must be consecutive (p, p + 1, ...) for the relative shift")
    return start


class TransformerXLRelativePosition(PositionScheme):
    """Transformer-XL/XLNet relative attention (Dai et al. 2019, §3.3; Yang et al. 2019).

    Adds terms (b), (c) and (d) of :func:`transformer_xl_position_terms` to the logits
    (term (a) is the module's own ``q·k``), all scaled by ``1/sqrt(Dh)`` as in
    Dai et al.'s code. ``R`` is :func:`sinusoidal_relative_encoding` of width
    ``model_dim``; ``W_{k,R}`` (``model_dim -> H * Dh``, no bias), ``u`` and ``v``
    are parameters of the scheme.

    Args:
        model_dim: width of ``R`` (the model width in the paper), positive and even.
        num_heads: ``H`` (positive).
        head_dim: ``Dh`` (positive).
        causal: compute (b) + (d) for the ``Lk`` distances of the causal part only
            (:func:`relative_shift` with ``causal=True``, Transformer-XL's shortcut) and
            give the keys after each query (in the layout of
            :func:`pecode.attention.causal_mask`) a bias of ``-inf``: the scheme is then
            causal by itself, and its terms equal the full computation's wherever a
            causal layer looks.

    Raises:
        TypeError, ValueError: an argument is not a positive int, ``model_dim`` is odd,
            or ``causal`` is not a bool.
    """

    def __init__(
        self, model_dim: int, num_heads: int, head_dim: int, *, causal: bool = False
    ) -> None:
        super().__init__()
        self.model_dim = check_int("model_dim", model_dim, 1)
        self.num_heads = check_int("num_heads", num_heads, 1)
        self.head_dim = check_int("head_dim", head_dim, 1)
        if model_dim % 2:
            raise ValueError(f"model_dim must be even, got {model_dim}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        self.rel_proj = nn.Linear(model_dim, num_heads * head_dim, bias=False)  # W_{k,R}
        self.u = nn.Parameter(torch.zeros(num_heads, head_dim))
        self.v = nn.Parameter(torch.zeros(num_heads, head_dim))

    def rel_keys(self, q_len: int, k_len: int, offset: int = 0) -> Tensor:
        """``W_{k,R} R_d`` for the distances of :func:`relative_distances`: ``[H, W, Dh]``.

        ``W = Lq + Lk - 1``, or ``Lk`` when the scheme is causal.
        """
        distances = relative_distances(q_len, k_len, offset, causal=self.causal)
        encoding = sinusoidal_relative_encoding(distances.to(self.u.device), self.model_dim)
        projected = self.rel_proj(encoding.to(self.u.dtype)).view(-1, self.num_heads, self.head_dim)
        return projected.transpose(0, 1)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``((b) + (c) + (d)) / sqrt(Dh)``: ``[B, H, Lq, Lk]`` (``-inf`` after a causal query).

        Raises:
            ValueError: positions are not 1-D runs ``p, p + 1, ...``, or (causal) there
                are fewer keys than queries.
        """
        q_len, k_len = q.shape[2], k.shape[2]
        if (q_positions.shape[-1], k_positions.shape[-1]) != (q_len, k_len):
            raise ValueError(
                f"positions of lengths {q_positions.shape[-1]}, {k_positions.shape[-1]} "
                f"do not match q and k of lengths {q_len}, {k_len}"
            )
        offset = _consecutive_start("q_positions", q_positions) - _consecutive_start(
            "k_positions", k_positions
        )
        _check_causal_lengths(self.causal, q_len, k_len)
        rel_keys = self.rel_keys(q_len, k_len, offset)
        terms = transformer_xl_position_terms(q, k, rel_keys, self.u, self.v, causal=self.causal)
        terms = terms * self.logit_scale(q.shape[-1])
        if self.causal:  # the entries above the diagonal are other pairs' terms
            terms = terms.masked_fill(~causal_mask(q_len, k_len, q.device), float("-inf"))
        return terms


# --------------------------------------------------------------------------- T5


def t5_relative_position_bucket(
    relative_position: Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket for each relative position ``key_position - query_position``.

    Raffel et al. (2020), §2.1, as in the T5 code (Mesh TensorFlow): with
    ``bidirectional`` the buckets are split in half, the upper half for keys after the
    query. Within a half of ``n`` buckets, distances below ``n / 2`` get a bucket each;
    larger ones share logarithmically spaced buckets up to ``max_distance``, and every
    distance beyond falls into the last bucket. Causal (``bidirectional=False``): keys
    after the query all get bucket 0. The log is computed in float32, as in the original.

    Shapes::

        relative_position: [...] (integer)    returns: [...] (int64, in 0 .. num_buckets-1)

    Raises:
        TypeError: ``relative_position`` is not an integer tensor, or a count not an int.
        ValueError: ``num_buckets`` too small (at least 2, or 4 when bidirectional) or
            ``max_distance`` not larger than the exact range.
    """
    check_integer_tensor("relative_position", relative_position)
    check_int("num_buckets", num_buckets, 4 if bidirectional else 2)
    check_int("max_distance", max_distance, 1)
    relative_position = relative_position.long()
    if bidirectional:
        half = num_buckets // 2
        offset = (relative_position > 0).long() * half
        distance = relative_position.abs()
    else:
        half = num_buckets
        offset = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)  # keys in the future: distance 0
    max_exact = half // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance={max_distance} must exceed the exact range {max_exact}")
    # log-spaced buckets from max_exact up to max_distance; clamp avoids log(0) below
    scaled = distance.clamp(min=max_exact).to(torch.float32) / max_exact
    log_ratio = torch.log(scaled) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (half - max_exact)).long()
    large = large.clamp(max=half - 1)
    return offset + torch.where(distance < max_exact, distance, large)


class T5RelativePositionBias(PositionScheme):
    """T5's learned bias per head and relative-position bucket (Raffel et al. 2020, §2.1).

    ``b_h(i, j) = table[bucket(pos_j - pos_i), h]`` is added to the logits; T5 keeps only
    the content term ``q·k`` otherwise. T5 does not divide the logits by ``sqrt(Dh)``
    (its initialization absorbs the factor), so :meth:`logit_scale` is 1 unless
    ``scale_logits=True``.

    Args:
        num_heads: ``H`` (positive).
        bidirectional: encoder (True) or decoder (False) buckets.
        num_buckets, max_distance: as in :func:`t5_relative_position_bucket`.
        scale_logits: divide ``q·k`` by ``sqrt(Dh)`` after all.

    Raises:
        TypeError, ValueError: bad counts, as in :func:`t5_relative_position_bucket`.
    """

    def __init__(
        self,
        num_heads: int,
        *,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
        scale_logits: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, 1)
        t5_relative_position_bucket(
            torch.zeros(1, dtype=torch.long), bidirectional, num_buckets, max_distance
        )
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.scale_logits = scale_logits
        self.bias = nn.Embedding(num_buckets, num_heads)

    def logit_scale(self, head_dim: int) -> float:
        """1 (T5), or ``1/sqrt(head_dim)`` with ``scale_logits=True``."""
        return super().logit_scale(head_dim) if self.scale_logits else 1.0

    def position_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias: ``[H, Lq, Lk]``, or ``[B, H, Lq, Lk]`` for batched positions."""
        buckets = t5_relative_position_bucket(
            _pairwise_offsets(q_positions, k_positions),
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
        )
        return self.bias(buckets.to(self.bias.weight.device)).movedim(-1, -3)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The learned bias, independent of ``q`` and ``k``."""
        return self.position_bias(q_positions, k_positions)


# --------------------------------------------------------------------------- DeBERTa

_P2C_INDEX = ("released", "paper")


def _check_buckets(position_buckets: object, max_distance: object) -> None:
    """``position_buckets`` None or an int >= 2; with buckets, ``max_distance > buckets/2 + 1``."""
    check_int("max_distance", max_distance, 1)
    if position_buckets is None:
        return
    check_int("position_buckets", position_buckets, 2)
    mid = position_buckets // 2
    if max_distance <= mid + 1:
        raise ValueError(
            f"max_distance={max_distance} must exceed position_buckets // 2 + 1 = {mid + 1}: "
            f"the log buckets run from distance {mid} to max_distance - 1"
        )


def deberta_table_rows(max_distance: int, position_buckets: int | None = None) -> int:
    """Rows of DeBERTa's relative-embedding table ``P``: ``2k``, or ``2 * position_buckets``.

    Raises:
        TypeError, ValueError: as :func:`deberta_relative_index`.
    """
    _check_buckets(position_buckets, max_distance)
    return 2 * (max_distance if position_buckets is None else position_buckets)


def deberta_log_bucket(
    relative_position: Tensor, position_buckets: int, max_distance: int
) -> Tensor:
    """DeBERTa-v2/v3's log buckets of a query-minus-key distance ``r``.

    Not in the DeBERTa paper: the released code (``make_log_bucket_position`` of the
    authors' DeBERTa-v2 code and of Hugging Face's ``DebertaV2``) keeps distances with
    ``|r| <= m``, ``m = position_buckets // 2``, and maps a larger one to
    ``sign(r) * (m + ceil((m - 1) * ln(|r| / m) / ln((max_distance - 1) / m)))``, which
    reaches ``±(2m - 1)`` at ``|r| = max_distance - 1`` and keeps growing past it (the
    clamp of :func:`deberta_relative_index` then saturates it). The logarithms are taken
    in float32, as in Hugging Face's version (the authors' uses float64 NumPy); the book's
    tests find the same integers as a float64 loop on every offset from -3000 to 3000 for
    the settings they try, and as Hugging Face's function.

    Shapes::

        relative_position: [...] (integer)    returns: [...] (int64)

    Raises:
        TypeError: ``relative_position`` is not an integer tensor, or a count not an int.
        ValueError: ``position_buckets < 2``, or ``max_distance <= position_buckets // 2 + 1``.
    """
    check_integer_tensor("relative_position", relative_position)
    if position_buckets is None:
        raise TypeError("position_buckets must be an int, got NoneType")
    _check_buckets(position_buckets, max_distance)
    mid = position_buckets // 2
    relative_position = relative_position.long()
    distance = relative_position.abs()
    # float32 throughout, in Hugging Face's order of operations; distances below
    # mid are clamped only to keep the logarithm finite: their bucket is the distance
    scaled = distance.clamp(min=mid).to(torch.float32) / mid
    log_ratio = torch.tensor((max_distance - 1) / mid, dtype=torch.float32).log()
    far = torch.ceil(scaled.log() / log_ratio.to(scaled.device) * (mid - 1)) + mid
    return torch.where(distance <= mid, relative_position, relative_position.sign() * far.long())


def deberta_relative_index(
    q_positions: Tensor,
    k_positions: Tensor,
    max_distance: int,
    *,
    position_buckets: int | None = None,
) -> Tensor:
    """DeBERTa's ``δ(i, j)`` for each (query, key) pair: the row of ``P`` it reads.

    He et al. (2021), eq. (3): ``δ(i, j) = 0`` if ``i - j <= -k``, ``2k - 1`` if
    ``i - j >= k``, and ``i - j + k`` otherwise, so ``2k`` rows, and the offset is query
    minus key (the opposite sign to Shaw's and T5's). With ``position_buckets = b``
    (DeBERTa-v2/v3's released code, not in the paper) ``i - j`` is first replaced by
    :func:`deberta_log_bucket` and the table has ``2b`` rows:
    ``δ(i, j) = clamp(bucket(i - j) + b, 0, 2b - 1)``.

    ``max_distance`` is Hugging Face's ``max_relative_positions`` in both cases: ``k``
    without buckets, the distance where the log buckets reach the last row with them.

    Shapes::

        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]
        returns: [Lq, Lk] or [B, Lq, Lk] (int64, in 0 .. rows - 1)

    Raises:
        TypeError: bad positions, or a count not an int.
        ValueError: ``max_distance`` not positive, or bad ``position_buckets`` (see
            :func:`deberta_log_bucket`).
    """
    _check_buckets(position_buckets, max_distance)
    query_minus_key = _pairwise_offsets(q_positions, k_positions).long().neg_()
    if position_buckets is None:
        span = max_distance
    else:
        span = position_buckets
        query_minus_key = deberta_log_bucket(query_minus_key, position_buckets, max_distance)
    return query_minus_key.add_(span).clamp_(0, 2 * span - 1)


def deberta_position_terms(
    q: Tensor,
    k: Tensor,
    q_rel: Tensor,
    k_rel: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    max_distance: int,
    p2c_index: str = "released",
    *,
    position_buckets: int | None = None,
) -> tuple[Tensor, Tensor]:
    """DeBERTa's content-to-position and position-to-content scores, unscaled.

    ``c2p_ij = Q^c_i · K^r_{δ(i,j)}`` (He et al. 2021, eq. 4, and every released code).
    The position-to-content term is where the paper and the code differ:

    - ``p2c_index="released"`` (the default): ``p2c_ij = K^c_j · Q^r_{δ(i,j)}``, the same
      row as c2p. This is what the authors' code (v1 and v2) and Hugging Face's
      ``Deberta``/``DebertaV2`` compute (in the key's row ``j`` they gather column
      ``clamp(-(j - i) + k)``, which is ``δ(i, j)``, and transpose), so it is what every
      released checkpoint was trained with.
    - ``p2c_index="paper"``: ``p2c_ij = K^c_j · Q^r_{δ(j,i)}``, eq. (4) as printed.

    Inside the clipping window ``δ(j, i) = 2k - δ(i, j)``, a reversal of the rows, but at
    its edges the two differ: the paper's p2c tells apart the offsets ``i - j`` from
    ``-(k - 1)`` to ``k``, the released one those from ``-k`` to ``k - 1``.

    ``Q^r = P W_{q,r}``, ``K^r = P W_{k,r}`` are the projected relative embeddings (with
    ``share_att_key``, ``P W_Q`` and ``P W_K``). Both terms are a product against the rows
    followed by a gather (the paper's Algorithm 1), never an ``[Lq, Lk, Dh]`` tensor.

    Shapes::

        q: [B, H, Lq, Dh] (Q^c)    k: [B, H, Lk, Dh] (K^c)
        q_rel, k_rel: [H, rows, Dh] (Q^r, K^r), rows = deberta_table_rows(...)
        returns: (c2p, p2c), each [B, H, Lq, Lk]

    Raises:
        TypeError, ValueError: bad types, mismatched shapes, a bad count (as in
            :func:`deberta_relative_index`), or ``p2c_index`` not "released"/"paper".
    """
    if p2c_index not in _P2C_INDEX:
        raise ValueError(f"p2c_index must be 'released' or 'paper', got {p2c_index!r}")
    index_c2p = deberta_relative_index(
        q_positions, k_positions, max_distance, position_buckets=position_buckets
    )  # δ(i, j): [Lq, Lk]
    if p2c_index == "released":  # δ(i, j) again, read from the key's side: [Lk, Lq]
        index_p2c = index_c2p.transpose(-2, -1)
    else:  # δ(j, i): [Lk, Lq]
        index_p2c = deberta_relative_index(
            k_positions, q_positions, max_distance, position_buckets=position_buckets
        )
    _check_heads("q", q)
    _check_heads("k", k, q.shape[-1])
    batch, heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    rows = deberta_table_rows(max_distance, position_buckets)
    for name, rel in (("q_rel", q_rel), ("k_rel", k_rel)):
        if not isinstance(rel, Tensor) or tuple(rel.shape) != (heads, rows, head_dim):
            shape = tuple(rel.shape) if isinstance(rel, Tensor) else type(rel).__name__
            raise ValueError(f"{name} must have shape [{heads}, {rows}, {head_dim}], got {shape}")
    if index_c2p.shape[-2:] != (q_len, k_len):
        raise ValueError(
            f"positions give [{index_c2p.shape[-2]}, {index_c2p.shape[-1]}] pairs, "
            f"but q and k have lengths {q_len} and {k_len}"
        )
    c2p = (q @ k_rel.transpose(-2, -1)).gather(-1, _index_for_heads(index_c2p, batch, heads))
    p2c = (k @ q_rel.transpose(-2, -1)).gather(-1, _index_for_heads(index_p2c, batch, heads))
    return c2p, p2c.transpose(-2, -1)


class DebertaRelativePosition(PositionScheme):
    """DeBERTa's disentangled attention (He et al. 2021, §3.1), paper and released forms.

    ``Ã_ij = Q^c_i·K^c_j + Q^c_i·K^r_{δ(i,j)} + K^c_j·Q^r_{δ(i,j)}``, divided by
    ``sqrt(3 Dh)``: the module's ``q·k`` is the first term and :meth:`logit_scale` the
    factor; the scheme adds the other two, scaled the same. The p2c row is the released
    code's ``δ(i, j)``; the paper's eq. (4) prints ``δ(j, i)`` (``p2c_index="paper"``,
    see :func:`deberta_position_terms`). ``P`` (the relative embeddings, width
    ``model_dim``) and, unless shared, the position projections ``W_{q,r}``, ``W_{k,r}``
    are parameters of the scheme.

    The defaults are the paper's v1 form: separate ``W_{q,r}``, ``W_{k,r}`` without
    biases, ``2k`` rows, no normalisation. The keyword options give the released
    DeBERTa-v2/v3 variants, named as in Hugging Face's ``DebertaV2Config``; the v3
    checkpoints use ``position_buckets=256``, ``max_distance=512``,
    ``share_att_key=True``, ``norm_rel_ebd=True`` (:func:`deberta_attention` builds such
    a layer).

    Args:
        model_dim: width of ``P`` (the hidden size in the paper), positive.
        num_heads, head_dim: ``H`` and ``Dh``, positive.
        max_distance: ``k`` (Hugging Face's ``max_relative_positions``), positive.
        position_buckets: ``None`` (the paper: ``2k`` rows) or ``b`` for
            :func:`deberta_log_bucket`'s log buckets (``2b`` rows).
        share_att_key: project ``P`` with the layer's content projections ``W_Q``,
            ``W_K`` (and their biases) instead of ``W_{q,r}``, ``W_{k,r}``; the scheme
            must then be bound to its layer (:meth:`bind_content_projections`).
        pos_proj_bias: give ``W_{q,r}`` and ``W_{k,r}`` biases, as Hugging Face's
            ``pos_query_proj`` / ``pos_key_proj`` have (only without ``share_att_key``).
        norm_rel_ebd: apply a LayerNorm (with weight and bias) to ``P`` before projecting
            (``norm_rel_ebd="layer_norm"`` in the v2/v3 configs).
        layer_norm_eps: that LayerNorm's epsilon (``1e-7`` in the configs), positive.
        p2c_index: "released" (``δ(i, j)``) or "paper" (``δ(j, i)``).

    To share ``P`` across layers, as the paper and the released models do, give every
    layer's scheme the same ``rel_embeddings`` (and ``rel_norm``) objects. With
    ``share_att_key`` each layer needs its own scheme, since each layer has its own
    ``W_Q``, ``W_K``.

    Raises:
        TypeError, ValueError: a count is not a positive int, bad ``position_buckets``
            (see :func:`deberta_log_bucket`), a flag is not a bool, ``layer_norm_eps``
            not a positive number, ``pos_proj_bias`` with ``share_att_key``, or a bad
            ``p2c_index``.
    """

    def __init__(
        self,
        model_dim: int,
        num_heads: int,
        head_dim: int,
        max_distance: int,
        *,
        position_buckets: int | None = None,
        share_att_key: bool = False,
        pos_proj_bias: bool = False,
        norm_rel_ebd: bool = False,
        layer_norm_eps: float = 1e-7,
        p2c_index: str = "released",
    ) -> None:
        super().__init__()
        self.model_dim = check_int("model_dim", model_dim, 1)
        self.num_heads = check_int("num_heads", num_heads, 1)
        self.head_dim = check_int("head_dim", head_dim, 1)
        rows = deberta_table_rows(max_distance, position_buckets)
        self.max_distance = max_distance
        self.position_buckets = position_buckets
        for name, flag in (
            ("share_att_key", share_att_key),
            ("pos_proj_bias", pos_proj_bias),
            ("norm_rel_ebd", norm_rel_ebd),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        if share_att_key and pos_proj_bias:
            raise ValueError(
                "pos_proj_bias is for the scheme's own W_{q,r}, W_{k,r}; with share_att_key=True "
                "the layer's projections and their biases are used"
            )
        if isinstance(layer_norm_eps, bool) or not isinstance(layer_norm_eps, (int, float)):
            raise TypeError(f"layer_norm_eps must be a number, got {type(layer_norm_eps).__name__}")
        if not layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {layer_norm_eps}")
        if p2c_index not in _P2C_INDEX:
            raise ValueError(f"p2c_index must be 'released' or 'paper', got {p2c_index!r}")
        self.share_att_key = share_att_key
        self.p2c_index = p2c_index
        self.rel_embeddings = nn.Parameter(torch.randn(rows, model_dim) * 0.02)
        self.rel_norm = nn.LayerNorm(model_dim, eps=float(layer_norm_eps)) if norm_rel_ebd else None
        width = num_heads * head_dim
        if share_att_key:
            self.pos_q_proj = self.pos_k_proj = None
        else:
            self.pos_q_proj = nn.Linear(model_dim, width, bias=pos_proj_bias)  # W_{q,r}
            self.pos_k_proj = nn.Linear(model_dim, width, bias=pos_proj_bias)  # W_{k,r}
        # (W_Q, W_K) of the layer, held without registering them a second time
        self._content_projections: tuple[nn.Linear, nn.Linear] | None = None

    def bind_content_projections(self, layer: MultiHeadAttention) -> None:
        """Use ``layer``'s ``q_proj`` and ``k_proj`` for ``P`` (``share_att_key=True``).

        Raises:
            ValueError: the scheme does not share projections, ``layer`` does not hold
                this scheme, or its sizes differ from the scheme's.
            TypeError: ``layer`` is not a :class:`~pecode.attention.MultiHeadAttention`.
        """
        if not self.share_att_key:
            raise ValueError("bind_content_projections needs share_att_key=True")
        if not isinstance(layer, MultiHeadAttention):
            raise TypeError(f"layer must be a MultiHeadAttention, got {type(layer).__name__}")
        if layer.position is not self:
            raise ValueError("layer must hold this scheme as its position scheme")
        sizes = (layer.embed_dim, layer.num_heads, layer.head_dim)
        if sizes != (self.model_dim, self.num_heads, self.head_dim):
            raise ValueError(
                f"layer has (embed_dim, num_heads, head_dim) = {sizes}, the scheme "
                f"{(self.model_dim, self.num_heads, self.head_dim)}"
            )
        self._content_projections = (layer.q_proj, layer.k_proj)

    def logit_scale(self, head_dim: int) -> float:
        """``1 / sqrt(3 Dh)``: three terms of variance ``Dh`` each (He et al., eq. 4)."""
        return 1.0 / math.sqrt(3 * head_dim)

    def projected(self) -> tuple[Tensor, Tensor]:
        """``(Q^r, K^r)``, each ``[H, rows, Dh]``: ``P`` (normalised if asked) projected.

        Raises:
            RuntimeError: ``share_att_key`` and no layer bound yet.
        """
        table = self.rel_embeddings
        if self.rel_norm is not None:
            table = self.rel_norm(table)
        if self.share_att_key:
            if self._content_projections is None:
                raise RuntimeError(
                    "share_att_key=True: call bind_content_projections(layer) first "
                    "(deberta_attention does it)"
                )
            q_proj, k_proj = self._content_projections
        else:
            q_proj, k_proj = self.pos_q_proj, self.pos_k_proj

        def split(t: Tensor) -> Tensor:
            return t.view(table.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

        return split(q_proj(table)), split(k_proj(table))

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``(c2p + p2c) / sqrt(3 Dh)``: ``[B, H, Lq, Lk]``."""
        q_rel, k_rel = self.projected()
        c2p, p2c = deberta_position_terms(
            q,
            k,
            q_rel,
            k_rel,
            q_positions,
            k_positions,
            self.max_distance,
            self.p2c_index,
            position_buckets=self.position_buckets,
        )
        return (c2p + p2c) * self.logit_scale(q.shape[-1])


def deberta_attention(
    embed_dim: int,
    num_heads: int,
    max_distance: int,
    *,
    bias: bool = True,
    dropout: float = 0.0,
    **options: Any,
) -> MultiHeadAttention:
    """A :class:`~pecode.attention.MultiHeadAttention` with DeBERTa's disentangled attention.

    ``options`` go to :class:`DebertaRelativePosition` (``position_buckets``,
    ``share_att_key``, ``norm_rel_ebd``, ...); with ``share_att_key=True`` the scheme is
    bound to the layer's projections. ``bias`` is the layer's (content projections have
    biases in the released models). A layer shaped like DeBERTa-v3-base's::

        deberta_attention(768, 12, 512, position_buckets=256, share_att_key=True, norm_rel_ebd=True)

    Raises:
        TypeError, ValueError: as :class:`~pecode.attention.MultiHeadAttention` and
            :class:`DebertaRelativePosition`.
    """
    layer = MultiHeadAttention(embed_dim, num_heads, bias=bias, dropout=dropout)
    scheme = DebertaRelativePosition(embed_dim, num_heads, layer.head_dim, max_distance, **options)
    layer.position = scheme
    if scheme.share_att_key:
        scheme.bind_content_projections(layer)
    return layer


# --------------------------------------------------------------------------- memory


class _AllocationTracker(TorchDispatchMode):
    """Counts the bytes of every tensor storage that an operator creates while active.

    Each new storage adds its size when an operator returns it and subtracts it when the
    last tensor that uses it is garbage-collected, so ``peak`` is the largest number of
    bytes held at once by tensors created inside the block.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}  # data_ptr -> [bytes, tensors using it]

    def _release(self, key: int) -> None:
        entry = self._storages[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._storages[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, Tensor)
        }
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, Tensor):
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or (key in inputs and key not in self._storages):
                continue  # a view of a tensor from before the block: nothing allocated
            if key not in self._storages:
                self._storages[key] = [size, 0]
                self.live += size
                self.peak = max(self.peak, self.live)
            self._storages[key][1] += 1
            weakref.finalize(tensor, self._release, key)
        return out


def peak_tensor_memory(fn: Callable[[], Any]) -> int:
    """Peak bytes held by tensors that ``fn()`` creates, its result included.

    Every ATen operator call is intercepted (a ``TorchDispatchMode``); a new storage
    counts from the call that returns it until its last tensor is freed. Tensors that
    existed before the call (inputs, parameters) are not counted, nor is scratch memory
    a kernel allocates and frees internally. Works on every device (CPU included, where
    PyTorch has no ``max_memory_allocated``); the result is exact and deterministic
    for a given sequence of operators.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    tracker = _AllocationTracker()
    with tracker:
        result = fn()
    del result
    return tracker.peak
