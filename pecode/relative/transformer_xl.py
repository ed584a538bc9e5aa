"""Transformer-XL/XLNet (Dai et al. 2019, §3.3): sinusoids of the distance, projected.

``A_ij = q_iᵀk_j + q_iᵀ W_{k,R} R_{i-j} + uᵀ k_j + vᵀ W_{k,R} R_{i-j}``. The position
terms are one product against the projected encodings of every distance followed by a
strided view, :func:`~pecode.relative.relative_shift`, so no ``[Lq, Lk, Dh]`` tensor is
built; a causal variant computes only the distances a causal layer looks at.
:class:`~pecode.relative.TransformerXLRelativePosition` is the scheme.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pecode._checks import (
    check_bool,
    check_floating_tensor,
    check_heads,
    check_int,
    check_positions,
    check_query_key,
    check_real,
    check_tensor,
)
from pecode.attention import PositionScheme, causal_mask

__all__ = [
    "TransformerXLRelativePosition",
    "relative_distances",
    "relative_shift",
    "sinusoidal_relative_encoding",
    "transformer_xl_position_terms",
]


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
    if check_bool("causal", causal) and k_len < q_len:
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
    check_tensor("scores", scores)
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
        TypeError: ``distances`` is not a tensor, ``dim`` not an int, ``base`` not a
            real number.
        ValueError: ``dim`` is not positive and even, ``distances`` is not 1-D, or
            ``base`` is not a finite number greater than 1.
    """
    check_tensor("distances", distances)
    if distances.dim() != 1:
        raise ValueError(f"distances must be 1-D, got shape {tuple(distances.shape)}")
    check_int("dim", dim, 2)
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    base = check_real("base", base, above=1.0)
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
    check_query_key(q, k)
    heads, head_dim = q.shape[1], q.shape[-1]
    _check_causal_lengths(causal, q.shape[2], k.shape[2])
    width = k.shape[2] if causal else q.shape[2] + k.shape[2] - 1
    check_floating_tensor("rel_keys", rel_keys, (heads, width, head_dim))
    check_floating_tensor("u", u, (heads, head_dim))
    check_floating_tensor("v", v, (heads, head_dim))
    content_bias = (k @ u.unsqueeze(-1)).transpose(-2, -1)  # (c): [B, H, 1, Lk]
    by_distance = (q + v.unsqueeze(1)) @ rel_keys.transpose(-2, -1)  # (b)+(d): [B, H, Lq, W]
    return relative_shift(by_distance, causal=causal) + content_bias


def _consecutive_start(name: str, positions: Tensor) -> int:
    """First position of a 1-D run ``p, p + 1, ...``; the relative shift needs one."""
    check_positions(name, positions)
    if positions.dim() != 1:
        raise ValueError(
            f"{name} must be 1-D for Transformer-XL (one run p, p + 1, ... shared by the "
            f"batch, for the relative shift), got shape {tuple(positions.shape)}"
        )
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
        self.causal = check_bool("causal", causal)
        self.rel_proj = nn.Linear(model_dim, num_heads * head_dim, bias=False)  # W_{k,R}
        self.u = nn.Parameter(torch.zeros(num_heads, head_dim))
        self.v = nn.Parameter(torch.zeros(num_heads, head_dim))

    def extra_repr(self) -> str:
        return (
            f"model_dim={self.model_dim}, num_heads={self.num_heads}, "
            f"head_dim={self.head_dim}, causal={self.causal}"
        )

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
            TypeError, ValueError: as :func:`transformer_xl_position_terms`; ``q`` has
                another head count or head dimension than the scheme; positions are
                not 1-D runs ``p, p + 1, ...`` of the lengths of ``q`` and ``k``; or
                (causal) there are fewer keys than queries.
        """
        check_query_key(q, k)
        check_heads(
            "q", q, num_heads=self.num_heads, head_dim=self.head_dim, built_by=type(self).__name__
        )
        offset = _consecutive_start("q_positions", q_positions) - _consecutive_start(
            "k_positions", k_positions
        )
        q_len, k_len = q.shape[2], k.shape[2]
        if (q_positions.shape[-1], k_positions.shape[-1]) != (q_len, k_len):
            raise ValueError(
                f"positions of lengths {q_positions.shape[-1]}, {k_positions.shape[-1]} "
                f"do not match q and k of lengths {q_len}, {k_len}"
            )
        _check_causal_lengths(self.causal, q_len, k_len)
        rel_keys = self.rel_keys(q_len, k_len, offset)
        terms = transformer_xl_position_terms(q, k, rel_keys, self.u, self.v, causal=self.causal)
        terms = terms * self.logit_scale(q.shape[-1])
        if self.causal:  # the entries above the diagonal are other pairs' terms
            terms = terms.masked_fill(~causal_mask(q_len, k_len, q.device), float("-inf"))
        return terms
