"""Shaw et al. (2018): learned relation vectors for clipped offsets, on keys and values.

``e_ij = q_i (k_j + a^K_ij)ᵀ / sqrt(Dh)`` and ``z_i = Σ_j α_ij (v_j + a^V_ij)`` with
``a_ij = w_{clip(j - i, k)}``. The key term comes in two forms with the same numbers: the
direct one, which builds the ``[Lq, Lk, Dh]`` tensor of relation vectors
(:func:`~pecode.relative.shaw_key_logits_naive`), and a product with the ``2k + 1``
table rows followed by a gather (:func:`~pecode.relative.shaw_key_logits`); the value
term likewise. :class:`~pecode.relative.ShawRelativePosition` is the scheme.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pecode._checks import (
    check_bool,
    check_floating_tensor,
    check_heads,
    check_int,
)
from pecode.attention import PositionScheme
from pecode.relative._pairs import check_batch, index_for_heads, pairwise_offsets

__all__ = [
    "ShawRelativePosition",
    "shaw_key_logits",
    "shaw_key_logits_naive",
    "shaw_relative_index",
    "shaw_value_term",
    "shaw_value_term_naive",
]


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
    return pairwise_offsets(q_positions, k_positions).long().clamp_(-k, k).add_(k)


def _key_index(
    q: Tensor, key_table: Tensor, q_positions: Tensor, k_positions: Tensor, max_distance: int
) -> Tensor:
    """Check the key term's inputs; return the table row of every (query, key) pair."""
    index = shaw_relative_index(q_positions, k_positions, max_distance)
    check_heads("q", q)
    check_floating_tensor("key_table", key_table, (2 * max_distance + 1, q.shape[-1]))
    if q.shape[2] != index.shape[-2]:
        raise ValueError(
            f"q and q_positions have different lengths: {q.shape[2]} and {index.shape[-2]}"
        )
    check_batch(index, q.shape[0], "q")
    return index


def _value_index(
    weights: Tensor,
    value_table: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    max_distance: int,
) -> Tensor:
    """Check the value term's inputs; return the table row of every (query, key) pair."""
    index = shaw_relative_index(q_positions, k_positions, max_distance)
    check_heads("weights", weights, layout="[B, H, Lq, Lk]")
    check_floating_tensor("value_table", value_table)
    if value_table.dim() != 2 or value_table.shape[0] != 2 * max_distance + 1:
        raise ValueError(
            f"value_table must have shape [{2 * max_distance + 1}, Dh], "
            f"got {tuple(value_table.shape)}"
        )
    if weights.shape[2:] != index.shape[-2:]:
        raise ValueError(
            f"weights must have lengths [Lq, Lk] = {list(index.shape[-2:])} (those of "
            f"q_positions and k_positions), got {list(weights.shape[2:])}"
        )
    check_batch(index, weights.shape[0], "weights")
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
    index = _key_index(q, key_table, q_positions, k_positions, max_distance)
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
    index = _key_index(q, key_table, q_positions, k_positions, max_distance)
    per_row = q @ key_table.transpose(0, 1)  # [B, H, Lq, 2k + 1]
    return per_row.gather(-1, index_for_heads(index, q.shape[0], q.shape[1]))


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
    index = _value_index(weights, value_table, q_positions, k_positions, max_distance)
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
    index = _value_index(weights, value_table, q_positions, k_positions, max_distance)
    batch, heads, q_len, _ = weights.shape
    per_row = weights.new_zeros(batch, heads, q_len, 2 * max_distance + 1)
    per_row = per_row.scatter_add(-1, index_for_heads(index, batch, heads, "weights"), weights)
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
            non-negative int, ``memory_efficient`` not a bool.
    """

    score_bias_reads_keys = False  # the key term reads q and the positions only

    def __init__(self, head_dim: int, max_distance: int, *, memory_efficient: bool = True):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim, 1)
        self.max_distance = check_int("max_distance", max_distance, 0)
        self.memory_efficient = check_bool("memory_efficient", memory_efficient)
        rows = 2 * max_distance + 1
        # Shaw et al. do not state an initialization; small normal values, like embeddings.
        self.key_table = nn.Parameter(torch.randn(rows, head_dim) * head_dim**-0.5)
        self.value_table = nn.Parameter(torch.randn(rows, head_dim) * head_dim**-0.5)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``q_i · a^K_ij / sqrt(Dh)``: ``[B, H, Lq, Lk]``.

        Raises:
            TypeError, ValueError: as :func:`shaw_key_logits`, or ``q``'s head
                dimension is not the scheme's ``head_dim``.
        """
        check_heads("q", q, head_dim=self.head_dim, built_by=type(self).__name__)
        logits = shaw_key_logits if self.memory_efficient else shaw_key_logits_naive
        rel = logits(q, self.key_table, q_positions, k_positions, self.max_distance)
        return rel * self.logit_scale(q.shape[-1])

    def output_term(self, weights: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``Σ_j α_ij a^V_ij``: ``[B, H, Lq, Dh]``.

        Raises:
            TypeError, ValueError: as :func:`shaw_value_term`.
        """
        term = shaw_value_term if self.memory_efficient else shaw_value_term_naive
        return term(weights, self.value_table, q_positions, k_positions, self.max_distance)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, max_distance={self.max_distance}, "
            f"memory_efficient={self.memory_efficient}"
        )
