"""CoPE: contextual position encoding (Golovneva, Wang, Weston and Sukhbaatar 2024).

Golovneva et al., "Contextual Position Encoding: Learning to Count What's Important"
(arXiv:2405.18719), the section "Contextual Position Encoding". A position is a count
of the keys a query chooses to count. Query ``i`` gives each key ``t`` a gate
``g_it = sigmoid(q_i · k_t)``, and the position of key ``j`` relative to query ``i`` is
the sum of the gates from ``j`` to ``i``:

    ``p_ij = sum_{t=j}^{i} g_it``   (causal: ``j <= i``)

a fraction, not an integer. Learned embeddings ``e[0], ..., e[P - 1]`` of the integer
positions (``P = npos_max``) are interpolated at it,
``e[p] = (p - ⌊p⌋) e[⌈p⌉] + (1 - p + ⌊p⌋) e[⌊p⌋]``, with ``p`` clamped to ``P - 1``,
and the logit of ``(i, j)`` becomes ``q_i · (k_j + e[p_ij])``.

**The authors' code** (the listing in the paper's appendix, which x-transformers'
``CoPE`` transcribes, "Appendix B") fixes what the equations leave open, and this
module follows it:

* the gates are the sigmoid of the *scaled* logits ``q · k / sqrt(Dh)`` (the
  equations write ``q · k``);
* the position term ``q_i · e[p_ij]`` is added to the scaled logits without a
  ``1 / sqrt(Dh)`` (in the equations ``e`` shares the product with ``k``: the two
  differ by a factor ``sqrt(Dh)`` on ``e``, which is learned);
* the causal mask enters the logits before the gates, so a key after the query counts
  0, and a key after the query gets ``p = 0``, hence ``q · e[0]`` (hidden by the mask);
* ``q · e[n]`` is computed for the ``P`` integers ``n`` and then interpolated, which
  equals ``q · (interpolated e)``;
* one table ``[P, Dh]`` is shared by the heads of a layer, and starts at zero.

With gates all 1, ``p_ij = i - j + 1`` and CoPE is a learned relative bias
``q_i · e[i - j + 1]``: the key term of Shaw et al. (2018), clipped at ``P - 1``
(checked in the tests).

The queries are the last ``Lq`` of the ``Lk`` keys (the layout of decoding with a
:class:`~pecode.attention.KVCache`), so query ``i`` is key ``Lk - Lq + i``. The bias
does not see the layer's ``attn_mask``: the authors' code gives a key a mask hides the
gate 0, this module counts it. For the masks of causal decoding (left padding, a
sliding window), every key between a visible key and its query is visible too, and the
visible logits are the same.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pecode._checks import (
    check_floating_tensor,
    check_heads,
    check_int,
    check_query_key,
    check_real,
)
from pecode.attention import PositionScheme

__all__ = ["CoPE", "cope_bias", "cope_position_logits", "cope_positions"]


def _positions(gates: Tensor) -> Tensor:
    """:func:`cope_positions` without the checks."""
    q_len, k_len = gates.shape[-2:]
    query_index = torch.arange(k_len - q_len, k_len, device=gates.device).unsqueeze(-1)
    after = torch.arange(k_len, device=gates.device) > query_index  # [Lq, Lk]: t > i'
    counted = gates.masked_fill(after, 0.0)
    # p_ij = sum over t >= j: a cumulative sum from the right
    return counted.flip(-1).cumsum(dim=-1).flip(-1)


def cope_positions(gates: Tensor) -> Tensor:
    """CoPE's contextual positions ``p_ij = sum_{t=j}^{i'} g_it`` from the gates.

    ``i' = Lk - Lq + i`` is query ``i``'s index among the keys (the queries are the last
    ``Lq`` keys). Gates of keys after the query count 0, so ``p_ij = 0`` for ``j > i'``
    (the authors' code, whose causal mask makes those gates 0). Not clamped.

    Shapes::

        gates:   [..., Lq, Lk] (floating; sigmoid outputs in [0, 1])
        returns: [..., Lq, Lk], same dtype

    Raises:
        TypeError: ``gates`` is not a floating tensor.
        ValueError: ``gates`` is not at least 2-D, or ``Lq > Lk``.
    """
    check_floating_tensor("gates", gates)
    if gates.dim() < 2:
        raise ValueError(f"gates must have shape [..., Lq, Lk], got {tuple(gates.shape)}")
    if gates.shape[-2] > gates.shape[-1]:
        raise ValueError(
            f"gates has Lq={gates.shape[-2]} queries and Lk={gates.shape[-1]} keys: the "
            "queries are the last keys, so Lq <= Lk"
        )
    return _positions(gates)


def _position_logits(q: Tensor, embeddings: Tensor, positions: Tensor) -> Tensor:
    """:func:`cope_position_logits` without the checks."""
    top = embeddings.shape[-2] - 1
    p = positions.clamp(max=top)
    if embeddings.dim() == 2:  # one table for all heads
        per_position = q @ embeddings.transpose(-1, -2)  # [B, H, Lq, P]
    else:
        per_position = torch.einsum("bhid,hpd->bhip", q, embeddings)
    floor = p.floor()
    low = per_position.gather(-1, floor.long())
    high = per_position.gather(-1, p.ceil().long())
    w = p - floor
    return high * w + low * (1 - w)


def cope_position_logits(q: Tensor, embeddings: Tensor, positions: Tensor) -> Tensor:
    """The position term ``q_i · e[p_ij]``, with ``e`` interpolated at fractional ``p``.

    ``e[p] = (p - ⌊p⌋) e[⌈p⌉] + (1 - p + ⌊p⌋) e[⌊p⌋]`` after clamping ``p`` to ``P - 1``,
    computed as the authors' code does: ``q · e[n]`` for the ``P`` integers ``n``,
    then the same interpolation of those numbers (equal, since ``q ·`` is linear).

    Shapes::

        q:          [B, H, Lq, Dh]
        embeddings: [P, Dh] (shared by the heads) or [H, P, Dh] (one table per head)
        positions:  [B, H, Lq, Lk] (floating, >= 0)
        returns:    [B, H, Lq, Lk]

    Raises:
        TypeError: an argument is not a floating tensor.
        ValueError: the shapes do not fit, or a position is negative or NaN.
    """
    check_heads("q", q)
    check_floating_tensor("embeddings", embeddings)
    check_floating_tensor("positions", positions)
    _check_embeddings(embeddings, q.shape[1], q.shape[-1])
    if positions.dim() != 4 or positions.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"positions must have shape [B, H, Lq, Lk] with [B, H, Lq] = {list(q.shape[:3])} "
            f"(those of q), got {tuple(positions.shape)}"
        )
    if not bool((positions >= 0).all()):
        raise ValueError("positions must be >= 0 (sums of gates) and not NaN")
    return _position_logits(q, embeddings, positions)


def _check_embeddings(embeddings: Tensor, num_heads: int, head_dim: int) -> None:
    """``embeddings`` is ``[P, Dh]`` or ``[H, P, Dh]`` for these heads and width."""
    if embeddings.dim() not in (2, 3) or embeddings.shape[-1] != head_dim:
        raise ValueError(
            f"embeddings must have shape [P, Dh] or [H, P, Dh] with Dh={head_dim}, got "
            f"{tuple(embeddings.shape)}"
        )
    if embeddings.dim() == 3 and embeddings.shape[0] != num_heads:
        raise ValueError(f"embeddings has {embeddings.shape[0]} tables, q has {num_heads} heads")
    if embeddings.shape[-2] == 0:
        raise ValueError("embeddings must hold at least one position (P >= 1)")


def cope_bias(q: Tensor, k: Tensor, embeddings: Tensor, *, scale: float | None = None) -> Tensor:
    """CoPE's logit term ``q_i · e[p_ij]`` for queries ``q`` over keys ``k``.

    Gates ``g_it = sigmoid(scale · q_i · k_t)`` (``scale = 1/sqrt(Dh)`` by default, as the
    authors' code gates the scaled logits), positions from :func:`cope_positions`, the
    term from :func:`cope_position_logits`. Computed in ``q``'s dtype or float32 if
    narrower. Add the result to the *scaled* logits ``q · k / sqrt(Dh)``.

    Shapes::

        q: [B, H, Lq, Dh]    k: [B, H, Lk, Dh], Lq <= Lk (the queries are the last keys)
        embeddings: [P, Dh] or [H, P, Dh]
        returns: [B, H, Lq, Lk]

    Raises:
        TypeError: an argument is not a floating tensor, or ``scale`` not a real number.
        ValueError: ``q`` and ``k`` do not fit each other or ``embeddings``, ``Lq > Lk``,
            or ``scale`` is not positive and finite.
    """
    check_query_key(q, k)
    check_floating_tensor("embeddings", embeddings)
    _check_embeddings(embeddings, q.shape[1], q.shape[-1])
    if q.shape[2] > k.shape[2]:
        raise ValueError(
            f"q has {q.shape[2]} queries and k {k.shape[2]} keys: the queries are the last "
            "keys, so Lq <= Lk"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else check_real("scale", scale, above=0)
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, embeddings = q.to(dtype), k.to(dtype), embeddings.to(dtype)
    gates = torch.sigmoid((q @ k.transpose(-1, -2)) * scale)
    return _position_logits(q, embeddings, _positions(gates))


class CoPE(PositionScheme):
    """CoPE as a :class:`~pecode.attention.PositionScheme`: a bias from counted keys.

    Args:
        head_dim: the per-head width ``Dh``.
        npos_max: ``P``, the number of position embeddings; positions are clamped to
            ``P - 1``.
        num_heads: ``None`` for one table shared by the heads (the authors' code), or
            the layer's heads for one table per head.
        gate_scale: the factor on ``q · k`` inside the gates; ``None`` for
            ``1/sqrt(Dh)``, as the authors' code. It does not follow the attention
            layer's ``logit_scale`` option.

    Attributes:
        embeddings: ``[npos_max, head_dim]`` or ``[num_heads, npos_max, head_dim]``,
            learned, zero at first (as the authors' code).

    Raises:
        TypeError, ValueError: a size is not a positive int, or ``gate_scale`` is not
            positive and finite.
    """

    score_bias_reads_keys = True  # the gates are read from the keys

    def __init__(
        self,
        head_dim: int,
        npos_max: int,
        *,
        num_heads: int | None = None,
        gate_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.npos_max = check_int("npos_max", npos_max)
        self.num_heads = None if num_heads is None else check_int("num_heads", num_heads)
        self.gate_scale = (
            None if gate_scale is None else check_real("gate_scale", gate_scale, above=0)
        )
        shape = (npos_max, head_dim) if num_heads is None else (num_heads, npos_max, head_dim)
        self.embeddings = nn.Parameter(torch.empty(shape))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zero embeddings, as the authors' code: CoPE adds nothing until it learns."""
        with torch.no_grad():
            self.embeddings.zero_()

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias ``[B, H, Lq, Lk]``; the integer positions are not read.

        Raises:
            TypeError, ValueError: as :func:`cope_bias`, or ``q`` does not have
                ``num_heads`` heads of ``head_dim``.
        """
        check_heads("q", q, num_heads=self.num_heads, head_dim=self.head_dim, built_by="CoPE")
        return cope_bias(q, k, self.embeddings, scale=self.gate_scale)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, npos_max={self.npos_max}, num_heads={self.num_heads}, "
            f"gate_scale={self.gate_scale}"
        )
