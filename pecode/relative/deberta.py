"""DeBERTa (He et al. 2021, §3.1): disentangled content and relative-position attention.

``Ã_ij = Q^c_i·K^c_j + Q^c_i·K^r_{δ(i,j)} + K^c_j·Q^r_{δ(i,j)}``, in the paper's form
and in the form the released code computes (they differ in the row the
position-to-content term reads), with DeBERTa-v2/v3's log buckets
(:func:`~pecode.relative.deberta_log_bucket`). The two position terms are a product
with the table rows followed by a gather (:func:`~pecode.relative.deberta_position_terms`);
:class:`~pecode.relative.DebertaRelativePosition` is the scheme and
:func:`~pecode.relative.deberta_attention` builds a layer with it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from pecode._checks import (
    check_bool,
    check_floating_tensor,
    check_heads,
    check_int,
    check_integer_tensor,
    check_query_key,
    check_real,
)
from pecode.attention import MultiHeadAttention, PositionScheme
from pecode.relative._pairs import index_for_heads, pairwise_offsets

__all__ = [
    "DebertaRelativePosition",
    "deberta_attention",
    "deberta_log_bucket",
    "deberta_position_terms",
    "deberta_relative_index",
    "deberta_table_rows",
]


_P2C_INDEX = ("released", "paper")


def _check_p2c_index(p2c_index: object) -> None:
    if p2c_index not in _P2C_INDEX:
        raise ValueError(f"p2c_index must be 'released' or 'paper', got {p2c_index!r}")


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
    check_int("position_buckets", position_buckets, 2)  # None too: the buckets are needed here
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
    query_minus_key = pairwise_offsets(q_positions, k_positions).long().neg_()
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
    _check_p2c_index(p2c_index)
    index_c2p = deberta_relative_index(
        q_positions, k_positions, max_distance, position_buckets=position_buckets
    )  # δ(i, j): [Lq, Lk]
    if p2c_index == "released":  # δ(i, j) again, read from the key's side: [Lk, Lq]
        index_p2c = index_c2p.transpose(-2, -1)
    else:  # δ(j, i): [Lk, Lq]
        index_p2c = deberta_relative_index(
            k_positions, q_positions, max_distance, position_buckets=position_buckets
        )
    check_query_key(q, k)
    batch, heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    rows = deberta_table_rows(max_distance, position_buckets)
    check_floating_tensor("q_rel", q_rel, (heads, rows, head_dim))
    check_floating_tensor("k_rel", k_rel, (heads, rows, head_dim))
    if index_c2p.shape[-2:] != (q_len, k_len):
        raise ValueError(
            f"positions give [{index_c2p.shape[-2]}, {index_c2p.shape[-1]}] pairs, "
            f"but q and k have lengths {q_len} and {k_len}"
        )
    c2p = (q @ k_rel.transpose(-2, -1)).gather(-1, index_for_heads(index_c2p, batch, heads))
    p2c = (k @ q_rel.transpose(-2, -1)).gather(-1, index_for_heads(index_p2c, batch, heads, "k"))
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
            not a finite positive number, ``pos_proj_bias`` with ``share_att_key``, or a bad
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
        check_bool("share_att_key", share_att_key)
        check_bool("pos_proj_bias", pos_proj_bias)
        check_bool("norm_rel_ebd", norm_rel_ebd)
        if share_att_key and pos_proj_bias:
            raise ValueError(
                "pos_proj_bias is for the scheme's own W_{q,r}, W_{k,r}; with share_att_key=True "
                "the layer's projections and their biases are used"
            )
        layer_norm_eps = check_real("layer_norm_eps", layer_norm_eps, above=0.0)
        _check_p2c_index(p2c_index)
        self.share_att_key = share_att_key
        self.p2c_index = p2c_index
        self.rel_embeddings = nn.Parameter(torch.randn(rows, model_dim) * 0.02)
        self.rel_norm = nn.LayerNorm(model_dim, eps=layer_norm_eps) if norm_rel_ebd else None
        width = num_heads * head_dim
        if share_att_key:
            self.pos_q_proj = self.pos_k_proj = None
        else:
            self.pos_q_proj = nn.Linear(model_dim, width, bias=pos_proj_bias)  # W_{q,r}
            self.pos_k_proj = nn.Linear(model_dim, width, bias=pos_proj_bias)  # W_{k,r}
        # (W_Q, W_K) of the layer, held without registering them a second time
        self._content_projections: tuple[nn.Linear, nn.Linear] | None = None

    def extra_repr(self) -> str:
        # pos_proj_bias and norm_rel_ebd show in the pos_*_proj and rel_norm submodules
        return (
            f"model_dim={self.model_dim}, num_heads={self.num_heads}, "
            f"head_dim={self.head_dim}, max_distance={self.max_distance}, "
            f"position_buckets={self.position_buckets}, share_att_key={self.share_att_key}, "
            f"p2c_index={self.p2c_index!r}"
        )

    def bind_content_projections(self, layer: MultiHeadAttention) -> None:
        """Use ``layer``'s ``q_proj`` and ``k_proj`` for ``P`` (``share_att_key=True``).

        Raises:
            ValueError: the scheme does not share projections, ``layer`` does not hold
                this scheme, groups its keys (``num_kv_heads < num_heads``), or its
                sizes differ from the scheme's.
            TypeError: ``layer`` is not a :class:`~pecode.attention.MultiHeadAttention`.
        """
        if not self.share_att_key:
            raise ValueError("bind_content_projections needs share_att_key=True")
        if not isinstance(layer, MultiHeadAttention):
            raise TypeError(f"layer must be a MultiHeadAttention, got {type(layer).__name__}")
        if layer.position is not self:
            raise ValueError("layer must hold this scheme as its position scheme")
        if layer.num_kv_heads != layer.num_heads:  # P goes through k_proj for every head
            raise ValueError(
                f"bind_content_projections needs a layer without grouped keys, got "
                f"num_kv_heads={layer.num_kv_heads} for num_heads={layer.num_heads}"
            )
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
        """``(c2p + p2c) / sqrt(3 Dh)``: ``[B, H, Lq, Lk]``.

        Raises:
            TypeError, ValueError: as :func:`deberta_position_terms`, or ``q`` has
                another head count or head dimension than the scheme.
        """
        check_heads(
            "q", q, num_heads=self.num_heads, head_dim=self.head_dim, built_by=type(self).__name__
        )
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
